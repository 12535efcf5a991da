"""Image conventions (core/data/image_convention.py) and how the trajectory loader applies them per file."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from core.data.image_convention import CONVENTIONS, convert, flips, same
from core.data.trajectories import TrajectoryDataset, TrajectoryFile, TrajectoryWriter, _channels_first
from core.errors import ConfigError, DataError


def _raw(n: int = 2, h: int = 5, w: int = 7) -> np.ndarray:
    """(n, h, w, 3) uint8 frames with no symmetry: every pixel differs."""
    return (np.arange(n * h * w * 3) % 251).astype(np.uint8).reshape(n, h, w, 3)


def test_conventions_are_transforms_of_the_raw_render():
    raw = _raw()
    assert np.array_equal(convert(raw, "raw", "rot180"), raw[:, ::-1, ::-1])  # openpi's obs[...][::-1, ::-1]
    assert np.array_equal(convert(raw, "raw", "flipud"), raw[:, ::-1])
    assert np.array_equal(convert(raw[0], "raw", "upright"), raw[0, ::-1])  # one frame (H, W, C) too
    rot = raw[:, ::-1, ::-1]
    assert np.array_equal(convert(rot, "rot180", "flipud"), rot[:, :, ::-1])  # a horizontal flip
    assert np.array_equal(convert(rot, "rot180", "raw"), raw)
    for a in CONVENTIONS:
        for b in CONVENTIONS:
            back = convert(convert(raw, "raw", a), a, b)
            assert np.array_equal(back, convert(raw, "raw", b)), (a, b)
    assert convert(rot, "rot180", "rot180") is rot and convert(rot, "flipud", "upright") is rot  # no-op: same array
    assert convert(rot, "rot180", "flipud").flags.c_contiguous
    assert same("flipud", "upright") and not same("rot180", "flipud") and flips("raw", "rot180") == (True, True)


def test_unknown_names_are_one_line_config_errors():
    for bad in ("rot90", None, "ROT180"):
        with pytest.raises(ConfigError, match="unknown image convention") as e:
            convert(_raw(), "raw", bad)
        assert "\n" not in str(e.value) and "rot180" in str(e.value)
    with pytest.raises(ValueError, match="H, W, C"):
        convert(np.zeros((4, 4), np.uint8), "raw", "rot180")


@pytest.mark.parametrize("flip", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype, channels", [(np.uint8, 3), (np.uint8, 4), (np.uint8, 1), (np.float32, 3)])
def test_channels_first_copy_reverses_rows_and_columns_in_one_pass(flip, dtype, channels):
    src = (np.arange(3 * 6 * 5 * channels) % 200).astype(dtype).reshape(3, 6, 5, channels)
    dst = np.zeros((3, channels, 6, 5), dtype)
    _channels_first(dst, src, flip)
    want = src[:, :: -1 if flip[0] else 1, :: -1 if flip[1] else 1].transpose(0, 3, 1, 2)
    assert np.array_equal(dst, want)


def _opengl_robosuite_file(path, libero_env_args: bool = False):
    """A robomimic-style file storing the raw render (``macros_image_convention = "opengl"``)."""
    frames = _raw(4, 8, 6)
    env_meta = {"env_name": "Lift", "env_kwargs": {"robots": ["Panda"]}}
    if libero_env_args:
        env_meta = {"env_name": "Libero_Tabletop_Manipulation", "bddl_file": "libero_spatial/x.bddl"}
    with TrajectoryWriter(path, env_meta=env_meta) as w:
        w.add_episode({"agentview_image": frames, "proprio": np.zeros((4, 2), np.float32)}, np.zeros((4, 7)))
    with h5py.File(path, "a") as f:
        f["data"].attrs["macros_image_convention"] = "opengl"
    return frames


def test_a_non_libero_opengl_file_reads_upright_as_before(tmp_path):
    path = tmp_path / "lift.hdf5"
    raw = _opengl_robosuite_file(path)
    with TrajectoryFile(path) as f:
        assert not f.is_libero and f.image_convention is None and f.image_flips == (True, False)
        assert np.array_equal(f.read("demo_0", "obs/agentview_image"), raw[:, ::-1])
    ds = TrajectoryDataset(path, obs_keys=["agentview_image"])
    assert ds.image_convention is None
    assert np.array_equal(ds[2]["obs.agentview_image"][0].permute(1, 2, 0).numpy(), raw[2, ::-1])


def test_libero_files_read_rot180_and_a_file_s_own_convention_wins(libero_file, tmp_path):
    with TrajectoryFile(libero_file) as f:
        raw = f.raw("demo_0", "obs/eye_in_hand_rgb")
        assert f.image_convention == "rot180" and f.image_flips == (True, True)
        assert np.array_equal(f.episode("demo_0")["obs/eye_in_hand_rgb"], raw[:, ::-1, ::-1])
    path = tmp_path / "env_args.hdf5"  # LIBERO recognised by its env_args alone
    raw2 = _opengl_robosuite_file(path, libero_env_args=True)
    with TrajectoryFile(path) as f:
        assert f.is_libero and np.array_equal(f.read("demo_0", "obs/agentview_image"), raw2[:, ::-1, ::-1])
    with h5py.File(libero_file, "a") as h:
        h["data"].attrs["image_convention"] = "flipud"
    with TrajectoryFile(libero_file) as f:
        assert f.image_convention == "flipud"
        assert np.array_equal(f.read("demo_0", "obs/eye_in_hand_rgb"), raw[:, ::-1])
    assert TrajectoryDataset(libero_file, obs_keys=["eye_in_hand_rgb"]).image_convention == "flipud"
    with h5py.File(libero_file, "a") as h:
        h["data"].attrs["image_convention"] = "sideways"
    with pytest.raises(DataError, match="unknown image convention 'sideways'"):
        TrajectoryFile(libero_file)


def _rollout_file(path, frames, convention: str | None):
    """What ``sim.recorder`` writes for a LIBERO env: the env's frames as they are, env type "libero"."""
    env_meta = {"env_name": "embodied/Libero-spatial-0-v0", "env_type": "libero", "embodiment": "Panda"}
    if convention:
        env_meta["image_convention"] = convention
    with TrajectoryWriter(path, env_meta=env_meta) as w:
        w.add_episode({"image": frames, "proprio": np.zeros((len(frames), 15), np.float32)}, np.zeros((len(frames), 7)))


