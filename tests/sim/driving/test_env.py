"""DrivingEnv: Gymnasium checks, the sim.api contract, frames, determinism and failure handling."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence

from core.errors import ConfigError
from sim.driving.registration import SCENARIOS, register

register()
SMALL = {"horizon_s": 3.0, "image_size": (48, 96), "bev_size": (32, 32)}


def _make(scenario: str, **kwargs):
    return gym.make(SCENARIOS[scenario].env_id, **{**SMALL, **kwargs}).unwrapped


def test_registration_is_light_and_idempotent():
    code = (
        "import sys; from sim.driving.registration import register, SCENARIOS; register(); register();"
        "import gymnasium as gym; assert all(s.env_id in gym.registry for s in SCENARIOS.values());"
        "assert 'highway_env' not in sys.modules and 'cv2' not in sys.modules, 'heavy import'"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)
    assert [s.env_id for s in SCENARIOS.values()] == [
        "embodied/Drive-Highway-v0",
        "embodied/Drive-Merge-v0",
        "embodied/Drive-Roundabout-v0",
        "embodied/Drive-Intersection-v0",
        "embodied/Drive-Racetrack-v0",
    ]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_check_env_and_contract(scenario):
    env = _make(scenario)
    check_env(env, skip_render_check=True)
    md = env.metadata
    assert (md["family"], md["embodiment"], md["task"]) == ("driving", "ego_car", scenario)
    desc = md["action_space_desc"]
    assert desc["dim"] == 2 and desc["semantics"] == ["acceleration", "steering"]
    assert desc["units"] == ["m/s^2", "rad"] and desc["low"] == env.action_space.low.tolist()
    assert isinstance(md["language_instruction"], str) and md["language_instruction"]
    obs, info = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    assert obs["bev"].shape == (6, 32, 32) and obs["image"].shape == (48, 96, 3)
    obs, reward, terminated, truncated, info = env.step(env.make_expert().act(obs, info))
    for key in ("success", "crashed", "offroad", "speed", "progress", "route_completion", "meta_action"):
        assert key in info
    assert info["eef_delta"].shape == (6,) and not info["eef_delta"].any()
    assert info["ego_delta"].shape == (3,) and info["ego_delta"].dtype == np.float32
    assert info["expert_waypoints"].shape == (6, 2)
    assert info["meta_action_name"] in md["meta_actions"]
    assert obs["bev"][4].any(), "ego footprint missing from the BEV"
    assert obs["bev"][0, 24, 16] == 255, "the ego should stand on drivable area"
    env.close()


def _rollout(env, seed: int, steps: int) -> list:
    obs, info = env.reset(seed=seed)
    env.action_space.seed(seed)
    out = [(obs, info)]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(
            env.action_space.sample() * np.float32([0.5, 0.05])
        )
        out.append((obs, reward, terminated, info))
        if terminated or truncated:
            break
    return out


def test_same_seed_same_rollout_and_no_cross_env_leak():
    a = _rollout(_make("highway", horizon_s=4.0), seed=7, steps=15)
    # highway-env's intersection overwrites its traffic class's IDM constants in place: building one must
    # not change a highway rollout made afterwards in the same process.
    _make("intersection").reset(seed=0)
    b = _rollout(_make("highway", horizon_s=4.0), seed=7, steps=15)
    assert len(a) == len(b) > 5
    assert data_equivalence(a, b)
    c = _rollout(_make("highway", horizon_s=4.0), seed=8, steps=15)
    assert not data_equivalence(a, c)


def test_frames_and_steering_sign():
    env = _make("highway", horizon_s=10.0, hw_config={"vehicles_count": 0})
    obs, info = env.reset(seed=0)
    x0, y0, yaw0, speed = obs["ego_state"][:4]
    assert abs(yaw0) < 1e-6 and speed == pytest.approx(25.0)
    # straight ahead: route along +x, ego_delta = speed * dt forward
    assert obs["route"][0] == pytest.approx([3.0, 0.0], abs=1e-3)
    assert np.all(np.diff(obs["route"][:, 0]) > 0)
    obs, _, _, _, info = env.step(np.array([0.0, 0.0], dtype=np.float32))
    assert info["ego_delta"] == pytest.approx([25.0 * 0.2, 0.0, 0.0], abs=1e-4)
    assert obs["ego_state"][0] - x0 == pytest.approx(5.0, abs=1e-4)
    # positive steering turns left: yaw grows counter-clockwise, the car moves to +y (world and ego)
    obs, _, _, _, info = env.step(np.array([0.0, 0.05], dtype=np.float32))
    assert info["ego_delta"][2] > 0 and info["ego_delta"][1] > 0
    assert obs["ego_state"][2] > 0 and obs["ego_state"][1] > y0
    assert obs["proprio"][2] == pytest.approx(0.05)
    # braking never reverses
    for _ in range(25):  # 25 m/s at -6 m/s^2 stops within 21 steps of 0.2 s
        obs, *_ = env.step(np.array([-6.0, 0.0], dtype=np.float32))
    assert obs["ego_state"][3] == 0.0


def test_agents_in_ego_frame():
    env = _make("highway")
    obs, _ = env.reset(seed=3)
    agents = obs["agents"]
    present = agents[agents[:, 0] == 1]
    assert len(present) > 0
    d = np.linalg.norm(present[:, 1:3], axis=1)
    assert np.all(np.diff(d) >= 0), "agents are sorted nearest first"
    ego = env.ego
    nearest = min(
        (v for v in env.hw.road.vehicles if v is not ego),
        key=lambda v: np.linalg.norm(v.position - ego.position),
    )
    # highway-env's y points right; the ego frame's y points left
    assert present[0, 1] == pytest.approx(nearest.position[0] - ego.position[0], abs=1e-3)
    assert present[0, 2] == pytest.approx(-(nearest.position[1] - ego.position[1]), abs=1e-3)


def test_nan_state_ends_episode_with_failure():
    env = _make("highway")
    obs, info = env.reset(seed=0)
    env.ego.speed = float("nan")
    obs, reward, terminated, truncated, info = env.step(np.zeros(2, dtype=np.float32))
    assert terminated and not truncated
    assert "NaN" in info["failure"]
    assert info["crashed"] is False and info["success"] is False
    assert env.observation_space.contains(obs)


def test_bad_config_raises_one_line_errors():
    with pytest.raises(ConfigError, match="unknown 'parking'"):
        gym.make(SCENARIOS["highway"].env_id, scenario="parking")
    with pytest.raises(ConfigError, match="policy_frequency"):
        _make("merge", policy_frequency=4)
    env = _make("highway")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(3, dtype=np.float32))


def test_render_returns_camera_image():
    env = _make("roundabout", render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (48, 96, 3) and frame.dtype == np.uint8
    assert np.array_equal(frame, obs["image"])
    colours = {tuple(c) for c in frame.reshape(-1, 3)}
    assert len(colours) > 3, "sky, ground, road and markings at least"
