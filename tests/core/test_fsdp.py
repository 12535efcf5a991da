"""FSDP2 in the shared trainer: sharded training equals plain training, its checkpoints are ordinary full ones
(a plain process loads them), and a resume under FSDP lands on the uninterrupted weights.

Runs on CPU with gloo: FSDP2's ``fully_shard`` and the ``torch.distributed.checkpoint.state_dict`` helpers
work there, so nothing here needs a GPU.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from core import checkpoint as ckpt
from core import distributed as D
from core.config import TrainerConfig, compose, to_object
from core.errors import ConfigError
from core.logging import read_metrics
from core.testing import ToyRegressor, run_toy_training
from core.trainer import fsdp_units

REPO = Path(__file__).resolve().parents[2]
# Each Linear of ToyRegressor is a unit of its own, so both unit and root sharding are exercised.
FSDP = {"strategy": "fsdp", "fsdp_wrap": ["Linear"], "ema_decay": None}


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_weights(ckpt.resolve_checkpoint(run_dir) / ckpt.MODEL_FILE)


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], exact: bool = False) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if k == "steps_seen":  # counts this rank's micro-batches, not a weight
            continue
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


def _assert_same_optimizer(a: dict, b: dict) -> None:
    """Same ``Optimizer.state_dict`` layout (integer parameter ids, same groups) and close moments."""
    assert [g["params"] for g in a["param_groups"]] == [g["params"] for g in b["param_groups"]]
    assert a["state"].keys() == b["state"].keys() and all(isinstance(i, int) for i in a["state"])
    for i in a["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(a["state"][i][name], b["state"][i][name], rtol=1e-5, atol=1e-7)


def _copy_checkpoint(src_run: Path, name: str, dst_run: Path) -> None:
    shutil.copytree(src_run / "checkpoints" / name, dst_run / "checkpoints" / name)
    ckpt.mark_latest(dst_run / "checkpoints", name)


@pytest.fixture
def one_rank_group():
    """``strategy=fsdp`` in a plain process creates a one-rank process group; leave none behind."""
    yield
    D.cleanup()


def test_fsdp_in_one_process_equals_plain_training(tmp_path, one_rank_group):
    """Without torchrun, fsdp shards over a one-rank group: same weights (dropout and augmentation on), a
    checkpoint a plain model loads, and resume (from its own and from a plain checkpoint) is exact."""
    run = {"max_steps": 4, "ckpt_every": 2, "keep_last": 5, "ema_decay": None}
    run_toy_training(tmp_path / "plain", run)
    run_toy_training(tmp_path / "fsdp", {**run, **FSDP})
    _assert_same_weights(_weights(tmp_path / "plain"), _weights(tmp_path / "fsdp"))
    loaded = ckpt.load_checkpoint(tmp_path / "fsdp", ToyRegressor(dropout=0.1))  # strict: every key and shape
    plain_state = ckpt.load_checkpoint(tmp_path / "plain")["training_state"]
    _assert_same_optimizer(plain_state["optimizer"], loaded["training_state"]["optimizer"])

    for source in ("fsdp", "plain"):  # a plain checkpoint resumes under fsdp too (same layout)
        _copy_checkpoint(tmp_path / source, "step_00000002", tmp_path / f"resumed_{source}")
        run_toy_training(tmp_path / f"resumed_{source}", {**run, **FSDP})
        _assert_same_weights(_weights(tmp_path / "fsdp"), _weights(tmp_path / f"resumed_{source}"), exact=True)


_CHILD = textwrap.dedent(
    """
    import shutil, sys
    from pathlib import Path

    import torch.distributed as dist

    from core import checkpoint as ckpt
    from core.testing import run_toy_training

    out, cfg = Path(sys.argv[1]), {cfg}
    run_toy_training(out / "fsdp", cfg, dropout=0.0, augment=False)
    if dist.get_rank() == 0:  # a run interrupted after step 3: only that checkpoint is there
        shutil.copytree(out / "fsdp/checkpoints/step_00000003", out / "resumed/checkpoints/step_00000003")
        ckpt.mark_latest(out / "resumed/checkpoints", "step_00000003")
    dist.barrier()
    run_toy_training(out / "resumed", cfg, dropout=0.0, augment=False)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp_two_processes_equal_one_and_resume(tmp_path):
    """torchrun, 2 gloo processes x batch 2 x accum 2 under fsdp == 1 plain process x batch 8; the gathered
    checkpoints load into an unsharded model; resuming the step-3 checkpoint under fsdp is exact."""
    run = {"max_steps": 6, "ckpt_every": 3, "keep_last": 5, "ema_decay": None}
    single = tmp_path / "single"
    run_toy_training(single, {**run, "batch_size": 8, "grad_accum": 1}, dropout=0.0, augment=False)

    script = tmp_path / "fsdp_child.py"
    script.write_text(_CHILD.format(cfg=repr({**run, **FSDP, "batch_size": 2, "grad_accum": 2})))
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           f"--rdzv-endpoint=127.0.0.1:{port}", str(script), str(tmp_path)]
    res = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    if res.returncode != 0 and "terminate called without an active exception" in res.stderr:
        # An intermittent abort of a gloo rank at process teardown, after its training finished (seen once in
        # 3 full-suite runs on this 2-core machine, 0 in 4 runs alone): run the whole two-process job once more from
        # scratch. Any other failure, or the same abort twice, fails the test.
        for name in ("fsdp", "resumed"):
            shutil.rmtree(tmp_path / name, ignore_errors=True)
        res = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    fsdp = tmp_path / "fsdp"

    # (a) same losses, gradient norms and weights as one process with the same global batches
    for a, b in zip(read_metrics(single), read_metrics(fsdp), strict=True):
        for key in ("loss", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
    for name in ("step_00000003", "step_00000006"):
        _assert_same_weights(_weights(single / "checkpoints" / name), _weights(fsdp / "checkpoints" / name))
    torch.manual_seed(1234)  # and training moved the weights, so the equality is not trivial
    assert not torch.allclose(ToyRegressor().state_dict()["net.0.weight"], _weights(single)["net.0.weight"])

    # (b) an fsdp checkpoint is a plain full one: a plain model loads it strictly, optimizer layout included
    model = ToyRegressor()
    loaded = ckpt.load_checkpoint(fsdp, model)
    _assert_same_weights(_weights(single), model.state_dict())
    st = loaded["training_state"]
    assert st["world_size"] == 2 and st["step"] == 6
    _assert_same_optimizer(ckpt.load_checkpoint(single)["training_state"]["optimizer"], st["optimizer"])

    # (c) resumed from step 3 under fsdp == uninterrupted
    _assert_same_weights(_weights(fsdp), _weights(tmp_path / "resumed"), exact=True)
    assert [r["step"] for r in read_metrics(tmp_path / "resumed")][-1] == 6


# ----------------------------------------------------------------------------------------------
# Config and unit selection


def test_strategy_is_validated():
    with pytest.raises(ConfigError, match="trainer.strategy must be one of auto, ddp, fsdp"):
        TrainerConfig(strategy="zero3")
    with pytest.raises(ConfigError, match="ema_decay is not supported with trainer.strategy=fsdp"):
        TrainerConfig(strategy="fsdp", ema_decay=0.999)
    with pytest.raises(ConfigError, match="did you mean strategy"):
        compose(["debug=tiny", "trainer.strategi=fsdp"])


def test_fsdp_preset_composes():
    t = to_object(compose(["trainer=fsdp", "debug=tiny"]).trainer)
    assert (t.strategy, t.precision, t.gradient_checkpointing, t.ema_decay) == ("fsdp", "bf16", True, None)


def test_resolve_strategy():
    assert D.resolve_strategy("auto", 1) == "single" and D.resolve_strategy("auto", 4) == "ddp"
    assert D.resolve_strategy("ddp", 1) == "single" and D.resolve_strategy("fsdp", 1) == "fsdp"


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.heads = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])  # inside a unit: not a unit itself


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([_Block(), _Block(), nn.GELU()])  # GELU: no parameters, no unit


