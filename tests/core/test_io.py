"""``core.io.to_jsonable``: the one JSON-plainify helper (config.json, model cards, run markers, recorded-data specs,
LIBERO episode records and LeRobot stats all go through it)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from core.io import read_json, to_jsonable, write_json


class _Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class _Inner:
    depth: int = 2
    sizes: tuple = (1, 2)


@dataclasses.dataclass
class _Config:
    lr: float = 1.5
    path: Path = Path("/data/x")
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    missing: float = float("nan")


def test_plain_json_values_are_what_a_json_round_trip_gives():
    value = {"b": 1, "a": [1, 2.5, "x", None, True, (3, (4, 5))], "n": {"z": {"y": [{}]}}, "inf": float("inf")}
    assert to_jsonable(value) == json.loads(json.dumps(value))
    assert list(to_jsonable(value)) == ["b", "a", "n", "inf"]  # dict order kept (write_json sorts when writing)
    keys = {7: "int", 2.5: "float", False: "bool", None: "none"}
    assert to_jsonable(keys) == json.loads(json.dumps(keys)) == {"7": "int", "2.5": "float", "false": "bool",
                                                                 "null": "none"}


def test_numpy_torch_paths_tuples_dataclasses_and_subclasses():
    out = to_jsonable({"f32": np.float32(0.5), "i64": np.int64(3), "b": np.bool_(True), "arr": np.arange(4).reshape(2, 2),
                       "t": torch.tensor([1.0, 2.0]), "t0": torch.tensor(7), "p": Path("/a/b"), "tup": (1, (2,)),
                       "enum": _Level.HIGH, "f64": np.float64(2.5), np.int64(9): "numpy key", Path("k"): "path key"})
    assert out == {"f32": 0.5, "i64": 3, "b": True, "arr": [[0, 1], [2, 3]], "t": [1.0, 2.0], "t0": 7, "p": "/a/b",
                   "tup": [1, [2]], "enum": 3, "f64": 2.5, "9": "numpy key", "k": "path key"}
    assert [type(out[k]) for k in ("f32", "i64", "b", "enum", "f64")] == [float, int, bool, int, float]
    cfg = to_jsonable(_Config())
    assert cfg["inner"] == {"depth": 2, "sizes": [1, 2]} and cfg["path"] == "/data/x" and math.isnan(cfg["missing"])
    assert list(cfg) == ["lr", "path", "inner", "missing"]  # field order, as dataclasses.asdict
    assert to_jsonable([_Inner(depth=5)]) == [{"depth": 5, "sizes": [1, 2]}]


def test_nan_to_none_default_and_unknown_types():
    assert to_jsonable(_Config(), nan_to_none=True)["missing"] is None  # config.json and model cards: null
    assert to_jsonable([float("nan"), np.float32("nan")], nan_to_none=True) == [None, None]
    assert math.isnan(to_jsonable(np.float64("nan")))  # else NaN stays (json writes NaN, reads it back)
    assert to_jsonable({"s": {1}, "b": b"x"}, default=str) == {"s": "{1}", "b": "b'x'"}  # LIBERO records: str()
    with pytest.raises(TypeError, match="not JSON serialisable: object"):
        to_jsonable({"x": [object()]})
    with pytest.raises(TypeError, match="not JSON serialisable: type"):
        to_jsonable(np.ndarray)  # a class is no value, even one with a tolist attribute
    value = {"k": (1, 2)}
    to_jsonable(value)
    assert value == {"k": (1, 2)}  # the input is not modified


def test_write_json_takes_the_same_types(tmp_path):
    write_json(tmp_path / "a.json", {"cfg": _Config(), "arr": np.ones(2, np.float32), "p": Path("q")})
    back = read_json(tmp_path / "a.json")
    assert back["cfg"]["inner"] == {"depth": 2, "sizes": [1, 2]} and back["arr"] == [1.0, 1.0] and back["p"] == "q"
    text = (tmp_path / "a.json").read_text()
    assert text.index('"arr"') < text.index('"cfg"') < text.index('"p"')  # key-sorted, indented
    with pytest.raises(TypeError, match="not JSON serialisable"):
        write_json(tmp_path / "b.json", {"x": object()})
    assert not (tmp_path / "b.json").exists()
