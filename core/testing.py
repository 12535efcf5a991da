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
from collections.abc import Callable
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
        """(B, in_dim) -> (B, out_dim)."""
        return self.net(x)  # (B, out_dim)

    def training_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The MSE of the prediction to ``batch["y"]`` (and the MAE, logged); counts the steps seen."""
        self.steps_seen += 1
        pred = self(batch["x"])
        loss = nn.functional.mse_loss(pred, batch["y"])
        return {"loss": loss, "mae": (pred - batch["y"]).abs().mean()}


def noisy_inputs(batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A device transform (``core.data.device.BatchTransform``) adding input noise.

    The noise is drawn from the loader's per-batch generator, so a resumed run sees the same noise.
    """
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


def folder_digest(folder: str | Path, recursive: bool = True, exclude: tuple[str, ...] = (),
                  dirs: bool = False) -> dict[str, str]:
    """The SHA-256 of every file under ``folder``, keyed by its POSIX path relative to ``folder``.

    What a test compares before and after a call to show a folder was only read, or between two runs to show
    they wrote the same bytes.

    Args:
        folder: The folder.
        recursive: Also the files in sub-folders (False: only the files directly in ``folder``).
        exclude: File names left out wherever they are (a ``meta.json`` that records timings, say).
        dirs: Also list every sub-folder (its value ``""``), so that a new empty folder counts as a change.
    """
    import hashlib

    folder = Path(folder)
    out: dict[str, str] = {}
    for p in sorted(folder.rglob("*") if recursive else folder.iterdir()):
        if p.is_file() and p.name not in exclude:
            out[p.relative_to(folder).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif dirs and p.is_dir():
            out[p.relative_to(folder).as_posix()] = ""
    return out


@dataclasses.dataclass
class ModelExample:
    """A tiny model of a method and a fixed input: what the contract test checks for every registered method.

    A method declares ``register_method(..., example="pkg.module:function")``; the function takes a scratch
    folder (for a tiny base model the example may need to write first) and returns this. The contract test
    (``tests/test_model_contract.py``) runs ``ModelChecks`` on it and compares ``run(build(), inputs())`` with
    the method's golden file, so a method registered from any distribution is covered without a test of its own.

    Attributes:
        build: A fresh tiny model; deterministic given ``torch.manual_seed`` (the checks seed before calling).
        inputs: The fixed input batch (built from its own generator, never the global RNG).
        run: Forward of the model on the batch (default ``model(**batch)``); returns tensors (nested is fine).
        train_inputs: ``training_step``'s batch when it differs from ``inputs``.
        no_grad_params: Trainable parameter name prefixes legitimately without a gradient in one step.
        atol: Tolerance of the determinism check (0: bit-exact).
        golden_atol / golden_rtol: Tolerance of the golden comparison (float noise across CPUs / BLAS builds).
    """

    build: Callable[[], PreTrainedModel]
    inputs: Callable[[], dict[str, Any]]
    run: Callable[[nn.Module, dict[str, Any]], Any] | None = None
    train_inputs: Callable[[], dict[str, Any]] | None = None
    no_grad_params: tuple[str, ...] = ()
    atol: float = 0.0
    golden_atol: float = 1e-4
    golden_rtol: float = 1e-4


def example_of(method: str, workdir: str | Path) -> ModelExample:
    """The registered ``ModelExample`` of ``method`` (a one-line ``ConfigError`` when it declares none)."""
    from core.errors import ConfigError
    from core.registry import METHODS, import_target, load_plugins

    load_plugins()
    spec = METHODS.meta(method)["spec"]
    if not spec.example:
        raise ConfigError(f"method {method!r} declares no example= in register_method (the contract test needs one)")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return import_target(spec.example)(Path(workdir))


def example_checks(example: ModelExample) -> ModelChecks:
    """``ModelChecks`` driven by a ``ModelExample`` (the contract test makes one per method)."""
    checks = _ExampleChecks()
    checks.example = example
    checks.atol = example.atol
    checks.no_grad_params = tuple(example.no_grad_params)
    return checks


def golden_outputs(model: nn.Module, example: ModelExample) -> dict[str, torch.Tensor]:
    """The flattened float outputs of ``example.run`` on its fixed input, as the golden file stores them."""
    run = example.run or (lambda m, b: m(**b))
    with torch.no_grad():
        outs = ModelChecks._flat(run(model.eval(), example.inputs()))
    return {f"out.{i}": o.detach().float().cpu().contiguous() for i, o in enumerate(outs) if o.is_floating_point()}


def build_golden_model(example: ModelExample, seed: int = 0) -> nn.Module:
    """The model a golden file is computed from: ``example.build()`` right after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return example.build()


def golden_dir() -> Path:
    """Where golden files live: ``$EMBODIED_GOLDEN_DIR``, else ``<repository>/tests/golden``."""
    import os

    from core.resources import repository_root

    if os.environ.get("EMBODIED_GOLDEN_DIR"):
        return Path(os.environ["EMBODIED_GOLDEN_DIR"])
    root = repository_root()
    return (root if root is not None else Path.cwd()) / "tests" / "golden"


REGENERATE = "python -m core.testing golden METHOD --why \"<why the output may change>\""


def write_golden(method: str, why: str, directory: str | Path | None = None) -> Path:
    """Recompute ``method``'s golden outputs and write ``<dir>/<method>.safetensors``; log ``why`` in CHANGES.md.

    A golden file may change only when the model's computation changed on purpose (architecture, init, the
    example itself); ``why`` says which, and lands in ``CHANGES.md`` beside the files with the date.
    """
    import datetime
    import tempfile

    from core.checkpoint import save_weights

    if not why or not why.strip():
        raise ValueError("say why the golden output may change (--why)")
    directory = Path(directory) if directory is not None else golden_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        example = example_of(method, work)
        outs = golden_outputs(build_golden_model(example), example)
    if not outs:
        raise ValueError(f"{method}: the example's run returned no float tensors")
    path = directory / f"{method}.safetensors"
    save_weights(outs, path, metadata={"method": method, "torch": torch.__version__})
    log = directory / "CHANGES.md"
    line = f"- {datetime.date.today().isoformat()} `{method}`: {why.strip()}\n"
    with open(log, "a") as f:
        if log.stat().st_size == 0:
            f.write("# Why each golden file changed\n\nWritten by `" + REGENERATE + "`.\n\n")
        f.write(line)
    return path


def check_golden(method: str, example: ModelExample, directory: str | Path | None = None) -> None:
    """Assert that the example's outputs equal ``<dir>/<method>.safetensors`` (within the example's tolerance)."""
    from core.checkpoint import load_weights

    path = (Path(directory) if directory is not None else golden_dir()) / f"{method}.safetensors"
    assert path.is_file(), f"{path}: no golden file for {method!r}; create it with " + \
        REGENERATE.replace("METHOD", method)
    want = load_weights(path)
    got = golden_outputs(build_golden_model(example), example)
    assert sorted(got) == sorted(want), f"{method}: outputs {sorted(got)} vs golden {sorted(want)}"
    for k in sorted(want):
        assert got[k].shape == want[k].shape, \
            f"{method} {k}: shape {tuple(got[k].shape)} vs golden {tuple(want[k].shape)}"
        try:
            torch.testing.assert_close(got[k], want[k], atol=example.golden_atol, rtol=example.golden_rtol)
        except AssertionError as e:
            raise AssertionError(f"{method} {k} differs from its golden file {path} — if the change is intended, "
                                 f"regenerate with {REGENERATE.replace('METHOD', method)}\n{e}") from None


class ModelChecks:
    """Checks every model in the workspace must pass.

    Subclasses define ``make_model`` / ``make_batch`` and, when forward is not ``model(**batch)``, ``run``.

    ``test_gradient_flow`` calls ``model.training_step(self.make_train_batch())`` when the model has a
    ``training_step`` (override ``make_train_batch`` when its batch differs from ``make_batch``), else it
    backpropagates the sum of the float outputs of ``run``. Parameters that are legitimately unused by that
    step (trained in another stage, say) are listed by name prefix in ``no_grad_params``.
    """

    atol = 0.0
    no_grad_params: tuple[str, ...] = ()

    def make_model(self) -> nn.Module:
        """A fresh tiny model (deterministic under ``torch.manual_seed``)."""
        raise NotImplementedError

    def make_batch(self) -> dict[str, Any]:
        """A fixed input batch (from its own generator, never the global RNG)."""
        raise NotImplementedError

    def make_train_batch(self) -> dict[str, Any]:
        """The batch of ``model.training_step`` (``make_batch()`` unless overridden)."""
        return self.make_batch()

    def run(self, model: nn.Module, batch: dict[str, Any]) -> Any:
        """The forward whose outputs the checks compare (default ``model(**batch)``)."""
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
        """A training checkpoint loaded into a differently seeded model gives the same state and outputs."""
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
        """The export contract: ``save_pretrained`` -> ``from_pretrained`` gives identical weights and outputs.

        The model is rebuilt from its own config (a fresh construction, not loading into an existing object).
        """
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

    def test_dtype_round_trip(self, tmp_path):
        """A bf16 copy saves and loads bit-exactly in bf16, and loading with ``dtype=`` equals casting.

        ``from_pretrained(dtype=bf16)`` of the fp32 folder gives the same tensors as casting the model; the bf16
        folder loaded at the default dtype holds the bf16 values exactly and runs to finite outputs.
        """
        from core.pretrained import PreTrainedModel

        torch.manual_seed(0)
        model = self.make_model().eval()
        if not isinstance(model, PreTrainedModel):
            return
        fp32 = model.save_pretrained(tmp_path / "fp32")
        as_bf16 = type(model).from_pretrained(fp32, dtype=torch.bfloat16)
        cast = copy.deepcopy(model).to(torch.bfloat16)
        for (k, a), (_, b) in zip(cast.state_dict().items(), as_bf16.state_dict().items(), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{k}: from_pretrained(dtype=bf16) != cast"
        bf16 = cast.save_pretrained(tmp_path / "bf16")
        again = type(model).from_pretrained(bf16, dtype=torch.bfloat16)
        for (k, a), (_, b) in zip(cast.state_dict().items(), again.state_dict().items(), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{k}: bf16 save -> load is not bit-exact"
        # loaded without dtype=, the model is built as its constructor builds it (fp32, as diffusers and
        # transformers do by default) and holds the bf16 values exactly
        back = type(model).from_pretrained(bf16)
        # (a model around a base stores only what it trained; its base comes back from the base folder as saved)
        stored = set(model.trained_state_dict()) if model.base_fields else None
        for (k, a), (_, b) in zip(cast.state_dict().items(), back.state_dict().items(), strict=True):
            if a.is_floating_point() and (stored is None or k in stored):
                assert torch.equal(a.to(b.dtype), b), f"{k}: bf16 values changed when loaded at the default dtype"
        with torch.no_grad():
            outs = self._flat(self.run(back, self.make_batch()))
        assert all(torch.isfinite(o).all() for o in outs if o.is_floating_point())

    def test_deterministic_eval(self):
        """Two models built after the same seed agree, and eval outputs depend on neither RNG nor history.

        The global RNG is reseeded differently before each run, and a second call must match the first.
        """
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

    def test_gradient_checkpointing(self):
        """``enable_gradient_checkpointing()`` gives the same loss and gradients, and saves fewer activations.

        The second property is what makes the switch worth having: the bytes autograd keeps outside the
        checkpointed blocks (counted with ``saved_tensors_hooks``) must drop, so a switch that does nothing fails.
        """
        torch.manual_seed(0)
        plain = self.make_model().train()
        torch.manual_seed(0)
        ckpt = self.make_model().train()
        assert hasattr(ckpt, "enable_gradient_checkpointing"), f"{type(ckpt).__name__} has no gradient checkpointing"
        ckpt.enable_gradient_checkpointing()
        losses, saved = {}, {}
        for name, model in (("plain", plain), ("checkpointed", ckpt)):
            torch.manual_seed(1)
            losses[name], saved[name] = _loss_and_saved_bytes(lambda m=model: self.training_loss(m))
            losses[name].backward()
        torch.testing.assert_close(losses["checkpointed"], losses["plain"], rtol=0, atol=0)
        grads = dict(plain.named_parameters())
        for name, p in ckpt.named_parameters():
            g_ref = grads[name].grad
            if g_ref is None or p.grad is None:
                assert g_ref is None and p.grad is None, f"{name}: a gradient in only one of the two runs"
                continue
            torch.testing.assert_close(p.grad, g_ref, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        assert saved["checkpointed"] < saved["plain"], \
            f"checkpointing kept as many activations ({saved['checkpointed']} vs {saved['plain']} bytes)"

    def test_bf16_autocast_step(self):
        """A training step under bf16 autocast (``trainer.precision=bf16``) runs and agrees with fp32.

        Catches the usual mixed-precision faults (a buffer or an einsum operand left in fp32 against bf16
        activations, a dtype-pinned ``torch.zeros``); the agreement bounds are loose because bf16 has 8 bits of
        mantissa: loss within 5 %, gradient direction (cosine over all parameters) above 0.95.
        """
        grads, losses = {}, {}
        for name, ctx in (("fp32", None), ("bf16", torch.autocast("cpu", dtype=torch.bfloat16))):
            torch.manual_seed(0)
            model = self.make_model().train()
            torch.manual_seed(1)
            if ctx is None:
                loss = self.training_loss(model)
            else:
                with ctx:
                    loss = self.training_loss(model)
            assert torch.isfinite(loss), f"{name}: the training loss is {loss}"
            loss.float().backward()
            losses[name] = loss.detach().float()
            grads[name] = torch.cat([p.grad.flatten().float() for _, p in sorted(model.named_parameters())
                                     if p.grad is not None])
        assert torch.isfinite(grads["bf16"]).all(), "non-finite gradients under bf16 autocast"
        assert (losses["bf16"] - losses["fp32"]).abs() <= 0.05 * losses["fp32"].abs() + 1e-3, losses
        cos = torch.nn.functional.cosine_similarity(grads["bf16"], grads["fp32"], dim=0)
        assert cos > 0.95, f"bf16 gradients point elsewhere (cosine {cos:.3f} to fp32)"

    def test_forward_does_not_mutate_batch(self):
        """The forward leaves every tensor of the batch unchanged."""
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
        """Every float output of the eval forward is finite."""
        torch.manual_seed(0)
        model = self.make_model().eval()
        with torch.no_grad():
            outs = self._flat(self.run(model, self.make_batch()))
        assert all(torch.isfinite(o).all() for o in outs if o.is_floating_point())


def _loss_and_saved_bytes(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, int]:
    """``fn()`` and the bytes autograd saved for backward meanwhile (outside checkpointed regions)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    return loss, total


