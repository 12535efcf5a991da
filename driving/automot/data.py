"""Expert driving data for AutoMoT: recorded through ``sim.recorder``, read through ``core.data.trajectories``.

AutoMoT trains on Bench2Drive logs of CARLA's privileged expert; here the privileged IDM + MOBIL expert of
``sim.driving`` (``sim.rollout``'s ``"scripted"`` policy with noise 0, as ``driving.evaluate``'s ``idm``)
drives the highway-env scenarios and every step is labelled from the log and the scene
(``driving.automot.reasoning``).

Layout written by ``make_driving_dataset(out, split=...)``::

    out/<split>/meta.json                                split, scenarios, seeds, counts, image size ...
    out/<split>/<scenario>/embodied_Drive-<Scenario>-v0.hdf5    one file per scenario (``sim.recorder``)
    out/<split>/<scenario>/embodied_Drive-<Scenario>-v0.hdf5.spec.json    the settings it was recorded with
    out/<split>/<scenario>/summary.json, config.json

Each ``data/demo_<i>`` holds the recorder's fields (``obs/<key>`` and ``next_obs/<key>`` for ``image``
(T, H, W, 3) uint8, ``bev`` (T, 6, Hb, Wb) uint8, ``ego_state`` (T, 9), ``proprio`` (T, 4), ``route``
(T, K, 2), ``agents`` (T, N, 8); ``actions`` (T, 2) ...). The recorder keeps observations but not the
env's ``info``, so the expert's labels are added as two more observation keys (``LABEL_KEYS``), which
the recorder then also writes to ``next_obs``:

    obs/meta_action        (T,) int64   ``info["meta_action"]`` of the state each action was taken in
    obs/expert_waypoints   (T, 6, 2) float32   ``info["expert_waypoints"]`` (ego frame [m], 0.5 s apart)

The label of step ``t`` is the info the policy acted on; ``sim.rollout.Episode`` does not keep the reset
info (the label of step 0), so the policy logs every info it acts on (``_LabellingExpert``).

Seeds: episode ``j`` of split ``s`` uses env seed ``seed + SPLIT_OFFSETS[s] + j`` (the same seeds in every
scenario); ``episodes`` must stay below the offset gap so that the splits never share a seed.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import ConfigError, DataError

DEFAULT_SCENARIOS = ("highway", "merge", "roundabout", "intersection", "racetrack")
SEED_GAP = 10_000  # seed offset between splits (and the most episodes per scenario)
SPLIT_OFFSETS = {"train": 0, "test": SEED_GAP}
LABEL_KEYS = ("meta_action", "expert_waypoints")
POLICY_FREQUENCY = 5  # [Hz] DrivingEnv's default, recorded in every file's env_kwargs
EGO_FIELDS = ("speed", "acceleration", "steering", "yaw_rate", "lateral_offset", "heading_error")
_EGO_SLICE = slice(3, 9)  # EGO_FIELDS inside sim.driving.env's ego_state (9,)


def ego_features(ego_state: np.ndarray) -> np.ndarray:
    """``EGO_FIELDS`` (6,) float32 of ``DrivingEnv``'s ``ego_state`` (9,) (the pose-free part the policy sees)."""
    return np.asarray(ego_state, dtype=np.float32)[..., _EGO_SLICE]
META_FILE = "meta.json"


