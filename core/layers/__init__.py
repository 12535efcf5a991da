"""Shared neural-network layers: attention (self / cross, ``F.scaled_dot_product_attention``), MLP,
pre-norm transformer blocks, and LoRA adapters. Every layer takes ``device`` / ``dtype`` (timm habit)."""

from core.layers.attention import Attention
from core.layers.blocks import TransformerBlock
from core.layers.lora import LoRALinear, inject_lora, lora_parameters, lora_state_dict, merge_lora
from core.layers.mlp import Mlp

__all__ = [
    "Attention",
    "LoRALinear",
    "Mlp",
    "TransformerBlock",
    "inject_lora",
    "lora_parameters",
    "lora_state_dict",
    "merge_lora",
]