class _ExampleChecks(ModelChecks):
    example: ModelExample

    def make_model(self) -> nn.Module:
        return self.example.build()

    def make_batch(self) -> dict[str, Any]:
        return self.example.inputs()

    def make_train_batch(self) -> dict[str, Any]:
        return (self.example.train_inputs or self.example.inputs)()

    def run(self, model: nn.Module, batch: dict[str, Any]) -> Any:
        return self.example.run(model, batch) if self.example.run else model(**batch)


def fsdp_gradient_report(methods: list[str], workdir: str | Path, checkpointing: bool = True
                         ) -> dict[str, dict[str, Any]]:
    """Per method: does one training step under FSDP2 over the launched processes give one process's gradients?

    Run by every rank of a ``torchrun`` job (gloo on CPU). Each rank builds the method's ``ModelExample`` from
    the same seed, computes the plain single-process gradients of ``training_step`` on the example's training
    batch, then builds it again, enables gradient checkpointing (as ``trainer=fsdp`` does), shards it with the
    trainer's own ``core.trainer.shard_fsdp`` and repeats the step with the same batch and RNG. Every rank sees
    the same batch, so the reduced (averaged) sharded gradients must equal the plain ones; they are gathered
    with ``full_tensor()`` and compared. Returns ``{method: {"ok", "max_abs_diff", "max_ref", "params",
    "error"}}`` (on every rank).
    """
    import traceback

    from torch.distributed.tensor import DTensor

    from core import distributed as D
    from core.trainer import StepModule, seed_everything, shard_fsdp

    device = torch.device("cpu")
    dist = D.init_distributed(device, need_group=True)
    report: dict[str, dict[str, Any]] = {}
    for method in methods:
        try:
            folder = Path(workdir) / method
            examples = []
            for turn in range(dist.world_size):  # one rank at a time: an example may write a tiny base once
                if turn == dist.rank:
                    examples.append(example_of(method, folder))
                D.barrier()
            example = examples[0]
            checks = example_checks(example)

            seed_everything(0)
            plain = example.build().train()
            assert hasattr(plain, "training_step"), f"{type(plain).__name__} has no training_step"
            seed_everything(1)
            plain.training_step(checks.make_train_batch())["loss"].backward()
            ref = {n: p.grad.detach().clone() for n, p in plain.named_parameters() if p.grad is not None}

            seed_everything(0)
            model = example.build().train()
            if checkpointing:
                model.enable_gradient_checkpointing()
            step = StepModule(model)
            shard_fsdp(step, model, device, dist.world_size)
            seed_everything(1)
            step(checks.make_train_batch())["loss"].backward()
            got = {}
            for n, p in model.named_parameters():
                if p.grad is not None:
                    g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                    got[n] = g.detach()
            if sorted(got) != sorted(ref):
                raise AssertionError(f"gradients for {len(got)} parameters under FSDP, {len(ref)} in one process: "
                                     f"{sorted(set(got) ^ set(ref))[:5]}")
            diffs = [(got[n] - ref[n]).abs().max().item() for n in ref]
            scale = max((ref[n].abs().max().item() for n in ref), default=0.0)
            worst = max(diffs, default=0.0)
            report[method] = {"ok": bool(worst <= 1e-5 * max(scale, 1.0) + 1e-6), "max_abs_diff": worst,
                              "max_ref": scale, "params": len(ref), "error": None}
        except Exception as e:  # noqa: BLE001 — one method's failure is its row, the others still run
            report[method] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                              "trace": traceback.format_exc()[-2000:]}
        D.barrier()
    return report


