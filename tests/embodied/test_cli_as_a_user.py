"""The command line as a user meets it, from a folder of their own (not the repository root): nothing of theirs
deleted, one naming rule for batch outputs, bad inputs skipped one by one, videos bounded, domain honesty, and
a card for every shipped checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embodied.cli import EXIT_BAD_INPUT, main

REPO = Path(__file__).resolve().parents[2]
SAMPLE = str(REPO / "assets" / "samples" / "normals" / "glassware_000300.png")
EMBODIED = str(Path(sys.executable).with_name("embodied"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "HF_HUB_OFFLINE": "1"}


def _user(tmp_path, *argv, timeout=600) -> subprocess.CompletedProcess:
    """``embodied ARGV`` as a user types it, in their own folder ``tmp_path`` (outside the repository)."""
    assert REPO not in tmp_path.resolve().parents
    return subprocess.run([EMBODIED, *argv], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=timeout)


def _ours(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("embodied")]


# ------------------------------------------------------------------------------------------ item 1: --overwrite
WRITERS = [
    ["infer", "normals", SAMPLE, "--out", "u"],
    ["infer", "depth360", str(REPO / "assets" / "samples" / "normals" / "glassware_000311.png"), "--out", "u"],
    ["sim", "rollout", "embodied/Reach-Panda-v0", "--policy", "scripted", "--episodes", "1", "--image-size", "0",
     "--out", "u"],
    ["sim", "make-dataset", "panoramas", "--n", "1", "--out", "u"],
    ["drive", "eval", "--policy", "idm", "--episodes", "1", "--out", "u"],
    ["train", "bc", "debug=tiny", "out_dir=u"],
    ["demo", "--only", "methods", "--out", "u"],
]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["plain", "overwrite"])
@pytest.mark.parametrize("argv", WRITERS, ids=lambda a: " ".join(a[:2]))
def test_a_users_folder_is_refused_with_or_without_overwrite(tmp_path, monkeypatch, capsys, argv, overwrite):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "notes.txt").write_text("hi")
    assert main([*argv, *overwrite]) == EXIT_BAD_INPUT
    ours = _ours(capsys.readouterr().err)
    assert len(ours) == 1 and ours[0] == (
        f"embodied: error: {tmp_path / 'u'}: exists and holds files no embodied run wrote (notes.txt); choose "
        "another output folder or empty this one (--overwrite replaces only a folder an embodied run wrote)")
    assert (tmp_path / "u" / "notes.txt").read_text() == "hi"
    assert sorted(p.name for p in (tmp_path / "u").iterdir()) == ["notes.txt"]


def test_overwrite_replaces_a_run_folder_but_never_a_file_put_into_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    demo = ["demo", "--only", "methods", "--out", "outputs/demo"]
    assert main(demo) == 0
    assert main(demo) == EXIT_BAD_INPUT  # another demo run: --overwrite replaces it
    assert "holds another demo run; pass --overwrite" in _ours(capsys.readouterr().err)[0]
    assert main([*demo, "--overwrite"]) == 0  # `make demo`'s command, run twice
    (tmp_path / "outputs" / "demo" / "my_notes.md").write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert main([*demo, *extra]) == EXIT_BAD_INPUT
        assert "holds files the demo run there did not write (my_notes.md); move them out" in \
            _ours(capsys.readouterr().err)[0]
    assert (tmp_path / "outputs" / "demo" / "my_notes.md").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert main(["demo", "--only", "methods", "--out", "empty"]) == 0  # an empty folder is free


# ----------------------------------------------------------------------------- item 2: one rule for batch inputs
@pytest.fixture
def odd(tmp_path):
    """A user's folder: one photo in four formats (colliding stems), one in a subfolder, two bad files."""
    from PIL import Image

    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    (tmp_path / "odd" / "sub").mkdir(parents=True)
    for ext in ("bmp", "gif", "tiff", "webp"):
        im.save(tmp_path / "odd" / f"coffee.{ext}")
    im.save(tmp_path / "odd" / "sub" / "cup.png")
    im.save(tmp_path / "whole.png")
    data = (tmp_path / "whole.png").read_bytes()
    (tmp_path / "odd" / "truncated.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "odd" / "notes.png").write_text("not an image\n")
    return tmp_path


def test_infer_normals_names_outputs_uniquely_and_skips_bad_files(odd):
    r = _user(odd, "infer", "normals", "odd", "--out", "outputs/odd_normals")
    assert r.returncode == 1, r.stderr
    printed = r.stdout.split()
    assert printed == [f"outputs/odd_normals/{n}_normals.png" for n in
                       ("coffee_bmp", "coffee_gif", "coffee_tiff", "coffee_webp", "sub/cup")]
    assert all((odd / p).is_file() and (odd / p).with_suffix(".npy").is_file() for p in printed)  # all exist
    skipped = [ln for ln in _ours(r.stderr) if ln.endswith("; skipped")]
    assert skipped == ["embodied: error: odd/notes.png: not an image (no image format recognises its contents); "
                       "skipped", "embodied: error: odd/truncated.png: cannot decode image (image file is truncated); "
                       "skipped"]
    assert "embodied: 2 of 7 inputs skipped (errors above); the others ran" in r.stderr
    r = _user(odd, "infer", "normals", "odd/notes.png", "--out", "none")  # nothing could run: nothing written
    assert r.returncode == 1 and r.stdout == "" and not (odd / "none").exists()
    assert _ours(r.stderr)[-1] == "embodied: infer normals: no input could be processed; nothing was written"


def test_infer_forensics_reads_every_format_and_goes_on_past_bad_files(odd):
    r = _user(odd, "infer", "forensics", "odd", "--no-reason")
    assert r.returncode == 1, r.stderr
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [ln["path"] for ln in lines] == [f"odd/{n}" for n in ("coffee.bmp", "coffee.gif", "coffee.tiff",
                                                                 "coffee.webp", "notes.png", "sub/cup.png",
                                                                 "truncated.png")]  # .gif included
    assert [("error" in ln) for ln in lines] == [False] * 4 + [True, False, True]
    assert sum(ln.endswith("; skipped") for ln in _ours(r.stderr)) == 2
    # the shipped detector has domain statistics: every judged image says whether it is like its training crops
    assert all(isinstance(ln["out_of_domain"], bool) for ln in lines if "error" not in ln)
    assert "has no domain statistics" not in r.stderr


def test_infer_depth360_skips_a_video_and_a_non_panorama(odd):
    from core.data.video import write_mp4

    write_mp4(odd / "clip.mp4", np.zeros((2, 16, 32, 3), np.uint8))
    pano = odd / "panos"
    pano.mkdir()
    from PIL import Image

    Image.fromarray(np.full((32, 64, 3), 120, np.uint8)).save(pano / "room.png")
    Image.fromarray(np.full((32, 64, 3), 90, np.uint8)).save(pano / "room.jpg")
    r = _user(odd, "infer", "depth360", "panos", "clip.mp4", "whole.png", "--out", "d")
    assert r.returncode == 1, r.stderr
    assert [ln.rsplit(" -> ", 1)[1] for ln in r.stdout.splitlines()] == ["d/room_jpg_depth.npy", "d/room_png_depth.npy"]
    skipped = [ln for ln in _ours(r.stderr) if ln.endswith("; skipped")]
    assert len(skipped) == 2 and "clip.mp4: is a video; depth360 reads still panoramas" in skipped[0]
    assert "whole.png: panorama is 48x40, expected width = 2 x height" in skipped[1]
    preds = json.loads((odd / "d" / "predictions.json").read_text())
    assert [o["depth"] for o in preds["outputs"]] == ["room_jpg_depth.npy", "room_png_depth.npy"]


def test_help_states_the_naming_rule_and_the_exit_code(capsys):
    for kind in ("normals", "depth360", "forensics"):
        with pytest.raises(SystemExit):
            main(["infer", kind, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "the exit code is then 1" in text and "skipped" in text
        if kind != "forensics":
            assert "stem_ext when stems collide" in text and "subfolders kept" in text


# --------------------------------------------------------------------------- item 4: videos and the domain check
def test_a_video_runs_its_first_frames_with_the_size_stated_first(tmp_path):
    from core.data.video import write_mp4

    rng = np.random.default_rng(1)
    write_mp4(tmp_path / "clip.mp4", rng.integers(0, 256, (20, 48, 64, 3), dtype=np.uint8), fps=10)
    r = _user(tmp_path, "infer", "normals", "clip.mp4", "--out", "v", "--max-frames", "4")
    assert r.returncode == 0, r.stderr
    first = _ours(r.stderr)[0]
    assert first == ("embodied: clip.mp4: video of 20 frames, 64x48 at 10 fps: running the first 4 (--max-frames 4; "
                     "0 for all); writes v/clip_normals.mp4 and v/clip_normals.npy (4 x 48 x 64 x 3 float16, 73.7 kB)")
    assert r.stdout.split() == ["v/clip_normals.mp4"]
    n = np.load(tmp_path / "v" / "clip_normals.npy")
    assert n.shape == (4, 48, 64, 3) and n.dtype == np.float16
    assert sum("is far from this model's training domain" in ln for ln in r.stderr.splitlines()) <= 1  # one per video


@pytest.mark.parametrize("argv", [["infer", "forensics", "clip.mp4"], ["infer", "i2v", "clip.mp4", "--out", "o.mp4"]],
                         ids=lambda a: a[1])
def test_image_commands_refuse_a_video_in_one_line(tmp_path, monkeypatch, capsys, argv):
    from core.data.video import write_mp4

    monkeypatch.chdir(tmp_path)
    write_mp4(tmp_path / "clip.mp4", np.zeros((2, 16, 16, 3), np.uint8))
    assert main(argv) in (1, EXIT_BAD_INPUT)
    assert any("clip.mp4: is a video" in ln for ln in _ours(capsys.readouterr().err))


@pytest.mark.parametrize("argv", [["infer", "i2v", "{photo}", "--out", "o.mp4"],
                                  ["infer", "video", "--first-frame", "{photo}", "--frames", "3", "--out", "o.mp4"]],
                         ids=lambda a: a[1])
def test_video_models_warn_about_a_real_photo(tmp_path, monkeypatch, capsys, argv):
    from PIL import Image

    from core.data.samples import skimage_photo

    monkeypatch.chdir(tmp_path)
    Image.fromarray(skimage_photo("coffee")).save(tmp_path / "coffee.png")
    assert main([a.replace("{photo}", "coffee.png") for a in argv]) == 0
    warning = [ln for ln in _ours(capsys.readouterr().err) if "warning" in ln]
    assert len(warning) == 1 and warning[0].startswith("embodied: warning: coffee.png is far from this model's "
                                                       "training domain (")
    assert (tmp_path / "o.mp4").is_file()


def test_every_shipped_checkpoint_has_a_card_and_is_listed():
    from core.pretrained import read_card

    checkpoints = REPO / "assets" / "checkpoints"
    listing = (REPO / "assets" / "README.md").read_text()
    folders = sorted(p for p in checkpoints.iterdir() if p.is_dir())
    assert len(folders) >= 12
    for folder in folders:
        assert f"`checkpoints/{folder.name}/`" in listing, folder.name
    upstream = set()  # sub-folders the upstream libraries open carry their own config.json, not a card
    for folder in folders:
        card = read_card(folder) or {}
        upstream |= {folder / name for name in (card.get("upstream") or {})}
    model_folders = {p.parent for p in checkpoints.rglob("config.json")} - upstream
    for folder in [*folders, *sorted(model_folders)]:
        card = read_card(folder)
        assert card and (folder / "README.md").read_text().startswith("---\n"), folder
