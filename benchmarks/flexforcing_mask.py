"""Flex-Forcing's chunk-causal attention mask: the dense SDPA mask against FlexAttention's block mask.

``core.layers.wan.chunk_attention_mask(q_chunks, num_cached, backend)`` builds the mask of a masked pass of
``CausalWan``: query token ``i`` sees the ``M`` cached tokens and new token ``j`` iff ``chunk(j) <= chunk(i)``.
``backend="sdpa"`` gives a dense (N, M + N) bool tensor (N (M + N) bytes); ``backend="flex"`` a FlexAttention
``BlockMask`` built from per-block chunk ranges (``chunk_block_mask``; ``"flex_reference"`` builds the same mask with
torch's eager ``create_block_mask``) (per 128 x 128 block: int32 block counts and sorted block indices, both directions, partial and
full blocks; plus the chunk ids its ``mask_mod`` reads). ``CausalWan`` uses the mask for chunked passes of a
model without the K-projection (the AR-only baseline's training, a ``k_projection=False`` backbone); with the
K-projection each chunk's queries run their own SDPA call over the keys they see, with no mask.

Layout: Wan2.1-T2V's, 480 x 832 frames -> VAE factor 8 -> 60 x 104 latents -> 2 x 2 patches -> 1,560 tokens per
latent frame; 21 latent frames (Wan's 81-frame clip) = 32,760 tokens, 81 latent frames (a 321-frame video) =
126,360 tokens; no cache (M = 0), one pass over the whole clip. Chunkings (latent frames per chunk):
``singletons`` (Flex-Forcing's finest pyramid level when it reaches single frames, and AR-only training),
``pyramid`` (the finest level of ``pyramid_schedule(F, 4)``, the default 4 levels: chunks of 2-3 frames at 21)
and ``random`` (``random_partition`` with random cuts, seed 0, chunk ids in a random order: any-order
generation). A mask's bytes do not depend on the chunking (a BlockMask stores every block pair's index); the
fraction of blocks a block-sparse kernel visits does.

Measured on every device:

* **bytes** of the mask objects: the dense tensor's ``nbytes``; the BlockMask's tensors summed, plus the chunk
  ids its ``mask_mod`` captures. Both are built for real through ``chunk_attention_mask`` on the meta device
  (shapes and dtypes are exact, no memory), and on the CPU with values where they fit ``--cpu-build-gb`` (12;
  ``--quick``: 2; 16 also builds the 16 GB dense mask of 81 frames): the dense mask at 21 frames (1.07 GB) and
  the eager reference block mask at 21 frames (``flex_reference``; not with ``--quick``: ``create_block_mask``
  evaluates the ``mask_mod`` on every token pair, gathering int64 chunk ids, so its build peak is ten times the
  dense mask's — why ``CausalWan`` builds from ranges instead) — and the builds' peak resident set. (On CUDA the CPU builds are skipped: the CUDA rows build.)
* **block counts** (full / partial / empty 128 x 128 blocks) from ``block_mask_from_chunks`` (= ``chunk_block_mask``,
  what ``CausalWan`` uses): built from each block's min / max chunk id without the token-level mask (checked equal,
  tensor for tensor, to the eager reference where that is built on the CPU), so the 81-frame mask is built too.
* **outputs**: at a size that runs on a CPU (3 new latent frames after 1 cached one at 1,560 tokens each, 2 heads
  of 64, random chunks), SDPA with the dense mask against FlexAttention (eager) with the block mask: the max
  absolute difference (must be <= 1e-4 in float32).

Where CUDA is available, additionally per frame count, for the ``singletons`` chunking and a few head counts
(``--heads``, head dim 128, bf16, batch 1): the peak ``torch.cuda.max_memory_allocated`` above what is live of
(a) building each mask on the device (``chunk_attention_mask``: dense, and the range-built block mask) and (b) one attention call given the built mask —
SDPA + dense bool mask (torch expands it to an additive mask of the query dtype) against FlexAttention + block
mask (compiled once per shape, as ``CausalWan`` runs it) — and their times (best of ``--repeats`` after a
warm-up); forward only.

Limit (what cannot be beaten): a mask cannot hold less than the chunk ids it is computed from (the query and key
ids the ``mask_mod`` reads, 2N + M int64 here); ``block_vs_limit_F`` is the block mask's bytes over those. On
CUDA the attention time has one too: a block-sparse kernel cannot beat unmasked flash attention (SDPA, no mask)
on the fraction of blocks it visits, ``flex_vs_limit_F_hH = flex time / (flash time x visited fraction)``.

Ratios: ``dense_vs_block_bytes_F`` (dense mask bytes / block mask bytes; higher is better for the block mask;
goal >= 100 at 81 frames), ``block_vs_limit_F`` (lower is better), on CUDA ``dense_vs_block_peak_F_hH`` (peak
of mask + attention call, SDPA-dense / flex-block) and ``flex_vs_sdpa_time_F_hH``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import (
    Goal,
    default_device,
    parse_args,
    peak_memory_bytes,
    print_table,
    repeated_main,
    write_result,
)

FRAME_HW = (480, 832)  # Wan2.1-T2V-1.3B's 480p frames
VAE_FACTOR = 8  # AutoencoderKLWan: 8x in space (4x in time: 1 + 4 k video frames -> 1 + k latent frames)
PATCH = 2
FRAMES = (21, 81)
CHUNKINGS = ("singletons", "pyramid", "random")
BLOCK = 128  # FlexAttention's default sparse block size
CHECK_TOL = 1e-4
#: Peak bytes per (query, key) token pair of the eager ``create_block_mask`` on the CPU: the vmapped ``mask_mod``'s
#: int64 gathers (8), the bool mask (1) and its padded copy (1); measured 10.7 GB at 32,760 x 32,760.
EAGER_BYTES_PER_PAIR = 10
QUICK_BUDGET_FRACTION = 1 / 6  # --quick: 2 GB by default (the dense 21-frame mask, not the eager block build)
BLOCK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                "q_indices", "full_q_num_blocks", "full_q_indices")

# Every reported ratio: held to a goal (its target and where the number comes from) or a plain figure.
GOALS = {
    "dense_vs_block_bytes_81": Goal(">= 100", (
        "claim: a block mask costs memory per 128 x 128 block, not per token pair (at Wan2.1's 81 frames "
        "the dense mask is 16 GB)")),
}
FIGURES_ONLY = (
    "dense_vs_block_bytes_*", "block_vs_limit_*", "dense_vs_block_peak_*", "flex_vs_sdpa_time_*",
    "flex_vs_limit_*",
)


def tokens_per_frame(frame_hw: tuple[int, int] = FRAME_HW, vae_factor: int = VAE_FACTOR, patch: int = PATCH) -> int:
    """Transformer tokens of one latent frame: (H / factor / patch) x (W / factor / patch) (Wan2.1 480p: 1,560)."""
    h, w = frame_hw
    return (h // vae_factor // patch) * (w // vae_factor // patch)


def frame_chunks(kind: str, frames: int, seed: int = 0) -> torch.Tensor:
    """(frames,) chunk id of every latent frame for chunking ``kind`` (see the module docstring)."""
    from perception.video.chunking import chunk_ids, pyramid_schedule, random_partition

    if kind == "singletons":
        return torch.arange(frames)
    if kind == "pyramid":
        return chunk_ids(pyramid_schedule(frames, 4)[-1])
    if kind == "random":
        g = torch.Generator().manual_seed(seed)
        sizes = random_partition(frames, g, p_one=0.0, p_singletons=0.0)
        order = torch.randperm(len(sizes), generator=g)  # any-order generation: ids are the generation order
        return order[chunk_ids(sizes)]
    raise ValueError(f"chunking {kind!r}: choose one of {', '.join(CHUNKINGS)}")


def token_chunks(frame_ids: torch.Tensor, per_frame: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """(F,) chunk ids of latent frames -> (F * per_frame,) chunk id of every token (frame-major, as CausalWan)."""
    return frame_ids.to(device).long().repeat_interleave(per_frame)


def _captured_tensors(fn) -> list[torch.Tensor]:
    cells = getattr(fn, "__closure__", None) or ()
    return [c.cell_contents for c in cells if isinstance(c.cell_contents, torch.Tensor)]


def mask_bytes(mask) -> dict[str, int]:
    """Bytes of a mask object: ``{"tensors", "captured", "total"}``.

    A dense tensor: its ``nbytes``. A ``BlockMask``: its block tensors summed (``tensors``) and the tensors its
    ``mask_mod`` closes over (``captured``: the chunk ids). Works on the meta device (sizes from shapes).
    """
    if isinstance(mask, torch.Tensor):
        n = mask.numel() * mask.element_size()
        return {"tensors": n, "captured": 0, "total": n}
    own = sum(t.numel() * t.element_size() for name in BLOCK_FIELDS
              if isinstance(t := getattr(mask, name, None), torch.Tensor))
    cap = sum(t.numel() * t.element_size() for t in _captured_tensors(mask.mask_mod))
    return {"tensors": own, "captured": cap, "total": own + cap}


def block_mask_from_chunks(q_chunks: torch.Tensor, num_cached: int, block: int = BLOCK):
    """The range-built ``BlockMask`` (``core.layers.wan.chunk_block_mask``, what ``chunk_attention_mask(...,
    "flex")`` returns): memory O(N / block)^2 instead of the eager ``create_block_mask``'s O(N^2)."""
    from core.layers.wan import chunk_block_mask

    return chunk_block_mask(q_chunks, num_cached, block)


