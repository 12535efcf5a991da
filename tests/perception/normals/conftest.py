"""Fixtures of the TransNormal tests: a tiny config and a tiny rendered dataset (session-wide)."""

from __future__ import annotations

import pytest

from perception.normals.configuration_transnormal import TransNormalConfig


def tiny_config(**overrides) -> TransNormalConfig:
    """A model that runs in well under a second on CPU: 2-level UNet (16/32), VAE factor 2, 1-layer DINOv3."""
    base = dict(
        image_size=32, block_out_channels=[16, 32], down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
        up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"], layers_per_block=1, attention_head_dim=[8],
        cross_attention_dim=16, norm_num_groups=8, vae_block_out_channels=[8, 16], vae_layers_per_block=1,
        vae_norm_num_groups=8, scaling_factor=1.0, dino_model="vit_small_patch16_dinov3",
        dino_kwargs={"embed_dim": 16, "depth": 1, "num_heads": 2},
    )
    base.update(overrides)
    return TransNormalConfig(**base)


@pytest.fixture
def tiny():
    return tiny_config


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """4 path-traced close-up views (3 train, 1 test) at 32 px, 4 spp, real HDR light (the default experiment's
    source and framing): seconds to make."""
    from sim.render.normals import make_dataset

    root = tmp_path_factory.mktemp("transnormal_data") / "normals"
    make_dataset(root, n=4, seed=3, size=32, spp=4, test_fraction=0.25, source="real", framing="closeup")
    return root
