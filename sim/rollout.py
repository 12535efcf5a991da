"""Run policies over ``gymnasium.vector`` environments and collect whole, seeded episodes.

Works for every env family that keeps the ``sim.api`` contract. Episode ``j`` of a rollout resets its
env with seed ``seed + j`` and its policy with the same seed, whichever sub-env runs it, so a rollout's
episodes do not depend on ``num_envs`` nor on sync vs async vectorisation.

Every vector step asks the policy for all K actions with ONE ``act_batch`` call (``sim.api.BatchedPolicy``).
Policies are built from a picklable factory ``(env) -> Policy | BatchedPolicy``, once per sub-env, by
the ``PolicyHost`` wrapper around each sub-env (inside the worker process for ``AsyncVectorEnv``):

* a per-env ``Policy`` (scripted experts, random, the world-model planner) stays next to its env, is reset
  with the episode seed whenever its env resets and acts on the env's last observation / info;
  ``HostedPolicies`` is the batched adapter that loops over the hosts (one ``envs.call`` per step). This
  is what lets privileged scripted experts (``env.unwrapped.make_expert``) run under ``AsyncVectorEnv``.
* a natively batched policy (``sim.api.is_batched``, e.g. ``worldmodels.bc.pipeline_bc.BCPolicy``) is
  handed back to the rollout (pickled under async), which drives one instance for all K sub-envs from the
  main process: one model forward per step, ``reset(seed, index=i)`` whenever slot ``i`` starts an episode.

Example::

    from sim.rollout import RolloutConfig, rollout
    result = rollout(RolloutConfig("embodied/Lift-Panda-v0", episodes=4, num_envs=2))
    result.summary["success_rate"], result.episodes[0].obs["image"].shape  # (T+1, 64, 64, 3)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from core.errors import ConfigError
from sim.api import (
    INFO_EEF_DELTA,
    INFO_FAILURE,
    INFO_SUCCESS,
    BatchedPolicy,
    Policy,
    PolicySpec,
    is_batched,
    policy_expects,
)

PolicyFactory = Callable[[gym.Env], Policy | BatchedPolicy]


@dataclass
class RolloutConfig:
    """What to roll out.

    Attributes:
        env_id: A registered Gymnasium id (e.g. ``"embodied/Reach-Sawyer-v0"``).
        episodes: Number of complete episodes to collect (>= 1).
        num_envs: Number of sub-environments stepped together (>= 1).
        seed: Episode ``j`` uses seed ``seed + j`` for the env and its policy.
        policy: What ``--policy`` names, resolved by ``sim.policies.resolve_policy``: ``"expert"`` (the env's
            task-solving expert), ``"scripted"`` (its scripted expert), ``"random"``, a registered policy name,
            a checkpoint path (``core.checkpoint.load_policy``) or ``ws://HOST:PORT``.
        policy_args: Options of the policy's factory (``--policy-arg key=value``; checked against its signature).
        noise: Action-noise std of the scripted expert.
        vectorization: ``"sync"`` (one process) or ``"async"`` (one worker process per sub-env).
        env_kwargs: Extra keyword arguments for ``gym.make`` (e.g. ``{"image_size": 128}``).
        max_episode_steps: Optional cap on steps per episode (counted as truncation).
        progress: Show a tqdm bar over episodes.
        api_key_file: For ``policy="ws://HOST:PORT"`` (a served policy, ``sim.remote``): the API key's file.
        replan_steps: A served policy: actions of each chunk executed before the next request (None: the server's).
        realtime: Simulated real time (``sim.remote``): request latency costs control periods.
    """

    env_id: str
    episodes: int = 10
    num_envs: int = 1
    seed: int = 0
    policy: str = "scripted"
    policy_args: dict[str, Any] = field(default_factory=dict)
    noise: float = 0.05
    vectorization: Literal["sync", "async"] = "sync"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None
    progress: bool = True
    api_key_file: str | None = None
    replan_steps: int | None = None
    realtime: bool = False

    def __post_init__(self):
        if not isinstance(self.episodes, int) or self.episodes < 1:
            raise ConfigError(f"episodes: must be an integer >= 1, got {self.episodes!r}")
        if not isinstance(self.num_envs, int) or self.num_envs < 1:
            raise ConfigError(f"num_envs: must be an integer >= 1, got {self.num_envs!r}")
        if self.vectorization not in ("sync", "async"):
            raise ConfigError(f"vectorization: must be 'sync' or 'async', got {self.vectorization!r}")
        if self.noise < 0:
            raise ConfigError(f"noise: must be >= 0, got {self.noise}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ConfigError(f"max_episode_steps: must be >= 1, got {self.max_episode_steps}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable resolved config."""
        return asdict(self)


@dataclass
class Episode:
    """One finished episode of ``T`` steps.

    Attributes:
        index: Episode number ``j`` within the rollout.
        seed: Seed the env and policy were reset with (``config.seed + j``).
        obs: key -> (T + 1, ...) observations, from the reset one to the last (images uint8).
        actions: (T, A) float32 actions as sent to the env.
        rewards: (T,) float32.
        terminated: (T,) bool; truncated: (T,) bool.
        success: (T,) bool ``info["success"]`` per step.
        eef_delta: (T, 6) float32 end-effector motion per step (world frame: m, axis-angle rad).
        infos: Per-step info dicts (the env's, unbatched).
        failure: The simulator failure that ended the episode, or None.
        reset_info: The info of the reset that started the episode.
    """

    index: int
    seed: int
    obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    success: np.ndarray
    eef_delta: np.ndarray
    infos: list[dict[str, Any]]
    failure: str | None = None
    reset_info: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def solved(self) -> bool:
        """Whether the task was solved at any step."""
        return bool(self.success.any())

    @property
    def episode_return(self) -> float:
        """Sum of rewards."""
        return float(self.rewards.sum())


@dataclass
class RolloutResult:
    """Episodes (ordered by index) and their summary."""

    episodes: list[Episode]
    summary: dict[str, Any]


# --------------------------------------------------------------------------------------------- policies
def policy_factory(policy: str, noise: float = 0.05, *, policy_args: dict[str, Any] | None = None,
                   api_key_file: str | None = None, replan_steps: int | None = None,
                   realtime: bool = False) -> PolicyFactory:
    """Picklable factory for what ``--policy`` names, through the one resolver every closed loop uses
    (``sim.policies.resolve_policy``: expert / scripted / idm / constant / random, a registered name, a checkpoint
    path, a ``ws://`` URL); ``noise`` is the scripted expert's action noise; ``realtime`` puts any of them on the
    simulated clock."""
    from sim.policies import resolve_policy

    return resolve_policy(policy, policy_args, noise=noise, api_key_file=api_key_file, replan_steps=replan_steps,
                          realtime=realtime).factory


class PolicyHost(gym.Wrapper):
    """Holds a per-env policy next to its env: built by ``host_set_policy``, reset with each episode's seed."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._policy: Policy | None = None
        self._last: tuple[Any, dict[str, Any]] | None = None

    def host_set_policy(self, factory: PolicyFactory) -> BatchedPolicy | None:
        """Build the policy from ``factory(env)``.

        Returns:
            None when it is a per-env policy (kept here: ``host_act`` acts with it); a natively batched
            policy is returned to the caller instead of kept (it acts for every sub-env from the caller).
        """
        policy = factory(self.env)
        if is_batched(policy):
            self._policy = None
            return policy
        self._policy = policy
        return None

    def host_expects(self) -> PolicySpec | None:
        """The per-env policy's declared ``PolicySpec`` (``sim.api.policy_expects``), or None."""
        return policy_expects(self._policy)

    def host_act(self) -> np.ndarray:
        """The policy's action for the env's last observation / info."""
        if self._policy is None or self._last is None:
            raise RuntimeError("PolicyHost: set a policy and reset the env before acting")
        return np.asarray(self._policy.act(*self._last), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        if self._policy is not None:
            self._policy.reset(seed=seed)
        self._last = (obs, info)
        return obs, info

    def step(self, action):
        out = self.env.step(action)
        self._last = (out[0], out[4])
        return out


class HostedPolicies:
    """``BatchedPolicy`` adapter over the per-env policies held by a vector env's ``PolicyHost`` sub-envs.

    ``act_batch`` is one ``envs.call("host_act")``: a loop over the sub-envs (run in parallel in the
    workers under async); each host acts on its own env's last observation / info, so ``obs`` / ``infos``
    are not used. Hosts reset their policy with their env, so ``reset`` has nothing to do.
    """

    def __init__(self, envs: gym.vector.VectorEnv):
        self.envs = envs

    def reset(self, seed: int | None = None, index: int | None = None) -> None:
        """No-op: ``PolicyHost.reset`` already reset the policy with the env's episode seed."""

    def act_batch(self, obs: dict[str, np.ndarray], infos: Sequence[dict[str, Any]]) -> np.ndarray:
        """(K, A) float32 actions, row ``i`` from sub-env ``i``'s policy."""
        return np.stack(self.envs.call("host_act"))


def install_policy(envs: gym.vector.VectorEnv, factory: PolicyFactory, env_id: str | None = None) -> BatchedPolicy:
    """Build the policy of a ``make_vector_env`` env and return what acts for all its sub-envs.

    Each ``PolicyHost`` builds ``factory(env)``. Per-env policies stay in the hosts and a
    ``HostedPolicies`` is returned; a natively batched policy is returned itself (sub-env 0's instance;
    under sync vectorisation the other sub-envs do not build one). A policy that declares the spaces it
    was built for (``expects``, a ``sim.api.PolicySpec``) is checked against the env's before any step.

    Raises:
        CheckpointError: The policy was built for another observation or action space than the env's (one
            line naming both shapes; ``env_id`` names the env).
        RuntimeError: The factory returned batched policies for some sub-envs and per-env ones for others.
    """
    if isinstance(envs, gym.vector.SyncVectorEnv):
        first = envs.envs[0].host_set_policy(factory)
        if first is not None:
            check_policy_fits(policy_expects(first), envs, env_id)
            return first
        built = [first, *(e.host_set_policy(factory) for e in envs.envs[1:])]
    else:
        built = list(envs.call("host_set_policy", factory))
    if all(b is None for b in built):
        specs = envs.call("host_expects")  # the per-env policies stay in the hosts (the workers under async)
        check_policy_fits(next((s for s in specs if s is not None), None), envs, env_id)
        return HostedPolicies(envs)
    if any(b is None for b in built):
        raise RuntimeError("policy factory returned batched policies for some sub-envs and per-env ones for others")
    check_policy_fits(policy_expects(built[0]), envs, env_id)
    return built[0]  # the hosts kept none: the other workers' copies are dropped here


def check_policy_fits(spec: PolicySpec | None, envs: gym.vector.VectorEnv, env_id: str | None = None) -> None:
    """``spec.check`` against one sub-env's observation / action space (nothing to check for None).

    Raises:
        CheckpointError: See ``sim.api.PolicySpec.check``.
    """
    if spec is not None:
        spec.check(envs.single_observation_space, envs.single_action_space, env_id)


def make_vector_env(
    env_id: str, num_envs: int = 1, vectorization: str = "sync", env_kwargs: dict[str, Any] | None = None
) -> gym.vector.VectorEnv:
    """Vector env of ``PolicyHost``-wrapped sub-envs, autoreset disabled (the caller resets by mask).

    Raises:
        ConfigError: ``env_id`` is not registered (the message lists close matches).
    """
    from core.logging import third_party_quiet

    check_env_id(env_id)
    kwargs = dict(env_kwargs or {})
    check_env_kwargs(env_id, kwargs)
    fns = [functools.partial(_make_hosted, env_id, kwargs, third_party_quiet()) for _ in range(num_envs)]
    mode = gym.vector.AutoresetMode.DISABLED
    if vectorization == "async":
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, context="spawn")
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)


