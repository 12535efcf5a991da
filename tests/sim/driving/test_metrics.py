"""Closed-loop metrics on hand-made episodes with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from sim.driving.metrics import (
    COMFORT_LIMITS,
    PENALTIES,
    EpisodeMetrics,
    EpisodeTracker,
    aggregate,
    episode_metrics,
    infraction_penalty,
)


def test_clean_completed_episode():
    m = episode_metrics([10.0] * 5, progress_m=50.0, route_length_m=50.0, dt=0.2, completed=True)
    assert m.route_completion == 1.0
    assert m.infraction_penalty == 1.0
    assert m.driving_score == 1.0
    assert m.success
    assert m.mean_speed_mps == 10.0
    assert m.mean_abs_jerk_mps3 == 0.0 and m.max_abs_jerk_mps3 == 0.0
    assert m.steps == 5


def test_partial_route_with_one_vehicle_collision():
    m = episode_metrics([5.0, 5.0], progress_m=30.0, route_length_m=120.0, dt=0.2, collisions_vehicle=1)
    assert m.route_completion == pytest.approx(0.25)
    assert m.infraction_penalty == pytest.approx(0.6)
    assert m.driving_score == pytest.approx(0.25 * 0.6)
    assert not m.success and m.collisions == 1


def test_penalties_multiply_over_events():
    assert infraction_penalty(2, 1, 1) == pytest.approx(0.6**2 * 0.65 * 0.7)
    assert infraction_penalty(1, 0, 0, 1) == pytest.approx(0.6 * 0.7)
    assert PENALTIES == {"collision_vehicle": 0.6, "collision_static": 0.65, "offroad": 0.7, "timeout": 0.7}
    with pytest.raises(ValueError, match="infraction counts"):
        infraction_penalty(-1)


def test_success_needs_no_infraction_and_completion_is_clipped():
    m = episode_metrics(
        [1.0], progress_m=130.0, route_length_m=100.0, dt=0.1, offroad_events=1, completed=True
    )
    assert m.route_completion == 1.0  # clipped
    assert m.driving_score == pytest.approx(0.7)
    assert not m.success
    assert episode_metrics([1.0], -5.0, 100.0, 0.1).route_completion == 0.0


def test_jerk_from_speed_second_difference():
    # speed 0, 1, 3, 6 with dt = 0.5: accel 2, 4, 6 -> jerk 4, 4 m/s^3
    m = episode_metrics([0.0, 1.0, 3.0, 6.0], progress_m=5.0, route_length_m=10.0, dt=0.5)
    assert m.mean_abs_jerk_mps3 == pytest.approx(4.0)
    assert m.max_abs_jerk_mps3 == pytest.approx(4.0)
    # accelerate then hold: accel 2 -> 0 within 0.5 s, jerk -4 m/s^3
    m = episode_metrics([0.0, 1.0, 1.0], progress_m=1.0, route_length_m=10.0, dt=0.5)
    assert m.max_abs_jerk_mps3 == pytest.approx(4.0)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="route_length_m"):
        episode_metrics([1.0], 1.0, 0.0, 0.1)
    with pytest.raises(ValueError, match="dt"):
        episode_metrics([1.0], 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="NaN"):
        episode_metrics([np.nan], 1.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="no episodes"):
        aggregate([])


def _info(speed, progress, crashed=False, offroad=False, success=False, collision_with="none", **extra):
    return {
        **extra,
        "speed": speed,
        "progress": progress,
        "route_length": 100.0,
        "crashed": crashed,
        "offroad": offroad,
        "success": success,
        "collision_with": collision_with,
    }


def test_tracker_counts_rising_edges():
    tr = EpisodeTracker(dt=0.2)
    tr.update(_info(10.0, 2.0))
    tr.update(_info(10.0, 4.0, crashed=True, collision_with="static"))
    tr.update(_info(0.0, 4.0, crashed=True, collision_with="static"))  # same event, still crashed
    tr.update(_info(0.0, 4.0, offroad=True))
    m = tr.result()
    assert (m.collisions_static, m.collisions_vehicle, m.offroad_events) == (1, 0, 1)
    assert m.progress_m == 4.0 and m.route_completion == pytest.approx(0.04)
    assert m.driving_score == pytest.approx(0.04 * 0.65 * 0.7)
    assert m.mean_speed_mps == pytest.approx(5.0)
    with pytest.raises(KeyError, match="progress"):
        tr.update({"speed": 1.0})


def test_aggregate_known_values():
    a = episode_metrics([10.0], 100.0, 100.0, 0.2, completed=True)  # DS 1, success
    b = episode_metrics([20.0], 50.0, 100.0, 0.2, collisions_vehicle=1)  # DS 0.3, crash
    agg = aggregate([a, b])
    assert agg["episodes"] == 2
    assert agg["driving_score"] == pytest.approx((1.0 + 0.3) / 2)
    assert agg["success_rate"] == 0.5
    assert agg["collision_rate"] == 0.5
    assert agg["offroad_rate"] == 0.0
    assert agg["route_completion"] == pytest.approx(0.75)
    assert agg["progress_m"] == pytest.approx(75.0)
    assert agg["mean_speed_mps"] == pytest.approx(15.0)
    assert a.to_dict()["driving_score"] == 1.0


def _run(infos, truncated_last=False, finite_route=False, dt=0.2, failure=None) -> EpisodeMetrics:
    tr = EpisodeTracker(dt=dt, finite_route=finite_route)
    for k, info in enumerate(infos):
        tr.update(info, truncated=truncated_last and k == len(infos) - 1)
    return tr.result(failure=failure)


def test_scripted_vehicle_collision_at_half_route():
    """Drive 50 of 100 m, hit a vehicle (stays crashed for two infos): score 0.5 x 0.6 = 0.3."""
    infos = [_info(10.0, 10.0 * k) for k in range(1, 5)] + [_info(0.0, 50.0, crashed=True, collision_with="vehicle")] * 2
    m = _run(infos)
    assert (m.collisions_vehicle, m.collisions_static, m.offroad_events) == (1, 0, 0)
    assert m.route_completion == pytest.approx(0.5)
    assert m.driving_score == pytest.approx(0.3)
    assert not m.success and not m.timed_out and m.failure is None


def test_scripted_offroad_and_return():
    infos = [_info(10.0, 20.0), _info(10.0, 40.0, offroad=True), _info(10.0, 60.0), _info(10.0, 80.0, offroad=True),
             _info(10.0, 100.0, success=True)]
    m = _run(infos)
    assert m.offroad_events == 2 and m.route_completion == 1.0
    assert m.driving_score == pytest.approx(0.7**2)
    assert not m.success  # completed, but with infractions


def test_scripted_timeout_on_finite_route_only():
    infos = [_info(5.0, 10.0 * k) for k in range(1, 6)]  # 50 m of 100 m when the horizon ends
    finite = _run(infos, truncated_last=True, finite_route=True)
    assert finite.timed_out and finite.driving_score == pytest.approx(0.5 * 0.7)
    assert finite.infraction_penalty == pytest.approx(0.7)
    open_ended = _run(infos, truncated_last=True, finite_route=False)
    assert not open_ended.timed_out and open_ended.driving_score == pytest.approx(0.5)
    not_truncated = _run(infos, truncated_last=False, finite_route=True)  # e.g. still running: no timeout
    assert not not_truncated.timed_out
    done = _run(infos[:-1] + [_info(5.0, 100.0, success=True)], truncated_last=True, finite_route=True)
    assert not done.timed_out and done.driving_score == 1.0 and done.success
    assert episode_metrics([1.0], 50.0, 100.0, 0.2, timed_out=True).driving_score == pytest.approx(0.35)


def test_failed_episode_scores_zero():
    infos = [_info(10.0, 50.0), _info(10.0, 100.0, success=True)]
    m = _run(infos, failure="step 1: policy raised RuntimeError: boom")
    assert m.failed and m.driving_score == 0.0 and not m.success
    assert m.route_completion == 1.0  # still measured
    sim_fail = _run([_info(10.0, 50.0, failure="non-finite action")])
    assert sim_fail.failure == "simulator failure: non-finite action" and sim_fail.driving_score == 0.0
    agg = aggregate([m, _run(infos)])
    assert agg["failure_rate"] == 0.5 and agg["driving_score"] == 0.5 and agg["success_rate"] == 0.5


def test_lateral_comfort_from_ego_delta():
    # 10 m/s, yaw change 0.02 rad per 0.2 s step = 0.1 rad/s -> lateral acceleration 1 m/s^2: comfortable
    infos = [_info(10.0, 2.0 * k, ego_delta=np.array([2.0, 0.0, 0.02])) for k in range(1, 6)]
    m = _run(infos)
    assert m.max_abs_yaw_rate_rps == pytest.approx(0.1) and m.max_abs_lat_acc_mps2 == pytest.approx(1.0)
    assert m.mean_abs_lat_acc_mps2 == pytest.approx(1.0) and m.comfortable
    # one swerve at 0.3 rad per step = 1.5 rad/s > 0.95 rad/s: not comfortable
    infos[2] = _info(10.0, 6.0, ego_delta=np.array([2.0, 0.3, 0.3]))
    m = _run(infos)
    assert m.max_abs_yaw_rate_rps == pytest.approx(1.5) and m.max_abs_lat_acc_mps2 == pytest.approx(15.0)
    assert not m.comfortable and COMFORT_LIMITS["yaw_rate_rps"] == 0.95
    # longitudinal jerk above 4.13 m/s^3 alone is uncomfortable too: speeds 0, 0, 1 at dt 0.2 -> 25 m/s^3
    assert not episode_metrics([0.0, 0.0, 1.0], 1.0, 10.0, 0.2).comfortable
    assert aggregate([m, _run(infos[:2])])["comfort_rate"] == 0.5
