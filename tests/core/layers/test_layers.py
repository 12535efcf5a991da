"""core.layers: attention matches the textbook formula, masks hold, blocks compose, LoRA is exact at init."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.layers import Attention, LoRALinear, Mlp, TransformerBlock, inject_lora, lora_parameters, merge_lora


def _manual_attention(attn: Attention, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
    b, n, c = x.shape
    h, d = attn.num_heads, attn.head_dim
    q = attn.q(x).view(b, n, h, d).transpose(1, 2)
    k = attn.k(ctx).view(b, -1, h, d).transpose(1, 2)
    v = attn.v(ctx).view(b, -1, h, d).transpose(1, 2)
    w = (q @ k.transpose(-1, -2) / d**0.5).softmax(-1)
    return attn.proj((w @ v).transpose(1, 2).reshape(b, n, c))


def test_self_and_cross_attention_match_the_formula():
    torch.manual_seed(0)
    attn = Attention(16, num_heads=4).eval()
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(attn(x), _manual_attention(attn, x, x), atol=1e-5, rtol=1e-5)
    cross = Attention(16, num_heads=4, context_dim=8).eval()
    ctx = torch.randn(2, 3, 8)
    out = cross(x, ctx)
    assert out.shape == (2, 5, 16)
    torch.testing.assert_close(out, _manual_attention(cross, x, ctx), atol=1e-5, rtol=1e-5)


def test_causal_and_bool_masks_hide_later_tokens():
    torch.manual_seed(0)
    attn = Attention(8, num_heads=2).eval()
    x = torch.randn(1, 6, 8)
    y = x.clone()
    y[:, 4:] += 10.0  # change only the last two tokens
    a, b = attn(x, is_causal=True), attn(y, is_causal=True)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[:, 4:] = False  # nobody sees tokens 4, 5
    torch.testing.assert_close(attn(x, attn_mask=mask)[:, :4], attn(y, attn_mask=mask)[:, :4])
    with pytest.raises(ValueError, match="self-attention"):
        attn(x, context=torch.randn(1, 3, 8), is_causal=True)  # SDPA would align the mask top-left


def test_transformer_block_shapes_and_context_requirement():
    blk = TransformerBlock(16, 4, cross_attention=True, context_dim=12)
    x, ctx = torch.randn(2, 7, 16), torch.randn(2, 3, 12)
    assert blk(x, ctx).shape == (2, 7, 16)
    with pytest.raises(ValueError, match="context"):
        blk(x)
    pool = TransformerBlock(16, 4, cross_attention=True, self_attention=False, context_dim=12)
    assert pool(torch.randn(2, 1, 16), ctx).shape == (2, 1, 16)
    with pytest.raises(ValueError):
        TransformerBlock(16, 4, self_attention=False)
    assert Mlp(16, 32, 5)(x).shape == (2, 7, 5)


def test_lora_is_identity_at_init_trains_only_adapters_and_merges_exactly():
    torch.manual_seed(0)
    blk = TransformerBlock(16, 4).eval()
    x = torch.randn(2, 5, 16)
    before = blk(x)
    names = inject_lora(blk, ["q", "v"], rank=2)
    assert sorted(names) == ["attn.q", "attn.v"]
    torch.testing.assert_close(blk(x), before)  # B = 0 at init
    trainable = {n for n, p in blk.named_parameters() if p.requires_grad}
    assert {n for n in trainable if "lora_" in n} == {"attn.q.lora_A", "attn.q.lora_B", "attn.v.lora_A",
                                                      "attn.v.lora_B"}
    for p in blk.parameters():  # freeze the rest as adaptation does
        p.requires_grad_(False)
    for p in lora_parameters(blk):
        p.requires_grad_(True)
        nn.init.normal_(p, std=0.1)
    adapted = blk(x)
    assert not torch.allclose(adapted, before)
    assert inject_lora(blk, ["q"], rank=2) == []  # already wrapped: skipped
    merge_lora(blk)
    assert not any(isinstance(m, LoRALinear) for m in blk.modules())
    assert not any(p.requires_grad for p in blk.attn.q.parameters())  # the frozen base stays frozen
    torch.testing.assert_close(blk(x), adapted, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no nn.Linear"):
        inject_lora(blk, ["nonexistent"])
