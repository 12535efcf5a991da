"""``benchmarks.common`` / ``benchmarks.summary``: goals with sources, median-of-repeats with spread, ``--strict``.

No benchmark is run here: the declarations are checked on every benchmark module, the coverage rule on the
ratio names of the committed result files, and ``--strict`` on constructed JSON with known answers.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from benchmarks import common, summary
from benchmarks.common import Goal, Timing, goal_met, resolve_goals, split_runs, write_result

BENCH_DIR = Path(common.__file__).resolve().parent
BENCHMARKS = sorted(p.stem for p in BENCH_DIR.glob("*.py") if p.stem not in ("__init__", "common", "summary"))


def _module(name: str):
    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ImportError as e:  # make setup installs every stack a benchmark imports: a failed import is a break
        pytest.fail(f"benchmarks.{name} does not import: {e}")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_declares_goals_with_sources_and_plain_figures(name):
    mod = _module(name)
    assert isinstance(mod.GOALS, dict), f"{name}: GOALS must be a dict of Goal"
    assert isinstance(mod.FIGURES_ONLY, tuple) and all(isinstance(f, str) for f in mod.FIGURES_ONLY), name
    for key, goal in mod.GOALS.items():
        assert isinstance(goal, Goal), f"{name}.{key}: {goal!r} is not a Goal(target, source)"
        assert goal.source.split(":")[0] in ("claim", "limit", "anchor"), (
            f"{name}.{key}: the source should start with claim: / limit: / anchor:, got {goal.source!r}")
    overlap = [k for k in mod.GOALS if k in mod.FIGURES_ONLY]
    assert not overlap, f"{name}: {overlap} both held to a goal and named a plain figure"


def _recorded() -> list[Path]:
    return sorted(BENCH_DIR.glob("recorded/*/*.json")) + sorted(BENCH_DIR.glob("results/*.json"))


@pytest.mark.parametrize("path", _recorded(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recorded_ratio_has_a_goal_or_is_a_plain_figure(path):
    rec = json.loads(path.read_text())
    name = rec.get("name", path.stem)
    if name not in BENCHMARKS:
        pytest.skip(f"{path.name}: no benchmark module {name!r} (written with --out under another name)")
    mod = _module(name)
    _, _, uncovered = resolve_goals(list(rec["ratios"]), mod.GOALS, mod.FIGURES_ONLY)
    assert not uncovered, f"{name}: {uncovered} have neither a goal nor a place in FIGURES_ONLY"


def test_goals_are_as_strict_as_the_claims():
    """The issue's table: none looser than the paper's claim or the README's figure. AutoMoT's 0.6 / 0.35 lie
    below the arithmetic floor of the shipped model (``test_automot_floor_is_above_the_old_targets``), so its
    asynchronous path is held to that floor instead."""
    want = {("automot", "async_n2_vs_floor"): 1.15, ("automot", "async_n4_vs_floor"): 1.15,
            ("automot", "async_n4_vs_sync"): 0.5,
            ("flexforcing", "flex_vs_bidirectional_first_frame"): 0.6,
            ("flexforcing", "ar_cached_vs_recompute_time"): 0.5,
            ("fera", "dit_train_fera_nofecl_vs_lora_time"): 1.1, ("fera", "unet_train_fera_nofecl_vs_lora_time"): 1.1}
    for (name, ratio), bound in want.items():
        mod = _module(name)
        held, _, _ = resolve_goals([ratio], mod.GOALS, mod.FIGURES_ONLY)
        assert ratio in held, f"{name}.{ratio} has no goal"
        op, target = common.parse_goal(held[ratio].target)
        assert op in ("<=", "<") and target <= bound, f"{name}.{ratio}: {held[ratio].target} is looser than {bound}"


def test_automot_floor_is_above_the_old_targets():
    """Counted work of the shipped AutoMoT: re-encoding the prefix every N steps cannot cost less than
    (E / N + A) / (E + A) of a synchronous step, which is above the 0.6 / 0.35 once set as goals."""
    import torch

    automot = _module("automot")
    cfg, mot, _, prompter, spec = automot._model("cpu")
    batch = automot._batch(cfg, mot, prompter, spec, "cpu")
    with torch.no_grad():
        prefix = mot.encode_prefix(batch)
    e = automot.flops(lambda: mot.encode_prefix(batch))
    a = automot.flops(lambda: mot.act(prefix, batch))
    assert e > 0 and a > 0
    floor2, floor4 = (e / 2 + a) / (e + a), (e / 4 + a) / (e + a)
    assert floor2 > 0.6 and floor4 > 0.35, (floor2, floor4)
    assert abs(floor4 - 0.437) < 0.02  # the figure the goal's source states


def test_goal_needs_a_source_and_a_well_formed_target():
    with pytest.raises(ValueError, match="source"):
        Goal("<= 1", " ")
    with pytest.raises(ValueError, match="expected"):
        Goal("about 1", "claim: x")


def test_goal_met_allows_a_miss_within_the_spread_only():
    assert goal_met(0.59, "<= 0.6") and not goal_met(0.62, "<= 0.6")
    assert goal_met(0.62, "<= 0.6", spread=0.03) and not goal_met(0.62, "<= 0.6", spread=0.01)
    assert goal_met(0.78, ">= 0.8", spread=0.05) and not goal_met(0.78, ">= 0.8", spread=0.01)


def test_timing_split_and_split_runs_keep_rounds_together():
    t = {"a": Timing([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]), "b": Timing([7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0])}
    runs = split_runs(t, 3)
    assert [r["a"].times for r in runs] == [[1.0, 2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    assert [r["b"].times for r in runs] == [[7.0, 6.0, 5.0], [4.0, 3.0], [2.0, 1.0]]
    with pytest.raises(ValueError, match="groups"):
        Timing([1.0, 2.0]).split(3)


def test_write_result_reports_median_and_spread_and_refuses_an_uncovered_ratio(tmp_path):
    goals = {"x_vs_y": Goal("<= 1.0", "limit: test"), "p_*_vs_q": Goal(">= 2", "claim: test")}
    path = write_result("demo", "cpu", True, {"x_vs_y": [0.9, 1.3, 1.0], "p_a_vs_q": 3.0, "figure_k": [5, 7, 6]},
                        {}, {}, results_dir=tmp_path, goals=goals, figures_only=("figure_*",))
    rec = json.loads(path.read_text())
    assert rec["ratios"] == {"x_vs_y": 1.0, "p_a_vs_q": 3.0, "figure_k": 6.0}
    assert rec["spread"]["x_vs_y"] == pytest.approx(0.2) and rec["spread"]["p_a_vs_q"] == 0.0
    assert rec["runs"]["x_vs_y"] == [0.9, 1.3, 1.0]
    assert rec["goals"] == {"x_vs_y": "<= 1.0", "p_a_vs_q": ">= 2"}
    assert rec["goal_sources"]["p_a_vs_q"] == "claim: test" and rec["figures_only"] == ["figure_k"]
    with pytest.raises(ValueError, match="new_vs_old"):
        write_result("demo", "cpu", True, {"x_vs_y": 1.0, "new_vs_old": 2.0}, {}, {}, results_dir=tmp_path,
                     goals=goals, figures_only=("figure_*",))
    with pytest.raises(TypeError, match="Goal"):
        write_result("demo", "cpu", True, {"x_vs_y": 1.0}, {}, {}, results_dir=tmp_path, goals={"x_vs_y": "<= 1"})


def test_repeated_main_writes_the_median_of_whole_runs(tmp_path):
    values = iter([0.5, 0.9, 0.7])

    def main():
        write_result("rep", "cpu", True, {"a_vs_b": next(values)}, {"f": 1}, {"c": 2}, results_dir=tmp_path,
                     goals={"a_vs_b": Goal("<= 1", "limit: test")})

    common.repeated_main(main)
    rec = json.loads((tmp_path / "rep.json").read_text())
    assert rec["ratios"]["a_vs_b"] == 0.7 and rec["spread"]["a_vs_b"] == pytest.approx(0.2)
    assert rec["runs"]["a_vs_b"] == [0.5, 0.9, 0.7] and rec["config"] == {"c": 2}


def _record(tmp_path: Path, name: str, ratios: dict, goals: dict, spread: dict | None = None) -> None:
    rec = {"name": name, "device": "cpu", "quick": True, "ratios": ratios, "goals": goals}
    if spread is not None:
        rec["spread"] = spread
    (tmp_path / f"{name}.json").write_text(json.dumps(rec))


@pytest.mark.parametrize("value,spread,goal,code", [
    (0.66, 0.01, "<= 0.6", 1),   # missed by 0.06, noise 0.01: a regression
    (0.61, 0.02, "<= 0.6", 0),   # missed by 0.01, within its spread: noise
    (0.55, 0.0, "<= 0.6", 0),    # met
    (0.70, None, ">= 0.8", 1),   # an old record without spread: no allowance
    (0.79, 0.02, ">= 0.8", 0),
])
def test_strict_fails_only_a_miss_beyond_the_spread(tmp_path, value, spread, goal, code, capsys):
    _record(tmp_path, "demo", {"r": value, "plain": 123.0}, {"r": goal},
            None if spread is None else {"r": spread, "plain": 0.0})
    assert summary.main(["--results", str(tmp_path), "--strict"]) == code
    assert summary.main(["--results", str(tmp_path)]) == 0  # without --strict it only reports
    out = capsys.readouterr().out
    assert ("missed beyond the spread: demo.r" in out) == (code == 1)


def test_strict_counts_every_benchmark_file(tmp_path):
    _record(tmp_path, "a", {"x": 1.0}, {"x": "<= 1.1"}, {"x": 0.0})
    _record(tmp_path, "b", {"y": 2.0}, {"y": "<= 1.1"}, {"y": 0.5})
    assert summary.main(["--results", str(tmp_path), "--strict"]) == 1
    (tmp_path / "b.json").unlink()
    assert summary.main(["--results", str(tmp_path), "--strict"]) == 0
