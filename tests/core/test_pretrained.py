"""The pretrained-model contract: export / load round trips, EMA weights by default, strict configs, cards."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from core.checkpoint import EMA_FILE, MODEL_FILE, load_weights, resolve_checkpoint
from core.errors import CheckpointError
from core.pretrained import PreTrainedModel, dataclass_from_dict, read_card, read_config
from core.testing import ToyRegressor, folder_digest


@dataclasses.dataclass
class _Inner:
    depth: int = 1


@dataclasses.dataclass
class ToyConfig:
    in_dim: int = 8
    hidden: int = 16
    out_dim: int = 4
    inner: _Inner = dataclasses.field(default_factory=_Inner)


class ToyPretrained(PreTrainedModel):
    config_class = ToyConfig
    method = "toy"

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.net = nn.Sequential(nn.Linear(config.in_dim, config.hidden), nn.GELU(),
                                 nn.Linear(config.hidden, config.out_dim))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch):
        return {"loss": nn.functional.mse_loss(self(batch["x"]), batch["y"])}


def test_contract_is_checked_when_a_class_is_defined():
    with pytest.raises(TypeError, match="config_class"):
        class NoConfig(PreTrainedModel):  # noqa: F841
            pass

    class Family(PreTrainedModel):  # an abstract base may skip it
        abstract = True


def test_save_pretrained_round_trip_is_bit_exact_with_a_card(tmp_path):
    torch.manual_seed(0)
    model = ToyPretrained(ToyConfig(hidden=12, inner=_Inner(depth=3))).eval()
    out = model.save_pretrained(tmp_path / "export", card={"data": "toy regression", "command": "pytest",
                                                           "metrics": {"mse": 0.5}})
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    card = read_card(out)
    assert card["method"] == "toy" and card["metrics"] == {"mse": 0.5} and card["parameters"] == model.num_parameters()
    assert card["model_class"].endswith(":ToyPretrained")
    loaded = ToyPretrained.from_pretrained(out)
    assert loaded.config == model.config and isinstance(loaded.config.inner, _Inner)
    x = torch.randn(5, 8)
    assert torch.equal(loaded(x), model(x))
    assert not loaded.training


def test_from_pretrained_rejects_unknown_keys_and_other_methods(tmp_path):
    model = ToyPretrained(ToyConfig())
    out = model.save_pretrained(tmp_path / "export")
    cfg = json.loads((out / "config.json").read_text())
    cfg["model"]["hiden"] = 3
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"unknown config key\(s\) \['hiden'\]"):
        ToyPretrained.from_pretrained(out)
    cfg["model"].pop("hiden")
    cfg["method"] = "sola"
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="a 'sola' checkpoint, not 'toy'"):
        ToyPretrained.from_pretrained(out)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        ToyPretrained.from_pretrained(tmp_path / "nothing")


def test_dataclass_from_dict_nested():
    cfg = dataclass_from_dict(ToyConfig, {"hidden": 4, "inner": {"depth": 2}})
    assert cfg.inner == _Inner(depth=2)
    with pytest.raises(CheckpointError, match="model.inner"):
        dataclass_from_dict(ToyConfig, {"inner": {"depht": 2}})


def _train_with_ema(tmp_path):
    from core.config import TrainerConfig
    from core.testing import ToyRegressionDataset
    from core.trainer import Trainer, seed_everything

    seed_everything(0)
    model = ToyPretrained(ToyConfig())
    cfg = TrainerConfig(max_steps=6, batch_size=8, ckpt_every=6, device="cpu", tensorboard=False, progress=False,
                        ema_decay=0.5, optim={"lr": 1e-2})
    run_config = {"method": "toy", "model": dataclasses.asdict(model.config)}
    Trainer(model, ToyRegressionDataset(n=32), cfg, tmp_path / "run", run_config=run_config).fit()
    return tmp_path / "run"


def test_from_pretrained_uses_the_ema_weights_of_a_training_run(tmp_path):
    run = _train_with_ema(tmp_path)
    ckpt = resolve_checkpoint(run)
    ema, raw = load_weights(ckpt / EMA_FILE), load_weights(ckpt / MODEL_FILE)
    assert any(not torch.equal(ema[k], raw[k]) for k in raw), "EMA and raw weights should differ after 6 steps"
    default = ToyPretrained.from_pretrained(run)  # a run directory resolves to its newest checkpoint
    assert default.loaded_from["weights"] == EMA_FILE
    assert all(torch.equal(v, ema[k]) for k, v in default.state_dict().items())
    plain = ToyPretrained.from_pretrained(run, use_ema=False)
    assert all(torch.equal(v, raw[k]) for k, v in plain.state_dict().items())
    exported = default.save_pretrained(tmp_path / "export")
    with pytest.raises(CheckpointError, match="use_ema=True"):
        ToyPretrained.from_pretrained(exported, use_ema=True)


def test_from_pretrained_never_reads_the_training_state(tmp_path):
    run = _train_with_ema(tmp_path)
    ckpt = resolve_checkpoint(run)
    (ckpt / "training_state.safetensors").write_bytes(b"corrupt")  # a loader that touched it would fail
    (ckpt / "training_state.json").write_text("{not json")
    loaded = ToyPretrained.from_pretrained(run)
    ema = load_weights(ckpt / EMA_FILE)
    assert all(torch.equal(v, ema[k]) for k, v in loaded.state_dict().items())


def test_from_pretrained_casts_dtype(tmp_path):
    out = ToyPretrained(ToyConfig()).save_pretrained(tmp_path / "e")
    m = ToyPretrained.from_pretrained(out, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in m.parameters())


def test_bc_eval_policy_uses_ema_weights(tmp_path):
    """The closed-loop policy (what `embodied eval bc` rolls out) is built from the EMA weights."""
    import gymnasium as gym

    from core.checkpoint import load_policy, save_checkpoint
    from worldmodels.bc.configuration_bc import BCConfig
    from worldmodels.bc.modeling_bc import BCPolicyModel

    torch.manual_seed(0)
    cfg = BCConfig(action_dim=7, proprio_dim=9, image_size=32)
    model, ema = BCPolicyModel(cfg), BCPolicyModel(cfg)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(0.1)
    save_checkpoint(tmp_path / "ck", model, {"method": "bc", "model": dataclasses.asdict(cfg)}, ema=ema)

    class _Env:  # the spaces a Reach-style env declares (load_policy checks the policy fits them)
        action_space = gym.spaces.Box(-1, 1, (7,))
        observation_space = gym.spaces.Dict({cfg.image_key: gym.spaces.Box(0, 255, (32, 32, 3)),
                                             cfg.proprio_key: gym.spaces.Box(-1, 1, (9,))})
        spec = None

    policy = load_policy(tmp_path / "ck", _Env())
    loaded = policy.model.state_dict()
    assert all(torch.equal(v, ema.state_dict()[k]) for k, v in loaded.items())


# -- models around a base folder (base_fields / trained_state_dict) ----------------------------------------------
@dataclasses.dataclass
class _AdapterConfig:
    base_path: str | None = None
    rank: int = 2


class _Adapter(PreTrainedModel):
    """A low-rank delta on a ToyRegressor loaded read-only from ``base_path``."""

    config_class = _AdapterConfig
    method = "toy_adapter"
    base_fields = ("base_path",)

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.base = ToyRegressor.from_pretrained(config.base_path).requires_grad_(False)
        self.down = torch.nn.Linear(8, config.rank, bias=False)
        self.up = torch.nn.Linear(config.rank, 4, bias=False)
        torch.nn.init.normal_(self.up.weight)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))

    def trained_state_dict(self):
        return {k: v for k, v in self.state_dict().items() if not k.startswith("base.")}


@pytest.fixture
def adapter(tmp_path):
    torch.manual_seed(0)
    base = ToyRegressor().save_pretrained(tmp_path / "user_base")
    torch.manual_seed(1)
    return _Adapter(_AdapterConfig(base_path=str(base))), base


def test_adapter_references_its_base_and_stores_only_what_it_trained(adapter, tmp_path):
    from core.checkpoint import load_weights

    model, base = adapter
    before = folder_digest(base)
    out = model.save_pretrained(tmp_path / "export")
    assert sorted(load_weights(out / "model.safetensors")) == ["down.weight", "up.weight"]
    cfg = read_config(out)
    assert cfg["model"]["base_path"] == str(base.resolve()) and not (out / "base").exists()
    assert read_card(out)["base"] == {"base_path": str(base.resolve())}
    loaded = _Adapter.from_pretrained(out)
    x = torch.randn(3, 8)
    assert torch.equal(loaded(x), model.eval()(x))
    assert folder_digest(base) == before


def test_adapter_copy_base_is_self_contained(adapter, tmp_path):
    import shutil

    model, base = adapter
    out = model.save_pretrained(tmp_path / "export", copy_base=True)
    assert read_config(out)["model"]["base_path"] == "base" and (out / "base" / "model.safetensors").is_file()
    shutil.move(str(out), tmp_path / "moved")
    shutil.rmtree(base)
    loaded = _Adapter.from_pretrained(tmp_path / "moved")
    x = torch.randn(3, 8)
    assert torch.equal(loaded(x), model.eval()(x))


def test_adapter_missing_base_and_writing_into_base_are_one_line_errors(adapter, tmp_path):
    import shutil

    model, base = adapter
    with pytest.raises(CheckpointError, match="read-only"):
        model.save_pretrained(base / "inside")
    with pytest.raises(CheckpointError, match="read-only"):
        model.save_pretrained(base)
    out = model.save_pretrained(tmp_path / "export")
    shutil.rmtree(base)
    with pytest.raises(CheckpointError, match=r"model.base_path: base folder .* not found"):
        _Adapter.from_pretrained(out)


def test_adapter_loading_is_strict_on_the_trained_tensors(adapter, tmp_path):
    from core.checkpoint import load_weights, save_weights

    model, _ = adapter
    out = model.save_pretrained(tmp_path / "export")
    sd = load_weights(out / "model.safetensors")
    save_weights({"down.weight": sd["down.weight"]}, out / "model.safetensors")
    with pytest.raises(CheckpointError, match="1 missing: up.weight"):
        _Adapter.from_pretrained(out)
    save_weights({**sd, "extra.weight": torch.zeros(1)}, out / "model.safetensors")
    with pytest.raises(CheckpointError, match="1 unexpected: extra.weight"):
        _Adapter.from_pretrained(out)


def test_exported_folder_has_the_usual_permissions(tmp_path):
    """atomic_dir stages in a mkdtemp folder (mode 0700); the exported folder gets the umask's mode instead."""
    import os
    import stat

    mask = os.umask(0o022)
    try:
        out = ToyRegressor().save_pretrained(tmp_path / "export")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755


