"""Gymnasium env for any LIBERO task, built offline from its BDDL file and fixed init states.

Observation (``gymnasium.spaces.Dict``):
    ``image``        (H, W, 3) uint8 RGB, the ``agentview`` camera in openpi's and LeRobot's LIBERO convention
                     (``IMAGE_CONVENTION = "rot180"``, ``metadata["image_convention"]``): robosuite's raw
                     OpenGL-order frame (row 0 at the bottom) rotated 180 degrees, ``raw[::-1, ::-1]``, exactly
                     what openpi's LIBERO example and LeRobot's LIBERO processor give their policies (and what
                     their LIBERO datasets hold). Until 2026-12 it was ``raw[::-1]`` (``"flipud"``), a horizontal
                     mirror of this; ``core.data.image_convention`` converts.
    ``wrist_image``  (H, W, 3) uint8 RGB, ``robot0_eye_in_hand``, rotated the same way (only when
                     ``wrist_image=True``).
    ``proprio``      (15,) float32, world frame:
                     [0:3]  end-effector (grip site) position, metres;
                     [3:6]  end-effector orientation, axis-angle (radians) of robosuite's
                            ``robot0_eef_quat`` as robosuite's ``quat2axisangle`` computes it (angle
                            ``2 acos(w)`` in [0, 2 pi]): LIBERO's ``ee_ori``, openpi's and LeRobot's state;
                     [6:8]  gripper finger joint positions, metres (about +-0.04 open, 0 closed);
                     [8:15] arm joint positions, radians.
                     ``proprio[0:8]`` is openpi's / LeRobot's LIBERO ``observation/state`` (``sim.libero.openpi``).

Mapping to LIBERO's demonstration files (``data/demo_<i>/obs/<key>``, see ``sim.libero.demos``):
    ``agentview_rgb``  = ``image[::-1, ::-1]``, rotated back (LIBERO stores the raw OpenGL-order frame;
                         the loader, ``core.data.trajectories``, returns LIBERO files' frames in ``rot180``)
    ``eye_in_hand_rgb`` = ``wrist_image[::-1, ::-1]``
    ``ee_pos`` = proprio[0:3], ``ee_ori`` = proprio[3:6], ``ee_states`` = proprio[0:6],
    ``gripper_states`` = proprio[6:8], ``joint_states`` = proprio[8:15].
    LIBERO's ``actions`` are this env's actions (same controller, same scaling).

Action: 7-d in [-1, 1], robosuite ``OSC_POSE`` with delta input, in the robot base frame (axes
parallel to the world frame in every LIBERO scene): [0:3] translation of the end-effector goal,
times 0.05 m; [3:6] axis-angle rotation of the goal, times 0.5 rad; [6] gripper, -1 open / +1 close.
Control at 20 Hz (25 MuJoCo substeps of 2 ms).

Lazy images (``LiberoEnv(..., lazy_images=True)``): the observation is a read-only mapping
(``LazyObservation``) whose camera images are rendered when first read, not at every step. A policy that
reads images only when it re-plans (an action-chunking policy executing 4 of 8 actions, openpi's client
with ``replan_steps``) then pays for a quarter of the frames. The frames are bit-identical to the eager
ones: robosuite samples a camera at one MuJoCo substep of the step (its observable's sampling time) and
renders the kinematics MuJoCo computed there; this env records the whole ``MjData`` at that substep (a
0.02 ms copy) instead of rendering, and a read renders from that copy and puts the live state back
exactly. An observation's images can be read until the next ``step`` / ``reset``; later reads raise
RuntimeError (keep the arrays, not the observation, to hold frames).

Reward is 1.0 on success, else 0.0. ``terminated`` is set on success (LIBERO's own BDDL goal
predicates, ``_check_success``) and when physics diverges (``info["failure"]``); the step limit
comes from the registration (``TimeLimit``). ``info["eef_delta"]`` is the end-effector pose change over
the step in the world frame (dx, dy, dz in metres, then axis-angle in radians), computed from the same
observations as ``proprio`` so that ``eef_delta[:3]`` is exactly the change of ``proprio[0:3]``.

Reset: ``reset(seed=s)`` picks init state ``np_random.integers(num_init_states)`` unless
``options={"init_state_id": k}`` is given; the sim is set to that exact MuJoCo state (LIBERO's
evaluation protocol). ``options={"init_state_id": "sampled"}`` instead keeps the placement LIBERO's own
samplers draw at reset (seeded from ``np_random``), the distribution the fixed states were drawn from:
training demonstrations start there, so that the 50 evaluation states stay unseen (``init_state_id`` None). LIBERO also re-samples fixture poses (written into the model, not the state) at
every reset; those samplers are seeded from the same ``np_random``, so the same seed gives an identical
rollout.
"""

