"""``embodied serve POLICY``: any policy the CLI can build, served over openpi's websocket policy protocol.

The server is ``core.serving.PolicyServer``; this module turns a workspace policy into its backend:

* what a client sends is the layout of ``sim.remote`` (openpi's LIBERO example for LIBERO policies, else
  ``observation/<env key>`` plus ``prompt`` and ``task``), checked against the ``observation_spec`` the server
  sends in its metadata (shapes and dtypes), and turned back into the env's observation on this side;
* a policy that predicts whole chunks for a batch (``action_chunk_batch``, e.g. a BC checkpoint) answers the
  requests of all connections gathered by the server in ONE forward (``ChunkBackend``; each request's ``prompt``
  conditions its own row), and returns its whole chunk; ``replan_steps`` in the metadata says how many of its
  actions the policy executes itself before re-planning (a client may choose otherwise);
* any other policy (AutoMoT, random, a world-model planner) keeps one instance per connection, built when the
  connection opens or resets (``SessionBackend``); its answer is a chunk of one action.

Policies that read their own simulator's privileged state (LIBERO's ``expert`` / ``scripted``, driving's ``idm`` /
``constant``) cannot act on a remote client's observations and are refused in one line.

Metadata sent on connect (besides ``observation_spec`` and ``protocol``, which the server adds): ``policy``,
``method``, ``checkpoint``, ``env_id``, ``family``, ``action_dim``, ``chunk_length``, ``replan_steps``,
``image_convention`` (LIBERO: ``rot180``, the raw render rotated 180 degrees, as openpi and LeRobot), ``render_size``
(LIBERO: the side the policy was trained at; a client renders there and pads up to 224), ``wire``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigError

PRIVILEGED = ("expert", "scripted", "idm", "constant")
DEFAULT_DRIVING_ENV = "embodied/Drive-Highway-v0"


# ----------------------------------------------------------------------------------------- the wire
class LiberoWire:
    """openpi's LIBERO example observation <-> ``LiberoEnv`` observation (``sim.libero.openpi``)."""

    name = "openpi-libero"

    def __init__(self, image_size: int, wrist: bool):
        from core.serving import FieldSpec
        from sim.libero.openpi import OPENPI_LIBERO_SPEC

        self.image_size, self.wrist = int(image_size), bool(wrist)
        self.spec = {k: FieldSpec(tuple(shape), dtype) for k, (shape, dtype) in OPENPI_LIBERO_SPEC.items()
                     if wrist or k != "observation/wrist_image"}

    def env_observation(self, request: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The request as a ``LiberoEnv`` observation at the policy's side (``sim.libero.openpi``)."""
        from sim.libero.openpi import env_observation

        return env_observation(request, self.image_size, self.wrist)

    def instruction(self, request: Mapping[str, Any]) -> list[str] | None:
        """The request's ``prompt`` and, when it is a LIBERO task's benchmark text, that task's BDDL text.

        A policy trained on LIBERO's demo files knows the task by the latter, as ``load_policy`` finds it in process.
        """
        prompt = request.get("prompt")
        if not isinstance(prompt, str):
            return None
        bddl = _libero_bddl_texts().get(" ".join(prompt.lower().split()).rstrip("."))
        return [prompt, bddl] if bddl else [prompt]


def _libero_bddl_texts() -> dict[str, str]:
    """LIBERO benchmark instruction (compared by words) -> its BDDL text, over the five suites (built once)."""
    global _BDDL_TEXTS
    if _BDDL_TEXTS is None:
        from sim.libero.suites import SUITES, list_tasks

        _BDDL_TEXTS = {" ".join(t.language.lower().split()).rstrip("."): t.bddl_language
                       for suite in SUITES for t in list_tasks(suite)}
    return _BDDL_TEXTS


_BDDL_TEXTS: dict[str, str] | None = None


class EnvKeyWire:
    """``observation/<key>`` of the env's own observation keys (driving, the manipulation suite)."""

    name = "observation/<env key>"

    def __init__(self, observation_space: Any, keys: Sequence[str]):
        from core.serving import FieldSpec

        spaces = dict(getattr(observation_space, "spaces", {}) or {})
        self.keys = [k for k in keys if k in spaces]
        self.spec = {f"observation/{k}": FieldSpec(tuple(int(d) for d in spaces[k].shape), str(spaces[k].dtype))
                     for k in self.keys}

    def env_observation(self, request: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The request's ``observation/<key>`` arrays under the env's keys."""
        return {k: np.asarray(request[f"observation/{k}"]) for k in self.keys}


# --------------------------------------------------------------------------------------- backends
class ChunkBackend:
    """One policy, whole chunks for all the gathered requests in one forward (``action_chunk_batch``)."""

    def __init__(self, policy: Any, wire: Any, metadata: dict[str, Any]):
        self.policy, self.wire, self._metadata = policy, wire, metadata
        self.observation_spec = wire.spec

    def metadata(self) -> dict[str, Any]:
        """What the server sends on connect (it adds ``observation_spec`` and ``protocol``)."""
        return dict(self._metadata)

    def open_session(self, seed: int | None = None) -> dict[str, Any]:
        """A connection's policy state (a new one on connect and on a reset message)."""
        return {"seed": seed}

    def close_session(self, session: Any) -> None:
        """Forget a connection's state."""
        pass

    def infer_batch(self, sessions: Sequence[Any], observations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """One reply (``actions``: a chunk) per request, in order."""
        rows = [self.wire.env_observation(o) for o in observations]
        batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        instruction = getattr(self.wire, "instruction", None)
        prompts = [instruction(o) if instruction else (o["prompt"] if isinstance(o.get("prompt"), str) else None)
                   for o in observations]
        chunks = np.asarray(self.policy.action_chunk_batch(batch, instructions=prompts), dtype=np.float32)
        return [{"actions": chunks[i]} for i in range(len(rows))]


class SessionBackend:
    """One policy instance per connection, built from ``factory(env)`` on the connection's first request.

    ``envs(task)`` gives the env a session's policy is built for (driving: the scenario the request's ``task``
    names, so that AutoMoT knows its route instruction); envs are built once per task and kept.
    """

    def __init__(self, factory: Any, envs: Any, wire: Any, metadata: dict[str, Any]):
        self.factory, self.envs, self.wire, self._metadata = factory, envs, wire, metadata
        self.observation_spec = wire.spec

    def metadata(self) -> dict[str, Any]:
        """What the server sends on connect (it adds ``observation_spec`` and ``protocol``)."""
        return dict(self._metadata)

    def open_session(self, seed: int | None = None) -> dict[str, Any]:
        """A connection's policy state (a new one on connect and on a reset message)."""
        return {"seed": seed, "policy": None, "task": None}

    def close_session(self, session: Any) -> None:
        """Forget a connection's state."""
        session["policy"] = None

    def _policy(self, session: dict[str, Any], task: str | None) -> Any:
        if session["policy"] is None or (task and task != session["task"]):
            from sim.api import is_batched
            from sim.remote import _SingleEnv

            policy = self.factory(self.envs(task))
            policy = _SingleEnv(policy) if is_batched(policy) else policy
            policy.reset(seed=session["seed"])
            session.update(policy=policy, task=task)
        return session["policy"]

    def infer_batch(self, sessions: Sequence[Any], observations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """One reply (``actions``: a chunk) per request, in order."""
        out = []
        for session, request in zip(sessions, observations, strict=True):
            task = request.get("task") if isinstance(request.get("task"), str) else None
            action = self._policy(session, task).act(self.wire.env_observation(request), {})
            out.append({"actions": np.asarray(action, dtype=np.float32).reshape(1, -1)})
        return out


# ------------------------------------------------------------------------------------------ building
def _make_env(env_id: str, **kwargs: Any) -> Any:
    import gymnasium as gym

    from sim.rollout import check_env_id

    check_env_id(env_id)
    return gym.make(env_id, **kwargs)


def _checkpoint(path: Path) -> tuple[Path, dict[str, Any]]:
    """(resolved checkpoint, its ``config.json``) of a policy checkpoint folder (one-line errors)."""
    from core.checkpoint import method_entry
    from core.io import read_json
    from core.registry import POLICIES

    ckpt, _ = method_entry(path, POLICIES, "policy for closed-loop rollouts")
    cfg = read_json(Path(ckpt) / "config.json") if (Path(ckpt) / "config.json").is_file() else {}
    return Path(ckpt), cfg if isinstance(cfg, dict) else {}


def build_backend(policy: str, env_id: str | None = None, policy_args: Mapping[str, Any] | None = None) -> Any:
    """The backend that serves ``policy`` (a checkpoint folder or a registered / built-in name).

    Raises:
        ConfigError: A privileged policy, an unknown one, no env to build it for, or a policy whose inputs the wire
            does not carry (a LIBERO policy reading ``joint_states``).
    """
    import functools

    import sim
    from sim.api import policy_expects

    sim.register_envs()
    kwargs = dict(policy_args or {})
    if policy in PRIVILEGED:
        raise ConfigError(f"{policy!r} reads its own simulator's privileged state, so it cannot act on a remote "
                          "client's observations; serve a learned policy (a checkpoint folder, automot, random)")
    from sim.policies import resolve_policy

    if policy == "random" and env_id is None:
        raise ConfigError("random needs --env ENV_ID (the action space it samples; `embodied sim list`)")
    resolved = resolve_policy(policy, kwargs)  # the resolver every closed loop uses; unknown names: one line
    factory, label, method, checkpoint = resolved.factory, resolved.label, None, None
    if resolved.kind == "registered":  # a method's named policy (automot, noreason): driving's
        env_id = env_id or DEFAULT_DRIVING_ENV
        method, checkpoint = policy, kwargs.get("checkpoint")
    elif resolved.kind == "checkpoint":
        ckpt, cfg = _checkpoint(Path(policy))
        env_id = env_id or (cfg.get("env") or {}).get("id")
        if env_id is None:
            raise ConfigError(f"{policy}: its config names no env; pass --env ENV_ID")
        method, checkpoint = cfg.get("method"), str(ckpt.resolve())

    family = "libero" if "/Libero-" in env_id else "driving" if "/Drive-" in env_id else "manipulation"
    template = _make_env(env_id, **({"images": True, "wrist_image": True} if family == "libero" else {}))
    built = factory(template)
    spec = policy_expects(built)
    reads = list(spec.observation) if spec is not None else list(template.observation_space.spaces)
    metadata: dict[str, Any] = {"policy": label, "method": method, "checkpoint": checkpoint, "env_id": env_id,
                                "family": family, "action_dim": int(np.prod(template.action_space.shape))}
    if family == "libero":
        side = next((int(s[0]) for k, s in (spec.observation.items() if spec else ())
                     if k == "image" and s and s[0]), None) or 128
        if side != template.unwrapped.image_size:  # rebuild at the policy's side (its obs adapter is per env)
            template.close()
            template = _make_env(env_id, images=True, wrist_image=True, image_size=side)
            built = factory(template)
        _check_libero_inputs(built, label)
        wire: Any = LiberoWire(side, wrist="wrist_image" in reads)
        metadata.update(image_convention=str(template.unwrapped.metadata.get("image_convention", "rot180")),
                        render_size=side)
    else:
        wire = EnvKeyWire(template.observation_space, reads)
    metadata["wire"] = wire.name
    if callable(getattr(built, "action_chunk_batch", None)):
        cfg = getattr(getattr(built, "model", None), "config", None)
        metadata.update(chunk_length=int(getattr(cfg, "horizon", 1) or 1),
                        replan_steps=int(getattr(cfg, "n_action_steps", 1) or 1))
        return ChunkBackend(built, wire, metadata)
    metadata.update(chunk_length=1, replan_steps=1)
    envs = functools.lru_cache(maxsize=None)(functools.partial(_session_env, env_id=env_id, family=family,
                                                               template=template))
    return SessionBackend(factory, envs, wire, metadata)


def _session_env(task: str | None, env_id: str, family: str, template: Any) -> Any:
    """The env a session's policy is built for: the driving scenario the request names, else the template."""
    if family == "driving" and task:
        from sim.driving.registration import SCENARIOS

        if task in SCENARIOS and SCENARIOS[task].env_id != env_id:
            return _make_env(SCENARIOS[task].env_id)
    return template


def _check_libero_inputs(policy: Any, label: str) -> None:
    """Refuse a LIBERO policy that reads what openpi's observation does not carry (the arm's joint positions)."""
    from sim.libero.openpi import PROPRIO_KEYS_SENT

    cfg = getattr(getattr(policy, "model", None), "config", None)
    keys = list(getattr(cfg, "proprio_keys", None) or [])
    missing = [k for k in keys if k not in PROPRIO_KEYS_SENT and k != "proprio"]
    if missing:
        raise ConfigError(f"{label}: reads {', '.join(missing)}, which openpi's LIBERO observation does not carry "
                          f"(it sends {', '.join(PROPRIO_KEYS_SENT)})")


# --------------------------------------------------------------------------------------------- the CLI
def configure_parser(p: Any, positive_int: Any, non_negative_int: Any) -> None:
    """The ``embodied serve`` flags."""
    p.add_argument("policy", metavar="POLICY",
                   help="a checkpoint folder (of any method that acts) | automot | noreason | random")
    p.add_argument("--env", default=None, metavar="ENV_ID",
                   help="the env the policy acts in (default: the checkpoint's; automot: embodied/Drive-Highway-v0; "
                        "random: required)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: %(default)s, this machine only; any other needs --api-key-file)")
    p.add_argument("--port", type=non_negative_int, default=8000, help="port (default: %(default)s; 0: any free)")
    p.add_argument("--api-key-file", default=None, metavar="F",
                   help="a file holding the key clients must send as `Authorization: Api-Key KEY`")
    p.add_argument("--max-batch", type=positive_int, default=8, metavar="B",
                   help="requests of concurrent clients answered by one forward, at most (default: %(default)s)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, metavar="T",
                   help="how long the first request of a batch waits for others (default: %(default)s ms)")
    from sim.policies import add_policy_arg

    add_policy_arg(p)


def serve_command(args: Any) -> int:
    """``embodied serve``: build the backend, bind, print where it listens, serve until SIGTERM / Ctrl-C."""
    from core.bootstrap import prepare_process
    from core.serving import PolicyServer, read_api_key
    from sim.policies import parse_policy_args

    if args.max_wait_ms < 0:
        raise ConfigError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
    key = read_api_key(args.api_key_file) if args.api_key_file else None
    from core.serving.server import is_loopback

    if key is None and not is_loopback(args.host):  # before minutes of building: PolicyServer refuses it too
        raise ConfigError(f"--host {args.host} is reachable from other machines: serving there needs an API key "
                          "(--api-key-file F), or keep the default 127.0.0.1")
    prepare_process()
    backend = build_backend(args.policy, args.env, parse_policy_args(args.policy_arg))
    server = PolicyServer(backend, host=args.host, port=args.port, api_key=key, max_batch=args.max_batch,
                          max_wait_ms=args.max_wait_ms)
    meta = backend.metadata()

    def ready(srv: Any) -> None:  # the bound port (--port 0 picks one): a line a script can wait for
        print(f"serving {meta['policy']} ({meta['family']}, {meta['env_id']}, chunks of {meta['chunk_length']}) "
              f"at {srv.url}{' with an API key' if key else ''}; health: /healthz; Ctrl-C or SIGTERM stops it",
              file=sys.stderr, flush=True)

    return server.serve_forever(on_ready=ready)
