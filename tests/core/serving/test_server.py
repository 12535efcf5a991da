"""PolicyServer and PolicyClient on loopback: metadata, auth, health, bad frames, limits, reset, batching, shutdown."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from core.errors import ConfigError, EmbodiedError
from core.serving import (
    AuthenticationError,
    ConnectionLost,
    FieldSpec,
    PolicyClient,
    PolicyServer,
    ServerError,
    ServerUnavailable,
    packb,
    read_api_key,
    spec_to_metadata,
    unpackb,
)

ROOT = Path(__file__).resolve().parents[3]
T, A = 4, 3
KEY = "s3cret-key"
SPEC = {
    "observation/image": FieldSpec((4, 4, 3), "uint8"),
    "observation/state": FieldSpec((2,), "float32"),
    "prompt": FieldSpec((), "str"),
}


class RecordingBackend:
    """Echoes state[0] into actions[:, 0] and the session's call count into actions[:, 1]; records everything."""

    observation_spec = SPEC

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.opened: list[int | None] = []  # seeds
        self.closed: list[dict] = []
        self.batches: list[list[float]] = []  # state[0] of each request, per infer_batch call
        self.started = threading.Event()  # set when an infer_batch call begins
        self.threads: set[str] = set()
        self.active = 0
        self.overlap = False

    def metadata(self):
        return {"method": "recording", "action_dim": A, "chunk_length": T, "image_convention": "openpi"}

    def open_session(self, seed):
        self.opened.append(seed)
        return {"seed": seed, "calls": 0}

    def close_session(self, session):
        self.closed.append(session)

    def infer_batch(self, sessions, observations):
        self.active += 1
        self.overlap |= self.active > 1
        self.threads.add(threading.current_thread().name)
        try:
            markers = [float(o["observation/state"][0]) for o in observations]
            self.batches.append(markers)
            self.started.set()
            if any(m < 0 for m in markers):
                raise RuntimeError("boom\nsecond line of the message")
            if self.delay:
                time.sleep(self.delay)
            out = []
            for session, marker in zip(sessions, markers):
                session["calls"] += 1
                actions = np.zeros((T, A), np.float32)
                actions[:, 0] = marker
                actions[:, 1] = session["calls"]
                out.append({"actions": actions, "note": "ok"})
            return out
        finally:
            self.active -= 1


def obs(marker: float = 1.0, **overrides):
    out = {
        "observation/image": np.full((4, 4, 3), 7, np.uint8),
        "observation/state": np.array([marker, 0.0], np.float32),
        "prompt": "pick up the cube",
    }
    out.update(overrides)
    return out


def wait_for(predicate, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def backend():
    return RecordingBackend()


@pytest.fixture
def server(backend):
    with PolicyServer(backend, port=0) as srv:
        yield srv


# ----------------------------------------------------------------------------------------------- basics
def test_metadata_first_then_actions(server, backend):
    with PolicyClient(server.url) as client:
        meta = client.metadata
        assert meta["method"] == "recording" and meta["chunk_length"] == T and meta["action_dim"] == A
        assert meta["observation_spec"] == spec_to_metadata(SPEC)
        assert meta["protocol"] == {"name": "openpi-websocket", "reset": True, "max_batch": 1,
                                    "max_message_bytes": 32 * 2**20}
        reply = client.infer(obs(2.5))
    assert reply["actions"].shape == (T, A) and reply["actions"].dtype == np.float32
    np.testing.assert_array_equal(reply["actions"][:, 0], 2.5)
    assert reply["note"] == "ok"
    timing = reply["server_timing"]
    assert timing["batch_size"] == 1 and timing["infer_ms"] >= 0 and timing["queue_ms"] >= 0
    assert backend.opened == [None]
    stats = server.stats()
    assert stats["requests"] == 1 and stats["batches"] == 1 and stats["latency_p50_ms"] > 0


def test_healthz_answers_200_without_key(backend):
    with PolicyServer(backend, port=0, api_key=KEY) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b"ok"
        conn.close()
    assert backend.opened == []


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "192.168.1.20", "example.org"])
def test_non_loopback_host_needs_a_key(backend, host):
    with pytest.raises(ConfigError, match="API key") as info:
        PolicyServer(backend, host=host, port=0)
    assert "\n" not in str(info.value)
    PolicyServer(backend, host=host, port=0, api_key=KEY)  # constructing binds nothing


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "localhost"])
def test_loopback_hosts_need_no_key(backend, host):
    PolicyServer(backend, host=host, port=0)


