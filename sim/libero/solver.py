"""A privileged LIBERO expert that solves tasks from their BDDL goal and the MuJoCo state.

:class:`LiberoSolver` (a ``sim.api.Policy``) reads the goal (``parsed_problem["goal_state"]``, e.g.
``[['on', 'akita_black_bowl_1', 'plate_1']]``), turns it into one sub-goal per predicate and runs a
skill for each, in the BDDL's order (a placement into a container that a ``close`` predicate shuts goes
before that ``close``), re-checking achieved sub-goals before it moves on:

* ``on`` / ``in``: :class:`PickPlace` (this module) picks the object, carries it above the obstacles on
  its way, lowers it over the target (an object's body origin, or a region site's centre), releases it
  and retreats up; it checks the grasp by the finger gap and by the object rising with the hand and
  re-plans (new grasp pose) when a grasp misses or slips, a bounded number of times; a cup going into a
  region under a roof (a microwave) is held by its handle and slid in through the opening
  (:class:`Insert`), a flat object onto a table region is dragged (:class:`Slide`);
* ``open`` / ``close`` / ``turnon`` / ``turnoff``: the articulated skills of ``sim.libero.articulated``
  (``ARTICULATED_SKILLS``), when that module provides them; otherwise the sub-goal fails as
  ``"unsupported"``.

Grasp poses come from each object's collision geometry (:func:`plan_grasps`): objects that fit between
the open fingers are taken from the top with the fingers across their narrow horizontal axis (the
gripper rotated about z); wider ones (bowls, plates, mugs) by the rim, the fingers straddling the wall
on the side with most room. The reach-and-grasp script's rim grasp (``sim.libero.expert``) closed on
nothing for one reason, measured on libero_spatial/0: it computes the grasp point at reset, but the
objects of a LIBERO init state float above the table and drop about 7 cm in the first steps (the bowl's
origin goes from z 0.970 to 0.898 m), so the fingers closed 7 cm above the rim. This expert plans from
the settled state, and re-plans every attempt.

Every skill follows the same small protocol (``Skill``): built as ``SkillClass(env, predicate)`` on the
current state, ``act()`` returns the next action or None once ``outcome`` is set (``"done"`` or a
failure kind: ``"missed"``, ``"slipped"``, ``"misplaced"``, ``"unreachable"``, ``"unsupported"``,
``"timeout"``, ``"stuck"``, ``"blocked"``). ``LiberoSolver.skills`` maps a predicate to its skill, or to a
tuple of skills tried one a run (``clear``: :class:`Push`, then :class:`Relocate` after a refused or failed
push).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from core.errors import ConfigError
from sim.libero.env import LiberoEnv
from sim.libero.motion import (
    GRIPPER_MAX_GAP,
    WRIST_LIMIT,
    bodies_in_contact,
    body_box,
    body_frame_box,
    finger_gap,
    gripper_yaw,
    in_subtree,
    mj_model,
    reachable_yaw,
    step_toward,
    topdown_rotation,
)

PLACE_PREDICATES = ("on", "in")
ARTICULATED_PREDICATES = ("open", "close", "turnon", "turnoff")

FIT_MARGIN = 0.012  # m: an object is taken across an axis only if it is this much narrower than the open gripper
FIT_ASPECT = 1.5  # a held object is turned to fit its region only when its footprint is this much longer than wide
FIT_SLACK = 0.005  # m: a footprint may overhang a region's box by this much and fit
RIM_DEPTH = 0.018  # m: grip site below the rim's top for a rim grasp (pads on the wall's middle)
WALL_THICKNESS = 0.008  # m: box geoms thinner than this near the top are walls to grasp
TOP_DEPTH_MAX = 0.03  # m: grip site below the top for a top grasp (at most; half the height for flat objects)
FINGER_BELOW_SITE = 0.012  # m: keep the grip site this high above the surface the object stands on
CLEARANCE = 0.035  # m: travel height above the obstacles' tops (plus what the hand carries below it)
RELEASE_HEIGHT = 0.012  # m: carried object's bottom above the support when the gripper opens
GRASP_RISE = 0.025  # m: the object must have risen this much with the hand to count as grasped
CLOSED_GAP = 0.0015  # m: finger gap at or below which the fingers closed on nothing
OVER_ROT_GAIN = 0.5  # rotation gain while moving over a grasp (0.5 elsewhere): the turn, not the move, set its pace
APPROACH_SWEEP = 0.15  # m above a grasp whose column the descending hand must find free
LONG_HANDLE = 0.06  # m: a handle standing this far out of its vessel is grasped before the rim (a pan's: 9.5 cm)
MAX_ATTEMPTS = 4  # grasp-and-place attempts per PickPlace skill
MAX_SKILL_RUNS = 2  # skill instances per sub-goal (a failed skill is rebuilt once)
MAX_REDOS = 2  # times an earlier sub-goal that came undone is redone


class Skill(Protocol):
    """One sub-goal's controller, built as ``SkillClass(env, predicate)`` on the current state."""

    outcome: str | None

    def act(self) -> np.ndarray | None: ...


# ---------------------------------------------------------------------------------------------- goals


def parse_goal(parsed_problem: dict[str, Any]) -> list[tuple[str, ...]]:
    """The goal's predicates in the BDDL's order, lower-case tuples, e.g. ``[('on', 'bowl_1', 'plate_1')]``.

    ``goal_state`` is LIBERO's parse of ``(:goal (And (On a b) ...))``: a list of ``[name, arg, ...]``.
    A goal that is not a plain conjunction of atoms is refused with ConfigError.
    """
    goal = parsed_problem.get("goal_state")
    if not isinstance(goal, (list, tuple)) or not goal:
        raise ConfigError(f"BDDL goal_state must be a non-empty list of predicates, got {goal!r}")
    out = []
    for pred in goal:
        if not isinstance(pred, (list, tuple)) or not 2 <= len(pred) <= 3 or not all(isinstance(p, str) for p in pred):
            raise ConfigError(f"BDDL goal predicate must be [name, arg] or [name, arg, arg], got {pred!r}")
        out.append(tuple(p.lower() for p in pred))
    return out


