"""The contract every environment in ``sim`` keeps, so that one rollout loop and one recorder serve all.

Observations: a ``gymnasium.spaces.Dict``. Keys used across families:
    ``image``    (H, W, 3) uint8 RGB, upright (row 0 at the top), the main camera.
    ``proprio``  (P,) float32 robot / ego state (documented per env in ``metadata``).
Families add their own keys (``bev`` for driving, ``wrist_image`` ...); every key is written to
HDF5 as ``obs/<key>`` by the recorder. An observation is a dict, or a read-only ``LazyObservation`` whose
camera images are rendered when first read (``LiberoEnv(lazy_images=True)``, the LIBERO evaluation's env):
a policy reads it within its ``act`` call, and only the keys it needs.

``env.metadata`` (per registered env) holds:
    ``embodiment``         str, e.g. "Panda", "Sawyer+InspireHand", "ego_car".
    ``task``               str, e.g. "reach", "lift", "libero_spatial/0", "highway".
    ``family``             "manipulation" | "libero" | "driving".
    ``action_space_desc``  dict: ``dim`` (int), ``semantics`` (list[str], one per dim),
                           ``units`` (list[str] or str), ``frame`` (str), ``low`` / ``high``.
    ``language_instruction`` str or None.

Demonstration files may name observations otherwise than the env does (LIBERO's ``agentview_rgb``,
``ee_states`` ... are slices and views of ``image`` / ``proprio``). Such an env also offers
``env.unwrapped.demo_obs_sources`` (file key -> the env key it is computed from) and
``env.unwrapped.demo_obs(obs)`` (an env observation dict, batched (K, ...) or not, -> the file keys), so
that a policy trained on the files reads the env in closed loop (``worldmodels.bc.task.make_policy``).

``info`` after every ``step`` (and ``reset``) holds:
    ``success``       bool, task solved at this step.
    ``eef_delta``     (6,) float32 end-effector pose change over the step: dx, dy, dz in metres and
                      an axis-angle rotation in radians, both in the world frame (zeros for driving:
                      ``ego_delta`` holds the ego's (dx, dy, dyaw) in the ego frame instead).
    ``failure``       str, present only when the episode ended because the simulator failed
                      (e.g. "physics diverged: NaN in qpos"); the step is then ``terminated``.

Policies come in two shapes:
    ``Policy``         per env: ``reset(seed)``, ``act(obs, info) -> (A,)``. Scripted experts
                       (``env.unwrapped.make_expert(noise=..., seed=...)``, privileged: they read their env's
                       state) and ``RandomPolicy`` are per-env policies.
    ``BatchedPolicy``  K envs at once: ``reset(seed, index)``, ``act_batch(obs, infos) -> (K, A)`` with
                       ``obs`` holding (K, ...) arrays; one call (one model forward) per vector step. Learned
                       policies implement it natively (``worldmodels.bc.pipeline_bc.BCPolicy``).
``PerEnvPolicies`` turns K per-env policies into a ``BatchedPolicy`` by looping over them (experts are
cheap); ``is_batched`` tells the two shapes apart. ``sim.rollout`` drives either through ``act_batch``.
A policy that predicts action chunks may also offer ``action_chunk(obs, info) -> (T, A)``: the whole
chunk it would execute from ``obs`` (no state changed), which planners use as a proposal
(``worldmodels.lacwm.pipeline_lacwm``), and ``action_chunk_batch(obs, instructions=None) -> (K, T, A)``: the chunks of K
unrelated observations (K clients of a policy server, ``embodied serve``) in one forward, ``instructions`` giving
each row's language.

A learned policy declares what it was built for in an ``expects`` attribute, a ``PolicySpec`` (the observation
keys / shapes it reads and the action shape it returns; its factory fills it from the checkpoint's config).
``sim.rollout`` compares it with the env's spaces before the first step and refuses a policy of another
space in one line naming both shapes (``PolicySpec.check``). Policies that read whatever their env gives
(scripted experts, random) declare nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from core.errors import CheckpointError

INFO_SUCCESS = "success"
INFO_EEF_DELTA = "eef_delta"
INFO_FAILURE = "failure"


@runtime_checkable
class Policy(Protocol):
    """Maps an observation (and the last ``info``) to an action in the env's action space."""

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode; ``seed`` makes any noise the policy adds reproducible."""

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """Return the action for this step."""


@runtime_checkable
class BatchedPolicy(Protocol):
    """Maps a batch of K observations, one per env index, to K actions in one call.

    Env index ``i`` in ``[0, K)`` is a slot of a vector env: the policy keeps per-index state (the
    pending actions of a chunk, an RNG, a recurrent state) that ``reset(seed, index=i)`` clears when slot
    ``i`` starts a new episode, without touching the other indices. ``K`` may differ between policies but
    is fixed within a rollout. Obs keys are those of the env's ``Dict`` space (``{"obs": ...}`` for a
    non-dict space).
    """

    def reset(self, seed: int | None = None, index: int | None = None) -> None:
        """Start a new episode in env ``index`` (every env when None), seeding its noise with ``seed``."""

    def act_batch(self, obs: dict[str, np.ndarray], infos: Sequence[dict[str, Any]]) -> np.ndarray:
        """Actions for K envs.

        Args:
            obs: key -> (K, ...) array, row ``i`` the last observation of env ``i`` (images uint8).
            infos: K info dicts, ``infos[i]`` the last ``info`` of env ``i``.

        Returns:
            (K, A) float32 actions in the env's action space, row ``i`` for env ``i``.
        """


class LazyObservation(Mapping):
    """A read-only observation whose ``lazy`` entries are computed on first read (then kept).

    ``sim.libero.env.LiberoEnv(lazy_images=True)`` returns one: its camera images are rendered only if a policy
    reads them. ``dict(obs)`` reads (renders) every entry; ``materialized`` says which lazy entries have been
    read. A policy that re-plans every few steps should read the observation only when it re-plans.
    """

    def __init__(self, eager: Mapping[str, Any], lazy: Mapping[str, Callable[[], Any]],
                 order: Sequence[str] | None = None):
        self._values = dict(eager)
        self._lazy = dict(lazy)
        keys = [*self._lazy, *self._values]
        self._keys = [k for k in order if k in keys] + [k for k in keys if k not in order] if order else keys

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            make = self._lazy.get(key)
            if make is None:
                raise KeyError(key)
            self._values[key] = make()
        return self._values[key]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._lazy or key in self._values

    @property
    def materialized(self) -> list[str]:
        """The lazy entries read so far."""
        return [k for k in self._lazy if k in self._values]

    def __repr__(self) -> str:
        return f"LazyObservation(keys={self._keys}, rendered={self.materialized})"


def batch_of_one(obs: Mapping[str, Any]) -> Mapping[str, Any]:
    """``{k: np.asarray(v)[None]}`` for a per-env observation, entry by entry as it is read (a lazy
    observation's frames stay unrendered until a batched policy reads them)."""
    return LazyObservation({}, {k: (lambda k=k: np.asarray(obs[k])[None]) for k in obs})


def _shape_text(shape: Sequence[int | None]) -> str:
    """``(None, None, 3)`` -> ``"(?, ?, 3)"``, ``(7,)`` -> ``"(7,)"``."""
    dims = ["?" if d is None else str(int(d)) for d in shape]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _fits(want: Sequence[int | None], have: Sequence[int] | None) -> bool:
    return have is not None and len(want) == len(have) and all(
        w is None or w == h for w, h in zip(want, have, strict=True))


@dataclass(frozen=True)
class PolicySpec:
    """The spaces a policy was built for: what its ``expects`` attribute holds (see the module docstring).

    Attributes:
        observation: Observation key -> shape the policy reads, ``None`` on an axis of any size (e.g. an
            image the policy resizes: ``{"image": (None, None, 3), "proprio": (23,)}``). Keys it does not
            read are left out; the env may give more.
        action: Shape of the actions it returns, e.g. ``(7,)``.
        source: What it was built from (a checkpoint path), named in the refusal.
        made_for: The env id it was trained on, when known (named in the refusal).
    """

    observation: Mapping[str, tuple[int | None, ...]] = field(default_factory=dict)
    action: tuple[int, ...] | None = None
    source: str = ""
    made_for: str | None = None

    def mismatches(self, observation_space: Any, action_space: Any) -> list[str]:
        """One ``"what: policy SHAPE, env SHAPE"`` phrase per observation key or action that does not fit."""
        spaces = getattr(observation_space, "spaces", None)
        spaces = dict(spaces) if isinstance(spaces, Mapping) else {"obs": observation_space}
        out = []
        missing = [f"{key!r} {_shape_text(want)}" for key, want in self.observation.items() if key not in spaces]
        if missing:
            out.append(f"observation {', '.join(missing)}: policy reads {'it' if len(missing) == 1 else 'them'}, "
                       f"env has no such key (its keys: {', '.join(sorted(spaces))})")
        for key, want in self.observation.items():
            if key in spaces and not _fits(want, getattr(spaces[key], "shape", None)):
                out.append(f"observation {key!r}: policy {_shape_text(want)}, env {_shape_text(spaces[key].shape)}")
        have = getattr(action_space, "shape", None)
        if self.action is not None and not _fits(self.action, have):
            out.append(f"action: policy {_shape_text(self.action)}, env "
                       f"{_shape_text(have) if have is not None else type(action_space).__name__}")
        return out

    def check(self, observation_space: Any, action_space: Any, env_id: str | None = None) -> None:
        """Refuse an env whose spaces this policy was not built for.

        Raises:
            CheckpointError: One line naming the policy, the env and, for each mismatch, both shapes.
        """
        bad = self.mismatches(observation_space, action_space)
        if not bad:
            return
        who = f"policy {self.source}" if self.source else "the policy"
        made = f" (made for {self.made_for})" if self.made_for and self.made_for != env_id else ""
        raise CheckpointError(f"{who}{made} does not fit env {env_id or 'this env'}: {'; '.join(bad)}")


def policy_expects(policy: Any) -> PolicySpec | None:
    """The ``PolicySpec`` a policy declares in ``expects``, or None (scripted, random, undeclared)."""
    spec = getattr(policy, "expects", None)
    return spec if isinstance(spec, PolicySpec) else None


def is_batched(policy: Any) -> bool:
    """Whether ``policy`` acts on batches natively (has a callable ``act_batch``)."""
    return callable(getattr(policy, "act_batch", None))


class PerEnvPolicies:
    """``BatchedPolicy`` over K per-env ``Policy`` objects, policy ``i`` acting for env ``i`` in a loop.

    For callers that hold K per-env policies themselves. A ``sim.rollout`` policy factory should return the
    per-env policy of the env it is given instead: the rollout builds one per sub-env and loops over them
    next to their envs (``sim.rollout.HostedPolicies``), which privileged experts need.

    Args:
        policies: One per-env policy per env index (K >= 1).
    """

    def __init__(self, policies: Sequence[Policy]):
        if not policies:
            raise ValueError("PerEnvPolicies needs at least one policy")
        self.policies = list(policies)

    @property
    def num_envs(self) -> int:
        """K, the batch size ``act_batch`` expects."""
        return len(self.policies)

    def reset(self, seed: int | None = None, index: int | None = None) -> None:
        """Reset policy ``index`` with ``seed``; with ``index=None`` every policy ``i`` with ``seed + i``.

        ``seed + i`` (``None`` stays ``None``) follows ``gymnasium.vector``'s ``reset(seed=int)``.
        """
        if index is not None:
            self.policies[index].reset(seed=seed)
            return
        for i, p in enumerate(self.policies):
            p.reset(seed=None if seed is None else seed + i)

    def act_batch(self, obs: dict[str, np.ndarray], infos: Sequence[dict[str, Any]]) -> np.ndarray:
        """(K, A) float32: ``policies[i].act`` on row ``i`` of every key of ``obs`` and on ``infos[i]``."""
        k = self.num_envs
        sizes = {key: len(v) for key, v in obs.items()}
        if len(infos) != k or any(n != k for n in sizes.values()):
            raise ValueError(f"PerEnvPolicies: expected {k} observations and infos, got {sizes} and {len(infos)}")
        return np.stack([np.asarray(p.act({key: v[i] for key, v in obs.items()}, infos[i]), dtype=np.float32)
                         for i, p in enumerate(self.policies)])


class RandomPolicy:
    """Uniform random actions from the env's action space, seeded through ``reset``."""

    def __init__(self, action_space):
        self.action_space = action_space

    def reset(self, seed: int | None = None) -> None:
        self.action_space.seed(seed)

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        return np.asarray(self.action_space.sample())


def seeded_robosuite_reset(env: Any, seed: int, reset: Any = None) -> Any:
    """Reset a robosuite env (or LIBERO's, which is one) deterministically from ``seed``.

    robosuite draws object placements from its samplers' ``rng`` attributes (and the env's own ``rng``);
    LIBERO's region samplers and fixture poses use NumPy's global RNG. All of them are seeded here, and the
    global RNG's state is restored afterwards so callers see no side effect. ``reset`` is the callable that
    resets (default ``env.reset``); its result is returned.
    """
    rng = np.random.default_rng(int(seed))
    env.rng = rng
    stack = [getattr(env, "placement_initializer", None)]
    while stack:
        sampler = stack.pop()
        if sampler is None:
            continue
        if hasattr(sampler, "rng"):
            sampler.rng = rng
        stack.extend(getattr(sampler, "samplers", {}).values())
    global_state = np.random.get_state()
    np.random.seed(int(seed) % 2**32)
    try:
        return (reset or env.reset)()
    finally:
        np.random.set_state(global_state)
