"""Motion and geometry helpers for scripted LIBERO policies that read the privileged sim state.

Shared by the reach-and-grasp data script (``sim.libero.expert``) and the task-solving expert:

* :func:`move_action` turns a world-frame goal for the grip site (and an orientation to hold) into the
  env's 7-d ``OSC_POSE`` delta action, so skills are written as "go there" instead of in action units;
* :func:`body_box` / :func:`in_subtree` give an object's world-frame axis-aligned box from its collision
  geoms, the basis of grasp and place poses;
* :func:`closing_axis` is the direction between the finger pads, along which the gripper closes.
"""

from __future__ import annotations

import numpy as np

from sim.libero.env import LiberoEnv, _axis_angle_from_matrix


def mj_model(env: LiberoEnv):
    """MuJoCo's raw ``MjModel`` of the env (robosuite wraps it)."""
    model = env.sim.model
    return model._model if hasattr(model, "_model") else model


def move_action(env: LiberoEnv, goal: np.ndarray, hold_rot: np.ndarray | None = None, gripper: float = -1.0,
                rot_gain: float = 0.5, noise: np.ndarray | None = None) -> np.ndarray:
    """Action (7,) float32 in [-1, 1] that moves the grip site toward ``goal`` (world metres).

    A proportional step: the full position error in action units (clipped to the controller's 5 cm per
    step), ``rot_gain`` times the rotation error toward ``hold_rot`` (world rotation matrix; None keeps
    the current orientation), gripper command ``gripper`` (-1 open, +1 close); ``noise`` (6,) is added
    to the arm dims before clipping.
    """
    eef, rot = env.eef_pose()
    ctrl = env._arm_controller
    scale = np.asarray(ctrl.output_max, dtype=np.float64)
    base_rot = np.asarray(env._robot.base_ori).reshape(3, 3)  # base frame -> world
    action = np.zeros(7)
    action[:3] = (base_rot.T @ (np.asarray(goal, dtype=np.float64) - eef)) / scale[:3]
    if hold_rot is not None:
        action[3:6] = rot_gain * (base_rot.T @ _axis_angle_from_matrix(hold_rot @ rot.T)) / scale[3:6]
    action[6] = gripper
    if noise is not None:
        action[:6] += noise
    return np.clip(action, -1.0, 1.0).astype(np.float32)


def in_subtree(model, body: int, root: int) -> bool:
    """Whether ``body`` is ``root`` or one of its descendants (root 0, the world, holds every body)."""
    while body > 0:
        if body == root:
            return True
        body = int(model.body_parentid[body])
    return root == 0


