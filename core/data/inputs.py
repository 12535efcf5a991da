"""The files an ``embodied infer`` command runs on, and the name each one's outputs get.

Inputs (``expand_inputs``): a file is taken as given (its reader decides whether it can read it and says so in
one line); a folder is walked recursively (symlinked folders are not followed, hidden files and folders are
skipped) for the files whose suffix is one the command's reader accepts, sorted by their path inside the
folder, so the same folder always gives the same order. Results keep the order of the inputs, and a file
reached twice (named, and inside a named folder) comes once.

Output names (``plan_outputs``), one rule for every batch command (``<name>_normals.png``,
``<name>_depth.npy``, ...):

1. a file named on the command line is named by its stem (``photos/coffee.png`` -> ``coffee``); a file found in
   a folder by its path inside that folder, without the suffix, so subfolders are kept
   (``DIR/kitchen/coffee.png`` -> ``kitchen/coffee``, written as ``OUT/kitchen/coffee_normals.png``);
2. inputs whose names from rule 1 are equal (ignoring case, as some file systems do) all get their extension
   appended: ``coffee.bmp``, ``coffee.gif`` -> ``coffee_bmp``, ``coffee_gif``;
3. a name that still collides (the same file name from two places) gets ``_2``, ``_3``, ... in input order.

So every input has its own outputs, and an input's name depends only on the set of inputs.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from core.errors import DataError

__all__ = ["IMAGE_EXTS", "expand_inputs", "plan_outputs"]

#: Image files ``core.data.imread.read_image`` reads (Pillow's common formats; GIF gives its first frame). Videos:
#: ``core.data.video.VIDEO_EXTS``.
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif")


def expand_inputs(paths: Iterable[str | os.PathLike], exts: Sequence[str] = IMAGE_EXTS, *,
                  keep_missing: bool = False) -> list[Path]:
    """Expand files and folders into the files to run on (the rule is in the module docstring).

    Args:
        paths: Files and folders, as the user typed them.
        exts: Suffixes (lower case, with the dot) of the files a folder contributes.
        keep_missing: Keep a path that does not exist (the caller reports it with the other per-file
            errors) instead of raising.

    Returns:
        The files, in input order, each folder's files sorted.

    Raises:
        DataError: A path does not exist, a folder holds no file of ``exts``, or no path was given; one line
            naming the path.
    """
    return [f for f, _ in _expand(paths, exts, keep_missing)]


def plan_outputs(paths: Iterable[str | os.PathLike], exts: Sequence[str] = IMAGE_EXTS, *,
                 keep_missing: bool = False) -> list[tuple[Path, str]]:
    """``expand_inputs``, with the name each input's outputs get (the rule is in the module docstring).

    Returns:
        ``(input file, output name)`` pairs in input order; the name is a posix path relative to the output
        folder without a suffix (``"coffee"``, ``"kitchen/coffee"``, ``"coffee_bmp"``), unique ignoring case.

    Raises:
        DataError: As ``expand_inputs``.
    """
    found = _expand(paths, exts, keep_missing)
    base = [(f.relative_to(root).with_suffix("") if root is not None else Path(f.stem)).as_posix()
            for f, root in found]
    count = Counter(b.casefold() for b in base)
    names = [f"{b}_{f.suffix.lstrip('.').lower()}" if count[b.casefold()] > 1 and f.suffix else b
             for b, (f, _) in zip(base, found, strict=True)]
    taken: set[str] = set()
    out = []
    for name, (f, _) in zip(names, found, strict=True):
        unique, k = name, 1
        while unique.casefold() in taken:
            k += 1
            unique = f"{name}_{k}"
        taken.add(unique.casefold())
        out.append((f, unique))
    return out


def _expand(paths: Iterable[str | os.PathLike], exts: Sequence[str],
            keep_missing: bool) -> list[tuple[Path, Path | None]]:
    """(file, the folder it was found in or None when named) for every input (see ``expand_inputs``)."""
    wanted = tuple(e.lower() for e in exts)
    raw = [Path(p) for p in paths]
    if not raw:
        raise DataError("inputs", "no file or folder given")
    out: list[tuple[Path, Path | None]] = []
    seen: set[Path] = set()
    for p in raw:
        if p.is_dir():
            found = [(f, p) for f in _walk(p, wanted)]
            if not found:
                raise DataError(p, f"folder holds no {' / '.join(wanted)} file")
        elif p.exists() or keep_missing:
            found = [(p, None)]
        else:
            raise DataError(p, "no such file or folder")
        for f, root in found:
            key = f.resolve() if f.exists() else f.absolute()
            if key not in seen:
                seen.add(key)
                out.append((f, root))
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
