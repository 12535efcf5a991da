"""Shared test kit: tiny reference models / datasets and the model checks every method's tests inherit.

Like timm's ``test_*`` variants and diffusers' ``ModelTesterMixin``, this lives in the library so that a
method's test only supplies a tiny init and a batch, and inherits the real checks::

    class TestMyModel(ModelChecks):
        def make_model(self):  return MyModel(MyConfig.tiny())
        def make_batch(self):  return {"image": torch.rand(2, 3, 16, 16)}
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from core.pretrained import PreTrainedModel


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


@dataclasses.dataclass
class ToyRegressorConfig:
    """Sizes of ``ToyRegressor``."""

    in_dim: int = 8
    hidden: int = 32
    out_dim: int = 4
    dropout: float = 0.0


class ToyRegressor(PreTrainedModel):
    """A two-layer MLP with optional dropout; ``training_step`` is the MSE to ``y``.

    ``ToyRegressor(hidden=16)`` and ``ToyRegressor(ToyRegressorConfig(hidden=16))`` build the same model.
    """

    config_class = ToyRegressorConfig
    method = "toy"

    def __init__(self, config: ToyRegressorConfig | None = None, **sizes: Any):
        super().__init__()
        self.config = config = config or ToyRegressorConfig(**sizes)
        self.net = nn.Sequential(nn.Linear(config.in_dim, config.hidden), nn.GELU(), nn.Dropout(config.dropout),
                                 nn.Linear(config.hidden, config.out_dim))
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
    and, when forward is not ``model(**batch)``, ``run``.

    ``test_gradient_flow`` calls ``model.training_step(self.make_train_batch())`` when the model has a
    ``training_step`` (override ``make_train_batch`` when its batch differs from ``make_batch``), else it
    backpropagates the sum of the float outputs of ``run``. Parameters that are legitimately unused by that
    step (trained in another stage, say) are listed by name prefix in ``no_grad_params``.
    """

    atol = 0.0
    no_grad_params: tuple[str, ...] = ()

    def make_model(self) -> nn.Module:
        raise NotImplementedError

    def make_batch(self) -> dict[str, Any]:
        raise NotImplementedError

    def make_train_batch(self) -> dict[str, Any]:
        """The batch of ``model.training_step`` (``make_batch()`` unless overridden)."""
        return self.make_batch()

    def run(self, model: nn.Module, batch: dict[str, Any]) -> Any:
        return model(**batch)

    def training_loss(self, model: nn.Module) -> torch.Tensor:
        """The scalar the gradient check backpropagates: ``training_step``'s loss, else the summed outputs."""
        if hasattr(model, "training_step"):
            out = model.training_step(self.make_train_batch())
            return out["loss"] if isinstance(out, dict) else out
        outs = [o.float().sum() for o in self._flat(self.run(model, self.make_batch())) if o.is_floating_point()]
        assert outs, "the model returned no float tensors"
        return torch.stack(outs).sum()

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

    def test_save_pretrained_from_pretrained_same_output(self, tmp_path):
        """The export contract: ``save_pretrained`` -> ``from_pretrained`` rebuilds the model from its own config
        (a fresh construction, not loading into an existing object) with identical weights and outputs."""
        from core.pretrained import PreTrainedModel

        torch.manual_seed(0)
        model = self.make_model().eval()
        assert isinstance(model, PreTrainedModel), f"{type(model).__name__} should be a core.pretrained.PreTrainedModel"
        folder = model.save_pretrained(tmp_path / "export", card={"data": "test"})
        torch.manual_seed(1)  # nothing of the reload may come from the RNG
        loaded = type(model).from_pretrained(folder)
        assert type(loaded) is type(model) and loaded.config == model.config
        sd_a, sd_b = model.state_dict(), loaded.state_dict()
        assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
        batch = self.make_batch()
        with torch.no_grad():
            outs = zip(self._flat(self.run(model, batch)), self._flat(self.run(loaded, batch)), strict=True)
            for a, b in outs:
                assert torch.equal(a, b)

    def test_deterministic_eval(self):
        """Two models built after the same seed agree, and eval outputs depend neither on the global RNG
        (reseeded differently before each run) nor on earlier calls."""
        torch.manual_seed(0)
        model = self.make_model().eval()
        torch.manual_seed(0)
        twin = self.make_model().eval()
        batch = self.make_batch()
        with torch.no_grad():
            torch.manual_seed(1)
            a = self._flat(self.run(model, batch))
            torch.manual_seed(2)
            b = self._flat(self.run(twin, batch))
            torch.manual_seed(3)
            c = self._flat(self.run(model, batch))
        assert a, "the model returned no tensors"
        for what, other in (("a second model built from the same seed", b), ("a second call", c)):
            assert len(a) == len(other), f"{what} returned {len(other)} tensors, the first {len(a)}"
            for i, (x, y) in enumerate(zip(a, other, strict=True)):
                try:
                    torch.testing.assert_close(x, y, atol=self.atol, rtol=0)
                except AssertionError as e:
                    raise AssertionError(f"output {i} differs for {what}: {e}") from None

    def test_gradient_flow(self):
        """One training step gives every trainable parameter (but ``no_grad_params``) a finite gradient."""
        torch.manual_seed(0)
        model = self.make_model().train()
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        stale = [pre for pre in self.no_grad_params if not any(n.startswith(pre) for n in names)]
        assert not stale, f"no_grad_params entries {stale} match no trainable parameter"
        loss = self.training_loss(model)
        assert loss.ndim == 0 and torch.isfinite(loss), f"the training loss is {loss}"
        loss.backward()
        missing, bad = [], []
        for name, p in model.named_parameters():
            if not p.requires_grad or name.startswith(tuple(self.no_grad_params)):
                continue
            if p.grad is None:
                missing.append(name)
            elif not torch.isfinite(p.grad).all():
                bad.append(name)
        assert not missing, f"no gradient reaches {len(missing)} trainable parameters: {missing[:10]}"
        assert not bad, f"non-finite gradient in {len(bad)} parameters: {bad[:10]}"

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
