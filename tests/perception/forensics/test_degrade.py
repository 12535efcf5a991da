"""The robustness protocol's degradations (JPEG, resize, blur): what each does to an image, measured."""

from __future__ import annotations

import numpy as np
import pytest

from core.data.imread import square
from core.errors import ConfigError
from perception.forensics.degrade import LEVELS, apply, canonical, parse, tag


def _photo(h=64, w=64, seed=0):
    """A smooth image with texture: gradients plus band-limited noise (JPEG and blur both act on it)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 3.0, y * 3.0, (x + y) * 1.5], -1)
    noise = rng.normal(0, 25, (h, w, 3))
    return np.clip(base + noise + 40, 0, 255).astype(np.uint8)


def _psnr(a, b):
    return 10 * np.log10(255.0**2 / np.mean((a.astype(float) - b.astype(float)) ** 2))


def test_specs_parse_canonicalise_and_name_files():
    assert parse("none") == () and parse("") == () and canonical(None) == "none" and tag("none") == "none"
    assert parse("JPEG=75, blur=1.5") == (("jpeg", 75.0), ("blur", 1.5))
    assert canonical("jpeg=75.0,resize=0.50") == "jpeg=75,resize=0.5"
    assert tag("jpeg=75,blur=1") == "jpeg75_blur1" and tag("resize=0.5") == "resize0.5"
    assert all(canonical(lv) == lv for lv in LEVELS)


@pytest.mark.parametrize("spec, says", [("gamma=2", "one of jpeg=V"), ("jpeg", "one of jpeg=V"),
                                        ("jpeg=abc", "not a number"), ("jpeg=0", "out of range"),
                                        ("jpeg=75.5", "out of range"), ("resize=1", "out of range"),
                                        ("blur=0", "out of range"), ("resize=20", "out of range")])
def test_bad_specs_are_one_line_errors_naming_the_valid_ones(spec, says):
    with pytest.raises(ConfigError) as e:
        parse(spec)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_jpeg_loses_more_at_lower_quality_and_keeps_the_size():
    img = _photo()
    out = {q: apply(img, f"jpeg={q}") for q in (95, 75, 50)}
    assert all(o.shape == img.shape and o.dtype == np.uint8 for o in out.values())
    p = {q: _psnr(img, o) for q, o in out.items()}
    assert p[95] > p[75] > p[50] > 20  # monotone in quality, and still the same picture
    np.testing.assert_array_equal(apply(img, "jpeg=75"), out[75])  # deterministic


def test_resize_changes_the_side_and_the_reader_brings_it_back():
    img = _photo()
    half, double = apply(img, "resize=0.5"), apply(img, "resize=2")
    assert half.shape == (32, 32, 3) and double.shape == (128, 128, 3)
    back = square(half, 64)
    assert back.shape == (64, 64, 3)
    assert 15 < _psnr(img, back) < _psnr(img, square(double, 64))  # half the resolution is lost, 2x resamples
    # the reader enlarges bilinearly, not in blocks: a 2 x 2 checker gets values between its two
    checker = np.kron(np.array([[0, 255], [255, 0]], np.uint8), np.ones((1, 1), np.uint8))[..., None].repeat(3, 2)
    big = square(checker, 8)
    assert len(np.unique(big)) > 2


def test_blur_has_the_stated_sigma_and_keeps_flat_images():
    flat = np.full((32, 32, 3), 77, np.uint8)
    np.testing.assert_array_equal(apply(flat, "blur=2"), flat)
    delta = np.zeros((41, 41, 3), np.uint8)
    delta[20, 20] = 255
    for sigma in (1.0, 2.0):
        out = apply(delta, f"blur={sigma:g}")[..., 0].astype(float)
        y, x = np.mgrid[0:41, 0:41]
        var = (out * (x - 20) ** 2).sum() / out.sum()  # the spread of the blurred point along x
        assert abs(np.sqrt(var) - sigma) < 0.15 * sigma
    img = _photo()
    hp = lambda a: np.abs(np.diff(a.astype(float), axis=1)).mean()  # noqa: E731 - high-frequency energy
    assert hp(apply(img, "blur=2")) < hp(apply(img, "blur=1")) < hp(img)


def test_the_dataset_degrades_its_images_and_none_is_the_clean_read(tmp_path):
    from PIL import Image

    from perception.forensics.genimage import GenImageDataset, scan

    for i in range(2):
        d = tmp_path / "gen" / "val" / ("ai" if i else "nature")
        d.mkdir(parents=True)
        Image.fromarray(_photo(seed=i)).save(d / "0.png")
    items = scan(tmp_path, "val")
    clean = GenImageDataset(items, 64)[0]["image"]
    np.testing.assert_array_equal(GenImageDataset(items, 64, "none")[0]["image"], clean)
    np.testing.assert_array_equal(clean, _photo(seed=0))  # a 64 px file read at 64 px is the file
    jp = GenImageDataset(items, 64, "jpeg=50")[0]["image"]
    np.testing.assert_array_equal(jp, apply(clean, "jpeg=50"))
    half = GenImageDataset(items, 64, "resize=0.5")[0]["image"]
    assert half.shape == (64, 64, 3) and not np.array_equal(half, clean)
    with pytest.raises(ConfigError):
        GenImageDataset(items, 64, "sharpen=1")
