"""LeRobot v3 datasets (Parquet + MP4) written from and read like the workspace's HDF5 trajectory files.

Folder layout (LeRobot ``codebase_version`` "v3.0", as ``lerobot.datasets.LeRobotDataset`` reads it)::

    meta/info.json                  fps, features (dtype / shape / names; video info), totals, splits,
                                    data_path / video_path templates, chunks_size
    meta/stats.json                 per feature: min / max / mean / std / count / q01 q10 q50 q90 q99
                                    (images: per channel, shape (3, 1, 1), pixel values / 255)
    meta/tasks.parquet              task text (the index) -> task_index
    meta/episodes/chunk-000/file-000.parquet
                                    one row per episode: episode_index, tasks, length, dataset_from_index /
                                    dataset_to_index (global frame rows), data/chunk_index / file_index,
                                    videos/<key>/chunk_index / file_index / from_timestamp / to_timestamp (s),
                                    stats/<feature>/<stat>
    meta/info.json ``image_convention``
                                    (ours; LeRobot's reader ignores it) the convention of the image / video
                                    frames (``core.data.image_convention``): ``"rot180"`` for LIBERO data, as
                                    openpi's and LeRobot's own LIBERO datasets; absent when the sources state none
    meta/embodied.json              (ours; LeRobot ignores it) env_meta and per-episode attributes of the
                                    source HDF5 files (embodiment, success, ...), which obs keys make
                                    ``observation.state``
    data/chunk-CCC/file-FFF.parquet one row per frame
    videos/<video key>/chunk-CCC/file-FFF.mp4
                                    the frames of consecutive episodes, one after another (an episode is
                                    ``[from_timestamp, to_timestamp)`` of its file)

Export (``export_lerobot``) maps an HDF5 episode (``core.data.trajectories``) to features:

    ``obs/<key>`` image (T, H, W, 3) uint8   -> ``observation.images.<key>`` (video; frames as the loader returns
                                               them: LIBERO's in ``rot180``, others upright; a source in another
                                               known convention is converted to the first source's)
    ``obs/<key>`` low-dim (T, D) / (T,)      -> ``observation.<key>`` (D,) / (1,)
    ``obs/<key>`` (T, D1, ..., Dk), k <= 5, any other array (a driving recording's ``agents`` (T, 8, 8),
                                               ``route`` (T, 20, 2), channel-first ``bev`` (T, 6, H, W) uint8)
                                             -> ``observation.<key>`` of shape (D1, ..., Dk): nested fixed-size
                                               lists in the Parquet, which LeRobot's reader loads as the HF
                                               ``Array2D`` .. ``Array5D`` its ``get_hf_features_from_features``
                                               maps such shapes to; stats per last axis, as LeRobot computes them
                                    (low-dim dtypes: floats as float32, bool and integers as they are)
    ``drop_keys``                            -> not exported; info.json ``obs_keys`` states what was kept (obs key
                                               -> feature) and what was dropped
    ``state_keys`` (default: ``proprio`` if the episode has it, else every (T,) / (T, D) low-dim key in sorted
                   order)                    -> ``observation.state`` float32, those keys concatenated
    ``actions`` (T, A)                       -> ``action`` float32 (A,)
    ``rewards`` / ``dones``                  -> ``next.reward`` float32 / ``next.done`` bool
    step t                                   -> ``frame_index`` t, ``timestamp`` t / fps (float32, s),
                                               ``index`` (global row), ``episode_index``, ``task_index``
    language_instruction (else env task / env name) -> the episode's task text

Videos: PyAV (FFmpeg's libx264), by default H.264 ``yuv420p`` at CRF 18 with a keyframe every 2 frames (LeRobot's
GOP, so that its per-frame seeks stay short); ``vcodec="libx264rgb", pix_fmt="rgb24", crf=0`` is lossless.

Import (``LeRobotFile``) exposes a folder with the interface ``TrajectoryDataset`` uses from ``TrajectoryFile``:
episode ``demo_<i>`` is ``episode_index`` i; ``observation.images.<key>`` / ``observation.<key>`` come back as obs
key ``<key>`` (``observation.state`` as ``state``, except in our exports, where it repeats other keys); video frames
are decoded per episode (seek to ``from_timestamp``, decode up to ``to_timestamp``, frames matched by their
timestamps) and kept in a small LRU, so consecutive windows of an episode decode it once. Frames come back in
``image_convention``: the one ``info.json`` states; an export of ours from before conventions were stated (a
``meta/embodied.json``, no ``image_convention``) holds LIBERO frames in the old ``"flipud"``, which are turned to
``"rot180"``; a dataset written by LeRobot itself is read as it is (convention None).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.data.hdf5 import TrajectoryFile, demo_index, is_image_key, is_libero, trajectory_files
from core.data.image_convention import LIBERO_CONVENTION, check, convert, flips
from core.errors import ConfigError, DataError
from core.io import atomic_dir, write_json

__all__ = ["LeRobotFile", "export_lerobot", "is_lerobot_folder", "check_not_input"]

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
EMBODIED_PATH = "meta/embodied.json"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNKS_SIZE = 1000  # files per chunk folder (LeRobot's default)
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
_IMAGES = "observation.images."


def is_lerobot_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder (a LeRobot dataset is one; an HDF5 trajectory file is not)."""
    return Path(path).is_dir()


def check_not_input(inputs: Iterable[str | os.PathLike], out: str | os.PathLike) -> None:
    """Refuse an output folder that is an input, lies inside an input folder, or holds an input.

    Raises:
        DataError: Naming the input concerned.
    """
    o = Path(out).resolve()
    for p in inputs:
        q = Path(p).resolve()
        if o == q or q in o.parents or o in q.parents:
            raise DataError(p, f"is an input; the output folder {out} must lie outside it (inputs are read-only)")


