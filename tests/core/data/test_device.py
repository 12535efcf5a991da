from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from core.data.device import DeviceLoader, Normalize, RandomCrop, RandomHorizontalFlip, augment_seed
from core.data.samplers import build_loader

B, T, H, W = 4, 2, 6, 8


def coord_batch() -> dict[str, torch.Tensor]:
    """Every spatial key encodes (row, col) of each pixel, so crops / flips can be checked across keys."""
    rows = torch.arange(H).view(H, 1).expand(H, W)
    cols = torch.arange(W).view(1, W).expand(H, W)
    sample = torch.arange(B).view(B, 1, 1)
    rgb = torch.stack([rows.expand(B, H, W), cols.expand(B, H, W), sample.expand(B, H, W)], 1).to(torch.uint8)
    normals = torch.randn(B, 3, H, W)
    return {
        "rgb": rgb,  # (B, 3, H, W)
        "obs.image": rgb[:, None].expand(B, T, 3, H, W).clone(),  # (B, T, 3, H, W) frame stack
        "normals": normals / normals.norm(dim=1, keepdim=True),
        "valid": (rows * W + cols).expand(B, H, W).clone(),  # (B, H, W)
        "depth": (rows * 100 + cols).float().expand(B, 1, H, W).clone(),
        "actions": torch.randn(B, 3, 7),
        "episode_index": torch.arange(B),
    }


def test_flip_negates_normal_x_and_lateral_actions():
    batch = coord_batch()
    flip = RandomHorizontalFlip(p=1.0, lateral_dims=[1, 5])
    out = flip(batch, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out["normals"][:, 0], -batch["normals"][:, 0].flip(-1))
    torch.testing.assert_close(out["normals"][:, 1:], batch["normals"][:, 1:].flip(-1))
    assert torch.equal(out["rgb"], batch["rgb"].flip(-1))
    assert torch.equal(out["obs.image"], batch["obs.image"].flip(-1))
    assert torch.equal(out["valid"], batch["valid"].flip(-1))
    sign = torch.tensor([1, -1, 1, 1, 1, -1, 1.0])
    torch.testing.assert_close(out["actions"], batch["actions"] * sign)
    assert torch.equal(out["episode_index"], batch["episode_index"])
    twice = flip(out, torch.Generator().manual_seed(0))
    for k in batch:
        assert torch.equal(twice[k], batch[k]), k


def test_flip_is_per_sample_and_seeded():
    batch = coord_batch()
    flip = RandomHorizontalFlip(p=0.5)
    out = flip(batch, torch.Generator().manual_seed(3))
    flipped = (out["rgb"][:, 1, 0, 0] == W - 1).tolist()
    assert out["normals"].shape == batch["normals"].shape
    for b, f in enumerate(flipped):
        expect_x = -batch["normals"][b, 0].flip(-1) if f else batch["normals"][b, 0]
        torch.testing.assert_close(out["normals"][b, 0], expect_x)
        assert bool(out["valid"][b, 0, 0] == W - 1) == f
    again = flip(batch, torch.Generator().manual_seed(3))
    assert all(torch.equal(again[k], out[k]) for k in out)


def test_crop_is_consistent_across_keys():
    batch = coord_batch()
    out = RandomCrop((4, 5))(batch, torch.Generator().manual_seed(1))
    assert out["rgb"].shape == (B, 3, 4, 5) and out["obs.image"].shape == (B, T, 3, 4, 5)
    assert out["valid"].shape == (B, 4, 5) and out["depth"].shape == (B, 1, 4, 5)
    assert out["actions"].shape == batch["actions"].shape  # not spatial
    offsets = set()
    for b in range(B):
        r0, c0 = int(out["rgb"][b, 0, 0, 0]), int(out["rgb"][b, 1, 0, 0])
        offsets.add((r0, c0))
        rows = torch.arange(r0, r0 + 4).view(4, 1)
        cols = torch.arange(c0, c0 + 5).view(1, 5)
        assert torch.equal(out["rgb"][b, 0].long(), rows.expand(4, 5))
        assert torch.equal(out["rgb"][b, 1].long(), cols.expand(4, 5))
        assert torch.equal(out["obs.image"][b, 1], out["rgb"][b])
        assert torch.equal(out["valid"][b], rows * W + cols)
        assert torch.equal(out["depth"][b, 0], (rows * 100 + cols).float())
        torch.testing.assert_close(out["normals"][b], batch["normals"][b, :, r0 : r0 + 4, c0 : c0 + 5])
    assert len(offsets) > 1  # offsets are drawn per sample


def test_normalize():
    batch = {"rgb": torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), "depth": torch.ones(2, 1, 4, 4)}
    out = Normalize(mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 1.0))(batch, torch.Generator())
    assert out["rgb"].dtype == torch.float32
    torch.testing.assert_close(out["rgb"][0, :, 0, 0], torch.tensor([1.0, 3.0, 1.0]))
    assert out["depth"] is batch["depth"]


class CoordDataset(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        n = torch.randn(3, H, W, generator=g)
        return {
            "rgb": torch.randint(0, 256, (3, H, W), generator=g, dtype=torch.uint8),
            "normals": n / n.norm(dim=0, keepdim=True),
            "actions": torch.randn(7, generator=g),
            "index": torch.tensor(i),
        }


def transforms():
    return [RandomCrop(4), RandomHorizontalFlip(lateral_dims=[1]), Normalize()]


def test_cpu_device_loader_equals_plain_iteration():
    loader = DataLoader(CoordDataset(), batch_size=3)
    plain = list(loader)
    got = list(DeviceLoader(loader, "cpu"))
    assert len(got) == len(plain) == 4
    for a, b in zip(plain, got):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # with transforms: batch `step` is augmented with the generator seeded by (seed, step)
    dl = DeviceLoader(loader, "cpu", transforms=transforms(), seed=7)
    for step, (a, b) in enumerate(zip(plain, dl)):
        g = torch.Generator().manual_seed(augment_seed(7, step))
        for t in transforms():
            a = t(a, g)
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert dl.step == 4 and dl.state_dict() == {"seed": 7, "step": 4}


def test_resume_mid_epoch_sees_identical_batches():
    ds = CoordDataset()
    full_loader = build_loader(ds, batch_size=2, seed=5)
    full_loader.sampler.set_epoch(1)
    dl = DeviceLoader(full_loader, "cpu", transforms=transforms(), seed=11, step=5)  # epoch 0 took 5 steps
    full = list(dl)
    # "crash" after 2 batches of epoch 1, resume from the saved states
    resumed_loader = build_loader(ds, batch_size=2, seed=5)
    resumed_loader.sampler.set_epoch(1)
    resumed_loader.sampler.set_start_index(2 * 2)
    resumed = DeviceLoader(resumed_loader, "cpu", transforms=transforms())
    resumed.load_state_dict({"seed": 11, "step": 5 + 2})
    tail = list(resumed)
    assert len(tail) == len(full) - 2
    for a, b in zip(full[2:], tail):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(full[0]["rgb"], full[1]["rgb"])


def test_prefetch_must_be_positive():
    with pytest.raises(ValueError, match="prefetch"):
        DeviceLoader([], "cpu", prefetch=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    loader = DataLoader(CoordDataset(), batch_size=3, pin_memory=True)
    cpu = list(DeviceLoader(loader, "cpu", transforms=transforms(), seed=1))
    gpu = list(DeviceLoader(loader, "cuda", transforms=transforms(), seed=1, prefetch=3))
    for a, b in zip(cpu, gpu):
        for k in a:
            assert b[k].is_cuda
            torch.testing.assert_close(a[k], b[k].cpu())
