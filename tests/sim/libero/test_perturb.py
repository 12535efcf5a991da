"""LIBERO-Plus's axes as seeded perturbations: parsing, reproducible draws, the model restored between episodes,
unsolvable draws redrawn, and `libero eval --perturb` recording each episode's draw."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from core.errors import ConfigError
from sim.libero import perturb as P


def test_parse_names_the_valid_axes_and_levels_in_one_line():
    assert P.parse_perturb("light=1, camera=2") == {"camera": 2, "light": 1}  # AXES order
    assert P.parse_perturb(None) == {} and P.parse_perturb("") == {}
    for bad, want in (("camra=2", "did you mean camera"), ("camera=5", "one of 1, 2, 3"), ("camera", "AXIS=LEVEL")):
        with pytest.raises(ConfigError, match=want) as e:
            P.parse_perturb(bad)
        assert "\n" not in str(e.value)


def test_draws_are_reproducible_from_seed_and_attempt_and_sized_by_level():
    lang = "pick up the black bowl and place it on the plate"
    a = P.draw({"camera": 2, "language": 3, "noise": 1}, 7, lang)
    assert a == P.draw({"camera": 2, "language": 3, "noise": 1}, 7, lang)
    assert a != P.draw({"camera": 2, "language": 3, "noise": 1}, 7, lang, attempt=1)
    assert json.loads(json.dumps(a)) == a  # JSON-able: episodes.jsonl holds it whole
    for lv in P.LEVELS:
        cam = P.draw({"camera": lv}, 3, lang)["params"]["camera"]
        assert np.linalg.norm(cam["shift_m"]) == pytest.approx(P.CAMERA_SHIFT_M[lv - 1], abs=1e-4)
        assert cam["turn_deg"] == P.CAMERA_TURN_DEG[lv - 1]
    words = a["params"]["language"]["instruction"]
    assert words != lang and "black bowl" in words and len(words) > len(lang)


def test_one_axis_an_episode_is_seeded_and_covers_every_axis():
    levels = {"camera": 2, "light": 1, "layout": 3}
    assert P.for_episode(levels, 5) == levels  # "all": what libero eval applies
    picks = [P.for_episode(levels, s, "one") for s in range(60)]
    assert all(len(p) == 1 and p.items() <= levels.items() for p in picks)
    assert picks == [P.for_episode(levels, s, "one") for s in range(60)]  # from the seed alone
    counts = {a: sum(a in p for p in picks) for a in levels}
    assert min(counts.values()) >= 10, counts  # every axis gets its share of a training set
    with pytest.raises(ConfigError, match="--perturb-mode: one of all, one"):
        P.for_episode(levels, 0, "each")


@pytest.fixture(scope="module")
def env():
    from sim.libero.env import LiberoEnv

    e = LiberoEnv("libero_spatial", 0, image_size=64, wrist_image=False, render_mode="rgb_array")
    yield e
    e.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_axis_changes_what_it_names_and_restore_undoes_it(env):
    obs0, _ = env.reset(seed=0, options={"init_state_id": 0})
    pt = P.Perturber(env)
    lang = env.task.language
    changed = {}
    for axis in P.AXES:
        env.reset(seed=0, options={"init_state_id": 0})
        q0 = env.sim.data._data.qpos.copy()
        pt.apply(P.draw({axis: 3}, 1, lang))
        seen = pt.observe(env._obs)["image"].astype(float)
        changed[axis] = (np.abs(seen - obs0["image"]).mean(), np.abs(env.sim.data._data.qpos - q0).max())
        if axis == "language":
            assert pt.language and pt.language != lang
    pix = {a: c[0] for a, c in changed.items()}
    state = {a: c[1] for a, c in changed.items()}
    assert all(pix[a] > 1.0 for a in ("camera", "light", "texture", "noise")), pix
    assert pix["language"] == 0.0 and state["language"] == 0.0
    assert state["robot_init"] > 0.05 and state["layout"] > 0.01  # bodies moved
    assert all(state[a] == 0.0 for a in ("camera", "light", "texture", "noise"))  # only the look changed
    pt.restore()
    obs, _ = env.reset(seed=0, options={"init_state_id": 0})
    np.testing.assert_array_equal(obs["image"], obs0["image"])  # the reused model is as it was


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_eval_records_each_draw_redraws_unsolvable_ones_and_replays(tmp_path):
    """From outside the repository: two episodes under layout level 3; each record's draw replays to the same
    state, rejected draws are listed with their reason, and a resumed run refuses other levels."""
    out = tmp_path / "ev"
    cmd = [sys.executable, "-m", "embodied", "libero", "eval", "--suite", "spatial", "--tasks", "0",
           "--episodes-per-task", "3", "--policy", "expert", "--videos", "0", "--perturb", "layout=3",
           "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": ""}
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    recs = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(recs) == 3 and all(r["perturbation"]["levels"] == {"layout": 3} for r in recs)
    assert any(r["perturbation"]["rejected"] for r in recs)  # this task's level-3 shifts collide sometimes
    assert (out / "perturbations" / "libero_spatial" / "task0.png").is_file()
    page = (out / "index.html").read_text()
    assert "layout level 3" in page
    for lv in (1, 2, 3):  # the gallery: the run's axis at every level, each on the page
        name = f"task0_layout_L{lv}.png"
        assert (out / "perturbations" / "libero_spatial" / name).is_file() and name in page
    from sim.libero.env import LiberoEnv

    r = recs[0]
    e = LiberoEnv("libero_spatial", 0, images=False)
    try:
        states = []
        for _ in range(2):
            e.reset(seed=r["seed"], options={"init_state_id": r["init_state_id"]})
            P.Perturber(e).apply(P.draw(r["perturbation"]["levels"], r["seed"], e.task.language,
                                        r["perturbation"]["attempt"]))
            states.append(e.sim.data._data.qpos.copy())
        np.testing.assert_array_equal(*states)
        assert P.draw({"layout": 3}, r["seed"], e.task.language, r["perturbation"]["attempt"])["params"] == \
            r["perturbation"]["params"]
    finally:
        e.close()
    res = subprocess.run(cmd[:-3] + ["layout=2", "--out", str(out)], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert res.returncode != 0 and "perturb" in res.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_task_whose_draws_all_fail_stops_with_one_line_and_scores_nothing(tmp_path, monkeypatch):
    """Levels too large for a scene are the user's settings, not the policy's failure: no episode is recorded."""
    from sim.libero import evaluate as ev

    monkeypatch.setattr(P, "MAX_REDRAWS", 1)
    monkeypatch.setattr(P, "PENETRATION_M", -1.0)  # every draw "interpenetrates"
    with pytest.raises(P.UnsolvablePerturbation) as e:
        ev.evaluate_libero("expert", "spatial", task_ids=[0], episodes_per_task=1, videos=0, perturb="layout=1",
                           out=tmp_path / "ev", progress=False)
    assert "\n" not in str(e.value) and "2 draws all left the task unsolvable" in str(e.value)
    assert not ev.read_episodes(tmp_path / "ev" / ev.EPISODES_FILE) if (tmp_path / "ev").exists() else True


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_reworded_instruction_reaches_an_in_process_policy(tmp_path):
    """An in-process policy reads the instruction when it is built: each episode's reworded one is what the policy
    was built with, and what the record says it got."""
    from sim.api import RandomPolicy
    from sim.libero import evaluate as ev

    seen: list[str] = []

    def factory(env):
        seen.append(env.metadata["language_instruction"])
        return RandomPolicy(env.action_space)

    info = ev.evaluate_libero(factory, "spatial", task_ids=[0], episodes_per_task=2, videos=0, max_steps=2,
                              perturb="language=3", out=tmp_path / "ev", progress=False)
    told = [r["language"] for r in info["per_episode"]]
    from sim.libero.suites import get_task

    original = get_task("spatial", 0).language
    assert all(t != original and t in seen for t in told), (told, seen, original)
    assert seen[0] == original  # built once for the task as it is, then once per new wording


def _record(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "embodied", "libero", "record", "--suite", "spatial", "--tasks", "0",
           "--image-size", "32", "--no-wrist", *flags]
    return subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_record_under_perturbations_keeps_each_demo_s_draw_frames_and_instruction(tmp_path):
    """From outside the repository: ``libero record --perturb camera=2,language=2 --perturb-mode one`` writes
    demos perturbed along one axis each; each demo's stored draw is the one its seed gives, its first frame is
    the perturbed camera's view (not the clean one), a reworded instruction is what the loader gives a policy for
    that demo, and a rerun with other perturbations is refused."""
    from core.data.trajectories import TrajectoryDataset, TrajectoryFile
    from sim.libero.env import LiberoEnv
    from sim.libero.record import NOOP_ACTION
    from sim.libero.suites import get_task

    task = get_task("libero_spatial", 0)
    flags = ["--demos-per-task", "2", "--perturb", "camera=2,language=2", "--perturb-mode", "one"]
    r = _record(tmp_path, *flags, "--out", "demos")
    assert r.returncode == 0, r.stderr[-2000:]
    path = tmp_path / "demos" / "libero_spatial" / f"{task.name}_demo.hdf5"
    with TrajectoryFile(path) as f:
        demos = {d: (f.attrs(d), f.episode(d)["obs/agentview_rgb"][0]) for d in f.episodes}
    axes = {}
    for name, (attrs, _) in demos.items():
        drawn, seed = attrs["perturbation"], int(attrs["seed"])
        assert list(drawn["levels"]) == list(P.for_episode({"camera": 2, "language": 2}, seed, "one"))
        assert drawn["params"] == P.draw(drawn["levels"], seed, task.language, drawn["attempt"])["params"]
        axes[next(iter(drawn["levels"]))] = name
    assert set(axes) == {"camera", "language"}  # seeds 0 and 1 draw one axis each (P.for_episode)
    worded = demos[axes["language"]][0]["language_instruction"]
    assert worded == demos[axes["language"]][0]["perturbation"]["params"]["language"]["instruction"] != task.language
    assert "language_instruction" not in demos[axes["camera"]][0]
    ds = TrajectoryDataset([path], obs_keys=["agentview_rgb"])
    said = {ep.name: ep.language_instruction for ep in ds.episodes}
    assert said == {axes["language"]: worded, axes["camera"]: task.bddl_language}
    attrs, first = demos[axes["camera"]]
    env = LiberoEnv(task.suite, task.index, image_size=32, wrist_image=False)
    try:
        views = []
        for perturbed in (False, True):  # the demo's placement, settled, without and with its camera draw
            env.reset(seed=int(attrs["seed"]), options={"init_state_id": "sampled"})
            pt = P.Perturber(env)
            if perturbed:
                pt.apply(attrs["perturbation"])
            for _ in range(10):
                obs, *_ = env.step(NOOP_ACTION)
            views.append(obs["image"])
            pt.restore()
    finally:
        env.close()
    np.testing.assert_array_equal(first, views[1])
    assert np.abs(first.astype(float) - views[0]).mean() > 5.0
    r = _record(tmp_path, *flags[:3], "camera=1", *flags[4:], "--out", "demos")
    assert r.returncode == 2 and "perturb" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = _record(tmp_path, "--perturb-mode", "one", "--out", "other")
    assert r.returncode == 2 and "--perturb-mode" in r.stderr and not (tmp_path / "other").exists(), r.stderr