def _main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m core.testing", description="Maintain the contract test's golden files.")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("golden", help="recompute methods' golden outputs (tests/golden/<method>.safetensors)")
    g.add_argument("methods", nargs="+", metavar="METHOD", help="registered method names, or 'all'")
    g.add_argument("--why", required=True, help="why the output may change (logged in CHANGES.md)")
    g.add_argument("--dir", default=None, help="golden folder (default $EMBODIED_GOLDEN_DIR or tests/golden)")
    f = sub.add_parser("fsdp", help="(under torchrun) each method's FSDP2 training step vs one process; JSON")
    f.add_argument("methods", nargs="+", metavar="METHOD", help="registered method names, or 'all'")
    f.add_argument("--workdir", required=True, help="scratch folder for the examples' tiny bases")
    f.add_argument("--out", required=True, help="JSON report (written by rank 0)")
    f.add_argument("--no-checkpointing", action="store_true", help="shard without gradient checkpointing")
    args = p.parse_args(argv)
    from core.registry import load_plugins, method_specs

    load_plugins()
    names = [s.name for s in method_specs() if s.example] if args.methods == ["all"] else args.methods
    if args.cmd == "fsdp":
        import json

        from core import distributed as D
        from core.io import write_json

        report = fsdp_gradient_report(names, args.workdir, checkpointing=not args.no_checkpointing)
        if D.is_main_process():
            write_json(args.out, report)
            print(json.dumps({k: {kk: v for kk, v in r.items() if kk != "trace"} for k, r in report.items()}))
        D.cleanup()
        return 0
    for name in names:
        print(write_golden(name, args.why, args.dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