from __future__ import annotations

import math
import os
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from core.data.image_convention import LIBERO_CONVENTION
from core.errors import ConfigError
from sim.api import INFO_EEF_DELTA, INFO_FAILURE, INFO_SUCCESS, LazyObservation, seeded_robosuite_reset
from sim.libero._bootstrap import prepare_libero
from sim.libero.suites import LiberoTask, get_task, load_init_states

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

PROPRIO_LAYOUT: dict[str, slice] = {
    "ee_pos": slice(0, 3),
    "ee_ori": slice(3, 6),
    "gripper_states": slice(6, 8),
    "joint_states": slice(8, 15),
}
"""Named slices of ``proprio``; the names are LIBERO's demonstration obs keys."""
DEMO_OBS_SOURCES = {"agentview_rgb": "image", "eye_in_hand_rgb": "wrist_image", "ee_states": "proprio",
                    **{k: "proprio" for k in PROPRIO_LAYOUT}}
"""LIBERO demo obs key -> the ``LiberoEnv`` observation key it is computed from (``demo_obs``)."""
PROPRIO_DIM = 15
ACTION_DIM = 7  # robosuite OSC pose (6: dx dy dz, axis-angle) + gripper (1), as LIBERO's demonstrations
EMBODIMENT = "Panda"
AGENT_CAMERA = "agentview"
WRIST_CAMERA = "robot0_eye_in_hand"
CONTROL_FREQ = 20
IMAGE_CONVENTION = LIBERO_CONVENTION
"""``"rot180"``: camera images are the raw render rotated 180 degrees (``core.data.image_convention``)."""

_MJ_BAD_STATE_WARNINGS = ("mjWARN_BADQPOS", "mjWARN_BADQVEL", "mjWARN_BADQACC", "mjWARN_BADCTRL")


def _axis_angle_from_quat_xyzw(q: np.ndarray) -> np.ndarray:
    """Axis-angle (3,) from a quaternion (x, y, z, w), as robosuite's ``transform_utils.quat2axisangle``.

    ``xyz / sqrt(1 - w^2) * 2 acos(w)``, angle in [0, 2 pi], zeros when ``sqrt(1 - w^2)`` is 0. That is
    LIBERO's ``ee_ori`` and the state of openpi's and LeRobot's LIBERO observations. The sign of ``q``
    matters: ``q = (u sin(t/2), cos(t/2))`` gives ``u t`` and ``-q`` (the same rotation) ``-u (2 pi - t)``. The
    LIBERO gripper points down, so ``w`` is near 0 and its sign differs between init states (negative at init
    state 0 of libero_spatial/0); this formula is continuous across ``w = 0`` (the angle passes through pi).
    Before 2026-12 ``q`` was first made ``w >= 0``, which gave ``-u (2 pi - t)`` where this gives ``u t`` (t > pi).
    """
    q = np.asarray(q, dtype=np.float64)
    w = min(max(float(q[3]), -1.0), 1.0)
    den = math.sqrt(1.0 - w * w)
    if den == 0.0:  # robosuite's math.isclose(den, 0.0): relative tolerance only, so exactly 0
        return np.zeros(3)
    return (q[:3] * 2.0 * math.acos(w)) / den


def _axis_angle_from_matrix(r: np.ndarray) -> np.ndarray:
    """Axis-angle (3,) of a rotation matrix (3, 3)."""
    from scipy.spatial.transform import Rotation

    return Rotation.from_matrix(r).as_rotvec()


_REFLECTION_FLAG = 2  # mujoco.mjtRndFlag.mjRND_REFLECTION (checked in the tests; mujoco is imported late here)


