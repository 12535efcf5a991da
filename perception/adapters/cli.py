"""``embodied infer fera-samples --run DIR --out DIR [--n 16] [--seed 0] [--steps N] [--base]``: sample
images from an adapted diffusion model (any arm of ``embodied train fera``: FeRA, its ablations, LoRA, DoRA).

``--run`` is the arm's run folder (its exported model ``<run>/adapter``, which references its base) or an exported
adapted model itself (e.g. ``assets/checkpoints/fera/fera``). The samples are Euler-ODE draws from pure noise
(FeRA routes each step by the latent's frequency energy), written as PNGs; ``--steps`` defaults to the run's
``model.sample_steps``. ``--base`` samples the unadapted base instead, with the same noise, for a side-by-side
look (the adapter switched off). A latent base (a diffusers model) samples with its own objective's sampler and
decodes through its VAE; a Wan base's clips are written as their frames side by side. The output folder follows the CLI's policy (``core.outputs``: staged, renamed into place on success):
``grid.png`` and ``samples/NNN.png``.
"""

from __future__ import annotations

import math
from pathlib import Path

from core.errors import ConfigError, DataError


def infer(args) -> int:
    """Write ``grid.png`` and ``samples/NNN.png`` of ``args.n`` samples into ``args.out``; returns 0."""
    from core.checkpoint import CONFIG_FILE
    from core.data.images import write_image
    from core.distributed import resolve_device
    from core.io import read_json
    from core.viz import image_grid
    from perception.adapters.configuration_fera import FeRAModelConfig
    from perception.adapters.pipeline_fera import sample_pixels
    from perception.adapters.task import load_adapted

    out = Path(args.out)  # the staged folder core.outputs claimed for us
    if args.n < 1 or (args.steps is not None and args.steps < 1):
        raise ConfigError("--n and --steps must be >= 1")
    run = Path(args.run)
    if not (run / CONFIG_FILE).is_file():
        raise DataError(run, "has no config.json (not an `embodied train fera` run folder)")
    model = load_adapted(run)
    if model.is_latent:
        model.to(resolve_device("auto"))
        steps = args.steps or model.config.latent.sample_steps
    else:
        config = read_json(run / CONFIG_FILE)
        section = config.get("base_model") or config.get("model") or {}  # an exported model's / the run's
        steps = args.steps or section.get("sample_steps", FeRAModelConfig.sample_steps)
    imgs = sample_pixels(model, args.n, steps, seed=args.seed, base=args.base)
    if imgs.dim() == 5:  # clips (n, 3, F, H, W): each sample is its frames side by side
        imgs = imgs.permute(0, 1, 3, 2, 4).flatten(-2)
    grid = image_grid(imgs.permute(0, 2, 3, 1).numpy(), cols=math.ceil(math.sqrt(args.n)))
    h, w = imgs.shape[-2:]
    (out / "samples").mkdir(parents=True, exist_ok=True)
    write_image(out / "grid.png", grid)
    for i, img in enumerate(imgs.permute(0, 2, 3, 1).numpy()):
        write_image(out / "samples" / f"{i:03d}.png", img)
    shown = getattr(args, "out_display", out)
    print(f"wrote {shown}/grid.png and {args.n} samples ({h}x{w}, {'base' if args.base else 'adapted'})")
    return 0
