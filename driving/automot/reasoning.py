"""Language derived from the driving scene: navigation instructions, reasoning labels and scene QA.

AutoMoT trains its understanding expert on text about the scene (CARLA's language annotations in the
paper). Here every sentence is computed from one step of ``sim.driving.env.DrivingEnv``: its observation
(``agents`` (N, 8), ``route`` (K, 2), ``ego_state`` (9,), ``proprio`` (4,), optionally ``bev``) and info
(``meta_action`` / ``meta_action_name`` of the privileged expert, ``speed``). Nothing is sampled from a
language model, so every fact a sentence states is true for the scene it was computed from.

Scene geometry (all in the ego frame: x forward, y left [m]):
    road frame   The route (centreline of the ego's current lane, points ahead) extended straight 200 m
                 behind its first point and beyond its last one. A point's ``s`` is its arc length along
                 that line relative to the ego's own projection (+ = ahead), its ``d`` the signed distance
                 from the centreline (+ = left).
    lanes        A vehicle is in lane ``round(d / LANE_WIDTH)`` relative to the ego's lane (0 = mine,
                 +1 = the lane to my left, -1 = to my right); highway-env's lanes are 4 m wide. A side
                 lane exists when the BEV's drivable channel covers its centre beside the ego (assumed to
                 exist when the observation has no ``bev``); the direction of travel is not checked, so at
                 the intersection the "left lane" may be the oncoming one.
    observed     ``agents`` lists the N nearest objects only. When the table is full, nothing is known
                 beyond the farthest listed one (``SceneFacts.known_radius``); every "clear for X m" /
                 count claim is capped there so that it stays true for the whole scene.
    lead         The nearest vehicle in my lane with ``0 < s <= min(LEAD_RANGE, known_radius)``; its
                 distance is ``s`` (centre to centre) and its speed the component of its velocity along
                 the road.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.driving.expert import META_ACTIONS

__all__ = [
    "LANE_WIDTH",
    "META_ACTIONS",
    "SceneFacts",
    "describe_scene",
    "meta_action_text",
    "navigation_instruction",
    "reasoning_text",
    "road_direction",
    "scene_qa",
    "speed_bucket",
]

LANE_WIDTH = 4.0  # highway-env's default lane width [m]
LEAD_RANGE = 50.0  # a lead vehicle is searched this far ahead [m]
BLOCK_RANGE = 40.0  # a lead this close "blocks" my lane in the lane-change explanation [m]
SIDE_BEHIND, SIDE_AHEAD = 10.0, 30.0  # a side lane is free when no vehicle is within [-10, +30] m of me
CLEAR_CAP = 100.0  # "clear for X m" never claims more than this [m]
CURVE_DEG = 15.0  # heading change of the route that counts as a bend [deg]
TURN_DEG = 60.0  # ... and as a turn [deg]
COUNT_RADII = (10.0, 20.0, 30.0, 50.0)  # radii the counting question may ask about [m]
SPEED_BUCKETS = (
    (1.0, "stopped"),
    (8.0, "slow"),
    (20.0, "moderate"),
    (math.inf, "fast"),
)  # [m/s] upper bounds
_EXTEND = 200.0  # the road frame's straight extensions [m]


def meta_action_text(index: int) -> str:
    """``META_ACTIONS[index]`` as words: 2 -> ``"slow down"``."""
    return META_ACTIONS[int(index)].replace("_", " ")


def speed_bucket(speed: float) -> str:
    """``"stopped"`` (< 1 m/s), ``"slow"`` (< 8), ``"moderate"`` (< 20) or ``"fast"``."""
    return next(name for bound, name in SPEED_BUCKETS if speed < bound)


# ------------------------------------------------------------------------------------------- geometry
def _polyline(route: np.ndarray) -> np.ndarray:
    """The road frame's centreline (M, 2) float64: distinct route points, extended straight at both ends."""
    pts = np.asarray(route, dtype=np.float64).reshape(-1, 2)
    pts = pts[np.isfinite(pts).all(axis=1)]
    if len(pts):
        keep = np.concatenate(([True], np.linalg.norm(np.diff(pts, axis=0), axis=1) > 1e-6))
        pts = pts[keep]
    if len(pts) < 2:  # no usable route: the ego's own x axis
        pts = np.array([[0.0, 0.0], [1.0, 0.0]])
    first = (pts[0] - pts[1]) / np.linalg.norm(pts[0] - pts[1])
    last = (pts[-1] - pts[-2]) / np.linalg.norm(pts[-1] - pts[-2])
    return np.concatenate([[pts[0] + _EXTEND * first], pts, [pts[-1] + _EXTEND * last]])


