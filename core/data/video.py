"""Video clips from mp4 files or frame folders, and an atomic mp4 writer.

Decoding and encoding go through imageio-ffmpeg (its bundled ffmpeg; libx264, yuv420p). PyAV is not
installed in this environment, so it is not used.

Sources: ``*.mp4`` / ``*.mov`` / ``*.avi`` / ``*.mkv`` / ``*.webm`` files, and folders of frames
(``*.png`` / ``*.jpg``, sorted by the number in the name, else by name).

Sample of ``VideoClipDataset``:
    ``video``        (T, 3, H, W) uint8 RGB, frames ``start, start + stride, ..., start + (T-1) stride``
    ``video_index``  () int64, index into ``dataset.sources``
    ``start``        () int64, first frame index
The same samples with ``cache="none"`` (one ffmpeg run per mp4 clip) and ``cache="all"`` (every source decoded
once at construction and held in memory).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import DataError
from core.io import atomic_path

__all__ = ["VideoClipDataset", "probe_video", "read_frames", "write_mp4"]

VIDEO_EXTS = (".mp4", ".mov", ".avi", ".mkv", ".webm")
FRAME_EXTS = (".png", ".jpg", ".jpeg")


def write_mp4(
    path: str | os.PathLike, frames: np.ndarray | Sequence[np.ndarray], fps: float = 30.0, crf: int = 18
) -> Path:
    """Encode (T, H, W, 3) uint8 RGB frames to an H.264 mp4, atomically (temp file + rename).

    Odd frame sizes are padded by one pixel (edge-replicated) at the bottom / right, as yuv420p needs
    even dimensions.

    Args:
        path: Destination ``.mp4``.
        frames: (T, H, W, 3) uint8 array or a sequence of (H, W, 3) uint8 frames.
        fps: Frames per second.
        crf: x264 constant rate factor (0 = lossless luma, 18 = visually lossless, 23 = default).
    """
    import imageio_ffmpeg

    path = Path(path)
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise ValueError(f"frames must be (T, H, W, 3) uint8 with T >= 1, got {frames.shape} {frames.dtype}")
    _, h, w, _ = frames.shape
    ph, pw = h % 2, w % 2
    if ph or pw:
        frames = np.pad(frames, ((0, 0), (0, ph), (0, pw), (0, 0)), mode="edge")
    with atomic_path(path) as tmp:
        writer = imageio_ffmpeg.write_frames(
            str(tmp),
            (w + pw, h + ph),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            macro_block_size=1,
            output_params=["-crf", str(crf)],
            ffmpeg_log_level="error",
        )
        writer.send(None)
        try:
            for f in frames:
                writer.send(np.ascontiguousarray(f))
        finally:
            writer.close()
    return path


def probe_video(path: str | os.PathLike) -> tuple[int, float, tuple[int, int]]:
    """Return (number of frames, fps, (H, W)) of a video file, decoding it once to count exactly."""
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no such file")
    def probe():
        gen = imageio_ffmpeg.read_frames(str(path))
        meta = gen.__next__()
        gen.close()
        return meta, imageio_ffmpeg.count_frames_and_secs(str(path))[0]

    try:
        meta, n = _retry(probe)
    except (OSError, RuntimeError, StopIteration) as e:
        raise DataError(path, f"cannot decode video ({_reason(e)})") from None
    w, h = meta["size"]
    return int(n), float(meta["fps"]), (int(h), int(w))


def read_frames(
    path: str | os.PathLike, start: int = 0, count: int | None = None, fps: float | None = None
) -> np.ndarray:
    """Decode ``count`` consecutive frames from frame ``start`` -> (count, H, W, 3) uint8 RGB.

    Seeks by timestamp (``start / fps``, accurate seek in ffmpeg), so only the needed frames are decoded.
    """
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no such file")
    input_params = []
    if start > 0:
        if fps is None:
            _, fps, _ = probe_video(path)
        input_params = ["-ss", f"{(start - 0.5) / fps:.6f}"]
    output_params = ["-frames:v", str(count)] if count is not None else []
    def decode():
        gen = imageio_ffmpeg.read_frames(str(path), input_params=input_params, output_params=output_params)
        meta = gen.__next__()
        w, h = meta["size"]
        return h, w, [np.frombuffer(b, np.uint8).reshape(h, w, 3) for b in gen]

    try:
        h, w, frames = _retry(decode)
    except (OSError, RuntimeError, StopIteration) as e:
        raise DataError(path, f"cannot decode video ({_reason(e)})") from None
    if count is not None and len(frames) < count:
        raise DataError(path, f"wanted frames {start}..{start + count - 1}, decoded only {len(frames)}")
    return np.stack(frames) if frames else np.zeros((0, h, w, 3), np.uint8)


def _read_clip(path: Path, start: int, count: int, fps: float, size: tuple[int, int]) -> np.ndarray:
    """``read_frames(path, start, count, fps)`` for a video whose decoded (H, W) is known.

    The same ffmpeg command line, so the same frames, without waiting for and parsing ffmpeg's header (a third
    of the time of a short clip).
    """
    import imageio_ffmpeg

    seek = ["-ss", f"{(start - 0.5) / fps:.6f}"] if start > 0 else []
    out = ["-pix_fmt", "rgb24", "-vcodec", "rawvideo", "-f", "image2pipe", "-frames:v", str(count), "-"]
    stdout = run_ffmpeg([imageio_ffmpeg.get_ffmpeg_exe(), "-loglevel", "error", *seek, "-i", str(path), *out], path)
    h, w = size
    n = len(stdout) // (h * w * 3)
    if n < count:
        raise DataError(path, f"wanted frames {start}..{start + count - 1}, decoded only {n}")
    return np.frombuffer(stdout, np.uint8, count * h * w * 3).reshape(count, h, w, 3)


def run_ffmpeg(cmd: list[str], path: str | Path) -> bytes:
    """Run an ffmpeg command line that decodes ``path`` to stdout; its raw output bytes.

    A failure is the one-line ``DataError`` naming ``path`` with ffmpeg's last error line.
    """
    try:
        run = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    except OSError as e:
        raise DataError(path, f"cannot decode video ({_reason(e)})") from None
    if run.returncode != 0:
        lines = run.stderr.decode(errors="replace").strip().splitlines()
        reason = lines[-1] if lines else f"ffmpeg exit code {run.returncode}"
        raise DataError(path, f"cannot decode video ({reason})")
    return run.stdout


def _retry(fn, attempts: int = 3):
    """Run an ffmpeg read, retrying when ffmpeg's header did not arrive in time.

    imageio-ffmpeg waits a fixed time for ffmpeg to print the stream header; on a loaded machine a
    valid short file occasionally fails with "Could not load meta information". A corrupt file fails
    every attempt and is reported as such.
    """
    import time

    for i in range(attempts):
        try:
            return fn()
        except OSError as e:
            if "meta information" not in str(e) or i == attempts - 1:
                raise
            time.sleep(0.2 * (i + 1))
    raise AssertionError("unreachable")


def _reason(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[-1] if text else type(e).__name__


def _frame_files(folder: Path) -> list[Path]:
    files = [p for p in folder.iterdir() if p.suffix.lower() in FRAME_EXTS]

    def key(p: Path):
        nums = re.findall(r"\d+", p.stem)
        return (int(nums[-1]) if nums else -1, p.name)

    return sorted(files, key=key)


class VideoClipDataset(Dataset):
    """Map-style dataset of fixed-length clips from videos and frame folders.

    Args:
        sources: Video files, frame folders, or folders containing videos / frame folders (one level).
        clip_len: Frames per clip ``T``.
        stride: Step between frames inside a clip (temporal subsampling).
        step: Step between the start frames of consecutive clips; ``clip_len * stride`` (no overlap) when
            None.
        size: Optional (H, W) to resize every frame to (bilinear; for mixing sources of different sizes).
        on_error: ``"raise"`` on an unreadable source, or ``"skip"`` it (counted in ``skipped``).
        cache: ``"none"``: every clip is decoded when read (one ffmpeg run per clip of a video file,
            tens of ms, most of it starting ffmpeg). ``"all"``: every source is decoded once at
            construction and its frames held in memory, ``N * H * W * 3`` bytes for ``N`` frames of all
            sources (after ``size``); reading a clip is then a copy. ``cache_nbytes`` says how much.
    """

    def __init__(
        self,
        sources: str | os.PathLike | Sequence[str | os.PathLike],
        clip_len: int = 8,
        stride: int = 1,
        step: int | None = None,
        size: tuple[int, int] | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        cache: Literal["none", "all"] = "none",
    ):
        if clip_len < 1 or stride < 1 or (step is not None and step < 1):
            raise ValueError("clip_len, stride and step must be >= 1")
        if cache not in ("none", "all"):
            raise ValueError(f"cache must be 'none' or 'all', got {cache!r}")
        if isinstance(sources, (str, os.PathLike)):
            sources = [sources]
        self.clip_len, self.stride, self.size, self.cache = clip_len, stride, size, cache
        self.step = step if step is not None else clip_len * stride
        self.on_error = on_error
        self.skipped = 0
        self.errors: list[DataError] = []
        self.sources: list[Path] = []
        self._meta: list[tuple[int, float]] = []  # (num_frames, fps); fps 0 for frame folders
        self._sizes: list[tuple[int, int] | None] = []  # decoded (H, W) of video files
        self._frames: dict[int, list[Path]] = {}
        self._cached: dict[int, np.ndarray] = {}  # cache="all": source -> (N, 3, H, W) uint8
        index: list[tuple[int, int]] = []
        for src in self._expand([Path(s) for s in sources]):
            try:
                files, hw = None, None
                if src.is_dir():
                    files = _frame_files(src)
                    if not files:
                        raise DataError(src, "folder holds no frames (*.png / *.jpg)")
                    n, fps = len(files), 0.0
                else:
                    n, fps, hw = probe_video(src)
                if cache == "all":  # the whole source, decoded once: (N, 3, H, W)
                    frames = self._decode(src, files, fps, hw, 0, n, 1)
                    self._cached[len(self.sources)] = np.ascontiguousarray(frames.transpose(0, 3, 1, 2))
            except DataError as e:
                if on_error == "raise":
                    raise
                self.errors.append(e)
                self.skipped += 1
                continue
            vi = len(self.sources)
            self.sources.append(src)
            self._meta.append((n, fps))
            self._sizes.append(hw)
            if files is not None:
                self._frames[vi] = files
            span = (clip_len - 1) * stride + 1
            index += [(vi, s) for s in range(0, n - span + 1, self.step)]
        self._index = np.array(index, dtype=np.int64).reshape(-1, 2)
        self.cache_nbytes = sum(a.nbytes for a in self._cached.values())

    @staticmethod
    def _expand(paths: list[Path]) -> list[Path]:
        out: list[Path] = []
        for p in paths:
            if p.is_file():
                out.append(p)
            elif p.is_dir() and _frame_files(p):
                out.append(p)
            elif p.is_dir():
                kids = sorted(p.iterdir())
                out += [
                    k
                    for k in kids
                    if (k.is_file() and k.suffix.lower() in VIDEO_EXTS) or (k.is_dir() and _frame_files(k))
                ]
            else:
                raise DataError(p, "no such file or folder")
        return out

    def __len__(self) -> int:
        return len(self._index)

    def _decode(
        self,
        src: Path,
        files: list[Path] | None,
        fps: float,
        hw: tuple[int, int] | None,
        start: int,
        span: int,
        stride: int,
    ) -> np.ndarray:
        """Frames ``start, start + stride, ... < start + span``, resized to ``size``: (T, H, W, 3) uint8.

        From a frame folder (``files``) or a video file (``fps``, decoded size ``hw``).
        """
        if files is not None:
            from core.data.images import read_image

            frames = []
            for f in files[start : start + span : stride]:
                img = read_image(f)
                frames.append(np.repeat(img[..., None], 3, 2) if img.ndim == 2 else img[..., :3])
            shapes = {fr.shape for fr in frames}
            if len(shapes) > 1 and self.size is None:
                raise DataError(src, f"frames differ in size: {sorted(shapes)}")
        else:
            frames = list(_read_clip(src, start, span, fps, hw)[::stride])
        if self.size is not None:
            import cv2

            h, w = self.size
            frames = [cv2.resize(f, (w, h), interpolation=cv2.INTER_LINEAR) for f in frames]
        return np.stack(frames)

    def clip(self, video_index: int, start: int) -> np.ndarray:
        """Frames of one clip: (T, H, W, 3) uint8."""
        return np.ascontiguousarray(self._clip_chw(video_index, start).transpose(0, 2, 3, 1))

    @property
    def clip_index(self) -> np.ndarray:
        """(len, 2) int64: ``(video_index, start)`` of every clip."""
        return self._index

    def source_frames(self, video_index: int) -> np.ndarray:
        """Every frame of one source (after ``size``), for pre-encoding whole videos: (N, 3, H, W) uint8."""
        cached = self._cached.get(video_index)
        if cached is not None:
            return cached
        src, (n, fps), hw = self.sources[video_index], self._meta[video_index], self._sizes[video_index]
        frames = self._decode(src, self._frames.get(video_index), fps, hw, 0, n, 1)
        return np.ascontiguousarray(frames.transpose(0, 3, 1, 2))

    def _clip_chw(self, video_index: int, start: int) -> np.ndarray:
        span = (self.clip_len - 1) * self.stride + 1
        cached = self._cached.get(video_index)
        if cached is not None:
            return cached[start : start + span : self.stride].copy()
        src, fps, hw = self.sources[video_index], self._meta[video_index][1], self._sizes[video_index]
        frames = self._decode(src, self._frames.get(video_index), fps, hw, start, span, self.stride)
        return np.ascontiguousarray(frames.transpose(0, 3, 1, 2))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        vi, start = (int(x) for x in self._index[index])
        return {
            "video": torch.from_numpy(self._clip_chw(vi, start)),
            "video_index": torch.tensor(vi, dtype=torch.int64),
            "start": torch.tensor(start, dtype=torch.int64),
        }