# ------------------------------------------------------------------------------------------ geometry
def future_waypoints(
    poses_xy_yaw: np.ndarray,
    t: int,
    dt: float,
    horizon_s: float = 3.0,
    hz: float = 2.0,
    extrapolate: Literal["velocity", "hold"] = "velocity",
) -> np.ndarray:
    """The ego's own future positions in its ego frame at step ``t``.

    Args:
        poses_xy_yaw: (T, 3) logged world poses x, y [m], yaw [rad] (world frame: yaw CCW from +x) at the
            policy rate, row ``i`` at time ``i * dt``.
        t: Current step (0 <= t < T).
        dt: Policy period [s].
        horizon_s: How far ahead [s].
        hz: Waypoint rate [Hz]; ``round(horizon_s * hz)`` waypoints at ``t * dt + k / hz``, k = 1 ...

    Returns:
        (round(horizon_s * hz), 2) float64 positions, ego frame of pose ``t`` (x forward, y left) [m]. Between
        logged poses the position is interpolated linearly. Past the end of the log (an episode that ended
        early) it is extrapolated along a straight line at the last step's velocity (``"velocity"``: the
        displacement between the last two poses over ``dt``) or held at the last pose (``"hold"``, also
        used when the log has a single pose).
    """
    poses = np.asarray(poses_xy_yaw, dtype=np.float64)
    if poses.ndim != 2 or poses.shape[1] < 3 or not 0 <= t < len(poses):
        raise ValueError(f"future_waypoints: poses {poses.shape} must be (T, 3) and 0 <= t={t} < T")
    if extrapolate not in ("velocity", "hold"):
        raise ValueError(f"extrapolate must be 'velocity' or 'hold', got {extrapolate!r}")
    n = int(round(horizon_s * hz))
    last = len(poses) - 1
    f = t + np.arange(1, n + 1) / (hz * dt)  # fractional step of each waypoint
    xy = poses[:, :2]
    i0 = np.minimum(np.floor(f).astype(np.int64), last)
    i1 = np.minimum(i0 + 1, last)
    a = (f - i0)[:, None]
    out = (1.0 - a) * xy[i0] + a * xy[i1]
    past = f > last
    if past.any():
        vel = (xy[last] - xy[last - 1]) if (extrapolate == "velocity" and last >= 1) else np.zeros(2)
        out[past] = xy[last] + (f[past] - last)[:, None] * vel
    x0, y0, yaw = poses[t, :3]
    c, s = math.cos(yaw), math.sin(yaw)
    d = out - np.array([x0, y0])
    return np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]], axis=-1)


def route_points(route: np.ndarray, n: int = 20, spacing: float | None = None) -> np.ndarray:
    """Resample a route polyline to ``n`` points ``spacing`` metres apart along it.

    Args:
        route: (K, 2) route points (ego frame [m]), ordered along the route.
        n: Number of output points.
        spacing: Arc length between output points [m]; the route's mean spacing when None (so the env's
            evenly spaced route comes back unchanged when K == n).

    Returns:
        (n, 2) float32: the first point is ``route[0]``, then every ``spacing`` m of arc length; beyond the
        route's end the points continue straight along its last segment. A route of a single distinct point
        (or none) repeats it (zeros).
    """
    pts = np.asarray(route, dtype=np.float64).reshape(-1, 2)
    if len(pts) == 0:
        return np.zeros((n, 2), np.float32)
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    keep = np.concatenate(([True], seg > 1e-9))
    pts = pts[keep]
    if len(pts) < 2:
        return np.repeat(pts[:1], n, axis=0).astype(np.float32)
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    cum = np.concatenate(([0.0], np.cumsum(seg)))
    step = float(cum[-1] / (len(pts) - 1)) if spacing is None else float(spacing)
    s = step * np.arange(n)
    out = np.stack([np.interp(s, cum, pts[:, k]) for k in range(2)], axis=-1)
    beyond = s > cum[-1]
    if beyond.any():
        direction = (pts[-1] - pts[-2]) / seg[-1]
        out[beyond] = pts[-1] + (s[beyond] - cum[-1])[:, None] * direction
    return out.astype(np.float32)


# ---------------------------------------------------------------------------------------- generation
def split_seeds(seed: int, episodes: int, split: str) -> list[int]:
    """Env seeds of a split's episodes: ``seed + SPLIT_OFFSETS[split] + j``, j < episodes."""
    if split not in SPLIT_OFFSETS:
        raise ConfigError(f"split: unknown {split!r}; choose from {sorted(SPLIT_OFFSETS)}")
    if not 1 <= episodes <= SEED_GAP:
        raise ConfigError(
            f"episodes: must be in [1, {SEED_GAP}] so that the splits' seeds stay disjoint, got {episodes}"
        )
    start = int(seed) + SPLIT_OFFSETS[split]
    return list(range(start, start + int(episodes)))


