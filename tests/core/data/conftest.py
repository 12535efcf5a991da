"""Tiny fixtures in each supported on-disk format, written into pytest's tmp dirs."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from core.data.trajectories import TrajectoryWriter


def make_episode(rng: np.random.Generator, T: int, A: int, H: int = 8, W: int = 8) -> dict:
    return {
        "obs": {
            "image": rng.integers(0, 256, (T, H, W, 3), dtype=np.uint8),
            "proprio": rng.normal(size=(T, 4)).astype(np.float32),
        },
        "actions": rng.normal(size=(T, A)).astype(np.float32),
        "rewards": rng.random(T).astype(np.float32),
    }


@pytest.fixture
def episode_factory():
    """``make_episode(rng, T, A)``: random obs / actions / rewards of one episode."""
    return make_episode


@pytest.fixture
def traj_file(tmp_path):
    """Our writer: 3 Panda episodes (T = 5, 6, 7; A = 7), plus the episodes for comparison."""
    rng = np.random.default_rng(0)
    path = tmp_path / "panda.hdf5"
    episodes = [make_episode(rng, T, 7) for T in (5, 6, 7)]
    with TrajectoryWriter(path, env_meta={"env_name": "Lift", "env_kwargs": {"robots": ["Panda"]}},
                          language_instruction="lift the cube") as w:  # fmt: skip
        for i, ep in enumerate(episodes):
            w.add_episode(ep["obs"], ep["actions"], rewards=ep["rewards"],
                          attrs={"embodiment": "Panda", "success": i != 1, "action_space": {"dim": 7}})  # fmt: skip
        w.add_filter_key("train", ["demo_0", "demo_2"])
    return path, episodes


@pytest.fixture
def libero_file(tmp_path):
    """A file in LIBERO's own layout, written with h5py directly (no project code)."""
    rng = np.random.default_rng(1)
    path = tmp_path / "KITCHEN_SCENE1_open_the_drawer_demo.hdf5"
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["env_name"] = "Libero_Kitchen_Tabletop_Manipulation"
        data.attrs["problem_info"] = json.dumps(
            {"problem_name": "libero_kitchen_tabletop_manipulation", "domain_name": "robosuite",
             "language_instruction": "open the top drawer of the cabinet"})  # fmt: skip
        data.attrs["bddl_file_name"] = "libero/bddl_files/KITCHEN_SCENE1_open_the_drawer.bddl"
        data.attrs["env_args"] = json.dumps(
            {"type": 1, "env_name": "Libero_Kitchen_Tabletop_Manipulation",
             "env_kwargs": {"robots": ["Panda"], "controller_configs": {"type": "OSC_POSE"}}})  # fmt: skip
        data.attrs["macros_image_convention"] = "opengl"
        data.attrs["num_demos"] = 2
        data.attrs["total"] = 9
        for i, T in enumerate((4, 5)):
            g = data.create_group(f"demo_{i}")
            o = g.create_group("obs")
            o["agentview_rgb"] = rng.integers(0, 256, (T, 16, 16, 3), dtype=np.uint8)
            o["eye_in_hand_rgb"] = rng.integers(0, 256, (T, 16, 16, 3), dtype=np.uint8)
            o["ee_pos"] = rng.normal(size=(T, 3))
            o["ee_ori"] = rng.normal(size=(T, 3))
            o["ee_states"] = rng.normal(size=(T, 6))
            o["gripper_states"] = rng.normal(size=(T, 2))
            o["joint_states"] = rng.normal(size=(T, 7))
            g["actions"] = rng.normal(size=(T, 7))
            g["rewards"] = np.eye(T, dtype=np.uint8)[-1]
            g["dones"] = np.eye(T, dtype=np.uint8)[-1]
            g["robot_states"] = rng.normal(size=(T, 9))
            g["states"] = rng.normal(size=(T, 47))
            g.attrs["num_samples"] = T
            g.attrs["init_state"] = rng.normal(size=47)
            g.attrs["model_file"] = "<mujoco model='base'><worldbody/></mujoco>"
    return path


@pytest.fixture
def robomimic_file(tmp_path):
    """A file in robomimic's layout (11 demos, names sort wrongly as strings), written with h5py."""
    rng = np.random.default_rng(2)
    path = tmp_path / "image.hdf5"
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["env_args"] = json.dumps(
            {"env_name": "Lift", "type": 1,
             "env_kwargs": {"robots": ["Panda"], "has_offscreen_renderer": True, "camera_names": ["agentview"]}})  # fmt: skip
        total = 0
        for i in range(11):
            T = 3 + i % 3
            total += T
            g = data.create_group(f"demo_{i}")
            for grp in ("obs", "next_obs"):
                o = g.create_group(grp)
                o["agentview_image"] = rng.integers(0, 256, (T, 8, 8, 3), dtype=np.uint8)
                o["robot0_eef_pos"] = rng.normal(size=(T, 3))
                o["robot0_eef_quat"] = rng.normal(size=(T, 4))
                o["robot0_gripper_qpos"] = rng.normal(size=(T, 2))
            g["actions"] = rng.normal(size=(T, 7))
            g["rewards"] = np.zeros(T)
            g["dones"] = np.eye(T, dtype=np.int64)[-1]
            g["states"] = rng.normal(size=(T, 32))
            g.attrs["num_samples"] = T
            g.attrs["model_file"] = "<mujoco/>"
        data.attrs["total"] = total
        mask = f.create_group("mask")
        mask["train"] = np.array([f"demo_{i}".encode() for i in range(9)])
        mask["valid"] = np.array([b"demo_9", b"demo_10"])
    return path
