"""msgpack with numpy arrays, byte-compatible with ``openpi_client.msgpack_numpy``.

An array travels as the map ``{b"__ndarray__": True, b"data": <C-order bytes>, b"dtype": dtype.str,
b"shape": [...]}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": <python value>, b"dtype": dtype.str}``;
the keys are msgpack *bin* (bytes), everything else is plain msgpack. Object, void (structured) and complex
dtypes are refused both ways (an object array would need pickle).

Decoded arrays are **writable copies** that own their memory (one ``memcpy`` per array): a policy may
normalise an image in place without touching the received buffer. Tuples come back as lists (msgpack has
one sequence type); ``np.float64`` scalars travel as plain floats (numpy makes them ``float`` subclasses).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from core.errors import EmbodiedError

__all__ = ["CodecError", "packb", "unpackb"]

_REFUSED_KINDS = frozenset("VOc")  # void / structured, object, complex
_ARRAY_KEY = b"__ndarray__"
_SCALAR_KEY = b"__npgeneric__"


class CodecError(EmbodiedError, ValueError):
    """A frame is not msgpack this codec can decode, or an object it cannot encode."""


def _encode(obj: Any) -> Any:
    # msgpack calls this for every object it has no native type for.
    if isinstance(obj, (np.ndarray, np.generic)):
        if obj.dtype.kind in _REFUSED_KINDS:
            raise CodecError(f"cannot encode numpy dtype {obj.dtype} (object, void and complex are refused)")
        if isinstance(obj, np.ndarray):
            return {_ARRAY_KEY: True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
        return {_SCALAR_KEY: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode an object of type {type(obj).__name__}")


def _dtype(value: Any) -> np.dtype:
    if not isinstance(value, (str, bytes)):
        raise CodecError(f"malformed array: dtype is a {type(value).__name__}, not a string")
    try:
        dtype = np.dtype(value.decode("ascii") if isinstance(value, bytes) else value)
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise CodecError(f"malformed array: unknown dtype {value!r}") from exc
    if dtype.kind in _REFUSED_KINDS:
        raise CodecError(f"refused numpy dtype {dtype} (object, void and complex are refused)")
    return dtype


def _decode(obj: dict) -> Any:
    # object_hook: called for every decoded map, innermost first.
    if _ARRAY_KEY in obj:
        dtype = _dtype(obj.get(b"dtype"))
        shape, data = obj.get(b"shape"), obj.get(b"data")
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CodecError(f"malformed array: shape {shape!r}")
        if not isinstance(data, bytes):
            raise CodecError(f"malformed array: data is a {type(data).__name__}, not bytes")
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(data) != expected:
            raise CodecError(f"malformed array: {len(data)} bytes for shape {tuple(shape)} of {dtype}, "
                             f"expected {expected}")
        out = np.empty(tuple(shape), dtype=dtype)
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
        return out
    if _SCALAR_KEY in obj:
        dtype = _dtype(obj.get(b"dtype"))
        try:
            return dtype.type(obj.get(b"data"))
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"malformed numpy scalar of {dtype}: {exc}") from exc
    return obj


def packb(obj: Any) -> bytes:
    """Encode ``obj`` (dicts, lists, str, bytes, numbers, None, numpy arrays and scalars) as one msgpack frame.

    Raises:
        CodecError: an array or scalar of an object, void or complex dtype.
        TypeError: any other object msgpack cannot encode.
    """
    return msgpack.packb(obj, default=_encode)


def unpackb(data: bytes) -> Any:
    """Decode one msgpack frame; arrays come back as writable numpy copies (see the module docstring).

    Raises:
        CodecError: ``data`` is not bytes, not exactly one msgpack object, or holds a malformed or refused
            array; the message is one line starting with "malformed msgpack" or naming the array problem.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"malformed msgpack: expected bytes, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, object_hook=_decode)
    except CodecError:
        raise
    except Exception as exc:  # msgpack raises ExtraData, FormatError, StackError, ValueError, TypeError, ...
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise CodecError(f"malformed msgpack: {reason}") from exc
