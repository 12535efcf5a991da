"""``embodied infer normals IMAGE|DIR|VIDEO... --out DIR [--checkpoint CKPT] [--pointcloud --depth D.npy]``.

For each image ``<stem>``: ``<out>/<stem>_normals.png`` (colour-coded, RGB = (n + 1) / 2 * 255) and
``<out>/<stem>_normals.npy`` ((H, W, 3) float32 unit normals, OpenCV camera frame: x right, y down,
z forward), at the input's size. Folders are walked (recursively, sorted) for images and videos; two inputs of
the same stem are refused. A video (``core.data.video.VIDEO_EXTS``: .mp4, .mov, .avi, .mkv, .webm) gives
``<stem>_normals.mp4`` (colour-coded) and ``<stem>_normals.npy`` ((T, H, W, 3) float16).
``--pointcloud`` with ``--depth`` (z-depth in metres: .npy, .exr or 16-bit PNG in mm) writes
``<stem>.ply``: an oriented, coloured point cloud (camera frame, metres), back-projected with the
intrinsics of the embodied-dense ``meta.json`` the image sits under, else a pinhole with a 45 degree
horizontal field of view (the synthetic renderer's camera).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from core.errors import DataError
from core.io import atomic_path, save_npy
from core.logging import get_logger
from core.resources import asset
from core.viz import normals_to_rgb

log = get_logger("embodied.transnormal")

DEFAULT_CHECKPOINT = asset("checkpoints", "transnormal")
DEFAULT_FOV_DEG = 45.0


def inference_device() -> dict:
    """``from_pretrained`` keyword arguments: CUDA in bfloat16 when available, else CPU in float32."""
    import torch

    if torch.cuda.is_available():
        return {"device": "cuda", "dtype": torch.bfloat16}
    return {"device": "cpu", "dtype": None}


def collect_inputs(inputs: list[str]) -> list[Path]:
    """The images / videos to run on: files as given, folders walked (``core.data.inputs.expand_inputs``).

    Raises:
        DataError: A path does not exist, a folder holds no image or video, or two inputs share a stem (both
            would write ``<stem>_normals.*``).
    """
    from core.data.inputs import IMAGE_EXTS, expand_inputs
    from core.data.video import VIDEO_EXTS

    return expand_inputs(inputs, IMAGE_EXTS + VIDEO_EXTS, unique_stems=True)


def intrinsics_for(image: Path, width: int, height: int) -> tuple[float, float, float, float]:
    """(fx, fy, cx, cy) in pixels: the embodied-dense ``meta.json`` two folders up, else a 45 deg pinhole."""
    from core.io import read_json

    meta = image.parent.parent.parent / "meta.json"
    if meta.is_file():
        info = read_json(meta)
        intr = info.get("intrinsics")
        if intr and info.get("width", width) == width:
            return float(intr["fx"]), float(intr["fy"]), float(intr["cx"]), float(intr["cy"])
    f = width / (2.0 * math.tan(math.radians(DEFAULT_FOV_DEG) / 2.0))
    return f, f, (width - 1) / 2.0, (height - 1) / 2.0


def write_pointcloud(path: Path, normals: np.ndarray, depth: np.ndarray, rgb: np.ndarray,
                     intrinsics: tuple[float, float, float, float]) -> int:
    """Back-project valid depth pixels into an oriented, coloured .ply (camera frame, metres).

    Args:
        normals: (H, W, 3) unit normals, OpenCV camera frame.
        depth: (H, W) z-depth in metres (0 / non-finite = invalid).
        rgb: (H, W, 3) uint8 colours.

    Returns:
        Number of points written.
    """
    import open3d as o3d

    H, W = depth.shape
    if normals.shape[:2] != (H, W):
        raise DataError(path, f"depth is {H}x{W} but the image is {normals.shape[0]}x{normals.shape[1]}")
    fx, fy, cx, cy = intrinsics
    v, u = np.mgrid[0:H, 0:W]
    ok = np.isfinite(depth) & (depth > 0)
    z = depth[ok]
    pts = np.stack([(u[ok] - cx) / fx * z, (v[ok] - cy) / fy * z, z], -1)
    pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(pts.astype(np.float64)))
    pc.normals = o3d.utility.Vector3dVector(normals[ok].astype(np.float64))
    pc.colors = o3d.utility.Vector3dVector(rgb[ok].astype(np.float64) / 255.0)
    with atomic_path(path) as tmp:
        if not o3d.io.write_point_cloud(str(tmp), pc):
            raise DataError(path, "open3d could not write the point cloud")
    return int(ok.sum())


def infer(args) -> int:
    """Entry point of ``embodied infer normals`` (argparse namespace from ``embodied.cli``); returns 0."""
    from core.data.images import read_depth, write_image
    from core.data.imread import read_image
    from core.domain import warn_if_out_of_domain
    from perception.normals.pipeline_transnormal import TransNormalPipeline

    files = collect_inputs(list(args.inputs))
    depth_path = getattr(args, "depth", None)
    if getattr(args, "pointcloud", False):
        if depth_path is None:
            raise DataError("--pointcloud", "needs --depth (a z-depth map in metres for the image)")
        if len(files) != 1 or _is_video(files[0]):
            raise DataError("--pointcloud", "works on exactly one image (the one --depth belongs to)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shown = Path(getattr(args, "out_display", None) or out)  # the folder the user named (we may write a staged one)
    pipe = TransNormalPipeline.from_pretrained(args.checkpoint or DEFAULT_CHECKPOINT, **inference_device())
    for f in files:
        if _is_video(f):
            _infer_video(pipe, f, out)
            print(shown / f"{f.stem}_normals.mp4")
            continue
        img = read_image(f)  # (H, W, 3) uint8 RGB from any 8 / 16-bit, grey, alpha, palette or CMYK file
        warn_if_out_of_domain(pipe.model.loaded_from["path"], [img[..., :3]], [str(f)])
        n = pipe(img[..., :3]).normals[0].permute(1, 2, 0).numpy().astype(np.float32)  # (H, W, 3)
        write_image(out / f"{f.stem}_normals.png", normals_to_rgb(n))
        save_npy(out / f"{f.stem}_normals.npy", n)
        if getattr(args, "pointcloud", False):
            depth = np.load(depth_path) if str(depth_path).endswith(".npy") else read_depth(depth_path)
            depth = np.asarray(depth, np.float32).squeeze()
            k = intrinsics_for(f, n.shape[1], n.shape[0])
            count = write_pointcloud(out / f"{f.stem}.ply", n, depth, img[..., :3], k)
            log.info("%s: %d oriented points", out / f"{f.stem}.ply", count)
        print(shown / f"{f.stem}_normals.png")
    return 0


def _is_video(path: Path) -> bool:
    """Whether ``path`` goes to the video pipeline (by suffix, ``core.data.video.VIDEO_EXTS``)."""
    from core.data.video import VIDEO_EXTS

    return path.suffix.lower() in VIDEO_EXTS


def _infer_video(pipe, path: Path, out: Path) -> None:
    from core.data.video import read_frames, write_mp4

    frames = read_frames(path)  # (T, H, W, 3) uint8
    preds = []
    for i in range(0, len(frames), 8):
        batch = np.ascontiguousarray(frames[i: i + 8].transpose(0, 3, 1, 2))
        import torch

        preds.append(pipe(torch.from_numpy(batch)).normals.permute(0, 2, 3, 1).numpy())
    normals = np.concatenate(preds)
    write_mp4(out / f"{path.stem}_normals.mp4", np.stack([normals_to_rgb(n) for n in normals]))
    save_npy(out / f"{path.stem}_normals.npy", normals.astype(np.float16))
