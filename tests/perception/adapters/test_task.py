"""FeRA end to end: config tree (adapter group), train (base pretraining + one arm), evaluate, infer, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.config import compose, to_object
from core.errors import CheckpointError, ConfigError

REPO = Path(__file__).resolve().parents[3]


def overrides(root: Path, arm: str = "fera", model: str = "fera_unet_tiny", run: str | None = None) -> list[str]:
    return ["experiment=fera", "debug=tiny", f"model={model}", f"adapter={arm}",
            f"model.pretrain_dir={root / ('base_' + model)}", f"data.source_root={root / 'src'}",
            "data.source_clips=2", "data.source_frames=4", "data.shots=8", "data.test_n=8", "data.curve_n=4",
            "data.eval_every=2", "data.fd_samples=4", f"out_dir={root / (run or f'{model}_{arm}')}"]


def test_adapter_group_picks_the_arm_and_checks_keys(tmp_path):
    cfg = compose(overrides(tmp_path, "lora"))
    a = to_object(cfg.adapter)
    assert (a.kind, a.rank, a.name) == ("lora", 12, "lora")
    a = to_object(compose(overrides(tmp_path, "fera_norouter")).adapter)
    assert (a.kind, a.routing, a.fecl_weight, a.kappa_divisor) == ("fera", "uniform", 0.1, 32)
    assert to_object(compose(overrides(tmp_path, "fera_nofecl")).adapter).fecl_weight == 0.0
    assert "fera_unet_tiny_dora" in compose(overrides(tmp_path, "dora")).out_dir
    with pytest.raises(ConfigError, match="rnak"):
        compose(overrides(tmp_path) + ["adapter.rnak=3"])
    with pytest.raises(ConfigError, match="adapter.kind"):
        compose(overrides(tmp_path) + ["adapter.kind=ia3"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from perception.adapters import task

    root = tmp_path_factory.mktemp("fera")
    results = {arm: task.train(compose(overrides(root, arm)))
               for arm in ("fera", "lora", "dora", "xlora", "fourierft", "waveft")}
    return root, results


def test_arms_train_with_matched_parameters_and_write_adapters(trained):
    root, results = trained
    n = {arm: r["trainable_parameters"] for arm, r in results.items()}
    assert abs(n["fera"] - n["lora"]) / n["lora"] < 0.05 and abs(n["dora"] - n["lora"]) / n["lora"] < 0.1
    assert abs(n["xlora"] - n["lora"]) / n["lora"] < 0.05
    # the spectral arms: LoRA's count per layer, capped at the layer's entries (the tiny UNet's 16 x 16 linears)
    assert n["fourierft"] == n["waveft"] and 0.7 * n["lora"] < n["fourierft"] <= n["lora"]
    for arm in ("fera", "lora", "dora", "xlora", "fourierft", "waveft"):  # the exported model: config.json names the arm and the base
        model = json.loads((root / f"fera_unet_tiny_{arm}" / "adapter" / "config.json").read_text())["model"]
        assert model["adapter"]["name"] == arm and Path(model["base_path"]) == (root / "base_fera_unet_tiny").absolute()
    curve = json.loads((root / "fera_unet_tiny_fera" / "curve.json").read_text())
    assert [p["step"] for p in curve] == [0, 2, 4] and set(curve[0]) >= {"t0.1", "t0.9", "mean"}
    # every arm starts from the same base: identical step-0 losses
    c0 = [json.loads((root / f"fera_unet_tiny_{a}" / "curve.json").read_text())[0] for a in ("fera", "lora")]
    assert c0[0] == c0[1]


@pytest.mark.parametrize("arm", ["fera", "lora", "dora", "xlora", "fourierft", "waveft"])
def test_adapter_folder_reproduces_the_trained_model(trained, arm):
    """base + the exported adapter-only folder == the full training checkpoint, exactly; the folder holds only the
    arm's tensors, and load_pretrained rebuilds both the export and the run folder (its newest checkpoint)."""
    from core import checkpoint as ckpt
    from core.pretrained import load_pretrained
    from perception.adapters import task
    from perception.adapters.modeling_fera import is_adapter_key

    root, _ = trained
    cfg = compose(overrides(root, arm))
    model_cfg, _, adapter, _ = task._configs(cfg)
    base = root / "base_fera_unet_tiny"
    full = task.AdaptedDenoiser.around(task.load_base(model_cfg, base), adapter, base)
    ckpt.load_checkpoint(ckpt.latest_checkpoint(Path(cfg.out_dir) / "checkpoints"), full)
    loaded = task.load_adapted(cfg.out_dir)
    stored = ckpt.load_weights(Path(cfg.out_dir) / "adapter" / "model.safetensors")
    assert sorted(stored) == sorted(loaded.trained_state_dict()) and all(is_adapter_key(k) for k in stored)
    assert any("fera_router" in k for k in stored) == (arm in ("fera", "xlora"))
    assert any("_spectrum" in k for k in stored) == (arm in ("fourierft", "waveft"))
    assert any("lora_magnitude_vector" in k for k in stored) == (arm == "dora")
    x, t = torch.randn(3, 3, 16, 16), torch.tensor([0.2, 0.5, 0.9])
    with torch.no_grad():
        want = full.eval()(x, t)
        assert torch.equal(want, loaded(x, t))
        for other in (load_pretrained(Path(cfg.out_dir) / "adapter"), load_pretrained(cfg.out_dir)):
            assert type(other) is task.AdaptedDenoiser and torch.equal(want, other(x, t))


