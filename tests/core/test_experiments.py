"""core.experiments: the arm x seed grid (on a fake CLI), collect and tables, the CLI runner, the statistics."""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
from pathlib import Path

import pytest

from core import experiments as ex
from core.errors import ConfigError
from core.experiments import mean_sd, run_cli
from core.io import read_json, write_json

ARMS = {"method": (), "baseline": ("model.arm=baseline",)}
SCORE = {"method": 0.9, "baseline": 0.5}


class FakeCLI:
    """Stands in for ``run_cli``: records every command; ``eval`` writes ``eval.json`` with a known score
    (``SCORE[arm] + seed / 10``) into ``out_dir``; ``fail`` names run folders whose train command fails."""

    def __init__(self, fail=(), delay=0.0):
        self.calls: list[list[str]] = []
        self.fail, self.delay = set(fail), delay
        self.active = self.peak = 0
        self.lock = threading.Lock()
        self.busy: set[Path] = set()  # run folders with a command running (a real one locks its folder)
        self.overlap = False

    def __call__(self, args, log, threads=1):
        over = dict(a.split("=", 1) for a in args[2:] if "=" in a)
        run = Path(over["out_dir"])
        with self.lock:
            self.calls.append(list(args))
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.overlap |= run in self.busy
            self.busy.add(run)
        try:
            time.sleep(self.delay)
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            Path(log).write_text(" ".join(args))
            if args[0] == "train" and run.name in self.fail:
                raise subprocess.CalledProcessError(3, args)
            if args[0] == "eval":
                arm = over.get("model.arm", "method")
                name = f"eval_{over['variant']}.json" if "variant" in over else "eval.json"
                write_json(run / name, {"acc": SCORE[arm] + int(over["trainer.seed"]) / 10, "arm": arm})
        finally:
            with self.lock:
                self.active -= 1
                self.busy.discard(run)


@pytest.fixture
def fake(monkeypatch):
    cli = FakeCLI()
    monkeypatch.setattr(ex, "run_cli", cli)
    return cli


def test_grid_runs_every_cell_through_train_then_eval_and_skips_finished_cells(tmp_path, fake):
    grid = ex.Grid("toy", tmp_path, ARMS, [0, 1], ["trainer.max_steps=5"])
    assert grid.run(workers=1) == []
    assert len(fake.calls) == 8 and [c[0] for c in fake.calls[:2]] == ["train", "eval"]
    train = fake.calls[2]  # method, seed 1
    assert train[:2] == ["train", "toy"] and "trainer.max_steps=5" in train and "trainer.seed=1" in train
    assert f"out_dir={tmp_path / 'method_s1'}" in train
    assert "model.arm=baseline" in fake.calls[4] and "model.arm=baseline" not in fake.calls[0]
    assert (tmp_path / "baseline_s0.log").is_file()
    assert grid.run(workers=2) == [] and len(fake.calls) == 8  # every cell done: nothing runs again
    (tmp_path / "baseline_s1" / "eval.json").unlink()  # a cell killed before its result: it runs again
    assert grid.run() == [] and len(fake.calls) == 10


def test_grid_evaluates_finished_cells_again_under_each_variant_once(tmp_path, monkeypatch):
    fake = FakeCLI(delay=0.02)
    monkeypatch.setattr(ex, "run_cli", fake)
    grid = ex.Grid("toy", tmp_path, ARMS, [0, 1], ["trainer.max_steps=5"])
    assert grid.evaluate({"eval_a.json": ["variant=a"]}) == [] and fake.calls == []  # nothing trained yet
    assert grid.run(workers=1) == [] and len(fake.calls) == 8
    variants = {"eval_a.json": ["variant=a"], "eval_b.json": ["variant=b"]}
    assert grid.evaluate(variants, workers=4) == []
    assert not fake.overlap and fake.peak > 1  # cells in parallel, never two commands in one run folder
    new = fake.calls[8:]
    assert len(new) == 8 and all(c[0] == "eval" for c in new)  # 4 cells x 2 variants, evaluation only
    assert all("trainer.max_steps=5" in c and c[-1] in ("variant=a", "variant=b") for c in new)
    assert (tmp_path / "baseline_s1" / "eval_b.json").is_file()
    assert grid.evaluate(variants) == [] and len(fake.calls) == 16  # every variant done: nothing runs again
    assert ex.collect(tmp_path, result="eval_a.json")["baseline"][1]["acc"] == pytest.approx(0.6)


def test_a_failing_cell_is_reported_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    cli = FakeCLI(fail={"method_s1"})
    monkeypatch.setattr(ex, "run_cli", cli)
    failures = ex.Grid("toy", tmp_path, ARMS, [0, 1]).run(workers=2)
    assert [f.name for f in failures] == ["method_s1"] and failures[0].log == tmp_path / "method_s1.log"
    assert "exit 3" in str(failures[0]) and "FAILED" in capsys.readouterr().out
    assert sorted(p.parent.name for p in tmp_path.glob("*/eval.json")) == ["baseline_s0", "baseline_s1", "method_s0"]
    assert ex.report(failures) == 1 and ex.report([]) == 0


