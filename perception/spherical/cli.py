"""``embodied infer depth360 PANO|DIR... --out DIR``: 360 depth + semantics for equirectangular panoramas.

Inputs are image files or folders (walked recursively for every image format the reader takes and .exr / .hdr
files), each a 2:1 equirectangular panorama in the ``core.data.panoramas`` convention. Outputs are named by
``core.data.inputs.plan_outputs`` (a named file by its stem, a file found in a folder by its path inside it,
colliding stems with their extension: ``room.png``, ``room.exr`` -> ``room_png``, ``room_exr``). Per input
``<name>`` it writes into ``DIR``: ``<name>_depth.npy`` (H, W) float32 Euclidean range in metres,
``<name>_depth.png`` (colour-mapped), ``<name>_semantic.npy`` (H, W) uint8 class ids, ``<name>_semantic.png``
(palette), and one ``predictions.json`` with the classes, the checkpoint used and one entry per input (its
outputs, depth range, out-of-domain flag). An input that cannot be read (or is not 2:1, or is a video: this
command reads still panoramas only) is skipped with its own error line on stderr while the others run; the
exit code is then 1. The checkpoint is the shipped one (``assets/checkpoints/sola``) unless ``--checkpoint``
names another (a checkpoint or run directory).
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


def _inputs(paths: list[str]) -> list[tuple[Path, str]]:
    """``(panorama, output name)`` pairs: files as given, folders walked (``core.data.inputs.plan_outputs``)."""
    from core.data.inputs import IMAGE_EXTS, plan_outputs

    return plan_outputs(paths, IMAGE_EXTS + HDR_SUFFIXES, keep_missing=True)


def read_panorama(path: Path) -> np.ndarray:
    """An equirectangular panorama as (H, 2H, 3) uint8 sRGB: HDR files (.exr / .hdr, linear radiance) are
    tone-mapped (``core.data.panoramas.tonemap_to_srgb``, Reinhard with automatic exposure), others read as is."""
    from core.data.imread import read_image
    from core.data.panoramas import read_equirect, tonemap_to_srgb
    from core.data.video import VIDEO_EXTS

    if path.suffix.lower() in VIDEO_EXTS:
        raise DataError(path, "is a video; depth360 reads still panoramas (extract frames first, e.g. "
                              "`ffmpeg -i clip.mp4 frames/%04d.png`)")
    if path.suffix.lower() in HDR_SUFFIXES:
        return tonemap_to_srgb(read_equirect(path))
    rgb = read_image(path)
    h, w = rgb.shape[:2]
    if w != 2 * h:
        raise DataError(path, f"panorama is {w}x{h}, expected width = 2 x height (equirectangular)")
    return rgb


def infer(args) -> int:
    """Run the checkpoint on every panorama in ``args.inputs``; write results to ``args.out``.

    Returns:
        0 when every input ran, 1 when some were skipped (each with its own error line on stderr).
    """
    import torch

    from core.domain import warn_if_out_of_domain
    from core.io import write_json
    from core.logging import progress
    from core.outputs import Batch, announce
    from perception.spherical.modeling_sola import SoLAModel

    plan = _inputs(list(args.inputs))
    ckpt = Path(getattr(args, "checkpoint", None) or DEFAULT_CHECKPOINT)
    model = SoLAModel.from_pretrained(ckpt)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shown = Path(getattr(args, "out_display", None) or out)  # the folder the user named
    pal = palette(model.config.num_classes)
    written, batch = [], Batch(len(plan), "panoramas")
    bar = progress(plan, desc="depth360", unit="pano", enabled=len(plan) > 1)
    for f, name in bar:
        files: list[Path] = []
        try:
            if not f.is_file():
                raise DataError(f, "no such file")
            rgb8 = read_panorama(f)
            outside = warn_if_out_of_domain(model.loaded_from["path"], [rgb8], [str(f)])[0]
            rgb = torch.from_numpy(np.ascontiguousarray(rgb8.transpose(2, 0, 1)))[None]
            pred = model.predict(rgb)
            depth = pred["depth"][0, 0].numpy().astype(np.float32)
            sem = pred["semantic"][0].numpy().astype(np.uint8)
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            _write_outputs(out, name, depth, sem, pal, files)
        except Exception as e:  # one panorama's failure skips only that panorama
            for p in files:
                p.unlink(missing_ok=True)
            batch.skip(f, e, bar)
            continue
        written.append({"input": str(f), "depth": f"{name}_depth.npy", "semantic": f"{name}_semantic.npy",
                        "depth_range_m": [float(depth.min()), float(depth.max())], "out_of_domain": outside})
        line = f"{f}: depth {depth.min():.2f}-{depth.max():.2f} m -> {shown / (name + '_depth.npy')}"
        announce(args, line, shown / f"{name}_depth.npy")
    if written:
        classes = _classes(ckpt, model.config.num_classes)
        write_json(out / "predictions.json", {"checkpoint": str(ckpt), "classes": classes, "outputs": written})
    return batch.exit_code()


def _write_outputs(out: Path, name: str, depth: np.ndarray, sem: np.ndarray, pal: np.ndarray,
                   files: list[Path]) -> None:
    """``<name>_depth.npy / .png`` and ``<name>_semantic.npy / .png`` (atomic each), noted in ``files``."""
    import cv2

    from core.io import atomic_path
    from core.viz import colorize

    for fname, arr in ((f"{name}_depth.npy", depth), (f"{name}_semantic.npy", sem)):
        files.append(out / fname)
        with atomic_path(out / fname) as tmp, open(tmp, "wb") as fh:
            np.save(fh, arr)
    for fname, img in ((f"{name}_depth.png", colorize(depth, cmap="magma")), (f"{name}_semantic.png", pal[sem])):
        files.append(out / fname)
        with atomic_path(out / fname) as tmp:
            if not cv2.imwrite(str(tmp), np.ascontiguousarray(img[..., ::-1])):
                raise OSError(f"could not write {out / fname}")


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
