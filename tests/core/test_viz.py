"""core.viz helpers on inputs with known answers."""

from __future__ import annotations

import numpy as np

from core.viz import image_grid


def test_image_grid_places_images_row_by_row_and_pads_black():
    imgs = np.stack([np.full((2, 3, 1), i + 1, np.uint8) for i in range(5)])
    g = image_grid(imgs, cols=2)
    assert g.shape == (6, 6, 1) and g.dtype == np.uint8
    assert g[0, 0, 0] == 1 and g[0, 3, 0] == 2 and g[2, 0, 0] == 3 and g[4, 0, 0] == 5
    assert (g[4:, 3:] == 0).all()  # the sixth cell is empty
