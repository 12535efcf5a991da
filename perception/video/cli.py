"""``embodied infer video --out FILE.mp4 [--mode bidirectional|autoregressive|flex] [--frames N]
[--first-frame IMAGE]``: generate a video with Flex-Forcing.

The model continues given frames: ``--first-frame`` (any image, resized to the model's frame size; checked
against the training domain by ``core.domain``, a warning when it is far) or, without it, the first frame of
the checkpoint's sample scene (a held-out simulator clip bundled in the checkpoint folder as
``sample_first_frame.png``; a run without one uses the shipped model's, resized). ``--frames`` counts the output frames, the first included; videos longer
than the training length are generated in windows (see ``perception.video.pipeline_flexforcing``). The mp4 is written
atomically (temp file + rename): a failed run leaves no partial file. The checkpoint is the shipped one
(``assets/checkpoints/flexforcing``) unless ``--checkpoint`` names another.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.errors import ConfigError, DataError
from core.outputs import output_file
from core.resources import asset

DEFAULT_CHECKPOINT = asset("checkpoints", "flexforcing")
SAMPLE_FRAME = "sample_first_frame.png"
FPS = 15


def read_first_frame(path: str | Path, size: int | tuple[int, int]) -> np.ndarray:
    """An image file -> (H, W, 3) uint8 RGB: centre-cropped to the aspect of ``size`` ((H, W), or a square side)
    and area-resized (``core.data.imread.read_square`` for a square)."""
    from core.data.imread import read_square

    h, w = (size, size) if isinstance(size, int) else size
    if h == w:
        return read_square(path, h)
    import cv2

    from core.data.imread import read_image

    img = read_image(Path(path))
    ih, iw = img.shape[:2]
    ch, cw = (ih, round(ih * w / h)) if iw * h >= ih * w else (round(iw * h / w), iw)  # the largest (h:w) window
    y0, x0 = (ih - ch) // 2, (iw - cw) // 2
    return np.ascontiguousarray(cv2.resize(img[y0:y0 + ch, x0:x0 + cw], (w, h), interpolation=cv2.INTER_AREA))


def infer(args) -> int:
    """Generate ``args.frames`` frames in ``args.mode`` and write them to ``args.out`` (mp4)."""
    import torch

    from core.data.video import write_mp4
    from perception.video.modeling_flexforcing import FlexForcingModel
    from perception.video.pipeline_flexforcing import continue_video, supported_regimes

    out = output_file(args.out, ".mp4", getattr(args, "overwrite", False))
    if args.frames is None or args.frames < 2:
        raise ConfigError(f"--frames: must be >= 2 (the first frame plus at least one new one), got {args.frames}")
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps: must be >= 1, got {args.steps}")
    ckpt = Path(args.checkpoint or DEFAULT_CHECKPOINT)
    first_path = Path(args.first_frame) if args.first_frame else None
    if first_path is not None and not first_path.is_file():
        raise DataError(first_path, "no such file")
    model = FlexForcingModel.from_pretrained(ckpt).eval()
    if args.mode not in supported_regimes(model):
        raise ConfigError(f"--mode {args.mode}: this checkpoint (chunking={model.config.chunking}) runs only "
                          f"{', '.join(supported_regimes(model))}")
    size = model.config.frame_hw
    if first_path is None:
        # the checkpoint's own sample scene, else the shipped model's (a held-out simulator frame, resized)
        candidates = [Path(model.loaded_from["path"]) / SAMPLE_FRAME, ckpt / SAMPLE_FRAME,
                      Path(DEFAULT_CHECKPOINT) / SAMPLE_FRAME]
        sample = next((c for c in candidates if c.is_file()), None)
        if sample is None:
            raise DataError(ckpt, f"has no {SAMPLE_FRAME}; pass --first-frame IMAGE")
        first_path = sample
    first = read_first_frame(first_path, size)
    if args.first_frame:  # the shipped sample frame is the model's own; a user's image is checked
        from core.domain import warn_if_out_of_domain

        warn_if_out_of_domain(model.loaded_from["path"], [first], [str(first_path)])
    video = torch.from_numpy(np.ascontiguousarray(first.transpose(2, 0, 1)))[None, None]
    g = torch.Generator().manual_seed(args.seed)
    frames, gen = continue_video(model, video, args.frames, args.mode, context=1, generator=g, steps=args.steps)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_mp4(out, frames[0].permute(0, 2, 3, 1).numpy(), fps=FPS)
    print(f"{args.mode}: {args.frames} frames ({size[0]} x {size[1]} px) in {gen.seconds:.2f} s, first new frame "
          f"after {gen.first_frame_s:.2f} s -> {out}")
    return 0


def calibrate_domain(checkpoint: str | Path | None = None, work: str | Path = "outputs/domain/videos",
                     n_train: int = 48, n_cal: int = 48, n_heldout: int = 48) -> dict:
    """Fit and store the ``--first-frame`` domain check (``core.domain``) of a checkpoint trained on simulator
    clips: the training sample is frames 0, 8, 16, 23 of the first ``n_train`` clips of the training data
    (``sim.render.videos``, seed 0, the checkpoint's frame size, 24 frames); calibration and held-out splits
    are the first frames of clips of seeds 1000 and 2000. Run once at ship time (about 3 minutes on a CPU)::

        python -c "from perception.video.cli import calibrate_domain; calibrate_domain()"
    """
    from core.bootstrap import prepare_process

    prepare_process()  # the learning stack before any render context
    from perception.video.modeling_flexforcing import FlexForcingModel
    from sim.render.videos import calibrate_clip_domain

    checkpoint = Path(checkpoint or DEFAULT_CHECKPOINT)
    size = FlexForcingModel.from_pretrained(checkpoint).config.frame_hw[0]

    return calibrate_clip_domain(checkpoint, size, work, n_train, n_cal, n_heldout)
