"""The Deep-VRM comparison, rerunnable: every arm x seed through the public CLI, the layer probe, the table.

    embodied experiment deepvrm --out outputs/deepvrm_exp --seeds 0 1 \
        [--arms deepvrm lora full freq_cnn feature_probe] [--workers 2] [--extra k=v ...] [--collect-only] [--ship]
        [--degrade jpeg=95 jpeg=75 jpeg=50 resize=0.5 resize=2 blur=1 blur=2 | none]

The arms are Deep-VRM's registered arms (``perception/forensics/register.py``). Every arm trains on the same
GenImage-layout set (``data.root``; built on first use), the same steps and the same evaluation (the
``core.experiments`` grid: ``embodied train deepvrm <arm> trainer.seed=<s>`` then ``embodied eval deepvrm``); the
VLM arms start from the same base VLM (``model.base_path``, pretrained on image QA on first use, by the first run
alone). A run with an ``eval.json`` is not rerun. Then the layer-wise probe of the base (``probe.json``) and
``summary.json`` / ``summary.md``: accuracy / AP per generator (the held-out family marked), the general-ability
QA accuracy after training against the base's, mean and spread over seeds. Then the robustness table
(AIGIBench's protocol): every trained run evaluated again on the same val images degraded (``--degrade``:
JPEG quality 95 / 75 / 50, resize 0.5x / 2x, Gaussian blur sigma 1 / 2 by default; ``eval_<tag>.json`` in each
run folder, made by ``embodied eval deepvrm --degrade LEVEL``), mean accuracy / AP over the families and the
held-out family's, per arm and level.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from core import experiments as ex
from core.io import read_json, write_json
from perception.forensics.degrade import LEVELS, canonical, tag

ARMS = ("deepvrm", "lora", "full", "freq_cnn", "feature_probe")  # the registered arms, in table order
LABELS = {"deepvrm": "Deep-VRM", "lora": "LoRA only (no residual)", "full": "full fine-tuning",
          "freq_cnn": "frequency CNN", "feature_probe": "frozen-feature probe (EffNet-Lite0)"}


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
    """Every finished run under ``out`` (any arm, any seed): per-generator accuracy / AP and QA, mean ± sd."""
    found = ex.collect(out)
    runs = {arm: list(found[arm].values()) for arm in [a for a in ARMS if a in found] + sorted(set(found) - set(ARMS))}
    rows: dict[str, Any] = {}
    gens: list[str] = []
    holdout = None
    for arm, evs in runs.items():
        holdout = evs[0]["holdout"]
        gens = [g for g in evs[0]["per_generator"] if g not in ("all", "mean")]
        rows[arm] = ex.seed_stats(evs, {**{f"{g}.{m}": f"per_generator/{g}/{m}" for g in [*gens, "mean"]
                                        for m in ("acc", "ap")}, "qa": "qa_exact_match/acc"})
        if "qa" in rows[arm]:
            rows[arm]["qa_base"] = evs[0]["qa_exact_match_base"]["acc"]
    summary = {"command": command, "generators": gens, "holdout": holdout, "rows": rows,
               "trained_on": next(iter(runs.values()))[0]["trained_on"] if runs else [],
               "robustness": robustness(out, list(runs), holdout)}
    if (out / "probe.json").is_file():
        summary["probe"] = read_json(out / "probe.json")
    ex.write_summary(out, summary, table(summary))
    return summary


def robustness(out: Path, arms: list[str], holdout: str | None) -> dict[str, Any]:
    """Arm -> level -> mean ± sd over seeds of the mean and held-out accuracy / AP, for every level some run was
    evaluated at (``eval_<tag>.json``; ``clean`` is ``eval.json``), levels in ``LEVELS`` order then the rest."""
    files = {"clean": "eval.json"}
    found = sorted({f.name for f in Path(out).glob("*/eval_*.json")})
    known = {f"eval_{tag(lv)}.json": canonical(lv) for lv in LEVELS}
    for name in [n for n in known if n in found] + [n for n in found if n not in known]:
        files[known.get(name) or read_json(next(Path(out).glob(f"*/{name}")))["degrade"]] = name
    metrics = {"mean.acc": "per_generator/mean/acc", "mean.ap": "per_generator/mean/ap"}
    if holdout:
        metrics |= {"holdout.acc": f"per_generator/{holdout}/acc", "holdout.ap": f"per_generator/{holdout}/ap"}
    table: dict[str, Any] = {"levels": list(files), "rows": {}}
    for level, name in files.items():
        found_runs = ex.collect(out, result=name, arms=arms)
        for arm, by_seed in found_runs.items():
            table["rows"].setdefault(arm, {})[level] = ex.seed_stats(by_seed.values(), metrics)
    return table if len(files) > 1 else {}


def table(summary: dict[str, Any]) -> str:
    """The markdown of a summary: one row per arm (in %), then the layer probe when there is one."""
    gens, hold = summary["generators"], summary["holdout"]
    columns = [ex.Column(f"{g}{' (held out)' if g == hold else ''} acc / AP", (f"{g}.acc", f"{g}.ap"), 100, 1)
               for g in gens]
    columns += [ex.Column("mean acc / AP", ("mean.acc", "mean.ap"), 100, 1),
                ex.Column("QA exact match after (base)", ("qa", "qa_base"), 100, 1, template="{0} ({1})", missing="n/a")]
    text = ex.arm_table(summary["rows"], columns, labels=LABELS)
    text += f"\n\nMean ± sd over seeds, in %. Trained on {summary['trained_on']}.\n"
    rob = summary.get("robustness") or {}
    if rob:
        levels = rob["levels"]
        for key, what in (("mean", "mean over the families"), ("holdout", f"the held-out family ({hold})")):
            text += (f"\nUnder degradation (AIGIBench's protocol; trained on clean images): accuracy / AP of {what}, "
                     "in %, mean ± sd over seeds:\n\n")
            cell = ex.Column("", (f"{key}.acc", f"{key}.ap"), 100, 1).cell
            rows = [[LABELS.get(arm, arm)] + [cell(by.get(lv, {}), zero_sd=False) for lv in levels]
                    for arm, by in rob["rows"].items()]
            text += ex.markdown_table(["arm", *levels], rows) + "\n"
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
    images of each generator family and class (``images/<generator>_<ai|nature>_<i>.png``). The exported detector
    then gets its domain check (``cli.calibrate_domain``) and its measured card metrics (``card.measure``)."""
    from core.config import compose
    from core.pretrained import card_body, read_card, read_config
    from core.resources import asset
    from perception.forensics.genimage import list_generators, scan
    from perception.forensics.modeling_deepvrm import DeepVRM

    src = (run or out / f"deepvrm_s{seed}") / "detector"
    card = {k: v for k, v in read_card(src).items() if k not in ("method", "model_class", "parameters", "weights",
                                                                  "base")}
    run_config = {k: v for k, v in read_config(src).items() if k not in ("method", "model")}
    # a self-contained export: the base VLM copied into <asset>/base, referenced relatively
    dst = asset("checkpoints", "deepvrm")
    DeepVRM.from_pretrained(src).save_pretrained(dst, card=card, run_config=run_config, body=card_body(src),
                                                  copy_base=True)
    from core.pretrained import write_card_metrics
    from perception.forensics.card import measure
    from perception.forensics.cli import calibrate_domain

    root = compose(["experiment=deepvrm", *extra]).data.root
    calibrate_domain(dst)
    write_card_metrics(dst, measure(dst, root))
    samples = asset("samples", "deepvrm")
    samples.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "summary.json", samples / "comparison.json")
    shutil.copy(out / "summary.md", samples / "comparison.md")
    images = samples / "images"
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(parents=True)
    for gen in list_generators(root):
        items = scan(root, "val", [gen])
        for label, name in ((0, "nature"), (1, "ai")):
            for i, it in enumerate([x for x in items if x.label == label][:per_class]):
                shutil.copy(it.path, images / f"{gen}_{name}_{i}.png")


