"""One resolver for ``--policy`` in every closed loop: ``sim rollout``, ``libero eval``, ``drive eval`` (and ``serve``).

``resolve_policy(name, policy_args)`` turns what the user typed into a picklable factory ``(env) -> Policy``
(``sim.api``), the same way in every command, so a policy one loop accepts the others accept too:

==================  =====================================================================================
``expert``          the env's task-solving privileged expert: ``env.unwrapped.make_task_expert`` where the env
                    has one (LIBERO: ``sim.libero.solver.LiberoSolver``), else its scripted expert
                    (manipulation suite: the scripted pick / reach; driving: the IDM + MOBIL expert)
``scripted``        the env's scripted expert ``env.unwrapped.make_expert(noise=...)`` (LIBERO: the reach-and-
                    grasp script, which does not solve tasks)
``idm``             driving's name for its scripted expert (the IDM + MOBIL driver)
``constant``        driving: keep lane at constant speed (``sim.driving.expert.LaneKeepingPolicy``)
``random``          uniform random actions (``sim.api.RandomPolicy``)
NAME                a policy a method registers in ``core.registry.POLICIES`` (``automot``, ``noreason`` ...),
                    built as ``factory(env, **policy_args)``
CKPT                a checkpoint / run / export folder: ``core.checkpoint.load_policy(CKPT, env, **policy_args)``
``ws://HOST:PORT``  a policy served over openpi's websocket protocol (``sim.remote.RemotePolicy``); its options
                    belong to the server (``embodied serve --policy-arg``), so ``policy_args`` are refused
a callable          ``factory(env, **policy_args)`` (Python API)
==================  =====================================================================================

``policy_args`` (``--policy-arg key=value``, ``parse_policy_args``) are checked against the factory's signature
before any env is built: an unknown key is one line naming the options it takes and the closest one.
``realtime`` puts any of them on the simulated clock (``sim.remote.realtime_factory``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError

#: Names every closed loop accepts, whatever the env (they read the simulator's privileged state, except random).
BUILTIN_POLICIES = ("expert", "scripted", "idm", "constant", "random")
#: Builtins that read only simulator state (no camera needed: a loop may run its envs without images).
STATE_POLICIES = frozenset(BUILTIN_POLICIES)


@dataclass(frozen=True)
class ResolvedPolicy:
    """``factory(env) -> Policy`` (picklable), a label for reports and signatures, and its kind.

    ``kind``: ``"state"`` (a builtin), ``"registered"`` (a ``POLICIES`` name), ``"checkpoint"``, ``"remote"`` or
    ``"callable"``.
    """

    factory: Callable[[Any], Any]
    label: str
    kind: str


# ------------------------------------------------------------------------------------------- arguments
def parse_value(text: str) -> Any:
    """``"3"`` -> 3, ``"0.5"`` -> 0.5, ``"true"`` / ``"false"`` -> bool, ``"none"`` -> None, else the string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_policy_args(items: Sequence[str] | None) -> dict[str, Any]:
    """``["update_interval=2", "refiner=true"]`` -> ``{"update_interval": 2, "refiner": True}``.

    Raises:
        ConfigError: An item without ``=`` or with an empty / non-identifier key, or a repeated key.
    """
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"--policy-arg {item!r}: expected key=value with a Python identifier as key")
        if key in out:
            raise ConfigError(f"--policy-arg {key}: given twice")
        out[key] = parse_value(value)
    return out


def add_policy_arg(parser: Any) -> None:
    """The repeatable ``--policy-arg KEY=VALUE`` flag (``parse_policy_args`` reads it)."""
    parser.add_argument("--policy-arg", action="append", default=[], metavar="KEY=VALUE", dest="policy_arg",
                        help="an option of the policy's factory (repeatable; int / float / true / false / none are "
                             "parsed), e.g. AutoMoT's update_interval=2 refiner=true checkpoint=DIR")


def check_options(fn: Callable[..., Any], options: Mapping[str, Any], what: str, skip: Sequence[str] = ()) -> None:
    """Refuse keys ``fn`` does not take, in one line with the closest one (``fn(env, ...)``: ``env`` is not an option).

    Raises:
        ConfigError: ``--policy-arg KEY: WHAT takes no option 'KEY'; did you mean ...? (options: ...)``.
    """
    if not options:
        return
    target = fn.func if isinstance(fn, functools.partial) else fn
    try:
        params = inspect.signature(target.__init__ if inspect.isclass(target) else target).parameters
    except (TypeError, ValueError):  # a builtin / C callable: let the call decide
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    names = [n for n, p in params.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in ("self", "env", *skip)]
    for key in options:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"--policy-arg {key}: {what} takes no option {key!r}{hint} "
                              f"(options: {', '.join(names) or 'none'})")


# -------------------------------------------------------------------------------------------- builtins
def expert_policy(env: Any, noise: float = 0.0, seed: int | None = None) -> Any:
    """The env's task-solving expert: ``make_task_expert`` (LIBERO's solver) if it has one, else ``make_expert``."""
    unwrapped = env.unwrapped
    make = getattr(unwrapped, "make_task_expert", None) or getattr(unwrapped, "make_expert", None)
    if make is None:
        raise ConfigError(f"--policy expert: {_env_name(env)} has no privileged expert")
    return make(noise=noise, seed=seed)


def scripted_policy(env: Any, noise: float = 0.0, seed: int | None = None) -> Any:
    """The env's scripted expert (``env.unwrapped.make_expert``)."""
    make = getattr(env.unwrapped, "make_expert", None)
    if make is None:
        raise ConfigError(f"--policy scripted: {_env_name(env)} has no scripted expert (make_expert)")
    return make(noise=noise, seed=seed)


