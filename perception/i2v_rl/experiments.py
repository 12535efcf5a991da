"""The TAGRPO comparison, rerunnable: every arm x seed through the public CLI, then the table and the plot.

    embodied experiment tagrpo --out outputs/tagrpo_exp --seeds 0 1 2 --iterations 60 \
        --arms tagrpo dancegrpo tagrpo_indep dancegrpo_same [tagrpo_reuse] [--workers 2] \
        [--base FOLDER] [--rewards trajectory=1 psnr=0.01] [--extra k=v ...]
    embodied experiment tagrpo --pilot [--base FOLDER] [--rewards ...]   # the reward / noise pilot

The arms are TAGRPO's registered arms (``perception/i2v_rl/register.py``). Every arm post-trains the same base
(``--base``: the shipped Flex-Forcing model by default, or any ``model.base_path``, a Wan diffusers folder
included) on the same conditioning images with the same reward (``--rewards name=weight ...``, default the motion
reward ``MOTION_REWARD``; ``data.rewards`` of the runs), learning rate,
iterations and evaluation (the ``core.experiments`` grid: ``embodied train tagrpo <arm> trainer.seed=<s>``);
the seed changes the image order, the noises and the SDE draws. Runs go ``--workers`` at a time (one thread
each) and a run whose ``curve.json`` reaches ``--iterations`` is not retrained; each run is then scored by
``embodied eval tagrpo`` (three noises per held-out image, every simulator-grounded reward, base vs
post-trained). ``summary.json`` / ``summary.md``: held-out reward against iteration and against rollouts spent
(mean and spread over seeds), the gain over the base, and ``curve.png``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from core import experiments as ex
from core.io import read_json, write_json

ARMS = ("tagrpo", "dancegrpo", "tagrpo_indep", "dancegrpo_same")  # the default of --arms (tagrpo_reuse, mixgrpo: opt in)
GUARD_LAST = 10  # GRPO-Guard's ratio means are summarised over a run's last GUARD_LAST iterations
# The reward that pays for motion: the simulator's trajectory reward (centroid tracking, in frame diagonals) plus a
# small PSNR term that keeps the appearance from drifting. In the pilot (``--pilot``, README) a PSNR weight of 0.01
# gave the group as much spread as the trajectory term; at 0.005 it is half of it, so the motion ranks the rollouts.
MOTION_REWARD = {"trajectory": 1.0, "psnr": 0.005}


def _trained(iterations: int):
    """Whether a run folder's ``curve.json`` reaches ``iterations`` (a shorter run trains on and is rescored)."""
    def trained(run_dir: Path) -> bool:
        f = run_dir / "curve.json"
        return f.is_file() and max(c["iteration"] for c in read_json(f)["curve"]) >= iterations
    return trained


def guard(ratio_steps: list[dict[str, Any]], last: int = GUARD_LAST) -> dict[str, Any]:
    """GRPO-Guard's diagnostic of one run (``curve.json``'s ``ratio_steps``), over its last ``last`` iterations.

    ``steps``: sampling step -> the mean over those iterations of the step's importance-ratio mean minus 1
    (``ratio_m1``), of its sd over the update's samples (``sd``), and the update it was trained in (``update``: 0
    is on-policy, where the ratio is exactly 1; a step trained in both is averaged over its off-policy entries);
    ``off_policy``: the same averaged over the steps trained after an
    optimizer step (update >= 1); ``seconds``: the run's summed iteration, rollout, evaluation and update seconds.
    """
    if not ratio_steps:
        return {}
    top = max(r["iteration"] for r in ratio_steps)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in ratio_steps:
        if r["iteration"] > top - last:
            for e in r["steps"]:
                by_step.setdefault(e["step"], []).append(e)
    # a step trained both on- and off-policy in those iterations (MixGRPO's window moving) counts off-policy only
    by_step = {i: [e for e in es if e["update"] >= 1] or es for i, es in by_step.items()}
    steps = {i: {"ratio_m1": statistics.fmean(e["mean"] - 1 for e in es), "sd": statistics.fmean(e["sd"] for e in es),
                 "update": max(e["update"] for e in es)} for i, es in sorted(by_step.items())}
    off = [v for v in steps.values() if v["update"] >= 1]
    secs = [r["seconds"] for r in ratio_steps if "seconds" in r]
    return {"steps": steps, "off_policy": statistics.fmean(v["ratio_m1"] for v in off) if off else None,
            "seconds": {k: sum(x[k] for x in secs) for k in secs[0]} if secs else {}}