def run(a) -> int:
    """``embodied experiment deepvrm``: every arm on every seed, the probe, the table (and ``--ship``)."""
    levels = [lv for lv in dict.fromkeys(canonical(x) for x in a.degrade) if lv != "none"]  # checked first
    failures = []
    if not a.collect_only:
        grid = ex.Grid("deepvrm", a.out, ex.pick_arms(ex.method_arms("deepvrm"), a.arms), a.seeds,
                       ["trainer.tensorboard=false", *a.extra])
        failures = grid.run(a.workers, first_alone=True)  # the first builds the data and the base VLM
        if not a.no_probe and not failures:
            probe(a.out, a.extra)
        failures += grid.evaluate({f"eval_{tag(lv)}.json": [f"data.degrade='{lv}'"] for lv in levels}, a.workers)
    summary = summarise(a.out, "embodied experiment deepvrm " + " ".join(
        [f"--out {a.out}", "--seeds", *map(str, a.seeds), "--arms", *a.arms, "--degrade", *a.degrade]
        + (["--extra", *a.extra] if a.extra else [])))
    print(table(summary))
    if a.ship:
        ship(a.out, a.seeds[0], a.extra, run=a.ship_run)
    return ex.report(failures)


EXPERIMENT = ex.Experiment(
    run, out="outputs/deepvrm_exp", arms=ARMS,
    options=(("--extra", dict(nargs="*", default=[], help="more overrides for every run (k=v)")),
             ("--no-probe", dict(action="store_true")),
             ("--degrade", dict(nargs="+", default=list(LEVELS), metavar="LEVEL",
                                help="evaluate every trained run again on degraded val images at these levels "
                                     "(jpeg=Q, resize=F, blur=SIGMA; none: skip); default: "
                                     + " ".join(LEVELS))),
             ("--ship", dict(action="store_true", help="copy deepvrm seed 0's detector to assets/checkpoints/deepvrm "
                                                       "and the table to assets/samples/deepvrm")),
             ("--ship-run", dict(type=Path, default=None, help="with --ship: the run folder whose detector is "
                                                              "shipped (default <out>/deepvrm_s<seed>)"))))


if __name__ == "__main__":
    raise SystemExit(ex.moved("perception.forensics.experiments", "deepvrm"))
