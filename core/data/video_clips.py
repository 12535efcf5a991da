"""The simulator's motion clips as a data config: the fields every method that reads them shares (light: no torch).

``sim.render.videos`` renders the clips on first use: ``render_n`` training clips of ``render_frames`` frames from
``render_seed`` under ``root``, ``test_n`` held-out clips of ``test_frames`` frames from ``test_seed`` (other
scenes) under ``test_root``, ``size`` px. Flex-Forcing (``perception.video.configuration_flexforcing``) and
TAGRPO (``perception.i2v_rl.configuration_tagrpo``) subclass ``VideoClipsConfig`` with their own fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError


def frame_hw(value: Any, key: str) -> tuple[int, int]:
    """A frame size given as an int (square) or ``[H, W]`` -> (H, W); a one-line ``ConfigError`` naming ``key``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    try:
        h, w = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be an int or [H, W], got {value!r}") from None
    return h, w


@dataclass
class VideoClipsConfig:
    """Where the simulator clips are and how they are rendered when missing.

    ``size``: the frames' side (an int), or ``[H, W]`` where a subclass allows it (the simulator renders squares
    of the longer side; the loader resizes them to (H, W)).
    """

    root: str = "outputs/datasets/videos_flex"
    size: Any = 32
    render_n: int = 240
    render_frames: int = 24
    render_seed: int = 0
    test_root: str = "outputs/datasets/videos_flex_test73"
    test_n: int = 24
    test_frames: int = 73
    test_seed: int = 5000

    def __post_init__(self) -> None:
        if min(self.frame_hw) < 8 or any(v % 2 for v in self.frame_hw):
            raise ConfigError(f"data.size must be even and >= 8, got {self.size}")
        if self.render_n < 2 or self.test_n < 1:
            raise ConfigError("data.render_n must be >= 2 and data.test_n >= 1")

    @property
    def frame_hw(self) -> tuple[int, int]:
        """(H, W) of the clips' frames."""
        return frame_hw(self.size, "data.size")
