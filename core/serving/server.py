"""A policy server speaking openpi's websocket protocol, with cross-connection batching.

One asyncio event loop (``websockets.asyncio.server``) owns the sockets; every backend call — ``metadata``,
``open_session``, ``close_session``, ``infer_batch`` — runs on ONE dedicated worker thread, one call at a time,
so a backend needs no locks and the loop keeps answering pings, health checks, handshakes and malformed
frames while the policy computes. Requests waiting for the worker are gathered into one ``infer_batch`` call
(up to ``max_batch``, waiting at most ``max_wait_ms`` after the first). See ``core/serving/__init__.py`` for
the wire protocol.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import itertools
import logging
import math
import queue
import signal
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol, runtime_checkable

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from core.errors import ConfigError, EmbodiedError
from core.logging import get_logger
from core.serving.codec import CodecError, packb, unpackb
from core.serving.spec import FieldSpec, ObservationError, spec_to_metadata, validate_observation

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "PROTOCOL_NAME", "FunctionBackend", "FunctionSession", "PolicyBackend",
           "PolicyServer", "is_loopback"]

PROTOCOL_NAME = "openpi-websocket"
DEFAULT_MAX_MESSAGE_BYTES = 32 * 2**20
_LATENCY_WINDOW = 10_000  # stats() percentiles are over the last this many answered requests

log = get_logger("serving")
_ws_log = log.getChild("websockets")  # websockets' own messages: one per connection at INFO, so warnings only
_ws_log.setLevel(logging.WARNING)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` only listens on this machine: ``localhost``, 127.0.0.0/8 or ::1."""
    if host is None:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost, or "" (all interfaces)
        return False


