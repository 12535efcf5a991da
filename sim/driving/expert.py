"""Privileged expert driver (highway-env's IDM + MOBIL driving the ego) and baseline policies.

The planner keeps a "ghost" ``IDMVehicle`` that mirrors the ego's pose and speed every step. highway-env's
own logic then decides for the ghost, exactly as for the traffic cars: ``follow_road`` (route
following), MOBIL (``change_lane_policy``: when to change lane) and IDM (acceleration, taking the
leader on both the current and the target lane while changing). During that call the ghost stands in
for the ego in ``road.vehicles`` so that neighbour queries see the real traffic but not the ego itself.
On the approach to a junction (intersection, roundabout) the ghost also yields (target speed 0) when
highway-env's own conflict test (``RegulatedRoad.is_conflict_possible``) finds a conflict with a vehicle
that has priority (``IDMMobilPlanner._must_yield``); a missed exit re-plans the route.

Measured (20 episodes per scenario, seeds 1000-1019, default horizons; expert vs constant action [0, 0]):
    highway       success 1.00, crash 0.00, 670 m   vs  constant: crash 0.75, 453 m
    merge         success 1.00, crash 0.00          vs  constant: crash 1.00
    roundabout    success 0.85, crash 0.10          vs  constant: crash 0.60, off-road 0.40
    intersection  success 0.60, crash 0.40          vs  constant: crash 0.45, off-road 0.55
    racetrack     success 1.00, crash 0.00, 302 m   vs  constant: off-road 1.00

Continuous command (acceleration m/s^2, steering rad; ego-frame sign: positive steers LEFT):
    acceleration  the IDM acceleration, clipped to the action limits;
    steering      pure pursuit on the MOBIL-chosen target lane: look-ahead point at
                  ``clip(0.5 * speed + 2, 4, 25)`` m along the lane centreline (following the route), and
                  the steering angle that puts highway-env's kinematic bicycle (reference at the centre,
                  half-length 2.5 m) on the circle through it.

Labels logged every step (``info`` of ``DrivingEnv``):
    expert_waypoints  (K, 2) float32 ego-frame positions [m] at t = dt_w, 2 dt_w, ... K dt_w (default six at
                      0.5 s, i.e. 3 s at 2 Hz as in AutoMoT), from a look-ahead rollout of the plan: the same
                      pure pursuit on the target lane and a 1-D IDM behind the target lane's leader, the
                      leader moving at constant speed.
    meta_action       int index into ``META_ACTIONS`` (and its name), first match of:
                      change_left / change_right  the target lane is a different lane of the same road,
                                                  on the ego's left / right;
                      stop        speed < 1 m/s and planned acceleration <= 0.5 m/s^2;
                      slow_down   planned acceleration < -0.5 m/s^2;
                      accelerate  planned acceleration > +0.5 m/s^2;
                      keep_lane   otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from highway_env.road.regulation import RegulatedRoad
from highway_env.vehicle.behavior import IDMVehicle

from sim.driving.geometry import hw_to_ego, lane_points_ahead

if TYPE_CHECKING:
    from sim.driving.env import DrivingEnv

META_ACTIONS: tuple[str, ...] = (
    "keep_lane",
    "accelerate",
    "slow_down",
    "stop",
    "change_left",
    "change_right",
)
ACCEL_THRESHOLD = 0.5  # [m/s^2] planned acceleration that counts as accelerate / slow_down
STOP_SPEED = 1.0  # [m/s]
HALF_LENGTH = 2.5  # highway-env's Vehicle.LENGTH / 2 [m]


class PlannerIDMVehicle(IDMVehicle):
    """The ghost's class: IDM / MOBIL constants pinned to highway-env 1.12.1's defaults.

    Pinned here because highway-env's intersection scenario overwrites the class attributes of its traffic
    class in place; the traffic classes used by ``DrivingEnv`` are private subclasses for the same reason.
    """

    ACC_MAX = 6.0
    COMFORT_ACC_MAX = 3.0
    COMFORT_ACC_MIN = -5.0
    DISTANCE_WANTED = 5.0 + 5.0
    TIME_WANTED = 1.5
    DELTA = 4.0
    POLITENESS = 0.0
    LANE_CHANGE_MIN_ACC_GAIN = 0.2
    LANE_CHANGE_MAX_BRAKING_IMPOSED = 2.0
    LANE_CHANGE_DELAY = 1.0


@dataclass(frozen=True)
class Plan:
    """The expert's decision for the current state.

    Attributes:
        action: (2,) float32 [acceleration m/s^2, steering rad (+ = left)], within the action limits.
        waypoints: (K, 2) float32 future ego-frame positions [m].
        meta_action: Index into ``META_ACTIONS``.
    """

    action: np.ndarray
    waypoints: np.ndarray
    meta_action: int

    @property
    def meta_action_name(self) -> str:
        """The meta-action's label."""
        return META_ACTIONS[self.meta_action]


