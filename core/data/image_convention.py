"""Image conventions: how a camera frame is laid out relative to the simulator's raw render.

robosuite / MuJoCo read an offscreen frame in OpenGL row order (row 0 is the bottom of the picture). Each
convention is named by what it does to that raw frame ``raw`` (any array (..., H, W, C)):

    ``"raw"``      ``raw``                    as rendered; what LIBERO's demo files store
                                              (``macros_image_convention = "opengl"``)
    ``"flipud"``   ``raw[..., ::-1, :, :]``   rows reversed: the picture the right way up. The LIBERO convention of
                                              this workspace before 2026-12 (``LiberoEnv`` images, LIBERO files as
                                              the loader returned them, LeRobot exports of them)
    ``"upright"``  the layout of ``"flipud"``  the name for non-LIBERO robosuite / robomimic frames
    ``"rot180"``   ``raw[..., ::-1, ::-1, :]`` rows and columns reversed (the raw frame rotated 180 degrees, which is
                                              the upright picture mirrored left-right): openpi's LIBERO example
                                              (``obs["agentview_image"][::-1, ::-1]``) and LeRobot's LIBERO
                                              processor, so every checkpoint trained on their LIBERO data; the
                                              LIBERO convention here now (``sim.libero.env.IMAGE_CONVENTION``)

``convert(frames, src, dst)`` takes frames from one to another: ``rot180`` <-> ``flipud`` is a horizontal flip,
``raw`` <-> ``rot180`` reverses both axes. The module imports nothing above numpy and ``core.errors``.
"""

from __future__ import annotations

import numpy as np

from core.errors import ConfigError

__all__ = ["CONVENTIONS", "LIBERO_CONVENTION", "check", "convert", "flips", "same"]

CONVENTIONS: dict[str, tuple[bool, bool]] = {
    "raw": (False, False),
    "flipud": (True, False),
    "upright": (True, False),
    "rot180": (True, True),
}
"""Name -> (rows reversed, columns reversed) relative to the raw OpenGL-order render."""
LIBERO_CONVENTION = "rot180"
"""openpi's and LeRobot's LIBERO convention, the one LIBERO frames are given in everywhere in the workspace."""


def check(name: object) -> str:
    """``name`` if it is a known convention.

    Raises:
        ConfigError: Any other value (one line, listing the known names).
    """
    if not isinstance(name, str) or name not in CONVENTIONS:
        raise ConfigError(f"unknown image convention {name!r}; known: {', '.join(CONVENTIONS)}")
    return name


def flips(src: str, dst: str) -> tuple[bool, bool]:
    """(reverse rows, reverse columns) that take frames in convention ``src`` to ``dst``."""
    a, b = CONVENTIONS[check(src)], CONVENTIONS[check(dst)]
    return a[0] != b[0], a[1] != b[1]


def same(a: str, b: str) -> bool:
    """Whether two conventions lay frames out identically (``"flipud"`` and ``"upright"`` do)."""
    return flips(a, b) == (False, False)


def convert(frames: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Frames (..., H, W, C) in convention ``src`` laid out in ``dst``.

    Returns ``frames`` itself when the two lay frames out alike, else a new C-contiguous array.

    Raises:
        ConfigError: An unknown convention name.
        ValueError: ``frames`` has fewer than 3 dims.
    """
    rows, cols = flips(src, dst)
    if not (rows or cols):
        return frames
    frames = np.asarray(frames)
    if frames.ndim < 3:
        raise ValueError(f"image frames must be (..., H, W, C), got shape {frames.shape}")
    return np.ascontiguousarray(frames[..., :: -1 if rows else 1, :: -1 if cols else 1, :])