def test_exported_base_is_read_only_and_legacy_adapter_is_one_line(trained, tmp_path):
    """model.base_path may be an exported base folder: training and evaluation read it and write nothing into it
    (the base's figures are cached in the run folder instead)."""
    from perception.adapters import task
    from perception.adapters.backbones import BASE_RUN_CONFIG, load_denoiser

    root, _ = trained
    base = tmp_path / "exported_base"
    load_denoiser(root / "base_fera_unet_tiny").save_pretrained(base, run_config=dict(BASE_RUN_CONFIG))
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    cfg = compose(overrides(root, "lora", run="lora_on_export") + [f"model.base_path={base}"])
    task.train(cfg)
    out = task.evaluate(cfg)
    assert {p.name: p.read_bytes() for p in base.iterdir()} == before
    assert (Path(cfg.out_dir) / task.BASE_EVAL_FILE).is_file() and out["base"]["fd"] >= 0
    legacy = tmp_path / "legacy" / "adapter"
    legacy.mkdir(parents=True)
    (legacy / "arm.json").write_text("{}")
    with pytest.raises(CheckpointError, match="older version"):
        task.load_adapted(legacy.parent)


def test_ship_models_writes_self_contained_exports(trained, tmp_path):
    """--ship's writer: each arm a self-contained export (a clean base: weights and config, no training state)
    that loads from anywhere and computes what the run's model computes; the run's card is kept."""
    import shutil

    from core.pretrained import load_pretrained, read_card
    from perception.adapters import task

    root, _ = trained
    (tmp_path / "table.md").write_text("| arm |\n")
    runs = {arm: root / f"fera_unet_tiny_{arm}" for arm in ("fera", "lora")}
    dest = task.ship_models(runs, tmp_path / "ship", tmp_path / "table.md")
    assert sorted(p.name for p in dest.iterdir()) == ["comparison.md", "fera", "lora"]
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([0.3, 0.7])
    for arm, run in runs.items():
        assert sorted(p.name for p in (dest / arm / "base").iterdir()) == ["README.md", "config.json",
                                                                          "model.safetensors"]
        assert read_card(dest / arm)["command"] == read_card(run / "adapter")["command"]
        moved = shutil.move(str(dest / arm), str(tmp_path / f"moved_{arm}"))
        with torch.no_grad():
            assert torch.equal(load_pretrained(moved)(x, t), task.load_adapted(run)(x, t))


def test_evaluate_reports_levels_fd_and_routing(trained):
    from perception.adapters import task

    root, _ = trained
    out = task.evaluate(compose(overrides(root, "fera")))
    assert set(out["heldout_loss"]) == {"t0.1", "t0.3", "t0.5", "t0.7", "t0.9", "mean"}
    assert out["fd"] >= 0 and out["base"]["fd"] >= 0 and out["trainable_parameters"] > 0
    for w in out["routing_by_level"].values():
        assert len(w) == 3 and abs(sum(w) - 1) < 1e-5
    assert "routing_by_level" not in task.evaluate(compose(overrides(root, "lora")))
    xl = task.evaluate(compose(overrides(root, "xlora")))["routing_by_level"]  # X-LoRA's: from the hidden state
    assert all(len(w) == 3 and abs(sum(w) - 1) < 1e-5 for w in xl.values())


