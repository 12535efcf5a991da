"""Readable results: the short aligned table that ``embodied eval METHOD`` prints (the full JSON is on disk).

A method names its headline metrics once, in ``register_method(..., headline=[...])``: each entry is a
pattern over the result's flattened keys (``*`` matches anything, dots included: ``policies.*.success_rate``;
every other character is literal)
with its unit and an optional display scale: ``("closed_loop.*.all.driving_score", "%", 100)`` shows a
fraction stored in the JSON as a percentage. Without ``headline`` the table shows the first numeric values of
the result. Lists of numbers flatten to ``key[i]``, and ``key[-1]`` names the last one (e.g. the PSNR at the
last step of a rollout); those appear only when a headline names them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MAX_ROWS = 12

#: One headline entry: (pattern, unit) or (pattern, unit, scale).
Headline = tuple


def flatten(result: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a nested result as ``{"a.b.c": value}`` (strings, bools and None left out)."""
    out: dict[str, float] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)) and value and all(_is_number(v) for v in value):
            for i, v in enumerate(value):
                out[f"{name}[{i}]"] = v
            out[f"{name}[-1]"] = value[-1]
        elif _is_number(value):
            out[name] = value
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _entries(headline: Sequence[Any]) -> list[tuple[str, str, float]]:
    rows = []
    for entry in headline:
        pattern, unit, scale = (entry, "", 1.0) if isinstance(entry, str) else (*entry, 1.0)[:3]
        rows.append((str(pattern), str(unit), float(scale)))
    return rows


def headline_rows(result: Mapping[str, Any], headline: Sequence[Any] = (),
                  max_rows: int = MAX_ROWS) -> tuple[list[tuple[str, float, str]], int]:
    """The rows ``(metric, value, unit)`` to show and how many numeric values were left out of them.

    With ``headline``: the values whose keys match an entry, in entry order, each scaled for display. Without:
    the numeric values in the result's order (list items excluded). At most ``max_rows`` rows.
    """
    flat = flatten(result)
    plain = {k: v for k, v in flat.items() if not k.endswith("]")}
    rows: list[tuple[str, float, str]] = []
    if headline:
        seen: set[str] = set()
        for pattern, unit, scale in _entries(headline):
            regex = re.compile(".*".join(map(re.escape, pattern.split("*"))))
            for key, value in flat.items():
                if key not in seen and regex.fullmatch(key):
                    seen.add(key)
                    rows.append((key, value * scale, unit))
    else:
        rows = [(k, v, "") for k, v in plain.items()]
    shown = rows[:max_rows]
    return shown, len(plain) - sum(1 for k, _, _ in shown if k in plain)


def _value(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


def format_table(rows: Sequence[tuple[str, float, str]]) -> str:
    """``metric | value | unit`` as aligned plain-text columns (metric left, value right aligned)."""
    cells = [(m, _value(v), u) for m, v, u in rows]
    head = ("metric", "value", "unit")
    w = [max(len(r[i]) for r in [head, *cells]) for i in range(3)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]}".rstrip() for r in [head, *cells]]
    lines.insert(1, f"{'-' * w[0]}  {'-' * w[1]}  {'-' * w[2]}")
    return "\n".join(lines)


def result_file(out_dir: str | Path, since: float) -> Path | None:
    """The evaluation JSON an eval wrote into ``out_dir`` (the newest ``eval*.json`` modified after ``since``)."""
    d = Path(out_dir)
    files = [p for p in d.glob("eval*.json") if p.is_file() and p.stat().st_mtime >= since] if d.is_dir() else []
    return max(files, key=lambda p: p.stat().st_mtime) if files else None


def eval_report(name: str, result: Mapping[str, Any], headline: Sequence[Any] = (),
                json_path: str | Path | None = None) -> str:
    """What ``embodied eval NAME`` prints: one title line, the headline table, where the full results are."""
    rows, left = headline_rows(result, headline)
    where = f" (full results: {json_path})" if json_path else ""
    if not rows:
        return f"evaluated {name}: no numeric results{where}"
    tail = f"\n{left} more value{'s' if left != 1 else ''} in {json_path or 'the result'}" if left > 0 else ""
    return f"evaluated {name}{where}\n{format_table(rows)}{tail}"
