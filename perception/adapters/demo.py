"""Demo section of FeRA: the shipped base (a UNet pretrained on simulator renders) and its FeRA / LoRA
adapters (64 crops of real videos, same steps) sampling from the same noise, FeRA's routing against the noise
level on held-out real crops, and the recorded comparison tables (the paper's baselines, then the newer peers:
peft's FourierFT / WaveFT and X-LoRA's routing)."""

from __future__ import annotations

from pathlib import Path

from core.demo import DemoContext, DemoSection, img_tag, table
from core.resources import asset

SHIPPED = asset("checkpoints", "fera")
PEERS = asset("samples", "fera") / "peers.md"  # the peers comparison (embodied experiment fera --arms ...)
SCALE = 3


def load_shipped(arm: str | None, folder: Path = SHIPPED):
    """The shipped base denoiser, with the adapter of ``arm`` (``fera`` / ``lora``) on it when given.

    Each arm's folder is a self-contained exported ``AdaptedDenoiser`` (its base copied into ``<arm>/base``);
    the base alone is the FeRA folder's copy. Returns ``(denoiser, FeRAModelConfig of the base)``.
    """
    from core.errors import DataError
    from core.io import read_json
    from core.pretrained import dataclass_from_dict
    from perception.adapters.backbones import load_denoiser
    from perception.adapters.configuration_fera import FeRAModelConfig
    from perception.adapters.modeling_fera import AdaptedDenoiser

    export = folder / (arm or "fera")
    if not (export / "config.json").is_file():
        raise DataError(export, "has no config.json (not a shipped FeRA model folder)")
    model_cfg = dataclass_from_dict(FeRAModelConfig, read_json(export / "config.json")["base_model"])
    model = load_denoiser(export / "base") if arm is None else AdaptedDenoiser.from_pretrained(export).denoiser
    return model.eval().requires_grad_(False), model_cfg


def _grid(imgs, cols: int = 8):
    from core.viz import image_grid

    return image_grid(imgs.permute(0, 2, 3, 1).numpy(), cols)


def demo_section(ctx: DemoContext) -> DemoSection:
    """Samples of the base and both adapters from the same noise, held-out loss, FeRA's routing, the table."""
    from perception.adapters.backbones import heldout_loss_by_level
    from perception.adapters.data import target_images
    from perception.adapters.pipeline_fera import sample_images
    from perception.adapters.task import routing_by_level

    figures, body, rows = {}, "", []
    base, model_cfg = load_shipped(None)
    test = target_images("test", model_cfg.image_size, 64, seed=0)
    body += img_tag(ctx.save_image("fera_real.png", _grid(test[:16]), SCALE),
                    "held-out real crops (target domain)", 8 * model_cfg.image_size * SCALE)
    for arm in (None, "fera", "lora"):
        model = base if arm is None else load_shipped(arm)[0]
        imgs = sample_images(model, 16, steps=model_cfg.sample_steps, seed=ctx.seed)
        name = arm or "base"
        body += img_tag(ctx.save_image(f"fera_{name}.png", _grid(imgs), SCALE),
                        f"{name}: 16 samples, same noise", 8 * model_cfg.image_size * SCALE)
        loss = heldout_loss_by_level(model, test, seed=0)
        rows.append({"model": name, **{k: round(v, 4) for k, v in loss.items()}})
        figures[f"{name}_heldout_loss"] = loss["mean"]
        if arm == "fera":
            routing = [{"t": k[1:], **{f"expert {e}": round(w, 3) for e, w in enumerate(v)}}
                       for k, v in routing_by_level(model, test, [0.1, 0.3, 0.5, 0.7, 0.9]).items()]
    body += "<h4>held-out denoising loss (64 real crops, fixed noise) by noise level t</h4>" + table(rows)
    body += "<h4>FeRA's mean routing weights by noise level (the indicator reads the noisy latent)</h4>"
    body += table(routing)
    comparison = SHIPPED / "comparison.md"
    if comparison.is_file():
        body += "<h4>recorded comparison (embodied experiment fera; mean ± sd over seeds)</h4>"
        body += f"<pre>{comparison.read_text()}</pre>"
    if PEERS.is_file():
        body += ("<h4>recorded comparison with the newer peers (peft's FourierFT and WaveFT, X-LoRA's routing; "
                 "DiT 32 px, equal trainable parameters; mean ± sd over seeds)</h4>")
        body += f"<pre>{PEERS.read_text()}</pre>"
    return DemoSection(
        title="FeRA: frequency-energy routed adapters for diffusion fine-tuning (perception/adapters)",
        lead=f"A {model_cfg.kind} flow-matching model pretrained on simulator renders ({model_cfg.image_size} px), "
             "adapted with 64 crops of real videos by FeRA (3 routed rank-4 LoRA experts, FECL) and by peft's "
             "LoRA at the same parameter count. Samples share their noise across models.",
        body=body, figures=figures)
