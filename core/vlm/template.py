"""The chat template (Qwen-VL's ChatML) and the tokenised training example built from it.

One turn, one image (``n_images`` images: one vision block each, in order)::

    <|im_start|>user
    <|vision_start|><|image_pad|> x N<|vision_end|>QUESTION<|im_end|>
    <|im_start|>assistant
    ANSWER<|im_end|>

``encode`` returns the ids and the labels: ``-100`` everywhere except the answer and its closing
``<|im_end|>``, so the next-token loss is on the answer only. ``N`` is the number of LLM tokens the merger makes
of the image (``PatchSpec.tokens_per_image``).
"""

from __future__ import annotations

from typing import Any

import torch

from core.vlm.tokenizer import IM_END, IM_START, IMAGE_PAD, VISION_END, VISION_START

IGNORE = -100


def prompt_text(question: str, n_image_tokens: int, system: str | None = None, n_images: int = 1) -> str:
    """The prompt up to and including the assistant header (what generation starts from).

    ``n_image_tokens`` is per image; ``n_images`` vision blocks are placed before the question (e.g. a few past
    camera frames, oldest first).
    """
    if n_images < 0:
        raise ValueError(f"n_images must be >= 0, got {n_images}")
    head = f"{IM_START}system\n{system}{IM_END}\n" if system else ""
    image = f"{VISION_START}{IMAGE_PAD * n_image_tokens}{VISION_END}" * n_images if n_image_tokens else ""
    return f"{head}{IM_START}user\n{image}{question}{IM_END}\n{IM_START}assistant\n"


def encode(tokenizer: Any, question: str, answer: str | None, n_image_tokens: int,
           system: str | None = None, n_images: int = 1) -> dict[str, torch.Tensor]:
    """Token ids (and labels when ``answer`` is given) of one example.

    Returns:
        ``input_ids`` (L,) long; ``labels`` (L,) long (only with an answer), ``IGNORE`` on the prompt.
    """
    prompt = tokenizer(prompt_text(question, n_image_tokens, system, n_images),
                       add_special_tokens=False)["input_ids"]
    out = {"input_ids": torch.tensor(prompt, dtype=torch.long)}
    if answer is None:
        return out
    target = tokenizer(answer + IM_END, add_special_tokens=False)["input_ids"]
    out["input_ids"] = torch.tensor(prompt + target, dtype=torch.long)
    out["labels"] = torch.tensor([IGNORE] * len(prompt) + target, dtype=torch.long)
    return out


def decode_answer(tokenizer: Any, ids: Any) -> str:
    """Generated ids -> the answer text (stops at ``<|im_end|>``; special tokens dropped)."""
    ids = [int(i) for i in ids]
    end = tokenizer.convert_tokens_to_ids(IM_END)
    if end in ids:
        ids = ids[: ids.index(end)]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()