def block_counts(mask) -> dict[str, int]:
    """``{"full", "partial", "empty", "blocks"}`` 128 x 128 block pairs of a (non-meta) ``BlockMask``."""
    qb, kb = mask.kv_indices.shape[-2:]
    full = int(mask.full_kv_num_blocks.sum()) if mask.full_kv_num_blocks is not None else 0
    partial = int(mask.kv_num_blocks.sum())
    return {"full": full, "partial": partial, "empty": qb * kb - full - partial, "blocks": qb * kb}


def same_block_mask(a, b) -> bool:
    """Whether two BlockMasks hold equal block tensors and sequence lengths."""
    if tuple(a.seq_lengths) != tuple(b.seq_lengths):
        return False
    for name in BLOCK_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and not torch.equal(x.cpu(), y.cpu())):
            return False
    return True


def check_outputs(frames: int = 3, per_frame: int | None = None, cached_frames: int = 1, heads: int = 2,
                  head_dim: int = 64, seed: int = 0) -> float:
    """Max |SDPA(dense mask) - FlexAttention(block mask)| (eager, float32, CPU) at a size that runs on a CPU."""
    from torch.nn.attention.flex_attention import flex_attention

    from core.layers.wan import chunk_attention_mask

    per_frame = per_frame or tokens_per_frame()
    q_chunks = token_chunks(frame_chunks("random", frames, seed), per_frame)
    m = cached_frames * per_frame
    n = len(q_chunks)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(1, heads, n, head_dim, generator=g)
    k, v = (torch.randn(1, heads, m + n, head_dim, generator=g) for _ in range(2))
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=chunk_attention_mask(q_chunks, m, "sdpa"))
    with torch.no_grad():
        flex = flex_attention(q, k, v, block_mask=chunk_attention_mask(q_chunks, m, "flex"))
    return float((dense - flex).abs().max())