@runtime_checkable
class PolicyBackend(Protocol):
    """What the server serves. Every method is called on the server's one worker thread, never concurrently.

    Attributes:
        observation_spec: the keys, shapes and dtypes each observation must have (checked before batching).
    """

    observation_spec: Mapping[str, FieldSpec]

    def metadata(self) -> dict[str, Any]:
        """Msgpack-able facts for clients: method, checkpoint, action_dim, chunk_length, image_convention, ..."""

    def open_session(self, seed: int | None) -> Any:
        """Create the policy state of one connection (history, RNG, ...); called on connect and on reset."""

    def close_session(self, session: Any) -> None:
        """Release a session; called when its connection closes or resets."""

    def infer_batch(self, sessions: Sequence[Any], observations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Answer a batch of requests from different connections in ONE call.

        Args:
            sessions: the session of each request's connection (distinct within a batch).
            observations: validated observations, arrays as numpy, in the same order.

        Returns:
            One dict per request, in order, each with ``"actions"``: a (T, A) float array (T actions of A dims).
        """


@dataclass
class FunctionSession:
    """The session a :class:`FunctionBackend` hands out: an id, the reset seed and how many steps it served."""

    id: int
    seed: int | None
    steps: int = 0


class FunctionBackend:
    """A :class:`PolicyBackend` around a plain function, for tests and benchmarks.

    Args:
        fn: maps a list of B observations to actions of shape (B, T, A).
        observation_spec: the spec observations are checked against.
        metadata: extra metadata entries (``action_dim``, ``chunk_length``, ...).

    Attributes:
        calls: how many ``infer_batch`` calls were made.
        batch_sizes: the size of each call (the last 10,000).
        open_sessions: sessions opened and not yet closed.
    """

    def __init__(self, fn: Callable[[list[dict[str, Any]]], Any], observation_spec: Mapping[str, FieldSpec],
                 metadata: Mapping[str, Any] | None = None):
        self.fn = fn
        self.observation_spec = dict(observation_spec)
        self._metadata = {"method": "function", **dict(metadata or {})}
        self.calls = 0
        self.batch_sizes: deque[int] = deque(maxlen=10_000)
        self.open_sessions = 0
        self._ids = itertools.count()

    def metadata(self) -> dict[str, Any]:
        """The metadata given at construction, with ``method`` defaulting to ``"function"``."""
        return dict(self._metadata)

    def open_session(self, seed: int | None) -> FunctionSession:
        """A new :class:`FunctionSession`."""
        self.open_sessions += 1
        return FunctionSession(next(self._ids), seed)

    def close_session(self, session: FunctionSession) -> None:
        """Forget a session."""
        self.open_sessions -= 1

    def infer_batch(self, sessions: Sequence[FunctionSession], observations: Sequence[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
        """Call ``fn`` once on the whole batch and split its (B, T, A) result per request."""
        actions = np.asarray(self.fn(list(observations)))
        if actions.ndim != 3 or actions.shape[0] != len(observations):
            raise ValueError(f"fn returned shape {actions.shape}, expected (B={len(observations)}, T, A)")
        self.calls += 1
        self.batch_sizes.append(len(observations))
        for session in sessions:
            session.steps += 1
        return [{"actions": actions[i]} for i in range(len(observations))]


class _BackendThread:
    """Runs jobs one at a time on one daemon thread; ``call`` returns an asyncio future for the result."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable, *args: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return future

    def post(self, fn: Callable, *args: Any) -> None:
        """Run ``fn`` after every job already queued, without waiting; an exception is logged."""
        self._jobs.put((None, None, fn, args))

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, fn, args = job
            try:
                outcome = (True, fn(*args))
            except Exception as exc:
                outcome = (False, exc)
                if future is None:
                    log.error("%s failed: %s", getattr(fn, "__name__", "backend call"), _one_line(exc))
            if future is not None:
                try:
                    loop.call_soon_threadsafe(_resolve, future, outcome)
                except RuntimeError:  # the loop is closed: nobody waits for this result any more
                    pass
            del job, loop, future, fn, args, outcome  # drop references (sessions, arrays) before blocking

    def stop(self, timeout: float) -> bool:
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


def _resolve(future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    if future.cancelled():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _log_open_failure(opened: asyncio.Future) -> None:
    if not opened.cancelled() and opened.exception() is not None:
        log.error("open_session failed: %s", _one_line(opened.exception()))


_NO_SESSION = object()


@dataclass(eq=False)
class _Connection:
    ws: ServerConnection
    opened: asyncio.Future | None = None  # resolves once open_session has run for the current session
    session: Any = _NO_SESSION


@dataclass(eq=False)
class _Request:
    session: Any
    observation: dict[str, Any]
    future: asyncio.Future
    received: float  # time.perf_counter() when the frame arrived
    dropped: bool = False  # its connection closed before the answer


@dataclass
class _Stats:
    requests: int = 0
    batches: int = 0
    batched_requests: int = 0
    errors: int = 0
    rejected: int = 0
    resets: int = 0
    open_connections: int = 0
    connections: int = 0
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW))


