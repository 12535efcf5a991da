"""Image datasets with dense labels: the project's "embodied-dense" folders and ClearGrasp.

embodied-dense layout (written by the scene renderers through ``write_meta`` / ``write_dense_sample``)::

    <root>/meta.json                        {"format": "embodied-dense/1", ...}, fields below
    <root>/<split>/rgb/<id>.png             (H, W, 3) uint8 RGB
    <root>/<split>/rgb_twin/<id>.png        optional material-changed twin (same geometry, labels)
    <root>/<split>/normals/<id>.png         16-bit PNG, value = (n + 1) / 2 * 65535 per component,
                                            all-zero pixels = invalid;  or normals/<id>.exr float32
    <root>/<split>/depth/<id>.png           uint16 millimetres (z-depth along the optical axis), 0 =
                                            invalid;  or depth/<id>.exr / depth/<id>.npy float32 metres
    <root>/<split>/mask/<id>.png            uint8, 0 / 255 (binary) or instance ids (0 = background)
    <root>/<split>/semantic/<id>.png        uint8 or uint16 class ids

``meta.json`` fields: ``format`` ("embodied-dense/1"), ``projection`` ("pinhole" | "equirectangular"),
``normals_frame`` ("opencv_camera": x right, y down, z forward — the only frame written),
``depth_units`` ("m" after decoding; PNGs hold millimetres), ``mask_kind`` ("binary" | "instance"),
optional ``intrinsics`` (``{"fx", "fy", "cx", "cy"}`` in pixels), ``classes`` (list of names, index =
semantic id) and any renderer-specific keys.

EXR files store normals as channels R, G, B = x, y, z. EXR is read and written through OpenCV, which
needs ``OPENCV_IO_ENABLE_OPENEXR=1`` before its EXR codec is first used; this module sets it (if unset)
before importing cv2. Checked working with opencv-python 4.11.0.86.

Sample of ``DenseImageDataset`` / ``ClearGraspDataset`` (keys present only when the files exist):
    ``rgb``          (3, H, W) uint8
    ``rgb_twin``     (3, H, W) uint8
    ``normals``      (3, H, W) float32 unit vectors, OpenCV camera frame (x right, y down, z forward);
                     zeros where invalid
    ``valid``        (H, W) bool, where ``normals`` is valid
    ``depth``        (1, H, W) float32 metres, 0 = invalid
    ``mask``         (H, W) int64; {0, 1} for binary masks, instance ids otherwise
    ``semantic``     (H, W) int64 class ids
    ``index``        () int64; ``dataset.ids[index]`` is the sample's string id
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENCV_IO_ENABLE_OPENEXR", "1")

import re  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Literal  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from core.errors import DataError  # noqa: E402
from core.io import atomic_path, read_json, save_npy, write_json  # noqa: E402

__all__ = [
    "DENSE_FORMAT",
    "ClearGraspDataset",
    "DenseImageDataset",
    "read_depth",
    "read_image",
    "read_normals",
    "write_dense_sample",
    "write_image",
    "write_meta",
]

DENSE_FORMAT = "embodied-dense/1"
DENSE_KEYS = ("rgb", "rgb_twin", "normals", "depth", "mask", "semantic")
_EXTS = {
    "rgb": (".png", ".jpg", ".jpeg"),
    "rgb_twin": (".png", ".jpg", ".jpeg"),
    "normals": (".png", ".exr", ".npy"),
    "depth": (".png", ".exr", ".npy"),
    "mask": (".png",),
    "semantic": (".png",),
}
OnError = Literal["raise", "skip"]


# ------------------------------------------------------------------------------------------ file codecs
def read_image(path: str | os.PathLike, flags: int = cv2.IMREAD_UNCHANGED) -> np.ndarray:
    """Read an image file as stored (RGB order for colour, any bit depth; EXR as float32).

    For images users hand to a command (any mode / depth -> (H, W, 3) uint8 as a viewer shows it), use
    ``core.data.imread.read_image``, which decodes through this one when Pillow cannot.

    Raises:
        DataError: The file is missing or cannot be decoded.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no such file")
    try:
        img = cv2.imread(str(path), flags)
    except cv2.error as e:
        raise DataError(path, f"cannot decode image ({str(e).strip().splitlines()[-1]})") from None
    if img is None:
        raise DataError(path, "cannot decode image (corrupt or unsupported format)")
    if img.ndim == 3 and img.shape[2] >= 3:
        img = img[..., 2::-1] if img.shape[2] == 3 else img[..., [2, 1, 0, 3]]
    return np.ascontiguousarray(img)


