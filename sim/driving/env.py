"""``DrivingEnv``: highway-env scenarios behind one continuous-control adapter (``sim.api`` contract).

Scenarios (``sim.driving.registration.SCENARIOS``): highway (highway-fast-v0), merge, roundabout,
intersection, racetrack; ids ``embodied/Drive-<Scenario>-v0``. Frames are defined in
``sim.driving.geometry`` (world: right-handed, yaw CCW; ego: x forward, y left).

Action: (2,) float32 ``[acceleration, steering]``.
    acceleration  [-6, 4] m/s^2, longitudinal; speed never goes below 0 (no reversing).
    steering      [-pi/4, pi/4] rad, front-wheel angle of highway-env's kinematic bicycle (wheelbase term
                  = half the 5 m car length), positive steers LEFT (counter-clockwise).
    Held for one policy period (``policy_frequency``, default 5 Hz); physics runs at the scenario's
    highway-env rate (5 Hz on highway-fast, 15 Hz elsewhere).

Observation (``gymnasium.spaces.Dict``):
    image      (H, W, 3) uint8 front camera, a perspective projection of the scene (``sim.driving.render``).
    bev        (6, Hb, Wb) uint8 ego-centred bird's-eye grid, channels ``render.BEV_CHANNELS``.
    ego_state  (9,) float32: x, y [m], yaw [rad] (world frame), speed [m/s], acceleration [m/s^2] and
               steering [rad] last applied, yaw rate [rad/s] over the last step, lateral offset from the
               current lane's centre [m, + = left], heading relative to that lane [rad, + = CCW].
    proprio    (4,) float32: speed, acceleration, steering, yaw rate (the pose-free part of ego_state).
    route      (K, 2) float32 target points along the route, ego frame [m]: the centreline of the ego's
               current lane (continuing along the route's roads) every ``route_spacing_m`` metres ahead.
    agents     (N, 8) float32, the N nearest other vehicles / obstacles (nearest first, zero rows if
               fewer): presence (0/1), x, y [m], vx, vy [m/s] (ego frame), relative yaw [rad], length,
               width [m].

Off-road: the ego's centre lies more than ``OFFROAD_MARGIN`` (1 m) outside every lane of the network
(the tolerance bridges gaps highway-env leaves between lanes at junctions, e.g. roundabout exits).
Episode end: ``terminated`` on a collision, on leaving the road (``terminate_offroad``), on reaching the
route's end (merge, roundabout, intersection) or on a simulator failure (NaN state: ``info["failure"]``,
not counted as a crash); ``truncated`` at ``horizon_s``. ``info["success"]``: the route's end reached
without crash / off-road, or for the open-ended highway and racetrack routes the horizon survived.

Reward: route progress per step over ``nominal_speed * dt`` clipped to [-1, 1], minus 10 on the step of a
collision or off-road.

Info (every reset and step): ``success``, ``eef_delta`` (6,) zeros, ``ego_delta`` (3,) float32 (dx, dy
[m], dyaw [rad] in the previous ego frame), ``crashed``, ``collision_with`` ("none" | "vehicle" |
"static"), ``offroad``, ``speed`` [m/s], ``progress`` [m along the route], ``route_length`` [m],
``route_completion`` [0, 1], ``time`` [s], and the expert's labels ``expert_action`` (2,),
``expert_waypoints`` (K, 2), ``meta_action`` (int), ``meta_action_name`` (``sim.driving.expert``).

Deviations from plain highway-env: the ego is a kinematic ``Vehicle`` driven by our continuous action at
5 Hz; highway-env's own reward / termination / observation are not used; the traffic of every scenario
uses private ``IDMVehicle`` subclasses because highway-env's intersection overwrites its traffic
class's IDM constants in place (which would otherwise change later highway episodes in the process).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from highway_env.envs.common.observation import ObservationType
from highway_env.vehicle.kinematics import Vehicle
from highway_env.vehicle.objects import Obstacle

from core.errors import ConfigError
from sim.api import INFO_EEF_DELTA, INFO_FAILURE, INFO_SUCCESS
from sim.driving.expert import (
    META_ACTIONS,
    ExpertPolicy,
    IDMMobilPlanner,
    Plan,
    PlannerIDMVehicle,
)
from sim.driving.geometry import (
    RoutePolyline,
    hw_pose_to_world,
    hw_to_ego,
    hw_vec_to_ego,
    lane_points_ahead,
    wrap_angle,
)
from sim.driving.registration import SCENARIOS, ScenarioSpec
from sim.driving.render import BEV_CHANNELS, SceneRasterizer

# pygame (highway-env's renderer) must never open a window; it reads this when a display is initialised.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

ACCEL_LIMITS = (-6.0, 4.0)  # [m/s^2]
STEER_LIMIT = float(np.pi / 4)  # [rad]
ACTION_DIM = 2  # (acceleration m/s^2, steering angle rad)
EMBODIMENT = "ego_car"
EGO_STATE_FIELDS = (
    "x",
    "y",
    "yaw",
    "speed",
    "acceleration",
    "steering",
    "yaw_rate",
    "lateral_offset",
    "heading_error",
)
PROPRIO_FIELDS = ("speed", "acceleration", "steering", "yaw_rate")
AGENT_FIELDS = ("presence", "x", "y", "vx", "vy", "yaw", "length", "width")
COLLISION_PENALTY_REWARD = 10.0
NEIGHBOUR_RADIUS_M = 50.0  # [m] the surrounding traffic whose speed Bench2Drive's efficiency compares with
OFFROAD_MARGIN = (
    1.0  # [m] beyond a lane's edge; bridges the gaps highway-env leaves between lanes at junctions
)


class TrafficIDMVehicle(PlannerIDMVehicle):
    """Traffic cars: highway-env's IDM + MOBIL with its default constants pinned (see module docstring)."""


