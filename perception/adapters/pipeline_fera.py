"""FeRA's sampling loops: the inference side of the pixel-space bases (``backbones``), of a user's diffusers base in
its latent space (``latent``) and of an adapted model (``modeling_fera.AdaptedDenoiser``).

- ``sample_images``: the Euler probability-flow ODE of a pixel-space flow denoiser (``FlowDenoiser`` or a model
  wrapping one) from seeded noise, to uint8 images.
- ``latent_samples``: DDIM (eta 0; Euler for flow) on a latent base's own objective (``latent.Objective``).
- ``sample_pixels``: an adapted model's (or its unadapted base's) samples in pixels, the latent ones decoded
  through the base's VAE: what the harness scores and ``embodied infer fera-samples`` writes.

This module imports ``backbones``; ``backbones`` and ``latent`` never import it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from core.diffusion import euler_step, timestep_grid
from perception.adapters.backbones import _model_device

if TYPE_CHECKING:
    from perception.adapters.latent import Objective
    from perception.adapters.modeling_fera import AdaptedDenoiser

__all__ = ["latent_samples", "sample_images", "sample_pixels"]


@torch.no_grad()
def sample_images(
    model: nn.Module,
    n: int,
    steps: int = 20,
    seed: int = 0,
    batch_size: int = 64,
    shift: float = 1.0,
    shape: tuple[int, int, int] | None = None,
) -> Tensor:
    """Generate ``n`` images with the Euler probability-flow ODE from ``t = 1`` (noise) to ``t = 0``.

    Args:
        model: ``model(x_t, t) -> v``.
        n: Number of images.
        steps: Euler steps on ``timestep_grid(steps, shift)``.
        seed: Seed of the starting noise (a CPU ``torch.Generator``; same seed, same images).
        batch_size: Images per forward pass.
        shift: Timestep shift of the grid (``> 1`` spends more steps at high noise).
        shape: ``(C, H, W)``; default ``(config.channels, config.image_size, config.image_size)`` of the model
            (of its ``denoiser`` when it wraps one).

    Returns:
        ``(n, C, H, W)`` uint8 on the CPU.
    """
    if shape is None:
        cfg = getattr(model, "denoiser", model).config  # a FlowDenoiser, or a model wrapping one
        shape = (cfg.channels, cfg.image_size, cfg.image_size)
    was_training = model.training
    model.eval()
    device = _model_device(model)
    noise = torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    grid = timestep_grid(steps, shift, device=device)
    chunks = []
    try:
        for i in range(0, n, batch_size):
            x = noise[i:i + batch_size].to(device)
            for k in range(steps):
                v = model(x, grid[k].expand(x.shape[0])).float()
                x = euler_step(x, v, grid[k], grid[k + 1])
            chunks.append(((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu())
    finally:
        model.train(was_training)
    return torch.cat(chunks) if chunks else torch.zeros((0, *shape), dtype=torch.uint8)


def _device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (a latent base always has parameters)."""
    return next(model.parameters()).device


@torch.no_grad()
def latent_samples(model: nn.Module, objective: Objective, n: int, shape: tuple[int, ...], steps: int = 20,
                   seed: int = 0, batch_size: int = 8) -> Tensor:
    """``n`` latents drawn with DDIM (eta 0; Euler for flow) from seeded noise on ``objective.grid(steps)``."""
    was = model.training
    model.eval()
    device = _device(model)
    noise = torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed))
    grid = objective.grid(steps, device=device)
    chunks = []
    try:
        for i in range(0, n, batch_size):
            x = noise[i:i + batch_size].to(device)
            for k in range(steps):
                t = grid[k].expand(x.shape[0])
                x0, eps = objective.split(model(x, t).float(), x, t)
                if k == steps - 1:
                    x = x0
                else:
                    x = objective.noisy(x0, eps, grid[k + 1].expand(x.shape[0]))
            chunks.append(x.cpu())
    finally:
        model.train(was)
    return torch.cat(chunks) if chunks else torch.zeros((0, *shape))


def sample_pixels(model: AdaptedDenoiser, n: int, steps: int, seed: int = 0, base: bool = False) -> torch.Tensor:
    """``n`` uint8 samples of the adapted model (or of its base): images ``(n, 3, H, W)``, or clips
    ``(n, 3, F, H, W)`` of a Wan base; a latent base's are decoded through its VAE."""
    d = model.denoiser
    with model.base_pass() if base else contextlib.nullcontext():
        if not model.is_latent:
            return sample_images(d, n, steps=steps, seed=seed)
        s = model.config.latent
        z = latent_samples(d, d.objective, n, d.latent_shape(s.image_size, s.frames), steps=steps, seed=seed)
    return d.decode(z)
