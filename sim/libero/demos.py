"""LIBERO's human-demonstration HDF5 layout, and how this package's env observations map onto it.

A LIBERO demo file (``<task>_demo.hdf5``, written by LIBERO's ``create_dataset.py``)::

    data/                 attrs: problem_info (JSON: problem_name, domain_name, language_instruction),
                          bddl_file_name (str), bddl_file_content (the BDDL text),
                          env_args (JSON: type, env_name, problem_name, bddl_file, env_kwargs),
                          env_name, macros_image_convention ("opengl": images stored bottom-up),
                          num_demos, total; files written here add image_convention ("rot180": the
                          convention the loader returns the frames in, the one ``LiberoEnv`` gives policies)
    data/demo_<i>/        attrs: num_samples, init_state (S,) float64, model_file (MJCF XML str)
        actions           (T, 7) float64, OSC_POSE delta actions in [-1, 1] (same as ``LiberoEnv``)
        states            (T, S) float64 flattened MuJoCo states [time, qpos, qvel]
        robot_states      (T, 9) float64 [gripper qpos (2), eef pos (3), eef quat xyzw (4)]
        rewards           (T,) uint8;  dones (T,) uint8 (both 1 on the last step only)
        obs/agentview_rgb     (T, H, W, 3) uint8, the raw render in OpenGL row order (bottom-up)
        obs/eye_in_hand_rgb   (T, H, W, 3) uint8, the raw render in OpenGL row order
        obs/ee_pos (T, 3), obs/ee_ori (T, 3) axis-angle, obs/ee_states (T, 6) = [ee_pos, ee_ori],
        obs/gripper_states (T, 2), obs/joint_states (T, 7)        all float64, world frame

``LiberoEnv`` observations -> these keys: ``image[::-1, ::-1]`` -> ``agentview_rgb`` (the env's ``rot180``
rotated back to the raw frame, ``LiberoEnv.raw_obs["agentview_image"]`` exactly), ``wrist_image[::-1, ::-1]``
-> ``eye_in_hand_rgb``, ``proprio[PROPRIO_LAYOUT[k]]`` -> ``k`` for ``ee_pos``, ``ee_ori``, ``gripper_states``,
``joint_states``; ``ee_states`` = ``proprio[0:6]``. :func:`libero_obs_from_env` applies that mapping;
:func:`write_libero_demo_file` writes the layout (atomically) so that files recorded here and LIBERO's own files
are interchangeable: both store raw frames, and ``core.data.trajectories`` returns both in ``rot180``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from core.data.image_convention import check, convert
from core.errors import DataError
from core.io import atomic_path
from sim.libero.env import IMAGE_CONVENTION, LiberoEnv

LIBERO_OBS_KEYS: tuple[str, ...] = (
    "agentview_rgb",
    "eye_in_hand_rgb",
    "ee_pos",
    "ee_ori",
    "ee_states",
    "gripper_states",
    "joint_states",
)


def libero_obs_from_env(obs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map one ``LiberoEnv`` observation to LIBERO's demo obs keys as stored: ``LiberoEnv.demo_obs`` with the
    images back in the raw OpenGL-order frame (``IMAGE_CONVENTION`` undone) and proprio as float64."""
    out = LiberoEnv.demo_obs({**obs, "proprio": np.asarray(obs["proprio"], dtype=np.float64)})
    for key in ("agentview_rgb", "eye_in_hand_rgb"):
        if key in out:
            out[key] = np.ascontiguousarray(convert(out[key], IMAGE_CONVENTION, "raw"))
    return out


@dataclass
class LiberoDemo:
    """One episode in LIBERO's layout (arrays indexed by step, ``T`` steps)."""

    actions: np.ndarray  # (T, 7)
    states: np.ndarray  # (T, S)
    obs: dict[str, np.ndarray]  # LIBERO_OBS_KEYS -> (T, ...)
    rewards: np.ndarray  # (T,)
    dones: np.ndarray  # (T,)
    robot_states: np.ndarray | None = None  # (T, 9)
    attrs: dict[str, object] = field(default_factory=dict)  # e.g. init_state, model_file


def write_libero_demo_file(
    path: str | os.PathLike,
    demos: Sequence[LiberoDemo],
    *,
    problem_info: Mapping[str, object],
    bddl_file_name: str,
    env_args: Mapping[str, object],
    bddl_file_content: str | None = None,
    extra_attrs: Mapping[str, object] | None = None,
    image_convention: str | None = IMAGE_CONVENTION,
) -> None:
    """Write ``demos`` to ``path`` in LIBERO's demonstration layout (atomically).

    Images in ``demos`` are raw OpenGL-order frames (``libero_obs_from_env``), stored as they are.
    ``image_convention`` is written as the ``data`` attribute of that name: the convention the loader returns
    the frames in (``LiberoEnv``'s, ``"rot180"``); None leaves it out, as in LIBERO's own files (which the loader
    also returns in ``rot180``).

    Raises:
        DataError: an episode whose arrays disagree in length, naming the file and the episode.
        ConfigError: an unknown ``image_convention``.
    """
    if image_convention is not None:
        check(image_convention)
    import h5py

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        data = f.create_group("data")
        total = 0
        for i, demo in enumerate(demos):
            n = len(demo.actions)
            lengths = {k: len(v) for k, v in {**demo.obs, "states": demo.states, "rewards": demo.rewards,
                                              "dones": demo.dones}.items()}
            if any(v != n for v in lengths.values()):
                raise DataError(path, f"demo_{i}: arrays disagree in length (actions {n}, {lengths})")
            grp = data.create_group(f"demo_{i}")
            grp.create_dataset("actions", data=np.asarray(demo.actions, np.float64))
            grp.create_dataset("states", data=np.asarray(demo.states, np.float64))
            grp.create_dataset("rewards", data=np.asarray(demo.rewards, np.uint8))
            grp.create_dataset("dones", data=np.asarray(demo.dones, np.uint8))
            if demo.robot_states is not None:
                grp.create_dataset("robot_states", data=np.asarray(demo.robot_states, np.float64))
            obs = grp.create_group("obs")
            for key, value in demo.obs.items():
                value = np.asarray(value)
                obs.create_dataset(key, data=value, dtype=np.uint8 if value.dtype == np.uint8 else np.float64)
            grp.attrs["num_samples"] = n
            for key, value in demo.attrs.items():
                grp.attrs[key] = value
            total += n
        data.attrs["problem_info"] = json.dumps(dict(problem_info))
        data.attrs["bddl_file_name"] = str(bddl_file_name)
        if bddl_file_content is not None:
            data.attrs["bddl_file_content"] = str(bddl_file_content)
        data.attrs["env_args"] = json.dumps(dict(env_args))
        data.attrs["env_name"] = str(env_args.get("env_name", ""))
        data.attrs["macros_image_convention"] = "opengl"
        if image_convention is not None:
            data.attrs["image_convention"] = image_convention
        for key, value in (extra_attrs or {}).items():
            data.attrs[key] = value
        data.attrs["num_demos"] = len(demos)
        data.attrs["total"] = total
