"""Shared test kit: tiny reference models / datasets and the model checks every method's tests inherit.

Like timm's ``test_*`` variants and diffusers' ``ModelTesterMixin``, this lives in the library so that a
method's test only supplies a tiny init and a batch, and inherits the real checks::

    class TestMyModel(ModelChecks):
        def make_model(self):  return MyModel(MyConfig.tiny())
        def make_batch(self):  return {"image": torch.rand(2, 3, 16, 16)}
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset


class ToyRegressionDataset(Dataset):
    """``n`` samples of ``y = W x + noise`` with a fixed ``W``; deterministic from ``seed``.

    Items: ``x`` (in_dim,) float32, ``y`` (out_dim,) float32.
    """

    def __init__(self, n: int = 64, in_dim: int = 8, out_dim: int = 4, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(out_dim, in_dim, generator=g)
        self.x = torch.randn(n, in_dim, generator=g)
        self.y = self.x @ self.w.T + 0.01 * torch.randn(n, out_dim, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


class ToyRegressor(nn.Module):
    """A two-layer MLP with optional dropout; ``training_step`` is the MSE to ``y``."""

    def __init__(self, in_dim: int = 8, hidden: int = 32, out_dim: int = 4, dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, out_dim))
        self.register_buffer("steps_seen", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # (B, out_dim)

    def training_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.steps_seen += 1
        pred = self(batch["x"])
        loss = nn.functional.mse_loss(pred, batch["y"])
        return {"loss": loss, "mae": (pred - batch["y"]).abs().mean()}


def noisy_inputs(batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A device transform (``core.data.device.BatchTransform``): input noise drawn from the loader's
    per-batch generator, so a resumed run sees the same noise."""
    noise = torch.randn(batch["x"].shape, generator=generator).to(batch["x"].device)
    return {**batch, "x": batch["x"] + 0.01 * noise}


def run_toy_training(out_dir: str | Path, overrides: dict[str, Any] | None = None, dropout: float = 0.1,
                     n: int = 64, sleep: float = 0.0, augment: bool = True) -> dict[str, Any]:
    """Train ``ToyRegressor`` with the real ``Trainer`` (used by the resume and DDP tests)."""
    import time

    from core.config import TrainerConfig
    from core.trainer import Trainer, seed_everything

    cfg_kwargs: dict[str, Any] = dict(max_steps=12, batch_size=4, grad_accum=2, ckpt_every=3, log_every=1,
                                      device="cpu", tensorboard=False, progress=False, ema_decay=0.9,
                                      optim={"lr": 3e-3}, scheduler={"name": "cosine", "warmup_steps": 2})
    cfg_kwargs.update(overrides or {})
    cfg = TrainerConfig(**cfg_kwargs)
    seed_everything(1234)  # model init is identical in every process / run
    model = ToyRegressor(dropout=dropout)
    hooks = [lambda *_: time.sleep(sleep)] if sleep else []
    trainer = Trainer(model, ToyRegressionDataset(n=n), cfg, out_dir, run_config={"method": "toy"},
                      transforms=[noisy_inputs] if augment else None, hooks=hooks)
    return trainer.fit()


class ModelChecks:
    """Checks every model in the workspace must pass. Subclasses define ``make_model`` / ``make_batch``
    and, when forward is not ``model(**batch)``, ``run``."""

    atol = 0.0

    def make_model(self) -> nn.Module:
        raise NotImplementedError

    def make_batch(self) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, model: nn.Module, batch: dict[str, Any]) -> Any:
        return model(**batch)

    @staticmethod
    def _flat(out: Any) -> list[torch.Tensor]:
        if isinstance(out, torch.Tensor):
            return [out]
        if isinstance(out, dict):
            return [t for v in out.values() for t in ModelChecks._flat(v)]
        if isinstance(out, (list, tuple)):
            return [t for v in out for t in ModelChecks._flat(v)]
        if hasattr(out, "__dict__"):
            return [t for v in vars(out).values() for t in ModelChecks._flat(v)]
        return []

    def test_save_load_bit_exact(self, tmp_path):
        from core.checkpoint import load_checkpoint, save_checkpoint

        torch.manual_seed(0)
        model = self.make_model().eval()
        save_checkpoint(tmp_path / "ckpt", model, {"method": "test"})
        torch.manual_seed(1)
        other = self.make_model().eval()
        load_checkpoint(tmp_path / "ckpt", other)
        for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items(), strict=True):
            assert torch.equal(a, b), k
        batch = self.make_batch()
        with torch.no_grad():
            for a, b in zip(self._flat(self.run(model, batch)), self._flat(self.run(other, batch)), strict=True):
                assert torch.equal(a, b)

    def test_deterministic_eval(self):
        torch.manual_seed(0)
        model = self.make_model().eval()
        batch = self.make_batch()
        with torch.no_grad():
            a = self._flat(self.run(model, batch))
            b = self._flat(self.run(model, batch))
        assert a, "the model returned no tensors"
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, atol=self.atol, rtol=0)

    def test_forward_does_not_mutate_batch(self):
        torch.manual_seed(0)
        model = self.make_model().eval()
        batch = self.make_batch()
        before = copy.deepcopy(batch)
        with torch.no_grad():
            self.run(model, batch)
        for k, v in before.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, batch[k]), f"forward changed batch[{k!r}]"

    def test_outputs_finite(self):
        torch.manual_seed(0)
        model = self.make_model().eval()
        with torch.no_grad():
            outs = self._flat(self.run(model, self.make_batch()))
        assert all(torch.isfinite(o).all() for o in outs if o.is_floating_point())
