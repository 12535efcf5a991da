"""``embodied infer fera-samples --run DIR --out DIR [--n 16] [--seed 0] [--steps N] [--base]``: sample
images from an adapted diffusion model (any arm of ``embodied train fera``: FeRA, its ablations, LoRA, DoRA).

The run folder names its base (``model.base_path`` in its ``config.json``) and holds the adapter folder; the
samples are Euler-ODE draws from pure noise (FeRA routes each step by the latent's frequency energy), written as
PNGs. ``--base`` samples the unadapted base instead, with the
same noise, for a side-by-side look. The output folder follows the CLI's policy (``core.outputs``: staged, renamed
into place on success): ``grid.png`` and ``samples/NNN.png``.
"""

from __future__ import annotations

import math
from pathlib import Path

from core.errors import ConfigError, DataError


def infer(args) -> int:
    from core.data.images import write_image
    from core.io import read_json
    from core.pretrained import dataclass_from_dict
    from core.viz import image_grid
    from perception.adapters.backbones import sample_images
    from perception.adapters.configuration_fera import FeRAModelConfig
    from perception.adapters.task import load_adapted, load_base

    out = Path(args.out)  # the staged folder core.outputs claimed for us
    if args.n < 1 or (args.steps is not None and args.steps < 1):
        raise ConfigError("--n and --steps must be >= 1")
    run = Path(args.run)
    cfg_file = run / "config.json"
    if not cfg_file.is_file():
        raise DataError(run, "has no config.json (not an `embodied train fera` run folder)")
    model_cfg = dataclass_from_dict(FeRAModelConfig, read_json(cfg_file).get("model") or {})
    denoiser = load_base(model_cfg) if args.base else load_adapted(model_cfg, run).denoiser
    imgs = sample_images(denoiser, args.n, steps=args.steps or model_cfg.sample_steps, seed=args.seed)
    grid = image_grid(imgs.permute(0, 2, 3, 1).numpy(), cols=math.ceil(math.sqrt(args.n)))
    h, w = imgs.shape[-2:]
    (out / "samples").mkdir(parents=True, exist_ok=True)
    write_image(out / "grid.png", grid)
    for i, img in enumerate(imgs.permute(0, 2, 3, 1).numpy()):
        write_image(out / "samples" / f"{i:03d}.png", img)
    shown = getattr(args, "out_display", out)
    print(f"wrote {shown}/grid.png and {args.n} samples ({h}x{w}, {'base' if args.base else 'adapted'})")
    return 0