def test_api_key(backend):
    with PolicyServer(backend, port=0, api_key=KEY) as srv:
        with pytest.raises(InvalidStatus) as info:  # no header at all
            connect(srv.url, open_timeout=5)
        assert info.value.response.status_code == 401
        with pytest.raises(InvalidStatus) as info:
            connect(srv.url, open_timeout=5, additional_headers={"Authorization": "Api-Key wrong"})
        assert info.value.response.status_code == 401
        with pytest.raises(AuthenticationError, match="needs an API key"):
            PolicyClient(srv.url)
        with pytest.raises(AuthenticationError, match="refused the API key") as info:
            PolicyClient(srv.url, api_key="s3cret-kez", connect_timeout=30)  # not retried: fails at once
        assert KEY not in str(info.value) and "s3cret-kez" not in str(info.value)
        assert backend.opened == [] and backend.batches == []  # rejected before any policy code
        assert srv.stats()["rejected_handshakes"] == 4
        with PolicyClient(srv.url, api_key=KEY) as client:
            assert client.infer(obs(3.0))["actions"][0, 0] == 3.0


# ------------------------------------------------------------------------------------------- bad frames
BAD_FRAMES = [
    ("malformed", b"\xc1\x00", "malformed msgpack"),
    ("truncated", packb(obs())[:-10], "malformed msgpack"),
    ("text frame", "hello", "text frame"),
    ("not a map", packb([1, 2, 3]), "(observation): expected a map"),
    ("missing key", packb({k: v for k, v in obs().items() if k != "observation/state"}), "observation/state: missing"),
    ("wrong shape", packb(obs(**{"observation/image": np.zeros((8, 4, 3), np.uint8)})),
     "observation/image: shape (8, 4, 3), expected (4, 4, 3)"),
    ("wrong dtype", packb(obs(**{"observation/image": np.zeros((4, 4, 3), np.float32)})),
     "observation/image: dtype float32, expected uint8"),
    ("nan", packb(obs(float("nan"))), "observation/state: NaN or inf values"),
    ("prompt", packb(obs(prompt=["a"])), "prompt: expected a string"),
    ("bad reset seed", packb({"reset": True, "seed": "x"}), "reset: seed must be an integer"),
    ("policy raises", packb(obs(-1.0)), "policy error: RuntimeError: boom second line of the message"),
]


@pytest.mark.parametrize("frame, expected", [case[1:] for case in BAD_FRAMES], ids=[c[0] for c in BAD_FRAMES])
def test_bad_frame_gets_one_text_line_and_the_connection_serves_on(server, backend, frame, expected):
    with connect(server.url, open_timeout=5) as ws:
        unpackb(ws.recv(timeout=5))  # metadata
        ws.send(frame)
        answer = ws.recv(timeout=5)
        assert isinstance(answer, str), "errors come back as TEXT frames"
        assert expected in answer and "\n" not in answer
        ws.send(packb(obs(5.0)))  # the same connection still serves
        reply = unpackb(ws.recv(timeout=5))
        assert reply["actions"][0, 0] == 5.0
    assert server.stats()["errors"] == 1


def test_policy_client_raises_server_error_and_carries_on(server):
    with PolicyClient(server.url) as client:
        with pytest.raises(ServerError, match=r"^observation/image: dtype float64, expected uint8$"):
            client.infer(obs(**{"observation/image": np.zeros((4, 4, 3))}))
        assert client.infer(obs(1.0))["actions"][0, 0] == 1.0


