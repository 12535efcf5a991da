"""``expand_inputs``: the files an ``embodied infer`` command runs on, from the paths a user typed.

One rule for every infer command: a file is taken as given (its reader decides whether it can read it and
says so in one line); a folder is walked recursively (symlinked folders are not followed, hidden files and
folders are skipped) for the files whose suffix is one the command's reader accepts, sorted by their path
inside the folder, so the same folder always gives the same order. Results keep the order of the inputs,
and a file reached twice (named, and inside a named folder) comes once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from core.errors import DataError

__all__ = ["IMAGE_EXTS", "expand_inputs"]

#: Image files ``core.data.imread.read_image`` reads (Pillow's common formats; GIF gives its first frame). Videos:
#: ``core.data.video.VIDEO_EXTS``.
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif")


def expand_inputs(paths: Iterable[str | os.PathLike], exts: Sequence[str] = IMAGE_EXTS, *,
                  keep_missing: bool = False, unique_stems: bool = False) -> list[Path]:
    """Expand files and folders into the files to run on (the rule is in the module docstring).

    Args:
        paths: Files and folders, as the user typed them.
        exts: Suffixes (lower case, with the dot) of the files a folder contributes.
        keep_missing: Keep a path that does not exist (the caller reports it with the other per-file
            errors) instead of raising.
        unique_stems: Refuse two files with the same stem (for commands that name outputs ``<stem>_*``, where
            the second would overwrite the first).

    Returns:
        The files, in input order, each folder's files sorted.

    Raises:
        DataError: A path does not exist, a folder holds no file of ``exts``, no path was given, or (with
            ``unique_stems``) two files share a stem; one line naming the path.
    """
    wanted = tuple(e.lower() for e in exts)
    raw = [Path(p) for p in paths]
    if not raw:
        raise DataError("inputs", "no file or folder given")
    out: list[Path] = []
    seen: set[Path] = set()
    for p in raw:
        if p.is_dir():
            found = _walk(p, wanted)
            if not found:
                raise DataError(p, f"folder holds no {' / '.join(wanted)} file")
        elif p.exists() or keep_missing:
            found = [p]
        else:
            raise DataError(p, "no such file or folder")
        for f in found:
            key = f.resolve() if f.exists() else f.absolute()
            if key not in seen:
                seen.add(key)
                out.append(f)
    if unique_stems:
        by_stem: dict[str, Path] = {}
        for f in out:
            if f.stem in by_stem:
                raise DataError(f, f"has the same name as {by_stem[f.stem]}: both would write {f.stem}_* "
                                   "(rename one, or run them separately)")
            by_stem[f.stem] = f
    return out


def _walk(folder: Path, exts: tuple[str, ...]) -> list[Path]:
    """Files under ``folder`` with a suffix in ``exts``: recursive, no symlinked folders, no hidden entries."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith(".") and os.path.splitext(name)[1].lower() in exts:
                path = Path(root) / name
                if path.is_file():
                    found.append(path)
    return sorted(found, key=lambda f: f.relative_to(folder).parts)
