"""Angular metrics exact on known angles; a horizontal flip negates x and leaves the metrics unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from core.data.device import RandomHorizontalFlip
from perception.normals.metrics import NormalMetrics, angular_error_deg


def _tilted(angles_deg: torch.Tensor) -> torch.Tensor:
    """(H, W) angles -> (1, 3, H, W) unit normals tilted from -z by each angle about the y axis."""
    a = torch.deg2rad(angles_deg.double())
    return torch.stack([torch.sin(a), torch.zeros_like(a), -torch.cos(a)])[None].float()


def test_metrics_exact_on_known_angles():
    angles = torch.tensor([[1.0, 6.0, 10.0, 20.0], [25.0, 40.0, 90.0, 170.0]])
    gt = _tilted(torch.zeros_like(angles))
    pred = _tilted(angles)
    torch.testing.assert_close(angular_error_deg(pred, gt)[0], angles, atol=2e-3, rtol=0)
    valid = torch.ones(1, 2, 4, dtype=torch.bool)
    valid[0, 1, 3] = False  # the 170 degree pixel does not count
    m = NormalMetrics()
    m.update(pred, gt, valid)
    r = m.compute()
    e = torch.tensor([1.0, 6.0, 10.0, 20.0, 25.0, 40.0, 90.0], dtype=torch.float64)
    assert r["pixels"] == 7
    assert r["mean"] == pytest.approx(float(e.mean()), abs=2e-3)
    assert r["median"] == pytest.approx(20.0, abs=2e-3)
    assert r["rmse"] == pytest.approx(math.sqrt(float((e**2).mean())), abs=2e-3)
    assert r["a5"] == pytest.approx(100 / 7)
    assert r["a7.5"] == pytest.approx(200 / 7) and r["a11.25"] == pytest.approx(300 / 7)
    assert r["a22.5"] == pytest.approx(400 / 7) and r["a30"] == pytest.approx(500 / 7)


def test_metrics_pool_pixels_not_images():
    gt = _tilted(torch.zeros(1, 4))
    m = NormalMetrics()
    m.update(_tilted(torch.tensor([[10.0, 10.0, 10.0, 10.0]])), gt, torch.ones(1, 1, 4, dtype=torch.bool))
    one = torch.zeros(1, 1, 4, dtype=torch.bool)
    one[0, 0, 0] = True
    m.update(_tilted(torch.tensor([[50.0, 0.0, 0.0, 0.0]])), gt, one)
    assert m.compute()["mean"] == pytest.approx((4 * 10 + 50) / 5, abs=1e-3)  # not (10 + 50) / 2


def test_flip_negates_x_and_leaves_metrics_unchanged():
    g = torch.Generator().manual_seed(0)
    gt = torch.nn.functional.normalize(torch.randn(2, 3, 8, 8, generator=g), dim=1)
    pred = torch.nn.functional.normalize(gt + 0.3 * torch.randn(2, 3, 8, 8, generator=g), dim=1)
    valid = torch.rand(2, 8, 8, generator=g) > 0.2
    rgb = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    flip = RandomHorizontalFlip(p=1.0, normal_keys=("normals", "pred"))
    out = flip({"rgb": rgb, "normals": gt, "pred": pred, "valid": valid}, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out["normals"][:, 0], -gt[:, 0].flip(-1))
    torch.testing.assert_close(out["normals"][:, 1:], gt[:, 1:].flip(-1))
    assert torch.equal(out["valid"], valid.flip(-1))
    before, after = NormalMetrics(), NormalMetrics()
    before.update(pred, gt, valid)
    after.update(out["pred"], out["normals"], out["valid"])
    a, b = before.compute(), after.compute()
    for k in a:
        assert a[k] == pytest.approx(b[k], abs=1e-4), k
    # flipping the image but not the x sign would break the metrics
    wrong = NormalMetrics()
    wrong.update(pred.flip(-1), gt.flip(-1) * torch.tensor([-1.0, 1, 1]).view(1, 3, 1, 1), valid.flip(-1))
    assert wrong.compute()["mean"] > a["mean"] + 1.0
