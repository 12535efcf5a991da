"""Losses and metrics for 360 depth and segmentation on the sphere.

Depth (metres, Euclidean range): BerHu loss; MAE, RMSE, AbsRel and delta1 (share of ``max(p/g, g/p) < 1.25``)
over valid targets (``> 0``). Segmentation: cross-entropy and mean IoU from an accumulated confusion matrix
over the classes present in the ground truth, leaving out ``ignore_index``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["DepthMetrics", "berhu_loss", "confusion_matrix", "mean_iou"]


def berhu_loss(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, c: float = 0.2) -> torch.Tensor:
    """Reverse Huber: ``|e|`` below ``t = c * max|e|`` (over the batch), ``(e^2 + t^2) / 2t`` above.

    Args:
        pred, target: (...) depths in metres. valid: (...) bool. c: threshold as a share of the largest error.

    Returns:
        () mean over valid entries (0 when there are none).
    """
    err = (pred - target).abs()[valid]
    if err.numel() == 0:
        return pred.sum() * 0.0
    t = (c * err.max().detach()).clamp_min(1e-6)
    return torch.where(err <= t, err, (err * err + t * t) / (2 * t)).mean()


class DepthMetrics:
    """Accumulates MAE, RMSE, AbsRel and delta1 over batches (every valid sample counts equally)."""

    def __init__(self):
        self.n = 0
        self.abs = self.sq = self.rel = self.d1 = 0.0

    def update(self, pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """pred, target: (...) metres; valid: (...) bool (default ``target > 0``)."""
        valid = target > 0 if valid is None else valid & (target > 0)
        p, g = pred[valid].double().clamp_min(1e-6), target[valid].double()
        e = p - g
        self.n += int(g.numel())
        self.abs += float(e.abs().sum())
        self.sq += float((e * e).sum())
        self.rel += float((e.abs() / g).sum())
        self.d1 += float((torch.maximum(p / g, g / p) < 1.25).sum())

    def compute(self) -> dict[str, float]:
        n = max(self.n, 1)
        return {"mae": self.abs / n, "rmse": (self.sq / n) ** 0.5, "absrel": self.rel / n, "delta1": self.d1 / n}


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> np.ndarray:
    """(num_classes, num_classes) int64 counts, rows = ground truth, columns = prediction."""
    t, p = target.reshape(-1).long(), pred.reshape(-1).long()
    ok = (t >= 0) & (t < num_classes)
    cm = torch.bincount(t[ok] * num_classes + p[ok], minlength=num_classes * num_classes)
    return cm.reshape(num_classes, num_classes).cpu().numpy()


def mean_iou(cm: np.ndarray, ignore_index: int | None = None) -> tuple[float, np.ndarray]:
    """Mean IoU over classes with ground-truth pixels (``ignore_index`` left out); also per-class IoU (NaN =
    absent). Predictions of the ignored class count as errors for the other classes' rows only."""
    cm = cm.astype(np.float64)
    keep = np.ones(len(cm), bool)
    if ignore_index is not None and 0 <= ignore_index < len(cm):
        keep[ignore_index] = False
        cm = cm.copy()
        cm[ignore_index, :] = 0  # ignored ground truth does not count at all
    tp = np.diag(cm)
    union = cm.sum(0) + cm.sum(1) - tp
    present = keep & (cm.sum(1) > 0)
    iou = np.full(len(cm), np.nan)
    iou[present] = tp[present] / np.maximum(union[present], 1)
    return (float(np.nanmean(iou)) if present.any() else float("nan")), iou


def seg_loss(logits: torch.Tensor, target: torch.Tensor, ignore_index: int | None) -> torch.Tensor:
    """Cross-entropy; logits (B, N, K), target (B, N) int64; ``ignore_index`` left out."""
    ii = -100 if ignore_index is None else ignore_index
    if (target != ii).sum() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.flatten(0, -2).float(), target.reshape(-1), ignore_index=ii)
