"""Vectorised rollouts: per-episode seeding independent of num_envs, summaries, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import ConfigError
from sim.rollout import RolloutConfig, rollout

ENV = "embodied/Reach-Kinova3-v0"


def _cfg(**kw) -> RolloutConfig:
    base = dict(env_id=ENV, episodes=3, seed=11, env_kwargs={"image_size": 32}, progress=False)
    return RolloutConfig(**{**base, **kw})


def test_episodes_do_not_depend_on_num_envs():
    one = rollout(_cfg(num_envs=1))
    two = rollout(_cfg(num_envs=2))
    assert [e.index for e in one.episodes] == [0, 1, 2]
    for a, b in zip(one.episodes, two.episodes, strict=True):
        assert a.seed == b.seed
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.obs["image"], b.obs["image"])
    ep = one.episodes[0]
    T = len(ep)
    assert ep.obs["image"].shape == (T + 1, 32, 32, 3) and ep.eef_delta.shape == (T, 6)
    assert ep.terminated[-1] or ep.truncated[-1]
    assert one.summary["success_rate"] == 1.0 and one.summary["episodes"] == 3
    assert one.summary["failures"] == 0 and one.summary["mean_length"] == np.mean([len(e) for e in one.episodes])


def test_random_policy_and_step_cap():
    res = rollout(_cfg(policy="random", episodes=2, max_episode_steps=5, env_kwargs={"image_size": 0}))
    assert all(len(e) == 5 and e.truncated[-1] for e in res.episodes)
    assert set(res.episodes[0].obs) == {"proprio"}
    assert not np.array_equal(res.episodes[0].actions, res.episodes[1].actions)


def test_async_matches_sync():
    kw = dict(episodes=2, num_envs=2, env_kwargs={"image_size": 0}, max_episode_steps=8)
    sync = rollout(_cfg(**kw))
    asyn = rollout(_cfg(vectorization="async", **kw))
    for a, b in zip(sync.episodes, asyn.episodes, strict=True):
        np.testing.assert_allclose(a.obs["proprio"], b.obs["proprio"], atol=1e-6)


def test_bad_input_raises_config_errors():
    with pytest.raises(ConfigError, match="episodes"):
        RolloutConfig(ENV, episodes=0)
    with pytest.raises(ConfigError, match="not registered"):
        rollout(RolloutConfig("embodied/Fly-Panda-v0", progress=False))
    with pytest.raises(ConfigError, match="policy"):
        rollout(_cfg(policy="/no/such/checkpoint"))
