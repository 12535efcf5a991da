"""One LIBERO image convention from the render to the policy, the demo files and openpi's observation.

``LiberoEnv`` gives policies openpi's and LeRobot's LIBERO frames (the raw render rotated 180 degrees); demo files
keep LIBERO's raw OpenGL-order frames and the loader gives them back rotated the same way. Pinned here against
the raw render and against openpi's own recipe (``openpi_client.image_tools``). One 64 px env for the module.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

SIZE = 64


@pytest.fixture(scope="module")
def env():
    from sim.libero.env import LiberoEnv

    env = LiberoEnv("libero_spatial", 0, image_size=SIZE, render_mode="rgb_array")
    yield env
    env.close()


def _openpi_quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """openpi's ``examples/libero/main.py::_quat2axisangle`` (robosuite's ``quat2axisangle``), verbatim."""
    quat = np.array(quat)
    if quat[3] > 1.0:
        quat[3] = 1.0
    elif quat[3] < -1.0:
        quat[3] = -1.0
    den = np.sqrt(1.0 - quat[3] * quat[3])
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return (quat[:3] * 2.0 * math.acos(quat[3])) / den


def test_policy_frames_are_the_raw_render_rotated_as_openpi_does(env):
    obs, _ = env.reset(options={"init_state_id": 0})
    raw = env.raw_obs
    # openpi's examples/libero/main.py: "IMPORTANT: rotate 180 degrees to match train preprocessing"
    img = np.ascontiguousarray(raw["agentview_image"][::-1, ::-1])
    wrist_img = np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1])
    assert np.array_equal(obs["image"], img) and np.array_equal(obs["wrist_image"], wrist_img)
    assert np.array_equal(env.render(), obs["image"])
    assert not np.array_equal(obs["image"], obs["image"][:, ::-1])  # a mirror would not go unnoticed
    assert env.metadata["image_convention"] == "rot180" == type(env).metadata["image_convention"]


def test_proprio_axis_angle_is_robosuite_s(env):
    """``proprio[3:6]`` is robosuite's ``quat2axisangle`` of the raw quaternion (LIBERO's ``ee_ori``), on init
    states whose quaternion has ``w < 0`` (state 0) and ``w > 0`` (state 21) alike."""
    signs = set()
    for k in (0, 21):
        obs, _ = env.reset(options={"init_state_id": k})
        q = env.raw_obs["robot0_eef_quat"]
        signs.add(bool(q[3] > 0))
        want = _openpi_quat2axisangle(q).astype(np.float32)
        np.testing.assert_array_equal(obs["proprio"][3:6], want)
    assert signs == {True, False}


def test_demo_files_store_the_raw_render_and_read_back_as_the_env_gives_it(env, tmp_path):
    import h5py

    from core.data.trajectories import TrajectoryDataset, TrajectoryFile
    from sim.libero.demos import LIBERO_OBS_KEYS, LiberoDemo, libero_obs_from_env, write_libero_demo_file

    obs, _ = env.reset(options={"init_state_id": 3})
    rng = np.random.default_rng(0)
    frames, raws, seen, actions, states = [], [], [], [], []
    for _ in range(3):
        frames.append(libero_obs_from_env(obs))
        raws.append({k: env.raw_obs[k].copy() for k in ("agentview_image", "robot0_eye_in_hand_image")})
        seen.append(obs)
        states.append(env.sim.get_state().flatten())
        actions.append(rng.uniform(-1, 1, 7))
        obs, *_ = env.step(actions[-1])
    last = np.eye(3, dtype=np.uint8)[-1]
    demo = LiberoDemo(actions=np.stack(actions), states=np.stack(states), rewards=last, dones=last,
                      obs={k: np.stack([f[k] for f in frames]) for k in LIBERO_OBS_KEYS})
    path = tmp_path / f"{env.task.name}_demo.hdf5"
    write_libero_demo_file(path, [demo], problem_info={"problem_name": "libero_tabletop_manipulation",
                                                       "language_instruction": env.task.bddl_language},
                           bddl_file_name=env.task.bddl_file, env_args={"env_name": "Libero_Tabletop_Manipulation",
                                                                        "type": 1, "env_kwargs": {}})
    with h5py.File(path, "r") as h:
        attrs = h["data"].attrs
        assert attrs["macros_image_convention"] == "opengl" and attrs["image_convention"] == "rot180"
        for t in range(3):  # exactly the raw render, as LIBERO's own files store it
            assert np.array_equal(h["data/demo_0/obs/agentview_rgb"][t], raws[t]["agentview_image"])
            assert np.array_equal(h["data/demo_0/obs/eye_in_hand_rgb"][t], raws[t]["robot0_eye_in_hand_image"])
    with TrajectoryFile(path) as f:
        ep = f.episode("demo_0")
    for t in range(3):  # the loader gives what the env gave the policy at that step
        assert np.array_equal(ep["obs/agentview_rgb"][t], seen[t]["image"])
        assert np.array_equal(ep["obs/eye_in_hand_rgb"][t], seen[t]["wrist_image"])
    ds = TrajectoryDataset(path, obs_keys=["agentview_rgb", "eye_in_hand_rgb"])
    assert ds.image_convention == "rot180"
    for t in range(3):
        s = ds[t]
        assert np.array_equal(s["obs.agentview_rgb"][0].permute(1, 2, 0).numpy(), seen[t]["image"])
        assert np.array_equal(s["obs.eye_in_hand_rgb"][0].permute(1, 2, 0).numpy(), seen[t]["wrist_image"])


@pytest.mark.parametrize("init_state", [0, 21])
def test_openpi_observation_is_openpi_s_own(env, init_state):
    """``openpi_observation`` on a LiberoEnv observation equals what openpi's LIBERO example builds from the raw
    robosuite observation with ``openpi_client.image_tools``."""
    from openpi_client import image_tools

    from sim.libero.openpi import OPENPI_LIBERO_SPEC, openpi_observation

    obs, _ = env.reset(options={"init_state_id": init_state})
    raw = env.raw_obs
    language = env.metadata["language_instruction"]
    got = openpi_observation(obs, language)
    img = np.ascontiguousarray(raw["agentview_image"][::-1, ::-1])
    wrist_img = np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1])
    want = {
        "observation/image": image_tools.convert_to_uint8(image_tools.resize_with_pad(img, 224, 224)),
        "observation/wrist_image": image_tools.convert_to_uint8(image_tools.resize_with_pad(wrist_img, 224, 224)),
        "observation/state": np.concatenate((raw["robot0_eef_pos"], _openpi_quat2axisangle(raw["robot0_eef_quat"]),
                                             raw["robot0_gripper_qpos"])),
        "prompt": str(language),
    }
    assert set(got) == set(want) == set(OPENPI_LIBERO_SPEC)
    for key in ("observation/image", "observation/wrist_image"):
        assert got[key].dtype == np.uint8 and np.array_equal(got[key], want[key]), key
    assert got["observation/state"].dtype == np.float32
    np.testing.assert_array_equal(got["observation/state"], want["observation/state"].astype(np.float32))
    assert got["prompt"] == want["prompt"]
    for key, (shape, dtype) in OPENPI_LIBERO_SPEC.items():
        if dtype != "str":
            assert got[key].shape == shape and str(got[key].dtype) == dtype, key
    no_wrist = openpi_observation({k: v for k, v in obs.items() if k != "wrist_image"}, language)
    assert "observation/wrist_image" not in no_wrist


def test_env_observation_takes_openpi_s_request_back_to_the_env_s_keys(env):
    from sim.libero.openpi import env_observation, openpi_observation

    obs, _ = env.reset(options={"init_state_id": 0})
    back = env_observation(openpi_observation(obs, "x"), SIZE, wrist=True)
    assert set(back) == {"image", "wrist_image", "proprio"} and env.observation_space.contains(back)
    np.testing.assert_array_equal(back["proprio"][:8], obs["proprio"][:8])
    assert not back["proprio"][8:].any()  # the joint positions openpi does not send
    for key in ("image", "wrist_image"):  # 64 -> 224 (bilinear) -> 64 (area): the same picture, the same way up
        err = np.abs(back[key].astype(int) - obs[key]).mean()
        assert err < 0.25 * np.abs(back[key].astype(int) - obs[key][:, ::-1]).mean() and err < 6, (key, err)
