"""Open-loop planning metrics on held-out expert driving logs: L2 at 1 / 2 / 3 s and collision rate.

Core functions (pure NumPy, ego frame: x forward, y left, metres):

``l2_at_horizons(pred, gt, hz=2.0)``: ``pred`` / ``gt`` (B, T, 2) waypoints at t = 1/hz, 2/hz, ... s.
    ``l2_{h}s``      mean over samples of the Euclidean error of the point AT h seconds (the 2nd, 4th, 6th
                     point at 2 Hz): UniAD's convention.
    ``l2_avg_{h}s``  mean over samples and over the points up to h seconds (points 1..2h at 2 Hz): the
                     ST-P3 / VAD convention (their "L2 at 2 s" averages 0.5, 1, 1.5 and 2 s).
    ``l2_mean`` / ``l2_avg_mean``  the means of the three horizon values (each paper's "Avg." column).
``trajectory_collisions(pred, agents_future)``: whether the ego's box (5 x 2 m, heading along the
    trajectory) at each predicted point overlaps an agent's box at the same time (separating-axis test on
    oriented rectangles); (B,) bool, or (B, T) with ``per_step=True``. The collision rate is its mean.

On logs (``evaluate_openloop``): an HDF5 driving log of ``sim.recorder`` / ``embodied drive eval`` (obs
``ego_state`` = world pose x, y, yaw, and ``agents`` (N, 8) = presence, x, y, vx, vy, yaw, length, width
in the ego frame of that step, 5 Hz). Ground truth at step t = the logged future ego positions at
t + 0.5 s, ..., t + 3 s (linear interpolation between the 0.2 s steps) in the ego frame of t; steps
without 3 s of future are skipped. Agents' futures are approximated by their logged boxes at the step
nearest each waypoint time (the log does not track identities, so no interpolation), moved into the
ego frame of t. ``gt_collision_rate`` (the same test on the ground-truth trajectory) shows the
approximation's floor: the expert itself should score ~0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HORIZONS_S: tuple[float, ...] = (1.0, 2.0, 3.0)
EGO_SIZE: tuple[float, float] = (5.0, 2.0)  # (length, width) [m]


def _as_batch(a: np.ndarray, ndim: int) -> tuple[np.ndarray, bool]:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == ndim - 1:
        return a[None], True
    if a.ndim != ndim:
        raise ValueError(f"expected a {ndim - 1}-d or {ndim}-d array, got shape {a.shape}")
    return a, False


def l2_at_horizons(pred: np.ndarray, gt: np.ndarray, hz: float = 2.0, horizons: Sequence[float] = HORIZONS_S,
                   valid: np.ndarray | None = None) -> dict[str, float]:
    """L2 errors at (``l2_{h}s``) and averaged up to (``l2_avg_{h}s``) each horizon; see the module docstring.

    Args:
        pred: (B, T, 2) or (T, 2) predicted waypoints, point k at (k + 1) / hz seconds.
        gt: Ground truth of the same shape.
        hz: Waypoints per second (2.0: 0.5 s spacing, 6 points = 3 s).
        horizons: Horizons in seconds; each must fall on a waypoint (h * hz an integer <= T).
        valid: Optional (B, T) bool mask of ground-truth points to count.

    Returns:
        ``{"l2_1s", "l2_avg_1s", ..., "l2_mean", "l2_avg_mean"}`` [m] (NaN where no valid point).
    """
    p, _ = _as_batch(pred, 3)
    g, _ = _as_batch(gt, 3)
    if p.shape != g.shape or p.shape[-1] != 2:
        raise ValueError(f"pred {p.shape} and gt {g.shape} must both be (B, T, 2)")
    err = np.linalg.norm(p - g, axis=-1)  # (B, T)
    mask = np.ones_like(err, dtype=bool) if valid is None else np.broadcast_to(np.asarray(valid, bool), err.shape)
    out: dict[str, float] = {}

    def masked_mean(e: np.ndarray, m: np.ndarray) -> float:
        return float(e[m].mean()) if m.any() else float("nan")

    for h in horizons:
        k = h * hz
        if abs(k - round(k)) > 1e-6 or not 1 <= round(k) <= err.shape[1]:
            raise ValueError(f"horizon {h} s does not fall on one of the {err.shape[1]} waypoints at {hz} Hz")
        k = int(round(k))
        name = f"{h:g}s"
        out[f"l2_{name}"] = masked_mean(err[:, k - 1], mask[:, k - 1])
        out[f"l2_avg_{name}"] = masked_mean(err[:, :k], mask[:, :k])
    out["l2_mean"] = float(np.mean([out[f"l2_{h:g}s"] for h in horizons]))
    out["l2_avg_mean"] = float(np.mean([out[f"l2_avg_{h:g}s"] for h in horizons]))
    return out


def _box_corners(center: np.ndarray, yaw: np.ndarray, length: np.ndarray, width: np.ndarray) -> np.ndarray:
    """(..., 2), (...), (...), (...) -> (..., 4, 2) rectangle corners."""
    c, s = np.cos(yaw)[..., None], np.sin(yaw)[..., None]
    lx = np.array([0.5, 0.5, -0.5, -0.5]) * np.asarray(length)[..., None]
    ly = np.array([0.5, -0.5, -0.5, 0.5]) * np.asarray(width)[..., None]
    return np.stack([center[..., 0:1] + c * lx - s * ly, center[..., 1:2] + s * lx + c * ly], axis=-1)


def boxes_overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Separating-axis test of oriented rectangles given by corners (..., 4, 2) (broadcast); touching counts."""
    out = np.ones(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), dtype=bool)
    for box in (a, b):
        for i in (0, 1):  # two edge normals per rectangle
            edge = box[..., i + 1, :] - box[..., i, :]
            axis = np.stack([-edge[..., 1], edge[..., 0]], axis=-1)[..., None, :]  # (..., 1, 2)
            pa = (a * axis).sum(-1)
            pb = (b * axis).sum(-1)
            sep = (pa.max(-1) < pb.min(-1)) | (pb.max(-1) < pa.min(-1))
            out &= ~sep
    return out


