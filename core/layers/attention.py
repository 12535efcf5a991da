"""Multi-head attention on ``F.scaled_dot_product_attention``: self-attention, or cross-attention to a context."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head (self- or cross-) attention.

    Queries come from ``x`` (B, N, C); keys / values from ``context`` (B, M, C_ctx) when given (cross-
    attention), else from ``x`` (self-attention). Projections are separate ``q`` / ``k`` / ``v`` / ``proj``
    linears so LoRA can target them by name.

    Args:
        dim: Query width ``C`` (also the output width).
        num_heads: Heads; ``dim`` must be divisible by it.
        context_dim: Width of ``context`` for cross-attention (default ``dim``).
        qkv_bias: Bias on the q / k / v projections.
        qk_norm: LayerNorm on per-head queries and keys (stabilises small-batch training).
        attn_drop: Dropout on attention weights (training only).
        proj_drop: Dropout after the output projection.
    """

    def __init__(self, dim: int, num_heads: int = 8, context_dim: int | None = None, qkv_bias: bool = True,
                 qk_norm: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} must be divisible by num_heads {num_heads}")
        kw = {"device": device, "dtype": dtype}
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        context_dim = context_dim or dim
        self.q = nn.Linear(dim, dim, bias=qkv_bias, **kw)
        self.k = nn.Linear(context_dim, dim, bias=qkv_bias, **kw)
        self.v = nn.Linear(context_dim, dim, bias=qkv_bias, **kw)
        self.q_norm = nn.LayerNorm(self.head_dim, **kw) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, **kw) if qk_norm else nn.Identity()
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim, **kw)
        self.proj_drop = nn.Dropout(proj_drop)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, N, d)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        """Attend from ``x`` to ``context`` (or to ``x``).

        Args:
            x: (B, N, C) queries.
            context: (B, M, C_ctx) keys / values; None for self-attention.
            attn_mask: Bool (True = may attend) or additive float mask broadcastable to (B, heads, N, M).
            is_causal: Causal mask (query i sees keys <= i); self-attention only, with ``attn_mask=None``.

        Returns:
            (B, N, C).
        """
        if is_causal and (context is not None or attn_mask is not None):
            raise ValueError("is_causal is for self-attention without attn_mask (SDPA aligns it top-left otherwise)")
        ctx = x if context is None else context
        q = self.q_norm(self._heads(self.q(x)))
        k = self.k_norm(self._heads(self.k(ctx)))
        v = self._heads(self.v(ctx))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                             dropout_p=self.attn_drop if self.training else 0.0)
        b, _, n, _ = out.shape
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, -1)))
