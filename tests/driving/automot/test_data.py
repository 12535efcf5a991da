"""AutoMoT's driving data: geometry labels, recording through sim.recorder, the per-step dataset."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch

from core.errors import ConfigError, DataError
from driving.automot.data import (
    EGO_FIELDS,
    DrivingSamples,
    collate_driving,
    future_waypoints,
    make_driving_dataset,
    route_points,
    scenario_file,
    split_seeds,
)
from driving.automot.reasoning import META_ACTIONS

SCEN = ("highway", "merge")
TINY = dict(scenarios=SCEN, episodes=1, seed=7, image_size=16, horizon_s=2.0)  # 10 steps per episode


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("automot_data")
    return out, make_driving_dataset(out, **TINY)


def datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda k, v: names.append(k) if isinstance(v, h5py.Dataset) else None)
    return names


def line_poses(T: int, dt: float, v: float, yaw: float = 0.0, x0: float = 0.0, y0: float = 0.0) -> np.ndarray:
    t = dt * np.arange(T)
    return np.stack([x0 + v * t * np.cos(yaw), y0 + v * t * np.sin(yaw), np.full(T, yaw)], axis=1)


# ------------------------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("yaw", [0.0, 0.7, -2.5])
def test_future_waypoints_of_a_straight_constant_speed_line(yaw):
    dt, v = 0.2, 8.0
    poses = line_poses(40, dt, v, yaw=yaw, x0=100.0, y0=-30.0)
    wp = future_waypoints(poses, t=5, dt=dt)
    expected = np.stack([v * 0.5 * np.arange(1, 7), np.zeros(6)], axis=1)  # x = v t, y = 0 in the ego frame
    assert wp.shape == (6, 2)
    np.testing.assert_allclose(wp, expected, atol=1e-9)


def test_future_waypoints_rotate_into_the_ego_frame():
    dt = 0.5
    poses = line_poses(10, dt, 2.0)  # driving along world +x ...
    poses[:, 2] = np.pi / 2  # ... while the ego faces world +y: the motion is to its right (-y)
    np.testing.assert_allclose(
        future_waypoints(poses, 0, dt), np.stack([np.zeros(6), -np.arange(1, 7.0)], 1), atol=1e-9
    )


def test_future_waypoints_past_the_episode_end():
    dt, v = 0.2, 5.0
    poses = line_poses(8, dt, v)  # 1.4 s logged
    full = np.stack([v * 0.5 * np.arange(1, 7), np.zeros(6)], axis=1)
    np.testing.assert_allclose(future_waypoints(poses, 5, dt), full, atol=1e-9)  # constant velocity
    held = future_waypoints(poses, 5, dt, extrapolate="hold")
    np.testing.assert_allclose(held[:, 0], np.minimum(full[:, 0], v * 0.4), atol=1e-9)
    np.testing.assert_allclose(future_waypoints(poses[:1], 0, dt), np.zeros((6, 2)))


def test_route_points_resampling():
    route = np.stack([3.0 * np.arange(1, 21), np.zeros(20)], axis=1)
    np.testing.assert_allclose(route_points(route), route, atol=1e-5)
    half = route_points(route[:5], n=20, spacing=1.5)  # 12 m of route, extended straight past its end
    np.testing.assert_allclose(half[:, 0], 3.0 + 1.5 * np.arange(20), atol=1e-5)
    assert route_points(np.zeros((20, 2))).shape == (20, 2)


def test_split_seeds_are_disjoint():
    train, test = split_seeds(0, 100, "train"), split_seeds(0, 100, "test")
    assert len(train) == len(test) == 100 and not set(train) & set(test)
    with pytest.raises(ConfigError, match="episodes"):
        split_seeds(0, 10_001, "train")
    with pytest.raises(ConfigError, match="split"):
        split_seeds(0, 1, "valid")


# ------------------------------------------------------------------------------------------- building
def test_meta_and_test_split(built, tmp_path):
    out, root = built
    meta = json.loads((root / "meta.json").read_text())
    assert meta["split"] == "train" and meta["scenarios"] == list(SCEN) and meta["seeds"] == [7]
    assert meta["image_size"] == [16, 32] and {s: c["episodes"] for s, c in meta["counts"].items()} == {
        "highway": 1,
        "merge": 1,
    }
    test_root = make_driving_dataset(tmp_path, **{**TINY, "scenarios": ("highway",), "split": "test"})
    assert json.loads((test_root / "meta.json").read_text())["seeds"] == [10_007]


def test_recording_matches_the_env_and_its_expert(built):
    """The stored log, labels included, is the expert's rollout with the same seed, step for step."""
    from sim.driving.env import DrivingEnv

    _, root = built
    with h5py.File(scenario_file(root, "merge"), "r") as f:
        g = f["data/demo_0"]
        stored = {k: g[f"obs/{k}"][:] for k in ("ego_state", "meta_action", "expert_waypoints", "image")}
        actions, last = g["actions"][:], g["next_obs/meta_action"][-1]
        assert g.attrs["seed"] == 7
    env = DrivingEnv("merge", image_size=16, horizon_s=2.0)
    obs, info = env.reset(seed=7)
    policy = env.make_expert(noise=0.0)
    for t in range(len(actions)):
        np.testing.assert_array_equal(stored["ego_state"][t], obs["ego_state"])
        np.testing.assert_array_equal(stored["image"][t], obs["image"])
        assert stored["meta_action"][t] == info["meta_action"]
        np.testing.assert_array_equal(stored["expert_waypoints"][t], info["expert_waypoints"])
        action = policy.act(obs, info)
        np.testing.assert_array_equal(actions[t], action)
        obs, _, term, trunc, info = env.step(action)
    assert term or trunc
    assert last == info["meta_action"]


