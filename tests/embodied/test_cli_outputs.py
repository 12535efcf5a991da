"""The CLI as a new user meets it: one output-folder policy for every writing command, flags anywhere,
finished runs that say so, one-line errors."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.io import read_json
from embodied.cli import EXIT_BAD_INPUT, main

SAMPLE = str(Path(__file__).resolve().parents[2] / "assets" / "samples" / "normals" / "glassware_000300.png")
ROLLOUT = ["sim", "rollout", "embodied/Reach-Panda-v0", "--policy", "scripted", "--image-size", "32"]


def _one_line_error(capsys) -> str:
    """The command's own error: exactly one line (library warnings a simulator logs may precede it)."""
    err = capsys.readouterr().err
    ours = [ln for ln in err.splitlines() if re.match(r"embodied[\w -]*: error: ", ln)]  # not a progress bar
    assert len(ours) == 1 and "Traceback" not in err, err
    return ours[0]


@pytest.mark.parametrize("argv", [
    [*ROLLOUT, "--episodes", "1", "--out", "{f}"],
    ["drive", "eval", "--policy", "idm", "--episodes", "1", "--out", "{f}"],
    ["infer", "normals", SAMPLE, "--out", "{f}"],
    ["sim", "make-dataset", "panoramas", "--n", "1", "--out", "{f}"],
    ["demo", "--only", "methods", "--out", "{f}"],
    ["train", "bc", "debug=tiny", "out_dir={f}"],
], ids=lambda a: " ".join(a[:2]))
def test_an_output_path_that_is_a_file_is_one_line_exit_2(tmp_path, capsys, argv):
    f = tmp_path / "existing.txt"
    f.write_text("precious")
    assert main([a.replace("{f}", str(f)) for a in argv]) == EXIT_BAD_INPUT
    assert "exists and is a file" in _one_line_error(capsys)
    assert f.read_text() == "precious"


def test_a_second_rollout_into_one_folder_is_refused_and_overwrite_replaces_it_whole(tmp_path, capsys):
    out = tmp_path / "reach"
    assert main([*ROLLOUT, "--episodes", "3", "--out", str(out)]) == 0
    assert main([*ROLLOUT, "--policy", "random", "--episodes", "2", "--out", str(out)]) == EXIT_BAD_INPUT
    assert "holds another sim rollout run; pass --overwrite" in _one_line_error(capsys)
    assert read_json(out / "summary.json")["episodes"] == 3  # untouched
    assert main([*ROLLOUT, "--policy", "random", "--episodes", "2", "--out", str(out), "--overwrite"]) == 0
    assert read_json(out / "summary.json")["episodes"] == 2
    assert sorted(p.name for p in (out / "videos").iterdir()) == ["episode_0.mp4", "episode_1.mp4"]  # no stale 3rd


def test_a_failed_run_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "never"
    assert main([*ROLLOUT, "--policy", str(tmp_path / "no_such_checkpoint"), "--episodes", "1",
                 "--out", str(out)]) == EXIT_BAD_INPUT
    _one_line_error(capsys)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_two_concurrent_rollouts_into_one_folder(tmp_path):
    out = tmp_path / "shared"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "embodied", "sim", "rollout", "embodied/Reach-Panda-v0", "--policy", "random",
           "--image-size", "0", "--episodes", "40", "--out", str(out)]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / ".shared.lock"
        deadline = time.time() + 120
        while not lock.exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.05)
        assert lock.exists(), "the first rollout never claimed its folder"
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == EXIT_BAD_INPUT
        assert second.stderr.strip().endswith("another process is writing this folder right now"), second.stderr
        assert first.wait(timeout=600) == 0
    finally:
        first.kill()
    assert read_json(out / "summary.json")["episodes"] == 40  # the first run's folder, whole


@pytest.mark.parametrize("parts", list(itertools.permutations([("--rotate", "so3"), ("debug=tiny",),
                                                                  ("trainer.seed=3",)])), ids=str)
def test_flags_anywhere_among_overrides(parts, capsys):
    words = [w for part in parts for w in part]  # a flag's value stays right after it
    assert main(["eval", "sola", *words, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "rotate: so3" in out and "max_steps: 4" in out and "seed: 3" in out


@pytest.mark.parametrize("argv", [
    ["train", "sola", "--print-config", "debug=tiny"],
    ["train", "--print-config", "sola", "debug=tiny"],
    ["train", "sola", "debug=tiny", "--print-config"],
    ["eval", "sola", "debug=tiny", "--rotate", "so3", "trainer.seed=3", "--print-config"],
])
def test_readme_examples_with_flags_in_any_place(argv, capsys):
    assert main(argv) == 0
    assert "max_steps: 4" in capsys.readouterr().out


def test_infer_takes_inputs_around_its_flags(tmp_path):
    out = tmp_path / "n"
    assert main(["infer", "normals", SAMPLE, "--out", str(out), SAMPLE.replace("300", "311")]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["glassware_000300_normals.png", "glassware_000311_normals.png"]


def test_training_folder_of_another_config_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".embodied-run.json").write_text('{"command": "train bc", "signature": {"model": "other"}}')
    (run / "metrics.jsonl").write_text("")
    assert main(["train", "bc", "debug=tiny", f"out_dir={run}"]) == EXIT_BAD_INPUT
    assert "pass --overwrite to replace it or the same config to resume it" in _one_line_error(capsys)


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["drive", "eval", "--policy", "idm", "--episodes", "0", "--out", "x"])
    assert e.value.code == EXIT_BAD_INPUT
    err = _one_line_error(capsys)
    assert err.startswith("embodied drive eval: error: argument --episodes") and "--help" in err