def check_env_id(env_id: str) -> None:
    """Register the ``sim`` families and check that ``env_id`` exists.

    Raises:
        ConfigError: ``env_id`` is not registered (the message names the closest registered ids, see
            ``suggest_env_ids``).
    """
    import sim

    sim.register_envs()
    if env_id not in gym.registry:
        near = suggest_env_ids(env_id, list(gym.registry))
        parts = [f"env id {env_id!r} is not registered", numbered_env_ids(env_id, list(gym.registry)),
                 f"did you mean {' or '.join(repr(k) for k in near)}?" if near else None,
                 "`embodied sim list` lists them all"]
        raise ConfigError("; ".join(p for p in parts if p))


def numbered_env_ids(env_id: str, registered: Sequence[str]) -> str | None:
    """``"embodied/Libero-spatial-N-v0 has N in 0..9"`` when ``env_id`` differs from a numbered family of
    registered ``embodied/`` ids in one number only (an index out of range), else None."""
    import re

    from sim import NAMESPACE

    name = env_id.split("/", 1)[-1]
    groups = list(re.finditer(r"\d+", name))
    for g in groups[:-1] if len(groups) > 1 else groups:  # the last number of a gym id is its version
        pattern = re.compile(re.escape(name[: g.start()]) + r"(\d+)" + re.escape(name[g.end():]) + "$")
        found = sorted(int(m.group(1)) for k in registered if k.startswith(f"{NAMESPACE}/")
                       for m in [pattern.match(k.split("/", 1)[1])] if m)
        if len(found) > 1:
            span = f"{found[0]}..{found[-1]}" if found == list(range(found[0], found[-1] + 1)) else ", ".join(
                map(str, found))
            return f"{NAMESPACE}/{name[: g.start()]}N{name[g.end():]} has N in {span}"
    return None


