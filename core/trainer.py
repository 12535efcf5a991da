"""The one training loop every method uses.

Single process or ``torchrun`` DDP (gloo on CPU, NCCL on CUDA); gradient accumulation and clipping;
bf16 autocast on CUDA; optional EMA; periodic atomic checkpoints; TensorBoard + ``metrics.jsonl``;
a progress bar. A run killed at any moment (SIGKILL included) and started again with the same
config resumes from its newest checkpoint and reaches the same weights as an uninterrupted run:
model, EMA, optimizer, scheduler, every RNG, and the position inside the epoch are all restored,
and the data order depends only on (seed, epoch).

The model contract (LeRobot / Lightning style)::

    class MyModel(nn.Module):
        def training_step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
            ...                          # must return {"loss": scalar, other scalars to log ...}
        def param_groups(self) -> dict[str, list[nn.Parameter]]:   # optional: named groups whose
            ...                                                     # lr comes from optim.param_group_lrs

Frozen parameters (``requires_grad=False``) are left out of the optimizer.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from core import checkpoint as ckpt
from core import distributed as D
from core.config import TrainerConfig
from core.data.device import BatchTransform, DeviceLoader
from core.data.samplers import ResumableDistributedSampler
from core.errors import ConfigError, EmbodiedError
from core.logging import MetricsLogger, get_logger, progress

log = get_logger("embodied.trainer")


class TrainingError(EmbodiedError):
    """Training cannot go on (e.g. a non-finite loss); the last checkpoint is intact."""


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and Python's ``random``."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _last_logged(out_dir: Path) -> dict[str, float]:
    """The last row of ``metrics.jsonl`` (what a finished run reports when started again)."""
    import json

    path = Path(out_dir) / "metrics.jsonl"
    try:
        rows = [ln for ln in path.read_text().splitlines() if ln.strip()]
        row = json.loads(rows[-1]) if rows else {}
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}


class _StopRequest:
    """SIGINT / SIGTERM during ``fit``: finish the current optimizer step, save a checkpoint, then stop.

    A second SIGINT interrupts at once (the default handler is back after the first). Only the main thread
    can install handlers; elsewhere (e.g. a training thread) the signals keep their defaults. Under DDP the
    request is shared with an all-reduce so every rank saves the same step.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        import signal

        self.signal_name = signal.Signals(signum).name
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))  # a second one acts at once

    def requested(self, distributed: bool, device: torch.device | None = None) -> bool:
        flag = self.signal_name is not None
        if distributed:  # on the model's device: NCCL reduces CUDA tensors only
            t = torch.tensor(float(flag), device=device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            flag = bool(t.item())
            if flag:
                self.signal_name = self.signal_name or "a signal on another rank"
        return flag

    def uninstall(self) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class _StepModule(nn.Module):
    """What DDP wraps: its forward is the model's ``training_step`` so DDP's hooks see every step."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.model.training_step(batch)


class EMA:
    """Exponential moving average of a model's floating-point parameters and buffers.

    The decay warms up as ``min(decay, (1 + n) / (10 + n))`` after ``n`` updates (the usual schedule, e.g.
    timm's / diffusers' EMA warm-up): without it a short run's average keeps ``decay ** steps`` of the
    initial weights (22 % after 1500 steps at 0.999), and with zero-initialised output layers (adaLN-Zero)
    that shrinks every prediction.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    def decay_at(self, step: int) -> float:
        """The decay of the update that follows optimizer step ``step`` (1-based)."""
        return min(self.decay, step / (9.0 + step))

    @torch.no_grad()
    def update(self, model: nn.Module, step: int | None = None) -> None:
        decay = self.decay if step is None else self.decay_at(step)
        src = model.state_dict()
        for k, v in self.module.state_dict().items():
            if v.dtype.is_floating_point:
                v.lerp_(src[k].to(v.dtype), 1.0 - decay)
            else:
                v.copy_(src[k])


def lr_lambda(cfg: TrainerConfig) -> Callable[[int], float]:
    """Multiplier of the base lr at optimizer step ``s``: linear warm-up, then constant / cosine / linear."""
    sch, total = cfg.scheduler, cfg.max_steps

    def f(s: int) -> float:
        if s < sch.warmup_steps:
            return (s + 1) / sch.warmup_steps
        if sch.name == "constant":
            return 1.0
        progress_ = min(1.0, (s - sch.warmup_steps) / max(1, total - sch.warmup_steps))
        decay = 0.5 * (1 + math.cos(math.pi * progress_)) if sch.name == "cosine" else 1.0 - progress_
        return sch.min_lr_ratio + (1 - sch.min_lr_ratio) * decay

    return f


def build_optimizer(model: nn.Module, cfg: TrainerConfig) -> torch.optim.Optimizer:
    """AdamW / Adam / SGD over trainable parameters. Named groups from ``model.param_groups()`` get their
    own lr; matrices get weight decay, biases and norm scales (1-d tensors) do not.

    Raises:
        ConfigError: ``optim.param_group_lrs`` names an unknown group, a trainable parameter is in no group
            of ``param_groups()`` (it would silently never be optimised), or nothing is trainable.
    """
    o = cfg.optim
    named_groups: dict[str, list[nn.Parameter]]
    if hasattr(model, "param_groups"):
        named_groups = dict(model.param_groups())
    else:
        named_groups = {"default": list(model.parameters())}
    unknown = set(o.param_group_lrs) - set(named_groups)
    if unknown:
        raise ConfigError(f"trainer.optim.param_group_lrs names unknown parameter groups {sorted(unknown)}; "
                          f"the model has {sorted(named_groups)}")
    groups, seen = [], set()
    for name, params in named_groups.items():
        params = [p for p in params if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in params)
        lr = o.param_group_lrs.get(name, o.lr)
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        if decay:
            groups.append({"params": decay, "lr": lr, "weight_decay": o.weight_decay, "name": f"{name}"})
        if no_decay:
            groups.append({"params": no_decay, "lr": lr, "weight_decay": 0.0, "name": f"{name}.no_decay"})
    left_out = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in seen]
    if left_out:
        more = f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""
        raise ConfigError(f"{len(left_out)} trainable parameters are in no group of {type(model).__name__}"
                          f".param_groups() and would never be optimised: {', '.join(left_out[:5])}{more} "
                          f"(add them to a group, or set requires_grad=False to freeze them)")
    if not groups:
        raise ConfigError("the model has no trainable parameters")
    if o.name == "adamw":
        return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps)
    if o.name == "adam":
        return torch.optim.Adam(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps)
    return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum)


