"""Trajectory datasets in the robomimic / LIBERO HDF5 layout: writer, reader and a map-style Dataset.

File layout (one HDF5 file, many episodes)::

    data/                          attrs: total (int, sum of num_samples), env_args (JSON str), and
                                   optionally problem_info (JSON str with "language_instruction"),
                                   env_name, bddl_file_name (LIBERO)
    data/demo_<i>/                 attrs: num_samples (int) + per-episode attrs (see below)
        obs/<key>                  (T, H, W, 3) uint8 RGB images (row 0 at the top; chunked per frame)
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

Reader API::

    with TrajectoryFile(path) as f:
        f.episodes                   # ["demo_0", "demo_1", ...] sorted by index
        f.episode("demo_0")          # {"obs/agentview_rgb": (T,H,W,3) uint8, "actions": (T,A), ...}
        f.attrs("demo_0"), f.env_meta, f.language_instruction, f.filter_keys

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
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import DataError
from core.io import atomic_path

__all__ = [
    "EpisodeInfo",
    "TrajectoryDataset",
    "TrajectoryFile",
    "TrajectoryWriter",
    "is_image_key",
]

_DEMO_RE = re.compile(r"^demo_(\d+)$")
OnError = Literal["raise", "skip"]


# --------------------------------------------------------------------------------------------- helpers
def _encode_attr(value: Any) -> Any:
    """Map a Python value to something HDF5 stores as an attribute (dicts / lists -> JSON strings)."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, Path):
        return str(value)
    if value is None:
        return "null"
    return value


