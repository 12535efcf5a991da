"""Every method's experiment driver imports, explains itself and tabulates an empty grid folder."""

from __future__ import annotations

import importlib

import pytest

DRIVERS = ["perception.normals", "perception.spherical", "perception.forensics", "perception.video",
           "perception.adapters", "perception.i2v_rl", "worldmodels.lacwm", "driving.automot"]
COLLECT = {  # driver -> the arguments that only tabulate the finished runs of a grid folder
    "perception.normals": ["glass", "--collect-only"],
    "perception.forensics": ["--collect-only"],
    "perception.video": ["--collect-only"],
    "perception.adapters": ["--collect-only"],
    "perception.i2v_rl": ["--summary-only"],  # the old name of --collect-only
    "driving.automot": ["--collect-only"],
}


@pytest.mark.parametrize("package", DRIVERS)
def test_driver_help_parses(package, capsys):
    main = importlib.import_module(f"{package}.experiments").main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("package", sorted(COLLECT))
def test_driver_collects_an_empty_folder_without_running_anything(package, tmp_path, monkeypatch):
    from core import experiments

    def no_run(*args, **kwargs):
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(experiments, "run_cli", no_run)
    module = importlib.import_module(f"{package}.experiments")
    monkeypatch.setattr(module, "run_cli", no_run, raising=False)
    result = module.main([*COLLECT[package], "--out", str(tmp_path / "grid")])
    assert result == 0 or isinstance(result, dict) and not result.get("failed")
