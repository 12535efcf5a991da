"""read_image: every image file users have -> (H, W, 3) uint8 RGB; anything else -> one-line DataError."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from core.data.imread import read_image
from core.errors import DataError


def _rgb(h: int = 6, w: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _check(img: np.ndarray, shape: tuple[int, int]) -> None:
    assert img.dtype == np.uint8 and img.shape == (*shape, 3) and img.flags["C_CONTIGUOUS"]


def test_8bit_rgb_png_and_bmp_are_exact(tmp_path):
    rgb = _rgb()
    for ext in ("png", "bmp", "tif", "webp"):
        kw = {"lossless": True} if ext == "webp" else {}
        Image.fromarray(rgb).save(tmp_path / f"a.{ext}", **kw)
        out = read_image(tmp_path / f"a.{ext}")
        _check(out, (6, 10))
        np.testing.assert_array_equal(out, rgb, err_msg=ext)


def test_jpeg_is_rgb_not_bgr(tmp_path):
    flat = np.broadcast_to(np.array([220, 40, 10], np.uint8), (16, 16, 3))
    Image.fromarray(np.ascontiguousarray(flat)).save(tmp_path / "a.jpg", quality=95)
    out = read_image(str(tmp_path / "a.jpg"))
    _check(out, (16, 16))
    assert np.abs(out.astype(int) - flat).max() <= 3


@pytest.mark.parametrize("writer", ["opencv", "pillow"])
def test_16bit_grey_is_scaled_with_rounding(tmp_path, writer):
    g16 = np.array([[0, 128, 129, 385, 386, 32896, 65406, 65535]], np.uint16)
    if writer == "opencv":
        cv2.imwrite(str(tmp_path / "g.png"), g16)
    else:
        Image.fromarray(g16).save(tmp_path / "g.png")
    out = read_image(tmp_path / "g.png")
    _check(out, (1, 8))
    expect = np.array([0, 0, 1, 1, 2, 128, 254, 255], np.uint8)  # round(v / 257); 257 k + 128.5 is the edge
    np.testing.assert_array_equal(out, np.repeat(expect[None, :, None], 3, axis=2))


@pytest.mark.parametrize("ext", ["png", "tif"])
def test_16bit_colour_is_scaled_not_truncated(tmp_path, ext):
    rgb16 = np.random.default_rng(1).integers(0, 65536, (5, 7, 3), dtype=np.uint16)
    rgb16[0, 0] = [2000, 65535, 0]  # 2000 / 257 = 7.78 -> 8 (the high byte would give 7)
    cv2.imwrite(str(tmp_path / f"c.{ext}"), rgb16[..., ::-1])  # OpenCV writes BGR
    out = read_image(tmp_path / f"c.{ext}")
    _check(out, (5, 7))
    np.testing.assert_array_equal(out, np.round(rgb16 / 257.0).astype(np.uint8))
    assert out[0, 0].tolist() == [8, 255, 0]


def test_16bit_rgba_is_composited_on_white(tmp_path):
    bgra = np.zeros((2, 2, 4), np.uint16)
    bgra[..., 2] = 65535  # red
    bgra[0, 0, 3], bgra[0, 1, 3], bgra[1, 0, 3] = 65535, 0, 32768
    cv2.imwrite(str(tmp_path / "c.png"), bgra)
    out = read_image(tmp_path / "c.png")
    assert out[0, 0].tolist() == [255, 0, 0] and out[0, 1].tolist() == [255, 255, 255]
    assert out[1, 0, 0] == 255 and abs(int(out[1, 0, 1]) - 127) <= 1


def test_grey_and_grey_alpha(tmp_path):
    g = _rgb()[..., 0]
    Image.fromarray(g, "L").save(tmp_path / "l.png")
    np.testing.assert_array_equal(read_image(tmp_path / "l.png"), np.repeat(g[..., None], 3, axis=2))
    la = np.stack([g, np.full_like(g, 255)], -1)
    la[0, 0, 1] = 0
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    out = read_image(tmp_path / "la.png")
    assert out[0, 0].tolist() == [255, 255, 255]  # transparent -> white
    np.testing.assert_array_equal(out[1:], np.repeat(g[1:, :, None], 3, axis=2))


def test_rgba_png_is_composited_on_white(tmp_path):
    rgba = np.zeros((3, 3, 4), np.uint8)
    rgba[..., :3] = [0, 0, 200]
    rgba[0, :, 3], rgba[1, :, 3], rgba[2, :, 3] = 255, 0, 128
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = read_image(tmp_path / "a.png")
    _check(out, (3, 3))
    assert out[0, 0].tolist() == [0, 0, 200]
    assert out[1, 0].tolist() == [255, 255, 255]
    assert np.abs(out[2, 0].astype(int) - [127, 127, 227]).max() <= 1  # 128/255 of blue over white


def test_palette_png_with_and_without_transparency(tmp_path):
    rgb = _rgb(8, 8, seed=3) // 64 * 64  # few colours: an exact palette
    pal = Image.fromarray(rgb).quantize(colors=64, dither=Image.Dither.NONE)
    pal.save(tmp_path / "p.png")
    assert Image.open(tmp_path / "p.png").mode == "P"
    np.testing.assert_array_equal(read_image(tmp_path / "p.png"), np.asarray(pal.convert("RGB")))
    idx = np.asarray(pal)[0, 0]
    pal.save(tmp_path / "pt.png", transparency=int(idx))
    out = read_image(tmp_path / "pt.png")
    assert out[0, 0].tolist() == [255, 255, 255]  # the transparent palette entry -> white


def test_cmyk_jpeg(tmp_path):
    rgb = np.zeros((16, 32, 3), np.uint8)
    rgb[:, :16] = [200, 30, 30]
    rgb[:, 16:] = [20, 180, 60]
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "c.jpg", quality=95)
    assert Image.open(tmp_path / "c.jpg").mode == "CMYK"
    out = read_image(tmp_path / "c.jpg")
    _check(out, (16, 32))
    assert np.abs(out[4:-4, 4:12].astype(int) - [200, 30, 30]).max() <= 6
    assert np.abs(out[4:-4, 20:28].astype(int) - [20, 180, 60]).max() <= 6


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(tmp_path, orientation):
    rgb = _rgb(4, 7, seed=orientation)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(rgb).save(tmp_path / "o.png", exif=exif)
    expect = np.asarray(ImageOps.exif_transpose(Image.open(tmp_path / "o.png")).convert("RGB"))
    out = read_image(tmp_path / "o.png")
    assert out.shape == ((4, 7, 3) if orientation < 5 else (7, 4, 3))
    np.testing.assert_array_equal(out, expect)


def test_exif_orientation_on_a_jpeg(tmp_path):
    rgb = np.zeros((16, 32, 3), np.uint8)
    rgb[:, :16] = 250  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: shown rotated 90 degrees clockwise
    Image.fromarray(rgb).save(tmp_path / "o.jpg", exif=exif, quality=95)
    out = read_image(tmp_path / "o.jpg")
    assert out.shape == (32, 16, 3)
    assert out[2:14, 4:12].mean() > 240 and out[18:30, 4:12].mean() < 15  # the white half is now on top


@pytest.mark.parametrize("size", [(1, 1), (1, 999), (777, 3)])
def test_any_size(tmp_path, size):
    rgb = _rgb(*size)
    Image.fromarray(rgb).save(tmp_path / "s.png")
    np.testing.assert_array_equal(read_image(tmp_path / "s.png"), rgb)


def test_beyond_pillows_pixel_limit(tmp_path, monkeypatch):
    rgb = _rgb(20, 30)
    Image.fromarray(rgb).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 600 px > 2 x limit: Pillow refuses to open it
    np.testing.assert_array_equal(read_image(tmp_path / "big.png"), rgb)


def test_not_images_are_one_line_data_errors(tmp_path):
    Image.fromarray(_rgb(64, 64)).save(tmp_path / "full.png")
    data = (tmp_path / "full.png").read_bytes()
    (tmp_path / "truncated.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "notes.png").write_text("this is not an image\n")
    (tmp_path / "empty.jpg").write_bytes(b"")
    for name in ("truncated.png", "notes.png", "empty.jpg", "missing.png"):
        with pytest.raises(DataError) as e:
            read_image(tmp_path / name)
        assert str(e.value).startswith(str(tmp_path / name)) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(DataError, match="no such file"):
        read_image(tmp_path / "missing.png")
