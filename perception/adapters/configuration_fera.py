"""Configuration of the FeRA experiment (light: no torch import).

Three groups of the config tree:

- ``adapter`` (schema ``adapter_schema``; ``configs/adapter/{fera,fera_norouter,fera_nofecl,lora,dora}.yaml``):
  which adapter fine-tunes the base model. ``embodied train fera adapter=lora`` picks an arm. A new root group
  of the tree (``RunConfig.adapter``): any method may adapt a model with it; FeRA's experiment is the first.
- ``model`` (``fera_model_schema``; ``configs/model/fera_{unet,dit}{,_tiny}.yaml``): the diffusers backbone of
  the small pixel-space flow-matching model, and how its base is pretrained on the source domain.
- ``data`` (``fera_data_schema``): source domain (simulator motion-clip frames) and target domain (crops of
  real videos), few-shot sizes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from core.config import choice, schema
from core.errors import ConfigError

ATTENTION_PROJECTIONS = ["to_q", "to_k", "to_v", "to_out.0"]


@schema("adapter", "adapter_schema")
@dataclass
class AdapterConfig:
    """An adapter arm. FeRA fields are ignored by peft's ``lora`` / ``dora``, which use ``rank`` as their rank,
    and by peft's ``fourierft`` / ``waveft`` (a trained sparse spectrum of ``n_frequency`` Fourier / wavelet
    coefficients per layer, transformed to the update ``delta W``, zero at init like every other arm's;
    ``n_frequency`` None: ``rank * (in + out)`` per layer, a rank-``rank`` LoRA's count, so the arms compare at
    equal trainable parameters (at most ``in * out``: a layer too small for it gets a dense spectrum);
    ``spectrum_scaling`` None: peft's default, 150 / 25). ``routing="xlora"``: FeRA's experts routed as X-LoRA routes them
    (``perception.adapters.fera``), its classifier reading the base's last hidden state."""

    name: str = "fera"  # the arm's name (fera, fera_norouter, ...): names its output folder
    kind: str = "fera"  # fera | lora | dora | fourierft | waveft
    rank: int = 4  # per expert for FeRA; the adapter's rank for LoRA / DoRA; sets n_frequency's default
    alpha: float | None = None  # scale numerator; None -> rank (scale 1)
    target_modules: list[str] = field(default_factory=lambda: list(ATTENTION_PROJECTIONS))
    num_experts: int = 3
    num_bands: int = 3
    kappa: float | None = None  # None -> min(H, W) / kappa_divisor
    kappa_divisor: float = 128.0  # the paper's; sub-pixel on a 32 px latent (experiment/fera.yaml sets 32)
    finest_band: str = "keep"
    router_hidden: int = 64
    temperature: float = 0.7
    routing: str = "soft"  # soft | uniform (ablation: no router) | xlora (X-LoRA's classifier on the hidden state)
    xlora_hidden: str = "auto"  # xlora: the module whose input is the last hidden state (auto: norm_out /
    # conv_norm_out)
    fecl_weight: float = 0.1  # 0: ablation without FECL (and no base pass)
    n_frequency: int | None = None  # fourierft / waveft: coefficients per layer (None: rank * (in + out))
    spectrum_scaling: float | None = None  # fourierft / waveft: peft's ``scaling`` (None: 150 / 25, peft's)
    wavelet_family: str = "db1"  # waveft

    def __post_init__(self) -> None:
        choice("adapter.kind", self.kind, ("fera", "lora", "dora", "fourierft", "waveft"))
        choice("adapter.routing", self.routing, ("soft", "uniform", "xlora"))
        if self.n_frequency is not None and self.n_frequency < 1:
            raise ConfigError(f"adapter.n_frequency must be >= 1, got {self.n_frequency}")
        choice("adapter.finest_band", self.finest_band, ("keep", "drop"))
        if self.rank < 1 or self.num_experts < 1:
            raise ConfigError(f"adapter.rank and adapter.num_experts must be >= 1, got {self.rank}, "
                              f"{self.num_experts}")
        if self.fecl_weight < 0:
            raise ConfigError(f"adapter.fecl_weight must be >= 0, got {self.fecl_weight}")

    def fera_config(self):
        """The library's ``FeRAConfig`` (only for ``kind == "fera"``)."""
        from perception.adapters.fera import FeRAConfig

        return FeRAConfig(target_modules=list(self.target_modules), num_experts=self.num_experts, rank=self.rank,
                          alpha=self.alpha, num_bands=self.num_bands, kappa=self.kappa,
                          kappa_divisor=self.kappa_divisor,
                          finest_band=self.finest_band, router_hidden=self.router_hidden,
                          temperature=self.temperature, routing=self.routing, fecl_weight=self.fecl_weight,
                          xlora_hidden=self.xlora_hidden)

    def peft_config(self, layers: dict[str, tuple[int, int]]):
        """peft's config of a ``lora`` / ``dora`` / ``fourierft`` / ``waveft`` arm on ``layers`` (qualified name ->
        (in, out) features of each adapted linear)."""
        if self.kind in ("lora", "dora"):
            from core.layers.lora import lora_config

            return lora_config(layers, self.rank, self.alpha, use_dora=self.kind == "dora")
        if self.n_frequency is not None:
            small = [n for n, (i, o) in layers.items() if self.n_frequency > i * o]
            if small:
                raise ConfigError(f"adapter.n_frequency {self.n_frequency} > the entries of {small[0]} "
                                  f"({layers[small[0]][0]} x {layers[small[0]][1]})")
        # the default: LoRA rank ``rank``'s count, at most every entry of the layer (a dense update)
        counts = {n: self.n_frequency or min(self.rank * (i + o), i * o) for n, (i, o) in layers.items()}
        top = max(counts.values())
        common = {"target_modules": sorted(layers), "n_frequency": top, "init_weights": True,
                  # peft matches a pattern key as a name suffix (fourierft: ".*\.KEY$"; waveft: "(.*\.)?(KEY)$");
                  # "(?!)|^NAME" matches the whole qualified name alone under both
                  "n_frequency_pattern": {f"(?!)|^{re.escape(n)}": c for n, c in counts.items() if c != top}}
        if self.spectrum_scaling is not None:
            common["scaling"] = self.spectrum_scaling
        if self.kind == "fourierft":
            from peft import FourierFTConfig

            return FourierFTConfig(**common)
        from peft import WaveFTConfig

        return WaveFTConfig(wavelet_family=self.wavelet_family, **common)


