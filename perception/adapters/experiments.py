"""The FeRA comparison, rerunnable: every arm x seed x backbone (x resolution) through the public CLI.

    python -m perception.adapters.experiments --out outputs/fera_exp --seeds 0 1 --steps 600 \
        --backbones unet dit --arms fera fera_norouter fera_nofecl lora dora [--size 32] [--jobs 2]

Per backbone: the base is pretrained once on the source domain (``embodied train fera`` does it on first use,
into ``<out>/base_<kind>_<size>``); then each arm (``adapter=<arm>``) is fine-tuned on the same target shots
for the same steps with the same trainer settings, one run per seed (``trainer.seed``; the shots and the
held-out crops are fixed by ``data.seed``), and evaluated by ``embodied eval fera``. Runs go ``--jobs`` at a
time (one thread each). ``summary.json`` / ``summary.md`` hold the table: trainable parameters, held-out
loss per noise level and FD-EffNet, mean and spread over seeds, next to the unadapted base.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from core.experiments import mean_sd, run_cli
from core.io import read_json, write_json, write_text

ARMS = ("fera", "fera_norouter", "fera_nofecl", "lora", "dora")


def run_arm(out: Path, kind: str, size: int, arm: str, seed: int, steps: int, extra: list[str]) -> Path:
    run_dir = out / f"{kind}{size}" / f"{arm}_s{seed}"
    base = out / f"base_{kind}_{size}"
    overrides = [f"model=fera_{kind}", f"model.image_size={size}", f"model.base_path={base}", f"adapter={arm}",
                 f"trainer.seed={seed}", f"trainer.max_steps={steps}", "trainer.progress=false", f"out_dir={run_dir}",
                 *extra]
    if not (run_dir / "eval.json").is_file():
        run_cli(["train", "fera", *overrides], run_dir.with_suffix(".log"))
        run_cli(["eval", "fera", *overrides], run_dir.with_suffix(".log"))
    return run_dir


def collect(out: Path) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    """Every finished run under ``out`` (all backbones and sizes run so far), by (backbone, size, arm)."""
    results: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for f in sorted(out.glob("*/*_s*/eval.json")):
        e = read_json(f)
        results.setdefault((e["backbone"], e["image_size"], e["arm"]), []).append(e)
    return results


def summarise(results: dict[tuple[str, int, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for (kind, size, arm), evals in sorted(results.items()):
        levels = list(evals[0]["heldout_loss"])
        row = {"backbone": kind, "size": size, "arm": arm, "seeds": len(evals),
               "trainable_parameters": evals[0]["trainable_parameters"],
               "fd": mean_sd([e["fd"] for e in evals]),
               "loss": {lv: mean_sd([e["heldout_loss"][lv] for e in evals]) for lv in levels},
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
    model = task.AdaptedDenoiser(task.load_base(model_cfg), adapter)  # its training_step: MSE + FECL
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="outputs/fera_exp")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--backbones", nargs="+", default=["unet", "dit"], choices=["unet", "dit"])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides for every run")
    p.add_argument("--ship", default=None, metavar="DIR",
                   help="copy the first backbone's base, its seed-0 fera and lora adapters and the table here")
    p.add_argument("--fecl-probe", default=None, metavar="BASE_DIR",
                   help="only: FECL vs MSE gradient norms while FeRA adapts the base in BASE_DIR (a DiT)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.fecl_probe:
        write_json(out / "fecl_probe.json", fecl_gradient_probe(args.fecl_probe))
        return 0
    for kind in args.backbones:
        # the base first (one run pretrains it; the arms then share it)
        first = run_arm(out, kind, args.size, args.arms[0], args.seeds[0], args.steps, args.extra)
        jobs = [(kind, args.size, arm, s) for arm in args.arms for s in args.seeds]
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            dirs = list(pool.map(lambda j: run_arm(out, *j, args.steps, args.extra), jobs))
        assert first in dirs
        rows = summarise(collect(out))
        write_json(out / "summary.json", rows)
        write_text(out / "summary.md", markdown(rows) + "\n" + markdown_curves(rows))
    if args.ship:
        ship(out, Path(args.ship), args.backbones[0], args.size, args.seeds[0])
    print((out / "summary.md").read_text())
    return 0


def ship(out: Path, dest: Path, kind: str, size: int, seed: int) -> None:
    """What the demo loads: ``model.json``, ``base/model.safetensors``, ``fera/`` and ``lora/`` adapter folders,
    ``comparison.md`` (the summary table)."""
    import shutil

    from core import checkpoint as ckpt
    from core.io import atomic_dir

    runs = out / f"{kind}{size}"
    cfg = read_json(runs / f"fera_s{seed}" / "config.json")
    with atomic_dir(dest) as tmp:
        tmp = Path(tmp)
        model = dict(cfg["model"], base_path="(shipped: base/)")
        write_json(tmp / "model.json", model)
        latest = ckpt.latest_checkpoint(out / f"base_{kind}_{size}" / "checkpoints")
        (tmp / "base").mkdir()
        shutil.copy2(latest / ckpt.MODEL_FILE, tmp / "base" / "model.safetensors")
        for arm in ("fera", "lora"):
            shutil.copytree(runs / f"{arm}_s{seed}" / "adapter", tmp / arm)
        shutil.copy2(out / "summary.md", tmp / "comparison.md")


if __name__ == "__main__":
    raise SystemExit(main())
