"""The Deep-VRM comparison, rerunnable: every arm x seed through the public CLI, the layer probe, the table.

    python -m perception.forensics.experiments --out outputs/deepvrm_exp --seeds 0 1 \
        [--arms deepvrm lora full freq_cnn feature_probe] [--jobs 2] [--extra k=v ...] [--summary-only] [--ship]

Every arm trains on the same GenImage-layout set (``data.root``; built on first use), the same steps and the same
evaluation (``embodied train deepvrm model.arm=<arm> trainer.seed=<s>`` then ``embodied eval deepvrm``); the VLM
arms start from the same base VLM (``model.base_path``, pretrained on image QA on first use). A run with an
``eval.json`` is not rerun. Then the layer-wise probe of the base (``probe.json``) and ``summary.json`` /
``summary.md``: accuracy / AP per generator (the held-out family marked), the general-ability QA accuracy after
training against the base's, mean and spread over seeds.
"""

from __future__ import annotations

import argparse
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from core.experiments import mean_sd, run_cli
from core.io import read_json, write_json, write_text

ARMS = ("deepvrm", "lora", "full", "freq_cnn", "feature_probe")
LABELS = {"deepvrm": "Deep-VRM", "lora": "LoRA only (no residual)", "full": "full fine-tuning",
          "freq_cnn": "frequency CNN", "feature_probe": "frozen-feature probe (EffNet-Lite0)"}


def run_arm(out: Path, arm: str, seed: int, extra: list[str]) -> Path:
    run_dir = out / f"{arm}_s{seed}"
    over = [f"model.arm={arm}", f"trainer.seed={seed}", "trainer.tensorboard=false", f"out_dir={run_dir}", *extra]
    if not (run_dir / "detector").is_dir():
        (run_dir / "eval.json").unlink(missing_ok=True)
        run_cli(["train", "deepvrm", *over], run_dir.with_suffix(".log"))
    if not (run_dir / "eval.json").is_file():
        run_cli(["eval", "deepvrm", *over], run_dir.with_suffix(".log"))
    return run_dir


