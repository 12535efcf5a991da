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

The peer (``trajectories_vs_robomimic``): ``TrajectoryDataset`` against robomimic's ``SequenceDataset``
on the same HDF5 file and windows, windows/s through a plain ``DataLoader`` (batch 32, shuffled with the
same seed, default collate, CPU). The file mimics ``embodied sim rollout embodied/Lift-Panda-v0 --episodes
20 --image-size 84`` (20 episodes, 618 steps: 84 px gzip'd RGB frames chunked per frame, proprio (23),
eef_delta (6), actions (7), rewards, dones); ``--traj-file PATH`` measures a recorded file instead. Two
window shapes: ``1f1a`` (1 obs frame, 1 action) and ``8f8a`` (8 frames t-7..t, 8 actions; robomimic
``frame_stack=8, seq_length=1``, whose 8 actions are t-7..t: the same amount of data). Each loader runs
in its own forked process (HDF5 shares open datasets and their chunk caches inside one process, so
loaders in one process would speed each other up), one warm-up epoch, then rounds interleaved across
all loaders of a shape, each loader running epochs for at least 0.15 s (0.5 s) per round: the best epoch
counts; workers are persistent. ``--quick`` leaves out ``none`` with workers (robomimic's slowest).
    ``trajectories_vs_robomimic_<shape>_<mode>[_w2]``   ours / robomimic's windows/s with the same cache
        mode (``none``, ``low_dim``, ``all``; robomimic's ``hdf5_cache_mode`` None / "low_dim" / "all"),
        ``num_workers`` 0 (or 2 with ``_w2``). Goals: >= 1.5 for ``low_dim`` (0 and 2 workers), >= 1.0 for
        ``all`` with 0 workers.
    ``trajectories_<shape>_<mode>_vs_limit[_w2]``   ours / the limit's windows/s (1 = the dataset costs
        nothing beyond the DataLoader's own work; with workers, noise puts it a little above 1 at times).
The limit: the same DataLoader over our samples built beforehand and handed out by reference, i.e. the
collate (a copy of every batch) and, with workers, the transfer of each batch tensor to the main process.
That transfer costs about 0.5 ms per tensor per batch here (file-descriptor passing), so a sample with
our 9 keys is capped near 7,000 windows/s at batch 32 with 2 workers on 2 cores, robomimic's 6 keys near
10,000/s: with workers and ``all`` neither does work of its own, and robomimic's fewer keys win (no goal).
With ``all`` the images of a batch's samples are views of the cache, copied once by the collate (see
``TrajectoryDataset.__getitems__``), as robomimic hands out its cached arrays. Figures also hold the first
(cold) epoch of each loader and the bytes of our caches.
robomimic is a benchmark-only tool (``.venv/bin/pip install --no-deps robomimic==0.3.0 termcolor``);
without it that part is skipped with a one-line note.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import (
    Goal,
    default_device,
    parse_args,
    print_table,
    repeated_main,
    timeit,
    write_result,
)
from core.data.device import DeviceLoader, Normalize, RandomCrop, RandomHorizontalFlip, to_device
from core.data.images import DenseImageDataset, write_dense_sample, write_meta
from core.data.samplers import build_loader
from core.data.trajectories import CACHE_MODES, TrajectoryDataset, TrajectoryFile, TrajectoryWriter

ROBOMIMIC_INSTALL = ".venv/bin/pip install --no-deps robomimic==0.3.0 termcolor"

# Every reported ratio: held to a goal (its target and where the number comes from) or a plain figure.
GOALS = {
    "trajectories_vs_robomimic_*_low_dim*": Goal(">= 1.5", (
        "anchor: the README's Measured table (9.4 / 9.6): low-dimensional windows cached in memory against "
        "robomimic 0.3.0's SequenceDataset on the same file")),
    "trajectories_vs_robomimic_*_all": Goal(">= 1.0", (
        "limit: both fully cached, the same windows: ours must not be slower; the README's Measured table "
        "(1.20 / 1.09)")),
}
FIGURES_ONLY = ("trajectories_vs_robomimic_*", "trajectories_*_vs_limit*", "*_device_vs_decode_limit",
                "*_device_vs_plain")


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


# ------------------------------------------------------------------------------ the peer: robomimic
def lift_like_frames(rng: np.random.Generator, steps: int, size: int) -> np.ndarray:
    """(steps, size, size, 3) uint8 frames like a Lift rollout's (gzip'd about as well as rendered ones)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = np.stack([0.55 + 0.3 * yy, 0.5 + 0.2 * xx, 0.45 + 0.1 * yy * xx], -1) * 255
    base[int(size * 0.55) :] = (90, 70, 50)  # table
    out = np.empty((steps, size, size, 3), np.uint8)
    for t in range(steps):
        img = base.copy()
        cx, cy = int(size * (0.3 + 0.4 * t / steps)), int(size * (0.35 + 0.1 * np.sin(t / 3)))
        img[cy : cy + size // 6, cx : cx + size // 10] = (200, 200, 210)  # arm
        img[int(size * 0.5) : int(size * 0.6), size // 2 : size // 2 + size // 10] = (200, 30, 30)  # cube
        out[t] = np.clip(img + rng.normal(0, 0.6, img.shape), 0, 255)
    return out


def make_lift_like(path: Path, episodes: int = 20, size: int = 84, seed: int = 0) -> Path:
    """Write a file laid out like the recorder's Lift-Panda rollouts (20 episodes: 618 steps at seed 0)."""
    rng = np.random.default_rng(seed)
    with TrajectoryWriter(path, env_meta={"env_name": "bench"}) as w:
        for steps in rng.integers(27, 35, episodes).tolist():
            w.add_episode(
                {
                    "image": lift_like_frames(rng, steps, size),
                    "proprio": rng.normal(size=(steps, 23)).astype(np.float32),
                    "eef_delta": rng.normal(size=(steps, 6)).astype(np.float32),
                },
                rng.normal(size=(steps, 7)).astype(np.float32),
                attrs={"embodiment": "Panda"},
            )
    return path


def _loader(dataset, batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0),
        num_workers=workers, persistent_workers=workers > 0,
    )  # fmt: skip


