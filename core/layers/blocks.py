"""Pre-norm transformer block: self-attention, optional cross-attention to a context, MLP."""

from __future__ import annotations

import torch
from torch import nn

from core.layers.attention import Attention
from core.layers.mlp import Mlp


class TransformerBlock(nn.Module):
    """``x + SelfAttn(LN x)`` -> ``x + CrossAttn(LN x, context)`` (if ``cross_attention``) -> ``x + MLP(LN x)``.

    Args:
        dim: Token width ``C``.
        num_heads: Attention heads.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        cross_attention: Add a cross-attention sub-layer (queries from ``x``, keys / values from ``context``).
        context_dim: Width of ``context`` (default ``dim``).
        self_attention: Include the self-attention sub-layer (False: a cross-attention-only block, e.g. a
            learned query pooling a sequence).
        qk_norm, drop, attn_drop: See ``Attention`` / ``Mlp``.
    """

    def __init__(self, dim: int, num_heads: int = 8, mlp_ratio: float = 4.0, cross_attention: bool = False,
                 context_dim: int | None = None, self_attention: bool = True, qk_norm: bool = False,
                 drop: float = 0.0, attn_drop: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        if not (self_attention or cross_attention):
            raise ValueError("a TransformerBlock needs self- or cross-attention")
        self.norm1 = nn.LayerNorm(dim, **kw) if self_attention else None
        self.attn = Attention(dim, num_heads, qk_norm=qk_norm, attn_drop=attn_drop, proj_drop=drop, **kw) \
            if self_attention else None
        self.norm_cross = nn.LayerNorm(dim, **kw) if cross_attention else None
        self.norm_context = nn.LayerNorm(context_dim or dim, **kw) if cross_attention else None
        self.cross_attn = Attention(dim, num_heads, context_dim=context_dim, qk_norm=qk_norm, attn_drop=attn_drop,
                                    proj_drop=drop, **kw) if cross_attention else None
        self.norm2 = nn.LayerNorm(dim, **kw)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop, **kw)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N, C) tokens, optional (B, M, C_ctx) context -> (B, N, C).

        ``attn_mask`` / ``is_causal`` apply to self-attention, ``context_mask`` (B or 1, heads or 1, N, M) to
        cross-attention.
        """
        if self.attn is not None:
            x = x + self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)
        if self.cross_attn is not None:
            if context is None:
                raise ValueError("this block has cross-attention: pass a context")
            x = x + self.cross_attn(self.norm_cross(x), self.norm_context(context), attn_mask=context_mask)
        return x + self.mlp(self.norm2(x))