def trajectory_headings(traj: np.ndarray, min_step: float = 0.1) -> np.ndarray:
    """(B, T, 2) ego-frame waypoints -> (B, T) headings [rad]: the direction from the previous point (the
    origin for the first); kept from the previous point (0 = straight ahead at the start) for steps < ``min_step`` m."""
    prev = np.concatenate([np.zeros_like(traj[:, :1]), traj[:, :-1]], axis=1)
    d = traj - prev
    yaw = np.arctan2(d[..., 1], d[..., 0])
    moving = np.linalg.norm(d, axis=-1) >= min_step
    out = np.zeros(traj.shape[:2])
    last = np.zeros(traj.shape[0])
    for t in range(traj.shape[1]):
        last = np.where(moving[:, t], yaw[:, t], last)
        out[:, t] = last
    return out


def trajectory_collisions(pred: np.ndarray, agents_future: np.ndarray, ego_size: tuple[float, float] = EGO_SIZE,
                          agent_size: tuple[float, float] = EGO_SIZE, per_step: bool = False) -> np.ndarray:
    """Whether the predicted ego trajectory hits an agent's box at the same time step.

    Args:
        pred: (B, T, 2) or (T, 2) ego-frame waypoints [m]; the ego box is ``ego_size`` (length, width),
            heading along the trajectory (``trajectory_headings``).
        agents_future: (B, T, N, D) or (T, N, D) agents at the waypoint times in the same ego frame:
            D = 2 (x, y; boxes of ``agent_size`` aligned with the ego's x axis) or D = 5 (x, y, yaw,
            length, width). Rows with a NaN x are absent.
        per_step: Return (B, T) per waypoint instead of (B,) "any along the trajectory".

    Returns:
        bool array (B,) or (B, T) (without the batch axis when ``pred`` had none).
    """
    p, single = _as_batch(pred, 3)
    ag, _ = _as_batch(agents_future, 4)
    if ag.shape[:2] != p.shape[:2]:
        raise ValueError(f"agents_future {ag.shape} must share (B, T) with pred {p.shape}")
    if ag.shape[-1] == 2:
        n = ag.shape[:-1]
        ag = np.concatenate([ag, np.zeros(n + (1,)), np.full(n + (1,), agent_size[0]),
                             np.full(n + (1,), agent_size[1])], axis=-1)
    elif ag.shape[-1] != 5:
        raise ValueError(f"agents_future: last axis must be 2 (x, y) or 5 (x, y, yaw, length, width), got {ag.shape}")
    present = np.isfinite(ag[..., 0])
    ag = np.where(present[..., None], ag, 1e6)  # absent agents far away (and finite)
    yaw = trajectory_headings(p)
    ego = _box_corners(p, yaw, np.full(yaw.shape, ego_size[0]), np.full(yaw.shape, ego_size[1]))  # (B, T, 4, 2)
    others = _box_corners(ag[..., :2], ag[..., 2], ag[..., 3], ag[..., 4])  # (B, T, N, 4, 2)
    hit = boxes_overlap(ego[:, :, None], others) & present  # (B, T, N)
    hit = hit.any(-1) if hit.shape[-1] else np.zeros(p.shape[:2], dtype=bool)
    out = hit if per_step else hit.any(-1)
    return out[0] if single else out


