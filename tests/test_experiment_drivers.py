"""Every method's study runs from `embodied experiment METHOD`: it explains itself, tabulates an empty grid
folder without running anything, and the drivers' old `python -m` spelling says where the command went."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from core.registry import method_specs
from embodied.cli import main

STUDIES = {s.name: s.experiment for s in method_specs() if s.experiment}
COLLECT = {  # method -> the arguments that only tabulate the finished runs of a grid folder
    "transnormal": ["glass", "--collect-only"],
    "deepvrm": ["--collect-only"],
    "flexforcing": ["--collect-only"],
    "fera": ["--collect-only"],
    "tagrpo": ["--summary-only"],  # the old name of --collect-only
    "automot": ["--collect-only"],
}


def test_every_method_with_a_driver_module_declares_its_study():
    # a method folder with an experiments module is reachable from `embodied experiment`
    for spec in method_specs():
        package = spec.folder.replace("/", ".")
        try:
            importlib.import_module(f"{package}.experiments")
        except ModuleNotFoundError:
            continue
        assert spec.experiment and spec.experiment.startswith(f"{package}.experiments:"), spec.name
    assert set(COLLECT) <= set(STUDIES) and len(STUDIES) == 8


@pytest.mark.parametrize("method", sorted(STUDIES))
def test_study_help_parses(method, capsys):
    with pytest.raises(SystemExit) as e:
        main(["experiment", method, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith(f"usage: embodied experiment {method}")


@pytest.mark.parametrize("method", sorted(COLLECT))
def test_study_collects_an_empty_folder_without_running_anything(method, tmp_path, monkeypatch):
    from core import experiments

    def no_run(*args, **kwargs):
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(experiments, "run_cli", no_run)
    module = importlib.import_module(STUDIES[method].partition(":")[0])
    monkeypatch.setattr(module, "run_cli", no_run, raising=False)
    assert main(["experiment", method, *COLLECT[method], "--out", str(tmp_path / "grid")]) == 0


def test_unknown_study_option_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["experiment", "flexforcing", "--no-such-option"])
    assert e.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_overrides_may_follow_the_flags(tmp_path, monkeypatch):
    seen = {}
    module = importlib.import_module("worldmodels.lacwm.experiments")
    monkeypatch.setattr(module, "reevaluate", lambda overrides, counts, out, plan: seen.update(
        overrides=overrides, counts=counts, plan=plan) or {"rows": []})
    assert main(["experiment", "lacwm", "reeval", "debug=tiny", "--counts", "1", "--plan",
                 "trainer.max_steps=2"]) == 0
    assert seen == {"overrides": ["debug=tiny", "trainer.max_steps=2"], "counts": [1], "plan": True}


@pytest.mark.parametrize("method", ["flexforcing", "lacwm"])
def test_old_python_m_spelling_says_where_the_command_went(method):
    module = STUDIES[method].partition(":")[0]
    r = subprocess.run([sys.executable, "-m", module, "--steps", "3"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert f"embodied experiment {method}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
