"""``embodied infer depth360 PANO... --out DIR``: 360 depth + semantics for equirectangular panoramas.

Inputs are image files or folders (walked recursively for images and .exr / .hdr files; two inputs of the same
stem are refused), each a 2:1 equirectangular panorama in the ``core.data.panoramas`` convention. Per input
``<stem>`` it writes into ``DIR``: ``<stem>_depth.npy`` (H, W) float32 Euclidean range in metres, ``<stem>_depth.png`` (colour-mapped),
``<stem>_semantic.npy`` (H, W) uint8 class ids, ``<stem>_semantic.png`` (palette), and one
``predictions.json`` with the classes and the checkpoint used. The checkpoint is the shipped one
(``assets/checkpoints/sola``) unless ``--checkpoint`` names another (a checkpoint or run directory).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.errors import DataError
from core.resources import asset

DEFAULT_CHECKPOINT = asset("checkpoints", "sola")
HDR_SUFFIXES = (".exr", ".hdr")


def palette(n: int) -> np.ndarray:
    """(n, 3) uint8 distinct colours for class ids (id 0 black)."""
    rng = np.random.default_rng(3)
    pal = rng.integers(40, 256, (n, 3)).astype(np.uint8)
    pal[0] = 0
    return pal


def _inputs(paths: list[str]) -> list[Path]:
    """The panoramas to run on: files as given, folders walked (``core.data.inputs.expand_inputs``)."""
    from core.data.inputs import IMAGE_EXTS, expand_inputs

    return expand_inputs(paths, IMAGE_EXTS + HDR_SUFFIXES, unique_stems=True)


def read_panorama(path: Path) -> np.ndarray:
    """An equirectangular panorama as (H, 2H, 3) uint8 sRGB: HDR files (.exr / .hdr, linear radiance) are
    tone-mapped (``core.data.panoramas.tonemap_to_srgb``, Reinhard with automatic exposure), others read as is."""
    from core.data.imread import read_image
    from core.data.panoramas import read_equirect, tonemap_to_srgb

    if path.suffix.lower() in HDR_SUFFIXES:
        return tonemap_to_srgb(read_equirect(path))
    rgb = read_image(path)
    h, w = rgb.shape[:2]
    if w != 2 * h:
        raise DataError(path, f"panorama is {w}x{h}, expected width = 2 x height (equirectangular)")
    return rgb


def infer(args) -> int:
    """Run the checkpoint on every panorama in ``args.inputs``; write results to ``args.out``."""
    import cv2
    import torch

    from core.domain import warn_if_out_of_domain
    from core.io import atomic_path, write_json
    from core.viz import colorize
    from perception.spherical.modeling_sola import SoLAModel

    ckpt = Path(getattr(args, "checkpoint", None) or DEFAULT_CHECKPOINT)
    model = SoLAModel.from_pretrained(ckpt)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pal = palette(model.config.num_classes)
    written = []
    for f in _inputs(list(args.inputs)):
        rgb8 = read_panorama(f)
        outside = warn_if_out_of_domain(model.loaded_from["path"], [rgb8], [str(f)])[0]
        rgb = torch.from_numpy(np.ascontiguousarray(rgb8.transpose(2, 0, 1)))[None]
        pred = model.predict(rgb)
        depth = pred["depth"][0, 0].numpy().astype(np.float32)
        sem = pred["semantic"][0].numpy().astype(np.uint8)
        for name, arr in ((f"{f.stem}_depth.npy", depth), (f"{f.stem}_semantic.npy", sem)):
            with atomic_path(out / name) as tmp, open(tmp, "wb") as fh:
                np.save(fh, arr)
        for name, img in ((f"{f.stem}_depth.png", colorize(depth, cmap="magma")), (f"{f.stem}_semantic.png", pal[sem])):
            with atomic_path(out / name) as tmp:
                if not cv2.imwrite(str(tmp), np.ascontiguousarray(img[..., ::-1])):
                    raise OSError(f"could not write {out / name}")
        written.append({"input": str(f), "depth": f"{f.stem}_depth.npy", "semantic": f"{f.stem}_semantic.npy",
                        "depth_range_m": [float(depth.min()), float(depth.max())], "out_of_domain": outside})
        shown = Path(getattr(args, "out_display", None) or out)  # the folder the user named
        print(f"{f}: depth {depth.min():.2f}-{depth.max():.2f} m -> {shown / (f.stem + '_depth.npy')}")
    classes = _classes(ckpt, model.config.num_classes)
    write_json(out / "predictions.json", {"checkpoint": str(ckpt), "classes": classes, "outputs": written})
    return 0


def _run_data(ckpt: Path) -> dict:
    from core.io import read_json

    cfg_file = (ckpt if ckpt.is_dir() else ckpt.parent) / "config.json"
    return read_json(cfg_file).get("data", {}) if cfg_file.is_file() else {}


def render_source(ckpt: str | Path) -> str:
    """The ``sim.render.panoramas`` source a checkpoint was trained on (its run config; "analytic" for
    checkpoints made before sources existed)."""
    return str(_run_data(Path(ckpt)).get("render_source", "analytic"))


def _classes(ckpt: Path, n: int) -> list[str]:
    """Class names of a checkpoint: from the dataset its run config names (the render source's list, or the
    Stanford2D3D list), else by count for older checkpoints without one; ids as names when nothing matches."""
    data = _run_data(ckpt)
    if data.get("layout") == "stanford2d3d" or (not data and n == 14):
        from core.data.panoramas import S2D3D_CLASSES

        names = list(S2D3D_CLASSES)
    elif data.get("render_source") == "mujoco":
        from sim.render.scene_panoramas import CLASSES

        names = list(CLASSES)
    else:
        from sim.render.panoramas import CLASSES

        names = list(CLASSES)
    return names if len(names) == n else [str(i) for i in range(n)]
