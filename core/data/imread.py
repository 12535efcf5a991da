"""``read_image``: any image file a user has -> (H, W, 3) uint8 RGB, as an image viewer shows it.

Accepted: every format Pillow reads (PNG, JPEG, BMP, TIFF, WebP, GIF, ...) and, as a fallback, those only
OpenCV reads; 1-, 8- and 16-bit samples; grey, grey + alpha, RGB, RGBA, palette (with or without a
transparent entry), CMYK and YCbCr JPEGs; any size. Conversions:

* 16-bit samples (grey or colour PNG / TIFF) -> ``round(v / 257)``, so 65535 -> 255 and 32896 -> 128
  (Pillow alone would keep the high byte of 16-bit colour, ``v // 256``; those files are decoded by OpenCV).
  32-bit integer grey is clipped to the 16-bit range first; float samples are taken as [0, 1].
* Alpha is composited on white (a transparent background reads as white, as viewers show it); images
  read through the OpenCV fallback (files Pillow cannot open, or larger than Pillow's decompression-bomb
  limit of about 179 megapixels) have their alpha dropped.
* The EXIF orientation tag is applied (a phone photo stored sideways comes back upright).
* CMYK is converted with Pillow's plain formula (no ICC colour management).

Anything that is not a decodable image (a text file named ``.png``, a truncated or empty file) raises a
one-line ``DataError`` naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from core.errors import DataError

__all__ = ["read_image", "read_square", "square"]

_EXIF_ORIENTATION = 0x0112
# EXIF orientation -> the transform that shows the stored pixels upright (as PIL.ImageOps.exif_transpose).
_ORIENT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1),
    8: lambda a: np.rot90(a, 1),
}


def read_image(path: str | os.PathLike) -> np.ndarray:
    """Read an image file as (H, W, 3) uint8 RGB (see the module docstring for the conversions).

    Args:
        path: The image file.

    Returns:
        (H, W, 3) uint8 RGB, C-contiguous, upright per the EXIF orientation.

    Raises:
        DataError: The file is missing, is not an image, or is truncated / corrupt.
    """
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no such file")
    try:
        with Image.open(path) as im:
            # 16-bit colour: Pillow decodes it to 8 bits by dropping the low byte; OpenCV keeps 16 bits.
            sixteen = im.mode in ("RGB", "RGBA") and any(";16" in str(t.args) for t in im.tile)
            im.load()  # decode now: truncated or corrupt data fails here
            orientation = int(im.getexif().get(_EXIF_ORIENTATION, 1) or 1)
            if sixteen:
                arr = _from_opencv(path, alpha=True)
            else:
                arr = _from_pillow(im)
    except DataError:
        raise
    except Image.DecompressionBombError:
        return _to_rgb8(_from_opencv(path, alpha=False), path)  # OpenCV applies EXIF orientation itself
    except Image.UnidentifiedImageError:
        try:
            arr = _from_opencv(path, alpha=False)
        except DataError:
            raise DataError(path, "not an image (no image format recognises its contents)") from None
        return _to_rgb8(arr, path)
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise DataError(path, f"cannot decode image ({reason})") from None
    out = _to_rgb8(arr, path)
    if orientation in _ORIENT:
        out = _ORIENT[orientation](out)
    return np.ascontiguousarray(out)


def _from_pillow(im) -> np.ndarray:
    """A loaded Pillow image -> (H, W), (H, W, 3) or (H, W, 4) array (RGB(A) order, any dtype)."""
    mode = im.mode
    if mode.startswith("I;16") or mode in ("I", "F", "L", "RGB", "RGBA"):
        return np.asarray(im)
    if mode == "P" and "transparency" in im.info or mode in ("PA", "LA", "La", "RGBa"):
        return np.asarray(im.convert("RGBA"))
    return np.asarray(im.convert("RGB"))  # 1, P, CMYK, YCbCr, LAB, HSV


def _from_opencv(path: Path, alpha: bool) -> np.ndarray:
    """Decode with OpenCV (``core.data.images.read_image``: RGB(A) order, bit depth kept).

    With ``alpha=False`` the EXIF orientation is applied by OpenCV and alpha dropped.
    """
    import cv2

    from core.data.images import read_image as read_as_stored

    return read_as_stored(path, cv2.IMREAD_UNCHANGED if alpha else cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR)


def _to_rgb8(arr: np.ndarray, path: Path) -> np.ndarray:
    """(H, W[, C]) array of any sample type -> (H, W, 3) uint8, alpha composited on white."""
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (2, 3, 4)):
        raise DataError(path, f"unsupported image layout {arr.shape}")
    if arr.dtype == np.uint8:
        scale = 1.0
    elif arr.dtype == np.uint16 or np.issubdtype(arr.dtype, np.integer):
        arr = np.clip(arr, 0, 65535)
        scale = 1.0 / 257.0
    else:  # float samples in [0, 1]
        arr = np.nan_to_num(np.clip(arr.astype(np.float32), 0.0, 1.0))
        scale = 255.0
    if arr.ndim == 2:
        arr = arr[..., None]
    colour, alpha = (arr[..., :-1], arr[..., -1:]) if arr.shape[2] in (2, 4) else (arr, None)
    if colour.shape[2] == 1:
        colour = np.repeat(colour, 3, axis=2)
    if alpha is None and scale == 1.0:
        return np.ascontiguousarray(colour)
    c = colour.astype(np.float32) * scale  # [0, 255]
    if alpha is not None:
        a = alpha.astype(np.float32) * scale / 255.0  # [0, 1]
        c = c * a + 255.0 * (1.0 - a)
    return np.ascontiguousarray(np.clip(np.rint(c), 0, 255).astype(np.uint8))


def square(img: np.ndarray, size: int) -> np.ndarray:
    """An (H, W, 3) image -> (size, size, 3): centre-cropped to a square, then resized.

    Area interpolation when shrinking (no aliasing); bilinear when enlarging (area interpolation enlarges like
    nearest-neighbour, which would add blocks a forensic detector reads as upsampling traces).
    """
    import cv2

    h, w = img.shape[:2]
    s = min(h, w)
    img = img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
    if s == size:
        return np.ascontiguousarray(img)
    mode = cv2.INTER_AREA if s > size else cv2.INTER_LINEAR
    return np.ascontiguousarray(cv2.resize(img, (size, size), interpolation=mode))


def read_square(path: str | os.PathLike, size: int) -> np.ndarray:
    """An image file -> (size, size, 3) uint8 RGB: centre-cropped to a square, then resized (:func:`square`).

    The conditioning frame of video models (Flex-Forcing's continuation, TAGRPO's image-to-video). Errors are
    ``read_image``'s one-line ``DataError`` naming the file.
    """
    return square(read_image(Path(path)), size)
