"""Gradient checkpointing of a model's blocks (core.layers.checkpointing, PreTrainedModel, the trainer switch)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from core.config import TrainerConfig
from core.errors import ConfigError
from core.layers.checkpointing import block_units, checkpoint_modules, is_checkpointed, uncheckpoint_modules
from core.pretrained import PreTrainedModel
from core.testing import _loss_and_saved_bytes
from core.trainer import Trainer, fsdp_units


@dataclasses.dataclass
class StagesConfig:
    width: int = 8
    dropout: float = 0.2


class Stages(PreTrainedModel):
    """Two stages of blocks (a ModuleList of ModuleLists) with dropout, and a head outside them."""

    config_class = StagesConfig
    method = "stages_toy"

    def __init__(self, config: StagesConfig | None = None):
        super().__init__()
        self.config = config = config or StagesConfig()
        w = config.width

        def block():
            return nn.Sequential(nn.Linear(w, 4 * w), nn.GELU(), nn.Dropout(config.dropout), nn.Linear(4 * w, w))

        self.stages = nn.ModuleList([nn.ModuleList([block(), block()]), nn.ModuleList([block()])])
        self.head = nn.Linear(w, 1)

    def forward(self, x):
        for stage in self.stages:
            for b in stage:
                x = x + b(x)
        return self.head(x)

    def training_step(self, batch):
        return {"loss": (self(batch["x"]) - batch["y"]).pow(2).mean()}


def _batch():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(16, 8, generator=g), "y": torch.randn(16, 1, generator=g)}


def test_block_units_expand_lists_of_stages():
    names = [n for n, _ in block_units(Stages())]
    assert names == ["stages.0.0", "stages.0.1", "stages.1.0"]
    # the trainer's FSDP units are the same blocks (a container has no forward to shard)
    model = Stages()
    assert {id(m) for m in fsdp_units(model)} == {id(m) for _, m in block_units(model)}


def test_checkpointing_same_gradients_less_memory_same_keys():
    torch.manual_seed(0)
    plain = Stages().train()
    ck = copy.deepcopy(plain)
    keys = list(ck.state_dict())
    ck.enable_gradient_checkpointing()
    assert list(ck.state_dict()) == keys  # names unchanged: checkpoints and FSDP units stay valid
    assert all(is_checkpointed(m) for m in ck.checkpoint_units())
    out = {}
    for name, m in (("plain", plain), ("ck", ck)):
        torch.manual_seed(3)  # dropout draws: the recompute must replay them
        loss, saved = _loss_and_saved_bytes(lambda m=m: m.training_step(_batch())["loss"])
        loss.backward()
        out[name] = (loss.detach(), saved)
    assert torch.equal(out["plain"][0], out["ck"][0])
    for (n, a), (_, b) in zip(plain.named_parameters(), ck.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0, msg=n)
    assert out["ck"][1] < out["plain"][1] / 2


def test_eval_and_no_grad_run_the_plain_forward():
    torch.manual_seed(0)
    m = Stages()
    m.enable_gradient_checkpointing()
    m.eval()
    with torch.no_grad():
        y = m(_batch()["x"])
    uncheckpoint_modules(m)
    assert not any(is_checkpointed(u) for u in m.modules())
    with torch.no_grad():
        assert torch.equal(m(_batch()["x"]), y)


def test_idempotent_and_deepcopy():
    m = Stages()
    assert checkpoint_modules(m.checkpoint_units()) == 3
    assert checkpoint_modules(m.checkpoint_units()) == 3  # a second call wraps nothing twice
    twin = copy.deepcopy(m).train()
    torch.manual_seed(1)
    twin.training_step(_batch())["loss"].backward()  # the copy's checkpointed forward is its own
    assert all(p.grad is not None for p in twin.parameters()) and all(p.grad is None for p in m.parameters())


def test_model_without_blocks_checkpoints_its_parts():
    @dataclasses.dataclass
    class C:
        w: int = 4

    class Mlp(PreTrainedModel):
        config_class = C
        method = "mlp_toy"

        def __init__(self, config=None):
            super().__init__()
            self.config = config or C()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

        def training_step(self, batch):
            return {"loss": (self.net(batch["x"]) - batch["y"]).pow(2).mean()}

    m = Mlp()
    m.enable_gradient_checkpointing()
    assert is_checkpointed(m.net)


def test_trainer_switch_on_a_plain_module_and_a_clear_error(tmp_path):
    cfg = TrainerConfig(max_steps=1, batch_size=2, device="cpu", tensorboard=False, progress=False,
                        gradient_checkpointing=True)

    class Plain(nn.Module):  # no enable_gradient_checkpointing: the trainer checkpoints its block list
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(2, 2)])

        def training_step(self, batch):
            return {"loss": self.blocks[0](batch["x"]).sum()}

    data = [{"x": torch.ones(2)}] * 4
    p = Plain()
    Trainer(p, data, cfg, tmp_path / "a")
    assert is_checkpointed(p.blocks[0])

    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def training_step(self, batch):
            return {"loss": (self.w * batch["x"]).sum()}

    with pytest.raises(ConfigError, match="gradient_checkpointing"):
        Trainer(Flat(), data, cfg, tmp_path / "b")
