"""openpi's websocket policy protocol, as a server (:class:`PolicyServer`) and a client (:class:`PolicyClient`).

The protocol is openpi's (``openpi_client.websocket_client_policy``), also spoken by StarVLA and OpenVLA-OFT
servers, so their clients drive our server and ours drives theirs.

Frames:
    Every message is one BINARY websocket frame holding one msgpack object; numpy arrays and scalars are
    encoded as ``openpi_client.msgpack_numpy`` does (:mod:`core.serving.codec`). No compression.

Metadata:
    On connect the server first sends one frame: the backend's metadata (``method``, ``checkpoint``,
    ``action_dim``, ``chunk_length``, ``image_convention``, ...) plus ``"observation_spec"``:
    ``{key: {"shape": [...], "dtype": "uint8" | "float32" | ... | "str"}}`` (null = any length) and
    ``"protocol"``: ``{"name": "openpi-websocket", "reset": true, "max_batch": B, "max_message_bytes": N}``.

Requests:
    Each client frame is an observation dict (e.g. ``observation/image`` (H, W, 3) uint8,
    ``observation/state`` (S,) float32, ``prompt`` str). The server checks it against the spec (float fields
    are cast to the spec's dtype and must be finite; integer images must match exactly; extra keys pass
    through) and answers with a dict whose ``actions`` is a chunk of shape (T, A), plus
    ``server_timing = {"infer_ms", "batch_size", "queue_ms"}`` (queue_ms: from the frame's arrival to the
    start of the policy call that answered it).

Reset:
    ``{"reset": True}``, optionally with ``"seed": int`` and no other keys, closes the connection's policy
    session and opens a fresh one with that seed; the answer is ``{"reset": True}``. Only servers whose
    metadata says ``protocol.reset`` understand it (:meth:`PolicyClient.reset` is a no-op elsewhere).

Errors:
    A bad request gets one TEXT frame of one line (openpi's client raises on a str answer):
    ``"malformed msgpack: ..."``, ``"observation/image: shape (64, 64, 3), expected (224, 224, 3)"``,
    ``"policy error: ValueError: ..."``. The connection stays open and serves the next request.

Auth:
    With an API key, the handshake must carry ``Authorization: Api-Key <key>``, else HTTP 401 before any
    policy code runs. A server listening beyond loopback refuses to start without a key.

Health:
    ``GET /healthz`` answers HTTP 200 ``ok`` (no key needed).

Limits:
    A frame larger than ``max_message_bytes`` (32 MiB by default) closes that connection with code 1009
    (message too big); the server and other connections carry on.

Batching:
    Requests from concurrent connections are answered by one ``infer_batch`` call of up to ``max_batch``
    requests, gathered for at most ``max_wait_ms`` after the first; the policy runs on one worker thread.
"""

from core.serving.client import (
    AuthenticationError,
    ConnectionLost,
    PolicyClient,
    ServerError,
    ServerUnavailable,
    read_api_key,
)
from core.serving.codec import CodecError, packb, unpackb
from core.serving.server import (
    DEFAULT_MAX_MESSAGE_BYTES,
    PROTOCOL_NAME,
    FunctionBackend,
    FunctionSession,
    PolicyBackend,
    PolicyServer,
    is_loopback,
)
from core.serving.spec import (
    FieldSpec,
    ObservationError,
    spec_from_metadata,
    spec_to_metadata,
    validate_observation,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "PROTOCOL_NAME",
    "AuthenticationError",
    "CodecError",
    "ConnectionLost",
    "FieldSpec",
    "FunctionBackend",
    "FunctionSession",
    "ObservationError",
    "PolicyBackend",
    "PolicyClient",
    "PolicyServer",
    "ServerError",
    "ServerUnavailable",
    "is_loopback",
    "packb",
    "read_api_key",
    "spec_from_metadata",
    "spec_to_metadata",
    "unpackb",
    "validate_observation",
]