def default_collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors key by key; non-tensor values become lists."""
    out: dict[str, Any] = {}
    for k in samples[0]:
        vals = [s[k] for s in samples]
        out[k] = torch.stack(vals) if isinstance(vals[0], torch.Tensor) else vals
    return out


class Trainer:
    """Trains ``model`` on ``dataset`` under ``cfg``; outputs go to ``out_dir``.

    Args:
        model: An ``nn.Module`` with ``training_step`` (see the module docstring).
        dataset: A map-style dataset of dicts of tensors.
        cfg: The trainer config.
        out_dir: Run directory: ``checkpoints/``, ``metrics.jsonl``, ``tensorboard/``.
        run_config: The resolved run config (plain dict) stored in every checkpoint's ``config.json``.
        collate_fn: Batch collation (defaults to stacking every tensor key).
        transforms: Device-side batch transforms (``core.data.device``: ``RandomCrop``,
            ``RandomHorizontalFlip``, ``Normalize`` or any ``(batch, generator) -> batch``), applied by the
            ``DeviceLoader`` after the (prefetched, side-stream) host->device copy. Their generator is
            seeded by (seed, micro-batch number), so a resumed run sees the same augmentations.
        hooks: Callables ``(trainer, step, metrics)`` run on rank 0 after every logging step.
    """

    def __init__(
        self,
        model: nn.Module,
        dataset: Dataset,
        cfg: TrainerConfig,
        out_dir: str | Path,
        run_config: dict[str, Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        transforms: Sequence[BatchTransform] | None = None,
        hooks: list[Callable[[Trainer, int, dict[str, float]], None]] | None = None,
        find_unused_parameters: bool = False,
    ):
        if not hasattr(model, "training_step"):
            raise ConfigError(f"{type(model).__name__} has no training_step(batch) method")
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.run_config = run_config or {}
        self.device = D.resolve_device(cfg.device)
        self.dist = D.init_distributed(self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.model = model.to(self.device)
        if cfg.gradient_checkpointing:
            if not hasattr(model, "enable_gradient_checkpointing"):
                raise ConfigError(f"{type(model).__name__} does not support gradient checkpointing")
            model.enable_gradient_checkpointing()
        self.step_module: nn.Module = _StepModule(self.model)
        if self.dist.enabled:
            self.step_module = nn.parallel.DistributedDataParallel(
                self.step_module,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=find_unused_parameters,
            )
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.ema = EMA(self.model, cfg.ema_decay) if cfg.ema_decay else None
        self.dataset = dataset
        if len(dataset) < 1:
            raise ConfigError("the training dataset is empty")
        # Data order is a function of (seed, epoch, world size) only, split between ranks as
        # DistributedSampler does, so 2 ranks see the same global batches as 1 rank with twice the batch.
        self.sampler = ResumableDistributedSampler(dataset, self.dist.world_size, self.dist.rank,
                                                   shuffle=cfg.shuffle, seed=cfg.seed)
        self._loader_gen = torch.Generator()
        self.loader = DataLoader(
            dataset,
            batch_size=cfg.batch_size,
            sampler=self.sampler,
            num_workers=cfg.num_workers,
            collate_fn=collate_fn or default_collate,
            pin_memory=self.device.type == "cuda",
            drop_last=cfg.drop_last,
            generator=self._loader_gen,  # never touch the global RNG (resume equivalence)
            persistent_workers=False,
        )
        self.device_loader = DeviceLoader(self.loader, self.device, prefetch=2, transforms=transforms, seed=cfg.seed)
        if len(self.loader) < 1:
            raise ConfigError(
                f"trainer.batch_size={cfg.batch_size} is larger than the {len(dataset)} samples this rank sees"
            )
        self.hooks = hooks or []
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0  # micro-batches of this epoch already consumed
        self.micro_step = 0  # micro-batches consumed in total
        self.autocast_dtype = self._autocast_dtype()

    # ------------------------------------------------------------------------------------------
    def _autocast_dtype(self) -> torch.dtype | None:
        p = self.cfg.precision
        if p == "bf16" or (p == "auto" and self.device.type == "cuda"):
            return torch.bfloat16
        return None

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _batches(self):
        """Yield device batches forever, advancing (epoch, batch_in_epoch) deterministically."""
        while True:
            self.sampler.set_epoch(self.epoch)
            self.sampler.set_start_index(self.batch_in_epoch * self.cfg.batch_size)
            self._loader_gen.manual_seed(self.cfg.seed * 1_000_003 + self.epoch * 101 + self.dist.rank)
            self.device_loader.set_step(self.micro_step)  # augmentation of batch k depends on (seed, k) only
            for batch in self.device_loader:
                self.batch_in_epoch += 1
                self.micro_step += 1
                yield batch
            self.epoch += 1
            self.batch_in_epoch = 0

    # ------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        rng = ckpt.capture_rng()
        if self.dist.enabled:
            gathered: list[Any] = [None] * self.dist.world_size
            torch.distributed.all_gather_object(gathered, rng)
            rng_per_rank = gathered
        else:
            rng_per_rank = [rng]
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "micro_step": self.micro_step,
            "world_size": self.dist.world_size,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_per_rank,
        }

    def save(self) -> Path | None:
        """Write ``checkpoints/step_<N>`` (rank 0) and point ``latest`` at it."""
        state = self.state()  # collective under DDP: every rank calls it
        path = None
        if self.dist.is_main:
            name = f"step_{self.step:08d}"
            path = ckpt.save_checkpoint(self.ckpt_dir / name, self.model, self.run_config, state,
                                        ema=self.ema.module if self.ema else None)
            ckpt.mark_latest(self.ckpt_dir, name)
            ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.keep_last)
        D.barrier()
        return path

    def resume(self) -> bool:
        """Load the newest checkpoint in ``out_dir`` if there is one; returns whether it did."""
        latest = ckpt.latest_checkpoint(self.ckpt_dir)
        if latest is None:
            return False
        loaded = ckpt.load_checkpoint(latest, self.model, ema=self.ema.module if self.ema else None)
        st = loaded["training_state"]
        if st is None:
            raise TrainingError(f"{latest}: has no training state to resume from")
        if st["world_size"] != self.dist.world_size:
            raise TrainingError(f"{latest}: written by {st['world_size']} processes, resuming with "
                                f"{self.dist.world_size} would change the data order")
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        ckpt.restore_rng(st["rng"][self.dist.rank])
        self.step, self.epoch, self.batch_in_epoch = st["step"], st["epoch"], st["batch_in_epoch"]
        self.micro_step = st["micro_step"]
        if self.dist.is_main:
            log.info("resumed from %s (step %d)", latest, self.step)
        return True

    # ------------------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to ``cfg.max_steps``; returns ``{"step", "metrics", "checkpoint"}``."""
        cfg = self.cfg
        resumed = cfg.resume and self.resume()
        if not resumed:
            seed_everything(cfg.seed + self.dist.rank)
        logger = MetricsLogger(self.out_dir, enabled=self.dist.is_main, tensorboard=cfg.tensorboard,
                               resume_step=self.step if resumed else None)
        params = [p for p in self.model.parameters() if p.requires_grad]
        bar = progress(total=cfg.max_steps, initial=self.step, desc="train",
                       enabled=cfg.progress and self.dist.is_main)
        batches = self._batches()
        last: dict[str, float] = {}
        ckpt_path: Path | None = None
        if self.step >= cfg.max_steps:  # a finished run started again: say where its results are
            ckpt_path = ckpt.latest_checkpoint(self.ckpt_dir)
            last = _last_logged(self.out_dir)
        t0 = time.perf_counter()
        stop = _StopRequest()
        try:
            stop.install()
            while self.step < cfg.max_steps:
                self.step_module.train()
                self.optimizer.zero_grad(set_to_none=True)
                sums: dict[str, float] = {}
                for micro in range(cfg.grad_accum):
                    batch = next(batches)
                    sync = micro == cfg.grad_accum - 1 or not self.dist.enabled
                    ctx = contextlib.nullcontext() if sync else self.step_module.no_sync()
                    with ctx:
                        with self._autocast():
                            out = self.step_module(batch)
                        loss = out["loss"]
                        if not torch.isfinite(loss.detach()).all():
                            raise TrainingError(
                                f"non-finite loss ({loss.item()}) at step {self.step}; the last checkpoint "
                                f"({ckpt.latest_checkpoint(self.ckpt_dir) or 'none'}) is intact"
                            )
                        (loss.float() / cfg.grad_accum).backward()
                    for k, v in out.items():
                        if isinstance(v, torch.Tensor) and v.numel() == 1:
                            sums[k] = sums.get(k, 0.0) + float(v.detach()) / cfg.grad_accum
                if cfg.grad_clip is not None:
                    sums["grad_norm"] = float(nn.utils.clip_grad_norm_(params, cfg.grad_clip))
                self.optimizer.step()
                self.scheduler.step()
                self.step += 1
                if self.ema is not None:
                    self.ema.update(self.model, self.step)
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                    last = {k: float(D.all_reduce_mean(torch.tensor(v))) for k, v in sums.items()}
                    last["lr"] = self.scheduler.get_last_lr()[0]
                    last["epoch"] = self.epoch
                    if self.dist.is_main:
                        logger.log(self.step, last)
                        bar.set_postfix(loss=f"{last.get('loss', float('nan')):.4g}")
                        for hook in self.hooks:
                            hook(self, self.step, last)
                if self.step % cfg.ckpt_every == 0 or self.step == cfg.max_steps:
                    ckpt_path = self.save()
                if stop.requested(self.dist.enabled, params[0].device if params else None):  # Ctrl-C / SIGTERM: keep this step's work, then stop
                    saved = ckpt_path if self.step % cfg.ckpt_every == 0 else self.save()
                    log.warning("%s at step %d: saved %s; run the same command to resume", stop.signal_name,
                                self.step, saved)
                    raise KeyboardInterrupt(f"stopped by {stop.signal_name} at step {self.step}")
        finally:
            stop.uninstall()
            bar.close()
            logger.close()
        return {"step": self.step, "metrics": last, "checkpoint": ckpt_path,
                "seconds": time.perf_counter() - t0}