def test_fecl_only_for_fera_with_weight(tmp_path):
    from perception.adapters import task
    from perception.adapters.backbones import FlowDenoiser
    from perception.adapters.configuration_fera import AdapterConfig
    from perception.adapters.modeling_fera import tiny_config

    batch = {"image": torch.rand(2, 3, 16, 16) * 2 - 1}
    cfg = tiny_config("dit", dit_layers=1).backbone()
    calls = []
    for adapter, has in ((AdapterConfig(kappa_divisor=16), True), (AdapterConfig(fecl_weight=0.0), False),
                         (AdapterConfig(kind="lora", rank=12), False)):
        m = task.AdaptedDenoiser.around(FlowDenoiser(cfg), adapter)
        h = m.denoiser.backbone.register_forward_hook(lambda *a: calls.append(1))
        out = m.training_step(batch)
        h.remove()
        assert ("fecl" in out) == has and torch.isfinite(out["loss"])
        assert len(calls) == (2 if has else 1)  # FECL's base pass is one more backbone forward
        calls.clear()


def test_infer_writes_samples_and_bad_run_is_one_line(trained, tmp_path):
    root, _ = trained
    run = root / "fera_unet_tiny_fera"
    cmd = [sys.executable, "-m", "embodied.cli", "infer", "fera-samples", "--run", str(run), "--out",
           str(tmp_path / "s"), "--n", "3", "--steps", "2"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "s" / "grid.png").is_file() and len(list((tmp_path / "s" / "samples").iterdir())) == 3
    cmd[cmd.index(str(run))] = str(tmp_path / "nope")
    cmd[cmd.index(str(tmp_path / "s"))] = str(tmp_path / "s2")
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1 and "config.json" in res.stderr
    assert not (tmp_path / "s2").exists()


def test_experiment_summary_aggregates_seeds(tmp_path):
    from core.io import write_json
    from perception.adapters.experiments import collect, markdown, summarise

    base = {"heldout_loss": {"t0.1": 1.0, "mean": 1.0}, "fd": 50.0}
    for arm, seed, loss, fd in (("fera", 0, 0.5, 10.0), ("fera", 1, 0.7, 14.0), ("lora", 0, 0.6, 12.0)):
        write_json(tmp_path / "unet32" / f"{arm}_s{seed}" / "eval.json",
                   {"arm": arm, "backbone": "unet", "image_size": 32, "trainable_parameters": 100,
                    "heldout_loss": {"t0.1": loss, "mean": loss}, "fd": fd, "base": base})
    rows = summarise(collect(tmp_path))
    fera = next(r for r in rows if r["arm"] == "fera")
    assert fera["seeds"] == 2 and fera["fd"]["mean"] == pytest.approx(12.0)
    assert fera["loss"]["t0.1"]["sd"] == pytest.approx(0.1414, abs=1e-3)
    table = markdown(rows)
    assert "base (no adapter)" in table and "0.6000 ± 0.0000" in table and table.count("\n") == 5


def test_shipped_adapters_load_and_the_demo_section_runs(tmp_path):
    """The shipped base + FeRA / LoRA adapters (assets/checkpoints/fera) load strictly, and both adapters
    lower the base's held-out loss on real crops (what they were trained for)."""
    from core.demo import DemoContext
    from perception.adapters.demo import demo_section

    sec = demo_section(DemoContext(out=tmp_path))
    f = sec.figures
    assert f["fera_heldout_loss"] < f["base_heldout_loss"] and f["lora_heldout_loss"] < f["base_heldout_loss"]
    assert (tmp_path / "img" / "fera_fera.png").is_file() and "routing" in sec.body


def test_shipped_folders_are_self_contained_exports(tmp_path):
    """Each shipped arm is an exported AdaptedDenoiser with its base inside (copy_base=True): it loads with
    load_pretrained from a copy elsewhere, stores only the adapter tensors, and `embodied infer fera-samples`
    samples from it."""
    import argparse
    import shutil

    from core.checkpoint import load_weights
    from core.pretrained import load_pretrained, read_config
    from perception.adapters import cli
    from perception.adapters.demo import SHIPPED
    from perception.adapters.modeling_fera import AdaptedDenoiser

    for arm in ("fera", "lora"):
        assert read_config(SHIPPED / arm)["model"]["base_path"] == "base"
        moved = shutil.copytree(SHIPPED / arm, tmp_path / arm)
        model = load_pretrained(moved)
        assert isinstance(model, AdaptedDenoiser) and model.adapter.kind == arm
        assert sorted(load_weights(moved / "model.safetensors")) == sorted(model.trained_state_dict())
    out = tmp_path / "samples"
    args = argparse.Namespace(run=str(tmp_path / "fera"), out=str(out), n=2, seed=0, steps=2, base=False)
    assert cli.infer(args) == 0 and len(list((out / "samples").iterdir())) == 2