def _project(line: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arc length ``s`` (P,), signed offset ``d`` (P,, + = left) and unit tangent (P, 2) of points q (P, 2)."""
    a, seg = line[:-1], np.diff(line, axis=0)  # (S, 2)
    seg_len = np.linalg.norm(seg, axis=1)
    cum = np.concatenate(([0.0], np.cumsum(seg_len)))
    tangent = seg / seg_len[:, None]
    rel = q[:, None, :] - a[None]  # (P, S, 2)
    u = np.clip((rel * tangent[None]).sum(-1), 0.0, seg_len[None])  # along each segment, clipped
    foot = a[None] + u[..., None] * tangent[None]
    k = np.argmin(np.linalg.norm(q[:, None, :] - foot, axis=-1), axis=1)  # nearest segment per point
    rows = np.arange(len(q))
    r, t = rel[rows, k], tangent[k]
    s = cum[k] + u[rows, k]
    d = t[:, 0] * r[:, 1] - t[:, 1] * r[:, 0]  # cross(tangent, rel): + = left
    return s, d, t


def _route_heading_change(route: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per route segment: heading relative to the first segment [rad, + = left], arc length at its start and end.

    Arc lengths count from the ego: the straight distance to the first route point plus the length along the
    route [m].
    """
    pts = _polyline(route)[1:-1]
    seg = np.diff(pts, axis=0)
    heading = np.unwrap(np.arctan2(seg[:, 1], seg[:, 0]))
    end = np.cumsum(np.linalg.norm(seg, axis=1)) + float(np.linalg.norm(pts[0]))
    start = end - np.linalg.norm(seg, axis=1)
    return heading - heading[0], start, end


def road_direction(route: np.ndarray, threshold_deg: float = CURVE_DEG) -> tuple[str, float | None]:
    """Where the route goes: ``("left" | "right" | "straight", distance to the bend [m] or None)``.

    The direction is that of the first route segment whose heading differs from the first segment's by more
    than ``threshold_deg`` (the route is in the ego frame, so left = counter-clockwise); the distance is the
    arc length from the ego to that segment's start. ``"straight"`` (distance None) when no segment turns
    that far.
    """
    change, start, _ = _route_heading_change(route)
    bent = np.flatnonzero(np.abs(change) > math.radians(threshold_deg))
    if len(bent) == 0:
        return "straight", None
    i = int(bent[0])
    return ("left" if change[i] > 0 else "right"), float(start[i])


# -------------------------------------------------------------------------------------------- facts
@dataclass(frozen=True)
class SceneFacts:
    """What the language is built from (ego frame, metres, m/s).

    Attributes:
        ego_speed: The ego's speed [m/s].
        known_radius: Every object closer than this is in the agents table (inf when the table is not full).
        distances: (P,) Euclidean distances of the present agents to the ego [m].
        s, d: (P,) road-frame coordinates of the present agents (see the module docstring).
        lane: (P,) int lane of each agent relative to mine.
        along_speed: (P,) each agent's speed along the road [m/s].
        crossing: (P,) bool, the agent's heading differs from mine by more than 30 degrees.
        lead_range: How far ahead the lead was searched [m].
        lead_distance, lead_speed: The lead vehicle's ``s`` and speed, None when there is none.
        side_exists: {"left": bool, "right": bool}.
        side_free: {"left": bool, "right": bool}, the lane exists and is free in [-10, +30] m.
        side_clear_ahead: {"left"/"right": metres ahead free in that lane (capped, see ``clear_ahead``)}.
        clear_ahead: Metres free ahead in my lane: the lead's distance, else min(known radius, 100).
        road: ``road_direction(route)``.
    """

    ego_speed: float
    known_radius: float
    distances: np.ndarray
    s: np.ndarray
    d: np.ndarray
    lane: np.ndarray
    along_speed: np.ndarray
    crossing: np.ndarray
    lead_range: float
    lead_distance: float | None
    lead_speed: float | None
    side_exists: dict[str, bool]
    side_free: dict[str, bool]
    side_clear_ahead: dict[str, float]
    clear_ahead: float
    road: tuple[str, float | None]


def _ego_speed(obs: dict[str, Any], info: dict[str, Any] | None) -> float:
    if "proprio" in obs:
        return float(np.asarray(obs["proprio"]).reshape(-1)[0])
    if "ego_state" in obs:
        return float(np.asarray(obs["ego_state"]).reshape(-1)[3])
    return float((info or {}).get("speed", 0.0))


def _lane_exists(obs: dict[str, Any], line: np.ndarray, s0: float, side: float, m_per_px: float) -> bool:
    """Whether the BEV's drivable channel covers the centre of the lane ``side`` (+1 left, -1 right) beside me."""
    bev = obs.get("bev")
    if bev is None:
        return True
    bev = np.asarray(bev)
    h, w = bev.shape[-2:]
    cum = np.concatenate(([0.0], np.cumsum(np.linalg.norm(np.diff(line, axis=0), axis=1))))
    k = min(max(int(np.searchsorted(cum, s0, side="right")) - 1, 0), len(line) - 2)
    t = (line[k + 1] - line[k]) / (cum[k + 1] - cum[k])
    centre = line[k] + (s0 - cum[k]) * t + side * LANE_WIDTH * np.array([-t[1], t[0]])
    ego_row = round(0.75 * h)  # sim.driving.render.SceneRasterizer's default
    col = int(round(w / 2 - centre[1] / m_per_px))
    row = int(round(ego_row - centre[0] / m_per_px))
    if not (0 <= row < h and 0 <= col < w):
        return False
    return bool(bev[0, row, col] > 127)


def describe_scene(
    obs: dict[str, Any], info: dict[str, Any] | None = None, bev_m_per_px: float = 1.0
) -> SceneFacts:
    """The facts of one step (see ``SceneFacts`` and the module docstring)."""
    agents = np.asarray(obs["agents"], dtype=np.float64).reshape(-1, 8)
    present = agents[agents[:, 0] > 0.5]
    line = _polyline(obs["route"])
    (s_ego,), (_,), _ = _project(line, np.zeros((1, 2)))
    dist = np.linalg.norm(present[:, 1:3], axis=1)
    full = len(agents) > 0 and len(present) == len(agents)
    known = float(dist.max()) if full else math.inf
    if len(present):
        s, d, tangent = _project(line, present[:, 1:3])
        s = s - s_ego
        along = (present[:, 3:5] * tangent).sum(-1)
        crossing = np.abs(np.asarray(present[:, 5])) > math.radians(30.0)
    else:
        s = d = along = np.zeros(0)
        crossing = np.zeros(0, dtype=bool)
    lane = np.round(d / LANE_WIDTH).astype(int)
    lead_range = min(LEAD_RANGE, known)
    ahead = np.flatnonzero((lane == 0) & (s > 0) & (s <= lead_range))
    lead = int(ahead[np.argmin(s[ahead])]) if len(ahead) else None
    cap = min(known, CLEAR_CAP)
    clear = float(s[lead]) if lead is not None else cap
    exists, free, side_clear = {}, {}, {}
    for name, k in (("left", 1), ("right", -1)):
        exists[name] = _lane_exists(obs, line, s_ego, k, bev_m_per_px)
        mine = lane == k
        near = mine & (s >= -SIDE_BEHIND) & (s <= SIDE_AHEAD)
        free[name] = exists[name] and not near.any()
        front = s[mine & (s > 0)]
        side_clear[name] = float(min(front.min(), cap)) if len(front) else cap
    return SceneFacts(
        ego_speed=_ego_speed(obs, info),
        known_radius=known,
        distances=dist,
        s=s,
        d=d,
        lane=lane,
        along_speed=along,
        crossing=crossing,
        lead_range=lead_range,
        lead_distance=None if lead is None else float(s[lead]),
        lead_speed=None if lead is None else float(along[lead]),
        side_exists=exists,
        side_free=free,
        side_clear_ahead=side_clear,
        clear_ahead=clear,
        road=road_direction(obs["route"]),
    )


# ------------------------------------------------------------------------------------------ language
def _m(x: float) -> int:
    """Metres as a whole number, rounded down (a "clear for X m" claim stays true)."""
    return int(math.floor(x + 1e-9))


def _round5(x: float) -> int:
    return int(5 * round(x / 5.0))


def navigation_instruction(
    obs: dict[str, Any], info: dict[str, Any] | None = None, scenario: str | None = None
) -> str:
    """A navigation instruction from the route's shape, e.g. ``"Turn left in 35 m."``, then the scenario's task.

    The route phrase comes from ``road_direction``: a heading change above ``TURN_DEG`` over the route is a
    turn, above ``CURVE_DEG`` a bend; the distance is to the first bent segment, rounded to 5 m. The task
    sentence is ``sim.driving.registration.SCENARIOS[scenario].instruction`` (omitted for an unknown one).
    """
    direction, at = road_direction(obs["route"])
    change, _, end = _route_heading_change(obs["route"])
    if direction == "straight":
        phrase = f"Follow the road straight ahead for the next {_round5(float(end[-1]))} m."
    else:
        total = math.degrees(abs(float(change[np.argmax(np.abs(change))])))
        where = "now" if at < 5.0 else f"in {_round5(at)} m"
        verb = "Turn" if total >= TURN_DEG else "Follow the road as it bends"
        phrase = f"{verb} {direction} {where}."
    from sim.driving.registration import SCENARIOS

    task = SCENARIOS[scenario].instruction if scenario in SCENARIOS else ""
    return f"{phrase} {task}".strip()


def _lead_phrase(f: SceneFacts) -> str:
    dv = round(f.ego_speed - f.lead_speed)
    d = round(f.lead_distance)
    if dv >= 1:
        return f"a vehicle {d} m ahead in my lane is {dv} m/s slower"
    if dv <= -1:
        return f"a vehicle {d} m ahead in my lane is {-dv} m/s faster"
    return f"a vehicle {d} m ahead in my lane drives at my speed"


def _side_phrase(f: SceneFacts, side: str) -> str:
    return f"the {side} lane is free for {_m(f.side_clear_ahead[side])} m"


def _crossing_phrase(f: SceneFacts) -> str | None:
    """The nearest vehicle within 30 m whose heading crosses mine, not behind me in my lane."""
    idx = np.flatnonzero(f.crossing & (f.distances < 30.0) & ~((f.lane == 0) & (f.s < 0)))
    if not len(idx):
        return None
    i = int(idx[np.argmin(f.distances[idx])])
    side = "left" if f.d[i] > 0 else "right"
    return f"a crossing vehicle is {round(float(f.distances[i]))} m away on my {side}"


def reasoning_text(obs: dict[str, Any], info: dict[str, Any]) -> str:
    """A scene-grounded explanation of the expert's meta-action (``info["meta_action"]``).

    Form: ``"<meta action>: <facts>"``, e.g. ``"slow down: a vehicle 12 m ahead in my lane is 4 m/s slower"``,
    ``"change left: a vehicle 20 m ahead in my lane is 5 m/s slower and the left lane is free for 40 m"``,
    ``"keep lane: road clear for 60 m"``. Distances are centre to centre (``SceneFacts``); "clear for" /
    "free for" distances are rounded down and capped at what the agents table covers.
    """
    f = describe_scene(obs, info)
    action = META_ACTIONS[int(info["meta_action"])]
    head = meta_action_text(META_ACTIONS.index(action))
    lead = f.lead_distance is not None
    speed = round(f.ego_speed)
    if action in ("change_left", "change_right"):
        side = action.split("_")[1]
        blocked = lead and f.lead_distance <= BLOCK_RANGE
        body = (f"{_lead_phrase(f)} and " if blocked else "") + _side_phrase(f, side)
        return f"{head}: {body}"
    if action in ("slow_down", "stop"):
        crossing = _crossing_phrase(f)
        direction, at = f.road
        if lead:
            gap = 10.0 + 1.5 * f.ego_speed  # IDM's desired gap (sim.driving.expert.PlannerIDMVehicle) [m]
            if round(f.ego_speed - f.lead_speed) >= 1 or f.lead_distance >= gap:
                body = _lead_phrase(f)
            else:
                body = (
                    f"a vehicle {round(f.lead_distance)} m ahead in my lane is inside my {round(gap)} m gap"
                )
        elif crossing is not None:
            body = crossing
        elif direction != "straight":
            body = f"the road bends {direction} in {_m(at)} m and I drive at {speed} m/s"
        else:
            body = f"no vehicle ahead in my lane within {_m(f.lead_range)} m; easing off from {speed} m/s"
        return f"{head}: {body}"
    if action == "accelerate":
        if lead:
            return f"{head}: {_lead_phrase(f)}"
        return f"{head}: road clear for {_m(f.clear_ahead)} m and I drive at {speed} m/s"
    if lead:  # keep_lane
        return f"{head}: following a vehicle {round(f.lead_distance)} m ahead at {round(f.lead_speed)} m/s"
    return f"{head}: road clear for {_m(f.clear_ahead)} m"


def scene_qa(obs: dict[str, Any], info: dict[str, Any], rng: np.random.Generator) -> list[tuple[str, str]]:
    """Question-answer pairs about the scene, answers a word or a number; shuffled by ``rng``.

    Questions: vehicles within R m (R drawn from ``COUNT_RADII`` among those the agents table covers; the
    question is left out when none is), lead distance (whole metres, or ``"none"``), whether the left / the
    right lane is free (``"yes"`` / ``"no"``), the ego's speed bucket (``speed_bucket``), where the road
    ahead goes (``"left"`` / ``"right"`` / ``"straight"``) and the expert's meta-action (``meta_action_text``).
    The same ``rng`` state gives the same list.
    """
    f = describe_scene(obs, info)
    qa: list[tuple[str, str]] = []
    radii = [r for r in COUNT_RADII if r <= f.known_radius]
    if radii:
        r = float(radii[int(rng.integers(len(radii)))])
        qa.append((f"How many vehicles are within {r:g} m of me?", str(int((f.distances < r).sum()))))
    lead = "none" if f.lead_distance is None else str(round(f.lead_distance))
    qa.append((f"How far ahead is the lead vehicle in my lane (within {_m(f.lead_range)} m)?", lead))
    for side in ("left", "right"):
        qa.append((f"Is the {side} lane free?", "yes" if f.side_free[side] else "no"))
    qa.append(("How fast am I driving: stopped, slow, moderate or fast?", speed_bucket(f.ego_speed)))
    qa.append(("Does the road ahead curve left, right or go straight?", f.road[0]))
    qa.append(("Which meta-action should I take?", meta_action_text(int(info["meta_action"]))))
    order = rng.permutation(len(qa))
    return [qa[i] for i in order]
