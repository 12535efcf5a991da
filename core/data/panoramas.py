"""Equirectangular panoramas (RGB + depth + semantics) and the pixel <-> direction convention.

Convention (used by every spherical model here). An equirectangular image of width W and height H
covers longitude ``lon`` in [-pi, pi) left to right and latitude ``lat`` in [pi/2, -pi/2] top to bottom,
sampled at pixel centres::

    lon = ((u + 0.5) / W) * 2 pi - pi          u = column, 0 .. W-1
    lat = pi / 2 - ((v + 0.5) / H) * pi        v = row,    0 .. H-1

Unit directions are in the panorama's camera frame with OpenCV axes (x right, y down, z forward)::

    d = (cos(lat) sin(lon), -sin(lat), cos(lat) cos(lon))

so the image centre looks along +z, the right quarter along +x, and the top row towards -y (up).
Depth in every panorama dataset is the Euclidean distance along ``d`` (range, metres), not z-depth.

Folders:
    embodied-dense with ``meta.json`` ``"projection": "equirectangular"`` (see ``core.data.images``):
        ``<root>/<split>/{rgb,depth,semantic}/<id>.png`` (depth uint16 mm, or .exr / .npy metres).
    Stanford2D3D: ``<root>/area_<k>/pano/{rgb,depth,semantic}/<name>_{rgb,depth,semantic}.png``; depth is
        uint16 in units of 1/512 m with 65535 = invalid; semantic PNGs encode an instance index as
        ``R * 65536 + G * 256 + B`` into ``semantic_labels.json`` (``"<class>_<instance>_<room>"``); when that
        file is found (``<root>/semantic_labels.json`` or ``<root>/assets/semantic_labels.json``) the index
        is mapped to the 13 class ids of ``S2D3D_CLASSES`` (0 = ``<UNK>`` / missing), else the raw index is
        returned.

Sample keys: ``rgb`` (3, H, W) uint8, ``depth`` (1, H, W) float32 metres (0 = invalid), ``semantic`` (H, W)
int64, ``index`` () int64 with ``dataset.ids[index]`` the sample's string id.

Single files: ``read_equirect`` reads one panorama (8/16-bit PNG / JPEG, or HDR ``.exr`` / ``.hdr``) as
(H, 2H, 3) float32 linear RGB, and ``tonemap_to_srgb`` turns HDR radiance into a displayable uint8 sRGB
image (e.g. the CC0 HDRIs of Debian ``blender-data``, see ``core.data.samples.blender_hdri``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from core.data.images import DenseImageDataset, _FileSampleDataset, read_image
from core.errors import DataError

__all__ = [
    "S2D3D_CLASSES",
    "EquirectDataset",
    "Stanford2D3DDataset",
    "direction_to_equirect",
    "equirect_directions",
    "equirect_to_direction",
    "read_equirect",
    "tonemap_to_srgb",
]

S2D3D_CLASSES = (
    "<UNK>", "beam", "board", "bookcase", "ceiling", "chair", "clutter", "column", "door", "floor", "sofa",
    "table", "wall", "window",
)  # fmt: skip
S2D3D_DEPTH_SCALE = 512.0
S2D3D_DEPTH_INVALID = 65535


# ------------------------------------------------------------------------------------------- geometry
def _lib(x: Any):
    return torch if isinstance(x, torch.Tensor) else np


def equirect_to_direction(u: Any, v: Any, width: int, height: int) -> Any:
    """Pixel coordinates -> unit directions (module convention).

    Args:
        u: Column coordinates (any shape; pixel centres at integers), numpy array or torch tensor.
        v: Row coordinates, same shape as ``u``.
        width: Image width W in pixels.
        height: Image height H in pixels.

    Returns:
        (..., 3) float unit vectors (x right, y down, z forward), same library as the input.
    """
    xp = _lib(u)
    lon = (u + 0.5) / width * (2 * math.pi) - math.pi
    lat = math.pi / 2 - (v + 0.5) / height * math.pi
    cl = xp.cos(lat)
    parts = (cl * xp.sin(lon), -xp.sin(lat), cl * xp.cos(lon))
    return torch.stack(parts, dim=-1) if xp is torch else np.stack(parts, axis=-1)


def direction_to_equirect(d: Any, width: int, height: int) -> tuple[Any, Any]:
    """Directions (..., 3) (need not be unit length) -> continuous pixel coordinates (u, v).

    Inverse of ``equirect_to_direction``: ``u`` in [-0.5, W - 0.5), ``v`` in [-0.5, H - 0.5].
    """
    xp = _lib(d)
    x, y, z = d[..., 0], d[..., 1], d[..., 2]
    r = xp.sqrt(x * x + y * y + z * z)
    lon = xp.arctan2(x, z)
    lat = xp.arcsin(xp.clip(-y / xp.clip(r, 1e-12, None), -1.0, 1.0))
    u = (lon + math.pi) / (2 * math.pi) * width - 0.5
    v = (math.pi / 2 - lat) / math.pi * height - 0.5
    return u, v


def equirect_directions(
    height: int, width: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Unit direction of every pixel centre: (H, W, 3) tensor (module convention)."""
    v, u = torch.meshgrid(
        torch.arange(height, device=device, dtype=torch.float64),
        torch.arange(width, device=device, dtype=torch.float64),
        indexing="ij",
    )
    return equirect_to_direction(u, v, width, height).to(dtype)


