"""Padded collation of variable-length token sequences with their images."""

from __future__ import annotations

from typing import Any

import torch

from core.vlm.template import IGNORE


def pad_sequences(seqs: list[torch.Tensor], value: int, side: str = "right") -> torch.Tensor:
    """(L_i,) tensors -> (B, max L) padded with ``value`` on ``side`` ("right" for training, "left" for generation)."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    length = max(int(s.numel()) for s in seqs)
    out = torch.full((len(seqs), length), value, dtype=seqs[0].dtype)
    for i, s in enumerate(seqs):
        if side == "right":
            out[i, : s.numel()] = s
        else:
            out[i, length - s.numel():] = s
    return out


def vlm_collate(samples: list[dict[str, Any]], pad_id: int, side: str = "right") -> dict[str, Any]:
    """Batch examples of ``template.encode`` (+ any other keys).

    ``input_ids`` are padded with ``pad_id``, ``labels`` with ``IGNORE``, and ``attention_mask`` marks the real
    tokens. Tensor keys of equal shape are stacked (e.g. ``image`` (3, S, S)); other keys become lists.
    """
    batch: dict[str, Any] = {
        "input_ids": pad_sequences([s["input_ids"] for s in samples], pad_id, side),
        "attention_mask": pad_sequences([torch.ones_like(s["input_ids"]) for s in samples], 0, side),
    }
    if all("labels" in s for s in samples):
        batch["labels"] = pad_sequences([s["labels"] for s in samples], IGNORE, side)
    for key in samples[0]:
        if key in ("input_ids", "labels"):
            continue
        values = [s[key] for s in samples]
        if isinstance(values[0], torch.Tensor) and all(v.shape == values[0].shape for v in values):
            batch[key] = torch.stack(values)
        elif isinstance(values[0], (int, float)) and not isinstance(values[0], bool):
            batch[key] = torch.tensor(values)
        else:
            batch[key] = values
    return batch
