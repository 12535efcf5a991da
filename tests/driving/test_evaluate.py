"""`embodied drive eval`: paired closed-loop episodes, scored and recorded."""

from __future__ import annotations

import json

import pytest

from core.data.trajectories import TrajectoryFile
from driving.evaluate import evaluate_policy
from embodied.cli import main


@pytest.mark.timeout(600)
def test_expert_outscores_constant_on_paired_seeds(tmp_path):
    idm = evaluate_policy("idm", "highway", episodes=2, out=tmp_path / "idm", seed=3, video=False)
    const = evaluate_policy("constant", "highway", episodes=2, out=tmp_path / "const", seed=3, video=False)
    assert [r["seed"] for r in idm["episodes"]] == [r["seed"] for r in const["episodes"]] == [3, 4]
    assert idm["aggregate"]["collision_rate"] == 0.0
    assert idm["aggregate"]["progress_m"] > 0
    # Strict and paired: the expert wins on every seed, not just on average and not by a tie (two runs of one
    # policy, or an evaluator that scores everything 0, would tie). Lane keeping at constant speed crashes
    # into the traffic ahead on these seeds, so the comparison is not vacuous.
    assert const["aggregate"]["collision_rate"] > 0
    for e_idm, e_const in zip(idm["episodes"], const["episodes"], strict=True):
        assert e_idm["driving_score"] > e_const["driving_score"], (e_idm, e_const)
    assert idm["aggregate"]["success_rate"] > const["aggregate"]["success_rate"]
    assert idm["aggregate"]["driving_score"] > const["aggregate"]["driving_score"]
    saved = json.loads((tmp_path / "idm" / "metrics.json").read_text())
    assert saved["aggregate"] == pytest.approx(idm["aggregate"])
    hdf5 = next((tmp_path / "idm").glob("*.hdf5"))
    with TrajectoryFile(hdf5) as f:  # driving logs in the shared trajectory format
        assert len(f.episodes) == 2
        assert f.attrs("demo_0")["embodiment"] == "ego_car"


def test_cli_errors(tmp_path, capsys):
    assert main(["drive", "eval", "--policy", "automot", "--scenario", "highway", "--out", str(tmp_path)]) == 3
    assert "not built yet" in capsys.readouterr().err
    assert main(["drive", "eval", "--policy", "idm", "--scenario", "highwy", "--out", str(tmp_path)]) == 2
    assert "unknown scenario 'highwy'" in capsys.readouterr().err
    assert main(["drive", "eval", "--policy", "nope", "--scenario", "highway", "--out", str(tmp_path)]) == 2
