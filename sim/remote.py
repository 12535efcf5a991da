"""Policies served elsewhere, and simulated real time, in the workspace's closed loops.

``--policy ws://HOST:PORT`` (or ``wss://``) in ``embodied libero eval``, ``sim rollout`` and ``drive eval`` builds a
``RemotePolicy`` per env: a client of openpi's websocket policy protocol (``core.serving``), so a policy served by
``embodied serve`` on a GPU box, by openpi's own ``serve_policy.py`` or by any server written to be
openpi-compatible acts in our simulators.

What goes over the wire (``observation_for``):
    LIBERO     exactly openpi's LIBERO example (``sim.libero.openpi``): ``observation/image`` and
               ``observation/wrist_image`` (the raw render rotated 180 degrees, resized with padding to 224 x 224,
               uint8), ``observation/state`` (8,) (end-effector position, axis-angle, the 2 gripper joints),
               ``prompt`` (the task's language).
    others     (driving, the manipulation suite) every key of the env's observation as ``observation/<key>``
               unchanged (driving: ``image``, ``bev``, ``ego_state``, ``proprio``, ``route``, ``agents``; see
               ``sim.driving.env``), ``prompt`` (the env's ``language_instruction``) and ``task`` (the env's task,
               e.g. the driving scenario ``highway``).
The reply's ``actions`` is a chunk (T, A) (an (A,) reply is a chunk of one). The first ``replan_steps`` actions are
executed, then the policy asks again (openpi's LIBERO example uses 5); ``replan_steps=None`` takes the server's
``replan_steps`` metadata, else the whole chunk.

Real time (``realtime=True``, ``--realtime``): inference costs simulated time, as on a robot or a car. Each request's
wall-clock latency ``L`` (network and server included) is charged as ``floor(L / dt)`` control periods of the env
(``dt``: LIBERO 0.05 s, driving 0.2 s) during which the simulator goes on stepping: with the rest of the current
chunk while there is one, then holding its last action (before the first chunk: the env's no-op). When a chunk
lands its first ``floor(L / dt)`` actions lie in the past and are skipped. The next request is sent once
``replan_steps`` actions have run since the current chunk landed (the cadence without ``--realtime``), so with zero
latency both modes act identically. The simulator does not really run concurrently: the clock is
virtual, which makes the mode independent of how fast this machine simulates (LIBERO on a CPU steps slower than
20 Hz). ``RealtimePolicy`` gives any in-process policy the same treatment (its ``action_chunk`` when it has one,
else one action per request), so a local and a served policy are compared on the same footing. Every policy here
reports its requests' latencies in ``episode_stats()`` (p50 / p99 ms, held steps).

A server lost mid-episode raises ``core.serving.ConnectionLost`` from ``act`` (the harness fails or re-runs that
episode, see each harness); the next ``reset`` reconnects with back-off for up to ``server_wait_s`` seconds and
raises ``core.serving.ServerUnavailable`` (one line) when the server does not come back.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigError

REMOTE_SCHEMES = ("ws://", "wss://")
SERVER_WAIT_S = 300.0
"""How long a harness waits for a lost server to come back before it stops (resumable runs resume)."""


def is_remote(policy: Any) -> bool:
    """Whether ``--policy`` names a served policy (``ws://`` / ``wss://``)."""
    return isinstance(policy, str) and policy.startswith(REMOTE_SCHEMES)


# ------------------------------------------------------------------------------------------ the wire
def env_family(env: Any) -> str:
    """``"libero"``, ``"driving"``, ``"manipulation"`` ... from the env's metadata (``"unknown"`` without)."""
    meta = getattr(getattr(env, "unwrapped", env), "metadata", None) or {}
    return str(meta.get("family") or "unknown")


def observation_for(env: Any, obs: Mapping[str, Any]) -> dict[str, Any]:
    """The request for one env observation (the layout of the module docstring)."""
    meta = getattr(getattr(env, "unwrapped", env), "metadata", None) or {}
    language = str(meta.get("language_instruction") or "")
    if env_family(env) == "libero":
        from sim.libero.openpi import openpi_observation

        return openpi_observation(obs, language)
    out: dict[str, Any] = {f"observation/{k}": np.asarray(v) for k, v in obs.items()}
    out["prompt"] = language
    out["task"] = str(meta.get("task") or "")
    return out


def chunk_from_reply(reply: Any, action_dim: int) -> np.ndarray:
    """(T, A) float32 from a reply's ``actions`` (an (A,) action is a chunk of one).

    Raises:
        ValueError: No ``actions``, or actions of another dimension (one line).
    """
    if not isinstance(reply, Mapping) or "actions" not in reply:
        keys = sorted(map(str, reply)) if isinstance(reply, Mapping) else type(reply).__name__
        raise ValueError(f"the server's reply has no 'actions' (it has {keys})")
    a = np.asarray(reply["actions"], dtype=np.float32)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[1] != action_dim or len(a) == 0:
        raise ValueError(f"the server's actions have shape {a.shape}, expected (T, {action_dim})")
    return a


# ------------------------------------------------------------------------------- chunks in (virtual) time
class ChunkExecutor:
    """Turns a chunk source into one action per env step, in plain or simulated real time (module docstring).

    Args:
        request: ``(obs, info) -> (T, A)`` chunk for an observation (a remote call or an in-process policy).
        dt: The env's control period in seconds (real time only).
        replan_steps: Actions of each chunk executed before the next request (None: the whole chunk).
        realtime: Charge each request's latency as simulated time.
        hold_action: (A,) action sent before the first chunk has landed (real time only).
        clock: Seconds, monotonic (``time.perf_counter``; tests give a fake one).
    """

    def __init__(self, request: Callable[[Mapping[str, Any], Mapping[str, Any]], np.ndarray], *, dt: float,
                 replan_steps: int | None, realtime: bool = False, hold_action: np.ndarray | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if replan_steps is not None and int(replan_steps) < 1:
            raise ConfigError(f"--replan-steps must be >= 1, got {replan_steps}")
        if realtime and not dt > 0:
            raise ConfigError(f"real time needs the env's control period, got dt={dt}")
        self.request, self.dt, self.realtime = request, float(dt), bool(realtime)
        self.replan_steps = None if replan_steps is None else int(replan_steps)
        self.hold_action = None if hold_action is None else np.asarray(hold_action, dtype=np.float32)
        self.clock = clock
        self.latencies_ms: list[float] = []
        self.reset()

    def reset(self) -> None:
        """A new episode: no chunk, clock at 0; the episode's latencies start afresh."""
        self.t = 0
        self.chunk: np.ndarray | None = None
        self.chunk_t0 = 0
        self.next_request_at = 0
        self.pending: tuple[np.ndarray, int, int] | None = None  # (chunk, its observation's step, landing step)
        self.last: np.ndarray | None = None
        self.latencies_ms = []
        self.held_steps = 0

    def _replan(self, chunk: np.ndarray) -> int:
        return len(chunk) if self.replan_steps is None else min(self.replan_steps, len(chunk))

    def act(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> np.ndarray:
        """The action for the current step (see the module docstring for the timing)."""
        t = self.t
        if self.pending is not None and t >= self.pending[2]:
            self.chunk, self.chunk_t0, _ = self.pending
            self.pending = None
            self.next_request_at = t + self._replan(self.chunk)
        if self.pending is None and t >= self.next_request_at:
            start = self.clock()
            chunk = np.asarray(self.request(obs, info), dtype=np.float32)
            latency = self.clock() - start
            self.latencies_ms.append(1000.0 * latency)
            delay = int(math.floor(latency / self.dt + 1e-9)) if self.realtime else 0
            if delay == 0:
                self.chunk, self.chunk_t0 = chunk, t
                self.next_request_at = t + self._replan(chunk)
            else:
                self.pending = (chunk, t, t + delay)
        idx = t - self.chunk_t0
        if self.chunk is not None and idx < (len(self.chunk) if self.realtime else self._replan(self.chunk)):
            action = self.chunk[idx]
        else:
            action = self.last if self.last is not None else self.hold_action
            self.held_steps += 1
            if action is None:
                raise RuntimeError("no action yet and no hold action")
        self.last = np.asarray(action, dtype=np.float32)
        self.t = t + 1
        return self.last

    def stats(self) -> dict[str, Any]:
        """Requests, their latency (p50 / p99 / mean ms) and the steps that held the last action."""
        lat = np.asarray(self.latencies_ms, dtype=np.float64)
        out: dict[str, Any] = {"requests": int(lat.size), "held_steps": int(self.held_steps),
                               "realtime": self.realtime}
        if lat.size:
            out.update(latency_ms_p50=float(np.percentile(lat, 50)), latency_ms_p99=float(np.percentile(lat, 99)),
                       latency_ms_mean=float(lat.mean()))
        return out


def control_period(env: Any) -> float:
    """The env's control period in seconds: 1 / ``policy_frequency`` (driving) or 1 / ``render_fps`` (LIBERO)."""
    base = getattr(env, "unwrapped", env)
    hz = getattr(base, "policy_frequency", None) or (getattr(base, "metadata", None) or {}).get("render_fps")
    if not hz:
        raise ConfigError(f"{type(base).__name__}: no control rate (policy_frequency / render_fps) for --realtime")
    return 1.0 / float(hz)


def noop_action(env: Any) -> np.ndarray:
    """The action held before a first chunk lands: LIBERO's settle action (arm still, gripper open), else zeros
    clipped into the action box (driving: no acceleration, no steering)."""
    space = env.action_space
    if env_family(env) == "libero":
        return np.asarray((0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0), dtype=np.float32)
    return np.clip(np.zeros(space.shape, np.float32), space.low, space.high).astype(np.float32)


# ------------------------------------------------------------------------------------- the client side
class RemotePolicy:
    """``sim.api.Policy`` that asks a served policy for action chunks (see the module docstring).

    Args:
        env: The env it acts in (its family picks the observation layout; its action space is checked against the
            server's ``action_dim``).
        url: ``ws://HOST:PORT`` or ``wss://...``.
        api_key: Sent as ``Authorization: Api-Key ...`` (None: no header).
        replan_steps: Actions of each chunk to execute (None: the server's ``replan_steps``, else the whole chunk).
        realtime: Simulated real time (module docstring).
        server_wait_s: How long ``reset`` waits, with back-off, for a lost server.
        connect_timeout: Seconds to wait for the first connection.
    """

    def __init__(self, env: Any, url: str, api_key: str | None = None, replan_steps: int | None = None,
                 realtime: bool = False, server_wait_s: float = SERVER_WAIT_S, connect_timeout: float = 30.0):
        from core.serving import PolicyClient

        self.env, self.url, self.server_wait_s = env, url, float(server_wait_s)
        self.client = PolicyClient(url, api_key=api_key, connect_timeout=connect_timeout)
        self.metadata = dict(self.client.metadata or {})
        self.action_dim = int(np.prod(env.action_space.shape))
        served = self.metadata.get("action_dim")
        if served is not None and int(served) != self.action_dim:
            self.client.close()
            raise ConfigError(f"--policy {url}: the server's policy returns {served}-D actions, this env takes "
                              f"{self.action_dim}-D ({getattr(env.spec, 'id', None) or type(env).__name__})")
        family, theirs = env_family(env), self.metadata.get("family")
        if theirs and family != "unknown" and str(theirs) != family:
            self.client.close()
            raise ConfigError(f"--policy {url}: the server's policy is for {theirs} envs, this env is {family}")
        if replan_steps is None and self.metadata.get("replan_steps"):
            replan_steps = int(self.metadata["replan_steps"])
        self.expects = _served_spec(self.metadata, env, url)
        self._lost: str | None = None
        self.server_timing: list[dict[str, Any]] = []
        self.executor = ChunkExecutor(self._request, dt=control_period(env) if realtime else 0.0,
                                      replan_steps=replan_steps, realtime=realtime, hold_action=noop_action(env))

    def _request(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> np.ndarray:
        from core.serving import ConnectionLost

        try:
            reply = self.client.infer(observation_for(self.env, obs))
        except ConnectionLost as e:
            self._lost = str(e)
            raise
        timing = reply.get("server_timing") if isinstance(reply, Mapping) else None
        if isinstance(timing, Mapping):
            self.server_timing.append(dict(timing))
        return chunk_from_reply(reply, self.action_dim)

    def reset(self, seed: int | None = None) -> None:
        """A new episode: drop the chunk; after a lost connection first reconnect (back-off, ``server_wait_s``)."""
        if self._lost is not None:
            self.client.reconnect(self.server_wait_s)
            self._lost = None
        self.executor.reset()
        self.server_timing = []
        self.client.reset(seed)

    def reconnect(self) -> None:
        """Wait (with back-off, up to ``server_wait_s``) until the server answers again."""
        self.client.reconnect(self.server_wait_s)
        self._lost = None

    def act(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> np.ndarray:
        return self.executor.act(obs, info)

    def episode_stats(self) -> dict[str, Any]:
        """The episode's requests and latencies (``ChunkExecutor.stats``) and the server's mean inference time."""
        out = self.executor.stats()
        infer = [float(t["infer_ms"]) for t in self.server_timing if "infer_ms" in t]
        if infer:
            out["server_infer_ms_mean"] = float(np.mean(infer))
        return out

    def close(self) -> None:
        self.client.close()


def _served_spec(metadata: Mapping[str, Any], env: Any, url: str):
    """The env settings a LIBERO harness should render for a served policy (``sim.api.PolicySpec``), or None.

    openpi's LIBERO observation is always 224 x 224; our server says at which side its policy was trained
    (``render_size``), so the client renders there and pads up; an openpi server says nothing: 256 px as openpi's
    LIBERO example renders. The wrist camera is rendered when the server's spec reads it (or says nothing).
    """
    if env_family(env) != "libero":
        return None
    from sim.api import PolicySpec

    side = int(metadata.get("render_size") or 256)
    spec = metadata.get("observation_spec")
    wrist = True if not isinstance(spec, Mapping) else "observation/wrist_image" in spec
    obs = {"image": (side, side, 3), "proprio": (None,)}
    if wrist:
        obs["wrist_image"] = (side, side, 3)
    return PolicySpec(obs, (7,), source=url)


def remote_policy(env: Any, url: str, api_key_file: str | None = None, replan_steps: int | None = None,
                  realtime: bool = False, server_wait_s: float | None = None) -> RemotePolicy:
    """Picklable factory ``(env) -> RemotePolicy`` (``functools.partial`` over the other arguments); the API key is
    read from its file in the process that connects (it never travels in a config or a pickle)."""
    from core.serving import read_api_key

    key = read_api_key(api_key_file) if api_key_file else None
    return RemotePolicy(env, url, api_key=key, replan_steps=replan_steps, realtime=realtime,
                        server_wait_s=SERVER_WAIT_S if server_wait_s is None else server_wait_s)


def remote_factory(url: str, api_key_file: str | Path | None = None, replan_steps: int | None = None,
                   realtime: bool = False, server_wait_s: float | None = None) -> Callable[[Any], RemotePolicy]:
    """``functools.partial(remote_policy, ...)`` after checking the arguments (one-line errors, before any env)."""
    if not is_remote(url):
        raise ConfigError(f"--policy {url!r}: a served policy is named ws://HOST:PORT or wss://HOST:PORT")
    if api_key_file is not None and not Path(api_key_file).is_file():
        raise ConfigError(f"--api-key-file {api_key_file}: no such file")
    if replan_steps is not None and int(replan_steps) < 1:
        raise ConfigError(f"--replan-steps must be >= 1, got {replan_steps}")
    return functools.partial(remote_policy, url=url, api_key_file=None if api_key_file is None else str(api_key_file),
                             replan_steps=replan_steps, realtime=realtime, server_wait_s=server_wait_s)


def add_remote_arguments(parser: Any, positive_int: Callable[[str], int], period: str) -> None:
    """The flags every closed loop takes for a served policy or simulated real time (``period``: the env's control
    period, for the help text): ``--api-key-file``, ``--replan-steps``, ``--realtime``."""
    parser.add_argument("--api-key-file", default=None, metavar="F", dest="api_key_file",
                        help="ws:// only: send the key in F as `Authorization: Api-Key KEY`")
    parser.add_argument("--replan-steps", type=positive_int, default=None, metavar="K", dest="replan_steps",
                        help="execute K actions of each returned chunk, then ask again (default: the server's "
                             "replan_steps, else the whole chunk; openpi's LIBERO example uses 5)")
    parser.add_argument("--realtime", action="store_true",
                        help=f"simulated real time: each request's latency costs control periods ({period}) in which "
                             "the simulator goes on with the current chunk, then holds its last action")


def latency_summary(stats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Request latency over episodes (their policies' ``episode_stats``), or {} when none reports it.

    ``latency_ms_mean`` weighs every request alike; ``latency_ms_p50`` is the median of the episodes' medians and
    ``latency_ms_p99`` the 99th percentile of their 99th percentiles; ``held_steps`` counts the steps (real time) that
    held the last action while a request was in flight.
    """
    rows = [r for r in stats if isinstance(r, Mapping) and r.get("requests") and "latency_ms_p50" in r]
    if not rows:
        return {}
    n = sum(int(r["requests"]) for r in rows)
    return {"requests": n,
            "latency_ms_mean": float(sum(r["latency_ms_mean"] * r["requests"] for r in rows) / n),
            "latency_ms_p50": float(np.median([r["latency_ms_p50"] for r in rows])),
            "latency_ms_p99": float(np.percentile([r["latency_ms_p99"] for r in rows], 99)),
            "held_steps": int(sum(int(r.get("held_steps", 0)) for r in rows))}


# ------------------------------------------------------------------------------------ in-process real time
class RealtimePolicy:
    """Any in-process per-env policy in simulated real time (the module docstring's clock).

    A policy with ``action_chunk(obs, info) -> (T, A)`` is asked for chunks (``replan_steps`` None: its own
    ``n_action_steps`` when it has a model config saying so, else the whole chunk); any other is asked one action
    per request (``act``), so its whole per-step compute is the latency.
    """

    def __init__(self, inner: Any, env: Any, replan_steps: int | None = None):
        self.inner = inner
        self.expects = getattr(inner, "expects", None)
        chunked = callable(getattr(inner, "action_chunk", None))
        if chunked and replan_steps is None:
            cfg = getattr(getattr(inner, "model", None), "config", None)
            replan_steps = getattr(cfg, "n_action_steps", None)
        request = (lambda obs, info: inner.action_chunk(obs, info)) if chunked else (
            lambda obs, info: np.asarray(inner.act(obs, info), dtype=np.float32)[None])
        self.executor = ChunkExecutor(request, dt=control_period(env), replan_steps=replan_steps if chunked else 1,
                                      realtime=True, hold_action=noop_action(env))
        if callable(getattr(inner, "overlay", None)):
            self.overlay = inner.overlay

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed=seed)
        self.executor.reset()

    def act(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> np.ndarray:
        return self.executor.act(obs, info)

    def episode_stats(self) -> dict[str, Any]:
        out = self.executor.stats()
        inner = getattr(self.inner, "episode_stats", None)
        if callable(inner):
            with contextlib.suppress(Exception):  # diagnostics never fail an episode
                out["policy"] = inner()
        return out


class LatencyProbe:
    """Wraps an in-process per-env policy to time each ``act`` (``episode_stats``: p50 / p99 ms), unchanged
    otherwise: the latency column of a report that did not ask for real time."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.expects = getattr(inner, "expects", None)
        self.latencies_ms: collections.deque[float] = collections.deque()
        if callable(getattr(inner, "overlay", None)):
            self.overlay = inner.overlay

    def reset(self, seed: int | None = None) -> None:
        self.latencies_ms.clear()
        self.inner.reset(seed=seed)

    def act(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> np.ndarray:
        start = time.perf_counter()
        try:
            return self.inner.act(obs, info)
        finally:
            self.latencies_ms.append(1000.0 * (time.perf_counter() - start))

    def episode_stats(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms, dtype=np.float64)
        out: dict[str, Any] = {"requests": int(lat.size)}
        if lat.size:
            out.update(latency_ms_p50=float(np.percentile(lat, 50)), latency_ms_p99=float(np.percentile(lat, 99)),
                       latency_ms_mean=float(lat.mean()))
        inner = getattr(self.inner, "episode_stats", None)
        if callable(inner):
            with contextlib.suppress(Exception):  # diagnostics never fail an episode
                out["policy"] = inner()
        return out


def realtime_factory(factory: Callable[[Any], Any], replan_steps: int | None = None) -> Callable[[Any], Any]:
    """``factory`` whose policies run in simulated real time (picklable when ``factory`` is)."""
    return functools.partial(_realtime_build, factory=factory, replan_steps=replan_steps)


def _realtime_build(env: Any, factory: Callable[[Any], Any], replan_steps: int | None) -> Any:
    from sim.api import is_batched

    inner = factory(env)
    if isinstance(inner, RemotePolicy):
        return inner  # already on the clock (built with realtime=True)
    if is_batched(inner):
        inner = _SingleEnv(inner)
    return RealtimePolicy(inner, env, replan_steps)


class _SingleEnv:
    """A natively batched policy driven as a per-env one (index 0), keeping its ``action_chunk`` hook."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.expects = getattr(inner, "expects", None)
        self.model = getattr(inner, "model", None)
        if callable(getattr(inner, "action_chunk", None)):
            self.action_chunk = inner.action_chunk

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed=seed, index=0)

    def act(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> np.ndarray:
        return np.asarray(self.inner.act_batch({k: np.asarray(v)[None] for k, v in obs.items()}, [info]))[0]