def check_env_kwargs(env_id: str, kwargs: dict[str, Any]) -> None:
    """Refuse ``gym.make`` options the registered env's constructor does not take (e.g. ``--camera`` for driving).

    Raises:
        ConfigError: One line naming the option and the ones the env takes.
    """
    import inspect

    from gymnasium.envs.registration import load_env_creator

    ep = gym.registry[env_id].entry_point
    try:
        params = inspect.signature(load_env_creator(ep) if isinstance(ep, str) else ep).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    registered = gym.registry[env_id].kwargs or {}
    takes = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL and n not in registered]
    for key in kwargs:
        if key not in params:
            raise ConfigError(f"env {env_id} takes no {key!r} option (its options: {', '.join(takes) or 'none'})")


def suggest_env_ids(env_id: str, registered: Sequence[str], n: int = 3) -> list[str]:
    """The registered ids closest to a mistyped ``env_id``, best first (the workspace's ``embodied/`` ones).

    The id with the same name under the ``embodied/`` namespace comes alone when it exists
    (``Reach-Panda-v0`` -> ``embodied/Reach-Panda-v0``); else up to ``n`` ids whose names are close
    (``difflib``), compared without the namespace so a missing or wrong prefix does not count.
    """
    import difflib

    from sim import NAMESPACE

    name = env_id.split("/", 1)[-1]
    ours = {k.split("/", 1)[1]: k for k in registered if k.startswith(f"{NAMESPACE}/")}
    if name in ours:
        return [ours[name]]
    return [ours[m] for m in difflib.get_close_matches(name, list(ours), n=n, cutoff=0.6)]


