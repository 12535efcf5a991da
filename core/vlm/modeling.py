"""Vision-language models through ``transformers``, and the few generic operations a method needs.

Tiny configs of the Qwen-VL classes, local-folder loading and saving, the parts of the model, answer
log-probabilities and greedy answers.

Two reference families, the classes users have weights for:

============  ===============================================  =========================================
family        transformers classes                             paper-size example
============  ===============================================  =========================================
qwen2_5_vl    ``Qwen2_5_VLConfig``, ``Qwen2_5_VLForConditionalGeneration``  Qwen2.5-VL-7B (28 layers, 3584)
qwen3_vl      ``Qwen3VLConfig``, ``Qwen3VLForConditionalGeneration``        Qwen3-VL-8B
============  ===============================================  =========================================

A user's model is a local folder written by ``save_pretrained`` (``config.json`` + safetensors +
``tokenizer.json`` + ``preprocessor_config.json``): ``load_vlm(folder)``. Nothing is downloaded
(``local_files_only``). Tests and CPU training build the same classes at a tiny size from ``VLMConfig``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError, ConfigError
from core.vlm.processor import PatchSpec, image_processor
from core.vlm.template import IGNORE
from core.vlm.tokenizer import IMAGE_PAD, SPECIAL_TOKENS, VIDEO_PAD, VISION_END, VISION_START, token_id

FAMILIES = ("qwen2_5_vl", "qwen3_vl")


def _classes(family: str) -> tuple[type, type]:
    import transformers

    if family == "qwen2_5_vl":
        return transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
    if family == "qwen3_vl":
        return transformers.Qwen3VLConfig, transformers.Qwen3VLForConditionalGeneration
    raise ConfigError(f"unknown VLM family {family!r}; choose from {FAMILIES}")


def mrope_section(head_dim: int) -> list[int]:
    """Split of the rotary half-dimension between (time, height, width), in Qwen-VL's 1/4, 3/8, 3/8 ratio."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


