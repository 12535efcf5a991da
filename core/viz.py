"""Pictures of dense predictions: normal maps and scalar maps as uint8 RGB (used by CLIs, demos and reports)."""

from __future__ import annotations

import numpy as np


def normals_to_rgb(normals: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """(H, W, 3) unit normals in [-1, 1] -> (H, W, 3) uint8 colours ((n + 1) / 2), invalid pixels black."""
    img = ((np.clip(normals, -1, 1) + 1.0) * 127.5).astype(np.uint8)
    if valid is not None:
        img[~valid] = 0
    return img


def colorize(values: np.ndarray, valid: np.ndarray | None = None, cmap: str = "viridis") -> np.ndarray:
    """Scalar map -> (H, W, 3) uint8 through a matplotlib colour map (depth, ids)."""
    import matplotlib

    v = values.astype(np.float64)
    mask = np.isfinite(v) if valid is None else valid & np.isfinite(v)
    lo, hi = (v[mask].min(), v[mask].max()) if mask.any() else (0.0, 1.0)
    norm = (v - lo) / (hi - lo + 1e-12)
    rgb = (matplotlib.colormaps[cmap](np.clip(norm, 0, 1))[..., :3] * 255).astype(np.uint8)
    rgb[~mask] = 0
    return rgb


def image_grid(images: np.ndarray, cols: int) -> np.ndarray:
    """(N, H, W, C) images -> one (rows * H, cols * W, C) grid, row by row; empty cells black."""
    images = np.asarray(images)
    n, h, w, c = images.shape
    rows = -(-n // cols)
    grid = np.zeros((rows * h, cols * w, c), images.dtype)
    for i, img in enumerate(images):
        r, k = divmod(i, cols)
        grid[r * h:(r + 1) * h, k * w:(k + 1) * w] = img
    return grid

