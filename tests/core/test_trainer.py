"""The shared trainer: loss falls, resume after SIGKILL is bit-exact, 2-process DDP equals 1 process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from core import checkpoint as ckpt
from core.config import TrainerConfig
from core.errors import ConfigError
from core.logging import read_metrics
from core.testing import ToyRegressionDataset, ToyRegressor, run_toy_training
from core.trainer import Trainer, TrainingError, lr_lambda

REPO = Path(__file__).resolve().parents[2]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_weights(ckpt.resolve_checkpoint(run_dir) / ckpt.MODEL_FILE)


def test_loss_goes_down(tmp_path):
    run_toy_training(tmp_path, {"max_steps": 60, "ckpt_every": 60, "optim": {"lr": 2e-2}}, dropout=0.0)
    rows = read_metrics(tmp_path)
    first = sum(r["loss"] for r in rows[:5]) / 5
    last = sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.5 * first


def test_checkpoint_contents_and_pruning(tmp_path):
    run_toy_training(tmp_path, {"max_steps": 9, "ckpt_every": 3, "keep_last": 2})
    steps = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert steps == ["step_00000006", "step_00000009"]
    latest = ckpt.resolve_checkpoint(tmp_path)
    assert latest.name == "step_00000009"
    for f in (ckpt.MODEL_FILE, ckpt.EMA_FILE, ckpt.CONFIG_FILE, ckpt.STATE_TENSORS, ckpt.STATE_JSON):
        assert (latest / f).is_file(), f
    state = ckpt.load_checkpoint(latest)["training_state"]
    assert state["step"] == 9 and state["optimizer"]["state"]  # Adam moments were stored


_CHILD = textwrap.dedent(
    """
    import sys
    from core.testing import run_toy_training
    run_toy_training(sys.argv[1], {"max_steps": 12, "ckpt_every": 3}, sleep=float(sys.argv[2]))
    """
)


def _child(out: Path, sleep: float) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(out), str(sleep)], env=env, cwd=REPO)


def test_resume_after_sigkill_is_bit_exact(tmp_path):
    """A real subprocess is SIGKILLed mid-run, restarted, and must land on the uninterrupted weights."""
    ref = tmp_path / "ref"
    assert _child(ref, 0.0).wait(timeout=300) == 0

    run = tmp_path / "killed"
    proc = _child(run, 0.3)
    deadline = time.time() + 300
    while time.time() < deadline:
        latest = ckpt.latest_checkpoint(run / "checkpoints")
        if latest is not None and latest.name >= "step_00000006":
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the child never wrote its step-6 checkpoint")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = ckpt.latest_checkpoint(run / "checkpoints").name
    assert killed_at < "step_00000012", "the run finished before it was killed"

    assert _child(run, 0.0).wait(timeout=300) == 0
    a, b = _weights(ref), _weights(run)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ema_a = ckpt.load_weights(ckpt.resolve_checkpoint(ref) / ckpt.EMA_FILE)
    ema_b = ckpt.load_weights(ckpt.resolve_checkpoint(run) / ckpt.EMA_FILE)
    assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)
    steps = [r["step"] for r in read_metrics(run)]
    assert steps == sorted(set(steps)) and steps[-1] == 12  # no duplicated history after the resume


def test_ddp_two_processes_equal_one(tmp_path):
    """torchrun with 2 gloo processes x batch 2 x accum 2 == 1 process x batch 8 (same global batches)."""
    single = tmp_path / "single"
    run_toy_training(single, {"max_steps": 6, "batch_size": 8, "grad_accum": 1, "ckpt_every": 6,
                              "ema_decay": None}, dropout=0.0, augment=False)
    script = tmp_path / "ddp_child.py"
    script.write_text(textwrap.dedent(
        f"""
        from core.testing import run_toy_training
        run_toy_training({str(tmp_path / 'ddp')!r}, {{"max_steps": 6, "batch_size": 2, "grad_accum": 2,
                         "ckpt_every": 6, "ema_decay": None}}, dropout=0.0, augment=False)
        """
    ))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
           "--rdzv-endpoint=127.0.0.1:29533", str(script)]
    res = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = _weights(single), _weights(tmp_path / "ddp")
    for k in a:
        if k != "steps_seen":  # counts micro-batches: 6 single vs 12 per DDP rank (accum 2)
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    # and training actually moved the weights (the equality above is not trivial)
    torch.manual_seed(1234)
    init = ToyRegressor()
    assert not torch.allclose(init.state_dict()["net.0.weight"], a["net.0.weight"])


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainerConfig(max_steps=10, scheduler={"name": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1})
    f = lr_lambda(cfg)
    assert f(0) == 0.5 and f(1) == 1.0
    assert f(2) == pytest.approx(1.0) and f(10) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(2, 10))


def test_nan_loss_is_a_clear_error(tmp_path):
    class NaNModel(ToyRegressor):
        def training_step(self, batch):
            return {"loss": super().training_step(batch)["loss"] * float("nan")}

    cfg = TrainerConfig(max_steps=2, batch_size=2, device="cpu", tensorboard=False, progress=False)
    with pytest.raises(TrainingError, match="non-finite loss"):
        Trainer(NaNModel(), ToyRegressionDataset(8), cfg, tmp_path).fit()


def test_bad_setup_errors(tmp_path):
    cfg = TrainerConfig(max_steps=2, batch_size=64, device="cpu", tensorboard=False, progress=False)
    with pytest.raises(ConfigError, match="batch_size"):
        Trainer(ToyRegressor(), ToyRegressionDataset(8), cfg, tmp_path)
    cfg = TrainerConfig(max_steps=2, batch_size=2, device="cpu", optim={"param_group_lrs": {"unet": 1e-4}})
    with pytest.raises(ConfigError, match="unknown parameter groups"):
        Trainer(ToyRegressor(), ToyRegressionDataset(8), cfg, tmp_path)
    with pytest.raises(ConfigError, match="training_step"):
        Trainer(torch.nn.Linear(2, 2), ToyRegressionDataset(8), cfg, tmp_path)


def test_tensorboard_and_metrics_written(tmp_path):
    run_toy_training(tmp_path, {"max_steps": 3, "tensorboard": True})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_trainable_parameters_missing_from_param_groups_are_an_error(tmp_path):
    """A trainable parameter left out of ``param_groups()`` would silently never be optimised."""

    class Grouped(ToyRegressor):
        def param_groups(self):
            return {"first": list(self.net[0].parameters())}  # forgets net.3

    cfg = TrainerConfig(max_steps=2, batch_size=2, device="cpu", tensorboard=False, progress=False)
    with pytest.raises(ConfigError, match=r"net\.3\.weight.*net\.3\.bias|net\.3\.bias.*net\.3\.weight") as e:
        Trainer(Grouped(), ToyRegressionDataset(8), cfg, tmp_path)
    assert "\n" not in str(e.value)
    model = Grouped()
    model.net[3].requires_grad_(False)  # frozen parameters may stay out of the groups
    Trainer(model, ToyRegressionDataset(8), cfg, tmp_path / "frozen")


def test_missing_parameter_error_names_at_most_five(tmp_path):
    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(2, 2)
            self.rest = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(4))  # 8 parameters

        def training_step(self, batch):
            return {"loss": self.used(batch["x"][:, :2]).sum()}

        def param_groups(self):
            return {"default": list(self.used.parameters())}

    from core.trainer import build_optimizer

    with pytest.raises(ConfigError, match=r"8 trainable parameters .*and 3 more") as e:
        build_optimizer(Wide(), TrainerConfig(device="cpu"))
    assert str(e.value).count("rest.") == 5


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])  # same path
def test_interrupt_saves_a_checkpoint_and_resume_is_bit_exact(tmp_path, sig):
    """Ctrl-C / SIGTERM: the step in progress finishes, a checkpoint of THAT step is written (no work lost,
    even between ckpt_every boundaries), the process stops, and the restart lands on the uninterrupted weights."""
    ref = tmp_path / "ref"
    assert _child(ref, 0.0).wait(timeout=300) == 0
    run = tmp_path / "stopped"
    proc = _child(run, 0.3)
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "metrics.jsonl").is_file():
        time.sleep(0.05)
    while time.time() < deadline and len(read_metrics(run)) < 4:  # ckpt_every=3: step 4 is no checkpoint step
        time.sleep(0.02)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) != 0
    last_logged = read_metrics(run)[-1]["step"]
    latest = ckpt.latest_checkpoint(run / "checkpoints")
    assert latest is not None and latest.name == f"step_{last_logged:08d}", (latest, last_logged)
    assert last_logged < 12, "the run finished before the signal"
    assert _child(run, 0.0).wait(timeout=300) == 0
    a, b = _weights(ref), _weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_finished_run_started_again_reports_its_checkpoint(tmp_path):
    from core.testing import run_toy_training

    first = run_toy_training(tmp_path)
    again = run_toy_training(tmp_path)
    assert again["step"] == 12 and again["checkpoint"] == first["checkpoint"]
    assert again["metrics"]["loss"] == pytest.approx(first["metrics"]["loss"])


def test_ema_warms_up_so_a_short_run_forgets_its_initial_weights():
    from core.trainer import EMA

    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    ema = EMA(model, 0.999)
    with torch.no_grad():
        model.weight.fill_(1.0)
    for step in range(1, 1501):
        ema.update(model, step)
    # (1 + n) / (10 + n) warm-up: the initial 0 keeps prod(decay_t) ~ 1e-4 of the weight, not 0.999^1500 = 22 %
    assert float(ema.module.weight) > 0.99
    assert ema.decay_at(1) == 0.1 and ema.decay_at(10**6) == 0.999


# ----------------------------------------------------------------------------------------------
# The on-policy hooks: prepare_batch (samples of the live weights) and training_state (in every checkpoint)


class _Points(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(2, generator=torch.Generator().manual_seed(i))}


class _OnPolicyToy(torch.nn.Module):
    """``prepare_batch`` samples ``x * w`` of the current weights and keeps a running buffer (its training state);
    the loss pulls the weights towards the samples shifted by the buffer's mean, so a lost buffer changes them."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5, -0.3]))
        self.buffer: list[float] = []
        self.seen: list[torch.Tensor] = []  # the weights prepare_batch saw, in order

    def prepare_batch(self, batch):
        assert not torch.is_grad_enabled()
        sample = batch["x"] * self.w
        self.buffer = (self.buffer + [float(sample.mean())])[-3:]
        self.seen.append(self.w.detach().clone())
        return {**batch, "sample": sample, "shift": torch.tensor(sum(self.buffer) / len(self.buffer))}

    def training_step(self, batch):
        loss = ((batch["x"] * self.w - batch["sample"] - 1.0 - batch["shift"]) ** 2).mean()
        return {"loss": loss, "shift": batch["shift"]}

    def training_state(self):
        return {"buffer": list(self.buffer)}

    def load_training_state(self, state):
        self.buffer = [float(v) for v in state["buffer"]]


