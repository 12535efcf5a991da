"""`embodied eval METHOD` prints a short aligned table of the method's headline metrics (the JSON stays on disk),
and the command line's small things: the command that makes a missing run, dotted-key suggestions, help texts."""

from __future__ import annotations

import json
import re

import pytest

from core.errors import ConfigError
from embodied.results import MAX_ROWS, eval_report, flatten, format_table, headline_rows

RESULT = {"env": "embodied/Reach-Panda-v0", "episodes": 4, "checkpoint": "outputs/bc",
          "policies": {"bc": {"success_rate": 0.75, "mean_length": 31.5, "failures": 0},
                       "random": {"success_rate": 0.0, "mean_length": 60.0, "failures": 0}},
          "rollout": {"psnr": [30.0, 25.0, 20.5], "flag": True, "note": "text"}}


def test_flatten_keeps_numbers_only_and_names_list_items():
    flat = flatten(RESULT)
    assert flat["policies.bc.success_rate"] == 0.75 and flat["episodes"] == 4
    assert flat["rollout.psnr[0]"] == 30.0 and flat["rollout.psnr[-1]"] == 20.5
    assert not {"env", "checkpoint", "rollout.flag", "rollout.note"} & set(flat)  # strings and bools are not metrics


def test_headline_picks_scales_and_aligns():
    headline = [("policies.*.success_rate", "%", 100.0), ("rollout.psnr[-1]", "dB", 1.0)]
    rows, left = headline_rows(RESULT, headline)
    assert rows == [("policies.bc.success_rate", 75.0, "%"), ("policies.random.success_rate", 0.0, "%"),
                    ("rollout.psnr[-1]", 20.5, "dB")]
    assert left == 5  # episodes, 2 x mean_length, 2 x failures: in the JSON, not in the table
    table = format_table(rows).splitlines()
    assert table[0].split() == ["metric", "value", "unit"] and set(table[1]) <= {"-", " "}
    assert table[2].split() == ["policies.bc.success_rate", "75", "%"]
    assert table[4].split() == ["rollout.psnr[-1]", "20.5", "dB"]
    # aligned: every value ends in the same column (right-aligned), every unit starts in the same column
    ends = {line.index(line.split()[1], len(line.split()[0])) + len(line.split()[1]) for line in table[2:]}
    assert len(ends) == 1 and ends == {len(table[1].rsplit(" ", 1)[0].rstrip())}, table
    assert len({line.rindex(" ") + 1 for line in table[2:]}) == 1, table


def test_brackets_in_a_headline_are_literal():
    rows, _ = headline_rows({"a": [1.0, 2.0], "a1": 5.0, "a-": 6.0}, [("a[-1]", "", 1.0)])
    assert rows == [("a[-1]", 2.0, "")]


def test_default_shows_the_first_numbers_capped():
    result = {f"m{i}": float(i) for i in range(20)}
    rows, left = headline_rows(result)
    assert [r[0] for r in rows] == [f"m{i}" for i in range(MAX_ROWS)] and left == 20 - MAX_ROWS
    text = eval_report("toy", result, (), "outputs/toy/eval.json")
    lines = text.splitlines()
    assert lines[0] == "evaluated toy (full results: outputs/toy/eval.json)"
    assert lines[-1] == f"{20 - MAX_ROWS} more values in outputs/toy/eval.json"
    assert len(lines) == 1 + 2 + MAX_ROWS + 1 and len(text) < 600
    assert eval_report("toy", {"name": "x"}) == "evaluated toy: no numeric results"


def test_every_registered_method_names_matching_headline_entries():
    from core.registry import method_specs, register_method

    specs = {s.name: s for s in method_specs()}
    for name, spec in specs.items():
        assert spec.headline, f"{name} declares no headline metrics"
        assert all(isinstance(p, str) and p and isinstance(u, str) and s > 0 for p, u, s in spec.headline), name
    assert ("closed_loop.*.all.driving_score", "%", 100.0) in specs["automot"].headline  # one unit: %, README's
    with pytest.raises(ConfigError, match="headline entry"):
        register_method("_bad_headline", folder="x", description="x", task="x", headline=[("a", "b", 1, 2)])


def _tiny_bc(out):
    return ["debug=tiny", "model=bc_tiny", "data.record.episodes=1", "data.record.image_size=32",
            "data.paths=[outputs/data/reach.hdf5]", f"out_dir={out}"]


