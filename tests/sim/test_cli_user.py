"""`embodied sim ...` / `embodied drive eval` as a user meets them: the console script, run from a folder of
their own outside the repository, its stdout / stderr and exit code read as they are (issue 33).

Held here: a policy of other spaces refused in one line (exit 2, nothing written), third-party noise filtered
unless ``--verbose``, progress bars on stderr, env-id suggestions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EMBODIED = str(Path(sys.executable).with_name("embodied"))
ENV = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
# the lines issue 33 found on stderr: gym's banner, robosuite's log lines, highway-env's route warnings
NOISE = ("Gym has been unmaintained", "[robosuite", "does not start after current road", "Traceback")


def embodied(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the console script in ``cwd`` (a folder outside the repository)."""
    return subprocess.run([EMBODIED, *argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def noise(stderr: str) -> list[str]:
    return [line for line in stderr.replace("\r", "\n").splitlines() if any(n in line for n in NOISE)]


@pytest.fixture(scope="module")
def reach_bc(tmp_path_factory) -> Path:
    """A BC checkpoint as `embodied train bc` writes it for Reach-Panda (proprio 23, 7-d actions), untrained."""
    from worldmodels.bc.modeling_bc import BCPolicyModel, tiny_config

    cfg = tiny_config(action_dim=7, proprio_dim=23)
    out = tmp_path_factory.mktemp("user") / "bc_reach"
    BCPolicyModel(cfg).save_pretrained(out, run_config={"method": "bc", "env": {"id": "embodied/Reach-Panda-v0"}})
    return out


def test_libero_rollout_with_a_reach_checkpoint_is_refused_in_one_line(tmp_path, reach_bc):
    """Issue 33: `sim rollout embodied/Libero-spatial-0-v0 --policy outputs/bc_tiny` ended in a traceback."""
    r = embodied("sim", "rollout", "embodied/Libero-spatial-0-v0", "--policy", str(reach_bc), "--episodes", "1",
                 "--out", "r", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.replace("\r", "\n").splitlines() if ln.strip()]
    assert lines[-1] == (f"embodied: error: policy {reach_bc} (made for embodied/Reach-Panda-v0) does not fit env "
                         "embodied/Libero-spatial-0-v0: observation 'proprio': policy (23,), env (15,)")
    assert noise(r.stderr) == []  # building the LIBERO env: no gym banner, no robosuite lines
    assert not (tmp_path / "r").exists()


def test_drive_eval_with_a_manipulation_checkpoint_is_refused_in_one_line(tmp_path, reach_bc):
    r = embodied("drive", "eval", "--policy", str(reach_bc), "--episodes", "1", "--out", "d", "--no-video",
                 cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"embodied: error: policy {reach_bc} (made for embodied/Reach-Panda-v0) does not fit "
                           "env embodied/Drive-Highway-v0: ")
    assert "observation 'proprio': policy (23,), env (4,)" in last and "action: policy (7,), env (2,)" in last
    assert not (tmp_path / "d").exists() and noise(r.stderr) == []


def test_scripted_rollout_prints_no_third_party_noise_but_a_progress_bar(tmp_path):
    r = embodied("sim", "rollout", "embodied/Reach-Panda-v0", "--policy", "scripted", "--episodes", "1",
                 "--out", "X", "--image-size", "32", "--no-video", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "success 1.00 over 1 episodes" in r.stdout
    assert noise(r.stderr) == []
    assert "embodied/Reach-Panda-v0:   0%" in r.stderr and "0/1" in r.stderr  # the bar, even into a pipe
    # --verbose, given after the command, keeps the libraries' lines: the filter is what removed them
    v = embodied("sim", "rollout", "embodied/Reach-Panda-v0", "--episodes", "1", "--out", "Y", "--image-size", "0",
                 "--no-video", "--verbose", cwd=tmp_path)
    assert v.returncode == 0, v.stderr[-2000:]
    assert "[robosuite WARNING] No private macro file found!" in v.stderr


def test_async_workers_are_quiet_too(tmp_path):
    r = embodied("sim", "rollout", "embodied/Reach-Panda-v0", "--episodes", "2", "--num-envs", "2", "--async",
                 "--out", "X", "--image-size", "0", "--no-video", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert noise(r.stderr) == []


@pytest.mark.parametrize("typed, wanted", [
    ("Reach-Panda-v0", "did you mean 'embodied/Reach-Panda-v0'?"),
    ("Libero-spatial-10-v0", "embodied/Libero-spatial-N-v0 has N in 0..9; did you mean 'embodied/Libero-spatial-"),
])
def test_env_id_suggestions(tmp_path, typed, wanted):
    r = embodied("sim", "rollout", typed, "--episodes", "1", "--out", "X", cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"embodied: error: env id {typed!r} is not registered; ") and wanted in line
    assert "Reach" not in line.split("did you mean", 1)[1] or typed.startswith("Reach")
    assert not (tmp_path / "X").exists()


def test_make_dataset_shows_a_per_view_bar(tmp_path):
    r = embodied("sim", "make-dataset", "panoramas", "--n", "2", "--size", "16", "--spp", "1", "--out", "p",
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "make-dataset panoramas:   0%" in r.stderr and "0/2" in r.stderr and "view" in r.stderr
    assert (tmp_path / "p" / "meta.json").is_file()


def test_an_option_the_env_does_not_take_is_one_line(tmp_path):
    r = embodied("sim", "rollout", "embodied/Drive-Highway-v0", "--camera", "workspace", "--episodes", "1",
                 "--out", "X", cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("embodied: error: env embodied/Drive-Highway-v0 takes no 'camera' option (its options: ")
    assert not (tmp_path / "X").exists()


def test_bc_closed_loop_eval_on_another_env_is_refused_in_one_line(tmp_path, reach_bc):
    """`embodied eval bc` rolls the checkpoint out: the same check, before any episode."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    import shutil

    shutil.copytree(reach_bc, run / "checkpoints" / "step_00000002")
    (run / "checkpoints" / "latest").write_text("step_00000002\n")
    r = embodied("eval", "bc", f"out_dir={run}", "env=libero_spatial_0", "env.episodes=1", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("embodied: error: policy ") and "\n" not in last
    assert ("(made for embodied/Reach-Panda-v0) does not fit env embodied/Libero-spatial-0-v0: "
            "observation 'proprio': policy (23,), env (15,)") in last
    assert noise(r.stderr) == []
