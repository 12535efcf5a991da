"""How an image of any size is shown to the detector: K views drawn like its training crops, pooled in log-odds."""

from __future__ import annotations

import types

import cv2
import numpy as np
import pytest

from core.errors import ConfigError
from perception.forensics import views as V


def photo(h: int = 480, w: int = 512, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_the_crop_bound_is_the_training_crops_own():
    from perception.forensics.generators import MIN_CROP_SCALE

    assert V.MIN_CROP_SCALE == MIN_CROP_SCALE


@pytest.mark.parametrize("h,w", [(480, 512), (1110, 1282), (194, 259), (600, 400), (356, 413)])
def test_boxes_span_the_training_crop_sides_inside_the_image(h, w):
    short = min(h, w)
    boxes = V.view_boxes(h, w, 64, 8)
    assert len(boxes) == 8 == len(set(boxes))
    first = boxes[0]
    assert first.side == short and first.y == (h - short) // 2 and first.x == (w - short) // 2  # centred square
    sides = [b.side for b in boxes]
    assert sides == sorted(sides, reverse=True)  # evenly from the whole square down
    assert min(sides) == max(64, round(0.25 * short))  # generators.pool_crops' smallest side
    for b in boxes:
        assert 0 <= b.y and b.y + b.side <= h and 0 <= b.x and b.x + b.side <= w
    centres = {(b.y + b.side // 2, b.x + b.side // 2) for b in boxes}
    assert len(centres) >= 6  # spread over the image, not stacked on the centre


def test_a_large_photo_is_never_seen_at_one_to_one():
    # a 1:1 crop of a photo much larger than the input looks upsampled to this detector (RESULTS.md): never made
    for k in (1, 4, 8, 16, 32):
        assert all(b.side >= 4 * 64 for b in V.view_boxes(1024, 1536, 64, k))


def test_views_are_area_resized_boxes_and_k1_is_centre_crop_and_resize(tmp_path):
    from core.data.imread import read_square

    img = photo(355, 493)  # odd margins: the centred square as read_square places it
    got, boxes = V.views(img, 64, 8)
    assert got.shape == (8, 64, 64, 3) and got.dtype == np.uint8
    for v, b in zip(got, boxes, strict=True):
        want = cv2.resize(np.ascontiguousarray(img[b.y:b.y + b.side, b.x:b.x + b.side]), (64, 64),
                          interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(v, want)
    assert not np.array_equal(got[1], got[0])
    cv2.imwrite(str(tmp_path / "p.png"), img[..., ::-1])
    one, _ = V.views(img, 64, 1)
    np.testing.assert_array_equal(one[0], read_square(tmp_path / "p.png", 64))  # the former single view


@pytest.mark.parametrize("h,w", [(64, 64), (40, 90), (64, 200)])
def test_an_image_no_larger_than_the_input_is_one_view(h, w):
    got, boxes = V.views(photo(h, w), 64, 8)
    assert len(boxes) == 1 and got.shape == (1, 64, 64, 3) and boxes[0].side == min(h, w)


def test_aggregate_pools_log_odds():
    assert V.aggregate([0.7])["probability"] == pytest.approx(0.7)
    assert V.aggregate([0.9, 0.1])["probability"] == pytest.approx(0.5)
    a = V.aggregate([0.2, 0.5, 0.8, 0.95])
    z = np.mean([np.log(p / (1 - p)) for p in (0.2, 0.5, 0.8, 0.95)])
    assert a["probability"] == pytest.approx(1 / (1 + np.exp(-z)))
    assert (a["min"], a["max"]) == (0.2, 0.95) and a["sd"] == pytest.approx(np.std([0.2, 0.5, 0.8, 0.95]))
    assert V.aggregate([1.0, 1.0])["probability"] <= 1.0  # clipped, finite
    assert V.representative([0.1, 0.5, 0.97]) == 1
    with pytest.raises(ConfigError):
        V.aggregate([])
    with pytest.raises(ConfigError):
        V.view_boxes(100, 100, 64, 0)


def test_score_views_judges_each_image_by_its_k_views(monkeypatch):
    """The scoring ``infer forensics`` runs: every view goes through the detector, the image's P is their pool."""
    from perception.forensics import cli, task

    seen = []

    def fake_prob(detector, images, batch=64):
        seen.append(images.copy())
        return images.reshape(len(images), -1).mean(1) / 255.0  # a view's "P(fake)": its mean brightness

    monkeypatch.setattr(task, "detector_prob", fake_prob)
    det = types.SimpleNamespace(config=lambda: {"size": 64})
    big, small = photo(), photo(48, 48, seed=1)
    out = cli.score_views(det, [big, small], 8)
    assert len(seen) == 1 and len(seen[0]) == 8 + 1  # one batch: 8 views of the photo, 1 of the small image
    (agg, v, pr), (agg_s, v_s, _) = out
    assert agg["n"] == 8 and v.shape == (8, 64, 64, 3) and agg_s["n"] == 1
    np.testing.assert_array_equal(v, V.views(big, 64, 8)[0])
    assert agg["probability"] == pytest.approx(V.aggregate(pr)["probability"])
