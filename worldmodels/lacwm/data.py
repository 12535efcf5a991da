"""Pretraining / adaptation data for LAC-WM and EAC-WM: recording, and frame-pair windows for training.

Recording (``record_suite``) rolls out the manipulation suite (and optionally LIBERO) through
``sim.recorder.record_rollout`` with ``ExplorationPolicy``: even episodes follow the scripted expert with
action noise and short random detours, odd episodes are smooth random exploration (an Ornstein-Uhlenbeck
walk in the normalised action box) for coverage of the action space. One HDF5 file per (task,
embodiment) lands in ``<root>/<split>/``, recorded once through ``sim.recorder.ensure_recorded`` (the spec is
kept in ``<file>.spec.json``; an existing file of other settings is refused, never reused).

Training windows (``TransitionDataset``) wrap ``core.data.trajectories.TrajectoryDataset`` and give, for
an anchor step ``t`` and ``K = context`` transitions of ``skip`` control steps each:

    ``frames``       (K+1, 3, H, W) uint8, steps t-K*skip, ..., t-skip, t (upright RGB)
    ``motion``       (K, 6) float32, end-effector motion of each transition: summed ``obs/eef_delta``
                     (dx, dy, dz in m and an axis-angle rotation in rad, world frame); from demonstration
                     files without ``eef_delta`` (LIBERO's: ``obs/ee_states`` = position + axis-angle),
                     ``motion_key="ee_states"`` takes the relative pose between the transition's two ends
    ``actions``      (K, skip * A) float32, the raw env actions of each transition, concatenated in time
    ``embodiment_id``() int64, index into ``TransitionDataset.embodiments``
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from core.errors import ConfigError, DataError
from core.logging import get_logger

log = get_logger("embodied.lacwm")

EEF_KEY = "eef_delta"
POSE_KEY = "ee_states"  # LIBERO demo files: (T, 6) end-effector position (m) + orientation as an axis-angle
MOTION_KEYS = (EEF_KEY, POSE_KEY)


def _rotvec_to_matrix(v: np.ndarray) -> np.ndarray:
    """(..., 3) axis-angle -> (..., 3, 3) rotation matrices (Rodrigues)."""
    theta = np.linalg.norm(v, axis=-1, keepdims=True)
    k = v / np.maximum(theta, 1e-12)
    kx, ky, kz = k[..., 0], k[..., 1], k[..., 2]
    zero = np.zeros_like(kx)
    K = np.stack([zero, -kz, ky, kz, zero, -kx, -ky, kx, zero], -1).reshape(*v.shape[:-1], 3, 3)
    s, c = np.sin(theta)[..., None], np.cos(theta)[..., None]
    return np.eye(3) + s * K + (1 - c) * (K @ K)


def _matrix_to_rotvec(R: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotation matrices -> (..., 3) axis-angle (angle in [0, pi])."""
    from scipy.spatial.transform import Rotation

    shape = R.shape[:-2]
    return Rotation.from_matrix(R.reshape(-1, 3, 3)).as_rotvec().reshape(*shape, 3)


def pose_motion(poses: np.ndarray) -> np.ndarray:
    """(N+1, 6) poses (position + axis-angle, world frame) -> (N, 6) motion between consecutive poses:
    the position difference and the world-frame rotation ``R_{i+1} R_i^T`` as an axis-angle, the same
    quantities ``eef_delta`` sums step by step."""
    poses = np.asarray(poses, np.float64)
    R = _rotvec_to_matrix(poses[:, 3:6])
    rel = R[1:] @ np.swapaxes(R[:-1], -1, -2)
    return np.concatenate([poses[1:, :3] - poses[:-1, :3], _matrix_to_rotvec(rel)], -1).astype(np.float32)


