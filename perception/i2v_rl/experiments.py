"""The TAGRPO comparison, rerunnable: every arm x seed through the public CLI, then the table and the plot.

    python -m perception.i2v_rl.experiments --out outputs/tagrpo_exp --seeds 0 1 2 --iterations 60 \
        --arms tagrpo dancegrpo tagrpo_indep dancegrpo_same [tagrpo_reuse] [--jobs 2] [--extra k=v ...]

Every arm post-trains the same base (the shipped Flex-Forcing model) on the same conditioning images with the
same reward, learning rate, iterations and evaluation (``embodied train tagrpo algo=<arm> trainer.seed=<s>``);
the seed changes the image order, the noises and the SDE draws. Runs go ``--jobs`` at a time (one thread each)
and a run whose ``curve.json`` reaches ``--iterations`` is not rerun; each run is then scored by ``embodied eval
tagrpo`` (three noises per held-out image, every simulator-grounded reward, base vs post-trained). ``summary.json`` / ``summary.md``: held-out
reward against iteration and against rollouts spent (mean and spread over seeds), the gain over the base, and
``curve.png``.
"""

from __future__ import annotations

import argparse
import re
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from core.experiments import mean_sd, run_cli
from core.io import read_json, write_json, write_text

ARMS = ("tagrpo", "dancegrpo", "tagrpo_indep", "dancegrpo_same")


def _done(run_dir: Path, iterations: int) -> bool:
    f = run_dir / "curve.json"
    return f.is_file() and max(c["iteration"] for c in read_json(f)["curve"]) >= iterations


def run_arm(out: Path, arm: str, seed: int, iterations: int, extra: list[str]) -> Path:
    run_dir = out / f"{arm}_s{seed}"
    over = [f"algo={arm}", f"trainer.seed={seed}", f"trainer.max_steps={iterations}", "trainer.tensorboard=false",
            f"out_dir={run_dir}", *extra]
    if not _done(run_dir, iterations):
        (run_dir / "eval.json").unlink(missing_ok=True)
        run_cli(["train", "tagrpo", *over], run_dir.with_suffix(".log"))
    if not (run_dir / "eval.json").is_file():
        run_cli(["eval", "tagrpo", *over], run_dir.with_suffix(".log"))
    return run_dir


