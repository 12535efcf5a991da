"""AutoMoT's experiment: arms x seeds, open loop, and the closed-loop grid in every scenario with paired seeds.

    embodied experiment automot --out outputs/automot_exp --seeds 0 1 --episodes 20 [--workers 2]
        [--steps 1500] [--collect-only] [--extra KEY=VALUE ...]

1. Trains ``model.arm`` = automot (understanding expert fine-tuned), frozen (frozen understanding expert) and
   noreason (no understanding expert) for every seed (``embodied train automot``; all share one base VLM and
   one dataset), then scores each open loop (``embodied eval automot data.eval_episodes=0``).
2. Closed loop through ``embodied drive eval --scenario all`` with the same episode seeds for every row:
   AutoMoT (seed-0 model) at N = 1 / 2 / 4 without the refiner and N = 2 with it, frozen (N = 2), noreason,
   the privileged expert (idm), constant speed and random; every other seed's AutoMoT at N = 2 (the seed
   spread).
3. ``summary.json`` / ``summary.md``: the closed-loop table (DS, SR, collision rate, progress per scenario and
   overall), open-loop L2 / ADE / meta-action accuracy (coarse and refined), general reasoning (scene-QA
   answer accuracy vs the base's).

The arms are AutoMoT's registered arms (``driving/automot/register.py``). Every run goes through the public CLI
in its own process (one thread each, ``--workers`` at a time; the ``core.experiments`` grid, in
``<out>/runs/<arm>_s<seed>``, logs in ``<out>/logs``); finished runs (their ``eval.json`` / ``summary.json``
exist) are skipped, so the driver resumes after a kill.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core import experiments as ex
from core.io import read_json

ARMS = ("automot", "frozen", "noreason")  # the registered arms; noreason (no base VLM) runs last
SCENARIOS = ("highway", "merge", "roundabout", "intersection", "racetrack")


def arm_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / f"{arm}_s{seed}"


def grid(out: Path, seeds: list[int], extra: list[str], arms: tuple[str, ...] = ARMS) -> ex.Grid:
    """The arm x seed grid: train (all arms share ``<out>/base`` and one dataset), then score open loop."""
    return ex.Grid("automot", out / "runs", ex.pick_arms(ex.method_arms("automot"), arms), seeds,
                   [f"model.base_path={out / 'base'}", *extra], eval_overrides=["data.eval_episodes=0"],
                   log_dir=out / "logs", train_flags=["--overwrite"],  # training does not resume: start over
                   trained=lambda run: (run / "policy" / "model.safetensors").is_file())


def closed_loop_rows(out: Path, seeds: list[int]) -> dict[str, tuple[str, list[str]]]:
    """Row name -> (policy, policy args)."""
    s0 = arm_dir(out, "automot", seeds[0]) / "policy"
    rows = {f"automot_n{n}": ("automot", [f"checkpoint={s0}", f"update_interval={n}"]) for n in (1, 2, 4)}
    rows["automot_n2_refiner"] = ("automot", [f"checkpoint={s0}", "update_interval=2", "refiner=true"])
    rows["frozen_n2"] = ("automot", [f"checkpoint={arm_dir(out, 'frozen', seeds[0]) / 'policy'}", "update_interval=2"])
    rows["noreason"] = ("noreason", [f"checkpoint={arm_dir(out, 'noreason', seeds[0]) / 'policy'}"])
    for s in seeds[1:]:
        rows[f"automot_n2_s{s}"] = ("automot", [f"checkpoint={arm_dir(out, 'automot', s) / 'policy'}",
                                                "update_interval=2"])
    rows.update({b: (b, []) for b in ("idm", "constant", "random")})
    return rows


def drive(out: Path, row: str, policy: str, args: list[str], episodes: int, seed: int) -> bool:
    """One closed-loop row (``embodied drive eval --scenario all``); False when its ``summary.json`` exists."""
    d = out / "closed_loop" / row
    if (d / "summary.json").is_file():
        return False
    cmd = ["drive", "eval", "--policy", policy, "--scenario", "all", "--episodes", str(episodes), "--out", str(d),
           "--seed", str(seed), "--videos", "1", "--overwrite"]
    for a in args:
        cmd += ["--policy-arg", a]
    ex.run_cli(cmd, out / "logs" / f"drive_{row}.log")
    return True


OPENLOOP = {**{f"{head}_{k}": f"openloop/{head}/{k}" for head in ("coarse", "refined")
               for k in ("l2_1s", "l2_2s", "l2_3s", "ade")},
            "meta_accuracy": "openloop/meta_accuracy", "qa": "qa_token_match/acc",
            "qa_base": "qa_token_match_base/acc"}


def summarise(out: Path, seeds: list[int], command: str = "") -> dict[str, Any]:
    closed: dict[str, Any] = {}
    for d in sorted((out / "closed_loop").glob("*/summary.json")):
        rep = read_json(d)
        closed[d.parent.name] = {s: _pick(r["aggregate"]) for s, r in rep["scenarios"].items()}
        closed[d.parent.name]["all"] = _pick(rep["overall"])
    runs = ex.collect(out / "runs", arms=ARMS, seeds=seeds)
    openloop = {arm: ex.seed_stats(by_seed.values(), OPENLOOP) for arm, by_seed in runs.items()}
    summary = {"command": command, "seeds": seeds, "closed_loop": closed, "openloop": openloop}
    ex.write_summary(out, summary, table(summary))
    return summary


def _pick(a: dict[str, Any]) -> dict[str, Any]:
    keys = ("episodes", "driving_score", "success_rate", "collision_rate", "offroad_rate", "timeout_rate",
            "failure_rate", "route_completion", "progress_m", "mean_speed_mps", "mean_abs_jerk_mps3")
    return {k: a[k] for k in keys if k in a}


def table(summary: dict[str, Any]) -> str:
    lines = ["## Closed loop (DS / SR / collision rate in %, progress in m; same episode seeds for every row)", ""]
    scen = [s for s in SCENARIOS if any(s in r for r in summary["closed_loop"].values())] + ["all"]
    lines.append("| row | " + " | ".join(scen) + " |")
    lines.append("| --- |" + " --- |" * len(scen))
    for row, per in summary["closed_loop"].items():
        cells = []
        for s in scen:
            a = per.get(s)
            cells.append("-" if a is None else f"{100 * a['driving_score']:.1f} / {100 * a['success_rate']:.0f} / "
                                               f"{100 * a['collision_rate']:.0f} / {a['progress_m']:.0f}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", "## Open loop (held-out logs; mean ± sd over seeds)", ""]
    cols = [ex.Column(h, k) for h, k in (("L2 1 s", "coarse_l2_1s"), ("L2 2 s", "coarse_l2_2s"),
                                          ("L2 3 s", "coarse_l2_3s"), ("ADE", "coarse_ade"),
                                          ("refined L2 3 s", "refined_l2_3s"), ("refined ADE", "refined_ade"),
                                          ("meta-action acc", "meta_accuracy"))]
    cols.append(ex.Column("QA token match (base)", ("qa", "qa_base"), template="{0} ({1})"))
    return "\n".join(lines) + "\n" + ex.arm_table(summary["openloop"], cols, zero_sd=False) + "\n"


def run(args) -> int:
    """``embodied experiment automot``: the training grid, then the closed-loop rows, then the table."""
    out = args.out
    extra = list(args.extra) + ([f"trainer.max_steps={args.steps}"] if args.steps else [])
    failures = []
    if not args.collect_only:
        # the first run alone builds the base VLM and the data: every other arm then finds them built
        failures = grid(out, args.seeds, extra).run(args.workers, first_alone=True)
        rows = closed_loop_rows(out, args.seeds)
        if args.rows:
            rows = {k: v for k, v in rows.items() if k in args.rows}
        failures += ex.run_jobs([(f"drive {k}", lambda k=k, v=v: drive(out, k, v[0], v[1], args.episodes,
                                                                         args.eval_seed)) for k, v in rows.items()],
                                args.workers, logs={f"drive {k}": out / "logs" / f"drive_{k}.log" for k in rows})
    summary = summarise(out, args.seeds, args.command_line)
    print(table(summary))
    return ex.report(failures)


EXPERIMENT = ex.Experiment(
    run, out="outputs/automot_exp",
    options=(("--episodes", dict(type=int, default=20, help="closed-loop episodes per scenario and row")),
             ("--eval-seed", dict(type=int, default=1000, help="first closed-loop episode seed (paired rows)")),
             ("--steps", dict(type=int, default=None, help="trainer.max_steps override")),
             ("--rows", dict(nargs="*", default=None, help="only these closed-loop rows")),
             ("--extra", dict(nargs="*", default=[], help="extra overrides for every train / eval"))))


if __name__ == "__main__":
    raise SystemExit(ex.moved("driving.automot.experiments", "automot"))


__all__ = ["EXPERIMENT", "closed_loop_rows", "summarise", "table"]