def _make_hosted(env_id: str, kwargs: dict[str, Any], quiet: bool = False) -> gym.Env:
    import sim

    if quiet:  # a spawned worker starts with the libraries' own console chatter: turn it down as its parent did
        from core.logging import quiet_third_party

        quiet_third_party()
    sim.register_envs()
    return PolicyHost(gym.make(env_id, **kwargs))


# --------------------------------------------------------------------------------------------- rollout
class _Buffer:
    def __init__(self, index: int, seed: int, obs: dict[str, np.ndarray], info: dict[str, Any]):
        self.index, self.seed = index, seed
        self.obs = [obs]
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.terminated: list[bool] = []
        self.truncated: list[bool] = []
        self.infos: list[dict[str, Any]] = []
        self.reset_info = info

    def add(self, action, obs, reward, terminated, truncated, info) -> None:
        self.actions.append(np.asarray(action, dtype=np.float32))
        self.obs.append(obs)
        self.rewards.append(float(reward))
        self.terminated.append(bool(terminated))
        self.truncated.append(bool(truncated))
        self.infos.append(info)

    def finish(self) -> Episode:
        obs = {k: np.stack([o[k] for o in self.obs]) for k in self.obs[0]}
        success = np.array([bool(i.get(INFO_SUCCESS, False)) for i in self.infos])
        eef = np.stack([np.asarray(i.get(INFO_EEF_DELTA, np.zeros(6)), dtype=np.float32) for i in self.infos])
        failure = next((str(i[INFO_FAILURE]) for i in self.infos if i.get(INFO_FAILURE)), None)
        return Episode(
            index=self.index,
            seed=self.seed,
            obs=obs,
            actions=np.stack(self.actions),
            rewards=np.asarray(self.rewards, dtype=np.float32),
            terminated=np.asarray(self.terminated),
            truncated=np.asarray(self.truncated),
            success=success,
            eef_delta=eef,
            infos=self.infos,
            failure=failure,
            reset_info=self.reset_info,
        )


