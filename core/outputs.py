"""One output-folder policy for every command that writes (rollouts, datasets, driving eval, infer, train, demo).

``claim_output(path, ...)`` is the only way a command takes its output folder:

- an existing FILE at ``path`` is refused in one line (``OutputError``, exit 2);
- a lock (``<parent>/.<name>.lock``, ``flock``: released by the OS when the process dies) lets one process
  write a folder at a time: a second one is refused in one line;
- an existing folder with anything in it that no run of this workspace wrote is refused, with or without
  ``overwrite``: a folder without the marker ``.embodied-run.json`` (a user's folder), or a staged run's folder
  holding files beyond the list its marker records (something the user put there). ``overwrite`` never
  deletes what a run did not write. Only file-browser clutter (``.DS_Store``, ``Thumbs.db``, ``desktop.ini``)
  is not counted; an empty folder is free;
- a folder a run wrote (its marker says so: staged runs record the files they wrote, training folders are
  marked "running" / "failed" / "finished") is refused unless ``overwrite`` (the new results replace it
  atomically when the command succeeds; until then the old folder is untouched) or ``resume`` with the same
  run signature (training continues its own folder);
- staged commands (everything but training) write into a hidden sibling ``.<name>.partial-<pid>`` that is
  renamed onto ``path`` only when the command succeeds, so a failed or interrupted run leaves nothing behind
  (and never a mix of two runs); their marker ``{"command", "status": "finished", "files": [...]}`` lists
  every file they wrote (paths relative to the folder);
- in-place commands (training, whose checkpoints must survive a kill) keep ``.embodied-run.json`` in the
  folder: ``{"status": "running" | "finished" | "failed", ...}`` — a failed run is clearly marked
  incomplete, and the next start with the same config resumes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.errors import EmbodiedError
from core.io import atomic_dir, read_json, to_jsonable, write_json

MARKER = ".embodied-run.json"


class OutputError(EmbodiedError):
    """The output path cannot be used as asked (a file, a user's folder, another run's folder, another writer)."""


@contextlib.contextmanager
def _lock(path: Path, wait: float = 0.0) -> Iterator[None]:
    lock = path.parent / f".{path.name}.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    deadline = time.monotonic() + wait
    held = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise OutputError(f"{path}: another process is writing this folder right now") from None
                time.sleep(0.5)
                continue
            try:
                current = os.stat(lock).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                held = True
                break
            # The holder we waited for unlinked this lock file on release, and a newer caller may hold a new one at
            # the same path: lock that one instead, or two callers would both hold "the" lock.
            new = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
            os.close(fd)
            fd = new
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        if held:  # only the holder removes the file (a waiter that gives up must not unlink the holder's lock)
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


#: Files a file browser drops into any folder it shows: neither a run's nor the user's work.
CLUTTER = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(p for p in path.iterdir() if p.name != MARKER and p.name not in CLUTTER)


def written_files(folder: str | Path) -> list[str]:
    """Every file under ``folder`` (posix paths relative to it, sorted), the marker and clutter excepted.

    Symlinks count as files and are not followed (a symlinked folder is one entry).
    """
    return sorted(_iter_files(Path(folder)))


def _iter_files(folder: Path) -> Iterator[str]:
    for root, dirs, files in os.walk(folder, followlinks=False):
        here = Path(root)
        dirs.sort()
        for name in [d for d in dirs if (here / d).is_symlink()] + sorted(files):
            rel = (here / name).relative_to(folder).as_posix()
            if name not in CLUTTER and rel != MARKER:
                yield rel


def _examples(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (" and more" if len(names) > n else "")


def _refuse_foreign(path: Path, marker: dict[str, Any] | None) -> None:
    """Refuse ``path`` (with or without --overwrite) when it holds anything no run of this workspace wrote."""
    if marker is None:  # a user's folder: name a few of its entries (it may be large: do not walk it all)
        some = sorted(itertools.islice(_iter_files(path), 4)) or sorted(f"{p.name}/" for p in path.iterdir())
        raise OutputError(f"{path}: exists and holds files no embodied run wrote ({_examples(some)}); "
                          "choose another output folder or empty this one (--overwrite replaces only a folder an "
                          "embodied run wrote)")
    listed = marker.get("files")
    if isinstance(listed, list):  # a staged run's record of what it wrote (older markers have none)
        extra = sorted(set(written_files(path)) - set(map(str, listed)))
        if extra:
            raise OutputError(f"{path}: holds files the {marker.get('command', 'embodied')} run there did not "
                              f"write ({_examples(extra)}); move them out or choose another output folder "
                              "(--overwrite never deletes them)")


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
        OutputError: ``path`` is a file, holds anything no run wrote, belongs to another run (without
            ``overwrite``), or another process holds it.
    """
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path}: exists and is a file; --out needs a folder path")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        occupied = path.is_dir() and not _is_empty_dir(path)
        marker = run_marker(path) if occupied else None
        if occupied:
            _refuse_foreign(path, marker)
        same_run = marker is not None and signature is not None and marker.get("signature") == to_jsonable(signature)
        if occupied and not overwrite and not (not staged and resume and same_run):
            hint = " or the same config to resume it" if not staged else ""
            what = marker.get("command", "embodied")
            raise OutputError(f"{path}: exists and holds another {what} run; pass --overwrite to replace it{hint}")
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
        write_json(tmp / MARKER, {"command": command, "status": "finished", "finished": time.time(),
                                  "files": written_files(tmp)})