def lookahead_distance(speed: float) -> float:
    """Pure-pursuit look-ahead distance [m] for a speed [m/s]."""
    return float(np.clip(0.5 * speed + 2.0, 4.0, 25.0))


def pursuit_steering_hw(
    network: Any,
    lane_index: tuple,
    route: Sequence | None,
    position: np.ndarray,
    heading: float,
    speed: float,
) -> float:
    """Pure-pursuit steering angle in highway-env's sign convention (+ = towards +y_hw, i.e. right) [rad]."""
    lane = network.get_lane(lane_index)
    s, _ = lane.local_coordinates(position)
    ld = lookahead_distance(speed)
    target = lane_points_ahead(network, lane_index, s, [ld], route)[0]
    c, sn = np.cos(heading), np.sin(heading)
    d = target - position
    lx, ly = c * d[0] + sn * d[1], -sn * d[0] + c * d[1]
    dist = max(np.hypot(lx, ly), 1e-3)
    curvature = 2.0 * ly / dist**2  # = 2 sin(alpha) / dist
    beta = np.arcsin(np.clip(curvature * HALF_LENGTH, -1.0, 1.0))
    return float(np.arctan(2.0 * np.tan(beta)))


def idm_acceleration(
    v: IDMVehicle, speed: float, target_speed: float, gap: float | None, lead_speed: float
) -> float:
    """highway-env's IDM formula (same constants as ``v``) for a 1-D state [m, m/s -> m/s^2]."""
    acc = v.COMFORT_ACC_MAX * (1 - np.power(max(speed, 0.0) / max(abs(target_speed), 1e-2), v.DELTA))
    if gap is not None:
        ab = -v.COMFORT_ACC_MAX * v.COMFORT_ACC_MIN
        d_star = v.DISTANCE_WANTED + speed * v.TIME_WANTED + speed * (speed - lead_speed) / (2 * np.sqrt(ab))
        acc -= v.COMFORT_ACC_MAX * (d_star / max(gap, 1e-2)) ** 2
    return float(acc)


@contextlib.contextmanager
def _standing_in(vehicles: list, ego: Any, ghost: Any) -> Iterator[None]:
    """Temporarily replace ``ego`` by ``ghost`` in the road's vehicle list."""
    i = next(k for k, v in enumerate(vehicles) if v is ego)
    vehicles[i] = ghost
    try:
        yield
    finally:
        vehicles[i] = ego


