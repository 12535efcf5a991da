"""Manipulation suite: Gymnasium API compliance, the sim.api contract, seeding and failure handling."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sim
from core.errors import ConfigError
from sim.manipulation.registration import EMBODIMENTS, env_ids

sim.register_envs()


def _make(env_id: str, **kwargs) -> gym.Env:
    return gym.make(env_id, **kwargs)


def test_suite_covers_five_arms_and_a_hand_with_different_action_spaces():
    assert len(EMBODIMENTS) >= 6
    dims = {e.action_dim for e in EMBODIMENTS.values()}
    controllers = {e.controller for e in EMBODIMENTS.values()}
    assert {4, 7, 8, 12} <= dims
    assert {"OSC_POSE", "OSC_POSITION", "JOINT_POSITION"} <= controllers
    assert any(len(e.hand_dims) > 1 for e in EMBODIMENTS.values())
    assert len(env_ids()) == 2 * len(EMBODIMENTS)


@pytest.mark.parametrize("env_id", env_ids())
def test_check_env_and_contract(env_id):
    env = _make(env_id, image_size=32)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        meta = env.unwrapped.metadata
        assert meta["family"] == "manipulation"
        assert meta["task"] in ("reach", "lift")
        assert meta["embodiment"] in {e.name for e in EMBODIMENTS.values()}
        desc = meta["action_space_desc"]
        assert desc["dim"] == env.action_space.shape[0] == len(desc["semantics"]) == len(desc["units"])
        assert len(desc["low"]) == len(desc["high"]) == desc["dim"] and desc["frame"]
        assert meta["proprio_desc"]["dim"] == env.observation_space["proprio"].shape[0]
        obs, info = env.reset(seed=0)
        assert obs["image"].shape == (32, 32, 3) and obs["image"].dtype == np.uint8
        assert obs["image"].std() > 5  # a real rendered scene, not a blank frame
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert isinstance(info["success"], bool) and "failure" not in info
        assert info["eef_delta"].shape == (6,) and info["eef_delta"].dtype == np.float32
    finally:
        env.close()


def test_image_is_upright_table_at_the_bottom():
    env = _make("embodied/Reach-Panda-v0", image_size=64)
    try:
        obs, _ = env.reset(seed=0)
        img = obs["image"].astype(float)
        # agentview looks down at the bright table top: the bottom rows are the table, brighter than the top
        assert img[-8:].mean() > img[:8].mean()
    finally:
        env.close()


def test_same_seed_same_rollout_and_different_seed_differs():
    def run(seed: int) -> tuple[np.ndarray, np.ndarray]:
        env = _make("embodied/Lift-Sawyer-v0", image_size=32)
        try:
            obs, info = env.reset(seed=seed)
            env.action_space.seed(123)
            frames, props = [obs["image"]], [obs["proprio"]]
            for _ in range(10):
                obs, *_ = env.step(env.action_space.sample())
                frames.append(obs["image"])
                props.append(obs["proprio"])
            return np.stack(frames), np.stack(props)
        finally:
            env.close()

    f1, p1 = run(7)
    f2, p2 = run(7)
    f3, p3 = run(8)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(f1, f2)
    assert not np.array_equal(p1, p3)


def test_reset_seed_makes_repeated_resets_identical_in_one_env():
    env = _make("embodied/Lift-IIWA-v0", image_size=0)
    try:
        a, _ = env.reset(seed=3)
        env.step(env.action_space.sample())
        b, _ = env.reset(seed=3)
        np.testing.assert_array_equal(a["proprio"], b["proprio"])
        np.testing.assert_array_equal(env.unwrapped.cube_pos(), env.unwrapped.cube_pos())
    finally:
        env.close()


def test_eef_delta_matches_end_effector_motion():
    env = _make("embodied/Reach-Panda-v0", image_size=0)
    try:
        env.reset(seed=0)
        pos0, _ = env.unwrapped.eef_pose()
        action = np.zeros(7, dtype=np.float32)
        action[2] = 1.0  # +z in the base frame = world up
        _, _, _, _, info = env.step(action)
        pos1, _ = env.unwrapped.eef_pose()
        np.testing.assert_allclose(info["eef_delta"][:3], pos1 - pos0, atol=1e-6)
        assert info["eef_delta"][2] > 0.003
    finally:
        env.close()


def test_nan_in_qpos_ends_episode_with_failure():
    env = _make("embodied/Lift-Kinova3-v0", image_size=32)
    try:
        env.reset(seed=0)
        env.unwrapped.sim_data.qpos[0] = np.nan
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert terminated and not truncated
        assert "NaN in qpos" in info["failure"]
        assert env.observation_space.contains(obs)
        # the episode stays failed until the next reset, which recovers
        _, _, terminated, _, info = env.step(env.action_space.sample())
        assert terminated and "failure" in info
        _, info = env.reset(seed=0)
        assert "failure" not in info
        _, _, terminated, _, info = env.step(np.zeros(env.action_space.shape, dtype=np.float32))
        assert "failure" not in info
    finally:
        env.close()


def test_exploding_velocity_is_reported_not_raised():
    env = _make("embodied/Reach-UR5e-v0", image_size=0)
    try:
        env.reset(seed=0)
        env.unwrapped.sim_data.qvel[:] = np.inf
        _, _, terminated, _, info = env.step(env.action_space.sample())
        assert terminated and info["failure"].startswith("physics diverged")
    finally:
        env.close()


def test_state_only_variant_has_no_image_and_bad_args_are_config_errors():
    env = _make("embodied/Reach-Sawyer-v0", image_size=0)
    try:
        obs, _ = env.reset(seed=0)
        assert set(obs) == {"proprio"} and obs["proprio"].dtype == np.float32
        with pytest.raises(ValueError, match="action"):
            env.step(np.zeros(3))
    finally:
        env.close()
    with pytest.raises(ConfigError, match="image_size"):
        gym.make("embodied/Reach-Sawyer-v0", image_size=1000)
    with pytest.raises(ConfigError, match="embodiment"):
        from sim.manipulation.env import ManipulationEnv

        ManipulationEnv("reach", "Robby")


def _eef_in_frame(env: gym.Env, steps: int = 30) -> float:
    """Fraction of steps of a random-exploration episode whose end-effector site projects inside the image."""
    u = env.unwrapped
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    a = np.zeros(env.action_space.shape)
    inside = 0
    for _ in range(steps):
        a = np.clip(0.8 * a + 0.5 * rng.normal(size=a.shape), -1, 1)
        env.step(a.astype(np.float32))
        u._renderer.update_scene(u._data, camera=u._camera)
        cam = u._renderer.scene.camera[0]
        fwd, up = np.asarray(cam.forward), np.asarray(cam.up)
        v = u.eef_pose()[0] - np.asarray(cam.pos)
        x, y, z = v @ np.cross(fwd, up), v @ up, v @ fwd
        half = cam.frustum_width or (cam.frustum_top - cam.frustum_bottom) / 2  # 0: from the (square) aspect
        px = (x / z * cam.frustum_near - cam.frustum_center + half) / (2 * half)
        py = (y / z * cam.frustum_near - cam.frustum_bottom) / (cam.frustum_top - cam.frustum_bottom)
        inside += bool(0.05 < px < 0.95 and 0.05 < py < 0.95)
    return inside / steps


def test_workspace_camera_keeps_the_gripper_in_frame_where_agentview_loses_it():
    fractions = {}
    for camera in ("workspace", "agentview"):
        env = _make("embodied/Reach-PandaInspireHand-v0", image_size=48, camera=camera)
        try:
            fractions[camera] = _eef_in_frame(env)
        finally:
            env.close()
    assert fractions["workspace"] >= 0.9, fractions
    assert fractions["workspace"] > fractions["agentview"], fractions
    with pytest.raises(ConfigError, match="camera.*workspace"):
        gym.make("embodied/Reach-Panda-v0", image_size=48, camera="nosuchcam")
