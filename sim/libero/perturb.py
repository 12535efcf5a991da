"""LIBERO-Plus's perturbation axes as seeded perturbations of any LIBERO suite (``libero eval --perturb``).

LIBERO-Plus (2025) perturbs LIBERO's episodes along seven axes and reports each axis's drop. Here each axis has
three levels, each level a stated physical size; an episode's perturbation is drawn from its seed (the episode's
``seed + k`` and the redraw count), applied after the env resets to its init state, and recorded whole in
``episodes.jsonl`` (``perturbation``: axes, levels, the concrete draw), so :func:`apply` on a fresh env replays it.

=============  ===========================================================================================
axis           level 1 / 2 / 3
=============  ===========================================================================================
camera         the agent-view camera moved 5 / 10 / 15 cm in a random direction and turned 5 / 10 / 15
               degrees about a random axis
robot_init     the 7 arm joints offset by N(0, 0.1 / 0.2 / 0.3 rad) each (clipped to their limits)
language       the instruction reworded: verbs swapped for synonyms / and put in a request / and after an
               unrelated sentence
light          every light's brightness scaled by a factor drawn from [1 - 0.25 L, 1 + 0.25 L] (at least 0.1)
               and its position moved up to 0.5 / 1.0 / 1.5 m
texture        the table's and the floor's colours tinted: each channel multiplied by a factor in
               [1 - 0.25 L, 1]
noise          Gaussian pixel noise of sigma 4 / 8 / 16 (of 255) on every camera image the policy sees
layout         every movable object shifted 2 / 4 / 6 cm in a random direction on the table
=============  ===========================================================================================

A draw that makes the task unsolvable or already solved is detected after the settle steps and drawn again
(up to :data:`MAX_REDRAWS` times, from the next seed), never scored as the policy's failure: an object that ends
the settle steps more than 5 cm lower than it does unperturbed (pushed off the table), bodies that start
interpenetrating 5 mm deeper than in the unperturbed init state (the arm in the table, two objects in one place),
or the goal already holding. A task whose draws all fail stops the evaluation with one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from core.errors import ConfigError
from sim.api import INFO_SUCCESS


class UnsolvablePerturbation(ConfigError):
    """Every draw of a task's perturbation left it unsolvable: the levels are too large for that scene."""


AXES: tuple[str, ...] = ("camera", "robot_init", "language", "light", "texture", "noise", "layout")
LEVELS: tuple[int, ...] = (1, 2, 3)
MAX_REDRAWS = 10
CAMERA_SHIFT_M = (0.05, 0.10, 0.15)
CAMERA_TURN_DEG = (5.0, 10.0, 15.0)
JOINT_SIGMA_RAD = (0.1, 0.2, 0.3)
LIGHT_MOVE_M = (0.5, 1.0, 1.5)
NOISE_SIGMA = (4.0, 8.0, 16.0)
LAYOUT_SHIFT_M = (0.02, 0.04, 0.06)
FELL_M = 0.05
PENETRATION_M = 0.005

_SYNONYMS = (("pick up", "grab"), ("put", "place"), ("place", "set"), ("open", "pull open"), ("close", "shut"),
             ("turn on", "switch on"), ("turn off", "switch off"), ("push", "slide"))
_REQUESTS = ("could you {}, please", "please {}", "I need you to {}", "your job: {}")
_PREAMBLES = ("The kitchen is quiet this morning.", "Someone left the lights on.", "There is a lot on the table.",
              "It is almost lunch time.")