# ------------------------------------------------------------------------------------------ recording
class ExplorationPolicy:
    """``sim.api.Policy`` mixing a noisy scripted expert with smooth random exploration.

    Args:
        env: The (unwrapped-able) environment; ``env.unwrapped.make_expert`` must exist for expert episodes.
        noise: Std of the expert's Gaussian action noise (normalised action units).
        explore_every: Episode seeds divisible by this are pure random exploration (1: always random;
            0: never).
        detour_prob: Per-step probability, in expert episodes, of starting a 3-8 step random detour.
        theta: OU mean reversion per step; ``sigma`` the OU step std (normalised action units).
    """

    def __init__(self, env: Any, noise: float = 0.1, explore_every: int = 2, detour_prob: float = 0.05,
                 theta: float = 0.25, sigma: float = 0.35):
        self.env = env
        self.space = env.action_space
        self.expert = env.unwrapped.make_expert(noise=noise) if hasattr(env.unwrapped, "make_expert") else None
        self.explore_every, self.detour_prob, self.theta, self.sigma = explore_every, detour_prob, theta, sigma
        self.rng = np.random.default_rng(0)
        self._explore = True
        self._ou = np.zeros(self.space.shape, np.float64)
        self._detour = 0

    def reset(self, seed: int | None = None) -> None:
        seed = 0 if seed is None else int(seed)
        self.rng = np.random.default_rng(seed + 7919)
        self._explore = self.expert is None or (self.explore_every > 0 and seed % self.explore_every == 1)
        self._ou = self.rng.uniform(-0.5, 0.5, self.space.shape)
        self._detour = 0
        if self.expert is not None:
            self.expert.reset(seed)

    def _ou_step(self) -> np.ndarray:
        self._ou += -self.theta * self._ou + self.sigma * self.rng.normal(size=self._ou.shape)
        return np.clip(self._ou, self.space.low, self.space.high)

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        if self._explore:
            return self._ou_step().astype(np.float32)
        action = np.asarray(self.expert.act(obs, info), np.float64)  # keeps the expert's phase machine going
        if self._detour == 0 and self.rng.random() < self.detour_prob:
            self._detour = int(self.rng.integers(3, 9))
            self._ou = action.copy()
        if self._detour > 0:
            self._detour -= 1
            return self._ou_step().astype(np.float32)
        return action.astype(np.float32)


def exploration_policy(env: Any, noise: float = 0.1, explore_every: int = 2) -> ExplorationPolicy:
    """Picklable factory ``(env) -> ExplorationPolicy`` for ``sim.rollout``."""
    return ExplorationPolicy(env, noise=noise, explore_every=explore_every)


@dataclass(frozen=True)
class RecordSpec:
    """One recorded file: ``episodes`` episodes of ``env_id`` starting at ``seed``, capped at ``max_steps``."""

    env_id: str
    episodes: int
    seed: int
    max_steps: int
    image_size: int
    explore_every: int = 2
    noise: float = 0.1
    camera: str | None = None  # manipulation-suite camera (None: the env's default; LIBERO has its own)

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return {"image_size": self.image_size, **({"camera": self.camera} if self.camera else {})}


def record_file(spec: RecordSpec, out_dir: str | Path) -> Path:
    """Record ``spec`` into ``out_dir/<env id>.hdf5`` unless that file exists; return the path.

    Raises:
        DataError: The file was recorded with another spec (set a new ``data.root``).
        ConfigError: The file has no spec (recorded before specs were kept) and ``check_cached`` refuses it.
    """
    import dataclasses

    from sim.recorder import ensure_recorded, record_rollout, sanitize_env_id
    from sim.rollout import RolloutConfig

    path = Path(out_dir) / f"{sanitize_env_id(spec.env_id)}.hdf5"
    cfg = RolloutConfig(env_id=spec.env_id, episodes=spec.episodes, seed=spec.seed, policy="scripted",
                        noise=spec.noise, env_kwargs=spec.env_kwargs,
                        max_episode_steps=spec.max_steps, progress=False)
    factory = functools.partial(exploration_policy, noise=spec.noise, explore_every=spec.explore_every)

    def record(staging: Path) -> Path:
        result = record_rollout(cfg, staging, video=False, policy=factory)
        log.info("recorded %s: %d episodes, %.1f steps/s", spec.env_id, spec.episodes, result.summary["steps_per_s"])
        return Path(result.summary["hdf5"])

    ensure_recorded(path, dataclasses.asdict(spec), record, check_unrecorded=lambda p: check_cached(spec, p),
                    hint="set a new data.root to record it")
    return path


