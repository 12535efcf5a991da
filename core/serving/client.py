"""A blocking client for openpi's websocket policy protocol (our server, openpi's, StarVLA's, ...).

``PolicyClient`` is not thread-safe: one thread drives one connection (one request in flight at a time, as
the protocol wants). Give each simulator worker its own client.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from core.errors import ConfigError, EmbodiedError
from core.serving.codec import CodecError, packb, unpackb
from core.serving.server import is_loopback

__all__ = ["AuthenticationError", "ConnectionLost", "PolicyClient", "ServerError", "ServerUnavailable",
           "read_api_key"]

_BACKOFF_START_S = 0.5
_BACKOFF_CAP_S = 8.0


def _one_line(text: str) -> str:
    return " ".join(text.split())


class ServerError(EmbodiedError):
    """The server answered with a text (error) frame.

    ``str()`` is one line: the whole message for our server, the last line (the exception) of the traceback
    openpi's server sends. The full text is in ``detail``.
    """

    def __init__(self, text: str):
        self.detail = text
        lines = [line for line in text.strip().splitlines() if line.strip()]
        super().__init__(_one_line(lines[-1]) if lines else "the server sent an empty error frame")

    def __reduce__(self):
        return (type(self), (self.detail,))


class ConnectionLost(EmbodiedError):
    """The connection dropped (or the answer timed out) mid-conversation; :meth:`PolicyClient.reconnect` it."""


class ServerUnavailable(EmbodiedError):
    """No server could be reached before the deadline."""


class AuthenticationError(ConfigError):
    """The server refused the connection's API key (HTTP 401 / 403)."""