def parse_perturb(text: str | Mapping[str, int] | None) -> dict[str, int]:
    """``"camera=2,light=1"`` -> ``{"camera": 2, "light": 1}`` (axes in :data:`AXES` order).

    Raises:
        ConfigError: An unknown axis or level, or a malformed item (one line naming the valid ones).
    """
    if text is None or text == "":
        return {}
    items = dict(text) if isinstance(text, Mapping) else {}
    if not isinstance(text, Mapping):
        for part in (p.strip() for p in str(text).split(",") if p.strip()):
            axis, sep, level = part.partition("=")
            if not sep:
                raise ConfigError(f"--perturb: expected AXIS=LEVEL items like camera=2,light=1, got {part!r}")
            items[axis.strip()] = level.strip()
    out: dict[str, int] = {}
    for axis, level in items.items():
        if axis not in AXES:
            import difflib

            near = difflib.get_close_matches(axis, AXES, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise ConfigError(f"--perturb: unknown axis {axis!r}; {hint}axes: {', '.join(AXES)}")
        try:
            lv = int(level)
        except (TypeError, ValueError):
            lv = -1
        if lv not in LEVELS:
            raise ConfigError(f"--perturb: {axis} level must be one of {', '.join(map(str, LEVELS))}, got {level!r}")
        out[axis] = lv
    return {a: out[a] for a in AXES if a in out}


def draw(levels: Mapping[str, int], seed: int, language: str, attempt: int = 0) -> dict[str, Any]:
    """The concrete perturbation of one episode's ``attempt``-th draw (JSON-able; :meth:`Perturber.apply` replays
    it)."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(attempt), 0x51B5])
    params: dict[str, Any] = {}
    for axis, lv in levels.items():
        i = lv - 1
        if axis == "camera":
            direction, turn_axis = _unit(rng), _unit(rng)
            params[axis] = {"shift_m": (direction * CAMERA_SHIFT_M[i]).round(5).tolist(),
                            "turn_axis": turn_axis.round(5).tolist(), "turn_deg": CAMERA_TURN_DEG[i]}
        elif axis == "robot_init":
            params[axis] = {"joint_offsets_rad": rng.normal(0.0, JOINT_SIGMA_RAD[i], 7).round(5).tolist()}
        elif axis == "language":
            params[axis] = {"instruction": reword(language, lv, rng)}
        elif axis == "light":
            params[axis] = {"scale": float(round(max(0.1, rng.uniform(1 - 0.25 * lv, 1 + 0.25 * lv)), 4)),
                            "move_m": (_unit(rng) * LIGHT_MOVE_M[i] * rng.uniform(0.5, 1.0)).round(4).tolist()}
        elif axis == "texture":
            params[axis] = {"tint": rng.uniform(1 - 0.25 * lv, 1.0, 3).round(4).tolist()}
        elif axis == "noise":
            params[axis] = {"sigma": NOISE_SIGMA[i], "seed": int(rng.integers(2**31 - 1))}
        elif axis == "layout":
            angles = rng.uniform(0, 2 * math.pi, 64)
            params[axis] = {"shift_m": LAYOUT_SHIFT_M[i], "angles_rad": angles.round(5).tolist()}
    return {"levels": dict(levels), "attempt": int(attempt), "params": params}


#: Axes that move bodies: their draws are checked for a task made unsolvable (see the module docstring).
PHYSICAL = ("robot_init", "layout")
MODES = ("all", "one")


def for_episode(levels: Mapping[str, int], seed: int, mode: str = "all") -> dict[str, int]:
    """The axes one episode is perturbed along: all of ``levels`` (``mode="all"``, what ``libero eval`` does), or
    one of them drawn from ``seed`` (``mode="one"``: ``libero record --perturb-mode one``, a training set that
    covers every axis, each episode along one)."""
    if mode not in MODES:
        raise ConfigError(f"--perturb-mode: one of {', '.join(MODES)}, got {mode!r}")
    if mode == "all" or len(levels) <= 1:
        return dict(levels)
    axes = list(levels)
    axis = axes[int(np.random.default_rng([int(seed) & 0xFFFFFFFF, 0xA4E5]).integers(len(axes)))]
    return {axis: levels[axis]}


def start(env: Any, pt: Perturber, levels: Mapping[str, int], seed: int, options: Mapping[str, Any],
          settle_steps: int, noop: np.ndarray, where: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Reset ``env`` (``options``: its init state) under a draw of ``levels`` and run ``settle_steps`` ``noop``
    actions; a draw that leaves the task unsolvable or solved is drawn again (see the module docstring).

    Returns the settled observation, info, and the draw with the reasons of the rejected ones (``rejected``).

    Raises:
        UnsolvablePerturbation: Every one of the ``MAX_REDRAWS + 1`` draws was rejected (``where`` names the
            episode in its one line).
    """
    language = env.task.language
    physical = any(a in levels for a in PHYSICAL)
    reference, resting = None, 0.0
    if physical:  # the objects' heights after an unperturbed settle: a perturbed one that ends far lower fell
        pt.restore()
        env.reset(seed=seed, options=dict(options))
        resting = pt.penetration()  # LIBERO's own init states rest with some contacts a few mm deep
        for _ in range(settle_steps):
            env.step(noop)
        reference = pt.heights()
    rejected: list[str] = []
    for attempt in range(MAX_REDRAWS + 1):
        obs, info = env.reset(seed=seed, options=dict(options))
        drawn = draw(levels, seed, language, attempt)
        pt.apply(drawn)
        obs = env._obs
        why = None
        if physical and pt.penetration() > resting + PENETRATION_M:
            why = f"bodies interpenetrate by {1000 * pt.penetration():.0f} mm"
        for _ in range(settle_steps if why is None else 0):
            obs, _, _, _, info = env.step(noop)
        if why is None and physical and (reference - pt.heights()).max(initial=0.0) > FELL_M:
            why = f"an object fell {100 * (reference - pt.heights()).max():.0f} cm"
        if why is None and info.get(INFO_SUCCESS):
            why = "the goal already holds"
        if why is None:
            return obs, info, {**drawn, "rejected": rejected}
        rejected.append(why)
    raise UnsolvablePerturbation(f"--perturb {dict(levels)}: {where}: {MAX_REDRAWS + 1} draws all left the task "
                                 f"unsolvable ({rejected[-1]}); lower the levels")


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=3)
    return v / max(np.linalg.norm(v), 1e-9)


