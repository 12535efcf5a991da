"""Images -> the Qwen-VL vision tower's input: normalised, flattened patches and the (t, h, w) patch grid.

``patchify`` is a batched torch version of ``transformers.Qwen2VLImageProcessor``'s layout (tested to match it
exactly), so that training batches are patchified on the device after augmentation, and so that a second view of
the same image (Deep-VRM's high-pass view) goes through the same function. ``image_processor`` builds the HF
processor itself with a fixed resolution; it is saved with every checkpoint, so that a folder written here is
what ``AutoProcessor`` users expect.

Layout (per image, T = temporal_patch_size copies of the still image)::

    (C, H, W) -> (H/(p m), W/(p m), m, m, C, T, p, p) -> rows of length C*T*p*p, h*w rows per image
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.errors import ConfigError

# OpenAI CLIP statistics, the Qwen-VL processors' defaults.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class PatchSpec:
    """How the vision tower cuts an image: ``image_size`` must be a multiple of ``patch_size * merge_size``."""

    image_size: int = 64
    patch_size: int = 8
    merge_size: int = 2
    temporal_patch_size: int = 2
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    def __post_init__(self) -> None:
        unit = self.patch_size * self.merge_size
        if self.image_size < unit or self.image_size % unit:
            raise ConfigError(f"image_size {self.image_size} must be a multiple of patch_size x merge_size = {unit}")

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def tokens_per_image(self) -> int:
        """LLM tokens per image after the merger (``grid**2 / merge**2``)."""
        return (self.grid // self.merge_size) ** 2

    @property
    def patch_dim(self) -> int:
        """Values per patch: channels x temporal patch x patch area."""
        return 3 * self.temporal_patch_size * self.patch_size ** 2


def normalize(images: torch.Tensor, spec: PatchSpec) -> torch.Tensor:
    """(B, 3, H, W) in [0, 1] -> per-channel standardised."""
    mean = torch.tensor(spec.mean, device=images.device, dtype=images.dtype).view(1, 3, 1, 1)
    std = torch.tensor(spec.std, device=images.device, dtype=images.dtype).view(1, 3, 1, 1)
    return (images - mean) / std


def patchify(images: torch.Tensor, spec: PatchSpec, normalized: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 3, S, S) in [0, 1] (or already normalised) -> (pixel_values (B*h*w, patch_dim), image_grid_thw (B, 3)).

    Raises:
        ConfigError: The images are not (B, 3, image_size, image_size).
    """
    if images.ndim != 4 or images.shape[1] != 3 or tuple(images.shape[-2:]) != (spec.image_size,) * 2:
        raise ConfigError(f"images must be (B, 3, {spec.image_size}, {spec.image_size}), got {tuple(images.shape)}")
    x = images if normalized else normalize(images, spec)
    b, c = x.shape[:2]
    p, m, g = spec.patch_size, spec.merge_size, spec.grid
    x = x.reshape(b, c, g // m, m, p, g // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)
    x = x.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, spec.temporal_patch_size, -1, -1)
    pixel_values = x.reshape(b * g * g, spec.patch_dim)
    grid = torch.tensor([[1, g, g]], dtype=torch.long, device=images.device).expand(b, 3).contiguous()
    return pixel_values, grid


def image_processor(spec: PatchSpec) -> Any:
    """The ``transformers`` Qwen2-VL image processor at ``spec``'s fixed resolution (saved with checkpoints)."""
    from transformers import Qwen2VLImageProcessor

    pixels = spec.image_size ** 2
    return Qwen2VLImageProcessor(patch_size=spec.patch_size, merge_size=spec.merge_size,
                                 temporal_patch_size=spec.temporal_patch_size, min_pixels=pixels, max_pixels=pixels,
                                 image_mean=list(spec.mean), image_std=list(spec.std))


def to_tensor(images: Any) -> torch.Tensor:
    """uint8 (N, H, W, 3) / (H, W, 3) numpy or tensor -> float (N, 3, H, W) in [0, 1]."""
    x = torch.as_tensor(images)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ConfigError(f"images must be (N, H, W, 3) uint8, got {tuple(x.shape)}")
    return x.permute(0, 3, 1, 2).float().div(255.0)
