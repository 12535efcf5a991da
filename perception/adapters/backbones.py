"""Small pixel-space flow-matching diffusion models on diffusers backbones: the base models FeRA adapts.

FeRA (frequency-energy routed adapters) fine-tunes a pretrained diffusion model with low-rank experts on its
attention projections. The experiment needs base models small enough to pretrain here, with the attention
layout of the real ones, so the two backbones are the diffusers classes themselves at toy width:

- ``kind="unet"``: ``diffusers.UNet2DConditionModel`` (the Stable-Diffusion family). Layout as SD: down
  blocks ``CrossAttnDownBlock2D`` at every level but the last (``DownBlock2D``), the mirror for the up
  blocks, and a cross-attention mid block, so attention lives at both resolutions (full resolution in the
  outer blocks, the lowest in the mid block). ``attention_levels`` moves it (see below).
- ``kind="dit"``: ``diffusers.DiTTransformer2DModel`` (adaLN-Zero DiT), one class (``num_embeds_ada_norm=1``,
  label 0 always), ``out_channels = channels`` (no learned-sigma half to slice off).

Both expose ``Attention`` modules with ``to_q`` / ``to_k`` / ``to_v`` / ``to_out.0`` linears, the names
FeRA's experts attach to.

Conventions and choices:

- Pixel space, no VAE: images are ``(B, C, H, W)`` float in ``[-1, 1]``; ``H = W = image_size``.
- Flow matching as everywhere in the workspace (:mod:`core.diffusion`): ``x_t = (1 - t) x0 + t eps``, the
  network predicts ``v = eps - x0``, ``t = 1`` is pure noise, ``t`` in ``[0, 1]``. The backbones were
  written for DDPM step indices, so they see ``timestep = 1000 t`` (a float; both embed it sinusoidally).
- The backbone is always called with the noisy image as a keyword (``sample=`` for the UNet,
  ``hidden_states=`` for the DiT): FeRA's router reads it from a forward pre-hook on ``self.backbone``.
- Unconditional: the UNet's cross-attention attends to a learned null context of ``context_tokens`` tokens
  ``(1, T, cross_attention_dim)`` (broadcast to the batch; 4 by default). With a single key token the softmax
  would be identically 1: ``attn2`` would add the same vector at every pixel and ``attn2.to_q`` / ``to_k`` (and
  any adapter on them) would get no gradient. With several tokens the pixels attend to a learned memory. The
  DiT gets class label 0; its label dropout (diffusers' classifier-free-guidance default, 10 %) is switched
  off, so training draws no extra random numbers and never sees the unused null label.
- ``attention_head_dim`` is the width of one head for both kinds. (diffusers' UNet argument of that name is,
  for historical reasons, the number of heads; we pass ``channels // attention_head_dim`` per level.)

Folders: ``FlowDenoiser`` is a ``core.pretrained.PreTrainedModel`` (config: ``BackboneConfig``), so a base
exports with ``denoiser.save_pretrained(DIR, run_config=BASE_RUN_CONFIG)`` (``model.safetensors`` +
``config.json`` + ``README.md``). ``load_denoiser(DIR)`` is the one reader of a base: such a folder, or the base's
training run folder (its newest checkpoint), opened read-only, frozen.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.diffusion import add_noise, sample_timesteps, velocity_target
from core.pretrained import PreTrainedModel
from perception.adapters.configuration_fera import KINDS, BackboneConfig

__all__ = [
    "KINDS",
    "BackboneConfig",
    "BASE_RUN_CONFIG",
    "FlowDenoiser",
    "build_backbone",
    "heldout_loss_by_level",
    "load_denoiser",
]

TIMESTEP_SCALE = 1000.0  # the backbones' timestep embeddings expect DDPM-style indices in [0, 1000]
#: The rest of a base folder's ``config.json`` (beside ``model``): what it is. Not a method's model of its own
#: (``load_pretrained`` of it says so); ``load_denoiser`` reads it.
BASE_RUN_CONFIG = {"method": "fera", "stage": "base"}


def build_backbone(cfg: BackboneConfig) -> nn.Module:
    """The diffusers model for ``cfg``: maps ``(B, C, H, W)`` noisy images to ``(B, C, H, W)`` velocities."""
    if cfg.kind == "unet":
        from diffusers import UNet2DConditionModel

        attn = cfg.unet_attention_levels
        down = tuple("CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attn)
        up = tuple("CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attn))
        return UNet2DConditionModel(
            sample_size=cfg.image_size,
            in_channels=cfg.channels,
            out_channels=cfg.channels,
            down_block_types=down,
            up_block_types=up,
            block_out_channels=tuple(cfg.block_out_channels),
            layers_per_block=cfg.layers_per_block,
            # diffusers' (mis)named argument is the number of heads per level; see the module docstring.
            attention_head_dim=[c // cfg.attention_head_dim for c in cfg.block_out_channels],
            cross_attention_dim=cfg.cross_attention_dim,
            norm_num_groups=cfg.norm_num_groups,
        )
    from diffusers import DiTTransformer2DModel
    from diffusers.models.embeddings import LabelEmbedding

    model = DiTTransformer2DModel(
        num_attention_heads=cfg.dit_heads,
        attention_head_dim=cfg.dit_head_dim,
        in_channels=cfg.channels,
        out_channels=cfg.channels,
        num_layers=cfg.dit_layers,
        sample_size=cfg.image_size,
        patch_size=cfg.patch_size,
        num_embeds_ada_norm=1,
    )
    for m in model.modules():
        if isinstance(m, LabelEmbedding):
            m.dropout_prob = 0.0  # one class, no classifier-free guidance: label 0 always
    return model


def _as_model_images(images: Tensor) -> Tensor:
    """uint8 ``[0, 255]`` -> float ``[-1, 1]``; float images are returned as they are."""
    return images.float() / 127.5 - 1.0 if images.dtype == torch.uint8 else images


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


class FlowDenoiser(PreTrainedModel):
    """Unconditional velocity predictor ``v(x_t, t)`` in pixel space on a diffusers backbone.

    Usable by :class:`core.trainer.Trainer` (``training_step``) for pretraining the base model. A base, not a
    method's model (``method`` is None): FeRA's adapted model (``modeling_fera.AdaptedDenoiser``) wraps it.
    """

    config_class = BackboneConfig

    def __init__(self, config: BackboneConfig):
        super().__init__()
        self.config = config
        self.backbone = build_backbone(config)
        if config.kind == "unet":
            # Learned null context, (1, T, D); expanded to (B, T, D) as encoder_hidden_states.
            self.context = nn.Parameter(torch.randn(1, config.context_tokens, config.cross_attention_dim))

    def forward(self, x_t: Tensor, t: Tensor | float) -> Tensor:
        """Predicted velocity ``eps - x0``.

        Args:
            x_t: Noisy images ``(B, C, H, W)``.
            t: Noise levels in ``[0, 1]``, ``(B,)`` (or a scalar / float shared by the batch).

        Returns:
            ``(B, C, H, W)`` velocity, in the backbone's output dtype.
        """
        b = x_t.shape[0]
        t = torch.as_tensor(t, device=x_t.device, dtype=torch.float32)
        timestep = (t.expand(b) if t.ndim == 0 else t.reshape(b)) * TIMESTEP_SCALE
        if self.config.kind == "unet":
            ctx = self.context.expand(b, -1, -1).to(x_t.dtype)
            return self.backbone(sample=x_t, timestep=timestep, encoder_hidden_states=ctx, return_dict=False)[0]
        labels = torch.zeros(b, dtype=torch.long, device=x_t.device)
        return self.backbone(hidden_states=x_t, timestep=timestep, class_labels=labels, return_dict=False)[0]

    def noisy_batch(
        self, x0: Tensor, generator: torch.Generator | None = None, t: Tensor | float | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """A training triple for clean images ``x0`` ``(B, C, H, W)`` in ``[-1, 1]``.

        Args:
            x0: Clean images.
            generator: RNG for ``t`` (when drawn) and the noise; drawn on its device, moved to ``x0``'s.
            t: Noise levels ``(B,)`` or a float for all; default logit-normal(0, 1) from ``sample_timesteps``.

        Returns:
            ``(x_t, t, target)``: noisy images, the ``(B,)`` float32 levels, the velocity target ``eps - x0``.
        """
        b = x0.shape[0]
        if t is None:
            t = sample_timesteps((b,), generator=generator, device=x0.device)
        else:
            t = torch.as_tensor(t, dtype=torch.float32, device=x0.device)
            t = t.expand(b).clone() if t.ndim == 0 else t
        draw_device = generator.device if generator is not None else x0.device
        noise = torch.randn(x0.shape, generator=generator, device=draw_device, dtype=x0.dtype).to(x0.device)
        return add_noise(x0, noise, t), t, velocity_target(x0, noise)

    def training_step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``{"loss": MSE(v_pred, eps - x0)}`` for ``batch["image"]`` ``(B, C, H, W)`` in ``[-1, 1]``."""
        x_t, t, target = self.noisy_batch(batch["image"])
        pred = self(x_t, t)
        return {"loss": F.mse_loss(pred.float(), target.float())}