def ours(path: Path, frames: int, cache: str, batch_size: int, workers: int):
    """A DataLoader over ``TrajectoryDataset`` windows of ``frames`` obs frames and ``frames`` actions."""
    ds = TrajectoryDataset(path, horizon=frames, frame_stack=frames, cache=cache)
    return _loader(ds, batch_size, workers), {"cache_mib": round(ds.cache_nbytes / 2**20, 1)}


def robomimic(path: Path, frames: int, cache: str, batch_size: int, workers: int):
    """The same windows through robomimic's ``SequenceDataset`` (``hdf5_cache_mode`` None for "none")."""
    import robomimic.utils.obs_utils as obs_utils
    from robomimic.utils.dataset import SequenceDataset

    with TrajectoryFile(path) as f:
        name = f.episodes[0]
        keys = f.obs_keys(name)
        rgb = [k for k in keys if f.dataset(name, f"obs/{k}").ndim == 4]
    obs_utils.initialize_obs_utils_with_obs_specs(
        {"obs": {"rgb": rgb, "low_dim": [k for k in keys if k not in rgb]}}
    )
    ds = SequenceDataset(
        str(path), obs_keys=keys, dataset_keys=("actions", "rewards", "dones"), frame_stack=frames,
        seq_length=1, hdf5_cache_mode=None if cache == "none" else cache, load_next_obs=False,
    )  # fmt: skip
    return _loader(ds, batch_size, workers), {}


class _Precomputed(torch.utils.data.Dataset):
    """Samples built beforehand and handed out as they are: what the DataLoader costs by itself."""

    def __init__(self, items: list):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


def limit(path: Path, frames: int, cache: str, batch_size: int, workers: int):
    """The DataLoader alone over our samples (collate and, with workers, the transfer of each batch)."""
    ds = TrajectoryDataset(path, horizon=frames, frame_stack=frames, cache="all")
    return _loader(_Precomputed([ds[i] for i in range(len(ds))]), batch_size, workers), {}


