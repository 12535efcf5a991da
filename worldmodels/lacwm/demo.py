"""Demo section of LAC-WM / EAC-WM: imagined vs real rollouts on the held-out embodiment, side by side.

Uses the shipped checkpoints (``assets/checkpoints/{lacwm,eacwm}``: adapted to Panda+InspireHand) and
records one fresh episode of the held-out embodiment (a new seed) to compare against; no training.
"""

from __future__ import annotations

import numpy as np

from core.demo import DemoContext, DemoSection, table, video_tag
from core.resources import asset

ASSETS = asset("checkpoints")
HELD_OUT_ENV = "embodied/Reach-PandaInspireHand-v0"


def _to_uint8(x) -> np.ndarray:
    """(T, 3, H, W) float in [-1, 1] -> (T, H, W, 3) uint8."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()


def demo_section(ctx: DemoContext) -> DemoSection:
    import torch

    from core.data.video import write_mp4
    from sim.recorder import record_rollout
    from sim.rollout import RolloutConfig
    from worldmodels.lacwm.data import TransitionDataset
    from worldmodels.lacwm.metrics import rollout_error
    from worldmodels.lacwm.modeling_lacwm import WorldModel

    models = {name: WorldModel.from_pretrained(ASSETS / name) for name in ("lacwm", "eacwm")
              if (ASSETS / name).exists()}
    if not models:
        return DemoSection(title="LAC-WM / EAC-WM (worldmodels/lacwm)", lead="no shipped checkpoint found",
                           body="", figures={})
    cfg = next(iter(models.values())).config
    # the camera of the frames it was trained on
    camera = (next(iter(models.values())).loaded_from["config"].get("data") or {}).get("camera")
    # the whole 45 steps even after the target is reached: the window below needs 6 x frame_skip + 1 steps
    env_kwargs = {"image_size": cfg.image_size, "terminate_on_success": False, **({"camera": camera} if camera else {})}
    rec = record_rollout(RolloutConfig(env_id=HELD_OUT_ENV, episodes=1, seed=ctx.seed + 900, policy="scripted",
                                       noise=0.1, env_kwargs=env_kwargs, max_episode_steps=45,
                                       progress=False), ctx.path("lacwm", "real"), video=False)
    horizon = 6
    ds = TransitionDataset([rec.summary["hdf5"]], context=horizon, skip=cfg.frame_skip)
    emb = ds.embodiments[0]
    sample = ds[len(ds) // 2]
    real = sample["frames"].float() / 127.5 - 1  # (K+1, 3, H, W)
    panels = [_to_uint8(real[1:])]
    rows = []
    for name, model in models.items():
        with torch.no_grad():
            im = model.imagine(sample["frames"][None, 0], model.action_encoder(emb)(sample["actions"][None].float()))
        panels.append(_to_uint8(im[0]))
        r = rollout_error(model, ds, emb, horizon=horizon, max_samples=32)
        rows.append({"model": name, "psnr@1": r["model"]["psnr"][0], f"psnr@{horizon}": r["model"]["psnr"][-1],
                     "shuffled@1": r["shuffled"]["psnr"][0], "copy_last@1": r["copy_last"]["psnr"][0]})
    side = np.concatenate(panels, axis=2)  # (T, H, W * (1 + models), 3): real | LAC-WM | EAC-WM
    side = side.repeat(4, axis=1).repeat(4, axis=2)
    video = write_mp4(ctx.path("lacwm", "imagined_vs_real.mp4"), side, fps=4)
    names = " | ".join(["real", *models])
    body = video_tag(ctx.rel(video), f"{names} ({horizon} transitions of {cfg.frame_skip} steps)", 512) + table(rows)
    return DemoSection(
        title="LAC-WM and EAC-WM world models (worldmodels/lacwm)",
        lead="Shipped checkpoints adapted to the held-out Panda+InspireHand from a few demonstrations: imagined "
             "rollouts from one real frame under the real actions, next to the real episode (new seed).",
        body=body,
        figures={f"{r['model']}_psnr@1": r["psnr@1"] for r in rows},
    )
