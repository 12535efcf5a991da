"""Samplers and DataLoader construction: deterministic given (seed, epoch), DDP-aware, resumable mid-epoch.

Resuming mid-epoch (what the trainer does)::

    sampler = build_sampler(dataset, shuffle=True, seed=cfg.seed)
    sampler.set_epoch(epoch)                       # resets the start offset to 0
    sampler.set_start_index(batches_done * batch_size)   # per-rank offset into this epoch's order
    loader = build_loader(dataset, batch_size, num_workers, seed, sampler=sampler)

The order of an epoch depends only on (seed, epoch, num_replicas), so the resumed run sees exactly the
samples the interrupted run had not yet seen, in the same order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

__all__ = [
    "GroupedBatchSampler",
    "ResumableDistributedSampler",
    "build_loader",
    "build_sampler",
    "seed_worker",
]


def _dist_info(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return (num_replicas if num_replicas is not None else dist.get_world_size(),
                rank if rank is not None else dist.get_rank())  # fmt: skip
    return (num_replicas or 1, rank or 0)


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can start an epoch at a sample offset (for mid-epoch resume).

    Outside ``torch.distributed`` it behaves as a single replica (``num_replicas=1, rank=0``): a seeded
    permutation (or ``range``) of the whole dataset. Shuffling uses ``torch.Generator`` seeded with
    ``seed + epoch``, so the order is a function of (seed, epoch, num_replicas) only.

    Args:
        dataset: Any sized dataset.
        num_replicas: World size; from ``torch.distributed`` when initialised, else 1.
        rank: This process's rank; from ``torch.distributed`` when initialised, else 0.
        shuffle: Permute each epoch.
        seed: Base seed shared by all ranks.
        drop_last: Drop the tail so every rank gets the same count (else pad by repeating indices).
        start_index: Skip this many of this rank's samples in the current epoch.
    """

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        start_index: int = 0,
    ):
        num_replicas, rank = _dist_info(num_replicas, rank)
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self.start_index = 0
        self.set_start_index(start_index)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order and reset the start offset to 0."""
        super().set_epoch(epoch)
        self.start_index = 0

    def set_start_index(self, start_index: int) -> None:
        """Start the current epoch at this rank's ``start_index``-th sample (call after ``set_epoch``)."""
        if not 0 <= start_index <= self.num_samples:
            raise ValueError(f"start_index {start_index} outside [0, {self.num_samples}]")
        self.start_index = int(start_index)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start_index :])

    def __len__(self) -> int:
        return self.num_samples - self.start_index

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "start_index", "seed"}``."""
        return {"epoch": self.epoch, "start_index": self.start_index, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore ``state_dict()`` (epoch first, then the offset)."""
        self.set_epoch(int(state["epoch"]))
        self.set_start_index(int(state.get("start_index", 0)))


class GroupedBatchSampler(Sampler[list[int]]):
    """Batches drawn from one group at a time (e.g. one embodiment, so one action dim per batch).

    Each epoch: every group's indices are permuted, cut into batches of ``batch_size``, and the batches
    of all groups are shuffled together (all with ``torch.Generator`` seeded by ``seed + epoch``). Under
    ``torch.distributed`` rank ``r`` takes batches ``r, r + world, ...`` (the list is padded by repeating
    batches so that every rank gets the same number).

    Args:
        groups: group name -> dataset indices (``TrajectoryDataset.groups()``).
        batch_size: Samples per batch.
        shuffle: Permute within groups and across batches.
        seed: Base seed shared by all ranks.
        drop_last: Drop each group's final short batch.
        num_replicas: World size (from ``torch.distributed`` when initialised, else 1).
        rank: This rank (from ``torch.distributed`` when initialised, else 0).
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[int]],
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.groups = {k: list(v) for k, v in groups.items() if len(v)}
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.num_replicas, self.rank = _dist_info(num_replicas, rank)
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order and reset the start offset."""
        self.epoch, self.start_batch = int(epoch), 0

    def set_start_index(self, start_batch: int) -> None:
        """Skip this rank's first ``start_batch`` batches of the current epoch (mid-epoch resume)."""
        self.start_batch = int(start_batch)

    def _batches(self) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        batches: list[list[int]] = []
        for name in sorted(self.groups):
            idx = self.groups[name]
            if self.shuffle:
                idx = [idx[i] for i in torch.randperm(len(idx), generator=g).tolist()]
            for s in range(0, len(idx), self.batch_size):
                b = idx[s : s + self.batch_size]
                if len(b) == self.batch_size or not self.drop_last:
                    batches.append(b)
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        if self.num_replicas > 1 and batches:
            per_rank = -(-len(batches) // self.num_replicas)
            batches += batches[: per_rank * self.num_replicas - len(batches)]
            batches = batches[self.rank :: self.num_replicas]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches()[self.start_batch :])

    def __len__(self) -> int:
        return max(0, len(self._batches()) - self.start_batch)


def build_sampler(
    dataset: Dataset, shuffle: bool = True, seed: int = 0, drop_last: bool = False
) -> ResumableDistributedSampler:
    """The sampler every loader uses: ``ResumableDistributedSampler`` (a ``DistributedSampler``).

    Under an initialised ``torch.distributed`` process group it shards across ranks; otherwise it is a
    single-replica sampler over the whole dataset. Deterministic given (seed, epoch).
    """
    return ResumableDistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed ``random`` and ``numpy`` from the worker's torch seed (set by DataLoader)."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def build_loader(
    dataset: Dataset,
    batch_size: int,
    num_workers: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    sampler: Sampler | None = None,
    batch_sampler: Sampler[list[int]] | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    pin_memory: bool | None = None,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
) -> DataLoader:
    """A ``DataLoader`` with a deterministic, DDP-aware, resumable sampler and seeded workers.

    Args:
        dataset: Map-style dataset.
        batch_size: Samples per batch (per rank). Ignored when ``batch_sampler`` is given.
        num_workers: Worker processes (0 = load in the main process).
        seed: Seeds the sampler order and the workers' base seed.
        shuffle: Shuffle each epoch (when ``sampler`` is not given).
        drop_last: Drop the last incomplete batch.
        sampler: Use this sampler instead of ``build_sampler(dataset, shuffle, seed)``.
        batch_sampler: Use this batch sampler (e.g. ``GroupedBatchSampler``) instead.
        collate_fn: Batch collation (default: ``torch.utils.data.default_collate``).
        pin_memory: Pin host memory; default True when CUDA is available.
        persistent_workers: Keep workers alive between epochs.
        prefetch_factor: Batches each worker loads ahead (DataLoader default when None).
    """
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs["persistent_workers"] = persistent_workers
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    generator = torch.Generator().manual_seed(seed)
    if batch_sampler is not None:
        return DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            worker_init_fn=seed_worker,
            generator=generator,
            **kwargs,
        )
    if sampler is None:
        sampler = build_sampler(dataset, shuffle=shuffle, seed=seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        drop_last=drop_last,
        worker_init_fn=seed_worker,
        generator=generator,
        **kwargs,
    )