def test_fsdp_units():
    m = _Stack()
    assert fsdp_units(m) == [m.blocks[0], m.blocks[1]]
    deep_first = fsdp_units(m, ["_Block", "Linear"])
    assert set(map(id, deep_first)) == {id(x) for x in m.modules() if isinstance(x, (_Block, nn.Linear))}
    assert deep_first.index(m.blocks[0].heads[1]) < deep_first.index(m.blocks[0])  # bottom-up
    with pytest.raises(ConfigError, match=r"fsdp_wrap names \['DecoderLayer'\]"):
        fsdp_units(m, ["DecoderLayer"])
    m.fsdp_units = lambda: [m.embed]
    assert fsdp_units(m) == [m.embed]
    m.fsdp_units = lambda: [nn.Linear(2, 2)]
    with pytest.raises(ConfigError, match="not its submodules"):
        fsdp_units(m)


def test_release_makes_the_model_plain_for_a_later_stage(tmp_path, one_rank_group):
    """After fit under fsdp, ``release()`` gives back the same model object with plain full parameters (the
    checkpoint's weights): a plain forward works and a second fsdp Trainer (a later
    stage) shards and trains it again; the released trainer refuses to train."""
    from torch.distributed.fsdp import FSDPModule

    from core.testing import ToyRegressionDataset
    from core.trainer import Trainer, TrainingError

    torch.manual_seed(0)
    model = ToyRegressor(dropout=0.0)
    cfg = TrainerConfig(max_steps=2, batch_size=4, ckpt_every=2, log_every=1, device="cpu", tensorboard=False,
                        progress=False, ema_decay=None, strategy="fsdp", fsdp_wrap=["Linear"])
    trainer = Trainer(model, ToyRegressionDataset(n=16), cfg, tmp_path / "a")
    trainer.fit()
    assert trainer.release() is model
    assert not any(isinstance(m, FSDPModule) for m in model.modules())
    assert not any(type(p).__name__ == "DTensor" for p in model.parameters())
    _assert_same_weights(_weights(tmp_path / "a"), model.state_dict())
    with torch.no_grad():
        assert model(torch.randn(3, model.net[0].in_features)).shape[0] == 3  # a plain forward
    with pytest.raises(TrainingError, match="released"):
        trainer.fit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    second = Trainer(model, ToyRegressionDataset(n=16), cfg, tmp_path / "b")
    second.fit()
    second.release()
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k != "steps_seen")  # trained again
    _assert_same_weights(_weights(tmp_path / "b"), after)