class IntersectionTrafficIDMVehicle(PlannerIDMVehicle):
    """Traffic cars of the intersection (highway-env overwrites this class's IDM constants at each reset)."""


class EgoVehicle(Vehicle):
    """highway-env's kinematic ego that cannot reverse: braking stops at zero speed."""

    def step(self, dt: float) -> None:
        """Integrate one physics step, limiting braking so that the speed stays >= 0."""
        self.clip_actions()
        if not self.crashed and self.speed >= 0:
            self.action["acceleration"] = max(self.action["acceleration"], -self.speed / dt)
        super().step(dt)


class _NullObservation(ObservationType):
    """highway-env observation that costs nothing (the adapter builds its own observations)."""

    def space(self) -> spaces.Space:
        return spaces.Box(0.0, 0.0, shape=(0,), dtype=np.float32)

    def observe(self) -> np.ndarray:
        return np.zeros(0, dtype=np.float32)


class _AdapterMixin:
    """Strips highway-env's observation and reward from a scenario class (the adapter computes its own)."""

    def define_spaces(self) -> None:
        super().define_spaces()
        self.observation_type = _NullObservation(self)
        self.observation_space = self.observation_type.space()

    def _reward(self, action: Any) -> float:
        return 0.0

    def _rewards(self, action: Any) -> dict[str, float]:
        raise NotImplementedError  # highway-env's _info skips reward components on this


@functools.cache
def _adapted_class(path: str) -> type:
    module, name = path.split(":")
    base = getattr(__import__(module, fromlist=[name]), name)
    return type(f"Adapted{name}", (_AdapterMixin, base), {})


