"""What AutoMoT reads: driving samples (logged or live) -> the model's batch.

One function serves training (a ``collate_fn`` over ``DrivingSamples``) and driving (``live_sample`` from the
env's observation + the policy's frame buffer), so the two cannot drift apart.

Understanding tokens (U): the ChatML prompt of ``core.vlm.template`` with the system prompt, ``history`` front
frames (oldest first, each resized to the VLM's square ``image_size`` and patchified as Qwen-VL does) and the
navigation instruction. Right-padded (``AutoMoT`` requires it).

Action-expert inputs: ``bev`` (B, 6, Hb, Wb) in [0, 1], ``target_points`` (B, K, 2) ego-frame metres, ``ego``
(B, 6) ``data.EGO_FIELDS``. Targets (training): ``meta_action``, ``route``, ``waypoints``, ``velocity``.

With ``lm_answers`` the batch also holds a labelled copy of U followed by an answer (``lm_input_ids`` /
``lm_attention_mask`` / ``lm_labels``): the understanding expert's next-token loss on reasoning text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from driving.automot.configuration_automot import SYSTEM_PROMPT

ACTION_KEYS = ("bev", "target_points", "ego")
TARGET_KEYS = ("meta_action", "route", "waypoints", "velocity")


class Prompter:
    """Token ids of AutoMoT's understanding prompt (and of prompt + answer, with answer-only labels)."""

    def __init__(self, tokenizer: Any, tokens_per_image: int, history: int):
        self.tokenizer, self.n_tok, self.history = tokenizer, int(tokens_per_image), int(history)
        self.pad_id = int(tokenizer.pad_token_id)

    def prompt(self, instruction: str) -> torch.Tensor:
        from core.vlm import encode

        return encode(self.tokenizer, instruction, None, self.n_tok, SYSTEM_PROMPT, self.history)["input_ids"]

    def example(self, question: str, answer: str) -> dict[str, torch.Tensor]:
        from core.vlm import encode

        return encode(self.tokenizer, question, answer, self.n_tok, SYSTEM_PROMPT, self.history)


def square_frames(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, T, 3, H, W) float frames in [0, 1] -> (B * T, 3, size, size) (bilinear, antialiased)."""
    if images.ndim != 5 or images.shape[2] != 3:
        raise ValueError(f"images must be (B, T, 3, H, W), got {tuple(images.shape)}")
    flat = images.flatten(0, 1).float()
    if flat.shape[-2:] == (size, size):
        return flat
    return F.interpolate(flat, size=(size, size), mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)


def _pad(seqs: Sequence[torch.Tensor], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    from core.vlm.collate import pad_sequences

    ids = pad_sequences(list(seqs), value, side="right")
    mask = pad_sequences([torch.ones_like(s) for s in seqs], 0, side="right")
    return ids, mask


def model_batch(samples: dict[str, Any], prompter: Prompter | None = None, spec: Any = None,
                questions: Sequence[str] | None = None, lm_answers: Sequence[str] | None = None) -> dict[str, Any]:
    """A collated sample dict (``data.collate_driving``) -> AutoMoT's batch.

    Args:
        samples: ``images`` (B, T, 3, H, W), ``instruction`` (list of str), the action keys and, when training,
            the targets.
        prompter / spec: The understanding expert's tokenizer wrapper and ``core.vlm.PatchSpec``; None for the
            noreason arm (no U tokens).
        questions / lm_answers: With answers, a labelled U + answer sequence per sample (the question
            defaults to the instruction).
    """
    out: dict[str, Any] = {k: samples[k].float() for k in ACTION_KEYS}
    for k in TARGET_KEYS:
        if k in samples:
            out[k] = samples[k]
    if prompter is None:
        return out
    from core.vlm import patchify

    if samples["images"].shape[1] != prompter.history:
        raise ValueError(f"images carry {samples['images'].shape[1]} frames, the prompt expects {prompter.history}")
    pv, grid = patchify(square_frames(samples["images"], spec.image_size), spec)
    out["pixel_values"], out["image_grid_thw"] = pv, grid
    out["input_ids"], out["attention_mask"] = _pad([prompter.prompt(t) for t in samples["instruction"]],
                                                   prompter.pad_id)
    if lm_answers is not None:
        qs = questions if questions is not None else samples["instruction"]
        exs = [prompter.example(q, a) for q, a in zip(qs, lm_answers, strict=True)]
        out["lm_input_ids"], out["lm_attention_mask"] = _pad([e["input_ids"] for e in exs], prompter.pad_id)
        out["lm_labels"], _ = _pad([e["labels"] for e in exs], -100)
    return out


def to_device(batch: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def live_sample(frames: Sequence[np.ndarray], obs: dict[str, Any], info: dict[str, Any], scenario: str,
                n_target_points: int, route_n: int = 20) -> dict[str, Any]:
    """One driving step as a collated batch of one (what ``DrivingSamples`` gives for a logged step).

    ``frames``: the last ``history`` front images (H, W, 3) uint8, oldest first.
    """
    from driving.automot.data import ego_features, route_points
    from driving.automot.reasoning import navigation_instruction

    images = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float().div(255.0)
    route = route_points(np.asarray(obs["route"], dtype=np.float32), route_n)
    return {
        "images": images[None],
        "bev": torch.from_numpy(np.asarray(obs["bev"], dtype=np.float32) / 255.0)[None],
        "target_points": torch.from_numpy(np.ascontiguousarray(route[:n_target_points], dtype=np.float32))[None],
        "ego": torch.from_numpy(ego_features(obs["ego_state"]))[None],
        "instruction": [navigation_instruction(obs, info, scenario)],
    }


__all__ = ["ACTION_KEYS", "TARGET_KEYS", "Prompter", "live_sample", "model_batch", "square_frames", "to_device"]