def test_eval_bc_before_training_names_the_command_that_makes_it(tmp_path, monkeypatch, capsys):
    from embodied.cli import main

    monkeypatch.chdir(tmp_path)  # a folder of the user's, outside the repository
    assert main(["eval", "bc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("embodied: error: outputs/bc: no such checkpoint; `embodied train bc` makes it, or set "
                   "eval.checkpoint=PATH")
    # the same arm, train flags and overrides; eval-only flags (SoLA's --rotate) and eval.* keys left out
    assert main(["eval", "sola", "--rotate", "so3", "debug=tiny", "eval.video=true"]) == 2
    assert "`embodied train sola debug=tiny` makes it" in capsys.readouterr().err
    assert main(["eval", "lacwm", "--arm", "eacwm", "debug=tiny"]) == 2
    assert "`embodied train lacwm --arm eacwm debug=tiny` makes it" in capsys.readouterr().err


def test_eval_bc_prints_a_table_and_writes_the_json(tmp_path, monkeypatch, capsys):
    from embodied.cli import main

    monkeypatch.chdir(tmp_path)
    args = _tiny_bc("outputs/bc_tiny")
    assert main(["train", "bc", *args]) == 0
    capsys.readouterr()
    assert main(["eval", "bc", *args, "env.episodes=1", "env.image_size=32", "env.max_episode_steps=4",
                 "eval.baselines=[random]"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "evaluated bc (full results: outputs/bc_tiny/eval.json)"
    assert out[1].split() == ["metric", "value", "unit"]
    rows = {line.split()[0]: line.split()[1:] for line in out[3:] if not line.endswith("eval.json")}
    saved = json.loads((tmp_path / "outputs/bc_tiny/eval.json").read_text())
    for policy in ("bc", "random"):
        value, unit = rows[f"policies.{policy}.success_rate"]
        assert unit == "%" and float(value) == pytest.approx(100 * saved["policies"][policy]["success_rate"])
        assert rows[f"policies.{policy}.mean_length"] == [f"{saved['policies'][policy]['mean_length']:.4g}",
                                                         "steps"]
    assert "{" not in "\n".join(out)  # no dict repr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_eval_flexforcing_prints_its_regimes(tmp_path, monkeypatch, capsys):
    from embodied.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["debug=tiny", "model=flexforcing_tiny", "data.root=outputs/fd", "data.test_root=outputs/ft",
            "data.size=16", "data.render_n=4", "data.render_frames=8", "data.test_n=2", "data.test_frames=14",
            "data.eval_frames=14", "out_dir=outputs/flex"]
    assert main(["train", "flexforcing", *args]) == 0
    capsys.readouterr()
    assert main(["eval", "flexforcing", *args]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "evaluated flexforcing (full results: outputs/flex/eval.json)"
    units = {line.split()[0]: line.split()[2:] for line in out[3:3 + MAX_ROWS]}
    assert units["regimes.flex.mean.psnr"] == ["dB"] and units["regimes.flex.mean.fps"] == ["frames/s"]
    assert len(units) == MAX_ROWS and re.fullmatch(r"\d+ more values in outputs/flex/eval.json", out[-1])


@pytest.mark.parametrize("override, hint", [
    ("max_steps=3", "did you mean trainer.max_steps?"),
    ("lr=0.1", "did you mean trainer.optim.lr?"),
    ("+max_steps=3", "did you mean trainer.max_steps?"),
    ("trainer.max_stpes=3", "did you mean max_steps?"),
])
def test_unknown_key_suggests_the_dotted_key(override, hint):
    from core.config import compose

    with pytest.raises(ConfigError, match=re.escape(hint)):
        compose(["experiment=bc", override])


def test_unknown_key_without_a_match_has_no_hint():
    from core.config import compose

    with pytest.raises(ConfigError) as e:
        compose(["experiment=bc", "zzzq=1"])
    assert str(e.value) == "unknown config key 'zzzq'"


def test_help_texts(capsys):
    from embodied.cli import build_parser, main

    with pytest.raises(SystemExit):
        main(["infer", "video", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "replace an existing --out file (on success)" in text and "--out folder" not in text
    # every command's --help ends with the exit codes, 130 included
    stack = [build_parser()]
    seen = 0
    while stack:
        p = stack.pop()
        seen += 1
        assert "130 interrupted" in " ".join(p.format_help().split()), p.prog
        for a in p._actions:
            if a.__class__.__name__ == "_SubParsersAction":
                stack += list(dict.fromkeys(a.choices.values()))
    assert seen >= 15  # embodied, demo, infer + 6 kinds, sim + 3, drive + eval, train, eval, methods


def test_methods_prints_a_header(capsys):
    from embodied.cli import main

    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["method", "folder", "description"]
    assert lines[1].split()[:2] == ["automot", "driving/automot"]
    assert lines[0].index("folder") == lines[1].index("driving/automot")  # aligned with the rows


def test_driving_scores_are_percent_in_every_table_and_fractions_in_the_json():
    from driving.report import SUMMARY_COLUMNS, markdown_summary, stdout_table

    agg = {"episodes": 4, "driving_score": 0.6612, "success_rate": 0.5, "collision_rate": 0.25, "offroad_rate": 0.0,
           "timeout_rate": 0.25, "failure_rate": 0.0, "progress_m": 120.0, "route_completion": 0.8,
           "comfort_rate": 1.0, "mean_abs_jerk_mps3": 1.5, "mean_abs_lat_acc_mps2": 0.5, "mean_speed_mps": 12.0,
           "pdms": 0.8123, "epdms": 0.85, "efficiency": 1.1, "comfortness": 0.9}
    report = {"policy": "idm", "seed": 0, "n_episodes": 4, "scenarios": {"highway": {"aggregate": agg}},
              "aggregate": agg}
    table = stdout_table(report).splitlines()
    titles = [h.strip() for h in table[0].split("  ") if h.strip()]  # titles hold single spaces
    row = dict(zip(titles, table[2].split(), strict=True))
    assert row["DS %"] == "66.1" and row["SR %"] == "50" and row["collision %"] == "25"
    assert row["route compl. %"] == "80.0" and row["PDMS %"] == "81.2" and row["EPDMS %"] == "85.0"
    assert row["efficiency %"] == "110" and row["comfortness %"] == "90" and row["latency p50 ms"] == "—"
    assert "| highway | 4 | 66.1 | 50 | 25 |" in markdown_summary(report)
    assert {c for c, _, _, s in SUMMARY_COLUMNS if s != 1} == {c for c, _, _, _ in SUMMARY_COLUMNS if "%" in c}
