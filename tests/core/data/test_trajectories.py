from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from core.data.samplers import GroupedBatchSampler
from core.data.trajectories import TrajectoryDataset, TrajectoryFile, TrajectoryWriter
from core.errors import DataError


def test_writer_round_trip(traj_file):
    path, episodes = traj_file
    with TrajectoryFile(path) as f:
        assert f.episodes == ["demo_0", "demo_1", "demo_2"]
        assert f.language_instruction == "lift the cube"
        assert f.env_meta["env_name"] == "Lift" and f.env_meta["env_kwargs"] == {"robots": ["Panda"]}
        assert f.file_attrs["total"] == 5 + 6 + 7
        assert f.filter_keys == {"train": ["demo_0", "demo_2"]}
        for i, ep in enumerate(episodes):
            got = f.episode(f"demo_{i}")
            np.testing.assert_array_equal(got["obs/image"], ep["obs"]["image"])
            np.testing.assert_allclose(got["obs/proprio"], ep["obs"]["proprio"])
            np.testing.assert_allclose(got["actions"], ep["actions"])
            np.testing.assert_allclose(got["rewards"], ep["rewards"])
            assert got["dones"].tolist() == [0] * (len(ep["actions"]) - 1) + [1]
            attrs = f.attrs(f"demo_{i}")
            assert attrs["embodiment"] == "Panda" and attrs["success"] is (i != 1)
            assert attrs["action_space"] == {"dim": 7} and attrs["num_samples"] == len(ep["actions"])
        assert f.dataset("demo_0", "obs/image").chunks == (1, 8, 8, 3)


def test_writer_is_atomic_and_validates(tmp_path, episode_factory):
    path = tmp_path / "x.hdf5"
    rng = np.random.default_rng(0)
    ep = episode_factory(rng, 4, 2)
    with pytest.raises(RuntimeError), TrajectoryWriter(path) as w:
        w.add_episode(ep["obs"], ep["actions"])
        raise RuntimeError("crash mid-write")
    assert not path.exists() and not list(tmp_path.iterdir())
    with TrajectoryWriter(path) as w, pytest.raises(DataError, match=r"x\.hdf5: demo_0: obs/image has shape"):
        w.add_episode({"image": ep["obs"]["image"][:3]}, ep["actions"])
    # the failed episode left nothing behind; the file is still valid and empty
    assert TrajectoryFile(path).episodes == []


def test_libero_file_loads_unchanged(libero_file):
    with TrajectoryFile(libero_file) as f:
        assert f.language_instruction == "open the top drawer of the cabinet"
        assert f.env_meta["env_name"] == "Libero_Kitchen_Tabletop_Manipulation"
        assert f.attrs("demo_0")["init_state"].shape == (47,)
        assert f.obs_keys("demo_1") == sorted(
            [
                "agentview_rgb",
                "eye_in_hand_rgb",
                "ee_pos",
                "ee_ori",
                "ee_states",
                "gripper_states",
                "joint_states",
            ]
        )
        # LIBERO stores the raw render (macros_image_convention = "opengl"): reads come back in openpi's and
        # LeRobot's LIBERO convention, the raw frame rotated 180 degrees (rows and columns reversed)
        assert f.bottom_up_images and f.is_libero and f.image_convention == "rot180"
        raw = f.raw("demo_0", "obs/agentview_rgb")
        assert np.array_equal(f.read("demo_0", "obs/agentview_rgb"), raw[:, ::-1, ::-1])
        assert np.array_equal(f.read("demo_0", "obs/agentview_rgb", np.s_[1:3]), raw[1:3, ::-1, ::-1])
        assert np.array_equal(f.read("demo_0", "obs/ee_pos"), f.raw("demo_0", "obs/ee_pos"))
    ds = TrajectoryDataset(libero_file, obs_keys=["agentview_rgb", "ee_states"], horizon=2)
    assert np.array_equal(ds[0]["obs.agentview_rgb"][0].permute(1, 2, 0).numpy(), raw[0, ::-1, ::-1])
    assert ds.image_convention == "rot180"
    assert len(ds) == 4 + 5
    s = ds[0]
    assert s["obs.agentview_rgb"].shape == (1, 3, 16, 16) and s["obs.agentview_rgb"].dtype == torch.uint8
    assert s["obs.ee_states"].shape == (1, 6) and s["obs.ee_states"].dtype == torch.float32
    assert s["actions"].shape == (2, 7) and s["actions"].dtype == torch.float32
    info = ds.episode_info(0)
    assert info.embodiment == "Panda" and info.language_instruction.startswith("open the top drawer")