def check_cached(spec: RecordSpec, path: str | Path) -> None:
    """Refuse a cached file recorded with other settings than ``spec`` (the cache is keyed by env id only).

    Checks the frame size, the camera, the episode count and the longest episode against ``spec`` (a file
    recorded with a larger ``max_steps`` or other ``image_size`` / ``camera`` / ``episodes`` would otherwise be
    reused silently;
    a smaller recorded ``max_steps`` cannot be told from early episode ends and is not caught).

    Raises:
        ConfigError: The file does not match ``spec`` (record into a new ``data.root``).
    """
    import json

    import h5py

    with h5py.File(path, "r") as f:
        demos = [f["data"][k] for k in f["data"]]
        size = demos[0]["obs/image"].shape[1] if demos and "image" in demos[0]["obs"] else spec.image_size
        longest = max((d["actions"].shape[0] for d in demos), default=0)
        env_args = f["data"].attrs.get("env_args", "{}")
    camera = json.loads(env_args).get("env_kwargs", {}).get("camera") if isinstance(env_args, str) else None
    found = {"image_size": size, "episodes": len(demos), "camera": camera}
    want = {"image_size": spec.image_size, "episodes": spec.episodes, "camera": spec.camera}
    if found != want or longest > spec.max_steps:
        raise ConfigError(f"cached {path} does not match the requested data ({found}, longest episode {longest} vs "
                          f"{want}, max_steps={spec.max_steps}); set a new data.root to record it")


def embodiment_name(id_name: str) -> str:
    """The recorded ``embodiment`` attribute of a suite embodiment id (``PandaInspireHand`` -> ``Panda+InspireHand``)."""
    from sim.manipulation.registration import EMBODIMENTS

    return EMBODIMENTS[id_name].name if id_name in EMBODIMENTS else id_name


def suite_specs(embodiments: Sequence[str], tasks: Sequence[str], episodes: int, seed: int, max_steps: int,
                image_size: int, explore_every: int = 2, camera: str | None = None) -> list[RecordSpec]:
    """Record specs for every task x embodiment of the manipulation suite (ids ``embodied/<Task>-<Emb>-v0``)."""
    from sim.manipulation.registration import EMBODIMENTS, TASKS, env_id

    specs = []
    for emb in embodiments:
        if emb not in EMBODIMENTS:
            raise ConfigError(f"data.embodiments: unknown embodiment {emb!r}; choose from {sorted(EMBODIMENTS)}")
        for task in tasks:
            if task not in TASKS:
                raise ConfigError(f"data.tasks: unknown task {task!r}; choose from {sorted(TASKS)}")
            specs.append(RecordSpec(env_id(task, emb), episodes, seed, max_steps, image_size, explore_every,
                                    camera=camera))
    return specs


def record_suite(specs: Sequence[RecordSpec], out_dir: str | Path) -> list[Path]:
    """Record every spec (cached per file); LIBERO specs get the LIBERO bootstrap first."""
    import sim

    sim.register_envs()
    return [record_file(s, out_dir) for s in specs]


