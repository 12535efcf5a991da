"""The FeRA comparison, rerunnable: every arm x seed x backbone (x resolution) through the public CLI.

    embodied experiment fera --out outputs/fera_exp --seeds 0 1 --steps 600 \
        --backbones unet dit --arms fera fera_norouter fera_nofecl lora dora [--size 32] [--workers 2]

The arms are FeRA's registered arms (``perception/adapters/register.py``). Per backbone: the base is pretrained
once on the source domain (the first run does it alone, into ``<out>/base_<kind>_<size>``); then each arm is
fine-tuned on the same target shots for the same steps with the same trainer settings, one run per seed
(``trainer.seed``; the shots and the held-out crops are fixed by ``data.seed``), and evaluated by ``embodied eval
fera`` (the ``core.experiments`` grid, in ``<out>/<kind><size>/<arm>_s<seed>``). Runs go ``--workers`` at a time
(one thread each); a run with an ``eval.json`` is not rerun. ``summary.json`` / ``summary.md`` hold the table:
trainable parameters, held-out loss per noise level and FD-EffNet, mean and spread over seeds, next to the
unadapted base.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from core import experiments as ex
from core.io import write_json

ARMS = ("fera", "fera_norouter", "fera_nofecl", "lora", "dora", "xlora", "fourierft", "waveft")  # run order


def grid(out: Path, kind: str, size: int, arms: dict[str, tuple[str, ...]], seeds: list[int], steps: int,
         extra: list[str]) -> ex.Grid:
    """One backbone's arm x seed grid (every arm adapts the same base, ``<out>/base_<kind>_<size>``)."""
    return ex.Grid("fera", out / f"{kind}{size}", arms, seeds,
                   [f"model=fera_{kind}", f"model.image_size={size}", f"model.pretrain_dir={out / f'base_{kind}_{size}'}",
                    f"trainer.max_steps={steps}", "trainer.progress=false", *extra])


def collect(out: Path) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    """Every finished run under ``out`` (all backbones and sizes run so far), by (backbone, size, arm)."""
    results: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for sub in sorted(d for d in out.iterdir() if d.is_dir()) if out.is_dir() else []:
        for by_seed in ex.collect(sub).values():
            for e in by_seed.values():
                results.setdefault((e["backbone"], e["image_size"], e["arm"]), []).append(e)
    return results


