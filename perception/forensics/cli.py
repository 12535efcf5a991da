"""``embodied infer forensics IMAGE|DIR...``: real or fake, one JSON line per image on stdout.

``{"path": ..., "verdict": "real" | "fake", "probability": P(fake), "reason": "...", "detector": ...,
"out_of_domain": true | false | null}`` — the probability is the verdict prompt's (``sigmoid(log P("fake") -
log P("real"))``), the reason the model's answer to the explain prompt; ``out_of_domain`` is the training-domain
check of ``core.domain`` (null, with one note on stderr, when the checkpoint has no domain statistics).
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

from core.errors import DataError, EmbodiedError


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