class _LabellingExpert:
    """The privileged expert (``sim.policies.scripted_policy``, noise 0) that logs the labels it acts on.

    ``log[seed]`` gets one ``(meta_action, expert_waypoints)`` per step of the episode reset with ``seed``.
    """

    def __init__(self, env: Any, log: dict[int, list]):
        from sim.policies import scripted_policy

        self.expert = scripted_policy(env, noise=0.0)
        self.log = log
        self._rows: list | None = None

    def reset(self, seed: int | None = None) -> None:
        self.expert.reset(seed=seed)
        self._rows = self.log[seed] = []

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        self._rows.append(_labels(info))
        return self.expert.act(obs, info)


def _labels(info: dict[str, Any]) -> tuple[int, np.ndarray]:
    return int(info["meta_action"]), np.array(info["expert_waypoints"], dtype=np.float32)


def _with_labels(episode: Any, rows: list) -> Any:
    """Add ``LABEL_KEYS`` to ``episode.obs`` ((T + 1) rows: the logged ones, then the final step's info)."""
    T = len(episode)
    if len(rows) != T:
        raise RuntimeError(f"episode {episode.index}: {len(rows)} logged labels for {T} steps")
    rows = [*rows, _labels(episode.infos[-1])]
    episode.obs["meta_action"] = np.array([r[0] for r in rows], dtype=np.int64)
    episode.obs["expert_waypoints"] = np.stack([r[1] for r in rows])
    return episode


def _env_kwargs(image_size: int, horizon_s: float | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"image_size": int(image_size), "policy_frequency": POLICY_FREQUENCY}
    if horizon_s is not None:
        kwargs["horizon_s"] = float(horizon_s)
    return kwargs


def scenario_file(root: str | Path, scenario: str) -> Path:
    """The HDF5 file of ``scenario`` under a split folder ``root``."""
    from sim.driving.registration import SCENARIOS
    from sim.recorder import sanitize_env_id

    if scenario not in SCENARIOS:
        raise ConfigError(f"scenario: unknown {scenario!r}; choose from {sorted(SCENARIOS)}")
    return Path(root) / scenario / f"{sanitize_env_id(SCENARIOS[scenario].env_id)}.hdf5"


def _counts(path: Path) -> dict[str, Any]:
    """Episode / step counts and per-episode success of a recorded scenario file."""
    from core.data.trajectories import TrajectoryFile

    with TrajectoryFile(path) as f:
        return {
            "episodes": len(f.episodes),
            "steps": sum(f.num_samples(e) for e in f.episodes),
            "success": [bool(f.attrs(e).get("success")) for e in f.episodes],
        }


def _check_unrecorded(path: Path, seeds: list[int], env_kwargs: dict[str, Any]) -> None:
    """Refuse a scenario file without a recording spec unless it holds exactly these episodes, options and labels.

    Raises:
        DataError: It holds other seeds, env options or no labels.
    """
    from core.data.trajectories import TrajectoryFile

    with TrajectoryFile(path) as f:
        found = {
            "env_kwargs": f.env_meta.get("env_kwargs"),
            "seeds": [f.attrs(e).get("seed") for e in f.episodes],
            "labels": set(LABEL_KEYS) <= set(f.obs_keys(f.episodes[0])) if f.episodes else False,
        }
    want = {"env_kwargs": env_kwargs, "seeds": seeds, "labels": True}
    diff = sorted(k for k in want if found[k] != want[k])
    if diff:
        raise DataError(path, f"recorded with other {', '.join(diff)}; use a new --out, or delete it to record it "
                              "again")


