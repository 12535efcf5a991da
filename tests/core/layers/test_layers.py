"""core.layers: attention matches the textbook formula, masks hold, blocks compose; LoRA (peft) is exact at
init, equals the former own LoRA formula, merges, saves adapter-only in peft's layout."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.layers import (
    Attention,
    Mlp,
    TransformerBlock,
    inject_lora,
    is_lora_layer,
    load_lora,
    load_lora_state_dict,
    lora_parameters,
    lora_state_dict,
    merge_lora,
    save_lora,
)


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
    assert is_lora_layer(blk.attn.q) and type(blk.attn.q).__module__.startswith("peft.")
    torch.testing.assert_close(blk(x), before)  # B = 0 at init
    trainable = {n for n, p in blk.named_parameters() if p.requires_grad}
    want = {f"attn.{p}.lora_{f}.default.weight" for p in "qv" for f in "AB"}
    assert {n for n in trainable if "lora_" in n} == want
    # only the wrapped linears are frozen (peft alone would freeze the whole root module)
    assert not blk.attn.q.base_layer.weight.requires_grad
    assert "attn.k.weight" in trainable and "norm1.weight" in trainable
    assert len(lora_parameters(blk)) == 4
    for p in blk.parameters():  # freeze the rest as adaptation does
        p.requires_grad_(False)
    for p in lora_parameters(blk):
        p.requires_grad_(True)
        nn.init.normal_(p, std=0.1)
    adapted = blk(x)
    assert not torch.allclose(adapted, before)
    assert inject_lora(blk, ["q"], rank=2) == []  # already wrapped: skipped
    assert inject_lora(blk, ["k"], rank=2) == ["attn.k"]  # a second call adds layers, keeps the first ones
    assert set(blk.peft_config["default"].target_modules) == {"attn.q", "attn.v", "attn.k"}
    torch.testing.assert_close(blk(x), adapted)
    merge_lora(blk)
    assert not any(is_lora_layer(m) for m in blk.modules()) and not hasattr(blk, "peft_config")
    assert type(blk.attn.q) is nn.Linear
    assert not any(p.requires_grad for p in blk.attn.q.parameters())  # the frozen base stays frozen
    torch.testing.assert_close(blk(x), adapted, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no nn.Linear"):
        inject_lora(blk, ["nonexistent"])


def test_peft_lora_equals_the_former_own_formula_on_fixed_inputs():
    """peft's layer == the former ``LoRALinear``: ``base(x) + (alpha / r) x A^T B^T``; merged:
    ``W + (alpha / r) B A`` (1e-6)."""
    torch.manual_seed(0)
    lin = nn.Linear(12, 10)
    w, b = lin.weight.detach().clone(), lin.bias.detach().clone()
    root = nn.Sequential(lin)
    inject_lora(root, ["0"], rank=3, alpha=6.0)
    g = torch.Generator().manual_seed(1)
    a_, b_ = torch.randn(3, 12, generator=g), torch.randn(10, 3, generator=g)
    layer = root[0]
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(a_)
        layer.lora_B["default"].weight.copy_(b_)
    x = torch.randn(4, 7, 12, generator=g)
    former = x @ w.t() + b + (x @ a_.t() @ b_.t()) * (6.0 / 3)
    torch.testing.assert_close(layer(x), former, atol=1e-6, rtol=0)
    merge_lora(root)
    torch.testing.assert_close(root[0].weight, w + 2.0 * b_ @ a_, atol=1e-6, rtol=0)
    torch.testing.assert_close(root[0](x), former, atol=1e-5, rtol=0)


def _adapted_block(seed: int = 0):
    torch.manual_seed(seed)
    base = TransformerBlock(16, 4).eval()
    model = TransformerBlock(16, 4).eval()
    model.load_state_dict(base.state_dict())
    inject_lora(model, ["q", "v", "proj"], rank=2)
    for p in lora_parameters(model):
        nn.init.normal_(p, std=0.1)
    return base, model


def test_adapter_only_save_and_load_round_trip_in_peft_layout(tmp_path):
    peft = pytest.importorskip("peft")
    base, model = _adapted_block()
    x = torch.randn(2, 5, 16)
    want = model(x)
    sd = lora_state_dict(model)
    assert sd and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in sd)  # adapter only, no base
    save_lora(model, tmp_path / "ad")
    assert sorted(p.name for p in (tmp_path / "ad").iterdir()) == ["adapter_config.json",
                                                                   "adapter_model.safetensors"]
    fresh = TransformerBlock(16, 4).eval()
    fresh.load_state_dict(base.state_dict())
    load_lora(fresh, tmp_path / "ad")  # injects from adapter_config.json, then loads
    torch.testing.assert_close(fresh(x), want)
    # peft itself reads the folder (PeftModel on the un-adapted block)
    plain = TransformerBlock(16, 4).eval()
    plain.load_state_dict(base.state_dict())
    torch.testing.assert_close(peft.PeftModel.from_pretrained(plain, tmp_path / "ad").eval()(x), want)
    from core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="missing"):
        load_lora_state_dict(fresh, {k: v for k, v in sd.items() if "attn.q." not in k})
    with pytest.raises(ValueError, match="no LoRA adapter"):
        lora_state_dict(TransformerBlock(16, 4))


