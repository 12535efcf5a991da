"""Privileged expert driver (highway-env's IDM + MOBIL driving the ego) and baseline policies.

The planner keeps a "ghost" ``IDMVehicle`` that mirrors the ego's pose and speed every step. highway-env's
own logic then decides for the ghost, exactly as for the traffic cars: ``follow_road`` (route
following), MOBIL (``change_lane_policy``: when to change lane) and IDM (acceleration, taking the
leader on both the current and the target lane while changing). During that call the ghost stands in
for the ego in ``road.vehicles`` so that neighbour queries see the real traffic but not the ego itself.

At a junction (intersection, roundabout: scenarios with ``yield_roads``) the expert adds privileged
conflict avoidance (``IDMMobilPlanner._junction_control``): every other vehicle is predicted at constant
speed along its own planned route, the ego along its route with a free-road IDM speed profile, each car
as three discs; ego and another car conflict where their discs come close with a time gap below 0.5 s
(``CROSSING_GAP_S`` / ``MERGING_GAP_S``). On the approach roads the ego yields (IDM behind a virtual
stopped car at the end of the approach, the stop line) while going on would conflict and it can still
stop there; past the stop line it is committed and only evades imminent conflicts (full acceleration or
full braking). A missed exit re-plans the route.

Measured with ``python -m sim.report --families driving --episodes 20`` (action noise 0.05), success rate
before -> after the junction control, seeds 0-19 | 100-119:
    highway       1.00 -> 1.00 | 1.00          merge      1.00 -> 1.00 | 1.00
    racetrack     1.00 -> 1.00 | 1.00
    roundabout    0.95 -> 0.90 | 0.60 -> 0.80  (crashes 0 -> 1 | 4 -> 0)
    intersection  0.85 -> 0.65 | 0.55 -> 0.65  (crashes 2 -> 1 | 6 -> 1)
The other failures are timeouts. Most follow a wreck: highway-env's traffic collides with itself inside
the junction (also when the ego brakes to a standstill at its start, e.g. intersection seeds 3, 4, 10,
12, 101, 102, 108; roundabout 103, 105, 108, 118) and the wrecks stay on the ego's route for the rest of
the episode. The rest is waiting for a gap in dense priority traffic (the intersection spawns a car
with probability 0.6 every policy step).

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
DISC_OFFSET = 1.6  # [m] rear / front disc centres from the car's centre (5 m x 2 m cars as three discs)


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


def _discs(positions: np.ndarray, headings: np.ndarray) -> np.ndarray:
    """Three disc centres (T, 3, 2) along each car's axis (rear, centre, front) for (T, 2) poses."""
    axis = np.stack([np.cos(headings), np.sin(headings)], axis=-1)[:, None, :]
    return positions[:, None, :] + np.array([-1.0, 0.0, 1.0])[None, :, None] * DISC_OFFSET * axis


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
    PREDICTION_DT = 0.2  # [s] time step of the junction conflict prediction
    PREDICTION_TIMES = np.arange(0.0, 6.0 + 1e-9, PREDICTION_DT)  # [s] its horizon: clear a junction
    PREDICTION_RADIUS = 80.0  # [m] other vehicles farther than this are not predicted
    HEADING_PROBE = 0.5  # [m] centreline step that gives a predicted heading
    DISC_RADIUS = 1.0  # [m] a car's half width
    DISC_MARGIN = 0.4  # [m] extra clearance between two cars' discs
    STATIC_DISC_MARGIN = 0.2  # [m] the same to a standing car (e.g. a wreck: its position is certain)
    STANDSTILL_SPEED = 0.1  # [m/s] below this a car counts as standing
    CROSSING_GAP_S = 0.5  # [s] time gap required where paths cross
    MERGING_GAP_S = 0.5  # [s] time gap required where paths merge (same direction)
    COMMIT_HORIZON_S = 3.0  # [s] past the stop line, only conflicts sooner than this are evaded
    STOP_DECEL = 5.0  # [m/s^2] the hardest braking the ego plans for a stop at the stop line

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

    # ------------------------------------------------------------------ junction control
    def _path_ahead(
        self, vehicle: Any, route: Sequence | None, travelled: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Centreline positions (T, 2) and headings (T,) of ``vehicle`` after travelling ``travelled`` [m].

        The vehicle follows its current lane, then ``route`` (``lane_points_ahead``); each heading is the
        direction of the centreline over the next ``HEADING_PROBE`` metres.
        """
        network = self.road.network
        s0, _ = network.get_lane(vehicle.lane_index).local_coordinates(vehicle.position)
        d = np.stack([travelled, travelled + self.HEADING_PROBE], axis=1).reshape(-1)
        pts = lane_points_ahead(network, vehicle.lane_index, s0, d, route).reshape(-1, 2, 2)
        step = pts[:, 1] - pts[:, 0]
        return pts[:, 0], np.arctan2(step[:, 1], step[:, 0])

    def _ego_profile(self, accel0: float | None) -> np.ndarray:
        """Ego distance travelled [m] at ``PREDICTION_TIMES``: free-road IDM (None) or a constant acceleration."""
        g = self.ghost
        lane = self.road.network.get_lane(self.ego.lane_index)
        v0 = min(self.cruise_speed, lane.speed_limit) if lane.speed_limit is not None else self.cruise_speed
        dt = self.PREDICTION_DT
        s, v = 0.0, float(self.ego.speed)
        out = np.zeros(len(self.PREDICTION_TIMES))
        for k in range(1, len(out)):
            a = idm_acceleration(g, v, v0, None, 0.0) if accel0 is None else accel0
            a = float(np.clip(a, self.low[0], self.high[0]))
            v_new = float(np.clip(v + a * dt, 0.0, max(v0, v)))
            s += 0.5 * (v + v_new) * dt
            v = v_new
            out[k] = s
        return out

    def _others(self) -> list[tuple[np.ndarray, np.ndarray, float]]:
        """Constant-speed predictions (positions, headings, disc margin) of the other vehicles.

        Each vehicle moves along its own planned route (privileged) at its current speed; crashed
        vehicles stay put. Vehicles on the ego's own lane (its leader and followers, handled by IDM)
        and vehicles farther than ``PREDICTION_RADIUS`` are left out.
        """
        e = self.ego
        out = []
        for v in self.road.vehicles:
            if v is e or v is self.ghost or np.linalg.norm(v.position - e.position) > self.PREDICTION_RADIUS:
                continue
            if v.lane_index == e.lane_index:
                continue
            speed = 0.0 if v.crashed else max(float(v.speed), 0.0)
            path = self._path_ahead(v, self._route_of(v), speed * self.PREDICTION_TIMES)
            out.append(
                (*path, self.DISC_MARGIN if speed > self.STANDSTILL_SPEED else self.STATIC_DISC_MARGIN)
            )
        return out

    def _route_of(self, vehicle: Any) -> list | None:
        """The route ``vehicle`` will follow from its current lane on (None: it follows the road).

        highway-env pops a route's head only when the vehicle's target lane ends, so the stored route may
        start at the current road, at the next one, or (after a lane change onto another lane of a
        roundabout) elsewhere: then the route is re-planned from here to the route's destination.
        """
        route = getattr(vehicle, "route", None)
        if not route:
            return None
        here = tuple(vehicle.lane_index[:2])
        roads = [tuple(r[:2]) for r in route]
        if here in roads:
            return [vehicle.lane_index] + list(route[roads.index(here) + 1 :])
        if route[0][0] == here[1]:
            return [vehicle.lane_index] + list(route)
        try:
            path = self.road.network.shortest_path(here[1], route[-1][1])
        except (KeyError, ValueError):
            return None
        return [vehicle.lane_index] + [(path[i], path[i + 1], None) for i in range(len(path) - 1)]

    def _first_conflict(self, ego_path: tuple[np.ndarray, np.ndarray], others: list) -> float:
        """Earliest predicted time [s] at which the ego's path conflicts with another vehicle (inf if none).

        Each car is three discs along its axis. Ego at time t_i and another car at t_j conflict when two
        of their discs come closer than ``2 * DISC_RADIUS + DISC_MARGIN`` and |t_i - t_j| is within the
        time gap required: ``CROSSING_GAP_S`` where their paths cross (headings > 30 deg apart),
        ``MERGING_GAP_S`` where they run the same way (merging into one lane).
        """
        times = self.PREDICTION_TIMES
        ep, eh = ego_path
        e_discs = _discs(ep, eh)  # (T, 3, 2)
        first = np.inf
        dt_pair = np.abs(times[:, None] - times[None, :])  # (T_ego, T_other)
        for op, oh, margin in others:
            o_discs = _discs(op, oh)
            d = np.linalg.norm(e_discs[:, None, :, None, :] - o_discs[None, :, None, :, :], axis=-1)
            close = (d < 2 * self.DISC_RADIUS + margin).any(axis=(2, 3))  # (T_ego, T_other)
            if not close.any():
                continue
            crossing = np.abs(np.angle(np.exp(1j * (eh[:, None] - oh[None, :])))) > np.radians(30.0)
            window = np.where(crossing, self.CROSSING_GAP_S, self.MERGING_GAP_S)
            hit = close & (dt_pair <= window + 1e-9)
            if hit.any():
                first = min(first, float(times[np.nonzero(hit.any(axis=1))[0][0]]))
        return first

    def _stop_line_distance(self) -> float | None:
        """Distance [m] from the ego's front bumper to the end of the approach roads (None past them)."""
        e = self.ego
        if tuple(e.lane_index[:2]) not in self._approach:
            return None
        network = self.road.network
        s, _ = e.lane.local_coordinates(e.position)
        dist = e.lane.length - s
        route = self.ghost.route or []
        roads = [tuple(r[:2]) for r in route]
        here = roads.index(tuple(e.lane_index[:2])) if tuple(e.lane_index[:2]) in roads else len(roads)
        for r in route[here + 1 :]:
            if tuple(r[:2]) not in self._approach:
                break
            dist += network.get_lane((r[0], r[1], 0)).length
        return dist - HALF_LENGTH

    def _junction_control(self, accel: float) -> tuple[float, float | None, float | None]:
        """Gap acceptance and conflict avoidance at a junction (roundabout, intersection).

        Args:
            accel: The ghost's IDM acceleration (route following behind its leader) [m/s^2].

        Returns:
            (acceleration, stop gap, constant acceleration): the acceleration to apply; when yielding at the
            stop line, the IDM gap [m] of the virtual stopped car there (else None); when a committed ego
            takes an evasive constant acceleration, that acceleration (else None).

        On the approach, the ego checks whether going on (free-road IDM) lets every other vehicle pass
        with the required time gap (``_first_conflict``: vehicles predicted at constant speed along their
        own routes). If not, and it can still stop before the end of the approach (the stop line, at
        most ``STOP_DECEL`` m/s^2), it yields: IDM behind a virtual stopped car at the stop line. Past the
        stop line (or too close to stop) it is committed: it keeps going when that is conflict-free,
        else takes the first conflict-free of full acceleration and full braking, else the option whose
        first conflict comes latest.
        """
        e, g = self.ego, self.ghost
        others = self._others()
        route = g.route

        def conflict(accel0: float | None) -> float:
            return self._first_conflict(self._path_ahead(e, route, self._ego_profile(accel0)), others)

        go = conflict(None)
        line = self._stop_line_distance()
        if line is not None and go < np.inf:
            # A gap that the ego clears only at full acceleration is still accepted.
            if conflict(float(self.high[0])) == np.inf:
                return min(float(self.high[0]), accel), None, float(self.high[0])
            # Room to stop before the line (a 1 m tolerance: a stopped ego waiting at the line).
            if e.speed**2 / (2.0 * self.STOP_DECEL) <= line + 1.0:
                gap = max(line, 0.0) + g.DISTANCE_WANTED - 1.0
                stop_accel = idm_acceleration(g, float(e.speed), max(self.cruise_speed, 1.0), gap, 0.0)
                return min(accel, stop_accel), gap, None
        if go > self.COMMIT_HORIZON_S:  # committed: only imminent conflicts call for evasion
            return accel, None, None
        options = [(go, accel, None)]
        for a in (float(self.high[0]), float(self.low[0])):
            t = conflict(a)
            if t > self.COMMIT_HORIZON_S:
                return (min(a, accel) if a > 0 else a), None, a
            options.append((t, a, a))
        t, a, const = max(options, key=lambda o: o[0])
        return (min(a, accel) if a > 0 else a), None, const

    def plan(self) -> Plan:
        """Decide for the current state (advances MOBIL's timer and target lane: call once per step)."""
        g, e, network = self.ghost, self.ego, self.road.network
        self._sync()
        with _standing_in(self.road.vehicles, e, g):
            g.target_speed = self.cruise_speed
            IDMVehicle.act(g)  # follow_road + MOBIL + IDM; writes g.action, g.target_lane_index
            accel = float(g.action["acceleration"])
            front, _ = self.road.neighbour_vehicles(g, g.target_lane_index)
        stop_gap = const_accel = None
        if self._approach:
            accel, stop_gap, const_accel = self._junction_control(accel)
        route = g.route
        steer_hw = pursuit_steering_hw(network, g.target_lane_index, route, e.position, e.heading, e.speed)
        action = np.clip(np.array([accel, -steer_hw]), self.low, self.high)
        self._rollout_args = (float(action[0]), front, stop_gap, const_accel)
        waypoints = self._rollout(*self._rollout_args)
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

    def lookahead(self, horizon_s: float) -> np.ndarray:
        """The last plan integrated for ``horizon_s`` seconds: (K, 2) highway-env-frame positions every
        ``waypoint_dt`` (non-reactive, like the waypoints; changes no planner state). Call after ``plan``."""
        if getattr(self, "_rollout_args", None) is None:
            raise RuntimeError("IDMMobilPlanner.lookahead called before plan")
        n = max(int(round(horizon_s / self.waypoint_dt)), 1)
        return self._rollout(*self._rollout_args, n_waypoints=n, ego_frame=False)

    def _rollout(
        self, accel0: float, front: Any, stop_gap: float | None = None, const_accel: float | None = None,
        n_waypoints: int | None = None, ego_frame: bool = True,
    ) -> np.ndarray:
        """Integrate the plan for K * waypoint_dt seconds; return ego-frame waypoints (K, 2) float32
        (``n_waypoints``: K, default the planner's; ``ego_frame=False``: highway-env-frame float64 positions).

        Args:
            accel0: The acceleration applied now [m/s^2].
            front: The leader on the target lane (followed at constant speed by the 1-D IDM) or None.
            stop_gap: When yielding at a stop line, the IDM gap [m] to the virtual stopped car there.
            const_accel: When the junction control takes an evasive constant acceleration, that value
                (held over the look-ahead instead of the IDM).
        """
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
        if stop_gap is not None and (gap is None or stop_gap < gap):
            gap, lead_speed = stop_gap, 0.0
        v0 = min(g.target_speed, lane.speed_limit) if lane.speed_limit is not None else g.target_speed
        n_sub = max(int(round(self.waypoint_dt / self.ROLLOUT_DT)), 1)
        dt = self.waypoint_dt / n_sub
        n_waypoints = self.n_waypoints if n_waypoints is None else int(n_waypoints)
        out = np.empty((n_waypoints, 2))
        accel = accel0
        for k in range(n_waypoints * n_sub):
            if k > 0:
                accel = (
                    const_accel
                    if const_accel is not None
                    else idm_acceleration(g, speed, v0, gap, lead_speed)
                )
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
        return hw_to_ego(out, e.position, e.heading).astype(np.float32) if ego_frame else out


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
