"""core.experiments: the experiment drivers' CLI runner and per-seed statistics."""

from __future__ import annotations

import subprocess

import pytest

from core.experiments import mean_sd, run_cli


def test_mean_sd_is_the_sample_statistics():
    assert mean_sd([1.0, 2.0, 3.0]) == {"mean": 2.0, "sd": 1.0}
    assert mean_sd([4.0]) == {"mean": 4.0, "sd": 0.0}


def test_run_cli_appends_output_and_raises_on_failure(tmp_path):
    log = tmp_path / "logs" / "run.log"
    run_cli(["methods"], log)
    assert "flexforcing" in log.read_text()
    with pytest.raises(subprocess.CalledProcessError):
        run_cli(["train", "no_such_method"], log)
    assert "no_such_method" in log.read_text()  # appended: the first run's output is still there
    assert "flexforcing" in log.read_text()
