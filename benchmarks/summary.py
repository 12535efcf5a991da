"""One table of every benchmark ratio with its goal: reads ``benchmarks/results/*.json``.

Each benchmark's JSON holds ``ratios`` (the median of its repeats), ``spread`` (half the range of the repeats)
and, under ``goals`` / ``goal_sources``, the target of the ratios it is held to (``"<= 1.1"`` / ``">= 0.7"``,
see ``benchmarks.common.parse_goal``) and where that target comes from. This prints one row per ratio —
benchmark, ratio, value, spread, goal, met (yes; "within spread" when the value misses the goal by no more
than its spread; NO; blank when the ratio is a plain figure), quick or full run, dtype, device — and a last
line counting goals met. It measures nothing and writes nothing.

    python -m benchmarks.summary [--results DIR] [--strict]

``--strict`` exits with code 1 when a ratio misses its goal by more than its measured spread (noise alone
cannot trip it; ``make bench`` ends with it); ``--quick`` is accepted and ignored so that ``make bench``'s
loop over ``benchmarks/*.py`` can run it too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, goal_met, print_table


def load_results(results_dir: str | Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every ``<name>.json`` benchmark record in ``results_dir`` (sorted by name); unreadable files and
    files without ``ratios`` are reported on stderr and skipped."""
    records = []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            print(f"{path}: unreadable ({e}); skipped", file=sys.stderr)
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("ratios"), dict):
            print(f"{path}: no 'ratios'; skipped", file=sys.stderr)
            continue
        rec.setdefault("name", path.stem)
        records.append(rec)
    return records


def summary_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (benchmark, ratio): value, spread, goal, met."""
    rows = []
    for rec in records:
        goals = rec.get("goals") or {}
        spreads = rec.get("spread") or {}
        for key, value in rec["ratios"].items():
            goal = goals.get(key, "")
            spread = float(spreads.get(key) or 0.0)
            met = ""
            if goal:
                try:
                    met = ("yes" if goal_met(float(value), goal) else
                           "within spread" if goal_met(float(value), goal, spread) else "NO")
                except ValueError:
                    met = "bad goal"
            rows.append({"benchmark": rec["name"], "ratio": key, "value": float(value), "spread": spread,
                         "goal": goal, "met": met,
                         "run": "quick" if rec.get("quick") else "full", "dtype": rec.get("dtype", "float32"),
                         "device": rec.get("device", "")})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(RESULTS_DIR), help="folder of <name>.json results")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a ratio misses its goal by more than its measured spread")
    parser.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = summary_rows(load_results(args.results))
    if not rows:
        print(f"no benchmark results in {args.results} (run `make bench`)")
        return 0
    print_table(rows)
    held = [r for r in rows if r["goal"]]
    missed = [r for r in held if r["met"] not in ("yes", "within spread")]
    noisy = [r for r in held if r["met"] == "within spread"]
    print(f"{len(held) - len(missed) - len(noisy)}/{len(held)} goals met"
          + (f", {len(noisy)} within their spread (" + ", ".join(f"{r['benchmark']}.{r['ratio']}" for r in noisy)
             + ")" if noisy else "")
          + ("; missed beyond the spread: " + ", ".join(f"{r['benchmark']}.{r['ratio']}" for r in missed)
             if missed else ""))
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
