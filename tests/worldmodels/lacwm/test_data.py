"""TransitionDataset: frame windows, summed motion labels and concatenated actions line up with the file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.data.trajectories import TrajectoryWriter
from worldmodels.lacwm.data import TransitionDataset


def _write(path, embodiment: str, a_dim: int, lengths=(10, 7)):
    with TrajectoryWriter(path, env_meta={"env_name": "toy"}) as w:
        for e, T in enumerate(lengths):
            t = np.arange(T)
            img = np.zeros((T, 8, 8, 3), np.uint8)
            img[:, 0, 0, 0] = t  # the step index in pixel (0, 0)
            eef = np.tile(t[:, None].astype(np.float32), (1, 6)) + 100 * e
            acts = np.tile(t[:, None].astype(np.float32), (1, a_dim))
            w.add_episode({"image": img, "eef_delta": eef}, acts, attrs={"embodiment": embodiment})


def test_windows_motion_and_actions(tmp_path):
    _write(tmp_path / "a.hdf5", "ArmA", 3)
    _write(tmp_path / "b.hdf5", "ArmB", 5, lengths=(9,))
    ds = TransitionDataset([tmp_path / "a.hdf5", tmp_path / "b.hdf5"], context=2, skip=2, action_pad_to=10)
    # anchors t >= context * skip = 4: episode lengths 10, 7, 9 -> 6 + 3 + 5 windows
    assert len(ds) == 14 and ds.embodiments == ["ArmA", "ArmB"]
    s = ds[0]  # episode 0 anchored at t = 4: frames at steps 0, 2, 4
    assert s["frames"].shape == (3, 3, 8, 8) and s["frames"][:, 0, 0, 0].tolist() == [0, 2, 4]
    torch.testing.assert_close(s["motion"][:, 0], torch.tensor([0.0 + 1, 2.0 + 3]))  # summed eef_delta
    assert s["actions"].shape == (2, 10)  # 2 steps x 3 dims, zero-padded to 10
    assert s["actions"][0, :6].tolist() == [0, 0, 0, 1, 1, 1] and not s["actions"][:, 6:].any()
    b = ds[len(ds) - 1]
    assert int(b["embodiment_id"]) == 1 and ds.embodiment_of(len(ds) - 1) == "ArmB"
    assert set(ds.groups()) == {"ArmA", "ArmB"} and len(ds.groups()["ArmB"]) == 5
    few = TransitionDataset([tmp_path / "a.hdf5"], context=1, skip=1, episodes_per_embodiment=1)
    assert len(few) == 9  # only the first episode (T=10, anchors 1..9)


def test_bad_inputs_fail_clearly(tmp_path):
    from core.errors import ConfigError, DataError

    _write(tmp_path / "a.hdf5", "ArmA", 3)
    with pytest.raises(ConfigError, match="context"):
        TransitionDataset([tmp_path / "a.hdf5"], context=0)
    with pytest.raises(DataError, match="vocabulary"):
        TransitionDataset([tmp_path / "a.hdf5"], embodiment_names=["Other"])
    with pytest.raises(DataError, match="no such file"):
        TransitionDataset([tmp_path / "missing.hdf5"])


def test_cached_recording_with_other_settings_is_refused(tmp_path):
    """The recording cache is keyed by env id: a file of another image size / episode count / camera must not be
    reused."""
    from core.errors import ConfigError
    from worldmodels.lacwm.data import RecordSpec, check_cached, record_file

    _write(tmp_path / "embodied_Reach-ArmA-v0.hdf5", "ArmA", 3)  # 2 episodes (10, 7 steps) of 8 px frames
    ok = RecordSpec("embodied/Reach-ArmA-v0", episodes=2, seed=0, max_steps=10, image_size=8)
    assert record_file(ok, tmp_path) == tmp_path / "embodied_Reach-ArmA-v0.hdf5"  # cache hit, nothing recorded
    for bad in ({"image_size": 16}, {"episodes": 4}, {"max_steps": 5}, {"camera": "workspace"}):
        spec = RecordSpec(**{**ok.__dict__, **bad})
        with pytest.raises(ConfigError, match="new data.root"):
            check_cached(spec, tmp_path / "embodied_Reach-ArmA-v0.hdf5")
        with pytest.raises(ConfigError, match="new data.root"):
            record_file(spec, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pretraining_records_and_uses_libero_interaction(tmp_path):
    """LIBERO scenes join the pretraining data through the same recorder and trajectory loader."""
    from core.data.trajectories import TrajectoryFile
    from embodied.cli import main

    data = tmp_path / "data"
    args = ["train", "lacwm", "model=lacwm_tiny", "debug=tiny", f"data.root={data}",
            "data.libero_tasks=[embodied/Libero-spatial-0-v0]", "data.libero_episodes=1",
            "data.num_pretrain_embodiments=1", "data.episodes=1", "data.adapt_episodes=1", "data.test_episodes=1",
            "data.max_steps=12", "data.image_size=32", f"out_dir={tmp_path / 'run'}"]
    assert main(args) == 0
    libero = data / "pretrain" / "embodied_Libero-spatial-0-v0.hdf5"
    with TrajectoryFile(libero) as f:
        assert f.language_instruction and len(f.episodes) == 1
        assert "obs/eef_delta" in f.keys("demo_0")
    assert (tmp_path / "run" / "adapted").is_dir()