def _on_policy_trainer(out: Path, max_steps: int) -> Trainer:
    cfg = TrainerConfig(max_steps=max_steps, batch_size=4, ckpt_every=2, log_every=1, tensorboard=False,
                        progress=False, device="cpu", grad_clip=None, seed=3)
    cfg.optim.lr = 0.05
    cfg.scheduler.name = "constant"  # the same lr whatever max_steps: a shorter run is a killed longer one
    cfg.scheduler.warmup_steps = 0
    return Trainer(_OnPolicyToy(), _Points(), cfg, out)


def test_prepare_batch_sees_the_current_weights_and_training_state_survives_resume(tmp_path):
    straight = _on_policy_trainer(tmp_path / "a", 6)
    straight.fit()
    seen = straight.model.seen
    assert len(seen) == 6 and torch.equal(seen[0], torch.tensor([0.5, -0.3]))  # once per micro-batch
    assert all(not torch.equal(a, b) for a, b in zip(seen, seen[1:], strict=False))  # after every optimizer step
    state = ckpt.load_checkpoint(tmp_path / "a")["training_state"]
    assert state["model_state"] == [{"buffer": straight.model.buffer}]  # per rank, like the RNG states

    _on_policy_trainer(tmp_path / "b", 3).fit()  # "killed" after its step-3 checkpoint
    resumed = _on_policy_trainer(tmp_path / "b", 6)
    resumed.fit()
    assert resumed.model.buffer == straight.model.buffer
    assert torch.equal(resumed.model.w, straight.model.w)
    assert [r["shift"] for r in read_metrics(tmp_path / "b")] == [r["shift"] for r in read_metrics(tmp_path / "a")]

    # without the buffer the resumed run drifts: the equality above is not trivial
    lost = _on_policy_trainer(tmp_path / "c", 3)
    lost.fit()
    lost = _on_policy_trainer(tmp_path / "c", 6)
    lost.model.load_training_state = lambda state: None
    lost.fit()
    assert not torch.equal(lost.model.w, straight.model.w)

    # call_model runs a model method the same way (no_grad, through the wrapped module)
    out = straight.call_model("prepare_batch", {"x": torch.ones(1, 2)})
    assert torch.equal(out["sample"], straight.model.w.detach()[None])
