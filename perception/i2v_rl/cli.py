"""``embodied infer i2v IMAGE --out FILE.mp4``: continue an image with the post-trained image-to-video policy
(``--checkpoint``: a run folder, its ``<out_dir>/policy`` or a training checkpoint; default the shipped
``assets/checkpoints/tagrpo``; loaded read-only by ``I2VPolicy.from_pretrained``).

The image is centre-cropped and resized to the policy's frame size (``core.data.imread.read_square``); the video
(the given frame, then ``frames - 1`` generated ones) is sampled with the deterministic ODE (or the SDE with
``--sde``) and written atomically: an unreadable image, a bad ``--out`` or a failure on the way leaves no file.
The image is checked against the policy's training domain (``core.domain``): a warning on stderr when it is far.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import ConfigError, DataError
from core.outputs import output_file

FPS = 15


def read_frame(path: str | Path, hw: tuple[int, int]):
    """An image file -> (H, W, 3) uint8 RGB: centre-cropped to the aspect of ``hw``, then area-resized (square
    frames: ``core.data.imread.read_square``). Errors are one-line ``DataError`` naming the file."""
    import cv2
    import numpy as np

    from core.data.imread import read_image, read_square

    h, w = hw
    if h == w:
        return read_square(path, h)
    img = read_image(Path(path))
    ih, iw = img.shape[:2]
    ch, cw = (ih, round(ih * w / h)) if iw * h >= ih * w else (round(iw * h / w), iw)
    img = img[(ih - ch) // 2:(ih - ch) // 2 + ch, (iw - cw) // 2:(iw - cw) // 2 + cw]
    return np.ascontiguousarray(cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA))


def infer(args) -> int:
    """Generate one video from ``args.image`` into ``args.out`` (see the module docstring)."""
    import numpy as np
    import torch

    from core.data.video import VIDEO_EXTS, write_mp4
    from core.domain import warn_if_out_of_domain
    from core.resources import asset
    from perception.i2v_rl.modeling_tagrpo import I2VPolicy
    from perception.i2v_rl.task import policy_folder

    out = output_file(args.out, ".mp4", getattr(args, "overwrite", False))
    if args.eta <= 0:
        raise ConfigError(f"--eta: must be > 0, got {args.eta}")
    image = Path(args.image)
    if not image.is_file():
        raise DataError(image, "no such file")
    if image.suffix.lower() in VIDEO_EXTS:
        raise DataError(image, "is a video; i2v continues one image (extract a frame first)")
    policy_dir = Path(args.checkpoint) if getattr(args, "checkpoint", None) else asset("checkpoints", "tagrpo")
    if not policy_dir.is_dir():
        raise DataError(policy_dir, "no such policy folder (--checkpoint: a run or its <out_dir>/policy)")
    policy = I2VPolicy.from_pretrained(policy_folder(policy_dir)).eval()
    hw = policy.frame_hw
    first = read_frame(image, hw)  # before any output exists: a bad image leaves nothing behind
    warn_if_out_of_domain(policy.loaded_from["path"], [first], [str(image)])
    img = torch.from_numpy(np.ascontiguousarray(first.transpose(2, 0, 1)))[None]
    z = policy.encode_first(img)
    g = torch.Generator().manual_seed(args.seed)
    noise = policy.initial_noise(1, g)
    lat = policy.rollout(z, noise, args.eta, g).final if args.sde else policy.sample(z, noise)
    video = policy.decode_video(img, lat)[0].permute(0, 2, 3, 1).numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_mp4(out, video, fps=FPS)
    print(f"{'sde' if args.sde else 'ode'}: {len(video)} frames ({hw[0]} x {hw[1]} px) from {image} -> {out}")
    return 0


def calibrate_domain(checkpoint: str | Path | None = None, work: str | Path = "outputs/domain/videos",
                     n_train: int = 48, n_cal: int = 48, n_heldout: int = 48) -> dict:
    """Fit and store the conditioning-image domain check (``core.domain``) of a policy post-trained on
    simulator clips' first frames: the training sample is frames 0, 8, 16, 23 of the first ``n_train`` clips of
    its data (``sim.render.videos``, seed 0, the policy's frame size, 24 frames); calibration and held-out
    splits are first frames of clips of seeds 1000 and 2000. Run once at ship time::

        python -c "from perception.i2v_rl.cli import calibrate_domain; calibrate_domain()"
    """
    from core.bootstrap import prepare_process

    prepare_process()  # the learning stack before any render context

    from core.resources import asset
    from perception.i2v_rl.modeling_tagrpo import I2VPolicy
    from perception.i2v_rl.task import policy_folder
    from sim.render.videos import calibrate_clip_domain

    checkpoint = Path(checkpoint or asset("checkpoints", "tagrpo"))
    folder = policy_folder(checkpoint)
    size = I2VPolicy.from_pretrained(folder).frame_hw[0]

    return calibrate_clip_domain(folder, size, work, n_train, n_cal, n_heldout)
