"""``embodied libero eval`` (``sim.libero.evaluate``): aggregation, scheduling, crash isolation, resume, refusal.

Building a LIBERO env costs 5-15 s here, so the default run builds one in-process (the module fixture: one
evaluation whose policy raises on one init state and returns NaN on another) and runs the CLI twice in a
subprocess (killed with SIGKILL after its first episode, then resumed). Spawned workers (K = 2 vs 1, a worker
that dies) and ``--overwrite`` are ``slow``. Envs run without images and episodes are a few steps long.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError, DataError
from core.outputs import OutputError
from sim.libero import evaluate as ev
from sim.libero.suites import get_task

REPO = Path(__file__).resolve().parents[3]
SUITE = "libero_spatial"


# --------------------------------------------------------------------------------------- no env needed
def _rec(suite, task, k, success, failure=None, steps=5, video=None):
    return {"suite": suite, "task_index": task, "task_name": f"t{task}", "language": f"do {task}",
            "init_state_id": k, "success": success, "failure": None if success else failure or "timeout",
            "steps": steps, "seconds": 1.0, "video": video}


def test_aggregate_known_answers():
    recs = [
        _rec("libero_object", 2, 0, True, steps=10, video="videos/a.mp4"),
        _rec("libero_spatial", 1, 1, False, "policy: act raised ValueError: x"),
        _rec("libero_spatial", 1, 0, True, steps=20),
        *[_rec("libero_spatial", 0, k, True) for k in range(5)],
        *[_rec("libero_spatial", 0, k, False, "sim: physics diverged") for k in range(5, 10)],
    ]
    info = ev.aggregate(recs)
    tasks = [(t["suite"], t["task_index"]) for t in info["per_task"]]
    assert tasks == [("libero_spatial", 0), ("libero_spatial", 1), ("libero_object", 2)]  # suite order, task order
    t0, t1, t2 = info["per_task"]
    assert (t0["task_group"], t0["task_id"], t0["n_episodes"], t0["successes"]) == ("libero_spatial", 0, 10, 5)
    assert t0["pc_success"] == 50.0 and t0["pc_success_ci95"] == pytest.approx([23.66, 76.34], abs=0.01)
    assert t0["failures"] == {"sim": 5}
    assert (t1["n_episodes"], t1["successes"], t1["failures"], t1["mean_steps"]) == (2, 1, {"policy": 1}, 12.5)
    assert (t2["pc_success"], t2["video_paths"], t2["language"]) == (100.0, ["videos/a.mp4"], "do 2")
    assert t2["pc_success_ci95"] == pytest.approx([20.65, 100.0], abs=0.01)  # Wilson 1 / 1
    sp = info["per_group"]["libero_spatial"]
    assert (sp["n_tasks"], sp["n_episodes"], sp["successes"]) == (2, 12, 6) and sp["pc_success"] == 50.0
    assert sp["failures"] == {"policy": 1, "sim": 5}
    ov = info["overall"]
    assert (ov["n_tasks"], ov["n_episodes"], ov["successes"]) == (3, 13, 7)
    assert ov["pc_success"] == pytest.approx(700 / 13) and ov["video_paths"] == ["videos/a.mp4"]
    table = ev.stdout_table(info)
    assert "libero_spatial/0" in table and "overall" in table and "[23.7, 76.3]" in table


def test_scheduler_keeps_a_task_per_worker_and_shares_the_last_one():
    a, b = get_task(SUITE, 0), get_task(SUITE, 1)
    s = ev.Scheduler([(a, [0, 1, 2]), (b, [0, 1])])
    assert s.take(None) == (a, 0) and s.take(None) == (b, 0)  # two workers: one task each
    assert s.take(a) == (a, 1) and s.take(b) == (b, 1) and s.take(a) == (a, 2)
    assert s.take(b) is None  # nothing left anywhere
    one = ev.Scheduler([(a, [0, 1, 2])])  # fewer tasks than workers: both build task a
    assert [one.take(None), one.take(None), one.take(a), one.take(a)] == [(a, 0), (a, 1), (a, 2), None]


def test_select_and_parse_errors():
    plan = ev.select_episodes("spatial", [3, 0], 4)
    assert [(t.task_id, ids) for t, ids in plan] == [("libero_spatial/3", [0, 1, 2, 3]), ("libero_spatial/0", [0, 1, 2, 3])]
    assert len(ev.select_episodes("all", None, 1)) == 130
    assert ev.parse_task_ids("0,3") == [0, 3] and ev.parse_task_ids("0-2,7") == [0, 1, 2, 7]
    assert ev.parse_task_ids(None) is None
    for args, match in [(("nope", None, 1), "unknown LIBERO suite"), ((SUITE, [10], 1), "task 10 is out of range"),
                        ((SUITE, None, 51), "51 > 50"), ((SUITE, None, 0), ">= 1")]:
        with pytest.raises(ConfigError, match=match):
            ev.select_episodes(*args)
    with pytest.raises(ConfigError, match="--tasks"):
        ev.parse_task_ids("a,b")


def test_check_action_and_torn_episode_file(tmp_path):
    a, why = ev._check_action([[0.1] * 7], (7,))
    assert why is None and a.shape == (7,)
    assert "shape (3,)" in ev._check_action(np.zeros(3), (7,))[1]
    assert "non-finite" in ev._check_action([np.nan] * 7, (7,))[1]
    path = tmp_path / "episodes.jsonl"
    good = [json.dumps(_rec(SUITE, 0, k, False)) for k in range(2)]
    path.write_text("\n".join(good) + "\n" + good[0][:20])  # a kill mid-write tore the last line
    assert [r["init_state_id"] for r in ev.read_episodes(path)] == [0, 1]
    assert path.read_text().endswith(good[0][:20])  # reading alone changes nothing
    ev.read_episodes(path, repair=True)
    assert path.read_text() == "\n".join(good) + "\n"
    path.write_text("not json\n" + good[0] + "\n")
    with pytest.raises(DataError, match="line 1"):
        ev.read_episodes(path)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from embodied.cli import main

    bad_ckpt = tmp_path / "ckpt"
    bad_ckpt.mkdir()
    (bad_ckpt / "config.json").write_text("{not json")
    base = ["libero", "eval", "--policy", "random", "--out", str(tmp_path / "o")]
    cases = [(["--suite", "nope"], "unknown LIBERO suite"), (["--suite", SUITE, "--tasks", "12"], "out of range"),
             (["--suite", SUITE, "--episodes-per-task", "60"], "60 > 50"),
             (["--suite", SUITE, "--policy", str(tmp_path / "missing")], "neither a policy name"),
             (["--suite", SUITE, "--policy", str(bad_ckpt)], str(bad_ckpt))]
    for extra, match in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and match in err, err
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------- one in-process run
class FlakyPolicy:
    """Zero actions; raises at step 3 of init state 1, returns NaN at the first step of init state 2 and puts
    NaN into the sim's velocities at step 2 of init state 3 (the physics diverges); init state 4 is normal but
    says why it failed (``episode_stats``)."""

    def __init__(self, env):
        self.env, self.t = env, 0

    def reset(self, seed=None):
        self.t = 0

    def act(self, obs, info):
        self.t += 1
        k = self.env.init_state_id
        if k == 1 and self.t == 3:
            raise RuntimeError("boom\nsecond line")
        if k == 2:
            return np.full(7, np.nan)
        if k == 3 and self.t == 2:
            self.env.sim.data.qvel[:] = np.nan
        return np.zeros(7)

    def episode_stats(self):
        return {"failure": "grasp slipped" if self.env.init_state_id == 4 else None, "acts": self.t}


EVAL = dict(episodes_per_task=5, task_ids=[0], max_steps=5, settle_steps=2, videos=1, images=False, progress=False)


@pytest.fixture(scope="module")
def flaky_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    info = ev.evaluate_libero(FlakyPolicy, SUITE, out=out, **EVAL)
    return out, info


def test_a_failing_policy_fails_only_its_episode(flaky_run):
    out, info = flaky_run
    lines = (out / ev.EPISODES_FILE).read_text().splitlines()
    recs = {r["init_state_id"]: r for r in map(json.loads, lines)}
    assert len(lines) == 5 and sorted(recs) == [0, 1, 2, 3, 4]
    for k, why in [(0, "timeout"), (4, "timeout: grasp slipped")]:  # around the failing ones: to the step limit
        assert (recs[k]["failure"], recs[k]["steps"], recs[k]["success"]) == (why, 5, False)
    assert recs[0]["policy_stats"] == {"failure": None, "acts": 5}
    assert recs[1]["failure"] == "policy: act raised RuntimeError: boom" and recs[1]["steps"] == 2
    assert recs[2]["failure"].startswith("policy: returned a non-finite action") and recs[2]["steps"] == 0
    assert recs[3]["failure"].startswith("sim: physics diverged") and recs[3]["steps"] == 2
    # eval_info counts are the episode lines
    disk = json.loads((out / ev.INFO_FILE).read_text())
    task = disk["per_task"][0]
    assert (task["n_episodes"], task["successes"], task["failures"]) == (5, 0, {"policy": 2, "sim": 1, "timeout": 2})
    assert disk["per_group"][SUITE]["n_episodes"] == disk["overall"]["n_episodes"] == len(lines)
    assert [(r["init_state_id"], r["failure"]) for r in disk["per_episode"]] == [
        (k, recs[k]["failure"]) for k in range(5)]
    assert disk["config"]["step_limits"] == {SUITE: 5} and disk["overall"]["pc_success_ci95"][0] == 0.0
    assert info["overall"]["n_episodes"] == 5
    # the first episode of the task has a video (settle + policy steps + the reset frame), on the page too
    assert recs[0]["video"] == f"videos/{SUITE}/task0_init0.mp4" and recs[1]["video"] is None
    from core.data.video import probe_video

    assert probe_video(out / recs[0]["video"]) == (1 + 2 + 5, 20.0, (128, 128))
    page = (out / ev.PAGE_FILE).read_text()
    assert f'<video src="{recs[0]["video"]}"' in page and "policy: act raised" in page


def test_same_settings_resume_and_other_settings_are_refused(flaky_run):
    out, _ = flaky_run
    before = (out / ev.EPISODES_FILE).read_bytes()
    again = ev.evaluate_libero(FlakyPolicy, SUITE, out=out, **EVAL)  # everything done: nothing reruns
    assert again["overall"]["episodes_this_run"] == 0 and again["overall"]["n_episodes"] == 5
    assert (out / ev.EPISODES_FILE).read_bytes() == before
    for change, word in [({"settle_steps": 3}, "settle_steps"), ({"max_steps": 6}, "max_steps"),
                         ({"seed": 1}, "seed")]:
        with pytest.raises(OutputError, match=f"other settings.*{word}.*--overwrite"):
            ev.evaluate_libero(FlakyPolicy, SUITE, out=out, **{**EVAL, **change})
    with pytest.raises(OutputError, match="policy"):
        ev.evaluate_libero("random", SUITE, out=out, **EVAL)
    assert (out / ev.EPISODES_FILE).read_bytes() == before


# ------------------------------------------------------------------------ the CLI, killed and resumed
def test_cli_killed_resumes_without_rerunning_and_writes_only_under_out(tmp_path):
    """Run from a folder outside the repository; SIGKILL after the first episode line, rerun, compare."""
    cmd = [sys.executable, "-m", "embodied", "libero", "eval", "--suite", "spatial", "--tasks", "0", "--policy",
           "random", "--episodes-per-task", "3", "--max-steps", "150", "--settle-steps", "0", "--videos", "0",
           "--out", "out"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    episodes = tmp_path / "out" / ev.EPISODES_FILE
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not (episodes.exists() and episodes.read_bytes().count(b"\n") >= 1):
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "no episode finished in 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = episodes.read_bytes()
    n_first = first.count(b"\n")
    assert 1 <= n_first < 3, "the run ended before it was killed: make its episodes longer"
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = episodes.read_text().splitlines()
    keys = [json.loads(x)["init_state_id"] for x in lines]
    assert sorted(keys) == [0, 1, 2]  # each episode exactly once
    complete = first[: first.rfind(b"\n") + 1]
    assert episodes.read_bytes().startswith(complete)  # the finished episodes' lines are unchanged
    info = json.loads((tmp_path / "out" / ev.INFO_FILE).read_text())
    assert info["overall"]["episodes_this_run"] == 3 - n_first and info["overall"]["n_episodes"] == 3
    assert "libero_spatial/0" in run.stdout and "eval_info.json" in run.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing written beside --out (nor in cwd)


# ----------------------------------------------------------------------------------- spawned workers
def _fields(info):
    return [(r["init_state_id"], r["success"], r["steps"], r["failure"], r.get("policy_stats"))
            for r in info["per_episode"]]


@pytest.mark.slow
def test_two_workers_equal_one(tmp_path):
    kw = dict(episodes_per_task=3, task_ids=[0], max_steps=25, settle_steps=3, videos=0, progress=False)
    one = ev.evaluate_libero("scripted", SUITE, out=tmp_path / "k1", workers=1, **kw)
    two = ev.evaluate_libero("scripted", SUITE, out=tmp_path / "k2", workers=2, **kw)
    assert _fields(one) == _fields(two)
    assert all(r["policy_stats"]["min_distance"] < 0.3 for r in one["per_episode"])  # the script moved the arm


@pytest.mark.slow
def test_a_dying_worker_fails_only_its_episode(tmp_path, monkeypatch):
    (tmp_path / "crashy_policy.py").write_text(textwrap.dedent("""
        import os, signal
        import numpy as np

        class Crashy:
            def __init__(self, env):
                self.env = env
            def reset(self, seed=None):
                pass
            def act(self, obs, info):
                if self.env.init_state_id in (0, 1):
                    os.kill(os.getpid(), signal.SIGKILL)
                return np.zeros(7)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers inherit sys.path, so they import it too
    import crashy_policy

    info = ev.evaluate_libero(crashy_policy.Crashy, SUITE, out=tmp_path / "run", workers=2, episodes_per_task=3,
                              task_ids=[0], max_steps=5, settle_steps=0, videos=0, images=False, progress=False)
    # both first workers die (init states 0 and 1): only their replacements can run init state 2
    fails = {r["init_state_id"]: r["failure"] for r in info["per_episode"]}
    assert fails[0] == fails[1] == "worker: process died (killed by SIGKILL) during this episode"
    assert fails[2] == "timeout" and info["overall"]["worker_restarts"] == 2
    assert info["per_task"][0]["failures"] == {"timeout": 1, "worker": 2}


@pytest.mark.slow
def test_overwrite_starts_afresh(flaky_run, tmp_path):
    out, _ = flaky_run
    info = ev.evaluate_libero("random", SUITE, out=out, overwrite=True, **{**EVAL, "episodes_per_task": 1})
    lines = (out / ev.EPISODES_FILE).read_text().splitlines()
    assert len(lines) == 1 and info["config"]["policy"] == "random" and info["overall"]["n_episodes"] == 1
    assert json.loads(lines[0])["init_state_id"] == 0 and json.loads(lines[0])["failure"] == "timeout"


def _unbuildable(env):
    raise ValueError("weights missing\nmore")


@pytest.mark.slow
def test_a_policy_that_cannot_be_built_stops_the_run_and_leaves_no_folder(tmp_path):
    with pytest.raises(ev.PolicyBuildError, match="building it for libero_spatial/0 failed: ValueError: weights "
                                                  "missing$"):
        ev.evaluate_libero(_unbuildable, SUITE, out=tmp_path / "run", **EVAL)
    assert list(tmp_path.iterdir()) == []