def test_robomimic_file_filter_keys_and_order(robomimic_file):
    with TrajectoryFile(robomimic_file) as f:
        assert f.episodes[:3] == ["demo_0", "demo_1", "demo_2"] and f.episodes[-1] == "demo_10"
        assert f.filter_keys["valid"] == ["demo_9", "demo_10"]
        assert "next_obs/agentview_image" in f.keys("demo_3")
    ds = TrajectoryDataset(robomimic_file, obs_keys=["agentview_image", "robot0_eef_pos"], filter_key="valid")
    assert [e.name for e in ds.episodes] == ["demo_9", "demo_10"]
    assert len(ds) == (3 + 9 % 3) + (3 + 10 % 3)
    with pytest.raises(DataError, match="no filter key mask/test"):
        TrajectoryDataset(robomimic_file, filter_key="test")


def test_windows_frame_stack_and_horizon(traj_file):
    path, episodes = traj_file
    ds = TrajectoryDataset(path, horizon=3, frame_stack=2, stride=2)
    # anchors 0, 2, 4 (T=5) | 0, 2, 4 (T=6) | 0, 2, 4, 6 (T=7)
    assert len(ds) == 3 + 3 + 4
    s = ds[0]  # episode 0, t = 0: the first frame is repeated, actions 0..2
    img = episodes[0]["obs"]["image"]
    assert torch.equal(s["obs.image"][0], s["obs.image"][1])
    np.testing.assert_array_equal(s["obs.image"][1].permute(1, 2, 0).numpy(), img[0])
    s = ds[2]  # episode 0, t = 4: obs frames 3, 4; actions 4, pad, pad
    np.testing.assert_array_equal(s["obs.image"][0].permute(1, 2, 0).numpy(), img[3])
    np.testing.assert_allclose(s["obs.proprio"].numpy(), episodes[0]["obs"]["proprio"][3:5])
    assert s["actions_is_pad"].tolist() == [False, True, True]
    np.testing.assert_allclose(s["actions"][1].numpy(), episodes[0]["actions"][4])
    assert s["dones"].tolist() == [True, True, True] and int(s["timestep"]) == 4
    ds_nopad = TrajectoryDataset(path, horizon=3, pad_end=False)
    assert len(ds_nopad) == 3 + 4 + 5
    assert not any(ds_nopad[i]["actions_is_pad"].any() for i in range(len(ds_nopad)))


def test_multi_embodiment_groups_and_explicit_padding(tmp_path, traj_file, episode_factory):
    path, _ = traj_file
    hand = tmp_path / "hand.hdf5"
    rng = np.random.default_rng(3)
    with TrajectoryWriter(hand) as w:
        for _ in range(2):
            ep = episode_factory(rng, 4, 12)
            w.add_episode(ep["obs"], ep["actions"], attrs={"embodiment": "Panda+InspireHand"})
    ds = TrajectoryDataset([path, hand])
    assert ds.action_dims == {"Panda": 7, "Panda+InspireHand": 12}
    groups = ds.groups()
    assert len(groups["Panda"]) == 18 and len(groups["Panda+InspireHand"]) == 8
    loader = DataLoader(ds, batch_sampler=GroupedBatchSampler(groups, batch_size=4, seed=0))
    seen = 0
    for batch in loader:
        dims = {ds.episodes[i].action_dim for i in batch["episode_index"].tolist()}
        assert len(dims) == 1 and batch["actions"].shape[-1] == dims.pop()
        seen += len(batch["actions"])
    assert seen == len(ds)
    padded = TrajectoryDataset([path, hand], action_pad_to=12)
    s = padded[len(padded) - 1]
    assert s["actions"].shape == (1, 12) and s["action_dim_mask"].all()
    s = padded[0]
    assert s["action_dim_mask"].sum() == 7 and (s["actions"][:, 7:] == 0).all()
    with pytest.raises(ValueError, match="action_pad_to"):
        TrajectoryDataset([path, hand], action_pad_to=8)


