import hashlib
import json

import cv2
import numpy as np
import pytest

from core.data.video import VideoClipDataset
from core.errors import ConfigError
from sim.render import videos as V


def _frames(path):
    # OpenCV's decoder: imageio-ffmpeg's reader can race on tiny files under load ("Could not load meta
    # information" when ffmpeg exits before its log header is parsed).
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame[..., ::-1])
    cap.release()
    return np.stack(frames)


def test_make_dataset_clips(tmp_path):
    s = V.make_dataset(tmp_path / "a", n=3, seed=0, size=32, test_fraction=0.34)
    assert s["splits"] == {"train": 2, "test": 1}
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert sorted(c["scene"] for c in meta["clips"].values()) == sorted(V.SCENES)
    files = sorted((tmp_path / "a").rglob("*.mp4"))
    assert len(files) == 3
    for f in files:
        video = _frames(f)
        assert video.shape == (V.FRAMES, 32, 32, 3)
        assert np.abs(video[-1].astype(int) - video[0]).mean() > 0.5  # something moved
        qpos = np.load(f.parent.parent / "qpos" / f.name.replace(".mp4", ".npy"))
        assert qpos.shape[0] == V.FRAMES and np.isfinite(qpos).all()
    clips = VideoClipDataset(tmp_path / "a" / "train" / "video", clip_len=8)
    assert len(clips) == 4 and clips[0]["video"].shape == (8, 3, 32, 32)
    V.make_dataset(tmp_path / "b", n=3, seed=0, size=32, test_fraction=0.34)
    for f in files:
        g = tmp_path / "b" / f.relative_to(tmp_path / "a")
        assert hashlib.sha256(f.read_bytes()).digest() == hashlib.sha256(g.read_bytes()).digest()


def test_simulate_clip_is_deterministic():
    a, qa = V.simulate_clip("double_pendulum", np.random.default_rng(5), size=16, frames=4)
    b, qb = V.simulate_clip("double_pendulum", np.random.default_rng(5), size=16, frames=4)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(qa, qb)
    assert not np.allclose(qa[0], qa[-1])


def test_bad_arguments(tmp_path):
    with pytest.raises(ConfigError, match="size"):
        V.make_dataset(tmp_path, n=1, size=33)
    with pytest.raises(ConfigError, match="scene"):
        V.scene_xml("juggling", np.random.default_rng(0))


def test_frames_sets_the_clip_length_and_is_checked(tmp_path):
    V.make_dataset(tmp_path / "long", n=1, seed=0, size=16, test_fraction=0.0, frames=5)
    meta = json.loads((tmp_path / "long" / "meta.json").read_text())
    assert meta["frames"] == 5 and next(iter(meta["clips"].values()))["frames"] == 5
    assert _frames(next((tmp_path / "long").rglob("*.mp4"))).shape == (5, 16, 16, 3)
    with pytest.raises(ConfigError, match="frames"):
        V.make_dataset(tmp_path / "none", n=1, frames=0)