def read_api_key(path: str | os.PathLike) -> str:
    """Read an API key from a file (surrounding whitespace stripped). The key never appears in messages.

    Raises:
        ConfigError: the file is missing, unreadable, empty, or holds more than one line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except FileNotFoundError:
        raise ConfigError(f"{path}: API key file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the API key file ({type(exc).__name__})") from None
    if not key:
        raise ConfigError(f"{path}: API key file is empty")
    if len(key.splitlines()) > 1:
        raise ConfigError(f"{path}: API key file holds more than one line")
    return key


class PolicyClient:
    """One connection to a policy server: metadata first, then request/response.

    Args:
        url: ``ws://host:port`` or ``wss://host:port``.
        api_key: sent as ``Authorization: Api-Key <api_key>`` when given.
        connect_timeout: seconds the constructor keeps trying to reach the server (see :meth:`reconnect`).
        open_timeout: seconds one attempt may take (TCP, TLS and websocket handshakes, then the metadata frame).
        recv_timeout: seconds to wait for an answer to :meth:`infer` (None: no limit; a first call may compile).
        max_message_bytes: largest frame accepted from the server (None: no limit).

    Attributes:
        metadata: the server's first frame (a dict).

    Raises:
        ConfigError: a malformed url; AuthenticationError when the key is refused.
        ServerUnavailable: nothing answered within ``connect_timeout``.
    """

    def __init__(self, url: str, api_key: str | None = None, *, connect_timeout: float = 10.0,
                 open_timeout: float = 10.0, recv_timeout: float | None = None,
                 max_message_bytes: int | None = 256 * 2**20):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ConfigError(f"policy url {url!r}: expected ws://host:port or wss://host:port")
        self.url = url
        self._host = parts.hostname
        self._api_key = api_key
        self.open_timeout = open_timeout
        self.recv_timeout = recv_timeout
        self.max_message_bytes = max_message_bytes
        self._ws: ClientConnection | None = None
        self.metadata: dict[str, Any] = {}
        self.reconnect(connect_timeout)

    # ------------------------------------------------------------------------------------------ requests
    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Send one observation and return the server's answer (``actions``: a (T, A) array, ...).

        Raises:
            ServerError: the server answered with an error frame (the connection stays usable unless the
                server closed it, as openpi's does).
            ConnectionLost: the connection dropped or no answer came within ``recv_timeout``.
            CodecError: ``obs`` holds something msgpack cannot carry (nothing was sent).
        """
        reply = self._exchange(packb(obs))
        if not isinstance(reply, dict):
            raise ServerError(f"expected a map from the server, got {type(reply).__name__}")
        return reply

    def reset(self, seed: int | None = None) -> bool:
        """Ask the server for a fresh policy session (new history, and ``seed`` for its sampling).

        Sent only when the server's metadata says ``protocol.reset`` is true; openpi's own server does not
        understand the message, so this is then a no-op.

        Returns:
            Whether the server reset the session.
        """
        if not (isinstance(self.metadata.get("protocol"), dict) and self.metadata["protocol"].get("reset") is True):
            return False
        message: dict[str, Any] = {"reset": True}
        if seed is not None:
            message["seed"] = int(seed)
        reply = self._exchange(packb(message))
        if not (isinstance(reply, dict) and reply.get("reset") is True):
            raise ServerError(f"unexpected answer to a reset: {type(reply).__name__}")
        return True

    def _exchange(self, payload: bytes) -> Any:
        if self._ws is None:
            raise ConnectionLost(f"{self.url}: not connected (call reconnect())")
        try:
            self._ws.send(payload)
            reply = self._ws.recv(timeout=self.recv_timeout)
        except ConnectionClosed as exc:
            self._drop()
            raise ConnectionLost(f"{self.url}: connection lost ({self._describe(exc)})") from None
        except TimeoutError:
            self._drop()
            raise ConnectionLost(f"{self.url}: no answer within {self.recv_timeout} s; connection closed") from None
        if isinstance(reply, str):
            raise ServerError(reply)
        return unpackb(reply)

    def _describe(self, exc: ConnectionClosed) -> str:
        close = exc.rcvd or exc.sent
        if close is not None and close.code == 1009:
            limit = (self.metadata.get("protocol") or {}).get("max_message_bytes")
            return f"message too big for the server (limit {limit} bytes)" if limit else "message too big"
        return _one_line(str(exc)) or "closed"

    # -------------------------------------------------------------------------------------- connection
    def reconnect(self, deadline_s: float = 30.0) -> dict[str, Any]:
        """(Re)connect, retrying with exponential back-off (0.5 s doubling, capped at 8 s) until ``deadline_s``.

        The server opens a fresh session for the new connection. At least one attempt is made.

        Returns:
            The server's metadata.

        Raises:
            ServerUnavailable: not connected within ``deadline_s`` (one line: the url, how long, how many tries).
            AuthenticationError: the server refused the API key (not retried).
        """
        self.close()
        start = time.monotonic()
        delay, tries = _BACKOFF_START_S, 0
        while True:
            tries += 1
            remaining = deadline_s - (time.monotonic() - start)
            try:
                self._connect_once(min(self.open_timeout, max(remaining, 1.0)))
                return self.metadata
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
                last = exc
            elapsed = time.monotonic() - start
            if elapsed >= deadline_s:
                reason = _one_line(str(last)) or type(last).__name__
                raise ServerUnavailable(f"{self.url}: no policy server after {elapsed:.1f} s ({tries} tries; "
                                        f"last error: {reason})")
            time.sleep(min(delay, deadline_s - elapsed))
            delay = min(2 * delay, _BACKOFF_CAP_S)

    def _connect_once(self, timeout: float) -> None:
        headers = {"Authorization": f"Api-Key {self._api_key}"} if self._api_key else None
        try:
            ws = connect(self.url, compression=None, max_size=self.max_message_bytes, additional_headers=headers,
                         open_timeout=timeout, proxy=None if is_loopback(self._host) else True,
                         legacy=True)  # a long-lived connection we close ourselves (websockets >= 17.1)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                what = "refused the API key" if self._api_key else "needs an API key"
                raise AuthenticationError(f"{self.url}: the server {what} (HTTP {status})") from None
            raise
        try:
            first = ws.recv(timeout=timeout)
            if isinstance(first, str):
                raise ServerError(first)
            metadata = unpackb(first)
            if not isinstance(metadata, dict):
                raise CodecError(f"metadata is a {type(metadata).__name__}, expected a map")
        except BaseException:
            ws.close()
            raise
        self._ws, self.metadata = ws, metadata

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()

    @property
    def connected(self) -> bool:
        """Whether a connection is open (as far as this side knows)."""
        return self._ws is not None

    def close(self) -> None:
        """Close the connection (idempotent); the server closes its session."""
        self._drop()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