def order_subgoals(goals: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The BDDL's order, except that a placement ``in`` / ``on`` whose target belongs to the thing a
    ``close`` predicate shuts goes before that ``close`` (libero_10: "put the bowl in the drawer and close
    it" lists ``Close`` first)."""
    goals = list(goals)
    for i, g in enumerate(list(goals)):
        if g[0] != "close":
            continue
        closed = g[1]
        for j in range(i + 1, len(goals)):
            h = goals[j]
            if h[0] in PLACE_PREDICATES and (h[2] == closed or _owner(h[2]) == _owner(closed)):
                goals.insert(i, goals.pop(j))
    return goals


def _owner(name: str) -> str:
    """``wooden_cabinet_1`` for ``wooden_cabinet_1_top_region`` (a region site's object): the name up to its
    first number; the name itself when it has none."""
    parts = name.split("_")
    for k, part in enumerate(parts):
        if part.isdigit():
            return "_".join(parts[: k + 1])
    return name


def predicate_holds(env: LiberoEnv, pred: tuple[str, ...]) -> bool:
    """LIBERO's own check of one goal predicate on the current state; the solver's own sub-goal
    ``('clear', obj, drawer_region)`` (``obj`` out of the opened drawer's way) is checked here."""
    if pred[0] == "clear":
        return not under_opened_drawer(env, pred[1], pred[2])
    return bool(env.libero_env._eval_predicate(list(pred)))


# ----------------------------------------------------------------------------------------- geometry


@dataclass
class GraspPose:
    """Where to put the grip site (world, metres), the closing axis' yaw (radians) and the rule used."""

    point: np.ndarray
    yaw: float
    kind: str  # "top" (across the narrow axis), "rim" (fingers straddling a wall), "outline" (straddling the
    # object's box outline: no wall to hold) or "handle"
    width: float = 0.0  # m: extent between the fingers (top grasps)


def _object_body(env: LiberoEnv, name: str) -> int:
    rs = env.libero_env
    obj = rs.objects_dict.get(name) or rs.fixtures_dict.get(name)
    if obj is None:
        raise ConfigError(f"{name!r} is not an object of this LIBERO scene")
    return int(rs.sim.model.body_name2id(obj.root_body))


def _obstacle_boxes(env: LiberoEnv, exclude: tuple[int, ...] = ()) -> list[tuple[np.ndarray, np.ndarray]]:
    """World boxes of every object and fixture of the scene except the bodies in ``exclude``."""
    rs = env.libero_env
    boxes = []
    for obj in list(rs.objects_dict.values()) + list(rs.fixtures_dict.values()):
        body = int(rs.sim.model.body_name2id(obj.root_body))
        if body in exclude:
            continue
        boxes.append(body_box(env, body))
    return boxes


def _geom_boxes(env: LiberoEnv, exclude_roots: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """World AABBs of every collision geom outside the robot and the ``exclude_roots`` subtrees."""
    model, data = mj_model(env), env.sim.data
    robot_root = int(model.body(env._robot.robot_model.root_body).id)
    out = []
    for g in range(model.ngeom):
        if not (model.geom_contype[g] or model.geom_conaffinity[g]):
            continue
        b = int(model.geom_bodyid[g])
        if b == 0 and model.geom_type[g] == 0:  # the floor plane
            continue
        if in_subtree(model, b, robot_root) or any(in_subtree(model, b, r) for r in exclude_roots):
            continue
        name = model.body(b).name
        if name.startswith(("gripper0", "robot0", "mount0")):
            continue
        rot = np.array(data.geom_xmat[g]).reshape(3, 3)
        center = np.array(data.geom_xpos[g]) + rot @ model.geom_aabb[g, :3]
        half = np.abs(rot) @ model.geom_aabb[g, 3:]
        out.append((center - half, center + half))
    return out


def support_height(env: LiberoEnv, xy: np.ndarray, half_xy: np.ndarray, exclude_roots: tuple[int, ...],
                   below: float = np.inf) -> float:
    """Highest top (m) of the collision geoms overlapping the footprint ``xy +- half_xy`` whose top is under
    ``below``: what an object lowered there lands on."""
    best = -np.inf
    for lo, hi in _geom_boxes(env, exclude_roots):
        if hi[2] >= below:
            continue
        if np.all(lo[:2] <= xy + half_xy) and np.all(hi[:2] >= xy - half_xy):
            best = max(best, float(hi[2]))
    return best


def _clearance(point_xy: np.ndarray, boxes, z_from: float) -> float:
    """Horizontal distance (m) from a point to the nearest box that rises above ``z_from``."""
    best = np.inf
    for lo, hi in boxes:
        if hi[2] < z_from:
            continue
        d = np.maximum(np.maximum(lo[:2] - point_xy, point_xy - hi[:2]), 0.0)
        best = min(best, float(np.linalg.norm(d)))
    return best


def _hand_samples(point: np.ndarray, yaw: float, open_half: float = 0.044) -> np.ndarray:
    """Sample points (N, 3) of the open gripper at a grasp: the two fingers (1.6 cm columns at
    ``+-open_half`` along the closing axis, from just under the grip site to 5 cm above it) and the hand
    (22 x 6 cm, from 6 to 12 cm above the grip site)."""
    c = np.array([np.cos(yaw), np.sin(yaw), 0.0])
    n = np.array([-np.sin(yaw), np.cos(yaw), 0.0])
    pts = []
    for side in (-1.0, 1.0):
        for dc in (open_half - 0.006, open_half + 0.006):
            for dn in (-0.009, 0.0, 0.009):
                for dz in (-0.008, 0.015, 0.04):
                    pts.append(point + side * dc * c + dn * n + [0.0, 0.0, dz])
    for dc in np.linspace(-0.11, 0.11, 9):
        for dn in (-0.03, 0.0, 0.03):
            for dz in (0.06, 0.11):
                pts.append(point + dc * c + dn * n + [0.0, 0.0, dz])
    return np.array(pts)


def _geom_obbs(env: LiberoEnv, exclude_roots: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Oriented boxes of the collision geoms outside the robot and ``exclude_roots``: centres (G, 3),
    rotations (G, 3, 3) and half extents (G, 3), from each geom's own-frame bounding box (a rotated
    cabinet's thin walls stay thin, unlike their world-aligned boxes)."""
    model, data = mj_model(env), env.sim.data
    robot_root = int(model.body(env._robot.robot_model.root_body).id)
    cs, rs, hs = [], [], []
    for g in range(model.ngeom):
        if not (model.geom_contype[g] or model.geom_conaffinity[g]):
            continue
        b = int(model.geom_bodyid[g])
        if (b == 0 and model.geom_type[g] == 0) or in_subtree(model, b, robot_root):
            continue
        if any(in_subtree(model, b, r) for r in exclude_roots) or model.body(b).name.startswith(("gripper0", "robot0", "mount0")):
            continue
        rot = np.array(data.geom_xmat[g]).reshape(3, 3)
        cs.append(np.array(data.geom_xpos[g]) + rot @ model.geom_aabb[g, :3])
        rs.append(rot)
        hs.append(np.array(model.geom_aabb[g, 3:]))
    if not cs:
        return np.zeros((0, 3)), np.zeros((0, 3, 3)), np.zeros((0, 3))
    return np.array(cs), np.array(rs), np.array(hs)


def hand_collisions(env: LiberoEnv, point: np.ndarray, yaw: float, exclude_roots: tuple[int, ...],
                    obbs: tuple | None = None, margin: float = 0.004, sweep: float = 0.0) -> int:
    """How many of the open gripper's sample points (:func:`_hand_samples`) at this grasp, and at heights
    every 3 cm up to ``sweep`` above it (the column the hand comes down through), lie inside another
    body's collision geoms (their oriented boxes, grown by ``margin``): 0 for a free approach. The sweep
    catches what overhangs the object (an opened drawer 10 cm over a bowl's back half, libero_goal/3)."""
    centers, rots, halves = _geom_obbs(env, exclude_roots) if obbs is None else obbs
    if len(centers) == 0:
        return 0
    pts = _hand_samples(point, yaw)
    if sweep > 0:
        pts = np.concatenate([pts + [0.0, 0.0, dz] for dz in np.arange(0.0, sweep + 1e-9, 0.03)])
    local = np.einsum("gji,pgj->pgi", rots, pts[:, None, :] - centers[None])  # R^T (p - c)
    inside = np.all(np.abs(local) <= halves[None] + margin, axis=2)
    return int(np.any(inside, axis=1).sum())


def plan_grasps(env: LiberoEnv, body: int, current_yaw: float | None = None) -> list[GraspPose]:
    """Grasp poses for ``body`` from its collision geometry, best first.

    * Top grasp when a horizontal extent of the object's own box is at least ``FIT_MARGIN`` under the
      open gripper's gap: closing axis along that (narrowest) axis, grip site at the box centre, below
      the top by half the height (at most ``TOP_DEPTH_MAX``), never closer than ``FINGER_BELOW_SITE`` to
      the object's bottom.
    * A handle's bar (:func:`handle_grasp`) otherwise, when it stands ``LONG_HANDLE`` or more out of the
      vessel's ring (a frying pan's: its rim is low and slanted, and held there the pan pivoted on its far edge
      and slipped from the fingers, libero_90 18); then the rim grasps. When the object is no open cup
      (:func:`_open_vessel`) and has no thin wall at its top to hold, so that the rim grasps aim at its box
      outline (a moka pot: 19 of 50 on libero_90 19), its handle comes second, after the first of them.
      First, it put libero_10 8's second pot down against the first one (40 -> 19 of 50).
    * Rim grasp otherwise: for eight radial directions, the wall is the farthest collision geometry near
      the top along it; the grip site goes onto the wall, ``RIM_DEPTH`` under the rim, closing axis radial.
      Directions are ranked by the room around the outer finger (other objects), then by facing the robot.
    """
    center, axes, half = body_frame_box(env, body)
    lo, hi = body_box(env, body)
    cur = gripper_yaw(env) if current_yaw is None else current_yaw
    up = int(np.argmax(np.abs(axes[2])))
    horiz = [i for i in range(3) if i != up]
    widths = {i: 2.0 * half[i] * float(np.linalg.norm(axes[:2, i])) + 2.0 * half[up] * float(abs(axes[2, i]))
              for i in horiz}
    height = float(hi[2] - lo[2])
    poses: list[GraspPose] = []
    for i in sorted(horiz, key=lambda k: widths[k]):
        if widths[i] > GRIPPER_MAX_GAP - FIT_MARGIN:
            continue
        yaw = reachable_yaw(env, float(np.arctan2(axes[1, i], axes[0, i])))
        z = max(float(hi[2]) - min(TOP_DEPTH_MAX, 0.5 * height), float(lo[2]) + FINGER_BELOW_SITE)
        poses.append(GraspPose(np.array([center[0], center[1], z]), yaw, "top", widths[i]))
    if poses:
        obbs = _geom_obbs(env, (body,))
        hits = [hand_collisions(env, p.point, p.yaw, (body,), obbs, sweep=APPROACH_SWEEP) for p in poses]
        order = sorted(range(len(poses)), key=lambda k: (hits[k] > 0, hits[k], k))
        return [poses[k] for k in order]
    rims = _rim_grasps(env, body, lo, hi, cur)
    handle = handle_grasp(env, body)
    if handle is not None and handle[2] >= LONG_HANDLE:
        return [handle[0]] + rims
    if handle is not None and all(p.kind == "outline" for p in rims) and not _open_vessel(env, body, float(hi[2])):
        return rims[:1] + [handle[0]] + rims[1:]  # the handle after the first outline grasp has missed
    return rims


def _open_vessel(env: LiberoEnv, body: int, top: float) -> bool:
    """Whether six or more thin box pieces (``HANDLE_WALL``) reach within 1 cm of the object's top: a cup's ring,
    open at the top, whose wall the fingers straddle (a moka pot's top is its lid and knob)."""
    n = sum(c[2] + float(np.abs(rot[2]) @ size) >= top - 0.01 for c, rot, size in _box_pieces(env, body)
            if size.min() <= HANDLE_WALL / 2)
    return n >= 6


def _box_pieces(env: LiberoEnv, body: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The collision boxes of ``body``'s subtree: world centre (3,), rotation (3, 3) and half sizes (3,) each."""
    model, data = mj_model(env), env.sim.data
    out = []
    for g in range(model.ngeom):
        if model.geom_type[g] != 6 or not (model.geom_contype[g] or model.geom_conaffinity[g]):
            continue
        if in_subtree(model, int(model.geom_bodyid[g]), body):
            out.append((np.array(data.geom_xpos[g]), np.array(data.geom_xmat[g]).reshape(3, 3),
                        np.array(model.geom_size[g])))
    return out


def wrist_allows(env: LiberoEnv, *yaws: float) -> bool:
    """Whether the down-pointing hand turns through the yaws (radians, in order, each the short way from the
    last, as the controller does) with its last joint inside +-``WRIST_LIMIT``. Unlike :func:`reachable_yaw` the
    hand's two ends are told apart, as they must be when what it holds sticks out to one side (a cup's handle)."""
    q7 = float(env.sim.data.qpos[env._robot._ref_joint_pos_indexes[-1]])
    yaw = gripper_yaw(env)
    for target in yaws:
        step = (target - yaw + np.pi) % (2 * np.pi) - np.pi
        yaw, q7 = yaw + step, q7 - step
        if abs(q7) > WRIST_LIMIT:
            return False
    return True


def _rim_grasps(env: LiberoEnv, body: int, lo: np.ndarray, hi: np.ndarray, cur: float) -> list[GraspPose]:
    """Rim grasps: one candidate per thin wall piece near the top (box geoms under ``WALL_THICKNESS``,
    the fingers closing along its thin axis, centred on it); eight radial directions on the box's outline
    when the object has no such pieces."""
    model, data = mj_model(env), env.sim.data
    origin = np.array(data.xpos[body])
    box_center = (lo[:2] + hi[:2]) / 2
    center_xy = box_center if np.linalg.norm(origin[:2] - box_center) > 0.02 else origin[:2]
    z = max(float(hi[2]) - RIM_DEPTH, float(lo[2]) + FINGER_BELOW_SITE)
    walls = []  # (xy, closing direction)
    for g in range(model.ngeom):
        if model.geom_type[g] != 6 or not (model.geom_contype[g] or model.geom_conaffinity[g]):
            continue
        if not in_subtree(model, int(model.geom_bodyid[g]), body):
            continue
        rot = np.array(data.geom_xmat[g]).reshape(3, 3)
        size = np.array(model.geom_size[g])
        c = np.array(data.geom_xpos[g])
        top = c[2] + float(np.abs(rot[2]) @ size)
        thin = int(np.argmin(size))
        if size[thin] > WALL_THICKNESS / 2 or top < hi[2] - 0.01:
            continue
        normal = rot[:2, thin]
        if np.linalg.norm(normal) < 0.5 or np.linalg.norm(c[:2] - center_xy) < 0.01:
            continue
        # a low, slanted rim (plates) lies wholly above the default height: pads on the piece's middle then
        z_wall = z if c[2] - float(np.abs(rot[2]) @ size) <= z else max(float(c[2]) - 0.0035, float(lo[2]) + FINGER_BELOW_SITE)
        walls.append((c[:2], normal / np.linalg.norm(normal), z_wall, "rim"))
    if not walls:
        for k in range(8):
            d = np.array([np.cos(k * np.pi / 4), np.sin(k * np.pi / 4)])
            r = float(np.min((hi[:2] - lo[:2]) / 2 / np.maximum(np.abs(d), 1e-9))) - 0.004  # the box's outline
            walls.append((center_xy + d * r, d, z, "outline"))
    obstacles = _geom_boxes(env, (body,))
    obbs = _geom_obbs(env, (body,))
    robot_xy = np.asarray(env._robot.base_pos)[:2]
    scored = []
    for xy, normal, z, kind in walls:
        radial = xy - center_xy
        radial /= max(np.linalg.norm(radial), 1e-9)
        outer = xy + radial * 0.045
        room = min(_clearance(outer, obstacles, z - 0.03), 0.06)
        to_robot = robot_xy - center_xy
        facing = float(np.dot(radial, to_robot / max(np.linalg.norm(to_robot), 1e-9)))
        yaw = reachable_yaw(env, float(np.arctan2(normal[1], normal[0])))
        hits = hand_collisions(env, np.array([xy[0], xy[1], z]), yaw, (body,), obbs, sweep=APPROACH_SWEEP)
        score = room + 0.01 * facing - 0.004 * abs(yaw - cur) - 0.1 * hits
        scored.append((score, GraspPose(np.array([xy[0], xy[1], z]), yaw, kind)))
    scored.sort(key=lambda s: -s[0])
    return [p for _, p in scored]


# --------------------------------------------------------------------------------------- pick-place


@dataclass
class _Phase:
    name: str
    steps: int = 0


SPOT_STEP = 0.01  # m: grid of candidate spots in a region
SPOT_MARGIN = 0.01  # m: a spot (the object's origin) keeps this far inside the region's box; on its edge, the
# second can of libero_10 0 ended just outside the basket's region (4 of 50 failed)
SPOT_TALL = 0.02  # m: objects standing higher than this above a region's surface take room in it
WALL_MAX = 0.015  # m: a region's fixture's parts at most this thick (horizontally) are walls a spot keeps off


def region_half(env: LiberoEnv, site: int) -> np.ndarray:
    """World half extents (3,) of a region site's box as LIBERO's ``in_box`` takes them (``|R @ size|``)."""
    return np.abs(np.array(env.sim.data.site_xmat[site]).reshape(3, 3) @ np.array(mj_model(env).site_size[site]))


def _overhang_boxes(env: LiberoEnv, site: int, fixture: int, center: np.ndarray,
                    reach: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """For a region inside a drawer (its site on a body with a slide joint): the boxes (2-d) of the fixture's
    other collision geoms that hang over it, their bottom within 30 cm above the site's centre (the handles and
    fronts of the drawers above an opened bottom drawer, libero_10 3), which an object lowered into the drawer
    must pass; none for any other region. Measured on libero_10 3: the bowl aimed at the region's centre was
    stopped by them and dropped from 7-19 cm, tilted, and the drawer would not close over it (24 of 50 solved);
    aimed clear of them, 30 of 50."""
    model = mj_model(env)
    drawer = int(model.site_bodyid[site])
    joints = range(int(model.body_jntadr[drawer]), int(model.body_jntadr[drawer]) + int(model.body_jntnum[drawer]))
    if drawer == fixture or not any(int(model.jnt_type[j]) == 2 for j in joints):  # 2: mjJNT_SLIDE
        return []
    data = env.sim.data
    out = []
    for g in range(model.ngeom):
        b = int(model.geom_bodyid[g])
        if not (model.geom_contype[g] or model.geom_conaffinity[g]) or not in_subtree(model, b, fixture):
            continue
        if in_subtree(model, b, drawer):
            continue
        rot = np.array(data.geom_xmat[g]).reshape(3, 3)
        mid = np.array(data.geom_xpos[g]) + rot @ model.geom_aabb[g, :3]
        h = np.abs(rot) @ model.geom_aabb[g, 3:]
        lo, hi = mid - h, mid + h
        near = np.all(lo[:2] < center[:2] + reach) and np.all(hi[:2] > center[:2] - reach)
        if near and center[2] < lo[2] < center[2] + 0.3:
            out.append((lo[:2], hi[:2]))
    return out


def _wall_boxes(env: LiberoEnv, site: int, fixture: int, center: np.ndarray,
                reach: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The boxes (2-d) of the region's own fixture's thin walls (at most ``WALL_MAX`` thick) standing in or
    around the region: rising ``SPOT_TALL`` above its floor, from below its centre. A caddy's partitions
    (libero_90 75: a book aimed at the right compartment's centre came down on the partition beside it,
    was let go 16 cm up and fell over)."""
    model, data = mj_model(env), env.sim.data
    floor = center[2] - float(region_half(env, site)[2])
    out = []
    for g in range(model.ngeom):
        b = int(model.geom_bodyid[g])
        if not (model.geom_contype[g] or model.geom_conaffinity[g]) or not in_subtree(model, b, fixture):
            continue
        grot = np.array(data.geom_xmat[g]).reshape(3, 3)
        mid = np.array(data.geom_xpos[g]) + grot @ model.geom_aabb[g, :3]
        h = np.abs(grot) @ model.geom_aabb[g, 3:]
        lo, hi = mid - h, mid + h
        near = np.all(lo[:2] < center[:2] + reach) and np.all(hi[:2] > center[:2] - reach)
        if near and 2 * h[:2].min() <= WALL_MAX and hi[2] > floor + SPOT_TALL and lo[2] < center[2]:
            out.append((lo[:2], hi[:2]))
    return out


def free_spot(env: LiberoEnv, site: int, body: int, turn: float = 0.0) -> np.ndarray:
    """Offset (2-d) from a region site's centre to put ``body``'s origin at: the centre unless other objects
    stand in the way there (libero_10's second moka pot, whose stove region holds the first), else the spot
    of a 1 cm grid inside the region (LIBERO's ``In`` / ``On`` of a region test the origin against the site's
    box) whose footprint overlaps other objects least, ties to the nearer spot. Inside a drawer, the fixture's
    parts that hang over the region (:func:`_overhang_boxes`) are in the way too; in any other region, the
    fixture's thin walls around it (:func:`_wall_boxes`). ``turn``: the body as it will be, turned by that
    much (radians) about its origin in the hand (:meth:`PickPlace._fit_turn`)."""
    model, data = mj_model(env), env.sim.data
    center = np.array(data.site_xpos[site])
    half = region_half(env, site)[:2]
    lo, hi = body_box(env, body)
    foot = (hi[:2] - lo[:2]) / 2
    offset = (lo[:2] + hi[:2]) / 2 - np.array(data.xpos[body][:2])  # footprint centre relative to the origin
    if turn:
        mid, axes, ext = body_frame_box(env, body)
        spin = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
        foot = sum(ext[i] * np.abs(spin @ axes[:2, i]) for i in range(3))
        offset = spin @ (mid[:2] - np.array(data.xpos[body][:2]))
    fixture = int(model.body_rootid[model.site_bodyid[site]])  # the region's own fixture (a stove's frame) is no obstacle
    boxes = [(blo[:2], bhi[:2]) for blo, bhi in _obstacle_boxes(env, (body, fixture))
             if bhi[2] > center[2] + SPOT_TALL and blo[2] < center[2] + 0.3
             and np.all(blo[:2] < center[:2] + half + foot) and np.all(bhi[:2] > center[:2] - half - foot)]
    over = _overhang_boxes(env, site, fixture, center, half + foot)
    boxes += over if over else _wall_boxes(env, site, fixture, center, half + foot)
    if not boxes:
        return np.zeros(2)
    inner = np.maximum(half - SPOT_MARGIN, 0.0)  # LIBERO's in_box wants the origin strictly inside
    gx = np.arange(-inner[0], inner[0] + 1e-9, SPOT_STEP)
    gy = np.arange(-inner[1], inner[1] + 1e-9, SPOT_STEP)
    pts = np.stack(np.meshgrid(gx, gy), axis=-1).reshape(-1, 2)
    c = center[:2] + pts + offset
    hit = np.zeros(len(pts))
    for blo, bhi in boxes:
        hit += np.prod(np.clip(np.minimum(c + foot, bhi) - np.maximum(c - foot, blo), 0.0, None), axis=1)
    if hit[np.argmin(np.linalg.norm(pts, axis=1))] == 0.0:
        return np.zeros(2)  # the centre is free: as before
    cost = hit + 1e-4 * np.linalg.norm(pts, axis=1)
    return pts[int(np.argmin(cost))]


LAY_WALL = 0.015  # m: a standing object to be laid down stands this far from the region's edge behind it
LAY_ROOM = 0.035  # m: the closed hand starts its push this far behind the standing object's footprint
LAY_BELOW_TOP = 0.03  # m: ... and this far under its top
LAY_PUSH = 0.14  # m: ... and pushes this far


def lay_down_axis(env: LiberoEnv, site: int, body: int) -> np.ndarray | None:
    """The direction (unit (2,), a table axis, away from the robot) to lay ``body`` down along in region ``site``
    when standing it there leaves its origin above the region's box (LIBERO's ``In`` tests the origin in 3-d):
    a 14.6 cm ketchup bottle in an opened drawer whose region is 6 cm high (libero_90 32). None when it stands
    inside, when lying on its wider side would not bring the origin in either, or when the region is shorter
    than the object lying along both axes."""
    data = env.sim.data
    center, half = np.array(data.site_xpos[site]), region_half(env, site)
    top = float(center[2] + half[2])
    lo, hi = body_box(env, body)
    floor = support_height(env, center[:2], np.full(2, 0.01), exclude_roots=(body,), below=top)
    if not np.isfinite(floor) or floor + float(data.xpos[body][2] - lo[2]) <= top - 0.002:  # stands in (tray: 3.5 mm)
        return None
    _, axes, ext = body_frame_box(env, body)
    up = int(np.argmax(np.abs(axes[2])))
    if floor + max(float(ext[i]) for i in range(3) if i != up) >= top - 0.005:
        return None
    axis = int(np.argmax(half[:2]))
    if 2 * half[axis] < 2 * ext[up] + float(hi[axis] - lo[axis]) + LAY_WALL:
        return None
    d = np.zeros(2)
    d[axis] = 1.0 if center[axis] >= float(np.asarray(env._robot.base_pos)[axis]) else -1.0
    return d


class PickPlace:
    """Skill for ``('on', obj, target)`` / ``('in', obj, target)``: pick ``obj`` and put it on / in ``target``.

    Targets: another object (its body origin, as LIBERO's ``On`` compares origins within 3 cm) or a region
    site (its centre). The object is lowered until its bottom is ``RELEASE_HEIGHT`` above whatever lies
    under its footprint there (a plate, a basket's floor, a bowl's rim), or until it touches, then released.
    An elongated object that does not fit an ``in`` region's box as held is turned in the hand until it does
    (:meth:`_fit_turn`), and its spot chosen for the turned footprint.
    """

    def __init__(self, env: LiberoEnv, predicate: list[str] | tuple[str, ...], max_attempts: int = MAX_ATTEMPTS):
        pred = tuple(str(p).lower() for p in predicate)
        if len(pred) != 3 or pred[0] not in PLACE_PREDICATES:
            raise ConfigError(f"PickPlace takes ('on'|'in', object, target), got {list(predicate)}")
        self.env = env
        self.predicate = pred
        self.outcome: str | None = None
        self.attempts = 0
        self.max_attempts = int(max_attempts)
        self.failures: list[str] = []
        self.steps = 0
        rs = env.libero_env
        if pred[1] not in rs.objects_dict:
            self.outcome = "unsupported"  # a fixture cannot be carried
            return
        self.body = _object_body(env, pred[1])
        self._target_name = pred[2]
        self._target_body = None
        self._site = None
        if pred[2] in rs.objects_dict or pred[2] in rs.fixtures_dict:
            self._target_body = _object_body(env, pred[2])
        else:
            import mujoco

            site = mujoco.mj_name2id(mj_model(env), mujoco.mjtObj.mjOBJ_SITE, pred[2])
            if site < 0:
                self.outcome = "unsupported"
                return
            self._site = int(site)
        self._new_attempt()

    # ------------------------------------------------------------------------------------ protocol

    def act(self) -> np.ndarray | None:
        if self.outcome is not None:
            return None
        self.steps += 1
        for _ in range(8):  # phase changes without a step in between
            action = self._phase_action()
            if action is not None or self.outcome is not None:
                return action
        return self._hold(-1.0)

    # ----------------------------------------------------------------------------------- internals

    def _new_attempt(self) -> None:
        self.attempts += 1
        if self.attempts > self.max_attempts:
            self.outcome = self.failures[-1] if self.failures else "timeout"
            return
        self.grasp = self._plan_grasp()
        if self.grasp is None:
            self.outcome = "unsupported"
            return
        self.rot = topdown_rotation(self.grasp.yaw)
        rest_lo, rest_hi = body_box(self.env, self.body)  # where the object rests
        self._rest_top, self._rest_lo = float(rest_hi[2]), float(rest_lo[2])
        self._spot = free_spot(self.env, self._site, self.body) if self._site is not None else np.zeros(2)
        self._lay = lay_down_axis(self.env, self._site, self.body) if self._site is not None and \
            self.predicate[0] == "in" else None
        if self._lay is not None:  # stood up behind the centre, so that laid down it ends across it
            along = float(np.abs(self._lay) @ (rest_hi[:2] - rest_lo[:2])) / 2
            self._spot = -self._lay * (float(np.abs(self._lay) @ region_half(self.env, self._site)[:2]) - along
                                       - LAY_WALL)
        self._tipped = False
        self.phase = _Phase("rise")
        self._obj_z0 = float(self.env.sim.data.xpos[self.body][2])
        self._hang = None
        self._offset = None
        self._last_eef = None
        self._stall = 0

    def _plan_grasp(self) -> GraspPose | None:
        """This attempt's grasp: the next of :func:`plan_grasps`' poses, best first."""
        poses = plan_grasps(self.env, self.body)
        return poses[(self.attempts - 1) % len(poses)] if poses else None

    def _fail(self, kind: str) -> None:
        self.failures.append(kind)
        self._new_attempt()
        if self.outcome is None:
            self.phase = _Phase("reopen")

    def _goto(self, name: str) -> None:
        self.phase = _Phase(name)

    def _hold(self, gripper: float) -> np.ndarray:
        return step_toward(self.env, self.env.eef_pose()[0], self.rot, gripper)

    def _target_xy(self) -> np.ndarray:
        if self._site is not None:
            return np.array(self.env.sim.data.site_xpos[self._site][:2]) + self._spot
        return np.array(self.env.sim.data.xpos[self._target_body][:2])

    def _travel_z(self, a_xy: np.ndarray, b_xy: np.ndarray, hang: float, exclude: tuple[int, ...]) -> float:
        """Grip-site height that carries ``hang`` metres below it over every box near the segment a-b."""
        top = -np.inf
        for lo, hi in _obstacle_boxes(self.env, exclude):
            seg_lo, seg_hi = np.minimum(a_xy, b_xy) - 0.05, np.maximum(a_xy, b_xy) + 0.05
            if np.all(lo[:2] <= seg_hi) and np.all(hi[:2] >= seg_lo):
                # a box overlapping the rectangle around the segment: check its distance to the segment
                if _segment_box_distance(a_xy, b_xy, lo[:2], hi[:2]) < 0.05:
                    top = max(top, float(hi[2]))
        z = max(top, self._rest_top if hang < 0.02 else self._rest_lo) + hang + CLEARANCE
        base_z = float(np.asarray(self.env._robot.base_pos)[2])
        return float(min(z, base_z + 0.55))

    def _diagonal(self, eef: np.ndarray, dest: np.ndarray) -> np.ndarray:
        """Where (2-d) the hand may already head while it still rises with the object: up to 5 cm toward
        ``dest`` when the carried object's bottom clears, by 1.5 cm, every obstacle within 2 cm of its
        footprint's way there; the hand's own xy otherwise (rising and crossing at once saves ~40 % of
        the transport's steps, which an In into an opened drawer needs within 300)."""
        d = dest - eef[:2]
        dist = float(np.linalg.norm(d))
        if dist < 1e-6:
            return eef[:2].copy()
        ahead = eef[:2] + d / dist * min(0.05, dist)
        lo, hi = body_box(self.env, self.body)
        reach = float(np.linalg.norm(hi[:2] - lo[:2])) / 2 + 0.02
        bottom = float(lo[2])
        for blo, bhi in _obstacle_boxes(self.env, (self.body,)):
            if _segment_box_distance(eef[:2] + (lo[:2] + hi[:2]) / 2 - eef[:2], ahead + (lo[:2] + hi[:2]) / 2 - eef[:2],
                                     blo[:2], bhi[:2]) < reach and bhi[2] > bottom - 0.015:
                return eef[:2].copy()
        return ahead

    def _arrived(self, goal: np.ndarray, tol: float) -> bool:
        return float(np.linalg.norm(self.env.eef_pose()[0] - goal)) < tol

    def _fit_turn(self) -> float:
        """The turn (radians, about z) of the held object that makes its footprint fit the target region's box
        (LIBERO's ``in_box`` extents) when it does not fit as held: an upright book into a caddy's 5.7 cm
        compartment. 0 for a target object, an ``on``, a footprint with sides within ``FIT_ASPECT`` of each
        other (a bowl, a can: turning does not change what fits), or when no turn the wrist can make fits."""
        if self._site is None or self.predicate[0] != "in":
            return 0.0
        env = self.env
        _, axes, half = body_frame_box(env, self.body)
        up = int(np.argmax(np.abs(axes[2])))
        sides = [(float(half[i]), axes[:2, i] / max(np.linalg.norm(axes[:2, i]), 1e-9)) for i in range(3) if i != up]
        if max(h for h, _ in sides) < FIT_ASPECT * min(h for h, _ in sides):
            return 0.0
        room = region_half(env, self._site)[:2] + FIT_SLACK

        def fits(turn: float) -> bool:
            c, s = np.cos(turn), np.sin(turn)
            spin = np.array([[c, -s], [s, c]])
            extent = sum(h * np.abs(spin @ d) for h, d in sides)
            return bool(np.all(extent <= room))

        if fits(0.0):
            return 0.0
        long = max(sides, key=lambda side: side[0])[1]
        base = -float(np.arctan2(long[1], long[0]))  # the long side onto the world's x axis (in_box's boxes are
        turns = [(base + k * np.pi / 2 + np.pi) % (2 * np.pi) - np.pi for k in range(4)]  # the world's axes')
        for turn in sorted((t for t in turns if fits(t)), key=abs):
            if wrist_allows(env, gripper_yaw(env) + turn):
                return turn
        return 0.0

    def _yaw_ok(self, tol: float = 0.08) -> bool:
        rot = self.env.eef_pose()[1]
        err = np.linalg.norm(_rotvec(self.rot @ rot.T))
        return bool(err < tol)

    def _stalled(self, eps: float = 0.0015, patience: int = 4) -> bool:
        eef = self.env.eef_pose()[0]
        if self._last_eef is not None and np.linalg.norm(eef - self._last_eef) < eps:
            self._stall += 1
        else:
            self._stall = 0
        self._last_eef = eef
        return self._stall >= patience

    def _tip_action(self, ph: _Phase, eef: np.ndarray, obj: np.ndarray) -> np.ndarray | None:
        """The closed hand comes down behind the standing object (``LAY_ROOM`` behind its footprint, ``LAY_BELOW_TOP``
        under its top) and pushes ``LAY_PUSH`` along :func:`lay_down_axis`; the object pivots on its front edge
        and falls over; then the hand retreats up and the placement is verified."""
        env, d = self.env, np.append(self._lay, 0.0)
        if ph.steps == 1 and ph.name == "tip_over":
            lo, hi = body_box(env, self.body)
            behind = float(d[:2] @ ((lo[:2] + hi[:2]) / 2)) - float(np.abs(d[:2]) @ (hi[:2] - lo[:2])) / 2 - LAY_ROOM
            start = np.array([obj[0], obj[1], float(hi[2]) - LAY_BELOW_TOP])
            start[:2] += d[:2] * (behind - float(d[:2] @ obj[:2]))
            self._tip_start = start
        start = self._tip_start
        if ph.name == "tip_over":
            goal = start + [0.0, 0.0, 0.06]
            if self._arrived(goal, 0.015) or ph.steps > 40:
                self._goto("tip_down")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "tip_down":
            if ph.steps == 1:
                self._last_eef, self._stall = None, 0
            if self._arrived(start, 0.008) or ph.steps > 25 or (ph.steps > 4 and self._stalled(0.001)):
                self._goto("tip_push")
                return None
            return step_toward(env, start, self.rot, 1.0)
        goal = start + d * LAY_PUSH
        if self._arrived(goal, 0.01) or ph.steps > 40:
            self._tipped = True
            self._goto("retreat")
            self._retreat_goal = eef + np.array([0.0, 0.0, 0.08])
            return None
        return step_toward(env, goal, self.rot, 1.0, max_step=0.03)

    def _phase_action(self) -> np.ndarray | None:  # noqa: C901 - one state machine, read top to bottom
        env, ph, g = self.env, self.phase, self.grasp
        ph.steps += 1
        eef = env.eef_pose()[0]
        obj = np.array(env.sim.data.xpos[self.body])
        if ph.name == "reopen":  # after a failed attempt: open and back off upward
            goal = eef.copy()
            goal[2] = max(eef[2], g.point[2] + 0.08)
            if ph.steps > 6 and finger_gap(env) > 0.06:
                self._goto("rise")
                return None
            return step_toward(env, goal, None, -1.0)
        if ph.name == "rise":
            if ph.steps == 1:
                self._travel = self._travel_z(eef[:2], g.point[:2], 0.01, exclude=(self.body,))
                self._travel = max(self._travel, g.point[2] + 0.05)
            if eef[2] >= self._travel - 0.03 or np.linalg.norm(eef[:2] - g.point[:2]) < 0.03 or ph.steps > 25:
                self._goto("over")
                return None
            return step_toward(env, np.array([eef[0], eef[1], self._travel]), None, -1.0)
        if ph.name == "over":
            goal = np.array([g.point[0], g.point[1], self._travel])
            if (self._arrived(goal, 0.015) and self._yaw_ok()) or ph.steps > 60:
                if ph.steps > 60 and not self._arrived(goal, 0.05):
                    self._fail("unreachable")
                    return None
                self._goto("descend")
                return None
            return step_toward(env, goal, self.rot, -1.0, rot_gain=OVER_ROT_GAIN)
        if ph.name == "descend":
            # re-aim at the object's current pose (it may have been nudged) on the way down
            goal = g.point.copy()
            if ph.steps == 1:
                self._last_eef = None
                self._stall = 0
            if self._arrived(goal, 0.006) or ph.steps > 40 or (ph.steps > 5 and self._stalled()):
                self._goto("close")
                return None
            return step_toward(env, goal, self.rot, -1.0)
        if ph.name == "close":
            gap = finger_gap(env)
            settled = ph.steps > 5 and abs(gap - getattr(self, "_gap", gap + 1.0)) < 0.0003  # fingers stopped
            self._gap = gap
            if ph.steps > 10 or settled:
                self._goto("lift")
                self._lift_from = eef.copy()
                self._obj_z0 = float(obj[2])
                return None
            return step_toward(env, g.point, self.rot, 1.0)
        if ph.name == "lift":
            goal = self._lift_from + np.array([0.0, 0.0, 0.06])
            if finger_gap(env) < CLOSED_GAP:
                self._fail("missed")
                return None
            if self._arrived(goal, 0.01) or ph.steps > 20:
                rose = float(obj[2]) - self._obj_z0
                if rose < GRASP_RISE:
                    self._fail("missed")
                    return None
                lo, _ = body_box(env, self.body)
                self._hang = float(eef[2] - lo[2])
                self._offset = eef[:2] - obj[:2]
                self._rel = env.eef_pose()[1].T @ (eef - obj)  # in the hand's frame: it may turn the object
                turn = self._fit_turn()
                if turn:
                    c, s = np.cos(turn), np.sin(turn)
                    self._offset = np.array([[c, -s], [s, c]]) @ self._offset
                    self.rot = topdown_rotation(self.grasp.yaw + turn)
                    self._spot = free_spot(env, self._site, self.body, turn)  # the footprint turned
                self._goto("carry_up")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        # --- carrying: watch for a slip
        if ph.name in ("carry_up", "carry", "lower") and self._hang is not None:
            if np.linalg.norm(env.eef_pose()[1].T @ (eef - obj) - self._rel) > 0.03 or finger_gap(env) < CLOSED_GAP:
                self._fail("slipped")
                return None
        if ph.name == "carry_up":
            if ph.steps == 1:
                dest = self._target_xy() + self._offset
                self._travel = self._travel_z(eef[:2], dest, self._hang, exclude=(self.body,))
            if eef[2] >= self._travel - 0.02 or ph.steps > 25:
                self._goto("carry")
                return None
            goal_xy = self._diagonal(eef, self._target_xy() + self._offset)
            return step_toward(env, np.array([goal_xy[0], goal_xy[1], max(self._travel, eef[2])]), self.rot, 1.0)
        if ph.name == "carry":
            dest = self._target_xy() + self._offset
            goal = np.array([dest[0], dest[1], self._travel])
            if self._arrived(goal, 0.012) or ph.steps > 60:
                self._goto("lower")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "lower":
            dest = self._target_xy() + self._offset
            lo, hi = body_box(env, self.body)
            half = (hi[:2] - lo[:2]) / 2
            obj_xy_at_dest = (lo[:2] + hi[:2]) / 2 + (dest - eef[:2])
            support = support_height(env, obj_xy_at_dest, half, exclude_roots=(self.body,), below=float(lo[2]) + 0.005)
            if not np.isfinite(support):
                support = float(lo[2]) - 0.05
            goal_z = support + RELEASE_HEIGHT + self._hang
            goal = np.array([dest[0], dest[1], goal_z])
            if ph.steps == 1:
                self._last_eef = None
                self._stall = 0
            touching = self._target_body is not None and bodies_in_contact(env, self.body, self._target_body)
            if self._arrived(goal, 0.008) or touching or ph.steps > 40 or (ph.steps > 4 and self._stalled(0.001)):
                self._goto("release")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "release":
            if ph.steps > 6 and finger_gap(env) > 0.05 or ph.steps > 15:
                self._goto("retreat")
                self._retreat_goal = eef + np.array([0.0, 0.0, 0.08])
                return None
            return self._hold(-1.0)
        if ph.name == "retreat":
            if self._arrived(self._retreat_goal, 0.015) or ph.steps > 20:
                self._goto("verify" if self._lay is None or self._tipped else "tip_over")
                return None
            return step_toward(env, self._retreat_goal, self.rot, -1.0)
        if ph.name in ("tip_over", "tip_down", "tip_push"):  # lay the standing object down: push its top over
            return self._tip_action(ph, eef, obj)
        if ph.name == "verify":
            if predicate_holds(env, self.predicate):
                self.outcome = "done"
                return None
            if ph.steps > 10:
                self._fail("misplaced")
                return None
            return self._hold(-1.0)
        raise RuntimeError(f"unknown phase {ph.name!r}")


def _rotvec(r: np.ndarray) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    return Rotation.from_matrix(r).as_rotvec()


def _segment_box_distance(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Distance (m) in the plane between segment a-b and the box [lo, hi] (sampled along the segment)."""
    best = np.inf
    for t in np.linspace(0.0, 1.0, 11):
        p = a + t * (b - a)
        d = np.maximum(np.maximum(lo - p, p - hi), 0.0)
        best = min(best, float(np.linalg.norm(d)))
    return best


# -------------------------------------------------------------------------------------------- slide

SLIDE_MAX_HEIGHT = 0.03  # m: objects lower than this that no top grasp fits (plates) are slid, not carried
SLIDE_PEG_LEAD = 0.03  # m: how far past the rim's inside the dragging fingers are commanded (the drag's force)
SLIDE_PRESS = 0.03  # m: the dragging fingers are commanded this far below where they touch (a downward force)
SLIDE_MAX_TILT = float(np.cos(np.radians(5.0)))  # the dragged object tilting past 5 degrees is a slip
SLIDE_MARGIN = 0.02  # m: aim this far inside the goal region's edges
SLIDE_CLEAR = 0.012  # m: keep the slid object's outline this far from other objects


def slidable(env: LiberoEnv, predicate: tuple[str, ...]) -> bool:
    """Whether ``('on', obj, region)`` is done by sliding: ``obj`` is flat (under ``SLIDE_MAX_HEIGHT``) and
    wider than the open gripper both ways (a plate: its 1.9 cm rim is too low to pinch above the table),
    and ``region`` is a site on the surface the object stands on (a table region, not another object)."""
    rs = env.libero_env
    if len(predicate) != 3 or predicate[0] != "on" or predicate[1] not in rs.objects_dict:
        return False
    if predicate[2] in rs.objects_dict or predicate[2] in rs.fixtures_dict:
        return False
    import mujoco

    site = mujoco.mj_name2id(mj_model(env), mujoco.mjtObj.mjOBJ_SITE, predicate[2])
    if site < 0:
        return False
    body = _object_body(env, predicate[1])
    lo, _ = body_box(env, body)
    _, axes, half = body_frame_box(env, body)  # the object's own frame: a tilted plate stays flat
    up = int(np.argmax(np.abs(axes[2])))
    narrow = min(2.0 * half[i] for i in range(3) if i != up)
    if 2.0 * half[up] > SLIDE_MAX_HEIGHT or narrow <= GRIPPER_MAX_GAP - FIT_MARGIN:
        return False
    xy = np.array(env.sim.data.site_xpos[site][:2])
    support = support_height(env, xy, np.full(2, 0.01), exclude_roots=(body,), below=float(lo[2]) + 0.02)
    return bool(abs(support - lo[2]) < 0.01)


def floor_top(env: LiberoEnv, body: int) -> float:
    """Top (m) of ``body``'s own collision geoms under its origin: a plate's floor, inside its rim."""
    model, data = mj_model(env), env.sim.data
    origin = np.array(data.xpos[body])
    best = -np.inf
    for g in range(model.ngeom):
        if not in_subtree(model, int(model.geom_bodyid[g]), body) or not (model.geom_contype[g] or model.geom_conaffinity[g]):
            continue
        rot = np.array(data.geom_xmat[g]).reshape(3, 3)
        center = np.array(data.geom_xpos[g]) + rot @ model.geom_aabb[g, :3]
        half = np.abs(rot) @ model.geom_aabb[g, 3:]
        if np.all(np.abs(origin[:2] - center[:2]) <= half[:2] + 1e-4):
            best = max(best, float(center[2] + half[2]))
    return best if np.isfinite(best) else float(body_box(env, body)[0][2])


def _disk_box_overlap(p: np.ndarray, radius: float, lo: np.ndarray, hi: np.ndarray) -> float:
    """How deep (m) a disk of ``radius`` at ``p`` reaches into the 2-d box [lo, hi] (0 when apart)."""
    d = np.maximum(np.maximum(lo - p, p - hi), 0.0)
    return max(0.0, radius - float(np.linalg.norm(d)))


def plan_slide(start: np.ndarray, region_center: np.ndarray, region_half: np.ndarray, radius: float,
               obstacles: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """Waypoints (object origin positions, 2-d) from ``start`` to a point of the goal region.

    Candidates: the region's centre and eight points ``SLIDE_MARGIN`` inside its edges, each reached
    straight or through one waypoint of a 5 cm grid over their box grown by 12 cm; cost = path length + 300 x the
    swept overlap (m x m) of the object's disk (``radius`` + ``SLIDE_CLEAR``) with the obstacles'
    footprints + 0.5 x the goal's distance from the region's centre, so the path goes round other objects
    when it can (libero_goal/5: round the cream cheese in front of the stove)."""
    start = np.asarray(start, dtype=np.float64)
    center = np.asarray(region_center, dtype=np.float64)
    inner = np.maximum(np.asarray(region_half, dtype=np.float64) - SLIDE_MARGIN, 0.0)
    goals = np.array([center + inner * np.array([sx, sy]) for sx in (-1, 0, 1) for sy in (-1, 0, 1)])
    r = radius + SLIDE_CLEAR
    los = np.array([lo for lo, _ in obstacles]).reshape(-1, 2)
    his = np.array([hi for _, hi in obstacles]).reshape(-1, 2)

    def swept(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Overlap integral (m x m) of segments a[i] -> b[i] (arrays (N, 2)) with the obstacles."""
        seg = np.linalg.norm(b - a, axis=1)
        t = np.linspace(0.0, 1.0, 21)[1:]
        p = a[:, None, :] + t[None, :, None] * (b - a)[:, None, :]  # (N, T, 2)
        if len(los) == 0:
            return np.zeros(len(a))
        d = np.maximum(np.maximum(los[None, None] - p[:, :, None], p[:, :, None] - his[None, None]), 0.0)
        depth = np.maximum(r - np.linalg.norm(d, axis=3), 0.0).sum(axis=2)  # (N, T)
        return depth.mean(axis=1) * seg

    lo_g = np.minimum(start, center) - 0.12
    hi_g = np.maximum(start, center) + 0.12
    gx, gy = np.meshgrid(np.arange(lo_g[0], hi_g[0] + 1e-9, 0.05), np.arange(lo_g[1], hi_g[1] + 1e-9, 0.05))
    grid = np.stack([gx.ravel(), gy.ravel()], axis=1)
    goal_cost = 0.5 * np.linalg.norm(goals - center, axis=1)
    direct = np.linalg.norm(goals - start, axis=1) + 300.0 * swept(np.repeat(start[None], len(goals), 0), goals)
    best_cost, best = float(np.min(direct + goal_cost)), [goals[int(np.argmin(direct + goal_cost))]]
    first = np.linalg.norm(grid - start, axis=1) + 300.0 * swept(np.repeat(start[None], len(grid), 0), grid)
    for k, goal in enumerate(goals):
        second = np.linalg.norm(goal - grid, axis=1) + 300.0 * swept(grid, np.repeat(goal[None], len(grid), 0))
        total = first + second + goal_cost[k] + 0.02  # a corner costs a little
        i = int(np.argmin(total))
        if total[i] < best_cost:
            best_cost, best = float(total[i]), [grid[i], goal]
    return [np.asarray(p, dtype=np.float64) for p in best]


class Slide:
    """Skill for ``('on', flat_obj, table_region)`` (:func:`slidable`): drag the object along the table.

    A plate's rim is a 22-degree slope 1.9 cm high (its eight collision boxes run from 3.0 cm to 6.6 cm
    off the centre): a pinch above the table holds only its top millimetres, fingers under its outer edge
    lift it, and pushing it from behind needs room behind it that a cabinet or a bowl next to it leaves
    not (libero_goal/5: 3 cm and 6 mm). So the closed fingers go down inside it, next to the centre, and
    press down (``SLIDE_PRESS`` below their touching height) while they are driven toward the next
    waypoint of :func:`plan_slide`: they bear on the inside of the rim on that side, and the downward
    force keeps them from riding up the slope (no slip while the press exceeds ~0.85 x the plate's weight
    at friction 0.95). Each step re-aims at the object's current position. If the fingers leave the
    object or it tilts, the attempt is re-planned from the new pose ("slipped", a bounded number of times)."""

    def __init__(self, env: LiberoEnv, predicate: list[str] | tuple[str, ...], max_attempts: int = 4):
        pred = tuple(str(p).lower() for p in predicate)
        if not (slidable(env, pred) or (len(pred) == 3 and pred[0] == "clear")):
            raise ConfigError(f"Slide takes ('on', flat object, table region) or ('clear', object, drawer region), "
                              f"got {list(predicate)}")
        import mujoco

        self.env = env
        self.predicate = pred
        self.outcome: str | None = None
        self.failures: list[str] = []
        self.attempts = 0
        self.max_attempts = int(max_attempts)
        self.body = _object_body(env, pred[1])
        if pred[0] == "clear":  # a fixed point out of the drawer's way, 1.5 cm of slack each way
            self._goal, self._goal_half = clear_goal(env, pred[1], pred[2]), np.full(2, SLIDE_MARGIN + 0.015)
        else:
            site = int(mujoco.mj_name2id(mj_model(env), mujoco.mjtObj.mjOBJ_SITE, pred[2]))
            self._goal, self._goal_half = np.array(env.sim.data.site_xpos[site][:2]), np.array(mj_model(env).site_size[site][:2])
        self.rot = topdown_rotation(reachable_yaw(env, gripper_yaw(env)))
        self._new_attempt()

    def _new_attempt(self) -> None:
        self.attempts += 1
        if self.attempts > self.max_attempts:
            self.outcome = self.failures[-1] if self.failures else "timeout"
            return
        env = self.env
        obj = np.array(env.sim.data.xpos[self.body])
        lo, hi = body_box(env, self.body)
        self._radius = float(np.max(hi[:2] - lo[:2]) / 2)
        self._inner = 0.6 * self._radius  # where the rim's inside is (a plate: 4.1 cm of 6.8)
        self._top = float(hi[2])
        _, axes, _ = body_frame_box(env, self.body)
        self._up = int(np.argmax(np.abs(axes[2])))
        self._press_z = floor_top(env, self.body) + FINGER_BELOW_SITE - SLIDE_PRESS
        others = [(blo[:2], bhi[:2]) for blo, bhi in _obstacle_boxes(env, (self.body,)) if bhi[2] > lo[2] + 0.005]
        self.path = plan_slide(obj[:2], self._goal, self._goal_half, self._radius, others)
        self._wp = 0
        d = self.path[0] - obj[:2]
        self._start_xy = obj[:2] + 0.01 * d / max(float(np.linalg.norm(d)), 1e-9)
        eef_xy = env.eef_pose()[0][:2]
        tops = [float(bhi[2]) for blo, bhi in _obstacle_boxes(env, (self.body,))
                if _segment_box_distance(eef_xy, self._start_xy, blo[:2], bhi[:2]) < 0.05]
        self._travel = max(tops + [self._top]) + 0.06
        self.phase = _Phase("rise")

    def act(self) -> np.ndarray | None:
        for _ in range(6):
            if self.outcome is not None:
                return None
            action = self._phase_action()
            if action is not None:
                return action
        return step_toward(self.env, self.env.eef_pose()[0], self.rot, 1.0)

    def _fail(self, kind: str) -> None:
        self.failures.append(kind)
        self._new_attempt()

    def _phase_action(self) -> np.ndarray | None:  # noqa: C901 - one state machine, read top to bottom
        env, ph = self.env, self.phase
        ph.steps += 1
        eef = env.eef_pose()[0]
        obj = np.array(env.sim.data.xpos[self.body])
        if ph.name == "rise":
            if eef[2] >= self._travel - 0.02 or ph.steps > 25:
                self.phase = _Phase("over")
                return None
            return step_toward(env, np.array([eef[0], eef[1], self._travel]), self.rot, 1.0)
        if ph.name == "over":
            goal = np.array([self._start_xy[0], self._start_xy[1], self._travel])
            if float(np.linalg.norm(eef - goal)) < 0.015 or ph.steps > 60:
                self.phase = _Phase("descend")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "descend":
            goal = np.array([self._start_xy[0], self._start_xy[1], self._press_z])
            if ph.steps == 1:
                self._last = None
                self._still = 0
            if self._last is not None and abs(eef[2] - self._last) < 0.001:
                self._still += 1
            self._last = float(eef[2])
            if self._still >= 3 or ph.steps > 30:
                self.phase = _Phase("drag")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "drag":
            wp = self.path[self._wp]
            last = self._wp == len(self.path) - 1
            e = wp - obj[:2]
            dist = float(np.linalg.norm(e))
            if last and (dist < 0.006 or (dist < 0.015 and predicate_holds(env, self.predicate))):
                self.phase = _Phase("retreat")
                return None
            if not last and dist < 0.02:
                self._wp += 1
                return None
            up = np.array(env.sim.data.xmat[self.body]).reshape(3, 3)[2, self._up]
            if float(np.linalg.norm(eef[:2] - obj[:2])) > self._radius or abs(up) < SLIDE_MAX_TILT:
                self._fail("slipped")
                return None
            if ph.steps == 1 or ph.steps % 15 == 0:
                if ph.steps > 1 and float(np.linalg.norm(obj[:2] - self._mark)) < 0.005:
                    self._fail("stuck")  # blocked (by an object, or the arm's reach): re-plan from here
                    return None
                self._mark = obj[:2].copy()
            u = e / dist
            goal_xy = obj[:2] + u * (self._inner + SLIDE_PEG_LEAD * min(1.0, dist / 0.03))
            return step_toward(env, np.array([goal_xy[0], goal_xy[1], self._press_z]), self.rot, 1.0, max_step=0.05)
        if ph.name == "retreat":
            if eef[2] > self._top + 0.04 or ph.steps > 15:
                if predicate_holds(env, self.predicate):
                    self.outcome = "done"
                else:
                    self._fail("misplaced")
                return None
            return step_toward(env, np.array([eef[0], eef[1], self._top + 0.08]), self.rot, 1.0)
        raise RuntimeError(f"unknown phase {ph.name!r}")


def place_skill(env: LiberoEnv, predicate: list[str] | tuple[str, ...]) -> Skill:
    """The skill for an ``on`` / ``in`` sub-goal: :class:`Slide` for a flat object onto a table region,
    :class:`Insert` for a cup into a roofed region (a microwave), :class:`PickPlace` otherwise."""
    pred = tuple(str(p).lower() for p in predicate)
    if slidable(env, pred):
        return Slide(env, pred)
    if pred[0] == "in" and pred[1] in env.libero_env.objects_dict:
        insert = Insert(env, pred)
        if insert.outcome != "unsupported":
            return insert
    return PickPlace(env, pred)


# ------------------------------------------------------------------------------ under a roof (microwave)

ROOF_ROOM = 0.12  # m: a region whose fixture closes over it less than this above the carried object is roofed
INSERT_MARGIN = 0.015  # m: the object's origin ends this far inside the region's edge on the opening's side
INSERT_STAGE = 0.02  # m: the carried object's leading edge waits this far outside the opening
INSERT_LIFT = 0.01  # m: the carried object's bottom above the floor while it goes in
HAND_HALF_DEPTH = 0.03  # m: the hand's half thickness across its closing axis (the fingers' 1.4 cm, the palm's 7)
HANDLE_OUT = 0.012  # m: geoms this far outside the rim's circle are a handle's
HANDLE_SLIDE = 0.03  # m: a handle bar this long (half length) pointing out is held where the hand is free
HANDLE_END = 0.015  # m: ... and at least this far from the bar's ends
HANDLE_WALL = 0.012  # m: box geoms at most this thick reaching the rim make a vessel's ring (LIBERO's mugs: 8.2 mm)


def handle_grasp(env: LiberoEnv, body: int) -> tuple[GraspPose, np.ndarray, float] | None:
    """A top grasp of a handle, the handle's direction (unit (2,), from the vessel's axis out) and how far (m)
    the grasped bar's middle stands outside the vessel's ring; None for an object without one.

    The vessel is the ring of thin wall pieces (``HANDLE_WALL``) reaching the rim, the highest level that six
    of them reach (a mug's rim is its top; a frying pan's handle rises above its rim); its handle is the
    collision geometry standing more than ``HANDLE_OUT`` outside the ring. The fingers close across the
    outermost handle piece (the bar a hand would hold), 5 mm above its middle; along a long bar pointing out
    (``HANDLE_SLIDE``: a pan's), at the first hold from the vessel where the open hand meets least of the scene."""
    lo, _ = body_box(env, body)
    pieces = _box_pieces(env, body)
    thin = [(c, c[2] + float(np.abs(rot[2]) @ size)) for c, rot, size in pieces if size.min() <= HANDLE_WALL / 2]
    if len(thin) < 6:
        return None
    rim = sorted((top for _, top in thin), reverse=True)[5]
    walls = np.array([c[:2] for c, top in thin if top >= rim - 0.01])
    center = walls.mean(axis=0)
    radius = float(np.linalg.norm(walls - center, axis=1).max())
    out = [(float(np.linalg.norm(c[:2] - center)), c, rot, size) for c, rot, size in pieces
           if np.linalg.norm(c[:2] - center) > radius + HANDLE_OUT]
    if not out:
        return None
    dist, bar, rot, size = max(out, key=lambda o: o[0])
    d = (bar[:2] - center) / np.linalg.norm(bar[:2] - center)
    yaw = reachable_yaw(env, float(np.arctan2(d[0], -d[1])))  # the closing axis across the handle
    long = int(np.argmax(size))
    axis = rot[:, long]
    if abs(float(axis[:2] @ d)) < 0.8 or size[long] < HANDLE_SLIDE:
        half_h = float(np.abs(rot[2]) @ size)
        z = max(float(bar[2]) + min(0.005, half_h / 2), float(lo[2]) + FINGER_BELOW_SITE)
        return GraspPose(np.array([bar[0], bar[1], z]), yaw, "handle"), d, dist - radius
    # a long bar pointing out (a pan's handle): the hold nearest the vessel where the open hand meets least of the
    # scene (a moka pot 1.3 cm beside a pan's handle, libero_90 18)
    half_h = float(np.abs(rot[2]) @ size) - abs(float(rot[2, long])) * size[long]  # without the bar's own tilt
    axis = axis * np.sign(float(axis[:2] @ d))  # outward
    obbs = _geom_obbs(env, (body,))
    best = None
    for t in np.arange(-size[long] + HANDLE_END, size[long] - HANDLE_END + 1e-9, 0.01):
        p = bar + t * axis
        point = np.array([p[0], p[1], max(float(p[2]) + min(0.005, half_h / 2), float(lo[2]) + FINGER_BELOW_SITE)])
        hits = hand_collisions(env, point, yaw, (body,), obbs, sweep=APPROACH_SWEEP)
        if best is None or hits < best[0]:
            best = (hits, point)
        if hits == 0:
            break
    return GraspPose(best[1], yaw, "handle"), d, dist - radius


@dataclass
class Opening:
    """Where a roofed region opens and where an object goes in: ``inward`` (unit (2,), into the fixture),
    ``edge`` (the roof's front edge, metres along ``inward``), ``floor`` (its top, m), ``goal`` (the
    object's origin, xy, at the end) and ``span`` (the range, m, of the origin's other table coordinate
    that keeps the object off the side walls and inside the region; ``goal`` is its middle)."""

    inward: np.ndarray
    edge: float
    floor: float
    goal: np.ndarray
    span: tuple[float, float]


def roofed_opening(env: LiberoEnv, site: int, body: int) -> Opening | None:
    """The opening of the fixture around region ``site`` when the fixture closes over it too low for a hand
    above the carried ``body`` (less than ``ROOF_ROOM`` over the object's top): a microwave. None otherwise.

    From the region's centre at half the object's height, the fixture's boxes are met along three of the four
    table axes (walls); the fourth, the one nearest the robot when several are free, is the opening. The floor is
    the fixture's highest part under the centre, or what the fixture stands on when it has none there (a shelf's
    bottom compartment, over the table). The goal puts the object's origin ``INSERT_MARGIN`` inside the region's
    edge there, between the side walls."""
    model, data = mj_model(env), env.sim.data
    root = int(model.body_rootid[int(model.site_bodyid[site])])
    fixture = []  # the fixture's collision boxes
    for g in range(model.ngeom):
        if (model.geom_contype[g] or model.geom_conaffinity[g]) and in_subtree(model, int(model.geom_bodyid[g]), root):
            rot = np.array(data.geom_xmat[g]).reshape(3, 3)
            mid = np.array(data.geom_xpos[g]) + rot @ model.geom_aabb[g, :3]
            ext = np.abs(rot) @ model.geom_aabb[g, 3:]
            fixture.append((mid - ext, mid + ext))
    c = np.array(data.site_xpos[site])
    half = region_half(env, site)
    olo, ohi = body_box(env, body)
    height = float(ohi[2] - olo[2])
    inside = [(lo, hi) for lo, hi in fixture if np.all(lo[:2] <= c[:2]) and np.all(hi[:2] >= c[:2])]
    floors = [float(hi[2]) for lo, hi in inside if hi[2] <= c[2]]
    roofs = [(lo, hi) for lo, hi in inside if lo[2] > c[2]]
    if not floors:  # a shelf's bottom compartment: the table under it is the floor
        floors = [support_height(env, c[:2], np.full(2, 0.01), exclude_roots=(body,), below=float(c[2]))]
    if not roofs or not np.isfinite(max(floors)):
        return None
    floor = max(floors)
    roof_lo, roof_hi = min(roofs, key=lambda b: b[0][2])
    if roof_lo[2] - floor > height + ROOF_ROOM:
        return None
    z = floor + height / 2
    reach = {}
    for axis in (0, 1):
        for sign in (-1.0, 1.0):
            other = 1 - axis
            hits = [sign * (lo[axis] if sign > 0 else hi[axis]) - sign * c[axis] for lo, hi in fixture
                    if lo[other] <= c[other] <= hi[other] and lo[2] <= z <= hi[2]
                    and sign * ((lo[axis] + hi[axis]) / 2 - c[axis]) > 0]
            reach[(axis, sign)] = min([h for h in hits if h >= 0] or [np.inf])
    free = [k for k, v in reach.items() if not np.isfinite(v)]
    if not free:
        return None
    robot = np.asarray(env._robot.base_pos)[:2]
    axis, sign = max(free, key=lambda k: k[1] * (robot[k[0]] - c[k[0]]))  # the free side facing the robot
    inward = np.zeros(2)
    inward[axis] = -sign
    edge = float(np.dot(inward, roof_lo[:2] if sign < 0 else roof_hi[:2]))  # the roof's side toward the opening
    goal = c[:2].copy()
    goal[axis] = c[axis] + sign * (half[axis] - INSERT_MARGIN)
    other = 1 - axis
    origin = np.array(data.xpos[body])
    below, above = origin[other] - olo[other] + 0.01, ohi[other] - origin[other] + 0.01
    lo_o = max(c[other] - reach[(other, -1.0)] + below, c[other] - half[other] + 0.01)
    hi_o = min(c[other] + reach[(other, 1.0)] - above, c[other] + half[other] - 0.01)
    if lo_o > hi_o:
        return None
    goal[other] = (lo_o + hi_o) / 2
    return Opening(inward, edge, floor, goal, (float(lo_o), float(hi_o)))


class Insert(PickPlace):
    """Skill for ``('in', cup, region)`` when the region is under a roof (:func:`roofed_opening`): a
    microwave's inside, 14.4 cm high for a 10.3 cm mug.

    Lowered from above, the mug came to rest on the microwave's roof (libero_10 9: 0 of 50); held by the rim
    from above, the hand alone is 6-12 cm tall. So the cup is taken by its handle (:func:`handle_grasp`) and
    turned while it is carried until the handle points out of the opening; it is lowered in front of the
    opening, to ``INSERT_LIFT`` over the inside's floor, slid in level until its origin is ``INSERT_MARGIN``
    inside the region, set down and let go, and the hand backs out before it rises. The hand stays outside
    the roof's front edge throughout; a cup without a handle, or a goal that would put the hand under the
    roof, is refused (``unsupported``) and :class:`PickPlace` takes the sub-goal."""

    def _new_attempt(self) -> None:
        planned = handle_grasp(self.env, self.body) if self._site is not None else None
        self.opening = roofed_opening(self.env, self._site, self.body) if planned is not None else None
        if planned is None or self.opening is None:
            self.outcome = "unsupported"
            return
        self._handle_pose, handle, _ = planned
        super()._new_attempt()
        if self.outcome is not None:
            return
        env, op = self.env, self.opening
        origin = np.array(env.sim.data.xpos[self.body])
        lo, hi = body_box(env, self.body)
        # the turn (about z) that points the handle out of the opening, and the hand's yaw after it
        turn = float(np.arctan2(-op.inward[1], -op.inward[0]) - np.arctan2(handle[1], handle[0]))
        turn = (turn + np.pi) % (2 * np.pi) - np.pi
        self._turn = turn
        if not wrist_allows(env, self.grasp.yaw, self.grasp.yaw + turn):
            self.grasp.yaw += np.pi  # the hand the other way round
            if not wrist_allows(env, self.grasp.yaw, self.grasp.yaw + turn):
                self.outcome = "unsupported"
                return
        self._end_yaw = self.grasp.yaw + turn
        self.rot = topdown_rotation(self.grasp.yaw)
        self._end_rot = topdown_rotation(self._end_yaw)
        c, s = np.cos(turn), np.sin(turn)
        turned = np.array([[c, -s], [s, c]])
        grip = turned @ (self.grasp.point[:2] - origin[:2])  # from the turned object's origin
        lead = max(float(op.inward @ turned @ (np.array([x, y]) - origin[:2]))
                   for x in (lo[0], hi[0]) for y in (lo[1], hi[1]))  # the turned object's front, from its origin
        if float(op.inward @ (op.goal + grip)) + HAND_HALF_DEPTH > op.edge:
            self.outcome = "unsupported"  # the hand would go under the roof
            return
        self._bottom = float(origin[2] - lo[2])  # the origin above the object's bottom
        self._z_in = op.floor + INSERT_LIFT + self._bottom  # the origin's height going in
        grip_z = self._z_in + float(self.grasp.point[2] - origin[2])
        back = op.edge - INSERT_STAGE - lead - float(op.inward @ op.goal)  # goal -> stage, along inward (< 0)
        # across the opening: the goal whose hand, in front of the opening (and in the column it comes down
        # through) and at the end, is freest of the fixture (a microwave's door, open 76 to 118 degrees, reaches
        # 6 cm into the way of a hand 20 cm long); the middle of the span when all are free
        other = int(np.argmax(np.abs(op.inward[::-1])))
        obbs = _geom_obbs(env, (self.body,))
        best = None
        for x in np.arange(op.span[0], op.span[1] + 1e-9, 0.005):
            goal = op.goal.copy()
            goal[other] = x
            hits = sum(hand_collisions(env, np.append(goal + f * back * op.inward + grip, grip_z), self._end_yaw,
                                       (self.body,), obbs, margin=0.01, sweep=APPROACH_SWEEP * (f == 1.0))
                       for f in (1.0, 0.5, 0.0))
            key = (hits, abs(x - op.goal[other]))
            if best is None or key < best[0]:
                best = (key, goal)
        self._goal = best[1]
        self._stage = self._goal + back * op.inward

    def _plan_grasp(self) -> GraspPose | None:
        return self._handle_pose

    def _fit_turn(self) -> float:
        return 0.0  # the turn is the handle's (``_turn``), set with the grasp

    def _origin_goal_eef(self, origin_xy: np.ndarray, origin_z: float) -> np.ndarray:
        """Hand position that puts the carried object's origin at (xy, z), the hand at its end yaw."""
        return np.append(origin_xy, origin_z) + self._end_rot @ self._grip_local

    def _phase_action(self) -> np.ndarray | None:  # noqa: C901 - one state machine, read top to bottom
        env, ph = self.env, self.phase
        if ph.name in ("reopen", "rise", "over", "descend", "close", "lift", "retreat", "verify"):
            return super()._phase_action()
        ph.steps += 1
        eef, rot = env.eef_pose()
        obj = np.array(env.sim.data.xpos[self.body])
        op = self.opening
        if ph.name == "carry_up" and ph.steps == 1:  # just lifted: the object's pose in the hand from now on
            self._grip_local = rot.T @ (eef - obj)
            self.rot = self._end_rot  # the hand turns the handle out on its way
        if ph.name in ("carry_up", "carry", "stage", "slide", "lower"):
            held = rot.T @ (eef - obj)
            if np.linalg.norm(held - self._grip_local) > 0.03 or finger_gap(env) < CLOSED_GAP:
                self._fail("slipped")
                return None
        if ph.name == "carry_up":
            if ph.steps == 1:
                hang = float(eef[2]) - (float(obj[2]) - self._bottom)
                self._hang = hang
                self._travel = self._travel_z(eef[:2], self._stage, hang, exclude=(self.body,))
            if eef[2] >= self._travel - 0.02 or ph.steps > 25:
                self._goto("carry")
                return None
            return step_toward(env, np.array([eef[0], eef[1], self._travel]), self.rot, 1.0)
        if ph.name == "carry":
            goal = self._origin_goal_eef(self._stage, 0.0)
            goal[2] = self._travel
            if (self._arrived(goal, 0.012) and self._yaw_ok()) or ph.steps > 80:
                self._goto("stage")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "stage":  # down in front of the opening
            goal = self._origin_goal_eef(self._stage, self._z_in)
            if self._arrived(goal, 0.008) or ph.steps > 40 or (ph.steps > 4 and self._stalled(0.001)):
                self._goto("slide")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "slide":  # in, level
            goal = self._origin_goal_eef(self._goal, self._z_in)
            if self._arrived(goal, 0.008) or ph.steps > 40 or (ph.steps > 4 and self._stalled(0.001)):
                self._goto("lower")
                return None
            return step_toward(env, goal, self.rot, 1.0, max_step=0.04)
        if ph.name == "lower":
            goal = self._origin_goal_eef(self._goal, op.floor + self._bottom + 0.002)
            if self._arrived(goal, 0.004) or ph.steps > 15 or (ph.steps > 3 and self._stalled(0.001)):
                self._goto("release")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "release":
            if ph.steps > 6 and finger_gap(env) > 0.05 or ph.steps > 15:
                self._goto("back")
                self._back_goal = eef - np.append(op.inward, 0.0) * 0.08
                return None
            return step_toward(env, eef, self.rot, -1.0)
        if ph.name == "back":  # out of the opening before rising
            if self._arrived(self._back_goal, 0.015) or ph.steps > 20:
                self._goto("retreat")
                self._retreat_goal = eef + np.array([0.0, 0.0, 0.08])
                return None
            return step_toward(env, self._back_goal, self.rot, -1.0)
        raise RuntimeError(f"unknown phase {ph.name!r}")


# ------------------------------------------------------------------------------ clearing a drawer's way

CLEAR_REACH = 0.62  # m: farthest spot (horizontally from the robot's base) an object is moved to; at 0.75 the
# arm is stretched to its elbow's stop and the wrist cannot turn to the next grasp (measured)
CLEAR_LOW = 0.025  # m: objects lower than this may be partly under a relocated object
CLEAR_GAP = 0.03  # m: a relocated object ends this far out of an opened drawer's footprint (the hand's room)


def opened_box(env: LiberoEnv, region: str) -> tuple[np.ndarray, np.ndarray] | None:
    """World box (lo, hi) the drawer behind the region site ``region`` occupies once opened (its body's box
    moved along its slide joint to the articulated skill's ``open`` target); None when the region has no
    single slide joint (a door, a basket) or the articulated skills are absent."""
    try:
        from sim.libero.articulated import find_joint, goal_target
    except ImportError:
        return None
    try:
        info = find_joint(env, region)
        if info.kind != "slide":
            return None
        q_open = goal_target(info, "open")
    except ConfigError:
        return None
    data = env.sim.data
    q = float(data.qpos[info.qpos_addr])
    lo_r, hi_r = (float(v) for v in info.fixture_range)
    shift = np.array(data.xaxis[info.joint_id]) * (float(np.clip(q_open, lo_r, hi_r)) - q)
    lo, hi = body_box(env, info.body_id)
    return lo + shift, hi + shift


def under_opened_drawer(env: LiberoEnv, obj: str, region: str) -> bool:
    """Whether ``obj`` lies (partly) under where the drawer of ``region`` will be once open, so that no
    top-down grasp reaches it then: their footprints overlap, grown by ``CLEAR_GAP``, with the object's
    top below the drawer's bottom."""
    box = opened_box(env, region)
    if box is None or obj not in env.libero_env.objects_dict:
        return False
    lo, hi = body_box(env, _object_body(env, obj))
    dlo, dhi = box
    overlap = np.all(lo[:2] < dhi[:2] + CLEAR_GAP) and np.all(hi[:2] > dlo[:2] - CLEAR_GAP)
    return bool(overlap and hi[2] < dlo[2])


def clear_goal(env: LiberoEnv, obj: str, region: str) -> np.ndarray:
    """Where (2-d, the object's origin) to move ``obj`` so it is out of the opened drawer's way: the spot
    of a 2 cm grid within 16 cm whose footprint (grown by 5 mm) is clear of the opened drawer's footprint
    (grown by ``CLEAR_GAP``) and of the other objects taller than ``CLEAR_LOW`` (overlapping a lower one,
    a cream cheese box, costs a little: farther spots cost more steps than a tilted bowl), that minimises the distance moved plus half the
    distance on to the opened drawer's region (the carry that follows), within ``CLEAR_REACH`` of the robot."""
    import mujoco

    dlo, dhi = opened_box(env, region)
    body = _object_body(env, obj)
    lo, hi = body_box(env, body)
    origin = np.array(env.sim.data.xpos[body][:2])
    site = mujoco.mj_name2id(mj_model(env), mujoco.mjtObj.mjOBJ_SITE, region)
    closed_lo, _ = body_box(env, find_joint_body(env, region))
    target = np.array(env.sim.data.site_xpos[site][:2]) + (dlo[:2] - closed_lo[:2])
    half = (hi[:2] - lo[:2]) / 2 + 0.005
    offset = (lo[:2] + hi[:2]) / 2 - origin
    boxes = [(blo[:2], bhi[:2], 1e4 if bhi[2] > lo[2] + CLEAR_LOW else 30.0)
             for blo, bhi in _obstacle_boxes(env, (body,)) if bhi[2] > lo[2] + 0.005]
    boxes.append((dlo[:2] - CLEAR_GAP, dhi[:2] + CLEAR_GAP, 1e4))
    g = np.arange(-0.16, 0.16 + 1e-9, 0.02)
    pts = origin + np.stack(np.meshgrid(g, g), axis=-1).reshape(-1, 2)
    c = pts + offset
    hit = np.zeros(len(pts))
    for blo, bhi, weight in boxes:
        hit += weight * np.prod(np.clip(np.minimum(c + half, bhi) - np.maximum(c - half, blo), 0.0, None), axis=1)
    base = np.asarray(env._robot.base_pos)[:2]
    reach = np.linalg.norm(pts - base, axis=1)
    cost = np.linalg.norm(pts - origin, axis=1) + 0.5 * np.linalg.norm(pts - target, axis=1)
    cost += hit + 1e2 * np.maximum(reach - CLEAR_REACH, 0.0) + 1e2 * np.maximum(0.35 - reach, 0.0)
    return pts[int(np.argmin(cost))]


def find_joint_body(env: LiberoEnv, region: str) -> int:
    """The moving body (a drawer) of the region site's articulated joint."""
    from sim.libero.articulated import find_joint

    return find_joint(env, region).body_id


class Relocate(PickPlace):
    """Skill for the solver's ``('clear', obj, drawer_region)``: carry ``obj`` to :func:`clear_goal` (out
    of where the drawer will be once open) with :class:`PickPlace`'s grasp, transport and release."""

    def __init__(self, env: LiberoEnv, predicate: list[str] | tuple[str, ...], max_attempts: int = MAX_ATTEMPTS):
        pred = tuple(str(p).lower() for p in predicate)
        if len(pred) != 3 or pred[0] != "clear" or pred[1] not in env.libero_env.objects_dict:
            raise ConfigError(f"Relocate takes ('clear', object, drawer region), got {list(predicate)}")
        self.env = env
        self.predicate = pred
        self.outcome = None
        self.attempts = 0
        self.max_attempts = int(max_attempts)
        self.failures = []
        self.steps = 0
        self.body = _object_body(env, pred[1])
        self._target_name = pred[2]
        self._target_body = None
        self._site = None
        self._goal = clear_goal(env, pred[1], pred[2])
        self._new_attempt()

    def _target_xy(self) -> np.ndarray:
        return self._goal.copy()


PUSH_DEPTH = 0.025  # m: the pushing fingers' grip site above the pushed object's bottom (fingertips ~1.3 cm up)
PUSH_TIP = 0.013  # m: the closed fingertips below the grip site
PUSH_GAP = 0.02  # m between the closed fingers and the object's outline before the push starts
PUSH_OVERSHOOT = 0.03  # m the hand may be driven past the point that puts the object on its goal


class Push:
    """Skill for ``('clear', obj, drawer_region)``: push ``obj`` along the table to :func:`clear_goal` with the
    closed fingers against its side, in one straight stroke.

    A pick-and-place move of a bowl costs about 90 of libero_goal 3's 300 steps (turning to a rim grasp,
    closing, lifting, lowering, opening); a push needs no turn and no grip (libero_goal 3: 2 of 50 solved with
    the carry, 45 of 50 with the push). Refused (``blocked``) when something taller than the fingertips stands
    in the stroke's way, or the hand's way down or its end pose hits anything but the object; the solver then
    moves the object with :class:`Relocate`. Fails (``stuck``, ``blocked``) when the object tilts or is left
    under the drawer, or the hand stalls on its way down."""

    def __init__(self, env: LiberoEnv, predicate: list[str] | tuple[str, ...]):
        pred = tuple(str(p).lower() for p in predicate)
        if len(pred) != 3 or pred[0] != "clear" or pred[1] not in env.libero_env.objects_dict:
            raise ConfigError(f"Push takes ('clear', object, drawer region), got {list(predicate)}")
        self.env, self.predicate = env, pred
        self.outcome: str | None = None
        self.failures: list[str] = []
        self.steps = 0
        self.body = _object_body(env, pred[1])
        obj = np.array(env.sim.data.xpos[self.body])
        lo, hi = body_box(env, self.body)
        goal = clear_goal(env, pred[1], pred[2])
        d = goal - obj[:2]
        self._dist = float(np.linalg.norm(d))
        self._u = d / max(self._dist, 1e-9)
        centre = (lo[:2] + hi[:2]) / 2
        reach = float(np.linalg.norm(hi[:2] - lo[:2])) / 2  # the box's half-diagonal: outside it whatever the way
        self._z = float(lo[2]) + PUSH_DEPTH
        self._start = centre - self._u * (reach + PUSH_GAP + 0.012)
        self._end = self._start + self._u * (self._dist + PUSH_GAP + PUSH_OVERSHOOT)
        along = float(np.arctan2(self._u[1], self._u[0]))
        self._yaws = [reachable_yaw(env, along + d) for d in np.radians([0, 30, -30, 60, -60, 90])]
        self._top = float(hi[2])
        # the hand's column at the start and the stroke (the fingers' 2 cm plus 1.5 cm) must be free down to the
        # fingertips (PUSH_TIP under the grip site); they may pass over a low object (a plate) by pushing higher
        near = [(blo, bhi) for blo, bhi in _obstacle_boxes(env, (self.body,))
                if bhi[2] > lo[2] + 0.005 and _segment_box_distance(self._start, self._end, blo[:2], bhi[:2]) < 0.035]
        self._z = max([self._z] + [float(bhi[2]) + PUSH_TIP + 0.005 for _, bhi in near])
        if self._z > hi[2] - 0.012:
            self.outcome = "blocked"
            return
        # the hand's yaw: the fingers one behind the other along the stroke (the hand's 22 cm run along it), that
        # turned by 30 or 60 degrees, or side by side: the first whose hand is free of everything but the object at
        # the start (and the column above it that the hand comes down through) and at the end; none: refused.
        # No margin: the samples' 22 cm hand is already wider than the Panda's (a drawer handle 1 cm past its end)
        obbs = _geom_obbs(env, (self.body,))
        start, end = np.append(self._start, self._z), np.append(self._end, self._z)
        free = [y for y in self._yaws
                if not hand_collisions(env, start, y, (self.body,), obbs, margin=0.0, sweep=APPROACH_SWEEP)
                and not hand_collisions(env, end, y, (self.body,), obbs, margin=0.0)]
        if not free:
            self.outcome = "blocked"
            return
        self._yaw = free[0]
        self.rot = topdown_rotation(self._yaw)
        eef = env.eef_pose()[0]
        tops = [float(bhi[2]) for blo, bhi in _obstacle_boxes(env, (self.body,))
                if _segment_box_distance(eef[:2], self._start, blo[:2], bhi[:2]) < 0.05]
        self._travel = max(tops + [self._top]) + CLEARANCE
        self.phase = _Phase("over")

    def act(self) -> np.ndarray | None:
        if self.outcome is not None:
            return None
        self.steps += 1
        for _ in range(4):
            action = self._phase_action()
            if action is not None or self.outcome is not None:
                return action
        return step_toward(self.env, self.env.eef_pose()[0], self.rot, 1.0)

    def _fail(self, kind: str) -> None:
        self.failures.append(kind)
        self.outcome = kind

    def _stalled(self, eef: np.ndarray) -> bool:
        last, self._last = getattr(self, "_last", None), eef
        return last is not None and float(np.linalg.norm(eef - last)) < 0.001

    def _phase_action(self) -> np.ndarray | None:
        env, ph = self.env, self.phase
        ph.steps += 1
        eef = env.eef_pose()[0]
        if ph.name == "over":  # at travel height (or higher) over the start, closing the fingers
            goal = np.array([self._start[0], self._start[1], max(self._travel, min(eef[2], self._travel + 0.1))])
            if float(np.linalg.norm(eef[:2] - self._start)) < 0.015 or ph.steps > 60:
                self.phase = _Phase("descend")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "descend":
            goal = np.array([self._start[0], self._start[1], self._z])
            if float(np.linalg.norm(eef - goal)) < 0.008:
                self.phase = _Phase("push")
                return None
            if ph.steps > 40 or (ph.steps > 5 and self._stalled(eef)):
                self._fail("blocked")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        if ph.name == "push":
            obj_up = np.array(env.sim.data.xmat[self.body]).reshape(3, 3)[2, 2]
            if abs(obj_up) < SLIDE_MAX_TILT:
                self._fail("stuck")
                return None
            goal = np.array([self._end[0], self._end[1], self._z])
            if predicate_holds(env, self.predicate) and float(np.dot(eef[:2] - self._start, self._u)) > 0.02:
                self.phase = _Phase("retreat")
                return None
            if float(np.linalg.norm(eef[:2] - self._end)) < 0.008 or ph.steps > 40:
                self.phase = _Phase("retreat")
                return None
            return step_toward(env, goal, self.rot, 1.0, max_step=0.03)
        if ph.name == "retreat":  # back off the object and up past its top
            goal = np.array([eef[0], eef[1], self._top + 0.03]) - np.append(self._u, 0.0) * 0.01
            if eef[2] > self._top + 0.01 or ph.steps > 15:
                if predicate_holds(env, self.predicate):
                    self.outcome = "done"
                else:
                    self._fail("stuck")
                return None
            return step_toward(env, goal, self.rot, 1.0)
        raise RuntimeError(f"unknown phase {ph.name!r}")


# ------------------------------------------------------------------------------------------- solver


def _articulated_skills() -> dict[str, type]:
    try:
        from sim.libero.articulated import ARTICULATED_SKILLS
    except ImportError:
        return {}
    return dict(ARTICULATED_SKILLS)


class _Unsupported:
    """Stand-in skill for a predicate nobody implements: fails at once."""

    def __init__(self, env: LiberoEnv, predicate):
        self.outcome = "unsupported"

    def act(self) -> np.ndarray | None:
        return None


@dataclass
class _SubGoal:
    predicate: tuple[str, ...]
    outcome: str | None = None
    runs: int = 0
    redos: int = 0
    failures: list[str] = field(default_factory=list)
    steps: int = 0


class LiberoSolver:
    """Task-solving privileged expert for any ``LiberoEnv`` (``sim.api.Policy``).

    Args:
        env: the (unwrapped) LIBERO env whose sim state the solver reads.
        noise: Gaussian sigma (action units) added to the six arm dims of every action.
        seed: default seed for ``reset`` when none is given (noise only).

    ``reset`` must be called on the state the episode starts from (after any settle steps); after the
    episode, :meth:`episode_stats` gives the sub-goal outcomes and the failure cause.
    """

    def __init__(self, env: LiberoEnv, noise: float = 0.0, seed: int | None = None):
        if noise < 0:
            raise ConfigError(f"noise must be >= 0, got {noise}")
        self.env = env
        self.noise = float(noise)
        self._default_seed = seed
        self.rng = np.random.default_rng(seed)
        self.subgoals: list[_SubGoal] | None = None
        self.skills = {"on": place_skill, "in": place_skill, "clear": (Push, Relocate), **_articulated_skills()}

    def reset(self, seed: int | None = None) -> None:
        """Start an episode on the env's current (just reset, settled) state."""
        self.rng = np.random.default_rng(self._default_seed if seed is None else seed)
        goals = self._with_prerequisites(order_subgoals(parse_goal(self.env.libero_env.parsed_problem)))
        self.subgoals = [_SubGoal(g) for g in goals]
        self._current: int | None = None
        self._skill: Skill | None = None
        self.steps = 0

    def act(self, obs: dict[str, Any] | None = None, info: dict[str, Any] | None = None) -> np.ndarray:
        """Action (7,) float32 in [-1, 1] for the current sim state."""
        if self.subgoals is None:
            raise RuntimeError("call reset() before act()")
        self.steps += 1
        action = None
        for _ in range(2 * len(self.subgoals) + 4):
            if self._skill is None and not self._start_next():
                break
            action = self._skill.act()
            if action is not None:
                self.subgoals[self._current].steps += 1
                break
            self._finish_skill()
        if action is None:  # everything done (or given up): stay still, gripper open
            action = np.zeros(7, np.float32)
            action[6] = -1.0
        action = np.asarray(action, dtype=np.float32).copy()
        if self.noise > 0:
            action[:6] += self.rng.normal(0.0, self.noise, 6).astype(np.float32)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def episode_stats(self) -> dict[str, Any]:
        """``subgoals`` (predicate, outcome, runs, failures, steps each), ``solved`` (every predicate holds
        now) and ``failure`` (the first unfinished sub-goal's failure kind, None when solved)."""
        if self.subgoals is None:
            raise RuntimeError("call reset() first")
        subs = []
        for i, s in enumerate(self.subgoals):
            outcome = s.outcome
            holds = predicate_holds(self.env, s.predicate)
            if outcome is None and holds:
                outcome = "done"
            if outcome is None:
                outcome = "timeout" if (i == self._current or s.runs) else "not_reached"
            subs.append({"predicate": " ".join(s.predicate), "outcome": outcome, "runs": s.runs,
                         "failures": list(s.failures), "steps": s.steps,
                         "holds": holds})
        solved = all(s["holds"] for s in subs)
        failure = None
        if not solved:
            first = next(s for s in subs if not s["holds"])
            failure = first["outcome"] if first["outcome"] != "done" else "undone"
        return {"subgoals": subs, "solved": solved, "failure": failure}

    # ------------------------------------------------------------------------------------ internals

    def _with_prerequisites(self, goals: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """Insert ``('open', region)`` before a placement into a region of an articulated fixture (a
        drawer) that is shut now: libero_goal's "open the top drawer and put the bowl inside" has only the
        ``In`` predicate. Before that opening, whether the goal names it or not, ``('clear', obj, region)`` when
        the object would lie under the opened drawer (libero_90 8 names both; the bowl left under the drawer took
        the hand 300 of the 400 steps to reach and carry out, and 6 of 10 episodes ran out)."""
        sites = getattr(self.env.libero_env, "object_sites_dict", {})
        out = list(goals)
        for g in goals:
            if g[0] not in PLACE_PREDICATES or g[2] not in sites or not self._hinged(sites[g[2]]):
                continue
            opener = ("open", g[2])
            if predicate_holds(self.env, opener):
                continue
            if opener not in out:
                out.insert(out.index(g), opener)
            clear = ("clear", g[1], g[2])
            if clear not in out and not predicate_holds(self.env, clear):
                out.insert(out.index(opener), clear)  # the object would be under the opened drawer: out first
        return out

    def _hinged(self, site) -> bool:
        """Whether a region site moves with one-dof joints (a drawer's slide, a door's hinge); a basket's
        region follows its free joint, which is no thing to open."""
        joints = getattr(site, "joints", None) or []
        model = self.env.sim.model
        try:
            return bool(joints) and all(np.ndim(model.get_joint_qpos_addr(j)) == 0 for j in joints)
        except (ValueError, KeyError):
            return False

    def _start_next(self) -> bool:
        """Build the skill for the next sub-goal to work on; False when none is left."""
        for i, s in enumerate(self.subgoals):
            if s.outcome == "done":
                if predicate_holds(self.env, s.predicate) or s.redos >= MAX_REDOS:
                    continue
                s.redos += 1  # came undone: redo it
                s.outcome, s.runs = None, 0
            if s.outcome is not None:  # given up
                continue
            if predicate_holds(self.env, s.predicate) and s.runs == 0:
                s.outcome = "done"  # already true (e.g. a drawer that starts closed)
                continue
            if s.runs >= MAX_SKILL_RUNS:
                s.outcome = s.failures[-1] if s.failures else "timeout"
                continue
            s.runs += 1
            cls = self.skills.get(s.predicate[0], _Unsupported)
            if isinstance(cls, tuple):  # one skill a run: the first, then the next after it failed
                cls = cls[min(s.runs, len(cls)) - 1]
            self._skill = cls(self.env, list(s.predicate))
            self._current = i
            return True
        self._current = None
        return False

    def _finish_skill(self) -> None:
        s = self.subgoals[self._current]
        outcome = self._skill.outcome or "timeout"
        if outcome == "done":
            s.outcome = "done"
        else:
            s.failures.append(outcome)
            if outcome == "unsupported":
                s.outcome = "unsupported"
        self._skill = None


# -------------------------------------------------------------------------------------- measurement


def run_episode(env: LiberoEnv, init_state_id: int, max_steps: int | None = None, settle_steps: int = 10,
                noise: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """One evaluation-protocol episode: reset to ``init_state_id``, ``settle_steps`` no-op steps (gripper
    open), then the solver until success or the suite's step limit (counting the settle steps)."""
    from sim.libero.suites import MAX_EPISODE_STEPS

    limit = MAX_EPISODE_STEPS[env.task.suite] if max_steps is None else int(max_steps)
    obs, info = env.reset(seed=seed, options={"init_state_id": int(init_state_id)})
    idle = np.array([0.0] * 6 + [-1.0], dtype=np.float32)
    success, steps = False, 0
    for _ in range(settle_steps):
        obs, _, term, _, info = env.step(idle)
        steps += 1
    solver = LiberoSolver(env, noise=noise, seed=seed)
    solver.reset()
    while steps < limit:
        obs, _, term, trunc, info = env.step(solver.act(obs, info))
        steps += 1
        if info.get("success"):
            success = True
            break
        if term or trunc:
            break
    stats = solver.episode_stats()
    stats.update(success=success, steps=steps, init_state_id=int(init_state_id))
    if not success and stats["failure"] is None:
        stats["failure"] = "undone"
    return stats


def main(argv: list[str] | None = None) -> None:
    """``python -m sim.libero.solver --suite S --tasks 0 1 --init-states N``: success per task, failure kinds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--tasks", type=int, nargs="*", default=None, help="task indices (default: all)")
    parser.add_argument("--init-states", type=int, default=10, help="init states 0..N-1 per task")
    parser.add_argument("--first-init-state", type=int, default=0)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    from collections import Counter

    from sim.libero.suites import list_tasks

    tasks = args.tasks if args.tasks is not None else [t.index for t in list_tasks(args.suite)]
    total, wins, causes = 0, 0, Counter()
    for ti in tasks:
        env = LiberoEnv(args.suite, ti, images=False)
        ok = 0
        ids = range(args.first_init_state, args.first_init_state + args.init_states)
        for k in ids:
            st = run_episode(env, k, noise=args.noise, seed=k)
            ok += st["success"]
            if not st["success"]:
                causes[st["failure"]] += 1
            if args.verbose or not st["success"]:
                subs = "; ".join(f"{s['predicate']}={s['outcome']}{s['failures']}" for s in st["subgoals"])
                print(f"  {args.suite}/{ti} init {k}: success={st['success']} steps={st['steps']} {subs}", flush=True)
        env.close()
        total += len(ids)
        wins += ok
        print(f"{args.suite}/{ti}: {ok}/{len(ids)}  {env.task.language}", flush=True)
    print(f"{args.suite}: {wins}/{total} = {100.0 * wins / max(total, 1):.1f} %  failures: {dict(causes)}", flush=True)


if __name__ == "__main__":
    main()
