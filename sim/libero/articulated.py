"""Articulated skills for the privileged LIBERO expert: open / close drawers and microwave doors, turn stove knobs.

Each BDDL goal predicate ``open`` / ``close`` / ``turnon`` / ``turnoff`` names either a region site of an
articulated fixture (``wooden_cabinet_1_top_region`` -> the top drawer's slide joint ``..._top_level``) or
the fixture itself (``microwave_1`` -> ``microwave_1_microjoint``, ``flat_stove_1`` -> ``flat_stove_1_button``).
:func:`find_joint` resolves it the way LIBERO's object states do (the site's / fixture's ``joints``) and reads
the joint's kind, axis and the handle from the sim; the goal check is LIBERO's own ``_eval_predicate`` of the
parsed goal, so "done" means exactly what ``_check_success`` counts.

All three skills share one plan (:class:`JointSkill`): take hold of the moving part, then drive the joint by
moving the gripper with the part's kinematics -- the hand's pose is stored in the moving body's frame and the
gripper goal is that pose on the body displaced by the next joint increment (a translation along the slide
axis for drawers, a rotation about the hinge for doors and knobs) -- release, back off along the approach
axis. The hand first turns to the grasp orientation above the pre-grasp point (clear of open drawers and
doors), of the two grasps that differ by half a turn about the approach axis the one that keeps the wrist's
roll joint inside its range (re-chosen when that joint hits its stop). Contacts, read from the handle geoms:

* open a drawer (slide joint): hook the bar on the drawer front -- the hand points into the cabinet, the pads
  reach behind the bar and the fingers close vertically (rolled toward horizontal when the palm would hit
  the table, i.e. bottom drawers); when a movable object stands where the hand and wrist would be, the hand
  comes in pitched down (wrist higher) or turned about the vertical;
* close a drawer: push the bar's front with closed fingers, the hand pitched back 30 degrees from vertical
  so that the palm clears the drawer fronts and handles above;
* doors (hinge joint, microwave): closing pushes the door's outer face with closed fingers, the hand vertical
  and the fingertips just below the door's top edge so that the palm passes over door and cabinet; opening
  a shut door hooks its vertical bar (horizontal approach, fingers closing around it) and pulls it 0.45 rad
  ajar, then pushes the rest of the way from the inside (the pulled arc leaves the arm's reach);
* knobs (``turnon`` / ``turnoff``, flat stove): grasp the knob's ridge from above, fingers closing across it,
  grip centred on the hinge axis; the knob is turned by turning the wrist.

LIBERO's thresholds (``libero/envs/objects/articulated_objects.py``): cabinets open when the slide qpos is
< -0.14 (range -0.16 .. 0.01) and closed when > 0.0; the microwave open when the hinge is < -1.3 rad (range
-2.094 .. 0) and closed when > -0.005; the stove on when the knob is >= 0.5 rad and off when < 0.0 (range
-0.005 .. 2.1). The joint is driven to a target inside the goal interval (past the joint limit when the
interval ends there), so "closed" and "off" press the part against its stop.

Skills follow ``Skill(env, predicate)``; ``act()`` returns the next 7-d action or None once ``outcome`` is set
("done", or a failure kind: "missed" (the joint never moved after grasping), "slipped" (lost the handle
more often than the retries allow), "timeout", "unreachable" (could not get to the pre-grasp pose),
"unsupported" (no joint / handle for the predicate)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from core.errors import ConfigError
from sim.libero.env import LiberoEnv
from sim.libero.motion import body_box, mj_model, move_action

TABLE_CLEARANCE = 0.015  # m between the palm's lowest point and the table
PALM_HALF_SPAN = 0.105  # m: the Panda hand's half width along the fingers' closing axis
STANDOFF = 0.10  # m: pre-grasp distance in front of the handle along the approach axis
MAX_LEAD_SLIDE = 0.02  # m of joint travel commanded ahead of the current position per step
MAX_LEAD_HINGE = 0.12  # rad, the same for hinges
SLIP_DISTANCE = 0.04  # m: grip site this far from its grasp pose on the moving part = handle lost
MAX_RETRIES = 2
HOOK_POSES = tuple((np.deg2rad(y), np.deg2rad(p)) for y, p in
                   ((0, 0), (0, 25), (0, 40), (20, 25), (-20, 25), (35, 0), (-35, 0)))  # (yaw, pitch down) of hooks
PALM_OFFSET = 0.09  # m from the grip site back to the palm's centre
HAND_LENGTH = 0.25  # m behind the grip site that the hand and wrist occupy
HAND_CLEARANCE = 0.06  # m wanted between that segment and any movable object
HOOK_UNTIL = 0.45  # rad: a shut door is pulled open this far by its handle, then pushed from the inside
PUSH_RADIUS_CLOSE = 0.65  # push point on the door, fraction of its length from the hinge (clear of the handle)
PUSH_RADIUS_OPEN = 0.85
DOOR_PUSH_DEPTH = 0.03  # m: fingertips this far below the door's top edge when pushing it
WRIST_MARGIN = 0.5  # rad the hand's roll joint should stay inside its range after turning to the grasp
PUSH_PITCH = np.deg2rad(30.0)  # hand tilt back from vertical when pushing a drawer shut
FINGER_HALF_WIDTH = 0.014  # m: half the closed fingers' width across the closing axis
MAX_STEPS = 380


@dataclass
class JointInfo:
    """The joint a predicate refers to, with LIBERO's fixture object that judges it."""

    name: str
    joint_id: int
    qpos_addr: int
    kind: str  # "slide" or "hinge"
    body_id: int  # the moving body (drawer, door, knob)
    fixture: object  # LIBERO ArticulatedObject (WoodenCabinet, Microwave, FlatStove, ...)
    fixture_name: str
    fixture_range: np.ndarray  # (2,) the joint's range in the model


