"""Shared harness for ``python -m benchmarks.<name> [--quick]``.

Every benchmark measures one thing against a baseline or a limit in the same run (these machines are
noisy: compare ratios, not absolute times), prints a table, writes ``benchmarks/results/<name>.json``
atomically as ``{"name", "device", "quick", "ratios", "spread", "runs", "goals", "goal_sources",
"figures_only", "figures", "config"}`` and ends with one line ``RESULT <name> key=value ...`` (the ratios).
Each benchmark's docstring states its limit (what cannot be beaten and why) and it reports at least one
``*_vs_limit`` ratio.

Repeats: a ratio is measured ``REPEATS`` (3) times in one run and reported as the median of those runs, with
``spread`` = (max - min) / 2 of them beside it (``runs`` keeps every value). A benchmark hands
``write_result`` a list of values per ratio; ``split_runs`` cuts one interleaved timing into ``REPEATS``
consecutive groups (a ratio per group), ``repeated_main`` runs a whole benchmark ``REPEATS`` times for those
that cannot split.

Goals: every reported ratio is either held to a goal or named a plain figure. A benchmark module declares
``GOALS`` (ratio name or ``fnmatch`` pattern -> ``Goal(target, source)``: ``"<= 0.6"`` and where that number
comes from -- the paper's claim, a limit, an anchor measured elsewhere) and ``FIGURES_ONLY`` (patterns of the
ratios reported without a goal); ``write_result`` refuses a ratio that neither names. ``benchmarks.summary
--strict`` fails when a ratio misses its goal by more than its spread.

Typical use::

    GOALS = {"new_vs_base": Goal("<= 1.0", "limit: the same work as the baseline")}
    FIGURES_ONLY = ("new_ms",)
    args = parse_args(__doc__)
    t = interleaved({"new": run_new, "base": run_base}, repeats=REPEATS * (1 if args.quick else 3))
    runs = [{"new_vs_base": g["new"].best / g["base"].best} for g in split_runs(t)]
    write_result("loaders", device, args.quick, ratios=collect(runs), figures={...}, config={...},
                 goals=GOALS, figures_only=FIGURES_ONLY)

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
import fnmatch
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
REPEATS = 3  # measurements of every ratio per run: the median is reported, half their range is the spread


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

    def split(self, n: int = REPEATS) -> list[Timing]:
        """The repeats cut into ``n`` consecutive groups (sizes differ by at most one), one ``Timing`` each."""
        if len(self.times) < n:
            raise ValueError(f"{len(self.times)} timed repeats cannot make {n} groups (time at least {n})")
        k, r = divmod(len(self.times), n)
        out, i = [], 0
        for g in range(n):
            j = i + k + (g < r)
            out.append(Timing(self.times[i:j]))
            i = j
        return out


def split_runs(timings: Mapping[str, Timing], n: int = REPEATS) -> list[dict[str, Timing]]:
    """``interleaved``'s timings as ``n`` runs: run ``g`` holds group ``g`` of every function's repeats (the
    same rounds for all, so a ratio of two ``best`` within one run compares like with like)."""
    parts = {name: t.split(n) for name, t in timings.items()}
    return [{name: p[g] for name, p in parts.items()} for g in range(n)]


def collect(runs: Sequence[Mapping[str, float]]) -> dict[str, list[float]]:
    """Ratio dicts of several runs -> ratio -> its values (a ratio missing from a run is skipped there)."""
    out: dict[str, list[float]] = {}
    for run in runs:
        for key, value in run.items():
            if value is not None:
                out.setdefault(key, []).append(float(value))
    return out


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


@dataclass(frozen=True)
class Goal:
    """The target a ratio is held to and where that number comes from.

    Attributes:
        target: ``"<= X"`` / ``">= X"`` / ``"< X"`` / ``"> X"`` (``parse_goal``).
        source: Why this number: the paper's claim, a limit (what the ratio cannot beat), or an anchor (a
            figure measured and recorded elsewhere); stored in the JSON as ``goal_sources``.
    """

    target: str
    source: str

    def __post_init__(self) -> None:
        parse_goal(self.target)
        if not str(self.source).strip():
            raise ValueError(f"goal {self.target!r}: give its source (paper claim, limit or anchor)")


def parse_goal(goal: str) -> tuple[str, float]:
    """``"<= 1.1"`` -> ``("<=", 1.1)``; a malformed goal raises ``ValueError`` naming it."""
    m = _GOAL.match(str(goal))
    if not m:
        raise ValueError(f"goal {goal!r}: expected '<= X', '>= X', '< X' or '> X'")
    return m.group(1), float(m.group(2))


def goal_met(value: float, goal: str, spread: float = 0.0) -> bool:
    """Whether ``value`` satisfies ``goal`` (see ``parse_goal``), allowing it to miss by at most ``spread``
    (the measured noise of the ratio: ``--strict`` fails only a miss larger than that)."""
    op, target = parse_goal(goal)
    s = abs(float(spread or 0.0))
    return {"<=": value - s <= target, ">=": value + s >= target, "<": value - s < target,
            ">": value + s > target}[op]


def _matching(key: str, patterns: Any) -> str | None:
    """The first of ``patterns`` (exact names or ``fnmatch`` patterns) that names ratio ``key``."""
    if key in patterns:
        return key
    return next((p for p in patterns if any(c in p for c in "*?[") and fnmatch.fnmatchcase(key, p)), None)


def resolve_goals(keys: Sequence[str], goals: Mapping[str, Goal], figures_only: Sequence[str] = ()
                  ) -> tuple[dict[str, Goal], list[str], list[str]]:
    """Per reported ratio: ``(goal of each held ratio, plain figures, uncovered ratios)``; a ratio named both
    by a goal and as a figure counts as held."""
    held, plain, uncovered = {}, [], []
    for key in keys:
        pat = _matching(key, goals)
        if pat is not None:
            held[key] = goals[pat]
        elif _matching(key, figures_only) is not None:
            plain.append(key)
        else:
            uncovered.append(key)
    return held, plain, uncovered


def median_and_spread(values: float | Sequence[float]) -> tuple[float, float, list[float]]:
    """A ratio's repeats -> (median, (max - min) / 2, the values); a single number has spread 0."""
    vals = [float(values)] if isinstance(values, (int, float)) else [float(v) for v in values]
    if not vals:
        raise ValueError("a ratio needs at least one value")
    return statistics.median(vals), (max(vals) - min(vals)) / 2, vals


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
    ratios: Mapping[str, float | Sequence[float]],
    figures: Mapping[str, Any],
    config: Mapping[str, Any],
    results_dir: str | Path | None = None,
    goals: Mapping[str, Goal] | None = None,
    figures_only: Sequence[str] = (),
) -> Path:
    """Write ``<results_dir>/<name>.json`` atomically, print the ratios and the final ``RESULT`` line.

    Args:
        name: Benchmark name (the module name under ``benchmarks``).
        device: Device the numbers were measured on, e.g. "cpu", "cuda (NVIDIA H200)".
        quick: Whether ``--quick`` sizes were used.
        ratios: The headline comparisons, each one value or the values of its ``REPEATS`` runs (reported as their
            median, with ``spread`` = half their range); meaning and direction are in the benchmark's docstring.
        figures: Supporting absolute numbers (samples/s, seconds ...).
        config: Sizes and settings the run used.
        results_dir: Override of ``benchmarks/results``.
        goals: The benchmark's ``GOALS``: ratio name or ``fnmatch`` pattern -> ``Goal(target, source)``.
        figures_only: The benchmark's ``FIGURES_ONLY``: names / patterns of ratios reported without a goal.

    Raises:
        ValueError: A reported ratio has neither a goal nor a place in ``figures_only``.
    """
    if _COLLECT is not None:
        _COLLECT.append({"name": name, "device": device, "quick": quick, "figures": dict(figures),
                         "config": dict(config), "results_dir": results_dir, "goals": goals,
                         "figures_only": figures_only,
                         "ratios": {k: median_and_spread(v)[0] for k, v in ratios.items()}})
        print("RUN " + " ".join(f"{k}={median_and_spread(v)[0]:.4g}" for k, v in ratios.items()), flush=True)
        return (Path(results_dir) if results_dir is not None else RESULTS_DIR) / f"{name}.json"
    goals = dict(goals or {})
    for key, goal in goals.items():
        if not isinstance(goal, Goal):
            raise TypeError(f"goal for {key!r} of {name}: a Goal(target, source), got {goal!r}")
    stats = {k: median_and_spread(v) for k, v in ratios.items()}
    held, plain, uncovered = resolve_goals(list(stats), goals, figures_only)
    if uncovered:
        raise ValueError(f"{name}: ratios {uncovered} have no goal and are not named in figures_only")
    out = Path(results_dir) if results_dir is not None else RESULTS_DIR
    path = out / f"{name}.json"
    record = {
        "name": name,
        "device": device,
        "quick": bool(quick),
        "dtype": bench_dtype(device.split()[0] if device else "cpu"),
        "ratios": {k: m for k, (m, _, _) in stats.items()},
        "spread": {k: s for k, (_, s, _) in stats.items()},
        "runs": {k: v for k, (_, _, v) in stats.items()},
        "goals": {k: g.target for k, g in held.items()},
        "goal_sources": {k: g.source for k, g in held.items()},
        "figures_only": plain,
        "figures": dict(figures),
        "config": dict(config),
    }
    write_json(path, record)
    print_table([{"ratio": k, "median": m, "spread": s, "runs": len(v), "goal": held[k].target if k in held else "",
                  "met": ("yes" if goal_met(m, held[k].target) else
                          ("within spread" if goal_met(m, held[k].target, s) else "NO")) if k in held else ""}
                 for k, (m, s, v) in stats.items()])
    print(f"wrote {path}")
    print(f"RESULT {name} " + " ".join(f"{k}={m:.4g}" for k, (m, _, _) in stats.items()))
    return path


