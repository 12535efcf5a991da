"""FeRA's frequency-energy indicator and frequency-energy consistency loss (FECL).

Band decomposition (difference of Gaussians). For a latent ``x`` of spatial size ``H x W`` and ``B`` bands,
blur with ``sigma_k = kappa * 2**k`` (``kappa = min(H, W) / kappa_divisor`` unless given; the paper's divisor is
128, for SD-size latents), ``k = 0 .. B-2``::

    L_-1 = x,   L_k = G(sigma_k) * x
    band_finest = x - L_0,   band_k = L_(k-1) - L_k,   band_coarsest = L_(B-2)   (the low-pass remainder)

so the ``B`` bands telescope back to ``x`` exactly. Bands are returned ordered **low to high** frequency
(index 0 = the low-pass remainder, index -1 = ``x - L_0``). Per-band energies are mean squares per sample,
normalised to sum to 1.

The finest band. The reference code builds one band more than asked and keeps the coarse ones, so the
finest band ``x - L_0`` never reaches the router. We keep it by default (``finest_band="keep"``): on a noisy
latent the finest band is where most of the Gaussian noise energy lives, so its share is the indicator's most
direct reading of the noise level, which is the quantity the paper's mechanism says decides which
frequencies the network reconstructs; and with it the bands partition ``x``, so the indicator is a full
energy budget. ``finest_band="drop"`` reproduces the reference (``B + 1`` bands built, the finest dropped,
the remaining ``B`` renormalised).

Blurs are separable depthwise convolutions with reflect padding (radius ``ceil(3 sigma)``, capped below the
image size). On a 32 px latent the paper's divisor gives kappa = 0.25 px: a sub-pixel blur that leaves the
finest band nearly empty (white noise then shows up in the middle band). The experiment keeps the rule's form
and scales it to its small images (``kappa_divisor = 32``: kappa = 1 px at 32 px, 2 px at 64 px).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

__all__ = ["band_energies", "band_sigmas", "decompose", "fecl_loss", "gaussian_blur"]


@functools.lru_cache(maxsize=64)
def _kernel(sigma: float, radius: int, device, dtype) -> torch.Tensor:
    """The normalised 1-D Gaussian taps (built once per sigma, radius, device and dtype; callers only read it:
    a training step blurs with the same few sigmas every forward and backward)."""
    x = torch.arange(-radius, radius + 1, device=device, dtype=torch.float64)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return (k / k.sum()).to(dtype)


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur over the last two axes with reflect padding (sigma in pixels of ``x``).

    ``x`` is ``(N, C, H, W)`` or any ``(..., H, W)`` (a video latent in either layout: every ``H x W`` plane is
    blurred on its own, so the result does not depend on how the leading axes are ordered).
    """
    if sigma <= 0:
        return x
    h, w = x.shape[-2:]
    radius = max(1, min(math.ceil(3 * sigma), h - 1, w - 1))
    k = _kernel(sigma, radius, x.device, x.dtype)
    y = x.reshape(-1, 1, h, w)
    y = F.conv2d(F.pad(y, (radius, radius, 0, 0), mode="reflect"), k.view(1, 1, 1, -1))
    y = F.conv2d(F.pad(y, (0, 0, radius, radius), mode="reflect"), k.view(1, 1, -1, 1))
    return y.reshape(x.shape)


def band_sigmas(height: int, width: int, num_bands: int, kappa: float | None = None,
                kappa_divisor: float = 128.0) -> list[float]:
    """The ``num_bands - 1`` blur widths ``kappa * 2**k`` that split a latent into ``num_bands`` bands
    (``kappa = min(height, width) / kappa_divisor`` unless given)."""
    if num_bands < 2:
        raise ValueError(f"num_bands must be >= 2, got {num_bands}")
    kappa = min(height, width) / kappa_divisor if kappa is None else kappa
    if kappa <= 0:
        raise ValueError(f"kappa must be > 0, got {kappa}")
    return [kappa * 2**k for k in range(num_bands - 1)]


