"""A waypoint-tracking controller: turns any waypoint policy's plan into the driving env's continuous action.

Input: a plan of ``n`` ego-frame waypoints (x forward, y left, metres) at ``t = wp_dt, 2 wp_dt, ... n wp_dt``
(AutoMoT's head and ``info["expert_waypoints"]`` of ``sim.driving.env``: six at 0.5 s) and the ego's speed
[m/s]. Output: ``[acceleration m/s^2, steering rad (+ = left)]`` float32 within ``sim.driving.env``'s
``ACCEL_LIMITS`` / ``STEER_LIMIT``, to be held for one policy period ``dt``.

Longitudinal: the plan's speed profile is read off the waypoint spacing: segment ``k`` (from waypoint
``k - 1`` to ``k``, the ego at the origin being waypoint 0) has mean speed ``|p_k - p_{k-1}| / wp_dt``,
assigned to its midpoint time ``(k - 1/2) wp_dt``. The target speed is that piecewise-linear profile at
``target_time`` (default ``wp_dt / 2``: the first segment's mean speed, the part of the plan the next
control period actually drives; clamped to the first / last segment outside the midpoints), and the
feed-forward acceleration ``kff`` times the profile's slope there (0 for a single waypoint). A PID on the
speed error adds to it; the integral uses conditional integration (it freezes while the command saturates
in the error's direction) and is clamped to ``integral_limit``. Stop command: when the whole plan is shorter
than ``stop_distance`` (the waypoints collapse onto the ego), the controller brakes to a standstill
(``-speed / dt``, at least ``stop_hold_decel``, within the limits), steers straight and clears the PID.

Lateral: pure pursuit on the polyline origin -> waypoints. The look-ahead point lies ``lookahead(speed)``
metres of arc length along it, extrapolated along the last segment when the plan is shorter. The default
``plan_lookahead_distance`` = ``clip(0.35 v + 1.5, 3, 25)`` m is shorter than the expert's lane-pursuit rule
(``sim.driving.expert.lookahead_distance``, ``clip(0.5 v + 2, 4, 25)``) because a plan already anticipates
the road; tracking ``info["expert_waypoints"]`` for 30 s / to the goal, 6 seeds each (seeds 0-5): highway,
merge, racetrack 6/6 success, roundabout 5/6 (the expert itself: 5/6, same crash); with the expert's rule
the roundabout drops to 2/6 (cutting inside the entry curves, off-road). The steering
angle puts highway-env's kinematic bicycle (reference point at the car's centre, ``beta = atan(tan(steer)
/ 2)``, yaw rate ``= v sin(beta) / wheelbase``, ``wheelbase`` = half the 5 m car length) on the circle
through that point tangent to its centre's velocity (``pursuit_steering``; the expert's
``pursuit_steering_hw`` uses the circle tangent to the heading; ``pursuit_steering`` says why we differ).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from sim.driving.env import ACCEL_LIMITS, STEER_LIMIT
from sim.driving.expert import HALF_LENGTH

__all__ = ["WaypointController", "plan_lookahead_distance", "pursuit_steering"]


def plan_lookahead_distance(speed: float) -> float:
    """Pure-pursuit look-ahead distance [m] along a plan for a speed [m/s]."""
    return float(np.clip(0.35 * speed + 1.5, 3.0, 25.0))


def pursuit_steering(target: np.ndarray, wheelbase: float = HALF_LENGTH) -> float:
    """Pure-pursuit steering angle [rad, + = left] towards an ego-frame point ``target`` (2,) [m].

    highway-env's bicycle is referenced at the car's centre, whose velocity points ``beta`` off the heading
    (``tan(steer) = 2 tan(beta)``) and which turns with curvature ``sin(beta) / wheelbase``. The circle through
    the origin, tangent to the *velocity* and through ``target`` = (x, y) at distance d, has curvature
    ``2 sin(alpha - beta) / d`` (alpha the target's bearing); equating the two gives the closed form
    ``beta = atan2(2 wheelbase y, d^2 + 2 wheelbase x)``. (The expert's ``pursuit_steering_hw`` takes the
    circle tangent to the heading instead, which over-steers by ``(d + 2 wheelbase) / d``: harmless when
    pursuing a fixed lane, but it makes a tracker of the expert's own (already anticipating) plans cut
    inside curves.)
    """
    lx, ly = float(target[0]), float(target[1])
    beta = math.atan2(2.0 * wheelbase * ly, lx * lx + ly * ly + 2.0 * wheelbase * lx)
    limit = 0.5 * math.pi - 1e-3  # a target behind the car: turn as hard as the bicycle allows
    return math.atan(2.0 * math.tan(min(max(beta, -limit), limit)))


class WaypointController:
    """PID speed + pure-pursuit steering tracker of ego-frame waypoint plans; see the module docstring.

    Args:
        dt: Control period [s] (the env's policy period, 0.2 s at 5 Hz).
        wp_dt: Time between the plan's waypoints [s] (the first waypoint is at ``wp_dt``).
        wheelbase: The bicycle's length term [m] (yaw rate = speed sin(beta) / wheelbase).
        kp: Proportional gain [1/s] on the speed error [m/s].
        ki: Integral gain [1/s^2].
        kd: Derivative gain [-].
        kff: Weight of the plan's own acceleration (feed-forward).
        integral_limit: Bound on the integrated speed error [m].
        target_time: Time into the plan at which the target speed is read [s]; None = ``wp_dt / 2``.
        lookahead: Look-ahead distance [m] as a function of speed [m/s].
        stop_distance: A plan whose polyline (from the ego) is shorter than this [m] is a stop command.
        stop_hold_decel: Deceleration held while stopped [m/s^2, > 0].
        accel_limits: (min, max) acceleration [m/s^2].
        steer_limit: Largest steering magnitude [rad].
    """

    def __init__(
        self,
        dt: float = 0.2,
        wp_dt: float = 0.5,
        wheelbase: float = HALF_LENGTH,
        kp: float = 1.5,
        ki: float = 0.1,
        kd: float = 0.0,
        kff: float = 1.0,
        integral_limit: float = 5.0,
        target_time: float | None = None,
        lookahead: Callable[[float], float] = plan_lookahead_distance,
        stop_distance: float = 1.0,
        stop_hold_decel: float = 1.0,
        accel_limits: tuple[float, float] = ACCEL_LIMITS,
        steer_limit: float = STEER_LIMIT,
    ) -> None:
        for name, value in (("dt", dt), ("wp_dt", wp_dt), ("wheelbase", wheelbase),
                            ("stop_hold_decel", stop_hold_decel), ("steer_limit", steer_limit)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name, value in (("kp", kp), ("ki", ki), ("kd", kd), ("kff", kff), ("integral_limit", integral_limit),
                            ("stop_distance", stop_distance)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        lo, hi = (float(a) for a in accel_limits)
        if not lo < 0 < hi:
            raise ValueError(f"accel_limits must be (min < 0, max > 0), got {accel_limits!r}")
        if target_time is not None and not (math.isfinite(target_time) and target_time >= 0):
            raise ValueError(f"target_time must be None or a finite number >= 0, got {target_time!r}")
        self.dt, self.wp_dt, self.wheelbase = float(dt), float(wp_dt), float(wheelbase)
        self.kp, self.ki, self.kd, self.kff = float(kp), float(ki), float(kd), float(kff)
        self.integral_limit = float(integral_limit)
        self.target_time = 0.5 * self.wp_dt if target_time is None else float(target_time)
        self.lookahead = lookahead
        self.stop_distance, self.stop_hold_decel = float(stop_distance), float(stop_hold_decel)
        self.accel_limits = (lo, hi)
        self.steer_limit = float(steer_limit)
        self.reset()

    def reset(self) -> None:
        """Clear the PID state (call at every episode start)."""
        self._integral = 0.0
        self._prev_error: float | None = None
        self.target_speed = 0.0  # the last call's target speed [m/s] (diagnostics)
        self.target_point = np.zeros(2)  # the last call's look-ahead point, ego frame [m] (diagnostics)

    # ------------------------------------------------------------------ plan geometry
    def plan_speed(self, waypoints: np.ndarray) -> tuple[float, float]:
        """(target speed [m/s], plan acceleration [m/s^2]) read off the waypoint spacing at ``target_time``."""
        pts = np.vstack([np.zeros((1, 2)), waypoints])
        speeds = np.linalg.norm(np.diff(pts, axis=0), axis=1) / self.wp_dt  # (n,) segment mean speeds
        times = (np.arange(len(speeds)) + 0.5) * self.wp_dt
        target = float(np.interp(self.target_time, times, speeds))
        if len(speeds) < 2:
            return target, 0.0
        k = int(np.clip(np.searchsorted(times, self.target_time) - 1, 0, len(speeds) - 2))
        return target, float((speeds[k + 1] - speeds[k]) / self.wp_dt)

    def lookahead_point(self, waypoints: np.ndarray, distance: float) -> np.ndarray:
        """The point ``distance`` metres of arc length along origin -> waypoints (extrapolated past the end)."""
        pts = np.vstack([np.zeros((1, 2)), waypoints])
        seg = np.diff(pts, axis=0)
        lengths = np.linalg.norm(seg, axis=1)
        cum = np.concatenate([[0.0], np.cumsum(lengths)])
        if distance < cum[-1]:
            i = int(np.searchsorted(cum, distance, side="right") - 1)
            return pts[i] + seg[i] * ((distance - cum[i]) / lengths[i])
        moving = np.nonzero(lengths > 1e-6)[0]
        if not len(moving):
            return pts[-1].copy()
        last = moving[-1]
        return pts[-1] + seg[last] / lengths[last] * (distance - cum[-1])

    # ------------------------------------------------------------------ control
    def __call__(self, waypoints: np.ndarray, speed: float) -> np.ndarray:
        """One control step.

        Args:
            waypoints: (n, 2) ego-frame plan [m] at ``wp_dt`` spacing, ``n >= 1``.
            speed: The ego's current speed [m/s].

        Returns:
            (2,) float32 ``[acceleration m/s^2, steering rad (+ = left)]`` within the limits.

        Raises:
            ValueError: On a wrong shape or a non-finite waypoint / speed.
        """
        wp = np.asarray(waypoints, dtype=np.float64)
        if wp.ndim != 2 or wp.shape[1] != 2 or wp.shape[0] < 1:
            raise ValueError(f"waypoints must have shape (n >= 1, 2), got {wp.shape}")
        if not np.isfinite(wp).all():
            raise ValueError("waypoints contain NaN / inf")
        speed = float(speed)
        if not math.isfinite(speed):
            raise ValueError(f"speed must be finite, got {speed!r}")
        speed = max(speed, 0.0)
        lo, hi = self.accel_limits

        plan_length = float(np.linalg.norm(np.diff(np.vstack([np.zeros((1, 2)), wp]), axis=0), axis=1).sum())
        if plan_length < self.stop_distance:  # stop command: brake to a standstill, straight
            self._integral, self._prev_error = 0.0, None
            self.target_speed, self.target_point = 0.0, np.zeros(2)
            accel = float(np.clip(min(-speed / self.dt, -self.stop_hold_decel), lo, hi))
            return np.array([accel, 0.0], dtype=np.float32)

        # Longitudinal: feed-forward + PID with conditional integration.
        target, plan_accel = self.plan_speed(wp)
        error = target - speed
        deriv = 0.0 if self._prev_error is None else (error - self._prev_error) / self.dt
        self._prev_error = error
        base = self.kff * plan_accel + self.kp * error + self.kd * deriv
        integral = float(np.clip(self._integral + error * self.dt, -self.integral_limit, self.integral_limit))
        raw = base + self.ki * integral
        if (raw > hi and error > 0) or (raw < lo and error < 0):
            raw = base + self.ki * self._integral  # saturated: don't wind the integral up further
        else:
            self._integral = integral
        accel = float(np.clip(raw, lo, hi))

        # Lateral: pure pursuit on the look-ahead point.
        point = self.lookahead_point(wp, float(self.lookahead(speed)))
        steer = float(np.clip(pursuit_steering(point, self.wheelbase), -self.steer_limit, self.steer_limit))
        self.target_speed, self.target_point = target, point
        return np.array([accel, steer], dtype=np.float32)