KINDS = ("unet", "dit")


@dataclass
class BackboneConfig:
    """Size of a pixel-space flow-matching denoiser (``perception.adapters.backbones`` builds it; its docstring
    has the layout).

    Common: ``kind`` (``"unet"`` or ``"dit"``), square ``image_size`` px, ``channels`` image channels.
    UNet: one level per ``block_out_channels`` entry (each but the last halves the resolution),
    ``layers_per_block`` resnets per level, heads of ``attention_head_dim`` channels, a null context of width
    ``cross_attention_dim``, GroupNorm with ``norm_num_groups`` groups; ``attention_levels`` says which levels'
    down / up blocks have (self + cross) attention (``None``: every level but the lowest, as Stable Diffusion;
    the mid block always has it). DiT: ``dit_layers`` blocks of ``dit_heads`` heads of ``dit_head_dim``
    channels on ``patch_size`` patches.
    """

    kind: str = "unet"
    image_size: int = 32
    channels: int = 3
    block_out_channels: list[int] = field(default_factory=lambda: [32, 64])
    layers_per_block: int = 1
    attention_head_dim: int = 8
    cross_attention_dim: int = 32
    context_tokens: int = 4
    norm_num_groups: int = 8
    attention_levels: list[bool] | None = None
    dit_layers: int = 4
    dit_heads: int = 4
    dit_head_dim: int = 16
    patch_size: int = 2

    def __post_init__(self):
        choice("backbone.kind", self.kind, KINDS)
        for key in ("image_size", "channels", "layers_per_block", "attention_head_dim", "cross_attention_dim",
                    "context_tokens", "norm_num_groups", "dit_layers", "dit_heads", "dit_head_dim", "patch_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"backbone.{key} must be an integer >= 1, got {value!r}")
        if self.kind == "unet":
            self._check_unet()
        elif self.image_size % self.patch_size:
            raise ConfigError(f"backbone.image_size={self.image_size} must be a multiple of "
                              f"backbone.patch_size={self.patch_size}")

    def _check_unet(self) -> None:
        chans = list(self.block_out_channels)
        if not chans or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in chans):
            raise ConfigError(f"backbone.block_out_channels must be a non-empty list of ints >= 1, got {chans}")
        for c in chans:
            if c % self.norm_num_groups or c % self.attention_head_dim:
                raise ConfigError(f"backbone.block_out_channels entry {c} must be a multiple of "
                                  f"norm_num_groups={self.norm_num_groups} and "
                                  f"attention_head_dim={self.attention_head_dim}")
        factor = 2 ** (len(chans) - 1)
        if self.image_size % factor:
            raise ConfigError(f"backbone.image_size={self.image_size} must be a multiple of {factor} "
                              f"({len(chans)} UNet levels)")
        levels = self.attention_levels
        if levels is not None and len(levels) != len(chans):
            raise ConfigError(f"backbone.attention_levels needs one entry per block_out_channels level "
                              f"({len(chans)}), got {len(levels)}")

    @property
    def unet_attention_levels(self) -> list[bool]:
        """Per UNet level (outermost first): whether its down / up blocks have attention."""
        if self.attention_levels is not None:
            return [bool(a) for a in self.attention_levels]
        return [i < len(self.block_out_channels) - 1 for i in range(len(self.block_out_channels))]


OBJECTIVES = ("auto", "flow", "epsilon", "v_prediction")
BASE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class LatentSettings:
    """How a diffusers base is run in its latent space (``perception.adapters.latent``; ignored for a pixel base):
    the shots' resolution and clip length, the objective, the fixed text conditioning, the DiT class, the dtype,
    and the sampler's steps."""

    image_size: int = 32
    frames: int = 1
    objective: str = "auto"
    flow_shift: float | None = None
    prompt: str = ""
    prompt_embeds: str = ""
    prompt_tokens: int = 77
    class_label: int | None = None
    base_dtype: str = "float32"
    sample_steps: int = 20


