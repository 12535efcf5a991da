"""Flex-Forcing: one latent video diffusion transformer for bidirectional, autoregressive and chunked generation.

Paper: "Flex-Forcing" (ICML 2026; abstract in shared/papers/abstracts.md; no official code). Reading of the
method (spec: shared/specs/flexforcing.md), at the scale of this workspace:

- **Latents**: a diffusers ``AutoencoderKL`` applied per frame (trained here as stage 1, or loaded from a local
  folder via ``vae_path``); latents are normalised per channel with statistics measured on training frames.
- **Video DiT** (``VideoDiT``): latent frames are patchified to tokens (frame-major order), every token is
  conditioned through adaLN-Zero on *its frame's* noise-level embedding (per-frame timesteps, as in Diffusion
  Forcing), positions are 3-D rotary (frame, row, column) so attention depends on offsets only.
- **Chunk-causal attention**: the frames of a forward pass carry chunk ids; token ``i`` may attend token ``j``
  iff ``chunk(j) <= chunk(i)`` (``chunking.chunk_mask``). Frames held in a ``KVCache`` count as earlier chunks
  and are visible to every query; a chunk-by-chunk pass with the cache equals one masked forward pass.
- **K-projection on earlier chunks' keys**: per head, ``Pi(k) = k (1 + gamma_t) + <k, u_t> v_t`` with
  ``(gamma_t, u_t, v_t)`` a linear function of the *querying* chunk's noise-level embedding, applied to the keys
  of earlier chunks (cached clean frames at inference). ``gamma`` and ``v`` start at zero (``u`` random), so the
  projection is the identity at initialisation — zeroing ``u`` too would leave the rank-one term without
  gradient (d/du ∝ v = 0 and d/dv ∝ <k, u> = 0), a saddle the spec's "zero-initialised" cannot mean.
- **Training** (``training_step``): flow matching (``x_t = (1 - t) x0 + t eps``, velocity target
  ``eps - x0``) with a random partition per step and independent noise per chunk, so one set of weights serves
  every schedule; a clean prefix of 1..``max_context`` frames (t = 0, no loss) with probability
  ``context_prob`` teaches conditioning on given / cached clean frames. The baselines are the same class
  trained with ``chunking=one, noise=per_clip`` (bidirectional-only) or ``chunking=singletons`` (AR-only).

Sampling in every regime lives in ``perception.video.sampling``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from core.diffusion import add_noise, sample_timesteps
from core.layers.dit import DiTBlock, FinalLayer, RotaryEmbedding, TimestepEmbedder, rope_attention
from core.layers.kv_cache import KVCache
from core.layers.vae import build_autoencoder_kl, to_signed_unit
from core.pretrained import PreTrainedModel
from perception.video.chunking import chunk_ids, chunk_mask, random_partition
from perception.video.configuration_flexforcing import FlexForcingConfig

if TYPE_CHECKING:
    from core.testing import ModelExample

__all__ = ["FlexForcingModel", "VideoDiT"]


class VideoDiT(nn.Module):
    """Latent video DiT with per-frame timesteps, chunk-causal attention, a KV cache and the K-projection.

    Args:
        in_channels: Latent channels ``C``.
        patch: Spatial patch size ``p`` (latent pixels per token side).
        dim, depth, num_heads, mlp_ratio: Transformer sizes.
        k_projection: Add the per-block projection of earlier chunks' keys.
    """

    def __init__(self, in_channels: int, patch: int, dim: int, depth: int, num_heads: int, mlp_ratio: float = 4.0,
                 k_projection: bool = False):
        super().__init__()
        self.in_channels, self.patch, self.dim, self.num_heads = in_channels, patch, dim, num_heads
        self.head_dim = dim // num_heads
        self.patch_embed = nn.Linear(in_channels * patch * patch, dim)
        self.t_embedder = TimestepEmbedder(dim)
        self.rope = RotaryEmbedding(self.head_dim, 3)
        self.blocks = nn.ModuleList(DiTBlock(dim, num_heads, mlp_ratio) for _ in range(depth))
        self.final = FinalLayer(dim, in_channels * patch * patch)
        self.kproj = None
        if k_projection:
            self.kproj = nn.ModuleList(nn.Linear(dim, num_heads * (1 + 2 * self.head_dim)) for _ in range(depth))
            for lin in self.kproj:
                w = lin.weight.view(num_heads, 1 + 2 * self.head_dim, dim)
                b = lin.bias.view(num_heads, 1 + 2 * self.head_dim)
                with torch.no_grad():
                    w[:, 0].zero_()  # gamma
                    b[:, 0].zero_()
                    w[:, 1 + self.head_dim:].zero_()  # v
                    b[:, 1 + self.head_dim:].zero_()
        nn.init.xavier_uniform_(self.patch_embed.weight)
        nn.init.zeros_(self.patch_embed.bias)

    # -- tokens <-> latents -------------------------------------------------------------------------
    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, F, C, h, w) -> (B, F * h/p * w/p, C p p), frame-major, then row-major."""
        b, f, c, h, w = x.shape
        p = self.patch
        x = x.reshape(b, f, c, h // p, p, w // p, p).permute(0, 1, 3, 5, 2, 4, 6)
        return x.reshape(b, f * (h // p) * (w // p), c * p * p)

    def unpatchify(self, tokens: torch.Tensor, f: int, h: int, w: int) -> torch.Tensor:
        b, p, c = tokens.shape[0], self.patch, self.in_channels
        x = tokens.reshape(b, f, h // p, w // p, c, p, p).permute(0, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, f, c, h, w)

    def positions(self, frames: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """(F,) frame indices -> (F * h/p * w/p, 3) (frame, row, column) token positions."""
        gh, gw = h // self.patch, w // self.patch
        rows = torch.arange(gh, device=frames.device).repeat_interleave(gw)
        cols = torch.arange(gw, device=frames.device).repeat(gh)
        n = gh * gw
        return torch.stack([frames.repeat_interleave(n), rows.repeat(len(frames)), cols.repeat(len(frames))], 1)

    def _kproj_params(self, temb: torch.Tensor, layer: int):
        """(B, D) chunk embedding -> gamma (B, h, 1, 1), u (B, h, 1, d), v (B, h, 1, d)."""
        prm = self.kproj[layer](temb).view(-1, self.num_heads, 1, 1 + 2 * self.head_dim)
        return prm[..., :1], prm[..., 1:1 + self.head_dim], prm[..., 1 + self.head_dim:]

    @staticmethod
    def project_keys(k: torch.Tensor, params) -> torch.Tensor:
        """``Pi(k) = k (1 + gamma) + <k, u> v`` per head."""
        gamma, u, v = params
        return k * (1 + gamma) + (k * u).sum(-1, keepdim=True) * v

    # -- forward --------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, t: torch.Tensor, frames: torch.Tensor, chunks: torch.Tensor | None = None,
                caches: Sequence[KVCache] = (), return_kv: bool = False):
        """Velocity of latent frames ``x`` at noise levels ``t``.

        Args:
            x: (B, F, C, h, w) noisy latent frames.
            t: (B, F) noise level of every frame (0 = clean).
            frames: (F,) time index of every frame (rotary positions; any order, any offset).
            chunks: (F,) chunk ids (generation order) for the chunk-causal mask; None = one chunk.
            caches: KV caches whose tokens every query may attend (earlier chunks: clean cached frames, or the
                earlier chunks of the same denoising step).
            return_kv: Also return per-layer ``(k, v)`` of these frames (pre-rotary keys) for a cache.

        Returns:
            (B, F, C, h, w) velocity; with ``return_kv``, ``(velocity, [(k, v) per layer])``.
        """
        b, f, c, h, w = x.shape
        if t.shape != (b, f) or frames.shape != (f,):
            raise ValueError(f"t must be (B, F) = {(b, f)} and frames ({f},), got {tuple(t.shape)}, "
                             f"{tuple(frames.shape)}")
        if c != self.in_channels or h % self.patch or w % self.patch:
            raise ValueError(f"latents must have {self.in_channels} channels and sides divisible by {self.patch}, "
                             f"got {tuple(x.shape)}")
        n_per = (h // self.patch) * (w // self.patch)
        tokens = self.patch_embed(self.patchify(x))
        temb = self.t_embedder(t)  # (B, F, D)
        cond = temb.repeat_interleave(n_per, dim=1)
        pos = self.positions(frames, h, w)
        rope_new = self.rope(pos)
        ctx = [cc for cc in caches if cc.num_tokens]
        rope_ctx = self.rope(torch.cat([cc.positions for cc in ctx]).to(x.device)) if ctx else None
        tok_chunks = None if chunks is None else chunks.to(x.device).repeat_interleave(n_per)
        uniq = [0] if chunks is None else torch.unique(chunks).tolist()
        chunk_emb = {}
        if self.kproj is not None and (ctx or len(uniq) > 1):
            for cid in uniq:
                sel = torch.ones(f, dtype=torch.bool, device=x.device) if chunks is None else chunks.to(x.device) == cid
                chunk_emb[cid] = self.t_embedder(t[:, sel].mean(1))
        # Everything that does not depend on the layer is built once here, not in every block's attention.
        m = sum(cc.num_tokens for cc in ctx)
        rope_k = (torch.cat([rope_ctx[0], rope_new[0]]), torch.cat([rope_ctx[1], rope_new[1]])) if ctx else rope_new
        mask = None  # (N, M + N) bool: cached tokens visible to all, chunk-causal among the new ones
        if tok_chunks is not None and len(uniq) > 1:
            mask = chunk_mask(tok_chunks)
            if m:
                mask = torch.cat([mask.new_ones(mask.shape[0], m), mask], 1)
        rows = {cid: slice(None) if tok_chunks is None else tok_chunks == cid for cid in uniq}
        earlier = {cid: None if tok_chunks is None else (tok_chunks < cid)[None, None, :, None] for cid in uniq}
        kv_out: list[tuple[torch.Tensor, torch.Tensor]] = []

        def attend_for(layer: int):
            def attend(q, k, v):
                kv_out.append((k, v))
                ck = torch.cat([cc.keys[layer] for cc in ctx], 2) if ctx else None
                vals = torch.cat([cc.values[layer] for cc in ctx] + [v], 2) if ctx else v
                if not chunk_emb:
                    keys = torch.cat([ck, k], 2) if ctx else k
                    return rope_attention(q, keys, vals, rope_new, rope_k, mask)
                out = torch.empty_like(q)
                for cid in uniq:
                    params = self._kproj_params(chunk_emb[cid], layer)
                    r = rows[cid]
                    kk = k if earlier[cid] is None else torch.where(earlier[cid], self.project_keys(k, params), k)
                    keys = torch.cat([self.project_keys(ck, params), kk], 2) if ctx else kk
                    out[:, :, r] = rope_attention(q[:, :, r], keys, vals, (rope_new[0][r], rope_new[1][r]), rope_k,
                                                  None if mask is None else mask[r])
                return out
            return attend

        for i, block in enumerate(self.blocks):
            tokens = block(tokens, cond, attend_for(i))
        out = self.unpatchify(self.final(tokens, cond), f, h, w)
        if return_kv:
            return out, kv_out
        return out


class FlexForcingModel(PreTrainedModel):
    """Per-frame VAE + ``VideoDiT`` (see the module docstring). ``training_step`` takes ``{"video": (B, T, 3, H,
    W) uint8}`` or, pre-encoded, ``{"latents": (B, T, C, h, w)}`` (normalised, as ``encode`` returns them);
    ``encode`` / ``decode`` map frames to normalised latents and back."""

    config_class = FlexForcingConfig
    method = "flexforcing"

    def __init__(self, config: FlexForcingConfig):
        super().__init__()
        self.config = config
        self.vae = build_autoencoder_kl(config.vae_channels, config.latent_channels, config.vae_layers_per_block,
                                        config.vae_norm_groups, config.frame_size, config.vae_path)
        self.vae.requires_grad_(False)
        self.register_buffer("latent_mean", torch.zeros(config.latent_channels))
        self.register_buffer("latent_std", torch.ones(config.latent_channels))
        self.dit = VideoDiT(config.latent_channels, config.patch, config.dim, config.depth, config.num_heads,
                            config.mlp_ratio, config.k_projection)

    # -- latents ------------------------------------------------------------------------------------------
    def _check_video(self, video: torch.Tensor) -> None:
        s = self.config.frame_size
        if video.ndim != 5 or video.shape[2] != 3 or tuple(video.shape[-2:]) != (s, s):
            raise ValueError(f"video must be (B, T, 3, {s}, {s}), got {tuple(video.shape)}")

    @torch.no_grad()
    def encode(self, video: torch.Tensor, chunk: int = 256) -> torch.Tensor:
        """(B, T, 3, H, W) uint8 (or float in [0, 1]) frames -> (B, T, C, h, w) normalised latents."""
        self._check_video(video)
        b, t = video.shape[:2]
        flat = to_signed_unit(video.reshape(b * t, *video.shape[2:]).to(self.latent_mean.device))
        z = torch.cat([self.vae.encode(flat[i:i + chunk]).latent_dist.mode() for i in range(0, len(flat), chunk)])
        z = (z.float() - self.latent_mean[:, None, None]) / self.latent_std[:, None, None]
        return z.reshape(b, t, *z.shape[1:])

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int = 256) -> torch.Tensor:
        """(B, T, C, h, w) normalised latents -> (B, T, 3, H, W) uint8 frames."""
        b, t = latents.shape[:2]
        z = latents.reshape(b * t, *latents.shape[2:]).float()
        z = z * self.latent_std[:, None, None] + self.latent_mean[:, None, None]
        x = torch.cat([self.vae.decode(z[i:i + chunk]).sample for i in range(0, len(z), chunk)])
        x = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return x.reshape(b, t, *x.shape[1:])

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
        """What FSDP shards unit by unit: the VAE's blocks and the DiT's blocks.

        The per-layer key projections (``dit.kproj``) stay with the root (gathered for the whole step): a step
        calls each once per chunk, and the chunking is drawn per rank, so as units of their own they would be
        gathered a different number of times on different ranks (a collective mismatch).
        """
        from core.layers.checkpointing import block_units

        return [m for _, m in block_units(self.vae)] + list(self.dit.blocks)

    def checkpoint_units(self) -> list[nn.Module]:
        """The blocks gradient checkpointing recomputes: the same as ``fsdp_units``."""
        return self.fsdp_units()

    def forward(self, *args, **kwargs):
        return self.dit(*args, **kwargs)


def example(workdir: Path) -> ModelExample:
    """The contract test's tiny Flex-Forcing model (16 px, 2 blocks) on a fixed chunked latent clip."""
    from core.testing import ModelExample

    cfg = FlexForcingConfig(frame_size=16, vae_channels=[8, 8], vae_norm_groups=4, dim=32, depth=2, num_heads=2,
                            num_frames=6, sample_steps=4, pyramid_levels=3)

    def build() -> FlexForcingModel:
        model = FlexForcingModel(cfg)
        g = torch.Generator().manual_seed(7)  # the zero-initialised weights get values: a non-trivial function
        with torch.no_grad():
            for p in model.dit.parameters():
                if p.abs().sum() == 0:
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
