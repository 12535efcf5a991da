"""AutoMoT's experiment: arms x seeds, open loop, and the closed-loop grid in every scenario with paired seeds.

    python -m driving.automot.experiments --out outputs/automot_exp --seeds 0 1 --episodes 20 [--jobs 2]
        [--steps 1500] [--summary-only] [--extra KEY=VALUE ...]

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

Every run goes through the public CLI in its own process (one thread each, ``--jobs`` at a time); finished
runs (their ``eval.json`` / ``summary.json`` exist) are skipped, so the driver resumes after a kill.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
from pathlib import Path
from typing import Any

from core.experiments import mean_sd, run_cli
from core.io import read_json, write_json, write_text

ARMS = ("automot", "frozen", "noreason")
SCENARIOS = ("highway", "merge", "roundabout", "intersection", "racetrack")


def arm_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / f"{arm}_s{seed}"


def train_and_eval(out: Path, arm: str, seed: int, extra: list[str]) -> Path:
    run = arm_dir(out, arm, seed)
    common = ["automot", f"model.arm={arm}", f"trainer.seed={seed}", f"out_dir={run}",
              f"model.base_path={out / 'base'}", *extra]
    if not (run / "policy" / "automot.json").is_file():
        run_cli(["train", *common, "--overwrite"] if run.exists() else ["train", *common], out / "logs" / f"{run.name}.log")
    if not (run / "eval.json").is_file():
        run_cli(["eval", *common, "data.eval_episodes=0"], out / "logs" / f"{run.name}.log")
    return run


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


def drive(out: Path, row: str, policy: str, args: list[str], episodes: int, seed: int) -> Path:
    d = out / "closed_loop" / row
    if not (d / "summary.json").is_file():
        cmd = ["drive", "eval", "--policy", policy, "--scenario", "all", "--episodes", str(episodes), "--out", str(d),
               "--seed", str(seed), "--videos", "1", "--overwrite"]
        for a in args:
            cmd += ["--policy-arg", a]
        run_cli(cmd, out / "logs" / f"drive_{row}.log")
    return d


def summarise(out: Path, seeds: list[int], command: str = "") -> dict[str, Any]:
    closed: dict[str, Any] = {}
    for d in sorted((out / "closed_loop").glob("*/summary.json")):
        rep = read_json(d)
        closed[d.parent.name] = {s: _pick(r["aggregate"]) for s, r in rep["scenarios"].items()}
        closed[d.parent.name]["all"] = _pick(rep["overall"])
    openloop: dict[str, Any] = {}
    for arm in ARMS:
        evals = [read_json(arm_dir(out, arm, s) / "eval.json") for s in seeds
                 if (arm_dir(out, arm, s) / "eval.json").is_file()]
        if not evals:
            continue
        row: dict[str, Any] = {"seeds": len(evals)}
        for head in ("coarse", "refined"):
            if all(head in e["openloop"] for e in evals):
                for k in ("l2_1s", "l2_2s", "l2_3s", "ade"):
                    row[f"{head}_{k}"] = mean_sd([e["openloop"][head][k] for e in evals])
        row["meta_accuracy"] = mean_sd([e["openloop"]["meta_accuracy"] for e in evals])
        if all("qa" in e for e in evals):
            row["qa"] = mean_sd([e["qa"]["acc"] for e in evals])
            row["qa_base"] = mean_sd([e["qa_base"]["acc"] for e in evals])
        openloop[arm] = row
    summary = {"command": command, "seeds": seeds, "closed_loop": closed, "openloop": openloop}
    write_json(out / "summary.json", summary)
    write_text(out / "summary.md", table(summary))
    return summary


def _pick(a: dict[str, Any]) -> dict[str, Any]:
    keys = ("episodes", "driving_score", "success_rate", "collision_rate", "offroad_rate", "timeout_rate",
            "failure_rate", "route_completion", "progress_m", "mean_speed_mps", "mean_abs_jerk_mps3")
    return {k: a[k] for k in keys if k in a}


def _pm(v: dict[str, float] | None, scale: float = 1.0, digits: int = 2) -> str:
    if not v:
        return "-"
    return f"{scale * v['mean']:.{digits}f} ± {scale * v['sd']:.{digits}f}" if v["sd"] else f"{scale * v['mean']:.{digits}f}"


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
    lines += ["", "## Open loop (held-out logs; mean ± sd over seeds)", "",
              "| arm | L2 1 s | L2 2 s | L2 3 s | ADE | refined L2 3 s | refined ADE | meta-action acc | QA acc (base) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, r in summary["openloop"].items():
        qa = f"{_pm(r.get('qa'))} ({_pm(r.get('qa_base'))})" if "qa" in r else "-"
        lines.append(f"| {arm} | {_pm(r.get('coarse_l2_1s'))} | {_pm(r.get('coarse_l2_2s'))} | "
                     f"{_pm(r.get('coarse_l2_3s'))} | {_pm(r.get('coarse_ade'))} | {_pm(r.get('refined_l2_3s'))} | "
                     f"{_pm(r.get('refined_ade'))} | {_pm(r.get('meta_accuracy'))} | {qa} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("outputs/automot_exp"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--episodes", type=int, default=20, help="closed-loop episodes per scenario and row")
    p.add_argument("--eval-seed", type=int, default=1000, help="first closed-loop episode seed (paired rows)")
    p.add_argument("--steps", type=int, default=None, help="trainer.max_steps override")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--rows", nargs="*", default=None, help="only these closed-loop rows")
    p.add_argument("--summary-only", action="store_true")
    p.add_argument("--extra", nargs="*", default=[], help="extra overrides for every train / eval")
    args = p.parse_args(argv)
    out = args.out
    extra = list(args.extra) + ([f"trainer.max_steps={args.steps}"] if args.steps else [])
    command = "python -m driving.automot.experiments " + " ".join(argv or [])
    if not args.summary_only:
        # the base VLM and the data first (one process: every arm then finds them built)
        train_and_eval(out, "automot", args.seeds[0], extra)
        # the noreason arm needs no base VLM: last, so that it can also be trained beside the base's pretraining
        jobs = [(arm, s) for arm in ("frozen", "automot", "noreason") for s in args.seeds
                if (arm, s) != ("automot", args.seeds[0])]
        with cf.ThreadPoolExecutor(args.jobs) as ex:
            list(ex.map(lambda j: train_and_eval(out, j[0], j[1], extra), jobs))
        rows = closed_loop_rows(out, args.seeds)
        if args.rows:
            rows = {k: v for k, v in rows.items() if k in args.rows}
        with cf.ThreadPoolExecutor(args.jobs) as ex:
            list(ex.map(lambda kv: drive(out, kv[0], kv[1][0], kv[1][1], args.episodes, args.eval_seed),
                        rows.items()))
    summary = summarise(out, args.seeds, command)
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["closed_loop_rows", "main", "summarise", "table"]