def summarise(out: Path) -> list[dict[str, Any]]:
    """One row per arm: held-out reward curve (mean / sd over seeds) by iteration, rollouts, final gain."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(out.glob("*_s*/curve.json")):
        c = read_json(f)
        runs.setdefault(c["algo"]["name"], []).append(c)
    rows = []
    for arm, cs in runs.items():
        its = sorted(set.intersection(*({p["iteration"] for p in c["curve"]} for c in cs)))
        by = [{p["iteration"]: p for p in c["curve"]} for c in cs]
        curve = [{"iteration": i, "rollouts": statistics.fmean(b[i]["rollouts"] for b in by),
                  **mean_sd([b[i]["reward"] for b in by])} for i in its]
        gains = [b[its[-1]]["reward"] - b[0]["reward"] for b in by]
        evals = [read_json(f) for f in sorted(out.glob(f"{arm}_s*/eval.json"))
                 if re.fullmatch(rf"{re.escape(arm)}_s\d+", f.parent.name)]  # not dancegrpo_same for dancegrpo
        diag = {}
        if evals:
            diag = {w: {k: mean_sd([e[w]["diagnostics"][k] for e in evals]) for k in evals[0][w]["diagnostics"]}
                    for w in ("base", "tuned")}
        rows.append({"arm": arm, "seeds": len(cs), "curve": curve, "base": statistics.fmean(b[0]["reward"] for b in by),
                     "final": mean_sd([b[its[-1]]["reward"] for b in by]), "gain": mean_sd(gains),
                     "gain_per_seed": [round(g, 4) for g in gains],
                     "best_gain": mean_sd([max(p["reward"] for p in b.values()) - b[0]["reward"] for b in by]),
                     # mean gain over the evaluations after the start (area under the gain curve / length): "faster"
                     "mean_gain": mean_sd([statistics.fmean(b[i]["reward"] - b[0]["reward"] for i in its[1:])
                                           for b in by]),
                     # evaluations where the held-out reward fell by more than 0.01 dB: "consistent"
                     "drops": mean_sd([float(sum(b[i]["reward"] < b[j]["reward"] - 0.01 for j, i in
                                                 zip(its, its[1:], strict=False))) for b in by]),
                     "rollouts": curve[-1]["rollouts"], "iterations": its[-1], "diagnostics": diag,
                     "eval_gain": mean_sd([e["gain"] for e in evals]) if evals else None})
    order = {a: i for i, a in enumerate((*ARMS, "tagrpo_reuse"))}
    return sorted(rows, key=lambda r: order.get(r["arm"], 99))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Held-out reward against iteration and against rollouts spent (mean +- sd over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in rows:
        x_it = [p["iteration"] for p in r["curve"]]
        x_ro = [p["rollouts"] for p in r["curve"]]
        m = [p["mean"] for p in r["curve"]]
        sd = [p["sd"] for p in r["curve"]]
        for ax, x in zip(axes, (x_it, x_ro), strict=True):
            ax.plot(x, m, label=f"{r['arm']} (n={r['seeds']})")
            ax.fill_between(x, [a - b for a, b in zip(m, sd, strict=True)], [a + b for a, b in zip(m, sd, strict=True)],
                            alpha=0.15)
    axes[0].set_xlabel("iteration")
    axes[1].set_xlabel("rollouts spent")
    for ax in axes:
        ax.set_ylabel("held-out reward (PSNR dB)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    from core.io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| arm | seeds | iterations | rollouts | base | final (mean ± sd) | gain (mean ± sd) | gain per seed | "
             "mean gain over the curve | drops |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['seeds']} | {r['iterations']} | {r['rollouts']:.0f} | {r['base']:.3f} | "
                     f"{r['final']['mean']:.3f} ± {r['final']['sd']:.3f} | {r['gain']['mean']:+.3f} ± "
                     f"{r['gain']['sd']:.3f} | {', '.join(f'{g:+.3f}' for g in r['gain_per_seed'])} | "
                     f"{r['mean_gain']['mean']:+.3f} ± {r['mean_gain']['sd']:.3f} | {r['drops']['mean']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("outputs/tagrpo_exp"))
    p.add_argument("--arms", nargs="+", default=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for every run (k=v)")
    p.add_argument("--summary-only", action="store_true")
    p.add_argument("--ship", action="store_true",
                   help="copy tagrpo seed-0's policy to assets/checkpoints/tagrpo and the table + curves to "
                        "assets/samples/tagrpo/comparison.json (what the demo shows)")
    a = p.parse_args(argv)
    if not a.summary_only:
        jobs = [(arm, s) for s in a.seeds for arm in a.arms]
        with ThreadPoolExecutor(a.jobs) as ex:
            for f in [ex.submit(run_arm, a.out, arm, s, a.iterations, a.extra) for arm, s in jobs]:
                f.result()
    rows = summarise(a.out)
    write_json(a.out / "summary.json", rows)
    write_text(a.out / "summary.md", table(rows))
    plot(rows, a.out / "curve.png")
    print(table(rows))
    if a.ship:
        ship(a.out, rows, a.seeds[0], a.iterations, a.extra)
    return 0


def ship(out: Path, rows: list[dict[str, Any]], seed: int, iterations: int, extra: list[str]) -> None:
    """The demo's assets: TAGRPO's post-trained policy (seed ``seed``) and the recorded comparison."""
    import shutil

    from core.io import atomic_dir
    from core.resources import asset

    src = out / f"tagrpo_s{seed}" / "policy"
    with atomic_dir(asset("checkpoints", "tagrpo")) as tmp:
        for f in src.iterdir():
            shutil.copyfile(f, tmp / f.name)
    command = (f"python -m perception.i2v_rl.experiments --seeds {' '.join(str(r) for r in range(rows[0]['seeds']))} "
               f"--iterations {iterations} --arms {' '.join(r['arm'] for r in rows)}"
               + (f" --extra {' '.join(extra)}" if extra else ""))
    note = ("Held-out reward: PSNR (dB) of ODE samples against the simulator's continuation of 24 unseen first "
            "frames, fixed noise; base = the shipped Flex-Forcing model. Same images, reward, lr, iterations for "
            "every arm; tagrpo_reuse samples half of each group anew and reuses the bank for the rest.")
    write_json(asset("samples", "tagrpo") / "comparison.json", {"command": command, "note": note, "rows": rows})
    plot(rows, asset("samples", "tagrpo") / "curve.png")


if __name__ == "__main__":
    raise SystemExit(main())