def write_image(path: str | os.PathLike, img: np.ndarray) -> None:
    """Atomically write an RGB(A) / single-channel array; the extension picks the codec (png, jpg, exr)."""
    path = Path(path)
    img = np.asarray(img)
    if img.ndim == 3 and img.shape[2] in (3, 4):
        img = img[..., [2, 1, 0]] if img.shape[2] == 3 else img[..., [2, 1, 0, 3]]
    with atomic_path(path) as tmp:
        try:
            ok = cv2.imwrite(str(tmp), np.ascontiguousarray(img))
        except cv2.error as e:
            raise DataError(path, f"cannot encode image ({str(e).strip().splitlines()[-1]})") from None
        if not ok:
            raise DataError(path, f"cannot encode {img.dtype} {img.shape} image")


def encode_normals_png(normals: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """(H, W, 3) float unit normals -> (H, W, 3) uint16, value = (n + 1) / 2 * 65535; invalid -> 0."""
    n = np.clip(np.asarray(normals, np.float64), -1.0, 1.0)
    out = np.round((n + 1.0) * 0.5 * 65535.0).astype(np.uint16)
    if valid is None:
        valid = np.linalg.norm(n, axis=-1) > 0.5
    out[~valid] = 0
    # A valid pixel that encodes to all zeros (n = (-1, -1, -1), impossible for a unit vector) stays valid.
    return out


def decode_normals(raw: np.ndarray, path: str | os.PathLike = "<array>") -> tuple[np.ndarray, np.ndarray]:
    """Decode a stored normal map to ((H, W, 3) float32 unit vectors, (H, W) bool valid).

    uint16 input uses the 16-bit PNG encoding (all-zero pixel = invalid); uint8 input the 8-bit analogue;
    float input holds the components directly (near-zero length = invalid).
    """
    if raw.ndim != 3 or raw.shape[2] < 3:
        raise DataError(path, f"normal map must be (H, W, 3), got {raw.shape}")
    raw = raw[..., :3]
    if raw.dtype == np.uint16 or raw.dtype == np.uint8:
        scale = 65535.0 if raw.dtype == np.uint16 else 255.0
        valid = raw.any(axis=-1)
        n = raw.astype(np.float32) / scale * 2.0 - 1.0
    else:
        n = np.nan_to_num(raw.astype(np.float32))
        valid = np.linalg.norm(n, axis=-1) > 1e-3
    norm = np.linalg.norm(n, axis=-1, keepdims=True)
    n = np.where(valid[..., None], n / np.maximum(norm, 1e-6), 0.0).astype(np.float32)
    return n, valid


def read_normals(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read a normal map file (16-bit PNG, EXR or .npy) -> ((H, W, 3) float32, (H, W) bool valid)."""
    path = Path(path)
    raw = _read_array(path) if path.suffix == ".npy" else read_image(path)
    return decode_normals(raw, path)


def read_depth(path: str | os.PathLike) -> np.ndarray:
    """Read a depth map -> (H, W) float32 metres, 0 = invalid (uint16 PNG in mm; EXR / .npy in metres)."""
    path = Path(path)
    raw = _read_array(path) if path.suffix == ".npy" else read_image(path)
    if raw.ndim == 3:
        raw = raw[..., 0]
    if raw.dtype == np.uint16:
        return raw.astype(np.float32) / 1000.0
    if not np.issubdtype(raw.dtype, np.floating):
        raise DataError(path, f"depth must be uint16 millimetres or float metres, got {raw.dtype}")
    d = raw.astype(np.float32)
    d[~np.isfinite(d) | (d < 0)] = 0.0
    return d


def _read_array(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(path, "no such file")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(path, f"cannot read .npy ({e})") from None


# ------------------------------------------------------------------------------------------ writers
def write_meta(root: str | os.PathLike, **meta: Any) -> dict[str, Any]:
    """Write ``<root>/meta.json`` for an embodied-dense folder and return what was written.

    Defaults: ``format`` "embodied-dense/1", ``projection`` "pinhole", ``normals_frame``
    "opencv_camera", ``depth_units`` "m", ``mask_kind`` "binary"; ``meta`` overrides / adds keys
    (``intrinsics``, ``classes``, renderer settings ...).
    """
    full = {
        "format": DENSE_FORMAT,
        "projection": "pinhole",
        "normals_frame": "opencv_camera",
        "depth_units": "m",
        "mask_kind": "binary",
        **meta,
    }
    write_json(Path(root) / "meta.json", full)
    return full


def write_dense_sample(
    root: str | os.PathLike,
    split: str,
    sample_id: str,
    rgb: np.ndarray,
    normals: np.ndarray | None = None,
    depth: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    semantic: np.ndarray | None = None,
    rgb_twin: np.ndarray | None = None,
    normals_format: Literal["png", "exr"] = "png",
    depth_format: Literal["png", "exr", "npy"] = "png",
) -> dict[str, Path]:
    """Write one sample of the embodied-dense layout (each file atomically); return key -> path written.

    Args:
        root: Dataset root (``write_meta`` writes its ``meta.json``).
        split: e.g. ``"train"`` / ``"val"``.
        sample_id: File stem, e.g. ``"000012"``.
        rgb: (H, W, 3) uint8 RGB.
        normals: (H, W, 3) float unit normals, OpenCV camera frame; zero vectors mark invalid pixels.
        depth: (H, W) float metres (z-depth), 0 / non-finite = invalid. The PNG encoding rounds to mm
            and saturates at 65.535 m.
        mask: (H, W) uint8 / bool; bool is stored as 0 / 255.
        semantic: (H, W) integer class ids (< 65536).
        rgb_twin: (H, W, 3) uint8 RGB of the material-changed twin.
        normals_format: 16-bit ``"png"`` or float32 ``"exr"``.
        depth_format: uint16 mm ``"png"``, float32 metres ``"exr"`` or ``"npy"``.
    """
    base = Path(root) / split
    written: dict[str, Path] = {}

    def put(key: str, ext: str, arr: np.ndarray) -> None:
        p = base / key / f"{sample_id}{ext}"
        if ext == ".npy":
            save_npy(p, arr)
        else:
            write_image(p, arr)
        written[key] = p

    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"rgb must be (H, W, 3) uint8, got {rgb.shape} {rgb.dtype}")
    put("rgb", ".png", rgb)
    if rgb_twin is not None:
        put("rgb_twin", ".png", np.asarray(rgb_twin, np.uint8))
    if normals is not None:
        n = np.asarray(normals, np.float32)
        if normals_format == "png":
            put("normals", ".png", encode_normals_png(n))
        else:
            put("normals", ".exr", n)
    if depth is not None:
        d = np.nan_to_num(np.asarray(depth, np.float32), nan=0.0, posinf=0.0, neginf=0.0)
        d[d < 0] = 0.0
        if depth_format == "png":
            put("depth", ".png", np.clip(np.round(d * 1000.0), 0, 65535).astype(np.uint16))
        else:
            put("depth", f".{depth_format}", d)
    if mask is not None:
        m = np.asarray(mask)
        put("mask", ".png", (m.astype(np.uint8) * 255) if m.dtype == bool else m.astype(np.uint8))
    if semantic is not None:
        s = np.asarray(semantic)
        if s.min(initial=0) < 0 or s.max(initial=0) > 65535:
            raise ValueError("semantic ids must lie in [0, 65535]")
        put("semantic", ".png", s.astype(np.uint8 if s.max(initial=0) < 256 else np.uint16))
    return written


# ------------------------------------------------------------------------------------------ datasets
def _to_chw(img: np.ndarray) -> torch.Tensor:
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    return torch.from_numpy(np.ascontiguousarray(img[..., :3].transpose(2, 0, 1)))


def _label_map(raw: np.ndarray) -> np.ndarray:
    return (raw[..., 0] if raw.ndim == 3 else raw).astype(np.int64)


class _FileSampleDataset(Dataset):
    """Shared machinery: a list of samples, each a dict key -> file path, decoded on ``__getitem__``."""

    normals_flip_x = False
    mask_kind = "binary"

    def __init__(
        self,
        samples: list[tuple[str, dict[str, Path]]],
        keys: Sequence[str] | None,
        on_error: OnError,
        bad: Sequence[DataError] = (),
        validate: bool = False,
    ):
        """Hold the samples a subclass found.

        Args:
            samples: (id, key -> file) found by the subclass.
            keys: The keys kept of each sample's files (None: all of them).
            on_error: ``"raise"`` or ``"skip"`` (bad samples are dropped and counted).
            bad: Problems found while listing them (raised, or counted in ``skipped`` / ``errors`` with
                ``on_error="skip"``).
            validate: Decode every sample once up front (always done in skip mode, so bad files are dropped
                before training).
        """
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.skipped = 0
        self.errors: list[DataError] = []
        self.keys = tuple(keys) if keys is not None else None
        self.ids: list[str] = [s[0] for s in samples]
        self._files: list[dict[str, Path]] = [
            {k: p for k, p in files.items() if self.keys is None or k in self.keys} for _, files in samples
        ]
        for e in bad:
            if on_error == "raise":
                raise e
            self.errors.append(e)
            self.skipped += 1
        if validate or on_error == "skip":
            self.validate()

    def __len__(self) -> int:
        return len(self._files)

    def decode(self, files: dict[str, Path]) -> dict[str, torch.Tensor]:
        """Decode one sample's files (see the module docstring for keys, shapes and dtypes)."""
        out: dict[str, torch.Tensor] = {}
        for key in ("rgb", "rgb_twin"):
            if key in files:
                out[key] = _to_chw(read_image(files[key], cv2.IMREAD_COLOR))
        if "normals" in files:
            n, valid = read_normals(files["normals"])
            if self.normals_flip_x:
                n[..., 0] *= -1.0
            out["normals"] = torch.from_numpy(np.ascontiguousarray(n.transpose(2, 0, 1)))
            out["valid"] = torch.from_numpy(valid)
        if "depth" in files:
            out["depth"] = torch.from_numpy(read_depth(files["depth"]))[None]
        if "mask" in files:
            m = _label_map(read_image(files["mask"]))
            out["mask"] = torch.from_numpy((m > 0).astype(np.int64) if self.mask_kind == "binary" else m)
        if "semantic" in files:
            out["semantic"] = torch.from_numpy(_label_map(read_image(files["semantic"])))
        shapes = {k: tuple(v.shape[-2:]) for k, v in out.items()}
        if len(set(shapes.values())) > 1:
            first = next(iter(files.values()))
            raise DataError(first, f"maps of one sample differ in size: {shapes}")
        return out

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        out = self.decode(self._files[index])
        out["index"] = torch.tensor(index, dtype=torch.int64)
        return out

    def validate(self) -> int:
        """Decode every sample once; with ``on_error="skip"`` drop the bad ones. Returns the number dropped."""
        good_ids, good_files = [], []
        for sid, files in zip(self.ids, self._files):
            try:
                self.decode(files)
            except DataError as e:
                if self.on_error == "raise":
                    raise
                self.errors.append(e)
                self.skipped += 1
                continue
            good_ids.append(sid)
            good_files.append(files)
        dropped = len(self.ids) - len(good_ids)
        self.ids, self._files = good_ids, good_files
        return dropped


def _find(folder: Path, stem: str, exts: Sequence[str]) -> Path | None:
    for ext in exts:
        p = folder / f"{stem}{ext}"
        if p.is_file():
            return p
    return None


class DenseImageDataset(_FileSampleDataset):
    """Map-style dataset over an embodied-dense folder (layout and sample keys: module docstring).

    Args:
        root: Folder with ``meta.json``.
        split: Sub-folder, e.g. ``"train"``.
        keys: Subset of ``("rgb", "rgb_twin", "normals", "depth", "mask", "semantic")`` to load; all
            present maps when None.
        on_error: ``"raise"`` on a sample with a missing or undecodable map, or ``"skip"`` it (counted in
            ``skipped``, errors kept in ``errors``).
        validate: Decode every sample at construction to find bad files up front (always done for
            ``on_error="skip"``; otherwise a bad file raises ``DataError`` when its sample is read).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split: str = "train",
        keys: Sequence[str] | None = None,
        on_error: OnError = "raise",
        validate: bool = False,
    ):
        self.root = Path(root)
        meta_path = self.root / "meta.json"
        if not meta_path.is_file():
            raise DataError(meta_path, "no such file (not an embodied-dense folder)")
        try:
            self.meta = read_json(meta_path)
        except ValueError as e:
            raise DataError(meta_path, str(e).split(": ", 1)[-1]) from None
        fmt = self.meta.get("format", "") if isinstance(self.meta, dict) else ""
        if not str(fmt).startswith("embodied-dense/"):
            raise DataError(meta_path, f"format is {fmt!r}, expected {DENSE_FORMAT!r}")
        self.mask_kind = self.meta.get("mask_kind", "binary")
        split_dir = self.root / split
        rgb_dir = split_dir / "rgb"
        if not rgb_dir.is_dir():
            raise DataError(split_dir, "no rgb/ folder (missing split or wrong layout)")
        unknown = set(keys or ()) - set(DENSE_KEYS)
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}; choose from {DENSE_KEYS}")
        samples = []
        bad: list[DataError] = []
        for p in sorted(rgb_dir.iterdir()):
            if p.suffix.lower() not in _EXTS["rgb"]:
                continue
            files = {"rgb": p}
            for key in DENSE_KEYS[1:]:
                if (split_dir / key).is_dir() and (keys is None or key in keys):
                    found = _find(split_dir / key, p.stem, _EXTS[key])
                    if found is not None:
                        files[key] = found
                    elif keys is not None:
                        bad.append(
                            DataError(split_dir / key / p.stem, f"no {key} file for sample {p.stem!r}")
                        )
                        files = {}
                        break
            if files:
                samples.append((p.stem, files))
        super().__init__(samples, keys, on_error, bad, validate)


class ClearGraspDataset(_FileSampleDataset):
    """ClearGrasp layout: ``<split folder>/<object>/{rgb-imgs, camera-normals, segmentation-masks}``.

    ClearGrasp ships as two archives, with one split folder per split::

        cleargrasp-dataset-train/<object>/...                     split "train"
        cleargrasp-dataset-test-val/synthetic-val/<object>/...    split "val"
        cleargrasp-dataset-test-val/synthetic-test/<object>/...   split "test"
        cleargrasp-dataset-test-val/real-{val,test}/...           real captures: no normals, not read here

    ``split`` picks the split folder(s) under ``root``, which may be the folder holding both archives, one
    archive, or the split folder itself; plain ``train/ val/ test/`` sub-folders work too, and any other
    ``split`` names a sub-folder literally. Every candidate that exists is used. ``split=None`` takes
    ``root`` as one split (a folder of objects, or one object folder).

    Files: ``rgb-imgs/<id>-rgb.jpg``, ``camera-normals/<id>-cameraNormals.exr`` (float RGB = xyz),
    ``segmentation-masks/<id>-segmentation-mask.png`` (0 / 255), and when present
    ``depth-imgs-rectified/<id>-depth-rectified.exr`` (float metres). ClearGrasp's normals have x
    flipped relative to OpenCV; they are converted so ``normals`` is in the OpenCV camera frame
    (x right, y down, z forward) like every other dataset here. Sample ids are ``"<object>/<id>"``.

    Args:
        root: The dataset folder (see above); with ``split=None``, a folder holding one sub-folder per
            object (or itself one object folder).
        split: ``"train"``, ``"val"``, ``"test"`` (or a sub-folder name); None: ``root`` is one split.
        objects: Object folder names to use; all when None.
        keys: Subset of ``("rgb", "normals", "mask", "depth")``.
        on_error: ``"raise"`` or ``"skip"`` samples with missing / undecodable files.
    """

    normals_flip_x = True
    _LAYOUT = {
        "normals": ("camera-normals", "-cameraNormals.exr"),
        "mask": ("segmentation-masks", "-segmentation-mask.png"),
        "depth": ("depth-imgs-rectified", "-depth-rectified.exr"),
    }
    #: split -> its folders relative to the dataset root (the download's names first, then plain ones)
    SPLIT_DIRS = {
        "train": ("cleargrasp-dataset-train", "train"),
        "val": ("cleargrasp-dataset-test-val/synthetic-val", "synthetic-val", "val"),
        "test": ("cleargrasp-dataset-test-val/synthetic-test", "synthetic-test", "test"),
    }

    def __init__(
        self,
        root: str | os.PathLike,
        split: str | None = None,
        objects: Sequence[str] | None = None,
        keys: Sequence[str] | None = None,
        on_error: OnError = "raise",
    ):
        self.root = Path(root)
        self.split = split
        if not self.root.is_dir():
            raise DataError(self.root, "no such folder")
        split_dirs = [self.root] if split is None else self.split_dirs(self.root, split)
        if not split_dirs:
            looked = ", ".join(f"{r}/" for r in self.SPLIT_DIRS.get(split, (split,)))
            raise DataError(self.root, f"no {split!r} split (looked for {looked})")
        obj_dirs: list[Path] = []
        for s in split_dirs:
            if (s / "rgb-imgs").is_dir():
                obj_dirs.append(s)
            else:
                obj_dirs += sorted(d for d in s.iterdir() if (d / "rgb-imgs").is_dir())
        if objects is not None:
            obj_dirs = [d for d in obj_dirs if d.name in set(objects)]
        if not obj_dirs:
            raise DataError(split_dirs[0], "no <object>/rgb-imgs folders (not a ClearGrasp layout)")
        samples = []
        bad: list[DataError] = []
        pat = re.compile(r"^(.*)-rgb\.(jpg|jpeg|png)$")
        for d in obj_dirs:
            for p in sorted((d / "rgb-imgs").iterdir()):
                m = pat.match(p.name)
                if not m:
                    continue
                sid = m.group(1)
                files: dict[str, Path] = {"rgb": p}
                for key, (sub, suffix) in self._LAYOUT.items():
                    if keys is not None and key not in keys:
                        continue
                    f = d / sub / f"{sid}{suffix}"
                    if f.is_file():
                        files[key] = f
                    elif key != "depth" or keys is not None:
                        bad.append(DataError(f, "no such file"))
                        files = {}
                        break
                if files:
                    samples.append((sid if d in split_dirs else f"{d.name}/{sid}", files))
        super().__init__(samples, keys, on_error, bad)

    @classmethod
    def split_dirs(cls, root: str | os.PathLike, split: str) -> list[Path]:
        """The existing folders of ``split`` under ``root`` (``root`` itself when it is named as one)."""
        root = Path(root)
        rels = cls.SPLIT_DIRS.get(split, (split,))
        if root.name in {Path(r).name for r in rels}:
            return [root]
        return [root / r for r in rels if (root / r).is_dir()]
