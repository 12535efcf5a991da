"""Haar transform, wavelet loss, latent-cell masking: the checks the spec lists, with teeth."""

from __future__ import annotations

import pytest
import torch

from perception.normals.losses import (
    haar_dwt,
    haar_idwt,
    latent_valid_mask,
    masked_mse,
    normal_gradient_weight,
    wavelet_loss,
)


def _normals(B=2, H=16, W=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(B, 3, H, W, generator=g), dim=1)


def test_haar_round_trip_is_exact_and_orthonormal():
    x = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    bands = haar_dwt(x)
    assert all(b.shape == (2, 3, 4, 6) for b in bands)
    torch.testing.assert_close(haar_idwt(*bands), x, atol=1e-12, rtol=0)
    energy = sum(b.pow(2).sum() for b in bands)  # orthonormal: energy preserved
    torch.testing.assert_close(energy, x.pow(2).sum())


def test_haar_equals_pywavelets_and_ptwt_on_fixed_inputs():
    """The own Haar is PyWavelets' / ptwt's one-level ``haar`` DWT: same bands, order and signs (float64,
    1e-12)."""
    pywt = pytest.importorskip("pywt", reason="PyWavelets is the reference (installed with scikit-image)")
    x = torch.randn(2, 3, 8, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ll, (lh, hl, hh) = pywt.dwt2(x.numpy(), "haar", axes=(-2, -1))
    for own, ref in zip(haar_dwt(x), (ll, lh, hl, hh)):
        torch.testing.assert_close(own, torch.from_numpy(ref), atol=1e-12, rtol=0)
    try:
        import ptwt
    except ImportError:  # not a dependency (see the losses module docstring); checked where installed
        return
    lib = ptwt.wavedec2(x, "haar", level=1)
    for own, ref in zip(haar_dwt(x), (lib[0], *lib[1])):
        torch.testing.assert_close(own, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(haar_idwt(*haar_dwt(x)), ptwt.waverec2(lib, "haar"), atol=1e-12, rtol=0)


def test_haar_bands_mean_what_they_say():
    x = torch.zeros(1, 1, 2, 2)
    x[..., 0, :] = 1.0  # top row bright: a horizontal edge
    ll, lh, hl, hh = haar_dwt(x)
    assert ll.item() == 1.0 and lh.item() == 1.0 and hl.item() == 0.0 and hh.item() == 0.0
    flat = haar_dwt(torch.full((1, 1, 4, 4), 0.3))
    assert all(b.abs().max() == 0 for b in flat[1:])


def test_wavelet_loss_zero_at_target_positive_elsewhere():
    n = _normals()
    valid = torch.ones(2, 16, 16, dtype=torch.bool)
    assert wavelet_loss(n, n, valid).item() == 0.0
    assert wavelet_loss(n + 0.1, n, valid).item() > 0.0


def test_wavelet_loss_ignores_invalid_blocks():
    n = _normals()
    valid = torch.ones(2, 16, 16, dtype=torch.bool)
    valid[:, :8] = False
    pred = n.clone()
    pred[:, :, :8] += 5.0  # wrong only where invalid
    assert wavelet_loss(pred, n, valid).item() == 0.0


def test_gradient_weight_is_zero_on_flat_regions_and_max_normalised():
    n = torch.zeros(1, 3, 8, 8)
    n[:, 2] = -1.0
    n[:, :, :, 4:] = torch.tensor([1.0, 0.0, 0.0]).view(1, 3, 1, 1)  # a crease at column 4
    w = normal_gradient_weight(n, torch.ones(1, 8, 8, dtype=torch.bool))
    assert w.shape == (1, 1, 4, 4)
    assert w.max().item() == 1.0
    assert w[..., 0].abs().max() == 0 and w[..., 3].abs().max() == 0  # far from the crease
    assert (w[..., 2] > 0).all()  # the 2x2 block holding columns 4-5 sees the step at column 4


def test_single_invalid_pixel_voids_exactly_its_latent_cell():
    valid = torch.ones(1, 16, 16, dtype=torch.bool)
    valid[0, 9, 2] = False  # pixel in cell (1, 0) for factor 8
    cells = latent_valid_mask(valid, 8)
    assert cells.shape == (1, 2, 2)
    assert cells.tolist() == [[[True, True], [False, True]]]
    # the loss does not see that cell, whatever the prediction there
    target = torch.zeros(1, 4, 2, 2)
    pred = torch.zeros(1, 4, 2, 2)
    pred[..., 1, 0] = 100.0
    assert masked_mse(pred, target, cells).item() == 0.0
    pred[..., 0, 1] = 1.0
    assert masked_mse(pred, target, cells).item() > 0.0
