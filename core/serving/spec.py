"""What a served policy expects to receive: one ``FieldSpec`` per observation key, and its check.

A spec maps keys such as ``"observation/image"`` (``FieldSpec((224, 224, 3), "uint8")``),
``"observation/state"`` (``FieldSpec((8,), "float32")``) or ``"prompt"`` (``FieldSpec((), "str")``) to the shape
and dtype the policy wants. ``None`` in a shape matches any length on that axis. The spec travels in the
server's metadata as ``{key: {"shape": [224, 224, 3], "dtype": "uint8"}}`` (``None`` -> null).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import ConfigError, EmbodiedError

__all__ = ["FieldSpec", "ObservationError", "spec_from_metadata", "spec_to_metadata", "validate_observation"]

STR = "str"  # the FieldSpec dtype for text such as a language instruction


class ObservationError(EmbodiedError, ValueError):
    """An observation does not match the spec. ``str()`` is one line: ``"<key>: <what is wrong>"``.

    Attributes:
        key: the offending observation key (``"(observation)"`` when the observation is not a map).
        message: what is wrong with it.
    """

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = " ".join(str(message).split())
        super().__init__(f"{key}: {self.message}")

    def __reduce__(self):
        return (type(self), (self.key, self.message))


@dataclass(frozen=True)
class FieldSpec:
    """Shape and dtype of one observation entry.

    Attributes:
        shape: length of each axis; ``None`` accepts any length. Ignored for ``dtype="str"``.
        dtype: a numpy dtype name (``"uint8"``, ``"float32"``, ``"bool"``, ...) or ``"str"`` for text.
            Float fields accept any real numeric input and cast it; other fields need that exact dtype.
    """

    shape: tuple[int | None, ...]
    dtype: str

    def __post_init__(self):
        shape = tuple(self.shape)
        for dim in shape:
            if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 0):
                raise ConfigError(f"FieldSpec shape {shape}: each axis is a length >= 0 or None")
        object.__setattr__(self, "shape", shape)
        if not isinstance(self.dtype, str):
            raise ConfigError(f"FieldSpec dtype {self.dtype!r}: expected a numpy dtype name or 'str'")
        if self.dtype != STR:
            try:
                dtype = np.dtype(self.dtype)
            except TypeError as exc:
                raise ConfigError(f"FieldSpec dtype {self.dtype!r}: not a numpy dtype name nor 'str'") from exc
            if dtype.kind not in "biuf":
                raise ConfigError(f"FieldSpec dtype {self.dtype!r}: only bool, integer, float or 'str'")
            object.__setattr__(self, "dtype", dtype.name)

    @property
    def is_text(self) -> bool:
        """Whether the field holds a string rather than an array."""
        return self.dtype == STR

    def matches_shape(self, shape: tuple[int, ...]) -> bool:
        """Whether an array of ``shape`` fits this spec (``None`` axes match any length)."""
        return len(shape) == len(self.shape) and all(e is None or e == s for e, s in zip(self.shape, shape))


def spec_to_metadata(spec: Mapping[str, FieldSpec]) -> dict[str, dict[str, Any]]:
    """The msgpack/JSON form of a spec: ``{key: {"shape": [..., None -> null], "dtype": "uint8"}}``."""
    return {key: {"shape": list(field.shape), "dtype": field.dtype} for key, field in spec.items()}


def spec_from_metadata(metadata: Mapping[str, Any]) -> dict[str, FieldSpec]:
    """Inverse of :func:`spec_to_metadata`.

    Raises:
        ConfigError: an entry is not ``{"shape": [...], "dtype": "..."}`` (the message names its key).
    """
    out = {}
    for key, entry in metadata.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("shape"), (list, tuple)) \
                or not isinstance(entry.get("dtype"), str):
            raise ConfigError(f"observation_spec[{key!r}]: expected {{'shape': [...], 'dtype': '...'}}, got {entry!r}")
        out[str(key)] = FieldSpec(tuple(entry["shape"]), entry["dtype"])
    return out


def _fmt_shape(shape: tuple) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _check_array(key: str, value: Any, field: FieldSpec) -> np.ndarray:
    if isinstance(value, (str, bytes, Mapping)) or value is None:
        raise ObservationError(key, f"expected an array of {field.dtype}, got {type(value).__name__}")
    if isinstance(value, np.ndarray):
        arr = value
    else:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:  # ragged nested lists
            raise ObservationError(key, f"expected an array of {field.dtype}: {exc}") from exc
    if arr.dtype.kind not in "biuf":
        raise ObservationError(key, f"dtype {arr.dtype}, expected {field.dtype}")
    if not field.matches_shape(arr.shape):
        raise ObservationError(key, f"shape {_fmt_shape(arr.shape)}, expected {_fmt_shape(field.shape)}")
    want = np.dtype(field.dtype)
    if want.kind == "f":
        if arr.dtype != want:
            with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf: reported below
                arr = arr.astype(want)
        if not np.isfinite(arr).all():
            raise ObservationError(key, "NaN or inf values")
    elif arr.dtype != want:
        raise ObservationError(key, f"dtype {arr.dtype}, expected {field.dtype}")
    return arr


def validate_observation(obs: Any, spec: Mapping[str, FieldSpec]) -> dict[str, Any]:
    """Check ``obs`` against ``spec`` and return a new dict with its arrays as numpy.

    Float fields are cast to the spec's dtype (then must be finite); bool and integer fields (images) must
    already have the spec's dtype. Text fields must be ``str``. Keys the spec does not name are passed
    through untouched. ``obs`` itself is not modified.

    Raises:
        ObservationError: the first problem found, as one line naming the key, e.g.
            ``"observation/image: shape (64, 64, 3), expected (224, 224, 3)"``.
    """
    if not isinstance(obs, Mapping):
        raise ObservationError("(observation)", f"expected a map of keys to arrays, got {type(obs).__name__}")
    out = dict(obs)
    for key, field in spec.items():
        if key not in obs:
            raise ObservationError(key, "missing")
        value = obs[key]
        if field.is_text:
            if not isinstance(value, str):
                raise ObservationError(key, f"expected a string, got {type(value).__name__}")
            out[key] = str(value)  # np.str_ -> str
        else:
            out[key] = _check_array(key, value, field)
    return out
