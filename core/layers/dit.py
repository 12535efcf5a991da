"""Diffusion-transformer pieces shared by the video, image-to-video and action models.

- ``timestep_embedding`` / ``TimestepEmbedder``: sinusoidal features of a noise level ``t`` in [0, 1] -> MLP.
  Called on a (B, F) tensor it gives one embedding per frame, so every frame can sit at its own noise level
  (Diffusion Forcing); the model broadcasts a frame's embedding to that frame's tokens.
- ``RotaryEmbedding``: n-D rotary positions (RoPE) for (frame, row, column) tokens; the head dimension is split
  between the axes. Attention scores depend on position differences only, which is what lets a rolling KV cache
  run far past the training length (absolute frame indices grow; the differences a query sees stay in range).
- ``DiTBlock``: pre-norm transformer block with adaLN-Zero modulation (DiT, Peebles & Xie 2023) from a
  *per-token* conditioning ``c`` (B, N, D), QK-RMSNorm, and an ``attend`` hook: the block computes per-head
  q / k / v and hands them to ``attend(q, k, v)``, so the caller decides the mask, the KV cache, and any
  transform of cached keys without the block knowing (``rope_attention`` is the plain masked SDPA path).
- ``FinalLayer``: adaLN (shift, scale) + linear read-out, zero-initialised (the model starts at output 0).

At initialisation every block is the identity (adaLN-Zero gates are 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DiTBlock",
    "FinalLayer",
    "RotaryEmbedding",
    "TimestepEmbedder",
    "apply_rotary",
    "modulate",
    "rope_attention",
    "timestep_embedding",
]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0, scale: float = 1000.0) -> torch.Tensor:
    """Sinusoidal features of noise levels ``t`` (any shape, values in [0, 1]) -> ``t.shape + (dim,)``.

    ``t`` is multiplied by ``scale`` first (so [0, 1] spans the frequencies the way integer DDPM steps do).
    """
    if dim % 2:
        raise ValueError(f"timestep_embedding needs an even dim, got {dim}")
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[..., None] * scale * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbedder(nn.Module):
    """``t`` (any shape) -> ``t.shape + (dim,)``: sinusoidal features then Linear-SiLU-Linear."""

    def __init__(self, dim: int, frequency_dim: int = 256, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, dim, **kw), nn.SiLU(), nn.Linear(dim, dim, **kw))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """Timesteps (...,) -> embeddings (..., dim)."""
        emb = timestep_embedding(t, self.frequency_dim).to(self.mlp[0].weight.dtype)
        return self.mlp(emb)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over several axes (e.g. frame, row, column).

    Args:
        head_dim: Per-head width; split between the axes as ``axes_dims`` (each even, summing to ``head_dim``).
        axes_dims: Channels per axis; default: the head width split as evenly as possible in even parts, the
            first axis (time) taking the remainder.
        theta: Base of the frequencies.
    """

    def __init__(self, head_dim: int, num_axes: int = 3, axes_dims: Sequence[int] | None = None,
                 theta: float = 10000.0):
        super().__init__()
        if axes_dims is None:
            base = (head_dim // num_axes) // 2 * 2
            axes_dims = [head_dim - base * (num_axes - 1)] + [base] * (num_axes - 1)
        axes_dims = [int(a) for a in axes_dims]
        if sum(axes_dims) != head_dim or any(a % 2 or a <= 0 for a in axes_dims):
            raise ValueError(f"axes_dims {axes_dims} must be positive, even and sum to head_dim {head_dim}")
        self.axes_dims = axes_dims
        self.theta = theta

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, num_axes) positions (integers or floats) -> (cos, sin), each (N, head_dim // 2) float32."""
        if positions.ndim != 2 or positions.shape[1] != len(self.axes_dims):
            raise ValueError(f"positions must be (N, {len(self.axes_dims)}), got {tuple(positions.shape)}")
        angles = []
        for axis, d in enumerate(self.axes_dims):
            inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d))
            angles.append(positions[:, axis].float()[:, None] * inv)
        a = torch.cat(angles, dim=-1)
        return torch.cos(a), torch.sin(a)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs ``(x[..., 2i], x[..., 2i + 1])`` of (..., N, d) by the (N, d // 2) angles."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    return out.to(x.dtype)


def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope_q: tuple[torch.Tensor, torch.Tensor],
                   rope_k: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA of (B, h, N, d) queries on (B, h, M, d) keys / values after rotary positions.

    ``mask``: bool (N, M) or broadcastable to (B, h, N, M), True = may attend; None = attend everywhere.
    """
    q = apply_rotary(q, *rope_q)
    k = apply_rotary(k, *rope_k)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The adaLN modulation ``x * (1 + scale) + shift`` (all broadcast to (B, N, D))."""
    return x * (1 + scale) + shift


class DiTBlock(nn.Module):
    """adaLN-Zero transformer block with per-token conditioning and a pluggable attention.

    ``forward(x, c, attend)``: ``x`` (B, N, D) tokens, ``c`` (B, N, D) conditioning (e.g. each token's frame
    timestep embedding), ``attend(q, k, v) -> (B, h, N, d)`` with per-head q / k / v (B, h, N, d); q and k are
    RMS-normalised (``qk_norm``) but *not* position-rotated: the attend function owns positions, masks and the
    cache. Six modulation vectors (shift / scale / gate for attention and MLP) come from ``c`` through a
    zero-initialised linear, so the block is the identity at initialisation.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qk_norm: bool = True, eps: float = 1e-6,
                 device=None, dtype=None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} must be divisible by num_heads {num_heads}")
        kw = {"device": device, "dtype": dtype}
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps, **kw)
        self.qkv = nn.Linear(dim, 3 * dim, **kw)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps, **kw) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps, **kw) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, **kw)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps, **kw)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden, **kw), nn.GELU(approximate="tanh"),
                                 nn.Linear(hidden, dim, **kw))
        self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim, **kw))
        nn.init.zeros_(self.adaLN[1].weight)
        nn.init.zeros_(self.adaLN[1].bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Tokens (B, N, D) conditioned per token on ``c`` (B, N, D) -> (B, N, D); ``attend(q, k, v)`` attends."""
        b, n, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN(c).chunk(6, dim=-1)
        h = modulate(self.norm1(x), shift1, scale1)
        q, k, v = self.qkv(h).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = attend(self.q_norm(q), self.k_norm(k), v)
        x = x + gate1 * self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + gate2 * self.mlp(modulate(self.norm2(x), shift2, scale2))


class FinalLayer(nn.Module):
    """adaLN-modulated LayerNorm then a linear read-out to ``out_dim``; all zero-initialised."""

    def __init__(self, dim: int, out_dim: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=eps, **kw)
        self.linear = nn.Linear(dim, out_dim, **kw)
        self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim, **kw))
        for m in (self.linear, self.adaLN[1]):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Tokens (B, N, D) conditioned on ``c`` (B, N, D) -> (B, N, out_dim)."""
        shift, scale = self.adaLN(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm(x), shift, scale))