def flattens_at(curve: list[dict[str, Any]], tail: int = 3) -> int | None:
    """The first evaluation from which the mean held-out reward stays on its plateau: the plateau is the mean of the
    last ``tail`` evaluations and its band the larger of their across-seed sd and their own spread about it; every
    later mean must lie in the band. None (not flat) when the last ``tail`` means still move by more than a quarter
    of the curve's whole range, or for a curve of fewer than ``tail + 1`` evaluations."""
    if len(curve) <= tail:
        return None
    means = [p["mean"] for p in curve]
    if max(means[-tail:]) - min(means[-tail:]) > 0.25 * (max(means) - min(means)):
        return None
    plateau = statistics.fmean(p["mean"] for p in curve[-tail:])
    band = max(max(max(p["sd"], abs(p["mean"] - plateau)) for p in curve[-tail:]), 1e-12)
    for k, p in enumerate(curve):
        if all(abs(q["mean"] - plateau) <= band for q in curve[k:]):
            return p["iteration"]
    return curve[-1]["iteration"]


def summarise(out: Path) -> list[dict[str, Any]]:
    """One row per arm: held-out reward curve (mean / sd over seeds) by iteration, rollouts, final gain, where it
    flattens, GRPO-Guard's per-step ratio means (``guard``) and the run's seconds."""
    curves, evals_by_arm = ex.collect(out, "curve.json"), ex.collect(out, "eval.json")
    rows = []
    for arm, by_seed in curves.items():
        cs = list(by_seed.values())
        its = sorted(set.intersection(*({p["iteration"] for p in c["curve"]} for c in cs)))
        by = [{p["iteration"]: p for p in c["curve"]} for c in cs]
        curve = [{"iteration": i, "rollouts": statistics.fmean(b[i]["rollouts"] for b in by),
                  **ex.mean_sd([b[i]["reward"] for b in by])} for i in its]
        gains = [b[its[-1]]["reward"] - b[0]["reward"] for b in by]
        evals = list(evals_by_arm.get(arm, {}).values())  # by folder name: not dancegrpo_same for dancegrpo
        diag = {}
        if evals:
            diag = {w: ex.seed_stats(evals, {k: f"{w}/diagnostics/{k}" for k in evals[0][w]["diagnostics"]})
                    for w in ("base", "tuned")}
            for d in diag.values():
                d.pop("seeds")
        rows.append({"arm": arm, "seeds": len(cs), "curve": curve, "base": statistics.fmean(b[0]["reward"] for b in by),
                     "final": ex.mean_sd([b[its[-1]]["reward"] for b in by]), "gain": ex.mean_sd(gains),
                     "gain_per_seed": [round(g, 4) for g in gains],
                     "best_gain": ex.mean_sd([max(p["reward"] for p in b.values()) - b[0]["reward"] for b in by]),
                     # mean gain over the evaluations after the start (area under the gain curve / length): "faster"
                     "mean_gain": ex.mean_sd([statistics.fmean(b[i]["reward"] - b[0]["reward"] for i in its[1:])
                                              for b in by]),
                     # evaluations where the held-out reward fell by more than 0.01 dB: "consistent"
                     "drops": ex.mean_sd([float(sum(b[i]["reward"] < b[j]["reward"] - 0.01 for j, i in
                                                    zip(its, its[1:], strict=False))) for b in by]),
                     "rollouts": curve[-1]["rollouts"], "iterations": its[-1], "diagnostics": diag,
                     "eval_gain": ex.mean_sd([e["gain"] for e in evals]) if evals else None,
                     "flattens_at": flattens_at(curve), **_guard_row(cs)})
    order = {a: i for i, a in enumerate((*ARMS, "tagrpo_reuse", "mixgrpo"))}
    return sorted(rows, key=lambda r: order.get(r["arm"], 99))


