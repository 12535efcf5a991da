"""Helpers of the methods' experiment drivers (``python -m <method>.experiments``): every arm runs through the
public CLI in its own process, one thread each, and results are summarised as mean and spread over seeds."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path


def run_cli(args: list[str], log: str | Path, threads: int = 1) -> None:
    """Run ``embodied ARGS...`` in a child process with ``threads`` intra-op threads, appending its output to
    ``log``; a failing command raises ``subprocess.CalledProcessError`` (the log says why)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        subprocess.run([sys.executable, "-m", "embodied.cli", *args], check=True, env=env, stdout=f,
                       stderr=subprocess.STDOUT)


def mean_sd(values: list[float]) -> dict[str, float]:
    """``{"mean", "sd"}`` of per-seed values (sample standard deviation; 0 for a single value)."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}
