from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from core.data.samplers import GroupedBatchSampler, ResumableDistributedSampler, build_loader, build_sampler


class Range(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor(i), torch.tensor(np.random.randint(0, 2**31))


def test_sampler_deterministic_per_seed_and_epoch():
    ds = Range(23)
    a, b = build_sampler(ds, seed=3), build_sampler(ds, seed=3)
    assert isinstance(a, torch.utils.data.DistributedSampler)
    assert list(a) == list(b) and sorted(a) == list(range(23))
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(23))
    assert list(build_sampler(ds, seed=4)) != first
    assert list(build_sampler(ds, shuffle=False)) == list(range(23))


def test_sampler_resume_mid_epoch():
    ds = Range(23)
    s = build_sampler(ds, seed=0)
    s.set_epoch(2)
    full = list(s)
    s.set_start_index(10)
    assert list(s) == full[10:] and len(s) == 13
    r = build_sampler(ds, seed=0)
    r.load_state_dict(s.state_dict())
    assert list(r) == full[10:]
    s.set_epoch(3)
    assert len(s) == 23  # a new epoch starts from the beginning
    with pytest.raises(ValueError, match="start_index"):
        s.set_start_index(24)


def test_replicas_partition_the_dataset():
    ds = Range(20)
    parts = [list(ResumableDistributedSampler(ds, num_replicas=3, rank=r, seed=1)) for r in range(3)]
    assert all(len(p) == 7 for p in parts)  # padded to 21
    assert set().union(*parts) == set(range(20))


def test_loader_workers_seeded_and_reproducible():
    def run():
        loader = build_loader(Range(8), batch_size=2, num_workers=2, seed=9)
        return torch.cat([b[0] for b in loader]).tolist(), torch.cat([b[1] for b in loader]).tolist()

    (idx1, rnd1), (idx2, rnd2) = run(), run()
    assert idx1 == idx2 and sorted(idx1) == list(range(8))
    assert rnd1 == rnd2  # numpy in workers is seeded from the loader seed
    assert len(set(rnd1)) == len(rnd1)  # and differs between workers / samples


def test_grouped_batch_sampler():
    groups = {"a": list(range(0, 10)), "b": list(range(10, 15))}
    s = GroupedBatchSampler(groups, batch_size=4, seed=0)
    batches = list(s)
    assert sorted(i for b in batches for i in b) == list(range(15))
    assert all(set(b) <= set(groups["a"]) or set(b) <= set(groups["b"]) for b in batches)
    assert list(GroupedBatchSampler(groups, batch_size=4, seed=0)) == batches
    s.set_start_index(2)
    assert list(s) == batches[2:]
    ranks = [list(GroupedBatchSampler(groups, 4, seed=0, num_replicas=2, rank=r)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    assert {i for r in ranks for b in r for i in b} == set(range(15))
