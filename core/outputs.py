"""One output-folder policy for every command that writes (rollouts, datasets, driving eval, infer, train, demo).

``claim_output(path, ...)`` is the only way a command takes its output folder:

- an existing FILE at ``path`` is refused in one line (``OutputError``, exit 2);
- a lock (``<parent>/.<name>.lock``, ``flock``: released by the OS when the process dies) lets one process
  write a folder at a time: a second one is refused in one line;
- an existing non-empty folder is another run's and is refused, unless
  ``overwrite`` (the new results replace it atomically when the command succeeds; until then the old folder
  is untouched) or ``resume`` with the same run signature (training continues its own folder);
- staged commands (everything but training) write into a hidden sibling ``.<name>.partial-<pid>`` that is
  renamed onto ``path`` only when the command succeeds, so a failed or interrupted run leaves nothing behind
  (and never a mix of two runs);
- in-place commands (training, whose checkpoints must survive a kill) keep ``.embodied-run.json`` in the
  folder: ``{"status": "running" | "finished" | "failed", ...}`` — a failed run is clearly marked
  incomplete, and the next start with the same config resumes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.errors import EmbodiedError
from core.io import atomic_dir, read_json, write_json

MARKER = ".embodied-run.json"


class OutputError(EmbodiedError):
    """The output path cannot be used as asked (a file, another run's folder, another writer)."""


@contextlib.contextmanager
def _lock(path: Path, wait: float = 0.0) -> Iterator[None]:
    lock = path.parent / f".{path.name}.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise OutputError(f"{path}: another process is writing this folder right now") from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


@contextlib.contextmanager
def lock_folder(path: str | Path, wait: float = 0.0) -> Iterator[Path]:
    """Hold ``path``'s writer lock without claiming it.

    ``embodied eval`` adds its report to a training folder: it must not run while that folder is being trained,
    and two evaluations must not interleave.

    ``wait``: seconds to wait for another holder to finish (a shared input that the first of several runs
    builds, e.g. a rendered dataset or a pretrained base) before refusing; 0 refuses at once.
    """
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path}: exists and is a file; expected a run folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path, wait):
        yield path


def run_marker(path: str | Path) -> dict[str, Any] | None:
    """The folder's ``.embodied-run.json`` (None when it has none or it is unreadable)."""
    try:
        marker = read_json(Path(path) / MARKER)
    except (FileNotFoundError, ValueError, NotADirectoryError):
        return None
    return marker if isinstance(marker, dict) else None


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(p for p in path.iterdir() if p.name != MARKER)


@contextlib.contextmanager
def claim_output(path: str | Path, *, command: str, overwrite: bool = False, staged: bool = True,
                 signature: Any = None, resume: bool = True) -> Iterator[Path]:
    """Claim ``path`` for one run of ``command``; yields the folder to write into (see the module docstring).

    Args:
        path: The output folder the user named.
        command: What is writing (recorded in the marker and named in errors), e.g. ``"sim rollout"``.
        overwrite: Replace an existing folder (atomically, on success).
        staged: Write into a hidden sibling and rename on success (False: in place, for training).
        signature: For in-place runs: what makes a folder "the same run" (e.g. the resolved config);
            an existing folder with the same signature is resumed when ``resume`` is True.
        resume: Whether an in-place run may continue a folder with the same signature.

    Raises:
        OutputError: ``path`` is a file, belongs to another run, or another process holds it.
    """
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path}: exists and is a file; --out needs a folder path")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        occupied = path.is_dir() and not _is_empty_dir(path)
        marker = run_marker(path) if occupied else None
        same_run = marker is not None and signature is not None and marker.get("signature") == _plain(signature)
        if occupied and not overwrite and not (not staged and resume and same_run):
            what = f"another {marker.get('command')} run" if marker else "files of another run"
            hint = " or the same config to resume it" if not staged else ""
            raise OutputError(f"{path}: exists and holds {what}; pass --overwrite to replace it{hint}")
        if staged:
            yield from _staged(path, command)
        else:
            yield from _in_place(path, command, signature, fresh=occupied and overwrite and not same_run)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _staged(path: Path, command: str) -> Iterator[Path]:
    for stale in path.parent.glob(f".{path.name}.partial-*"):  # left by a killed run (we hold the lock)
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    with atomic_dir(path, tmp=path.parent / f".{path.name}.partial-{os.getpid()}") as tmp:
        yield tmp
        write_json(tmp / MARKER, {"command": command, "status": "finished", "finished": time.time()})


def _in_place(path: Path, command: str, signature: Any, fresh: bool) -> Iterator[Path]:
    if fresh:  # --overwrite of another run's training folder: start clean (its files are another run's)
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    started = time.time()
    base = {"command": command, "signature": _plain(signature), "started": started}
    write_json(path / MARKER, {**base, "status": "running"})
    try:
        yield path
    except BaseException as e:
        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
        write_json(path / MARKER, {**base, "status": "failed", "error": reason.splitlines()[0] if reason else ""})
        raise
    write_json(path / MARKER, {**base, "status": "finished", "finished": time.time()})


def _plain(obj: Any) -> Any:
    """JSON-comparable form of a signature (what ``write_json`` / ``read_json`` round-trip to)."""
    import json

    from core.io import _json_default

    return json.loads(json.dumps(obj, default=_json_default, sort_keys=True))


def output_file(path: str | Path, suffix: str, overwrite: bool = False) -> Path:
    """The single-file counterpart of ``claim_output`` (``embodied infer video|i2v --out FILE.mp4``).

    ``path`` must end in ``suffix`` and must not exist unless ``overwrite``; the command then writes it
    atomically (e.g. ``core.data.video.write_mp4``), so a failure leaves no partial file.

    Raises:
        ConfigError: One line naming ``--out`` and what is wrong.
    """
    from core.errors import ConfigError

    path = Path(path)
    if path.suffix.lower() != suffix.lower():
        raise ConfigError(f"--out: expected a {suffix} file, got {path}")
    if path.is_dir():
        raise ConfigError(f"--out: {path} is a folder, expected a {suffix} file")
    if path.exists() and not overwrite:
        raise ConfigError(f"--out: {path} exists; pass --overwrite to replace it")
    return path
