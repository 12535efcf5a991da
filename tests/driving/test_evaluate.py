"""`embodied drive eval`: paired closed-loop episodes, scored and recorded; failing policies; reports."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.checkpoint import require_checkpoint
from core.data.trajectories import TrajectoryFile
from core.errors import ConfigError
from core.registry import POLICIES
from driving.evaluate import evaluate_policy
from embodied.cli import main
from sim.policies import parse_policy_args, parse_value


class CrashyPolicy:
    """Raises at step ``fail_step`` of episode 0, returns NaN in episode 1, drives straight afterwards."""

    def __init__(self, env, fail_step: int = 3, label: str = "keep_lane"):
        self.fail_step, self.label = fail_step, label
        self.episode, self.t = -1, 0

    def reset(self, seed=None):
        self.episode += 1
        self.t = 0

    def act(self, obs, info):
        t, self.t = self.t, self.t + 1
        if self.episode == 0 and t == self.fail_step:
            raise RuntimeError(f"boom at step {t}\nsecond line")
        if self.episode == 1:
            return np.array([np.nan, 0.0])
        if self.episode == 3:
            return np.zeros(3)  # wrong shape
        return np.zeros(2)

    def overlay(self):
        return {"waypoints": np.array([[5.0, 0.0], [10.0, 0.5], [15.0, 1.0]]), "meta_action": self.label}


def _bad_build(env, **kwargs):
    raise ValueError("no weights here")


def checkpoint_style(env, checkpoint=None):
    require_checkpoint(checkpoint, "_test_ckptstyle")
    return CrashyPolicy(env)


POLICIES.register("_test_crashy", CrashyPolicy, overwrite=True)
POLICIES.register("_test_badbuild", _bad_build, overwrite=True)
POLICIES.register("_test_ckptstyle", checkpoint_style, overwrite=True)


@pytest.mark.timeout(600)
def test_expert_outscores_constant_on_paired_seeds(tmp_path):
    idm = evaluate_policy("idm", "highway", episodes=2, out=tmp_path / "idm", seed=3, video=False)
    const = evaluate_policy("constant", "highway", episodes=2, out=tmp_path / "const", seed=3, video=False)
    assert [r["seed"] for r in idm["episodes"]] == [r["seed"] for r in const["episodes"]] == [3, 4]
    assert idm["aggregate"]["collision_rate"] == 0.0
    assert idm["aggregate"]["progress_m"] > 0
    # Strict and paired: the expert wins on every seed, not just on average and not by a tie (two runs of one
    # policy, or an evaluator that scores everything 0, would tie). Lane keeping at constant speed crashes
    # into the traffic ahead on these seeds, so the comparison is not vacuous.
    assert const["aggregate"]["collision_rate"] > 0
    for e_idm, e_const in zip(idm["episodes"], const["episodes"], strict=True):
        assert e_idm["driving_score"] > e_const["driving_score"], (e_idm, e_const)
    assert idm["aggregate"]["success_rate"] > const["aggregate"]["success_rate"]
    assert idm["aggregate"]["driving_score"] > const["aggregate"]["driving_score"]
    saved = json.loads((tmp_path / "idm" / "highway" / "metrics.json").read_text())
    assert saved["aggregate"] == pytest.approx(idm["aggregate"])
    hdf5 = next((tmp_path / "idm" / "highway").glob("*.hdf5"))
    with TrajectoryFile(hdf5) as f:  # driving logs in the shared trajectory format
        assert len(f.episodes) == 2
        assert f.attrs("demo_0")["embodiment"] == "ego_car"


def test_short_paired_episodes(tmp_path):
    """Fast paired check: 8 s highway episodes with the same seeds for both policies, scored without failures."""
    kw = dict(episodes=2, seed=3, video=False, env_kwargs={"horizon_s": 8.0}, progress=False)
    idm = evaluate_policy("idm", "highway", out=tmp_path / "idm", **kw)
    const = evaluate_policy("constant", "highway", out=tmp_path / "const", **kw)
    assert [r["seed"] for r in idm["episodes"]] == [r["seed"] for r in const["episodes"]] == [3, 4]
    assert idm["aggregate"]["collision_rate"] == 0.0 and idm["aggregate"]["failure_rate"] == 0.0
    for a, b in zip(idm["episodes"], const["episodes"], strict=True):
        assert a["failure"] is None and a["steps"] == 40 and a["success"]
        assert a["driving_score"] == pytest.approx(a["route_completion"]) and a["driving_score"] > 0.8
        assert b["route_length_m"] == a["route_length_m"] == pytest.approx(25.0 * 8.0)


def test_crashing_policy_fails_episodes_and_run_continues(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["drive", "eval", "--policy", "_test_crashy", "--scenario", "highway", "--episodes", "4",
                 "--horizon-s", "2", "--videos", "1", "--policy-arg", "fail_step=3",
                 "--policy-arg", "label=slow_down", "--out", str(out), "--seed", "7"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "highway" / "episodes.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == [7, 8, 9, 10]
    r0, r1, r2, r3 = rows
    assert r0["failure"] == "step 3: policy raised RuntimeError: boom at step 3"
    assert r0["steps"] == 4 and r0["driving_score"] == 0.0 and not r0["success"]
    assert r1["failure"].startswith("step 0: policy returned a non-finite action")
    assert r1["driving_score"] == 0.0 and r1["steps"] == 1
    assert r2["failure"] is None and r2["steps"] == 10  # the policy was reset and drives on
    assert r2["driving_score"] > 0 and r2["success"]
    assert r3["failure"] == "step 0: policy returned an action of shape (3,), expected (2,)"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["failure_rate"] == pytest.approx(0.75)
    assert summary["overall"]["driving_score"] == pytest.approx(r2["driving_score"] / 4)
    assert summary["policy_args"] == {"fail_step": 3, "label": "slow_down"}
    assert (out / "highway" / "videos" / "episode_0.mp4").stat().st_size > 0
    assert not (out / "highway" / "videos" / "episode_1.mp4").exists()
    page = (out / "index.html").read_text()
    assert 'src="highway/videos/episode_0.mp4"' in page and "boom at step 3" in page
    assert "| highway |" in (out / "summary.md").read_text()
    with TrajectoryFile(next((out / "highway").glob("*.hdf5"))) as f:
        assert len(f.episodes) == 4


def test_policy_that_cannot_be_built_fails_the_run_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["drive", "eval", "--policy", "_test_badbuild", "--out", str(out), "--no-video"]) == 2
    err = capsys.readouterr().err
    assert "building the policy failed: ValueError: no weights here" in err and err.count("\n") == 1
    assert not out.exists()
    # an unknown factory keyword is refused before anything runs, naming what the factory takes
    assert main(["drive", "eval", "--policy", "_test_crashy", "--policy-arg", "nonsense=1", "--out", str(out),
                 "--no-video", "--horizon-s", "1"]) == 2
    err = capsys.readouterr().err
    assert "--policy-arg nonsense: the _test_crashy policy takes no option 'nonsense'" in err and "TypeError" not in err
    assert not out.exists()


class _ManipulationPolicy:
    """Declares the spaces of a manipulation policy (``expects``); acting would fail the test."""

    def __init__(self, env):
        from sim.api import PolicySpec

        self.expects = PolicySpec({"image": (None, None, 3), "wrist_image": (None, None, 3)}, (7,), source="arm")

    def reset(self, seed=None):
        pass

    def act(self, obs, info):
        raise AssertionError("acted before its spaces were checked")


def test_policy_of_other_spaces_is_refused_before_driving(tmp_path):
    """The guard around a driving policy passes its ``expects`` on, so ``sim.rollout`` checks it (issue 33)."""
    from core.errors import CheckpointError

    with pytest.raises(CheckpointError) as e:
        evaluate_policy(_ManipulationPolicy, "highway", episodes=1, out=tmp_path / "run", video=False)
    assert str(e.value) == (
        "policy arm does not fit env embodied/Drive-Highway-v0: observation 'wrist_image' (?, ?, 3): policy reads "
        "it, env has no such key (its keys: agents, bev, ego_state, image, proprio, route); "
        "action: policy (7,), env (2,)")
    assert not list((tmp_path / "run").rglob("*.hdf5")) and not (tmp_path / "run" / "summary.json").exists()


def test_scenario_all_writes_every_file(tmp_path):
    out = tmp_path / "all"
    assert main(["drive", "eval", "--policy", "_test_crashy", "--policy-arg", "fail_step=1000", "--scenario",
                 "all", "--episodes", "1", "--horizon-s", "1", "--videos", "1", "--out", str(out)]) == 0
    names = ["highway", "merge", "roundabout", "intersection", "racetrack"]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["scenarios"]) == sorted(names) and summary["overall"]["episodes"] == 5
    md = (out / "summary.md").read_text()
    page = (out / "index.html").read_text()
    for name in names:
        assert (out / name / "episodes.jsonl").exists() and (out / name / "metrics.json").exists()
        assert next((out / name).glob("*.hdf5")).stat().st_size > 0
        assert (out / name / "videos" / "episode_0.mp4").exists()
        assert f'src="{name}/videos/episode_0.mp4"' in page
        assert f"| {name} |" in md
    assert "| overall |" in md
    # finite routes not completed within 1 s are timeouts; open-ended ones survive
    rows = {n: json.loads((out / n / "episodes.jsonl").read_text()) for n in names}
    assert rows["merge"]["timed_out"] and not rows["highway"]["timed_out"]
    assert rows["merge"]["driving_score"] == pytest.approx(rows["merge"]["route_completion"] * 0.7)


def test_policy_args_parsing():
    assert parse_policy_args(["update_interval=2", "refiner=true", "checkpoint=/a/b=c", "x=0.5", "y=None"]) == {
        "update_interval": 2, "refiner": True, "checkpoint": "/a/b=c", "x": 0.5, "y": None}
    assert parse_value("False") is False and parse_value("1e-3") == 1e-3 and parse_value("abc") == "abc"
    for bad in (["noequals"], ["=3"], ["1a=2"], ["a=1", "a=2"]):
        with pytest.raises(ConfigError, match="--policy-arg"):
            parse_policy_args(bad)


def test_cli_errors(tmp_path, capsys):
    assert main(["drive", "eval", "--policy", "idm", "--scenario", "highwy", "--out", str(tmp_path / "a")]) == 2
    assert "unknown scenario 'highwy'" in capsys.readouterr().err
    assert main(["drive", "eval", "--policy", "nope", "--scenario", "highway", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "neither a policy name nor an existing checkpoint" in err and "_test_crashy" in err
    assert "names: expert, scripted, idm, constant, random" in err
    assert err.count("\n") == 1
    assert main(["drive", "eval", "--policy", "_test_ckptstyle", "--out", str(tmp_path / "c")]) == 2
    assert "pass the checkpoint folder" in capsys.readouterr().err
    assert main(["drive", "eval", "--policy", "idm", "--policy-arg", "oops", "--out", str(tmp_path / "d")]) == 2
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_overlay_projection_matches_the_camera():
    """A waypoint on the ground just in front of a car projects onto the car's pixels in the rendered frame."""
    import gymnasium as gym

    import sim
    from driving.report import overlay_frames, project_ego_points

    sim.register_envs()
    env = gym.make("embodied/Drive-Highway-v0")
    env.reset(seed=0)
    rast = env.unwrapped.rasterizer
    box = np.array([[20.0, 0.0, 0.0, 5.0, 2.0]])  # highway-env frame, ego at the origin heading +x
    img = rast.camera(np.zeros(2), 0.0, box, np.array([False]))
    env.close()
    u, v = project_ego_points(np.array([[17.6, 0.0], [17.6, 0.9]]), img.shape[:2])[0]
    r, g, b = img[int(v) - 2, int(round(u))].astype(int)
    assert b > r + 40, (u, v, (r, g, b))  # the car's flat-shaded blue, not road grey
    assert abs(u - img.shape[1] / 2) < 1.0
    behind = project_ego_points(np.array([[-3.0, 0.0]]), img.shape[:2])
    assert np.isnan(behind).all()
    frames = np.stack([img, img])
    ov = {"waypoints": np.array([[10.0, 0.0], [20.0, 0.0]]), "meta_action": "slow_down"}
    drawn = overlay_frames(frames, [ov], failure="boom")
    plain = overlay_frames(frames, None)
    assert drawn.shape == (2, img.shape[0] * 2, img.shape[1] * 2, 3)
    assert (drawn[0] != plain[0]).any() and (drawn[1] != plain[1]).any()  # waypoints; failure footer
