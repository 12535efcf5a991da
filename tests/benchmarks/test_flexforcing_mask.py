"""``benchmarks.flexforcing_mask``: the mask byte counts, the range-built BlockMask and a shrunk run on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import flexforcing_mask as fm
from core.layers.wan import chunk_attention_mask


def test_wan21_token_layout():
    assert fm.tokens_per_frame() == 1560
    assert 21 * fm.tokens_per_frame() == 32760 and 81 * fm.tokens_per_frame() == 126360


@pytest.mark.parametrize("kind", fm.CHUNKINGS)
def test_frame_chunkings_cover_every_frame(kind):
    ids = fm.frame_chunks(kind, 21)
    assert ids.shape == (21,)
    assert sorted(set(ids.tolist())) == list(range(int(ids.max()) + 1))  # ids 0..C-1, each used
    if kind == "singletons":
        assert ids.tolist() == list(range(21))
    if kind == "pyramid":
        assert torch.bincount(ids).tolist() == [3, 3, 3, 2, 3, 2, 3, 2]  # pyramid_schedule(21, 4)[-1]


@pytest.mark.parametrize("per_frame,cached,kind", [(100, 150, "random"), (128, 0, "singletons"), (96, 256, "pyramid")])
def test_range_built_block_mask_equals_create_block_mask(per_frame, cached, kind):
    q = fm.token_chunks(fm.frame_chunks(kind, 7, seed=3), per_frame)
    ref = chunk_attention_mask(q, cached, "flex_reference")
    ours = fm.block_mask_from_chunks(q, cached)
    assert fm.same_block_mask(ref, ours)
    counts = fm.block_counts(ours)
    assert counts["full"] > 0 and counts["empty"] > 0
    aligned = per_frame % fm.BLOCK == 0 and cached % fm.BLOCK == 0
    assert (counts["partial"] == 0) == aligned  # frames on block boundaries: every block full or empty
    # the same token rule: its dense view equals the SDPA mask
    dense = chunk_attention_mask(q, cached, "sdpa")
    assert torch.equal(ours.to_dense()[0, 0].bool(), _block_view(dense))


def _block_view(dense: torch.Tensor, block: int = fm.BLOCK) -> torch.Tensor:
    """(Qb, KVb) whether any pair of a block is visible (the padded dense mask reduced per block)."""
    n, m = dense.shape
    pad = torch.nn.functional.pad(dense, (0, -m % block, 0, -n % block))
    return pad.view(pad.shape[0] // block, block, pad.shape[1] // block, block).any(3).any(1)


def test_mask_bytes_dense_and_block_layouts_on_meta():
    n, m = 3000, 500
    q = torch.zeros(n, dtype=torch.long, device="meta")
    assert fm.mask_bytes(chunk_attention_mask(q, m, "sdpa")) == {"tensors": n * (n + m), "captured": 0,
                                                                   "total": n * (n + m)}
    got = fm.mask_bytes(chunk_attention_mask(q, m, "flex"))
    qb, kb = -(-n // 128), -(-(n + m) // 128)
    # int32: kv / full-kv indices (Qb, KVb) and counts (Qb); q / full-q indices (KVb, Qb) and counts (KVb)
    assert got["tensors"] == 4 * (4 * qb * kb + 2 * qb + 2 * kb)
    assert got["captured"] == 8 * (n + (n + m))  # the int64 chunk ids the mask_mod reads: queries, keys
    assert got["total"] == got["tensors"] + got["captured"]


def test_flex_attention_output_equals_sdpa_with_the_dense_mask_on_cpu():
    assert fm.check_outputs(frames=3, per_frame=70, cached_frames=1, heads=2, head_dim=16) <= fm.CHECK_TOL


def test_shrunk_run_writes_ratios(tmp_path):
    fm.main(["--quick", "--device", "cpu", "--tokens-per-frame", "40", "--results-dir", str(tmp_path)])
    rec = json.loads((tmp_path / "flexforcing_mask.json").read_text())
    assert rec["name"] == "flexforcing_mask" and rec["quick"] is True
    fig = rec["figures"]
    assert fig["flex_matches_sdpa"] and all(fig["range_build_checks"].values())
    assert any(k.endswith("ranges_equal_create_block_mask") for k in fig["range_build_checks"])
    for f in fm.FRAMES:
        n = 40 * f
        row = next(r for r in fig["cpu_rows"] if r["frames"] == f)
        assert row["dense_MB"] == pytest.approx(n * n / 1e6)
        assert rec["ratios"][f"dense_vs_block_bytes_{f}"] == pytest.approx(row["dense_MB"] / row["block_MB"])
        assert rec["ratios"][f"block_vs_limit_{f}"] > 1
    singles = [r for r in fig["cpu_rows"] if r["chunking"] == "singletons"]
    assert all(0 < r["visited"] < 1 for r in singles)  # the block-causal mask skips blocks


def test_cuda_rows_logic_with_the_cuda_counters_stubbed(monkeypatch):
    """The CUDA part's bookkeeping (build, range build, attention call, limit row), run on CPU tensors."""
    for name, value in (("synchronize", None), ("reset_peak_memory_stats", None), ("empty_cache", None),
                        ("memory_allocated", 0), ("max_memory_allocated", 0)):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _v=value, **k: _v)
    rows = fm.cuda_rows([3], [2], per_frame=100, head_dim=16, repeats=1, device="cpu")
    by = {r["backend"]: r for r in rows}
    assert set(by) == {"sdpa", "flex", "flash_unmasked"}
    assert all(r["status"] == "ok" for r in rows), rows
    assert by["flex"]["ranges_equal"] is True and 0 < by["flex"]["visited"] < 1
    assert by["sdpa"]["mask_MB"] == pytest.approx(300 * 300 / 1e6)
    assert all(r["s"] > 0 for r in rows)