class DrivingEnv(gym.Env):
    """One highway-env scenario with a continuous-control ego; see the module docstring.

    Args:
        scenario: Key of ``SCENARIOS`` ("highway", "merge", "roundabout", "intersection", "racetrack").
        render_mode: None or "rgb_array" (``render()`` returns the front camera image).
        horizon_s: Episode length [s]; default the scenario's.
        policy_frequency: Actions per simulated second [Hz].
        image_size: (H, W) of ``image`` [px]; a single number N means (N, 2N) (a wide front camera).
        bev_size: (H, W) of ``bev`` [px].
        bev_m_per_px: BEV resolution [m / px].
        route_points: K, number of route target points.
        route_spacing_m: Spacing of the route points along the lane [m].
        n_agents: N, number of surrounding agents observed.
        n_waypoints: Number of expert waypoints.
        waypoint_dt: Time between expert waypoints [s].
        terminate_offroad: End the episode when the ego leaves the road.
        hw_config: Extra highway-env config entries for the scenario (e.g. ``{"vehicles_count": 10}``).
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 5}

    def __init__(
        self,
        scenario: str = "highway",
        render_mode: str | None = None,
        horizon_s: float | None = None,
        policy_frequency: int = 5,
        image_size: int | tuple[int, int] = (96, 192),
        bev_size: tuple[int, int] = (64, 64),
        bev_m_per_px: float = 1.0,
        route_points: int = 20,
        route_spacing_m: float = 3.0,
        n_agents: int = 8,
        n_waypoints: int = 6,
        waypoint_dt: float = 0.5,
        terminate_offroad: bool = True,
        hw_config: dict | None = None,
    ):
        if scenario not in SCENARIOS:
            raise ConfigError(f"driving scenario: unknown {scenario!r}; choose from {sorted(SCENARIOS)}")
        if render_mode not in (None, "rgb_array"):
            raise ConfigError(f"render_mode: {render_mode!r} not supported (None or 'rgb_array')")
        for key, value in (
            ("policy_frequency", policy_frequency),
            ("route_points", route_points),
            ("n_agents", n_agents),
            ("n_waypoints", n_waypoints),
        ):
            if int(value) < 1:
                raise ConfigError(f"{key}: must be >= 1, got {value}")
        for key, value in (
            ("route_spacing_m", route_spacing_m),
            ("waypoint_dt", waypoint_dt),
            ("bev_m_per_px", bev_m_per_px),
        ):
            if not value > 0:
                raise ConfigError(f"{key}: must be > 0, got {value}")
        self.spec_scenario: ScenarioSpec = SCENARIOS[scenario]
        self.scenario = scenario
        self.render_mode = render_mode
        self.horizon_s = float(horizon_s if horizon_s is not None else self.spec_scenario.horizon_s)
        if not self.horizon_s > 0:
            raise ConfigError(f"horizon_s: must be > 0, got {horizon_s}")
        self.policy_frequency = int(policy_frequency)
        self.dt = 1.0 / self.policy_frequency
        self.horizon_steps = max(int(round(self.horizon_s * self.policy_frequency)), 1)
        if isinstance(image_size, (int, np.integer)):  # one number, as for every other family: N -> (N, 2N)
            image_size = (int(image_size), 2 * int(image_size))
        self.image_size = tuple(int(v) for v in image_size)
        self.bev_size = tuple(int(v) for v in bev_size)
        self.bev_m_per_px = float(bev_m_per_px)
        self.route_points = int(route_points)
        self.route_spacing_m = float(route_spacing_m)
        self.n_agents = int(n_agents)
        self.n_waypoints = int(n_waypoints)
        self.waypoint_dt = float(waypoint_dt)
        self.terminate_offroad = bool(terminate_offroad)

        self.action_space = spaces.Box(
            low=np.array([ACCEL_LIMITS[0], -STEER_LIMIT], dtype=np.float32),
            high=np.array([ACCEL_LIMITS[1], STEER_LIMIT], dtype=np.float32),
            dtype=np.float32,
        )
        h, w = self.image_size
        f32 = functools.partial(spaces.Box, low=-np.inf, high=np.inf, dtype=np.float32)
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, shape=(h, w, 3), dtype=np.uint8),
                "bev": spaces.Box(0, 255, shape=(len(BEV_CHANNELS), *self.bev_size), dtype=np.uint8),
                "ego_state": f32(shape=(len(EGO_STATE_FIELDS),)),
                "proprio": f32(shape=(len(PROPRIO_FIELDS),)),
                "route": f32(shape=(self.route_points, 2)),
                "agents": f32(shape=(self.n_agents, len(AGENT_FIELDS))),
            }
        )
        self.metadata = {
            **type(self).metadata,
            "render_fps": self.policy_frequency,
            "family": "driving",
            "embodiment": EMBODIMENT,
            "task": scenario,
            "language_instruction": self.spec_scenario.instruction,
            "action_space_desc": {
                "dim": 2,
                "semantics": ["acceleration", "steering"],
                "units": ["m/s^2", "rad"],
                "frame": "ego (x forward, y left); steering > 0 turns left",
                "low": self.action_space.low.tolist(),
                "high": self.action_space.high.tolist(),
            },
            "ego_state_fields": list(EGO_STATE_FIELDS),
            "proprio_fields": list(PROPRIO_FIELDS),
            "agent_fields": list(AGENT_FIELDS),
            "bev_channels": list(BEV_CHANNELS),
            "bev_m_per_px": self.bev_m_per_px,
            "meta_actions": list(META_ACTIONS),
            "policy_frequency": self.policy_frequency,
        }

        config = {
            "action": {
                "type": "ContinuousAction",
                "acceleration_range": ACCEL_LIMITS,
                "steering_range": (-STEER_LIMIT, STEER_LIMIT),
                "longitudinal": True,
                "lateral": True,
                "clip": True,
            },
            "policy_frequency": self.policy_frequency,
            "duration": 1e9,  # the adapter truncates
            "offroad_terminal": False,
            "other_vehicles_type": f"{__name__}."
            + ("IntersectionTrafficIDMVehicle" if scenario == "intersection" else "TrafficIDMVehicle"),
            **self.spec_scenario.config,
            **(hw_config or {}),
        }
        self.hw = _adapted_class(self.spec_scenario.env_class)(config=config)
        if self.hw.config["simulation_frequency"] % self.policy_frequency:
            raise ConfigError(
                f"policy_frequency: {self.policy_frequency} Hz must divide the physics rate "
                f"{self.hw.config['simulation_frequency']} Hz of scenario {scenario!r}"
            )
        self.ego: Vehicle | None = None
        self._route: list | None = None
        self._planner: IDMMobilPlanner | None = None
        self._plan: Plan | None = None
        self._last_obs: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------ episode
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start an episode; ``seed`` is the only seeding (same seed -> same traffic and rollout)."""
        super().reset(seed=seed)
        self.hw.reset(seed=int(self.np_random.integers(2**31 - 1)))
        old = self.hw.vehicle
        ego = EgoVehicle(self.hw.road, old.position.copy(), old.heading, old.speed)
        self.hw.road.vehicles[next(i for i, v in enumerate(self.hw.road.vehicles) if v is old)] = ego
        self.hw.controlled_vehicles = [ego]
        self.ego = ego
        network = self.hw.road.network
        spec = self.spec_scenario
        if spec.destination is not None:
            path = network.shortest_path(ego.lane_index[1], spec.destination)
            self._route = [ego.lane_index] + [(path[i], path[i + 1], None) for i in range(len(path) - 1)]
        else:
            self._route = None
        s0, _ = ego.lane.local_coordinates(ego.position)
        if spec.open_ended:
            length = spec.nominal_speed * self.horizon_s
            self.polyline = RoutePolyline.from_lanes(network, ego.lane_index, s0, None, length + 50.0)
            self.polyline.length = min(length, self.polyline.s[-1])
        else:
            self.polyline = RoutePolyline.from_lanes(
                network, ego.lane_index, s0, self._route, 1e5, spec.goal_s
            )
        self.route_length = float(self.polyline.length)
        self._ref_speed = spec.nominal_speed or spec.expert_speed
        self._planner = IDMMobilPlanner(
            ego,
            self._route,
            spec.expert_speed,
            self.dt,
            self.action_space.low,
            self.action_space.high,
            self.n_waypoints,
            self.waypoint_dt,
            spec.yield_roads,
        )
        self._lanes = network.lanes_list()
        self.rasterizer = SceneRasterizer(
            network, self.bev_size, self.bev_m_per_px, image_size=self.image_size
        )
        self.steps = 0
        self.progress = 0.0
        self._last_action = np.zeros(2)
        self._yaw_rate = 0.0
        self._done = False
        self._plan = self._planner.plan()
        obs = self._observe()
        info = self._info(np.zeros(3), crashed=False, offroad=False, success=False)
        info.update(self._score_info(self.ego.position.copy(), crashed=False))
        return obs, info

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        """Apply ``[acceleration m/s^2, steering rad]`` for one policy period."""
        if self.ego is None:
            raise RuntimeError("DrivingEnv.step called before reset")
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (2,):
            raise ValueError(f"action: expected shape (2,) [acceleration, steering], got {action.shape}")
        ego = self.ego
        if not self._state_finite() or not np.isfinite(action).all():
            reason = (
                "non-finite action"
                if self._state_finite()
                else "simulator state diverged: NaN/inf in a vehicle state"
            )
            return self._fail(reason)
        action = np.clip(action, self.action_space.low, self.action_space.high)
        prev_pos, prev_heading = ego.position.copy(), float(ego.heading)
        low, high = self.action_space.low.astype(np.float64), self.action_space.high.astype(np.float64)
        # highway-env maps [-1, 1] linearly onto its ranges; its steering sign is + = right.
        hw_action = np.array(
            [
                2.0 * (action[0] - low[0]) / (high[0] - low[0]) - 1.0,
                -action[1] / STEER_LIMIT,
            ]
        )
        self.hw.step(hw_action)
        self.steps += 1
        if not self._state_finite():
            return self._fail("simulator state diverged: NaN/inf in a vehicle state after the physics step")
        self._last_action = action
        delta = hw_to_ego(ego.position, prev_pos, prev_heading)
        dyaw = float(wrap_angle(-(ego.heading - prev_heading)))
        self._yaw_rate = dyaw / self.dt
        prev_progress = self.progress
        self.progress = max(self.polyline.project(ego.position), 0.0)

        crashed = bool(ego.crashed)
        offroad = not any(lane.on_lane(ego.position, margin=OFFROAD_MARGIN) for lane in self._lanes)
        goal = (not self.spec_scenario.open_ended) and self.progress >= self.route_length - 0.5
        terminated = crashed or (offroad and self.terminate_offroad) or goal
        truncated = (not terminated) and self.steps >= self.horizon_steps
        success = (goal or (truncated and self.spec_scenario.open_ended)) and not crashed and not offroad
        reward = float(np.clip((self.progress - prev_progress) / (self._ref_speed * self.dt), -1.0, 1.0))
        if crashed or offroad:
            reward -= COLLISION_PENALTY_REWARD
        self._done = terminated or truncated
        self._plan = self._planner.plan()
        obs = self._observe()
        info = self._info(
            np.array([delta[0], delta[1], dyaw]), crashed=crashed, offroad=offroad, success=success
        )
        info.update(self._score_info(prev_pos, crashed))
        return obs, reward, terminated, truncated, info

    def _fail(self, reason: str) -> tuple[dict, float, bool, bool, dict]:
        """End the episode on a simulator failure: last valid observation, no crash counted."""
        self._done = True
        info = self._info(np.zeros(3), crashed=False, offroad=False, success=False, plan=False)
        info[INFO_FAILURE] = reason
        return {k: v.copy() for k, v in self._last_obs.items()}, 0.0, True, False, info

    def _state_finite(self) -> bool:
        for v in self.hw.road.vehicles:
            if not (np.isfinite(v.position).all() and np.isfinite(v.heading) and np.isfinite(v.speed)):
                return False
        return True

    # --------------------------------------------------------------- scores
    def _score_info(self, prev_pos: np.ndarray, crashed: bool) -> dict[str, Any]:
        """The per-step facts NAVSIM's and Bench2Drive's scores need (``sim.driving.pdm``, ``metrics``).

        ``collision_at_fault`` (on a collision: nuPlan's fault rule), ``ttc_violation``, ``oncoming_m`` (driven
        against the lane's direction this step), ``lane_offset_m`` / ``at_junction`` (lane keeping),
        ``neighbour_speed_mps`` (mean speed of the vehicles within ``NEIGHBOUR_RADIUS_M``, None if none: Bench2Drive's
        efficiency); at the first state of every ``pdm.SCENE_S`` scene (reset, then every 20 steps at 5 Hz) the
        privileged planner's 4 s look-ahead: ``reference_progress_m``, ``reference_offroad``,
        ``reference_oncoming_m``, ``reference_lane_violation`` (``reference_progress_m`` None on the other steps).
        """
        from sim.driving import pdm

        ego = self.ego
        boxes, _, objs = self._objects()
        ego_box = np.array([*ego.position, ego.heading, ego.LENGTH, ego.WIDTH])
        s_lane, lat = ego.lane.local_coordinates(ego.position)
        out: dict[str, Any] = {"lane_offset_m": float(abs(lat)), "at_junction": self._at_junction(ego.position)}
        out["oncoming_m"] = self._oncoming(prev_pos, ego.position)
        velocities = np.array([np.asarray(getattr(o, "velocity", (0.0, 0.0)), dtype=np.float64) for o in objs]
                              ).reshape(-1, 2)
        out["ttc_violation"] = bool(pdm.ttc_violation(ego_box, np.asarray(ego.velocity, dtype=np.float64), boxes,
                                                      velocities)) if len(objs) else False
        out["collision_at_fault"] = None
        if crashed and len(objs):
            near = int(np.argmin(np.linalg.norm(boxes[:, :2] - ego.position, axis=1)))
            rel = hw_to_ego(boxes[near, :2], ego.position, ego.heading)
            _, fault = pdm.collision_fault(float(ego.speed), rel, float(lat))
            out["collision_at_fault"] = bool(fault)
        moving = [o for o in self.hw.road.vehicles if o is not ego
                  and np.linalg.norm(o.position - ego.position) <= NEIGHBOUR_RADIUS_M]
        out["neighbour_speed_mps"] = float(np.mean([o.speed for o in moving])) if moving else None
        per = max(int(round(pdm.SCENE_S * self.policy_frequency)), 1)
        if self.steps % per == 0 and self._planner is not None:
            pts = self._planner.lookahead(pdm.SCENE_S)
            out["reference_progress_m"] = float(max(self.polyline.project(pts[-1]) - self.progress, 0.0))
            out["reference_offroad"] = bool(any(not any(lane.on_lane(p, margin=OFFROAD_MARGIN) for lane in self._lanes)
                                                for p in pts))
            path = np.concatenate([ego.position[None], pts])
            out["reference_oncoming_m"] = float(sum(self._oncoming(a, b) for a, b in zip(path[:-1], path[1:])))
            offsets = []
            for p in pts:
                lane = self.hw.road.network.get_lane(self.hw.road.network.get_closest_lane_index(p))
                offsets.append(abs(lane.local_coordinates(p)[1]))
            step = self._planner.waypoint_dt
            out["reference_lane_violation"] = pdm.lane_keeping(
                offsets, [self._at_junction(p) for p in pts], step) == 0.0
        else:  # None, not NaN: infos of equal states compare equal (gymnasium's determinism check)
            out["reference_progress_m"] = None
        return out

    def _at_junction(self, position_hw: np.ndarray) -> bool:
        radius = self.spec_scenario.junction_radius_m
        return bool(radius > 0 and np.linalg.norm(position_hw) <= radius)

    def _oncoming(self, a: np.ndarray, b: np.ndarray) -> float:
        """Distance from ``a`` to ``b`` driven against the direction of every lane that holds ``b`` [m]."""
        d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
        dist = float(np.linalg.norm(d))
        if dist < 1e-6:
            return 0.0
        along = []
        for lane in self._lanes:
            if lane.on_lane(b, margin=0.0):
                s, _ = lane.local_coordinates(b)
                h = lane.heading_at(s)
                along.append(float(d @ np.array([np.cos(h), np.sin(h)])))
        return float(-max(along)) if along and max(along) < 0 else 0.0

    # --------------------------------------------------------------- expert
    def expert_plan(self) -> Plan:
        """The privileged IDM + MOBIL plan for the current state (computed once per reset / step)."""
        if self._plan is None:
            raise RuntimeError("DrivingEnv.expert_plan called before reset")
        return self._plan

    def make_expert(self, noise: float = 0.0, seed: int | None = None) -> ExpertPolicy:
        """The privileged IDM + MOBIL expert (``sim.api.Policy``), optionally with Gaussian action noise."""
        return ExpertPolicy(self, noise=noise, seed=seed)

    def route_from_current(self) -> list | None:
        """The route from the ego's current road on (None when open-ended or the ego left the route)."""
        if self._route is None:
            return None
        roads = [tuple(r[:2]) for r in self._route]
        here = tuple(self.ego.lane_index[:2])
        return [self.ego.lane_index] + list(self._route[roads.index(here) + 1 :]) if here in roads else None

    # ---------------------------------------------------------- observation
    def _objects(self) -> tuple[np.ndarray, np.ndarray, list]:
        """Other vehicles and obstacles: (M, 5) boxes (x, y, heading, length, width) hw frame, static mask."""
        road = self.hw.road
        objs = [v for v in road.vehicles if v is not self.ego] + [o for o in road.objects if o.collidable]
        boxes = np.array(
            [[o.position[0], o.position[1], o.heading, o.LENGTH, o.WIDTH] for o in objs], dtype=np.float64
        ).reshape(-1, 5)
        static = np.array([isinstance(o, Obstacle) for o in objs], dtype=bool)
        return boxes, static, objs

    def _route_points(self) -> np.ndarray:
        ego = self.ego
        network = self.hw.road.network
        distances = self.route_spacing_m * np.arange(1, self.route_points + 1)
        route = self.route_from_current()
        if self._route is None or route is not None:
            s, _ = ego.lane.local_coordinates(ego.position)
            pts = lane_points_ahead(network, ego.lane_index, s, distances, route)
        else:  # off the planned roads: fall back to the reference polyline ahead of the projection
            s_ref = self.progress + distances
            pts = np.stack(
                [np.interp(s_ref, self.polyline.s, self.polyline.points[:, k]) for k in range(2)], -1
            )
        return hw_to_ego(pts, ego.position, ego.heading).astype(np.float32)

    def _observe(self) -> dict[str, np.ndarray]:
        ego = self.ego
        boxes, static, objs = self._objects()
        route = self._route_points()
        agents = np.zeros((self.n_agents, len(AGENT_FIELDS)), dtype=np.float32)
        if len(objs):
            rel = hw_to_ego(boxes[:, :2], ego.position, ego.heading)
            order = np.argsort(np.linalg.norm(rel, axis=1))[: self.n_agents]
            for row, k in enumerate(order):
                o = objs[k]
                vel = hw_vec_to_ego(np.asarray(o.velocity, dtype=np.float64), ego.heading)
                agents[row] = [
                    1.0,
                    rel[k, 0],
                    rel[k, 1],
                    vel[0],
                    vel[1],
                    wrap_angle(-(o.heading - ego.heading)),
                    o.LENGTH,
                    o.WIDTH,
                ]
        x, y, yaw = hw_pose_to_world(ego.position, ego.heading)
        s, lat_hw = ego.lane.local_coordinates(ego.position)
        heading_err = float(wrap_angle(-(ego.heading - ego.lane.heading_at(s))))
        acc, steer = float(self._last_action[0]), float(self._last_action[1])
        obs = {
            "image": self.rasterizer.camera(ego.position, ego.heading, boxes, static),
            "bev": self.rasterizer.bev(
                ego.position, ego.heading, boxes, static, route, (ego.LENGTH, ego.WIDTH)
            ),
            "ego_state": np.array(
                [x, y, yaw, ego.speed, acc, steer, self._yaw_rate, -lat_hw, heading_err], dtype=np.float32
            ),
            "proprio": np.array([ego.speed, acc, steer, self._yaw_rate], dtype=np.float32),
            "route": route,
            "agents": agents,
        }
        self._last_obs = obs
        return obs

    def _info(
        self, ego_delta: np.ndarray, crashed: bool, offroad: bool, success: bool, plan: bool = True
    ) -> dict:
        collision_with = "none"
        if crashed:
            near = [
                o
                for o in self.hw.road.objects
                if isinstance(o, Obstacle)
                and o.crashed
                and np.linalg.norm(o.position - self.ego.position) < 10
            ]
            collision_with = "static" if near else "vehicle"
        info = {
            INFO_SUCCESS: bool(success),
            INFO_EEF_DELTA: np.zeros(6, dtype=np.float32),
            "ego_delta": np.asarray(ego_delta, dtype=np.float32),
            "crashed": bool(crashed),
            "collision_with": collision_with,
            "offroad": bool(offroad),
            "speed": float(self.ego.speed) if np.isfinite(self.ego.speed) else 0.0,
            "progress": float(self.progress),
            "route_length": self.route_length,
            "route_completion": float(np.clip(self.progress / max(self.route_length, 1e-6), 0.0, 1.0)),
            "time": self.steps * self.dt,
        }
        p = self._plan if plan and self._plan is not None else None
        info["expert_action"] = p.action.copy() if p else np.zeros(2, dtype=np.float32)
        info["expert_waypoints"] = (
            p.waypoints.copy() if p else np.zeros((self.n_waypoints, 2), dtype=np.float32)
        )
        info["meta_action"] = p.meta_action if p else 0
        info["meta_action_name"] = META_ACTIONS[info["meta_action"]]
        return info

    def render(self) -> np.ndarray | None:
        """The front camera image (H, W, 3) uint8 when ``render_mode == "rgb_array"``."""
        if self.render_mode != "rgb_array" or self._last_obs is None:
            return None
        return self._last_obs["image"].copy()

    def close(self) -> None:
        """Release highway-env's resources."""
        self.hw.close()