class IDMMobilPlanner:
    """highway-env's IDM + MOBIL deciding for the ego; see the module docstring.

    Args:
        ego: The ego ``Vehicle`` (highway-env) driven by continuous actions.
        route: The ego's planned route (lane indices) or None to follow the road.
        target_speed: Desired cruise speed [m/s] (IDM clips it to the lane speed limit).
        dt: Policy period [s] (advances MOBIL's decision timer).
        action_low: (2,) lower action limits [m/s^2, rad].
        action_high: (2,) upper action limits.
        n_waypoints: Number of look-ahead waypoints K.
        waypoint_dt: Time between waypoints [s].
        yield_roads: Number of route roads (the approach) with gap acceptance before the junction.
    """

    ROLLOUT_DT = 0.1  # [s] integration step of the waypoint look-ahead

    def __init__(
        self,
        ego: Any,
        route: Sequence | None,
        target_speed: float,
        dt: float,
        action_low: np.ndarray,
        action_high: np.ndarray,
        n_waypoints: int = 6,
        waypoint_dt: float = 0.5,
        yield_roads: int = 0,
    ):
        self.ego = ego
        self.road = ego.road
        self.dt = float(dt)
        self.low = np.asarray(action_low, dtype=np.float64)
        self.high = np.asarray(action_high, dtype=np.float64)
        self.n_waypoints = int(n_waypoints)
        self.waypoint_dt = float(waypoint_dt)
        self.cruise_speed = float(target_speed)
        self.destination = route[-1][1] if route else None
        self._approach = {tuple(r[:2]) for r in route[:yield_roads]} if route else set()
        self.ghost = PlannerIDMVehicle(
            self.road,
            ego.position.copy(),
            heading=ego.heading,
            speed=ego.speed,
            target_lane_index=ego.lane_index,
            target_speed=target_speed,
            route=list(route) if route else None,
        )
        self._first = True

    def _sync(self) -> None:
        g, e = self.ghost, self.ego
        g.position = e.position.copy()
        g.heading, g.speed = e.heading, e.speed
        g.lane_index, g.lane = e.lane_index, e.lane
        if not self._first:
            g.timer += self.dt
        self._first = False
        # Another policy may have driven the ego away from the planned lane: re-plan from where it is.
        target = self.road.network.get_lane(g.target_lane_index)
        s, lat = target.local_coordinates(g.position)
        if abs(lat) > 2.0 * target.width_at(s) or not -10.0 < s < target.length + 10.0:
            g.target_lane_index = e.lane_index
        # Off the planned roads (e.g. an exit missed): re-plan the route to the destination from here.
        if g.route and tuple(g.target_lane_index[:2]) not in {tuple(r[:2]) for r in g.route}:
            try:
                path = self.road.network.shortest_path(e.lane_index[1], self.destination)
            except KeyError:
                path = []
            g.route = [e.lane_index] + [(path[i], path[i + 1], None) for i in range(len(path) - 1)]
            g.target_lane_index = e.lane_index

    def _must_yield(self) -> bool:
        """Gap acceptance on the approach roads, before entering the junction.

        While the ego is on one of the route's first ``yield_roads`` roads, the ghost yields when
        highway-env's conflict test (``RegulatedRoad.is_conflict_possible``), run as if it went on at
        ``max(speed, 0.8 * cruise)``, finds a conflict with a vehicle ahead of or beside it that has
        priority: by ``RegulatedRoad.respect_priorities`` on a regulated road (intersection), else any
        vehicle already past the approach (roundabout: circulating traffic). Past the approach it is
        committed.
        """
        g, e = self.ghost, self.ego
        if tuple(e.lane_index[:2]) not in self._approach:
            return False
        regulated = isinstance(self.road, RegulatedRoad)
        speed = g.speed
        g.speed = max(speed, 0.8 * self.cruise_speed)
        try:
            for v in self.road.vehicles:
                if v is g or np.linalg.norm(v.position - g.position) > 40.0 or g.front_distance_to(v) < -1.0:
                    continue
                try:
                    conflict = RegulatedRoad.is_conflict_possible(g, v)
                except (IndexError, KeyError):  # highway-env's route prediction fails across lane counts
                    conflict = False
                if not conflict:
                    continue
                if (
                    RegulatedRoad.respect_priorities(g, v) is g
                    if regulated
                    else tuple(v.lane_index[:2]) not in self._approach
                ):
                    return True
        finally:
            g.speed = speed
        return False

    def plan(self) -> Plan:
        """Decide for the current state (advances MOBIL's timer and target lane: call once per step)."""
        g, e, network = self.ghost, self.ego, self.road.network
        self._sync()
        with _standing_in(self.road.vehicles, e, g):
            yielding = self._must_yield()
            g.target_speed = 0.0 if yielding else self.cruise_speed
            IDMVehicle.act(g)  # follow_road + MOBIL + IDM; writes g.action, g.target_lane_index
            accel = float(g.action["acceleration"])
            front, _ = self.road.neighbour_vehicles(g, g.target_lane_index)
        route = g.route
        steer_hw = pursuit_steering_hw(network, g.target_lane_index, route, e.position, e.heading, e.speed)
        action = np.clip(np.array([accel, -steer_hw]), self.low, self.high)
        waypoints = self._rollout(float(action[0]), front)
        return Plan(action.astype(np.float32), waypoints, self._meta_action(float(action[0])))

    def _meta_action(self, accel: float) -> int:
        g, e = self.ghost, self.ego
        if tuple(g.target_lane_index[:2]) == tuple(e.lane_index[:2]) and g.target_lane_index != e.lane_index:
            _, lat_hw = self.road.network.get_lane(g.target_lane_index).local_coordinates(e.position)
            return META_ACTIONS.index("change_left" if lat_hw > 0 else "change_right")
        if e.speed < STOP_SPEED and accel <= ACCEL_THRESHOLD:
            return META_ACTIONS.index("stop")
        if accel < -ACCEL_THRESHOLD:
            return META_ACTIONS.index("slow_down")
        if accel > ACCEL_THRESHOLD:
            return META_ACTIONS.index("accelerate")
        return META_ACTIONS.index("keep_lane")

    def _rollout(self, accel0: float, front: Any) -> np.ndarray:
        """Integrate the plan for K * waypoint_dt seconds; return ego-frame waypoints (K, 2) float32."""
        g, e, network = self.ghost, self.ego, self.road.network
        lane_index = g.target_lane_index
        route = list(g.route) if g.route else None
        lane = network.get_lane(lane_index)
        pos, heading, speed = e.position.copy(), float(e.heading), float(e.speed)
        gap = None  # centre-to-centre distance to the leader along the lane, as highway-env's IDM uses [m]
        lead_speed = 0.0
        if front is not None:
            gap = lane.local_coordinates(front.position)[0] - lane.local_coordinates(pos)[0]
            lead_speed = float(getattr(front, "speed", 0.0) * np.cos(front.heading - heading))
        v0 = min(g.target_speed, lane.speed_limit) if lane.speed_limit is not None else g.target_speed
        n_sub = max(int(round(self.waypoint_dt / self.ROLLOUT_DT)), 1)
        dt = self.waypoint_dt / n_sub
        out = np.empty((self.n_waypoints, 2))
        accel = accel0
        for k in range(self.n_waypoints * n_sub):
            if k > 0:
                accel = idm_acceleration(g, speed, v0, gap, lead_speed)
            accel = float(np.clip(accel, self.low[0], self.high[0]))
            steer = -float(
                np.clip(
                    -pursuit_steering_hw(network, lane_index, route, pos, heading, speed),
                    self.low[1],
                    self.high[1],
                )
            )
            beta = np.arctan(0.5 * np.tan(steer))
            pos = pos + speed * np.array([np.cos(heading + beta), np.sin(heading + beta)]) * dt
            heading += speed * np.sin(beta) / HALF_LENGTH * dt
            new_speed = max(speed + accel * dt, 0.0)
            if gap is not None:
                gap += (lead_speed - 0.5 * (speed + new_speed)) * dt
            speed = new_speed
            s, _ = lane.local_coordinates(pos)
            if s > lane.length:  # continue on the next lane of the route
                nxt = network.next_lane(lane_index, route=route, position=pos)
                if nxt != lane_index:
                    lane_index, lane = nxt, network.get_lane(nxt)
            if (k + 1) % n_sub == 0:
                out[(k + 1) // n_sub - 1] = pos
        return hw_to_ego(out, e.position, e.heading).astype(np.float32)


class ExpertPolicy:
    """The privileged IDM + MOBIL expert as a ``sim.api.Policy``: it plays the env's current plan.

    Args:
        env: The unwrapped ``DrivingEnv`` (the expert reads its privileged planner).
        noise: Std of Gaussian noise added to each action dim, as a fraction of that dim's half range.
        seed: Seed of the noise generator (``reset(seed)`` re-seeds it).
    """

    def __init__(self, env: DrivingEnv, noise: float = 0.0, seed: int | None = None):
        if noise < 0:
            raise ValueError(f"expert noise must be >= 0, got {noise}")
        self.env = env
        self.noise = float(noise)
        self._rng = np.random.default_rng(seed)
        space = env.action_space
        self._low, self._high = space.low.astype(np.float64), space.high.astype(np.float64)

    def reset(self, seed: int | None = None) -> None:
        """Re-seed the noise generator."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """The expert's action for the env's current state (``obs`` / ``info`` are not needed)."""
        action = self.env.expert_plan().action.astype(np.float64)
        if self.noise > 0:
            action = action + self._rng.normal(size=action.shape) * self.noise * (self._high - self._low) / 2
        return np.clip(action, self._low, self._high).astype(np.float32)


class ConstantActionPolicy:
    """Always the same action (e.g. ``[0, 0]``: hold speed, wheels straight) — the open-loop baseline."""

    def __init__(self, action: Sequence[float] = (0.0, 0.0)):
        self.action = np.asarray(action, dtype=np.float32)

    def reset(self, seed: int | None = None) -> None:
        """Nothing to reset."""

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """Return the constant action."""
        return self.action.copy()


class LaneKeepingPolicy:
    """Keep-lane constant-speed baseline: zero acceleration, pure pursuit on the ego's current lane.

    Privileged (reads the lane geometry), never changes lane or brakes — AutoMoT's "constant" baseline.

    Args:
        env: The unwrapped ``DrivingEnv``.
    """

    def __init__(self, env: DrivingEnv):
        self.env = env

    def reset(self, seed: int | None = None) -> None:
        """Nothing to reset."""

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """Zero acceleration and the pure-pursuit steering on the current lane, following the route."""
        ego = self.env.ego
        steer_hw = pursuit_steering_hw(
            ego.road.network,
            ego.lane_index,
            self.env.route_from_current(),
            ego.position,
            ego.heading,
            ego.speed,
        )
        space = self.env.action_space
        return np.clip(np.array([0.0, -steer_hw]), space.low, space.high).astype(np.float32)