# --------------------------------------------------------------------------------------------------- stats
def _stats(x: np.ndarray, image: bool) -> dict[str, np.ndarray]:
    """LeRobot statistics of ``x`` (``count``: N, the number of frames).

    Images (N, H, W, C) uint8: per channel in [0, 1], shape (C, 1, 1). (N,) / (N, D): per dim. (N, D1, ..., Dk):
    per index of the last axis, shape (Dk,), over the frames and the other axes (the shape LeRobot's
    ``compute_episode_stats`` gives such features).
    """
    if image:
        n = len(x)
        keep = _sample_rows(n)
        v = x[keep].reshape(-1, x.shape[-1]).astype(np.float64) / 255.0
        count = len(keep)
    else:
        v = (x.reshape(len(x), -1) if x.ndim <= 2 else x.reshape(-1, x.shape[-1])).astype(np.float64)
        count = len(x)
    out = {"min": v.min(0), "max": v.max(0), "mean": v.mean(0), "std": v.std(0)}
    for q, val in zip(QUANTILES, np.quantile(v, QUANTILES, axis=0), strict=True):
        out[f"q{round(q * 100):02d}"] = val
    if image:
        out = {k: a.reshape(-1, 1, 1) for k, a in out.items()}
    out["count"] = np.array([count], dtype=np.int64)
    return out


def _sample_rows(n: int) -> np.ndarray:
    """Frames an image's statistics use: all of up to 100, else about n**0.75 evenly spaced (at most 10,000)."""
    k = n if n <= 100 else max(100, min(int(n**0.75), 10_000))
    return np.unique(np.round(np.linspace(0, n - 1, k)).astype(np.int64))


