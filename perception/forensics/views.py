"""How an image of any size is shown to a detector trained on 64 px crops: K square views drawn like its training crops.

The detectors here are trained on ``perception.forensics.generators.pool_crops``: square crops of real photos,
video frames and panoramas whose side is uniform in ``[max(size, MIN_CROP_SCALE x short side), short side]``,
area-resized to ``size`` (so a real training image is downsampled by a factor between about 1 and 8; it is never
a 1:1 crop of a photo larger than ``4 x size``), and fakes made from such crops. ``views`` shows a user's image
the same way, deterministically: ``k`` square boxes whose sides are evenly spaced over that range (the first
view is the whole centred square, the largest side; with ``k = 1`` it is the only view: centre-crop and resize,
as ``core.data.imread.read_square``), placed by a Halton sequence (bases 2 and 3) over the image, each
area-resized to ``size``. An image whose short side is at most ``size`` has one view: its centred square, resized.

``aggregate`` turns the views' P(fake) into the image's: the sigmoid of the mean log-odds (a geometric pooling of
the views' evidence), with the spread of the views recorded beside it.

Measured with the shipped detector (``perception/forensics/RESULTS.md``, "Scoring photos larger than 64 px"):
1:1 native-resolution crops look like the ``upsample`` fakes to it (a camera image at its own pixel scale is
softer than a downsampled crop) and raise false alarms on real photos, so views are never 1:1 unless the image
is small enough that its training crops were too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.errors import ConfigError

__all__ = ["DEFAULT_VIEWS", "MIN_CROP_SCALE", "Box", "aggregate", "halton", "representative", "view_boxes", "views"]

#: Smallest crop side, as a fraction of the short side: the training crops' bound (``generators.pool_crops`` reads it
#: from here) and the smallest view.
MIN_CROP_SCALE = 0.25
#: Views per image of ``embodied infer forensics`` (``--views``) and of the domain check's calibration.
DEFAULT_VIEWS = 8


@dataclass(frozen=True)
class Box:
    """A square view ``(y, x, side)`` in the image's pixels."""

    y: int
    x: int
    side: int


def halton(i: int, base: int) -> float:
    """The ``i``-th element (``i >= 1``) of the van der Corput / Halton sequence in ``base``: a number in (0, 1)."""
    f, r = 1.0, 0.0
    while i > 0:
        f /= base
        r += f * (i % base)
        i //= base
    return r


def view_boxes(height: int, width: int, size: int, k: int) -> list[Box]:
    """The (distinct) square boxes ``views`` cuts from a ``height`` x ``width`` image; see the module docstring."""
    if k < 1 or size < 1 or height < 1 or width < 1:
        raise ConfigError(f"views: need k >= 1, size >= 1 and a non-empty image, got k={k}, size={size}, "
                          f"image {height}x{width}")
    short = min(height, width)
    if short <= size:  # as small as a training crop or smaller: its centred square, resized, is the one view
        return [Box((height - short) // 2, (width - short) // 2, short)]
    hi = short
    lo = min(hi, max(size, round(MIN_CROP_SCALE * short)))
    boxes: list[Box] = []
    for j in range(k):
        side = hi if k == 1 else int(round(hi - (hi - lo) * j / (k - 1)))
        if j == 0:  # the whole centred square, placed as core.data.imread.read_square places it
            box = Box((height - side) // 2, (width - side) // 2, side)
        else:
            box = Box(int(round(halton(j, 2) * (height - side))), int(round(halton(j, 3) * (width - side))), side)
        if box not in boxes:
            boxes.append(box)
    return boxes


def views(image: np.ndarray, size: int, k: int) -> tuple[np.ndarray, list[Box]]:
    """``k`` (or fewer, when boxes coincide) views of an (H, W, 3) uint8 image, each area-resized to ``size``.

    Returns:
        ((n, size, size, 3) uint8, the n boxes), n <= k; n = 1 when the short side is at most ``size``.
    """
    import cv2

    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ConfigError(f"views: expected an (H, W, 3) uint8 image, got {image.shape} {image.dtype}")
    boxes = view_boxes(image.shape[0], image.shape[1], size, k)
    out = np.empty((len(boxes), size, size, 3), np.uint8)
    for i, b in enumerate(boxes):
        patch = np.ascontiguousarray(image[b.y:b.y + b.side, b.x:b.x + b.side])
        out[i] = patch if b.side == size else cv2.resize(patch, (size, size), interpolation=cv2.INTER_AREA)
    return out, boxes


def aggregate(probs: Sequence[float] | np.ndarray) -> dict[str, float]:
    """The image's P(fake) from its views' P(fake): sigmoid of the mean log-odds, and the views' spread.

    Returns:
        ``{"probability", "min", "max", "sd"}`` (sd of the views' probabilities; 0 for one view).
    """
    p = np.clip(np.asarray(probs, np.float64), 1e-7, 1 - 1e-7)
    if p.ndim != 1 or not len(p):
        raise ConfigError(f"aggregate: expected a non-empty 1-D array of probabilities, got shape {p.shape}")
    z = float(np.mean(np.log(p) - np.log1p(-p)))
    return {"probability": 1.0 / (1.0 + np.exp(-z)), "min": float(p.min()), "max": float(p.max()),
            "sd": float(p.std())}


def representative(probs: Sequence[float] | np.ndarray) -> int:
    """Index of the view whose log-odds are nearest the views' mean (the one shown to the explain prompt)."""
    p = np.clip(np.asarray(probs, np.float64), 1e-7, 1 - 1e-7)
    z = np.log(p) - np.log1p(-p)
    return int(np.argmin(np.abs(z - z.mean())))