def probe(out: Path, extra: list[str], n: int = 400) -> dict[str, Any]:
    """The layer-wise probe of the base VLM (semantic labels from QA, real / fake from GenImage val)."""
    from core.config import compose
    from core.vlm import load_vlm
    from perception.forensics.configuration_deepvrm import VERDICT_PROMPT
    from perception.forensics.genimage import list_generators
    from perception.forensics.probe import layer_probe
    from perception.forensics.task import _configs, build_detector, ensure_data, load_split, qa_sets

    if (out / "probe.json").is_file():
        return read_json(out / "probe.json")
    cfg = compose(["experiment=deepvrm", *extra])
    model_cfg, data, _ = _configs(cfg)
    ensure_data(data)
    vlm, tok = load_vlm(model_cfg.base_path)
    model_cfg.arm = "full"  # no adapters: the plain base
    model = build_detector(vlm, tok, model_cfg).eval()
    records = qa_sets(model_cfg, data, ("test",))["test"]
    tasks = {}
    for kind in ("colour", "shape", "count", "domain"):
        rs = [r for r in records if r.kind == kind][:n]
        tasks[kind] = (np.stack([r.image for r in rs]), np.array([r.answer for r in rs]), rs[0].question)
    images, labels, _ = load_split(data.root, "val", list_generators(data.root), data.size, n // 8)
    tasks["real_vs_fake"] = (images, labels, VERDICT_PROMPT)
    result = {"inject_layer": model_cfg.inject_layer, "layers": len(vlm.model.language_model.layers),
              "probe": layer_probe(model, tasks)}
    write_json(out / "probe.json", result)
    return result


def summarise(out: Path, command: str = "") -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(out.glob("*_s*/eval.json")):
        arm = f.parent.name.rsplit("_s", 1)[0]
        runs.setdefault(arm, []).append(read_json(f))
    rows: dict[str, Any] = {}
    gens: list[str] = []
    holdout = None
    for arm in [a for a in ARMS if a in runs] + sorted(set(runs) - set(ARMS)):
        evs = runs[arm]
        holdout = evs[0]["holdout"]
        gens = [g for g in evs[0]["per_generator"] if g not in ("all", "mean")]
        row: dict[str, Any] = {"seeds": len(evs)}
        for g in [*gens, "mean"]:
            for m in ("acc", "ap"):
                row[f"{g}.{m}"] = mean_sd([e["per_generator"][g][m] for e in evs])
        if "qa" in evs[0]:
            row["qa"] = mean_sd([e["qa"]["acc"] for e in evs])
            row["qa_base"] = evs[0]["qa_base"]["acc"]
        rows[arm] = row
    summary = {"command": command, "generators": gens, "holdout": holdout, "rows": rows,
               "trained_on": next(iter(runs.values()))[0]["trained_on"] if runs else []}
    if (out / "probe.json").is_file():
        summary["probe"] = read_json(out / "probe.json")
    write_json(out / "summary.json", summary)
    write_text(out / "summary.md", table(summary))
    return summary


def _pm(v: dict[str, float] | None) -> str:
    return "–" if v is None else f"{100 * v['mean']:.1f} ± {100 * v['sd']:.1f}"


def table(summary: dict[str, Any]) -> str:
    gens, hold = summary["generators"], summary["holdout"]
    cols = [f"{g}{' (held out)' if g == hold else ''}" for g in gens]
    lines = ["| arm | " + " | ".join(f"{c} acc / AP" for c in cols) + " | mean acc / AP | QA after (base) |",
             "|---|" + "---|" * (len(gens) + 2)]
    for arm, r in summary["rows"].items():
        cells = [f"{_pm(r[f'{g}.acc'])} / {_pm(r[f'{g}.ap'])}" for g in [*gens, "mean"]]
        qa = f"{_pm(r['qa'])} ({100 * r['qa_base']:.1f})" if "qa" in r else "n/a"
        lines.append(f"| {LABELS.get(arm, arm)} | " + " | ".join(cells) + f" | {qa} |")
    text = "\n".join(lines) + f"\n\nMean ± sd over seeds, in %. Trained on {summary['trained_on']}.\n"
    if "probe" in summary:
        p = summary["probe"]
        text += f"\nLayer-wise linear probe of the base (accuracy entering each layer; K = {p['inject_layer']}):\n\n"
        n = p["layers"] + 1
        text += "| label | " + " | ".join(f"L{k}" if k < n - 1 else "out" for k in range(n)) + " | chance |\n"
        text += "|---|" + "---|" * (n + 1) + "\n"
        for name, r in p["probe"].items():
            text += f"| {name} | " + " | ".join(f"{100 * a:.0f}" for a in r["acc"]) + f" | {100 * r['chance']:.0f} |\n"
    return text


def ship(out: Path, seed: int, extra: list[str], per_class: int = 2, run: Path | None = None) -> None:
    """The demo's assets: Deep-VRM's detector (seed ``seed``), the recorded comparison, and ``per_class`` val
    images of each generator family and class (``images/<generator>_<ai|nature>_<i>.png``)."""
    from core.config import compose
    from core.resources import asset
    from perception.forensics.genimage import list_generators, scan

    src = (run or out / f"deepvrm_s{seed}") / "detector"
    dst = asset("checkpoints", "deepvrm")
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    samples = asset("samples", "deepvrm")
    samples.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "summary.json", samples / "comparison.json")
    shutil.copy(out / "summary.md", samples / "comparison.md")
    root = compose(["experiment=deepvrm", *extra]).data.root
    images = samples / "images"
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(parents=True)
    for gen in list_generators(root):
        items = scan(root, "val", [gen])
        for label, name in ((0, "nature"), (1, "ai")):
            for i, it in enumerate([x for x in items if x.label == label][:per_class]):
                shutil.copy(it.path, images / f"{gen}_{name}_{i}.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perception.forensics.experiments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("outputs/deepvrm_exp"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for every run (k=v)")
    p.add_argument("--summary-only", action="store_true")
    p.add_argument("--no-probe", action="store_true")
    p.add_argument("--ship", action="store_true", help="copy deepvrm seed 0's detector to assets/checkpoints/deepvrm "
                                                       "and the table to assets/samples/deepvrm")
    p.add_argument("--ship-run", type=Path, default=None,
                   help="with --ship: the run folder whose detector is shipped (default <out>/deepvrm_s<seed>)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.summary_only:
        jobs = [(arm, s) for s in a.seeds for arm in a.arms]
        with ThreadPoolExecutor(max(1, a.jobs)) as pool:
            for f in [pool.submit(run_arm, a.out, arm, s, a.extra) for arm, s in jobs]:
                f.result()
        if not a.no_probe:
            probe(a.out, a.extra)
    summary = summarise(a.out, "python -m perception.forensics.experiments " + " ".join(
        [f"--out {a.out}", "--seeds", *map(str, a.seeds), "--arms", *a.arms]
        + (["--extra", *a.extra] if a.extra else [])))
    print(table(summary))
    if a.ship:
        ship(a.out, a.seeds[0], a.extra, run=a.ship_run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
