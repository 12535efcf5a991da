"""Recorder: HDF5 round trip through core.data.trajectories, readable mp4s, summary and config."""

from __future__ import annotations

import numpy as np

from core.data.trajectories import TrajectoryFile
from core.data.video import probe_video, read_frames
from core.io import read_json
from sim.recorder import record_rollout, sanitize_env_id
from sim.rollout import RolloutConfig

ENV = "embodied/Lift-Sawyer-v0"


def test_record_rollout_round_trip(tmp_path):
    cfg = RolloutConfig(ENV, episodes=2, num_envs=2, seed=4, env_kwargs={"image_size": 48},
                        max_episode_steps=12, progress=False)
    result = record_rollout(cfg, tmp_path)
    h5 = tmp_path / f"{sanitize_env_id(ENV)}.hdf5"
    assert h5.name == "embodied_Lift-Sawyer-v0.hdf5"
    with TrajectoryFile(h5) as f:
        assert f.episodes == ["demo_0", "demo_1"]
        assert f.env_meta["env_name"] == ENV and f.env_meta["action_space_desc"]["dim"] == 4
        assert f.language_instruction == "pick up the cube"
        for name, ep in zip(f.episodes, result.episodes, strict=True):
            data = f.episode(name)
            T = len(ep)
            np.testing.assert_array_equal(data["obs/image"], ep.obs["image"][:T])
            np.testing.assert_array_equal(data["next_obs/image"], ep.obs["image"][1:])
            np.testing.assert_array_equal(data["actions"], ep.actions)
            np.testing.assert_array_equal(data["obs/eef_delta"], ep.eef_delta)
            np.testing.assert_array_equal(data["obs/proprio"], ep.obs["proprio"][:T])
            assert data["dones"][-1] == 1 and data["dones"][:-1].sum() == 0
            attrs = f.attrs(name)
            assert attrs["embodiment"] == "Sawyer" and attrs["action_space"]["dim"] == 4
            assert bool(attrs["success"]) == ep.solved and attrs["seed"] == ep.seed
    frames = read_frames(tmp_path / "videos" / "episode_1.mp4")
    n, fps, (h, w) = probe_video(tmp_path / "videos" / "episode_1.mp4")
    assert len(frames) == len(result.episodes[1]) + 1 and (h, w) == (48, 48)
    # lossy but close to the recorded frames
    assert np.abs(np.asarray(frames, float) - result.episodes[1].obs["image"]).mean() < 12
    summary = read_json(tmp_path / "summary.json")
    assert summary["episodes"] == 2 and summary["embodiment"] == "Sawyer"
    assert read_json(tmp_path / "config.json")["env_id"] == ENV
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes left no temp files


def test_no_video_without_image(tmp_path):
    cfg = RolloutConfig("embodied/Reach-IIWA-v0", episodes=1, env_kwargs={"image_size": 0},
                        max_episode_steps=4, progress=False)
    record_rollout(cfg, tmp_path, video=True)
    assert not (tmp_path / "videos").exists()
    with TrajectoryFile(tmp_path / "embodied_Reach-IIWA-v0.hdf5") as f:
        assert f.obs_keys("demo_0") == ["eef_delta", "proprio"] or set(f.obs_keys("demo_0")) == {
            "eef_delta", "proprio"}


def test_next_obs_mirrors_every_obs_key(tmp_path):
    """robomimic-style readers load ``next_obs/<key>`` for every ``obs/<key>``: each must exist, with the same
    per-step shape and dtype, and be the observation one step later."""
    cfg = RolloutConfig(ENV, episodes=1, seed=1, env_kwargs={"image_size": 32}, max_episode_steps=6,
                        progress=False)
    record_rollout(cfg, tmp_path, video=False)
    with TrajectoryFile(tmp_path / f"{sanitize_env_id(ENV)}.hdf5") as f:
        data = f.episode("demo_0")
    obs_keys = sorted(k.split("/", 1)[1] for k in data if k.startswith("obs/"))
    assert {"image", "proprio", "eef_delta"} <= set(obs_keys)
    assert sorted(k.split("/", 1)[1] for k in data if k.startswith("next_obs/")) == obs_keys
    T = len(data["actions"])
    for k in obs_keys:
        o, n = data[f"obs/{k}"], data[f"next_obs/{k}"]
        assert n.shape == o.shape and n.dtype == o.dtype and len(o) == T, k
        np.testing.assert_array_equal(n[:-1], o[1:], err_msg=k)


def test_writer_refuses_next_obs_that_does_not_mirror_obs(tmp_path):
    import pytest

    from core.data.trajectories import TrajectoryWriter
    from core.errors import DataError

    obs = {"proprio": np.zeros((3, 2), np.float32), "eef_delta": np.zeros((3, 6), np.float32)}
    with TrajectoryWriter(tmp_path / "t.hdf5") as w:
        with pytest.raises(DataError, match=r"t\.hdf5: demo_0: next_obs lacks obs key\(s\) \['eef_delta'\]"):
            w.add_episode(obs, np.zeros((3, 2)), next_obs={"proprio": obs["proprio"]})
        with pytest.raises(DataError, match=r"next_obs/proprio has shape \(3, 5\), obs/proprio \(3, 2\)"):
            w.add_episode(obs, np.zeros((3, 2)), next_obs={**obs, "proprio": np.zeros((3, 5), np.float32)})
        w.add_episode(obs, np.zeros((3, 2)), next_obs=obs)  # a mirrored next_obs is written