def find_joint(env: LiberoEnv, object_name: str) -> JointInfo:
    """The articulated joint behind a goal predicate's argument (a region site or a fixture), as LIBERO reads it.

    Raises ConfigError when the name is unknown or does not have exactly one slide / hinge joint.
    """
    rs = env.libero_env
    if object_name in rs.object_sites_dict:
        site = rs.object_sites_dict[object_name]
        joints, parent = list(site.joints or []), site.parent_name
    elif object_name in rs.fixtures_dict or object_name in rs.objects_dict:
        joints, parent = list(rs.get_object(object_name).joints or []), object_name
    else:
        raise ConfigError(f"{object_name!r} is neither a region site nor an object of this LIBERO task")
    model = rs.sim.model
    found = []
    for j in joints:
        jid = model.joint_name2id(j)
        jtype = int(model.jnt_type[jid])
        if jtype in (2, 3):  # mjJNT_SLIDE, mjJNT_HINGE
            found.append((j, jid, "slide" if jtype == 2 else "hinge"))
    if len(found) != 1:
        raise ConfigError(f"{object_name!r} has {len(found)} slide / hinge joints ({joints}); expected one")
    name, jid, kind = found[0]
    return JointInfo(name=name, joint_id=jid, qpos_addr=int(model.get_joint_qpos_addr(name)), kind=kind,
                     body_id=int(model.jnt_bodyid[jid]), fixture=rs.get_object(parent), fixture_name=parent,
                     fixture_range=np.array(mj_model(env).jnt_range[jid], dtype=np.float64))


