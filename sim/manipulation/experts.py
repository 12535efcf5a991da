"""Scripted experts for the manipulation suite (privileged state, one script for every embodiment).

The expert plans in end-effector space (a displacement per step in the world frame, a rotation, and a
grip command) and lets the env translate that into its own action space (``ManipulationEnv.compose_action``:
OSC deltas, or damped least-squares joint deltas for joint-space control). Gaussian noise of std ``noise``
is added to the normalised action, then clipped to [-1, 1].

Lift is a small state machine: hover 8 cm above the cube, descend, close for a few steps, raise; if the
cube is not following the hand when raised, it opens and starts over.

Parallel and three-finger grippers keep the episode's initial (top-down) orientation and close on the
cube with the grip site at its centre. A dexterous hand (``HAND_GRASPS``) instead does a palm-down
enveloping grasp: it first turns the palm to face the table (fingers horizontal), then brings a grasp
point in front of the palm, between the thumb and the finger bases, onto the cube; closing swings the
thumb into opposition a few steps before the fingers curl, so the fingers wrap the cube's far face and
the thumb presses its near face, with the palm on top. For reach, the hand turns its palm down the same
way before going low (its straight fingers reach ~18 cm past the wrist site that reach places).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.manipulation.env import OSC_POS_SCALE, rotation_to_axis_angle

if TYPE_CHECKING:
    from sim.manipulation.env import ManipulationEnv

HOVER = 0.08  # m above the cube centre before descending
GRASP_STEPS = (6, 30)  # min / max control steps spent closing; done early once the fingers stop
GAIN = 2.0  # proportional gain on the position error (OSC tracking lags under gravity and contact)
LIFT_HEIGHT = 0.15  # m above the table for the raise phase
MAX_TURN = 0.4  # rad per step, cap on the commanded rotation (hands turn the palm by ~90 degrees)


@dataclass(frozen=True)
class HandGrasp:
    """Palm-down enveloping grasp of one dexterous hand, in the frame of its palm body.

    Attributes:
        palm_body: Suffix of the palm body's MuJoCo name.
        normal: Palm normal (the side the fingers curl towards), unit vector in the palm body frame.
        fingers: Direction from the wrist to the straight fingertips, palm body frame.
        thumb: Direction from the fingers towards the thumb (across the palm), palm body frame.
        grasp_point: Where the cube centre goes, m along (normal, fingers, thumb) from the palm origin.
        world_pose: World directions (normal, fingers, thumb) the palm is turned to for the grasp.
        grasp_dz: m, height of the grasp point relative to the cube centre when closing.
        thumb_lead: Control steps the thumb rotation closes alone before the fingers and thumb bend.
        close_steps: Control steps spent closing in all (the hand's finger drives are slow and soft).
        thumb_rotation: Index of the thumb-rotation dim in the hand's action dims.
        close_level: Command of the finger and thumb bend dims when closed (-1 open .. +1 the drives' full
            range): the position drives are stiff enough that the full range squeezes the cube harder than
            needed, into ~1 cm of soft-contact penetration; the thumb rotation always goes to +1.
    """

    palm_body: str
    normal: tuple[float, float, float]
    fingers: tuple[float, float, float]
    thumb: tuple[float, float, float]
    grasp_point: tuple[float, float, float]
    world_pose: tuple[tuple[float, float, float], ...]
    grasp_dz: float
    thumb_lead: int
    close_steps: int
    thumb_rotation: int
    close_level: float = 1.0

    def palm_axes(self) -> np.ndarray:
        """(3, 3) matrix whose columns are (normal, fingers, thumb) in the palm body frame."""
        return np.array([self.normal, self.fingers, self.thumb], dtype=np.float64).T

    def palm_goal(self) -> np.ndarray:
        """Rotation (3, 3) of the palm body, world frame, in the grasp pose."""
        world = np.array(self.world_pose, dtype=np.float64).T  # columns: normal, fingers, thumb in world
        return world @ self.palm_axes().T


# robosuite's InspireRightHand (MJCF grippers/inspire_right_hand.xml): the fingers extend along the palm
# body's -y (index 0.10 m out, ~0.18 m to the tips), curl towards -x, and the thumb sits on the -z side
# ~0.07-0.12 m out, its base ~0.03-0.05 m from the wrist. Palm-down with fingers to the robot's right
# (-y) and thumb forward (+x) is one ~90 degree wrist roll from the Panda's home pose, well inside its
# joint limits; the grasp point (4.5 cm in front of the palm, 9.5 cm out, 4 cm towards the thumb) puts
# a 4 cm cube between the thumb and the index / middle finger bases.
HAND_GRASPS = {
    "Panda+InspireHand": HandGrasp(
        palm_body="r_palm",
        normal=(-1.0, 0.0, 0.0),
        fingers=(0.0, -1.0, 0.0),
        thumb=(0.0, 0.0, -1.0),
        grasp_point=(0.045, 0.095, 0.04),
        world_pose=((0.0, 0.0, -1.0), (0.0, -1.0, 0.0), (1.0, 0.0, 0.0)),
        grasp_dz=-0.005,
        thumb_lead=4,
        close_steps=18,
        thumb_rotation=5,
        close_level=0.5,
    )
}


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
        self._hand = HAND_GRASPS.get(env.spec_.name)
        self._palm = None
        if self._hand is not None:
            model = env.sim_model
            names = [model.body(i).name for i in range(model.nbody)]
            matches = [i for i, n in enumerate(names) if n.endswith(self._hand.palm_body)]
            if len(matches) != 1:
                raise ValueError(f"palm body {self._hand.palm_body!r}: {len(matches)} matches, expected 1")
            self._palm = matches[0]
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode (phase machine back to the start); ``seed`` reseeds the noise."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._phase = "orient" if self._hand is not None else "hover"
        self._timer = 0
        self._last_hand = np.zeros(0)

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """Return the next action, shape ``(action_dim,)`` float32 in [-1, 1]."""
        env = self.env
        pos, rot = env.eef_pose()
        if env.task == "reach" and self._hand is not None:
            # the straight fingers reach ~18 cm past the wrist site: turn the palm down before going low
            _, drot = self._palm_pose()
            goal, grip = env.reach_target(), -1.0
            if self._phase == "orient":
                goal = goal + np.array([0.0, 0.0, 0.05])
                if np.linalg.norm(drot) < 0.15:
                    self._phase = "hover"
        elif env.task == "reach":
            goal, grip = env.reach_target(), -1.0
            drot = rotation_to_axis_angle(env.home_rotation @ rot.T)
        elif self._hand is None:
            goal, grip = self._lift_goal(pos)
            drot = rotation_to_axis_angle(env.home_rotation @ rot.T)
        else:
            goal, pos, grip, drot = self._hand_lift()  # pos: the grasp point in front of the palm
        dpos = np.clip(GAIN * (goal - pos), -OSC_POS_SCALE, OSC_POS_SCALE)
        turn = np.linalg.norm(drot)
        if turn > MAX_TURN:
            drot = drot * (MAX_TURN / turn)
        action = env.compose_action(dpos, drot, grip)
        if self.noise:
            action = action + self._rng.normal(0.0, self.noise, size=action.shape)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def _lift_goal(self, pos: np.ndarray) -> tuple[np.ndarray, float]:
        """Gripper lift: goal of the tool point ``pos`` (grip site) and the grip command."""
        env = self.env
        cube = env.cube_pos()
        above = cube + np.array([0.0, 0.0, HOVER])
        at = cube
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
        return self._raise(pos, cube)

    def _raise(self, pos: np.ndarray, cube: np.ndarray) -> tuple[np.ndarray, float]:
        """Raise with the grip closed; give up and retry if the cube stays on the table."""
        env = self.env
        if pos[2] - cube[2] > 0.08 and cube[2] < env.table_height + 0.03:
            self._phase = "hover"
            return cube + np.array([0.0, 0.0, HOVER]), -1.0
        return np.array([cube[0], cube[1], env.table_height + LIFT_HEIGHT]), 1.0

    def _palm_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """Hand grasp point (3,) in m and the rotation (3,) that turns the palm into the grasp pose, world."""
        hand = self._hand
        assert hand is not None
        palm_rot = self.env.sim_data.xmat[self._palm].reshape(3, 3)
        axes = palm_rot @ hand.palm_axes()  # world (normal, fingers, thumb)
        point = self.env.sim_data.xpos[self._palm] + axes @ np.asarray(hand.grasp_point)
        return point, rotation_to_axis_angle(hand.palm_goal() @ palm_rot.T)

    def _hand_lift(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Dexterous-hand lift: (goal of the grasp point, grasp point, per-finger grip, rotation command)."""
        env, hand = self.env, self._hand
        assert hand is not None
        point, drot = self._palm_pose()
        cube = env.cube_pos()
        n = len(env.spec_.hand_dims)
        open_, closed = -np.ones(n), np.full(n, hand.close_level)
        closed[hand.thumb_rotation] = 1.0  # full opposition; the bend dims set how hard the hand squeezes
        if self._phase == "orient":  # turn the palm down well above the cube, so no finger sweeps it
            if np.linalg.norm(drot) < 0.15:
                self._phase = "hover"
            return cube + np.array([0.0, 0.0, HOVER + 0.05]), point, open_, drot
        if self._phase == "hover":
            above = cube + np.array([0.0, 0.0, HOVER])
            if np.linalg.norm(above - point) < 0.015 and np.linalg.norm(drot) < 0.1:
                self._phase = "descend"
            return above, point, open_, drot
        at = cube + np.array([0.0, 0.0, hand.grasp_dz])
        if self._phase == "descend":
            if np.linalg.norm((at - point)[:2]) > 0.03:
                self._phase = "hover"
            elif np.linalg.norm(at - point) < 0.01:
                self._phase, self._timer = "grasp", 0
            return at, point, open_, drot
        if self._phase == "grasp":
            self._timer += 1
            grip = closed.copy()
            if self._timer <= hand.thumb_lead:  # thumb swings into opposition first, everything else open
                grip = open_.copy()
                grip[hand.thumb_rotation] = 1.0
            if self._timer >= hand.close_steps:
                self._phase = "raise"
            return at, point, grip, drot
        goal, g = self._raise(point, cube)  # g < 0: the cube stayed behind, open and start over
        return goal, point, closed if g > 0 else open_, drot
