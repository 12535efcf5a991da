"""Run logging: a JSON-lines metrics file, TensorBoard scalars and a progress bar — on rank 0 only.

Also the one place where third-party console chatter is turned down (``quiet_third_party``: the CLI calls it
unless ``--verbose``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import sys
import warnings
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


def progress(iterable=None, total: int | None = None, desc: str = "", enabled: bool = True, initial: int = 0,
             unit: str = "it"):
    """A tqdm progress bar on stderr (disabled on non-main ranks or when asked).

    On a terminal it redraws up to 10 times a second; when stderr is a file or a pipe (a log), at most every
    ``NON_TTY_INTERVAL_S`` seconds, so a log gets a few status lines rather than thousands.
    """
    from tqdm.auto import tqdm

    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    return tqdm(iterable, total=total, desc=desc, disable=not enabled, initial=initial, dynamic_ncols=True,
                leave=False, file=sys.stderr, unit=unit, mininterval=0.1 if tty else NON_TTY_INTERVAL_S)


NON_TTY_INTERVAL_S = 10.0

# Third-party chatter that says nothing about the user's run (each seen in `embodied` commands' stderr):
# gym's "unmaintained" banner (print()ed on `import gym`, which LIBERO does), robosuite's import-time macro /
# optional-package WARNINGs and per-env controller INFO lines, highway-env's "Route ... does not start after
# current road" warnings (tens per driving evaluation).
QUIET_LOGGERS = {"highway_env": logging.ERROR, "robosuite_logs": logging.ERROR, "libero": logging.ERROR}
QUIET_PACKAGES = ("gym", "gymnasium", "robosuite", "highway_env", "libero", "pygame", "mujoco")
_quiet = False


class _AtLeast(logging.Filter):
    """Keeps records of ``level`` and above; unlike ``setLevel`` it survives a library resetting its level."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


def quiet_third_party() -> None:
    """Turn down the third-party console chatter listed in ``QUIET_LOGGERS`` / above (idempotent).

    Errors still show. Call it before the libraries are imported (robosuite logs while importing); processes a
    command spawns call it again (``third_party_quiet`` says whether to).
    """
    global _quiet
    _quiet = True
    for name, level in QUIET_LOGGERS.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(isinstance(f, _AtLeast) for f in logger.filters):  # robosuite sets its own level on import
            logger.addFilter(_AtLeast(level))
    # Python warnings raised from inside those packages: gym installs its own filters on import (ahead of any
    # set here), so they are dropped where they are shown instead
    if not getattr(warnings.showwarning, "_embodied_quiet", False):
        warnings.showwarning = _quiet_showwarning(warnings.showwarning, _package_dirs(QUIET_PACKAGES))
    if importlib.util.find_spec("gym_notices") is not None:  # gym prints gym_notices' banner on import
        import gym_notices.notices as gym_notices

        gym_notices.notices.clear()


def _package_dirs(names: tuple[str, ...]) -> tuple[str, ...]:
    """The installed folders of the top-level packages ``names`` (found without importing them)."""
    dirs = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        dirs += [os.path.join(d, "") for d in (spec.submodule_search_locations or ())] if spec else []
    return tuple(dirs)


def _quiet_showwarning(shown, dirs: tuple[str, ...]):
    """``warnings.showwarning`` that drops warnings attributed to a file under ``dirs``, shows the others."""

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not str(filename).startswith(dirs):
            shown(message, category, filename, lineno, file, line)

    showwarning._embodied_quiet = True
    return showwarning


def third_party_quiet() -> bool:
    """Whether ``quiet_third_party`` ran in this process (worker processes repeat it when it did)."""
    return _quiet


def _scalar(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        return v.item()
    return v


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 1 << 62  # drop unreadable lines (a torn last line after a kill)