class LiberoEnv(gym.Env):
    """One LIBERO task as a Gymnasium env (see the module docstring for spaces and conventions).

    Args:
        suite: ``"libero_spatial"`` / ``"spatial"``, ``"libero_object"``, ``"libero_goal"``,
            ``"libero_10"``, ``"libero_90"``.
        task_index: index of the task in the suite (LIBERO's default task order).
        image_size: side of the square camera images, pixels (LIBERO's demos use 128).
        wrist_image: also render the eye-in-hand camera (costs about as much again per step).
        render_mode: ``"rgb_array"`` (``render()`` returns the agent-view frame as ``image``, ``rot180``) or None.
        images: put camera images in the observation (the default). ``False`` gives ``proprio`` only
            and skips rendering at every step, about 10x faster on a CPU, for policies that read the sim
            state (the privileged expert, random); ``render()`` still renders a frame on demand.
        lazy_images: render a camera image when the observation's entry is first read, not at every step
            (see the module docstring); the same frames, bit for bit. ``raw_obs`` is lazy too.
        render_samples: MSAA samples of the offscreen frames. 0 (the default here) halves the cost of a
            frame on a CPU renderer; 4 is robosuite's and LIBERO's own. Record and evaluate with the same value.
        render_reflections: draw the mirror reflections of reflective surfaces (the table, the cabinets), as
            robosuite and LIBERO do. Off (the default here) halves the cost of a camera frame again on a CPU
            renderer (measured 0.13 -> 0.085 s per step with two 64 px cameras, MSAA off) and changes a 64 px
            frame by about 1 / 255 on average. Record and evaluate with the same value; for a policy trained on
            LIBERO's own downloaded demos, ``render_samples=4, render_reflections=True`` is LIBERO's look.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": CONTROL_FREQ, "image_convention": IMAGE_CONVENTION}

    def __init__(
        self,
        suite: str = "libero_spatial",
        task_index: int = 0,
        *,
        image_size: int = 128,
        wrist_image: bool = True,
        render_mode: str | None = None,
        images: bool = True,
        render_samples: int = 0,
        render_reflections: bool = False,
        lazy_images: bool = False,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ConfigError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        if not 8 <= int(image_size) <= 1024:
            raise ConfigError(f"image_size must be in 8..1024 pixels, got {image_size}")
        self.task: LiberoTask = get_task(suite, task_index)
        self.image_size = int(image_size)
        self.images = bool(images)
        self.use_wrist_image = bool(wrist_image) and self.images
        self.render_mode = render_mode
        self.render_reflections = bool(render_reflections)
        self.lazy_images = bool(lazy_images) and self.images
        prepare_libero()
        self.init_states = load_init_states(self.task.init_states_path())

        from libero.libero.envs import OffScreenRenderEnv  # heavy: robosuite, MuJoCo, EGL

        if self.task.source == "libero_pro":  # its scenes place object variants LIBERO does not register
            from sim.libero.pro import register_pro_objects

            register_pro_objects()
        cameras = [AGENT_CAMERA] + ([WRIST_CAMERA] if self.use_wrist_image else [])
        self._libero = OffScreenRenderEnv(
            use_camera_obs=self.images,  # the offscreen context stays for render() on demand
            bddl_file_name=str(self.task.bddl_path()),
            camera_names=cameras,
            camera_heights=self.image_size,
            camera_widths=self.image_size,
            control_freq=CONTROL_FREQ,
            hard_reset=False,  # keep the compiled model between episodes; the state is set explicitly
            ignore_done=True,  # the step limit is Gymnasium's TimeLimit
            initialization_noise=None,
        )
        self._rs = self._libero.env  # the robosuite / LIBERO problem env
        self._set_render_samples(int(render_samples))
        self._robot = self._rs.robots[0]
        self._eef_site = self._robot.eef_site_id["right"]
        self._arm_controller = self._robot.composite_controller.part_controllers["right"]
        if self.init_states.shape[1] != self._rs.sim.get_state().flatten().shape[0]:
            raise ConfigError(
                f"{self.task.init_states_path()}: init states have {self.init_states.shape[1]} values, "
                f"the model's state has {self._rs.sim.get_state().flatten().shape[0]}"
            )

        hw = (self.image_size, self.image_size, 3)
        obs_spaces = {"image": spaces.Box(0, 255, hw, np.uint8)} if self.images else {}
        if self.use_wrist_image:
            obs_spaces["wrist_image"] = spaces.Box(0, 255, hw, np.uint8)
        obs_spaces["proprio"] = spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32)
        self.observation_space = spaces.Dict(obs_spaces)
        low, high = (np.asarray(b, dtype=np.float32) for b in self._rs.action_spec)
        self.action_space = spaces.Box(low, high, dtype=np.float32)
        if self.action_space.shape != (ACTION_DIM,):  # `embodied sim list` states ACTION_DIM without building
            raise RuntimeError(f"LIBERO env has {self.action_space.shape} actions, expected ({ACTION_DIM},)")

        scale = np.asarray(self._arm_controller.output_max, dtype=np.float64)
        self.metadata = {
            **type(self).metadata,
            "embodiment": "Panda",
            "task": self.task.task_id,
            "task_name": self.task.name,
            "family": "libero",
            "language_instruction": self.task.language,
            "bddl_language": self.task.bddl_language,  # what LIBERO's demo files store as the instruction
            "proprio_layout": {k: [s.start, s.stop] for k, s in PROPRIO_LAYOUT.items()},
            "action_space_desc": {
                "dim": 7,
                "controller": "OSC_POSE (delta)",
                "semantics": ["dx", "dy", "dz", "drx", "dry", "drz", "gripper"],
                "units": [f"x{scale[i]:g} m" for i in range(3)]
                + [f"x{scale[i]:g} rad (axis-angle)" for i in range(3, 6)]
                + ["-1 open, +1 close"],
                "frame": f"robot base frame ({self._arm_controller.input_ref_frame}); axes parallel to world",
                "low": low.tolist(),
                "high": high.tolist(),
            },
        }
        self._raw_obs: dict[str, np.ndarray] | None = None
        self._obs: dict[str, np.ndarray] | None = None
        self.init_state_id: int | None = None
        self._generation = 0  # counts resets and steps: a lazy observation reads its frames in its own
        self._cameras = cameras
        self._snapshots: dict[str, Any] = {}
        if self.lazy_images:
            self._install_snapshot_sensors()

    # -------------------------------------------------------------------------------- properties

    @property
    def sim(self):
        """robosuite's ``MjSim`` (``.model``, ``.data`` are MuJoCo's)."""
        return self._rs.sim

    @property
    def libero_env(self):
        """The underlying LIBERO problem env (robosuite ``ManipulationEnv``)."""
        return self._rs

    @property
    def num_init_states(self) -> int:
        """Number of fixed init states of this task."""
        return int(self.init_states.shape[0])

    @property
    def raw_obs(self) -> dict[str, np.ndarray]:
        """The last robosuite observation dict (images in OpenGL row order), e.g. for LIBERO demos."""
        if self._raw_obs is None:
            raise RuntimeError("call reset() first")
        return self._raw_obs

    def eef_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """Grip-site position (3,) in metres and rotation matrix (3, 3), world frame."""
        data = self.sim.data
        return np.array(data.site_xpos[self._eef_site]), np.array(data.site_xmat[self._eef_site]).reshape(3, 3)

    # ------------------------------------------------------------------------------------- API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if self.images:  # a blind env renders only in render(), which makes its context current itself
            self._gl_current()
        options = dict(options or {})
        init_state_id = options.pop("init_state_id", None)
        if options:
            raise ConfigError(f"unknown reset option(s) {sorted(options)}; known: ['init_state_id']")
        sampled = isinstance(init_state_id, str) and init_state_id == "sampled"
        if init_state_id is None:
            init_state_id = int(self.np_random.integers(self.num_init_states))
        if not sampled and not (isinstance(init_state_id, (int, np.integer))
                                and 0 <= int(init_state_id) < self.num_init_states):
            raise ConfigError(f"init_state_id must be in 0..{self.num_init_states - 1} or 'sampled', "
                              f"got {init_state_id!r}")
        self.init_state_id = None if sampled else int(init_state_id)
        self._generation += 1
        self._reset_libero(int(self.np_random.integers(2**32 - 1)))
        if sampled:  # a fresh placement from LIBERO's samplers, the distribution the fixed states came from
            self._raw_obs = self._libero.regenerate_obs_from_state(self.sim.get_state().flatten())
        else:
            self._raw_obs = self._libero.set_init_state(self.init_states[self.init_state_id])
        self._obs = self._convert_obs(self._raw_obs)
        info = {INFO_SUCCESS: bool(self._rs._check_success()), INFO_EEF_DELTA: np.zeros(6, np.float32)}
        info["init_state_id"] = self.init_state_id
        return self._obs, info

    def step(self, action):
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        if self.images:
            self._gl_current()
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (7,):
            raise ValueError(f"LIBERO action must have 7 values, got shape {action.shape}")
        action = np.clip(action, self.action_space.low, self.action_space.high)
        raw0 = self._raw_obs
        warnings0 = self._bad_state_warnings()
        self._generation += 1  # the previous observation's lazy frames are read from here on: gone
        failure = None
        try:
            raw, _, _, _ = self._libero.step(action)
        except (ValueError, FloatingPointError, np.linalg.LinAlgError) as e:
            failure = self._divergence(warnings0)
            if failure is None:
                raise
            failure = f"{failure} ({type(e).__name__}: {e})"
        else:
            failure = self._divergence(warnings0)
        if failure is not None:
            info = {INFO_SUCCESS: False, INFO_EEF_DELTA: np.zeros(6, np.float32), INFO_FAILURE: failure}
            return self._obs, 0.0, True, False, info
        self._raw_obs = raw
        self._obs = self._convert_obs(raw)
        eef_delta = eef_delta_from_raw_obs(raw0, raw)
        success = bool(self._rs._check_success())
        info = {INFO_SUCCESS: success, INFO_EEF_DELTA: eef_delta}
        return self._obs, float(success), success, False, info

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        if self._obs is None:
            raise RuntimeError("call reset() before render()")
        if not self.images:
            self._gl_current()
            frame = self.sim.render(width=self.image_size, height=self.image_size, camera_name=AGENT_CAMERA)
            return np.ascontiguousarray(frame[::-1, ::-1])  # IMAGE_CONVENTION, like image
        return self._obs["image"].copy()

    def close(self):
        libero = self.__dict__.pop("_libero", None)
        if libero is not None:
            libero.close()

    def make_task_expert(self, noise: float = 0.0, seed: int | None = None):
        """The task-solving privileged expert (``sim.libero.solver.LiberoSolver``): ``--policy expert``."""
        from sim.libero.solver import LiberoSolver

        return LiberoSolver(self, noise=noise, seed=seed)

    def make_expert(self, noise: float = 0.0, seed: int | None = None):
        """Scripted reach-and-grasp policy for this task (``sim.libero.expert``), following ``sim.api.Policy``."""
        from sim.libero.expert import LiberoReachGraspExpert

        return LiberoReachGraspExpert(self, noise=noise, seed=seed)

    demo_obs_sources = DEMO_OBS_SOURCES

    @staticmethod
    def demo_obs(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """An observation (one, or a batch of K) under LIBERO's demo obs keys, as ``core.data`` loads them.

        Images stay in ``IMAGE_CONVENTION`` (``rot180``: the loader returns the files' OpenGL-order frames
        rotated the same way), proprio is sliced by ``PROPRIO_LAYOUT`` (``ee_states`` = ``proprio[..., 0:6]``).
        Keys the env did not render are absent.
        """
        out = {}
        if "image" in obs:
            out["agentview_rgb"] = obs["image"]
        if "wrist_image" in obs:
            out["eye_in_hand_rgb"] = obs["wrist_image"]
        proprio = np.asarray(obs["proprio"])
        for key, sl in PROPRIO_LAYOUT.items():
            out[key] = proprio[..., sl]
        out["ee_states"] = proprio[..., 0:6]
        return out

    # -------------------------------------------------------------------------------- internals

    def _convert_obs(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.lazy_images:
            return self._lazy_obs(raw)
        # IMAGE_CONVENTION: the raw OpenGL-order frame rotated 180 degrees, as openpi's LIBERO example does
        obs = {"image": np.ascontiguousarray(raw[f"{AGENT_CAMERA}_image"][::-1, ::-1])} if self.images else {}
        if self.use_wrist_image:
            obs["wrist_image"] = np.ascontiguousarray(raw[f"{WRIST_CAMERA}_image"][::-1, ::-1])
        obs["proprio"] = proprio_from_raw_obs(raw)
        return obs

    # ------------------------------------------------------------------------------ lazy images

    def _install_snapshot_sensors(self) -> None:
        """Replace each camera observable's sensor by one that copies the ``MjData`` at the substep where
        robosuite samples the camera (its own timing, untouched) and returns a blank frame of the same shape;
        ``_render_camera`` renders from that copy. Done once, when the env is built: this env resets softly
        (``hard_reset=False``), which keeps robosuite's observables and their sensors."""
        import mujoco

        model = self.sim.model._model
        observables = self._rs._observables
        for cam in self._cameras:
            obs = observables[f"{cam}_image"]
            original = obs._sensor
            blank = np.zeros((self.image_size, self.image_size, 3), np.uint8)
            snap = self._snapshots.setdefault(cam, {"data": mujoco.MjData(model), "generation": -1})
            snap["render"] = original

            def sensor(obs_cache, _snap=snap, _blank=blank):
                mujoco.mj_copyData(_snap["data"], self.sim.model._model, self.sim.data._data)
                _snap["generation"] = self._generation
                return _blank

            sensor.__modality__ = original.__modality__
            sensor._embodied_snapshot = True
            obs._sensor = sensor  # not set_sensor(): that would call the sensor to probe its shape
        self._snapshots["scratch"] = mujoco.MjData(model)

    def _render_camera(self, cam: str, generation: int) -> np.ndarray:
        """The raw (OpenGL-order) frame robosuite's sensor would have rendered for camera ``cam`` at the
        observation of ``generation``: the live ``MjData`` is set aside, the sampled copy put in its place,
        the original sensor run (robosuite's render, its corrupter and filter), and the live data put back."""
        import mujoco

        if generation != self._generation:
            raise RuntimeError(f"a lazy LIBERO observation's {cam} image was read after the env stepped on "
                               f"({self._generation - generation} step(s) / reset(s) later); read it before the "
                               "next step, or keep the array")
        snap = self._snapshots[cam]
        if snap["generation"] < 0:
            raise RuntimeError(f"robosuite has not sampled camera {cam} since the env was built; call reset()")
        # a step in which robosuite did not sample the camera keeps its last sample, as the eager observable does
        model, live, scratch = self.sim.model._model, self.sim.data._data, self._snapshots["scratch"]
        obs = self._rs._observables[f"{cam}_image"]
        if not getattr(obs._sensor, "_embodied_snapshot", False):  # a hard reset rebuilt it: the copy is stale
            raise RuntimeError(f"robosuite replaced the {cam} camera's sensor; lazy images need the env's soft reset")
        self._gl_current()
        mujoco.mj_copyData(scratch, model, live)
        mujoco.mj_copyData(live, model, snap["data"])
        try:
            frame = np.array(obs._filter(obs._corrupter(snap["render"]({}))))
        finally:
            mujoco.mj_copyData(live, model, scratch)
        return frame

    def _lazy_obs(self, raw: dict[str, np.ndarray]) -> LazyObservation:
        gen = self._generation
        cams = {f"{cam}_image": cam for cam in self._cameras}
        raw_lazy = LazyObservation({k: v for k, v in raw.items() if k not in cams},
                                   {k: (lambda c=c: self._render_camera(c, gen)) for k, c in cams.items()})
        self._raw_obs = raw_lazy
        lazy = {"image": lambda: np.ascontiguousarray(raw_lazy[f"{AGENT_CAMERA}_image"][::-1, ::-1])}
        if self.use_wrist_image:
            lazy["wrist_image"] = lambda: np.ascontiguousarray(raw_lazy[f"{WRIST_CAMERA}_image"][::-1, ::-1])
        return LazyObservation({"proprio": proprio_from_raw_obs(raw)}, lazy, order=["image", "wrist_image",
                                                                                     "proprio"])

    def _gl_current(self) -> None:
        """Make this env's GL context the current one. robosuite renders into whichever context is current
        and each env makes its own current only when it is built, so with two rendering envs in one process
        the older one would draw with the newer one's context (garbage frames) without this."""
        ctx = getattr(self._rs.sim, "_render_context_offscreen", None)
        if ctx is not None:
            ctx.gl_ctx.make_current()
            # robosuite leaves the scene's reflection flag on; it is this env's setting every time it renders
            ctx.scn.flags[_REFLECTION_FLAG] = int(self.render_reflections)

    def _set_render_samples(self, n: int) -> None:
        """Multisampling of the offscreen frames (the model's ``vis.quality.offsamples``; robosuite's XML has 4).

        On the CPU renderers these machines have (Mesa llvmpipe) 4x MSAA about doubles the cost of every
        camera frame (measured 0.19 -> 0.10 s per step with two 64 px cameras); without it edges alias a
        little (mean |difference| 4 / 255 at 64 px). The model keeps the value across resets (no hard reset);
        a render context that already exists is rebuilt with it.
        """
        if not 0 <= n <= 16:
            raise ConfigError(f"render_samples must be in 0..16, got {n}")
        quality = self._rs.sim.model._model.vis.quality
        if quality.offsamples == n:
            return
        quality.offsamples = n
        ctx = getattr(self._rs.sim, "_render_context_offscreen", None)
        if ctx is not None:  # robosuite's MjRenderContext: a new MjrContext reads offsamples from the model
            self._gl_current()
            ctx.con.free()
            ctx._set_mujoco_context_and_buffers()

    def _reset_libero(self, seed: int):
        """robosuite reset with seeded placement. LIBERO writes fixture poses (cabinets, stoves) into the
        *model* at every reset, outside the init state, drawing from robosuite samplers (``rng``
        attributes) and LIBERO region samplers (NumPy's global RNG); both are seeded here, and the
        global RNG's state is restored afterwards so callers see no side effect."""
        return seeded_robosuite_reset(self._rs, seed, self._libero.reset)

    def _bad_state_warnings(self) -> int:
        import mujoco

        warning = self.sim.data._data.warning if hasattr(self.sim.data, "_data") else self.sim.data.warning
        return sum(int(warning[getattr(mujoco.mjtWarning, w)].number) for w in _MJ_BAD_STATE_WARNINGS)

    def _divergence(self, warnings_before: int) -> str | None:
        """Why the physics is no longer trustworthy, or None. MuJoCo resets the state itself (and
        counts a warning) when it meets NaN / Inf / huge values, so both are checked."""
        data = self.sim.data
        for name in ("qpos", "qvel", "qacc"):
            if not np.all(np.isfinite(getattr(data, name))):
                return f"physics diverged: NaN or Inf in {name}"
        if self._bad_state_warnings() > warnings_before:
            return "physics diverged: MuJoCo found NaN / Inf / huge values and reset the state"
        return None