def goal_target(info: JointInfo, predicate: str) -> float:
    """Joint value to drive to so that LIBERO's ``predicate`` holds, from the fixture's own check.

    Scans the joint range with the fixture's ``is_open`` / ``is_close`` / ``turn_on`` / ``turn_off`` (the
    functions LIBERO's predicates call) and aims 60 % into the satisfying interval from its threshold; when
    the interval ends at a joint limit, the target is just past that limit (the joint is pushed to its stop).
    """
    lo, hi = (float(v) for v in info.fixture_range)
    check = {"open": "is_open", "close": "is_close", "turnon": "turn_on", "turnoff": "turn_off"}[predicate]
    fn = getattr(info.fixture, check)
    qs = np.linspace(lo, hi, 2001)
    props = info.fixture.object_properties
    vis = dict(props.get("vis_site_names", {}))  # FlatStove.turn_on / turn_off also set the burner's display flag
    try:
        ok = np.array([bool(fn(q)) for q in qs])
    finally:
        props["vis_site_names"] = vis
    if not ok.any():
        raise ConfigError(f"no value of joint {info.name} in [{lo}, {hi}] satisfies {predicate!r}")
    sat = qs[ok]
    a, b = float(sat.min()), float(sat.max())
    span = hi - lo
    if b >= hi - 1e-9 and a > lo + 1e-9:  # interval [threshold, upper limit]
        return hi + 0.05 * span if (b - a) < 0.2 * span else a + 0.6 * (b - a)
    if a <= lo + 1e-9 and b < hi - 1e-9:  # interval [lower limit, threshold]
        return lo - 0.05 * span if (b - a) < 0.2 * span else b - 0.6 * (b - a)
    return 0.5 * (a + b)


def _rotation(approach: np.ndarray, closing: np.ndarray) -> np.ndarray:
    """Grip-site rotation (world) whose z axis is ``approach`` and x axis (the fingers' closing axis) ``closing``."""
    z = approach / np.linalg.norm(approach)
    x = closing - np.dot(closing, z) * z
    x /= np.linalg.norm(x)
    return np.column_stack([x, np.cross(z, x), z])


def _rot_angle(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(Rotation.from_matrix(a @ b.T).as_rotvec()))