def _in_place(path: Path, command: str, signature: Any, fresh: bool) -> Iterator[Path]:
    if fresh:  # --overwrite of another run's training folder: start clean (its files are another run's)
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    started = time.time()
    base = {"command": command, "signature": to_jsonable(signature), "started": started}
    write_json(path / MARKER, {**base, "status": "running"})
    try:
        yield path
    except BaseException as e:
        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
        write_json(path / MARKER, {**base, "status": "failed", "error": reason.splitlines()[0] if reason else ""})
        raise
    write_json(path / MARKER, {**base, "status": "finished", "finished": time.time()})


def output_file(path: str | Path, suffix: str, overwrite: bool = False) -> Path:
    """The single-file counterpart of ``claim_output`` (``embodied infer video|i2v --out FILE.mp4``).

    ``path`` must end in ``suffix`` and must not exist unless ``overwrite``; the command then writes it
    atomically (e.g. ``core.data.video.write_mp4``), so a failure leaves no partial file.

    Raises:
        ConfigError: One line naming ``--out`` and what is wrong.
    """
    from core.errors import ConfigError

    typed, path = str(path), Path(path)
    if path.is_dir() or typed.endswith(("/", os.sep)):
        raise ConfigError(f"--out: {typed} is a folder; this command writes one {suffix} file, "
                          f"e.g. --out {path / ('video' + suffix)}")
    if path.suffix.lower() != suffix.lower():
        raise ConfigError(f"--out: this command writes one {suffix} file; got {typed}, "
                          f"e.g. --out {path.with_suffix(suffix)}")
    if path.exists() and not overwrite:
        raise ConfigError(f"--out: {path} exists; pass --overwrite to replace it")
    return path


def announce(args: Any, line: str, path: str | Path) -> None:
    """Print ``line`` (which names the output ``path``), or hold it until the command's folder is in place.

    A staged command writes into a hidden folder that becomes ``--out`` only when it ends; the CLI then prints
    the held lines whose path exists (``args.announce``: a list of ``(line, path)``), so no printed path is one
    that does not exist. Without ``args.announce`` (a direct call, writing in place) the line is printed now.
    """
    held = getattr(args, "announce", None)
    if held is None:
        print(line, flush=True)
    else:
        held.append((line, Path(path)))


def flush_announced(held: list[tuple[str, Path]], stream=None) -> None:
    """Print the held lines of ``announce`` whose output exists (call once the folder is in place)."""
    import sys

    for line, path in held:
        if os.path.lexists(path):
            print(line, file=stream or sys.stdout, flush=True)


class Batch:
    """One batch command's per-input bookkeeping (``embodied infer normals | depth360 | forensics``).

    An input that fails (cannot be read, decoded or run) gets one line on stderr, ``embodied: error: <path>:
    <reason>; skipped``, and the others still run; ``exit_code()`` is then 1 (0 when every input ran).
    """

    def __init__(self, total: int, what: str = "inputs"):
        self.total, self.what, self.failed = total, what, 0

    def skip(self, path: str | Path, error: BaseException, bar=None) -> None:
        """Report ``error`` for ``path`` in one line on stderr and count it."""
        import sys

        self.failed += 1
        msg = str(error).splitlines()[0] if str(error) else type(error).__name__
        if not isinstance(error, EmbodiedError):  # ours name the path already; a library's does not
            kind = "" if isinstance(error, (OSError, ValueError)) else f"{type(error).__name__}: "
            msg = f"{path}: {kind}{msg}"
        line = f"embodied: error: {msg}; skipped"
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def exit_code(self) -> int:
        """1 (with a summary line on stderr) when some input was skipped, else 0."""
        import sys

        if not self.failed:
            return 0
        rest = "none ran" if self.failed == self.total else "the others ran"
        print(f"embodied: {self.failed} of {self.total} {self.what} skipped (errors above); {rest}",
              file=sys.stderr, flush=True)
        return 1
