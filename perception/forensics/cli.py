"""``embodied infer forensics IMAGE|DIR...``: real or fake, one JSON line per image on stdout.

``{"path": ..., "verdict": "real" | "fake", "probability": P(fake), "reason": "..."}`` — the probability is the
verdict prompt's (``sigmoid(log P("fake") - log P("real"))``), the reason the model's answer to the explain prompt.
Folders are walked for images (``core.data.inputs.expand_inputs``). A file that cannot be read (or does not exist)
gets ``{"path": ..., "error": "..."}`` and the others still run; the exit code is then 1. ``--checkpoint``: a
detector folder of ``embodied train deepvrm`` (``<out_dir>/detector``, any arm); default the shipped
``assets/checkpoints/deepvrm``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from core.errors import DataError, EmbodiedError


def infer(args) -> int:
    import numpy as np

    from core.data.imread import read_square
    from core.data.inputs import expand_inputs
    from core.resources import asset
    from perception.forensics.modeling_deepvrm import DeepVRM
    from perception.forensics.task import detector_prob, explain, load_detector, parse_answer

    if args.batch < 1:
        raise DataError("--batch", "must be >= 1")
    folder = Path(args.checkpoint) if getattr(args, "checkpoint", None) else asset("checkpoints", "deepvrm")
    detector, kind = load_detector(folder)
    size = detector.spec.image_size if isinstance(detector, DeepVRM) else int(detector.config().get("size", 64))
    paths = expand_inputs(args.inputs, keep_missing=True)  # a missing file gets its own error line
    failed = 0
    for i in range(0, len(paths), args.batch):
        lines: list[dict | None] = []  # in input order
        chunk, images = [], []
        for p in paths[i:i + args.batch]:
            try:
                if not p.is_file():
                    raise DataError(p, "no such file")
                images.append(read_square(p, size))
                chunk.append((len(lines), p))
                lines.append(None)
            except (EmbodiedError, OSError, ValueError) as e:
                failed += 1
                lines.append({"path": str(p), "error": str(e).splitlines()[0]})
        if chunk:
            batch = np.stack(images)
            prob = detector_prob(detector, batch)
            reasons = [""] * len(chunk)
            if isinstance(detector, DeepVRM) and not args.no_reason:
                reasons = [parse_answer(a)[1] for a in explain(detector, batch)]
            for (j, p), pr, reason in zip(chunk, prob, reasons, strict=True):
                lines[j] = {"path": str(p), "verdict": "fake" if pr >= 0.5 else "real",
                            "probability": round(float(pr), 4), "reason": reason, "detector": kind}
        for line in lines:
            print(json.dumps(line), flush=True)
    if failed:
        print(f"{failed} of {len(paths)} images could not be read", file=sys.stderr)
    return 1 if failed else 0
