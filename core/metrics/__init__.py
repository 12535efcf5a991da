"""Shared evaluation metrics. Importing ``core.metrics`` is light; the names below load their module on use.

Modules:
    image      pixel metrics on (..., C, H, W) images / (B, T, C, H, W) videos: ``psnr``, ``psnr_from_mse``,
               ``ssim`` (LAC-WM's definition by default), ``temporal_flicker``
    features   frozen ImageNet EfficientNet-Lite0 (``load_feature_network``): ``fd_effnet`` /
               ``frechet_distance`` (FID formula, NOT comparable to published FID), ``feature_distance``
               (1 - cosine of pooled features), ImageNet ``classify`` and ``imagenet_class_names``
    intervals  ``wilson_interval`` (95 % Wilson score interval of a success rate)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "psnr": "image",
    "psnr_from_mse": "image",
    "ssim": "image",
    "temporal_flicker": "image",
    "FeatureNetwork": "features",
    "load_feature_network": "features",
    "fd_effnet": "features",
    "frechet_distance": "features",
    "feature_distance": "features",
    "imagenet_class_names": "features",
    "wilson_interval": "intervals",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'core.metrics' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"core.metrics.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
