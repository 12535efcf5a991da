"""Image auto-encoders for latent diffusion.

A diffusers ``AutoencoderKL`` built from sizes or a local folder, weight loading from a diffusers folder or a
project checkpoint, and a training wrapper for the core Trainer.

At tiny scale nothing pretrained is installed (no SD / TAESD VAE, see ENV.md), so methods train the VAE here
as stage 1 (``AutoencoderTrainer``); at paper scale ``path`` points at a real diffusers VAE folder and the
same class loads it. Latents are normalised by the caller with per-channel statistics measured on data.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.errors import CheckpointError

__all__ = ["AutoencoderTrainer", "build_autoencoder_kl", "load_autoencoder_weights", "to_signed_unit"]

_DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model.safetensors", "model.safetensors")


def to_signed_unit(x: torch.Tensor) -> torch.Tensor:
    """Integer [0, 255] images (uint8) -> float32 in [-1, 1]; float images are taken to be in [0, 1]."""
    if not torch.is_floating_point(x):
        return x.float() / 127.5 - 1.0
    return x.float() * 2 - 1


def build_autoencoder_kl(block_out_channels: Sequence[int] = (32, 64, 64), latent_channels: int = 4,
                         layers_per_block: int = 1, norm_num_groups: int = 8, sample_size: int = 32,
                         path: str | Path | None = None, scaling_factor: float = 0.18215) -> nn.Module:
    """A diffusers ``AutoencoderKL`` (downsampling ``2 ** (len(block_out_channels) - 1)``).

    With ``path`` a diffusers VAE folder (``config.json`` of an ``AutoencoderKL``), its architecture is used
    instead of the sizes (weights are loaded separately by ``load_autoencoder_weights``).
    """
    from diffusers import AutoencoderKL

    if path is not None and (Path(path) / "config.json").is_file():
        cfg = dict(AutoencoderKL.load_config(str(path)))
        if cfg.get("_class_name", "AutoencoderKL") == "AutoencoderKL" and "latent_channels" in cfg:
            return AutoencoderKL.from_config(cfg)
    n = len(block_out_channels)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * n,
                         up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=tuple(block_out_channels),
                         layers_per_block=layers_per_block, latent_channels=latent_channels,
                         norm_num_groups=norm_num_groups, sample_size=sample_size, scaling_factor=scaling_factor)


def load_autoencoder_weights(vae: nn.Module, path: str | Path, prefix: str = "vae.") -> float | None:
    """Load ``vae`` from a diffusers folder or from a project checkpoint / run directory.

    A diffusers folder holds ``config.json`` + ``diffusion_pytorch_model.safetensors``; a checkpoint's
    ``model.safetensors`` holds ``<prefix>*`` keys (a stage-1 run, or a whole model that contains the VAE).
    Every key and shape must match (``CheckpointError`` names them).

    Returns:
        The latent scale the source states: a diffusers folder's ``scaling_factor``; a checkpoint's scalar
        ``latent_std`` buffer (as ``1 / latent_std``) or ``latent_scale``; None when it states none.
    """
    import json

    from core.checkpoint import load_into, load_weights, resolve_checkpoint

    path = Path(path)
    if (path / "config.json").is_file() and not (path / "training_state.json").exists():
        for name in _DIFFUSERS_WEIGHTS:
            f = path / name
            if f.is_file() and not any(k.startswith(prefix) for k in _keys(f)):
                load_into(vae, load_weights(f), str(f))
                return float(json.loads((path / "config.json").read_text()).get("scaling_factor", 0.18215))
    ckpt = resolve_checkpoint(path)
    sd = load_weights(ckpt / "model.safetensors")
    sub = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    if not sub:
        raise CheckpointError(f"{ckpt}: holds no {prefix}* weights")
    load_into(vae, sub, str(ckpt))
    if "latent_std" in sd and sd["latent_std"].numel() == 1:
        return float(1.0 / sd["latent_std"].clamp_min(1e-6))
    if "latent_scale" in sd and sd["latent_scale"].numel() == 1:
        return float(sd["latent_scale"])
    return None


def _keys(file: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        return set(f.keys())


class AutoencoderTrainer(nn.Module):
    """Stage 1: ``vae`` trained as an auto-encoder (L1 + ``kl_weight`` x KL) on the images under ``key``.

    ``sample_posterior=False`` decodes the posterior mean (a deterministic auto-encoder; the KL term then only
    keeps the latents small): at tiny scale and few steps it reconstructs far better than decoding samples,
    whose noise (std 1 until the encoder learns to shrink it) the decoder must first learn to ignore.

    ``batch[key]`` is (B, ..., 3, H, W) uint8 or float; leading dims (e.g. frames) are flattened. The weights
    are saved under ``vae.*`` so ``load_autoencoder_weights(run_dir)`` reads them back.
    """

    def __init__(self, vae: nn.Module, key: str = "video", kl_weight: float = 1e-6, sample_posterior: bool = True):
        super().__init__()
        self.vae, self.key, self.kl_weight, self.sample_posterior = vae, key, kl_weight, sample_posterior

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The loss (L1 reconstruction + ``kl_weight`` KL) of one batch, with its terms for logging."""
        x = batch[self.key]
        x = to_signed_unit(x.reshape(-1, *x.shape[-3:]))
        post = self.vae.encode(x).latent_dist
        z = post.sample() if self.sample_posterior else post.mode()
        rec = self.vae.decode(z).sample.float()
        loss_rec = (rec - x).abs().mean()
        kl = post.kl().mean() / z[0].numel()
        return {"loss": loss_rec + self.kl_weight * kl, "loss_rec": loss_rec.detach(), "kl": kl.detach()}
