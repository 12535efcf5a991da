"""The wire format (msgpack + numpy, byte-compatible with openpi_client.msgpack_numpy) and the observation spec."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as openpi_codec

from core.errors import ConfigError, EmbodiedError
from core.serving import (
    CodecError,
    FieldSpec,
    ObservationError,
    packb,
    spec_from_metadata,
    spec_to_metadata,
    unpackb,
    validate_observation,
)

RNG = np.random.default_rng(0)

ARRAYS = {
    "uint8_image": RNG.integers(0, 256, (6, 5, 3), dtype=np.uint8),
    "int8": np.array([-128, 0, 127], dtype=np.int8),
    "int16_2d": RNG.integers(-1000, 1000, (3, 4)).astype(np.int16),
    "uint16": np.array([0, 65535], dtype=np.uint16),
    "int32": np.arange(7, dtype=np.int32),
    "int64_4d": np.arange(24, dtype=np.int64).reshape(1, 2, 3, 4),
    "float16": np.array([0.5, -2.0, 65504.0], dtype=np.float16),
    "float32_chunk": RNG.standard_normal((10, 7)).astype(np.float32),
    "float64": RNG.standard_normal(5),
    "bool": np.array([[True, False], [False, True]]),
    "big_endian": np.arange(4, dtype=">f4"),
    "zero_d": np.array(3.25, dtype=np.float32),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "transposed": np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not C-contiguous
    "strided": np.arange(20, dtype=np.int32)[::3],
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_arrays_round_trip_exactly(name):
    arr = ARRAYS[name]
    out = unpackb(packb(arr))
    assert isinstance(out, np.ndarray)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_unpacked_arrays_are_writable_copies():
    frame = packb({"a": np.arange(6, dtype=np.float32)})
    out = unpackb(frame)["a"]
    assert out.flags.writeable and out.flags.c_contiguous and out.base is None
    out *= 2  # in-place normalisation by a policy must work and must not touch the frame
    np.testing.assert_array_equal(unpackb(frame)["a"], np.arange(6, dtype=np.float32))


def test_nested_structures_and_scalars_round_trip():
    obj = {
        "observation/image": ARRAYS["uint8_image"],
        "nested": {"list": [1, 2.5, "x", None, True], "deep": {"chunk": ARRAYS["float32_chunk"]}},
        "prompt": "pick up the bowl",
        "raw": b"\x00\x01",
        "i32": np.int32(-7),
        "f32": np.float32(1.5),
        "flag": np.bool_(True),
    }
    out = unpackb(packb(obj))
    assert out["prompt"] == "pick up the bowl" and out["raw"] == b"\x00\x01"
    assert out["nested"]["list"] == [1, 2.5, "x", None, True]
    np.testing.assert_array_equal(out["nested"]["deep"]["chunk"], obj["nested"]["deep"]["chunk"])
    assert type(out["i32"]) is np.int32 and out["i32"] == -7
    assert type(out["f32"]) is np.float32 and out["f32"] == 1.5
    assert type(out["flag"]) is np.bool_ and out["flag"]


def test_tuples_come_back_as_lists():
    assert unpackb(packb({"t": (1, 2)})) == {"t": [1, 2]}


OPENPI_OBJECTS = [
    ARRAYS["uint8_image"],
    {"observation/state": ARRAYS["float64"], "prompt": "stack", "nested": {"a": [ARRAYS["bool"], np.int16(3)]}},
    {"actions": ARRAYS["float32_chunk"], "big": ARRAYS["big_endian"], "t": ARRAYS["transposed"]},
]


@pytest.mark.parametrize("index", range(len(OPENPI_OBJECTS)))
def test_byte_identical_to_openpi(index):
    obj = OPENPI_OBJECTS[index]
    ours = packb(obj)
    assert ours == openpi_codec.packb(obj)
    assert ours == openpi_codec.Packer().pack(obj)  # what WebsocketClientPolicy sends


def _assert_same(a, b):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert type(b) is type(a) and b.dtype == a.dtype and np.shape(b) == np.shape(a)
        np.testing.assert_array_equal(b, a)
    else:
        assert a == b


@pytest.mark.parametrize("index", range(len(OPENPI_OBJECTS)))
def test_each_side_decodes_the_other(index):
    obj = OPENPI_OBJECTS[index]
    _assert_same(obj, openpi_codec.unpackb(packb(obj)))  # ours -> theirs
    _assert_same(obj, unpackb(openpi_codec.packb(obj)))  # theirs -> ours


@pytest.mark.parametrize("value", [np.array([1 + 2j]), np.array([object()], dtype=object),
                                   np.zeros(2, dtype=[("a", "f4")]), np.complex64(1j)])
def test_refused_dtypes_are_not_encoded(value):
    with pytest.raises(CodecError, match="dtype"):
        packb({"x": value})


def _crafted_array(dtype: str, data: bytes, shape: list) -> bytes:
    return msgpack.packb({b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape})


@pytest.mark.parametrize("frame, match", [
    (b"\xc1", "malformed msgpack"),                                    # a byte msgpack never uses
    (packb({"a": np.arange(4)})[:-5], "malformed msgpack"),             # truncated
    (packb({"a": 1}) + b"\x00", "malformed msgpack"),                   # trailing data
    (_crafted_array("|O", b"\x00" * 8, [1]), "refused numpy dtype"),    # object array from the wire
    (_crafted_array("<c16", b"\x00" * 16, [1]), "refused numpy dtype"),
    (_crafted_array("<f4", b"\x00" * 7, [2]), "7 bytes for shape"),     # data does not fill the shape
    (_crafted_array("not-a-dtype", b"", [0]), "unknown dtype"),
    (_crafted_array("<f4", b"\x00" * 4, [-1]), "shape"),
])
def test_undecodable_frames_raise_codec_error(frame, match):
    with pytest.raises(CodecError, match=match) as info:
        unpackb(frame)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, EmbodiedError)


def test_unpackb_refuses_text():
    with pytest.raises(CodecError, match="expected bytes"):
        unpackb("hello")


# ------------------------------------------------------------------------------------------ observation spec
SPEC = {
    "observation/image": FieldSpec((8, 8, 3), "uint8"),
    "observation/state": FieldSpec((4,), "float32"),
    "observation/history": FieldSpec((None, 2), "float32"),
    "prompt": FieldSpec((), "str"),
}


def _obs(**overrides):
    obs = {
        "observation/image": np.zeros((8, 8, 3), np.uint8),
        "observation/state": np.arange(4, dtype=np.float64),
        "observation/history": np.zeros((5, 2), np.float32),
        "prompt": "open the drawer",
        "extra/info": {"episode": 3},
    }
    obs.update(overrides)
    return obs


def test_valid_observation_is_cast_and_extra_keys_pass_through():
    obs = _obs()
    out = validate_observation(obs, SPEC)
    assert out["observation/state"].dtype == np.float32  # float64 cast to the spec's float dtype
    assert out["observation/image"].dtype == np.uint8
    assert out["extra/info"] == {"episode": 3}
    assert obs["observation/state"].dtype == np.float64  # the input is not modified
    lists = validate_observation(_obs(**{"observation/state": [1, 2, 3, 4]}), SPEC)  # ints cast to float32
    assert lists["observation/state"].dtype == np.float32
    assert validate_observation(_obs(**{"observation/history": np.zeros((0, 2))}), SPEC)  # None: any length


@pytest.mark.parametrize("overrides, expected", [
    ({"observation/image": np.zeros((64, 64, 3), np.uint8)},
     "observation/image: shape (64, 64, 3), expected (8, 8, 3)"),
    ({"observation/image": np.zeros((8, 8, 3), np.float64)}, "observation/image: dtype float64, expected uint8"),
    ({"observation/state": np.array([0, np.nan, 0, 0])}, "observation/state: NaN or inf values"),
    ({"observation/state": np.array([0, 0, np.inf, 0], np.float32)}, "observation/state: NaN or inf values"),
    ({"observation/state": np.array([0, 0, 1e300, 0])}, "observation/state: NaN or inf values"),  # float32 overflow
    ({"observation/state": "1,2,3,4"}, "observation/state: expected an array of float32, got str"),
    ({"observation/history": np.zeros((5, 3), np.float32)}, "observation/history: shape (5, 3), expected (None, 2)"),
    ({"prompt": 7}, "prompt: expected a string, got int"),
    ({"prompt": b"bytes"}, "prompt: expected a string, got bytes"),
])
def test_validation_errors_are_one_line_naming_the_key(overrides, expected):
    with pytest.raises(ObservationError) as info:
        validate_observation(_obs(**overrides), SPEC)
    assert str(info.value) == expected
    assert info.value.key == expected.split(":")[0]
    assert isinstance(info.value, EmbodiedError)


def test_missing_key_and_non_map():
    obs = _obs()
    del obs["observation/state"]
    with pytest.raises(ObservationError, match=r"^observation/state: missing$"):
        validate_observation(obs, SPEC)
    with pytest.raises(ObservationError, match="expected a map"):
        validate_observation([1, 2], SPEC)


def test_spec_metadata_round_trip_and_bad_specs():
    meta = spec_to_metadata(SPEC)
    assert meta["observation/history"] == {"shape": [None, 2], "dtype": "float32"}
    assert meta["prompt"] == {"shape": [], "dtype": "str"}
    assert spec_from_metadata(unpackb(packb(meta))) == SPEC  # through the wire: None <-> nil
    with pytest.raises(ConfigError, match="observation_spec\\['x'\\]"):
        spec_from_metadata({"x": {"shape": 3}})
    for bad in [((-1,), "float32"), ((2,), "complex64"), ((2,), "object"), ((2,), "no-such-dtype"), ((2,), None)]:
        with pytest.raises(ConfigError):
            FieldSpec(*bad)
