"""NAVSIM's PDM score (v1: PDMS) and extended PDM score (v2: EPDMS) from closed-loop driving episodes.

NAVSIM scores a planner on 4 s scenes. We cut each closed-loop episode into consecutive scenes of
``SCENE_S`` = 4 s (20 steps at 5 Hz; the last may be shorter when the episode ends), score every scene from
the simulator's privileged state, then average: per episode over its scenes, per scenario over all scenes of
all its episodes (the score is computed per scene and THEN averaged: the mean of sub-scores is reported beside
it but is not the score — a run whose scenes each fail one multiplier scores 0 with every averaged sub-score
at 0.5).

Sub-scores of one scene (as NAVSIM defines them; our simulator's counterpart in brackets):

NC   no at-fault collision, multiplier in {0, 1/2, 1}: 0 after an at-fault collision with a vehicle, 1/2 with a
     static object, 1 otherwise. A collision is NOT at fault (nuPlan's rules) when the ego stands
     (speed < ``STOPPED_SPEED``), when the other hits it from behind, or from the side while the ego keeps its
     lane (centre within ``LANE_CHANGE_OFFSET_M`` of its lane's centre); front collisions and side collisions
     while changing lanes are the ego's fault (``collision_fault``; the env records it in
     ``info["collision_at_fault"]``).
DAC  drivable-area compliance, multiplier in {0, 1}: 0 when the ego leaves the road in the scene [the env's
     off-road test: the ego's centre more than 1 m outside every lane; NAVSIM tests the box's corners
     against the map's drivable polygons].
DDC  driving-direction compliance (v2), multiplier in {0, 1/2, 1}: the distance driven against the direction
     of the lane the ego is on (``info["oncoming_m"]``, summed over the scene): <= 2 m -> 1, <= 6 m -> 1/2,
     else 0.
TLC  traffic-light compliance (v2), multiplier: highway-env has no traffic lights, so always 1 (not
     computable: listed as such in reports).
TTC  time to collision within bound, weight 5, {0, 1}: 0 when, at some step, the ego moving at constant
     velocity would overlap a vehicle ahead of it (also moving at constant velocity) within ``TTC_HORIZON_S``
     = 0.9 s (checked every 0.1 s; ``ttc_violation``, recorded in ``info["ttc_violation"]``).
EP   ego progress, weight 5, [0, 1]: the ego's progress along the route in the scene over the progress of the
     privileged planner from the scene's first state (the IDM + MOBIL expert's 4 s non-reactive look-ahead,
     ``info["reference_progress_m"]``; NAVSIM's PDM-Closed plays this role), clipped to [0, 1]; 1 when the
     planner itself would progress less than ``EP_MIN_REFERENCE_M`` (e.g. waiting at a yield line). A shorter
     last scene compares with the planner's progress over the same share of 4 s.
C    comfort (v1), weight 2, {0, 1}: every step of the scene within nuPlan's bounds (``COMFORT_BOUNDS``:
     longitudinal acceleration, lateral acceleration, jerk, yaw rate, yaw acceleration).
HC   history comfort (v2), weight 2: the same bounds over the scene together with the step before it (the
     motion history it continues).
LK   lane keeping (v2), weight 2, {0, 1}: 0 when the ego's centre stays more than ``LK_OFFSET_M`` = 0.5 m from
     its lane's centre for longer than ``LK_DURATION_S`` = 2 s in a row; disabled inside junctions
     (``info["at_junction"]``: the intersection's and roundabout's central areas), as NAVSIM disables it on
     intersections.
EC   extended comfort (v2), weight 2: compares the plans of consecutive frames; closed-loop policies here
     return actions, not plans, so EC is not computable and counts 1 (listed as such in reports).

PDMS  = NC * DAC * (5 TTC + 5 EP + 2 C) / 12
EPDMS = f(NC) f(DAC) f(DDC) f(TLC) * (5 f(TTC) + 5 f(EP) + 2 f(LK) + 2 f(HC) + 2 f(EC)) / 16, with NAVSIM v2's
        false-positive filter f(m) = 1 when the reference driver also scores 0 on m in that scene, else m.
        NAVSIM's reference is the human log; ours is the privileged expert's 4 s look-ahead from the scene's
        first state, which gives DAC, DDC and LK (``reference_offroad``, ``reference_oncoming_m``,
        ``reference_lane_violation`` in the first info); the look-ahead is non-reactive and collision-free by
        construction, so NC, TTC, HC and EP are not filtered.

A failed scene (the policy raised / returned a NaN action, the simulator diverged) scores 0 on both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

SCENE_S = 4.0  # [s] NAVSIM's scene horizon
STOPPED_SPEED = 0.05  # [m/s] below this the ego stands: a collision is not its fault (nuPlan)
LANE_CHANGE_OFFSET_M = 1.0  # [m] ego centre this far from its lane centre: its box crosses the lane line
TTC_HORIZON_S = 0.9  # [s]
TTC_STEP_S = 0.1  # [s]
DDC_LIMITS_M = (2.0, 6.0)  # [m] oncoming distance: <= first -> 1, <= second -> 0.5, else 0
LK_OFFSET_M = 0.5  # [m]
LK_DURATION_S = 2.0  # [s]
EP_MIN_REFERENCE_M = 5.0  # [m]
SMOOTHING_S = 1.0  # [s] window of the Savitzky-Golay derivative estimates (comfort)
# nuPlan's ego-comfort bounds: longitudinal acceleration [m/s^2] (min, max), |lateral acceleration| [m/s^2],
# |jerk| [m/s^3], |yaw rate| [rad/s], |yaw acceleration| [rad/s^2]
COMFORT_BOUNDS: dict[str, Any] = {"lon_acc_mps2": (-4.05, 2.40), "lat_acc_mps2": 4.89, "jerk_mps3": 4.13,
                                  "yaw_rate_rps": 0.95, "yaw_acc_rps2": 1.93}
PDMS_WEIGHTS = {"ttc": 5.0, "ep": 5.0, "c": 2.0}
EPDMS_WEIGHTS = {"ttc": 5.0, "ep": 5.0, "lk": 2.0, "hc": 2.0, "ec": 2.0}
#: Sub-scores this simulator cannot compute, with the reason (reports list them; they count 1).
NOT_COMPUTABLE = {"tlc": "highway-env has no traffic lights",
                  "ec": "needs the policy's plans at consecutive frames; the closed-loop policies return actions"}
SUBSCORES = ("nc", "dac", "ddc", "tlc", "ttc", "ep", "c", "hc", "lk", "ec")


# ------------------------------------------------------------------------------------------ geometry
def box_corners(boxes: np.ndarray) -> np.ndarray:
    """(M, 5) boxes ``(x, y, heading, length, width)`` -> (M, 4, 2) corners (any right- or left-handed frame)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 5)
    c, s = np.cos(b[:, 2]), np.sin(b[:, 2])
    half_l, half_w = b[:, 3] / 2, b[:, 4] / 2
    local = np.array([[1, 1], [1, -1], [-1, -1], [-1, 1]], dtype=np.float64)  # (4, 2) in units of the halves
    lx, ly = local[None, :, 0] * half_l[:, None], local[None, :, 1] * half_w[:, None]
    return np.stack([b[:, None, 0] + c[:, None] * lx - s[:, None] * ly,
                     b[:, None, 1] + s[:, None] * lx + c[:, None] * ly], axis=-1)