def reword(instruction: str, level: int, rng: np.random.Generator) -> str:
    """The instruction reworded at ``level`` (see the module docstring); the same rng draws give the same text."""
    text = instruction
    for a, b in _SYNONYMS:
        if f"{a} " in f"{text} " and rng.random() < 0.9:
            text = text.replace(a, b, 1)
    if level >= 2:
        text = _REQUESTS[int(rng.integers(len(_REQUESTS)))].format(text)
    if level >= 3:
        text = f"{_PREAMBLES[int(rng.integers(len(_PREAMBLES)))]} {text}"
    return text


class Perturber:
    """Applies recorded perturbations to one ``LiberoEnv`` and undoes them (the env's model is reused across
    episodes, so every change to it is restored before the next episode's)."""

    def __init__(self, env: Any):
        import mujoco

        self.env = env
        m = env.sim.model._model
        self._m, self._d = m, env.sim.data._data
        self._cam = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, "agentview")
        self._original = {"cam_pos": m.cam_pos.copy(), "cam_quat": m.cam_quat.copy(),
                          "light_diffuse": m.light_diffuse.copy(), "light_pos": m.light_pos.copy(),
                          "headlight": m.vis.headlight.diffuse.copy(), "mat_rgba": m.mat_rgba.copy(),
                          "geom_rgba": m.geom_rgba.copy()}
        self.noise: tuple[float, np.random.Generator] | None = None
        self.language: str | None = None
        self._surfaces = self._surface_geoms()  # the model's names do not change between episodes

    def restore(self) -> None:
        """Undo every model change (camera, lights, colours)."""
        m, o = self._m, self._original
        m.cam_pos[:], m.cam_quat[:] = o["cam_pos"], o["cam_quat"]
        m.light_diffuse[:], m.light_pos[:] = o["light_diffuse"], o["light_pos"]
        m.vis.headlight.diffuse[:] = o["headlight"]
        m.mat_rgba[:], m.geom_rgba[:] = o["mat_rgba"], o["geom_rgba"]
        self.noise, self.language = None, None

    def apply(self, perturbation: Mapping[str, Any]) -> None:
        """Apply a :func:`draw` result to the env just reset (model, then state); the observation is renewed."""
        import mujoco

        self.restore()
        m, d, env = self._m, self._d, self.env
        p = perturbation.get("params", {})
        if "camera" in p:
            c = p["camera"]
            m.cam_pos[self._cam] = self._original["cam_pos"][self._cam] + np.asarray(c["shift_m"])
            turn = np.zeros(4)
            mujoco.mju_axisAngle2Quat(turn, np.asarray(c["turn_axis"], np.float64), math.radians(c["turn_deg"]))
            q = np.zeros(4)
            mujoco.mju_mulQuat(q, turn, self._original["cam_quat"][self._cam].astype(np.float64))
            m.cam_quat[self._cam] = q
        if "light" in p:
            m.light_diffuse[:] = np.clip(self._original["light_diffuse"] * p["light"]["scale"], 0, 1)
            m.light_pos[:] = self._original["light_pos"] + np.asarray(p["light"]["move_m"])
            m.vis.headlight.diffuse[:] = np.clip(self._original["headlight"] * p["light"]["scale"], 0, 1)
        if "texture" in p:
            tint = np.asarray(p["texture"]["tint"])
            for g in self._surfaces:
                m.geom_rgba[g, :3] = self._original["geom_rgba"][g, :3] * tint
                mat = m.geom_matid[g]
                if mat >= 0:
                    m.mat_rgba[mat, :3] = self._original["mat_rgba"][mat, :3] * tint
        if "robot_init" in p:
            robot = env._robot
            idx = np.asarray(robot._ref_joint_pos_indexes)
            lo, hi = m.jnt_range[np.asarray(robot._ref_joint_indexes)].T
            q = d.qpos[idx] + np.asarray(p["robot_init"]["joint_offsets_rad"])[: len(idx)]
            d.qpos[idx] = np.where(hi > lo, np.clip(q, lo, hi), q)
            d.qvel[np.asarray(robot._ref_joint_vel_indexes)] = 0.0
        if "layout" in p:
            shift, angles = p["layout"]["shift_m"], p["layout"]["angles_rad"]
            for n, adr in enumerate(self._object_qpos()):
                a = angles[n % len(angles)]
                d.qpos[adr:adr + 2] += shift * np.array([math.cos(a), math.sin(a)])
        if "noise" in p:
            self.noise = (float(p["noise"]["sigma"]), np.random.default_rng(int(p["noise"]["seed"])))
        if "language" in p:
            self.language = str(p["language"]["instruction"])
        mujoco.mj_forward(m, d)
        if "robot_init" in p:  # the controller must hold the new joint pose, not pull back to the old one
            env._arm_controller.reset_goal()
        env._raw_obs = env._libero.regenerate_obs_from_state(env.sim.get_state().flatten())
        env._obs = env._convert_obs(env._raw_obs)

    def observe(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """The observation the policy sees: camera images with the episode's pixel noise, when it has some.
        Without noise a lazy observation (``sim.api.LazyObservation``) passes as it is; noise is drawn on every
        step's images, so it renders them (the draws stay those of the recorded seed)."""
        from sim.api import LazyObservation

        if self.noise is None:
            return obs if isinstance(obs, LazyObservation) else dict(obs)
        sigma, rng = self.noise
        out = dict(obs)
        for key in ("image", "wrist_image"):
            if key in out:
                img = np.asarray(out[key], np.float32) + rng.normal(0.0, sigma, np.shape(out[key]))
                out[key] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
        return out

    def heights(self) -> np.ndarray:
        """z of every movable object (metres), to detect one that fell off the table."""
        return np.array([self._d.qpos[adr + 2] for adr in self._object_qpos()])

    def penetration(self) -> float:
        """The deepest interpenetration among the current contacts (metres, >= 0)."""
        d = self._d
        return float(max([-d.contact[i].dist for i in range(d.ncon)] + [0.0]))

    def _object_qpos(self) -> list[int]:
        import mujoco

        m = self._m
        return [int(m.jnt_qposadr[j]) for j in range(m.njnt) if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]

    def _surface_geoms(self) -> list[int]:
        import mujoco

        m = self._m
        names = [mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, g) or "" for g in range(m.ngeom)]
        bodies = [mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_BODY, int(m.geom_bodyid[g])) or "" for g in range(m.ngeom)]
        return [g for g in range(m.ngeom) if any(k in (names[g] + " " + bodies[g]).lower() for k in ("table", "floor"))]