_COLLECT: list[dict[str, Any]] | None = None  # set by ``repeated_main`` while it runs a benchmark


def repeated_main(main: Callable[..., Any], argv: Sequence[str] | None = None, repeats: int = REPEATS) -> None:
    """Run a benchmark's ``main`` ``repeats`` times and write one result whose ratios are the runs' medians.

    For benchmarks whose measurement cannot be cut into groups (``split_runs``): every ``write_result`` of a
    run is captured instead of written (the printed table shows each run), then the last run's record is
    written with every ratio's values from all runs (figures and config of the last run).
    """
    global _COLLECT
    captured: list[dict[str, Any]] = []
    _COLLECT = captured
    try:
        for i in range(repeats):
            print(f"-- run {i + 1} / {repeats}", flush=True)
            main(*(() if argv is None else (argv,)))
    finally:
        _COLLECT = None
    if not captured:
        raise RuntimeError("repeated_main: the benchmark wrote no result")
    last = captured[-1]
    runs = collect([c["ratios"] for c in captured])
    figures = {**last["figures"], "repeated_main": f"{len(captured)} whole runs; figures of the last"}
    write_result(last["name"], last["device"], last["quick"], runs, figures, last["config"],
                 results_dir=last["results_dir"], goals=last["goals"], figures_only=last["figures_only"])
