"""GenImage-layout datasets of real and generated images: scanning, a torch ``Dataset``, and ``genimage.json``.

GenImage (Zhu et al., NeurIPS 2023) stores one folder per generator, each with its own real images::

    <root>/<generator>/<split>/ai/*.png       generated ("fake", label 1)
    <root>/<generator>/<split>/nature/*.png   real (label 0)

Split names are GenImage's ``train`` / ``val``, but any split folder present is accepted. Files may be PNG,
JPEG or WebP (``perception.forensics.generators`` writes PNG only, so the file format is not a cue). Deviation
from GenImage: ``genimage.json`` at the root records how a locally built dataset was made (generators, sizes,
counts, seed, held-out generator, command); GenImage itself ships no such file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.errors import DataError

__all__ = [
    "CLASSES",
    "EXTENSIONS",
    "META_NAME",
    "GenImageDataset",
    "GenImageItem",
    "list_generators",
    "read_meta",
    "scan",
    "write_meta",
]

CLASSES = {"nature": 0, "ai": 1}  # folder -> label
EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")
META_NAME = "genimage.json"


@dataclass(frozen=True)
class GenImageItem:
    """One image of a GenImage layout.

    Attributes:
        path: The image file.
        label: 1 = ``ai`` (generated), 0 = ``nature`` (real).
        generator: The generator folder it lies in (its real images too).
    """

    path: Path
    label: int
    generator: str


def _splits(gen_dir: Path) -> list[str]:
    """Split folders of one generator folder that hold both ``ai`` and ``nature``."""
    return sorted(
        s.name for s in gen_dir.iterdir() if s.is_dir() and all((s / c).is_dir() for c in CLASSES)
    )


def list_generators(root: str | os.PathLike) -> list[str]:
    """Sorted names of the generator folders under ``root`` that have the GenImage layout.

    Raises:
        DataError: ``root`` is missing, not a folder, or holds no generator folder with the layout.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(root, "no such dataset folder")
    gens = sorted(g.name for g in root.iterdir() if g.is_dir() and not g.name.startswith(".") and _splits(g))
    if not gens:
        raise DataError(root, "holds no <generator>/<split>/{ai,nature}/ folders (not a GenImage layout)")
    return gens


def scan(root: str | os.PathLike, split: str, generators: list[str] | tuple[str, ...] | None = None,
         ) -> list[GenImageItem]:
    """All images of ``split``, sorted by (generator, label, file name): deterministic.

    Args:
        root: The dataset folder.
        split: A split folder name (``train``, ``val``, ...).
        generators: Generator folders to take (default: every one that has ``split``).

    Raises:
        DataError: Missing root or layout, an unknown generator (the message lists the available ones), a
            generator without ``split``, or no image at all.
    """
    root = Path(root)
    available = list_generators(root)
    if generators is None:
        chosen = [g for g in available if split in _splits(root / g)]
        if not chosen:
            present = sorted({s for g in available for s in _splits(root / g)})
            raise DataError(root, f"no generator has split {split!r} (splits present: {', '.join(present)})")
    else:
        chosen = list(generators)
        unknown = [g for g in chosen if g not in available]
        if unknown:
            raise DataError(root, f"unknown generator(s) {', '.join(map(repr, unknown))} "
                                  f"(available: {', '.join(available)})")
        for g in chosen:
            if split not in _splits(root / g):
                raise DataError(root / g, f"has no split {split!r} (has: {', '.join(_splits(root / g))})")
    items = []
    for g in chosen:
        for cls, label in sorted(CLASSES.items(), key=lambda kv: kv[1]):
            folder = root / g / split / cls
            files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in EXTENSIONS)
            items += [GenImageItem(p, label, g) for p in files]
    if not items:
        raise DataError(root, f"split {split!r} holds no images ({', '.join(EXTENSIONS)})")
    return items


class GenImageDataset(torch.utils.data.Dataset):
    """Images of a GenImage layout, centre-cropped to a square and resized to ``size`` (``core.data.imread.square``).

    ``degrade``: a degradation spec (``perception.forensics.degrade``: ``"jpeg=75"``, ``"resize=0.5"``, ...)
    applied to each decoded file before the crop and resize, as a re-posted image reaches a detector. A sample is
    ``{"image": (size, size, 3) uint8 RGB ndarray, "label": int (1 = ai), "generator": str, "path": str}``. Unreadable files raise ``DataError`` naming the file (``core.data.imread.read_image``).
    """

    def __init__(self, items: list[GenImageItem], size: int = 64, degrade: str | None = None):
        from perception.forensics.degrade import parse

        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.items = list(items)
        self.size = size
        self.degrade = parse(degrade)

    @classmethod
    def from_root(cls, root: str | os.PathLike, split: str, size: int = 64,
                  generators: list[str] | tuple[str, ...] | None = None) -> GenImageDataset:
        """``GenImageDataset(scan(root, split, generators), size)``."""
        return cls(scan(root, split, generators), size)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        from core.data.imread import read_image, square
        from perception.forensics.degrade import apply

        item = self.items[index]
        image = read_image(item.path)
        if self.degrade:
            image = apply(image, self.degrade)
        image = square(image, self.size)
        return {"image": image, "label": item.label, "generator": item.generator, "path": str(item.path)}


def write_meta(root: str | os.PathLike, **meta: Any) -> Path:
    """Write ``<root>/genimage.json`` atomically (indented, key-sorted JSON); returns its path."""
    from core.io import write_json

    path = Path(root) / META_NAME
    write_json(path, meta)
    return path


def read_meta(root: str | os.PathLike) -> dict[str, Any]:
    """Read ``<root>/genimage.json``.

    Raises:
        DataError: It is missing or not a JSON object.
    """
    from core.io import read_json

    path = Path(root) / META_NAME
    try:
        meta = read_json(path)
    except FileNotFoundError:
        raise DataError(path, "no such file (the dataset was not built, or its build did not finish)") from None
    except ValueError as e:
        raise DataError(path, str(e).split(": ", 1)[-1]) from None
    if not isinstance(meta, dict):
        raise DataError(path, f"expected a JSON object, got {type(meta).__name__}")
    return meta
