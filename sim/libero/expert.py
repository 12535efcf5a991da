"""Scripted reach-and-grasp policy for LIBERO scenes, for recording interaction data.

It does not solve LIBERO tasks (no placing, no articulated objects); it produces purposeful arm
motion with contacts and grasps, which is what world-model training data needs. Using privileged
sim state, each episode it:

1. picks a target: the first movable object among the BDDL's objects of interest (else the first
   object-of-interest site, else fixture, which it only reaches for);
2. computes a grasp point from the target's collision geoms (world-frame box): the box centre, 1.5 cm
   below its top (capped at half its height); for objects wider than the open gripper (bowls, plates)
   the point moves onto the rim along the fingers' closing axis, so the fingers straddle the wall;
3. runs four phases with a proportional controller on the grip-site position (world frame, converted to
   the controller's base frame) and holds the initial gripper orientation:
   approach 8 cm above the grasp point (open) -> descend (open) -> close (12 steps) -> lift 12 cm.

Noise (``noise`` = sigma): Gaussian on the six arm action dims every step, and a per-episode grasp-point
offset of ``noise`` x 1 cm in x and y (clipped to 2 cm).

Measured (noise 0.1, few episodes, so indicative only): libero_spatial/0 (black bowl) reached within
3 cm in 2 / 2 episodes but grasped in 0 / 1 (the rim grasp misses: the fingers close on nothing);
libero_object/0 (alphabet soup can) reached and grasped (lifted 4.3 cm) in 1 / 1. The tests check
reach >= 1 / 2 on libero_spatial/0 and (slow) grasp >= 1 / 2 on libero_object/0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.libero.env import LiberoEnv, _axis_angle_from_matrix

APPROACH_HEIGHT = 0.08  # m above the grasp point
LIFT_HEIGHT = 0.12  # m above the grasp point
GRASP_DEPTH = 0.015  # m below the target's top
GRIPPER_HALF_OPENING = 0.035  # m: objects wider than this (half extent) are grasped by the rim
CLOSE_STEPS = 12
REACH_TOLERANCE = 0.03  # m: "reached" = grip site within this of the grasp point
GRASP_LIFT = 0.03  # m: "grasped" = target lifted at least this much


class LiberoReachGraspExpert:
    """Reach-and-grasp policy for any ``LiberoEnv`` (``sim.api.Policy``).

    Args:
        env: the (unwrapped) LIBERO env whose sim state the policy reads.
        noise: action noise sigma (action units, i.e. x0.05 m / x0.5 rad), also scales the grasp offset.
        seed: default seed for ``reset`` when none is given.

    Attributes after ``reset``: ``target`` (name), ``grasp_point`` (3,) world metres, ``phase`` (str),
    and per-episode ``min_distance`` (m) / ``max_lift`` (m) used by :meth:`episode_stats`.
    """

    PHASES = ("approach", "descend", "close", "lift")

    def __init__(self, env: LiberoEnv, noise: float = 0.0, seed: int | None = None):
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        self.env = env
        self.noise = float(noise)
        self._default_seed = seed
        self.rng = np.random.default_rng(seed)
        self.target: str | None = None

    # ----------------------------------------------------------------------------------- Policy

    def reset(self, seed: int | None = None) -> None:
        """Start an episode on the env's current (just reset) state."""
        self.rng = np.random.default_rng(self._default_seed if seed is None else seed)
        rs = self.env.libero_env
        self.target, self._target_body, lo, hi = self._choose_target(rs)
        self._movable = self.target in rs.objects_dict
        center, half = (lo + hi) / 2, (hi - lo) / 2
        point = np.array([center[0], center[1], hi[2] - min(GRASP_DEPTH, half[2])])
        if self._movable and max(half[0], half[1]) > GRIPPER_HALF_OPENING:
            axis = self._closing_axis()
            radius = float(abs(axis[0]) * half[0] + abs(axis[1]) * half[1])
            eef = self.env.eef_pose()[0]
            side = 1.0 if np.dot(eef[:2] - center[:2], axis[:2]) >= 0 else -1.0
            point[:2] += side * axis[:2] * max(radius - 0.005, 0.0)
        offset = np.clip(self.rng.normal(0.0, 0.01 * self.noise, 2), -0.02, 0.02)
        point[:2] += offset
        self.grasp_point = point
        self._initial_rot = self.env.eef_pose()[1]
        self._initial_target_z = self._target_z()
        self.phase = "approach"
        self._phase_steps = 0
        self.min_distance = float(np.linalg.norm(self.env.eef_pose()[0] - point))
        self.max_lift = 0.0

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """Action (7,) float32 in [-1, 1] for the current sim state."""
        if self.target is None:
            raise RuntimeError("call reset() before act()")
        eef, rot = self.env.eef_pose()
        dist = float(np.linalg.norm(eef - self.grasp_point))
        self.min_distance = min(self.min_distance, dist)
        self.max_lift = max(self.max_lift, self._target_z() - self._initial_target_z)
        self._advance_phase(eef)
        goal = {
            "approach": self.grasp_point + [0.0, 0.0, APPROACH_HEIGHT],
            "descend": self.grasp_point,
            "close": self.grasp_point,
            "lift": self.grasp_point + [0.0, 0.0, LIFT_HEIGHT],
        }[self.phase]
        ctrl = self.env._arm_controller
        scale = np.asarray(ctrl.output_max, dtype=np.float64)
        base_rot = np.asarray(self.env._robot.base_ori).reshape(3, 3)  # base frame -> world
        d_pos = base_rot.T @ (goal - eef)
        d_rot = base_rot.T @ _axis_angle_from_matrix(self._initial_rot @ rot.T)
        action = np.zeros(7)
        action[:3] = d_pos / scale[:3]
        action[3:6] = 0.5 * d_rot / scale[3:6]
        if self.noise > 0:
            action[:6] += self.rng.normal(0.0, self.noise, 6)
        action[6] = 1.0 if self.phase in ("close", "lift") else -1.0
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    # --------------------------------------------------------------------------------- metrics

    def episode_stats(self) -> dict[str, float | bool | str]:
        """``reached`` (min grip-site distance to the grasp point < 3 cm), ``grasped`` (movable target
        lifted >= 3 cm), with the raw ``min_distance`` / ``max_lift`` in metres."""
        return {
            "target": str(self.target),
            "min_distance": self.min_distance,
            "max_lift": self.max_lift,
            "reached": self.min_distance < REACH_TOLERANCE,
            "grasped": bool(self._movable and self.max_lift >= GRASP_LIFT),
        }

    # ------------------------------------------------------------------------------- internals

    def _advance_phase(self, eef: np.ndarray) -> None:
        self._phase_steps += 1
        if self.phase == "approach":
            above = self.grasp_point + [0.0, 0.0, APPROACH_HEIGHT]
            if np.linalg.norm(eef - above) < 0.015 or self._phase_steps > 80:
                self.phase, self._phase_steps = "descend", 0
        elif self.phase == "descend":
            if np.linalg.norm(eef - self.grasp_point) < 0.01 or self._phase_steps > 40:
                self.phase, self._phase_steps = ("close" if self._movable else "lift"), 0
        elif self.phase == "close" and self._phase_steps > CLOSE_STEPS:
            self.phase, self._phase_steps = "lift", 0

    def _choose_target(self, rs) -> tuple[str, int | None, np.ndarray, np.ndarray]:
        """Target name, its root body id (or None for a site) and its world box (lo, hi), metres."""
        interest = list(rs.obj_of_interest)
        model = self.env.sim.model._model if hasattr(self.env.sim.model, "_model") else self.env.sim.model
        for pool in (rs.objects_dict, rs.fixtures_dict):
            for name in interest:
                if name in pool:
                    body = rs.sim.model.body_name2id(pool[name].root_body)
                    lo, hi = self._body_box(model, body)
                    return name, body, lo, hi
        import mujoco

        for name in interest:
            site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, name)
            if site >= 0:
                pos = np.array(self.env.sim.data.site_xpos[site])
                return name, None, pos - 0.01, pos + 0.01
        # No usable object of interest: reach for the first movable object.
        name, obj = next(iter(rs.objects_dict.items()))
        body = rs.sim.model.body_name2id(obj.root_body)
        return (name, body, *self._body_box(model, body))

    def _body_box(self, model, body: int) -> tuple[np.ndarray, np.ndarray]:
        """World-frame axis-aligned box (lo, hi) of the collision geoms under ``body``'s subtree."""
        data = self.env.sim.data
        geoms = [g for g in range(model.ngeom) if self._in_subtree(model, int(model.geom_bodyid[g]), body)]
        solid = [g for g in geoms if model.geom_contype[g] or model.geom_conaffinity[g]]
        geoms = solid or geoms
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

    @staticmethod
    def _in_subtree(model, body: int, root: int) -> bool:
        while body > 0:
            if body == root:
                return True
            body = int(model.body_parentid[body])
        return root == 0

    def _closing_axis(self) -> np.ndarray:
        """Unit vector (3,) in the world frame between the two finger pads (the closing direction)."""
        model = self.env.sim.model
        data = self.env.sim.data
        names = [model.body_id2name(i) or "" for i in range(model.nbody)]
        fingers = [next((i for i, n in enumerate(names) if n.startswith("gripper0") and n.endswith(side)), None)
                   for side in ("leftfinger", "rightfinger")]
        if None not in fingers:
            d = np.array(data.body_xpos[fingers[0]]) - np.array(data.body_xpos[fingers[1]])
            d[2] = 0.0
            if np.linalg.norm(d) > 1e-6:
                return d / np.linalg.norm(d)
        y = self.env.eef_pose()[1][:, 1].copy()  # grip site's y axis, projected on the table
        y[2] = 0.0
        return y / max(np.linalg.norm(y), 1e-9)

    def _target_z(self) -> float:
        if self._target_body is None:
            return 0.0
        return float(self.env.sim.data.body_xpos[self._target_body][2])
