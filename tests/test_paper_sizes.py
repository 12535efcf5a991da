"""Every paper backbone, built at its FULL size on the meta device, has the paper's parameter count.

``with torch.device("meta")`` allocates nothing, so an 8 B model is built in seconds on a CPU. Where a method builds
its backbone from a config, it is built THROUGH the method's code (TransNormal's ``build_unet`` / ``build_dino`` /
``TransNormalModel`` on the composed ``experiment=transnormal_paper`` config; ``core.vlm.build_vlm`` from a
``VLMConfig`` of the paper's sizes), and checked against the upstream class built with the published config (the
``config.json`` a user's downloaded folder holds), so the test shows the method scales to the paper.

Published figures (the paper / model card) and the counts measured here:

==========================  =========  ===============  ==================================================
backbone                    paper      measured here    how built
==========================  =========  ===============  ==================================================
SD2 UNet (TransNormal)      0.87 B     867,556,804      ``build_unet``: SD2's 865,910,724 + the task embedding
SD VAE (TransNormal)        0.084 B    83,653,863       ``build_vae`` (inside ``TransNormalModel``)
DINOv3 ViT-L/16             0.30 B     303,079,424      ``build_dino`` (timm); HF ``DINOv3ViTModel``: +50,176
Qwen2.5-VL-7B (Deep-VRM)    8.3 B      8,292,166,656    ``core.vlm.build_vlm`` == transformers, published cfg
Qwen3-VL-4B (AutoMoT)       4.4 B      4,437,815,808    ``core.vlm.build_vlm`` == transformers, published cfg
Wan2.1-T2V-1.3B             1.3 B      1,418,996,800    diffusers ``WanTransformer3DModel``, published cfg
==========================  =========  ===============  ==================================================

Two figures are not the name's: Wan2.1's "1.3B" is a rounded name — the Wan report's architecture table (dim 1536,
30 layers, 12 heads, FFN 8960, text dim 4096) gives 1.419 B, which is what its released checkpoint holds (2.84 GB
in bf16); the test checks that table exactly and the count against 1.42 B. ``core.vlm.VLMConfig`` builds
Qwen3-VL-4B with its own ``head_dim`` (128; hidden / heads would be 80), deepstack mergers and vision position grid.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

TOL = 0.03  # relative, against the published figure


def count(module: nn.Module) -> int:
    """Parameters, each shared (tied) tensor once."""
    return sum(p.numel() for p in module.parameters())


def check(name: str, module: nn.Module, paper: float) -> int:
    n = count(module)
    assert all(p.device.type == "meta" for p in module.parameters()), f"{name}: built off the meta device"
    print(f"{name}: {n:,} parameters ({n / 1e9:.3f} B; paper {paper / 1e9:.2f} B, {n / paper - 1:+.1%})")
    assert abs(n / paper - 1) <= TOL, f"{name}: {n / 1e9:.3f} B is not within {TOL:.0%} of the paper's {paper / 1e9} B"
    return n


# ------------------------------------------------------------------------------------------ TransNormal
@pytest.fixture(scope="module")
def transnormal_config():
    """The paper config as the documented command composes it (``experiment=transnormal_paper``)."""
    from core.config import compose, to_object

    cfg = to_object(compose(["experiment=transnormal_paper"]).model)
    assert (cfg.image_size, cfg.dino_model, cfg.cross_attention_dim) == (768, "vit_large_patch16_dinov3", 1024)
    return cfg


def test_transnormal_unet_is_sd2_at_full_size(transnormal_config):
    from diffusers import UNet2DConditionModel

    from perception.normals.modeling_transnormal import build_unet

    with torch.device("meta"):
        unet = build_unet(transnormal_config)
        # stabilityai/stable-diffusion-2 unet/config.json (the published SD2 UNet)
        sd2 = UNet2DConditionModel(
            sample_size=96, in_channels=4, out_channels=4, layers_per_block=2, norm_num_groups=32,
            block_out_channels=(320, 640, 1280, 1280), attention_head_dim=(5, 10, 20, 20), cross_attention_dim=1024,
            down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, use_linear_projection=True)
    n = check("TransNormal UNet (SD2)", unet, 0.87e9)
    task_embedding = (4 * 1280 + 1280) + (1280 * 1280 + 1280)  # "projection" class embedding: 4 -> 1280 -> 1280
    assert count(sd2) == 865_910_724  # SD2's published UNet
    assert n == count(sd2) + task_embedding  # exactly SD2's UNet plus TransNormal's task switch


def test_transnormal_dinov3_is_vit_large_at_full_size(transnormal_config):
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    from perception.normals.modeling_transnormal import build_dino

    with torch.device("meta"):
        dino = build_dino(transnormal_config)
        # facebook/dinov3-vitl16-pretrain-lvd1689m config.json (what a user's HF folder holds)
        hf = DINOv3ViTModel(DINOv3ViTConfig(
            hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, patch_size=16,
            num_register_tokens=4, query_bias=True, key_bias=False, value_bias=True, layerscale_value=1e-5))
    n = check("DINOv3 ViT-L/16 (timm, build_dino)", dino, 0.30e9)
    assert (dino.num_features, len(dino.blocks), dino.num_prefix_tokens) == (1024, 24, 5)
    # HF's extra tensors: the mask token (training only) and the q / v biases, which are zero in the release
    assert count(hf) - n == 1024 + 2 * 24 * 1024


def test_transnormal_whole_model_at_full_size(transnormal_config):
    from perception.normals.modeling_transnormal import TransNormalModel

    with torch.device("meta"):
        model = TransNormalModel(transnormal_config)
    n = count(model)
    parts = {k: count(getattr(model, k)) for k in ("unet", "vae", "dino", "projector")}
    print(f"TransNormal at paper size: {n:,} parameters " + ", ".join(f"{k} {v:,}" for k, v in parts.items()))
    assert parts["vae"] == 83_653_863  # the SD VAE (AutoencoderKL, 4 latent channels)
    assert parts["projector"] == 1024 * 1024 + 1024  # DINOv3's 1024-d tokens -> the UNet's 1024-d cross-attention
    assert n == sum(parts.values())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == parts["unet"] + parts["projector"]  # VAE and DINOv3 frozen, as in the paper


# ------------------------------------------------------------------------------------------ VLMs
def _qwen2_5_vl_7b_config():
    """Qwen/Qwen2.5-VL-7B-Instruct config.json, written out."""
    from transformers import Qwen2_5_VLConfig

    text = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=128000,
                rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
                rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                  fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu", in_chans=3)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=151655, video_token_id=151656,
                            vision_start_token_id=151652, vision_end_token_id=151653, tie_word_embeddings=False)


def _qwen3_vl_4b_config():
    """Qwen/Qwen3-VL-4B-Instruct config.json, written out."""
    from transformers import Qwen3VLConfig

    text = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                max_position_embeddings=262144, rms_norm_eps=1e-6, rope_theta=5e6, tie_word_embeddings=True,
                attention_bias=False,
                rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True})
    vision = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2560,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                  deepstack_visual_indexes=[5, 11, 17], hidden_act="gelu_pytorch_tanh", in_channels=3)
    return Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=151655, video_token_id=151656,
                         vision_start_token_id=151652, vision_end_token_id=151653, tie_word_embeddings=True)


def test_qwen2_5_vl_7b_through_core_vlm():
    """Deep-VRM's paper base. ``core.vlm.build_vlm`` at the 7B sizes builds exactly the published model."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from core.vlm import VLMConfig, build_vlm

    sizes = VLMConfig(family="qwen2_5_vl", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                      num_layers=28, num_heads=28, num_kv_heads=4, vision_depth=32, vision_hidden=1280,
                      vision_intermediate=3420, vision_heads=16, patch_size=14, merge_size=2, temporal_patch_size=2,
                      max_positions=128000, tie_word_embeddings=False)
    with torch.device("meta"):
        ours = build_vlm(sizes)
        published = Qwen2_5_VLForConditionalGeneration(_qwen2_5_vl_7b_config())
    n = check("Qwen2.5-VL-7B (core.vlm.build_vlm)", ours, 8.3e9)
    assert n == count(published) == 8_292_166_656
    assert ours.config.text_config.rope_scaling["mrope_section"] == [16, 24, 24]  # the published M-RoPE split