def boxes_overlap(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """(M,) bool: whether oriented box ``box`` (5,) overlaps each of ``others`` (M, 5) (separating-axis test)."""
    others = np.asarray(others, dtype=np.float64).reshape(-1, 5)
    return pairs_overlap(np.broadcast_to(np.asarray(box, dtype=np.float64), others.shape), others)


def pairs_overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(M,) bool: whether box ``a[i]`` overlaps box ``b[i]``, both (M, 5) (separating-axis test, vectorised)."""
    if not len(b):
        return np.zeros(0, dtype=bool)
    ca, cb = box_corners(a), box_corners(b)  # (M, 4, 2)
    overlap = np.ones(len(b), dtype=bool)
    for corners in (ca, cb):  # the 2 edge directions of each box are the candidate separating axes
        for k in (1, 3):
            axis = corners[:, k] - corners[:, 0]
            axis = axis / (np.linalg.norm(axis, axis=1, keepdims=True) + 1e-12)  # (M, 2)
            pa = np.einsum("mcd,md->mc", ca, axis)
            pb = np.einsum("mcd,md->mc", cb, axis)
            overlap &= (pb.max(1) >= pa.min(1)) & (pb.min(1) <= pa.max(1))
    return overlap


def ttc_violation(ego_box: np.ndarray, ego_velocity: np.ndarray, boxes: np.ndarray, velocities: np.ndarray,
                  horizon_s: float = TTC_HORIZON_S, step_s: float = TTC_STEP_S) -> bool:
    """Whether the moving ego, projected at constant velocity, would overlap a vehicle ahead within ``horizon_s``.

    Args:
        ego_box: (5,) ``(x, y, heading, length, width)``; ego_velocity: (2,) [m/s], same frame.
        boxes, velocities: (M, 5) and (M, 2) of the other vehicles (static objects: zero velocity).

    Only vehicles whose centre lies ahead of the ego's centre (along its heading) count, and none the ego
    already overlaps (that is a collision, scored by NC), as nuPlan counts only the ego's at-fault side. Vehicles
    too far to meet the ego within the horizon (centre distance above both boxes' half diagonals plus both
    speeds times the horizon) are left out before the box tests, which run for every time step at once.
    """
    ego_box, ego_velocity = np.asarray(ego_box, dtype=np.float64), np.asarray(ego_velocity, dtype=np.float64)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 5)
    velocities = np.asarray(velocities, dtype=np.float64).reshape(-1, 2)
    speed = float(np.linalg.norm(ego_velocity))
    if not len(boxes) or speed < STOPPED_SPEED:
        return False
    rel = boxes[:, :2] - ego_box[:2]
    reach = (np.hypot(boxes[:, 3], boxes[:, 4]) + np.hypot(ego_box[3], ego_box[4])) / 2 \
        + (speed + np.linalg.norm(velocities, axis=1)) * horizon_s
    forward = np.array([np.cos(ego_box[2]), np.sin(ego_box[2])])
    near = (rel @ forward > 0) & (np.linalg.norm(rel, axis=1) <= reach)
    if not near.any():
        return False
    boxes, velocities = boxes[near], velocities[near]
    candidates = ~boxes_overlap(ego_box, boxes)
    if not candidates.any():
        return False
    boxes, velocities = boxes[candidates], velocities[candidates]
    times = np.arange(1, int(round(horizon_s / step_s)) + 1) * step_s  # (T,)
    moved = np.repeat(boxes[None], len(times), 0)  # (T, M, 5)
    moved[..., :2] += times[:, None, None] * velocities[None]
    moved_ego = np.repeat(ego_box[None, None], len(times), 0).repeat(len(boxes), 1)
    moved_ego[..., :2] += times[:, None, None] * ego_velocity
    return bool(pairs_overlap(moved_ego.reshape(-1, 5), moved.reshape(-1, 5)).any())


def collision_fault(ego_speed: float, other_xy_ego: Sequence[float], lane_offset_m: float) -> tuple[str, bool]:
    """nuPlan's collision type and whether it is the ego's fault.

    Args:
        ego_speed: [m/s] at the collision.
        other_xy_ego: The other object's centre in the ego frame (x forward, y left) [m].
        lane_offset_m: The ego centre's distance from its lane's centre [m].

    Returns:
        ``("stopped_ego" | "rear" | "front" | "lateral", at_fault)``: a standing ego or a hit from behind is not
        at fault; a front collision is; a lateral one is when the ego is changing lanes (centre more than
        ``LANE_CHANGE_OFFSET_M`` off its lane's centre).
    """
    x, y = float(other_xy_ego[0]), float(other_xy_ego[1])
    if ego_speed < STOPPED_SPEED:
        return "stopped_ego", False
    angle = abs(np.degrees(np.arctan2(y, x)))  # 0: straight ahead, 180: straight behind
    if angle >= 135.0:
        return "rear", False
    if angle <= 45.0:
        return "front", True
    return "lateral", abs(lane_offset_m) > LANE_CHANGE_OFFSET_M


# ------------------------------------------------------------------------------------------- scoring
def comfortable(speeds: Sequence[float], yaw_rates: Sequence[float], dt: float) -> bool:
    """Whether a motion (speeds [m/s] and yaw rates [rad/s] at steps ``dt`` apart) is within ``COMFORT_BOUNDS``.

    Derivatives are Savitzky-Golay estimates (polynomial order 2 over ``SMOOTHING_S`` = 1 s, as nuPlan's comfort
    metrics smooth theirs), so a 5 Hz controller's steps do not read as jerk; too short a motion is judged on
    what it has (no jerk under 3 samples, nothing under 2).
    """
    v = np.asarray(speeds, dtype=np.float64)
    w = np.asarray(yaw_rates, dtype=np.float64)
    if len(v) < 2:
        return True
    lo, hi = COMFORT_BOUNDS["lon_acc_mps2"]
    acc, jerk = _derivatives(v, dt, 2)
    (yaw_acc,) = _derivatives(w, dt, 1)
    return bool(((acc >= lo) & (acc <= hi)).all() and (np.abs(v * w) <= COMFORT_BOUNDS["lat_acc_mps2"]).all()
                and (np.abs(jerk) <= COMFORT_BOUNDS["jerk_mps3"]).all()
                and (np.abs(w) <= COMFORT_BOUNDS["yaw_rate_rps"]).all()
                and (np.abs(yaw_acc) <= COMFORT_BOUNDS["yaw_acc_rps2"]).all())


def _derivatives(x: np.ndarray, dt: float, order: int) -> list[np.ndarray]:
    """The first ``order`` derivatives of ``x`` (Savitzky-Golay, polyorder 2, window ~``SMOOTHING_S``)."""
    from scipy.signal import savgol_filter

    window = min(max(int(round(SMOOTHING_S / dt)) | 1, 3), len(x) if len(x) % 2 else len(x) - 1)
    if window < 3:  # two samples: a finite difference, no second derivative
        return [np.diff(x) / dt] + [np.zeros(0)] * (order - 1)
    return [savgol_filter(x, window, 2, deriv=d, delta=dt, mode="interp") for d in range(1, order + 1)]


def ddc_score(oncoming_m: float) -> float:
    """Driving-direction compliance from the distance driven against the lane's direction [m]."""
    return 1.0 if oncoming_m <= DDC_LIMITS_M[0] else 0.5 if oncoming_m <= DDC_LIMITS_M[1] else 0.0


def lane_keeping(offsets_m: Sequence[float], at_junction: Sequence[bool], dt: float) -> float:
    """0 when the offset stays above ``LK_OFFSET_M`` (outside junctions) for longer than ``LK_DURATION_S``."""
    run = 0
    for off, junction in zip(offsets_m, at_junction, strict=True):
        run = run + 1 if (abs(off) > LK_OFFSET_M and not junction) else 0
        if run * dt > LK_DURATION_S:
            return 0.0
    return 1.0


def pdms(s: Mapping[str, float]) -> float:
    """NAVSIM v1's PDMS of one scene's sub-scores."""
    weighted = sum(PDMS_WEIGHTS[k] * s[k] for k in PDMS_WEIGHTS) / sum(PDMS_WEIGHTS.values())
    return float(s["nc"] * s["dac"] * weighted)


def epdms(s: Mapping[str, float], reference: Mapping[str, float] | None = None) -> float:
    """NAVSIM v2's EPDMS of one scene's sub-scores, a sub-score voided (1) where ``reference`` scores it 0."""
    ref = reference or {}

    def f(k: str) -> float:
        return 1.0 if ref.get(k, 1.0) == 0.0 else float(s[k])

    weighted = sum(EPDMS_WEIGHTS[k] * f(k) for k in EPDMS_WEIGHTS) / sum(EPDMS_WEIGHTS.values())
    return float(f("nc") * f("dac") * f("ddc") * f("tlc") * weighted)


def scene_scores(infos: Sequence[Mapping[str, Any]], start: Mapping[str, Any], dt: float,
                 route_length_m: float | None = None, previous_speed: float | None = None,
                 previous_yaw_rate: float | None = None, failed: bool = False) -> dict[str, float]:
    """Sub-scores, PDMS and EPDMS of one scene.

    Args:
        infos: The scene's step infos (``DrivingEnv``'s), at most ``SCENE_S / dt``.
        start: The info of the state the scene starts from (the reset info, or the step before the scene).
        dt: Policy period [s].
        route_length_m: For finite routes: the planner's progress is capped at what is left of the route.
        previous_speed, previous_yaw_rate: The motion of the step before the scene (history comfort).
        failed: The policy or the simulator failed in this scene: it scores 0.
    """
    n = len(infos)
    if n == 0:
        raise ValueError("scene_scores: a scene needs at least one step")
    speeds = [float(start["speed"])] + [float(i["speed"]) for i in infos]
    yaw = [yaw_rate(start, dt)] + [yaw_rate(i, dt) for i in infos]
    nc = 1.0
    crashed_before = bool(start.get("crashed", False))
    for info in infos:
        crashed = bool(info.get("crashed", False))
        if crashed and not crashed_before and info.get("collision_at_fault", True):
            nc = min(nc, 0.5 if info.get("collision_with") == "static" else 0.0)
        crashed_before = crashed
    dac = 0.0 if any(bool(i.get("offroad", False)) for i in infos) else 1.0
    ddc = ddc_score(sum(float(i.get("oncoming_m", 0.0)) for i in infos))
    ttc = 0.0 if any(bool(i.get("ttc_violation", False)) for i in infos) else 1.0
    progress = float(infos[-1]["progress"]) - float(start["progress"])
    ref_m = start.get("reference_progress_m")
    reference = (np.nan if ref_m is None else float(ref_m)) * min(n * dt / SCENE_S, 1.0)
    if route_length_m is not None and np.isfinite(reference):
        reference = min(reference, max(route_length_m - float(start["progress"]), 0.0))
    if not np.isfinite(reference) or reference < EP_MIN_REFERENCE_M:
        ep = 1.0
    else:
        ep = float(np.clip(progress / reference, 0.0, 1.0))
    c = 1.0 if comfortable(speeds, yaw, dt) else 0.0
    hist_v = ([previous_speed] if previous_speed is not None else []) + speeds
    hist_w = ([previous_yaw_rate] if previous_yaw_rate is not None else []) + yaw
    hc = 1.0 if comfortable(hist_v, hist_w, dt) else 0.0
    lk = lane_keeping([float(i.get("lane_offset_m", 0.0)) for i in infos],
                      [bool(i.get("at_junction", False)) for i in infos], dt)
    s = {"nc": nc, "dac": dac, "ddc": ddc, "tlc": 1.0, "ttc": ttc, "ep": ep, "c": c, "hc": hc, "lk": lk, "ec": 1.0}
    ref = {"dac": 0.0 if start.get("reference_offroad", False) else 1.0,
           "ddc": ddc_score(float(start.get("reference_oncoming_m", 0.0))),
           "lk": 0.0 if start.get("reference_lane_violation", False) else 1.0}
    ref = {k: (0.0 if v == 0.0 else 1.0) for k, v in ref.items()}
    s["pdms"] = 0.0 if failed else pdms(s)
    s["epdms"] = 0.0 if failed else epdms(s, ref)
    return s


def yaw_rate(info: Mapping[str, Any], dt: float) -> float:
    """The ego's yaw rate over the step that led to ``info`` [rad/s] (0 without ``ego_delta``)."""
    delta = info.get("ego_delta")
    return float(np.asarray(delta).reshape(-1)[2]) / dt if delta is not None else 0.0


def episode_scenes(infos: Sequence[Mapping[str, Any]], start: Mapping[str, Any], dt: float,
                   route_length_m: float | None = None, failure_step: int | None = None) -> list[dict[str, float]]:
    """Every scene of one episode (``SCENE_S`` windows of its step infos), scored by ``scene_scores``.

    Args:
        infos: The episode's step infos; start: its reset info.
        failure_step: Index of the step at which the episode failed (its scene and none after score 0).
    """
    per = max(int(round(SCENE_S / dt)), 1)
    scenes = []
    for k in range(0, len(infos), per):
        first = start if k == 0 else infos[k - 1]
        prev = None if k == 0 else (infos[k - 2] if k >= 2 else start)
        failed = failure_step is not None and failure_step < k + per
        scenes.append(scene_scores(infos[k:k + per], first, dt, route_length_m,
                                   previous_speed=None if prev is None else float(prev["speed"]),
                                   previous_yaw_rate=None if prev is None else yaw_rate(prev, dt), failed=failed))
    return scenes


def mean_scores(scenes: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per-scene scores averaged: ``pdms`` / ``epdms`` (the scores) and each sub-score's mean (``scenes``: count)."""
    scenes = list(scenes)
    if not scenes:
        raise ValueError("mean_scores: no scenes")
    out = {k: float(np.mean([s[k] for s in scenes])) for k in ("pdms", "epdms", *SUBSCORES)}
    out["scenes"] = len(scenes)
    return out
