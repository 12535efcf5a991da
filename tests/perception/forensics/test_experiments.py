"""The Deep-VRM experiment driver's summary and the layer probe, on cases with known answers."""

from __future__ import annotations

import json

import numpy as np

from perception.forensics.experiments import summarise, table
from perception.forensics.probe import linear_probe_accuracy


def _eval(path, arm, acc_g, acc_h, qa=None):
    per = {"flow": {"acc": acc_g, "ap": 1.0}, "gan": {"acc": acc_h, "ap": 0.5}, "mean": {"acc": (acc_g + acc_h) / 2,
                                                                                       "ap": 0.75}}
    ev = {"arm": arm, "holdout": "gan", "trained_on": ["flow"], "per_generator": {**per, "all": per["mean"]}}
    if qa is not None:
        ev["qa_exact_match"] = {"acc": qa}
        ev["qa_exact_match_base"] = {"acc": 0.8}
    path.mkdir(parents=True)
    (path / "eval.json").write_text(json.dumps(ev))


def test_summary_means_and_spreads_per_arm_with_lookalike_names(tmp_path):
    _eval(tmp_path / "deepvrm_s0", "deepvrm", 0.9, 0.7, qa=0.75)
    _eval(tmp_path / "deepvrm_s1", "deepvrm", 1.0, 0.5, qa=0.65)
    _eval(tmp_path / "freq_cnn_s0", "freq_cnn", 0.6, 0.6)
    s = summarise(tmp_path, "cmd")
    d = s["rows"]["deepvrm"]
    assert d["seeds"] == 2
    assert abs(d["flow.acc"]["mean"] - 0.95) < 1e-9 and abs(d["gan.acc"]["mean"] - 0.6) < 1e-9
    assert abs(d["gan.acc"]["sd"] - np.std([0.7, 0.5], ddof=1)) < 1e-9
    assert abs(d["qa"]["mean"] - 0.70) < 1e-9 and d["qa_base"] == 0.8
    assert "qa" not in s["rows"]["freq_cnn"] and s["rows"]["freq_cnn"]["seeds"] == 1
    md = table(s)
    assert "gan (held out)" in md and "95.0 ± 7.1" in md and "n/a" in md
    assert (tmp_path / "summary.md").read_text() == md


def test_linear_probe_reads_a_planted_label_and_not_noise():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    x = rng.normal(size=(300, 16))
    assert linear_probe_accuracy(x, y) < 0.5  # noise: about chance (1/3)
    x[:, 3] += 4.0 * y  # one direction carries the label
    assert linear_probe_accuracy(x, y) > 0.85  # classes 4 sd apart on one axis: ~0.95 at best


def test_summary_robustness_table_per_level_in_protocol_order(tmp_path):
    _eval(tmp_path / "deepvrm_s0", "deepvrm", 0.9, 0.7, qa=0.75)
    _eval(tmp_path / "deepvrm_s1", "deepvrm", 1.0, 0.5, qa=0.65)
    _eval(tmp_path / "freq_cnn_s0", "freq_cnn", 0.8, 0.6)
    for run, level, acc in (("deepvrm_s0", "blur=1", 0.6), ("deepvrm_s1", "blur=1", 0.8),
                            ("deepvrm_s0", "jpeg=75", 0.7), ("freq_cnn_s0", "jpeg=75", 0.5)):
        per = {"flow": {"acc": acc, "ap": 0.9}, "gan": {"acc": acc - 0.1, "ap": 0.4}, "mean": {"acc": acc, "ap": 0.8}}
        tag = level.replace("=", "")
        (tmp_path / run / f"eval_{tag}.json").write_text(json.dumps({"arm": run[:-3], "degrade": level,
                                                                     "per_generator": per}))
    s = summarise(tmp_path, "cmd")
    rob = s["robustness"]
    assert rob["levels"] == ["clean", "jpeg=75", "blur=1"]  # LEVELS order, not file order
    assert abs(rob["rows"]["deepvrm"]["blur=1"]["mean.acc"]["mean"] - 0.7) < 1e-9
    assert rob["rows"]["deepvrm"]["jpeg=75"]["seeds"] == 1 and "blur=1" not in rob["rows"]["freq_cnn"]
    assert abs(rob["rows"]["freq_cnn"]["clean"]["holdout.ap"]["mean"] - 0.5) < 1e-9
    md = table(s)
    assert "| arm | clean | jpeg=75 | blur=1 |" in md and "70.0 ± 14.1 / 80.0 |" in md
    assert "the held-out family (gan)" in md
