"""Pixel metrics for images and videos: PSNR, SSIM (torchmetrics underneath) and temporal flicker.

Shapes: every metric takes images ``(..., C, H, W)`` and reduces the last three dimensions, so
``(B, C, H, W)`` gives per-sample ``(B,)`` and a video ``(B, T, C, H, W)`` gives per-frame ``(B, T)``
(take ``.mean(-1)`` for one number per clip; for PSNR of a clip prefer ``psnr_from_mse`` of the clip's
mean squared error, as a mean of per-frame PSNRs is dominated by the near-perfect frames).

Values are floats in ``[0, data_range]``; integer tensors (e.g. uint8) are cast to float32 first, so pass
``data_range=255`` for uint8. The computation runs in the input's floating dtype.

PSNR and SSIM are torchmetrics' (``peak_signal_noise_ratio`` per image,
``structural_similarity_index_measure`` with its SSIM map; torchmetrics 1.9.0, imported on first use).
``psnr_from_mse`` is the one-line formula torchmetrics applies (it has no public function from an MSE).
tests/core/test_metrics.py checks both against the former own code / scikit-image on fixed inputs (PSNR
rtol 1e-6, SSIM 1e-6 in float32, 1e-9 in float64).

Compatibility with LAC-WM (``worldmodels.lacwm.metrics``), whose frames are in [-1, 1]:
    ``lacwm.psnr(p, t)     == psnr(p, t, data_range=2.0, min_mse=1e-10)``  (PSNR only depends on p - t)
    ``lacwm.ssim(p, t)     == ssim((p + 1) / 2, (t + 1) / 2)``              (the defaults are LAC-WM's)
The SSIM default is LAC-WM's definition: uniform 7 x 7 windows, valid positions only (no padding),
population (biased) variances, ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``, mean over channels and positions.
This equals ``skimage.metrics.structural_similarity(..., win_size=7, use_sample_covariance=False)``;
``kernel="gaussian"`` (11 x 11, sigma 1.5) is Wang et al. 2004's and equals scikit-image's
``gaussian_weights=True, use_sample_covariance=False``. torchmetrics' own SSIM number differs in definition:
it reflect-pads the images and averages the map over ALL positions, borders included — on 64 px images with
7 x 7 uniform windows that moves SSIM by up to 9e-4 (1.6e-3 with the 11 x 11 gaussian), more on small frames.
``padding="valid"`` (default) averages torchmetrics' map over the valid positions only (LAC-WM / scikit-image:
equal to the former own code to 2.4e-7 in float32); ``padding="reflect"`` returns torchmetrics' number.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

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

    torchmetrics' ``peak_signal_noise_ratio`` reduced over the last three dims (``reduction="none"``). The MSE
    floor is applied as the equivalent cap ``10 log10(data_range^2 / min_mse)`` on the result.

    Args:
        pred: (..., C, H, W) float in [0, data_range] (or integer, cast to float32).
        target: Same shape as ``pred``.
        data_range: Peak-to-peak range of the pixel values.
        min_mse: Floor on the MSE (see ``psnr_from_mse``).
    """
    from torchmetrics.functional.image import peak_signal_noise_ratio

    _check_pair(pred, target, "psnr")
    out = peak_signal_noise_ratio(_as_float(pred), _as_float(target), data_range=float(data_range),
                                  reduction="none", dim=(-3, -2, -1))
    if min_mse > 0:
        out = out.clamp_max(10 * math.log10(data_range**2 / min_mse))
    return out


def ssim(
    pred: torch.Tensor,
    target: torch.Tensor,
    data_range: float = 1.0,
    window: int | None = None,
    kernel: Literal["uniform", "gaussian"] = "uniform",
    sigma: float = 1.5,
    clamp: bool = True,
    padding: Literal["valid", "reflect"] = "valid",
) -> torch.Tensor:
    """Mean structural similarity per image: (..., C, H, W) -> (...), 1 for identical images.

    torchmetrics' ``structural_similarity_index_measure`` (its full SSIM map: local statistics over
    ``window`` x ``window`` windows, population variances, ``C1 = (0.01 data_range)^2``,
    ``C2 = (0.03 data_range)^2``), averaged over channels and the positions ``padding`` names. Defaults
    reproduce LAC-WM's SSIM (see the module docstring).

    Args:
        pred: (..., C, H, W) float in [0, data_range] (or integer, cast to float32).
        target: Same shape as ``pred``.
        data_range: Peak-to-peak range ``L`` of the pixel values.
        window: Odd window side in pixels; default 7 (uniform, LAC-WM / scikit-image default). torchmetrics
            sizes the gaussian window from ``sigma`` (``2 int(3.5 sigma + 0.5) + 1``: 11 for 1.5), so for
            ``kernel="gaussian"`` it must be that or None.
        kernel: ``"uniform"`` box window, or ``"gaussian"`` with standard deviation ``sigma`` pixels.
        sigma: Gaussian standard deviation in pixels (``kernel="gaussian"`` only).
        clamp: Clip both inputs to [0, data_range] first (as LAC-WM does; a model's output may overshoot).
        padding: ``"valid"``: average over the positions whose window lies inside the image (LAC-WM,
            scikit-image; the image must be at least ``window`` pixels on each side); ``"reflect"``:
            torchmetrics' own average over every position of the reflect-padded image.

    Returns:
        SSIM in [-1, 1], shape ``pred.shape[:-3]``, dtype of the (float) input.
    """
    from torchmetrics.functional.image import structural_similarity_index_measure

    _check_pair(pred, target, "ssim")
    if kernel not in ("uniform", "gaussian"):
        raise ValueError(f"ssim: kernel must be 'uniform' or 'gaussian', got {kernel!r}")
    if padding not in ("valid", "reflect"):
        raise ValueError(f"ssim: padding must be 'valid' or 'reflect', got {padding!r}")
    gaussian_size = 2 * int(3.5 * sigma + 0.5) + 1
    if window is None:
        window = gaussian_size if kernel == "gaussian" else 7
    if kernel == "gaussian" and window != gaussian_size:
        raise ValueError(f"ssim: torchmetrics' gaussian window for sigma={sigma} is {gaussian_size} px, got "
                         f"window={window}")
    if window % 2 == 0 or window < 1:
        raise ValueError(f"ssim: window must be an odd positive size, got {window}")
    lead, (c, h, w) = pred.shape[:-3], pred.shape[-3:]
    if h < window or w < window:
        raise ValueError(f"ssim: images of {h}x{w} are smaller than the {window}x{window} window")
    x = _as_float(pred).reshape(-1, c, h, w)
    y = _as_float(target).reshape(-1, c, h, w)
    if clamp:
        x, y = x.clamp(0, data_range), y.clamp(0, data_range)
    _, full = structural_similarity_index_measure(
        x, y, gaussian_kernel=kernel == "gaussian", sigma=sigma, kernel_size=window, reduction="none",
        data_range=float(data_range), return_full_image=True)
    if padding == "valid":
        r = window // 2
        full = full[..., r: h - r, r: w - r]
    return full.flatten(1).mean(1).reshape(lead)


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