def decompose(x: torch.Tensor, num_bands: int, kappa: float | None = None,
              finest_band: str = "keep", kappa_divisor: float = 128.0) -> list[torch.Tensor]:
    """``x`` (N, C, H, W) as ``num_bands`` difference-of-Gaussian bands, ordered low -> high frequency.

    A video latent (5-D, ``(N, T, C, H, W)`` or ``(B, C, F, H, W)``) is decomposed plane by plane (the last two
    axes are the spatial ones); the bands keep ``x``'s shape. With ``finest_band="keep"`` the bands sum to ``x``;
    with ``"drop"`` one finer band is built and discarded (the reference code's choice).
    """
    if x.dim() not in (4, 5):
        raise ValueError(f"expected a latent of shape (N, C, H, W) or a 5-D video latent, got {tuple(x.shape)}")
    if finest_band not in ("keep", "drop"):
        raise ValueError(f"finest_band must be 'keep' or 'drop', got {finest_band!r}")
    built = num_bands + (finest_band == "drop")
    blurs = [x] + [gaussian_blur(x, s) for s in band_sigmas(x.shape[-2], x.shape[-1], built, kappa,
                                                                     kappa_divisor)]
    fine_to_coarse = [blurs[i] - blurs[i + 1] for i in range(len(blurs) - 1)] + [blurs[-1]]
    if finest_band == "drop":
        fine_to_coarse = fine_to_coarse[1:]
    return fine_to_coarse[::-1]


def band_energies(x: torch.Tensor, num_bands: int, kappa: float | None = None, finest_band: str = "keep",
                  eps: float = 1e-12, kappa_divisor: float = 128.0) -> torch.Tensor:
    """Normalised per-band energies ``(N, num_bands)`` (each row sums to 1; low -> high frequency)."""
    bands = decompose(x.float(), num_bands, kappa, finest_band, kappa_divisor)
    e = torch.stack([b.pow(2).flatten(1).mean(1) for b in bands], dim=1)
    return e / (e.sum(dim=1, keepdim=True) + eps)


def _norms(bands: list[torch.Tensor], eps: float) -> torch.Tensor:
    # sqrt(sum of squares + eps): finite gradient at 0 (the adapted model equals the base at init)
    return torch.stack([(b.pow(2).flatten(1).sum(1) + eps).sqrt() for b in bands], dim=1)


def fecl_loss(adapted: torch.Tensor, base: torch.Tensor, target: torch.Tensor, num_bands: int,
              kappa: float | None = None, finest_band: str = "keep", weight: float = 0.1,
              eps: float = 1e-12, kappa_divisor: float = 128.0) -> torch.Tensor:
    """Frequency-energy consistency loss, mean over the batch.

    ``delta = adapted - base`` (the update the adapter makes), ``r = adapted - target`` (the residual);
    ``L = weight * sum_k w_k (|delta_k| / |delta| - |r_k| / |r|)^2`` with ``w_k`` band ``k``'s share of the
    residual energy (no gradient through ``w``). Zero when ``delta`` is proportional to ``r``; unchanged when
    either is rescaled. ``base`` should come from a no-grad pass with the adapters disabled.
    """
    delta = (adapted - base.detach()).float()
    r = (adapted - target).float()
    # one decomposition of both (stacked on the batch axis: every plane is blurred on its own), so the blurs run
    # once per sigma instead of twice, forward and backward
    both = _norms(decompose(torch.cat([delta, r]), num_bands, kappa, finest_band, kappa_divisor), eps)
    d_k, r_k = both.split(delta.shape[0])
    d_all = (delta.pow(2).flatten(1).sum(1, keepdim=True) + eps).sqrt()
    r_all = (r.pow(2).flatten(1).sum(1, keepdim=True) + eps).sqrt()
    w = r_k.detach().pow(2)
    w = w / w.sum(dim=1, keepdim=True)
    return weight * (w * (d_k / d_all - r_k / r_all).pow(2)).sum(dim=1).mean()
