"""Closed-loop metrics on hand-made episodes with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from sim.driving.metrics import PENALTIES, EpisodeTracker, aggregate, episode_metrics, infraction_penalty


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
    assert PENALTIES == {"collision_vehicle": 0.6, "collision_static": 0.65, "offroad": 0.7}
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


def _info(speed, progress, crashed=False, offroad=False, success=False, collision_with="none"):
    return {
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
