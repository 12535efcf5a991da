"""Flex-Forcing: one latent video diffusion transformer for bidirectional, autoregressive and chunked generation.

Paper: "Flex-Forcing" (ICML 2026; abstract in shared/papers/abstracts.md; no official code). It fine-tunes
Wan2.1-T2V-1.3B; here the backbone *is* Wan's, as diffusers ships it:

- **Latents**: diffusers ``AutoencoderKLWan``, causal in time (the first frame alone, then groups of the
  temporal factor: 4 in Wan2.1), trained here as stage 1 or loaded from a user's Wan VAE folder; latents are
  normalised per channel (the Wan config's ``latents_mean`` / ``latents_std``, or statistics measured here).
- **Transformer**: diffusers ``WanTransformer3DModel`` run by ``core.layers.wan.CausalWan``: per-frame
  timesteps (Wan2.2-TI2V's per-token path), a chunk-causal mask over *latent* frames (token ``i`` attends
  token ``j`` iff ``chunk(j) <= chunk(i)``; a FlexAttention block mask on CUDA), a KV cache with frame-offset
  rotary positions, and the K-projection. A user's Wan2.1 folder loads unchanged; only ``kproj.*`` is new.
- **K-projection on earlier chunks' keys**: per head, ``Pi(k) = k (1 + gamma_t) + <k, u_t> v_t`` with
  ``(gamma_t, u_t, v_t)`` linear in the *querying* chunk's time embedding, applied to the keys of earlier
  chunks (cached clean frames at inference). ``gamma`` and ``v`` start at zero (``u`` random), so the
  projection is the identity at initialisation — zeroing ``u`` too would leave the rank-one term without
  gradient (d/du ∝ v = 0 and d/dv ∝ <k, u> = 0), a saddle the spec's "zero-initialised" cannot mean.
- **Training** (``training_step``): flow matching (``x_t = (1 - t) x0 + t eps``, velocity target
  ``eps - x0``, Wan's parametrisation) with a random partition per step and independent noise per chunk, so one
  set of weights serves every schedule; a clean prefix of 1..``max_context`` latent frames (t = 0, no loss) with
  probability ``context_prob`` teaches conditioning on given / cached clean frames — the first frame of
  image-to-video is exactly such a prefix (Wan2.2-TI2V's layout). The baselines are the same class trained with
  ``chunking=one, noise=per_clip`` (bidirectional-only) or ``chunking=singletons`` (AR-only).

Sampling in every regime lives in ``perception.video.pipeline_flexforcing``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from core.diffusion import add_noise, sample_timesteps
from core.layers.vae import (
    build_autoencoder_kl_wan,
    load_autoencoder_weights,
    wan_decode,
    wan_encode,
    wan_latent_stats,
)
from core.layers.wan import CausalWan, wan_transformer_config
from core.pretrained import PreTrainedModel
from perception.video.chunking import chunk_ids, random_partition
from perception.video.configuration_flexforcing import FlexForcingConfig

if TYPE_CHECKING:
    from core.testing import ModelExample

__all__ = ["FlexForcingModel"]


def _plain_config(cfg) -> dict[str, Any]:
    """A diffusers config as a JSON-able dict (tuples as lists, private keys dropped)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(cfg).items() if not k.startswith("_")}


def _vae_source(config: FlexForcingConfig) -> str | None:
    if config.vae_path is not None:
        return config.vae_path
    if config.base_path is not None and (Path(config.base_path) / "vae" / "config.json").is_file():
        return str(Path(config.base_path) / "vae")
    return None


