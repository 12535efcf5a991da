"""Checkpoints: bit-exact round trip, atomic writes, no pickle, clear errors on bad files."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from core import checkpoint as ckpt
from core.errors import CheckpointError
from core.testing import ModelChecks, ToyRegressor


class TestToyRegressorChecks(ModelChecks):
    """The shared model checks, run on the reference toy model (methods do the same on theirs)."""

    def make_model(self):
        return ToyRegressor(dropout=0.1)

    def make_batch(self):
        return {"x": torch.randn(3, 8, generator=torch.Generator().manual_seed(0))}

    def make_train_batch(self):
        g = torch.Generator().manual_seed(0)
        return {"x": torch.randn(3, 8, generator=g), "y": torch.randn(3, 4, generator=g)}


def test_training_state_round_trip(tmp_path):
    model = ToyRegressor()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.9))
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    state = {"step": 3, "optimizer": opt.state_dict(), "rng": ckpt.capture_rng(), "nested": {"a": (1, 2.5, "x")}}
    ckpt.save_checkpoint(tmp_path / "c", model, {"method": "toy"}, state)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())

    loaded = ckpt.load_checkpoint(tmp_path / "c")
    st = loaded["training_state"]
    assert st["step"] == 3 and st["nested"] == {"a": (1, 2.5, "x")}
    opt2 = torch.optim.AdamW(ToyRegressor().parameters(), lr=1e-3)
    opt2.load_state_dict(st["optimizer"])
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(v, opt2.state_dict()["state"][0][k])
    assert tuple(opt2.param_groups[0]["betas"]) == (0.8, 0.9)
    ckpt.restore_rng(st["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_files_are_safetensors_and_json_only(tmp_path):
    ckpt.save_checkpoint(tmp_path / "c", ToyRegressor(), {"method": "toy"}, {"step": 1})
    names = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert names == sorted([ckpt.CONFIG_FILE, ckpt.MODEL_FILE, ckpt.STATE_JSON, ckpt.STATE_TENSORS])
    for p in (tmp_path / "c").iterdir():
        assert not p.read_bytes().startswith(b"\x80")  # no pickle protocol header
    json.loads((tmp_path / "c" / ckpt.STATE_JSON).read_text())


def test_overwrite_is_atomic_and_leaves_no_temp(tmp_path):
    m = ToyRegressor()
    ckpt.save_checkpoint(tmp_path / "c", m, {"v": 1})
    ckpt.save_checkpoint(tmp_path / "c", m, {"v": 2})
    assert ckpt.load_checkpoint(tmp_path / "c")["config"] == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_failed_write_keeps_previous(tmp_path, monkeypatch):
    m = ToyRegressor()
    ckpt.save_checkpoint(tmp_path / "c", m, {"v": 1})

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "write_json", boom)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path / "c", m, {"v": 2})
    assert ckpt.load_checkpoint(tmp_path / "c")["config"] == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_mismatched_weights_are_reported(tmp_path):
    ckpt.save_checkpoint(tmp_path / "c", ToyRegressor(hidden=16), {})
    with pytest.raises(CheckpointError, match=r"mismatched: net\.0\.weight: \(16, 8\)"):
        ckpt.load_checkpoint(tmp_path / "c", ToyRegressor(hidden=32))
    report = ckpt.load_into(torch.nn.Linear(8, 4), ckpt.load_weights(tmp_path / "c" / ckpt.MODEL_FILE), strict=False)
    assert set(report["missing"]) == {"weight", "bias"} and "net.0.weight" in report["unexpected"]


def test_corrupt_and_missing_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        ckpt.resolve_checkpoint(tmp_path / "nope")
    ckpt.save_checkpoint(tmp_path / "c", ToyRegressor(), {})
    f = tmp_path / "c" / ckpt.MODEL_FILE
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        ckpt.load_checkpoint(tmp_path / "c", ToyRegressor())
    (tmp_path / "d").mkdir()
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        ckpt.resolve_checkpoint(tmp_path / "d")


def test_latest_pointer(tmp_path):
    d = tmp_path / "checkpoints"
    for s in (1, 2):
        ckpt.save_checkpoint(d / f"step_{s:08d}", ToyRegressor(), {"s": s})
    ckpt.mark_latest(d, "step_00000001")
    assert ckpt.resolve_checkpoint(tmp_path).name == "step_00000001"
    (d / "latest").unlink()
    assert ckpt.latest_checkpoint(d).name == "step_00000002"
