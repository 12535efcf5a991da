"""How should a detector trained on 64 px crops look at a larger image? The measurement behind ``views``.

    python -m perception.forensics.view_study --out DIR [--regions 3] [--generators DIR] [--checkpoint DIR]

Real: the held-out photos of ``card.HELDOUT_PHOTOS`` whole, and ``--regions`` square regions of each (side uniform
in [128, short side], a multiple of 16, at native resolution). Fake: each region regenerated AT ITS OWN RESOLUTION
by the four generator families of the benchmark (``generators.GENERATORS``, all fully convolutional: the trained
ones fitted as the builder fits them, seed 0, or loaded from ``--generators`` where ``Generator.save`` left them).
Each image is scored three ways: ``K1`` (the centred square resized: the former ``infer``), ``K8`` (``views``, as
``infer`` now does) and ``native9`` (nine 1:1 64 px crops on a grid, pooled the same way). Writes
``DIR/view_study.json`` (every score) and prints the table of RESULTS.md ("Scoring photos larger than 64 px").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

FAMILIES = ("vae", "flow", "gan", "upsample")


def native_grid(image: np.ndarray, size: int = 64, k: int = 9) -> np.ndarray:
    """``k`` 1:1 ``size`` crops on a regular grid over the image (its corners included)."""
    h, w = image.shape[:2]
    g = int(np.ceil(np.sqrt(k)))
    ys = np.linspace(0, h - size, g).round().astype(int)
    xs = np.linspace(0, w - size, g).round().astype(int)
    return np.stack([image[y:y + size, x:x + size] for y in ys for x in xs][:k])


def generators(folder: str | Path | None, size: int = 64) -> dict[str, Any]:
    """The four families at ``size`` (weights do not depend on it): loaded from ``folder`` or fitted like the
    builder (``FIT_POOL`` train crops, seed 0, default steps)."""
    from core.checkpoint import load_weights
    from perception.forensics.generators import FIT_POOL, GENERATORS, image_pool

    out, states = {}, {}
    for name in FAMILIES:
        path = Path(folder) / f"{name}.safetensors" if folder else None
        if name != "upsample" and path is not None and path.is_file():
            states[name] = load_weights(path)
    missing = [n for n in FAMILIES if n != "upsample" and n not in states]
    if missing:
        pool = image_pool("train", FIT_POOL, size, 0)
        for name in missing:
            g = GENERATORS[name](size=size)
            g.fit(pool, seed=0)
            states[name] = g.state_dict()
            if folder:
                Path(folder).mkdir(parents=True, exist_ok=True)
                g.save(Path(folder) / name)
    for name in FAMILIES:
        out[name] = states.get(name)
    return out


def at_size(name: str, state, side: int):
    from perception.forensics.generators import GENERATORS

    g = GENERATORS[name](size=side)
    if state is not None:
        g.load_state_dict(state)
    return g


def run_study(out: str | Path, regions: int = 3, generator_dir: str | Path | None = None,
              checkpoint: str | Path | None = None, seed: int = 45) -> dict[str, Any]:
    from core.data.imread import read_image
    from core.io import write_json
    from core.resources import asset
    from perception.forensics.card import heldout_photo_paths
    from perception.forensics.task import detector_prob, load_detector
    from perception.forensics.views import aggregate, views

    detector, _ = load_detector(Path(checkpoint) if checkpoint else asset("checkpoints", "deepvrm"))
    gens = generators(generator_dir)
    methods = {"K1": lambda im: views(im, 64, 1)[0], "K8": lambda im: views(im, 64, 8)[0],
               "native9": lambda im: native_grid(im, 64, 9)}
    rng = np.random.default_rng(seed)
    rows = []

    def score(image, **row):
        for m, f in methods.items():
            row[m] = float(aggregate(detector_prob(detector, np.ascontiguousarray(f(image))))["probability"])
        rows.append(row)

    for name, path in heldout_photo_paths().items():
        im = read_image(path)
        h, w = im.shape[:2]
        score(im, photo=name, kind="whole", side=min(h, w), label="real")
        for r in range(regions):
            side = int(rng.integers(128, min(h, w) + 1)) // 16 * 16
            y, x = int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1))
            region = np.ascontiguousarray(im[y:y + side, x:x + side])
            score(region, photo=name, kind="region", side=side, label="real")
            for fam in FAMILIES:
                fake = at_size(fam, gens[fam], side).generate(region[None], seed=1000 + r)[0]
                score(fake, photo=name, kind="region", side=side, label=fam)
    result = {"rows": rows, "summary": summarise(rows, list(methods))}
    write_json(Path(out) / "view_study.json", result)
    return result


def summarise(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, Any]:
    from perception.forensics.metrics import roc_auc

    out: dict[str, Any] = {}
    for m in methods:
        whole = np.array([r[m] for r in rows if r["kind"] == "whole"])
        real = np.array([r[m] for r in rows if r["kind"] == "region" and r["label"] == "real"])
        s = {"whole_photos_called_fake": float(np.mean(whole >= 0.5)), "n_whole": len(whole),
             "regions_called_fake": float(np.mean(real >= 0.5)), "n_regions": len(real)}
        fakes = []
        for fam in FAMILIES:
            f = np.array([r[m] for r in rows if r["label"] == fam])
            fakes.append(f)
            s[f"{fam}_detected"] = float(np.mean(f >= 0.5))
        allf = np.concatenate(fakes)
        s["auc_regions_vs_fakes"] = roc_auc(np.r_[real, allf], np.r_[np.zeros(len(real)), np.ones(len(allf))])
        out[m] = s
    return out


def table(summary: dict[str, Any]) -> str:
    head = ("| scoring | real photos called fake (whole) | real regions called fake | "
            + " | ".join(f"{f} fakes detected" for f in FAMILIES) + " | AUC regions vs fakes |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m, s in summary.items():
        lines.append(f"| {m} | {100 * s['whole_photos_called_fake']:.1f} % of {s['n_whole']} | "
                     f"{100 * s['regions_called_fake']:.1f} % of {s['n_regions']} | "
                     + " | ".join(f"{100 * s[f'{f}_detected']:.1f} %" for f in FAMILIES)
                     + f" | {s['auc_regions_vs_fakes']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perception.forensics.view_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for view_study.json")
    p.add_argument("--regions", type=int, default=3, help="regions per photo")
    p.add_argument("--generators", default=None, help="folder of saved generators (fitted and saved there if missing)")
    p.add_argument("--checkpoint", default=None, help="detector folder (default: the shipped one)")
    a = p.parse_args(argv)
    from core.bootstrap import prepare_process

    prepare_process()
    result = run_study(a.out, a.regions, a.generators, a.checkpoint)
    print(table(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
