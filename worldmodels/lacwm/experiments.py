"""LAC-WM's scaling sweep: held-out rollout error vs the number of pretraining embodiments, and its tables.

``embodied experiment lacwm scaling [--counts 1 2 3] [--arms lacwm,eacwm,scratch] [--workers N]
[overrides]``: for each number of pretraining embodiments, LAC-WM and its EAC-WM arm are pretrained and adapted
(the ``core.experiments`` grid, through the public CLI); scratch once, in process; the held-out rollout error
table goes to ``<out_dir>/scaling.json``. ``... reeval --plan`` evaluates a finished sweep again
(``reeval.json``, with planning on the largest count); ``... table`` prints the README tables of a
``reeval.json``. The training and evaluation code is ``worldmodels.lacwm.training`` / ``task`` / ``metrics``.

``embodied experiment lacwm libero-plan --world-model DIR [--proposal CKPT] --select
model|random|policy --suite S --out DIR [--tasks IDS] [--episodes-per-task N] [--workers K]``: planning
with a world model trained on LIBERO demos (``configs/experiment/lacwm_libero.yaml``), scored by
``embodied libero eval``'s protocol and harness (``sim.libero.evaluate``): the policy is
``worldmodels.lacwm.pipeline_lacwm.libero_planner``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from core import experiments as ex
from core.config import to_container
from core.errors import ConfigError
from core.io import write_json
from worldmodels.lacwm.task import configs, evaluate
from worldmodels.lacwm.training import adapt, data_files

# ------------------------------------------------------------------------------------------ scaling
ARMS = ("lacwm", "eacwm", "scratch")  # LAC-WM's registered arms, then the scratch arm (no CLI: in process)


def scaling(overrides: list[str], counts: list[int], out_root: str, arms: tuple[str, ...] = ARMS,
            workers: int = 1) -> dict[str, Any]:
    """The scaling experiment: LAC-WM vs EAC-WM vs scratch on the held-out embodiment for each count.

    The LAC-WM / EAC-WM cells (``<out_root>/<arm>_n<count>``) are a ``core.experiments`` grid: each runs
    ``embodied train lacwm <arm> data.num_pretrain_embodiments=<count>`` then ``embodied eval lacwm`` (no
    planning) in its own process, ``workers`` at a time, the first alone (it records the data); a cell with an
    ``eval.json`` is not rerun. The scratch arm trains in this process (``<out_root>/scratch``). ``arms`` picks a
    subset; the table goes to ``scaling.json`` (all arms) or ``scaling_<arms>.json``.
    """
    from core import experiments as ex
    from core.io import read_json

    root = Path(out_root)
    seed = next((int(o.split("=", 1)[1]) for o in reversed(overrides) if o.startswith("trainer.seed=")), 0)
    registered = ex.method_arms("lacwm")
    grid = {f"{arm}_n{n}": (*registered[arm], f"data.num_pretrain_embodiments={n}")
            for arm in ("lacwm", "eacwm") if arm in arms for n in counts}
    cells = ex.Grid("lacwm", root, grid, [seed], overrides, eval_overrides=["data.plan_episodes=0"],
                    name="{arm}").cells() if grid else []
    scratch_dir = root / "scratch"

    def scratch() -> bool:
        if (scratch_dir / "eval_scratch.json").is_file():
            return False
        from core.config import compose
        from worldmodels.lacwm.modeling_lacwm import build_model

        cfg = compose(["experiment=lacwm", *registered["eacwm"], *overrides, "data.num_pretrain_embodiments=1",
                       f"out_dir={scratch_dir}"])
        model_cfg, data_cfg, trainer_cfg = configs(cfg)
        adapt(build_model(dataclasses.replace(model_cfg, action_dims={})), data_files(data_cfg), data_cfg.held_out,
              trainer_cfg, scratch_dir, to_container(cfg), scratch=True)
        evaluate(cfg, scratch=True, planning=False)
        return True

    jobs = [(c.name, c.run) for c in cells] + ([("scratch", scratch)] if "scratch" in arms else [])
    failures = ex.run_jobs(jobs, workers, first_alone=True, logs={c.name: c.log for c in cells})
    rows = [_row(c.arm.rsplit("_n", 1)[0], int(c.arm.rsplit("_n", 1)[1]), read_json(c.result))
            for c in cells if c.done()]
    if (scratch_dir / "eval_scratch.json").is_file() and "scratch" in arms:
        rows.append(_row("scratch", 0, read_json(scratch_dir / "eval_scratch.json")))
    table = {"counts": counts, "rows": rows, "failed": [str(f) for f in failures]}
    write_json(root / ("scaling.json" if tuple(arms) == ARMS else f"scaling_{'_'.join(arms)}.json"), table)
    ex.report(failures)
    return table


def _row(method: str, n: int, ev: dict[str, Any]) -> dict[str, Any]:
    r = ev["rollout"]
    row = {"method": method, "pretrain_embodiments": n,
           "psnr@1": r["model"]["psnr"][0], "psnr@8": r["model"]["psnr"][-1],
           "psnr_mean": float(np.mean(r["model"]["psnr"])), "ssim_mean": float(np.mean(r["model"]["ssim"])),
           "shuffled_psnr_mean": float(np.mean(r["shuffled"]["psnr"])),
           "copy_last_psnr_mean": float(np.mean(r["copy_last"]["psnr"]))}
    if "feature_distance" in r["model"]:
        row["feat_dist_mean"] = float(np.mean(r["model"]["feature_distance"]))
        row["shuffled_feat_dist_mean"] = float(np.mean(r["shuffled"]["feature_distance"]))
        row["copy_last_feat_dist_mean"] = float(np.mean(r["copy_last"]["feature_distance"]))
    if "probe" in ev:
        row["probe_r2"] = ev["probe"]["r2"]
        row["probe_r2_shuffled"] = ev["probe"]["r2_shuffled"]
        row["probe_r2_translation"] = ev["probe"].get("r2_translation")
        if "probe_adapted" in ev:
            row["probe_adapted_r2_translation"] = ev["probe_adapted"]["r2_translation"]
    if "planning" in ev:
        row["plan_success"] = ev["planning"]["model"]["success_rate"]
        row["random_select_success"] = ev["planning"]["random"]["success_rate"]
    return row


def reevaluate(overrides: list[str], counts: list[int], out_root: str, plan: bool = False) -> dict[str, Any]:
    """Evaluate every finished run of a sweep again (current metrics; planning on the largest count and the
    scratch arm when ``plan``); writes ``<out_root>/reeval.json`` with the table rows and the full evaluations."""
    from core.config import compose
    from core.experiments import method_arms

    root = Path(out_root)
    rows, full = [], {}
    arms = method_arms("lacwm")
    for method in ("lacwm", "eacwm"):
        for n in counts:
            run = root / f"{method}_n{n}"
            if (run / "adapted").exists():
                cfg = compose(["experiment=lacwm", *arms[method], *overrides, f"data.num_pretrain_embodiments={n}",
                               f"out_dir={run}"])
                full[run.name] = ev = evaluate(cfg, planning=plan and n == max(counts))
                rows.append(_row(method, n, ev))
    if (root / "scratch" / "scratch_model").exists():
        cfg = compose(["experiment=lacwm", *arms["eacwm"], *overrides, "data.num_pretrain_embodiments=1",
                       f"out_dir={root / 'scratch'}"])
        full["scratch"] = ev = evaluate(cfg, scratch=True, planning=plan)
        rows.append(_row("scratch", 0, ev))
    table = {"rows": rows, "full": full}
    write_json(root / "reeval.json", table)
    return table


def markdown(table: dict[str, Any]) -> str:
    """The README tables of a ``reeval.json``: scaling (rollout error + probe), PSNR vs horizon, planning."""

    def f(v, nd=2):
        return "–" if v is None else f"{v:.{nd}f}"

    out = ["| method | pretrain emb. | PSNR@1 | PSNR@8 | PSNR 1-8 | shuffled | copy-last | SSIM 1-8 | feat. dist "
           "(shuf. / copy) | probe R2 trans. | (all 6) | shuffled R2 | adapted IDM R2 trans. |", "|" + "---|" * 13]
    for r in sorted(table["rows"], key=lambda r: (ARMS.index(r["method"]), r["pretrain_embodiments"])):
        fd = (f"{f(r['feat_dist_mean'], 3)} ({f(r['shuffled_feat_dist_mean'], 3)} / "
              f"{f(r['copy_last_feat_dist_mean'], 3)})" if "feat_dist_mean" in r else "–")
        out.append(f"| {r['method']} | {r['pretrain_embodiments']} | {f(r['psnr@1'])} | {f(r['psnr@8'])} | "
                   f"{f(r['psnr_mean'])} | {f(r['shuffled_psnr_mean'])} | {f(r['copy_last_psnr_mean'])} | "
                   f"{f(r['ssim_mean'], 3)} | {fd} | {f(r.get('probe_r2_translation'))} | {f(r.get('probe_r2'))} | "
                   f"{f(r.get('probe_r2_shuffled'))} | {f(r.get('probe_adapted_r2_translation'))} |")
    full = table.get("full", {})
    h = max((len(ev["rollout"]["model"]["psnr"]) for ev in full.values()), default=0)
    if h:
        top = max((r["pretrain_embodiments"] for r in table["rows"]), default=0)
        out += ["", "| run / arm (PSNR at horizon) | " + " | ".join(str(i + 1) for i in range(h)) + " |",
                "|---|" + "---|" * h]
        for run, ev in full.items():
            for arm in ("model", "shuffled", "copy_last"):
                if not (run.endswith(f"_n{top}") or run == "scratch" and arm == "model"):
                    continue
                out.append(f"| {run} {arm} | " + " | ".join(f(v) for v in ev["rollout"][arm]["psnr"]) + " |")
    plans = {run: ev["planning"] for run, ev in full.items() if "planning" in ev}
    if plans:
        out += ["", "| model | episodes | success (model selection) | success (random selection) | return (model) | "
                "return (random) |", "|" + "---|" * 6]
        for run, p in plans.items():
            out.append(f"| {run} | {p['episodes']} | {f(p['model']['success_rate'])} | "
                       f"{f(p['random']['success_rate'])} | {f(p['model']['mean_return'])} | "
                       f"{f(p['random']['mean_return'])} |")
    return "\n".join(out)


def seed_markdown(tables: list[dict[str, Any]]) -> str:
    """Scaling table over several seeds' ``reeval.json`` (one per seed): per-seed PSNR 1-8 and probe, and means."""
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for t in tables:
        for r in t["rows"]:
            rows.setdefault((r["method"], r["pretrain_embodiments"]), []).append(r)

    def mean(rs, k):
        return float(np.mean([r[k] for r in rs]))

    out = ["| method | pretrain emb. | PSNR 1-8 per seed | mean | shuffled (mean) | copy-last | PSNR@1 (mean) | "
           "PSNR@8 (mean) | SSIM (mean) | probe R2 trans. per seed | shuffled R2 (mean) |", "|" + "---|" * 11]
    for key in sorted(rows, key=lambda k: (ARMS.index(k[0]), k[1])):
        rs = rows[key]
        probe = " / ".join(f"{r['probe_r2_translation']:.2f}" for r in rs) if rs[0].get("probe_r2_translation") \
            is not None else "–"
        shuf = f"{mean(rs, 'probe_r2_shuffled'):.2f}" if "probe_r2_shuffled" in rs[0] else "–"
        out.append(f"| {key[0]} | {key[1]} | " + " / ".join(f"{r['psnr_mean']:.2f}" for r in rs)
                   + f" | **{mean(rs, 'psnr_mean'):.2f}** | {mean(rs, 'shuffled_psnr_mean'):.2f} | "
                   f"{mean(rs, 'copy_last_psnr_mean'):.2f} | {mean(rs, 'psnr@1'):.2f} | {mean(rs, 'psnr@8'):.2f} | "
                   f"{mean(rs, 'ssim_mean'):.3f} | {probe} | {shuf} |")
    return "\n".join(out)


