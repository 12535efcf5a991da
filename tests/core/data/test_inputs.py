"""``core.data.inputs.expand_inputs``: files as given, folders walked, sorted, deterministic, one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.data.inputs import IMAGE_EXTS, expand_inputs
from core.errors import DataError


def _touch(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")


@pytest.fixture
def tree(tmp_path):
    _touch(tmp_path / "imgs", "b.png", "A.JPG", "sub/c.webp", "sub/deeper/d.tif", "notes.txt", "clip.mp4",
           ".hidden.png", ".cache/e.png", "sub/z/f.bmp")
    return tmp_path / "imgs"


def test_folders_are_walked_sorted_for_the_readers_formats(tree):
    got = [p.relative_to(tree).as_posix() for p in expand_inputs([tree])]
    assert got == ["A.JPG", "b.png", "sub/c.webp", "sub/deeper/d.tif", "sub/z/f.bmp"]  # no txt, mp4, hidden
    with_video = [p.relative_to(tree).as_posix() for p in expand_inputs([str(tree)], IMAGE_EXTS + (".mp4",))]
    assert with_video == ["A.JPG", "b.png", "clip.mp4", "sub/c.webp", "sub/deeper/d.tif", "sub/z/f.bmp"]
    assert expand_inputs([tree]) == expand_inputs([tree])  # deterministic


def test_input_order_kept_files_as_given_and_duplicates_once(tree):
    named = tree / "notes.txt"  # a named file is taken as given: its reader decides
    got = expand_inputs([named, tree / "sub", tree / "b.png", tree / "sub" / "c.webp"])
    assert got == [named, tree / "sub" / "c.webp", tree / "sub" / "deeper" / "d.tif", tree / "sub" / "z" / "f.bmp",
                   tree / "b.png"]


def test_symlinked_folders_are_not_followed(tree, tmp_path):
    outside = tmp_path / "outside"
    _touch(outside, "o.png")
    os.symlink(outside, tree / "link")
    assert all("link" not in p.parts for p in expand_inputs([tree]))


def test_one_line_errors(tree, tmp_path):
    missing = tmp_path / "missing.png"
    with pytest.raises(DataError) as err:
        expand_inputs([tree, missing])
    assert str(err.value) == f"{missing}: no such file or folder"
    assert expand_inputs([missing, tree / "b.png"], keep_missing=True) == [missing, tree / "b.png"]
    empty = tmp_path / "empty"
    _touch(empty, "readme.md")
    with pytest.raises(DataError, match="folder holds no .png / .jpg") as err:
        expand_inputs([empty])
    assert str(err.value).startswith(str(empty)) and "\n" not in str(err.value)
    with pytest.raises(DataError, match="no file or folder given"):
        expand_inputs([])


def test_unique_stems(tree, tmp_path):
    _touch(tree, "sub/b.jpg")
    assert len(expand_inputs([tree])) == 6
    with pytest.raises(DataError, match=r"same name as .*b\.png: both would write b_\*") as err:
        expand_inputs([tree], unique_stems=True)
    assert str(err.value).startswith(str(tree / "sub" / "b.jpg"))
