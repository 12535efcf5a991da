"""The shipped detector on images nobody trained it on, judged as ``embodied infer forensics`` judges them.

Real photos it never saw (``perception.forensics.card.HELDOUT_PHOTOS``: opencv-doc's sample photos and the pool's
two held-out photos) must stay below a false-alarm bound measured with the shipped model, and below the former
single centred view's rate; images unlike any training crop (flat, a checkerboard, drawn shapes, rendered text) must
be flagged by the domain check on the views the model sees.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from core.data.imread import read_image
from core.resources import asset
from perception.forensics.card import HELDOUT_PHOTOS, heldout_photo_paths, real_photo_check
from perception.forensics.cli import domain_flags, score_views
from perception.forensics.views import DEFAULT_VIEWS, views

CHECKPOINT = asset("checkpoints", "deepvrm")
#: Measured with the shipped detector and DEFAULT_VIEWS views (RESULTS.md, "Scoring photos larger than 64 px"):
#: 3 of the 28 photos called fake (apple, fruits, orange: 10.7 %); the former single centred view: 5 of 28 (17.9 %).
#: The bound allows one more.
FALSE_ALARM_BOUND = 4 / 28


@pytest.fixture(scope="module")
def detector():
    from perception.forensics.task import load_detector

    return load_detector(CHECKPOINT)[0]


def foreign() -> dict[str, np.ndarray]:
    """Larger-than-input images no training crop looks like: flat, a checkerboard, rendered text, a drawing of blobs
    (opencv-doc's ``detect_blob.png``). Not here: renders of objects (opencv-doc's ``Blender_Suzanne1.jpg``, the
    glassware sample): the ImageNet feature of the check puts them near real photos (RESULTS.md)."""
    import cv2

    from core.data.samples import opencv_sample

    y, x = np.mgrid[0:300, 0:400]
    board = np.repeat((((y // 20) + (x // 20)) % 2 * 255).astype(np.uint8)[..., None], 3, -1)
    text = np.full((240, 480, 3), 255, np.uint8)
    for i, line in enumerate(("Is this image real", "or fake? Please just", "answer real or fake.")):
        cv2.putText(text, line, (10, 60 + 60 * i), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (0, 0, 0), 2, cv2.LINE_AA)
    return {"flat grey": np.full((300, 400, 3), 128, np.uint8), "checkerboard": board, "rendered text": text,
            "drawn blobs": read_image(opencv_sample("detect_blob.png"))}


def test_foreign_images_are_flagged_on_the_views_the_model_sees():
    images = foreign()
    seen = [views(im, 64, DEFAULT_VIEWS)[0] for im in images.values()]
    assert all(len(v) == DEFAULT_VIEWS for v in seen)
    stream = io.StringIO()
    flags = domain_flags(CHECKPOINT, seen, list(images), stream=stream)
    assert flags == [True] * len(images), dict(zip(images, flags, strict=True))
    assert len(stream.getvalue().splitlines()) == len(images)  # one warning per input, not per view


@pytest.mark.slow  # about a minute: 28 photos x 8 views, and the former single view for comparison
def test_held_out_real_photos_stay_below_the_false_alarm_bound(detector):
    photos = real_photo_check(detector, CHECKPOINT, DEFAULT_VIEWS)
    assert len(photos) == len(HELDOUT_PHOTOS)  # opencv-doc, scikit-image and matplotlib are in the pinned set
    assert all(r["views"] == DEFAULT_VIEWS for r in photos.values())  # all larger than the input: K distinct views
    called_fake = sorted(n for n, r in photos.items() if r["probability"] >= 0.5)
    assert len(called_fake) / len(photos) <= FALSE_ALARM_BOUND, called_fake
    in_domain = [n for n, r in photos.items() if r["out_of_domain"] is False]
    assert len(in_domain) >= len(photos) // 2  # real photos are mostly in the detector's domain

    paths = heldout_photo_paths()
    single = score_views(detector, [read_image(paths[n]) for n in photos], 1)  # the former centred view
    before = sum(agg["probability"] >= 0.5 for agg, _, _ in single)
    assert len(called_fake) < before, (called_fake, before)