def libero_plan(a) -> int:
    """``libero-plan``: ``evaluate_libero`` with ``libero_planner`` as the policy; prints the table."""
    import functools

    from sim.libero.evaluate import INFO_FILE, evaluate_libero, parse_task_ids, stdout_table
    from worldmodels.lacwm.pipeline_lacwm import libero_planner

    if a.subgoal < 0:
        raise ConfigError(f"--subgoal must be >= 0, got {a.subgoal}")
    for path in (a.world_model, *([a.proposal] if a.proposal else [])):
        if not Path(path).exists():
            raise ConfigError(f"{path}: no such checkpoint folder")
    factory = functools.partial(libero_planner, world_model=str(a.world_model.resolve()),
                                proposal=str(Path(a.proposal).resolve()) if a.proposal else None, select=a.select,
                                num_candidates=a.candidates, horizon=a.horizon, noise=a.noise,
                                score_pool=a.score_pool, settle_steps=a.settle_steps, subgoal=a.subgoal)
    info = evaluate_libero(factory, a.suite, episodes_per_task=a.episodes_per_task, task_ids=parse_task_ids(a.tasks),
                           workers=a.workers, max_steps=a.max_steps, settle_steps=a.settle_steps, videos=a.videos, out=a.out, seed=a.seed,
                           overwrite=a.overwrite, progress=True)
    print(stdout_table(info))
    print(f"-> {a.out / INFO_FILE}")
    return 0




