"""CausalWan: diffusers' WanTransformer3DModel run chunk-causally with KV caches (core.layers.wan)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from core.errors import CheckpointError, ConfigError
from core.layers.kv_cache import KVCache
from core.layers.wan import (
    WAN21_1_3B,
    CausalWan,
    chunk_attention_mask,
    wan_parameter_count,
    wan_transformer_config,
)

TINY = wan_transformer_config(num_heads=2, head_dim=12, num_layers=2, ffn_dim=48, in_channels=4, text_dim=16)


def _model(k_projection=False, seed=0, **kw) -> CausalWan:
    torch.manual_seed(seed)
    m = CausalWan.from_config(TINY, k_projection=k_projection, **kw).eval()
    with torch.no_grad():  # Wan zero-initialises nothing, but give the K-projection a non-trivial function
        if m.kproj is not None:
            for lin in m.kproj:
                lin.weight.normal_(0, 0.05)
                lin.bias.normal_(0, 0.05)
    return m


def _x(b=2, f=5, h=4, w=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, f, 4, h, w, generator=g), torch.rand(b, f, generator=g)


def _fill(model, cache, x, t, frames, chunks=None):
    _, kv = model(x, t, frames, chunks, caches=[cache], return_kv=True)
    h, w = x.shape[-2:]
    n = (h // model.patch) * (w // model.patch)
    cache.extend([k for k, _ in kv], [v for _, v in kv], frames.repeat_interleave(n), model.positions(frames, h, w))


def test_one_chunk_equals_wans_own_forward_and_per_frame_t_equals_the_ti2v_path():
    m = _model()
    x, t = _x()
    prompt = torch.randn(2, 3, 16)
    frames = torch.arange(5)
    # Wan's own forward with its own processors and rotary tables
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor
    for blk in m.blocks:
        blk.attn1.set_processor(WanAttnProcessor())
    ref = m.transformer(x.transpose(1, 2), (t[:, :1] * 1000).squeeze(1), prompt, return_dict=False)[0]
    n = 2 * 3
    ref_pf = m.transformer(x.transpose(1, 2), (t * 1000).repeat_interleave(n, 1), prompt, return_dict=False)[0]
    m2 = _model()
    ours = m2(x, t[:, :1].expand(2, 5), frames, prompt_embeds=prompt)
    ours_pf = m2(x, t, frames, prompt_embeds=prompt)
    torch.testing.assert_close(ours, ref.transpose(1, 2), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ours_pf, ref_pf.transpose(1, 2), atol=2e-5, rtol=1e-4)
    assert (ours_pf - ours).abs().max() > 1e-3  # the per-frame levels matter


@pytest.mark.parametrize("k_projection", [False, True])
@pytest.mark.parametrize("sizes", [[2, 2, 1], [1, 1, 1, 1, 1], [3, 2]])
def test_chunk_by_chunk_with_a_cache_equals_one_masked_pass(sizes, k_projection):
    m = _model(k_projection)
    x, t = _x()
    frames = torch.arange(5)
    chunks = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    full = m(x, t, frames, chunks)
    cache = KVCache(len(m.blocks))
    outs, a = [], 0
    for s in sizes:
        sl = slice(a, a + s)
        outs.append(m(x[:, sl], t[:, sl], frames[sl], None, caches=[cache]))
        _fill(m, cache, x[:, sl], t[:, sl], frames[sl])
        a += s
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-4)


def test_the_projection_uses_the_querying_chunks_level_so_cached_keys_are_the_unprojected_ones():
    m = _model(True)
    x, t = _x()
    frames = torch.arange(5)
    cache = KVCache(len(m.blocks))
    _fill(m, cache, x[:, :2], t[:, :2], frames[:2])
    a = m(x[:, 2:], t[:, 2:], frames[2:], None, caches=[cache])
    b = m(x[:, 2:], t[:, 2:] * 0.3, frames[2:], None, caches=[cache])
    assert (a - b).abs().max() > 1e-4


def test_any_order_generation_with_the_cache_equals_the_masked_pass():
    m = _model(True)
    x, t = _x()
    frames = torch.arange(5)
    pieces = [(2, 4), (0, 2), (4, 5)]  # generation order: middle, start, end
    chunk_of = torch.zeros(5, dtype=torch.long)
    for cid, (a, e) in enumerate(pieces):
        chunk_of[a:e] = cid
    full = m(x, t, frames, chunk_of)
    cache = KVCache(len(m.blocks))
    out = torch.empty_like(full)
    for a, e in pieces:
        out[:, a:e] = m(x[:, a:e], t[:, a:e], frames[a:e], None, caches=[cache])
        _fill(m, cache, x[:, a:e], t[:, a:e], frames[a:e])
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-4)


def test_the_k_projection_is_the_identity_at_init_and_learns_away_from_it():
    torch.manual_seed(0)
    plain = CausalWan.from_config(TINY).eval()
    torch.manual_seed(0)
    proj = CausalWan.from_config(TINY, k_projection=True).eval()
    proj.transformer.load_state_dict(plain.transformer.state_dict())
    x, t = _x()
    frames, chunks = torch.arange(5), torch.tensor([0, 0, 1, 1, 2])
    torch.testing.assert_close(proj(x, t, frames, chunks), plain(x, t, frames, chunks), atol=1e-6, rtol=0)
    proj.train()
    loss = proj(x, t, frames, chunks).pow(2).mean()
    loss.backward()
    g = [lin.weight.grad.view(2, 25, -1) for lin in proj.kproj]
    assert all(gg[:, 0].abs().sum() > 0 and gg[:, 13:].abs().sum() > 0 for gg in g)  # gamma and v learn
    assert proj.transformer.blocks[0].attn1.to_q.weight.grad.abs().sum() > 0


def test_only_the_frame_offsets_matter_so_frames_may_run_past_wans_rope_length():
    m = _model(True)
    x, t = _x()
    chunks = torch.tensor([0, 0, 1, 1, 2])
    a = m(x, t, torch.arange(5), chunks)
    b = m(x, t, torch.arange(5) + 5000, chunks)  # Wan's rope tables stop at rope_max_seq_len = 1024
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert (m(x, t, torch.tensor([0, 1, 2, 3, 5]), chunks) - a).abs().max() > 1e-5  # a gap is seen


def test_the_rotary_tables_are_wans():
    m = _model()
    pos = m.positions(torch.arange(3), 4, 6)
    cos, sin = m.rotary(pos)
    ref_cos, ref_sin = m.transformer.rope(torch.zeros(1, 4, 3, 4, 6))
    torch.testing.assert_close(cos, ref_cos[0, :, 0].float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, ref_sin[0, :, 0].float(), atol=1e-6, rtol=0)


def test_flex_attention_block_mask_equals_the_dense_sdpa_mask():
    x, t = _x()
    frames, chunks = torch.arange(5), torch.tensor([0, 1, 1, 2, 2])
    dense = _model(attention="sdpa")
    flex = _model(attention="flex")
    with torch.no_grad():  # FlexAttention has no CPU backward (a training pass there falls back to SDPA)
        torch.testing.assert_close(flex(x, t, frames, chunks), dense(x, t, frames, chunks), atol=1e-5, rtol=1e-4)
    flex(x, t, frames, chunks).sum().backward()
    q = torch.repeat_interleave(torch.tensor([0, 1, 1, 2]), 3)
    mask = chunk_attention_mask(q, 2, "sdpa")
    assert mask.shape == (12, 14) and bool(mask[:, :2].all())
    assert bool(mask[0, 2:5].all()) and not bool(mask[0, 5:].any()) and bool(mask[-1].all())


@pytest.mark.parametrize("cached", [0, 130])
def test_the_range_built_block_mask_equals_torchs_create_block_mask(cached):
    from core.layers.wan import chunk_block_mask

    g = torch.Generator().manual_seed(0)
    q = torch.repeat_interleave(torch.randperm(5, generator=g), torch.tensor([70, 200, 1, 90, 130]))
    ours, ref = chunk_block_mask(q, cached), chunk_attention_mask(q, cached, "flex_reference")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                 "q_indices", "full_q_num_blocks", "full_q_indices"):
        a, b = getattr(ours, name), getattr(ref, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name
    assert bool(ours.kv_num_blocks.sum() + ours.full_kv_num_blocks.sum() < ours.kv_indices.shape[-1] ** 2)


def test_rectangular_latents_and_the_cache_roll_bound_memory():
    m = _model(True)
    x, t = _x(f=4, h=4, w=8)
    out = m(x, t, torch.arange(4), torch.tensor([0, 1, 2, 3]))
    assert out.shape == x.shape
    cache = KVCache(len(m.blocks))
    for i in range(6):
        fr = torch.tensor([i])
        _fill(m, cache, x[:, i % 4:i % 4 + 1], torch.zeros(2, 1), fr)
        cache.roll(3, sink_frames=1)
        assert len(cache) <= 3 and cache.num_tokens == len(cache) * 8
    assert cache.frames() == [0, 4, 5]


def test_gradient_checkpointing_gives_the_same_gradients():
    from core.layers.checkpointing import checkpoint_modules

    x, t = _x()
    frames, chunks = torch.arange(5), torch.tensor([0, 0, 1, 1, 2])
    grads = []
    for ckpt in (False, True):
        m = _model(True).train()
        if ckpt:
            checkpoint_modules(m.blocks)
        m(x, t, frames, chunks).pow(2).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def _tree_hash(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_a_wan_folder_written_by_save_pretrained_loads_with_only_the_k_projection_missing(tmp_path):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(3)
    src = WanTransformer3DModel(**TINY).eval()
    (tmp_path / "Wan-tiny").mkdir()
    src.save_pretrained(tmp_path / "Wan-tiny" / "transformer")  # a pipeline folder's layout
    before = _tree_hash(tmp_path / "Wan-tiny")
    model, missing, unexpected = CausalWan.from_pretrained(tmp_path / "Wan-tiny", k_projection=True)
    assert unexpected == [] and missing and all(k.startswith("kproj.") for k in missing)
    assert len(missing) == 2 * len(model.blocks)  # weight and bias of every block's K-projection
    x, t = _x()
    prompt = torch.zeros(2, 1, 16)
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor
    for blk in src.blocks:
        blk.attn1.set_processor(WanAttnProcessor())
    ref = src(x.transpose(1, 2), torch.full((2,), 400.0), prompt, return_dict=False)[0].transpose(1, 2)
    torch.testing.assert_close(model.eval()(x, torch.full((2, 5), 0.4), torch.arange(5)), ref, atol=2e-5, rtol=1e-4)
    assert _tree_hash(tmp_path / "Wan-tiny") == before  # the user's folder is only read


def test_bad_folders_and_unsupported_wan_variants_are_one_line_errors(tmp_path):
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    with pytest.raises(CheckpointError, match="no WanTransformer3DModel"):
        CausalWan.from_pretrained(tmp_path)
    AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False]
                     ).save_pretrained(tmp_path / "vae")
    with pytest.raises(CheckpointError, match="AutoencoderKLWan config, not a WanTransformer3DModel"):
        CausalWan.from_pretrained(tmp_path / "vae")
    WanTransformer3DModel(**TINY).save_pretrained(tmp_path / "t")
    (tmp_path / "t" / "diffusion_pytorch_model.safetensors").write_bytes(b"corrupt")
    with pytest.raises(CheckpointError):
        CausalWan.from_pretrained(tmp_path / "t")
    with pytest.raises(ConfigError, match="I2V-14B"):
        CausalWan.from_config(dict(TINY, image_dim=8, added_kv_proj_dim=8))
    with pytest.raises(ConfigError, match="attention"):
        CausalWan.from_config(TINY, attention="xformers")


def test_wan21_1_3b_on_the_meta_device_has_the_papers_size():
    assert wan_parameter_count(WAN21_1_3B) == 1_418_996_800  # Wan2.1-T2V-1.3B: 1.42 B


@pytest.mark.parametrize("k_projection", [False, True])
def test_the_cached_tokens_rotary_tables_are_reused_only_while_the_cache_is_unchanged(k_projection):
    """A frame's Euler steps reuse the cached tokens' tables (memoised per cache state); the output is the same
    bits as a model without the memo, and any change of the cache (extend, roll, clear) rebuilds them."""
    m = _model(k_projection)
    x, _ = _x(b=1, f=4)
    cache = KVCache(len(m.blocks))
    _fill(m, cache, x[:, :2], torch.zeros(1, 2), torch.arange(2))
    t = torch.full((1, 1), 0.5)
    calls = []
    real = m.rotary
    m.rotary = lambda pos, origin=0: (calls.append(len(pos)), real(pos, origin))[1]
    with torch.no_grad():
        a = m(x[:, 2:3], t, torch.tensor([2]), caches=[cache])
        b = m(x[:, 2:3], t * 0.5, torch.tensor([2]), caches=[cache])  # the next Euler step: tables reused
        n_cached = cache.num_tokens
        assert calls.count(n_cached) == 1 and len(calls) == 3  # cached tables once; the new frame's each pass
        m._rope_memo.clear()
        a2 = m(x[:, 2:3], t, torch.tensor([2]), caches=[cache])
    assert torch.equal(a, a2) and not torch.equal(a, b)
    state = cache.state
    _fill(m, cache, x[:, 2:3], torch.zeros(1, 1), torch.tensor([2]))
    assert cache.state != state  # extended: a new key, the old tables are not used for the longer cache
    with torch.no_grad():
        m(x[:, 3:4], t, torch.tensor([3]), caches=[cache])
    assert calls[-1] == cache.num_tokens  # the longer cache's tables, built anew
    cache.roll(2)
    assert cache.state[1] > state[1] + 1
