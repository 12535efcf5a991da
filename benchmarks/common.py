"""Shared harness for ``python -m benchmarks.<name> [--quick]``.

Every benchmark measures one thing against a baseline or a limit in the same run (these machines are
noisy: compare ratios, not absolute times), prints a table, writes ``benchmarks/results/<name>.json``
atomically as ``{"name", "device", "quick", "ratios", "figures", "config"}`` and ends with one line
``RESULT <name> key=value ...`` (the ratios).

Typical use::

    args = parse_args(__doc__)
    t = timeit(lambda: run_once(), warmup=1, repeats=3 if args.quick else 7)
    write_result("loaders", device, args.quick, ratios={...}, figures={...}, config={...})
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.io import write_json

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parse_args(description: str | None = None, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the common flags: ``--quick`` (small sizes, few repeats) and ``--device`` (default auto)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (CI, make bench)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    return parser.parse_args(argv)


def default_device(requested: str | None = None) -> str:
    """``requested``, else ``"cuda"`` when available, else ``"cpu"``."""
    if requested:
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def synchronize(device: str) -> None:
    """Wait for queued device work (a no-op on CPU), so timings include it."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


@dataclass
class Timing:
    """Wall-clock seconds of the measured repeats (warm-up runs excluded)."""

    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)


def timeit(fn: Callable[[], Any], warmup: int = 1, repeats: int = 5, device: str = "cpu") -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed (device synchronised)."""
    for _ in range(warmup):
        fn()
        synchronize(device)
    t = Timing()
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        t.times.append(time.perf_counter() - t0)
    return t


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    """Print a list of dicts (same keys) as an aligned text table."""
    if not rows:
        return
    cols = list(rows[0])
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def write_result(
    name: str,
    device: str,
    quick: bool,
    ratios: Mapping[str, float],
    figures: Mapping[str, Any],
    config: Mapping[str, Any],
    results_dir: str | Path | None = None,
) -> Path:
    """Write ``<results_dir>/<name>.json`` atomically, print the ratios and the final ``RESULT`` line.

    Args:
        name: Benchmark name (the module name under ``benchmarks``).
        device: Device the numbers were measured on, e.g. "cpu", "cuda (NVIDIA H200)".
        quick: Whether ``--quick`` sizes were used.
        ratios: The headline comparisons; each one's meaning and direction is in the benchmark's docstring.
        figures: Supporting absolute numbers (samples/s, seconds ...).
        config: Sizes and settings the run used.
        results_dir: Override of ``benchmarks/results``.
    """
    out = Path(results_dir) if results_dir is not None else RESULTS_DIR
    path = out / f"{name}.json"
    record = {
        "name": name,
        "device": device,
        "quick": bool(quick),
        "ratios": {k: float(v) for k, v in ratios.items()},
        "figures": dict(figures),
        "config": dict(config),
    }
    write_json(path, record)
    print_table([{"ratio": k, "value": float(v)} for k, v in ratios.items()])
    print(f"wrote {path}")
    print(f"RESULT {name} " + " ".join(f"{k}={float(v):.4g}" for k, v in ratios.items()))
    return path
