"""Angular-error metrics of surface normals, pooled over valid pixels (the ClearGrasp / DSINE protocol).

Pooled means every valid pixel of every image counts once (not a mean of per-image means). Reported:
mean, median and RMSE of the angle between predicted and ground-truth normals in degrees, and the share
of pixels (in %) whose error is under 5, 7.5, 11.25, 22.5 and 30 degrees.
"""

from __future__ import annotations

import numpy as np
import torch

THRESHOLDS_DEG: tuple[float, ...] = (5.0, 7.5, 11.25, 22.5, 30.0)

__all__ = ["THRESHOLDS_DEG", "NormalMetrics", "angular_error_deg"]


def angular_error_deg(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Angle in degrees between (..., 3, H, W) normal maps (normalised here), as (..., H, W) float32.

    Uses ``atan2(|a x b|, a . b)``, accurate for small and large angles alike.
    """
    a = torch.nn.functional.normalize(pred.double(), dim=-3, eps=1e-12)
    b = torch.nn.functional.normalize(target.double(), dim=-3, eps=1e-12)
    cross = torch.linalg.cross(a, b, dim=-3).norm(dim=-3)
    dot = (a * b).sum(-3)
    return torch.rad2deg(torch.atan2(cross, dot)).float()


class NormalMetrics:
    """Accumulates per-pixel angular errors over batches; ``compute()`` gives the pooled metrics."""

    def __init__(self):
        self._errors: list[np.ndarray] = []

    def update(self, pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> None:
        """Add a batch: ``pred`` / ``target`` (B, 3, H, W) normals in one frame, ``valid`` (B, H, W) bool."""
        if pred.shape != target.shape:
            raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ")
        err = angular_error_deg(pred, target)
        self._errors.append(err[valid.bool()].cpu().numpy())

    @property
    def num_pixels(self) -> int:
        return int(sum(e.size for e in self._errors))

    def compute(self) -> dict[str, float]:
        """``{"mean", "median", "rmse", "a5", "a7.5", "a11.25", "a22.5", "a30", "pixels"}`` (degrees / %)."""
        if not self.num_pixels:
            return {"pixels": 0}
        e = np.concatenate(self._errors).astype(np.float64)
        out = {"mean": float(e.mean()), "median": float(np.median(e)), "rmse": float(np.sqrt((e**2).mean()))}
        for t in THRESHOLDS_DEG:
            out[f"a{t:g}"] = float((e < t).mean() * 100.0)
        out["pixels"] = int(e.size)
        return out
