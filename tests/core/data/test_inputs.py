"""``core.data.inputs``: files as given, folders walked, sorted, deterministic, one-line errors; one output-naming
rule (stems, subfolders kept, colliding stems made unique)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.data.inputs import IMAGE_EXTS, expand_inputs, plan_outputs
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


def test_output_names_are_stems_subfolder_paths_and_unique(tree):
    plan = plan_outputs([tree])
    assert [f for f, _ in plan] == expand_inputs([tree])
    assert [n for _, n in plan] == ["A", "b", "sub/c", "sub/deeper/d", "sub/z/f"]  # subfolders kept
    named = plan_outputs([tree / "sub" / "deeper" / "d.tif", tree / "b.png"])
    assert [n for _, n in named] == ["d", "b"]  # a named file: its stem


def test_colliding_stems_get_their_extension_then_a_counter(tmp_path):
    _touch(tmp_path / "odd", "coffee.bmp", "coffee.gif", "coffee.tiff", "Coffee.webp", "tea.png", "coffee_bmp.png")
    names = dict((f.name, n) for f, n in plan_outputs([tmp_path / "odd"]))
    assert names == {"coffee.bmp": "coffee_bmp", "coffee.gif": "coffee_gif", "coffee.tiff": "coffee_tiff",
                     "Coffee.webp": "Coffee_webp", "tea.png": "tea",
                     "coffee_bmp.png": "coffee_bmp_2"}  # "coffee_bmp" was taken by coffee.bmp: a counter
    _touch(tmp_path, "a/x.png", "b/x.png")
    twice = plan_outputs([tmp_path / "a" / "x.png", tmp_path / "b" / "x.png"])  # same name, same extension
    assert [n for _, n in twice] == ["x_png", "x_png_2"]
    every = [n.casefold() for _, n in plan_outputs([tmp_path / "odd", tmp_path / "a", tmp_path / "b"])]
    assert len(every) == len(set(every)) == 8
    assert plan_outputs([tmp_path / "odd"]) == plan_outputs([tmp_path / "odd"])  # deterministic
