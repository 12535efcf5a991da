"""Open-loop metrics: L2 at horizons and trajectory collisions on known cases; a round trip through a log."""

from __future__ import annotations

import numpy as np
import pytest

from driving.openloop import (
    boxes_overlap,
    evaluate_openloop,
    future_targets,
    l2_at_horizons,
    trajectory_collisions,
)


def _straight(speed=5.0, n=6, dt=0.5):
    return np.stack([speed * dt * np.arange(1, n + 1), np.zeros(n)], -1)


def test_l2_point_and_average_conventions():
    gt = _straight()
    pred = gt + np.stack([np.arange(1, 7), np.zeros(6)], -1)  # error k + 1 at point k: 1, 2, ..., 6 m
    out = l2_at_horizons(pred, gt)
    assert out["l2_1s"] == pytest.approx(2.0) and out["l2_2s"] == pytest.approx(4.0) and out["l2_3s"] == 6.0
    assert out["l2_avg_1s"] == pytest.approx(1.5)  # mean of 1, 2
    assert out["l2_avg_2s"] == pytest.approx(2.5)  # mean of 1..4
    assert out["l2_avg_3s"] == pytest.approx(3.5)
    assert out["l2_mean"] == pytest.approx(4.0) and out["l2_avg_mean"] == pytest.approx(2.5)
    # batch: a perfect sample halves every error; lateral errors count as Euclidean distance
    both = l2_at_horizons(np.stack([pred, gt]), np.stack([gt, gt]))
    assert both["l2_3s"] == pytest.approx(3.0)
    lat = l2_at_horizons(gt + np.array([3.0, 4.0]), gt)
    assert lat["l2_1s"] == pytest.approx(5.0) and lat["l2_avg_3s"] == pytest.approx(5.0)
    # masked ground truth: the second sample's last point is not counted
    valid = np.ones((2, 6), bool)
    valid[1, 5] = False
    masked = l2_at_horizons(np.stack([pred, pred]), np.stack([gt, gt]), valid=valid)
    assert masked["l2_3s"] == pytest.approx(6.0)
    with pytest.raises(ValueError, match="horizon"):
        l2_at_horizons(pred[:, :], gt, hz=2.0, horizons=(1.25,))
    with pytest.raises(ValueError, match="horizon"):
        l2_at_horizons(pred[:4], gt[:4])  # 4 points = 2 s: no 3 s point
    with pytest.raises(ValueError, match="must both be"):
        l2_at_horizons(pred, gt[:5])


def test_box_overlap_separating_axes():
    def box(x, y, yaw, ln, wd):
        c, s = np.cos(yaw), np.sin(yaw)
        local = np.array([[0.5, 0.5], [0.5, -0.5], [-0.5, -0.5], [-0.5, 0.5]]) * [ln, wd]
        return local @ np.array([[c, s], [-s, c]]) + [x, y]

    assert boxes_overlap(box(0, 0, 0, 5, 2), box(4.9, 0, 0, 5, 2))
    assert not boxes_overlap(box(0, 0, 0, 5, 2), box(5.1, 0, 0, 5, 2))
    # a 45-degree box whose bounding box overlaps but whose corner does not reach
    assert not boxes_overlap(box(0, 0, 0, 2, 2), box(2.3, 2.3, np.pi / 4, 2, 2))
    assert boxes_overlap(box(0, 0, 0, 2, 2), box(1.6, 1.6, np.pi / 4, 2, 2))


def test_trajectory_collisions_known_cases():
    traj = _straight()  # 2.5, 5, ..., 15 m ahead
    def agents(*rows):  # the same agents at every waypoint
        return np.repeat(np.asarray(rows, dtype=float)[None], 6, axis=0)

    assert trajectory_collisions(traj, agents([10.0, 0.0]))  # parked in the lane
    assert not trajectory_collisions(traj, agents([10.0, 2.1]))  # 0.1 m gap beside the lane (widths 2 m)
    assert trajectory_collisions(traj, agents([10.0, 1.9]))
    assert not trajectory_collisions(traj, agents([np.nan, 0.0], [30.0, 0.0]))  # absent / far
    # agent spans x 7.7..12.7; ego boxes (5 m) centred at 2.5, 5, ..., 15 m
    per = trajectory_collisions(traj, agents([10.2, 0.0]), per_step=True)
    assert per.tolist() == [False, False, True, True, True, True]
    per = trajectory_collisions(traj, agents([20.1, 0.0]), per_step=True)  # spans 17.6..22.6: never reached
    assert not per.any()
    # a lead car 8 m ahead moving at the ego's speed is never hit
    lead = np.stack([traj + [8.0, 0.0]], axis=1)
    assert not trajectory_collisions(traj, lead)
    # heading follows the trajectory: driving to the left (+y), the 5 m length lies along y
    left = traj[:, ::-1]
    side = agents([2.0, 10.0, 0.0, 1.0, 1.0])  # 1 x 1 m box 2 m to the right of the path
    assert not trajectory_collisions(left, side)
    assert trajectory_collisions(np.stack([left, traj]), np.stack([side, agents([10.0, 0.0, 0.0, 1.0, 1.0])])).tolist() \
        == [False, True]
    with pytest.raises(ValueError, match="last axis"):
        trajectory_collisions(traj, np.zeros((6, 1, 3)))