def summarise(results: dict[tuple[str, int, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for (kind, size, arm), evals in sorted(results.items()):
        levels = list(evals[0]["heldout_loss"])
        row = {"backbone": kind, "size": size, "arm": arm, "seeds": len(evals),
               "trainable_parameters": evals[0]["trainable_parameters"],
               "fd": ex.mean_sd([e["fd"] for e in evals]),
               "loss": {lv: ex.mean_sd([e["heldout_loss"][lv] for e in evals]) for lv in levels},
               "base": evals[0]["base"]}
        curves = [{p["step"]: p["mean"] for p in e.get("curve", [])} for e in evals]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves and all(curves) else []
        row["curve"] = {str(st): statistics.fmean(c[st] for c in curves) for st in steps}
        if "routing_by_level" in evals[0]:
            row["routing_by_level"] = evals[0]["routing_by_level"]
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    levels = list(rows[0]["loss"])
    head = ["backbone", "arm", "params", *[f"loss {lv}" for lv in levels], "FD"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    seen_base = set()
    for r in rows:
        key = (r["backbone"], r["size"])
        if key not in seen_base:
            seen_base.add(key)
            b = r["base"]
            lines.append("| " + " | ".join([f"{r['backbone']}{r['size']}", "base (no adapter)", "0",
                                            *[f"{b['heldout_loss'][lv]:.4f}" for lv in levels],
                                            f"{b['fd']:.1f}"]) + " |")
        cells = [f"{r['backbone']}{r['size']}", r["arm"], str(r["trainable_parameters"]),
                 *[f"{r['loss'][lv]['mean']:.4f} ± {r['loss'][lv]['sd']:.4f}" for lv in levels],
                 f"{r['fd']['mean']:.1f} ± {r['fd']['sd']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_curves(rows: list[dict[str, Any]]) -> str:
    """Held-out loss (mean over levels and seeds) against adaptation steps, one row per arm."""
    steps = sorted({int(st) for r in rows for st in r.get("curve", {})})
    if not steps:
        return ""
    lines = ["| backbone | arm | " + " | ".join(f"step {st}" for st in steps) + " |",
             "|" + "---|" * (len(steps) + 2)]
    for r in rows:
        c = r.get("curve", {})
        lines.append(f"| {r['backbone']}{r['size']} | {r['arm']} | "
                     + " | ".join(f"{c[str(st)]:.4f}" if str(st) in c else "" for st in steps) + " |")
    return "\n".join(lines) + "\n"


def fecl_gradient_probe(base_path: str, kind: str = "dit", steps: int = 60, seed: int = 0) -> list[dict[str, float]]:
    """FeRA training on the target shots from the base at ``base_path``, reporting at a few steps the norms of
    the MSE's and FECL's gradients on the adapter (FECL is scale-invariant in delta = adapted - base, so its
    gradient grows like 1 / |delta|: largest when the zero-initialised adapter starts to move)."""
    import torch

    from core.config import compose
    from perception.adapters import task
    torch.manual_seed(seed)
    model_cfg, data, adapter, _ = task._configs(compose(["experiment=fera", f"model=fera_{kind}",
                                                         f"model.base_path={base_path}"]))
    model = task.AdaptedDenoiser.around(task.load_base(model_cfg), adapter, base_path)  # MSE + FECL step
    shots = task.target_split(model_cfg, data, "train").float() / 127.5 - 1
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for step in range(1, steps + 1):
        out = model.training_step({"image": shots[torch.randint(0, len(shots), (16,), generator=g)]})
        mse, fecl = out["mse"], out["fecl"]
        norms = []
        for loss in (mse, fecl):
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            norms.append(float(torch.sqrt(sum((x ** 2).sum() for x in grads if x is not None))))
        if step in (1, 2, 3, 5, 10, 20, 40, 60, steps):
            rows.append({"step": step, "mse": mse.item(), "fecl": fecl.item(), "grad_mse": norms[0],
                         "grad_fecl": norms[1], "ratio": norms[1] / norms[0]})
            print(rows[-1])
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    return rows


def run(args) -> int:
    """``embodied experiment fera``: per backbone, pretrain the base once, adapt every arm, tabulate."""
    out = Path(args.out)
    if args.fecl_probe:
        write_json(out / "fecl_probe.json", fecl_gradient_probe(args.fecl_probe))
        return 0
    failures = []
    if not args.collect_only:
        arms = ex.pick_arms(ex.method_arms("fera"), args.arms)
        for kind in args.backbones:  # the first run pretrains the base alone; the arms then share it
            failures += grid(out, kind, args.size, arms, args.seeds, args.steps, args.extra).run(args.workers, True)
    rows = summarise(collect(out))
    if rows:
        ex.write_summary(out, rows, markdown(rows) + "\n" + markdown_curves(rows))
        print((out / "summary.md").read_text())
    if args.ship:
        ship(out, Path(args.ship), args.backbones[0], args.size, args.seeds[0])
    return ex.report(failures)


def ship(out: Path, dest: Path, kind: str, size: int, seed: int) -> None:
    """What the demo loads: ``fera/`` and ``lora/`` (self-contained exported models of the seed-``seed`` runs,
    each with its base copied into ``<arm>/base``) and ``comparison.md`` (the summary table)."""
    from perception.adapters.task import ship_models

    runs = out / f"{kind}{size}"
    ship_models({arm: runs / f"{arm}_s{seed}" for arm in ("fera", "lora")}, dest, out / "summary.md")


EXPERIMENT = ex.Experiment(
    run, out="outputs/fera_exp", arms=ARMS,
    options=(("--steps", dict(type=int, default=600)),
             ("--backbones", dict(nargs="+", default=["unet", "dit"], choices=["unet", "dit"])),
             ("--size", dict(type=int, default=32)),
             ("--extra", dict(nargs="*", default=[], help="more Hydra overrides for every run")),
             ("--ship", dict(default=None, metavar="DIR", help="copy the first backbone's base, its seed-0 fera and "
                                                              "lora adapters and the table here")),
             ("--fecl-probe", dict(default=None, metavar="BASE_DIR",
                                   help="only: FECL vs MSE gradient norms while FeRA adapts the base in BASE_DIR "
                                        "(a DiT)"))))

if __name__ == "__main__":
    raise SystemExit(ex.moved("perception.adapters.experiments", "fera"))