# ------------------------------------------------------------------------------------------ single files
def _srgb_to_linear(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


def _linear_to_srgb(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(np.maximum(x, 0.0031308), 1 / 2.4) - 0.055)


def read_equirect(path: str | os.PathLike, clip_negative: bool = True) -> np.ndarray:
    """Read one equirectangular panorama as linear RGB: -> (H, W, 3) float32 with W = 2 H.

    Float files (``.exr`` through OpenCV's OpenEXR codec, ``.hdr``) are returned as stored (linear
    radiance, unbounded); 8/16-bit files are taken as sRGB-encoded, scaled to [0, 1] and linearised with
    the sRGB transfer function. Grey files are repeated to 3 channels, alpha is dropped.

    Args:
        path: Image file.
        clip_negative: Clip negative values to 0 (half-float EXRs carry tiny negative compression noise,
            about -3e-3 in Blender's HDRIs).

    Raises:
        DataError: The file is missing, undecodable, not 2:1, or holds NaN / inf.
    """
    img = read_image(path)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    img = img[..., :3]
    if img.shape[2] != 3:
        raise DataError(path, f"expected an RGB or grey panorama, got {img.shape[2]} channels")
    if img.dtype == np.uint8 or img.dtype == np.uint16:
        out = _srgb_to_linear(img.astype(np.float64) / np.iinfo(img.dtype).max).astype(np.float32)
    else:
        out = img.astype(np.float32, copy=False)
        if not np.isfinite(out).all():
            raise DataError(path, "panorama holds NaN or inf values")
    h, w = out.shape[:2]
    if w != 2 * h:
        raise DataError(path, f"panorama is {w}x{h}, expected width = 2 x height")
    return np.ascontiguousarray(np.clip(out, 0, None) if clip_negative else out)


def tonemap_to_srgb(rgb: np.ndarray, exposure: float | None = None, key: float = 0.18) -> np.ndarray:
    """Linear HDR RGB -> displayable uint8 sRGB, with Reinhard's global operator.

    Operator: scale the radiance by ``s`` (``2 ** exposure`` when given, else auto-exposure
    ``s = key / exp(mean(log(1e-6 + L)))`` with ``L`` the Rec. 709 luminance ``0.2126 R + 0.7152 G +
    0.0722 B``, Reinhard et al. 2002), compress each channel with ``x / (1 + x)``, encode with the sRGB
    transfer function and round to 8 bits. Monotonic per channel; a constant image maps to a constant.

    Args:
        rgb: (H, W, 3) float linear RGB (negative values count as 0).
        exposure: Fixed exposure in stops; auto-exposure when None.
        key: Target mid-grey of the auto-exposure (0.18 = "normal key").

    Returns:
        (H, W, 3) uint8 sRGB.
    """
    x = np.clip(np.asarray(rgb, dtype=np.float64), 0, None)
    if x.ndim != 3 or x.shape[2] != 3:
        raise ValueError(f"rgb must be (H, W, 3), got shape {x.shape}")
    if exposure is not None:
        scale = 2.0**exposure
    else:
        lum = x @ np.array([0.2126, 0.7152, 0.0722])
        scale = key / math.exp(float(np.log(1e-6 + lum).mean()))
    x = x * scale
    return np.round(_linear_to_srgb(x / (1 + x)) * 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------- datasets
class EquirectDataset(DenseImageDataset):
    """embodied-dense folder whose ``meta.json`` says ``"projection": "equirectangular"``.

    Same arguments and sample keys as ``DenseImageDataset``; checks the projection and that every
    panorama is 2:1 (W = 2 H).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split: str = "train",
        keys: Sequence[str] | None = ("rgb", "depth", "semantic"),
        on_error: Literal["raise", "skip"] = "raise",
        validate: bool = False,
    ):
        super().__init__(root, split, keys=keys, on_error=on_error, validate=validate)
        if self.meta.get("projection") != "equirectangular":
            raise DataError(
                self.root / "meta.json",
                f"projection is {self.meta.get('projection')!r}, expected 'equirectangular'",
            )

    def decode(self, files: dict[str, Path]) -> dict[str, torch.Tensor]:
        """One sample's tensors (the parent's decoding), refusing a panorama that is not 2:1."""
        out = super().decode(files)
        h, w = out["rgb"].shape[-2:] if "rgb" in out else next(iter(out.values())).shape[-2:]
        if w != 2 * h:
            raise DataError(next(iter(files.values())), f"panorama is {w}x{h}, expected width = 2 x height")
        return out


class Stanford2D3DDataset(_FileSampleDataset):
    """Stanford2D3D panoramas: ``<root>/area_*/pano/{rgb,depth,semantic}`` (conventions: module docstring).

    Args:
        root: Folder holding ``area_1`` ... (or one area folder).
        areas: Area folder names to use, e.g. ``["area_1", "area_5a"]``; all when None.
        keys: Subset of ``("rgb", "depth", "semantic")``.
        on_error: ``"raise"`` or ``"skip"`` panoramas with missing / undecodable files.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        areas: Sequence[str] | None = None,
        keys: Sequence[str] | None = ("rgb", "depth", "semantic"),
        on_error: Literal["raise", "skip"] = "raise",
    ):
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataError(self.root, "no such folder")
        area_dirs = [self.root] if (self.root / "pano").is_dir() else sorted(self.root.glob("area_*"))
        if areas is not None:
            area_dirs = [a for a in area_dirs if a.name in set(areas)]
        area_dirs = [a for a in area_dirs if (a / "pano" / "rgb").is_dir()]
        if not area_dirs:
            raise DataError(self.root, "no area_*/pano/rgb folders (not a Stanford2D3D layout)")
        keys = tuple(keys) if keys is not None else ("rgb", "depth", "semantic")
        self._class_of = self._load_labels()
        samples, bad = [], []
        for a in area_dirs:
            for p in sorted((a / "pano" / "rgb").glob("*_rgb.png")):
                stem = p.name[: -len("_rgb.png")]
                files: dict[str, Path] = {}
                for key in keys:
                    f = a / "pano" / key / f"{stem}_{key}.png"
                    if not f.is_file():
                        bad.append(DataError(f, "no such file"))
                        files = {}
                        break
                    files[key] = f
                if files:
                    samples.append((f"{a.name}/{stem}", files))
        super().__init__(samples, keys, on_error, bad)

    def _load_labels(self) -> np.ndarray | None:
        for p in (self.root / "semantic_labels.json", self.root / "assets" / "semantic_labels.json"):
            if p.is_file():
                try:
                    labels = json.loads(p.read_text())
                except ValueError as e:
                    raise DataError(p, f"not valid JSON ({e})") from None
                index = {c: i for i, c in enumerate(S2D3D_CLASSES)}
                return np.array([index.get(str(lab).split("_")[0], 0) for lab in labels], dtype=np.int64)
        return None

    def decode(self, files: dict[str, Path]) -> dict[str, torch.Tensor]:
        """One panorama's ``rgb`` (3, H, W) uint8, ``depth`` (1, H, W) float32 m, ``semantic`` (H, W) int64."""
        out: dict[str, torch.Tensor] = {}
        if "rgb" in files:
            rgb = read_image(files["rgb"])[..., :3]
            out["rgb"] = torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1)))
        if "depth" in files:
            raw = read_image(files["depth"])
            if raw.dtype != np.uint16:
                raise DataError(files["depth"], f"depth must be a 16-bit PNG, got {raw.dtype}")
            raw = raw[..., 0] if raw.ndim == 3 else raw
            d = np.where(raw == S2D3D_DEPTH_INVALID, 0.0, raw / S2D3D_DEPTH_SCALE).astype(np.float32)
            out["depth"] = torch.from_numpy(d)[None]
        if "semantic" in files:
            sem = read_image(files["semantic"]).astype(np.int64)
            if sem.ndim != 3:
                raise DataError(files["semantic"], "semantic PNG must be RGB-encoded")
            idx = sem[..., 0] * 65536 + sem[..., 1] * 256 + sem[..., 2]
            if self._class_of is not None:
                ok = idx < len(self._class_of)
                idx = np.where(ok, self._class_of[np.clip(idx, 0, len(self._class_of) - 1)], 0)
            out["semantic"] = torch.from_numpy(idx)
        return out