def _serve(conn, build: Callable[[], tuple[Iterable, dict]]) -> None:
    """Child process: build a loader; then per request ``min_s``, run epochs for at least ``min_s`` seconds
    (at least one) and answer the best epoch's windows/s; stop when sent None."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            loader, info = build()
        conn.send(("ready", info))
        while (min_s := conn.recv()) is not None:
            best, start = 0.0, time.perf_counter()
            while best == 0.0 or time.perf_counter() - start < min_s:
                t0, n = time.perf_counter(), 0
                for batch in loader:
                    n += len(batch["actions"])
                best = max(best, n / (time.perf_counter() - t0))
            conn.send(("epoch", best))
    except Exception as e:  # reported by the parent in one line
        conn.send(("error", f"{type(e).__name__}: {e}"))


class _Server:
    """A loader living in its own forked process (own HDF5 state); ``epoch()`` times one pass."""

    def __init__(self, build: Callable[[], tuple[Iterable, dict]]):
        self.conn, child = mp.get_context("fork").Pipe()
        self.proc = mp.get_context("fork").Process(target=_serve, args=(child, build))
        self.proc.start()
        self.info = self._get()

    def _get(self):
        kind, value = self.conn.recv()
        if kind == "error":
            self.close()
            raise RuntimeError(value)
        return value

    def epoch(self, min_s: float = 0.0) -> float:
        """Windows per second of the best of the epochs run in ``min_s`` seconds (at least one epoch)."""
        self.conn.send(min_s)
        return self._get()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()


def trajectories_vs_robomimic(path: Path, quick: bool, workers: Iterable[int], batch_size: int = 32):
    """Windows/s of ours, robomimic and the DataLoader limit per window shape, cache mode and worker count.

    Returns:
        ``(rows, ratios, figures)`` for the table and the result JSON (see the module docstring).
    """
    repeats, min_s = (4, 0.15) if quick else (5, 0.5)  # rounds; seconds per loader and round (fast ones)
    rows, ratios, figures = [], {}, {}
    for frames in (1, 8):
        shape = f"{frames}f{frames}a"
        for w in workers:
            modes = CACHE_MODES if w == 0 or not quick else ("low_dim", "all")  # --quick: no w2 "none"
            servers: dict[tuple[str, str], _Server] = {}
            try:
                for mode in modes:
                    for impl, make in (("ours", ours), ("robomimic", robomimic)):
                        servers[impl, mode] = _Server(partial(make, path, frames, mode, batch_size, w))
                servers["limit", ""] = _Server(partial(limit, path, frames, "all", batch_size, w))
                first = {k: s.epoch() for k, s in servers.items()}  # workers started, chunk caches filled
                sps = dict.fromkeys(servers, 0.0)
                for _ in range(repeats):  # interleaved rounds, best epoch
                    for k, s in servers.items():
                        sps[k] = max(sps[k], s.epoch(min_s))
            finally:
                for s in servers.values():
                    s.close()
            end = f"_w{w}" if w else ""
            lim = sps["limit", ""]
            figures[f"limit_{shape}{end}_windows_per_s"] = round(lim, 1)
            for mode in modes:
                suffix = f"{shape}_{mode}{end}"
                ours_sps, rm_sps = sps["ours", mode], sps["robomimic", mode]
                ratios[f"trajectories_vs_robomimic_{suffix}"] = ours_sps / rm_sps
                if mode != "none":
                    ratios[f"trajectories_{shape}_{mode}_vs_limit{end}"] = ours_sps / lim
                for impl in ("ours", "robomimic"):
                    name = "trajectories" if impl == "ours" else impl
                    figures[f"{name}_{suffix}_windows_per_s"] = round(sps[impl, mode], 1)
                    figures[f"{name}_{suffix}_first_epoch_windows_per_s"] = round(first[impl, mode], 1)
                figures[f"trajectories_{shape}_{mode}_cache_mib"] = servers["ours", mode].info["cache_mib"]
                rows.append({"window": shape, "cache": mode, "workers": w, "ours windows/s": ours_sps,
                             "robomimic windows/s": rm_sps, "ours / robomimic": ours_sps / rm_sps,
                             "first epoch ours / robomimic": first["ours", mode] / first["robomimic", mode],
                             "limit windows/s": lim})  # fmt: skip
    return rows, ratios, figures


def robomimic_available() -> bool:
    """Whether robomimic's ``SequenceDataset`` imports (it is a benchmark-only tool, not a dependency)."""
    if importlib.util.find_spec("robomimic") is None:
        return False
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from robomimic.utils.dataset import SequenceDataset  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--traj-file", type=Path, default=None, help="recorded HDF5 file for the peer part")
    known, rest = extra.parse_known_args()
    args = parse_args(__doc__ + "\n--traj-file PATH: a recorded HDF5 file for the peer part", rest)
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
        print_table(rows)
        if robomimic_available():
            path = known.traj_file or make_lift_like(Path(tmp) / "lift_like.hdf5")
            cfg["peer"] = {"file": str(known.traj_file or "lift-like synthetic, 20 episodes, 84 px"),
                           "batch_size": 32, "workers": [0, workers] if workers else [0]}  # fmt: skip
            peer_rows, peer_ratios, peer_figures = trajectories_vs_robomimic(
                path, quick, cfg["peer"]["workers"]
            )
            print_table(peer_rows)
            ratios.update(peer_ratios)
            figures.update(peer_figures)
        else:
            print(f"robomimic not installed: trajectories_vs_robomimic skipped ({ROBOMIMIC_INSTALL})")
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    write_result(
        "loaders", f"{device} ({name})" if device.startswith("cuda") else device, quick, ratios, figures, cfg,
        goals=GOALS, figures_only=FIGURES_ONLY,
    )  # fmt: skip


if __name__ == "__main__":
    repeated_main(main)
