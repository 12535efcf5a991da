"""Atomic file output: everything the workspace writes goes through a temp file and a rename.

A reader (or a crash) never sees a half-written file: data is written to a temporary file in the
same directory, flushed and fsynced, then moved over the destination with ``os.replace`` (atomic on
POSIX within one filesystem).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
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
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a missing or corrupt file raises ``ValueError`` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):  # numpy / torch scalars and arrays
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def save_npy(path: str | os.PathLike, arr: Any) -> Path:
    """``np.save`` atomically (temp file + rename); returns the path."""
    import numpy as np

    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, arr)
    return path
