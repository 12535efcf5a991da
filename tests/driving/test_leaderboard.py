"""embodied drive leaderboard: paired rows, intervals, resume, one-line errors."""

from __future__ import annotations

import json

import pytest

from core.errors import ConfigError
from driving.leaderboard import mean_interval, parse_row, run_leaderboard, scene_mean_interval
from embodied.cli import main


def test_rows_and_intervals():
    assert parse_row("fast=automot,update_interval=4,refiner=true") == (
        "fast", ("automot", {"update_interval": 4, "refiner": True}))
    assert parse_row("e=expert") == ("e", ("expert", {}))
    for bad in ("noequals", "=expert", "x="):
        with pytest.raises(ConfigError, match="--row"):
            parse_row(bad)
    m, lo, hi = mean_interval([0.0, 1.0, 0.0, 1.0])
    assert m == 0.5 and hi - m == pytest.approx(1.96 * (1 / 3) ** 0.5 / 2)
    assert mean_interval([0.3]) == (0.3, 0.3, 0.3) and mean_interval([float("nan"), None, 0.2])[0] == 0.2
    # per scene: 3 scenes of 1.0 and 1 scene of 0.0 -> 0.75, not the mean of the episodes' means (0.5)
    eps = [{"scenes": [{"pdms": 1.0}] * 3}, {"scenes": [{"pdms": 0.0}]}]
    m, lo, hi = scene_mean_interval(eps, "pdms")
    assert m == 0.75 and lo < m < hi
    assert hi - m == pytest.approx(1.96 * ((3 - 0.75 * 3) ** 2 + (0 - 0.75) ** 2) ** 0.5 * 2 ** 0.5 / 4)


def test_a_leaderboard_is_paired_resumable_and_complete(tmp_path):
    out = tmp_path / "lb"
    rows = {"expert": ("expert", {}), "random": ("random", {})}
    figures = run_leaderboard(out, rows, episodes=1, seed=3, progress=False, env_kwargs={"horizon_s": 2.0})
    for name in rows:
        summary = json.loads((out / "rows" / name / "summary.json").read_text())
        assert summary["seed"] == 3 and set(summary["scenarios"]) == {
            "highway", "merge", "roundabout", "intersection", "racetrack"}
        assert figures[name]["episodes"] == 5
    assert figures["expert"]["driving_score"]["mean"] > figures["random"]["driving_score"]["mean"]
    md = (out / "leaderboard.md").read_text()
    assert "| expert |" in md and "| random |" in md and "merging (merge)" in md and "traffic_sign:" in md
    table = json.loads((out / "leaderboard.json").read_text())
    assert set(table["rows"]["expert"]) >= {"driving_score", "success_rate", "pdms", "epdms", "efficiency",
                                            "comfortness", "latency_ms", "abilities"}
    stamp = (out / "rows" / "expert" / "summary.json").stat().st_mtime_ns
    run_leaderboard(out, rows, episodes=1, seed=3, progress=False, env_kwargs={"horizon_s": 2.0})  # resumes: no rerun
    assert (out / "rows" / "expert" / "summary.json").stat().st_mtime_ns == stamp


def test_a_typo_fails_before_any_row_runs(tmp_path, capsys):
    assert main(["drive", "leaderboard", "--out", str(tmp_path / "lb"), "--row", "a=expert",
                 "--row", "b=automot,update_intervall=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean update_interval" in err[0]
    assert not (tmp_path / "lb").exists()
