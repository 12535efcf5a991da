"""Vectorised rollouts: per-episode seeding independent of num_envs, summaries, bad input, batched policies."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from core.errors import ConfigError
from sim.api import BatchedPolicy, PerEnvPolicies, Policy, is_batched
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


# ------------------------------------------------------------------------------------ batched policies
TOY = "embodied-test/Countdown-v0"


class _Countdown(gym.Env):
    """Episodes of ``2 + seed % 3`` steps (slots of a vector env finish at different steps).

    ``proprio`` is ``(t, seed)``: the step within the episode and the seed the env was reset with.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self):
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
            "proprio": gym.spaces.Box(-1e9, 1e9, (2,), np.float32),
        })
        self.action_space = gym.spaces.Box(-1e9, 1e9, (1,), np.float32)
        self.t, self.seed, self.length = 0, 0, 2

    def _obs(self):
        return {"image": np.zeros((16, 16, 3), np.uint8), "proprio": np.array([self.t, self.seed], np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.seed = 0, int(seed)
        self.length = 2 + self.seed % 3
        return self._obs(), {"success": False}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        return self._obs(), float(np.asarray(action)[0]), done, False, {"success": done}


if TOY not in gym.registry:
    gym.register(TOY, entry_point=_Countdown)


class _StepCounter:
    """Native ``BatchedPolicy``: action ``i`` is the number of steps since env index ``i`` was reset.

    Checks on every call that row ``i`` of ``obs`` is at that step (so resets reached the right index at
    the right time) and records each call's batch size and each reset.
    """

    def __init__(self, log: dict):
        self.log = log
        log["built"] += 1
        self.t: dict[int, int] = {}

    def reset(self, seed=None, index=None):
        self.log["resets"].append((seed, index))
        self.t[index] = 0

    def act_batch(self, obs, infos):
        k = len(obs["proprio"])
        assert len(infos) == k and all("success" in i for i in infos)
        self.log["calls"].append(k)
        for i in range(k):
            assert obs["proprio"][i, 0] == self.t[i], (i, obs["proprio"][i], self.t[i])
        out = np.array([[self.t[i]] for i in range(k)], np.float32)
        for i in range(k):
            self.t[i] += 1
        return out


def _counter_factory(log: dict, env: gym.Env) -> _StepCounter:
    return _StepCounter(log)


def _toy_cfg(**kw) -> RolloutConfig:
    return RolloutConfig(**{**dict(env_id=TOY, episodes=7, seed=11, progress=False), **kw})


def test_batched_policy_is_called_once_per_vector_step():
    log = {"built": 0, "calls": [], "resets": []}
    res = rollout(_toy_cfg(num_envs=3), policy=functools.partial(_counter_factory, log))
    assert log["built"] == 1  # one instance for the 3 sub-envs
    assert set(log["calls"]) == {3}  # every call acts for all 3 envs at once
    steps = res.summary["steps"]
    assert steps == sum(2 + (11 + j) % 3 for j in range(7))
    assert len(log["calls"]) < steps  # K=3: one call per vector step, not one per env step
    assert steps <= 3 * len(log["calls"])
    # episode j ran with seed 11 + j on some slot whose policy index was reset with that seed
    assert [e.seed for e in res.episodes] == list(range(11, 18))
    assert {s for s, _ in log["resets"]} >= set(range(11, 18)) and {i for _, i in log["resets"]} == {0, 1, 2}
    for e in res.episodes:
        assert e.obs["proprio"][0, 1] == e.seed and len(e) == 2 + e.seed % 3
        np.testing.assert_array_equal(e.actions[:, 0], np.arange(len(e)))  # counter restarted per episode
    one = rollout(_toy_cfg(num_envs=1), policy=functools.partial(_counter_factory, {**log, "calls": []}))
    for a, b in zip(one.episodes, res.episodes, strict=True):
        np.testing.assert_array_equal(a.actions, b.actions)


def test_k1_rollout_matches_the_per_env_loop():
    """K=1: the rollout's batched call reproduces the plain per-env loop (scripted expert, same seeds)."""
    import sim

    sim.register_envs()
    kw = dict(episodes=2, num_envs=1, env_kwargs={"image_size": 0}, max_episode_steps=25)
    res = rollout(_cfg(**kw))
    env = gym.make(ENV, image_size=0)
    try:
        expert = env.unwrapped.make_expert(noise=0.05)
        assert isinstance(expert, Policy) and not is_batched(expert)
        for j, ep in enumerate(res.episodes):
            obs, info = env.reset(seed=11 + j)
            expert.reset(seed=11 + j)
            actions, rewards = [], []
            for _ in range(25):
                a = np.asarray(expert.act(obs, info), np.float32)
                obs, r, term, trunc, info = env.step(a)
                actions.append(a)
                rewards.append(r)
                if term or trunc:
                    break
            np.testing.assert_array_equal(ep.actions, np.stack(actions))
            assert ep.episode_return == pytest.approx(float(np.sum(np.asarray(rewards, np.float32))))
    finally:
        env.close()


class _EncodingBC(torch.nn.Module):
    """Stands in for ``BCPolicyModel``: chunk action ``h`` of the row for ``(t, seed)`` is
    ``100 * seed + 10 * t + h``, so an executed action tells which observation and chunk step it came from."""

    def __init__(self, config, log: list):
        super().__init__()
        self.config, self.log = config, log

    def forward(self, image, proprio, generator=None):  # BCPolicyModel's signature (a flow head draws from it)
        self.log.append(len(image))
        t, seed = proprio[:, :1], proprio[:, 1:]
        h = torch.arange(self.config.horizon, dtype=torch.float32)
        return (100 * seed + 10 * t + h)[..., None]  # (B, horizon, 1)


def _bc_factory(log: list, env: gym.Env):
    from worldmodels.bc.modeling_bc import tiny_config
    from worldmodels.bc.pipeline_bc import BCPolicy

    cfg = tiny_config(n_action_steps=3, action_dim=1, proprio_dim=2)
    return BCPolicy(_EncodingBC(cfg, log), env.action_space.low, env.action_space.high)


def test_bc_chunk_queue_is_reset_per_env_when_its_episode_ends():
    """Episodes of 2-4 steps with 3-step chunks: a finished env's leftover chunk actions must be dropped
    for that env only, while the others keep executing theirs."""
    forwards: list[int] = []
    res = rollout(_toy_cfg(num_envs=2, episodes=6), policy=functools.partial(_bc_factory, forwards))
    assert is_batched(_bc_factory([], _Countdown())) and isinstance(_bc_factory([], _Countdown()), BatchedPolicy)
    for e in res.episodes:
        t = np.arange(len(e))
        replan = 3 * (t // 3)  # the step whose observation the executing chunk was predicted from
        np.testing.assert_array_equal(e.actions[:, 0], 100 * e.seed + 10 * replan + (t - replan))
    assert max(forwards) == 2 and min(forwards) == 1  # one forward for both envs, or just the one that needs it


def test_per_env_policies_adapter():
    class Rec:
        def __init__(self, k):
            self.k, self.seeds = k, []

        def reset(self, seed=None):
            self.seeds.append(seed)

        def act(self, obs, info):
            return np.array([obs["x"][0] + self.k, info["y"]])

    pols = [Rec(k) for k in range(3)]
    batched = PerEnvPolicies(pols)
    assert isinstance(batched, BatchedPolicy) and batched.num_envs == 3
    batched.reset(seed=5)
    batched.reset(seed=9, index=1)
    assert [p.seeds for p in pols] == [[5], [6, 9], [7]]
    out = batched.act_batch({"x": np.array([[10.0], [20.0], [30.0]])}, [{"y": 1}, {"y": 2}, {"y": 3}])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[10, 1], [21, 2], [32, 3]])
    with pytest.raises(ValueError, match="expected 3"):
        batched.act_batch({"x": np.zeros((2, 1))}, [{}, {}])
