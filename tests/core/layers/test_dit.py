"""Shared DiT pieces: rotary positions depend on offsets only, adaLN-Zero blocks start as the identity, the
timestep embedding tells noise levels apart, the KV cache keeps frame bookkeeping, the VAE helpers round-trip."""

from __future__ import annotations

import pytest
import torch

from core.layers.dit import (
    DiTBlock,
    FinalLayer,
    RotaryEmbedding,
    apply_rotary,
    rope_attention,
    timestep_embedding,
)
from core.layers.kv_cache import KVCache


def test_rotary_scores_depend_on_position_offsets_only():
    rope = RotaryEmbedding(24, 3)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 24, generator=g), torch.randn(1, 1, 1, 24, generator=g)

    def score(pq, pk):
        cq, sq = rope(torch.tensor([pq]))
        ck, sk = rope(torch.tensor([pk]))
        return float((apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum())

    a = score([3, 1, 2], [1, 0, 0])
    b = score([103, 5, 6], [101, 4, 4])  # same offsets, far larger absolute positions (a long video)
    c = score([3, 1, 2], [2, 0, 0])
    assert abs(a - b) < 1e-3 and abs(a - c) > 1e-3


def test_rotary_rejects_bad_axes():
    with pytest.raises(ValueError, match="axes_dims"):
        RotaryEmbedding(24, 3, axes_dims=[8, 8, 7])
    with pytest.raises(ValueError, match="positions"):
        RotaryEmbedding(24, 3)(torch.zeros(4, 2))


def test_adaln_zero_block_and_final_layer_start_as_identity_and_zero():
    torch.manual_seed(0)
    block, final = DiTBlock(32, 4), FinalLayer(32, 12)
    x, c = torch.randn(2, 10, 32), torch.randn(2, 10, 32)
    rope = RotaryEmbedding(8)(torch.zeros(10, 3, dtype=torch.long))

    def attend(q, k, v):
        return rope_attention(q, k, v, rope, rope)

    assert torch.equal(block(x, c, attend), x)
    assert torch.equal(final(x, c), torch.zeros(2, 10, 12))
    with torch.no_grad():
        block.adaLN[1].bias.normal_()
    assert not torch.allclose(block(x, c, attend), x)


def test_timestep_embedding_separates_levels_and_keeps_shape():
    e = timestep_embedding(torch.tensor([[0.0, 0.5], [0.5, 1.0]]), 64)
    assert e.shape == (2, 2, 64)
    assert torch.allclose(e[0, 1], e[1, 0]) and (e[0, 0] - e[0, 1]).abs().max() > 0.1


def test_kv_cache_bookkeeping():
    cache = KVCache(2)
    assert len(cache) == 0 and cache.get(0) is None
    k = torch.randn(1, 2, 6, 4)
    cache.extend([k, k], [k, k], torch.tensor([0, 0, 0, 1, 1, 1]), torch.zeros(6, 3))
    assert len(cache) == 2 and cache.num_tokens == 6
    cache.drop_frames([0])
    assert cache.frames() == [1] and torch.equal(cache.get(1)[0], k[:, :, 3:])
    with pytest.raises(ValueError, match="do not match"):
        cache.extend([k, k], [k, k], torch.tensor([2]), torch.zeros(6, 3))
    cache.drop_frames([1])
    assert len(cache) == 0 and cache.get(0) is None


def test_autoencoder_weights_load_from_a_stage_run_and_mismatches_fail(tmp_path):
    from core.checkpoint import save_checkpoint
    from core.errors import CheckpointError
    from core.layers.vae import AutoencoderTrainer, build_autoencoder_kl, load_autoencoder_weights

    torch.manual_seed(0)
    vae = build_autoencoder_kl((8, 8), 4, 1, 4, 16)
    wrapper = AutoencoderTrainer(vae)
    out = wrapper.training_step({"video": torch.randint(0, 256, (1, 2, 3, 16, 16), dtype=torch.uint8)})
    assert torch.isfinite(out["loss"]) and out["loss"] > 0
    save_checkpoint(tmp_path / "ckpt", wrapper, {"method": "test"})
    other = build_autoencoder_kl((8, 8), 4, 1, 4, 16)
    load_autoencoder_weights(other, tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(vae.state_dict().values(), other.state_dict().values(), strict=True))
    with pytest.raises(CheckpointError, match="mismatched"):
        load_autoencoder_weights(build_autoencoder_kl((8, 16), 4, 1, 4, 16), tmp_path / "ckpt")
