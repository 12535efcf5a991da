"""The waypoint-tracking controller: a kinematic bicycle in the test, and closed loop in the highway env."""

from __future__ import annotations

import math

import numpy as np
import pytest

from driving.controller import WaypointController, pursuit_steering
from sim.driving.env import ACCEL_LIMITS, STEER_LIMIT

HALF_LENGTH = 2.5  # highway-env: the car is 5 m long, its bicycle's length term is half that


class Bicycle:
    """highway-env's kinematic bicycle (``Vehicle.step``), reference at the centre, world frame y left."""

    def __init__(self, x: float = 0.0, y: float = 0.0, yaw: float = 0.0, speed: float = 0.0):
        self.x, self.y, self.yaw, self.speed = x, y, yaw, speed

    def step(self, action: np.ndarray, dt: float) -> None:
        accel = float(np.clip(action[0], *ACCEL_LIMITS))
        steer = float(np.clip(action[1], -STEER_LIMIT, STEER_LIMIT))
        beta = math.atan(0.5 * math.tan(steer))
        self.x += self.speed * math.cos(self.yaw + beta) * dt
        self.y += self.speed * math.sin(self.yaw + beta) * dt
        self.yaw += self.speed * math.sin(beta) / HALF_LENGTH * dt
        self.speed = max(self.speed + accel * dt, 0.0)

    def to_ego(self, pts: np.ndarray) -> np.ndarray:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        d = pts - np.array([self.x, self.y])
        return np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]], axis=1)


def _lane_plan(car: Bicycle, speed: float, n: int = 6, wp_dt: float = 0.5) -> np.ndarray:
    """Waypoints along the world line y = 0 ahead of the car at ``speed``, ego frame."""
    xs = car.x + speed * wp_dt * np.arange(1, n + 1)
    return car.to_ego(np.stack([xs, np.zeros(n)], axis=1))


def test_converges_to_the_lane_from_a_lateral_offset():
    car = Bicycle(y=1.5, speed=15.0)
    ctrl = WaypointController()
    ys = []
    for _ in range(75):  # 15 s
        car.step(ctrl(_lane_plan(car, 15.0), car.speed), 0.2)
        ys.append(car.y)
    assert abs(ys[-1]) < 0.2 and max(abs(y) for y in ys[-25:]) < 0.2, ys[-25:]
    assert min(ys) > -0.5  # no big overshoot to the other side
    assert abs(car.speed - 15.0) < 0.5


def test_reaches_target_speed_without_overshoot():
    car = Bicycle(speed=10.0)
    ctrl = WaypointController()
    speeds = []
    for _ in range(50):  # 10 s
        car.step(ctrl(_lane_plan(car, 20.0), car.speed), 0.2)
        speeds.append(car.speed)
    reach = next(i for i, v in enumerate(speeds) if v >= 19.0)
    assert (reach + 1) * 0.2 <= 5.0, speeds
    assert max(speeds) <= 22.0, max(speeds)
    assert abs(speeds[-1] - 20.0) < 0.3


def test_decelerating_plan_slows_down():
    car = Bicycle(speed=20.0)
    ctrl = WaypointController()
    for _ in range(50):
        car.step(ctrl(_lane_plan(car, 8.0), car.speed), 0.2)
    assert abs(car.speed - 8.0) < 0.5


def test_all_zero_plan_brakes_to_a_stop_straight():
    ctrl = WaypointController()
    action = ctrl(np.zeros((6, 2)), 12.0)
    assert action.dtype == np.float32 and action.shape == (2,)
    assert action[0] == pytest.approx(ACCEL_LIMITS[0]) and action[1] == 0.0
    car = Bicycle(speed=12.0)
    for _ in range(20):
        car.step(ctrl(np.zeros((6, 2)), car.speed), 0.2)
    assert car.speed == 0.0 and abs(car.y) < 1e-9
    assert ctrl(np.zeros((6, 2)), 0.0)[0] < 0  # holds the brake at standstill


def test_bad_inputs():
    ctrl = WaypointController()
    wp = np.tile([[5.0, 0.0]], (6, 1)) * np.arange(1, 7)[:, None]
    bad = wp.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ctrl(bad, 10.0)
    with pytest.raises(ValueError, match="speed"):
        ctrl(wp, float("nan"))
    with pytest.raises(ValueError, match="shape"):
        ctrl(wp.reshape(-1), 10.0)
    with pytest.raises(ValueError, match="dt"):
        WaypointController(dt=0.0)
    single = ctrl(wp[:1], 10.0)  # one waypoint is enough
    assert np.isfinite(single).all()


def test_steering_sign_and_limits():
    assert pursuit_steering(np.array([10.0, 2.0])) > 0  # target on the left -> steer left
    assert pursuit_steering(np.array([10.0, -2.0])) < 0
    assert pursuit_steering(np.array([10.0, 0.0])) == 0.0
    # Holding the steering, highway-env's bicycle passes through the pursued point.
    for target in ([8.0, 1.5], [12.0, -3.0], [5.0, 4.0]):
        steer = pursuit_steering(np.array(target))
        car = Bicycle(speed=1.0)
        path = []
        for _ in range(4000):
            car.step(np.array([0.0, steer]), 0.005)
            path.append((car.x, car.y))
        assert np.linalg.norm(np.array(path) - np.array(target), axis=1).min() < 0.02, target
    ctrl = WaypointController()
    action = ctrl(np.array([[0.5, 3.0], [0.5, 6.0]]), 2.0)  # hard left, behind the look-ahead
    assert 0 < action[1] <= np.float32(STEER_LIMIT)  # the env's float32 action-space bound


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_loop_highway_tracks_the_expert_plan(seed):
    gym = pytest.importorskip("gymnasium")
    import sim

    sim.register_envs()
    env = gym.make("embodied/Drive-Highway-v0")
    try:
        obs, info = env.reset(seed=seed)
        ctrl = WaypointController(dt=env.unwrapped.dt, wp_dt=env.unwrapped.waypoint_dt)
        start = info["progress"]
        for _ in range(60):
            action = ctrl(info["expert_waypoints"], info["speed"])
            obs, _, terminated, truncated, info = env.step(action)
            assert not info["crashed"] and not info["offroad"], (seed, info["time"])
            if terminated or truncated:
                break
        assert abs(obs["ego_state"][7]) < 2.0  # near a lane centre
        assert info["progress"] - start > 60 * 0.2 * 15.0  # kept a highway pace (> 15 m/s on average)
    finally:
        env.close()
