"""The one training loop every method uses.

Single process, ``torchrun`` DDP or FSDP2 (gloo on CPU, NCCL on CUDA); gradient accumulation and clipping;
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

On-policy methods (RL post-training: rollouts drawn from the live model, as TRL's ``GRPOTrainer`` does inside
transformers' ``Trainer``) add two optional hooks::

        def prepare_batch(self, batch) -> batch:   # called with every micro-batch, before training_step, under
            ...                                    # no_grad and the training autocast, with the current weights
        def training_state(self) -> dict: ...      # this rank's extra state (e.g. a replay buffer, counters) ...
        def load_training_state(self, state): ...  # ... stored in every checkpoint and restored on resume

``prepare_batch`` runs through the same wrapped module as ``training_step`` (``StepModule(method=...)``), so
under DDP / FSDP every rank runs it (FSDP gathers the shards for its forwards) and it may draw samples from the
model; ``Trainer.call_model(method, batch)`` runs any other such method the same way (e.g. a final evaluation).
Both must do the same forwards on every rank. The extra state is kept per rank, like the RNG states.

``trainer.strategy=fsdp`` shards parameters, gradients and optimizer state over the processes with torch's
FSDP2 ``fully_shard``: each unit (``trainer.fsdp_wrap`` class names, else ``model.fsdp_units()``, else every
``nn.ModuleList`` element -- transformer blocks) is sharded on its own, then the rest with the root. Under
bf16 the shards are gathered in bf16 and gradients reduced in fp32. Checkpoints are gathered to full CPU
tensors on rank 0 and written in the usual format (the optimizer state in ``Optimizer.state_dict`` layout),
so a plain process loads them and a DDP checkpoint resumes under FSDP (same world size) and back. No EMA.
Gradients are reduce-scattered after every micro-batch (no ``no_sync``: it would keep full gradients).
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
from core.errors import CheckpointError, ConfigError, EmbodiedError
from core.layers.checkpointing import block_units, checkpoint_modules
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


class StepModule(nn.Module):
    """What DDP wraps: its forward is the model's ``training_step`` so DDP's hooks see every step.

    ``method`` calls another method of the model instead (``prepare_batch``, ``Trainer.call_model``): it still runs
    inside the root's forward, so FSDP gathers the root's shards around it.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, Any], method: str = "training_step") -> Any:
        """``model.<method>(batch)``."""
        return getattr(self.model, method)(batch)


class _FullWeights(nn.Module):
    """Stands in for the model in ``ckpt.save_checkpoint``: its ``state_dict`` is the one given.

    That is the gathered one under FSDP, and only the trained tensors for a model around a base.
    """

    def __init__(self, weights: dict[str, torch.Tensor]):
        super().__init__()
        self._weights = weights

    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        return self._weights


def fsdp_units(model: nn.Module, wrap: Sequence[str] | None = None) -> list[nn.Module]:
    """The submodules FSDP shards as units of their own, deepest first (``fully_shard`` goes bottom-up).

    ``wrap`` (class names) picks every submodule of those classes; without it ``model.fsdp_units()`` decides
    when the model has that method, else every element of the outermost ``nn.ModuleList``s. Units without
    parameters are dropped (they would shard nothing).

    Raises:
        ConfigError: A name in ``wrap`` matches no submodule, or ``fsdp_units()`` returns a foreign module.
    """
    named: list[tuple[str, nn.Module]]
    if wrap is not None:
        named = [(n, m) for n, m in model.named_modules() if n and type(m).__name__ in set(wrap)]
        missing = set(wrap) - {type(m).__name__ for _, m in named}
        if missing:
            raise ConfigError(f"trainer.fsdp_wrap names {sorted(missing)}, but {type(model).__name__} has no "
                              f"submodule of that class")
    elif hasattr(model, "fsdp_units"):
        chosen = {id(m) for m in model.fsdp_units()}
        named = [(n, m) for n, m in model.named_modules() if n and id(m) in chosen]
        if len(named) != len(chosen - {id(model)}):
            raise ConfigError(f"{type(model).__name__}.fsdp_units() returned modules that are not its submodules")
    else:
        named = block_units(model)  # the same blocks gradient checkpointing recomputes
    named = [(n, m) for n, m in named if next(m.parameters(), None) is not None]
    return [m for _, m in sorted(named, key=lambda nm: -nm[0].count("."))]


