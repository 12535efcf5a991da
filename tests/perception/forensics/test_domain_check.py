"""The shipped Deep-VRM detector's domain check: statistics and card present, samples in, foreign images out."""

from __future__ import annotations

import io

import numpy as np
import pytest

from core import domain
from core.data.imread import read_square
from core.pretrained import read_card
from core.resources import asset
from perception.forensics.views import DEFAULT_VIEWS

CHECKPOINT = asset("checkpoints", "deepvrm")
SAMPLES = asset("samples", "deepvrm", "images")


def foreign() -> dict[str, np.ndarray]:
    """Synthetic images nothing in the real-crop pool looks like (64 px, the detector's input size)."""
    y, x = np.mgrid[0:64, 0:64]
    board = (((y // 8) + (x // 8)) % 2 * 255).astype(np.uint8)
    return {"checkerboard": np.stack([board] * 3, -1), "flat grey": np.full((64, 64, 3), 128, np.uint8)}


@pytest.fixture(scope="module")
def loaded():
    got = domain.load(CHECKPOINT)
    assert got is not None, "assets/checkpoints/deepvrm has no domain statistics (run cli.calibrate_domain)"
    return got


def test_card_states_the_domain_and_the_check(loaded):
    ref, entry = loaded
    card = read_card(CHECKPOINT)
    assert "64 px" in card["training_domain"]
    assert ref.shape == (entry["n_train"], 1280)
    assert 0.0 < entry["threshold"] < 1.0
    assert entry["n_calibration"] >= 32 and entry["n_heldout"] >= 32
    assert entry["false_alarm_rate_heldout"] <= 0.1
    assert "pool_crops" in entry["calibration"]
    # calibrated on what `infer forensics` feeds the model: each image's views, judged by their median distance
    assert entry["views"] == DEFAULT_VIEWS and "median" in entry["rule"] and "pool_regions" in entry["calibration"]
    assert "views" in card["training_domain"]


def test_shipped_samples_in_domain_and_foreign_images_flagged(loaded):
    _, entry = loaded
    files = sorted(SAMPLES.glob("*.png"))
    assert len(files) >= 8
    samples = [read_square(f, 64) for f in files]  # as `infer forensics` reads them
    others = foreign()
    dist = domain.check(CHECKPOINT, samples + list(others.values()))
    inside, outside = dist[:len(samples)], dist[len(samples):]
    assert sum(d > entry["threshold"] for d in inside) <= len(samples) // 8, inside
    assert all(d > entry["threshold"] for d in outside), dict(zip(others, outside, strict=True))

    stream = io.StringIO()  # the command's warning: one line for the foreign image, none for the sample
    flags = domain.warn_if_out_of_domain(CHECKPOINT, [samples[0], others["checkerboard"]],
                                         [files[0].name, "checkerboard"], stream=stream)
    assert flags == [False, True]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "checkerboard is far from this model's training domain" in lines[0]
