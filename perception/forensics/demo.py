"""Demo section of Deep-VRM: the shipped detector on shipped real and generated images (verdict, P(fake), the
model's reason), and the recorded comparison with LoRA-only, full fine-tuning and the non-VLM baselines, clean and
under JPEG / resize / blur degradation."""

from __future__ import annotations

import html

from core.demo import DemoContext, DemoSection, table
from core.resources import asset

SAMPLES = asset("samples", "deepvrm")
DETECTOR = asset("checkpoints", "deepvrm")
SCALE = 2


def demo_section(ctx: DemoContext) -> DemoSection:
    import numpy as np

    from core.data.imread import read_square
    from core.pretrained import read_card
    from perception.forensics.task import detector_prob, explain, load_detector, parse_answer

    detector, _ = load_detector(DETECTOR)
    size = detector.spec.image_size
    card = read_card(DETECTOR)
    files = sorted((SAMPLES / "images").glob("*.png"))
    images = np.stack([read_square(f, size) for f in files])
    prob = detector_prob(detector, images)
    answers = explain(detector, images)
    rows = []
    for f, img, p, a in zip(files, images, prob, answers, strict=True):
        generator, truth = f.stem.split("_")[:2]  # <generator>_<ai|nature>_<i>.png
        verdict, reason = parse_answer(a)
        rows.append({"image": ctx.save_image(f"deepvrm_{f.name}", img, SCALE), "generator": generator,
                     "truth": "fake" if truth == "ai" else "real", "verdict": "fake" if p >= 0.5 else "real",
                     "P(fake)": f"{p:.3f}", "generated answer": a, "reason": reason,
                     "_ok": (p >= 0.5) == (truth == "ai"), "_verdict_text": verdict})
    body = "<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in (
        "image", "generator (folder)", "truth", "verdict", "P(fake)", "answer to the explain prompt")) + \
        "</tr></thead><tbody>"
    for r in rows:
        mark = "" if r["_ok"] else " ✗"
        body += (f"<tr><td><img src='{html.escape(r['image'])}' width='{size * SCALE}' "
                 f"style='image-rendering:pixelated'></td><td>{html.escape(r['generator'])}</td>"
                 f"<td>{r['truth']}</td><td>{r['verdict']}{mark}</td><td>{r['P(fake)']}</td>"
                 f"<td>{html.escape(r['generated answer'])}</td></tr>")
    body += "</tbody></table>"
    body += _recorded()
    acc = float(np.mean([r["_ok"] for r in rows])) if rows else float("nan")
    return DemoSection(
        title="Deep-VRM: AI-generated-image forensics with a deep visual residual path (perception/forensics)",
        lead=f"A tiny Qwen2.5-VL-class model pretrained here on image QA, then trained as a forensic detector "
             f"({html.escape(str(card.get('command', '')))}): frozen ViT and LLM layers 0..K-1, an artifact "
             f"encoder on the high-pass image whose tokens join layer K = {detector.config.inject_layer} at the "
             f"image positions, LoRA on the later layers. Below: shipped validation images of every generator "
             f"family (the held-out one included), real and fake; {100 * acc:.0f} % right here.",
        body=body, figures={"sample_accuracy": acc, "samples": len(rows)})


def _recorded() -> str:
    from core.io import read_json

    summary = SAMPLES / "comparison.json"
    if not summary.is_file():
        return "<p><em>No recorded comparison shipped (assets/samples/deepvrm/comparison.json).</em></p>"
    data = read_json(summary)
    gens, hold = data["generators"], data["holdout"]
    pm = lambda s: f"{100 * s['mean']:.1f} ± {100 * s['sd']:.1f}"  # noqa: E731
    from perception.forensics.experiments import LABELS

    rows = []
    for arm, r in data["rows"].items():
        row = {"arm": LABELS.get(arm, arm), "seeds": r["seeds"]}
        for g in [*gens, "mean"]:
            row[f"{g}{' (held out)' if g == hold else ''} acc / AP"] = f"{pm(r[f'{g}.acc'])} / {pm(r[f'{g}.ap'])}"
        row["QA after (base)"] = f"{pm(r['qa'])} ({100 * r['qa_base']:.1f})" if "qa" in r else "n/a"
        rows.append(row)
    command = data.get("command", "embodied experiment deepvrm")
    text = (f"<h3>Recorded comparison ({html.escape(command)})</h3><p class='lead'>Accuracy / AP in % per generator family (mean ± sd over seeds), "
            f"trained on {html.escape(str(data['trained_on']))}; the last column is the general-ability QA "
            "accuracy after forensic training, the base's in brackets.</p>" + table(rows))
    rob = data.get("robustness") or {}
    if rob:  # the same runs on degraded val images (embodied eval deepvrm --degrade LEVEL)
        for key, what in (("mean", "mean over the families"), ("holdout", f"the held-out family ({hold})")):
            order = [a for a in LABELS if a in rob["rows"]] + [a for a in rob["rows"] if a not in LABELS]
            rows = [{"arm": LABELS.get(arm, arm),
                     **{lv: f"{pm(by[lv][f'{key}.acc'])} / {pm(by[lv][f'{key}.ap'])}" if lv in by else "-"
                        for lv in rob["levels"]}} for arm, by in ((a, rob["rows"][a]) for a in order)]
            run = data.get("robustness_command", command)
            text += (f"<h4>Under degradation: accuracy / AP of {what}, in % (mean ± sd over seeds)</h4><p class='lead'>"
                     f"Every detector of {html.escape(run)}, trained on clean images, scored on the same val images "
                     "re-encoded as JPEG (quality), rescaled (factor) or blurred (sigma in px) first: AIGIBench's "
                     "protocol.</p>" + table(rows))
    return text
