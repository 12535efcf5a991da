"""Process-group helpers for single-process and ``torchrun`` runs (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size`` (``local_rank`` on its node)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the process that logs and writes)."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    """True when the environment carries torchrun's ``RANK`` / ``WORLD_SIZE`` variables."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(device: torch.device, need_group: bool = False) -> DistInfo:
    """Join the process group torchrun describes; returns this rank's info.

    A single process gets no group, unless ``need_group`` (FSDP, whose sharded tensors live on a device mesh
    even when it has one rank): it then gets an in-process one-rank group (no ports, no environment).
    """
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        if not need_group:
            return DistInfo()
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        atexit.register(cleanup)
        return DistInfo(local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend=backend)
    # Tear the group down before interpreter shutdown: left to static destructors, gloo's worker threads
    # are destroyed while still joinable and the process aborts ("terminate called without an active
    # exception", SIGABRT) after training has already succeeded.
    atexit.register(cleanup)
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


def resolve_strategy(strategy: str, world_size: int) -> str:
    """``trainer.strategy`` -> what runs: ``single``, ``ddp`` or ``fsdp``.

    ``auto`` / ``ddp`` with one process run plainly; ``fsdp`` stays ``fsdp`` on any number of processes.
    """
    if strategy == "fsdp":
        return "fsdp"
    return "ddp" if world_size > 1 else "single"


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` -> this process's CUDA device when there is one (``LOCAL_RANK``), else CPU."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        from core.errors import ConfigError

        raise ConfigError("trainer.device asks for CUDA but no CUDA device is visible")
    return device


def barrier() -> None:
    """Wait for every rank (a no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of ``value`` over ranks (returns ``value`` itself when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return value


def cleanup() -> None:
    """Destroy the process group, if one was initialised."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