def test_build_is_deterministic(built, tmp_path):
    _, root = built
    again = make_driving_dataset(tmp_path, **TINY)
    for s in SCEN:
        with h5py.File(scenario_file(root, s), "r") as a, h5py.File(scenario_file(again, s), "r") as b:
            names = datasets(a)
            assert names and "data/demo_0/obs/meta_action" in names
            for k in names:
                np.testing.assert_array_equal(a[k][()], b[k][()], err_msg=k)


def test_resume_skips_finished_files(built, tmp_path):
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    root = copy / "train"
    before = {s: scenario_file(root, s).stat().st_mtime_ns for s in SCEN}
    scenario_file(root, "merge").unlink()
    make_driving_dataset(copy, **TINY)
    meta = json.loads((root / "meta.json").read_text())
    assert meta["counts"]["highway"]["skipped"] and not meta["counts"]["merge"]["skipped"]
    assert scenario_file(root, "highway").stat().st_mtime_ns == before["highway"]
    assert scenario_file(root, "merge").exists()


def test_files_of_other_settings_are_refused_not_reused(built, tmp_path):
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with pytest.raises(DataError, match=r"seeds \[7\] \(asked \[8\]\).*new --out") as err:
        make_driving_dataset(copy, **{**TINY, "seed": 8})
    assert "merge" in str(err.value) or "highway" in str(err.value)


# -------------------------------------------------------------------------------------------- samples
def test_samples_shapes_and_dtypes(built):
    out, _ = built
    ds = DrivingSamples(out, history=3, qa=True)
    assert len(ds) == 20 and len(ds.episodes) == 2
    s = ds[0]
    shapes = {
        "images": ((3, 3, 16, 32), torch.float32),
        "bev": ((6, 64, 64), torch.float32),
        "target_points": ((4, 2), torch.float32),
        "ego": ((len(EGO_FIELDS),), torch.float32),
        "meta_action": ((), torch.int64),
        "route": ((20, 2), torch.float32),
        "waypoints": ((6, 2), torch.float32),
        "expert_waypoints": ((6, 2), torch.float32),
        "velocity": ((), torch.float32),
        "episode": ((), torch.int64),
        "step": ((), torch.int64),
    }
    for key, (shape, dtype) in shapes.items():
        assert tuple(s[key].shape) == shape and s[key].dtype == dtype, key
    assert 0 <= s["images"].min() and s["images"].max() <= 1 and s["bev"].max() == 1
    torch.testing.assert_close(s["images"][0], s["images"][2])  # the first frame repeated at the start
    assert 0 <= int(s["meta_action"]) < len(META_ACTIONS)
    assert s["scenario"] == "highway" and s["instruction"] and ":" in s["reasoning"]
    assert all(isinstance(q, str) and isinstance(a, str) for q, a in s["qa"])
    # The expert's look-ahead and the logged future agree 0.5 s ahead (later, MOBIL may start a lane change).
    assert float((s["waypoints"][0] - s["expert_waypoints"][0]).abs().max()) < 0.5
    assert float(s["velocity"]) == pytest.approx(float(ds[5]["ego"][0]))  # 1 s = 5 steps later
    batch = collate_driving([ds[i] for i in (0, 11, 19)])
    assert batch["images"].shape == (3, 3, 3, 16, 32) and batch["scenario"] == ["highway", "merge", "merge"]
    assert batch["step"].tolist() == [0, 1, 9]
    strided = DrivingSamples(out, scenarios=["merge"], history=1, stride=4)
    assert len(strided) == 3 and [int(strided[i]["step"]) for i in range(3)] == [0, 4, 8]


def test_missing_or_corrupt_file_names_it(built, tmp_path):
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    bad = scenario_file(copy / "train", "merge")
    bad.write_bytes(b"not an hdf5 file" * 64)
    with pytest.raises(DataError) as err:
        DrivingSamples(copy)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)
    bad.unlink()
    with pytest.raises(DataError, match="no such file") as err:
        DrivingSamples(copy)
    assert str(bad) in str(err.value)