def _scaling(args) -> int:
    arms = tuple(a for a in args.arms.split(",") if a)
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise ConfigError(f"--arms: unknown {bad}; choose from {','.join(ARMS)}")
    table = scaling(args.overrides, args.counts, args.out, arms=arms, workers=args.workers)
    print(json.dumps(table["rows"], indent=1))
    return 1 if table.get("failed") else 0


def _reeval(args) -> int:
    table = reevaluate(args.overrides, args.counts, args.out, plan=args.plan)
    print(json.dumps(table["rows"], indent=1))
    return 1 if table.get("failed") else 0


def _table(args) -> int:
    """The markdown of a finished ``reeval.json`` (and the seed table with ``--seeds``)."""
    from core.io import read_json

    table = read_json(Path(args.out) / "reeval.json")
    print(markdown(table))
    if args.seeds:
        print("\n" + seed_markdown([table, *(read_json(Path(d) / "reeval.json") for d in args.seeds)]))
    return 0


_COUNTS = ("--counts", dict(type=int, nargs="+", default=[1, 2, 3]))
_OUT = ("--out", dict(default="outputs/lacwm/scaling"))
_OVERRIDES = ("overrides", dict(nargs="*", help="config overrides for every run"))
STUDIES = {
    "scaling": ex.Experiment(
        _scaling, help="held-out rollout error vs the number of pretraining embodiments",
        options=(_COUNTS, _OUT,
                 ("--arms", dict(default=",".join(ARMS), help=f"comma-separated arms to run (of {','.join(ARMS)})")),
                 ("--workers", dict(type=int, default=1, help="runs at a time (one process, one thread each)")),
                 _OVERRIDES)),
    "reeval": ex.Experiment(
        _reeval, help="evaluate a finished sweep again (reeval.json)",
        options=(_COUNTS, _OUT, ("--plan", dict(action="store_true", help="also run planning for the largest count")),
                 _OVERRIDES)),
    "table": ex.Experiment(
        _table, help="print the README tables of a finished reeval.json",
        options=(_OUT, ("--seeds", dict(nargs="+", default=None, help="sweep folders of other seeds (the same sweep, "
                                                                      "other trainer.seed) to average with --out")))),
    "libero-plan": ex.Experiment(
        libero_plan, help="planning with a LIBERO-trained world model, in LIBERO's protocol",
        options=(
            ("--world-model", dict(required=True, type=Path, help="the world model's folder (e.g. .../adapted)")),
            ("--proposal", dict(default=None, help="a policy checkpoint proposing action chunks (none: random "
                                                   "shooting, smooth random walks)")),
            ("--select", dict(default="model", choices=["model", "random", "policy"],
                              help="model: closest imagined frame to the goal; random: a random candidate; policy: "
                                   "the proposal itself")),
            ("--candidates", dict(type=int, default=16)),
            ("--horizon", dict(type=int, default=2, help="transitions imagined per candidate")),
            ("--noise", dict(type=float, default=0.3, help="std of the candidates' offset from the proposal")),
            ("--score-pool", dict(type=int, default=4, dest="score_pool")),
            ("--subgoal", dict(type=int, default=0, help="0: the expert's end frame is the goal; k > 0: track the "
                               "expert's path, the goal k policy steps past the nearest path frame (with --select "
                               "model)")),
            ("--suite", dict(required=True)),
            ("--tasks", dict(default=None)),
            ("--episodes-per-task", dict(type=int, default=50, dest="episodes_per_task")),
            ("--workers", dict(type=int, default=1)),
            ("--max-steps", dict(type=int, default=None, dest="max_steps", help="default: the suite's limit")),
            ("--settle-steps", dict(type=int, default=10, dest="settle_steps")),
            ("--videos", dict(type=int, default=1)),
            ("--seed", dict(type=int, default=0)),
            ("--out", dict(required=True, type=Path)),
            ("--overwrite", dict(action="store_true")))),
}


if __name__ == "__main__":
    raise SystemExit(ex.moved("worldmodels.lacwm.experiments", "lacwm"))