def test_when_the_first_cell_run_alone_fails_the_rest_are_not_run(tmp_path, monkeypatch):
    cli = FakeCLI(fail={"method_s0"})
    monkeypatch.setattr(ex, "run_cli", cli)
    failures = ex.Grid("toy", tmp_path, ARMS, [0, 1]).run(workers=2, first_alone=True)
    assert [f.name for f in failures] == ["method_s0", "method_s1", "baseline_s0", "baseline_s1"]
    assert "not run" in failures[1].reason and len(cli.calls) == 1


def test_the_pool_runs_cells_concurrently_up_to_the_worker_count(tmp_path, monkeypatch):
    cli = FakeCLI(delay=0.15)
    monkeypatch.setattr(ex, "run_cli", cli)
    assert ex.Grid("toy", tmp_path, ARMS, [0, 1, 2]).run(workers=2) == []
    assert cli.peak == 2  # six cells, two at a time
    cli2 = FakeCLI(delay=0.05)
    monkeypatch.setattr(ex, "run_cli", cli2)
    ex.Grid("toy", tmp_path / "serial", ARMS, [0, 1]).run(workers=1)
    assert cli2.peak == 1


def test_a_cell_whose_training_is_short_trains_on_and_drops_its_stale_result(tmp_path, fake):
    done = {"ok": False}
    grid = ex.Grid("toy", tmp_path, {"method": ()}, [0], trained=lambda run: done["ok"],
                   train_flags=["--overwrite"])
    write_json(tmp_path / "method_s0" / "eval.json", {"acc": 0.0})  # from a shorter run
    assert not grid.cells()[0].done()
    grid.run()
    assert [c[0] for c in fake.calls] == ["train", "eval"] and "--overwrite" in fake.calls[0]
    assert read_json(tmp_path / "method_s0" / "eval.json")["acc"] == 0.9
    done["ok"] = True
    grid.run()
    assert len(fake.calls) == 2


def test_collect_and_the_table_give_mean_and_sd_over_seeds(tmp_path, fake):
    grid = ex.Grid("toy", tmp_path, ARMS, [0, 1])
    grid.run()
    write_json(tmp_path / "method_extra_s0" / "eval.json", {"acc": 0.0})  # a lookalike arm name
    write_json(tmp_path / "method_s7" / "other.json", {"acc": 0.0})  # not a result file
    assert grid.collect() == ex.collect(tmp_path, arms=["method", "baseline"], seeds=[0, 1])
    found = ex.collect(tmp_path)
    assert list(found) == ["baseline", "method", "method_extra"] and list(found["method"]) == [0, 1]
    rows = {arm: ex.seed_stats(by_seed.values(), {"acc": "acc", "missing": "no/such"})
            for arm, by_seed in grid.collect().items()}
    assert rows["method"]["seeds"] == 2 and "missing" not in rows["method"]
    assert rows["method"]["acc"]["mean"] == pytest.approx(0.95)
    assert rows["baseline"]["acc"]["sd"] == pytest.approx(0.1 / 2**0.5)
    md = ex.arm_table(rows, [ex.Column("seeds", "seeds"), ex.Column("acc (%)", "acc", 100, 1),
                             ex.Column("x", ("acc", "nope"), missing="n/a")], labels={"method": "The method"})
    assert md.splitlines() == ["| arm | seeds | acc (%) | x |", "| --- | --- | --- | --- |",
                               "| The method | 2 | 95.0 ± 7.1 | n/a |", "| baseline | 2 | 55.0 ± 7.1 | n/a |"]
    assert ex.pm({"mean": 1.0, "sd": 0.0}, zero_sd=False) == "1.00" and ex.pm(None) == "-"
    text = ex.write_summary(tmp_path, {"rows": rows}, md)
    assert (tmp_path / "summary.md").read_text() == text == md + "\n"
    assert read_json(tmp_path / "summary.json")["rows"]["method"]["seeds"] == 2


def test_method_arms_come_from_the_registry_spec():
    from core.registry import method_specs

    spec = next(s for s in method_specs() if s.arms)
    arms = ex.method_arms(spec.name)
    first = spec.arms[0][0]
    assert list(arms) == [name for name, _ in spec.arms] and arms[first] == spec.arm_overrides(first)
    assert ex.method_arms(spec.name, fallback={"x": ["a=1"]}) == arms  # the spec wins over a fallback
    with pytest.raises(ConfigError, match="no_such_method"):
        ex.method_arms("no_such_method")
    with pytest.raises(ConfigError, match="unknown arm"):
        ex.pick_arms(arms, ["no_such_arm"])
    bare = next((s.name for s in method_specs() if not s.arms), None)
    if bare is not None:
        assert ex.method_arms(bare, fallback={"x": ["a=1"]}) == {"x": ("a=1",)}
        with pytest.raises(ConfigError, match="declares no arms"):
            ex.method_arms(bare)


def test_grid_arguments_keep_the_old_option_names():
    p = ex.grid_arguments(argparse.ArgumentParser(), out="outputs/x", arms=["a", "b"], default_arms=["a"])
    a = p.parse_args(["--jobs", "3", "--summary-only", "--arms", "b", "--seeds", "4", "5"])
    assert a.workers == 3 and a.collect_only and a.arms == ["b"] and a.seeds == [4, 5] and a.out == Path("outputs/x")
    assert p.parse_args([]).arms == ["a"] and not p.parse_args([]).collect_only
    with pytest.raises(SystemExit):
        p.parse_args(["--arms", "c"])


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
