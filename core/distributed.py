"""Process-group helpers for single-process and ``torchrun`` runs (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


def is_main_process() -> bool:
    """Whether this process writes a run's shared outputs (an exported model, the resolved config).

    Rank 0 of the process group, or of torchrun's ``RANK`` before the group is joined; a plain process always.
    The other ranks must not write the same folder too: two ``atomic_dir`` renames onto one path race, and the
    second fails with "Directory not empty". Pair it with ``barrier()`` so no rank reads the output early.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def barrier() -> None:
    """Wait for every rank (a no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


#: Beside a folder that ``main_process_first`` makes: why the last process to try failed (waiters read it).
FAILED_SUFFIX = ".failed.json"


@contextlib.contextmanager
def main_process_first(lock: str | os.PathLike | None = None, wait: float = 6 * 3600.0) -> Iterator[None]:
    """Run the block in one process first, then in the others, which find what it made and only read it.

    For making shared data (a rendered dataset, a recording) that every process of a run asks for. The block
    must be idempotent: it makes the data when it is missing and otherwise just checks it.

    * ``lock`` given (the folder or file the block makes): the processes run the block one at a time under its
      file lock (``core.outputs.lock_folder``: ``flock``, released by the OS when a holder dies). This is what
      methods use: their data is made before the ``Trainer`` creates the process group, and the lock also
      serialises separate runs started at once, and several nodes that share a file system. If the block raises,
      its error line is kept beside the folder (``.<name>.failed.json``) and every process that was already
      waiting raises a one-line ``DataError`` naming it instead of making the data again; a later run tries
      afresh.
    * No ``lock``, under an initialised process group of several ranks: rank 0 runs the block while the others
      wait (``broadcast_object_list``, under the group's timeout), then whether it succeeded is broadcast; the
      others then run it, or raise a one-line ``DataError`` when rank 0 failed.
    * Otherwise the block just runs.

    Args:
        lock: The folder (or file) the block makes; its lock file is ``.<name>.lock`` beside it.
        wait: Seconds to wait for the process holding the lock before giving up (a one-line ``OutputError``).

    Raises:
        DataError: The process that ran the block first failed (its error is in the message).
    """
    from core.errors import DataError

    if lock is not None:
        from core.io import write_json
        from core.outputs import lock_folder

        target = Path(lock).absolute()
        note = target.with_name(f".{target.name}{FAILED_SUFFIX}")
        asked = time.time()
        with lock_folder(target, wait=wait):
            failed = _read_failure(note)
            if failed is not None and failed.get("time", 0.0) >= asked:  # the holder we waited for failed
                raise DataError(target, f"process {failed.get('pid')} failed making it: {failed.get('error')} "
                                        "(run again to retry)")
            try:
                yield
            except Exception as e:
                line = (str(e).strip().splitlines() or [""])[0]
                write_json(note, {"pid": os.getpid(), "time": time.time(), "error": f"{type(e).__name__}: {line}"})
                raise
            if failed is not None:
                note.unlink(missing_ok=True)
        return
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        yield
        return
    if dist.get_rank() == 0:
        try:
            yield
        except BaseException as e:
            line = (str(e).strip().splitlines() or [""])[0]
            dist.broadcast_object_list([f"{type(e).__name__}: {line}"], src=0)
            raise
        dist.broadcast_object_list([None], src=0)
        return
    outcome: list[str | None] = [None]
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise DataError("rank 0", f"failed before this rank could run the same step: {outcome[0]}")
    yield


def _read_failure(note: Path) -> dict | None:
    try:
        found = json.loads(note.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of ``value`` over ranks (returns ``value`` itself when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return value


def cleanup() -> None:
    """Destroy the process group, if one was initialised.

    Under gloo with several ranks, the ranks first meet at a monitored barrier (60 s): a rank that tears its
    group down while the other still has a collective in flight leaves that one's gloo threads to die at exit
    (SIGABRT, "terminate called without an active exception"; seen once in CI on the 2-rank DDP test). A rank
    that never arrives (it crashed) costs the barrier's timeout, not a hang.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() > 1 and dist.get_backend() == "gloo":
        with contextlib.suppress(RuntimeError):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    dist.destroy_process_group()
