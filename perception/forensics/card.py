"""The shipped detector's measured metrics, written into its model card (``metrics``), and the real-photo check.

    python -m perception.forensics.card [--checkpoint DIR] [--root GENIMAGE] [--views K]

Measures, with ``infer forensics``' own scoring (``perception.forensics.cli.score_views``):

* the val split of the GenImage-style benchmark (``data.root``; built by ``perception.forensics.generators`` with
  the builder's defaults when missing): accuracy, AP and ROC AUC over all four families pooled, the mean accuracy /
  AP over families (``embodied eval deepvrm``'s ``per_generator`` ``mean`` row) and the held-out family's;
* real photos the detector never trained on (``HELDOUT_PHOTOS``): the share it calls fake (its false-alarm rate,
  verdict "fake" at P >= 0.5, as ``infer`` prints it) and the share the domain check flags.

``core.pretrained.write_card_metrics`` puts the result into the shipped card's front matter; ``experiments.ship``
re-exports a detector with its card, so the metrics travel with it. A detector folder given with ``--checkpoint`` is
the user's: it is measured and printed, never written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import DataError, EmbodiedError
from core.pretrained import write_card_metrics

#: Real photos no forensic detector here trained on: opencv-doc's sample photos (the benchmark's pool,
#: ``generators.POOL``, takes none of them) and the pool's two held-out photos (its val split). Natural camera
#: images only: no renders, drawings, text, charts or synthetically blurred images. Some opencv-doc photos are in
#: the base VLM's image-QA pretraining (``qa.OPENCV_PHOTOS``, asked for their ImageNet class), never in forensic
#: training.
OPENCV_HELDOUT = ("aero1.jpg", "aero3.jpg", "aloeL.jpg", "apple.jpg", "baboon.jpg", "basketball1.png", "blox.jpg",
                  "board.jpg", "box_in_scene.png", "building.jpg", "butterfly.jpg", "chicky_512.png",
                  "ela_original.jpg", "fruits.jpg", "graf1.png", "HappyFish.jpg", "home.jpg", "left01.jpg",
                  "leuvenA.jpg", "messi5.jpg", "orange.jpg", "pca_test1.jpg", "rubberwhale1.png", "smarties.png",
                  "squirrel_cls.jpg", "stuff.jpg")
POOL_HELDOUT = ("coffee", "grace_hopper")  # generators.PHOTOS_VAL: the pool's held-out photos
HELDOUT_PHOTOS = OPENCV_HELDOUT + POOL_HELDOUT


def heldout_photo_paths() -> dict[str, Path]:
    """The installed ``HELDOUT_PHOTOS`` by name -> file (a missing package's photos are left out).

    Raises:
        DataError: None of them is installed.
    """
    import importlib.util

    from core.data import samples

    out: dict[str, Path] = {}
    for name in OPENCV_HELDOUT:
        try:
            out[name] = samples.opencv_sample(name)
        except DataError:
            continue
    try:
        out["grace_hopper"] = samples.grace_hopper_path()
    except DataError:
        pass
    spec = importlib.util.find_spec("skimage")
    if spec is not None and spec.submodule_search_locations:
        for name in POOL_HELDOUT:
            path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"{name}.png"
            if path.is_file():
                out[name] = path
    out = {k: p for k, p in out.items() if p.is_file()}
    if not out:
        raise DataError("core.data.samples", "none of the held-out real photos is installed (opencv-doc, scikit-image, "
                                             "matplotlib)")
    return out


def real_photo_check(detector, model_dir: str | Path, views: int) -> dict[str, dict[str, Any]]:
    """Each held-out photo as ``infer forensics`` judges it: ``{name: {"probability", "views", "out_of_domain"}}``."""
    import io

    from core.data.imread import read_image
    from perception.forensics.cli import domain_flags, score_views

    paths = heldout_photo_paths()
    scored = score_views(detector, [read_image(p) for p in paths.values()], views)
    flags = domain_flags(model_dir, [v for _, v, _ in scored], list(paths), stream=io.StringIO())
    return {n: {"probability": float(agg["probability"]), "views": int(agg["n"]), "out_of_domain": f}
            for n, (agg, _, _), f in zip(paths, scored, flags, strict=True)}


def measure(checkpoint: str | Path | None = None, root: str | Path = "outputs/datasets/genimage",
            views: int | None = None, holdout: str = "gan") -> dict[str, Any]:
    """The card's ``metrics`` (see the module docstring); fractions in [0, 1], rounded to 4 places."""
    from core.resources import asset
    from perception.forensics.cli import DEFAULT_VIEWS, detector_size, score_views
    from perception.forensics.genimage import list_generators
    from perception.forensics.metrics import MEAN, accuracy, average_precision, per_generator, roc_auc
    from perception.forensics.task import ensure_data, load_detector, load_split

    views = DEFAULT_VIEWS if views is None else views
    checkpoint = Path(checkpoint) if checkpoint else asset("checkpoints", "deepvrm")
    detector, _ = load_detector(checkpoint)
    size = detector_size(detector)
    from perception.forensics.configuration_deepvrm import DeepVRMDataConfig

    ensure_data(DeepVRMDataConfig(root=str(root), size=size))
    gens = list_generators(root)
    images, labels, g = load_split(root, "val", gens, size)
    prob = np.array([agg["probability"] for agg, _, _ in score_views(detector, list(images), views)])
    rows = per_generator(prob, labels, g)
    photos = real_photo_check(detector, (getattr(detector, "loaded_from", None) or {}).get("path", checkpoint),
                              views)
    p_real = np.array([r["probability"] for r in photos.values()])
    flagged = [r["out_of_domain"] for r in photos.values()]
    r4 = lambda v: round(float(v), 4)  # noqa: E731
    out: dict[str, Any] = {
        "val_acc": r4(accuracy(prob, labels)), "val_ap": r4(average_precision(prob, labels)),
        "val_auc": r4(roc_auc(prob, labels)),
        "val_mean_acc": r4(rows[MEAN]["acc"]), "val_mean_ap": r4(rows[MEAN]["ap"]),
    }
    if holdout in rows:
        out[f"heldout_{holdout}_acc"] = r4(rows[holdout]["acc"])
        out[f"heldout_{holdout}_ap"] = r4(rows[holdout]["ap"])
        hs = g == holdout
        out[f"heldout_{holdout}_auc"] = r4(roc_auc(prob[hs], labels[hs]))
    out["real_photo_false_alarm_rate"] = r4(np.mean(p_real >= 0.5))
    if all(f is not None for f in flagged):
        out["real_photo_out_of_domain_rate"] = r4(np.mean(flagged))
    out["split"] = (f"val split of {Path(root).name} ({len(labels)} images of {', '.join(gens)} at {size} px, half fake; "
                    f"{holdout} never trained on); real photos: {len(photos)} held-out photos "
                    f"(perception.forensics.card.HELDOUT_PHOTOS), each judged by {views} views as infer forensics does")
    out["real_photos_called_fake"] = sorted(n for n, r in photos.items() if r["probability"] >= 0.5)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m perception.forensics.card``: measure the shipped detector and write its card (or measure a given
    detector and print its metrics: a user's folder is never written)."""
    p = argparse.ArgumentParser(prog="python -m perception.forensics.card", description=main.__doc__)
    p.add_argument("--checkpoint", default=None, help="detector folder to measure and print, not written (default: "
                                                      "the shipped one, whose card gets the metrics)")
    p.add_argument("--root", default="outputs/datasets/genimage", help="GenImage-style set (built when missing)")
    p.add_argument("--views", type=int, default=None, help="views per image (default: infer's)")
    p.add_argument("--dry-run", action="store_true", help="print the metrics, write nothing")
    a = p.parse_args(argv)
    from core.bootstrap import prepare_process
    from core.resources import asset

    prepare_process()
    checkpoint = Path(a.checkpoint) if a.checkpoint else asset("checkpoints", "deepvrm")
    try:
        metrics = measure(checkpoint, a.root, a.views)
        if not a.dry_run and a.checkpoint is None:  # only the shipped card; a given folder is read-only
            write_card_metrics(checkpoint, metrics)
    except EmbodiedError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    for k, v in metrics.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