def _as_dict(obs: Any) -> dict[str, np.ndarray]:
    """A vector env's batched observation as ``key -> (K, ...)`` (``{"obs": ...}`` for a non-dict space)."""
    return obs if isinstance(obs, dict) else {"obs": obs}


def _merge_rows(old: dict[str, np.ndarray], new: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """Fresh arrays: rows where ``mask`` from ``new``, the others from ``old`` (both ``key -> (K, ...)``)."""
    out = {}
    for key, v in old.items():
        merged = np.array(v, copy=True)
        merged[mask] = np.asarray(new[key])[mask]
        out[key] = merged
    return out


def _split_obs(obs: Any, i: int) -> dict[str, np.ndarray]:
    if isinstance(obs, dict):
        return {k: np.asarray(v[i]) for k, v in obs.items()}
    return {"obs": np.asarray(obs[i])}


def _split_info(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """Un-batch sub-env ``i``'s info from a vector env's ``{key: array, _key: mask}`` dict."""
    out: dict[str, Any] = {}
    for k, v in infos.items():
        if k.startswith("_"):
            continue
        mask = infos.get(f"_{k}")
        if mask is not None and not mask[i]:
            continue
        out[k] = _split_info(v, i) if isinstance(v, dict) else v[i]
    return out


def rollout(
    config: RolloutConfig,
    policy: PolicyFactory | None = None,
    on_episode: Callable[[Episode], None] | None = None,
) -> RolloutResult:
    """Collect ``config.episodes`` complete episodes.

    The policy acts for all sub-envs with one ``act_batch`` call per vector step (see the module docstring):
    per-env policies through ``HostedPolicies``, natively batched ones directly, env index ``i`` being
    reset with the episode's seed whenever slot ``i`` starts an episode. Slots left idle once every
    episode has been started still step, but neither their actions nor their results are recorded.

    Args:
        config: What to run.
        policy: Optional picklable factory ``(env) -> Policy | BatchedPolicy`` overriding ``config.policy``.
        on_episode: Called with each finished episode (in completion order), e.g. to stream to disk.

    Returns:
        Episodes sorted by index, and a summary: ``episodes``, ``success_rate``, ``mean_return``,
        ``mean_length``, ``failures`` (count), ``failure_reasons``, ``steps``, ``steps_per_s``, ``wall_s``.
    """
    from core.logging import progress

    factory = policy or policy_factory(config.policy, config.noise, policy_args=config.policy_args,
                                       api_key_file=config.api_key_file, replan_steps=config.replan_steps,
                                       realtime=config.realtime)
    envs = make_vector_env(config.env_id, config.num_envs, config.vectorization, config.env_kwargs)
    n, k = config.episodes, config.num_envs
    episodes: list[Episode] = []
    steps = 0
    start = time.perf_counter()
    try:
        actor = install_policy(envs, factory, config.env_id)
        # slot i runs episode slot_ep[i]; episodes past n keep idle slots alive with unused seeds
        slot_ep = list(range(k))
        seeds = [config.seed + j for j in slot_ep]
        obs, infos = envs.reset(seed=seeds)
        # what the policy acts on next: key -> (K, ...) and one info per slot
        cur_obs, cur_infos = _as_dict(obs), [_split_info(infos, i) for i in range(k)]
        for i, s in enumerate(seeds):
            actor.reset(seed=s, index=i)
        bufs: list[_Buffer | None] = [
            _Buffer(j, s, _split_obs(obs, i), cur_infos[i]) if j < n else None
            for i, (j, s) in enumerate(zip(slot_ep, seeds, strict=True))
        ]
        next_ep = k
        bar = progress(total=n, desc=config.env_id, unit="ep", enabled=config.progress)
        while len(episodes) < n:
            actions = np.asarray(actor.act_batch(cur_obs, cur_infos), dtype=np.float32)
            if actions.ndim != 2 or actions.shape[0] != k:
                raise RuntimeError(f"policy {type(actor).__name__}: act_batch returned shape {actions.shape} "
                                   f"for {k} envs, expected ({k}, action_dim)")
            obs, rewards, terms, truncs, infos = envs.step(actions)
            cur_obs, cur_infos = _as_dict(obs), [_split_info(infos, i) for i in range(k)]
            steps += sum(b is not None for b in bufs)
            _show_steps(bar, steps, episodes)
            done_slots = []
            for i, buf in enumerate(bufs):
                cap = (
                    buf is not None
                    and config.max_episode_steps is not None
                    and len(buf.actions) + 1 >= config.max_episode_steps
                )
                if terms[i] or truncs[i] or cap:
                    done_slots.append(i)
                if buf is None:
                    continue
                buf.add(actions[i], _split_obs(obs, i), rewards[i], terms[i], truncs[i] or cap, cur_infos[i])
                if i in done_slots:
                    ep = buf.finish()
                    episodes.append(ep)
                    bar.update(1)
                    if on_episode is not None:
                        on_episode(ep)
            if done_slots and len(episodes) < n:
                mask = np.zeros(k, dtype=bool)
                mask[done_slots] = True
                reset_seeds: list[int | None] = [None] * k
                for i in done_slots:
                    slot_ep[i] = next_ep
                    reset_seeds[i] = config.seed + next_ep
                    next_ep += 1
                obs, infos = envs.reset(seed=reset_seeds, options={"reset_mask": mask})
                cur_obs = _merge_rows(cur_obs, _as_dict(obs), mask)
                for i in done_slots:
                    j = slot_ep[i]
                    cur_infos[i] = _split_info(infos, i)
                    actor.reset(seed=config.seed + j, index=i)
                    bufs[i] = _Buffer(j, config.seed + j, _split_obs(obs, i), cur_infos[i]) if j < n else None
        bar.close()
    finally:
        envs.close()
    wall = time.perf_counter() - start
    episodes.sort(key=lambda e: e.index)
    return RolloutResult(episodes, summarize(episodes, wall_s=wall, steps=steps))


def _show_steps(bar: Any, steps: int, episodes: Sequence[Episode]) -> None:
    """Steps so far (and the success rate of the finished episodes) after the bar, redrawn at the bar's pace.

    A long episode (a LIBERO task runs hundreds of steps) thus shows progress before it ends.
    """
    if bar.disable:
        return
    text = f"{steps} steps" + (f", success {np.mean([e.solved for e in episodes]):.2f}" if episodes else "")
    bar.set_postfix_str(text, refresh=False)
    now = time.time()
    if now - bar.last_print_t >= bar.mininterval:
        bar.refresh()
        bar.last_print_t = now


def summarize(episodes: Sequence[Episode], wall_s: float | None = None, steps: int | None = None) -> dict[str, Any]:
    """Summary statistics of finished episodes (see ``rollout``)."""
    lengths = [len(e) for e in episodes]
    failures = [e.failure for e in episodes if e.failure]
    summary: dict[str, Any] = {
        "episodes": len(episodes),
        "success_rate": float(np.mean([e.solved for e in episodes])) if episodes else 0.0,
        "mean_return": float(np.mean([e.episode_return for e in episodes])) if episodes else 0.0,
        "mean_length": float(np.mean(lengths)) if episodes else 0.0,
        "failures": len(failures),
        "failure_reasons": sorted(set(failures)),
        "per_episode": [
            {"index": e.index, "seed": e.seed, "success": e.solved, "return": e.episode_return,
             "length": len(e), "failure": e.failure}
            for e in episodes
        ],
    }
    if steps is not None:
        summary["steps"] = int(steps)
    if wall_s is not None:
        summary["wall_s"] = float(wall_s)
        if steps:
            summary["steps_per_s"] = float(steps / max(wall_s, 1e-9))
    return summary
