"""Run logging: a JSON-lines metrics file, TensorBoard scalars and a progress bar — on rank 0 only."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from core.io import atomic_open

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def get_logger(name: str = "embodied") -> logging.Logger:
    """A module logger writing to stderr once per process (no duplicate handlers)."""
    root = logging.getLogger("embodied")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("EMBODIED_LOG_LEVEL", "INFO"))
        root.propagate = False
    return root if name == "embodied" else root.getChild(name.removeprefix("embodied."))


class MetricsLogger:
    """Writes ``metrics.jsonl`` (one ``{"step": s, ...}`` object a line) and TensorBoard event files.

    On resume, lines past the resumed step are dropped first (rewritten atomically), so the file
    never holds two histories for the same steps.
    """

    def __init__(self, out_dir: str | Path, enabled: bool = True, tensorboard: bool = True,
                 resume_step: int | None = None):
        self.enabled = enabled
        self.path = Path(out_dir) / "metrics.jsonl"
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [ln for ln in self.path.read_text().splitlines() if _step_of(ln) <= resume_step]
            with atomic_open(self.path, "w") as f:
                f.writelines(ln + "\n" for ln in kept)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"), purge_step=resume_step)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one ``{"step": step, **metrics}`` line (and the finite scalars to TensorBoard)."""
        if not self.enabled:
            return
        clean = {k: _scalar(v) for k, v in metrics.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        """Flush and close TensorBoard (the JSONL file is closed after every line)."""
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """All rows of a run's ``metrics.jsonl``."""
    path = Path(out_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def progress(iterable=None, total: int | None = None, desc: str = "", enabled: bool = True, initial: int = 0):
    """A tqdm progress bar on stderr (disabled on non-main ranks or when asked)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=not enabled, initial=initial, dynamic_ncols=True,
                leave=False, file=sys.stderr)


def _scalar(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        return v.item()
    return v


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 1 << 62  # drop unreadable lines (a torn last line after a kill)
