"""Trajectory datasets in the robomimic / LIBERO HDF5 layout: writer, reader and a map-style Dataset.

File layout (one HDF5 file, many episodes)::

    data/                          attrs: total (int, sum of num_samples), env_args (JSON str), and
                                   optionally problem_info (JSON str with "language_instruction"),
                                   env_name, bddl_file_name (LIBERO)
    data/demo_<i>/                 attrs: num_samples (int) + per-episode attrs (see below)
        obs/<key>                  (T, H, W, 3) uint8 RGB images (chunked per frame; see "Image conventions")
                                   or (T, D) float proprio
        next_obs/<key>             optional, same shapes as obs/<key> (robomimic)
        actions                    (T, A) float
        rewards                    (T,) float
        dones                      (T,) uint8, 1 on the last step of a finished episode
        states                     optional (T, S) float simulator states
    mask/<filter>                  optional robomimic filter keys: byte strings of demo names

``env_args`` follows robomimic: ``{"env_name": str, "env_type": int | str, "env_kwargs": dict, ...}``.
Per-episode attrs written by the project's recorder: ``embodiment`` (str), ``action_space`` (dict),
``success`` (bool), ``language_instruction`` (str). Dicts and lists are stored as JSON strings and decoded
on read (any string attribute that parses as a JSON object or list comes back decoded).

Real LIBERO files (``agentview_rgb``, ``eye_in_hand_rgb``, ``ee_states`` ...; ``problem_info``,
``bddl_file_name``; demo attrs ``init_state``, ``model_file``) and real robomimic files
(``agentview_image``, ``robot0_eef_pos`` ...; ``mask/train|valid``; ``next_obs``) load unchanged.

Image conventions (``core.data.image_convention``; ``TrajectoryFile.image_convention`` says which one ``read``
returns, ``TrajectoryDataset.image_convention`` the one of a dataset's samples):
    - a file's own ``image_convention`` (``data`` attribute, or a key of ``env_args``) wins: frames come back in
      it. Files recorded here state it (``embodied libero record``: ``"rot180"``; rollouts of LIBERO envs).
    - LIBERO files (``is_libero``: BDDL attributes, a ``libero_*`` problem, a LIBERO env) come back in
      ``"rot180"``, openpi's and LeRobot's LIBERO convention and ``LiberoEnv``'s: LIBERO's own files store the raw
      OpenGL-order render (``macros_image_convention = "opengl"``), so rows and columns are reversed; a LIBERO file
      without that attribute and without its own convention is a rollout of ``LiberoEnv`` recorded before
      2026-12, in its ``"flipud"`` frames, so columns are reversed.
    - other files: ``"opengl"`` ones come back upright (rows reversed), the rest as stored; no convention (None).

Reader API (``TrajectoryFile``, defined in ``core.data.hdf5``)::

    with TrajectoryFile(path) as f:
        f.episodes                   # ["demo_0", "demo_1", ...] sorted by index
        f.episode("demo_0")          # {"obs/agentview_rgb": (T,H,W,3) uint8, "actions": (T,A), ...}
        f.attrs("demo_0"), f.env_meta, f.language_instruction, f.filter_keys

``TrajectoryDataset`` also reads LeRobot v3 dataset folders (a path that is a directory holding
``meta/info.json``; ``core.data.lerobot``) with the same windows: ``open_trajectories`` picks the reader.

Dataset sample (``TrajectoryDataset[i]``), for a window anchored at step ``t`` of one episode:
    ``obs.<key>``        (frame_stack, 3, H, W) uint8 for image keys (steps t-frame_stack+1 .. t, the first
                         frame repeated before the episode start), (frame_stack, D) float32 otherwise
    ``actions``          (horizon, A) float32, steps t .. t+horizon-1 (last action repeated past the end)
    ``actions_is_pad``   (horizon,) bool, True where the action step lies past the episode end
    ``rewards``          (horizon,) float32;  ``dones`` (horizon,) bool (zeros when the file has none)
    ``episode_index``    () int64, index into ``dataset.episodes`` (the side table of string metadata:
                         path, demo name, embodiment, language instruction, success)
    ``timestep``         () int64, ``t``
With ``action_pad_to=N`` actions are zero-padded to N dims (explicit opt-in) and ``action_dim_mask`` (N,)
bool marks the real dims; otherwise a batch must hold a single action dim (use
``core.data.samplers.GroupedBatchSampler`` over ``dataset.groups()`` to batch per embodiment).
The sample does not depend on ``cache`` (``"none"`` / ``"low_dim"`` / ``"all"``: what the dataset holds in
memory instead of reading it per window; see ``TrajectoryDataset``).
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from core.data.hdf5 import TrajectoryFile, is_image_key, is_libero, trajectory_files
from core.data.image_convention import flips
from core.data.lerobot import INFO_PATH, LeRobotFile
from core.errors import DataError
from core.io import atomic_path

__all__ = [
    "DataKeys",
    "EpisodeInfo",
    "TrajectoryDataset",
    "TrajectoryFile",
    "TrajectoryWriter",
    "data_keys",
    "is_image_key",
    "is_libero",
    "open_trajectories",
]

OnError = Literal["raise", "skip"]


# --------------------------------------------------------------------------------------------- helpers
def _encode_attr(value: Any) -> Any:
    """Map a Python value to something HDF5 stores as an attribute (dicts / lists -> JSON strings).

    ``core.data.hdf5`` decodes them on read.
    """
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, Path):
        return str(value)
    if value is None:
        return "null"
    return value


# ---------------------------------------------------------------------------------------------- writer
class TrajectoryWriter:
    """Write episodes to one HDF5 file in the robomimic / LIBERO layout, published atomically.

    Data goes to a temporary file next to ``path`` that is renamed onto ``path`` when the writer is
    closed after a successful ``with`` block; on an exception the temp file is removed and ``path`` is
    left untouched.

    Args:
        path: Destination ``.hdf5`` file.
        env_meta: robomimic-style env description: ``env_name``, ``env_type``, ``env_kwargs`` and any
            other JSON-serialisable keys; stored as the ``data`` attribute ``env_args`` (JSON).
        language_instruction: Stored LIBERO-style in ``data`` attr ``problem_info`` (JSON).
        compression: h5py compression filter for every dataset (``"gzip"``, ``"lzf"`` or None).

    Example::

        with TrajectoryWriter("demos.hdf5", env_meta={"env_name": "Lift"}) as w:
            w.add_episode({"image": frames, "proprio": q}, actions, attrs={"embodiment": "Panda"})
    """

    def __init__(
        self,
        path: str | os.PathLike,
        env_meta: dict | None = None,
        language_instruction: str | None = None,
        compression: str | None = "gzip",
    ):
        self.path = Path(path)
        self.compression = compression
        self._stack = contextlib.ExitStack()
        self._tmp = self._stack.enter_context(atomic_path(self.path))
        self._file = h5py.File(self._tmp, "w")
        self._data = self._file.create_group("data")
        self._num_episodes = 0
        self._total = 0
        self._closed = False
        meta = dict(env_meta or {})
        env_args = {
            "env_name": meta.pop("env_name", ""),
            "env_type": meta.pop("env_type", None),
            "env_kwargs": meta.pop("env_kwargs", {}),
            **meta,
        }
        self._data.attrs["env_args"] = _encode_attr(env_args)
        if env_args["env_name"]:
            self._data.attrs["env_name"] = str(env_args["env_name"])
        if language_instruction is not None:
            self._data.attrs["problem_info"] = _encode_attr({"language_instruction": language_instruction})
        self._data.attrs["total"] = 0

    # -- episodes
    def add_episode(
        self,
        obs: dict[str, np.ndarray],
        actions: np.ndarray,
        rewards: np.ndarray | None = None,
        dones: np.ndarray | None = None,
        states: np.ndarray | None = None,
        next_obs: dict[str, np.ndarray] | None = None,
        attrs: dict | None = None,
    ) -> str:
        """Append one episode of ``T`` steps and return its group name ``"demo_<i>"``.

        Args:
            obs: key -> (T, ...) array; images (T, H, W, 3) uint8 RGB, proprio (T, D) float.
            actions: (T, A) float actions (a (T,) array is stored as (T, 1)).
            rewards: (T,) float; zeros when None.
            dones: (T,) bool / int; when None, 1 on the last step only (robomimic convention).
            states: Optional (T, S) simulator states.
            next_obs: Optional key -> (T, ...) observations after each step; when given it must mirror
                ``obs`` (the same keys and shapes), since robomimic-style readers load ``next_obs/<key>``
                for every ``obs/<key>``.
            attrs: Episode attributes (``embodiment``, ``action_space``, ``success``,
                ``language_instruction`` ...); dicts / lists are stored as JSON strings.

        Raises:
            DataError: A length or shape is inconsistent (the message names the file, episode and key).
        """
        if self._closed:
            raise RuntimeError(f"{self.path}: writer is closed")
        name = f"demo_{self._num_episodes}"
        actions = np.asarray(actions)
        if actions.ndim == 1:
            actions = actions[:, None]
        if actions.ndim != 2:
            raise DataError(self.path, f"{name}: actions must be (T, A), got shape {actions.shape}")
        if not np.issubdtype(actions.dtype, np.floating):
            actions = actions.astype(np.float32)
        T = actions.shape[0]
        if T == 0:
            raise DataError(self.path, f"{name}: empty episode (0 steps)")
        if not obs:
            raise DataError(self.path, f"{name}: no observations")
        rewards = np.zeros(T, np.float32) if rewards is None else np.asarray(rewards, dtype=np.float32)
        if dones is None:
            dones = np.zeros(T, np.uint8)
            dones[-1] = 1
        dones = np.asarray(dones).astype(np.uint8)

        def check(key: str, arr: np.ndarray) -> np.ndarray:
            arr = np.asarray(arr)
            if arr.ndim == 0 or arr.shape[0] != T:
                raise DataError(
                    self.path, f"{name}: {key} has shape {arr.shape}, expected {T} steps like actions"
                )
            return arr

        check("rewards", rewards)
        check("dones", dones)
        if next_obs is not None:
            lacking, extra = sorted(set(obs) - set(next_obs)), sorted(set(next_obs) - set(obs))
            if lacking or extra:
                what = f"lacks obs key(s) {lacking}" if lacking else f"has key(s) {extra} that obs does not"
                raise DataError(self.path, f"{name}: next_obs {what}")
            for k in obs:
                o, n = np.shape(obs[k]), np.shape(next_obs[k])
                if o != n:
                    raise DataError(self.path, f"{name}: next_obs/{k} has shape {n}, obs/{k} {o}")
        grp = self._data.create_group(name)
        try:
            self._write_obs(grp.create_group("obs"), {k: check(f"obs/{k}", v) for k, v in obs.items()})
            if next_obs is not None:
                self._write_obs(
                    grp.create_group("next_obs"), {k: check(f"next_obs/{k}", v) for k, v in next_obs.items()}
                )
            self._dataset(grp, "actions", actions)
            self._dataset(grp, "rewards", rewards)
            self._dataset(grp, "dones", dones)
            if states is not None:
                self._dataset(grp, "states", check("states", states))
        except BaseException:
            del self._data[name]
            raise
        grp.attrs["num_samples"] = T
        for k, v in (attrs or {}).items():
            grp.attrs[k] = _encode_attr(v)
        self._num_episodes += 1
        self._total += T
        self._data.attrs["total"] = self._total
        return name

    def add_filter_key(self, name: str, episodes: Iterable[str]) -> None:
        """Add a robomimic filter key ``mask/<name>`` listing episode names (e.g. "train", "valid")."""
        mask = self._file.require_group("mask")
        if name in mask:
            del mask[name]
        mask.create_dataset(name, data=np.array([e.encode() for e in episodes], dtype="S"))

    def _write_obs(self, grp: h5py.Group, obs: Mapping[str, np.ndarray]) -> None:
        for key, arr in obs.items():
            if is_image_key(arr.shape, arr.dtype):
                self._dataset(grp, key, arr, chunks=(1, *arr.shape[1:]))
            else:
                if arr.dtype == np.float64:
                    arr = arr.astype(np.float32)
                self._dataset(grp, key, arr)

    def _dataset(self, grp: h5py.Group, key: str, arr: np.ndarray, chunks: tuple | None = None) -> None:
        small = arr.nbytes < 1024
        grp.create_dataset(
            key,
            data=arr,
            chunks=chunks if chunks is not None else (None if small else True),
            compression=None if small else self.compression,
        )

    # -- lifecycle
    def close(self) -> None:
        """Flush and publish the file (rename the temp file onto ``path``)."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        self._stack.close()

    def abort(self) -> None:
        """Discard everything written; ``path`` is left as it was."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        err = RuntimeError("aborted")
        self._stack.__exit__(type(err), err, None)

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __len__(self) -> int:
        return self._num_episodes


# ---------------------------------------------------------------------------------------------- reader
# ``TrajectoryFile``, ``is_image_key`` and ``is_libero`` live in ``core.data.hdf5`` and are re-exported here.
def open_trajectories(path: str | os.PathLike, chunk_cache_bytes: int | None = None) -> Any:
    """Open trajectories for reading: an HDF5 file as ``TrajectoryFile``, a folder as a LeRobot v3 dataset.

    Both offer the interface ``TrajectoryDataset`` uses (episodes, attrs, obs_keys, read, group-like ``_group``
    whose entries have ``shape`` / ``dtype`` / slicing); ``core.data.lerobot.LeRobotFile`` documents the folder.

    Raises:
        DataError: Missing, or not a trajectory file / LeRobot folder.
    """
    if Path(path).is_dir():
        return LeRobotFile(path)
    return TrajectoryFile(path, chunk_cache_bytes=chunk_cache_bytes)


def expand_data_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Data paths as the loaders take them: a folder stands for its ``*.hdf5`` files.

    A folder that is not a LeRobot dataset (no ``meta/info.json``: a LIBERO suite folder, an ``embodied libero
    record`` or ``drive eval`` output) becomes the ``*.hdf5`` files under it at any depth, sorted
    (``core.data.hdf5.trajectory_files``); files and LeRobot folders stay. Paths that do not exist are kept (the
    caller records or refuses them).

    Raises:
        DataError: A folder without ``*.hdf5`` files.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(trajectory_files(p) if p.is_dir() and not (p / INFO_PATH).is_file() else [p])
    return out


@dataclass(frozen=True)
class DataKeys:
    """The observation keys of a data source and what the source itself says they are.

    ``obs``: every obs key (of the first episode). ``cameras``: the image keys, the source's main camera first.
    ``state``: the keys that make the robot state, concatenated in this order. ``stated``: whether ``cameras`` and
    ``state`` are the source's own statement (a LeRobot folder's ``meta/info.json``: its camera features in their
    order, its ``observation.state``) rather than read off array shapes (an HDF5 file: its image-shaped keys,
    sorted, and no state). ``source``: where they were read.
    """

    obs: tuple[str, ...]
    cameras: tuple[str, ...]
    state: tuple[str, ...]
    stated: bool
    source: str


def data_keys(path: str | os.PathLike) -> DataKeys:
    """The ``DataKeys`` of an HDF5 trajectory file or a LeRobot folder (see ``DataKeys``).

    Raises:
        DataError: ``path`` cannot be read, or holds no episode.
    """
    with open_trajectories(path) as f:
        if not f.episodes:
            raise DataError(path, "no episodes")
        first = f.episodes[0]
        obs = tuple(f.obs_keys(first))
        if isinstance(f, LeRobotFile):
            return DataKeys(obs, tuple(f.camera_keys), tuple(f.state_keys), True, str(Path(path) / INFO_PATH))
        cams = tuple(k for k in obs if is_image_key(f.dataset(first, f"obs/{k}").shape,
                                                    f.dataset(first, f"obs/{k}").dtype))
        return DataKeys(obs, cams, (), False, str(path))


def _is_array(x: Any) -> bool:
    """Whether an entry of an episode group is an array (an h5py dataset or a LeRobot column), not a group."""
    return x is not None and hasattr(x, "shape") and hasattr(x, "dtype")


# --------------------------------------------------------------------------------------------- dataset
@dataclass(frozen=True)
class EpisodeInfo:
    """One row of ``TrajectoryDataset.episodes``: the string metadata kept out of the tensor dict."""

    path: str
    name: str
    length: int
    embodiment: str
    action_dim: int
    language_instruction: str | None
    success: bool | None


def _embodiment(attrs: Mapping[str, Any], env_meta: Mapping[str, Any]) -> str:
    """Episode attr ``embodiment``; else env_args' ``embodiment``, robosuite's ``env_kwargs.robots``, or Panda.

    ``"Panda"`` is the answer for a LIBERO file without robots (env_args with a ``bddl_file``: every LIBERO
    benchmark task is a Panda's); ``"unknown"`` for anything else.
    """
    if attrs.get("embodiment"):
        return str(attrs["embodiment"])
    if env_meta.get("embodiment"):
        return str(env_meta["embodiment"])
    robots = (env_meta.get("env_kwargs") or {}).get("robots")
    if isinstance(robots, str):
        return robots
    if isinstance(robots, list) and robots:
        return "+".join(map(str, robots))
    if env_meta.get("bddl_file"):
        return "Panda"
    return "unknown"


def _channels_first(dst: np.ndarray, src: np.ndarray, flip: tuple[bool, bool] = (False, False)) -> None:
    """Write images ``src`` (n, H, W, C) into ``dst`` (n, C, H, W), rows / columns reversed as ``flip`` says.

    uint8 images with 2-4 channels are split into planes by OpenCV (SIMD), about 8x faster than numpy's
    strided transpose copy, which remains the path for everything else. Rows and columns both reversed (LIBERO's
    raw frames to ``rot180``) is one ``cv2.flip`` of all n frames stacked before the split, which also reverses
    their order; the planes are then copied in reverse order, a copy of whole frames.
    """
    rows, cols = flip
    n, H, W, C = src.shape
    if n and src.dtype == np.uint8 and 2 <= C <= 4 and src.flags.c_contiguous:
        both = rows and cols
        stack = src.reshape(n * H, W, C)
        if both or cols:
            stack = cv2.flip(stack, -1 if both else 1)  # -1: rows of the whole stack (frame order too) and columns
        for c, plane in enumerate(cv2.split(stack)):
            plane = plane.reshape(n, H, W)
            dst[:, c] = plane[::-1] if both else (plane[:, ::-1] if rows else plane)
        return
    dst[...] = src[:, :: -1 if rows else 1, :: -1 if cols else 1].transpose(0, 3, 1, 2)


CacheMode = Literal["none", "low_dim", "all"]
CACHE_MODES: tuple[str, ...] = ("none", "low_dim", "all")
_CHUNK_CACHE_BYTES = 1 << 20  # HDF5 chunk cache per open image dataset (h5py's default) ...
_CHUNK_CACHE_BUDGET = 256 << 20  # ... lowered so that one worker's image datasets share at most this


class TrajectoryDataset(Dataset):
    """Map-style dataset of fixed-length windows over episodes of one or more trajectory files.

    Keys, shapes and dtypes of a sample are documented in this module's docstring; they do not depend on
    ``cache``. Files are indexed once at construction (then closed). Each process (the main one, each
    DataLoader worker after fork or spawn) opens the files it reads on first access and resolves an
    episode's datasets and attributes once, on the first window it reads from that episode; h5py handles
    are never shared across a fork. ``__getitems__`` (used by ``DataLoader`` with batching) reads a batch at
    once: each frame that several windows of the batch share is read and decoded once, consecutive frames
    in one HDF5 read.

    Cache modes (``cache``; memory per process, but forked DataLoader workers share the parent's arrays
    copy-on-write, so a cache is held once for ``num_workers`` workers on Linux):

    - ``"none"``: nothing loaded up front; every window is read from the files. A process holds its open
      files, a few KiB of handles per episode read, and HDF5's chunk cache of decoded chunks: at most
      1 MiB per open dataset, lowered so that the image datasets of all episodes share at most 256 MiB.
    - ``"low_dim"`` (default): also holds every non-image observation key (float32), ``actions``
      (float32, ``action_pad_to`` wide when set), ``rewards`` (float32) and ``dones`` (bool) of the
      selected episodes: ``4 * (D + A + 1) + 1`` bytes per step for D low-dim obs dims; images are
      read from the files as with ``"none"``.
    - ``"all"``: also decodes every image key at construction, ``H * W * C`` bytes per step and image key
      (uint8, channels first, in ``image_convention``; e.g. 21 KiB per 84x84 RGB frame), plus ``frame_stack - 1`` copies
      of each episode's first frame. The files are not read after construction. In ``__getitems__`` the
      images of the samples are views of this cache (see there).

    ``cache_nbytes`` says how many bytes a cache holds. ``image_convention`` is the convention of the samples'
    frames (``"rot180"`` for LIBERO files, see the module docstring; None without image keys or for other files),
    for a trainer to record in its checkpoint.

    Args:
        paths: One file or several. Files may hold different embodiments and action dims.
        obs_keys: Observation keys to load (without ``obs/``); all keys of the first episode when None.
            Every episode must have them.
        horizon: Number of action steps per sample (``actions`` is (horizon, A)).
        frame_stack: Number of observation frames per sample (steps t-frame_stack+1 .. t).
        stride: Step between consecutive window anchors ``t`` inside an episode.
        filter_key: robomimic filter key (``mask/<filter_key>``) selecting episodes, e.g. ``"train"``.
        pad_end: Allow windows whose actions run past the episode end (padded by repeating the last
            action, flagged in ``actions_is_pad``); otherwise anchors stop at T - horizon.
        action_pad_to: Zero-pad actions to this many dims and add ``action_dim_mask`` (explicit opt-in
            for batching embodiments with different action dims together).
        embodiments: Keep only episodes of these embodiments.
        on_error: ``"raise"`` a ``DataError`` on the first bad file / episode, or ``"skip"`` it and count
            it in ``skipped`` (``{"files": n, "episodes": m}``) with the errors in ``errors``. Errors while
            reading data later (a corrupt chunk: at construction for cached keys, else when a sample is
            read) always raise ``DataError`` naming file and episode.
        cache: ``"none"``, ``"low_dim"`` or ``"all"`` (see above).
    """

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        obs_keys: Sequence[str] | None = None,
        horizon: int = 1,
        frame_stack: int = 1,
        stride: int = 1,
        filter_key: str | None = None,
        pad_end: bool = True,
        action_pad_to: int | None = None,
        embodiments: Sequence[str] | None = None,
        on_error: OnError = "raise",
        cache: CacheMode = "low_dim",
    ):
        if horizon < 1 or frame_stack < 1 or stride < 1:
            raise ValueError(
                f"horizon, frame_stack and stride must be >= 1, got {horizon}, {frame_stack}, {stride}"
            )
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("TrajectoryDataset needs at least one file")
        self.obs_keys: list[str] | None = list(obs_keys) if obs_keys is not None else None
        self.horizon, self.frame_stack, self.stride = horizon, frame_stack, stride
        self.filter_key, self.pad_end, self.action_pad_to = filter_key, pad_end, action_pad_to
        self.on_error, self.cache = on_error, cache
        self.skipped = {"files": 0, "episodes": 0}
        self.errors: list[DataError] = []
        self.episodes: list[EpisodeInfo] = []
        self.image_keys: set[str] = set()
        self._file_conventions: dict[int, str | None] = {}  # file index -> its image_convention
        self._file_index: list[int] = []  # episode -> index into self.paths
        self._layouts: list[dict[str, Any]] = []  # episode -> stored shapes (see _index_episode)
        anchors: list[np.ndarray] = []
        keep = set(embodiments) if embodiments is not None else None
        for fi, path in enumerate(self.paths):
            try:
                rows, self._file_conventions[fi] = self._index_file(path)
            except DataError as e:
                self._fail(e, "files")
                continue
            for info, layout, err in rows:
                if err is not None:
                    self._fail(err, "episodes")
                    continue
                if keep is not None and info.embodiment not in keep:
                    continue
                ts = self._anchors(info.length)
                if len(ts) == 0:
                    continue
                ei = len(self.episodes)
                self.episodes.append(info)
                self._file_index.append(fi)
                self._layouts.append(layout)
                anchors.append(np.stack([np.full(len(ts), ei), ts], axis=1))
        self._index = np.concatenate(anchors).astype(np.int64) if anchors else np.zeros((0, 2), np.int64)
        self.image_convention = self._common_convention()
        if self.obs_keys is None:
            self.obs_keys = []
        self._check_action_dims()
        self._build_tables()
        # cached key -> (arrays, one per per-step shape; episode -> its array; episode -> first row there)
        self._mem: dict[str, tuple[list[np.ndarray], np.ndarray, np.ndarray]] = {}
        self.cache_nbytes = 0  # bytes the cache holds
        if cache != "none":
            self._load_cache()
        n_image_ds = len(self.episodes) * sum(k in self.image_keys and f"obs/{k}" not in self._mem
                                              for k in self.obs_keys)  # fmt: skip
        self._chunk_cache_bytes = min(_CHUNK_CACHE_BYTES, _CHUNK_CACHE_BUDGET // max(1, n_image_ds))
        self._handles: dict[int, TrajectoryFile] = {}
        self._episode_ds: dict[int, dict[str, tuple[h5py.Dataset | None, tuple[bool, bool]]]] = {}
        self._views: dict[tuple[str, int], torch.Tensor] = {}  # cached image array -> read-only tensor
        self._pid = os.getpid()

    # -- indexing
    def _fail(self, err: DataError, what: str) -> None:
        if self.on_error == "raise":
            raise err
        self.skipped[what] += 1
        self.errors.append(err)

    def _anchors(self, length: int) -> np.ndarray:
        last = length - 1 if self.pad_end else length - self.horizon
        return np.arange(0, last + 1, self.stride, dtype=np.int64) if last >= 0 else np.zeros(0, np.int64)

    def _common_convention(self) -> str | None:
        """The image convention of the samples' frames: that of every file with selected episodes.

        None when no image key is loaded or one of the files has none.

        Raises:
            DataError: Two files whose frames are laid out differently (``rot180`` vs ``flipud``): one policy
                cannot learn from both.
        """
        if not any(k in self.image_keys for k in self.obs_keys or []):
            return None
        got = [(fi, self._file_conventions.get(fi)) for fi in sorted(set(self._file_index))]
        known = [(fi, c) for fi, c in got if c is not None]
        for fi, c in known[1:]:
            if flips(c, known[0][1]) != (False, False):
                raise DataError(self.paths[fi], f"images in convention {c!r}, but {self.paths[known[0][0]]} has "
                                                f"{known[0][1]!r}: convert one (core.data.image_convention) or "
                                                "train on them separately")
        return known[0][1] if known and len(known) == len(got) else None

    def _index_file(self, path: Path) -> tuple[list[tuple[EpisodeInfo | None, dict | None, DataError | None]],
                                               str | None]:
        """The rows (info, layout, error) of the file's selected episodes, and its image convention."""
        with open_trajectories(path) as f:
            names = f.episodes
            if self.filter_key is not None:
                fk = f.filter_keys
                if self.filter_key not in fk:
                    raise DataError(
                        path, f"no filter key mask/{self.filter_key} (has {sorted(fk) or 'none'})"
                    )
                wanted = set(fk[self.filter_key])
                names = [n for n in names if n in wanted]
            env_meta, li_file = f.env_meta, f.language_instruction
            rows: list[tuple[EpisodeInfo | None, dict | None, DataError | None]] = []
            for name in names:
                try:
                    rows.append((*self._index_episode(f, name, env_meta, li_file), None))
                except DataError as e:
                    rows.append((None, None, e))
            return rows, f.image_convention

    def _index_episode(
        self, f: TrajectoryFile, name: str, env_meta: dict, li_file: str | None
    ) -> tuple[EpisodeInfo, dict[str, Any]]:
        """Check episode ``name`` and return its info and layout.

        The layout maps ``"obs/<key>"`` to ``(shape[1:], dtype, is_image)`` as stored, and ``"rewards"`` /
        ``"dones"`` to whether the episode has them.
        """
        grp = f._group(name)
        if not _is_array(grp.get("actions")):
            raise DataError(f.path, f"{name}: no 'actions' dataset (wrong layout)")
        act = grp["actions"]
        if act.ndim not in (1, 2):
            raise DataError(f.path, f"{name}: actions has shape {act.shape}, expected (T, A)")
        T = int(act.shape[0])
        obs_keys = f.obs_keys(name)
        if self.obs_keys is None:
            if not obs_keys:
                raise DataError(f.path, f"{name}: no obs group")
            self.obs_keys = obs_keys
        layout: dict[str, Any] = {}
        for key in self.obs_keys:
            ds = grp.get(f"obs/{key}")
            if not _is_array(ds):
                raise DataError(f.path, f"{name}: no observation {key!r} (has {obs_keys})")
            if ds.shape[0] != T:
                raise DataError(f.path, f"{name}: obs/{key} has {ds.shape[0]} steps, actions has {T}")
            image = is_image_key(ds.shape, ds.dtype)
            if image:
                self.image_keys.add(key)
            layout[f"obs/{key}"] = (tuple(ds.shape[1:]), np.dtype(ds.dtype), image)
        for key in ("rewards", "dones"):
            ds = grp.get(key)
            if _is_array(ds) and ds.shape[0] != T:
                raise DataError(f.path, f"{name}: {key} has {ds.shape[0]} steps, actions has {T}")
            layout[key] = key in grp
        attrs = f.attrs(name)
        if "num_samples" in attrs and int(attrs["num_samples"]) != T:
            raise DataError(f.path, f"{name}: num_samples={attrs['num_samples']} but actions has {T} steps")
        li = attrs.get("language_instruction") or li_file
        success = attrs.get("success")
        info = EpisodeInfo(
            path=str(f.path),
            name=name,
            length=T,
            embodiment=_embodiment(attrs, env_meta),
            action_dim=int(act.shape[1]) if act.ndim == 2 else 1,
            language_instruction=str(li) if li else None,
            success=None if success is None else bool(success),
        )
        return info, layout

    def _check_action_dims(self) -> None:
        dims: dict[str, set[int]] = {}
        for e in self.episodes:
            dims.setdefault(e.embodiment, set()).add(e.action_dim)
        for emb, ds in dims.items():
            if len(ds) > 1:
                raise DataError(
                    self.paths[0], f"embodiment {emb!r} has episodes with action dims {sorted(ds)}"
                )
        if self.action_pad_to is not None:
            big = max((e.action_dim for e in self.episodes), default=0)
            if big > self.action_pad_to:
                raise ValueError(f"action_pad_to={self.action_pad_to} is smaller than an action dim ({big})")

    def _is_image(self, name: str) -> bool:
        """Whether ``name`` ("obs/<key>", "actions" ...) is an image key."""
        return name.startswith("obs/") and name[4:] in self.image_keys

    def _spec(self, ei: int, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """Per-step shape and dtype of ``name`` ("obs/<key>", "actions" ...) in samples of episode ``ei``."""
        if name == "actions":
            return (self.action_pad_to or self.episodes[ei].action_dim,), np.dtype(np.float32)
        if name in ("rewards", "dones"):
            return (), np.dtype(np.float32 if name == "rewards" else bool)
        tail, dtype, _ = self._layouts[ei][name]
        if self._is_image(name):  # (H, W, C) as stored -> (C, H, W), dtype kept
            return (tail[-1], *tail[:-1]), dtype
        return tail, np.dtype(np.float32)

    def _build_tables(self) -> None:
        """Per-episode arrays the batched reader uses: lengths, action dims and sample signatures."""
        self._names = [f"obs/{k}" for k in self.obs_keys or []] + ["actions", "rewards", "dones"]
        self._lengths = np.array([e.length for e in self.episodes], dtype=np.int64)
        self._action_dims = np.array([e.action_dim for e in self.episodes], dtype=np.int64)
        self._stride_key = int(self._lengths.max(initial=0)) + 1  # (episode, step) -> episode * this + step
        self._frame_offsets = np.arange(1 - self.frame_stack, 1, dtype=np.int64)
        self._step_offsets = np.arange(self.horizon, dtype=np.int64)
        # Episodes with one signature give samples of one shape per key: batches of them are read at once.
        sigs: dict[tuple, int] = {}
        self._sig = np.array(
            [sigs.setdefault(tuple(self._spec(ei, n) for n in self._names), len(sigs))
             for ei in range(len(self.episodes))],
            dtype=np.int64,
        )  # fmt: skip
        self._uniform = len(sigs) <= 1

    def _load_cache(self) -> None:
        """Read the cached keys of every episode into one array per key and per-step shape.

        Cached image keys hold ``frame_stack - 1`` copies of an episode's first frame before it, so that
        every window of frames is one slice of the array (see ``_gather``).
        """
        names = [n for n in self._names if self.cache == "all" or not self._is_image(n)]
        E = len(self.episodes)
        for name in names:
            pad = self.frame_stack - 1 if self._is_image(name) else 0
            shapes: dict[tuple, int] = {}
            col_of, off = np.zeros(E, np.int64), np.zeros(E, np.int64)
            rows: list[int] = []
            for ei in range(E):
                c = col_of[ei] = shapes.setdefault(self._spec(ei, name), len(shapes))
                if c == len(rows):
                    rows.append(0)
                off[ei], rows[c] = rows[c] + pad, rows[c] + pad + self.episodes[ei].length
            cols = [np.zeros((n, *tail), dtype) for (tail, dtype), n in zip(shapes, rows)]
            self._mem[name] = (cols, col_of, off)
        by_file: dict[int, list[int]] = {}
        for ei, fi in enumerate(self._file_index):
            by_file.setdefault(fi, []).append(ei)
        for fi, eis in by_file.items():
            with open_trajectories(self.paths[fi]) as f:
                file_flips = f.image_flips
                for ei in eis:
                    grp, T = f._group(self.episodes[ei].name), self.episodes[ei].length
                    for name in names:
                        ds = grp.get(name)
                        if ds is None:  # rewards / dones absent: zeros
                            continue
                        cols, col_of, off = self._mem[name]
                        col, o = cols[col_of[ei]], off[ei]
                        arr = self._read(ei, name, ds, 0, T)
                        self._put(name, col[o : o + T], arr, self._flips(name, ei, file_flips))
                        if self._is_image(name):
                            col[o - self.frame_stack + 1 : o] = col[o]
        self.cache_nbytes = sum(c.nbytes for cols, _, _ in self._mem.values() for c in cols)

    def _flips(self, name: str, ei: int, file_flips: tuple[bool, bool]) -> tuple[bool, bool]:
        """(reverse rows, reverse columns) of stored ``name`` in its sample: the file's for an image key."""
        return file_flips if name.startswith("obs/") and self._layouts[ei][name][2] else (False, False)

    def _put(self, name: str, dst: np.ndarray, arr: np.ndarray, flip: tuple[bool, bool]) -> None:
        """Write stored rows ``arr`` of ``name`` into ``dst`` (rows of the sample layout)."""
        if name.startswith("obs/"):
            if self._is_image(name):
                _channels_first(dst, arr, flip)
            else:
                dst[...] = arr
        elif name == "actions":
            arr = arr.reshape(len(arr), -1)
            dst[:, : arr.shape[1]] = arr
        else:
            dst[...] = arr.reshape(len(arr), -1)[:, 0]

    def _read(self, ei: int, name: str, ds: h5py.Dataset, a: int, b: int) -> np.ndarray:
        try:
            return ds[a:b]
        except (OSError, ValueError, RuntimeError) as e:
            info = self.episodes[ei]
            raise DataError(info.path, f"{info.name}/{name}: cannot read ({e})") from None

    # -- side tables
    @property
    def action_dims(self) -> dict[str, int]:
        """Embodiment -> action dim."""
        return {e.embodiment: e.action_dim for e in self.episodes}

    def groups(self) -> dict[str, list[int]]:
        """Embodiment -> sample indices (for ``GroupedBatchSampler``: one action dim per batch)."""
        emb = np.array([e.embodiment for e in self.episodes], dtype=object)
        per_sample = emb[self._index[:, 0]] if len(self._index) else np.zeros(0, dtype=object)
        return {k: np.flatnonzero(per_sample == k).tolist() for k in sorted(set(per_sample))}

    def sample_episodes(self) -> np.ndarray:
        """(len(self),) int64: for each sample, the index into ``episodes`` of the episode it comes from."""
        return self._index[:, 0].copy()

    def episode_info(self, index: int) -> EpisodeInfo:
        """Metadata of the episode that sample ``index`` comes from."""
        return self.episodes[int(self._index[index, 0])]

    # -- access
    def _this_process(self) -> None:
        """Drop the handles (and tensor views) of another process: forked into a worker, never reuse them."""
        if self._pid != os.getpid():
            self._handles, self._episode_ds, self._views, self._pid = {}, {}, {}, os.getpid()

    def _file(self, ei: int) -> TrajectoryFile:
        self._this_process()
        fi = self._file_index[ei]
        f = self._handles.get(fi)
        if f is None:
            f = self._handles[fi] = open_trajectories(self.paths[fi], chunk_cache_bytes=self._chunk_cache_bytes)
        return f

    def _datasets(self, ei: int) -> dict[str, tuple[h5py.Dataset | None, tuple[bool, bool]]]:
        """This process's handles of episode ``ei``, resolved once.

        name -> (dataset or None, (flip rows, flip columns)).
        """
        self._this_process()
        got = self._episode_ds.get(ei)
        if got is None:
            f = self._file(ei)
            grp, file_flips = f._group(self.episodes[ei].name), f.image_flips
            got = {}
            for name in self._names:
                if name not in self._mem:
                    ds = grp.get(name)
                    if not _is_array(ds) and name.startswith("obs/"):
                        raise DataError(f.path, f"{self.episodes[ei].name}: no dataset {name!r}")
                    got[name] = (ds, self._flips(name, ei, file_flips))
            self._episode_ds[ei] = got
        return got

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        i = operator.index(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        return self._items(np.array([i % len(self)], dtype=np.int64), views=False)[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """Samples ``[self[i] for i in indices]``, read together (what ``DataLoader`` calls per batch).

        With ``cache="all"`` the image tensors of these samples are views of the cache, so that a batch's
        images are copied once, by the collate function (as robomimic hands out its cached arrays). They are
        inference tensors: an in-place update raises ``RuntimeError`` (PyTorch checks after writing, so the
        cache of that process is then spoilt); ``.clone()`` gives a writable copy. Everything else is a
        fresh tensor, as from ``self[i]``.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(idx) == 0:
            return []
        bad = (idx < -n) | (idx >= n)
        if bad.any():
            raise IndexError(f"index {int(idx[bad][0])} out of range for {n} samples")
        idx %= n
        if not self._uniform:
            sig = self._sig[self._index[idx, 0]]
            if (sig != sig[0]).any():  # samples of different shapes: read one by one
                return [self._items(idx[j : j + 1], views=True)[0] for j in range(len(idx))]
        return self._items(idx, views=True)

    def _items(self, idx: np.ndarray, views: bool) -> list[dict[str, torch.Tensor]]:
        arrays = self._gather(idx, views)
        columns = [torch.from_numpy(a).unbind(0) if isinstance(a, np.ndarray) else a for a in arrays.values()]
        keys = list(arrays)
        return [dict(zip(keys, values)) for values in zip(*columns)]

    def _view(self, name: str, c: int) -> torch.Tensor:
        """Cached array ``c`` of ``name`` as a read-only (inference) tensor sharing its memory."""
        self._this_process()
        v = self._views.get((name, c))
        if v is None:
            with torch.inference_mode():
                v = self._views[name, c] = torch.from_numpy(self._mem[name][0][c])
        return v

    @staticmethod
    def _plan(ei: np.ndarray, steps: np.ndarray, stride: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
        """Plan the file reads of ``steps`` (B, k) of episodes ``ei`` (B,): each distinct step read once.

        Returns:
            ``pos`` (B, k) int64: row of each wanted step in the read buffer, and the reads as
            ``(episode, first step, number of steps, first buffer row)``, consecutive steps in one read.
        """
        u, inv = np.unique(ei[:, None] * stride + steps, return_inverse=True)
        cut = np.flatnonzero(np.diff(u) != 1) + 1
        starts = np.concatenate(([0], cut))
        counts = np.diff(np.concatenate((starts, [len(u)])))
        first = u[starts]
        episode, step = np.divmod(first, stride)
        reads = list(zip(episode.tolist(), step.tolist(), counts.tolist(), starts.tolist()))
        return inv.reshape(steps.shape), reads

    def _gather(self, idx: np.ndarray, views: bool) -> dict[str, np.ndarray | list[torch.Tensor]]:
        """Samples ``idx`` (B,) of one signature as batched arrays (B, ...) in sample key order.

        With ``views``, a cached image key comes as B inference tensors instead: views of the cache (whose
        copies of each episode's first frame make every window one slice).
        """
        rows = self._index[idx]
        ei, t = np.ascontiguousarray(rows[:, 0]), np.ascontiguousarray(rows[:, 1])
        last = self._lengths[ei][:, None] - 1
        frames = np.maximum(t[:, None] + self._frame_offsets, 0)  # (B, frame_stack), first frame repeated
        steps = t[:, None] + self._step_offsets  # (B, horizon)
        is_pad = steps > last
        steps = np.minimum(steps, last)  # last action repeated
        wanted = {"frames": frames, "steps": steps}
        plans: dict[str, tuple[np.ndarray, list[tuple[int, ...]]]] = {}  # shared by the keys of one kind
        out: dict[str, np.ndarray] = {}

        def take(name: str, kind: str) -> np.ndarray | list[torch.Tensor]:
            which = wanted[kind]
            if name in self._mem:
                cols, col_of, off = self._mem[name]
                c, rows = int(col_of[ei[0]]), off[ei][:, None] + which
                if not (views and self._is_image(name)):
                    return np.take(cols[c], rows, axis=0)
                whole, fs = self._view(name, c), self.frame_stack  # first frame repeated before each episode
                return [whole[r : r + fs] for r in (off[ei] + t - (fs - 1)).tolist()]
            plan = plans.get(kind)
            if plan is None:
                plan = plans[kind] = self._plan(ei, which, self._stride_key)
            pos, reads = plan
            tail, dtype = self._spec(int(ei[0]), name)
            size = (reads[-1][2] + reads[-1][3], *tail)  # every row of an obs key is read; others may not be
            buf = np.empty(size, dtype) if name.startswith("obs/") else np.zeros(size, dtype)
            for e, a, n, row in reads:
                ds, flip = self._datasets(e)[name]
                if ds is not None:  # rewards / dones absent: zeros
                    self._put(name, buf[row : row + n], self._read(e, name, ds, a, a + n), flip)
            return np.take(buf, pos, axis=0)

        for key in self.obs_keys or []:
            out[f"obs.{key}"] = take(f"obs/{key}", "frames")
        actions = take("actions", "steps")
        if self.action_pad_to is not None:
            out["action_dim_mask"] = np.arange(self.action_pad_to) < self._action_dims[ei][:, None]
        out["actions"] = actions
        out["actions_is_pad"] = is_pad
        out["rewards"] = take("rewards", "steps")
        out["dones"] = take("dones", "steps")
        out["episode_index"] = ei
        out["timestep"] = t
        return out

    def close(self) -> None:
        """Close any open file handles of this process."""
        self._episode_ds, self._views = {}, {}
        for f in self._handles.values():
            f.close()
        self._handles = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"], state["_episode_ds"], state["_views"] = {}, {}, {}
        return state

    def __repr__(self) -> str:
        return (
            f"TrajectoryDataset(files={len(self.paths)}, episodes={len(self.episodes)}, samples={len(self)}, "
            f"obs_keys={self.obs_keys}, horizon={self.horizon}, frame_stack={self.frame_stack}, "
            f"cache={self.cache!r})"
        )