def load_denoiser(path: str | Path) -> FlowDenoiser:
    """The base denoiser of a folder, read-only: frozen, in eval mode, on the CPU.

    Args:
        path: A ``FlowDenoiser.save_pretrained`` folder, a training checkpoint, or the base's training run folder
            (its newest checkpoint).

    Raises:
        CheckpointError: No checkpoint there, no architecture in its ``config.json``, an adapted model's folder
            instead of a base's, or weights that do not fit (strict: every key and shape).
    """
    from core.checkpoint import MODEL_FILE, load_into, load_weights, resolve_checkpoint
    from core.errors import CheckpointError
    from core.pretrained import dataclass_from_dict, read_config

    ckpt = resolve_checkpoint(path)
    config = read_config(ckpt)
    section = config.get("model")
    if not isinstance(section, dict):
        raise CheckpointError(f"{ckpt}/config.json has no 'model' section (not a FeRA base denoiser folder)")
    if "adapter" in section:
        raise CheckpointError(f"{ckpt}: an adapted model's folder, not a base denoiser (load it with "
                              "perception.adapters.modeling_fera.AdaptedDenoiser.from_pretrained)")
    try:
        cfg = dataclass_from_dict(BackboneConfig, section)
    except CheckpointError as e:
        raise CheckpointError(f"{ckpt}/config.json: {e}") from None
    model = FlowDenoiser(cfg)
    load_into(model, load_weights(ckpt / MODEL_FILE), source=str(ckpt / MODEL_FILE))
    model.loaded_from = {"path": str(ckpt), "weights": MODEL_FILE, "config": config}
    return model.eval().requires_grad_(False)