def _decode_attr(value: Any) -> Any:
    """Inverse of ``_encode_attr`` for attributes read from any file (ours, robomimic or LIBERO)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        s = value.strip()
        if s == "null":
            return None
        if s[:1] in "{[":
            with contextlib.suppress(ValueError):
                return json.loads(s)
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode_attrs(attrs: h5py.AttributeManager) -> dict[str, Any]:
    return {k: _decode_attr(v) for k, v in attrs.items()}


def _demo_index(name: str) -> int:
    m = _DEMO_RE.match(name)
    return int(m.group(1)) if m else -1


def is_image_key(shape: Sequence[int], dtype: np.dtype) -> bool:
    """Whether a per-episode obs dataset of ``shape`` (T, ...) holds images: uint8 (T, H, W, C<=4)."""
    return np.dtype(dtype) == np.uint8 and len(shape) == 4 and shape[-1] in (1, 3, 4)


def _open_h5(path: Path) -> h5py.File:
    """Open ``path`` read-only, turning every failure into a ``DataError`` that names the file."""
    if not path.exists():
        raise DataError(path, "no such file")
    try:
        return h5py.File(path, "r")
    except OSError as e:  # truncated, not HDF5, permissions ...
        reason = str(e).split("(", 1)[-1].rstrip(")") if "(" in str(e) else str(e)
        raise DataError(path, f"cannot open as HDF5 ({reason})") from None


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
class TrajectoryFile:
    """Read one robomimic / LIBERO trajectory file.

    The file is opened on construction (read-only) and checked for the ``data/demo_<i>`` layout.

    Args:
        path: An HDF5 file.

    Raises:
        DataError: Missing, truncated, not HDF5, or without a ``data`` group of ``demo_<i>`` episodes.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = _open_h5(self.path)
        try:
            data = self._file.get("data")
            if not isinstance(data, h5py.Group):
                raise DataError(self.path, "no 'data' group: not a robomimic / LIBERO trajectory file")
            self._data = data
            names = [n for n in data.keys() if _DEMO_RE.match(n)]
            if not names and len(data.keys()) > 0:
                raise DataError(
                    self.path, f"'data' holds no demo_<i> episodes (found {sorted(data.keys())[:5]})"
                )
            self.episodes: list[str] = sorted(names, key=_demo_index)
            self.file_attrs: dict[str, Any] = _decode_attrs(data.attrs)
        except BaseException:
            self._file.close()
            raise

    # -- file-level metadata
    @property
    def env_meta(self) -> dict[str, Any]:
        """The decoded robomimic ``env_args`` dict (``{}`` if absent), with LIBERO's ``env_name`` merged in."""
        meta = self.file_attrs.get("env_args")
        meta = dict(meta) if isinstance(meta, dict) else {}
        if "env_name" in self.file_attrs and not meta.get("env_name"):
            meta["env_name"] = self.file_attrs["env_name"]
        return meta

    @property
    def language_instruction(self) -> str | None:
        """LIBERO's ``problem_info["language_instruction"]``, or a ``language_instruction`` attribute."""
        info = self.file_attrs.get("problem_info")
        if isinstance(info, dict) and info.get("language_instruction"):
            return str(info["language_instruction"])
        li = self.file_attrs.get("language_instruction")
        return str(li) if li else None

    @property
    def filter_keys(self) -> dict[str, list[str]]:
        """robomimic filter keys: ``{"train": ["demo_0", ...], "valid": [...]}`` (``{}`` if none)."""
        mask = self._file.get("mask")
        if not isinstance(mask, h5py.Group):
            return {}
        return {k: [_decode_attr(x) for x in np.asarray(mask[k]).ravel()] for k in mask.keys()}

    # -- episodes
    def _group(self, name: str) -> h5py.Group:
        grp = self._data.get(name)
        if not isinstance(grp, h5py.Group):
            raise DataError(self.path, f"no episode {name!r} (has {len(self.episodes)} episodes)")
        return grp

    def attrs(self, name: str) -> dict[str, Any]:
        """Decoded attributes of episode ``name`` (JSON strings come back as dicts / lists)."""
        return _decode_attrs(self._group(name).attrs)

    def keys(self, name: str) -> list[str]:
        """Every dataset path inside episode ``name``, e.g. ``["actions", "obs/agentview_rgb", ...]``."""
        out: list[str] = []
        self._group(name).visititems(lambda k, v: out.append(k) if isinstance(v, h5py.Dataset) else None)
        return sorted(out)

    def obs_keys(self, name: str) -> list[str]:
        """Observation keys of episode ``name`` (without the ``obs/`` prefix)."""
        obs = self._group(name).get("obs")
        return sorted(obs.keys()) if isinstance(obs, h5py.Group) else []

    def num_samples(self, name: str) -> int:
        """Number of steps ``T`` (the ``num_samples`` attr, else the length of ``actions``)."""
        grp = self._group(name)
        if "num_samples" in grp.attrs:
            return int(grp.attrs["num_samples"])
        if "actions" in grp:
            return int(grp["actions"].shape[0])
        raise DataError(self.path, f"{name}: no 'actions' and no num_samples attribute")

    def dataset(self, name: str, key: str) -> h5py.Dataset:
        """The h5py dataset ``data/<name>/<key>`` (lazy; slice it to read)."""
        ds = self._group(name).get(key)
        if not isinstance(ds, h5py.Dataset):
            raise DataError(self.path, f"{name}: no dataset {key!r}")
        return ds

    @property
    def bottom_up_images(self) -> bool:
        """Whether the file stores images bottom-up (LIBERO's ``macros_image_convention == "opengl"``)."""
        conv = self._data.attrs.get("macros_image_convention")
        return _decode_attr(conv) == "opengl" if conv is not None else False

    def read(self, name: str, key: str, sel: Any = ()) -> np.ndarray:
        """Read ``data/<name>/<key>[sel]``; a corrupt chunk raises ``DataError`` naming file, episode and key.

        Images come back upright (row 0 at the top) also from files that store them bottom-up (LIBERO's
        ``macros_image_convention = "opengl"``); ``TrajectoryFile.raw`` reads exactly as stored.
        """
        ds = self.dataset(name, key)
        arr = self.raw(name, key, sel, ds)
        if self.bottom_up_images and key.startswith(("obs/", "next_obs/")) and is_image_key(ds.shape, ds.dtype):
            arr = np.ascontiguousarray(arr[..., ::-1, :, :])  # (..., H, W, 3): flip rows
        return arr

    def raw(self, name: str, key: str, sel: Any = (), ds: h5py.Dataset | None = None) -> np.ndarray:
        """``data/<name>/<key>[sel]`` exactly as stored."""
        ds = ds if ds is not None else self.dataset(name, key)
        try:
            return ds[sel]
        except (OSError, ValueError, RuntimeError) as e:
            raise DataError(self.path, f"{name}/{key}: cannot read ({e})") from None

    def episode(self, name: str, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Read a whole episode into memory.

        Args:
            name: Episode group, e.g. ``"demo_0"``.
            keys: Dataset paths relative to the episode (``"actions"``, ``"obs/agentview_rgb"``);
                all datasets when None.

        Returns:
            ``{path: array}`` as stored, except that images are upright (see ``read``).
        """
        keys = self.keys(name) if keys is None else list(keys)
        return {k: self.read(name, k) for k in keys}

    def close(self) -> None:
        """Close the HDF5 handle."""
        self._file.close()

    def __enter__(self) -> TrajectoryFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.episodes)

    def __repr__(self) -> str:
        return f"TrajectoryFile({str(self.path)!r}, episodes={len(self.episodes)})"


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
    """Episode attr ``embodiment``; else env_args' ``embodiment`` or robosuite ``env_kwargs.robots[0]``."""
    if attrs.get("embodiment"):
        return str(attrs["embodiment"])
    if env_meta.get("embodiment"):
        return str(env_meta["embodiment"])
    robots = (env_meta.get("env_kwargs") or {}).get("robots")
    if isinstance(robots, str):
        return robots
    if isinstance(robots, list) and robots:
        return "+".join(map(str, robots))
    return "unknown"


class TrajectoryDataset(Dataset):
    """Map-style dataset of fixed-length windows over episodes of one or more trajectory files.

    Keys, shapes and dtypes of a sample are documented in this module's docstring. Files are indexed
    once at construction (then closed); each DataLoader worker reopens them lazily on first access
    (h5py handles are not fork-safe).

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
            reading a sample later (a corrupt chunk) always raise ``DataError`` naming file and episode.
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
    ):
        if horizon < 1 or frame_stack < 1 or stride < 1:
            raise ValueError(
                f"horizon, frame_stack and stride must be >= 1, got {horizon}, {frame_stack}, {stride}"
            )
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("TrajectoryDataset needs at least one file")
        self.obs_keys: list[str] | None = list(obs_keys) if obs_keys is not None else None
        self.horizon, self.frame_stack, self.stride = horizon, frame_stack, stride
        self.filter_key, self.pad_end, self.action_pad_to = filter_key, pad_end, action_pad_to
        self.on_error = on_error
        self.skipped = {"files": 0, "episodes": 0}
        self.errors: list[DataError] = []
        self.episodes: list[EpisodeInfo] = []
        self.image_keys: set[str] = set()
        self._file_index: list[int] = []  # episode -> index into self.paths
        anchors: list[np.ndarray] = []
        keep = set(embodiments) if embodiments is not None else None
        for fi, path in enumerate(self.paths):
            try:
                rows = self._index_file(path)
            except DataError as e:
                self._fail(e, "files")
                continue
            for info, err in rows:
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
                anchors.append(np.stack([np.full(len(ts), ei), ts], axis=1))
        self._index = np.concatenate(anchors).astype(np.int64) if anchors else np.zeros((0, 2), np.int64)
        if self.obs_keys is None:
            self.obs_keys = []
        self._check_action_dims()
        self._handles: dict[int, TrajectoryFile] = {}
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

    def _index_file(self, path: Path) -> list[tuple[EpisodeInfo | None, DataError | None]]:
        with TrajectoryFile(path) as f:
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
            rows: list[tuple[EpisodeInfo | None, DataError | None]] = []
            for name in names:
                try:
                    rows.append((self._index_episode(f, name, env_meta, li_file), None))
                except DataError as e:
                    rows.append((None, e))
            return rows

    def _index_episode(
        self, f: TrajectoryFile, name: str, env_meta: dict, li_file: str | None
    ) -> EpisodeInfo:
        grp = f._group(name)
        if not isinstance(grp.get("actions"), h5py.Dataset):
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
        for key in self.obs_keys:
            ds = grp.get(f"obs/{key}")
            if not isinstance(ds, h5py.Dataset):
                raise DataError(f.path, f"{name}: no observation {key!r} (has {obs_keys})")
            if ds.shape[0] != T:
                raise DataError(f.path, f"{name}: obs/{key} has {ds.shape[0]} steps, actions has {T}")
            if is_image_key(ds.shape, ds.dtype):
                self.image_keys.add(key)
        for key in ("rewards", "dones"):
            ds = grp.get(key)
            if isinstance(ds, h5py.Dataset) and ds.shape[0] != T:
                raise DataError(f.path, f"{name}: {key} has {ds.shape[0]} steps, actions has {T}")
        attrs = f.attrs(name)
        if "num_samples" in attrs and int(attrs["num_samples"]) != T:
            raise DataError(f.path, f"{name}: num_samples={attrs['num_samples']} but actions has {T} steps")
        li = attrs.get("language_instruction") or li_file
        success = attrs.get("success")
        return EpisodeInfo(
            path=str(f.path),
            name=name,
            length=T,
            embodiment=_embodiment(attrs, env_meta),
            action_dim=int(act.shape[1]) if act.ndim == 2 else 1,
            language_instruction=str(li) if li else None,
            success=None if success is None else bool(success),
        )

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

    def episode_info(self, index: int) -> EpisodeInfo:
        """Metadata of the episode that sample ``index`` comes from."""
        return self.episodes[int(self._index[index, 0])]

    # -- access
    def _file(self, ei: int) -> TrajectoryFile:
        if self._pid != os.getpid():  # forked into a worker: never reuse the parent's handles
            self._handles, self._pid = {}, os.getpid()
        fi = self._file_index[ei]
        f = self._handles.get(fi)
        if f is None:
            f = self._handles[fi] = TrajectoryFile(self.paths[fi])
        return f

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        ei, t = (int(x) for x in self._index[index])
        info = self.episodes[ei]
        f = self._file(ei)
        T = info.length
        # Observation frames t-frame_stack+1 .. t, clamped at 0 (first frame repeated).
        o0 = max(0, t - self.frame_stack + 1)
        obs_idx = np.clip(np.arange(t - self.frame_stack + 1, t + 1), 0, None) - o0
        a1 = min(T, t + self.horizon)
        act_idx = np.minimum(np.arange(t, t + self.horizon), T - 1) - t
        out: dict[str, Any] = {}
        for key in self.obs_keys or []:
            arr = f.read(info.name, f"obs/{key}", np.s_[o0 : t + 1])[obs_idx]
            if key in self.image_keys:
                out[f"obs.{key}"] = torch.from_numpy(np.ascontiguousarray(arr.transpose(0, 3, 1, 2)))
            else:
                out[f"obs.{key}"] = torch.from_numpy(np.asarray(arr, dtype=np.float32))
        actions = f.read(info.name, "actions", np.s_[t:a1])
        actions = np.asarray(actions, dtype=np.float32).reshape(a1 - t, -1)[act_idx]
        if self.action_pad_to is not None:
            padded = np.zeros((self.horizon, self.action_pad_to), np.float32)
            padded[:, : info.action_dim] = actions
            mask = np.zeros(self.action_pad_to, bool)
            mask[: info.action_dim] = True
            out["action_dim_mask"] = torch.from_numpy(mask)
            actions = padded
        out["actions"] = torch.from_numpy(np.ascontiguousarray(actions))
        out["actions_is_pad"] = torch.from_numpy(np.arange(t, t + self.horizon) >= T)
        grp = f._group(info.name)
        for key, dtype in (("rewards", np.float32), ("dones", bool)):
            if key in grp:
                vals = np.asarray(f.read(info.name, key, np.s_[t:a1])).reshape(-1)[act_idx]
            else:
                vals = np.zeros(self.horizon)
            out[key] = torch.from_numpy(vals.astype(dtype))
        out["episode_index"] = torch.tensor(ei, dtype=torch.int64)
        out["timestep"] = torch.tensor(t, dtype=torch.int64)
        return out

    def close(self) -> None:
        """Close any open file handles of this process."""
        for f in self._handles.values():
            f.close()
        self._handles = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        return state

    def __repr__(self) -> str:
        return (
            f"TrajectoryDataset(files={len(self.paths)}, episodes={len(self.episodes)}, samples={len(self)}, "
            f"obs_keys={self.obs_keys}, horizon={self.horizon}, frame_stack={self.frame_stack})"
        )
