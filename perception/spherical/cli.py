"""``embodied infer depth360 PANO... --out DIR``: 360 depth + semantics for equirectangular panoramas.

Inputs are image files or folders of images (PNG / JPEG), each a 2:1 equirectangular panorama in the
``core.data.panoramas`` convention. Per input ``<stem>`` it writes into ``DIR``:
``<stem>_depth.npy`` (H, W) float32 Euclidean range in metres, ``<stem>_depth.png`` (colour-mapped),
``<stem>_semantic.npy`` (H, W) uint8 class ids, ``<stem>_semantic.png`` (palette), and one
``predictions.json`` with the classes and the checkpoint used. The checkpoint is the shipped one
(``assets/checkpoints/sola``) unless ``--checkpoint`` names another (a checkpoint or run directory).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.errors import DataError

DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[2] / "assets" / "checkpoints" / "sola"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def palette(n: int) -> np.ndarray:
    """(n, 3) uint8 distinct colours for class ids (id 0 black)."""
    rng = np.random.default_rng(3)
    pal = rng.integers(40, 256, (n, 3)).astype(np.uint8)
    pal[0] = 0
    return pal


def _inputs(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(p, "no such file or folder")
    if not files:
        raise DataError(paths[0], "no panorama images found")
    return files


def infer(args) -> int:
    """Run the checkpoint on every panorama in ``args.inputs``; write results to ``args.out``."""
    import cv2
    import torch

    from core.demo_sections import colorize
    from core.io import atomic_path, write_json
    from perception.spherical.task import load_model

    ckpt = Path(getattr(args, "checkpoint", None) or DEFAULT_CHECKPOINT)
    model = load_model(ckpt)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pal = palette(model.config.num_classes)
    written = []
    for f in _inputs(list(args.inputs)):
        bgr = cv2.imread(str(f), cv2.IMREAD_COLOR)
        if bgr is None:
            raise DataError(f, "not a readable image")
        h, w = bgr.shape[:2]
        if w != 2 * h:
            raise DataError(f, f"panorama is {w}x{h}, expected width = 2 x height (equirectangular)")
        rgb = torch.from_numpy(np.ascontiguousarray(bgr[..., ::-1].transpose(2, 0, 1)))[None]
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
                        "depth_range_m": [float(depth.min()), float(depth.max())]})
        print(f"{f}: depth {depth.min():.2f}-{depth.max():.2f} m -> {out / (f.stem + '_depth.npy')}")
    classes = _classes(ckpt, model.config.num_classes)
    write_json(out / "predictions.json", {"checkpoint": str(ckpt), "classes": classes, "outputs": written})
    return 0


def _classes(ckpt: Path, n: int) -> list[str]:
    if n == 10:
        from sim.render.panoramas import CLASSES

        return list(CLASSES)
    if n == 14:
        from core.data.panoramas import S2D3D_CLASSES

        return list(S2D3D_CLASSES)
    return [str(i) for i in range(n)]
