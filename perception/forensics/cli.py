"""``embodied infer forensics IMAGE|DIR...``: real or fake, one JSON line per image on stdout.

``{"path": ..., "verdict": "real" | "fake", "probability": P(fake), "views": {"n", "min", "max", "sd"}, "reason":
"...", "detector": ..., "out_of_domain": true | false | null}``. The detectors are trained on 64 px crops
(``image_size``) of larger real images, each downsampled from a box of a random side (see
``perception.forensics.views``), so an image is judged the same way: ``--views K`` square views drawn over that
range of sides (the first is the whole centred square), each area-resized to the detector's input size; the
probability is the sigmoid of the views' mean log-odds (each view's is the verdict prompt's ``sigmoid(log
P("fake") - log P("real"))``), ``views`` their number and spread; an image no larger than the input size is one
view. The reason is the model's answer to the explain prompt on the view whose log-odds are nearest the mean;
``out_of_domain`` is the training-domain check of ``core.domain`` on the views the model saw (their median
distance; null, with one note on stderr, when the checkpoint has no domain statistics; the shipped detector's are
written by ``calibrate_domain`` below).
Folders are walked recursively for every image format the reader takes (``core.data.inputs.IMAGE_EXTS``,
.gif included), in the order of ``core.data.inputs.plan_outputs``. A file that cannot be read (or does not
exist, or is a video) gets ``{"path": ..., "error": "..."}`` on stdout and an error line on stderr, and the
others still run; the exit code is then 1. ``--checkpoint``: a detector folder of ``embodied train deepvrm``
(``<out_dir>/detector``, any arm); default the shipped ``assets/checkpoints/deepvrm``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from core.errors import ConfigError, DataError, EmbodiedError
from perception.forensics.views import DEFAULT_VIEWS  # views per image (``--views``)


def detector_size(detector) -> int:
    """The side of the images a detector reads (a VLM detector's ``image_size``, a baseline's ``size``)."""
    from perception.forensics.modeling_deepvrm import DeepVRM

    return detector.spec.image_size if isinstance(detector, DeepVRM) else int(detector.config().get("size", 64))


def score_views(detector, images, k: int, batch: int = 64) -> list[tuple[dict, np.ndarray, np.ndarray]]:
    """Judge (H, W, 3) uint8 images of any size by ``k`` views each (``perception.forensics.views``).

    Returns:
        Per image ``(aggregate, views (n, S, S, 3) uint8, the views' P(fake) (n,))``; ``aggregate`` is
        ``views.aggregate``'s ``{"probability", "min", "max", "sd"}`` plus ``"n"``.
    """
    from perception.forensics.task import detector_prob
    from perception.forensics.views import aggregate, views

    size = detector_size(detector)
    per = [views(im, size, k)[0] for im in images]
    if not per:
        return []
    prob = detector_prob(detector, np.concatenate(per), batch)
    out, i = [], 0
    for v in per:
        pr = prob[i:i + len(v)]
        i += len(v)
        out.append(({**aggregate(pr), "n": len(v)}, v, pr))
    return out


def domain_flags(model_dir: str | Path, seen: list[np.ndarray], names: list[str], stream=None) -> list[bool | None]:
    """The domain check (``core.domain.warn_if_out_of_domain``) of inputs seen as ``seen[i]`` (their views): one
    flag per input, from the median distance of its views; one warning line per flagged input."""
    from core.domain import warn_if_out_of_domain

    flat_names = [name for name, v in zip(names, seen, strict=True) for _ in range(len(v))]
    flags = warn_if_out_of_domain(model_dir, [im for v in seen for im in v], flat_names, stream=stream)
    out, at = [], 0
    for v in seen:
        out.append(flags[at])
        at += len(v)
    return out


def infer(args) -> int:
    """Print one JSON line per input (see the module docstring); returns 1 when some input was skipped."""
    from core.data.imread import read_image
    from core.data.inputs import plan_outputs
    from core.data.video import VIDEO_EXTS
    from core.logging import progress
    from core.outputs import Batch
    from core.resources import asset
    from perception.forensics.modeling_deepvrm import DeepVRM
    from perception.forensics.task import explain, load_detector, parse_answer

    if args.batch < 1:
        raise DataError("--batch", "must be >= 1")
    k = getattr(args, "views", DEFAULT_VIEWS)
    if k < 1:
        raise DataError("--views", f"must be >= 1, got {k}")
    folder = Path(args.checkpoint) if getattr(args, "checkpoint", None) else asset("checkpoints", "deepvrm")
    detector, kind = load_detector(folder)
    model_dir = (getattr(detector, "loaded_from", None) or {}).get("path", folder)  # its card: training domain
    paths = [p for p, _ in plan_outputs(args.inputs, keep_missing=True)]  # a missing file: its own error line
    batch = Batch(len(paths), "images")
    bar = progress(total=len(paths), desc="forensics", unit="image", enabled=len(paths) > args.batch)
    for i in range(0, len(paths), args.batch):
        lines: list[dict | None] = []  # in input order
        chunk, images = [], []
        for p in paths[i:i + args.batch]:
            try:
                if not p.is_file():
                    raise DataError(p, "no such file")
                if p.suffix.lower() in VIDEO_EXTS:
                    raise DataError(p, "is a video; forensics judges still images (extract frames first)")
                images.append(read_image(p))
                chunk.append((len(lines), p))
                lines.append(None)
            except (EmbodiedError, OSError, ValueError) as e:
                batch.skip(p, e, bar)
                lines.append({"path": str(p), "error": str(e).splitlines()[0]})
        if chunk:
            scored = score_views(detector, images, k)
            outside = domain_flags(model_dir, [v for _, v, _ in scored], [str(p) for _, p in chunk])
            reasons = [""] * len(chunk)
            if isinstance(detector, DeepVRM) and not args.no_reason:
                from perception.forensics.views import representative

                shown = np.stack([v[representative(pr)] for _, v, pr in scored])
                reasons = [parse_answer(a)[1] for a in explain(detector, shown)]
            for (j, p), (agg, _, _), reason, far in zip(chunk, scored, reasons, outside, strict=True):
                pr = agg["probability"]
                lines[j] = {"path": str(p), "verdict": "fake" if pr >= 0.5 else "real",
                            "probability": round(float(pr), 4),
                            "views": {"n": agg["n"], **{s: round(agg[s], 4) for s in ("min", "max", "sd")}},
                            "reason": reason, "detector": kind, "out_of_domain": far}
        for line in lines:
            bar.write(json.dumps(line), file=sys.stdout)
        sys.stdout.flush()
        bar.update(len(lines))
    bar.close()
    return batch.exit_code()


#: The shipped detector's training domain, as its model card states it (``training_domain``).
TRAINING_DOMAIN = ("64 px crops of real photos, video frames and panoramas (core.data.real_images) and fakes made "
                   "from such crops by small generators trained here; an input is judged by square views drawn like "
                   "those crops (perception.forensics.views: sides from the whole centred square down to a quarter "
                   "of it, area-resized to 64 px)")
#: The check's rule as the card states it (``core.domain``'s distance, taken over the views the detector sees).
DOMAIN_RULE = ("out of domain when the median, over the views the detector sees (perception.forensics.views), of the "
               "cosine distance from each view's FD-EffNet feature to the nearest training feature exceeds the "
               "threshold (the {q:.0%} quantile over held-out in-domain images seen the same way)")


def pool_regions(split: str, n: int, size: int, seed: int) -> list[np.ndarray]:
    """``n`` square regions of ``split``'s real sources at their own resolution: what a user's image of that
    material looks like before it is viewed. Deterministic in ``seed``.

    A region picks a source kind uniformly (photo / video / panorama), a source of it uniformly, a side uniformly
    in ``[size, short side]`` (a multiple of 4, so that an ``upsample`` fake can be made at that side) and a
    uniform position (``pool_crops``' sampler, without its ``MIN_CROP_SCALE`` bound and without the resize).
    """
    from perception.forensics.generators import POOL

    by_kind: dict[str, list[np.ndarray]] = {}
    for src, img in POOL.sources(split):
        if min(img.shape[:2]) >= size:
            by_kind.setdefault(src.kind, []).append(img)
    if not by_kind:
        raise DataError("core.data.samples", f"no {split} source is at least {size} px on its short side")
    kinds = sorted(by_kind)
    rng = np.random.default_rng([seed, 45])
    out = []
    for _ in range(n):
        kind = kinds[int(rng.integers(len(kinds)))]
        img = by_kind[kind][int(rng.integers(len(by_kind[kind])))]
        h, w = img.shape[:2]
        side = max(size, int(rng.integers(size, min(h, w) + 1)) // 4 * 4)
        y, x = int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1))
        out.append(np.ascontiguousarray(img[y:y + side, x:x + side]))
    return out


def view_distances(images, reference, size: int, k: int) -> np.ndarray:
    """Per image, the median over its ``k`` views of the nearest-training-feature distance (``core.domain``)."""
    from core import domain
    from perception.forensics.views import views

    seen = [views(im, size, k)[0] for im in images]
    flat = [v for vs in seen for v in vs]
    dist = domain.nearest_distance(domain.features(flat), reference).numpy() if flat else np.zeros(0)
    out, at = [], 0
    for vs in seen:
        out.append(float(np.median(dist[at:at + len(vs)])))
        at += len(vs)
    return np.asarray(out)


def calibrate_domain(checkpoint: str | Path | None = None, n_train: int = 192, n_cal: int = 128,
                     n_heldout: int = 128, fake_fraction: float = 0.25, views: int = DEFAULT_VIEWS,
                     quantile: float = 0.99) -> dict:
    """Fit and store the domain check (``core.domain``) of a detector trained on the GenImage-style benchmark.

    The reference sample is what the detector trained on: the first ``n_train`` crops of the train split's builder
    stream (``perception.forensics.generators.pool_crops``, seed 0, stream 1, at the detector's ``image_size``: crops
    that are in the training folders), the last ``fake_fraction`` of them replaced by their ``upsample`` fakes (the
    one family that needs no training; the trained families' fakes are reconstructions of such crops and are not in
    the sample). Calibration and held-out images are seen the way ``infer`` sees a user's image: regions of the
    held-out split's sources at their own resolution (``pool_regions``, seeds 1000 and 2000, which no detector
    trained on), the last ``fake_fraction`` replaced by ``upsample`` fakes made at the region's side, each judged by
    the median distance of its ``views`` views (``view_distances``). The threshold is the ``quantile`` of the
    calibration distances, the false-alarm rate is measured on the held-out ones. Writes ``domain.safetensors``,
    ``domain_check`` and ``training_domain`` into the card; the weights are not touched. A few minutes on a CPU::

        python -c "from perception.forensics.cli import calibrate_domain; calibrate_domain()"
    """
    import torch

    from core import domain
    from core.io import write_text
    from core.pretrained import CARD_FILE, card_body, front_matter, read_card
    from core.resources import asset
    from perception.forensics.generators import UpsampleGenerator, pool_crops
    from perception.forensics.task import load_detector

    checkpoint = Path(checkpoint) if checkpoint else asset("checkpoints", "deepvrm")
    if not 0.0 <= fake_fraction < 1.0:
        raise ConfigError(f"fake_fraction must be in [0, 1), got {fake_fraction}")
    if min(n_train, n_cal, n_heldout, views) < 1:
        raise ConfigError("n_train, n_cal, n_heldout and views must be >= 1")
    detector, _ = load_detector(checkpoint)
    size = detector_size(detector)
    del detector

    train = pool_crops("train", n_train, size, 0, stream=1)[0]
    k = round(fake_fraction * n_train)
    if k:
        train[n_train - k:] = UpsampleGenerator(size=size).generate(train[n_train - k:], seed=0)
    reference = domain.features(list(train))

    def held(seed: int, n: int) -> list[np.ndarray]:
        images = pool_regions("val", n, size, seed)
        for i in range(n - round(fake_fraction * n), n):
            images[i] = UpsampleGenerator(size=images[i].shape[0]).generate(images[i][None], seed=seed + i)[0]
        return images

    cal = view_distances(held(1000, n_cal), reference, size, views)
    threshold = float(torch.quantile(torch.from_numpy(cal), quantile))
    heldout = view_distances(held(2000, n_heldout), reference, size, views)
    entry = {"rule": DOMAIN_RULE.format(q=quantile), "network": "efficientnet_lite0 (ImageNet, core.metrics.features)",
             "threshold": round(threshold, 5), "quantile": quantile, "views": views, "n_train": len(reference),
             "n_calibration": len(cal), "n_heldout": len(heldout),
             "false_alarm_rate_heldout": round(float(np.mean(heldout > threshold)), 4)}
    note = (f"reference: perception.forensics.generators.pool_crops at {size} px, train split seed 0 stream 1 (the "
            f"builder's crops, first {n_train}, the last {fake_fraction:.0%} replaced by their upsample fakes); "
            f"calibration / held-out: perception.forensics.cli.pool_regions of the held-out split, seeds 1000 / 2000 "
            f"(regions of side {size} px to the source's short side at native resolution, the last "
            f"{fake_fraction:.0%} replaced by upsample fakes at their side), each the median over its {views} views")
    domain.save(checkpoint, reference.half(), entry, {"calibration": note})
    meta = read_card(checkpoint)
    meta["training_domain"] = TRAINING_DOMAIN
    write_text(checkpoint / CARD_FILE, front_matter(meta) + "\n" + card_body(checkpoint))
    return {**entry, "calibration": note}