class PolicyServer:
    """Serves a :class:`PolicyBackend` over openpi's websocket protocol.

    Args:
        backend: the policy.
        host: interface to listen on. Anything but loopback (127.0.0.0/8, ::1, localhost) needs ``api_key``.
        port: TCP port; 0 picks a free one (read ``.port`` / ``.url`` after :meth:`start`).
        api_key: when set, clients must send ``Authorization: Api-Key <api_key>``; others get HTTP 401.
        max_batch: most requests (from different connections) answered by one ``infer_batch`` call.
        max_wait_ms: how long a batch may wait for more requests after its first one.
        max_message_bytes: largest incoming frame; a bigger one closes its connection with code 1009
            (websockets' ``max_size``), the server and other connections carry on.
        ping_interval: seconds between keep-alive pings (None: off).
        ping_timeout: seconds without a pong before a connection is dropped (None: never).
        shutdown_timeout: how long SIGTERM / SIGINT under :meth:`serve_forever` waits for requests in flight.

    Raises:
        ConfigError: a non-loopback host without an API key, or an argument out of range.
    """

    def __init__(self, backend: PolicyBackend, *, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, max_batch: int = 1, max_wait_ms: float = 0.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, ping_interval: float | None = 20.0,
                 ping_timeout: float | None = 20.0, shutdown_timeout: float = 30.0):
        if not isinstance(backend, PolicyBackend):
            raise ConfigError(f"{type(backend).__name__} is not a PolicyBackend (observation_spec, metadata, "
                              "open_session, close_session, infer_batch)")
        spec = dict(backend.observation_spec)
        for key, entry in spec.items():
            if not isinstance(entry, FieldSpec):
                raise ConfigError(f"observation_spec[{key!r}] is a {type(entry).__name__}, not a FieldSpec")
        if api_key is not None and (not api_key.strip() or not api_key.isascii() or not api_key.isprintable()
                                    or api_key != api_key.strip()):
            raise ConfigError("api_key must be non-empty printable ASCII without surrounding whitespace")
        if not is_loopback(host) and api_key is None:
            raise ConfigError(f"host {host!r} is reachable from other machines: serving there needs an API key "
                              "(--api-key-file), or listen on 127.0.0.1")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch={max_batch!r}: expected an integer >= 1")
        if not (isinstance(max_wait_ms, (int, float)) and math.isfinite(max_wait_ms) and max_wait_ms >= 0):
            raise ConfigError(f"max_wait_ms={max_wait_ms!r}: expected a finite number >= 0")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) or max_message_bytes < 1:
            raise ConfigError(f"max_message_bytes={max_message_bytes!r}: expected an integer >= 1")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port={port!r}: expected an integer in [0, 65535]")
        self.backend = backend
        self.host = host
        self._port = port
        self._api_key = api_key.encode() if api_key is not None else None
        self.max_batch = max_batch
        self.max_wait_ms = float(max_wait_ms)
        self.max_message_bytes = max_message_bytes
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.shutdown_timeout = shutdown_timeout
        self._spec = spec
        self._stats = _Stats()
        self._lock = threading.Lock()  # guards _stats (read by stats() from any thread)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._used = False
        self.metadata: dict[str, Any] | None = None  # what each client receives first; set once serving

    # ----------------------------------------------------------------------------------------- public API
    @property
    def port(self) -> int:
        """The TCP port (the one actually bound once serving, when constructed with ``port=0``)."""
        return self._port

    @property
    def url(self) -> str:
        """``ws://host:port`` for clients."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self._port}"

    def start(self, timeout: float = 30.0) -> PolicyServer:
        """Serve on a background thread; returns once listening.

        Raises:
            ConfigError: the address cannot be bound, or the backend's metadata cannot be encoded.
        """
        self._claim()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main(None, False)),
                                        name="policy-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise ConfigError(f"policy server on {self.host}:{self._port} did not start within {timeout} s")
        if self._startup_error is not None:
            self._thread.join(timeout)
            self._thread = None
            raise self._startup_error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, answer requests already received (waiting at most ``timeout``), close, join."""
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._request_stop, timeout, False)
            except RuntimeError:  # loop already closed
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout + 10.0)  # + websockets' close handshakes and the worker's last jobs
            self._thread = None

    def serve_forever(self, on_ready: Callable[[PolicyServer], None] | None = None) -> int:
        """Serve in the calling (main) thread until SIGTERM or SIGINT, then stop gracefully.

        Requests in flight when the signal arrives are finished and answered (for up to ``shutdown_timeout``;
        a second signal stops without waiting).

        Args:
            on_ready: called with the server once it listens (``.port`` / ``.url`` are then final).

        Returns:
            0, the process exit code.
        """
        self._claim()
        asyncio.run(self._main(on_ready, True))
        if self._startup_error is not None:
            raise self._startup_error
        return 0

    def stats(self) -> dict[str, Any]:
        """Counters since start: requests answered, batches, mean batch size, error frames, connections, latency.

        Latency is from a frame's arrival to its answer being sent, over the last 10,000 answers (None before
        the first).
        """
        with self._lock:
            s = self._stats
            lat = np.asarray(s.latencies_ms, dtype=np.float64)
            return {
                "requests": s.requests,
                "batches": s.batches,
                "mean_batch_size": s.batched_requests / s.batches if s.batches else 0.0,
                "errors": s.errors,
                "rejected_handshakes": s.rejected,
                "resets": s.resets,
                "open_connections": s.open_connections,
                "connections": s.connections,
                "latency_p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                "latency_p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            }

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ internals
    def _claim(self) -> None:
        if self._used:
            raise RuntimeError("a PolicyServer serves once; make a new one")
        self._used = True

    def _build_metadata(self) -> bytes:
        meta = dict(self.backend.metadata())
        meta["observation_spec"] = spec_to_metadata(self._spec)
        meta["protocol"] = {"name": PROTOCOL_NAME, "reset": True, "max_batch": self.max_batch,
                            "max_message_bytes": self.max_message_bytes}
        try:
            payload = packb(meta)
        except (CodecError, TypeError, ValueError) as exc:
            raise ConfigError(f"the backend's metadata cannot be sent as msgpack: {_one_line(exc)}") from exc
        self.metadata = meta
        return payload

    async def _main(self, on_ready: Callable[[PolicyServer], None] | None, handle_signals: bool) -> None:
        loop = asyncio.get_running_loop()
        self._pending: deque[_Request] = deque()
        self._have_work = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._busy = 0
        self._connections = 0  # open connections: a batch never waits for more requests than this
        self._draining = False
        self._stop_requested = asyncio.Event()
        self._force_stop = asyncio.Event()
        self._stop_timeout = self.shutdown_timeout
        self._worker = _BackendThread("policy-backend")
        try:
            try:
                self._metadata_bytes = await self._worker.call(self._build_metadata)
                ws_server = await serve(
                    self._handle, self.host, self._port, process_request=self._process_request,
                    compression=None, max_size=self.max_message_bytes, ping_interval=self.ping_interval,
                    ping_timeout=self.ping_timeout, close_timeout=5.0, logger=_ws_log)
            except EmbodiedError as exc:
                self._startup_error = exc
                return
            except OSError as exc:
                self._startup_error = ConfigError(f"cannot listen on {self.host}:{self._port}: {_one_line(exc)}")
                return
            except Exception as exc:  # e.g. the backend's metadata() raised
                self._startup_error = ConfigError(f"policy server failed to start: {_one_line(exc)}")
                return
            self._port = ws_server.sockets[0].getsockname()[1]
            self._loop = loop
            if handle_signals and threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, self._on_signal, sig)
            log.info("serving %s on %s (max_batch=%d, max_wait_ms=%g%s)", self.metadata.get("method", "policy"),
                     self.url, self.max_batch, self.max_wait_ms, ", API key required" if self._api_key else "")
            self._ready.set()
            batcher = asyncio.create_task(self._batch_loop())
            try:
                if on_ready is not None:
                    on_ready(self)
                await self._stop_requested.wait()
            finally:
                await self._shutdown(ws_server, batcher)
        finally:
            self._ready.set()
            self._worker.stop(timeout=5.0)
            self._loop = None

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("%s: stopping (answering requests in flight; send it again to stop now)", sig.name)
        self._request_stop(self.shutdown_timeout, self._stop_requested.is_set())

    def _request_stop(self, timeout: float, force: bool) -> None:
        if force:
            self._force_stop.set()
        if not self._stop_requested.is_set():
            self._stop_timeout = timeout
            self._stop_requested.set()

    async def _shutdown(self, ws_server: Any, batcher: asyncio.Task) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._stop_timeout
        self._draining = True  # new requests on open connections are refused from now on
        ws_server.server.close()  # stop accepting; websockets answers handshakes in progress with HTTP 503
        waits = [asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(self._force_stop.wait())]
        await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        if not self._idle.is_set():
            log.warning("stopping with %d request(s) unanswered", self._busy)
        ws_server.close()  # close code 1001 to every connection; their handlers close their sessions
        try:
            await asyncio.wait_for(ws_server.wait_closed(), max(1.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            log.warning("connections still closing at shutdown")
        batcher.cancel()
        await asyncio.gather(batcher, return_exceptions=True)

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if urllib.parse.urlsplit(request.path).path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok")
        if self._api_key is not None and not self._authorized(request.headers.get("Authorization")):
            with self._lock:
                self._stats.rejected += 1
            response = connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong API key\n")
            response.headers["WWW-Authenticate"] = "Api-Key"
            return response
        return None

    def _authorized(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, token = header.strip().partition(" ")
        # compare_digest on bytes: constant time in the key's content, and no TypeError on non-ASCII input
        return scheme.lower() == "api-key" and hmac.compare_digest(token.strip().encode("utf-8", "replace"),
                                                                   self._api_key)

    def _enter(self) -> None:
        self._busy += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._busy -= 1
        if self._busy == 0:
            self._idle.set()

    async def _send_error(self, ws: ServerConnection, message: str) -> None:
        with self._lock:
            self._stats.errors += 1
        await ws.send(" ".join(message.split()))  # a TEXT frame: openpi's client raises on str

    # Session life cycle. conn.session is only written by these jobs on the worker thread; the loop reads it
    # after awaiting conn.opened. Jobs run in FIFO order, so the close posted when a connection ends runs
    # after its open and after any batch that holds its session.
    def _open_job(self, conn: _Connection, seed: int | None) -> None:
        self._close_job(conn)
        conn.session = self.backend.open_session(seed)

    def _close_job(self, conn: _Connection) -> None:
        session, conn.session = conn.session, _NO_SESSION
        if session is not _NO_SESSION:
            self.backend.close_session(session)

    def _open(self, conn: _Connection, seed: int | None) -> asyncio.Future:
        opened = self._worker.call(self._open_job, conn, seed)
        opened.add_done_callback(_log_open_failure)  # logged (and retrieved) even if no request awaits it
        return opened

    async def _has_session(self, conn: _Connection) -> bool:
        """Wait for the connection's session; if opening it failed, say so and close the connection."""
        try:
            await conn.opened
            return True
        except Exception as exc:
            await self._send_error(conn.ws, f"policy error: cannot open a session: {_one_line(exc)}")
            await conn.ws.close(1011, "policy error")
            return False

    async def _handle(self, ws: ServerConnection) -> None:
        conn = _Connection(ws)
        conn.opened = self._open(conn, None)
        with self._lock:
            self._stats.open_connections += 1
            self._stats.connections += 1
        self._connections += 1
        closed = asyncio.ensure_future(ws.wait_closed())
        try:
            # Metadata first, while the session opens on the worker: a busy policy does not delay it.
            await ws.send(self._metadata_bytes)
            async for message in ws:
                self._enter()
                try:
                    await self._serve_message(conn, message, closed)
                finally:
                    self._leave()
        except ConnectionClosed:
            pass
        finally:
            closed.cancel()
            self._connections -= 1
            with self._lock:
                self._stats.open_connections -= 1
            self._worker.post(self._close_job, conn)

    async def _serve_message(self, conn: _Connection, message: str | bytes, closed: asyncio.Future) -> None:
        received = time.perf_counter()
        ws = conn.ws
        if isinstance(message, str):
            return await self._send_error(ws, "expected a binary msgpack frame, got a text frame")
        try:
            obj = unpackb(message)
        except CodecError as exc:
            return await self._send_error(ws, str(exc))
        if isinstance(obj, dict) and obj.get("reset") is True and set(obj) <= {"reset", "seed"}:
            return await self._reset(conn, obj.get("seed"))
        if self._draining:
            return await self._send_error(ws, "server is shutting down")
        try:
            obs = validate_observation(obj, self._spec)
        except ObservationError as exc:
            return await self._send_error(ws, str(exc))
        if not await self._has_session(conn):
            return
        request = _Request(conn.session, obs, asyncio.get_running_loop().create_future(), received)
        self._pending.append(request)
        self._have_work.set()
        await asyncio.wait([request.future, closed], return_when=asyncio.FIRST_COMPLETED)
        if not request.future.done():  # the client left: drop its answer (its session closes in _handle)
            request.dropped = True
            return
        ok, payload = request.future.result()
        if not ok:
            return await self._send_error(ws, payload)
        await ws.send(payload)
        with self._lock:
            self._stats.requests += 1
            self._stats.latencies_ms.append((time.perf_counter() - received) * 1000.0)

    async def _reset(self, conn: _Connection, seed: Any) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            return await self._send_error(conn.ws, f"reset: seed must be an integer, got {type(seed).__name__}")
        if not await self._has_session(conn):
            return
        conn.opened = self._open(conn, seed)  # closes the old session, then opens a new one
        if not await self._has_session(conn):
            return
        with self._lock:
            self._stats.resets += 1
        await conn.ws.send(packb({"reset": True}))

    def _take(self, n: int) -> list[_Request]:
        out = []
        while self._pending and len(out) < n:
            request = self._pending.popleft()
            if not request.dropped:
                out.append(request)
        return out

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        max_wait = self.max_wait_ms / 1000.0
        while True:
            await self._have_work.wait()
            batch = self._take(self.max_batch)
            if batch:
                deadline = loop.time() + max_wait
                # One request in flight per connection: once every connection has one here, stop waiting.
                limit = self.max_batch
                while len(batch) < min(limit, self._connections) and (remaining := deadline - loop.time()) > 0:
                    self._have_work.clear()
                    try:
                        await asyncio.wait_for(self._have_work.wait(), remaining)
                    except asyncio.TimeoutError:
                        pass
                    batch += self._take(self.max_batch - len(batch))
                # A request whose client left while the batch gathered is dropped here, in the same loop step
                # that posts the batch, so its close_session (posted after) runs after this infer.
                batch = [r for r in batch if not r.dropped]
            if self._pending:
                self._have_work.set()
            else:
                self._have_work.clear()
            if batch:
                await self._run_batch(batch)

    def _infer(self, sessions: list[Any], observations: list[dict[str, Any]]) -> tuple[list[dict], float, float]:
        # On the worker thread.
        start = time.perf_counter()
        results = self.backend.infer_batch(sessions, observations)
        infer_ms = (time.perf_counter() - start) * 1000.0
        if not isinstance(results, Sequence) or len(results) != len(observations):
            got = len(results) if isinstance(results, Sequence) else type(results).__name__
            raise ValueError(f"infer_batch returned {got} results for {len(observations)} requests")
        for result in results:
            if not isinstance(result, Mapping) or "actions" not in result:
                raise ValueError("infer_batch returned a result without 'actions'")
            if np.ndim(result["actions"]) != 2:
                raise ValueError(f"actions of shape {np.shape(result['actions'])}, expected (T, A)")
        return list(results), start, infer_ms

    async def _run_batch(self, batch: list[_Request]) -> None:
        try:
            results, start, infer_ms = await self._worker.call(
                self._infer, [r.session for r in batch], [r.observation for r in batch])
        except Exception as exc:
            log.error("infer_batch failed on %d request(s)", len(batch), exc_info=exc)
            outcomes = [(False, f"policy error: {_one_line(exc)}")] * len(batch)
        else:
            outcomes = []
            for request, result in zip(batch, results):
                reply = dict(result)
                reply["server_timing"] = {"infer_ms": infer_ms, "batch_size": len(batch),
                                          "queue_ms": (start - request.received) * 1000.0}
                try:
                    outcomes.append((True, packb(reply)))
                except (CodecError, TypeError, ValueError) as exc:
                    outcomes.append((False, f"policy error: cannot encode the result: {_one_line(exc)}"))
        with self._lock:
            self._stats.batches += 1
            self._stats.batched_requests += len(batch)
        for request, outcome in zip(batch, outcomes):
            if not request.future.done():
                request.future.set_result(outcome)