def _geom_boxes(env: LiberoEnv, body: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(geom id, world centre, world half extents) of the collision geoms of ``body`` itself."""
    model, data = mj_model(env), env.sim.data
    out = []
    for g in range(model.ngeom):
        if int(model.geom_bodyid[g]) != body or not (model.geom_contype[g] or model.geom_conaffinity[g]):
            continue
        rot = np.array(data.geom_xmat[g]).reshape(3, 3)
        out.append((g, np.array(data.geom_xpos[g]) + rot @ model.geom_aabb[g, :3], np.abs(rot) @ model.geom_aabb[g, 3:]))
    return out


class JointSkill:
    """Grasp a moving part by its handle and drive its joint until LIBERO's predicate holds (see module doc)."""

    def __init__(self, env: LiberoEnv, predicate: list[str]):
        if len(predicate) != 2:
            raise ConfigError(f"articulated predicate takes one argument, got {predicate}")
        self.env = env
        self.rs = env.libero_env
        self.predicate = [str(predicate[0]).lower(), str(predicate[1])]
        self.outcome: str | None = None
        self.steps = 0
        self.retries = 0
        self.phase = "start"
        self._phase_steps = 0
        self._hold_steps = 0
        self._regrasp = False
        self._stage_target: float | None = None
        try:
            self.joint = find_joint(env, self.predicate[1])
            self.q_target = goal_target(self.joint, self.predicate[0])
        except (ConfigError, NotImplementedError, AttributeError):  # no joint, or a fixture without this check
            self.outcome = "unsupported"
            return
        if self.holds():
            self.outcome = "done"

    # ------------------------------------------------------------------------------------ state

    def q(self) -> float:
        return float(self.env.sim.data.qpos[self.joint.qpos_addr])

    def holds(self) -> bool:
        """LIBERO's own evaluation of the goal predicate."""
        return bool(self.rs._eval_predicate(self.predicate))

    def _body_pose(self) -> tuple[np.ndarray, np.ndarray]:
        data = self.env.sim.data
        b = self.joint.body_id
        return np.array(data.xpos[b]), np.array(data.xmat[b]).reshape(3, 3)

    def _axis(self) -> tuple[np.ndarray, np.ndarray]:
        data = self.env.sim.data
        j = self.joint.joint_id
        return np.array(data.xanchor[j]), np.array(data.xaxis[j])

    def _moved_pose(self, pos: np.ndarray, rot: np.ndarray, dq: float) -> tuple[np.ndarray, np.ndarray]:
        """A world pose rigidly attached to the moving body, after the joint moves by ``dq``."""
        anchor, axis = self._axis()
        if self.joint.kind == "slide":
            return pos + axis * dq, rot
        r = Rotation.from_rotvec(axis * dq).as_matrix()
        return anchor + r @ (pos - anchor), r @ rot

    # ------------------------------------------------------------------------------------ grasp

    def grasp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """World grip-site position and rotation at the grasp (subclasses)."""
        raise NotImplementedError

    def _closest_flip(self, rot: np.ndarray) -> np.ndarray:
        """``rot`` or the same grasp turned half a turn about the approach axis: the one that keeps the wrist's
        last joint (which turns the hand about its approach axis) farther inside its range, else the nearer one."""
        cur = self.env.eef_pose()[1]
        flipped = rot @ np.diag([-1.0, -1.0, 1.0])
        q7, (lo, hi) = self._wrist_joint()
        _, axis = self._axis()
        target = self.q_target if self._stage_target is None else self._stage_target
        scores = []
        for cand in (rot, flipped):
            qv = Rotation.from_matrix(cand @ cur.T).as_quat()  # (x, y, z, w), world frame
            twist = 2.0 * np.arctan2(float(np.dot(qv[:3], cur[:, 2])), float(qv[3]))
            twist = (twist + np.pi) % (2 * np.pi) - np.pi
            pred = q7 + twist
            if self.joint.kind == "hinge":  # the hand turns with the part while driving it
                drive = (target - self.q()) * float(np.dot(axis, cand[:, 2]))
                pred = pred + drive if abs(pred + drive - 0.5 * (lo + hi)) > abs(pred - 0.5 * (lo + hi)) else pred
            margin = min(pred - lo, hi - pred)
            scores.append((margin < WRIST_MARGIN, _rot_angle(cand, cur)))
        return rot if scores[0] <= scores[1] else flipped

    def _wrist_stuck(self, rot: np.ndarray) -> bool:
        q7, (lo, hi) = self._wrist_joint()
        return min(q7 - lo, hi - q7) < 0.05 and _rot_angle(self.grasp_rot, rot) > 0.1

    def _wrist_joint(self) -> tuple[float, tuple[float, float]]:
        robot = self.rs.robots[0]
        name = robot.robot_joints[-1]
        model = self.env.sim.model
        jid = model.joint_name2id(name)
        return float(self.env.sim.data.qpos[model.get_joint_qpos_addr(name)]), tuple(float(v) for v in model.jnt_range[jid])

    # ------------------------------------------------------------------------------------- loop

    def act(self) -> np.ndarray | None:
        if self.outcome is not None:
            return None
        self.steps += 1
        self._phase_steps += 1
        if self.steps > MAX_STEPS:
            self.outcome = "timeout"
            return None
        eef, rot = self.env.eef_pose()
        if self.phase == "start":
            self._plan_grasp()
        if self.phase == "via":
            # Turn the hand above the pre-grasp point, at least as high as it started, clear of open drawers / doors.
            goal = self.grasp_pos - self.grasp_rot[:, 2] * STANDOFF
            goal[2] = max(goal[2], self._start_z)
            if np.linalg.norm(goal - eef) < 0.03 and _rot_angle(self.grasp_rot, rot) < 0.15:
                self._set_phase("pregrasp")
            elif self._wrist_stuck(rot) and not self._flipped:
                # The hand's roll joint hit its stop: take the same grasp turned half a turn about the approach.
                self.grasp_rot = self.grasp_rot @ np.diag([-1.0, -1.0, 1.0])
                self._flipped = True
                self._phase_steps = 1
                return move_action(self.env, goal, self.grasp_rot, -1.0, rot_gain=0.8)
            elif self._phase_steps > 80:
                self.outcome = "unreachable"
                return None
            else:
                return move_action(self.env, goal, self.grasp_rot, -1.0, rot_gain=0.8)
        if self.phase == "pregrasp":
            goal = self.grasp_pos - self.grasp_rot[:, 2] * STANDOFF
            err = np.linalg.norm(goal - eef)
            if err < 0.012 and _rot_angle(self.grasp_rot, rot) < 0.08:
                self._set_phase("insert")
            elif self._phase_steps > 60:
                self.outcome = "unreachable"
                return None
            else:
                return move_action(self.env, goal, self.grasp_rot, -1.0, rot_gain=0.8)
        if self.phase == "insert":
            if np.linalg.norm(self.grasp_pos - eef) < 0.008 or self._phase_steps > 40:
                self._set_phase("grip")
            else:
                return move_action(self.env, self.grasp_pos, self.grasp_rot, -1.0, rot_gain=0.8)
        if self.phase == "grip":
            if self._phase_steps > 10:
                body_pos, body_rot = self._body_pose()
                self._rel_pos = body_rot.T @ (eef - body_pos)
                self._rel_rot = body_rot.T @ rot
                self._q_grip = self.q()
                self._q_best = self._q_grip
                self._stall = 0
                self._set_phase("drive")
            else:
                return move_action(self.env, self.grasp_pos, self.grasp_rot, 1.0, rot_gain=0.8)
        if self.phase == "drive":
            return self._drive(eef)
        if self.phase == "release":
            if self._phase_steps > 8:
                self._retreat_goal = eef - rot[:, 2] * 0.10
                self._set_phase("retreat")
            else:
                return move_action(self.env, eef, None, -1.0)
        if self.phase == "retreat":
            if np.linalg.norm(self._retreat_goal - eef) < 0.015 or self._phase_steps > 25:
                if self.holds():
                    self.outcome = "done"
                    return None
                if not self._regrasp:
                    self.outcome = "slipped"  # it held when released, not after
                    return None
                self._regrasp = False
                self._plan_grasp()
                return self.act()
            return move_action(self.env, self._retreat_goal, None, -1.0)
        raise AssertionError(self.phase)

    def _set_phase(self, phase: str) -> None:
        self.phase, self._phase_steps = phase, 0

    def _plan_grasp(self) -> None:
        pos, rot = self.grasp_pose()
        self.grasp_pos, self.grasp_rot = pos, self._closest_flip(rot)
        self._start_z = float(self.env.eef_pose()[0][2])
        self._flipped = False
        self._set_phase("via")
        self._phase_steps = 1

    def _drive(self, eef: np.ndarray) -> np.ndarray | None:
        body_pos, body_rot = self._body_pose()
        attached_pos = body_pos + body_rot @ self._rel_pos
        q = self.q()
        if self.holds():
            self._hold_steps += 1
            if self._hold_steps >= 3:
                self._set_phase("release")
                return move_action(self.env, eef, None, -1.0)
        else:
            self._hold_steps = 0
        if np.linalg.norm(attached_pos - eef) > SLIP_DISTANCE:
            return self._retry("slipped")
        target = self.q_target if self._stage_target is None else self._stage_target
        if self.joint.kind == "hinge":
            # Turning with the part drives the hand's roll joint; at its stop, grasp again the other way round.
            q7, (lo7, hi7) = self._wrist_joint()
            _, axis = self._axis()
            roll = (target - q) * float(np.dot(axis, self.env.eef_pose()[1][:, 2]))
            if (roll > 0 and hi7 - q7 < 0.03) or (roll < 0 and q7 - lo7 < 0.03):
                return self._retry("unreachable")
        sign = 1.0 if target >= self._q_grip else -1.0
        if self._stage_target is not None and sign * (q - self._stage_target) >= 0:
            self._stage_target = None  # first stage reached: let go and grasp again for the rest
            self._regrasp = True
            self._set_phase("release")
            return move_action(self.env, eef, None, -1.0)
        progress = sign * (q - self._q_best)
        if progress > 1e-3:
            self._q_best, self._stall = q, 0
        else:
            self._stall += 1
        if self._stall > 40:
            moved = abs(q - self._q_grip) > 0.01 * (1 if self.joint.kind == "slide" else 5)
            return self._retry("slipped" if moved else "missed")
        lead = MAX_LEAD_SLIDE if self.joint.kind == "slide" else MAX_LEAD_HINGE
        dq = float(np.clip(target - q, -lead, lead))
        goal_pos, goal_rot = self._moved_pose(attached_pos, body_rot @ self._rel_rot, dq)
        return move_action(self.env, goal_pos, goal_rot, 1.0, rot_gain=0.8)

    def _retry(self, kind: str) -> np.ndarray | None:
        if self.retries >= MAX_RETRIES:
            self.outcome = kind
            return None
        self.retries += 1
        self._regrasp = True  # open, back off, then plan a new grasp from the current state
        self._set_phase("release")
        return move_action(self.env, self.env.eef_pose()[0], None, -1.0)


class DrawerOrDoorSkill(JointSkill):
    """``open`` / ``close``: a drawer (slide joint) or a hinged door (microwave) pulled or pushed by its handle."""

    def grasp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        boxes = _geom_boxes(self.env, self.joint.body_id)
        if not boxes:
            raise ConfigError(f"joint {self.joint.name} moves a body without collision geoms")
        if self.joint.kind == "slide":
            return self._drawer_grasp(boxes)
        return self._door_grasp(boxes)

    def _drawer_grasp(self, boxes) -> tuple[np.ndarray, np.ndarray]:
        _, axis = self._axis()
        open_sign = -1.0 if self.joint.fixture.is_open(float(self.joint.fixture_range[0])) else 1.0
        out = axis * open_sign  # the drawer front's outward normal (the pull direction)
        out[2] = 0.0
        out /= np.linalg.norm(out)
        # The handle bar: the geom farthest out along the pull direction.
        _, center, half = max(boxes, key=lambda b: float(np.dot(b[1], out)))
        approach = -out
        along = np.cross(np.array([0.0, 0.0, 1.0]), out)  # the bar's long axis, horizontal
        depth = float(np.dot(half, np.abs(out)))  # the bar's half depth
        if self.predicate[0] == "close":
            # Push the bar's front with closed fingers, the hand pitched back so the palm clears the fronts above.
            approach = np.array([0.0, 0.0, -np.cos(PUSH_PITCH)]) - out * np.sin(PUSH_PITCH)
            pos = center + out * (depth + FINGER_HALF_WIDTH)
            return pos, _rotation(approach, along)
        # Straight at the front, level, unless an object stands where the hand and wrist would be: then the hand
        # comes in pitched down (wrist higher) and / or turned about the vertical, the first pose that clears it.
        # Fingers close vertically unless the palm (half span PALM_HALF_SPAN along the closing axis) would reach
        # the table; then the closing axis is rolled toward the bar's length.
        table_z = self._table_top()
        up = np.array([0.0, 0.0, 1.0])
        best = None
        for yaw, pitch in HOOK_POSES:
            a = Rotation.from_rotvec(up * yaw).apply(-out * np.cos(pitch) - up * np.sin(pitch))
            grip = center + a * (depth + 0.004)  # pads reach behind the bar
            clear = self._clearance(grip, -a)
            if best is None or clear > best[2] + 1e-9 or clear >= HAND_CLEARANCE:
                best = (a, grip, clear, pitch)
            if clear >= HAND_CLEARANCE:
                break
        approach, pos, _, pitch = best
        side = np.cross(approach, up)
        side /= np.linalg.norm(side)
        lift = np.cross(side, approach)  # perpendicular to the approach, upward
        room = pos[2] + PALM_OFFSET * np.sin(pitch) - table_z - TABLE_CLEARANCE
        cos_b = float(np.clip(room / (PALM_HALF_SPAN * max(lift[2], 1e-6)), 0.0, 1.0))
        closing = lift * cos_b + side * np.sqrt(1.0 - cos_b**2)
        return pos, _rotation(approach, closing)

    def _clearance(self, grip: np.ndarray, back: np.ndarray) -> float:
        """Smallest distance (m) from the hand's axis -- from the grip site back HAND_LENGTH along ``back`` --
        to any movable object's box, in 3-D; inf when the task has no movable objects."""

        rs = self.rs
        best = np.inf
        seg = [grip + back * t for t in np.linspace(0.04, HAND_LENGTH, 12)]
        for obj in rs.objects_dict.values():
            lo, hi = body_box(self.env, rs.sim.model.body_name2id(obj.root_body))
            for p in seg:
                d = np.maximum(np.maximum(lo - p, p - hi), 0.0)
                best = min(best, float(np.linalg.norm(d)))
        return best

    def _door_grasp(self, boxes) -> tuple[np.ndarray, np.ndarray]:
        model, data = mj_model(self.env), self.env.sim.data
        anchor, axis = self._axis()
        # The door panel: the largest box geom, in its own frame (centre, axes, half sizes).
        panel = max((b for b in boxes if int(model.geom_type[b[0]]) == 6), key=lambda b: float(np.prod(b[2])), default=None)
        if panel is None:
            raise ConfigError(f"joint {self.joint.name} moves no box-shaped door panel")
        g = panel[0]
        pc, axes, size = np.array(data.geom_xpos[g]), np.array(data.geom_xmat[g]).reshape(3, 3), model.geom_size[g]
        k = int(np.argmin(size))
        normal = axes[:, k].copy()
        # The handle: the geom farthest from the panel's plane; its side is the door's outer side.
        far = max(boxes, key=lambda b: abs(float(np.dot(b[1] - pc, normal))))
        if float(np.dot(far[1] - pc, normal)) < 0:
            normal = -normal
        lo, hi = (float(v) for v in self.joint.fixture_range)
        closed_end = hi if self.joint.fixture.is_close(hi) else lo
        open_sign = -1.0 if closed_end == hi else 1.0
        if self.predicate[0] == "open" and abs(self.q() - closed_end) < HOOK_UNTIL:
            # Nearly shut: hook the bar and pull the door ajar; the rest is pushed from the inside.
            self._stage_target = closed_end + open_sign * HOOK_UNTIL
            dist = float(np.dot(far[1] - pc, normal))
            bars = [b for b in boxes if float(np.dot(b[1] - pc, normal)) > dist - 0.012]
            _, center, half = max(bars, key=lambda b: float(b[2][2]))
            approach = -normal
            approach[2] = 0.0
            approach /= np.linalg.norm(approach)
            closing = np.cross(np.array([0.0, 0.0, 1.0]), approach)
            depth = float(np.dot(half, np.abs(approach)))
            return center + approach * (depth + 0.002), _rotation(approach, closing)
        # Push the panel with closed fingers, hand vertical, fingertips just below the door's top edge so that
        # the palm passes over the door and the cabinet: on the outer face to close, the inner face to open.
        radial = pc - anchor
        radial -= np.dot(radial, axis) * axis
        reach = float(np.linalg.norm(radial)) + float(np.abs(np.dot(axes.T @ (radial / np.linalg.norm(radial)), size)).max())
        radial /= np.linalg.norm(radial)
        r = reach * (PUSH_RADIUS_CLOSE if self.predicate[0] == "close" else PUSH_RADIUS_OPEN)
        side = normal if self.predicate[0] == "close" else -normal
        top = pc[2] + float(np.abs(axes[2]) @ size)
        pos = anchor + radial * r + side * (size[k] + FINGER_HALF_WIDTH + 0.004)
        pos[2] = top - DOOR_PUSH_DEPTH
        along = radial.copy()
        along[2] = 0.0
        return pos, _rotation(np.array([0.0, 0.0, -1.0]), along)

    def _table_top(self) -> float:
        model = mj_model(self.env)
        import mujoco

        g = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "table_collision")
        if g < 0:
            return -np.inf
        data = self.env.sim.data
        rot = np.array(data.geom_xmat[g]).reshape(3, 3)
        return float(data.geom_xpos[g][2] + (np.abs(rot) @ model.geom_size[g])[2])


