"""NAVSIM's PDMS / EPDMS and Bench2Drive's efficiency, comfortness and abilities on cases with known answers."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from sim.driving import pdm
from sim.driving.metrics import ability_table, comfortness, efficiency

DT = 0.2
PER = int(pdm.SCENE_S / DT)  # 20 steps a scene


def _scene(n: int = PER, speed: float = 10.0, step_m: float = 2.0, reference: float = 40.0, **changes):
    """A clean straight scene: constant speed, ``step_m`` progress a step; ``changes``: {step: {key: value}}."""
    start = {"speed": speed, "progress": 0.0, "reference_progress_m": reference, "crashed": False}
    infos = [{"speed": speed, "progress": step_m * (t + 1), "crashed": False, "offroad": False, "oncoming_m": 0.0,
              "ttc_violation": False, "lane_offset_m": 0.0, "at_junction": False, "ego_delta": np.zeros(3)}
             for t in range(n)]
    for t, update in changes.get("at", {}).items():
        infos[t].update(update)
    start.update(changes.get("start", {}))
    return infos, start


def test_a_clean_scene_scores_one():
    s = pdm.scene_scores(*_scene(), DT)
    assert all(s[k] == 1.0 for k in pdm.SUBSCORES) and s["pdms"] == 1.0 and s["epdms"] == 1.0


@pytest.mark.parametrize("fault,static,nc", [(True, False, 0.0), (True, True, 0.5), (False, False, 1.0)])
def test_no_at_fault_collision(fault, static, nc):
    infos, start = _scene(at={5: {"crashed": True, "collision_at_fault": fault,
                                  "collision_with": "static" if static else "vehicle"}})
    s = pdm.scene_scores(infos, start, DT)
    assert s["nc"] == nc and s["pdms"] == pytest.approx(nc)


def test_leaving_the_drivable_area_zeroes_pdms_unless_the_reference_leaves_it_too():
    infos, start = _scene(at={7: {"offroad": True}})
    s = pdm.scene_scores(infos, start, DT)
    assert s["dac"] == 0.0 and s["pdms"] == 0.0 and s["epdms"] == 0.0
    s = pdm.scene_scores(infos, {**start, "reference_offroad": True}, DT)  # the expert leaves it too: voided
    assert s["dac"] == 0.0 and s["pdms"] == 0.0 and s["epdms"] == 1.0


def test_time_to_collision_below_bound():
    s = pdm.scene_scores(*_scene(at={3: {"ttc_violation": True}}), DT)
    assert s["ttc"] == 0.0 and s["pdms"] == pytest.approx((5 * 0 + 5 * 1 + 2 * 1) / 12)
    assert s["epdms"] == pytest.approx((5 * 0 + 5 + 2 + 2 + 2) / 16)


def test_zero_progress_and_a_planner_that_would_not_move_either():
    s = pdm.scene_scores(*_scene(step_m=0.0, speed=0.0), DT)
    assert s["ep"] == 0.0 and s["pdms"] == pytest.approx((5 + 0 + 2) / 12)
    s = pdm.scene_scores(*_scene(step_m=0.0, speed=0.0, reference=3.0), DT)  # below EP_MIN_REFERENCE_M
    assert s["ep"] == 1.0 and s["pdms"] == 1.0
    s = pdm.scene_scores(*_scene(step_m=1.0), DT)  # half the planner's progress
    assert s["ep"] == pytest.approx(0.5)
    s = pdm.scene_scores(*_scene(n=5, step_m=2.0), DT)  # a 1 s last scene compares with 1 s of the planner's
    assert s["ep"] == pytest.approx(1.0)
    s = pdm.scene_scores(*_scene(step_m=1.0), DT, route_length_m=20.0)  # the route ends after 20 m
    assert s["ep"] == pytest.approx(1.0)


def test_driving_direction_lane_keeping_and_comfort():
    assert pdm.scene_scores(*_scene(at={2: {"oncoming_m": 1.5}}), DT)["ddc"] == 1.0
    assert pdm.scene_scores(*_scene(at={2: {"oncoming_m": 1.5}, 3: {"oncoming_m": 1.5}}), DT)["ddc"] == 0.5
    assert pdm.scene_scores(*_scene(at={t: {"oncoming_m": 2.0} for t in range(4)}), DT)["ddc"] == 0.0
    off = {t: {"lane_offset_m": 0.8} for t in range(11)}  # 2.2 s off-centre in a row
    assert pdm.scene_scores(*_scene(at=off), DT)["lk"] == 0.0
    assert pdm.scene_scores(*_scene(at={t: {"lane_offset_m": 0.8} for t in range(10)}), DT)["lk"] == 1.0  # 2.0 s
    assert pdm.scene_scores(*_scene(at={t: {"lane_offset_m": 0.8, "at_junction": True} for t in range(11)}),
                            DT)["lk"] == 1.0
    brake = {t: {"speed": max(10.0 - 2.0 * (t - 4), 0.0)} for t in range(5, 20)}  # -10 m/s^2
    s = pdm.scene_scores(*_scene(at=brake), DT)
    assert s["c"] == 0.0 and s["hc"] == 0.0 and s["pdms"] == pytest.approx(10 / 12)
    assert pdm.comfortable([10.0] * 8, [0.0] * 8, DT)
    assert not pdm.comfortable([10.0] * 8, [1.2] * 8, DT)  # yaw rate above 0.95 rad/s
    assert pdm.scene_scores(*_scene(), DT, failed=True)["pdms"] == 0.0


def test_scores_are_per_scene_then_averaged():
    """Two scenes failing one multiplier each: the score is 0, although each averaged sub-score is 0.5."""
    a = pdm.scene_scores(*_scene(at={1: {"crashed": True, "collision_at_fault": True}}), DT)
    b = pdm.scene_scores(*_scene(at={1: {"offroad": True}}), DT)
    m = pdm.mean_scores([a, b])
    assert m["pdms"] == 0.0 and m["nc"] == 0.5 and m["dac"] == 0.5 and m["scenes"] == 2


def test_an_episode_is_cut_into_4s_scenes_each_starting_where_the_last_ended():
    infos, start = _scene(n=45)
    for t in range(45):
        infos[t]["reference_progress_m"] = 40.0 if (t + 1) % PER == 0 else None
    scenes = pdm.episode_scenes(infos, start, DT)
    assert len(scenes) == 3 and all(s["ep"] == pytest.approx(1.0) for s in scenes)
    assert [s["pdms"] for s in pdm.episode_scenes(infos, start, DT, failure_step=30)] == [1.0, 0.0, 0.0]


def test_collision_fault_follows_nuplans_rules():
    assert pdm.collision_fault(0.0, (5.0, 0.0), 0.0) == ("stopped_ego", False)
    assert pdm.collision_fault(10.0, (-5.0, 0.2), 0.0) == ("rear", False)
    assert pdm.collision_fault(10.0, (5.0, 0.5), 0.0) == ("front", True)
    assert pdm.collision_fault(10.0, (0.5, 2.0), 0.2) == ("lateral", False)  # side-swiped in its lane
    assert pdm.collision_fault(10.0, (0.5, 2.0), 1.6) == ("lateral", True)  # while changing lanes


def test_ttc_projects_both_at_constant_velocity():
    ego = np.array([0.0, 0.0, 0.0, 5.0, 2.0])
    car = lambda x, y=0.0, h=0.0: [x, y, h, 5.0, 2.0]  # noqa: E731
    assert pdm.ttc_violation(ego, [10.0, 0.0], np.array([car(8.0)]), np.zeros((1, 2)))  # 3 m gap at 10 m/s
    assert not pdm.ttc_violation(ego, [10.0, 0.0], np.array([car(30.0)]), np.zeros((1, 2)))
    assert not pdm.ttc_violation(ego, [10.0, 0.0], np.array([car(8.0)]), np.array([[10.0, 0.0]]))  # same speed
    assert not pdm.ttc_violation(ego, [0.0, 0.0], np.array([car(6.0)]), np.zeros((1, 2)))  # standing ego
    assert not pdm.ttc_violation(ego, [10.0, 0.0], np.array([car(-7.0)]), np.array([[20.0, 0.0]]))  # from behind
    assert not pdm.ttc_violation(ego, [10.0, 0.0], np.array([car(8.0, 4.0)]), np.zeros((1, 2)))  # next lane
    assert pdm.boxes_overlap(ego, np.array([car(3.4, 0.0, np.pi / 2)]))[0]  # its side reaches x = 2.4
    assert not pdm.boxes_overlap(ego, np.array([car(3.6, 0.0, np.pi / 2)]))[0]
    assert not pdm.boxes_overlap(ego, np.array([car(5.1, 0.0, 0.0)]))[0]


def test_bench2drive_efficiency_comfortness_and_abilities():
    assert efficiency([10.0] * 10, [20.0] * 10, DT) == pytest.approx(0.5)
    assert np.isnan(efficiency([10.0] * 10, [float("nan")] * 10, DT))
    assert comfortness([10.0] * 11, [0.0] * 11, DT) == 1.0
    v = [10.0] * 6 + [10.0 - 2.0 * k for k in range(1, 6)]  # comfortable 1 s, then braking at -10 m/s^2
    assert comfortness(v, [0.0] * len(v), DT) == pytest.approx(0.5)
    t = ability_table({"merge": [True, False], "roundabout": [True], "intersection": [False]})
    assert t["merging"]["success_rate"] == 0.5 and t["give_way"] == {
        "scenarios": ["roundabout", "intersection"], "episodes": 2, "success_rate": 0.5}
    assert t["overtaking"]["success_rate"] is None and t["traffic_sign"]["reason"]


def test_the_env_records_what_the_scores_need():
    import sim

    sim.register_envs()
    env = gym.make("embodied/Drive-Highway-v0", image_size=16)
    obs, info = env.reset(seed=0)
    first = info
    expert = env.unwrapped.make_expert()
    expert.reset(seed=0)
    assert np.isfinite(info["reference_progress_m"]) and info["reference_progress_m"] > 50  # ~25 m/s x 4 s
    infos = []
    for _ in range(PER):
        obs, _, term, trunc, i = env.step(expert.act(obs, info))
        infos.append(i)
        info = i
    env.close()
    assert all(i["reference_progress_m"] is None for i in infos[:-1]) and np.isfinite(infos[-1]["reference_progress_m"])
    for key in ("ttc_violation", "oncoming_m", "lane_offset_m", "at_junction", "neighbour_speed_mps"):
        assert key in infos[0]
    s = pdm.scene_scores(infos, first, DT)  # the expert against its own 4 s look-ahead
    assert s["ddc"] == 1.0 and s["dac"] == 1.0 and s["nc"] == 1.0 and s["ep"] > 0.9


@pytest.mark.slow
def test_drive_eval_json_has_every_figure(tmp_path, capsys):
    from embodied.cli import main

    assert main(["drive", "eval", "--policy", "idm", "--scenario", "merge", "--episodes", "1", "--no-video",
                 "--json", "--out", str(tmp_path / "d")]) == 0
    report = json.loads(capsys.readouterr().out)
    overall = report["overall"]
    for key in ("driving_score", "success_rate", "pdms", "epdms", "efficiency", "comfortness", "pdm_nc", "pdm_ep"):
        assert key in overall and overall[key] == overall[key]  # present, not NaN
    assert overall["pdms"] > 0.5  # the expert drives the merge cleanly
    assert report["abilities"]["merging"]["episodes"] == 1 and "tlc" in report["not_computable"]
    assert report["latency"]["latency_ms_p50"] >= 0


def test_vectorised_ttc_equals_the_step_by_step_projection():
    """The pre-filtered, all-steps-at-once test agrees with projecting every vehicle step by step."""
    rng = np.random.default_rng(0)

    def reference(ego, v, boxes, vels):
        forward = np.array([np.cos(ego[2]), np.sin(ego[2])])
        keep = ((boxes[:, :2] - ego[:2]) @ forward > 0) & ~pdm.boxes_overlap(ego, boxes)
        for t in np.arange(1, 10) * 0.1:
            e = ego.copy()
            e[:2] += v * t
            moved = boxes[keep].copy()
            moved[:, :2] += vels[keep] * t
            if pdm.boxes_overlap(e, moved).any():
                return True
        return False

    hits = 0
    for _ in range(300):
        ego = np.array([0.0, 0.0, rng.uniform(-np.pi, np.pi), 5.0, 2.0])
        v = rng.uniform(0, 25) * np.array([np.cos(ego[2]), np.sin(ego[2])])
        boxes = np.column_stack([rng.uniform(-30, 30, (6, 2)), rng.uniform(-np.pi, np.pi, 6), np.full(6, 5.0),
                                 np.full(6, 2.0)])
        vels = rng.uniform(-15, 15, (6, 2))
        expected = reference(ego, v, boxes, vels)
        hits += expected
        assert pdm.ttc_violation(ego, v, boxes, vels) == expected
    assert 10 < hits < 290  # both answers occur
