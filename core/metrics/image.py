"""Pixel metrics for images and videos: PSNR, SSIM and temporal flicker.

Shapes: every metric takes images ``(..., C, H, W)`` and reduces the last three dimensions, so
``(B, C, H, W)`` gives per-sample ``(B,)`` and a video ``(B, T, C, H, W)`` gives per-frame ``(B, T)``
(take ``.mean(-1)`` for one number per clip; for PSNR of a clip prefer ``psnr_from_mse`` of the clip's
mean squared error, as a mean of per-frame PSNRs is dominated by the near-perfect frames).

Values are floats in ``[0, data_range]``; integer tensors (e.g. uint8) are cast to float32 first, so pass
``data_range=255`` for uint8. The computation runs in the input's floating dtype.

Compatibility with LAC-WM (``worldmodels.lacwm.experiments``), whose frames are in [-1, 1]:
    ``lacwm.psnr(p, t)     == psnr(p, t, data_range=2.0, min_mse=1e-10)``  (PSNR only depends on p - t)
    ``lacwm.ssim(p, t)     == ssim((p + 1) / 2, (t + 1) / 2)``              (the defaults are LAC-WM's)
The SSIM default is LAC-WM's definition: uniform 7 x 7 windows, valid positions only (no padding),
population (biased) variances, ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``, mean over channels and positions.
This equals ``skimage.metrics.structural_similarity(..., win_size=7, use_sample_covariance=False)``;
``kernel="gaussian"`` (11 x 11, sigma 1.5) is Wang et al. 2004's and equals scikit-image's
``gaussian_weights=True, use_sample_covariance=False``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

__all__ = ["psnr", "psnr_from_mse", "ssim", "temporal_flicker"]


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_floating_point() else x.float()


def _check_pair(pred: torch.Tensor, target: torch.Tensor, name: str) -> None:
    if pred.shape != target.shape:
        raise ValueError(
            f"{name}: pred and target differ in shape, {tuple(pred.shape)} vs {tuple(target.shape)}"
        )
    if pred.ndim < 3:
        raise ValueError(f"{name}: images must be (..., C, H, W), got shape {tuple(pred.shape)}")


def psnr_from_mse(mse: torch.Tensor, data_range: float = 1.0, min_mse: float = 0.0) -> torch.Tensor:
    """Peak signal-to-noise ratio of a mean squared error: ``10 log10(data_range^2 / mse)``.

    Args:
        mse: Mean squared error(s), any shape, in squared units of ``data_range``.
        data_range: Peak-to-peak range of the signal (1 for [0, 1], 2 for [-1, 1], 255 for uint8).
        min_mse: Floor on ``mse`` before the log. 0 (default) gives ``inf`` dB for a zero error;
            LAC-WM uses 1e-10 (so identical images give a large finite value, 10 log10(4e10) = 106 dB).

    Returns:
        PSNR in dB, same shape as ``mse``.
    """
    mse = _as_float(torch.as_tensor(mse))
    if min_mse > 0:
        mse = mse.clamp_min(min_mse)
    return 10 * torch.log10(data_range**2 / mse)


def psnr(
    pred: torch.Tensor, target: torch.Tensor, data_range: float = 1.0, min_mse: float = 0.0
) -> torch.Tensor:
    """PSNR in dB per image: (..., C, H, W) -> (...); ``inf`` for identical images (unless ``min_mse`` > 0).

    Args:
        pred: (..., C, H, W) float in [0, data_range] (or integer, cast to float32).
        target: Same shape as ``pred``.
        data_range: Peak-to-peak range of the pixel values.
        min_mse: Floor on the MSE (see ``psnr_from_mse``).
    """
    _check_pair(pred, target, "psnr")
    pred, target = _as_float(pred), _as_float(target)
    mse = ((pred - target) ** 2).flatten(-3).mean(-1)
    return psnr_from_mse(mse, data_range, min_mse)


def _gaussian_window(size: int, sigma: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return (g / g.sum()).to(dtype=dtype, device=device)


def ssim(
    pred: torch.Tensor,
    target: torch.Tensor,
    data_range: float = 1.0,
    window: int = 7,
    kernel: Literal["uniform", "gaussian"] = "uniform",
    sigma: float = 1.5,
    clamp: bool = True,
) -> torch.Tensor:
    """Mean structural similarity per image: (..., C, H, W) -> (...), 1 for identical images.

    Local statistics over ``window`` x ``window`` windows at every valid position (no padding; the
    image must be at least ``window`` pixels on each side), population variances,
    ``C1 = (0.01 data_range)^2``, ``C2 = (0.03 data_range)^2``; the SSIM map is averaged over channels
    and positions. Defaults reproduce LAC-WM's SSIM (see the module docstring).

    Args:
        pred: (..., C, H, W) float in [0, data_range] (or integer, cast to float32).
        target: Same shape as ``pred``.
        data_range: Peak-to-peak range ``L`` of the pixel values.
        window: Window side in pixels (7 uniform = LAC-WM / scikit-image default; 11 for gaussian).
        kernel: ``"uniform"`` box window, or ``"gaussian"`` with standard deviation ``sigma`` pixels.
        sigma: Gaussian standard deviation in pixels (``kernel="gaussian"`` only).
        clamp: Clip both inputs to [0, data_range] first (as LAC-WM does; a model's output may overshoot).

    Returns:
        SSIM in [-1, 1], shape ``pred.shape[:-3]``, dtype of the (float) input.
    """
    _check_pair(pred, target, "ssim")
    if kernel not in ("uniform", "gaussian"):
        raise ValueError(f"ssim: kernel must be 'uniform' or 'gaussian', got {kernel!r}")
    lead, (c, h, w) = pred.shape[:-3], pred.shape[-3:]
    if h < window or w < window:
        raise ValueError(f"ssim: images of {h}x{w} are smaller than the {window}x{window} window")
    x = _as_float(pred).reshape(-1, c, h, w)
    y = _as_float(target).reshape(-1, c, h, w)
    if clamp:
        x, y = x.clamp(0, data_range), y.clamp(0, data_range)
    if kernel == "uniform":

        def filt(z: torch.Tensor) -> torch.Tensor:
            return F.avg_pool2d(z, window, 1)

    else:
        g = _gaussian_window(window, sigma, x.dtype, x.device)
        gh, gw = g.view(1, 1, window, 1).repeat(c, 1, 1, 1), g.view(1, 1, 1, window).repeat(c, 1, 1, 1)

        def filt(z: torch.Tensor) -> torch.Tensor:
            return F.conv2d(F.conv2d(z, gh, groups=c), gw, groups=c)

    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_x, mu_y = filt(x), filt(y)
    sxx = filt(x * x) - mu_x**2
    syy = filt(y * y) - mu_y**2
    sxy = filt(x * y) - mu_x * mu_y
    s = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2))
    return s.flatten(1).mean(1).reshape(lead)


def temporal_flicker(video: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Mean absolute change between consecutive frames, per clip: (B, T, C, H, W) -> (B,).

    ``flicker = mean over t = 0..T-2 and over (C, H, W) of |x[t+1] - x[t]| / data_range``, so 0 for a static
    clip and 1 for a clip alternating between 0 and ``data_range`` at every pixel. It is not motion
    compensated (no flow warp): real motion counts as change too, so compare a generated clip with the
    flicker of its ground-truth clip (or of a static scene), not with 0.

    Args:
        video: (B, T, C, H, W) with T >= 2, float in [0, data_range] or integer (cast to float32;
            pass ``data_range=255`` for uint8).
        data_range: Peak-to-peak range; the result is a fraction of it.

    Returns:
        (B,) float flicker in [0, 1] for values inside the range.
    """
    if video.ndim != 5 or video.shape[1] < 2:
        raise ValueError(
            f"temporal_flicker: video must be (B, T, C, H, W) with T >= 2, got {tuple(video.shape)}"
        )
    v = _as_float(video)
    return (v[:, 1:] - v[:, :-1]).abs().flatten(1).mean(1) / data_range
