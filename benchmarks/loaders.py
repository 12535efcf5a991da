"""Benchmark: the shared device loader against a plain DataLoader and against the decode limit.

Three ways to consume the same dataset (same DataLoader settings, same device-side transforms):
    decode_limit   iterate the DataLoader alone: decode + collate, nothing moved, nothing transformed
    plain          DataLoader + per-batch ``.to(device)`` + the transforms, all synchronous
    device         ``core.data.device.DeviceLoader`` (pinned memory, side-stream prefetch on CUDA)
on two datasets generated into a temp dir at start: dense-label images (rgb + 16-bit normals + depth)
and trajectories (HDF5, two image streams + proprio, frame_stack 2, horizon 8).

Ratios (samples/s over samples/s; higher is better):
    ``<data>_device_vs_decode_limit``   1.0 = the loader costs nothing beyond decoding; goal >= 0.9
    ``<data>_device_vs_plain``          > 1.0 = faster than DataLoader + .to(device)
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import default_device, parse_args, print_table, timeit, write_result
from core.data.device import DeviceLoader, Normalize, RandomCrop, RandomHorizontalFlip, to_device
from core.data.images import DenseImageDataset, write_dense_sample, write_meta
from core.data.samplers import build_loader
from core.data.trajectories import TrajectoryDataset, TrajectoryWriter


def make_images(root: Path, n: int, size: int) -> DenseImageDataset:
    rng = np.random.default_rng(0)
    write_meta(root)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for i in range(n):
        rgb = (np.stack([yy, xx, np.full_like(xx, i / n)], -1) * 255).astype(np.uint8)
        rgb = np.clip(rgb.astype(int) + rng.integers(0, 8, rgb.shape), 0, 255).astype(np.uint8)
        nz = -np.ones_like(xx)
        normals = np.stack([xx - 0.5, yy - 0.5, nz], -1)
        normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
        depth = 1.0 + yy + 0.1 * i / n
        write_dense_sample(root, "train", f"{i:05d}", rgb=rgb, normals=normals, depth=depth)
    return DenseImageDataset(root, keys=["rgb", "normals", "depth"])


def make_trajectories(path: Path, episodes: int, steps: int, size: int) -> TrajectoryDataset:
    rng = np.random.default_rng(0)
    with TrajectoryWriter(path, env_meta={"env_name": "bench"}) as w:
        for _ in range(episodes):
            w.add_episode(
                {
                    "agentview_rgb": rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8),
                    "eye_in_hand_rgb": rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8),
                    "proprio": rng.normal(size=(steps, 9)).astype(np.float32),
                },
                rng.normal(size=(steps, 7)).astype(np.float32),
                attrs={"embodiment": "Panda"},
            )
    return TrajectoryDataset(path, horizon=8, frame_stack=2)


def measure(dataset, device: str, crop: int, batch_size: int, workers: int, repeats: int) -> dict[str, float]:
    transforms = [RandomCrop(crop), RandomHorizontalFlip(lateral_dims=[1]), Normalize()]
    loader = build_loader(dataset, batch_size, num_workers=workers, seed=0, persistent_workers=workers > 0,
                          pin_memory=device.startswith("cuda"), drop_last=True)  # fmt: skip
    n = len(loader) * batch_size

    def decode_only():
        for _ in loader:
            pass

    def plain():
        g = torch.Generator().manual_seed(0)
        for batch in loader:
            batch = to_device(batch, device)
            for t in transforms:
                batch = t(batch, g)

    dl = DeviceLoader(loader, device, prefetch=2, transforms=transforms)

    def device_loader():
        for _ in dl:
            pass

    modes = {"decode_limit": decode_only, "plain": plain, "device": device_loader}
    times: dict[str, list[float]] = {k: [] for k in modes}
    for fn in modes.values():  # warm-up: workers started, files cached
        fn()
    for _ in range(repeats):  # interleaved, so drift in machine load hits every mode alike
        for name, fn in modes.items():
            times[name] += timeit(fn, warmup=0, repeats=1, device=device).times
    out = {k: n / float(np.median(v)) for k, v in times.items()}
    return out


def main() -> None:
    args = parse_args(__doc__)
    device = default_device(args.device)
    torch.set_num_threads(1)
    quick = args.quick
    workers = min(2, os.cpu_count() or 1)
    cfg = {
        "images": {"n": 96 if quick else 512, "size": 64 if quick else 256, "crop": 56 if quick else 224},
        "trajectories": {
            "episodes": 10 if quick else 40,
            "steps": 16 if quick else 100,
            "size": 32 if quick else 128,
        },
        "batch_size": 8 if quick else 32,
        "num_workers": workers,
        "repeats": 5 if quick else 7,
    }
    t0 = time.perf_counter()
    rows, ratios, figures = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_loaders_") as tmp:
        c = cfg["images"]
        images = make_images(Path(tmp) / "dense", c["n"], c["size"])
        c = cfg["trajectories"]
        trajs = make_trajectories(Path(tmp) / "traj.hdf5", c["episodes"], c["steps"], c["size"])
        crops = {"images": cfg["images"]["crop"], "trajectories": cfg["trajectories"]["size"] - 4}
        for name, ds in (("images", images), ("trajectories", trajs)):
            sps = measure(ds, device, crops[name], cfg["batch_size"], workers, cfg["repeats"])
            for k, v in sps.items():
                figures[f"{name}_{k}_samples_per_s"] = round(v, 2)
            ratios[f"{name}_device_vs_decode_limit"] = sps["device"] / sps["decode_limit"]
            ratios[f"{name}_device_vs_plain"] = sps["device"] / sps["plain"]
            rows.append({"data": name, **{f"{k} samples/s": v for k, v in sps.items()}})
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    print_table(rows)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    write_result(
        "loaders", f"{device} ({name})" if device.startswith("cuda") else device, quick, ratios, figures, cfg
    )


if __name__ == "__main__":
    main()
