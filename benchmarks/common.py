"""Shared harness for ``python -m benchmarks.<name> [--quick]``.

Every benchmark measures one thing against a baseline or a limit in the same run (these machines are
noisy: compare ratios, not absolute times), prints a table, writes ``benchmarks/results/<name>.json``
atomically as ``{"name", "device", "quick", "ratios", "goals", "figures", "config"}`` and ends with one
line ``RESULT <name> key=value ...`` (the ratios). Each benchmark's docstring states its limit (what cannot
be beaten and why) and it reports at least one ``*_vs_limit`` ratio; ``goals`` maps a ratio to the target
it is held to, as a string ``"<= 2"`` / ``">= 0.7"`` (``benchmarks.summary`` prints them side by side).

Typical use::

    args = parse_args(__doc__)
    t = interleaved({"new": run_new, "base": run_base}, repeats=3 if args.quick else 7)  # best-of-N each
    write_result("loaders", device, args.quick, ratios={...}, figures={...}, config={...},
                 goals={"new_vs_base": "<= 1.0"})

Precision: on CUDA every call timed or measured through ``timeit`` / ``interleaved`` / ``peak_memory_bytes``
runs under bf16 autocast (``--dtype auto``, the default, or ``bfloat16``); ``--dtype float32`` turns it off.
On CPU everything runs in float32 unless ``--dtype bfloat16`` is asked for. Benchmarks with their own
argument parser read the same setting from the ``BENCH_DTYPE`` environment variable (``parse_args`` sets it),
and ``write_result`` records it as ``"dtype"``.

Peak memory: ``peak_memory_bytes`` is ``torch.cuda.max_memory_allocated`` on CUDA and, on CPU, the
process's resident-set high-water mark over the call (Linux ``VmHWM``, reset through
``/proc/self/clear_refs`` after ``malloc_trim`` hands freed heap pages back), which sees every allocation —
torch tensors, kernel workspaces, MKL buffers — that tracemalloc and tensor counters miss.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import re
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
    parser.add_argument("--dtype", default=os.environ.get("BENCH_DTYPE", "auto"), choices=DTYPES,
                        help="autocast precision of the timed calls (auto: bfloat16 on CUDA, float32 on CPU)")
    args = parser.parse_args(argv)
    os.environ["BENCH_DTYPE"] = args.dtype
    return args


DTYPES = ("auto", "float32", "bfloat16")


def bench_dtype(device: str) -> str:
    """The precision timed calls run in on ``device``: ``"bfloat16"`` or ``"float32"`` (``BENCH_DTYPE``)."""
    want = os.environ.get("BENCH_DTYPE", "auto")
    if want not in DTYPES:
        raise ValueError(f"BENCH_DTYPE={want!r}: expected one of {DTYPES}")
    if want == "auto":
        return "bfloat16" if str(device).startswith("cuda") else "float32"
    return want


def precision(device: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``bench_dtype`` says so, else a no-op context."""
    if bench_dtype(device) == "float32":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=str(device).split(":")[0], dtype=torch.bfloat16)


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
    with precision(device):
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


def interleaved(fns: Mapping[str, Callable[[], Any]], warmup: int = 1, repeats: int = 5,
                device: str = "cpu") -> dict[str, Timing]:
    """Time several functions round-robin (one call of each per round), so drift on a shared machine hits
    all of them alike; compare their ``Timing.best`` (best-of-N) or ``.median``."""
    with precision(device):
        for _ in range(warmup):
            for fn in fns.values():
                fn()
                synchronize(device)
        out = {name: Timing() for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                synchronize(device)
                t0 = time.perf_counter()
                fn()
                synchronize(device)
                out[name].times.append(time.perf_counter() - t0)
    return out


def _proc_status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _rss_peak_available() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _proc_status_bytes("VmHWM")
        return True
    except (OSError, KeyError):
        return False


def peak_memory_bytes(fn: Callable[[], Any], device: str = "cpu") -> int | None:
    """Peak memory one call of ``fn`` adds on top of what is live before it (bytes; None if unmeasurable).

    CUDA: ``torch.cuda.max_memory_allocated`` above the allocated bytes at the start. CPU (Linux): the
    resident-set high-water mark during the call minus the resident set before it; freed heap memory is
    first returned to the OS (``malloc_trim``) so that re-used pages count, and the high-water mark is
    reset by writing ``5`` to ``/proc/self/clear_refs``. Returns None where ``/proc`` does not allow it.
    """
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with precision(device):
            fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    if not _rss_peak_available():
        return None
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _proc_status_bytes("VmRSS")
    with precision(device):
        fn()
    return max(0, _proc_status_bytes("VmHWM") - before)


_GOAL = re.compile(r"^\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")


def parse_goal(goal: str) -> tuple[str, float]:
    """``"<= 1.1"`` -> ``("<=", 1.1)``; a malformed goal raises ``ValueError`` naming it."""
    m = _GOAL.match(str(goal))
    if not m:
        raise ValueError(f"goal {goal!r}: expected '<= X', '>= X', '< X' or '> X'")
    return m.group(1), float(m.group(2))


def goal_met(value: float, goal: str) -> bool:
    """Whether ``value`` satisfies ``goal`` (see ``parse_goal``)."""
    op, target = parse_goal(goal)
    return {"<=": value <= target, ">=": value >= target, "<": value < target, ">": value > target}[op]


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
    goals: Mapping[str, str] | None = None,
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
        goals: Target of each held ratio, ``"<= X"`` / ``">= X"`` (``parse_goal``); a goal for a ratio that is
            not reported is an error.
    """
    goals = dict(goals or {})
    for key, goal in goals.items():
        parse_goal(goal)
        if key not in ratios:
            raise ValueError(f"goal for {key!r}, which is not a reported ratio of {name}")
    out = Path(results_dir) if results_dir is not None else RESULTS_DIR
    path = out / f"{name}.json"
    record = {
        "name": name,
        "device": device,
        "quick": bool(quick),
        "dtype": bench_dtype(device.split()[0] if device else "cpu"),
        "ratios": {k: float(v) for k, v in ratios.items()},
        "goals": goals,
        "figures": dict(figures),
        "config": dict(config),
    }
    write_json(path, record)
    print_table([{"ratio": k, "value": float(v), "goal": goals.get(k, ""),
                  "met": ("yes" if goal_met(float(v), goals[k]) else "NO") if k in goals else ""}
                 for k, v in ratios.items()])
    print(f"wrote {path}")
    print(f"RESULT {name} " + " ".join(f"{k}={float(v):.4g}" for k, v in ratios.items()))
    return path