def _cpu_build(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """``(fn(), seconds, peak resident bytes above the start)`` of one build on the CPU."""
    held: dict[str, Any] = {}

    def run() -> None:
        t0 = time.perf_counter()
        held["out"] = fn()
        held["s"] = time.perf_counter() - t0

    peak = peak_memory_bytes(run, "cpu") or 0
    return held["out"], held["s"], peak


def cpu_rows(frames_list, chunkings, per_frame: int, budget_bytes: float
             ) -> tuple[list[dict[str, Any]], dict[str, bool]]:
    """Bytes, block counts and (where built on the CPU) build peaks of both masks, per frame count and chunking.

    The CPU builds with values run where they fit ``budget_bytes``: the dense one (for the first chunking: its
    bytes do not depend on it) where its N (N + M) bytes do, the eager block-mask one where ``EAGER_BYTES_PER_PAIR``
    x N (N + M) do. Returns the rows and the consistency checks (sizes of meta vs CPU builds, range build vs
    ``create_block_mask``), which must all be True.
    """
    from core.layers.wan import chunk_attention_mask

    rows, checks = [], {}
    for f in frames_list:
        n = f * per_frame
        meta_dense = chunk_attention_mask(torch.zeros(n, dtype=torch.long, device="meta"), 0, "sdpa")
        dense_b = mask_bytes(meta_dense)["total"]
        for kind in chunkings:
            q_chunks = token_chunks(frame_chunks(kind, f), per_frame)
            meta_block = chunk_attention_mask(q_chunks.to("meta"), 0, "flex")
            block_b = mask_bytes(meta_block)
            ranges_mask, ranges_s, ranges_peak = _cpu_build(partial(block_mask_from_chunks, q_chunks, 0))
            counts = block_counts(ranges_mask)
            row = {"frames": f, "tokens": n, "chunking": kind, "chunks": int(frame_chunks(kind, f).max()) + 1,
                   "dense_MB": dense_b / 1e6, "block_MB": block_b["total"] / 1e6,
                   "block_index_MB": block_b["tensors"] / 1e6, "chunk_ids_MB": block_b["captured"] / 1e6,
                   "dense_vs_block": dense_b / block_b["total"], "visited": (counts["full"] + counts["partial"])
                   / counts["blocks"], "full": counts["full"], "partial": counts["partial"],
                   "empty": counts["empty"], "ranges_build_peak_MB": ranges_peak / 1e6, "ranges_build_s": ranges_s}
            checks[f"{f}_{kind}_ranges_sizes_equal_meta"] = mask_bytes(ranges_mask) == block_b
            if EAGER_BYTES_PER_PAIR * n * n <= budget_bytes:
                real, sec, peak = _cpu_build(partial(chunk_attention_mask, q_chunks, 0, "flex_reference"))
                row.update(flex_build_peak_MB=peak / 1e6, flex_build_s=sec)
                checks[f"{f}_{kind}_cpu_sizes_equal_meta"] = mask_bytes(real) == block_b
                checks[f"{f}_{kind}_ranges_equal_create_block_mask"] = same_block_mask(real, ranges_mask)
                del real
            if n * n <= budget_bytes and kind == chunkings[0]:
                dense, sec, peak = _cpu_build(partial(chunk_attention_mask, q_chunks, 0, "sdpa"))
                row.update(dense_build_peak_MB=peak / 1e6, dense_build_s=sec)
                checks[f"{f}_dense_cpu_size_equal_meta"] = mask_bytes(dense)["total"] == dense_b
                del dense
            rows.append(row)
    return rows, checks


def _oom(e: BaseException) -> str:
    return "OOM: " + str(e).splitlines()[0][:100]


def _cuda_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``(fn(), peak torch.cuda.max_memory_allocated above what was allocated at the start)``."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, int(torch.cuda.max_memory_allocated() - base)


def _cuda_best(fn: Callable[[], Any], repeats: int) -> float:
    """Best of ``repeats`` timed calls after one untimed one (synchronised)."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def _oom(e: BaseException) -> str:
    return "OOM: " + str(e).splitlines()[0][:100]


def _sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _cuda_backend(frames: int, q_chunks: torch.Tensor, q, k, v, backend: str, repeats: int) -> dict[str, Any]:
    """One row of ``cuda_rows``: build the mask of ``backend``, then one attention call with it."""
    from core.layers.wan import _flex_attention, chunk_attention_mask  # the compiled kernel CausalWan runs

    row: dict[str, Any] = {"frames": frames, "tokens": len(q_chunks), "heads": q.shape[1], "backend": backend,
                           "status": "ok"}
    mask = None
    try:
        mask, build_peak = _cuda_peak(partial(chunk_attention_mask, q_chunks, 0, backend))
        row["build_peak_MB"] = build_peak / 1e6
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError, or an allocation failure re-raised under vmap
        if "out of memory" not in str(e).lower():
            raise
        row["build_status"] = _oom(e)
        torch.cuda.empty_cache()
    try:
        if backend == "flex":
            ranges, ranges_peak = _cuda_peak(partial(block_mask_from_chunks, q_chunks, 0))
            row["ranges_build_peak_MB"] = ranges_peak / 1e6
            if mask is not None:
                row["ranges_equal"] = same_block_mask(mask, ranges)
            mask = mask if mask is not None else ranges
            del ranges
            counts = block_counts(mask)
            row["visited"] = (counts["full"] + counts["partial"]) / counts["blocks"]
            call = partial(_flex_attention, q, k, v, mask)
        elif mask is None:
            raise RuntimeError("the dense mask did not build")
        else:
            call = partial(_sdpa, q, k, v, mask)
        row["mask_MB"] = mask_bytes(mask)["total"] / 1e6
        with torch.no_grad():
            call()  # warm-up (FlexAttention compiles here)
            _, call_peak = _cuda_peak(call)
            row.update(call_peak_MB=call_peak / 1e6, peak_MB=row["mask_MB"] + call_peak / 1e6,
                       s=_cuda_best(call, repeats))
    except torch.cuda.OutOfMemoryError as e:
        row["status"] = _oom(e)
    except RuntimeError as e:
        row["status"] = str(e).splitlines()[0][:120]
    return row


def cuda_rows(frames_list, heads_list, per_frame: int, head_dim: int, repeats: int, device: str
              ) -> list[dict[str, Any]]:
    """Peak memory and time of mask building and of one attention call, SDPA + dense vs flex + block (CUDA).

    The flex rows build the mask through ``chunk_attention_mask(..., "flex")`` (range-built, as ``CausalWan``
    does) and ``block_mask_from_chunks`` (the same function; ``ranges_equal`` compares the two builds).
    A ``flash_unmasked`` row times SDPA without a mask on the same shapes (the limit's reference).
    """
    rows = []
    for f in frames_list:
        q_chunks = token_chunks(frame_chunks("singletons", f), per_frame, device)
        n = len(q_chunks)
        for h in heads_list:
            g = torch.Generator(device=device).manual_seed(0)
            q, k, v = (torch.randn(1, h, n, head_dim, generator=g, device=device, dtype=torch.bfloat16)
                       for _ in range(3))
            for backend in ("sdpa", "flex"):
                rows.append(_cuda_backend(f, q_chunks, q, k, v, backend, repeats))
                torch.cuda.empty_cache()
            with torch.no_grad():
                flash = _cuda_best(partial(F.scaled_dot_product_attention, q, k, v), repeats)
            rows.append({"frames": f, "tokens": n, "heads": h, "backend": "flash_unmasked", "status": "ok",
                         "s": flash})
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> None:
    import argparse

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--heads", default="2,12", help="CUDA only: comma-separated head counts (head dim 128)")
    pre.add_argument("--repeats", type=int, default=3, help="CUDA only: timed repeats (best of)")
    pre.add_argument("--tokens-per-frame", type=int, default=tokens_per_frame(),
                     help="tokens per latent frame (default Wan2.1 480p: 1560; tests shrink it)")
    pre.add_argument("--results-dir", default=None, help="where the JSON goes (default benchmarks/results)")
    pre.add_argument("--cpu-build-gb", type=float, default=12.0,
                     help="memory the CPU builds with values may take (GB; --quick: a sixth)")
    own, rest = pre.parse_known_args(argv)
    args = parse_args(__doc__, rest)
    device = default_device(args.device)
    heads = [int(h) for h in own.heads.split(",") if h]
    t_start = time.perf_counter()
    per_frame = own.tokens_per_frame

    diff = check_outputs(per_frame=per_frame)
    print(f"SDPA + dense mask vs FlexAttention (eager) + block mask, 3 latent frames after 1 cached, "
          f"{per_frame} tokens each: max |diff| = {diff:.3g} (tolerance {CHECK_TOL:g})")
    if not diff <= CHECK_TOL:
        print(f"WARNING: FlexAttention with the block mask differs from SDPA with the dense mask by {diff:.3g}")

    cuda = device.startswith("cuda")  # the CUDA rows build (and compare) the masks themselves: no CPU builds
    budget = 0.0 if cuda else own.cpu_build_gb * 1e9 * (QUICK_BUDGET_FRACTION if args.quick else 1.0)
    rows, checks = cpu_rows(FRAMES, CHUNKINGS, per_frame, budget)
    print_table(rows)
    if not all(checks.values()):
        print(f"WARNING: the range-built BlockMask differs from create_block_mask's: {checks}")
    ratios: dict[str, float] = {}
    for f in FRAMES:
        r = next(r for r in rows if r["frames"] == f)
        ratios[f"dense_vs_block_bytes_{f}"] = r["dense_vs_block"]
        ratios[f"block_vs_limit_{f}"] = r["block_MB"] / r["chunk_ids_MB"]
    figures: dict[str, Any] = {
        "cpu_rows": rows, "flex_vs_sdpa_max_abs_diff": diff, "flex_matches_sdpa": diff <= CHECK_TOL,
        "range_build_checks": checks,
        "bytes_method": "dense: nbytes of chunk_attention_mask(..., 'sdpa'); block: the BlockMask's tensors + the "
                        "chunk ids its mask_mod captures, chunk_attention_mask(..., 'flex') built on the meta device "
                        "(and on the CPU at 21 frames, same sizes)",
        "build_peak_method": "peak resident set over the build (benchmarks.common.peak_memory_bytes)",
    }
    if cuda:
        cuda_table = cuda_rows(FRAMES, heads, per_frame, 128, own.repeats, device)
        print_table([{k: r.get(k, "") for k in ("frames", "heads", "backend", "mask_MB", "build_peak_MB",
                                                  "ranges_build_peak_MB", "call_peak_MB", "peak_MB", "visited",
                                                  "s", "status", "build_status")} for r in cuda_table])
        figures["cuda_rows"] = cuda_table
        for f in FRAMES:
            for h in heads:
                by = {r["backend"]: r for r in cuda_table if r["frames"] == f and r["heads"] == h}
                d, b, fl = by.get("sdpa", {}), by.get("flex", {}), by.get("flash_unmasked", {})
                if "peak_MB" in d and "peak_MB" in b:
                    ratios[f"dense_vs_block_peak_{f}_h{h}"] = d["peak_MB"] / b["peak_MB"]
                if "s" in d and "s" in b:
                    ratios[f"flex_vs_sdpa_time_{f}_h{h}"] = b["s"] / d["s"]
                if "s" in b and "s" in fl and b.get("visited"):
                    ratios[f"flex_vs_limit_{f}_h{h}"] = b["s"] / (fl["s"] * b["visited"])
    figures["wall_s"] = round(time.perf_counter() - t_start, 1)
    dev_name = f"{device} ({torch.cuda.get_device_name()})" if cuda else device
    write_result("flexforcing_mask", dev_name, args.quick, ratios, figures,
                 {"frame_hw": list(FRAME_HW), "vae_factor": VAE_FACTOR, "patch": PATCH, "tokens_per_frame": per_frame,
                  "frames": list(FRAMES), "chunkings": list(CHUNKINGS), "block": BLOCK, "num_cached": 0,
                  "cuda_heads": heads, "cuda_head_dim": 128, "cuda_dtype": "bfloat16", "torch": torch.__version__},
                 results_dir=own.results_dir, goals=GOALS, figures_only=FIGURES_ONLY)


if __name__ == "__main__":
    repeated_main(main)
