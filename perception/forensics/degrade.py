"""Image degradations of the forensics robustness protocol (AIGIBench's): JPEG re-encoding, resizing, blur.

A detector trained on clean images meets re-encoded, rescaled and blurred ones in the wild; AIGIBench reports
detectors losing over 40 points there. A degradation is applied to the decoded image file, before the
detector's own reader (centre square, area-resized to its input side), as a re-posted image would reach it.

Spec grammar (``--degrade SPEC`` of ``embodied eval deepvrm``, ``data.degrade``): ``none`` or
``KIND=VALUE[,KIND=VALUE...]``, applied left to right:

- ``jpeg=Q``: re-encoded as a JPEG of quality Q (an integer 1..100; Pillow's libjpeg, its default 4:2:0 chroma
  subsampling), then decoded.
- ``resize=F``: rescaled by the factor F (0.05..8, not 1): area interpolation when shrinking, bicubic when
  enlarging (OpenCV). The reader then brings the image back to the detector's side, so ``0.5`` loses half the
  resolution and ``2`` resamples twice.
- ``blur=S``: Gaussian blur of standard deviation S pixels (``scipy.ndimage.gaussian_filter`` per channel,
  kernel cut at 4 S, edges mirrored).

``LEVELS`` are the levels of the experiment's table (the issue's: JPEG 95 / 75 / 50, resize 0.5x / 2x, blur 1 / 2).
"""

from __future__ import annotations

import io

import numpy as np

from core.errors import ConfigError

KINDS = {"jpeg": "quality 1..100", "resize": "factor 0.05..8, not 1", "blur": "sigma in px, 0 < s <= 10"}
LEVELS = ("jpeg=95", "jpeg=75", "jpeg=50", "resize=0.5", "resize=2", "blur=1", "blur=2")

Step = tuple[str, float]


def parse(spec: str | None) -> tuple[Step, ...]:
    """``"jpeg=75,blur=1"`` -> ``(("jpeg", 75.0), ("blur", 1.0))``; ``none`` / empty -> ``()``.

    Raises:
        ConfigError: an unknown kind, a missing or out-of-range value (one line naming the valid ones).
    """
    text = "" if spec is None else str(spec).strip()
    if text.lower() in ("", "none"):
        return ()
    steps = []
    valid = "; ".join(f"{k}=V ({v})" for k, v in KINDS.items())
    for part in text.split(","):
        kind, sep, value = part.strip().partition("=")
        kind = kind.strip().lower()
        if kind not in KINDS or not sep:
            raise ConfigError(f"degradation {part.strip()!r}: expected KIND=VALUE with KIND one of {valid}, "
                              f"joined by commas, or none")
        try:
            v = float(value)
        except ValueError:
            raise ConfigError(f"degradation {part.strip()!r}: {value!r} is not a number ({kind}: "
                              f"{KINDS[kind]})") from None
        ok = {"jpeg": v == int(v) and 1 <= v <= 100, "resize": 0.05 <= v <= 8 and v != 1,
              "blur": 0 < v <= 10}[kind]
        if not ok:
            raise ConfigError(f"degradation {part.strip()!r}: out of range ({kind}: {KINDS[kind]})")
        steps.append((kind, v))
    return tuple(steps)


def canonical(spec: str | None) -> str:
    """The spec written one way (``"JPEG=75.0"`` -> ``"jpeg=75"``; no degradation -> ``"none"``)."""
    steps = parse(spec)
    return ",".join(f"{k}={v:g}" for k, v in steps) if steps else "none"


def tag(spec: str | None) -> str:
    """A file-name tag of the spec: ``"jpeg=75,blur=1"`` -> ``"jpeg75_blur1"``; none -> ``"none"``."""
    steps = parse(spec)
    return "_".join(f"{k}{v:g}" for k, v in steps) if steps else "none"


def apply(image: np.ndarray, spec: str | tuple[Step, ...] | None) -> np.ndarray:
    """Degrade an (H, W, 3) uint8 RGB image; returns a new uint8 array (its size changes under ``resize``)."""
    steps = spec if isinstance(spec, tuple) else parse(spec)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 image, got {image.dtype} {image.shape}")
    out = image
    for kind, v in steps:
        if kind == "jpeg":
            from PIL import Image

            buf = io.BytesIO()
            Image.fromarray(out).save(buf, format="JPEG", quality=int(v))
            buf.seek(0)
            with Image.open(buf) as im:
                out = np.asarray(im.convert("RGB"))
        elif kind == "resize":
            import cv2

            h, w = out.shape[:2]
            size = (max(1, round(w * v)), max(1, round(h * v)))
            out = cv2.resize(out, size, interpolation=cv2.INTER_AREA if v < 1 else cv2.INTER_CUBIC)
        else:  # blur
            from scipy.ndimage import gaussian_filter

            blurred = gaussian_filter(out.astype(np.float32), sigma=(v, v, 0), mode="mirror", truncate=4.0)
            out = np.clip(np.rint(blurred), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(out)