def test_future_targets_from_a_synthetic_log():
    dt, steps, speed = 0.2, 26, 5.0
    t = np.arange(steps) * dt
    ego = np.zeros((steps, 9))
    ego[:, 1] = speed * t  # driving north in the world frame
    ego[:, 2] = np.pi / 2
    agents = np.zeros((steps, 2, 8))
    agents[:, 0] = [1, 10.0, 0.0, 0, 0, 0, 5.0, 2.0]  # 10 m ahead at the same speed, every step
    wp, af, valid = future_targets(ego, agents, dt)
    assert valid.tolist() == [k * dt + 3.0 <= t[-1] + 1e-9 for k in range(steps)] and valid.sum() == 11
    np.testing.assert_allclose(wp[0], _straight(), atol=1e-5)
    np.testing.assert_allclose(wp[10], _straight(), atol=1e-5)
    assert af.shape == (steps, 6, 2, 5)
    np.testing.assert_allclose(af[0, 1], [[15.0, 0.0, 0.0, 5.0, 2.0], [np.nan] * 5], atol=1e-4)  # 1 s later
    np.testing.assert_allclose(af[0, 5, 0], [25.0, 0.0, 0.0, 5.0, 2.0], atol=1e-4)
    assert not trajectory_collisions(wp[valid], af[valid]).any()


def test_evaluate_openloop_on_a_recorded_log(tmp_path):
    from driving.evaluate import evaluate_policy

    evaluate_policy("idm", "highway", episodes=1, out=tmp_path, seed=1, video=False, progress=False,
                    env_kwargs={"horizon_s": 5.0})
    log = next((tmp_path / "highway").glob("*.hdf5"))
    from core.data.trajectories import TrajectoryFile

    with TrajectoryFile(log) as f:
        ego = np.concatenate([f.read("demo_0", "obs/ego_state"), f.read("demo_0", "next_obs/ego_state")[-1:]])
    wp, _, _ = future_targets(ego, None, 0.2)
    truth = {tuple(np.round(e[:2], 3)): w for e, w in zip(ego, wp)}

    def oracle(batch):
        assert batch["image"].shape[1:] == (96, 192, 3) and len(batch["language_instruction"]) == len(batch["ego_state"])
        return np.stack([truth[tuple(np.round(e[:2], 3))] for e in batch["ego_state"]])

    perfect = evaluate_openloop(oracle, log, batch_size=4)
    assert perfect["samples"] == 11  # 5 s at 5 Hz: steps 0..10 have 3 s of future
    assert perfect["l2_3s"] == pytest.approx(0.0, abs=1e-6) and perfect["l2_avg_mean"] == pytest.approx(0.0, abs=1e-6)
    assert perfect["gt_collision_rate"] == 0.0 and perfect["collision_rate"] == 0.0

    def constant_velocity(batch):
        v = batch["proprio"][:, 0]
        return np.stack([np.outer(v, 0.5 * np.arange(1, 7)), np.zeros((len(v), 6))], -1)

    cv = evaluate_openloop(constant_velocity, log, max_samples=6)
    assert cv["samples"] == 6
    assert 0 < cv["l2_1s"] < cv["l2_3s"] < 10.0 and cv["l2_avg_3s"] < cv["l2_3s"]

    def stand_still(batch):  # the car behind (if any) is ignored: only overlaps count
        return np.zeros((len(batch["proprio"]), 6, 2))

    assert evaluate_openloop(stand_still, log)["l2_3s"] > 50.0
    with pytest.raises(ValueError, match="predict returned shape"):
        evaluate_openloop(lambda b: np.zeros((1, 3, 2)), log)
