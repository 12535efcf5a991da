"""A tiny base VLM at a path, pretrained on image QA the first time it is asked for (shared by the VLM methods).

A method that wraps a base VLM (Deep-VRM's detector, AutoMoT's understanding expert) names a folder
(``model.base_path``). When the folder holds a model (a user's Qwen-VL ``save_pretrained`` folder, or one built
here before) it is loaded as is, read-only. Otherwise ``ensure_base_vlm`` builds one there::

    <base>.pretrain/        the lock (one process pretrains; the others wait, then load)
    <base>.run/             the pretraining run: tokenizer/ (kept on resume), checkpoints/, metrics.jsonl
    <base>/                 the finished model: save_vlm's folder + pretraining.json (what made it)

1. a byte-level BPE tokenizer on the method's text corpus (``corpus()``; ``extra_tokens`` added whole),
2. a Qwen-VL-class model of ``sizes`` (``core.vlm.VLMConfig`` fields; the vocabulary is the tokenizer's),
3. next-token loss on the answers of the method's image-QA examples (``dataset(tokenizer, spec)``), through
   the one trainer (``core.trainer.Trainer``: resumable, so a killed pretraining continues where it stopped),
4. ``save_vlm`` (atomic), then the folder is loaded like any other.

Under ``torchrun`` a missing base is an error (pretrain it in one process first): ranks must not race to build it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.errors import ConfigError
from core.vlm.modeling import next_token_loss, vlm_inputs
from core.vlm.processor import PatchSpec, patchify

PRETRAINING_FILE = "pretraining.json"


def is_workspace_base(folder: str | Path) -> bool:
    """Whether ``folder`` is a base VLM this workspace pretrained (it holds ``pretraining.json``).

    That is the only kind of base a method may cache files in; a user's folder is read-only.
    """
    return (Path(folder) / PRETRAINING_FILE).is_file()


class ImageQAModel(nn.Module):
    """A VLM trained with the next-token loss on the answers of image-QA examples (the base's pretraining).

    The batch holds ``input_ids`` / ``attention_mask`` / ``labels`` and either ``image`` (B, 3, S, S) in [0, 1]
    (patchified here with ``spec``) or ``pixel_values`` + ``image_grid_thw`` (patchified by the collate).
    """

    def __init__(self, vlm: nn.Module, spec: PatchSpec):
        super().__init__()
        self.vlm, self.spec = vlm, spec

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The next-token loss on the answer tokens (image-QA or text-only batches)."""
        if "pixel_values" in batch:
            pv, grid = batch["pixel_values"], batch["image_grid_thw"]
        else:
            pv, grid = patchify(batch["image"], self.spec)
        out = self.vlm(**vlm_inputs(self.vlm, batch["input_ids"], batch["attention_mask"], pv, grid))
        return {"loss": next_token_loss(out.logits, batch["labels"])}


@dataclass
class BasePretraining:
    """How a missing base is made (a method fills this from its model config).

    Attributes:
        sizes: ``core.vlm.VLMConfig`` fields of the model (``vocab_size`` is set from the tokenizer).
        image_size: Side of the square images the examples carry.
        tokenizer_vocab: BPE vocabulary size.
        steps / batch_size / lr: The pretraining run (cosine schedule; the rest of the trainer config is the
            method's).
        extra_tokens: Whole tokens added to the tokenizer (e.g. AutoMoT's meta-action names).
        method: The method name, for the one-line errors and the card.
        what: One line for ``pretraining.json`` (what the model is and which command made it).
    """

    sizes: dict[str, Any]
    image_size: int
    tokenizer_vocab: int = 1024
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1.0e-3
    extra_tokens: Sequence[str] = field(default_factory=tuple)
    method: str = ""
    what: str = ""


def ensure_base_vlm(path: str | Path, how: BasePretraining, trainer: Any, corpus: Callable[[], Iterable[str]],
                    dataset: Callable[[Any, PatchSpec], torch.utils.data.Dataset],
                    collate: Callable[[Any, PatchSpec], Callable[[list[Any]], Any]] | None = None,
                    run_config: dict[str, Any] | None = None, card: dict[str, Any] | None = None,
                    dtype: str | torch.dtype | None = None):
    """(vlm, tokenizer) from ``path``; pretrained there first (under a lock, resumable) if it holds no model.

    Args:
        path: The base folder (``model.base_path``).
        how: Sizes and the pretraining run's settings.
        trainer: The method's ``core.config.TrainerConfig`` (seed, device, strategy ...); steps, batch size, lr
            and the schedule come from ``how``.
        corpus: The tokenizer's training text (called only when the base is built, and only once per run: a
            resumed pretraining keeps its tokenizer).
        dataset: ``(tokenizer, spec) -> Dataset`` of examples for ``ImageQAModel`` (called only when built).
        collate: ``(tokenizer, spec) -> collate_fn``; default ``core.vlm.vlm_collate`` padded with the tokenizer's
            pad id.
        run_config: Recorded in the pretraining run's checkpoints (the method's model config, say).
        card: More fields for ``pretraining.json``.
        dtype: The loaded model's parameter dtype (``core.vlm.load_vlm``; None = float32). A base built here is
            pretrained in float32 whatever this is.

    Raises:
        ConfigError: No base there and this is one rank of a distributed run.
    """
    from core.outputs import lock_folder
    from core.vlm.modeling import load_vlm

    base = Path(path)
    if (base / "config.json").is_file():  # a user's folder or a finished base (save_vlm renames it into place whole)
        return load_vlm(base, dtype=dtype)  # nothing written, not even the lock beside it
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"{base}: no base VLM there; pretrain it in one process first (embodied train "
                          f"{how.method or 'METHOD'} with the same model.base_path) or point model.base_path at a "
                          "local VLM folder")
    with lock_folder(base.with_name(base.name + ".pretrain"), wait=24 * 3600):
        if not (base / "config.json").is_file():
            _pretrain(base, how, trainer, corpus, dataset, collate, run_config, card)
    return load_vlm(base, dtype=dtype)


