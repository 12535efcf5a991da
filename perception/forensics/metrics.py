"""Detection metrics of AI-generated-image detectors: accuracy, average precision, per-generator tables.

The protocol of UniversalFakeDetect (Ojha et al., CVPR 2023) and GenImage (Zhu et al., NeurIPS 2023):
accuracy at a fixed 0.5 threshold and average precision (AP) with the fake (AI-generated) class as the
positive one, reported per generator and averaged over generators. Inputs everywhere: ``prob`` (N,) float
probability of "fake" in [0, 1], ``labels`` (N,) int with 1 = fake and 0 = real, ``generators`` (N,) str,
the generator subset each image belongs to (its real images included).

AP is the step-wise sum ``sum_k (R_k - R_{k-1}) P_k`` over distinct scores (no interpolation), the same
definition as scikit-learn's ``average_precision_score`` (which is not a dependency here). A subset with
one class only has an undefined AP: ``nan``, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["ALL", "MEAN", "accuracy", "average_precision", "per_generator", "roc_auc", "summarise_table"]

#: Row names that ``per_generator`` adds next to the generators: every image pooled, and the mean over generators.
ALL = "all"
MEAN = "mean"
_FIELDS = ("acc", "ap", "real_acc", "fake_acc")


def _check(prob: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    prob = np.asarray(prob, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if prob.shape != labels.shape:
        raise ValueError(f"prob has {prob.size} entries, labels {labels.size}")
    if not np.all(np.isfinite(prob)):
        raise ValueError("prob has non-finite entries")
    if labels.size and not np.isin(labels, (0, 1)).all():
        raise ValueError(f"labels must be 0 (real) or 1 (fake), got values {np.unique(labels)[:5].tolist()}")
    return prob, labels.astype(np.int64)


def accuracy(prob: np.ndarray, labels: np.ndarray, threshold: float = 0.5) -> float:
    """Share of images classified right, an image being called fake when ``prob > threshold``.

    Returns:
        A float in [0, 1]; ``nan`` for empty input.
    """
    prob, labels = _check(prob, labels)
    if prob.size == 0:
        return math.nan
    return float(np.mean((prob > threshold).astype(np.int64) == labels))


def average_precision(prob: np.ndarray, labels: np.ndarray) -> float:
    """Average precision with fake (label 1) as positive; ties in ``prob`` form one threshold.

    Returns:
        A float in [0, 1]; ``nan`` when ``labels`` hold a single class (or nothing).
    """
    prob, labels = _check(prob, labels)
    n_pos = int(labels.sum())
    if n_pos == 0 or n_pos == labels.size:
        return math.nan
    order = np.argsort(-prob, kind="mergesort")
    p, y = prob[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(p)), p.size - 1]  # last index of each distinct score
    tp = np.cumsum(y)[last]
    fp = (last + 1) - tp
    precision = tp / (tp + fp)
    recall = tp / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def roc_auc(prob: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve with fake (label 1) as positive: the probability that a random fake scores above a
    random real image, ties counting one half (the Mann-Whitney U statistic over the pair count).

    Returns:
        A float in [0, 1]; ``nan`` when ``labels`` hold a single class (or nothing).
    """
    prob, labels = _check(prob, labels)
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(prob, kind="mergesort")
    ranks = np.empty(prob.size, np.float64)
    sorted_p = prob[order]
    start = np.r_[0, np.flatnonzero(np.diff(sorted_p)) + 1]
    end = np.r_[start[1:], prob.size]
    for a, b in zip(start, end, strict=True):  # tied scores share their mean rank (1-based)
        ranks[order[a:b]] = (a + b + 1) / 2.0
    u = ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def _row(prob: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float | int]:
    real, fake = labels == 0, labels == 1
    return {
        "acc": accuracy(prob, labels, threshold),
        "ap": average_precision(prob, labels),
        "real_acc": accuracy(prob[real], labels[real], threshold),
        "fake_acc": accuracy(prob[fake], labels[fake], threshold),
        "n": int(labels.size),
    }


def per_generator(
    prob: np.ndarray, labels: np.ndarray, generators: Sequence[str] | np.ndarray, threshold: float = 0.5
) -> dict[str, dict[str, float | int]]:
    """Metrics per generator subset, plus the pooled ``"all"`` row and the ``"mean"`` row.

    Each row is ``{"acc", "ap", "real_acc", "fake_acc", "n"}`` (floats in [0, 1], ``nan`` where undefined:
    AP of a one-class subset, ``real_acc`` of a subset without real images ...; ``n`` images). The ``"mean"``
    row averages each field over the generators where it is defined, and its ``n`` is the total count.
    Generators appear in sorted order, then ``"all"``, then ``"mean"``.
    """
    prob, labels = _check(prob, labels)
    gens = np.asarray(generators, dtype=str).reshape(-1)
    if gens.shape != labels.shape:
        raise ValueError(f"generators has {gens.size} entries, labels {labels.size}")
    names = sorted(set(gens.tolist()))
    clash = {ALL, MEAN} & set(names)
    if clash:
        raise ValueError(f"generator names {sorted(clash)} are reserved for the summary rows")
    out = {g: _row(prob[gens == g], labels[gens == g], threshold) for g in names}
    out[MEAN] = {f: _nanmean([float(out[g][f]) for g in names]) for f in _FIELDS}
    out[MEAN]["n"] = int(labels.size)
    out = {**{g: out[g] for g in names}, ALL: _row(prob, labels, threshold), MEAN: out[MEAN]}
    return out


def _pct(v: float | int | None) -> str:
    return "–" if v is None or math.isnan(float(v)) else f"{100 * float(v):.1f}"


def summarise_table(
    rows: Mapping[str, Mapping[str, Mapping[str, float | int]]],
    generators: Sequence[str],
    holdout: str | Sequence[str] | None = None,
) -> str:
    """A markdown table: one row per arm, accuracy and AP (in %) per generator, then the mean and all rows.

    Args:
        rows: arm name -> a ``per_generator`` result; a generator it lacks shows as "–".
        generators: The generator columns, in order.
        holdout: Generator(s) held out of training, marked with "†" and a footnote.

    Returns:
        The table text (GitHub markdown), ending with a newline.
    """
    held = {holdout} if isinstance(holdout, str) else set(holdout or ())
    cols = [*generators, MEAN, ALL]
    header = ["arm"]
    for c in cols:
        mark = "†" if c in held else ""
        header += [f"{c}{mark} acc", f"{c}{mark} AP"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm, table in rows.items():
        cells = [arm]
        for c in cols:
            r = table.get(c, {})
            cells += [_pct(r.get("acc")), _pct(r.get("ap"))]
        lines.append("| " + " | ".join(cells) + " |")
    if held:
        lines.append("")
        lines.append(f"† held out of training: {', '.join(sorted(held))}. Numbers in %; mean = over generators.")
    return "\n".join(lines) + "\n"
