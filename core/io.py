"""Atomic file output: everything the workspace writes goes through a temp file and a rename.

A reader (or a crash) never sees a half-written file: data is written to a temporary file in the
same directory, flushed and fsynced, then moved over the destination with ``os.replace`` (atomic on
POSIX within one filesystem).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` if the block succeeds.

    Use this for libraries that want a file name (h5py, safetensors, imageio, open3d). The temp
    file keeps ``path``'s suffix (or ``suffix``) so format sniffing by extension still works.
    On an exception the temp file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sfx = suffix if suffix is not None else path.suffix
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{sfx}", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():
            with open(tmp_path, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, tmp: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success it replaces ``path`` (a folder) whole.

    The old folder, if any, is moved aside and removed only after the new one is in place, so a reader sees
    the old or the new folder, never a mix. On an exception the temporary folder is removed and ``path`` is
    untouched. ``tmp`` names the temporary folder (default: a fresh hidden ``.<name>.*.tmp``).
    """
    import shutil
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if tmp is None:
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it 0700; the folder it becomes gets the usual mode
    else:
        staging = Path(tmp)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    try:
        yield staging
        fsync_dir(staging)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(staging, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries to disk (best effort: some filesystems refuse to fsync a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """``open`` for writing that publishes the file only when the block finishes without error."""
    if not any(m in mode for m in "wx"):
        raise ValueError(f"atomic_open is for writing, got mode {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f
        f.flush()


def write_text(path: str | os.PathLike, text: str) -> None:
    """Atomically write a text file (UTF-8)."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented, key-sorted JSON."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=to_jsonable) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a missing or corrupt file raises ``ValueError`` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def to_jsonable(obj: Any, *, nan_to_none: bool = False, default: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` as plain JSON types: what ``json.loads(json.dumps(obj))`` gives, for more than ``json`` takes.

    Mappings become dicts (keys as ``json`` spells them: ``1`` -> ``"1"``, ``True`` -> ``"true"``, ``None`` ->
    ``"null"``; other keys ``str``), lists and tuples lists, dataclass instances dicts of their fields, paths
    strings, numpy / torch scalars and arrays (anything with ``tolist``) numbers and lists; ``str`` / ``int`` /
    ``float`` subclasses (enums, ``np.float64``) plain ``str`` / ``int`` / ``float``. Dict order is kept.

    Args:
        obj: The value to convert (not modified).
        nan_to_none: Turn float NaN into ``None`` (strict JSON's ``null``); else NaN stays (``json`` writes ``NaN``).
        default: Called on any other value, its result converted in turn (e.g. ``str``); None: ``TypeError``.

    Raises:
        TypeError: A value of another type and no ``default``, naming the type.

    ``write_json`` uses it as ``json.dumps``'s ``default``, so everything the workspace writes as JSON takes the
    same types.
    """

    def walk(o: Any) -> Any:
        if o is None or isinstance(o, bool):
            return o
        if isinstance(o, str):
            return o if type(o) is str else str.__str__(o)
        if isinstance(o, int):
            return o if type(o) is int else int(o)
        if isinstance(o, float):
            o = float(o)
            return None if nan_to_none and o != o else o
        if isinstance(o, Mapping):
            return {_json_key(k): walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [walk(v) for v in o]
        if isinstance(o, type):  # a class (even a dataclass, or np.ndarray with its unbound tolist) is no value
            pass
        elif dataclasses.is_dataclass(o):
            return {f.name: walk(getattr(o, f.name)) for f in dataclasses.fields(o)}
        elif isinstance(o, os.PathLike):
            return os.fspath(o)
        elif hasattr(o, "tolist"):  # numpy / torch scalars and arrays
            return walk(o.tolist())
        if default is not None:
            return walk(default(o))
        raise TypeError(f"not JSON serialisable: {type(o).__name__}")

    return walk(obj)


def _json_key(k: Any) -> str:
    """A dict key as ``json.dumps`` writes it (keys ``json`` refuses: ``str(k)``)."""
    if isinstance(k, str):
        return k if type(k) is str else str.__str__(k)
    if k is None or isinstance(k, (bool, int, float)):
        return json.dumps(k)
    if isinstance(k, os.PathLike):
        return os.fspath(k)
    if hasattr(k, "tolist") and not isinstance(k, type) and getattr(k, "ndim", 0) == 0:
        return _json_key(k.tolist())
    return str(k)


def save_npy(path: str | os.PathLike, arr: Any) -> Path:
    """``np.save`` atomically (temp file + rename); returns the path."""
    import numpy as np

    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, arr)
    return path