def test_workers_reopen_files_lazily(traj_file):
    path, _ = traj_file
    ds = TrajectoryDataset(path, horizon=2)
    _ = ds[0]  # parent opens a handle; workers must not reuse it
    ref = [ds[i]["actions"] for i in range(len(ds))]
    loader = DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    got = torch.cat([b["actions"] for b in loader])
    assert torch.equal(got, torch.stack(ref))


def test_bad_files_raise_or_skip(tmp_path, traj_file):
    path, _ = traj_file
    missing = tmp_path / "missing.hdf5"
    with pytest.raises(DataError, match="missing.hdf5: no such file"):
        TrajectoryDataset(missing)
    truncated = tmp_path / "truncated.hdf5"
    raw = path.read_bytes()
    truncated.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="truncated.hdf5: cannot open as HDF5"):
        TrajectoryFile(truncated)
    not_hdf5 = tmp_path / "text.hdf5"
    not_hdf5.write_text("hello")
    with pytest.raises(DataError, match="text.hdf5"):
        TrajectoryFile(not_hdf5)
    wrong = tmp_path / "wrong.hdf5"
    import h5py

    with h5py.File(wrong, "w") as f:
        f["observations"] = np.zeros((3, 2))
    with pytest.raises(DataError, match="wrong.hdf5: no 'data' group"):
        TrajectoryDataset(wrong)
    bad_ep = tmp_path / "bad_episode.hdf5"
    with h5py.File(bad_ep, "w") as f:
        g = f.create_group("data/demo_0")
        g["obs/image"] = np.zeros((3, 8, 8, 3), np.uint8)
        g["obs/proprio"] = np.zeros((3, 4), np.float32)
        g["actions"] = np.zeros((4, 7))  # one step too many
        g2 = f.create_group("data/demo_1")
        g2["obs/image"] = np.zeros((3, 8, 8, 3), np.uint8)
        g2["obs/proprio"] = np.zeros((3, 4), np.float32)
        g2["actions"] = np.zeros((3, 7))
    with pytest.raises(DataError, match=r"bad_episode.hdf5: demo_0: obs/image has 3 steps, actions has 4"):
        TrajectoryDataset(bad_ep)
    ds = TrajectoryDataset([path, missing, truncated, wrong, bad_ep], on_error="skip")
    assert ds.skipped == {"files": 3, "episodes": 1}
    assert len(ds.episodes) == 3 + 1 and len(ds.errors) == 4
    assert all(isinstance(e, DataError) for e in ds.errors)


