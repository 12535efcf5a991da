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

from sim.libero.env import LiberoEnv
from sim.libero.motion import body_box, closing_axis, mj_model, move_action

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
            axis = closing_axis(self.env)
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
        eef = self.env.eef_pose()[0]
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
        noise = self.rng.normal(0.0, self.noise, 6) if self.noise > 0 else None
        return move_action(self.env, goal, self._initial_rot, 1.0 if self.phase in ("close", "lift") else -1.0,
                           noise=noise)

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
        model = mj_model(self.env)
        for pool in (rs.objects_dict, rs.fixtures_dict):
            for name in interest:
                if name in pool:
                    body = rs.sim.model.body_name2id(pool[name].root_body)
                    lo, hi = body_box(self.env, body)
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
        return (name, body, *body_box(self.env, body))

    def _target_z(self) -> float:
        if self._target_body is None:
            return 0.0
        return float(self.env.sim.data.body_xpos[self._target_body][2])
