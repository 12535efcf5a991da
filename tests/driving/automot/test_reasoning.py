"""Scene language of AutoMoT: facts, reasoning and QA answers checked on hand-built scenes."""

from __future__ import annotations

import numpy as np
import pytest

from driving.automot.reasoning import (
    META_ACTIONS,
    describe_scene,
    navigation_instruction,
    reasoning_text,
    road_direction,
    scene_qa,
    speed_bucket,
)
from sim.driving import expert


def straight_route(k: int = 20, spacing: float = 3.0) -> np.ndarray:
    return np.stack([spacing * np.arange(1, k + 1), np.zeros(k)], axis=1).astype(np.float32)


def arc_route(turn: str, straight_m: float = 30.0, radius: float = 15.0, k: int = 20, spacing: float = 3.0):
    """Straight for ``straight_m`` then a circular arc to the ``turn`` side, sampled every ``spacing`` m."""
    sign = 1.0 if turn == "left" else -1.0
    pts = []
    for i in range(1, k + 1):
        s = spacing * i
        if s <= straight_m:
            pts.append((s, 0.0))
        else:
            a = (s - straight_m) / radius
            pts.append((straight_m + radius * np.sin(a), sign * radius * (1 - np.cos(a))))
    return np.asarray(pts, dtype=np.float32)


def scene(vehicles=(), speed: float = 20.0, route=None, n_agents: int = 8, bev=None) -> dict:
    """An observation: ``vehicles`` as (x, y, vx) ego-frame rows."""
    agents = np.zeros((n_agents, 8), np.float32)
    for i, (x, y, vx) in enumerate(vehicles):
        agents[i] = [1, x, y, vx, 0, 0, 5, 2]
    obs = {
        "agents": agents,
        "route": straight_route() if route is None else route,
        "ego_state": np.array([0, 0, 0, speed, 0, 0, 0, 0, 0], np.float32),
        "proprio": np.array([speed, 0, 0, 0], np.float32),
    }
    if bev is not None:
        obs["bev"] = bev
    return obs


def info(action: str) -> dict:
    return {"meta_action": META_ACTIONS.index(action), "meta_action_name": action, "speed": 20.0}


def answers(obs, action="keep_lane", seed=0) -> dict[str, str]:
    return dict(scene_qa(obs, info(action), np.random.default_rng(seed)))


def answer(qa: dict[str, str], words: str) -> str:
    (key,) = [q for q in qa if words in q]
    return qa[key]


def test_meta_actions_are_the_experts():
    assert META_ACTIONS is expert.META_ACTIONS


def test_lead_vehicle_and_reasoning_facts():
    obs = scene([(12.0, 0.0, 16.0), (-20.0, 4.0, 25.0)])
    f = describe_scene(obs)
    assert f.lead_distance == pytest.approx(12.0) and f.lead_speed == pytest.approx(16.0)
    assert answer(answers(obs, "slow_down"), "lead vehicle") == "12"
    assert (
        reasoning_text(obs, info("slow_down")) == "slow down: a vehicle 12 m ahead in my lane is 4 m/s slower"
    )
    assert reasoning_text(obs, info("keep_lane")) == "keep lane: following a vehicle 12 m ahead at 16 m/s"


def test_no_lead_and_clear_road():
    obs = scene([(12.0, 4.1, 16.0), (-6.0, 0.0, 20.0)])  # one in the left lane, one behind in mine
    qa = answers(obs)
    assert answer(qa, "lead vehicle") == "none"
    assert describe_scene(obs).lead_distance is None
    assert reasoning_text(obs, info("keep_lane")) == "keep lane: road clear for 100 m"
    assert answer(answers(scene([(70.0, 0.0, 10.0)])), "lead vehicle") == "none"  # beyond the 50 m range