# ------------------------------------------------------------------------------------------------ logs
def _to_ego(points_world: np.ndarray, pose: np.ndarray) -> np.ndarray:
    """World points (..., 2) -> the ego frame of ``pose`` = (x, y, yaw)."""
    d = points_world - pose[:2]
    c, s = np.cos(pose[2]), np.sin(pose[2])
    return np.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]], axis=-1)


def future_targets(ego_state: np.ndarray, agents: np.ndarray | None, dt: float, n: int = 6,
                   spacing: float = 0.5) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Ground-truth future waypoints (and agents' boxes) for every step of one logged episode.

    Args:
        ego_state: (S, >=3) world poses (x, y, yaw) at the logged steps, ``dt`` apart.
        agents: Optional (S, N, 8) agents (``DrivingEnv`` layout: presence, x, y, vx, vy, yaw, length,
            width; ego frame of each step).
        dt: Log period [s]; ``n`` waypoints ``spacing`` seconds apart.

    Returns:
        ``waypoints`` (S, n, 2) in the ego frame of each step, ``agents_future`` (S, n, N, 5) (x, y, yaw,
        length, width; NaN rows absent) or None, and ``valid`` (S,) bool (the log covers the n-th waypoint).
    """
    ego_state = np.asarray(ego_state, dtype=np.float64)
    steps = len(ego_state)
    times = np.arange(steps) * dt
    wp = np.zeros((steps, n, 2))
    af = None if agents is None else np.full((steps, n, agents.shape[1], 5), np.nan)
    valid = times + n * spacing <= times[-1] + 1e-9
    for t in range(steps):
        tq = times[t] + spacing * np.arange(1, n + 1)
        xy = np.stack([np.interp(tq, times, ego_state[:, k]) for k in (0, 1)], -1)
        wp[t] = _to_ego(xy, ego_state[t, :3])
        if agents is None:
            continue
        for k, s in enumerate(np.clip(np.round(tq / dt).astype(int), 0, steps - 1)):
            a = agents[s]
            pose = ego_state[s, :3]
            c, sn = np.cos(pose[2]), np.sin(pose[2])
            world = pose[:2] + np.stack([c * a[:, 1] - sn * a[:, 2], sn * a[:, 1] + c * a[:, 2]], -1)
            xy_t = _to_ego(world, ego_state[t, :3])
            yaw_t = a[:, 5] + pose[2] - ego_state[t, 2]
            boxes = np.concatenate([xy_t, yaw_t[:, None], a[:, 6:8]], -1)
            boxes[a[:, 0] < 0.5] = np.nan
            af[t, k] = boxes
    return wp.astype(np.float32), (None if af is None else af.astype(np.float32)), valid


def evaluate_openloop(predict: Callable[[Mapping[str, np.ndarray]], np.ndarray], path: str | Path,
                      batch_size: int = 32, episodes: Sequence[str] | None = None, n: int = 6, spacing: float = 0.5,
                      dt: float | None = None, keys: Sequence[str] | None = None,
                      max_samples: int | None = None) -> dict[str, Any]:
    """Open-loop metrics of ``predict`` on the steps of a logged driving HDF5 file.

    Args:
        predict: ``predict(batch) -> (B, n, 2)`` ego-frame waypoints ``spacing`` s apart; ``batch`` maps each
            obs key (``image``, ``bev``, ``ego_state``, ``proprio``, ``route``, ``agents``) to (B, ...) arrays
            of the logged observations, plus ``language_instruction`` (list of str).
        path: The log (``sim.recorder`` layout, e.g. ``DIR/<scenario>/*.hdf5`` of ``embodied drive eval``).
        episodes: Episode groups to use (default all), e.g. a held-out split.
        dt: Log period [s] (default: from the env's policy frequency in the file's metadata, else 0.2).
        keys: Obs keys to put in the batch (default all).
        max_samples: Stop after this many samples.

    Returns:
        ``{"samples", "l2_1s", "l2_avg_1s", ..., "l2_mean", "l2_avg_mean", "collision_rate",
        "gt_collision_rate"}``.
    """
    from core.data.trajectories import TrajectoryFile

    preds, gts, agents_all = [], [], []
    with TrajectoryFile(path) as f:
        if dt is None:
            freq = (f.env_meta.get("env_kwargs") or {}).get("policy_frequency", 5)
            dt = 1.0 / float(freq)
        instruction = f.language_instruction or ""
        names = list(episodes) if episodes is not None else list(f.episodes)
        total = 0
        for name in names:
            obs_keys = [k for k in f.obs_keys(name) if keys is None or k in keys]
            ego = np.concatenate([f.read(name, "obs/ego_state"), f.read(name, "next_obs/ego_state")[-1:]])
            ag = np.concatenate([f.read(name, "obs/agents"), f.read(name, "next_obs/agents")[-1:]])
            wp, af, valid = future_targets(ego, ag, dt, n, spacing)
            idx = np.flatnonzero(valid[:-1])  # obs steps (the last entry is the final next_obs)
            if max_samples is not None:
                idx = idx[: max(max_samples - total, 0)]
            for start in range(0, len(idx), batch_size):
                sel = idx[start : start + batch_size]
                batch: dict[str, Any] = {k: f.read(name, f"obs/{k}", sel) for k in obs_keys
                                         if k not in ("eef_delta",)}
                batch["language_instruction"] = [instruction] * len(sel)
                out = np.asarray(predict(batch), dtype=np.float64)
                if out.shape != (len(sel), n, 2):
                    raise ValueError(f"predict returned shape {out.shape}, expected {(len(sel), n, 2)}")
                preds.append(out)
                gts.append(wp[sel])
                agents_all.append(af[sel])
            total += len(idx)
            if max_samples is not None and total >= max_samples:
                break
    if not preds:
        raise ValueError(f"{path}: no step has {n * spacing:g} s of logged future")
    pred, gt, agents = np.concatenate(preds), np.concatenate(gts), np.concatenate(agents_all)
    result: dict[str, Any] = {"samples": int(len(pred))}
    result.update(l2_at_horizons(pred, gt, hz=1.0 / spacing,
                                 horizons=[h for h in HORIZONS_S if h <= n * spacing + 1e-9]))
    result["collision_rate"] = float(trajectory_collisions(pred, agents).mean())
    result["gt_collision_rate"] = float(trajectory_collisions(gt, agents).mean())
    return result