def test_libero_rollouts_old_and_new(tmp_path):
    """A LIBERO env rollout recorded before conventions were stated holds flipud frames (the env's then) and reads
    rot180; one recorded now says rot180 in its env_args and reads as stored."""
    raw = _raw(3, 6, 6)
    _rollout_file(tmp_path / "old.hdf5", raw[:, ::-1], None)
    _rollout_file(tmp_path / "new.hdf5", raw[:, ::-1, ::-1], "rot180")
    for name in ("old", "new"):
        with TrajectoryFile(tmp_path / f"{name}.hdf5") as f:
            assert f.image_convention == "rot180"
            assert np.array_equal(f.read("demo_0", "obs/image"), raw[:, ::-1, ::-1]), name
    for cache in ("none", "all"):
        ds = TrajectoryDataset([tmp_path / "old.hdf5", tmp_path / "new.hdf5"], obs_keys=["image"], cache=cache)
        assert ds.image_convention == "rot180"
        for i in range(len(ds)):
            assert np.array_equal(ds[i]["obs.image"][0].permute(1, 2, 0).numpy(), raw[i % 3, ::-1, ::-1])


def test_a_dataset_refuses_files_in_different_conventions(tmp_path, traj_file):
    raw = _raw(3, 6, 6)
    _rollout_file(tmp_path / "a.hdf5", raw, "rot180")
    _rollout_file(tmp_path / "b.hdf5", raw, "flipud")
    _rollout_file(tmp_path / "c.hdf5", raw, "upright")
    with pytest.raises(DataError, match="b.hdf5: images in convention 'flipud'"):
        TrajectoryDataset([tmp_path / "a.hdf5", tmp_path / "b.hdf5"], obs_keys=["image"])
    same_layout = TrajectoryDataset([tmp_path / "b.hdf5", tmp_path / "c.hdf5"], obs_keys=["image"])
    assert same_layout.image_convention == "flipud"
    # without image keys the frames do not matter; a file without a convention makes the dataset's unknown
    assert TrajectoryDataset([tmp_path / "a.hdf5", tmp_path / "b.hdf5"], obs_keys=["proprio"]).image_convention is None
    path, _ = traj_file  # our writer's non-LIBERO file: no convention
    assert TrajectoryDataset([tmp_path / "a.hdf5", path], obs_keys=["image"]).image_convention is None