def test_oversize_message_closes_only_that_connection(backend):
    with PolicyServer(backend, port=0, max_message_bytes=64 * 1024) as srv:
        with PolicyClient(srv.url) as bystander, PolicyClient(srv.url) as big:
            huge = obs(prompt="x" * 200_000)
            with pytest.raises(ConnectionLost, match="too big"):
                big.infer(huge)
            assert not big.connected
            with connect(srv.url, open_timeout=5) as ws:  # the close code websockets uses
                ws.recv(timeout=5)
                ws.send(packb(huge))
                with pytest.raises(ConnectionClosed) as info:
                    ws.recv(timeout=5)
                assert info.value.rcvd.code == 1009
            assert bystander.infer(obs(4.0))["actions"][0, 0] == 4.0
            big.reconnect(5)
            assert big.infer(obs(6.0))["actions"][0, 0] == 6.0
        wait_for(lambda: srv.stats()["open_connections"] == 0, what="connections to close")
    assert len(backend.closed) == len(backend.opened) == 4


# ---------------------------------------------------------------------------------------------- sessions
def test_reset_opens_a_fresh_session(server, backend):
    with PolicyClient(server.url) as client:
        assert client.infer(obs())["actions"][0, 1] == 1
        assert client.infer(obs())["actions"][0, 1] == 2  # the session counts its calls
        assert client.reset(seed=7) is True
        assert backend.opened == [None, 7] and backend.closed == [{"seed": None, "calls": 2}]
        assert client.infer(obs())["actions"][0, 1] == 1  # fresh session
        assert client.reset() is True
        assert backend.opened == [None, 7, None]
    with connect(server.url, open_timeout=5) as ws:  # a "reset" key among others is an observation
        ws.recv(timeout=5)
        ws.send(packb({"reset": True, "observation/state": [1.0, 2.0]}))
        assert ws.recv(timeout=5) == "observation/image: missing"
    assert server.stats()["resets"] == 2


def test_client_that_leaves_mid_request_has_its_session_closed():
    backend = RecordingBackend(delay=0.6)
    with PolicyServer(backend, port=0, max_batch=1) as srv:
        busy = connect(srv.url, open_timeout=5)
        busy.recv(timeout=5)
        queued = connect(srv.url, open_timeout=5)
        queued.recv(timeout=5)
        busy.send(packb(obs(1.0)))
        assert backend.started.wait(5)
        queued.send(packb(obs(2.0)))  # waits behind the busy batch ...
        time.sleep(0.05)
        queued.close()  # ... and its client leaves
        busy.close()  # this one leaves while its batch is inside the policy
        wait_for(lambda: len(backend.closed) == 2, what="both sessions to close")
        assert backend.batches == [[1.0]], "the queued request of a departed client must not reach the policy"
        backend.delay = 0.0
        with PolicyClient(srv.url) as client:
            assert client.infer(obs(3.0))["actions"][0, 0] == 3.0
        wait_for(lambda: srv.stats()["open_connections"] == 0, what="connections to close")
    assert len(backend.closed) == len(backend.opened) == 3
    assert backend.threads == {"policy-backend"} and not backend.overlap


def test_a_session_that_cannot_open_is_reported_and_the_server_lives_on(server, backend):
    original = backend.open_session
    backend.open_session = lambda seed: (_ for _ in ()).throw(MemoryError("no room for another session"))
    with PolicyClient(server.url) as client:
        assert client.metadata["method"] == "recording"  # metadata comes first, before the session opens
        with pytest.raises(ServerError, match="^policy error: cannot open a session: MemoryError: no room"):
            client.infer(obs())
        with pytest.raises(ConnectionLost):  # then that connection is closed (1011)
            client.infer(obs())
    backend.open_session = original
    with PolicyClient(server.url) as client:
        assert client.infer(obs(2.0))["actions"][0, 0] == 2.0
    assert backend.batches == [[2.0]]