# ------------------------------------------------------------------------------------------- windows
class TransitionDataset(Dataset):
    """Frame windows with per-transition motion labels and actions (sample layout in the module docstring).

    Args:
        paths: Trajectory files (robomimic / LIBERO layout with ``obs/image`` and ``obs/eef_delta``).
        context: Number of transitions ``K`` per sample (1: a frame pair).
        skip: Control steps per transition (motion summed, actions concatenated).
        image_key: Observation key of the camera frames.
        embodiments: Keep only these embodiments (None: all in the files).
        embodiment_names: Fixed embodiment vocabulary for ``embodiment_id`` (default: sorted names found).
        episodes_per_embodiment: Keep only the first N episodes of each embodiment (few-shot adaptation).
        action_pad_to: Zero-pad ``actions`` to this many dims per transition so that embodiments with
            different action dims batch together (encoders read their own leading dims).
        motion_key: ``"eef_delta"`` (per-step motion, summed over a transition: the workspace's recordings)
            or ``"ee_states"`` (poses; the motion is the relative pose between a transition's ends: LIBERO's
            demonstration files, which store no per-step motion).
    """

    def __init__(self, paths: Sequence[str | Path], context: int = 1, skip: int = 1, image_key: str = "image",
                 embodiments: Sequence[str] | None = None, embodiment_names: Sequence[str] | None = None,
                 episodes_per_embodiment: int | None = None, action_pad_to: int | None = None,
                 motion_key: str = EEF_KEY):
        from core.data.trajectories import TrajectoryDataset

        if context < 1 or skip < 1:
            raise ConfigError(f"context and skip must be >= 1, got {context}, {skip}")
        if motion_key not in MOTION_KEYS:
            raise ConfigError(f"motion_key must be one of {list(MOTION_KEYS)}, got {motion_key!r}")
        self.context, self.skip, self.image_key, self.motion_key = context, skip, image_key, motion_key
        span = context * skip + 1
        self.base = TrajectoryDataset(list(paths), obs_keys=[image_key, motion_key], horizon=1, frame_stack=span,
                                      embodiments=embodiments)
        found = sorted({e.embodiment for e in self.base.episodes})
        self.embodiments = list(embodiment_names) if embodiment_names is not None else found
        missing = [e for e in found if e not in self.embodiments]
        if missing:
            raise DataError(self.base.paths[0], f"embodiments {missing} not in the model's vocabulary {self.embodiments}")
        keep_ep = self._keep_episodes(episodes_per_embodiment)
        # TrajectoryDataset (stride 1, pad_end) anchors every step 0..T-1 of each episode, episode-major
        lengths = [e.length for e in self.base.episodes]
        ep_of = np.repeat(np.arange(len(lengths)), lengths).astype(np.int64)
        ts = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64) if lengths else np.zeros(0, np.int64)
        if len(ep_of) != len(self.base):
            raise DataError(self.base.paths[0], f"expected {len(ep_of)} anchors, the loader has {len(self.base)}")
        # anchors need K whole transitions behind them
        self.indices = np.flatnonzero(np.isin(ep_of, sorted(keep_ep)) & (ts >= context * skip))
        self._ep_of = ep_of
        self.action_dims = {e.embodiment: e.action_dim * skip for e in self.base.episodes}
        self.action_pad_to = action_pad_to
        if action_pad_to is not None and max(self.action_dims.values(), default=0) > action_pad_to:
            raise ConfigError(f"action_pad_to={action_pad_to} < an action dim {self.action_dims}")
        self._files: dict[str, Any] = {}

    def _keep_episodes(self, n: int | None) -> set[int]:
        if n is None:
            return set(range(len(self.base.episodes)))
        seen: dict[str, int] = {}
        keep = set()
        for i, e in enumerate(self.base.episodes):
            if seen.get(e.embodiment, 0) < n:
                keep.add(i)
                seen[e.embodiment] = seen.get(e.embodiment, 0) + 1
        return keep

    def groups(self) -> dict[str, list[int]]:
        """Embodiment -> sample indices (one action dim per batch: ``GroupedBatchSampler``)."""
        out: dict[str, list[int]] = {}
        for j, i in enumerate(self.indices):
            out.setdefault(self.base.episodes[self._ep_of[i]].embodiment, []).append(j)
        return out

    def embodiment_of(self, index: int) -> str:
        """Embodiment name of sample ``index``."""
        return self.base.episodes[self._ep_of[self.indices[index]]].embodiment

    def __len__(self) -> int:
        return len(self.indices)

    def _read_actions(self, ei: int, t0: int, t1: int) -> np.ndarray:
        from core.data.trajectories import open_trajectories

        info = self.base.episodes[ei]
        f = self._files.get(info.path)
        if f is None:
            f = self._files[info.path] = open_trajectories(info.path)  # an HDF5 file or a LeRobot folder
        return np.asarray(f.read(info.name, "actions", np.s_[t0:t1]), dtype=np.float32).reshape(t1 - t0, -1)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        i = int(self.indices[index])
        s = self.base[i]
        ei, t = int(s["episode_index"]), int(s["timestep"])
        K, k = self.context, self.skip
        frames = s[f"obs.{self.image_key}"][::k]  # (K+1, 3, H, W): steps t-K*k .. t
        if self.motion_key == EEF_KEY:
            motion = s[f"obs.{EEF_KEY}"][:-1].reshape(K, k, -1).sum(1).float()  # eef_delta of steps t-K*k .. t-1
        else:  # poses at steps t-K*k, ..., t: the relative pose over each transition
            motion = torch.from_numpy(pose_motion(s[f"obs.{POSE_KEY}"][::k].numpy()))
        acts = torch.from_numpy(self._read_actions(ei, t - K * k, t)).reshape(K, -1)  # (K, k*A)
        if self.action_pad_to is not None:
            acts = F.pad(acts, (0, self.action_pad_to - acts.shape[-1]))
        info = self.base.episodes[ei]
        return {
            "frames": frames,
            "motion": motion,
            "actions": acts,
            "embodiment_id": torch.tensor(self.embodiments.index(info.embodiment), dtype=torch.int64),
        }

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_files"] = {}
        return state
