"""Wan folders as a user downloads them (diffusers ``save_pretrained``), for Flex-Forcing's and TAGRPO's tests."""

from __future__ import annotations

from pathlib import Path

import torch

# Wan2.1-T2V-1.3B's structure (30 blocks, 12 heads, patch (1, 2, 2), text width 4096 of umT5-XXL, 256-d time
# frequencies; its VAE: 4 levels, 8x space, 4x time, z 16) with shrunk widths
WAN21_SHRUNK = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=8, in_channels=16,
                    out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=64, num_layers=30, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
WAN21_VAE_SHRUNK = dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True,
                                                                                                            True])
TINY_WAN = dict(WAN21_SHRUNK, num_attention_heads=2, attention_head_dim=16, num_layers=2, text_dim=16, ffn_dim=64,
                in_channels=4, out_channels=4, freq_dim=32)
TINY_WAN_VAE = dict(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False])


def save_wan_pipeline(folder: Path, transformer: dict | None = None, vae: dict | None = None, seed: int = 0) -> Path:
    """A diffusers Wan pipeline folder (``transformer/`` + ``vae/`` + ``model_index.json``) of random weights,
    written by the upstream classes' own ``save_pretrained`` (default: Wan2.1-1.3B's structure, shrunk)."""
    import json

    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    torch.manual_seed(seed)
    WanTransformer3DModel(**(transformer or WAN21_SHRUNK)).save_pretrained(folder / "transformer")
    AutoencoderKLWan(**(vae or WAN21_VAE_SHRUNK)).save_pretrained(folder / "vae")
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "WanPipeline", "_diffusers_version": "0.42.1",
        "transformer": ["diffusers", "WanTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLWan"],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"], "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"]}))
    return folder