def test_the_event_loop_serves_while_the_policy_computes():
    backend = RecordingBackend(delay=1.5)
    with PolicyServer(backend, port=0) as srv:
        busy = PolicyClient(srv.url)
        t = threading.Thread(target=busy.infer, args=(obs(),))
        t.start()
        assert backend.started.wait(5)
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
        with connect(srv.url, open_timeout=5) as ws:
            assert "observation_spec" in unpackb(ws.recv(timeout=5))  # metadata does not wait for the policy
            ws.send(b"\xc1")
            assert ws.recv(timeout=5).startswith("malformed msgpack")
        assert time.monotonic() - start < 0.75, "answered only after the policy call"
        assert t.is_alive()
        t.join(5)
        busy.close()


def test_many_short_connections_leak_nothing(server, backend):
    def one_connection(i):
        with PolicyClient(server.url) as client:
            assert client.infer(obs(float(i)))["actions"][0, 0] == i

    for i in range(5):  # warm up: imports, caches, the first log lines
        one_connection(i)
    wait_for(lambda: len(backend.closed) == 5, what="warm-up sessions to close")
    threads_before = threading.active_count()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            one_connection(i)
        wait_for(lambda: len(backend.closed) == 205, what="all sessions to close")
        wait_for(lambda: threading.active_count() <= threads_before, what="client threads to end")
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert server.stats()["open_connections"] == 0
    assert server.stats()["connections"] == 205
    # 200 connections each moved ~1 KB of images and actions; per-connection state left behind would show as
    # tens of KB each. What stays is the bounded latency window (200 floats) and allocator noise.
    assert growth < 1_000_000, f"memory grew by {growth} bytes over 200 connections"


