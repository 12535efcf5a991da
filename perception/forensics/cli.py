"""``embodied infer forensics IMAGE|DIR...``: real or fake, one JSON line per image on stdout.

``{"path": ..., "verdict": "real" | "fake", "probability": P(fake), "reason": "...", "detector": ...,
"out_of_domain": true | false | null}`` — the probability is the verdict prompt's (``sigmoid(log P("fake") -
log P("real"))``), the reason the model's answer to the explain prompt; ``out_of_domain`` is the training-domain
check of ``core.domain`` (null, with one note on stderr, when the checkpoint has no domain statistics; the
shipped detector's are written by ``calibrate_domain`` below).
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

from core.errors import ConfigError, DataError, EmbodiedError


def infer(args) -> int:
    """Print one JSON line per input (see the module docstring); returns 1 when some input was skipped."""
    import numpy as np

    from core.data.imread import read_square
    from core.data.inputs import plan_outputs
    from core.data.video import VIDEO_EXTS
    from core.domain import warn_if_out_of_domain
    from core.logging import progress
    from core.outputs import Batch
    from core.resources import asset
    from perception.forensics.modeling_deepvrm import DeepVRM
    from perception.forensics.task import detector_prob, explain, load_detector, parse_answer

    if args.batch < 1:
        raise DataError("--batch", "must be >= 1")
    folder = Path(args.checkpoint) if getattr(args, "checkpoint", None) else asset("checkpoints", "deepvrm")
    detector, kind = load_detector(folder)
    size = detector.spec.image_size if isinstance(detector, DeepVRM) else int(detector.config().get("size", 64))
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
                images.append(read_square(p, size))
                chunk.append((len(lines), p))
                lines.append(None)
            except (EmbodiedError, OSError, ValueError) as e:
                batch.skip(p, e, bar)
                lines.append({"path": str(p), "error": str(e).splitlines()[0]})
        if chunk:
            stack = np.stack(images)
            outside = warn_if_out_of_domain(model_dir, images, [str(p) for _, p in chunk])
            prob = detector_prob(detector, stack)
            reasons = [""] * len(chunk)
            if isinstance(detector, DeepVRM) and not args.no_reason:
                reasons = [parse_answer(a)[1] for a in explain(detector, stack)]
            for (j, p), pr, reason, far in zip(chunk, prob, reasons, outside, strict=True):
                lines[j] = {"path": str(p), "verdict": "fake" if pr >= 0.5 else "real",
                            "probability": round(float(pr), 4), "reason": reason, "detector": kind,
                            "out_of_domain": far}
        for line in lines:
            bar.write(json.dumps(line), file=sys.stdout)
        sys.stdout.flush()
        bar.update(len(lines))
    bar.close()
    return batch.exit_code()


#: The shipped detector's training domain, as its model card states it (``training_domain``).
TRAINING_DOMAIN = ("64 px crops of real photos, video frames and panoramas (core.data.real_images) and fakes made "
                   "from such crops by small generators trained here; an input is centre-cropped and resized to 64 px")


def calibrate_domain(checkpoint: str | Path | None = None, n_train: int = 192, n_cal: int = 64,
                     n_heldout: int = 64, fake_fraction: float = 0.25) -> dict:
    """Fit and store the domain check (``core.domain``) of a detector trained on the GenImage-style benchmark.

    In-domain images are what the benchmark's builder makes (``perception.forensics.generators.pool_crops``, the
    same sampler, at the detector's ``image_size``): the training sample is the first ``n_train`` real crops of
    the train split's builder stream (seed 0, stream 1: crops that are in the training folders); calibration and
    held-out are crops of the held-out split (seeds 1000 and 2000, which no detector trained on). In each split
    the last ``fake_fraction`` of the crops are replaced by their ``upsample`` fakes, the one family that needs
    no training; the trained families' fakes (vae, flow, gan) are reconstructions of crops of the same pool and
    are not in the sample. Also writes ``training_domain`` into the card; the weights are not touched. About a
    minute on a CPU::

        python -c "from perception.forensics.cli import calibrate_domain; calibrate_domain()"
    """
    from core import domain
    from core.io import write_text
    from core.pretrained import CARD_FILE, card_body, front_matter, read_card
    from core.resources import asset
    from perception.forensics.generators import UpsampleGenerator, pool_crops
    from perception.forensics.modeling_deepvrm import DeepVRM
    from perception.forensics.task import load_detector

    checkpoint = Path(checkpoint) if checkpoint else asset("checkpoints", "deepvrm")
    if not 0.0 <= fake_fraction < 1.0:
        raise ConfigError(f"fake_fraction must be in [0, 1), got {fake_fraction}")
    detector, _ = load_detector(checkpoint)
    size = detector.spec.image_size if isinstance(detector, DeepVRM) else int(detector.config().get("size", 64))
    del detector
    split_of = {"train": ("train", 1), "calibration": ("val", 0), "heldout": ("val", 0)}  # (pool split, stream)

    def load_split(name: str, seed: int, n: int) -> list:
        split, stream = split_of[name]
        images = pool_crops(split, n, size, seed, stream=stream)[0]
        k = round(fake_fraction * n)
        if k:
            images[n - k:] = UpsampleGenerator(size=size).generate(images[n - k:], seed=seed)
        return list(images)

    sizes = {"train": (0, n_train), "calibration": (1000, n_cal), "heldout": (2000, n_heldout)}
    entry = domain.calibrate(
        checkpoint, load_split, sizes,
        f"perception.forensics.generators.pool_crops at {size} px: train split seed 0 stream 1 (the builder's "
        f"crops, first {n_train}); held-out split seeds 1000 / 2000; the last {fake_fraction:.0%} of each split "
        "replaced by its upsample fakes (vae / flow / gan fakes, reconstructions of such crops, not sampled)")
    meta = read_card(checkpoint)
    meta["training_domain"] = TRAINING_DOMAIN
    write_text(checkpoint / CARD_FILE, front_matter(meta) + "\n" + card_body(checkpoint))
    return entry