class KnobSkill(DrawerOrDoorSkill):
    """``turnon`` / ``turnoff``: grasp the stove knob's ridge from above and turn the wrist about its axis."""

    def grasp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        boxes = _geom_boxes(self.env, self.joint.body_id)
        if not boxes or self.joint.kind != "hinge":
            raise ConfigError(f"{self.joint.name} is not a knob hinge with geoms")
        anchor, axis = self._axis()
        # The ridge: the tallest geom; its long horizontal axis from the geom's own frame (the world box of a
        # knob turned by ~45 degrees is square).
        g, center, half = max(boxes, key=lambda b: float(b[1][2] + b[2][2]))
        model, data = mj_model(self.env), self.env.sim.data
        axes, size = np.array(data.geom_xmat[g]).reshape(3, 3), model.geom_size[g]
        horizontal = [i for i in range(3) if abs(axes[2, i]) < 0.5]
        long_axis = axes[:, max(horizontal, key=lambda i: size[i])].copy() if horizontal else np.array([1.0, 0, 0])
        long_axis[2] = 0.0
        long_axis /= np.linalg.norm(long_axis)
        closing = np.cross(np.array([0.0, 0.0, 1.0]), long_axis)
        top = center[2] + half[2]
        pos = np.array([anchor[0], anchor[1], top - min(0.02, half[2])])
        return pos, _rotation(np.array([0.0, 0.0, -1.0]), closing)


