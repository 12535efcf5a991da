"""The privileged expert's junction control: episodes where the plain IDM + MOBIL expert crashed now succeed.

Each seed below crashed with the expert before ``IDMMobilPlanner._junction_control`` (intersection: the
ego turning left into oncoming or crossing traffic; roundabout: entering in front of circulating cars).
Episodes run as ``sim.report`` runs them: env and expert noise (0.05) seeded with the episode seed.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from sim.driving.registration import SCENARIOS, register

register()


def _episode(scenario: str, seed: int) -> dict:
    env = gym.make(SCENARIOS[scenario].env_id, image_size=(8, 16), bev_size=(8, 8)).unwrapped
    try:
        obs, info = env.reset(seed=seed)
        policy = env.make_expert(noise=0.05)
        policy.reset(seed=seed)
        while True:
            obs, _, terminated, truncated, info = env.step(policy.act(obs, info))
            assert info["expert_waypoints"].shape == (6, 2) and info["expert_waypoints"].dtype == np.float32
            if terminated or truncated:
                return info
    finally:
        env.close()


@pytest.mark.parametrize(
    ("scenario", "seed"), [("intersection", 14), ("intersection", 17), ("roundabout", 111)]
)
def test_expert_succeeds_where_it_crashed_before(scenario, seed):
    info = _episode(scenario, seed)
    assert info["success"] and not info["crashed"], (scenario, seed, info["time"], info["route_completion"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "seed"),
    [
        ("intersection", 105),
        ("intersection", 110),
        ("roundabout", 107),
        ("roundabout", 115),
        ("roundabout", 117),
    ],
)
def test_expert_succeeds_where_it_crashed_before_more_seeds(scenario, seed):
    info = _episode(scenario, seed)
    assert info["success"] and not info["crashed"], (scenario, seed, info["time"], info["route_completion"])
