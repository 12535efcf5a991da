"""The HDF5 file layer of trajectory files: ``TrajectoryFile`` (the reader) and the helpers it shares.

Layout, attributes and image conventions are documented in ``core.data.trajectories``, which writes these files
(``TrajectoryWriter``), re-exports the names here and builds ``TrajectoryDataset`` on them; ``core.data.lerobot``
reads them to export LeRobot datasets. This module imports neither of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from core.data.image_convention import LIBERO_CONVENTION, check, flips
from core.errors import ConfigError, DataError

__all__ = ["TrajectoryFile", "demo_index", "is_image_key", "is_libero", "trajectory_files"]

_DEMO_RE = re.compile(r"^demo_(\d+)$")


# --------------------------------------------------------------------------------------------- helpers
def _decode_attr(value: Any) -> Any:
    """Decode an attribute read from any file (ours, robomimic or LIBERO).

    The inverse of ``core.data.trajectories._encode_attr``: JSON objects / lists come back decoded.
    """
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


def demo_index(name: str) -> int:
    """The ``<i>`` of an episode name ``demo_<i>``; -1 for any other name."""
    m = _DEMO_RE.match(name)
    return int(m.group(1)) if m else -1


def is_image_key(shape: Sequence[int], dtype: np.dtype) -> bool:
    """Whether a per-episode obs dataset of ``shape`` (T, ...) holds images: uint8 (T, H, W, C<=4)."""
    return np.dtype(dtype) == np.uint8 and len(shape) == 4 and shape[-1] in (1, 3, 4)


def is_libero(file_attrs: Mapping[str, Any], env_meta: Mapping[str, Any]) -> bool:
    """Whether a file's decoded ``data`` attributes and ``env_args`` are LIBERO's.

    LIBERO's ``create_dataset.py`` writes ``bddl_file_name`` / ``bddl_file_content``, ``problem_info`` with a
    ``libero_*`` problem name and ``env_args`` with a ``bddl_file`` and a ``Libero_*`` env; rollouts of this
    workspace's LIBERO envs (``sim.recorder``) have the env type ``"libero"`` (the env's family) and env names
    ``embodied/Libero-*``.
    """
    if file_attrs.get("bddl_file_name") or file_attrs.get("bddl_file_content") or env_meta.get("bddl_file"):
        return True
    info = file_attrs.get("problem_info")
    if isinstance(info, Mapping) and str(info.get("problem_name") or "").lower().startswith("libero"):
        return True
    if str(env_meta.get("env_type") or "").lower() == "libero":
        return True
    name = str(env_meta.get("env_name") or file_attrs.get("env_name") or "").lower()
    return name.startswith(("libero_", "embodied/libero-"))


def trajectory_files(path: str | os.PathLike) -> list[Path]:
    """``path`` itself if it is a file, else every ``*.hdf5`` file under the folder ``path``, at any depth.

    A recording command's output keeps its files in sub-folders (``embodied libero record``:
    ``<out>/<suite>/<task>_demo.hdf5``; ``embodied drive eval``: ``<out>/<scenario>/<env>.hdf5``). Files and
    folders whose name starts with ``.`` (a command's hidden staging area) are skipped. Sorted by their path
    relative to ``path``, so that the order does not depend on the file system.

    Raises:
        DataError: ``path`` does not exist, or is a folder without ``*.hdf5`` files.
    """
    path = Path(path)
    if path.is_dir():
        found = [q for q in path.rglob("*.hdf5")
                 if q.is_file() and not any(part.startswith(".") for part in q.relative_to(path).parts)]
        if not found:
            raise DataError(path, "a folder without .hdf5 trajectory files (its sub-folders searched too)")
        return sorted(found, key=lambda q: q.relative_to(path).parts)
    if not path.is_file():
        raise DataError(path, "no such file")
    return [path]


def _open_h5(path: Path, chunk_cache_bytes: int | None = None) -> h5py.File:
    """Open ``path`` read-only, turning every failure into a ``DataError`` that names the file.

    ``chunk_cache_bytes`` sets HDF5's chunk cache per open dataset (h5py's default, 1 MiB, when None).
    """
    if not path.exists():
        raise DataError(path, "no such file")
    try:
        if chunk_cache_bytes is not None:
            return h5py.File(path, "r", rdcc_nbytes=int(chunk_cache_bytes))
        return h5py.File(path, "r")
    except OSError as e:  # truncated, not HDF5, permissions ...
        reason = str(e).split("(", 1)[-1].rstrip(")") if "(" in str(e) else str(e)
        raise DataError(path, f"cannot open as HDF5 ({reason})") from None


# ---------------------------------------------------------------------------------------------- reader
class TrajectoryFile:
    """Read one robomimic / LIBERO trajectory file.

    The file is opened on construction (read-only) and checked for the ``data/demo_<i>`` layout.

    Args:
        path: An HDF5 file.
        chunk_cache_bytes: HDF5 chunk cache (decoded chunks) per open dataset; h5py's default (1 MiB)
            when None.

    Raises:
        DataError: Missing, truncated, not HDF5, or without a ``data`` group of ``demo_<i>`` episodes.
    """

    def __init__(self, path: str | os.PathLike, chunk_cache_bytes: int | None = None):
        self.path = Path(path)
        self._file = _open_h5(self.path, chunk_cache_bytes)
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
            self.episodes: list[str] = sorted(names, key=demo_index)
            self.file_attrs: dict[str, Any] = _decode_attrs(data.attrs)
            self._conventions = self._image_conventions()
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
        """The robomimic filter keys: ``{"train": ["demo_0", ...], "valid": [...]}`` (``{}`` if none)."""
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

    @property
    def is_libero(self) -> bool:
        """Whether this is a LIBERO file (``is_libero``)."""
        return is_libero(self.file_attrs, self.env_meta)

    @property
    def image_convention(self) -> str | None:
        """The convention ``read`` returns image frames in (``core.data.image_convention``).

        The file's own ``image_convention``, else ``"rot180"`` for a LIBERO file, else None (see the module
        docstring).
        """
        return self._conventions[0]

    @property
    def image_flips(self) -> tuple[bool, bool]:
        """(reverse rows, reverse columns) that ``read`` applies to stored image frames."""
        return self._conventions[1]

    def _image_conventions(self) -> tuple[str | None, tuple[bool, bool]]:
        """(the convention frames are returned in, the flips from the stored frames to it)."""
        env_meta = self.env_meta
        own = self.file_attrs.get("image_convention") or env_meta.get("image_convention")
        if own is not None:
            try:
                own = check(own)
            except ConfigError as e:
                raise DataError(self.path, str(e)) from None
        libero = is_libero(self.file_attrs, env_meta)
        wanted = own or (LIBERO_CONVENTION if libero else None)
        if self.bottom_up_images:  # the raw OpenGL-order render
            return wanted, flips("raw", wanted or "upright")
        if own is None and libero:  # a LiberoEnv rollout recorded before conventions were stated: flipud
            return wanted, flips("flipud", wanted)
        return wanted, (False, False)

    def read(self, name: str, key: str, sel: Any = ()) -> np.ndarray:
        """Read ``data/<name>/<key>[sel]``; a corrupt chunk raises ``DataError`` naming file, episode and key.

        Images come back in ``image_convention`` (non-LIBERO files that store them bottom-up, with
        ``macros_image_convention = "opengl"``: upright, row 0 at the top); ``TrajectoryFile.raw`` reads exactly
        as stored.
        """
        ds = self.dataset(name, key)
        arr = self.raw(name, key, sel, ds)
        rows, cols = self.image_flips
        if (rows or cols) and key.startswith(("obs/", "next_obs/")) and is_image_key(ds.shape, ds.dtype):
            arr = np.ascontiguousarray(arr[..., :: -1 if rows else 1, :: -1 if cols else 1, :])  # (..., H, W, C)
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
            ``{path: array}`` as stored, except that images are in ``image_convention`` (see ``read``).
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