class FlexForcingModel(PreTrainedModel):
    """Wan VAE + ``CausalWan`` (see the module docstring). ``training_step`` takes ``{"video": (B, T, 3, H, W)
    uint8}`` (T = ``config.video_frames``) or, pre-encoded, ``{"latents": (B, F, C, h, w)}`` (normalised, as
    ``encode`` returns them); ``encode`` / ``decode`` map frames to normalised latents and back.

    With ``base_path`` / ``vae_path`` the user's folders are read here (weights included) and their diffusers
    configs recorded in ``self.config``; a checkpoint of this model rebuilds from those configs alone
    (``build_for_loading``).
    """

    config_class = FlexForcingConfig
    method = "flexforcing"

    def __init__(self, config: FlexForcingConfig):
        super().__init__()
        vae_src = _vae_source(config)
        if vae_src is not None:  # a Wan VAE folder (its config gives the sizes) or an earlier run's stage 1
            if config.vae_config is not None:
                from diffusers import AutoencoderKLWan

                self.vae = AutoencoderKLWan.from_config(config.vae_config)
            else:
                self.vae = build_autoencoder_kl_wan(config.vae_base_dim, config.latent_channels, config.vae_dim_mult,
                                                    config.vae_num_res_blocks, config.vae_temporal_downsample,
                                                    path=vae_src)
            load_autoencoder_weights(self.vae, vae_src)
        elif config.vae_config is not None:
            from diffusers import AutoencoderKLWan

            self.vae = AutoencoderKLWan.from_config(config.vae_config)
        else:
            self.vae = build_autoencoder_kl_wan(config.vae_base_dim, config.latent_channels, config.vae_dim_mult,
                                                config.vae_num_res_blocks, config.vae_temporal_downsample)
        self.vae.requires_grad_(False)
        self.load_report: dict[str, list[str]] = {}
        if config.base_path is not None:
            self.dit, missing, unexpected = CausalWan.from_pretrained(config.base_path, config.k_projection,
                                                                      config.attention)
            self.load_report = {"missing": missing, "unexpected": unexpected}
        else:
            wcfg = config.transformer_config or wan_transformer_config(
                config.num_heads, config.head_dim, config.depth, config.ffn_dim, config.latent_channels,
                config.text_dim, config.patch, config.freq_dim)
            self.dit = CausalWan.from_config(wcfg, config.k_projection, config.attention)
        z = int(self.vae.config.z_dim)
        if self.dit.in_channels != z:
            raise ValueError(f"the transformer takes {self.dit.in_channels} latent channels, the VAE gives {z}")
        config = dataclasses.replace(config, latent_channels=z, vae_config=_plain_config(self.vae.config),
                                     transformer_config=_plain_config(self.dit.transformer.config),
                                     patch=self.dit.patch)
        self.config = config
        self.register_buffer("latent_mean", torch.zeros(z))
        self.register_buffer("latent_std", torch.ones(z))
        stats = wan_latent_stats(self.vae)
        if stats is not None:  # a user's Wan VAE states its own normalisation
            self.latent_mean.copy_(stats[0])
            self.latent_std.copy_(stats[1])
        if config.init_path is not None:  # start from a checkpoint (VAE, transformer, latent statistics)
            self._load_start(config.init_path)
        if config.objective == "self_forcing":  # the Self-Forcing arm: its critic and frozen teacher
            from perception.video.self_forcing import attach

            attach(self, config)

    def _load_start(self, path: str) -> None:
        from core.resources import resolve_asset_path

        init = FlexForcingModel.from_pretrained(resolve_asset_path(path), use_ema=False)
        sd = {k: v for k, v in init.state_dict().items() if not k.startswith("critic.")}
        missing, unexpected = self.load_state_dict(sd, strict=False)
        if unexpected or missing:
            raise ValueError(f"model.init_path {path}: not this model's architecture (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")

    @classmethod
    def build_for_loading(cls, config: FlexForcingConfig) -> FlexForcingModel:
        """The architecture from the recorded diffusers configs, without reading the user's folders again."""
        if config.vae_config is not None and config.transformer_config is not None:
            config = dataclasses.replace(config, base_path=None, vae_path=None)
        # a Self-Forcing run's weights (critic included) are all in the checkpoint: read neither start again
        return cls(dataclasses.replace(config, init_path=None, teacher_path=None))

    # -- latents ------------------------------------------------------------------------------------------
    def _check_video(self, video: torch.Tensor) -> None:
        h, w = self.config.frame_hw
        if video.ndim != 5 or video.shape[2] != 3 or tuple(video.shape[-2:]) != (h, w):
            raise ValueError(f"video must be (B, T, 3, {h}, {w}), got {tuple(video.shape)}")

    @torch.no_grad()
    def encode(self, video: torch.Tensor, chunk: int = 16) -> torch.Tensor:
        """(B, T, 3, H, W) uint8 (or float in [0, 1]) frames, T = 1 + r k -> (B, 1 + k, C, h, w) normalised
        latents (causal: the first ``1 + k'`` latents only depend on the first ``1 + r k'`` frames)."""
        self._check_video(video)
        z = wan_encode(self.vae, video.to(self.latent_mean.device), chunk=chunk)
        return (z - self.latent_mean[:, None, None]) / self.latent_std[:, None, None]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int = 16) -> torch.Tensor:
        """(B, F, C, h, w) normalised latents -> (B, 1 + (F - 1) r, 3, H, W) uint8 frames."""
        z = latents.float() * self.latent_std[:, None, None] + self.latent_mean[:, None, None]
        return wan_decode(self.vae, z, chunk=chunk)

    @torch.no_grad()
    def set_latent_stats(self, video: torch.Tensor) -> None:
        """Measure the per-channel mean / std of the VAE latents of ``video`` (B, T, 3, H, W) frames."""
        self.latent_mean.zero_()
        self.latent_std.fill_(1.0)
        z = self.encode(video)
        self.latent_mean.copy_(z.mean(dim=(0, 1, 3, 4)))
        self.latent_std.copy_(z.std(dim=(0, 1, 3, 4)).clamp_min(1e-4))

    # -- training -----------------------------------------------------------------------------------------
    def sample_training_layout(self, num_frames: int, generator: torch.Generator | None = None
                               ) -> tuple[int, list[int]]:
        """(number of clean context frames, partition of all ``num_frames`` frames) for one training step.

        The context (if any) is the first chunk; ``chunking=one`` keeps everything in one chunk (full attention,
        the context frames inline).
        """
        cfg = self.config
        ctx = 0
        if cfg.max_context and float(torch.rand((), generator=generator)) < cfg.context_prob:
            ctx = int(torch.randint(1, cfg.max_context + 1, (), generator=generator))
        rest = num_frames - ctx
        if cfg.chunking == "one":
            return ctx, [num_frames]
        sizes = [1] * rest if cfg.chunking == "singletons" else random_partition(
            rest, generator, cfg.p_one_chunk, cfg.p_singletons)
        return ctx, ([ctx] if ctx else []) + sizes

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        cfg = self.config
        if cfg.objective == "self_forcing":
            from perception.video.self_forcing import training_step

            return training_step(self, batch)
        z = batch["latents"].float() if "latents" in batch else self.encode(batch["video"])
        b, t_len = z.shape[:2]
        ctx, sizes = self.sample_training_layout(t_len)
        chunks = chunk_ids(sizes, device=z.device)
        n_chunks = len(sizes)
        if cfg.noise == "per_clip":
            t = sample_timesteps((b, 1), "logit_normal", cfg.t_mean, cfg.t_std, cfg.t_shift,
                                 device=z.device).expand(b, t_len).clone()
        else:
            tc = sample_timesteps((b, n_chunks), "logit_normal", cfg.t_mean, cfg.t_std, cfg.t_shift, device=z.device)
            t = tc[:, chunks]
        t[:, :ctx] = 0.0
        noise = torch.randn_like(z)
        xt = add_noise(z, noise, t)
        frames = torch.arange(t_len, device=z.device)
        pred = self.dit(xt, t, frames, chunks if n_chunks > 1 else None)
        err = (pred.float() - (noise - z)).pow(2).mean(dim=(2, 3, 4))  # (B, T)
        loss = err[:, ctx:].mean()
        return {"loss": loss, "context_frames": torch.tensor(float(ctx)), "chunks": torch.tensor(float(n_chunks))}

    def fsdp_units(self) -> list[nn.Module]:
        """What FSDP shards unit by unit: the VAE's blocks and the transformer's blocks.

        The per-layer key projections (``dit.kproj``) stay with the root (gathered for the whole step): a step
        calls each once per chunk, and the chunking is drawn per rank, so as units of their own they would be
        gathered a different number of times on different ranks (a collective mismatch). A step with one chunk
        does not use them at all, so the task trains with ``find_unused_parameters`` (their gradient is then
        reduced as zero on that rank rather than left out, which would mismatch the reduce-scatter).
        """
        from core.layers.checkpointing import block_units

        return [m for _, m in block_units(self.vae)] + list(self.dit.blocks)

    def checkpoint_units(self) -> list[nn.Module]:
        """The blocks gradient checkpointing recomputes: the transformer's (the VAE is frozen after stage 1)."""
        return list(self.dit.blocks)

    def forward(self, *args, **kwargs):
        return self.dit(*args, **kwargs)