def _aggregate(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Dataset statistics from per-episode ones: exact min / max / mean / std, count-weighted quantiles."""
    counts = np.array([p["count"][0] for p in parts], dtype=np.float64)
    total = counts.sum()
    shape = (-1,) + (1,) * (parts[0]["mean"].ndim)
    w = counts.reshape(shape)
    means = np.stack([p["mean"] for p in parts])
    mean = (means * w).sum(0) / total
    var = ((np.stack([p["std"] for p in parts]) ** 2 + (means - mean) ** 2) * w).sum(0) / total
    out = {"min": np.min([p["min"] for p in parts], 0), "max": np.max([p["max"] for p in parts], 0),
           "mean": mean, "std": np.sqrt(var), "count": np.array([int(total)], dtype=np.int64)}
    for k in parts[0]:
        if k.startswith("q"):
            out[k] = (np.stack([p[k] for p in parts]) * w).sum(0) / total
    return out


# ------------------------------------------------------------------------------------------------- export
@dataclass(frozen=True)
class VideoOptions:
    """How image keys are encoded (PyAV / FFmpeg): codec, pixel format, constant rate factor, GOP size."""

    vcodec: str = "libx264"
    pix_fmt: str = "yuv420p"
    crf: int = 18
    gop: int = 2


class _VideoFile:
    """One MP4 being written: consecutive episodes' frames, frame n at time n / fps."""

    def __init__(self, path: Path, fps: int, shape: tuple[int, int, int], opts: VideoOptions):
        import av

        H, W, _ = shape
        if opts.pix_fmt in ("yuv420p", "nv12") and (H % 2 or W % 2):
            raise DataError(path, f"{opts.pix_fmt} needs even image sides, got {W}x{H} (use pix_fmt yuv444p)")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.frames = path, 0
        self._c = av.open(str(path), "w")
        self._s = self._c.add_stream(opts.vcodec, rate=fps, options={"crf": str(opts.crf), "g": str(opts.gop)})
        self._s.width, self._s.height, self._s.pix_fmt = W, H, opts.pix_fmt

    def add(self, frames: np.ndarray) -> tuple[int, int]:
        """Append (T, H, W, 3) uint8 RGB frames; returns their first and end frame numbers in the file."""
        import av

        start = self.frames
        for img in frames:
            f = av.VideoFrame.from_ndarray(np.ascontiguousarray(img[..., :3]), format="rgb24")
            f.pts = self.frames
            self._c.mux(self._s.encode(f))
            self.frames += 1
        return start, self.frames

    def close(self) -> None:
        self._c.mux(self._s.encode())
        self._c.close()


def _arrow_column(values: np.ndarray):
    """A Parquet column of (N, ...) ``values``, as LeRobot's reader declares the feature.

    (N,) and (N, 1): scalars (``Value``); (N, D): fixed-size lists (``Sequence(length=D)``); (N, D1, ..., Dk):
    fixed-size lists nested k deep, which ``datasets`` casts to the ``ArrayKD`` feature.
    """
    import pyarrow as pa

    if values.ndim == 1 or values.shape[1:] == (1,):  # shape [1]: LeRobot's plain ``Value``, one scalar a row
        return pa.array(np.ascontiguousarray(values).reshape(len(values)))
    arr = pa.array(np.ascontiguousarray(values).reshape(-1))
    for d in reversed(values.shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, d)
    return arr


def _episode_text(attrs: dict, file_li: str | None, env_meta: dict) -> str:
    for t in (attrs.get("language_instruction"), file_li, env_meta.get("task"), env_meta.get("env_name")):
        if t:
            return str(t)
    return "unknown task"


def export_lerobot(
    hdf5_paths: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    fps: int = 20,
    state_keys: Sequence[str] | None = None,
    drop_keys: Sequence[str] = (),
    video: VideoOptions | None = None,
    episodes_per_file: int | None = None,
    in_place: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Convert HDF5 trajectory files into one LeRobot v3 dataset folder (see the module docstring).

    Args:
        hdf5_paths: One or more trajectory files (any of the recorders' files, LIBERO's and robomimic's), or
            folders of them: the ``*.hdf5`` files under a folder at any depth (``core.data.hdf5.trajectory_files``:
            a ``sim rollout``, ``libero record`` or ``drive eval`` output), sorted by path.
            Every episode must have the obs keys and shapes of the first one (LeRobot features are fixed).
        out_dir: The dataset folder. Written into a hidden sibling and renamed onto ``out_dir`` when done
            (an existing ``out_dir`` is replaced whole); with ``in_place`` written straight into ``out_dir``,
            which must be empty (the caller stages it, as ``core.outputs.claim_output`` does).
        fps: Frame rate of the recordings (timestamps t / fps, video rate).
        state_keys: Low-dim obs keys concatenated (in this order) into ``observation.state``; default
            ``["proprio"]`` if the episodes have it, else every (T,) / (T, D) low-dim key in sorted order.
        drop_keys: Obs keys left out of the dataset (each must be an obs key of the first episode).
        video: Encoder settings (``VideoOptions()``: H.264 yuv420p CRF 18, GOP 2).
        episodes_per_file: Start a new data Parquet and MP4 file every this many episodes; None: all episodes
            share one file per kind (how LeRobot writes datasets under its 100 / 200 MB file limits).
        in_place: See ``out_dir``.
        progress: Called with the number of episodes done after each one.

    Returns:
        Summary ``{"path", "episodes", "frames", "fps", "tasks", "features", "video"}``.

    Raises:
        DataError: An input is missing or unreadable, episodes disagree on keys or shapes, a state / drop key
            is not an obs key, an obs key has more than 5 per-step axes, or ``out_dir`` is an input or lies
            inside one.
    """
    paths = [Path(hdf5_paths)] if isinstance(hdf5_paths, (str, os.PathLike)) else [Path(p) for p in hdf5_paths]
    if not paths:
        raise DataError(str(out_dir), "no input files to export")
    if fps < 1:
        raise DataError(str(out_dir), f"fps must be >= 1, got {fps}")
    if episodes_per_file is not None and episodes_per_file < 1:
        raise DataError(str(out_dir), f"episodes_per_file must be >= 1, got {episodes_per_file}")
    check_not_input(paths, out_dir)  # also a folder given as input: nothing is written inside it
    paths = [q for p in paths for q in trajectory_files(p)]
    opts = video or VideoOptions()

    def write(root: Path) -> dict[str, Any]:
        w = _Writer(root, fps, state_keys, opts, episodes_per_file, drop_keys)
        done = 0
        for fi, p in enumerate(paths):
            with TrajectoryFile(p) as f:
                env_meta, li = f.env_meta, f.language_instruction
                w.sources.append({"path": p.name, "env_meta": env_meta})
                for name in f.episodes:
                    keys = w.kept(p, name, f.obs_keys(name))
                    grp = f._group(name)
                    obs = {}
                    for k in keys:
                        ds = grp[f"obs/{k}"]
                        obs[k] = (f.read(name, f"obs/{k}"), is_image_key(ds.shape, ds.dtype))
                    T = f.num_samples(name)
                    rewards = f.read(name, "rewards") if "rewards" in grp else np.zeros(T, np.float32)
                    if "dones" in grp:
                        dones = f.read(name, "dones")
                    else:
                        dones = np.zeros(T, bool)
                        dones[-1] = True
                    attrs = f.attrs(name)
                    w.add(p, name, obs, f.read(name, "actions"), rewards, dones, attrs,
                          _episode_text(attrs, li, env_meta), fi, f.image_convention)
                    done += 1
                    if progress is not None:
                        progress(done)
        if not w.episodes:
            raise DataError(paths[0], "no episodes to export")
        return w.finish()

    if in_place:
        root = Path(out_dir)
        root.mkdir(parents=True, exist_ok=True)
        if any(p.name != ".embodied-run.json" for p in root.iterdir()):
            raise DataError(root, "not empty (in_place export needs an empty folder)")
        return write(root)
    with atomic_dir(out_dir) as tmp:
        summary = write(tmp)
    summary["path"] = str(out_dir)
    return summary


class _Writer:
    """Accumulates episodes into the Parquet / MP4 files of one dataset folder."""

    def __init__(self, root: Path, fps: int, state_keys: Sequence[str] | None, opts: VideoOptions,
                 per_file: int | None, drop_keys: Sequence[str] = ()):
        self.root, self.fps, self.opts, self.per_file = root, fps, opts, per_file
        self.state_keys = list(state_keys) if state_keys is not None else None
        self.drop_keys = sorted(set(drop_keys))
        self.layout: dict[str, tuple[tuple[int, ...], bool]] | None = None  # obs key -> (tail shape, image)
        self.dtypes: dict[str, str] = {}  # low-dim obs key -> the dtype it is written in
        self.action_dim: int | None = None
        self.episodes: list[dict[str, Any]] = []
        self.ep_stats: list[dict[str, dict[str, np.ndarray]]] = []
        self.ep_attrs: list[dict[str, Any]] = []
        self.sources: list[dict[str, Any]] = []
        self.tasks: dict[str, int] = {}
        self.rows: dict[str, list[np.ndarray]] = {}
        self.frames = 0
        self.file_index = -1
        self.videos: dict[str, _VideoFile] = {}
        self.video_info: dict[str, dict] = {}
        self.embodiments: list[str] = []
        self.image_convention: str | None = None  # of the frames written (the first source's)
        self._convention_from: Path | None = None  # the source that set it

    # -- features
    def kept(self, src: Path, name: str, keys: list[str]) -> list[str]:
        """The obs ``keys`` of an episode that are exported (``drop_keys`` checked against the first episode)."""
        if self.layout is None:
            bad = [k for k in self.drop_keys if k not in keys]
            if bad:
                raise DataError(src, f"drop key(s) {bad} are not obs keys of {name} (has {keys})")
        return [k for k in keys if k not in self.drop_keys]

    def _setup(self, src: Path, name: str, obs: dict[str, tuple[np.ndarray, bool]], A: int) -> None:
        self.layout = {k: (tuple(a.shape[1:]), img) for k, (a, img) in obs.items()}
        for k, (tail, img) in self.layout.items():
            if not img and len(tail) > 5:
                raise DataError(src, f"{name}: obs/{k} has per-step shape {tail}; LeRobot features have at most 5 "
                                     f"axes (leave it out with drop_keys / --drop-keys {k})")
            if not img:
                dt = np.dtype(obs[k][0].dtype)
                self.dtypes[k] = "float32" if dt.kind in "fc" else ("bool" if dt.kind == "b" else dt.name)
        vectors = sorted(k for k, (tail, img) in self.layout.items() if not img and len(tail) <= 1)
        if self.state_keys is None:
            self.state_keys = ["proprio"] if "proprio" in vectors else vectors
        bad = [k for k in self.state_keys if k not in vectors]
        if bad:
            raise DataError(src, f"state key(s) {bad} are not (T,) / (T, D) low-dim obs keys of {name} "
                                 f"(has {vectors})")
        self.action_dim = A

    def _features(self) -> dict[str, dict[str, Any]]:
        assert self.layout is not None
        feats: dict[str, dict[str, Any]] = {}
        for k, (tail, img) in sorted(self.layout.items()):
            if img:
                feats[_IMAGES + k] = {"dtype": "video", "shape": list(tail),
                                      "names": ["height", "width", "channels"], "info": self.video_info[k]}
        for k, (tail, img) in sorted(self.layout.items()):
            if not img and len(tail) <= 1:
                d = int(np.prod(tail)) if tail else 1
                feats[f"observation.{k}"] = {"dtype": self.dtypes[k], "shape": [d],
                                             "names": [f"{k}_{i}" for i in range(d)]}
            elif not img:  # (D1, ..., Dk): LeRobot's ArrayKD features
                feats[f"observation.{k}"] = {"dtype": self.dtypes[k], "shape": list(tail), "names": None}
        if self.state_keys:
            names = [n for k in self.state_keys for n in feats[f"observation.{k}"]["names"]]
            feats["observation.state"] = {"dtype": "float32", "shape": [len(names)], "names": names}
        feats["action"] = {"dtype": "float32", "shape": [self.action_dim],
                           "names": [f"action_{i}" for i in range(self.action_dim or 0)]}
        feats["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
        feats["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
        for k in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
            feats[k] = {"dtype": "float32" if k == "timestamp" else "int64", "shape": [1], "names": None}
        return feats

    # -- files
    def _roll(self) -> None:
        """Close the current data / video files and start the next ones."""
        self._flush()
        for v in self.videos.values():
            v.close()
        self.videos = {}
        self.file_index += 1

    def _where(self) -> tuple[int, int]:
        return divmod(self.file_index, CHUNKS_SIZE)

    def _flush(self) -> None:
        if not self.rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        chunk, file = self._where()
        cols = {k: _arrow_column(np.concatenate(v)) for k, v in self.rows.items()}
        path = self.root / DATA_PATH.format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols), path, compression="snappy")
        self.rows = {}

    def _orient(self, src: Path, obs: dict[str, tuple[np.ndarray, bool]],
                convention: str | None) -> dict[str, tuple[np.ndarray, bool]]:
        """``obs`` with its images in the dataset's convention (the first source's), converted if need be.

        Raises:
            DataError: A source whose convention is unknown where the dataset's is known, or the reverse.
        """
        if not any(img for _, img in obs.values()):
            return obs
        if self._convention_from is None:
            self.image_convention, self._convention_from = convention, src
            return obs
        if convention == self.image_convention:
            return obs
        if convention is None or self.image_convention is None:
            raise DataError(src, f"images in convention {convention!r}, but {self._convention_from} has "
                                 f"{self.image_convention!r} (a dataset has one; export them separately)")
        return {k: (convert(a, convention, self.image_convention) if img else a, img) for k, (a, img) in obs.items()}

    def add(self, src: Path, name: str, obs: dict[str, tuple[np.ndarray, bool]], actions: np.ndarray,
            rewards: np.ndarray, dones: np.ndarray, attrs: dict[str, Any], task: str, source: int,
            image_convention: str | None = None) -> None:
        obs = self._orient(src, obs, image_convention)
        actions = np.asarray(actions, dtype=np.float32).reshape(len(actions), -1)
        T, A = actions.shape
        if self.layout is None:
            self._setup(src, name, obs, A)
        layout = {k: (tuple(a.shape[1:]), img) for k, (a, img) in obs.items()}
        if layout != self.layout:
            raise DataError(src, f"{name}: obs keys / shapes {layout} differ from the first episode's {self.layout}"
                                 " (a LeRobot dataset has one set of features; export them separately)")
        if A != self.action_dim:
            raise DataError(src, f"{name}: action dim {A}, the first episode's is {self.action_dim}")
        ei = len(self.episodes)
        if self.per_file is None and self.file_index < 0 or self.per_file and ei % self.per_file == 0:
            self._roll()
        task_index = self.tasks.setdefault(task, len(self.tasks))
        t = np.arange(T, dtype=np.int64)
        cols: dict[str, np.ndarray] = {}
        stats: dict[str, dict[str, np.ndarray]] = {}
        ep: dict[str, Any] = {"episode_index": ei, "tasks": [task], "length": T}
        chunk, file = self._where()
        ep["data/chunk_index"], ep["data/file_index"] = chunk, file
        ep["dataset_from_index"], ep["dataset_to_index"] = self.frames, self.frames + T
        for k, (arr, img) in sorted(obs.items()):
            if img:
                v = self.videos.get(k)
                if v is None:
                    path = self.root / VIDEO_PATH.format(video_key=_IMAGES + k, chunk_index=chunk, file_index=file)
                    v = self.videos[k] = _VideoFile(path, self.fps, arr.shape[1:], self.opts)
                    self.video_info.setdefault(k, self._video_info(arr.shape[1:]))
                a, b = v.add(arr)
                key = _IMAGES + k
                ep[f"videos/{key}/chunk_index"], ep[f"videos/{key}/file_index"] = chunk, file
                ep[f"videos/{key}/from_timestamp"], ep[f"videos/{key}/to_timestamp"] = a / self.fps, b / self.fps
                stats[key] = _stats(arr, image=True)
            else:
                a = np.asarray(arr, dtype=self.dtypes[k])
                cols[f"observation.{k}"] = a if a.ndim > 2 else a.reshape(T, -1)  # (T,) -> (T, 1)
        if self.state_keys:
            cols["observation.state"] = np.concatenate(
                [cols[f"observation.{k}"].astype(np.float32) for k in self.state_keys], axis=1)
        cols["action"] = actions
        cols["next.reward"] = np.asarray(rewards, dtype=np.float32).reshape(T)
        cols["next.done"] = np.asarray(dones).reshape(T).astype(bool)
        cols["timestamp"] = (t / self.fps).astype(np.float32)
        cols["frame_index"] = t
        cols["episode_index"] = np.full(T, ei, dtype=np.int64)
        cols["index"] = self.frames + t
        cols["task_index"] = np.full(T, task_index, dtype=np.int64)
        for k, v in cols.items():
            self.rows.setdefault(k, []).append(v)
            stats[k] = _stats(v if v.ndim > 2 else v.reshape(T, -1), image=False)
        self.frames += T
        self.episodes.append(ep)
        self.ep_stats.append(stats)
        plain = {k: v for k, v in attrs.items() if k != "num_samples"}
        self.ep_attrs.append({"source": source, "name": name, **json.loads(json.dumps(plain, default=str))})
        emb = attrs.get("embodiment") or self.sources[source]["env_meta"].get("embodiment")
        self.embodiments.append(str(emb) if emb else "")

    def _video_info(self, shape: tuple[int, ...]) -> dict[str, Any]:
        H, W, C = shape
        codec = "h264" if self.opts.vcodec.startswith("libx264") else self.opts.vcodec.removeprefix("lib")
        return {"video.height": H, "video.width": W, "video.codec": codec, "video.pix_fmt": self.opts.pix_fmt,
                "video.is_depth_map": False, "video.fps": self.fps, "video.channels": C, "has_audio": False}

    def finish(self) -> dict[str, Any]:
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._roll()
        feats = self._features()
        for ep, st in zip(self.episodes, self.ep_stats, strict=True):
            ep["meta/episodes/chunk_index"], ep["meta/episodes/file_index"] = 0, 0
            for f, s in st.items():
                for k, v in s.items():
                    ep[f"stats/{f}/{k}"] = v.tolist()
        table = pa.Table.from_pylist(self.episodes)
        path = self.root / EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="snappy")
        tasks = pd.DataFrame({"task_index": list(self.tasks.values())}, index=list(self.tasks))
        tasks.to_parquet(self.root / "meta/tasks.parquet")
        stats = {f: _aggregate([s[f] for s in self.ep_stats]) for f in self.ep_stats[0]}
        write_json(self.root / "meta/stats.json", stats)  # arrays as lists (core.io.to_jsonable)
        robots = sorted(set(self.embodiments) - {""})
        n_files = self.file_index
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": robots[0] if len(robots) == 1 else ("+".join(robots) if robots else None),
            "total_episodes": len(self.episodes),
            "total_frames": self.frames,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {"train": f"0:{len(self.episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.video_info else None,
            "features": feats,
        }
        if self.image_convention is not None and self.video_info:
            info["image_convention"] = self.image_convention  # LeRobot's reader ignores keys it does not use
        info["obs_keys"] = {  # ours too: which obs keys of the sources became which features, which were dropped
            "kept": {k: (_IMAGES if img else "observation.") + k for k, (_, img) in sorted(self.layout.items())},
            "dropped": self.drop_keys,
        }
        write_json(self.root / INFO_PATH, info)
        write_json(self.root / EMBODIED_PATH, {
            "format": 1, "state_keys": self.state_keys or [], "sources": self.sources,
            "episodes": self.ep_attrs, "video": vars(self.opts) | {}, "data_files": n_files,
        })
        return {"path": str(self.root), "episodes": len(self.episodes), "frames": self.frames, "fps": self.fps,
                "tasks": list(self.tasks), "features": list(feats), "video": dict(vars(self.opts))}


# ------------------------------------------------------------------------------------------------- import
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(path, "no such file (not a LeRobot v3 dataset folder)") from None
    except (OSError, ValueError) as e:
        raise DataError(path, f"cannot read as JSON ({e})") from None


def _read_parquet(path: Path, columns: list[str] | None = None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DataError(path, "no such file")
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise DataError(path, f"cannot read as Parquet ({str(e).splitlines()[0]})") from None


def _to_numpy(col) -> np.ndarray:
    """A Parquet column as (N,) or (N, ...) numpy.

    Fixed-size and equal-length lists, nested at any depth (our exports' multi-axis features and the ``ArrayKD``
    extension columns of ``datasets`` in LeRobot's), become axes.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(col, pa.ExtensionArray):  # datasets' Array2D .. Array5D: nested lists in storage
        col = col.storage
    t = col.type
    if pa.types.is_fixed_size_list(t):
        inner = _to_numpy(col.flatten())
        return inner.reshape(len(col), t.list_size, *inner.shape[1:])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if not len(col):
            return np.zeros((0, 0))
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if col.null_count == 0 and (lengths == lengths[0]).all():
            inner = _to_numpy(col.flatten())
            return inner.reshape(len(col), int(lengths[0]), *inner.shape[1:])
        return np.stack([np.asarray(x) for x in col.to_pylist()])
    return col.to_numpy(zero_copy_only=False)


class _Column:
    """A lazy (T, ...) array of one episode: what ``h5py.Dataset`` offers the loader (shape, dtype, slicing)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, load: Callable[[], np.ndarray]):
        self.shape, self.dtype, self._load = tuple(shape), np.dtype(dtype), load

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, sel: Any) -> np.ndarray:
        return self._load()[sel]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self._load()
        return a if dtype is None else a.astype(dtype)


class _Episode:
    """The group-like view of one episode: ``get(path)`` / ``[path]`` / ``in`` over "obs/<key>", "actions" ..."""

    def __init__(self, items: dict[str, _Column]):
        self._items = items

    def get(self, key: str, default: Any = None) -> Any:
        return self._items.get(key, default)

    def __getitem__(self, key: str) -> _Column:
        return self._items[key]

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def keys(self) -> list[str]:
        return sorted(self._items)


class LeRobotFile:
    """Read a local LeRobot v3 dataset folder with ``TrajectoryFile``'s interface (see the module docstring).

    Args:
        folder: The dataset root (holding ``meta/info.json``).
        video_cache_bytes: Decoded episodes (per video key) kept in memory, least recently used dropped first.

    Raises:
        DataError: No / unreadable ``meta/info.json``, another codebase version, unreadable episode table;
            a missing or truncated data / video file when an episode is read.
    """

    bottom_up_images = False

    def __init__(self, folder: str | os.PathLike, video_cache_bytes: int = 256 << 20):
        self.path = Path(folder)
        if not self.path.is_dir():
            raise DataError(self.path, "no such folder")
        self.info: dict[str, Any] = _read_json(self.path / INFO_PATH)
        version = str(self.info.get("codebase_version", ""))
        if not version.startswith("v3"):
            raise DataError(self.path / INFO_PATH, f"codebase_version {version!r}: only LeRobot v3 datasets are read")
        feats = self.info.get("features")
        if not isinstance(feats, dict) or "action" not in feats:
            raise DataError(self.path / INFO_PATH, "no 'features' with an 'action' entry")
        self.features: dict[str, dict[str, Any]] = feats
        self.fps = float(self.info.get("fps") or 0)
        if self.fps <= 0:
            raise DataError(self.path / INFO_PATH, f"fps {self.info.get('fps')!r} is not positive")
        extra = self.path / EMBODIED_PATH
        self.extra: dict[str, Any] = _read_json(extra) if extra.exists() else {}
        derived_state = bool(self.extra.get("state_keys"))
        self._obs: dict[str, str] = {}  # obs key -> feature
        for f, spec in feats.items():
            if f.startswith(_IMAGES) and spec.get("dtype") in ("video", "image"):
                self._obs[f[len(_IMAGES):]] = f
            elif f.startswith("observation.") and not f.startswith(_IMAGES):
                if f == "observation.state" and derived_state:
                    continue
                self._obs[f[len("observation."):]] = f
        self._rows = self._episode_table()
        self.episodes: list[str] = [f"demo_{i}" for i in sorted(self._rows)]
        self._tasks = self._task_table()
        self._tables: dict[Path, tuple[Any, int]] = {}  # data file -> (table, first global index)
        self._columns: dict[tuple[str, str], np.ndarray] = {}  # (feature, episode) -> its Parquet rows
        self._decoded: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._decoded_bytes, self._budget = 0, int(video_cache_bytes)
        self.file_attrs: dict[str, Any] = {"total": int(self.info.get("total_frames", 0))}
        self.image_convention, self._flips = self._image_conventions()

    image_flips = (False, False)  # what TrajectoryDataset applies to the frames here: they are turned when decoded

    @property
    def camera_keys(self) -> list[str]:
        """The obs keys of the camera features (``observation.images.<key>``, video or image).

        In ``info.json``'s order, LeRobot's own camera order (``LeRobotDatasetMetadata.camera_keys``).
        """
        return [k for k, f in self._obs.items() if f.startswith(_IMAGES)]

    @property
    def state_keys(self) -> list[str]:
        """The obs keys that are the robot state, concatenated in this order.

        ``["state"]`` (``observation.state``) in a dataset LeRobot wrote; in our exports, where ``observation.state``
        repeats other features, the keys it concatenates; ``[]`` without an ``observation.state`` feature.
        """
        if self.extra.get("state_keys"):
            return [str(k) for k in self.extra["state_keys"] if k in self._obs]
        return ["state"] if self._obs.get("state") == "observation.state" else []

    def _image_conventions(self) -> tuple[str | None, tuple[bool, bool]]:
        """(the convention frames are returned in, the flips from the stored frames to it)."""
        own = self.info.get("image_convention")
        if own is not None:
            try:
                return check(own), (False, False)
            except ConfigError as e:
                raise DataError(self.path / INFO_PATH, str(e)) from None
        sources = self.extra.get("sources") or []
        if any(isinstance(s, dict) and isinstance(s.get("env_meta"), dict) and is_libero({}, s["env_meta"])
               for s in sources):  # our export from before conventions were stated: LIBERO frames in flipud
            return LIBERO_CONVENTION, flips("flipud", LIBERO_CONVENTION)
        return None, (False, False)

    # -- tables
    def _episode_table(self) -> dict[int, dict[str, Any]]:
        files = sorted((self.path / "meta/episodes").glob("*/*.parquet"))
        if not files:
            raise DataError(self.path / "meta/episodes", "no episode table (meta/episodes/chunk-*/file-*.parquet)")
        rows: dict[int, dict[str, Any]] = {}
        for p in files:
            import pyarrow.parquet as pq

            try:
                names = pq.read_schema(p).names
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad footer
                raise DataError(p, f"cannot read as Parquet ({str(e).splitlines()[0]})") from None
            t = _read_parquet(p, [n for n in names if not n.startswith("stats/")])
            for r in t.to_pylist():
                rows[int(r["episode_index"])] = r
        for need in ("dataset_from_index", "dataset_to_index"):
            if need not in next(iter(rows.values())):
                raise DataError(files[0], f"no column {need!r} (not a LeRobot v3 episode table)")
        return rows

    def _task_table(self) -> dict[int, str]:
        path = self.path / "meta/tasks.parquet"
        if not path.exists():
            return {}
        t = _read_parquet(path)
        idx = _to_numpy(t.column("task_index")).astype(int)
        text_col = "task" if "task" in t.column_names else next(
            (n for n in t.column_names if n != "task_index"), None)
        if text_col is None:
            return {}
        return dict(zip(idx.tolist(), (str(x) for x in t.column(text_col).to_pylist()), strict=True))

    def _row(self, name: str) -> dict[str, Any]:
        row = self._rows.get(demo_index(name))
        if row is None:
            raise DataError(self.path, f"no episode {name!r} (has {len(self.episodes)} episodes)")
        return row

    # -- file-level metadata (TrajectoryFile's)
    @property
    def env_meta(self) -> dict[str, Any]:
        """The first source file's env_args (our exports), else ``{"env_name": robot_type, "fps": fps}``."""
        sources = self.extra.get("sources") or []
        if sources and isinstance(sources[0].get("env_meta"), dict):
            return dict(sources[0]["env_meta"])
        return {"env_name": self.info.get("robot_type") or "", "fps": self.fps}

    @property
    def language_instruction(self) -> str | None:
        """The task text when the dataset has one task, else None (each episode has its own)."""
        return next(iter(self._tasks.values())) if len(self._tasks) == 1 else None

    @property
    def filter_keys(self) -> dict[str, list[str]]:
        """``info.json`` splits (``"train": "0:40"``: episodes 0..39) as filter keys of demo names."""
        out: dict[str, list[str]] = {}
        for k, v in (self.info.get("splits") or {}).items():
            try:
                a, b = (int(x) for x in str(v).split(":"))
            except ValueError:
                continue
            out[k] = [f"demo_{i}" for i in range(a, b) if i in self._rows]
        return out

    # -- episodes
    def attrs(self, name: str) -> dict[str, Any]:
        """``num_samples``, ``language_instruction``, ``embodiment`` and (our exports) the source attributes."""
        row = self._row(name)
        i = int(row["episode_index"])
        out: dict[str, Any] = {}
        eps = self.extra.get("episodes") or []
        if i < len(eps):
            out.update({k: v for k, v in eps[i].items() if k not in ("source", "name")})
        tasks = row.get("tasks") or []
        if tasks:
            out["language_instruction"] = str(tasks[0])
        if not out.get("embodiment") and self.info.get("robot_type"):
            out["embodiment"] = str(self.info["robot_type"])
        out["num_samples"] = int(row["dataset_to_index"]) - int(row["dataset_from_index"])
        return out

    def obs_keys(self, name: str) -> list[str]:
        """Observation keys (the same for every episode: LeRobot features are dataset-wide)."""
        self._row(name)
        return sorted(self._obs)

    def num_samples(self, name: str) -> int:
        """Number of steps ``T`` of episode ``name``."""
        row = self._row(name)
        return int(row["dataset_to_index"]) - int(row["dataset_from_index"])

    def keys(self, name: str) -> list[str]:
        """Every array of episode ``name``: ``["actions", "dones", "obs/<key>", ..., "rewards"]``."""
        return self._group(name).keys()

    def _group(self, name: str) -> _Episode:
        row = self._row(name)
        T = int(row["dataset_to_index"]) - int(row["dataset_from_index"])
        items: dict[str, _Column] = {}
        for key, f in self._obs.items():
            spec = self.features[f]
            shape = tuple(int(s) for s in spec.get("shape") or (1,))
            if spec.get("dtype") in ("video", "image"):
                H, W, C = _hwc(spec)
                items[f"obs/{key}"] = _Column((T, H, W, C), np.uint8,
                                              lambda n=name, f=f: self._frames(n, f))
            else:
                items[f"obs/{key}"] = _Column((T, *shape), np.dtype(_np_dtype(spec)),
                                              lambda n=name, f=f, s=(T, *shape): self._data(n, f).reshape(s))
        A = tuple(int(s) for s in self.features["action"].get("shape") or (1,))
        items["actions"] = _Column((T, *A), np.float32, lambda n=name: self._data(n, "action").reshape(T, *A))
        if "next.reward" in self.features:
            items["rewards"] = _Column((T,), np.float32, lambda n=name: self._data(n, "next.reward").reshape(T))
        if "next.done" in self.features:
            items["dones"] = _Column((T,), np.uint8,
                                     lambda n=name: self._data(n, "next.done").reshape(T).astype(np.uint8))
        return _Episode(items)

    def dataset(self, name: str, key: str) -> _Column:
        """The lazy array ``key`` of episode ``name`` (slice it to read)."""
        col = self._group(name).get(key)
        if col is None:
            raise DataError(self.path, f"{name}: no dataset {key!r}")
        return col

    def read(self, name: str, key: str, sel: Any = ()) -> np.ndarray:
        """``key`` ("obs/<key>", "actions", "rewards", "dones") of episode ``name``, rows ``sel``."""
        return np.asarray(self.dataset(name, key)[sel])

    raw = read

    def episode(self, name: str, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Read a whole episode: ``{key: array}`` for ``keys`` (all when None)."""
        keys = self.keys(name) if keys is None else list(keys)
        return {k: self.read(name, k) for k in keys}

    # -- data
    def _data(self, name: str, feature: str) -> np.ndarray:
        """Column ``feature`` of episode ``name``'s rows (a writable array, kept for the next window)."""
        got = self._columns.get((feature, name))
        if got is None:
            got = self._columns[feature, name] = self._read_column(name, feature)
        return got

    def _read_column(self, name: str, feature: str) -> np.ndarray:
        row = self._row(name)
        path = self.path / self.info["data_path"].format(chunk_index=int(row["data/chunk_index"]),
                                                         file_index=int(row["data/file_index"]))
        got = self._tables.get(path)
        if got is None:
            t = _read_parquet(path)
            first = int(_to_numpy(t.column("index"))[0]) if "index" in t.column_names and len(t) else 0
            got = self._tables[path] = (t, first)
        t, first = got
        a, b = int(row["dataset_from_index"]) - first, int(row["dataset_to_index"]) - first
        if feature not in t.column_names:
            raise DataError(path, f"no column {feature!r}")
        if a < 0 or b > len(t):
            raise DataError(path, f"{name}: rows {a}..{b} outside the file's {len(t)} rows")
        sl = t.slice(a, b - a)
        if "episode_index" in t.column_names:
            ep = _to_numpy(sl.column("episode_index"))
            if len(ep) and (ep != int(row["episode_index"])).any():
                raise DataError(path, f"{name}: rows {a}..{b} hold other episodes (index column out of order)")
        out = _to_numpy(sl.column(feature))
        return np.array(out, dtype=np.float32 if out.dtype == np.float64 else out.dtype)  # a writable copy

    def _frames(self, name: str, feature: str) -> np.ndarray:
        """Episode ``name``'s frames of ``feature`` (T, H, W, C) uint8, from the LRU or decoded now."""
        row = self._row(name)
        key = (feature, int(row["episode_index"]))
        got = self._decoded.get(key)
        if got is not None:
            self._decoded.move_to_end(key)
            return got
        if self.features[feature].get("dtype") == "image":
            frames = self._images(name, feature)
        else:
            frames = self._decode(row, feature)
        rows, cols = self._flips
        if rows or cols:  # (T, H, W, C) stored in an old export's flipud -> image_convention
            frames = np.ascontiguousarray(frames[:, :: -1 if rows else 1, :: -1 if cols else 1])
        self._decoded[key] = frames
        self._decoded_bytes += frames.nbytes
        while self._decoded_bytes > self._budget and len(self._decoded) > 1:
            _, old = self._decoded.popitem(last=False)
            self._decoded_bytes -= old.nbytes
        return frames

    def _images(self, name: str, feature: str) -> np.ndarray:
        """Images stored in the Parquet rows (LeRobot ``image`` features: PNG / JPEG bytes)."""
        import cv2

        col = self._data(name, feature)
        out = []
        for cell in col:
            data = cell.get("bytes") if isinstance(cell, dict) else cell
            img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) if data else None
            if img is None:
                raise DataError(self.path, f"{name}: cannot decode an image of {feature}")
            out.append(cv2.cvtColor(img, cv2.COLOR_BGR2RGB))
        return np.stack(out)

    def _decode(self, row: dict[str, Any], feature: str) -> np.ndarray:
        import av

        i = int(row["episode_index"])
        T = int(row["dataset_to_index"]) - int(row["dataset_from_index"])
        path = self.path / self.info["video_path"].format(
            video_key=feature, chunk_index=int(row[f"videos/{feature}/chunk_index"]),
            file_index=int(row[f"videos/{feature}/file_index"]))
        if not path.is_file():
            raise DataError(path, f"no such file (video of episode {i})")
        t0 = float(row[f"videos/{feature}/from_timestamp"])
        half = 0.5 / self.fps
        H, W, C = _hwc(self.features[feature])
        out = np.zeros((T, H, W, C), np.uint8)
        seen = np.zeros(T, bool)
        try:
            with av.open(str(path)) as c:
                s = c.streams.video[0]
                c.seek(max(0, int(t0 / s.time_base)), stream=s, backward=True, any_frame=False)
                for fr in c.decode(s):
                    if fr.time is None:
                        continue
                    k = int(np.floor((fr.time - t0) * self.fps + 0.5))
                    if k >= T or fr.time - t0 >= T / self.fps + half:
                        break
                    if k >= 0:
                        out[k] = fr.to_ndarray(format="rgb24")[..., :C] if C != 3 else fr.to_ndarray(format="rgb24")
                        seen[k] = True
        except (av.FFmpegError, OSError, ValueError) as e:
            raise DataError(path, f"cannot decode episode {i} ({str(e).splitlines()[0]})") from None
        if not seen.all():
            raise DataError(path, f"episode {i}: {int((~seen).sum())} of its {T} frames are missing "
                                  f"from {t0:.3f} s on (truncated video?)")
        return out

    # -- lifecycle
    def close(self) -> None:
        """Drop the tables and decoded frames held in memory."""
        self._tables.clear()
        self._columns.clear()
        self._decoded.clear()
        self._decoded_bytes = 0

    def __enter__(self) -> LeRobotFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.episodes)

    def __repr__(self) -> str:
        return f"LeRobotFile({str(self.path)!r}, episodes={len(self.episodes)}, obs_keys={sorted(self._obs)})"


def _hwc(spec: dict[str, Any]) -> tuple[int, int, int]:
    """(H, W, C) of an image / video feature (LeRobot names its axes; some datasets store (C, H, W))."""
    shape = [int(s) for s in spec.get("shape") or ()]
    names = spec.get("names") or []
    if len(shape) != 3:
        raise DataError("meta/info.json", f"image feature shape {shape} is not 3-d")
    if names and list(names)[:1] in (["channels"], ["channel"]):
        return shape[1], shape[2], shape[0]
    return shape[0], shape[1], shape[2]


def _np_dtype(spec: dict[str, Any]) -> str:
    d = str(spec.get("dtype", "float32"))
    return "float32" if d in ("float64", "float") else ("bool" if d == "bool" else d)