def idm_policy(env: Any, noise: float = 0.0, seed: int | None = None) -> Any:
    """Driving's IDM + MOBIL expert (the driving env's scripted expert)."""
    _require_driving(env, "idm")
    return scripted_policy(env, noise=noise, seed=seed)


def constant_policy(env: Any) -> Any:
    """Driving: keep lane at constant speed (``sim.driving.expert.LaneKeepingPolicy``)."""
    _require_driving(env, "constant")
    from sim.driving.expert import LaneKeepingPolicy

    return LaneKeepingPolicy(env.unwrapped)


def random_policy(env: Any) -> Any:
    """Uniform random actions (``sim.api.RandomPolicy``)."""
    from sim.api import RandomPolicy

    return RandomPolicy(env.action_space)


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env.unwrapped).__name__


def _require_driving(env: Any, name: str) -> None:
    from sim.driving.env import DrivingEnv

    if not isinstance(env.unwrapped, DrivingEnv):
        raise ConfigError(f"--policy {name}: a driving policy, and {_env_name(env)} is not a driving env "
                          "(use expert, scripted or random)")


_BUILTINS: dict[str, Callable[..., Any]] = {"expert": expert_policy, "scripted": scripted_policy, "idm": idm_policy,
                                           "constant": constant_policy, "random": random_policy}


def _checkpoint_policy(env: Any, path: str, **options: Any) -> Any:
    from core.checkpoint import load_policy

    return load_policy(path, env, **options)


# -------------------------------------------------------------------------------------------- resolver
def known_policies() -> list[str]:
    """The builtin names, then every name a method registers in ``core.registry.POLICIES``."""
    from core.registry import POLICIES, load_plugins

    load_plugins()
    return [*BUILTIN_POLICIES, *(n for n in POLICIES.names() if n not in BUILTIN_POLICIES)]


def resolve_policy(policy: str | Callable[..., Any], policy_args: Mapping[str, Any] | None = None, *,
                   noise: float = 0.0, api_key_file: str | None = None, replan_steps: int | None = None,
                   realtime: bool = False) -> ResolvedPolicy:
    """``ResolvedPolicy`` for what ``--policy`` names (see the module docstring); nothing is built yet.

    Args:
        policy: A builtin name, a registered name, a checkpoint path, a ``ws://`` URL or a factory.
        policy_args: Options for the factory (checked against its signature now).
        noise: Action noise of ``scripted`` (and ``idm``) unless ``policy_args`` set it.
        api_key_file, replan_steps: For a served policy (``sim.remote.remote_factory``).
        realtime: Simulated real time for any policy (``sim.remote``).

    Raises:
        ConfigError: An unknown name / missing path (listing the known names), an option the factory does not
            take, or options for a served policy.
        CheckpointError: A checkpoint that names no method registering a policy.
    """
    from sim.remote import is_remote, realtime_factory, remote_factory

    options = dict(policy_args or {})
    if is_remote(policy):
        if options:
            raise ConfigError(f"--policy-arg is for a policy built here; {policy} is served elsewhere (pass them to "
                              "`embodied serve --policy-arg`)")
        return ResolvedPolicy(remote_factory(str(policy), api_key_file, replan_steps, realtime), str(policy), "remote")
    if callable(policy):
        check_options(policy, options, _label(policy))
        resolved = ResolvedPolicy(functools.partial(policy, **options), _label(policy), "callable")
    elif policy in _BUILTINS:
        fn = _BUILTINS[policy]
        check_options(fn, options, f"the {policy} policy")
        if policy in ("scripted", "idm"):
            options.setdefault("noise", noise)
        resolved = ResolvedPolicy(functools.partial(fn, **options), str(policy), "state")
    else:
        resolved = _resolve_named(str(policy), options)
    if realtime:
        resolved = ResolvedPolicy(realtime_factory(resolved.factory, replan_steps), resolved.label, resolved.kind)
    return resolved


def _resolve_named(policy: str, options: dict[str, Any]) -> ResolvedPolicy:
    from core.registry import POLICIES, load_plugins

    load_plugins()
    if policy in POLICIES:
        fn = POLICIES.get(policy)
        check_options(fn, options, f"the {policy} policy")
        return ResolvedPolicy(functools.partial(fn, **options), policy, "registered")
    path = Path(policy)
    if not path.exists():
        close = difflib.get_close_matches(policy, known_policies(), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"--policy {policy!r}: neither a policy name nor an existing checkpoint path{hint} "
                          f"(names: {', '.join(known_policies())}; or ws://HOST:PORT)")
    from core.checkpoint import method_entry

    _, fn = method_entry(path, POLICIES, "policy for closed-loop rollouts")  # unreadable / policy-less: one line
    check_options(fn, options, f"{path}'s policy", skip=("checkpoint",))
    resolved = str(path.resolve())
    return ResolvedPolicy(functools.partial(_checkpoint_policy, path=resolved, **options), resolved, "checkpoint")


def _label(fn: Any) -> str:
    """``module.qualname(args)`` for a factory (partials unfolded)."""
    if isinstance(fn, functools.partial):
        args = [repr(a) for a in fn.args] + [f"{k}={v!r}" for k, v in sorted(fn.keywords.items())]
        return f"{_label(fn.func)}({', '.join(args)})"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', None) or type(fn).__module__}.{name}"
