"""Wire compatibility with openpi: its client against our server, and our client against an openpi-style server."""

from __future__ import annotations

import asyncio
import threading
import traceback

import numpy as np
import pytest
import websockets
from openpi_client import image_tools, msgpack_numpy
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.asyncio.server import serve

from core.serving import (
    ConnectionLost,
    FieldSpec,
    FunctionBackend,
    PolicyClient,
    PolicyServer,
    ServerError,
    spec_to_metadata,
)

T, A = 5, 7
KEY = "openpi-key"
SPEC = {
    "observation/image": FieldSpec((224, 224, 3), "uint8"),
    "observation/wrist_image": FieldSpec((224, 224, 3), "uint8"),
    "observation/state": FieldSpec((8,), "float32"),
    "prompt": FieldSpec((), "str"),
}


def chunk_policy(batch):
    """(B, T, A): row t of request b is state[0] * 100 + t in every action dimension."""
    out = np.zeros((len(batch), T, A), np.float32)
    for b, obs in enumerate(batch):
        out[b] = obs["observation/state"][0] * 100 + np.arange(T, dtype=np.float32)[:, None]
    return out


def libero_obs(marker: float = 1.0) -> dict:
    """An observation built the way openpi's LIBERO example builds it (image_tools resize with padding)."""
    raw = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    image = image_tools.convert_to_uint8(image_tools.resize_with_pad(raw, 224, 224))
    return {
        "observation/image": image,
        "observation/wrist_image": image[::-1].copy(),
        "observation/state": np.full(8, marker, np.float64),  # openpi examples send float64 state
        "prompt": "put the bowl on the plate",
    }


@pytest.fixture
def backend():
    return FunctionBackend(chunk_policy, SPEC, metadata={"action_dim": A, "chunk_length": T})


def test_openpi_client_gets_metadata_and_actions(backend):
    with PolicyServer(backend, port=0) as srv:
        policy = WebsocketClientPolicy(host="127.0.0.1", port=srv.port)
        meta = policy.get_server_metadata()
        assert meta["observation_spec"] == spec_to_metadata(SPEC)
        assert meta["chunk_length"] == T and meta["protocol"]["name"] == "openpi-websocket"
        result = policy.infer(libero_obs(2.0))
        expected = 200 + np.arange(T, dtype=np.float32)[:, None] * np.ones(A, np.float32)
        np.testing.assert_array_equal(result["actions"], expected)
        assert result["server_timing"]["batch_size"] == 1
        with pytest.raises(RuntimeError, match="observation/state: shape \\(3,\\), expected \\(8,\\)"):
            policy.infer({**libero_obs(), "observation/state": np.zeros(3)})  # openpi raises on a text frame
        assert policy.infer(libero_obs(1.0))["actions"][0, 0] == 100  # same connection, still served
        policy._ws.close()


def test_openpi_client_with_api_key(backend):
    with PolicyServer(backend, port=0, api_key=KEY) as srv:
        policy = WebsocketClientPolicy(host="127.0.0.1", port=srv.port, api_key=KEY)
        assert policy.infer(libero_obs(3.0))["actions"][0, 0] == 300
        policy._ws.close()
        with pytest.raises(websockets.exceptions.InvalidStatus, match="401"):
            WebsocketClientPolicy(host="127.0.0.1", port=srv.port)
        with pytest.raises(websockets.exceptions.InvalidStatus, match="401"):
            WebsocketClientPolicy(host="127.0.0.1", port=srv.port, api_key="wrong")
    assert backend.calls == 1 and backend.open_sessions == 0


def test_action_chunk_broker_steps_through_each_chunk(backend):
    with PolicyServer(backend, port=0) as srv:
        inner = WebsocketClientPolicy(host=f"ws://127.0.0.1:{srv.port}")
        broker = ActionChunkBroker(inner, action_horizon=T)
        rows = [broker.infer(libero_obs(float(step // T)))["actions"] for step in range(3 * T)]
        inner._ws.close()
    assert backend.calls == 3  # one request per T steps
    for step, row in enumerate(rows):
        assert row.shape == (A,)
        np.testing.assert_array_equal(row, np.full(A, (step // T) * 100 + step % T, np.float32))


# --------------------------------------------------------------------- our client, an openpi-style server
class OpenpiStyleServer:
    """openpi's WebsocketPolicyServer behaviour, built from openpi_client.msgpack_numpy and websockets.

    Sends its metadata packed, then answers each observation with a fake policy; on an exception it sends the
    traceback as a text frame and closes with 1011, as openpi's server does.
    """

    metadata = {"policy": "fake-pi0", "action_horizon": T}

    def __init__(self):
        self.frames_received = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _handler(self, websocket):
        packer = msgpack_numpy.Packer()
        await websocket.send(packer.pack(self.metadata))
        while True:
            try:
                obs = msgpack_numpy.unpackb(await websocket.recv())
                self.frames_received += 1
                if obs.get("fail"):
                    raise ValueError("bad observation for the fake policy")
                state = obs["observation/state"]
                await websocket.send(packer.pack({"actions": np.tile(state, (T, 1)), "policy_timing": {"ms": 1.0}}))
            except websockets.ConnectionClosed:
                break
            except Exception:
                await websocket.send(traceback.format_exc())
                await websocket.close(code=1011, reason="Internal server error. Traceback included in previous frame.")
                break

    async def _main(self):
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self._handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def test_our_client_against_an_openpi_style_server():
    with OpenpiStyleServer() as stand_in:
        url = f"ws://127.0.0.1:{stand_in.port}"
        with PolicyClient(url) as client:
            assert client.metadata == OpenpiStyleServer.metadata
            state = np.arange(4, dtype=np.float32)
            reply = client.infer({"observation/state": state, "prompt": "go"})
            np.testing.assert_array_equal(reply["actions"], np.tile(state, (T, 1)))
            assert reply["actions"].flags.writeable
            assert client.reset(seed=3) is False  # no protocol.reset in its metadata: nothing is sent
            assert stand_in.frames_received == 1
            with pytest.raises(ServerError) as info:
                client.infer({"fail": True})
            assert str(info.value) == "ValueError: bad observation for the fake policy"  # the traceback's last line
            assert "Traceback" in info.value.detail
            with pytest.raises(ConnectionLost, match=url):  # openpi's server closed the connection (1011)
                client.infer({"observation/state": state})
            client.reconnect(5)
            assert client.infer({"observation/state": state})["actions"].shape == (T, 4)