def _build_scenario(root: str, scenario: str, seeds: list[int], env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Record the expert in one scenario (reused when its file was recorded with these settings); its counts."""
    from core.io import write_json
    from sim.driving.registration import SCENARIOS
    from sim.recorder import EpisodeRecorder, ensure_recorded, env_metadata
    from sim.rollout import RolloutConfig, rollout

    path = scenario_file(root, scenario)
    env_id = SCENARIOS[scenario].env_id
    cfg = RolloutConfig(
        env_id=env_id,
        episodes=len(seeds),
        seed=seeds[0],
        policy="scripted",
        noise=0.0,
        env_kwargs=env_kwargs,
        progress=False,
    )
    spec = {"env_id": env_id, "seeds": seeds, "env_kwargs": env_kwargs, "policy": cfg.policy, "noise": cfg.noise,
            "labels": list(LABEL_KEYS)}

    def record(staging: Path) -> Path:
        log: dict[int, list] = {}
        factory = functools.partial(_LabellingExpert, log=log)
        metadata = env_metadata(env_id, env_kwargs)
        with EpisodeRecorder(staging, env_id, metadata, env_kwargs, video=False) as rec:
            result = rollout(
                cfg, policy=factory, on_episode=lambda ep: rec.add(_with_labels(ep, log.pop(ep.seed)))
            )
        write_json(path.parent / "config.json", {**cfg.to_dict(), "video": False, "labels": list(LABEL_KEYS)})
        write_json(path.parent / "summary.json", {**result.summary, "hdf5": path.name})
        return rec.path

    start = time.perf_counter()
    recorded = ensure_recorded(path, spec, record, hint="use a new --out, or delete it to record it again",
                               check_unrecorded=lambda p: _check_unrecorded(p, seeds, env_kwargs))
    return {**_counts(path), "skipped": not recorded, "wall_s": time.perf_counter() - start if recorded else 0.0}


def make_driving_dataset(
    out: str | Path,
    scenarios: Sequence[str] = DEFAULT_SCENARIOS,
    episodes: int = 20,
    seed: int = 0,
    image_size: int = 64,
    workers: int = 1,
    split: str = "train",
    horizon_s: float | None = None,
) -> Path:
    """Record the privileged expert in each scenario into ``out/<split>`` (layout in the module docstring).

    Deterministic given the arguments. A scenario file is recorded once (``sim.recorder.ensure_recorded``:
    its settings are kept in ``<file>.spec.json``), so an interrupted build resumes; a file recorded with
    other settings (seeds, env options) is refused. Files and ``meta.json`` are published atomically.

    Args:
        out: Dataset root.
        scenarios: Scenario names (``sim.driving.registration.SCENARIOS``).
        episodes: Episodes per scenario.
        seed: Base seed (see ``split_seeds``).
        image_size: Front camera height [px] (the camera is ``image_size`` x ``2 * image_size``).
        workers: Scenarios recorded in parallel (spawned processes: a script calling this with workers > 1
            needs the ``if __name__ == "__main__":`` guard).
        split: ``"train"`` or ``"test"``.
        horizon_s: Episode length [s]; each scenario's default when None.

    Returns:
        The split folder ``out/<split>``.
    """
    from core.io import write_json

    seeds = split_seeds(seed, episodes, split)
    scenarios = list(scenarios)
    for s in scenarios:
        scenario_file(out, s)  # validates the name
    if len(set(scenarios)) != len(scenarios) or not scenarios:
        raise ConfigError(f"scenarios: need distinct names, got {scenarios}")
    if workers < 1:
        raise ConfigError(f"workers: must be >= 1, got {workers}")
    root = Path(out) / split
    kwargs = _env_kwargs(image_size, horizon_s)
    if workers == 1:
        counts = [_build_scenario(str(root), s, seeds, kwargs) for s in scenarios]
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(min(workers, len(scenarios)), mp_context=mp.get_context("spawn")) as pool:
            counts = list(
                pool.map(
                    _build_scenario,
                    [str(root)] * len(scenarios),
                    scenarios,
                    [seeds] * len(scenarios),
                    [kwargs] * len(scenarios),
                )
            )
    meta = {
        "split": split,
        "scenarios": scenarios,
        "seed": int(seed),
        "seeds": seeds,
        "episodes": int(episodes),
        "image_size": [int(image_size), 2 * int(image_size)],
        "env_kwargs": kwargs,
        "policy": "scripted",
        "noise": 0.0,
        "label_keys": list(LABEL_KEYS),
        "files": {s: str(scenario_file(root, s).relative_to(root)) for s in scenarios},
        "counts": {
            s: {k: v for k, v in c.items() if k != "success"} | {"success_rate": float(np.mean(c["success"]))}
            for s, c in zip(scenarios, counts)
        },
    }
    write_json(root / META_FILE, meta)
    return root


# ------------------------------------------------------------------------------------------- dataset
class DrivingSamples(Dataset):
    """Per-step AutoMoT training samples over the files of ``make_driving_dataset``.

    Images and BEV come through ``core.data.trajectories.TrajectoryDataset`` (frame stacking, per-process
    HDF5 handles); the low-dimensional log of every episode is read once at construction through
    ``TrajectoryFile`` (future waypoints and speeds need the whole episode).

    Sample (step ``t`` of one episode; ego frame x forward, y left [m]):
        ``images``         (history, 3, H, W) float32 in [0, 1]: front frames t-history+1 .. t, the first
                           frame repeated before the episode start
        ``bev``            (6, Hb, Wb) float32 in [0, 1] (channels ``sim.driving.render.BEV_CHANNELS``)
        ``target_points``  (n_target_points, 2) float32: the first resampled route points
        ``ego``            (6,) float32 ``EGO_FIELDS``: speed [m/s], acceleration [m/s^2], steering [rad],
                           yaw rate [rad/s], lateral offset [m, + = left], heading error [rad]
        ``meta_action``    () int64, index into ``reasoning.META_ACTIONS``
        ``route``          (route_n, 2) float32, ``route_points(route, route_n, route_spacing)``
        ``waypoints``      (6, 2) float32 ``future_waypoints`` of the logged poses (3 s at 2 Hz)
        ``expert_waypoints`` (6, 2) float32 the planner's look-ahead at step t
        ``velocity``       () float32 the logged speed 1 s later [m/s] (the last one past the end)
        ``instruction``, ``reasoning``, ``scenario``: str; ``episode`` () int64 (index into
                           ``self.episodes``), ``step`` () int64 ``t``
        ``qa``             list of (question, answer) (only with ``qa=True``; ``reasoning.scene_qa`` with a
                           generator seeded by (qa_seed, episode, step))

    Args:
        root: Dataset root (``out`` of ``make_driving_dataset``).
        split: Sub-folder to read.
        scenarios: Scenarios to read; all of the split's ``meta.json`` when None.
        history: Number of front frames.
        stride: Step between anchors inside an episode.
        n_target_points: Number of target points.
        route_n: Number of route points.
        route_spacing: Route point spacing [m]; the logged spacing when None.
        qa: Add scene QA pairs.
        qa_seed: Seed of the QA generators.

    Raises:
        DataError: A scenario file is missing or corrupt, or lacks a key (the message names the file).
    """

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        scenarios: Sequence[str] | None = None,
        history: int = 2,
        stride: int = 1,
        n_target_points: int = 4,
        route_n: int = 20,
        route_spacing: float | None = None,
        qa: bool = False,
        qa_seed: int = 0,
    ):
        from core.data.trajectories import TrajectoryDataset
        from core.io import read_json

        if history < 1 or stride < 1 or n_target_points < 1 or route_n < n_target_points:
            raise ConfigError(
                f"history={history}, stride={stride} must be >= 1 and 1 <= n_target_points="
                f"{n_target_points} <= route_n={route_n}"
            )
        self.root = Path(root) / split
        if scenarios is None:
            meta_path = self.root / META_FILE
            if not meta_path.exists():
                raise DataError(meta_path, "no such file (build the split with make_driving_dataset)")
            scenarios = read_json(meta_path)["scenarios"]
        self.scenarios = list(scenarios)
        self.history, self.stride = int(history), int(stride)
        self.n_target_points, self.route_n, self.route_spacing = (
            int(n_target_points),
            int(route_n),
            route_spacing,
        )
        self.qa, self.qa_seed = bool(qa), int(qa_seed)
        paths = [scenario_file(self.root, s) for s in self.scenarios]
        for p in paths:
            if not p.exists():
                raise DataError(p, "no such file (build it with make_driving_dataset)")
        self._frames = TrajectoryDataset(
            paths, obs_keys=["image"], frame_stack=self.history, stride=self.stride, cache="none"
        )
        self._bev = TrajectoryDataset(paths, obs_keys=["bev"], stride=self.stride, cache="none")
        if len(self._frames) != len(self._bev) or self._frames.episodes != self._bev.episodes:
            raise DataError(paths[0], "image and bev index different steps")  # cannot happen for our files
        self.episodes = self._frames.episodes
        by_path = {str(p): s for p, s in zip(paths, self.scenarios)}
        self._scenario = [by_path[e.path] for e in self.episodes]
        self._logs = [self._read_log(e.path, e.name) for e in self.episodes]

    @staticmethod
    def _read_log(path: str, name: str) -> dict[str, Any]:
        from core.data.trajectories import TrajectoryFile

        keys = ["ego_state", "proprio", "route", "agents", *LABEL_KEYS]
        with TrajectoryFile(path) as f:
            log = {k: f.read(name, f"obs/{k}") for k in keys}
            last = f.read(name, "next_obs/ego_state", slice(-1, None))
            dt = 1.0 / float((f.env_meta.get("env_kwargs") or {}).get("policy_frequency", POLICY_FREQUENCY))
        log["poses"] = np.concatenate([log["ego_state"], last]).astype(np.float64)  # (T + 1, 9)
        log["dt"] = dt
        return log

    def __len__(self) -> int:
        return len(self._frames)

    def __getitem__(self, index: int) -> dict[str, Any]:
        from driving.automot.reasoning import navigation_instruction, reasoning_text, scene_qa

        frames, bev = self._frames[index], self._bev[index]
        ei, t = int(frames["episode_index"]), int(frames["timestep"])
        log, scenario = self._logs[ei], self._scenario[ei]
        poses, dt = log["poses"], log["dt"]
        ahead = min(t + int(round(1.0 / dt)), len(poses) - 1)
        obs = {k: log[k][t] for k in ("ego_state", "proprio", "route", "agents")}
        info = {"meta_action": int(log["meta_action"][t]), "speed": float(log["ego_state"][t, 3])}
        route = route_points(log["route"][t], self.route_n, self.route_spacing)
        bev_u8 = bev["obs.bev"][0]  # (6, Hb, Wb) float32 holding 0 / 255
        sample = {
            "images": frames["obs.image"].float() / 255.0,
            "bev": bev_u8 / 255.0,
            "target_points": torch.from_numpy(route[: self.n_target_points].copy()),
            "ego": torch.from_numpy(ego_features(log["ego_state"][t])),
            "meta_action": torch.tensor(info["meta_action"], dtype=torch.long),
            "route": torch.from_numpy(route),
            "waypoints": torch.from_numpy(future_waypoints(poses[:, :3], t, dt).astype(np.float32)),
            "expert_waypoints": torch.from_numpy(log["expert_waypoints"][t].astype(np.float32)),
            "velocity": torch.tensor(poses[ahead, 3], dtype=torch.float32),
            "instruction": navigation_instruction(obs, info, scenario),
            "reasoning": reasoning_text(obs, info),
            "scenario": scenario,
            "episode": torch.tensor(ei, dtype=torch.long),
            "step": torch.tensor(t, dtype=torch.long),
        }
        if self.qa:
            rng = np.random.default_rng((self.qa_seed, ei, t))
            sample["qa"] = scene_qa({**obs, "bev": bev_u8.numpy()}, info, rng)
        return sample

    def __repr__(self) -> str:
        return (
            f"DrivingSamples(root={str(self.root)!r}, scenarios={self.scenarios}, episodes={len(self.episodes)}, "
            f"samples={len(self)}, history={self.history}, stride={self.stride})"
        )


def collate_driving(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Batch samples: tensors stacked on a new leading axis (B, ...), strings and other values kept as lists."""
    if not samples:
        raise ValueError("collate_driving: no samples")
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        out[key] = torch.stack(values) if isinstance(values[0], torch.Tensor) else values
    return out