def _guard_row(cs: list[dict[str, Any]]) -> dict[str, Any]:
    """GRPO-Guard's per-step ratio means and the seconds of one arm, mean / sd over its seeds' runs."""
    gs = [g for g in (guard(c.get("ratio_steps", [])) for c in cs) if g]
    if not gs:
        return {}
    steps = sorted(set.intersection(*(set(g["steps"]) for g in gs)))
    out: dict[str, Any] = {"guard": {str(i): {**ex.mean_sd([g["steps"][i]["ratio_m1"] for g in gs]),
                                               "update": gs[0]["steps"][i]["update"],
                                               "ratio_sd": statistics.fmean(g["steps"][i]["sd"] for g in gs)}
                                     for i in steps}}
    off = [g["off_policy"] for g in gs if g["off_policy"] is not None]
    out["guard_off_policy"] = ex.mean_sd(off) if off else None
    if all(g["seconds"] for g in gs):
        out["seconds"] = {k: ex.mean_sd([g["seconds"][k] for g in gs]) for k in gs[0]["seconds"]}
    return out


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
        ax.set_ylabel("held-out reward (data.rewards)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    from core.io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def table(rows: list[dict[str, Any]]) -> str:
    """One markdown row per arm: the held-out reward's base, final value and gain (mean ± sd over seeds)."""
    def d3(v):
        return f"{v:+.3f}"

    def secs(r, k):
        s = r.get("seconds", {}).get(k)
        return f"{s['mean']:.0f} ± {s['sd']:.0f}" if s else "-"

    header = ["arm", "seeds", "iterations", "rollouts", "base", "final (mean ± sd)", "gain (mean ± sd)",
              "gain per seed", "mean gain over the curve", "drops", "flat from it.", "train s", "update s"]
    main = ex.markdown_table(header, (
        [r["arm"], r["seeds"], r["iterations"], f"{r['rollouts']:.0f}", f"{r['base']:.4f}",
         ex.pm(r["final"], digits=4), f"{d3(r['gain']['mean'])} ± {r['gain']['sd']:.3f}",
         ", ".join(map(d3, r["gain_per_seed"])), f"{d3(r['mean_gain']['mean'])} ± {r['mean_gain']['sd']:.3f}",
         f"{r['drops']['mean']:.1f}", "no" if r.get("flattens_at") is None else r["flattens_at"], secs(r, "iteration"), secs(r, "update")]
        for r in rows)) + "\n"
    return main + ("\n" + guard_table(rows) if any(r.get("guard") for r in rows) else "")


def guard_table(rows: list[dict[str, Any]]) -> str:
    """GRPO-Guard's diagnostic: per arm and sampling step, the importance-ratio mean minus 1 (x 1e-3) over the last
    ``GUARD_LAST`` iterations (mean ± sd over seeds); ``*`` marks a step trained in the first update (on-policy,
    exactly 0), ``-`` a step not trained then."""
    steps = sorted({int(i) for r in rows for i in r.get("guard", {})})

    def cell(r, i):
        g = r.get("guard", {}).get(str(i))
        if g is None:
            return "-"
        return "0 *" if g["update"] == 0 else f"{1e3 * g['mean']:+.2f} ± {1e3 * g['sd']:.2f}"

    off = lambda r: "-" if not r.get("guard_off_policy") else f"{1e3 * r['guard_off_policy']['mean']:+.2f}"  # noqa: E731
    return ex.markdown_table(["arm", *(f"step {i}" for i in steps), "off-policy mean"],
                             ([r["arm"], *(cell(r, i) for i in steps), off(r)] for r in rows if r.get("guard"))) + "\n"


def updates_per_iteration(extra: list[str]) -> int:
    """``algo.updates_per_iteration`` of the runs: an ``--extra`` override, else the algo default (every arm's)."""
    from perception.i2v_rl.configuration_tagrpo import AlgoConfig

    given = [o.split("=", 1)[1] for o in extra if o.startswith("algo.updates_per_iteration=")]
    return int(given[-1]) if given else AlgoConfig().updates_per_iteration


def reward_overrides(rewards: dict[str, float]) -> list[str]:
    """``data.rewards`` of every run as Hydra overrides (the group replaced, not merged with the default)."""
    body = ",".join(f"{k}:{v}" for k, v in rewards.items())
    return [f"data.rewards={{{body}}}"]


def parse_rewards(items: list[str] | None) -> dict[str, float]:
    """``["trajectory=1", "psnr=0.01"]`` -> ``{"trajectory": 1.0, "psnr": 0.01}`` (None: ``MOTION_REWARD``)."""
    from core.errors import ConfigError

    if not items:
        return dict(MOTION_REWARD)
    out = {}
    for it in items:
        name, sep, w = it.partition("=")
        try:
            out[name] = float(w) if sep else 1.0
        except ValueError:
            raise ConfigError(f"--rewards {it!r}: expected name=weight") from None
    return out


def pilot(base: str | None, rewards: dict[str, float], etas=(0.3, 0.7), images: int = 8, group: int = 8,
          steps: int | None = None, seed: int = 0, data_overrides: list[str] | None = None,
          windows: tuple[int, ...] = (1, 2, 4)) -> dict[str, Any]:
    """Within-group reward spread of the base model: same initial noise vs independent noise, per SDE ``eta``,
    and with the SDE only inside a window (MixGRPO).

    For ``images`` training conditioning images (the experiment's data), ``group`` SDE rollouts each from one
    shared or from independent initial noises; the reward's std within a group (population), averaged over
    images, and of each reward term. Same-noise groups only help when the start carries a real share of the
    spread, and the reward must vary at all inside a group for any GRPO advantage to exist. ``window_rows`` (at
    the first ``eta``): the same with the SDE only on ``W`` consecutive steps (each ``W`` of ``windows``, at the
    noise end, the middle and the data end) and the ODE elsewhere. With same noise the spread is then what the
    window's draws make, the only part a MixGRPO update can credit; with independent noise the rest is the start.
    """
    import torch

    from core.config import compose, to_object
    from perception.i2v_rl.rewards import CompositeReward, RewardInputs
    from perception.i2v_rl.task import build_policy, conditioning_set

    over = ["experiment=tagrpo", *(data_overrides or [])] + ([f"model.base_path={base}"] if base else [])
    if steps:
        over.append(f"model.sample_steps={steps}")
    cfg = compose(over)
    model_cfg, data = to_object(cfg.model), to_object(cfg.data)
    policy = build_policy(model_cfg, data, "cpu").eval()
    pool = conditioning_set(data, policy.video_frames, "train")
    reward = CompositeReward(rewards)
    n = min(images, len(pool))
    out: dict[str, Any] = {"base": str(model_cfg.base_path), "rewards": rewards, "images": n, "group": group,
                           "steps": policy.steps, "shift": policy.shift, "rows": []}
    s = policy.steps
    spans = [(None, None)] + [(w, start) for w in windows if w <= s
                              for start in sorted({0, (s - w) // 2, s - w})]
    out["window_rows"] = []
    for eta, (w, start) in [(e, (None, None)) for e in etas] + [(etas[0], sp) for sp in spans[1:]]:
        for noise in ("same", "independent"):
            g = torch.Generator().manual_seed(seed)
            stds, terms = [], {}
            for i in range(n):
                imgs = pool.images[i:i + 1].expand(group, -1, -1, -1).contiguous()
                first = policy.encode_first(imgs)
                x0 = (policy.initial_noise(1, g).expand(group, -1, -1, -1, -1) if noise == "same"
                      else policy.initial_noise(group, g)).contiguous()
                traj = policy.rollout(first, x0, eta, g, sde_steps=None if w is None else list(range(start,
                                                                                                   start + w)))
                video = policy.decode_video(imgs, traj.final, first)
                total, parts = reward(RewardInputs(video, pool.reference[i:i + 1].expand_as(video).contiguous()))
                stds.append(float(total.std(unbiased=False)))
                for k, v in parts.items():
                    terms.setdefault(k, []).append((float(v.std(unbiased=False)), float(v.mean())))
            row = {"eta": eta, "noise": noise, "reward_std": statistics.fmean(stds),
                   **{f"{k}_std": statistics.fmean(a for a, _ in v) for k, v in terms.items()},
                   **{f"{k}_mean": statistics.fmean(b for _, b in v) for k, v in terms.items()}}
            if w is None:
                out["rows"].append(row)
            else:
                row = {"window": w, "start": start, **row}
                out["window_rows"].append(row)
            print(row)
    return out


def run(a) -> int:
    """``embodied experiment tagrpo``: the pilot, or every arm on every seed, the table and the curves."""
    rewards = parse_rewards(a.rewards)
    common = reward_overrides(rewards) + ([f"model.base_path={a.base}"] if a.base else [])
    if a.pilot:
        data_over = [o for o in a.extra if o.startswith("data.")]
        write_json(a.out / "pilot.json", pilot(a.base, rewards, data_overrides=data_over))
        return 0
    failures = []
    if not a.collect_only:
        steps = a.iterations * updates_per_iteration(a.extra)  # trainer.max_steps counts optimizer steps
        grid = ex.Grid("tagrpo", a.out, ex.pick_arms(ex.method_arms("tagrpo"), a.arms), a.seeds,
                       [f"trainer.max_steps={steps}", "trainer.tensorboard=false", *common, *a.extra],
                       trained=_trained(a.iterations))
        failures = grid.run(a.workers)
    rows = summarise(a.out)
    ex.write_summary(a.out, rows, table(rows))
    plot(rows, a.out / "curve.png")
    print(table(rows))
    if a.ship:
        ship(a.out, rows, a.seeds[0], a.iterations, [*common, *a.extra])
    if a.record:
        record(a.record, rows, a.seeds, a.iterations, [*common, *a.extra])
    return ex.report(failures)


def record(name: str, rows: list[dict[str, Any]], seeds, iterations: int, extra: list[str]) -> None:
    """The table and curves (no checkpoint) as ``assets/samples/tagrpo/<name>.{json,png}``, which the demo shows
    beside ``comparison.json``."""
    from core.resources import asset

    command = (f"embodied experiment tagrpo --seeds {' '.join(map(str, seeds))} --iterations {iterations} "
               f"--arms {' '.join(r['arm'] for r in rows)} --record {name}")
    note = ("Held-out reward (trajectory + 0.005 PSNR) of ODE samples on 24 unseen first frames, fixed noise. Same "
            "base, images, reward, lr, iterations for every arm. mixgrpo: GRPO with the SDE only in a 2-step window "
            "sliding from the noise end (ODE elsewhere), only the window trained. GRPO-Guard: the importance-ratio "
            "mean minus 1 per sampling step over the last iterations.")
    write_json(asset("samples", "tagrpo") / f"{name}.json",
               {"command": command, "note": note, "extra": extra, "rows": rows})
    plot(rows, asset("samples", "tagrpo") / f"{name}.png")


def ship(out: Path, rows: list[dict[str, Any]], seed: int, iterations: int, extra: list[str]) -> None:
    """The demo's assets: TAGRPO's post-trained policy (seed ``seed``) and the recorded comparison."""
    from core.resources import asset
    from perception.i2v_rl.modeling_tagrpo import ship_policy

    # the shipped copy references the sibling shipped base (../flexforcing), not the run's absolute path
    ship_policy(out / f"tagrpo_s{seed}" / "policy", asset("checkpoints", "tagrpo"))
    command = (f"embodied experiment tagrpo --seeds {' '.join(str(r) for r in range(rows[0]['seeds']))} "
               f"--iterations {iterations} --arms {' '.join(r['arm'] for r in rows)}"
               + (f" --extra {' '.join(extra)}" if extra else ""))
    note = ("Held-out reward (data.rewards of the runs; default trajectory + 0.005 PSNR) of ODE samples against the "
            "simulator's continuation of 24 unseen first frames, fixed noise; base = model.base_path. Same images, reward, lr, iterations for "
            "every arm; tagrpo_reuse samples half of each group anew and reuses the bank for the rest.")
    write_json(asset("samples", "tagrpo") / "comparison.json", {"command": command, "note": note, "rows": rows})
    plot(rows, asset("samples", "tagrpo") / "curve.png")


EXPERIMENT = ex.Experiment(
    run, out="outputs/tagrpo_exp", arms=ARMS, seeds=(0, 1, 2),
    options=(("--iterations", dict(type=int, default=60)),
             ("--base", dict(default=None, help="model.base_path of every run (default: the shipped Flex-Forcing "
                                                "model); a Flex-Forcing / TAGRPO folder or a Wan diffusers folder")),
             ("--rewards", dict(nargs="*", default=None, metavar="NAME=W",
                                help=f"data.rewards of every run (default the motion reward {MOTION_REWARD})")),
             ("--pilot", dict(action="store_true", help="only the pilot: within-group reward spread of the base, "
                                                        "same vs independent noise (-> <out>/pilot.json)")),
             ("--extra", dict(nargs="*", default=[], help="more overrides for every run (k=v)")),
             ("--record", dict(default=None, metavar="NAME",
                               help="write the table and curves to assets/samples/tagrpo/NAME.{json,png} (the demo "
                                    "shows every recorded comparison there)")),
             ("--ship", dict(action="store_true",
                             help="copy tagrpo seed-0's policy to assets/checkpoints/tagrpo and the table + curves "
                                  "to assets/samples/tagrpo/comparison.json (what the demo shows)"))))

if __name__ == "__main__":
    raise SystemExit(ex.moved("perception.i2v_rl.experiments", "tagrpo"))
