"""Scripted experts for the manipulation suite (privileged state, one script for every embodiment).

The expert plans in end-effector space (a displacement per step in the world frame, a rotation that
holds the episode's initial orientation, and a grip command) and lets the env translate that into its
own action space (``ManipulationEnv.compose_action``: OSC deltas, or damped least-squares joint deltas
for joint-space control; every finger of a hand gets the grip command). Gaussian noise of std
``noise`` is added to the normalised action, then clipped to [-1, 1].

Lift is a small state machine: hover 8 cm above the cube, descend, close for a few steps, raise; if the
cube is not following the hand when raised, it opens and starts over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sim.manipulation.env import OSC_POS_SCALE, rotation_to_axis_angle

if TYPE_CHECKING:
    from sim.manipulation.env import ManipulationEnv

HOVER = 0.08  # m above the cube centre before descending
GRASP_STEPS = (6, 30)  # min / max control steps spent closing; done early once the fingers stop
GAIN = 2.0  # proportional gain on the position error (OSC tracking lags under gravity and contact)
LIFT_HEIGHT = 0.15  # m above the table for the raise phase
# Per-embodiment grasp height (m, end-effector site relative to the cube centre); hands grasp higher
# because the grip site sits between the finger bases rather than at the fingertips.
GRASP_Z = {"Panda+InspireHand": 0.035}


class ScriptedExpert:
    """Noisy scripted expert following ``sim.api.Policy``.

    Args:
        env: The unwrapped ``ManipulationEnv`` it acts in (read-only access to its state).
        noise: Std of the Gaussian noise added to each normalised action dim.
        seed: Seed of the noise (``reset(seed)`` overrides it per episode).
    """

    def __init__(self, env: ManipulationEnv, noise: float = 0.05, seed: int | None = None):
        if noise < 0:
            raise ValueError(f"noise: must be >= 0, got {noise}")
        self.env = env
        self.noise = float(noise)
        self._rng = np.random.default_rng(seed)
        self._phase = "hover"
        self._timer = 0
        self._last_hand = np.zeros(0)

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode (phase machine back to the start); ``seed`` reseeds the noise."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._phase = "hover"
        self._timer = 0
        self._last_hand = np.zeros(0)

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """Return the next action, shape ``(action_dim,)`` float32 in [-1, 1]."""
        env = self.env
        pos, rot = env.eef_pose()
        if env.task == "reach":
            goal, grip = env.reach_target(), -1.0
        else:
            goal, grip = self._lift_goal(pos)
        dpos = np.clip(GAIN * (goal - pos), -OSC_POS_SCALE, OSC_POS_SCALE)
        drot = rotation_to_axis_angle(env.home_rotation @ rot.T)
        action = env.compose_action(dpos, drot, grip)
        if self.noise:
            action = action + self._rng.normal(0.0, self.noise, size=action.shape)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def _lift_goal(self, pos: np.ndarray) -> tuple[np.ndarray, float]:
        env = self.env
        cube = env.cube_pos()
        grasp_z = GRASP_Z.get(env.spec_.name, 0.0)
        above = cube + np.array([0.0, 0.0, HOVER])
        at = cube + np.array([0.0, 0.0, grasp_z])
        if self._phase == "hover":
            if np.linalg.norm((above - pos)[:2]) < 0.01 and abs(above[2] - pos[2]) < 0.02:
                self._phase = "descend"
            return above, -1.0
        if self._phase == "descend":
            if np.linalg.norm((at - pos)[:2]) > 0.03:
                self._phase = "hover"
            elif abs(at[2] - pos[2]) < 0.01:
                self._phase, self._timer = "grasp", 0
            return at, -1.0
        if self._phase == "grasp":
            self._timer += 1
            hand = env.hand_qpos()
            settled = self._last_hand.shape == hand.shape and np.abs(hand - self._last_hand).max() < 2e-3
            self._last_hand = hand
            if self._timer >= GRASP_STEPS[1] or (self._timer >= GRASP_STEPS[0] and settled):
                self._phase = "raise"
            return at, 1.0
        # raise: give up and retry if the cube stays on the table while the hand is well above it
        if pos[2] - cube[2] > 0.08 and cube[2] < env.table_height + 0.03:
            self._phase = "hover"
            return above, -1.0
        goal = np.array([cube[0], cube[1], env.table_height + LIFT_HEIGHT])
        return goal, 1.0