ARTICULATED_SKILLS: dict[str, type] = {
    "open": DrawerOrDoorSkill,
    "close": DrawerOrDoorSkill,
    "turnon": KnobSkill,
    "turnoff": KnobSkill,
}
"""BDDL predicate name (lower-case, as ``parsed_problem["goal_state"]`` has it) -> skill class."""


ARTICULATED_ONLY_TASKS: tuple[str, ...] = (
    "libero_goal/0", "libero_goal/7",
    "libero_90/0", "libero_90/6", "libero_90/7", "libero_90/11", "libero_90/20", "libero_90/22", "libero_90/23",
    "libero_90/28", "libero_90/33", "libero_90/35", "libero_90/39", "libero_90/44",
)
"""The tasks of libero_goal / libero_10 / libero_90 whose BDDL goals are all articulated predicates
(libero_10 has none: its articulated goals come with an ``On`` / ``In``)."""


def run_episode(env: LiberoEnv, init_state: int, settle_steps: int = 10) -> dict:
    """One episode in the benchmark's protocol with the skills alone (the goals in BDDL order): reset to
    ``init_state`` (seeded with it), ``settle_steps`` no-op steps, then the skills until success or the suite's
    step limit. Returns ``success`` (LIBERO's goal check), ``steps`` and each skill's ``outcomes``."""
    from sim.libero.suites import MAX_EPISODE_STEPS

    env.reset(seed=init_state, options={"init_state_id": init_state})
    settle = np.array([0.0] * 6 + [-1.0], dtype=np.float32)
    for _ in range(settle_steps):
        env.step(settle)
    limit = MAX_EPISODE_STEPS[env.task.suite]
    steps, success, outcomes = 0, False, []
    for predicate in env.libero_env.parsed_problem["goal_state"]:
        skill = ARTICULATED_SKILLS[str(predicate[0]).lower()](env, predicate)
        while steps < limit and not success:
            action = skill.act()
            if action is None:
                break
            _, _, _, _, info = env.step(action)
            steps += 1
            success = bool(info["success"])
        outcomes.append(skill.outcome or ("limit" if not success else None))
        if success or steps >= limit:
            break
    return {"success": success, "steps": steps, "outcomes": outcomes}


def main(argv: list[str] | None = None) -> None:
    """``python -m sim.libero.articulated [--tasks suite/i,...] [--init-states N]``: per-task success table."""
    import argparse
    import collections

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--tasks", default=",".join(ARTICULATED_ONLY_TASKS))
    parser.add_argument("--init-states", type=int, default=5)
    args = parser.parse_args(argv)
    total = [0, 0]
    for spec in args.tasks.split(","):
        suite, _, index = spec.partition("/")
        env = LiberoEnv(suite, int(index), images=False)
        wins, kinds = 0, collections.Counter()
        for k in range(min(args.init_states, env.num_init_states)):
            ep = run_episode(env, k)
            wins += ep["success"]
            if not ep["success"]:
                kinds[next((o for o in ep["outcomes"] if o != "done"), "limit")] += 1
        env.close()
        n = min(args.init_states, env.num_init_states)
        total[0] += wins
        total[1] += n
        print(f"{spec:14s} {env.task.language:60s} {wins:3d} / {n}  failures: {dict(kinds)}", flush=True)
    print(f"total {total[0]} / {total[1]}", flush=True)


if __name__ == "__main__":
    main()