@torch.no_grad()
def heldout_loss_by_level(
    model: nn.Module,
    images: Tensor,
    levels: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
    seed: int = 0,
    batch_size: int = 64,
) -> dict[str, float]:
    """Velocity MSE at fixed noise levels on held-out images, with fixed noise: comparable across models.

    The noise is one ``(N, C, H, W)`` draw from a CPU ``torch.Generator`` seeded ``seed``, shared by every
    level and every model evaluated with the same ``seed``, so differences come from the models only.

    Args:
        model: ``model(x_t, t) -> v`` (a :class:`FlowDenoiser` or anything that wraps one).
        images: ``(N, C, H, W)`` uint8 in ``[0, 255]`` or float in ``[-1, 1]``.
        levels: Noise levels ``t`` in ``[0, 1]``.
        seed: Seed of the noise.
        batch_size: Images per forward pass.

    Returns:
        ``{"t0.1": mse, ..., "mean": mean over levels}`` (per-element MSE averaged over all images).
    """
    return fixed_level_mse(model, images, add_noise, lambda x0, eps, t: velocity_target(x0, eps), levels, seed,
                           batch_size, prepare=_as_model_images)


@torch.no_grad()
def fixed_level_mse(model: nn.Module, clean: Tensor, noisy, target, levels: Sequence[float], seed: int,
                    batch_size: int, prepare=None) -> dict[str, float]:
    """The loop of ``heldout_velocity_mse`` and ``latent.latent_heldout_loss``: the MSE of ``model(x_t, t)`` to
    ``target(x0, eps, t)`` at each fixed level, ``x_t = noisy(x0, eps, t)``, with one fixed noise draw (a CPU
    generator seeded ``seed``) shared by every level; ``prepare`` maps a slice of ``clean`` to model inputs.
    Returns ``{"t<level>": per-element MSE, ..., "mean"}``; the model's train / eval mode is restored."""
    was_training = model.training
    model.eval()
    device = _model_device(model)
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    out: dict[str, float] = {}
    try:
        for level in levels:
            total = 0.0
            for i in range(0, clean.shape[0], batch_size):
                x0 = clean[i:i + batch_size]
                x0 = (prepare(x0) if prepare is not None else x0).to(device, torch.float32)
                eps = noise[i:i + batch_size].to(device)
                t = torch.full((x0.shape[0],), float(level), device=device)
                pred = model(noisy(x0, eps, t), t).float()
                total += float((pred - target(x0, eps, t)).pow(2).sum(dtype=torch.float64))
            out[f"t{level:g}"] = total / max(clean.numel(), 1)
    finally:
        model.train(was_training)
    out["mean"] = sum(out.values()) / max(len(out), 1)
    return out