def _pretrain(base: Path, how: BasePretraining, tcfg: Any, corpus, dataset, collate, run_config, card) -> None:
    from core.logging import get_logger
    from core.trainer import Trainer
    from core.vlm.collate import vlm_collate
    from core.vlm.modeling import VLMConfig, build_vlm, save_vlm
    from core.vlm.tokenizer import build_tokenizer, load_tokenizer

    run_dir = base.with_name(base.name + ".run")
    tok_dir = run_dir / "tokenizer"
    if (tok_dir / "tokenizer.json").is_file():  # a resumed pretraining keeps its tokenizer
        tok = load_tokenizer(tok_dir)
    else:
        tok = build_tokenizer(corpus(), vocab_size=how.tokenizer_vocab)
        if how.extra_tokens:
            tok.add_tokens(list(how.extra_tokens))
        tok.save_pretrained(tok_dir)
    vcfg = VLMConfig(**{**dict(how.sizes), "vocab_size": len(tok)})
    torch.manual_seed(tcfg.seed)
    vlm = build_vlm(vcfg)
    spec = vcfg.patch_spec(how.image_size)
    ds = dataset(tok, spec)
    collate_fn = collate(tok, spec) if collate is not None else functools.partial(vlm_collate,
                                                                                 pad_id=int(tok.pad_token_id))
    pcfg = dataclasses.replace(tcfg, max_steps=how.steps, batch_size=how.batch_size,
                               optim=dataclasses.replace(tcfg.optim, lr=how.lr),
                               scheduler=dataclasses.replace(tcfg.scheduler, name="cosine"))
    get_logger("embodied.vlm").info("pretraining the base VLM on %d image-QA examples for %d steps -> %s", len(ds),
                                    how.steps, base)
    Trainer(ImageQAModel(vlm, spec), ds, pcfg, run_dir, run_config=run_config or {}, collate_fn=collate_fn).fit()
    meta = {"what": how.what or f"tiny {vcfg.family} model pretrained on image QA", "method": how.method,
            "vlm": dataclasses.asdict(vcfg), "examples": len(ds), "steps": how.steps, **(card or {})}
    if how.extra_tokens:
        meta["extra_tokens"] = list(how.extra_tokens)
    save_vlm(base, vlm, tok, spec, extra_files={PRETRAINING_FILE: json.dumps(meta, indent=1)})


__all__ = ["PRETRAINING_FILE", "BasePretraining", "ImageQAModel", "ensure_base_vlm", "is_workspace_base"]