@dataclass
class VLMConfig:
    """Sizes of a Qwen-VL-class model built from scratch (every size a config value).

    The special-token ids must match the tokenizer (``core.vlm.tokenizer.SPECIAL_TOKENS`` order gives 0..6).

    - ``head_dim``: the LLM's attention head width; None = ``hidden_size / num_heads`` (Qwen2.5-VL allows only
      that; Qwen3-VL's published models set it, e.g. 128 in Qwen3-VL-4B where hidden / heads = 80).
    - ``mrope_section``: the (time, height, width) split of the rotary half-dimension; None = ``mrope_section``'s
      1/4, 3/8, 3/8 (Qwen3-VL-4B publishes [24, 20, 20]).
    - ``deepstack_indexes`` (qwen3_vl): vision blocks whose merged features are added to the first LLM layers'
      image tokens (one extra patch merger each; Qwen3-VL-4B: [5, 11, 17]); empty = none.
    - ``vision_position_embeddings`` (qwen3_vl): learned vision positions, a square grid (Qwen3-VL: 2304 = 48^2);
      None = ``max(64, max_positions // 4)``.
    """

    family: str = "qwen2_5_vl"
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    vision_depth: int = 4
    vision_hidden: int = 96
    vision_intermediate: int = 192
    vision_heads: int = 4
    patch_size: int = 8
    merge_size: int = 2
    temporal_patch_size: int = 2
    max_positions: int = 1024
    tie_word_embeddings: bool = True
    head_dim: int | None = None
    mrope_section: list[int] | None = None
    deepstack_indexes: list[int] = field(default_factory=list)
    vision_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"model.vlm.family must be one of {FAMILIES}, got {self.family!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("model.vlm: num_heads must divide by num_kv_heads")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ConfigError("model.vlm: hidden_size must divide by num_heads (or set model.vlm.head_dim)")
        if self.vision_hidden % self.vision_heads:
            raise ConfigError("model.vlm: vision_hidden must divide by vision_heads")
        derived = self.hidden_size // self.num_heads
        if self.head_dim is not None and (self.head_dim < 2 or self.head_dim % 2):
            raise ConfigError(f"model.vlm.head_dim must be an even integer >= 2, got {self.head_dim}")
        if self.family == "qwen2_5_vl" and self.head_dim not in (None, derived):
            raise ConfigError(f"model.vlm.head_dim: Qwen2.5-VL's attention uses hidden_size / num_heads = {derived}, "
                              f"got {self.head_dim}")
        if self.mrope_section is not None:
            self.mrope_section = [int(x) for x in self.mrope_section]
            if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.text_head_dim // 2:
                raise ConfigError(f"model.vlm.mrope_section must be 3 sizes summing to head_dim / 2 = "
                                  f"{self.text_head_dim // 2}, got {self.mrope_section}")
        self.deepstack_indexes = [int(i) for i in self.deepstack_indexes]
        if self.deepstack_indexes and self.family != "qwen3_vl":
            raise ConfigError("model.vlm.deepstack_indexes: only the qwen3_vl family has deepstack mergers")
        if any(not 0 <= i < self.vision_depth for i in self.deepstack_indexes) or \
                len(set(self.deepstack_indexes)) != len(self.deepstack_indexes):
            raise ConfigError(f"model.vlm.deepstack_indexes must be distinct vision blocks in [0, {self.vision_depth}),"
                              f" got {self.deepstack_indexes}")
        if self.deepstack_indexes and len(self.deepstack_indexes) > self.num_layers:
            raise ConfigError(f"model.vlm.deepstack_indexes: {len(self.deepstack_indexes)} deepstack levels feed the "
                              f"first LLM layers, but there are only {self.num_layers}")
        if self.vision_position_embeddings is not None:
            if self.family != "qwen3_vl":
                raise ConfigError("model.vlm.vision_position_embeddings: only the qwen3_vl family has them")
            side = round(self.vision_position_embeddings ** 0.5)
            if self.vision_position_embeddings < 1 or side * side != self.vision_position_embeddings:
                raise ConfigError(f"model.vlm.vision_position_embeddings must be a square number (a grid of "
                                  f"learned positions), got {self.vision_position_embeddings}")

    @property
    def text_head_dim(self) -> int:
        """The LLM's attention head width: ``head_dim``, else ``hidden_size / num_heads``."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    def hf_config(self) -> Any:
        """The ``transformers`` config of this size (special-token ids from ``SPECIAL_TOKENS``' order)."""
        config_cls, _ = _classes(self.family)
        ids = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
        head_dim = self.text_head_dim
        section = self.mrope_section or mrope_section(head_dim)
        text = dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                    intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                    num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                    max_position_embeddings=self.max_positions, tie_word_embeddings=self.tie_word_embeddings,
                    bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
        vision = dict(depth=self.vision_depth, hidden_size=self.vision_hidden,
                      intermediate_size=self.vision_intermediate, num_heads=self.vision_heads,
                      out_hidden_size=self.hidden_size, patch_size=self.patch_size,
                      spatial_merge_size=self.merge_size, temporal_patch_size=self.temporal_patch_size)
        if self.family == "qwen2_5_vl":
            text["rope_scaling"] = {"type": "mrope", "mrope_section": section}
            vision["fullatt_block_indexes"] = list(range(self.vision_depth))  # small images: one window anyway
            vision["window_size"] = self.patch_size * self.merge_size * 64
        else:
            text["rope_scaling"] = {"rope_type": "default", "mrope_section": section, "mrope_interleaved": True}
            text["head_dim"] = head_dim
            vision["deepstack_visual_indexes"] = list(self.deepstack_indexes)
            vision["num_position_embeddings"] = (self.vision_position_embeddings
                                                 or max(64, (self.max_positions // 4)))
        cfg = config_cls(text_config=text, vision_config=vision, image_token_id=ids[IMAGE_PAD],
                         video_token_id=ids[VIDEO_PAD], vision_start_token_id=ids[VISION_START],
                         vision_end_token_id=ids[VISION_END], tie_word_embeddings=self.tie_word_embeddings)
        return cfg

    def patch_spec(self, image_size: int) -> PatchSpec:
        """How images of ``image_size`` px are patched for this model."""
        return PatchSpec(image_size=image_size, patch_size=self.patch_size, merge_size=self.merge_size,
                         temporal_patch_size=self.temporal_patch_size)


def build_vlm(cfg: VLMConfig) -> nn.Module:
    """A randomly initialised model of ``cfg``'s family and size."""
    _, model_cls = _classes(cfg.family)
    return model_cls(cfg.hf_config())


def family_of(model: nn.Module) -> str:
    """The model's family (``qwen2_5_vl`` | ``qwen3_vl``); any other model is a one-line ``ConfigError``."""
    kind = getattr(model.config, "model_type", "")
    if kind in FAMILIES:
        return kind
    raise ConfigError(f"unsupported VLM type {kind!r}; supported: {FAMILIES}")


# -- the parts of a model ----------------------------------------------------------------------------------------
def vision_tower(model: nn.Module) -> nn.Module:
    """The ViT + merger (``model.model.visual``): pixel patches -> LLM-width image tokens."""
    return model.model.visual


def language_model(model: nn.Module) -> nn.Module:
    """The decoder stack (embeddings, layers, norm) of a Qwen-VL model."""
    return model.model.language_model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The LLM's decoder layers, in order (layer k's output is hidden state k + 1)."""
    return model.model.language_model.layers


def image_token_id(model: nn.Module) -> int:
    """The id of the placeholder token that stands for one merged image patch."""
    return int(model.config.image_token_id)


def encode_images(model_or_tower: nn.Module, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """Run a vision tower on patches -> (total image tokens, LLM hidden) in the model's order."""
    tower = vision_tower(model_or_tower) if hasattr(model_or_tower, "model") else model_or_tower
    out = tower(pixel_values, grid_thw=grid_thw)
    if hasattr(out, "pooler_output") and out.pooler_output is not None:
        out = out.pooler_output  # transformers 5 returns the merged tokens as pooler_output
    elif isinstance(out, tuple):
        out = out[0]
    if isinstance(out, (list, tuple)):
        out = torch.cat(list(out), dim=0)
    return out


def mm_token_type_ids(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, L) long: 1 at the model's image tokens, 0 elsewhere (the Qwen-VL classes' ``mm_token_type_ids``).

    Both families need it for their multimodal RoPE: without it transformers cannot compute the 3-D (time,
    height, width) positions of the image tokens and falls back to 1-D text positions for the whole sequence.
    """
    return (input_ids == image_token_id(model)).long()


POSITIONS = ("mrope", "text")


def vlm_inputs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               pixel_values: torch.Tensor | None, image_grid_thw: torch.Tensor | None,
               positions: str = "mrope") -> dict[str, Any]:
    """The keyword arguments of one forward: ids, mask and, with images, the pixels and their patch grid.

    ``positions="mrope"`` (the models' own scheme) adds ``mm_token_type_ids``, so that image tokens get the 3-D
    multimodal positions in every family. ``"text"`` leaves it out: transformers then gives the whole sequence
    1-D text positions, which is how checkpoints made here before the 3-D positions were trained (the shipped
    Deep-VRM detector records it in its config); nothing new should be trained that way.

    This is the one place the workspace builds a Qwen-VL forward's inputs; a method calls ``model(**kw)``.
    """
    family = family_of(model)  # an unsupported model fails here, by name
    if positions not in POSITIONS:
        raise ConfigError(f"positions must be one of {POSITIONS}, got {positions!r}")
    if positions == "text" and family != "qwen2_5_vl":
        raise ConfigError(f"positions='text' is a Qwen2.5-VL fallback (for checkpoints trained with it); {family} "
                          "always uses its 3-D positions")
    kw: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
    if pixel_values is not None:
        kw.update(pixel_values=pixel_values, image_grid_thw=image_grid_thw)
        if positions == "mrope":
            kw["mm_token_type_ids"] = mm_token_type_ids(model, input_ids)
    return kw


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (all, or those with ``requires_grad``)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


# -- scoring and answering ---------------------------------------------------------------------------------------
def answer_logprob(logits: torch.Tensor, labels: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    """Per-sample log-probability of the labelled tokens under teacher forcing.

    Args:
        logits: (B, L, V) from the model on the full sequence.
        labels: (B, L), ``IGNORE`` outside the answer.
        reduce: ``sum`` (sequence log-probability) or ``mean`` (per token).
    """
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    mask = shift_labels != IGNORE
    logp = torch.log_softmax(shift_logits, dim=-1)
    tok = logp.gather(-1, shift_labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * mask
    total = tok.sum(dim=1)
    return total / mask.sum(dim=1).clamp_min(1) if reduce == "mean" else total


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over labelled tokens (the answer), as in instruction tuning."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE)


# -- folders -----------------------------------------------------------------------------------------------------
def save_vlm(folder: str | Path, model: nn.Module, tokenizer: Any, spec: PatchSpec | None = None,
             extra_files: dict[str, str] | None = None, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` + ``tokenizer`` (+ the image processor) as one ``from_pretrained`` folder, atomically.

    The folder is written as a temporary sibling renamed into place; a previous folder is replaced only once the
    new one is complete. ``state_dict``: weights to write instead of the live ones (``model``'s own key names,
    e.g. an EMA copy's; transformers' ``save_pretrained(state_dict=...)``).
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is for everyone
    try:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        if spec is not None:
            image_processor(spec).save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        old = folder.with_name(f".{folder.name}.old")
        if folder.exists():
            shutil.rmtree(old, ignore_errors=True)
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


DTYPES = ("float32", "bfloat16", "float16", "auto")


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    """A ``load_vlm`` dtype: a ``torch.dtype``, one of ``DTYPES`` by name, or None (float32).

    ``"auto"`` is kept (the folder's own ``config.json`` dtype).
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"VLM dtype must be one of {DTYPES}, got {dtype!r}")
    return dtype if dtype == "auto" else getattr(torch, dtype)


def load_vlm(folder: str | Path, dtype: str | torch.dtype | None = None, device: str | torch.device = "cpu",
             weights: bool = True):
    """(model, tokenizer) from a local ``save_pretrained`` folder of a supported family; offline.

    ``dtype``: the parameters' dtype (``resolve_dtype``: None = float32; ``"auto"`` = the folder's ``config.json``
    dtype, float32 if it names none). The model is built on the meta device and its weights are read straight
    into that dtype (transformers' ``from_pretrained(dtype=...)``): a bf16 7B model never holds an fp32 copy.
    ``weights=False`` builds the model from ``config.json`` with freshly initialised weights, directly in
    ``dtype`` (for a caller that loads a full state dict of its own next, e.g. a fine-tuned copy: the folder
    then needs no weight files).

    Raises:
        CheckpointError: No such folder, no ``config.json``, an unsupported model type, or unreadable weights.
        ConfigError: An unknown ``dtype``.
    """
    import transformers

    from core.vlm.tokenizer import load_tokenizer

    dtype = resolve_dtype(dtype)
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such VLM folder")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json (expected a transformers save_pretrained folder)")
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}: unreadable config.json ({str(e).splitlines()[0]})") from None
    if config.model_type not in FAMILIES:
        raise CheckpointError(f"{folder}: model_type {config.model_type!r} is not a supported VLM {FAMILIES}")
    _, model_cls = _classes(config.model_type)
    if dtype == "auto":
        saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        dtype = saved if isinstance(saved, torch.dtype) else getattr(torch, str(saved or "float32"))
    if not weights:
        model = model_cls._from_config(config, dtype=dtype)  # initialised in dtype (default dtype set meanwhile)
    else:
        try:
            model = model_cls.from_pretrained(str(folder), local_files_only=True, dtype=dtype)
        except (OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{folder}: cannot load the weights ({str(e).splitlines()[0]})") from None
    tokenizer = load_tokenizer(folder)
    if token_id(tokenizer, IMAGE_PAD) != image_token_id(model):
        raise CheckpointError(f"{folder}: the tokenizer's {IMAGE_PAD} id differs from the model's image_token_id")
    return model.to(device), tokenizer


def has_token(tokenizer: Any, token: str) -> bool:
    """Whether ``token`` is one entry of ``tokenizer``'s vocabulary (not split, not the unknown token)."""
    i = tokenizer.convert_tokens_to_ids(token)
    return i is not None and i >= 0 and i != tokenizer.unk_token_id


def add_tokens(model: nn.Module, tokenizer: Any, tokens: Sequence[str]) -> list[str]:
    """Make each of ``tokens`` one vocabulary entry of ``tokenizer`` and ``model``; returns those added, in order.

    The tokens the tokenizer lacks are added (``tokenizer.add_tokens``, ids after the current ones); the model's
    embedding matrices grow to ``len(tokenizer)`` only if they have fewer rows (a Qwen checkpoint's are padded
    beyond its tokenizer, so they usually do not). Each added token's input row, and its output row when the LM
    head is not tied, is set to the mean of the rows of the tokens it was split into before: the same base and
    the same list always give the same ids and weights, so a model that records what it added (and adds it again
    on loading) is rebuilt exactly. Tokens already there are left alone (calling this twice adds nothing).
    """
    new = [t for t in dict.fromkeys(tokens) if not has_token(tokenizer, t)]
    if not new:
        return []
    pieces = {t: tokenizer(t, add_special_tokens=False)["input_ids"] for t in new}
    tokenizer.add_tokens(new)
    ids = [int(tokenizer.convert_tokens_to_ids(t)) for t in new]
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    out = None if out is None or out.weight is emb else out.weight
    with torch.no_grad():
        for t, i in zip(new, ids, strict=True):
            emb[i] = emb[pieces[t]].mean(dim=0)
            if out is not None:
                out[i] = out[pieces[t]].mean(dim=0)
    return new


def patch_spec_of(model: nn.Module, image_size: int) -> PatchSpec:
    """The patching a model's vision tower expects, at ``image_size``."""
    v = model.config.vision_config
    return PatchSpec(image_size=image_size, patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                     temporal_patch_size=v.temporal_patch_size)


def config_dict(cfg: VLMConfig) -> dict[str, Any]:
    """``cfg`` as a plain dict (what model cards and pretraining records store)."""
    return asdict(cfg)
