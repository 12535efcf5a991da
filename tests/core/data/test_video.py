from __future__ import annotations

import numpy as np
import pytest
import torch

from core.data.images import write_image
from core.data.video import VideoClipDataset, read_frames, write_mp4
from core.errors import DataError


def frames(T: int = 12, H: int = 16, W: int = 24) -> np.ndarray:
    # each frame a flat grey level, so frame identity survives lossy coding
    return np.repeat(np.arange(T, dtype=np.uint8)[:, None, None, None] * 20, H * W * 3).reshape(T, H, W, 3)


def test_mp4_round_trip_and_clip_sampling(tmp_path):
    video = frames()
    path = write_mp4(tmp_path / "clip.mp4", video, fps=10, crf=0)
    assert not [p for p in tmp_path.iterdir() if p.name != "clip.mp4"]  # temp file renamed away
    decoded = read_frames(path)
    assert decoded.shape == video.shape
    assert np.abs(decoded.astype(int) - video).max() <= 2
    ds = VideoClipDataset(path, clip_len=3, stride=2, step=4)
    # span 5 frames: starts 0, 4 (start 8 would need frame 12)
    assert len(ds) == 2
    s = ds[1]
    assert s["video"].shape == (3, 3, 16, 24) and s["video"].dtype == torch.uint8
    levels = s["video"][:, 0, 0, 0].float() / 20
    assert levels.round().tolist() == [4, 6, 8] and int(s["start"]) == 4


def test_odd_size_is_padded(tmp_path):
    path = write_mp4(tmp_path / "odd.mp4", frames(T=3, H=15, W=21), fps=5)
    assert read_frames(path).shape == (3, 16, 22, 3)


def test_frame_folder_and_errors(tmp_path):
    video = frames(T=6)
    for t, f in enumerate(video):
        write_image(tmp_path / "seq" / f"frame_{t}.png", f)  # unpadded numbers: numeric sort needed
    ds = VideoClipDataset(tmp_path / "seq", clip_len=2, stride=1, step=1)
    assert len(ds) == 5
    assert ds[4]["video"][:, 0, 0, 0].tolist() == [80, 100]
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    with pytest.raises(DataError, match="broken.mp4: cannot decode video"):
        VideoClipDataset(tmp_path / "broken.mp4")
    ds = VideoClipDataset([tmp_path / "seq", tmp_path / "broken.mp4"], clip_len=2, on_error="skip")
    assert ds.skipped == 1 and len(ds.sources) == 1
    with pytest.raises(DataError, match="nothing.mp4: no such file"):
        VideoClipDataset(tmp_path / "nothing.mp4")


def test_cache_all_gives_the_clips_of_none(tmp_path):
    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, (14, 16, 24, 3), dtype=np.uint8)  # noise: lossy coding changes pixels
    path = write_mp4(tmp_path / "noise.mp4", video, fps=12)
    for t, f in enumerate(video[:7]):
        write_image(tmp_path / "seq" / f"{t}.png", f[..., 0] if t == 3 else f)  # one grey frame
    whole = read_frames(path)
    for kw in (dict(clip_len=3, stride=2, step=1), dict(clip_len=2, step=3, size=(8, 10))):
        ref = VideoClipDataset([path, tmp_path / "seq"], **kw)
        ds = VideoClipDataset([path, tmp_path / "seq"], **kw, cache="all")
        assert len(ds) == len(ref) > 0 and ref.cache_nbytes == 0
        assert ds.cache_nbytes == (14 + 7) * 3 * np.prod(kw.get("size", (16, 24)))
        for i in range(len(ref)):
            a, b = ref[i], ds[i]
            assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), (kw, i)
        if "size" not in kw:  # clips of the mp4 are the frames of one decode of the whole file
            vi, start = (int(x) for x in ref._index[5])
            assert vi == 0 and np.array_equal(ref.clip(vi, start), whole[start : start + 5 : 2])
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    ds = VideoClipDataset([path, tmp_path / "broken.mp4"], clip_len=2, on_error="skip", cache="all")
    assert ds.skipped == 1 and ds.sources == [path] and set(ds._cached) == {0}
    with pytest.raises(ValueError, match="cache must be"):
        VideoClipDataset(path, cache="low_dim")