def tiny_config(**overrides) -> FlexForcingConfig:
    """The tests' and smoke runs' Flex-Forcing (``model=flexforcing_tiny``): small frames, a shallow Wan VAE
    pretrained a few steps, a thin Wan transformer (``overrides`` replace fields)."""
    kw = dict(frame_size=16, latent_channels=4, vae_base_dim=8, vae_dim_mult=[1, 2], vae_temporal_downsample=[False],
              vae_clip_frames=3, vae_pretrain_steps=4, patch=2, num_heads=2, head_dim=16, depth=2, ffn_dim=64,
              text_dim=16, freq_dim=32, num_frames=6, sample_steps=4, pyramid_levels=3)
    kw.update(overrides)
    return FlexForcingConfig(**kw)


def example(workdir: Path) -> ModelExample:
    """The contract test's tiny Flex-Forcing model (16 px, 2 blocks) on a fixed chunked latent clip."""
    from core.testing import ModelExample

    cfg = tiny_config()

    def build() -> FlexForcingModel:
        model = FlexForcingModel(cfg)
        g = torch.Generator().manual_seed(7)  # the zero-initialised K-projection gets values: a non-trivial function
        with torch.no_grad():
            for p in model.dit.kproj.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        return model

    def inputs() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"x": torch.randn(2, 6, 4, 8, 8, generator=g), "t": torch.rand(2, 6, generator=g),
                "frames": torch.arange(6), "chunks": torch.tensor([0, 0, 1, 1, 1, 1])}

    def train_inputs() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"video": torch.randint(0, 256, (2, 6, 3, 16, 16), generator=g, dtype=torch.uint8)}

    return ModelExample(build=build, inputs=inputs, train_inputs=train_inputs, atol=1e-6)