@schema("model", "fera_model_schema")
@dataclass
class FeRAModelConfig(LatentSettings, BackboneConfig):
    """The base FeRA adapts: a user's diffusers model in its latent space, or the workspace's pixel-space base.

    ``base_path``: the base, opened read-only and never written: a diffusers pipeline folder (``model_index.json``
    with ``unet/`` or ``transformer/`` and ``vae/``) or model folder (``UNet2DConditionModel``, DiT
    ``DiTTransformer2DModel`` / ``Transformer2DModel``, ``WanTransformer3DModel``), with its VAE folder in
    ``vae_path`` (empty: the pipeline's ``vae/``) -- see ``perception.adapters.latent``; or an exported pixel
    base (``FlowDenoiser.save_pretrained``) or a finished base run of this workspace. Empty: the pixel base is
    pretrained on the source domain into ``pretrain_dir`` (empty: ``<out_dir>/base``).

    Latent bases: ``image_size`` is the pixel resolution the shots are encoded at (``frames`` frames per clip
    for Wan, ``1 + 4 k``); ``objective`` (auto: the pipeline's scheduler), ``flow_shift``; the fixed text
    conditioning (``prompt`` through the pipeline's text encoder when it has one, else ``prompt_embeds`` (a
    ``.safetensors`` file), else a fixed Gaussian embedding of ``prompt_tokens`` tokens); ``class_label`` of a
    DiT (None: the null class); ``base_dtype`` of the base and its VAE. The pixel backbone's sizes
    (``BackboneConfig``) are then unused.
    """

    base_path: str = ""
    vae_path: str = ""
    pretrain_dir: str = ""  # the pixel base's pretraining run (empty: <out_dir>/base); never base_path
    pretrain_steps: int = 1500
    pretrain_lr: float = 1.0e-3
    pretrain_batch: int = 32
    # image_size, frames, objective, flow_shift, prompt, prompt_embeds, prompt_tokens, class_label, base_dtype and
    # sample_steps come from LatentSettings (the part an adapted model keeps, ``latent()``)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pretrain_steps < 0 or self.sample_steps < 1:
            raise ConfigError("model.pretrain_steps must be >= 0 and model.sample_steps >= 1")
        choice("model.objective", self.objective, OBJECTIVES)
        choice("model.base_dtype", self.base_dtype, BASE_DTYPES)
        if self.frames < 1 or self.prompt_tokens < 1:
            raise ConfigError(f"model.frames and model.prompt_tokens must be >= 1, got {self.frames}, "
                              f"{self.prompt_tokens}")

    def backbone(self) -> BackboneConfig:
        """Just the architecture (what a base checkpoint must match)."""
        return BackboneConfig(**{f.name: getattr(self, f.name) for f in fields(BackboneConfig)})

    def latent(self) -> LatentSettings:
        """The latent-space settings the adapted model keeps (``AdaptedDenoiserConfig.latent``)."""
        return LatentSettings(**{f.name: getattr(self, f.name) for f in fields(LatentSettings)})


@schema("data", "fera_data_schema")
@dataclass
class FeRADataConfig:
    """Source: frames of the simulator motion clips (rendered on first use). Target: crops of real videos
    (``bikes.mp4``, ``vtest.avi``): ``shots`` training crops from their first 60 %, ``test_n`` held-out crops
    from their last 30 %."""

    source_root: str = "outputs/datasets/fera_source"  # frames rendered into <source_root>/<size>px
    source_clips: int = 48
    source_frames: int = 16
    shots: int = 64
    test_n: int = 256
    seed: int = 0
    flip: bool = True
    levels: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])
    eval_every: int = 100  # held-out loss by noise level during training (the curve); 0: only at the end
    curve_n: int = 128  # held-out crops used for the curve
    fd_samples: int = 256  # samples drawn for FD at evaluation

    def __post_init__(self) -> None:
        if self.shots < 1 or self.test_n < 2:
            raise ConfigError(f"data.shots must be >= 1 and data.test_n >= 2, got {self.shots}, {self.test_n}")
        if not self.levels or any(not 0 < t <= 1 for t in self.levels):
            raise ConfigError(f"data.levels must be noise levels in (0, 1], got {self.levels}")


@dataclass
class AdaptedDenoiserConfig:
    """The model of ``embodied train fera`` (``perception.adapters.modeling_fera.AdaptedDenoiser``): one adapter
    arm on a frozen base denoiser.

    ``base_path``: the base, referenced and opened read-only: a diffusers pipeline / model folder (adapted in its
    latent space, VAE in ``vae_path`` or the pipeline's ``vae/``; ``latent`` holds how), a
    ``FlowDenoiser.save_pretrained`` folder, or the pixel base's training run folder.
    ``adapter``: the arm (FeRA, its ablations, peft LoRA / DoRA) with its hyperparameters.
    """

    base_path: str = ""
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    vae_path: str = ""
    latent: LatentSettings = field(default_factory=lambda: LatentSettings())