def shard_fsdp(step_module: nn.Module, model: nn.Module, device: torch.device, world_size: int,
               param_dtype: torch.dtype | None = None, wrap: Sequence[str] | None = None,
               reshard_after_forward: bool = True, find_unused_parameters: bool = False) -> None:
    """FSDP2: ``fully_shard`` every unit of ``model`` (``fsdp_units``), then ``step_module`` as the root.

    The root is the step module (which calls ``model.training_step``) rather than the model, so that its
    pre-forward hook (which gathers the root's parameters) runs around the whole ``training_step``, not only
    around ``model.forward``. ``param_dtype`` (bf16) gathers weights in that dtype and reduces gradients in
    fp32. The contract test's FSDP check shards every method's example with this same function.

    ``find_unused_parameters`` (DDP's option; FSDP2's ``set_reduce_scatter_unused_params``), on several ranks: a
    trainable parameter that a backward gave no gradient on this rank is reduced with a zero gradient (one that
    no rank used gets a zero gradient, not none). Without it each rank reduce-scatters only the gradients it has,
    so a step that uses a parameter on one rank and not on another (control flow drawn per rank) reduce-scatters
    different sizes: a collective mismatch. One rank has no one to match, and keeps plain training's ``None``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype is not None \
        else MixedPrecisionPolicy()
    for unit in fsdp_units(model, wrap):
        fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    # The batch reaches training_step as the loader made it (targets keep their dtype); autocast sets the
    # compute dtype as under the other strategies.
    root_mp = MixedPrecisionPolicy(param_dtype=mp.param_dtype, reduce_dtype=mp.reduce_dtype, cast_forward_inputs=False)
    fully_shard(step_module, mesh=mesh, mp_policy=root_mp)
    if find_unused_parameters and world_size > 1:
        step_module.set_reduce_scatter_unused_params(True)  # the root and every unit


def unshard_fsdp(root: nn.Module) -> None:
    """Undo ``fully_shard`` on ``root`` and every submodule, in place: a collective (every rank calls it).

    Each sharded parameter becomes a plain ``nn.Parameter`` holding its full tensor (on the shard's device, same
    dtype and ``requires_grad``; tied parameters stay tied), and each FSDP module gets its own class back without
    FSDP's hooks and state, so the modules are plain again: a plain forward, ``save_pretrained`` or another
    ``fully_shard`` (a later training stage) work on them. torch has no public inverse of ``fully_shard``; this
    removes exactly what it adds (``tests/core/test_fsdp.py`` checks it on the installed torch).
    """
    from torch.distributed import _composable_state
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    modules = list(root.modules())
    for m in modules:
        if isinstance(m, FSDPModule):
            m.reshard()  # the sharded parameters registered (also after a forward without backward)
    full: dict[int, nn.Parameter] = {}
    with torch.no_grad():
        for m in modules:  # same order on every rank: one all-gather per parameter
            for name, p in list(m._parameters.items()):
                if isinstance(p, DTensor):
                    if id(p) not in full:
                        full[id(p)] = nn.Parameter(p.full_tensor().clone(), requires_grad=p.requires_grad)
                    m._parameters[name] = full[id(p)]
    for m in modules:
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            for handle in {id(h): h for h in (state._pre_forward_hook_handle, state._post_forward_hook_handle)
                           }.values():
                handle.remove()
            cls = type(m)
            m.__class__ = cls.__mro__[cls._orig_cls_mro_index]
        _composable_state._module_state_mapping.pop(m, None)
        for key in (STATE_KEY, REGISTRY_KEY, "_is_fsdp_managed_module", "_fsdp_use_orig_params"):
            m.__dict__.pop(key, None)


def _optim_state_indexed(named: dict[str, Any]) -> dict[str, Any]:
    """A full optimizer state dict keyed by parameter name -> the ``Optimizer.state_dict()`` layout.

    The input is what ``torch.distributed.checkpoint`` gives; the output numbers parameters in group order, as
    checkpoints store them.
    """
    index: dict[str, int] = {}
    groups = []
    for g in named["param_groups"]:
        groups.append({**g, "params": [index.setdefault(n, len(index)) for n in g["params"]]})
    return {"state": {index[n]: v for n, v in named["state"].items()}, "param_groups": groups}


def _optim_state_named(indexed: dict[str, Any], model: nn.Module,
                       optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Inverse of ``_optim_state_indexed`` for ``optimizer`` over ``model``.

    The optimizer is built by ``build_optimizer``, whose parameter order is deterministic, so index ``i`` is the
    same parameter it was when saved.
    """
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    try:
        groups = [{**g, "params": [order[i] for i in g["params"]]} for g in indexed["param_groups"]]
        state = {order[int(i)]: v for i, v in indexed["state"].items()}
    except IndexError:
        raise CheckpointError("the checkpoint's optimizer state has more parameters than this optimizer") from None
    return {"state": state, "param_groups": groups}


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
        """Move the average towards ``model``'s weights (warmed-up decay of ``step`` when given)."""
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
    """AdamW / Adam / SGD over trainable parameters.

    Named groups from ``model.param_groups()`` get their own lr; matrices get weight decay, biases and norm
    scales (1-d tensors) do not.

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
        hooks: Callables ``(trainer, step, metrics)`` run on rank 0 after every logging step. Under FSDP
            ``trainer.model`` holds shards and a hook, running on rank 0 alone, must not gather them.
        find_unused_parameters: Some steps leave some trainable parameters without a gradient, and which ones
            may differ between ranks (e.g. a branch drawn per step): DDP's ``find_unused_parameters``, and under
            FSDP those parameters are reduced with zero gradients (``shard_fsdp``). No effect in one process.
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
        self.dist = D.init_distributed(self.device, need_group=cfg.strategy == "fsdp")
        self.strategy = D.resolve_strategy(cfg.strategy, self.dist.world_size)  # single | ddp | fsdp
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.autocast_dtype = self._autocast_dtype()
        # What a checkpoint holds: every tensor, or (a model around a referenced base) only what it trains.
        self.checkpoint_keys: set[str] | None = ckpt.trained_keys(model)
        # Under FSDP the model stays where it is until fully_shard moves each rank's shard to the device.
        self.model = model if self.strategy == "fsdp" else model.to(self.device)
        if cfg.gradient_checkpointing:
            self._enable_checkpointing(model)
        self.step_module: nn.Module = StepModule(self.model)
        self._released = False  # release() made the model plain again (FSDP removed)
        self.find_unused_parameters = find_unused_parameters
        if self.strategy == "ddp":
            self.step_module = nn.parallel.DistributedDataParallel(
                self.step_module,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=find_unused_parameters,
            )
        elif self.strategy == "fsdp":
            self._shard()
        self.optimizer = build_optimizer(self.model, cfg)  # after sharding: it holds the DTensor shards
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

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def _enable_checkpointing(model: nn.Module) -> None:
        """The model's own ``enable_gradient_checkpointing``, else its ``block_units`` (a plain module)."""
        try:
            if hasattr(model, "enable_gradient_checkpointing"):
                model.enable_gradient_checkpointing()
            else:
                checkpoint_modules(m for _, m in block_units(model))
        except ValueError as e:
            raise ConfigError(f"trainer.gradient_checkpointing: {type(model).__name__}: {e}") from None

    def _shard(self) -> None:
        """FSDP2 over all processes (``shard_fsdp``) with the trainer's precision and wrap settings."""
        shard_fsdp(self.step_module, self.model, self.device, self.dist.world_size, self.autocast_dtype,
                   wrap=self.cfg.fsdp_wrap, reshard_after_forward=self.cfg.fsdp_reshard_after_forward,
                   find_unused_parameters=self.find_unused_parameters)

    def release(self) -> nn.Module:
        """The model as a plain module again, after training; under FSDP a collective (every rank calls it).

        Under FSDP the model's parameters are shards (DTensors) and its modules FSDP's, so a plain forward,
        ``save_pretrained`` or another ``Trainer`` (a later stage) cannot use it: this gathers every parameter to
        its full tensor and removes FSDP from the modules in place (``unshard_fsdp``; the model and its submodules
        stay the same objects, on this rank's device). This trainer cannot train afterwards. Without FSDP it
        returns the model unchanged.
        """
        if self.strategy == "fsdp" and not self._released:
            unshard_fsdp(self.step_module)
            self._released = True
        return self.model

    def call_model(self, method: str, batch: Any) -> Any:
        """``model.<method>(batch)`` through the wrapped step module, under no_grad and the training autocast.

        Under DDP / FSDP a collective: every rank calls it (FSDP gathers the shards its forwards use).
        """
        with torch.no_grad(), self._autocast():
            return self.step_module(batch, method=method)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full weights.

        Under FSDP a collective (every rank calls it) that gathers them to CPU on rank 0 and returns ``{}`` on
        the others; otherwise ``model.state_dict()``.
        """
        if self.strategy != "fsdp":
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def _optimizer_state(self) -> dict[str, Any]:
        """``optimizer.state_dict()``; under FSDP gathered to rank 0 (``{}`` elsewhere) in the same layout."""
        if self.strategy != "fsdp":
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        named = get_optimizer_state_dict(self.model, self.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _optim_state_indexed(named) if named else {}

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
    def _per_rank(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (a collective under DDP / FSDP)."""
        if not self.dist.enabled:
            return [obj]
        gathered: list[Any] = [None] * self.dist.world_size
        torch.distributed.all_gather_object(gathered, obj)
        return gathered

    def state(self) -> dict[str, Any]:
        """The training state a checkpoint stores besides the weights.

        Counters, optimizer, scheduler, the RNGs of every rank and, when the model has one, its
        ``training_state()`` of every rank.
        """
        rng_per_rank = self._per_rank(ckpt.capture_rng())
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "micro_step": self.micro_step,
            "world_size": self.dist.world_size,
            "optimizer": self._optimizer_state(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_per_rank,
            **({"model_state": self._per_rank(self.model.training_state())}
               if hasattr(self.model, "training_state") else {}),
        }

    def save(self) -> Path | None:
        """Write ``checkpoints/step_<N>`` (rank 0) and point ``latest`` at it."""
        state = self.state()  # collective under DDP / FSDP: every rank calls it
        weights = self.full_state_dict()  # collective under FSDP
        path = None
        if self.dist.is_main:
            name = f"step_{self.step:08d}"
            keep = self.checkpoint_keys
            model = _FullWeights({k: v for k, v in weights.items() if keep is None or k in keep})
            ema = _FullWeights({k: v for k, v in self.ema.module.state_dict().items() if keep is None or k in keep}) \
                if self.ema else None
            path = ckpt.save_checkpoint(self.ckpt_dir / name, model, self.run_config, state, ema=ema)
            ckpt.mark_latest(self.ckpt_dir, name)
            ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.keep_last)
        D.barrier()
        return path

    def resume(self) -> bool:
        """Load the newest checkpoint in ``out_dir`` if there is one; returns whether it did."""
        latest = ckpt.latest_checkpoint(self.ckpt_dir)
        if latest is None:
            return False
        if self.strategy == "fsdp":
            st = self._load_sharded(latest)
        else:
            loaded = ckpt.load_checkpoint(latest, self.model, ema=self.ema.module if self.ema else None)
            st = loaded["training_state"]
            self._check_resumable(latest, st)
            self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        ckpt.restore_rng(st["rng"][self.dist.rank])
        if hasattr(self.model, "load_training_state"):
            if "model_state" not in st:
                raise TrainingError(f"{latest}: has no model training state ({type(self.model).__name__} keeps one)")
            self.model.load_training_state(st["model_state"][self.dist.rank])
        self.step, self.epoch, self.batch_in_epoch = st["step"], st["epoch"], st["batch_in_epoch"]
        self.micro_step = st["micro_step"]
        if self.dist.is_main:
            log.info("resumed from %s (step %d)", latest, self.step)
        return True

    def _check_resumable(self, path: Path, st: dict[str, Any] | None) -> None:
        if st is None:
            raise TrainingError(f"{path}: has no training state to resume from")
        if st["world_size"] != self.dist.world_size:
            raise TrainingError(f"{path}: written by {st['world_size']} processes, resuming with "
                                f"{self.dist.world_size} would change the data order")

    def _load_sharded(self, path: Path) -> dict[str, Any]:
        """FSDP resume: rank 0 reads the full checkpoint and scatters weights and optimizer state to the shards.

        Every rank gets the rest of the training state (counters, scheduler, RNGs); that rest is returned.
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        weights: dict[str, torch.Tensor] = {}
        optim: dict[str, Any] = {}
        payload: list[Any] = [None]
        if self.dist.is_main:
            try:
                st = ckpt.load_checkpoint(path)["training_state"]  # weights are scattered below, not loaded
                self._check_resumable(path, st)
                weights = ckpt.load_weights(path / ckpt.MODEL_FILE)
                own = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}  # DTensor: global shape
                need = set(own) if self.checkpoint_keys is None else self.checkpoint_keys
                bad = sorted((need - set(weights)) | (set(weights) - set(own))) + sorted(
                    k for k in own if k in weights and tuple(weights[k].shape) != own[k])
                if bad:
                    raise CheckpointError(f"{path / ckpt.MODEL_FILE} does not match the model: {len(bad)} missing, "
                                          f"unexpected or mis-shaped keys ({', '.join(bad[:5])})")
                optim = _optim_state_named(st.pop("optimizer"), self.model, self.optimizer)
                payload = [st]
            except (CheckpointError, TrainingError) as e:
                payload = [e]
        torch.distributed.broadcast_object_list(payload, src=0)  # a failure on rank 0 stops every rank
        if isinstance(payload[0], Exception):
            raise payload[0]
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        # a model around a base holds only its trained tensors in the file: the rest stays as built from the base
        set_model_state_dict(self.model, weights, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=self.checkpoint_keys is None))
        set_optimizer_state_dict(self.model, self.optimizer, optim, options=opts)
        return payload[0]

    # ------------------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to ``cfg.max_steps``; returns ``{"step", "metrics", "checkpoint"}``."""
        cfg = self.cfg
        if self._released:
            raise TrainingError("this trainer released its model (release()); build a new Trainer to train it")
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
                    if hasattr(self.model, "prepare_batch"):  # on-policy: e.g. rollouts of the current weights
                        batch = self.call_model("prepare_batch", batch)
                    sync = micro == cfg.grad_accum - 1 or self.strategy != "ddp"
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
                # Ctrl-C / SIGTERM: keep this step's work, then stop
                if stop.requested(self.dist.enabled, params[0].device if params else None):
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