def test_training_checkpoints_of_a_model_around_a_base_hold_only_what_it_trains(adapter, tmp_path):
    """The trainer checkpoints trained_state_dict() only (a 7 B base is not rewritten every ckpt_every steps),
    and a killed run resumes from such a checkpoint to the uninterrupted weights."""
    from core.checkpoint import load_checkpoint, load_weights, resolve_checkpoint
    from core.config import TrainerConfig
    from core.testing import ToyRegressionDataset
    from core.trainer import Trainer, seed_everything

    model, base = adapter
    before = folder_digest(base)

    class Step(_Adapter):
        method = "toy_adapter"

        def training_step(self, batch):
            return {"loss": torch.nn.functional.mse_loss(self(batch["x"]), batch["y"])}

    def run(out, steps, fresh=True):
        seed_everything(0)
        m = Step(model.config)
        cfg = TrainerConfig(max_steps=steps, batch_size=4, ckpt_every=2, keep_last=5, device="cpu",
                            tensorboard=False, progress=False, optim={"lr": 1e-2},
                            scheduler={"name": "constant"})  # the same schedule for 2 + 2 as for 4 steps
        Trainer(m, ToyRegressionDataset(n=32), cfg, out, run_config={"method": "toy_adapter"}).fit()
        return m

    straight = run(tmp_path / "a", 4)
    ck = resolve_checkpoint(tmp_path / "a")
    assert sorted(load_weights(ck / "model.safetensors")) == ["down.weight", "up.weight"]
    run(tmp_path / "b", 2)
    resumed = run(tmp_path / "b", 4)  # same out_dir: resumes from step 2 with the base rebuilt from its folder
    for k, v in straight.trained_state_dict().items():
        assert torch.equal(v, resumed.trained_state_dict()[k]), k
    assert not torch.equal(straight.up.weight, _Adapter(model.config).up.weight)  # training moved it
    loaded = Step(model.config)
    load_checkpoint(tmp_path / "a", loaded)  # the base part comes from the base folder, not the file
    assert torch.equal(loaded.up.weight, straight.up.weight)
    assert folder_digest(base) == before


def test_save_upstream_folders_land_in_the_export_and_the_card(tmp_path):
    """A model's ``save_upstream`` writes into the staged folder (with the export's weights) and the card lists it."""
    seen = {}

    class WithUpstream(ToyPretrained):
        method = "toy"

        def save_upstream(self, directory, state_dict=None):
            seen["weights"] = state_dict
            (directory / "net").mkdir()
            (directory / "net" / "weights.pt").write_bytes(b"x")
            return {"net": "torch.load(net/weights.pt)"}

    model = WithUpstream(ToyConfig())
    ema = {k: v + 1 for k, v in model.state_dict().items()}
    out = model.save_pretrained(tmp_path / "export", state_dict=ema)
    assert (out / "net" / "weights.pt").read_bytes() == b"x"
    assert read_card(out)["upstream"] == {"net": "torch.load(net/weights.pt)"}
    assert seen["weights"] is ema
    assert torch.equal(WithUpstream.from_pretrained(out).net[0].weight, ema["net.0.weight"])
