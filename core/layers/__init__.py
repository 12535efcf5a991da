"""Shared neural-network layers.

Attention (self / cross, ``F.scaled_dot_product_attention``), MLP, pre-norm transformer blocks, LoRA adapters
(Hugging Face ``peft``, imported on first use), diffusion-transformer pieces (``dit``: adaLN-Zero block with
per-token conditioning, rotary positions, timestep embedder), a rolling ``KVCache`` and AutoencoderKL helpers
(``vae``, diffusers imported on first use). Every layer takes ``device`` / ``dtype`` (timm habit).
"""

from core.layers.attention import Attention
from core.layers.blocks import TransformerBlock
from core.layers.dit import DiTBlock, FinalLayer, RotaryEmbedding, TimestepEmbedder
from core.layers.kv_cache import KVCache
from core.layers.lora import (
    inject_lora,
    is_lora_layer,
    load_lora,
    load_lora_state_dict,
    lora_config,
    lora_parameters,
    lora_state_dict,
    merge_lora,
    save_lora,
)
from core.layers.mlp import Mlp

__all__ = [
    "Attention",
    "DiTBlock",
    "FinalLayer",
    "KVCache",
    "RotaryEmbedding",
    "TimestepEmbedder",
    "Mlp",
    "TransformerBlock",
    "inject_lora",
    "is_lora_layer",
    "load_lora",
    "load_lora_state_dict",
    "lora_config",
    "lora_parameters",
    "lora_state_dict",
    "merge_lora",
    "save_lora",
]