def eef_delta_from_raw_obs(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> np.ndarray:
    """(6,) float32 world-frame pose change between two robosuite observations: the ``robot0_eef_pos``
    difference (m), then the axis-angle (rad) of ``R_after @ R_before.T`` from ``robot0_eef_quat``.

    Taken from the observations (not the live sim) so that ``eef_delta[:3]`` is exactly the change of
    ``proprio[0:3]`` (LIBERO's ``ee_pos``); robosuite samples them one 2 ms substep before the step ends.
    """
    from scipy.spatial.transform import Rotation

    r0 = Rotation.from_quat(before["robot0_eef_quat"])  # (x, y, z, w), as robosuite and scipy both use
    r1 = Rotation.from_quat(after["robot0_eef_quat"])
    d_pos = np.asarray(after["robot0_eef_pos"]) - np.asarray(before["robot0_eef_pos"])
    return np.concatenate([d_pos, (r1 * r0.inv()).as_rotvec()]).astype(np.float32)


def proprio_from_raw_obs(raw: dict[str, np.ndarray]) -> np.ndarray:
    """``proprio`` (15,) float32 from a robosuite observation dict (layout: ``PROPRIO_LAYOUT``)."""
    return np.concatenate(
        [
            raw["robot0_eef_pos"],
            _axis_angle_from_quat_xyzw(raw["robot0_eef_quat"]),
            raw["robot0_gripper_qpos"],
            raw["robot0_joint_pos"],
        ]
    ).astype(np.float32)