# -- cache modes, batched reads, workers ---------------------------------------------------------------
def _assert_same_items(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("cache", ["low_dim", "all"])
@pytest.mark.parametrize("horizon, frame_stack", [(1, 1), (3, 2), (8, 8)])
def test_cache_modes_give_the_items_of_none(traj_file, libero_file, tmp_path, episode_factory, cache, horizon,
                                            frame_stack):  # fmt: skip
    path, _ = traj_file
    big = tmp_path / "big.hdf5"  # other image size and action dim: batches of mixed shapes
    rng = np.random.default_rng(5)
    with TrajectoryWriter(big) as w:
        for T in (3, 9):
            ep = episode_factory(rng, T, 5)
            ep["obs"]["image"] = rng.integers(0, 256, (T, 16, 12, 3), dtype=np.uint8)
            w.add_episode(ep["obs"], ep["actions"], dones=np.zeros(T), attrs={"embodiment": "Other"})
    cases = [
        dict(paths=path),
        dict(paths=libero_file, obs_keys=["agentview_rgb", "ee_states", "joint_states"]),  # stored bottom-up
        dict(paths=[path, big], obs_keys=["image", "proprio"], action_pad_to=8, stride=2),
        dict(paths=[path, big], obs_keys=["image", "proprio"], pad_end=False),
    ]
    for kw in cases:
        ref = TrajectoryDataset(**kw, horizon=horizon, frame_stack=frame_stack, cache="none")
        ds = TrajectoryDataset(**kw, horizon=horizon, frame_stack=frame_stack, cache=cache)
        assert len(ds) == len(ref) > 0 and ds.cache_nbytes > 0 and ref.cache_nbytes == 0
        want = [ref[i] for i in range(len(ref))]
        for i in range(len(ds)):
            _assert_same_items(ds[i], want[i])
        order = np.random.default_rng(0).permutation(len(ds)).tolist() * 2  # repeats: frames shared
        for got_ref, got, i in zip(ref.__getitems__(order), ds.__getitems__(order), order):
            _assert_same_items(got_ref, want[i])
            _assert_same_items(got, want[i])
    assert TrajectoryDataset(path, cache="low_dim")[-1]["timestep"] == 6
    with pytest.raises(IndexError):
        TrajectoryDataset(path).__getitems__([0, 18])
    with pytest.raises(ValueError, match="cache must be one of"):
        TrajectoryDataset(path, cache="everything")


def test_all_cache_batches_copy_images_once(traj_file):
    path, _ = traj_file
    ds = TrajectoryDataset(path, horizon=2, frame_stack=3, cache="all")
    want = ds[5]["obs.image"].clone()
    ds[5]["obs.image"].zero_()  # single samples are fresh copies
    batch = next(iter(DataLoader(ds, batch_size=4)))
    batch["obs.image"].zero_()  # a collated batch is a normal tensor
    item = ds.__getitems__([5, 6])[0]
    item["actions"].mul_(0)  # in the batch path, everything but cached images is fresh too
    assert torch.equal(ds[5]["obs.image"], want) and ds[5]["actions"].abs().sum() > 0
    assert item["obs.image"].is_inference() and not ds[5]["obs.image"].is_inference()
    with pytest.raises(RuntimeError, match="[Ii]nplace update to inference tensor"):
        item["obs.image"].add_(1)  # a view of the cache: an in-place update fails loudly


def test_handles_and_attributes_resolved_once_per_process(traj_file, monkeypatch):
    path, _ = traj_file
    calls = {"open": 0, "group": 0}
    real_init, real_group = TrajectoryFile.__init__, TrajectoryFile._group

    def counting_init(self, *a, **k):
        calls["open"] += 1
        real_init(self, *a, **k)

    def counting_group(self, name):
        calls["group"] += 1
        return real_group(self, name)

    monkeypatch.setattr(TrajectoryFile, "__init__", counting_init)
    monkeypatch.setattr(TrajectoryFile, "_group", counting_group)
    ds = TrajectoryDataset(path, horizon=3, frame_stack=2, cache="none")
    for _ in range(2):
        ds.__getitems__(list(range(len(ds))))
        _ = [ds[i] for i in range(len(ds))]
    calls = {k: 0 for k in calls}
    for _ in range(3):  # warm: no file opened, no episode group looked up again
        ds.__getitems__(list(range(len(ds))))
        _ = [ds[i] for i in range(len(ds))]
    assert calls == {"open": 0, "group": 0}


@pytest.mark.parametrize("cache", ["none", "low_dim", "all"])
def test_pickled_and_forked_workers_give_the_same_batches(traj_file, cache):
    import pickle

    path, _ = traj_file
    ds = TrajectoryDataset(path, horizon=3, frame_stack=2, cache=cache)
    _ = ds.__getitems__([0, 1, 2])  # the parent holds open handles (and views); copies must not reuse them
    clone = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets
    assert clone._handles == {} and clone._episode_ds == {} and clone._views == {}
    for i in range(len(ds)):
        _assert_same_items(clone[i], ds[i])

    def batches(workers):
        loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers,
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
        return list(loader)

    for a, b in zip(batches(0), batches(2), strict=True):
        _assert_same_items(b, a)
    ds.close()
    assert ds._handles == {} and ds[0]["actions"].shape == (3, 7)


def test_corrupt_chunk_raises_naming_file_and_episode(traj_file, tmp_path):
    import h5py

    path, _ = traj_file
    bad = tmp_path / "corrupt.hdf5"
    bad.write_bytes(path.read_bytes())
    with h5py.File(bad, "r") as f:
        chunk = f["data/demo_1/obs/image"].id.get_chunk_info(2)  # gzip'd frame 2 of demo_1
    with open(bad, "r+b") as fh:
        fh.seek(chunk.byte_offset)
        fh.write(b"\xff" * chunk.size)
    ds = TrajectoryDataset(bad, horizon=1, frame_stack=1, cache="low_dim")  # images are read later
    _ = ds[0]
    with pytest.raises(DataError, match=r"corrupt\.hdf5: demo_1/obs/image: cannot read"):
        ds.__getitems__(list(range(len(ds))))
    with pytest.raises(DataError, match=r"corrupt\.hdf5: demo_1/obs/image: cannot read"):
        TrajectoryDataset(bad, cache="all")  # read at construction
