"""The workspace's vision-language-model toolkit (shared by the forensics and driving VLAs).

- ``tokenizer``: an offline byte-level BPE tokenizer (``tokenizers``) with the Qwen-VL special tokens.
- ``processor``: images -> the vision tower's patches (``patchify``, the HF Qwen2-VL layout, batched in torch)
  and the HF image processor saved with checkpoints.
- ``template``: the ChatML one-image template; ``encode`` gives ids + answer-only labels.
- ``collate``: padded batches of variable-length sequences (``vlm_collate``).
- ``modeling``: tiny Qwen2.5-VL / Qwen3-VL configs (``VLMConfig``), ``load_vlm`` / ``save_vlm`` for local
  folders (``load_vlm`` in the dtype asked for), ``add_tokens`` (whole new tokens, embeddings resized), the
  model's parts (vision tower, decoder layers), a forward's inputs (``vlm_inputs``, the one place
  ``mm_token_type_ids`` is added), answer log-probabilities and the next-token loss.
- ``pretrain``: ``ensure_base_vlm``: a base VLM at a path, pretrained there on image QA (under a lock,
  resumable) the first time it is missing.
"""

from core.vlm.collate import pad_sequences, vlm_collate
from core.vlm.modeling import (
    DTYPES,
    FAMILIES,
    VLMConfig,
    add_tokens,
    answer_logprob,
    build_vlm,
    count_parameters,
    decoder_layers,
    encode_images,
    has_token,
    image_token_id,
    language_model,
    load_vlm,
    mm_token_type_ids,
    next_token_loss,
    patch_spec_of,
    resolve_dtype,
    save_vlm,
    vision_tower,
    vlm_inputs,
)
from core.vlm.pretrain import BasePretraining, ImageQAModel, ensure_base_vlm, is_workspace_base
from core.vlm.processor import PatchSpec, image_processor, patchify, to_tensor
from core.vlm.template import IGNORE, decode_answer, encode, prompt_text
from core.vlm.tokenizer import SPECIAL_TOKENS, build_tokenizer, load_tokenizer, token_id

__all__ = [
    "DTYPES", "FAMILIES", "IGNORE", "SPECIAL_TOKENS", "BasePretraining", "ImageQAModel", "PatchSpec", "VLMConfig",
    "add_tokens", "answer_logprob", "build_tokenizer", "build_vlm", "count_parameters", "decode_answer",
    "decoder_layers", "encode", "encode_images", "ensure_base_vlm", "has_token", "image_processor",
    "image_token_id", "is_workspace_base", "language_model", "load_tokenizer", "load_vlm", "mm_token_type_ids",
    "next_token_loss", "pad_sequences", "patch_spec_of", "patchify", "prompt_text", "resolve_dtype", "save_vlm",
    "to_tensor", "token_id", "vision_tower", "vlm_collate", "vlm_inputs",
]
