"""``embodied infer normals IMAGE|DIR|VIDEO... --out DIR [--checkpoint CKPT] [--max-frames N]
[--pointcloud --depth D.npy]``.

Inputs: image files, videos and folders (walked recursively, sorted, for every image format the reader takes,
``core.data.inputs.IMAGE_EXTS``, and videos). Outputs are named by ``core.data.inputs.plan_outputs``: a named
file by its stem, a file found in a folder by its path inside it (subfolders kept), inputs whose stems collide
with their extension added (``coffee.bmp``, ``coffee.gif`` -> ``coffee_bmp``, ``coffee_gif``). For each image
``<name>``: ``<out>/<name>_normals.png`` (colour-coded, RGB = (n + 1) / 2 * 255) and ``<out>/<name>_normals.npy``
((H, W, 3) float32 unit normals, OpenCV camera frame: x right, y down, z forward), at the input's size.

A video (``core.data.video.VIDEO_EXTS``: .mp4, .mov, .avi, .mkv, .webm) is processed frame by frame, its first
``--max-frames`` frames only (default 16; 0 for every frame): before it starts, one line on stderr states the
video's frame count and size and what will be written, then a progress bar counts the frames. It gives
``<name>_normals.mp4`` (colour-coded, the video's fps) and ``<name>_normals.npy`` ((T, H, W, 3) float16, so
T x H x W x 6 bytes: 42 MB for 16 frames of 768 x 576). The domain check runs on its first, middle and last frame.

An input that cannot be read or run is skipped with its own error line on stderr while the others run; the
exit code is then 1. Each output path is printed (stdout) once the output folder is in place.
``--pointcloud`` with ``--depth`` (z-depth in metres: .npy, .exr or 16-bit PNG in mm) writes
``<name>.ply``: an oriented, coloured point cloud (camera frame, metres), back-projected with the
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
#: Frames of a video ``--max-frames`` runs by default (0: all): a long clip is a few GB of float16 normals.
DEFAULT_MAX_FRAMES = 16
VIDEO_BATCH = 8


def inference_device() -> dict:
    """``from_pretrained`` keyword arguments: CUDA in bfloat16 when available, else CPU in float32."""
    import torch

    if torch.cuda.is_available():
        return {"device": "cuda", "dtype": torch.bfloat16}
    return {"device": "cpu", "dtype": None}


def collect_inputs(inputs: list[str]) -> list[tuple[Path, str]]:
    """``(input, output name)`` for every image / video: files as given, folders walked, one naming rule
    (``core.data.inputs.plan_outputs``). A missing file is kept: it gets its own error line with the others.

    Raises:
        DataError: No input given, or a folder holds no image or video.
    """
    from core.data.inputs import IMAGE_EXTS, plan_outputs
    from core.data.video import VIDEO_EXTS

    return plan_outputs(inputs, IMAGE_EXTS + VIDEO_EXTS, keep_missing=True)


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
    """Entry point of ``embodied infer normals`` (argparse namespace from ``embodied.cli``).

    Returns:
        0 when every input ran, 1 when some were skipped (each with its own error line on stderr).
    """
    from core.data.imread import read_image
    from core.domain import warn_if_out_of_domain
    from core.logging import progress
    from core.outputs import Batch, announce
    from perception.normals.pipeline_transnormal import TransNormalPipeline

    plan = collect_inputs(list(args.inputs))
    max_frames = getattr(args, "max_frames", DEFAULT_MAX_FRAMES)
    if max_frames is None or max_frames < 0:
        raise DataError("--max-frames", f"must be >= 0 (0: every frame), got {max_frames}")
    depth_path = getattr(args, "depth", None)
    if getattr(args, "pointcloud", False):
        if depth_path is None:
            raise DataError("--pointcloud", "needs --depth (a z-depth map in metres for the image)")
        if len(plan) != 1 or _is_video(plan[0][0]):
            raise DataError("--pointcloud", "works on exactly one image (the one --depth belongs to)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shown = Path(getattr(args, "out_display", None) or out)  # the folder the user named (we may write a staged one)
    pipe = TransNormalPipeline.from_pretrained(args.checkpoint or DEFAULT_CHECKPOINT, **inference_device())
    ckpt_dir = pipe.model.loaded_from["path"]
    batch = Batch(len(plan))
    bar = progress(plan, desc="normals", unit="input", enabled=len(plan) > 1)
    for f, name in bar:
        written: list[Path] = []
        try:
            if not f.is_file():
                raise DataError(f, "no such file")
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            if _is_video(f):
                _infer_video(pipe, f, out / name, max_frames, ckpt_dir, shown / name, written)
                announce(args, str(shown / f"{name}_normals.mp4"), shown / f"{name}_normals.mp4")
                continue
            img = read_image(f)[..., :3]  # (H, W, 3) uint8 RGB from any 8 / 16-bit, grey, alpha, palette, CMYK
            warn_if_out_of_domain(ckpt_dir, [img], [str(f)])
            n = pipe(img).normals[0].permute(1, 2, 0).numpy().astype(np.float32)  # (H, W, 3)
            _write_normals(out / name, n, written)
            if getattr(args, "pointcloud", False):
                written.append(out / f"{name}.ply")
                count = _pointcloud(out / f"{name}.ply", f, n, img, depth_path)
                log.info("%s: %d oriented points", shown / f"{name}.ply", count)
            announce(args, str(shown / f"{name}_normals.png"), shown / f"{name}_normals.png")
        except Exception as e:  # one input's failure (unreadable, undecodable, too large) skips only that input
            for w in written:
                w.unlink(missing_ok=True)
            batch.skip(f, e, bar)
    return batch.exit_code()


def _write_normals(stem: Path, n: np.ndarray, written: list[Path]) -> None:
    """``<stem>_normals.png`` (colour-coded) and ``<stem>_normals.npy`` ((H, W, 3) float32), noted in ``written``."""
    from core.data.images import write_image

    png, npy = stem.with_name(f"{stem.name}_normals.png"), stem.with_name(f"{stem.name}_normals.npy")
    written += [png, npy]
    write_image(png, normals_to_rgb(n))
    save_npy(npy, n)


def _pointcloud(ply: Path, image: Path, n: np.ndarray, rgb: np.ndarray, depth_path) -> int:
    from core.data.images import read_depth

    depth = np.load(depth_path) if str(depth_path).endswith(".npy") else read_depth(depth_path)
    depth = np.asarray(depth, np.float32).squeeze()
    return write_pointcloud(ply, n, depth, rgb, intrinsics_for(image, n.shape[1], n.shape[0]))


def _is_video(path: Path) -> bool:
    """Whether ``path`` goes to the video pipeline (by suffix, ``core.data.video.VIDEO_EXTS``)."""
    from core.data.video import VIDEO_EXTS

    return path.suffix.lower() in VIDEO_EXTS


def _size(nbytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError


def _infer_video(pipe, path: Path, stem: Path, max_frames: int, ckpt_dir, shown_stem: Path,
                 written: list[Path]) -> None:
    """Normals of a video's first ``max_frames`` frames (0: all): ``<stem>_normals.mp4`` (colour-coded, the
    video's fps) and ``<stem>_normals.npy`` ((T, H, W, 3) float16). States the frame count and output size on
    stderr before it starts and shows a progress bar over the frames."""
    import sys

    import torch

    from core.data.video import probe_video, read_frames, write_mp4
    from core.domain import warn_if_out_of_domain
    from core.logging import progress

    total, fps, (h, w) = probe_video(path)
    take = total if max_frames == 0 else min(max_frames, total)
    if take < 1:
        raise DataError(path, "video has no frames")
    part = "every frame" if take == total else f"the first {take} (--max-frames {max_frames}; 0 for all)"
    print(f"embodied: {path}: video of {total} frames, {w}x{h} at {fps:g} fps: running {part}; writes "
          f"{shown_stem}_normals.mp4 and {shown_stem}_normals.npy ({take} x {h} x {w} x 3 float16, "
          f"{_size(take * h * w * 3 * 2)})", file=sys.stderr, flush=True)
    frames = read_frames(path, count=take, fps=fps)  # (T, H, W, 3) uint8
    sample = sorted({0, take // 2, take - 1})  # one warning for the video: its first, middle and last frame
    warn_if_out_of_domain(ckpt_dir, [frames[i] for i in sample], [str(path)] * len(sample))
    normals = np.zeros((take, h, w, 3), np.float16)
    with progress(total=take, desc=path.name, unit="frame") as bar:
        for i in range(0, take, VIDEO_BATCH):
            chunk = torch.from_numpy(np.ascontiguousarray(frames[i: i + VIDEO_BATCH].transpose(0, 3, 1, 2)))
            normals[i: i + len(chunk)] = pipe(chunk).normals.permute(0, 2, 3, 1).float().numpy()
            bar.update(len(chunk))
    mp4, npy = stem.with_name(f"{stem.name}_normals.mp4"), stem.with_name(f"{stem.name}_normals.npy")
    written += [mp4, npy]  # the caller removes them if this input fails half-way
    write_mp4(mp4, np.stack([normals_to_rgb(n.astype(np.float32)) for n in normals]), fps=fps)
    save_npy(npy, normals)
