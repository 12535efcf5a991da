"""Shared plumbing of the dataset renderers: argument checks, split assignment, per-view seeding.

Files are written by the shared data layer (``core.data.images.write_dense_sample`` / ``write_meta``,
``core.data.video.write_mp4``: atomic, RGB channel order in PNGs). The image renderers write the
``embodied-dense/1`` layout (one folder per split, one file per map, the same ``<id>`` across maps)::

    <root>/meta.json                      written last: its presence marks a complete dataset
    <root>/<split>/rgb/<id>.png           (H, W, 3) uint8 RGB
    <root>/<split>/rgb_twin/<id>.png      (H, W, 3) uint8 RGB, material-changed twin of the same view
    <root>/<split>/normals/<id>.png       (H, W, 3) uint16, value = (n + 1) / 2 * 65535, 0,0,0 = invalid
    <root>/<split>/depth/<id>.png         (H, W) uint16 millimetres, 0 = invalid
    <root>/<split>/mask/<id>.png          (H, W) uint8, 0 background, 255 object
    <root>/<split>/semantic/<id>.png      (H, W) uint8 class ids (names in meta.json "classes")
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from core.errors import ConfigError

NORMAL_FRAME = (
    "camera, OpenCV: x right, y down, z forward, unit vectors pointing out of the surface towards the "
    "camera side"
)
SPLITS = ("train", "test")
# The source a renderer's meta.json implies when it names none (datasets written before sources existed).
LEGACY_SOURCE = {"sim.render.panoramas": "analytic", "sim.render.normals": "procedural"}


def check_make_args(n: int, seed: int, size: int | None, spp: int, test_fraction: float) -> None:
    """Validate the common ``make_dataset`` arguments; raise ``ConfigError`` naming the bad one."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"n: expected an int >= 1, got {n!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed: expected an int >= 0, got {seed!r}")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 8):
        raise ConfigError(f"size: expected None or an int >= 8, got {size!r}")
    if not isinstance(spp, int) or isinstance(spp, bool) or spp < 1:
        raise ConfigError(f"spp: expected an int >= 1, got {spp!r}")
    if not 0.0 <= float(test_fraction) < 1.0:
        raise ConfigError(f"test_fraction: expected a value in [0, 1), got {test_fraction!r}")


def split_ids(n: int, test_fraction: float) -> list[tuple[str, str, int]]:
    """Assign views ``0 .. n-1`` to splits: the last ``round(n * test_fraction)`` go to ``test``.

    Returns ``(split, id, index)`` triples; ids are the zero-padded global index, so a view's id (and,
    since each view is seeded from ``(seed, index)``, its content) does not depend on ``n``.
    """
    n_test = int(round(n * test_fraction))
    if test_fraction > 0 and n >= 2:
        n_test = max(n_test, 1)
    n_test = min(n_test, n - 1)
    return [("test" if i >= n - n_test else "train", f"{i:06d}", i) for i in range(n)]


def view_rng(seed: int, index: int, stream: int = 0) -> np.random.Generator:
    """The generator for view ``index`` of a dataset made with ``seed`` (independent of ``n``)."""
    return np.random.default_rng(np.random.SeedSequence([seed, index, stream]))


def dataset_source(meta: dict) -> str | None:
    """The ``source`` a dataset was rendered from (``meta.json``), or None for folders no renderer here wrote."""
    if "source" in meta:
        return str(meta["source"])
    generator = str(meta.get("generator", ""))
    for module, source in LEGACY_SOURCE.items():
        if generator.startswith(module):
            return source
    return None


def check_source(root, wanted: str, key: str, field: str = "source", default: str | None = None) -> None:
    """Raise ``DataError`` when the rendered dataset at ``root`` has another ``field`` (``source`` or e.g.
    ``framing``; ``default`` when its meta.json predates the field) than ``wanted``.

    Folders that no renderer of this project wrote (real data with its own meta.json) pass unchecked.
    """
    from pathlib import Path

    from core.errors import DataError
    from core.io import read_json

    meta = read_json(Path(root) / "meta.json")
    source = dataset_source(meta)
    if source is None:
        return
    found = source if field == "source" else str(meta.get(field, default))
    if found != wanted:
        raise DataError(Path(root) / "meta.json", f"rendered with {field} {found!r} but {key} is {wanted!r}: "
                        "point data.root at another folder or remove this one")


_bar = None  # the progress bar of the dataset being made in this process (``view_progress``), if any


@contextlib.contextmanager
def view_progress(total: int, desc: str) -> Iterator[None]:
    """A per-view progress bar on stderr (``core.logging.progress``) while a renderer writes ``total`` views.

    Every renderer calls ``view_done()`` once per written view; outside this context that is a no-op, so
    ``make_dataset`` called from code shows nothing.
    """
    global _bar
    from core.logging import progress

    _bar = progress(total=total, desc=desc, unit="view")
    try:
        yield
    finally:
        _bar.close()
        _bar = None


def view_done() -> None:
    """One more view written (advances ``view_progress``'s bar when one is open)."""
    if _bar is not None:
        _bar.update(1)