def body_box(env: LiberoEnv, body: int, solid_only: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """World-frame axis-aligned box (lo, hi) of the geoms under ``body``'s subtree, metres.

    Collision geoms only when ``solid_only`` and there are any (visual meshes overhang them); a 4 cm
    cube around the body's origin when it has no geoms.
    """
    model, data = mj_model(env), env.sim.data
    geoms = [g for g in range(model.ngeom) if in_subtree(model, int(model.geom_bodyid[g]), body)]
    solid = [g for g in geoms if model.geom_contype[g] or model.geom_conaffinity[g]]
    geoms = (solid or geoms) if solid_only else geoms
    if not geoms:
        pos = np.array(data.body_xpos[body])
        return pos - 0.02, pos + 0.02
    los, his = [], []
    for g in geoms:
        rot = np.array(data.geom_xmat[g]).reshape(3, 3)
        center = np.array(data.geom_xpos[g]) + rot @ model.geom_aabb[g, :3]
        half = np.abs(rot) @ model.geom_aabb[g, 3:]
        los.append(center - half)
        his.append(center + half)
    return np.min(los, axis=0), np.max(his, axis=0)


def closing_axis(env: LiberoEnv) -> np.ndarray:
    """Unit vector (3,) in the world frame between the two finger pads, projected on the table."""
    model, data = env.sim.model, env.sim.data
    names = [model.body_id2name(i) or "" for i in range(model.nbody)]
    fingers = [next((i for i, n in enumerate(names) if n.startswith("gripper0") and n.endswith(side)), None)
               for side in ("leftfinger", "rightfinger")]
    if None not in fingers:
        d = np.array(data.body_xpos[fingers[0]]) - np.array(data.body_xpos[fingers[1]])
        d[2] = 0.0
        if np.linalg.norm(d) > 1e-6:
            return d / np.linalg.norm(d)
    y = env.eef_pose()[1][:, 1].copy()  # grip site's y axis, projected on the table
    y[2] = 0.0
    return y / max(np.linalg.norm(y), 1e-9)


# ------------------------------------------------------------------------------ task-solving helpers
# Used by the task-solving expert (``sim.libero.solver``): a top-down gripper orientation with a yaw,
# a speed-limited step toward a goal, an object's oriented box in its own frame, finger and contact reads.

GRIPPER_MAX_GAP = 0.079  # m: inner distance between the finger pads when fully open (finger joints at 0.04)


def topdown_rotation(yaw: float) -> np.ndarray:
    """World rotation (3, 3) of the grip site pointing straight down with its closing axis (the site's x
    axis, from finger to finger) at angle ``yaw`` (radians) in the table plane."""
    x = np.array([np.cos(yaw), np.sin(yaw), 0.0])
    z = np.array([0.0, 0.0, -1.0])
    return np.stack([x, np.cross(z, x), z], axis=1)


def gripper_yaw(env: LiberoEnv) -> float:
    """Angle (radians) in the table plane of the grip site's x axis, the axis :func:`topdown_rotation` sets
    (it runs between the fingers, up to sign)."""
    x = env.eef_pose()[1][:, 0]
    return float(np.arctan2(x[1], x[0]))


def nearest_equivalent_yaw(yaw: float, current: float) -> float:
    """``yaw`` or ``yaw + pi`` (a parallel gripper is symmetric), whichever is nearer ``current``,
    wrapped to within pi of it."""
    best = None
    for cand in (yaw, yaw + np.pi):
        d = (cand - current + np.pi) % (2 * np.pi) - np.pi
        if best is None or abs(d) < abs(best):
            best = d
    return float(current + best)


WRIST_LIMIT = 2.6  # rad: keep the Panda's last joint (range +-2.9) inside this


def reachable_yaw(env: LiberoEnv, yaw: float) -> float:
    """The equivalent of ``yaw`` (mod pi) nearest the current gripper yaw that the wrist can turn to.

    With the hand pointing down, the grip site's yaw is ``c - q7`` (q7: the last arm joint), so a yaw is
    reachable when ``c - yaw`` stays inside +-``WRIST_LIMIT``; a target picked only by the smallest turn
    can drive the wrist into its stop (measured: the hand then stalls short of its goal)."""
    current = gripper_yaw(env)
    q7 = float(env.sim.data.qpos[env._robot._ref_joint_pos_indexes[-1]])
    c = current + q7
    cands = [current + ((yaw - current + np.pi / 2) % np.pi - np.pi / 2) + k * np.pi for k in range(-3, 4)]
    ok = [y for y in cands if abs(c - y) <= WRIST_LIMIT] or cands
    return float(min(ok, key=lambda y: abs(y - current)))


def step_toward(env: LiberoEnv, goal: np.ndarray, rot: np.ndarray | None, gripper: float,
                max_step: float = 0.08, gain: float = 1.0, rot_gain: float = 0.5) -> np.ndarray:
    """Like :func:`move_action` with the commanded displacement ``gain`` x the position error, capped at
    ``max_step`` metres. Measured on the Panda's OSC (LIBERO's gains): a saturated command moves the hand
    about 1.2 cm per step, and gain 1 reaches a goal 10 cm away in about 12 steps with ~1 mm overshoot
    (gain 2: 5 mm), so gain 1 needs no slow-down near the goal. ``rot_gain`` as in :func:`move_action`."""
    eef = env.eef_pose()[0]
    err = gain * (np.asarray(goal, dtype=np.float64) - eef)
    dist = float(np.linalg.norm(err))
    if dist > max_step:
        err *= max_step / dist
    return move_action(env, eef + err, rot, gripper, rot_gain=rot_gain)


def body_frame_box(env: LiberoEnv, body: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Oriented box of ``body``'s collision geoms: world centre (3,), axes (3, 3) (columns: the body's
    x, y, z in the world) and half extents (3,) along them, metres."""
    model, data = mj_model(env), env.sim.data
    geoms = [g for g in range(model.ngeom) if in_subtree(model, int(model.geom_bodyid[g]), body)]
    solid = [g for g in geoms if model.geom_contype[g] or model.geom_conaffinity[g]] or geoms
    rb = np.array(data.xmat[body]).reshape(3, 3)
    pb = np.array(data.xpos[body])
    if not solid:
        return pb, rb, np.full(3, 0.02)
    signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=np.float64)
    pts = []
    for g in solid:
        rg = np.array(data.geom_xmat[g]).reshape(3, 3)
        corners = model.geom_aabb[g, :3] + signs * model.geom_aabb[g, 3:]
        world = np.array(data.geom_xpos[g]) + corners @ rg.T
        pts.append((world - pb) @ rb)
    pts = np.concatenate(pts)
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    return pb + rb @ ((lo + hi) / 2), rb, (hi - lo) / 2


def finger_gap(env: LiberoEnv) -> float:
    """Sum of the two finger joint positions, metres (about 0.08 open, under 0.002 closed on nothing)."""
    index = getattr(env._robot, "_ref_gripper_joint_pos_indexes", None)
    if isinstance(index, dict) and index:
        q = env.sim.data.qpos
        return float(sum(abs(q[i]) for i in next(iter(index.values()))))
    proprio = env._obs["proprio"]
    return float(abs(proprio[6]) + abs(proprio[7]))


def bodies_in_contact(env: LiberoEnv, body_a: int, body_b: int | None = None) -> bool:
    """Whether any geom under ``body_a``'s subtree touches one under ``body_b``'s (any other body when None)."""
    model, data = mj_model(env), env.sim.data
    for i in range(data.ncon):
        c = data.contact[i]
        b1, b2 = int(model.geom_bodyid[c.geom1]), int(model.geom_bodyid[c.geom2])
        for x, y in ((b1, b2), (b2, b1)):
            if in_subtree(model, x, body_a) and not in_subtree(model, y, body_a):
                if body_b is None or in_subtree(model, y, body_b):
                    return True
    return False
