"""``embodied models``: the shipped checkpoints and a user's local ones, with their model cards' fields.

A row is one model folder: an export (``config.json`` + ``model.safetensors`` + ``README.md`` card), a
training checkpoint (``checkpoints/step_N``) or a run directory (its ``checkpoints/latest``). The fields come
from the card's front matter (``core.pretrained.read_card``) and, where a card is silent, from ``config.json``
and the weights file's header (the tensors are never read). Nothing is written and no model is built, so
listing a folder of paper-size models takes as long as reading their headers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from core.checkpoint import CONFIG_FILE, MODEL_FILE, latest_checkpoint
from core.errors import CheckpointError, ConfigError, EmbodiedError

FIELDS = ("method", "parameters", "training_domain", "data", "metrics", "base", "upstream")
_MAX_DEPTH = 4  # how deep a folder argument is searched for model folders
_SKIP = {"__pycache__", "node_modules", "wandb"}


def shipped_root() -> Path:
    """``assets/checkpoints`` of this installation."""
    from core.resources import asset

    return asset("checkpoints")


def is_model_folder(path: Path) -> bool:
    """A folder holding ``config.json`` and ``model.safetensors`` (an export or a training checkpoint)."""
    return (path / CONFIG_FILE).is_file() and (path / MODEL_FILE).is_file()


def find_models(root: Path, max_depth: int = _MAX_DEPTH) -> Iterator[tuple[Path, Path]]:
    """``(name folder, model folder)`` for each model under ``root``: a run directory counts once (its latest).

    Raises:
        ConfigError: ``root`` is not a folder.
    """
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder")

    def walk(d: Path, depth: int) -> Iterator[tuple[Path, Path]]:
        if is_model_folder(d):
            yield d, d
            return
        latest = latest_checkpoint(d / "checkpoints") if (d / "checkpoints").is_dir() else None
        if latest is not None:
            yield d, latest
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")
                              and p.name not in _SKIP)
        except OSError:
            return
        for child in children:
            yield from walk(child, depth + 1)

    yield from walk(root, 0)


def _stored_parameters(weights: Path) -> int:
    """Number of values in a safetensors file, from its header alone."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def _bases(model_section: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in model_section.items()
            if isinstance(v, str) and v and (k == "base_path" or k.endswith("_path")) and k != "out_path"}


def _display(root: Path, name: Path) -> str:
    """``name`` relative to the searched ``root`` (``fera/lora``), or its own name when it is ``root``."""
    return name.name if name == root else name.relative_to(root).as_posix()


def describe(name: str, folder: Path, where: str, run: bool = False) -> dict[str, Any]:
    """The row of one model folder: ``FIELDS`` plus ``name``, ``path``, ``where`` and ``error`` (None when fine).

    ``run``: ``folder`` is the latest checkpoint of the run directory ``name`` (the row then names it).
    """
    from core.io import read_json
    from core.pretrained import read_card

    row: dict[str, Any] = {"name": name, "path": str(folder), "where": where, "error": None}
    row.update({f: None for f in FIELDS})
    try:
        card = read_card(folder)
        config = read_json(folder / CONFIG_FILE)
        if not isinstance(config, dict):
            raise CheckpointError(f"{folder / CONFIG_FILE}: not a JSON object")
        model = config.get("model") if isinstance(config.get("model"), dict) else {}
        row["method"] = card.get("method") or config.get("method")
        row["parameters"] = card.get("parameters")
        if row["parameters"] is None:
            row["parameters_stored"] = _stored_parameters(folder / MODEL_FILE)
        row["training_domain"] = card.get("training_domain")
        row["data"] = card.get("data")
        row["metrics"] = card.get("metrics")
        if not row["metrics"] and card.get("metrics_note"):  # a card without metrics says why
            row["metrics_note"] = str(card["metrics_note"])
        row["base"] = card.get("base") or _bases(model) or None
        row["upstream"] = card.get("upstream")
        if run:  # a run directory: say which checkpoint
            row["checkpoint"] = folder.name
    except (EmbodiedError, OSError, ValueError) as e:
        row["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    return row


def list_models(folders: Iterable[str | Path] = (), shipped: bool = True) -> list[dict[str, Any]]:
    """Rows for the shipped checkpoints (``shipped``) and for every model under each of ``folders``."""
    rows = []
    if shipped:
        root = shipped_root()
        rows += [describe(_display(root, n), f, "shipped", n != f) for n, f in find_models(root, max_depth=2)]
    for folder in folders:
        folder = Path(folder)
        rows += [describe(_display(folder, n), f, "local", n != f) for n, f in find_models(folder)]
    return rows


def _count(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


def _flat(metrics: Any, prefix: str = "") -> list[str]:
    """``a.b=value`` items of a (nested) metrics dict; numbers shortened."""
    if not isinstance(metrics, dict):
        return [f"{prefix.rstrip('.')}={metrics}"] if prefix else [str(metrics)]
    out = []
    for k, v in metrics.items():
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(f"{prefix}{k}={v:.4g}")
        elif isinstance(v, str) and len(v) <= 40:
            out.append(f"{prefix}{k}={v}")
    return out


def format_rows(rows: list[dict[str, Any]], width: int = 100) -> str:
    """Human-readable blocks, one per model."""
    import textwrap

    lines = []
    for r in rows:
        lines.append(f"{r['name']}  ({r['where']}: {r['path']})")
        if r["error"]:
            lines.append(f"  error: {r['error']}")
            continue
        params = _count(r["parameters"]) if r["parameters"] is not None else \
            f"{_count(r.get('parameters_stored'))} stored (no card)"
        base = ", ".join(f"{k}={v}" for k, v in (r["base"] or {}).items()) or "—"
        up = ", ".join(r["upstream"]) if r["upstream"] else "—"
        head = f"  method: {r['method'] or '—'}   parameters: {params}   base: {base}   upstream: {up}"
        if r.get("checkpoint"):
            head += f"   checkpoint: {r['checkpoint']}"
        lines.append(head)
        for label, key in (("domain", "training_domain"), ("data", "data")):
            text = str(r[key]) if r[key] else "—"
            lines += textwrap.wrap(text, width, initial_indent=f"  {label + ':':<9}", subsequent_indent=" " * 11)
        items = _flat(r["metrics"]) if r["metrics"] else []
        text = "  ".join(items) or ("— (" + r["metrics_note"] + ")" if r.get("metrics_note") else "—")
        lines += textwrap.wrap(text, width, initial_indent="  metrics: ", subsequent_indent=" " * 11)
    return "\n".join(lines)


def run(args) -> int:
    """``embodied models [FOLDER ...] [--json] [--no-shipped]``: 1 when a folder's card or config is unreadable."""
    import shutil

    rows = list_models(args.folders, shipped=not args.no_shipped)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    elif rows:
        print(format_rows(rows, width=max(60, shutil.get_terminal_size((110, 20)).columns - 2)))
    else:
        print("no model folders found")
    bad = [r for r in rows if r["error"]]
    for r in bad:
        import sys

        print(f"embodied: models: {r['path']}: {r['error']}", file=sys.stderr)
    return 1 if bad else 0