def test_side_lanes():
    obs = scene([(5.0, 4.0, 20.0), (40.0, 0.0, 10.0)])  # left lane occupied beside me, right lane empty
    qa = answers(obs)
    assert answer(qa, "left lane") == "no"
    assert answer(qa, "right lane") == "yes"
    obs = scene([(20.0, 0.0, 10.0), (45.0, -4.0, 20.0)])
    assert reasoning_text(obs, info("change_right")) == (
        "change right: a vehicle 20 m ahead in my lane is 10 m/s slower and the right lane is free for 45 m"
    )
    # A vehicle 40 m ahead in the left lane is outside the [-10, 30] m window: the lane is free.
    assert answer(answers(scene([(40.0, 4.0, 20.0)])), "left lane") == "yes"


def test_side_lane_must_exist_in_the_bev():
    bev = np.zeros((6, 64, 64), np.uint8)
    bev[0, :, 30:35] = 255  # only my own lane is drivable (ego at column 32)
    bev[0, :, 35:39] = 255  # ... and the lane to my right (y = -4 m -> column 36)
    qa = answers(scene(bev=bev))
    assert answer(qa, "left lane") == "no"
    assert answer(qa, "right lane") == "yes"


def test_counts_respect_what_the_table_covers():
    obs = scene([(5.0, 0.0, 20.0), (-8.0, 4.0, 20.0), (25.0, -4.0, 20.0)])  # distances 5, 8.9, 25.3
    for seed in range(8):
        qa = answers(obs, seed=seed)
        (q,) = [q for q in qa if q.startswith("How many")]
        radius = float(q.split("within ")[1].split(" m")[0])
        assert qa[q] == str(sum(d < radius for d in (5.0, np.hypot(8, 4), np.hypot(25, 4))))
    full = scene(
        [(3.0 + i, 4.0 * (i % 2), 20.0) for i in range(8)]
    )  # the table is full: 8 nearest, max ~10.8 m
    f = describe_scene(full)
    assert np.isfinite(f.known_radius)
    qa = answers(full)
    (q,) = [q for q in qa if q.startswith("How many")]
    assert q == "How many vehicles are within 10 m of me?" and qa[q] == "7"
    assert answer(qa, "lead vehicle") == "3"


def test_speed_bucket_meta_action_and_determinism():
    qa = answers(scene(speed=0.3), "stop")
    assert answer(qa, "How fast") == "stopped" and speed_bucket(30.0) == "fast"
    assert answer(qa, "meta-action") == "stop"
    obs = scene([(12.0, 0.0, 16.0)])
    a = scene_qa(obs, info("keep_lane"), np.random.default_rng(3))
    assert a == scene_qa(obs, info("keep_lane"), np.random.default_rng(3))
    b = scene_qa(obs, info("keep_lane"), np.random.default_rng(4))  # another order (and counting radius)
    same = lambda qa: sorted(p for p in qa if not p[0].startswith("How many"))  # noqa: E731
    assert len(a) == len(b) == 7 and same(a) == same(b)
    assert all(len(ans.split()) <= 2 for _, ans in a)


@pytest.mark.parametrize("turn", ["left", "right"])
def test_instruction_and_road_direction_follow_the_route(turn):
    route = arc_route(turn)
    direction, at = road_direction(route)
    assert direction == turn and 30.0 <= at <= 40.0
    obs = scene(route=route)
    text = navigation_instruction(obs, info("keep_lane"), "intersection")
    assert text.startswith(f"Turn {turn} in 35 m.") and "intersection" in text
    assert answer(answers(obs), "road ahead") == turn
    straight = navigation_instruction(scene(), info("keep_lane"), "highway")
    assert (
        straight.startswith("Follow the road straight ahead")
        and answer(answers(scene()), "road ahead") == "straight"
    )


def test_lane_assignment_follows_a_curved_road():
    route = arc_route("left", straight_m=0.0, radius=30.0)
    # A vehicle on my lane's centreline 20 m of arc ahead on a left bend (its ego-frame y is far from 0).
    a = 20.0 / 30.0
    x, y = 30.0 * np.sin(a), 30.0 * (1 - np.cos(a))
    f = describe_scene(scene([(x, y, 10.0)], route=route))
    assert f.lead_distance == pytest.approx(20.0, abs=0.5)
