"""Benchmark: SoLA's linear variant (one sparse key-value aggregation) against the explicit per-query gather
of the same linear attention, and against the softmax variant, as tokens N and neighbourhood K grow.

Forward passes of the three functions in ``perception.spherical.attention`` on icosphere levels (N = 642,
2562, 10242) with k-ring neighbourhoods (K = 7, 19, 37), batch 1, 4 heads of 16 channels:
    linear     ``sola_linear_attention``     S = A @ [k~ v^T | k~], one sparse product, no neighbour gather
    gather     ``linear_attention_gather``   the same numbers, every query gathers its K lifted keys / values
    softmax    ``sola_softmax_attention``    local softmax (factorised scores, gathered keys / values)
Peak memory is ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the peak of live tensors the three
functions allocate, tracked op by op (a dispatch-mode counter; storage shared by views counted once).

Ratios at the largest (N, K) measured (lower is better for all; 1.0 = parity with the gather):
    ``linear_vs_gather_time``    time of the aggregation / time of the gather implementation
    ``linear_vs_gather_memory``  peak memory of the aggregation / of the gather implementation
    ``softmax_vs_gather_time``   time of the softmax variant / the gather implementation
    ``linear_time_growth_k``     linear time at the largest K / at the smallest K (same N): how it scales in K
    ``gather_time_growth_k``     the same for the gather
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import default_device, parse_args, print_table, synchronize, timeit, write_result
from perception.spherical.attention import (
    SphereGrid,
    linear_attention_gather,
    sola_linear_attention,
    sola_softmax_attention,
)


class _PeakMemory(TorchDispatchMode):
    """Peak bytes of live tensors created by ops inside the mode (CPU fallback for max_memory_allocated)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not t.is_sparse:
                key = t.untyped_storage().data_ptr()
                if key in self._seen or key == 0:
                    continue
                n = t.untyped_storage().nbytes()
                self._seen.add(key)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, key, n)
        return out

    def _free(self, key: int, n: int) -> None:
        if key in self._seen:
            self._seen.discard(key)
            self.live -= n


def peak_bytes(fn, device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with _PeakMemory() as m:
        fn()
    return m.peak


def measure(level: int, ring: int, heads: int, d: int, device: str, repeats: int) -> dict[str, float]:
    """Time (median ms) and peak memory (MiB) of the three functions on one (level, ring)."""
    grid = SphereGrid(level, ring).to(device)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, grid.n, d, generator=g).to(device) for _ in range(3))
    b, w = torch.ones(heads, device=device), torch.ones(heads, device=device)
    adj = grid.adjacency()
    fns = {
        "linear": lambda: sola_linear_attention(q, k, v, grid.dirs, adj, b, w),
        "gather": lambda: linear_attention_gather(q, k, v, grid.dirs, grid.index, grid.mask, b, w),
        "softmax": lambda: sola_softmax_attention(q, k, v, grid.dirs, grid.index, grid.mask, b, w),
    }
    row = {"N": grid.n, "K": grid.index.shape[1], "max_abs_diff": float((fns["linear"]() - fns["gather"]()).abs().max())}
    for name, fn in fns.items():
        row[f"{name}_ms"] = 1e3 * timeit(fn, warmup=1, repeats=repeats, device=device).median
        row[f"{name}_MiB"] = peak_bytes(fn, device) / 2**20
    synchronize(device)
    return row


def main() -> None:
    args = parse_args(__doc__)
    device = default_device(args.device)
    levels = [3, 4] if args.quick else [3, 4, 5]
    rings = [1, 2] if args.quick else [1, 2, 3]
    heads, d = 4, 16
    with torch.no_grad():
        rows = [measure(lv, r, heads, d, device, 3 if args.quick else 7) for lv in levels for r in rings]
    print_table(rows)
    last = rows[-1]
    same_n = [r for r in rows if r["N"] == last["N"]]
    ratios = {
        "linear_vs_gather_time": last["linear_ms"] / last["gather_ms"],
        "linear_vs_gather_memory": last["linear_MiB"] / max(last["gather_MiB"], 1e-9),
        "softmax_vs_gather_time": last["softmax_ms"] / last["gather_ms"],
        "linear_time_growth_k": same_n[-1]["linear_ms"] / same_n[0]["linear_ms"],
        "gather_time_growth_k": same_n[-1]["gather_ms"] / same_n[0]["gather_ms"],
    }
    dev_name = device if not device.startswith("cuda") else f"cuda ({torch.cuda.get_device_name()})"
    write_result("sola", dev_name, args.quick, ratios, {"rows": rows},
                 {"levels": levels, "rings": rings, "heads": heads, "head_dim": d, "batch": 1})


if __name__ == "__main__":
    main()
