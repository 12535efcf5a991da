"""Is an input like the data a model was trained on? A check that ``infer`` commands run before answering.

The rule (stated in each checkpoint's model card under ``domain_check``): an input is out of the training
domain when the cosine distance from its FD-EffNet feature (``core.metrics.features``: frozen ImageNet
EfficientNet-Lite0, pooled 1280-d) to the NEAREST feature of a sample of training images exceeds a threshold.
The threshold is the ``quantile`` (default 0.99) of the same distance over a calibration split of in-domain
images the model never saw; the false-alarm rate is then measured on another held-out in-domain split and
recorded beside it. Nothing here knows any method: every infer command whose model has a training domain calls
``warn_if_out_of_domain(checkpoint_dir, images, names)`` (normals, depth360, forensics, video's
``--first-frame``, i2v); a checkpoint without the statistics gets a one-line note that the check is unavailable.

Files in the checkpoint folder: ``domain.safetensors`` (``features`` (N, 1280) float16 of the training sample)
and the ``domain_check`` entry of ``README.md``'s front matter (rule, threshold, rates, sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.logging import get_logger

log = get_logger("embodied.domain")

DOMAIN_FILE = "domain.safetensors"
RULE = ("out of domain when the cosine distance from the input's FD-EffNet feature to the nearest training "
        "feature exceeds the threshold (the {q:.0%} quantile over held-out in-domain images)")


def features(images: Sequence[np.ndarray] | torch.Tensor) -> torch.Tensor:
    """(N, 1280) float32 L2-normalised FD-EffNet features of (H, W, 3) uint8 RGB images (any sizes)."""
    from core.metrics.features import load_feature_network

    net = load_feature_network("cpu")
    if isinstance(images, torch.Tensor):
        batch = images
    else:
        batch = [torch.from_numpy(np.array(im[..., :3])).permute(2, 0, 1) for im in images]  # writable copies
    f = net.features(batch).float().cpu()
    return torch.nn.functional.normalize(f, dim=1)


def nearest_distance(query: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """(Q,) cosine distance of each normalised query feature to its nearest normalised reference feature."""
    return 1.0 - (query @ reference.T).max(dim=1).values


def fit(train: Sequence[np.ndarray], calibration: Sequence[np.ndarray], heldout: Sequence[np.ndarray],
        quantile: float = 0.99) -> tuple[torch.Tensor, dict[str, Any]]:
    """Fit the check: returns the training features to store and the ``domain_check`` card entry."""
    ref = features(train)
    cal = nearest_distance(features(calibration), ref)
    threshold = float(torch.quantile(cal, quantile))
    held = nearest_distance(features(heldout), ref)
    entry = {"rule": RULE.format(q=quantile), "network": "efficientnet_lite0 (ImageNet, core.metrics.features)",
             "threshold": round(threshold, 5), "quantile": quantile, "n_train": len(ref), "n_calibration": len(cal),
             "n_heldout": len(held), "false_alarm_rate_heldout": round(float((held > threshold).float().mean()), 4)}
    return ref.half(), entry


def calibrate(directory: str | Path, load_split, sizes: dict[str, tuple[int, int]], note: str,
              quantile: float = 0.99) -> dict[str, Any]:
    """Fit and store a checkpoint's check from three splits of in-domain images.

    Args:
        directory: The checkpoint / exported model folder.
        load_split: ``(name, seed, n) -> list of (H, W, 3) uint8`` — the method renders or reads its own data.
        sizes: ``{"train": (seed, n), "calibration": (seed, n), "heldout": (seed, n)}``; the train split is a
            sample of the training data, the other two unseen in-domain images.
        note: How the splits were made (recorded in the model card).
        quantile: Quantile of the calibration split's distances that becomes the threshold.
    """
    splits = {name: load_split(name, seed, n) for name, (seed, n) in sizes.items()}
    ref, entry = fit(splits["train"], splits["calibration"], splits["heldout"], quantile)
    save(directory, ref, entry, {"calibration": note})
    return entry


def save(directory: str | Path, reference: torch.Tensor, entry: dict[str, Any], extra: dict[str, Any] | None = None):
    """Write ``domain.safetensors`` and put ``domain_check`` into the model card's front matter."""
    from core.checkpoint import save_weights
    from core.io import write_text
    from core.pretrained import CARD_FILE, card_body, front_matter, read_card

    directory = Path(directory)
    save_weights({"features": reference}, directory / DOMAIN_FILE)
    meta = read_card(directory)
    meta["domain_check"] = {**entry, **(extra or {})}
    write_text(directory / CARD_FILE, front_matter(meta) + "\n" + card_body(directory))


def load(directory: str | Path) -> tuple[torch.Tensor, dict[str, Any]] | None:
    """(reference features, card entry), or None when the checkpoint has no domain check."""
    from core.checkpoint import load_weights
    from core.pretrained import read_card

    directory = Path(directory)
    entry = read_card(directory).get("domain_check")
    if not (directory / DOMAIN_FILE).is_file() or not entry:
        return None
    return load_weights(directory / DOMAIN_FILE)["features"].float(), entry


def check(directory: str | Path, images: Sequence[np.ndarray]) -> list[float] | None:
    """Nearest-training distances of ``images`` (None when the checkpoint has no domain check)."""
    loaded = load(directory)
    if loaded is None:
        return None
    ref, _ = loaded
    return nearest_distance(features(images), ref).tolist()


_noted: set[str] = set()  # checkpoints whose "no check" note was printed (once per process)


def warn_if_out_of_domain(directory: str | Path, images: Sequence[np.ndarray], names: Sequence[str],
                          stream=None) -> list[bool | None]:
    """Print one warning line per input outside the training domain; returns the out-of-domain flags.

    ``directory`` is the checkpoint folder the model was loaded from (resolved), whose model card states
    the training domain. Images with the same name are one input (e.g. a video's first, middle and last
    frame): it is judged by their median distance and warned about once. A checkpoint without the check
    (no ``domain.safetensors``) gets one note per process saying that the check is unavailable, and the flags
    are None (unknown).
    """
    import sys

    from core.pretrained import read_card

    stream = stream or sys.stderr
    loaded = load(directory)
    card = read_card(directory)
    domain = card.get("training_domain", "its training data")
    if loaded is None:
        key = str(Path(directory).resolve())
        if key not in _noted:
            _noted.add(key)
            print(f"embodied: note: {Path(directory).name} has no domain statistics ({DOMAIN_FILE}): inputs are "
                  f"not checked against its training domain ({domain})", file=stream)
        return [None] * len(images)
    ref, entry = loaded
    dist = nearest_distance(features(images), ref).tolist()
    groups: dict[str, list[float]] = {}
    for name, d in zip(names, dist, strict=True):
        groups.setdefault(name, []).append(d)
    outside = {}
    for name, ds in groups.items():
        d = float(np.median(ds))
        outside[name] = d > entry["threshold"]
        if outside[name]:
            print(f"embodied: warning: {name} is far from this model's training domain ({domain}): feature "
                  f"distance {d:.3f} > {entry['threshold']:.3f} (false alarms on held-out training-like images: "
                  f"{entry['false_alarm_rate_heldout']:.0%}); expect meaningless output", file=stream)
    return [outside[name] for name in names]