def test_qwen3_vl_4b_published_config():
    """AutoMoT's paper base, as a user's ``Qwen3-VL-4B-Instruct`` folder builds it (``load_vlm``: the family class
    from its ``config.json``)."""
    from transformers import Qwen3VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(_qwen3_vl_4b_config())
    n = check("Qwen3-VL-4B (transformers, published config)", model, 4.4e9)
    assert n == 4_437_815_808
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight  # tied: counted once


def test_qwen3_vl_4b_through_core_vlm():
    """AutoMoT's paper base through ``core.vlm``: ``VLMConfig`` with Qwen3-VL-4B's head_dim (128, not hidden /
    heads = 80), M-RoPE split, deepstack mergers and vision position grid builds exactly the published model."""
    from transformers import Qwen3VLForConditionalGeneration

    from core.vlm import VLMConfig, build_vlm

    sizes = VLMConfig(family="qwen3_vl", vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36,
                      num_heads=32, num_kv_heads=8, vision_depth=24, vision_hidden=1024, vision_intermediate=4096,
                      vision_heads=16, patch_size=16, merge_size=2, temporal_patch_size=2, max_positions=262144,
                      tie_word_embeddings=True, head_dim=128, mrope_section=[24, 20, 20],
                      deepstack_indexes=[5, 11, 17], vision_position_embeddings=2304)
    with torch.device("meta"):
        model = build_vlm(sizes)
        published = Qwen3VLForConditionalGeneration(_qwen3_vl_4b_config())
    n = check("Qwen3-VL-4B (core.vlm.build_vlm)", model, 4.4e9)
    assert n == count(published) == 4_437_815_808
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert ours == {k: tuple(v.shape) for k, v in published.state_dict().items()}  # the same tensors, by name
    assert len(model.model.visual.deepstack_merger_list) == 3
    text = model.config.text_config
    assert (text.head_dim, text.rope_scaling["mrope_section"]) == (128, [24, 20, 20])


# ------------------------------------------------------------------------------------------ video
def test_wan2_1_t2v_1_3b_published_config():
    """The workspace's video backbone family (diffusers' Wan classes) at Wan2.1-T2V-1.3B's size.

    The name's "1.3B" is rounded: the report's architecture table gives 1.419 B (module docstring), so the
    architecture is checked exactly and the count against 1.42 B.
    """
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        # Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json
        model = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
            text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6)
    c = model.config
    assert (c.num_attention_heads * c.attention_head_dim, c.num_layers, c.num_attention_heads, c.ffn_dim,
            c.text_dim, c.freq_dim) == (1536, 30, 12, 8960, 4096, 256)  # the Wan report's 1.3B row
    n = check("Wan2.1-T2V-1.3B (diffusers WanTransformer3DModel)", model, 1.42e9)
    assert n == 1_418_996_800