# --------------------------------------------------------------------------------------------- batching
def test_concurrent_clients_are_batched_and_each_gets_its_own_answer():
    backend = RecordingBackend(delay=0.02)
    n_clients, n_requests = 4, 6
    errors, timings = [], []
    with PolicyServer(backend, port=0, max_batch=4, max_wait_ms=50) as srv:
        clients = [PolicyClient(srv.url) for _ in range(n_clients)]
        barrier = threading.Barrier(n_clients)

        def run(c: int):
            try:
                barrier.wait(5)
                for r in range(n_requests):
                    marker = 100.0 * c + r
                    reply = clients[c].infer(obs(marker))
                    if not np.all(reply["actions"][:, 0] == marker):
                        errors.append(f"client {c} request {r} got {reply['actions'][0, 0]}")
                    if reply["actions"][0, 1] != r + 1:
                        errors.append(f"client {c} request {r}: its session saw {reply['actions'][0, 1]} calls")
                    timings.append(reply["server_timing"]["batch_size"])
            except Exception as exc:  # surfaced below
                errors.append(repr(exc))

        threads = [threading.Thread(target=run, args=(c,)) for c in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for client in clients:
            client.close()
        stats = srv.stats()
    assert not errors, errors
    sizes = [len(b) for b in backend.batches]
    assert sum(sizes) == n_clients * n_requests
    assert max(sizes) > 1 and max(sizes) <= 4, sizes
    assert max(timings) > 1
    assert stats["mean_batch_size"] > 1 and stats["batches"] == len(sizes)
    assert backend.threads == {"policy-backend"} and not backend.overlap


def test_batch_failure_answers_every_request_of_the_batch(backend):
    with PolicyServer(backend, port=0, max_batch=2, max_wait_ms=500) as srv:
        a, b = PolicyClient(srv.url), PolicyClient(srv.url)
        out = {}
        tb = threading.Thread(target=lambda: out.setdefault("b", _catch(lambda: b.infer(obs(1.0)))))
        tb.start()
        out["a"] = _catch(lambda: a.infer(obs(-1.0)))
        tb.join(5)
        assert [len(x) for x in backend.batches] == [2]
        assert isinstance(out["a"], ServerError) and isinstance(out["b"], ServerError)
        assert str(out["b"]).startswith("policy error: RuntimeError: boom")
        assert a.infer(obs(2.0))["actions"][0, 0] == 2.0  # the server lives on
        a.close()
        b.close()


def _catch(fn):
    try:
        return fn()
    except Exception as exc:
        return exc


# --------------------------------------------------------------------------------------------- shutdown
def test_stop_answers_requests_in_flight():
    backend = RecordingBackend(delay=0.5)
    srv = PolicyServer(backend, port=0).start()
    client = PolicyClient(srv.url)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", _catch(lambda: client.infer(obs(9.0)))))
    t.start()
    assert backend.started.wait(5)
    srv.stop(timeout=5)
    t.join(5)
    assert not isinstance(result["r"], Exception), result["r"]
    assert result["r"]["actions"][0, 0] == 9.0
    with pytest.raises(ConnectionLost):  # then the server closed the connection
        client.infer(obs())
    assert len(backend.closed) == 1
    assert not [th for th in threading.enumerate() if th.name in ("policy-server", "policy-backend")]


def test_reconnect_after_restart_and_back_off_deadline(backend):
    srv = PolicyServer(backend, port=0).start()
    port = srv.port
    client = PolicyClient(srv.url)
    client.infer(obs())
    srv.stop()
    with pytest.raises(ConnectionLost):
        client.infer(obs())
    later = PolicyServer(backend, port=port)
    timer = threading.Timer(0.8, later.start)
    timer.start()
    try:
        start = time.monotonic()
        meta = client.reconnect(10)  # fails for ~0.8 s, retries at 0.5 s, 1.5 s, ...
        assert meta["method"] == "recording" and 0.7 < time.monotonic() - start < 5
        assert client.infer(obs(8.0))["actions"][0, 0] == 8.0
    finally:
        timer.join()
        client.close()
        later.stop()
    url = f"ws://127.0.0.1:{port}"
    start = time.monotonic()
    with pytest.raises(ServerUnavailable) as info:
        PolicyClient(url, connect_timeout=1.2)
    elapsed = time.monotonic() - start
    assert 1.1 < elapsed < 4, elapsed
    assert str(info.value).startswith(f"{url}: no policy server after 1.") and "3 tries" in str(info.value)


def test_sigterm_answers_the_request_in_flight_and_exits_0():
    script = textwrap.dedent("""
        import sys, time
        import numpy as np
        from core.serving import FieldSpec, FunctionBackend, PolicyServer

        def slow(batch):
            print("busy", flush=True)
            time.sleep(1.0)
            return np.stack([np.full((4, 2), o["observation/state"][0], np.float32) for o in batch])

        server = PolicyServer(FunctionBackend(slow, {"observation/state": FieldSpec((2,), "float32")}), port=0)
        sys.exit(server.serve_forever(on_ready=lambda s: print("port", s.port, flush=True)))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        words = proc.stdout.readline().split()
        assert words[:1] == ["port"], words
        client = PolicyClient(f"ws://127.0.0.1:{words[1]}")
        result = {}
        t = threading.Thread(target=lambda: result.setdefault(
            "r", _catch(lambda: client.infer({"observation/state": np.array([3.0, 0.0], np.float32)}))))
        t.start()
        assert proc.stdout.readline().strip() == "busy"
        proc.send_signal(signal.SIGTERM)
        t.join(10)
        assert proc.wait(10) == 0
        assert not isinstance(result["r"], Exception), result["r"]
        np.testing.assert_array_equal(result["r"]["actions"], np.full((4, 2), 3.0, np.float32))
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------------ api key
def test_read_api_key(tmp_path):
    path = tmp_path / "key"
    path.write_text(f"  {KEY}\n")
    assert read_api_key(path) == KEY
    for content, match in [("", "empty"), (" \n\t", "empty"), ("a\nb", "more than one line")]:
        path.write_text(content)
        with pytest.raises(ConfigError, match=match) as info:
            read_api_key(path)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="not found") as info:
        read_api_key(tmp_path / "missing")
    assert str(info.value).startswith(str(tmp_path / "missing"))
    path.write_text("SECRETVALUE\nmore")
    with pytest.raises(EmbodiedError) as info:
        read_api_key(path)
    assert "SECRETVALUE" not in str(info.value)  # the key never appears in a message
