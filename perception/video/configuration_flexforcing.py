"""Configuration of Flex-Forcing and its data (light: no torch import).

``FlexForcingConfig`` (``model`` group, schema ``flexforcing_schema``) sizes the video VAE (diffusers
``AutoencoderKLWan``) and the transformer (diffusers ``WanTransformer3DModel``, run chunk-causally by
``core.layers.wan.CausalWan``) or names a user's Wan folders, and says how the model is *trained*:

- ``chunking``: ``random`` (Flex-Forcing: a random partition of the clip into chunks every step, chunk-causal
  mask), ``one`` (the bidirectional-only baseline: one chunk, full attention) or ``singletons`` (the
  autoregressive-only baseline: frame-causal, Diffusion-Forcing style).
- ``noise``: ``per_chunk`` (every chunk its own noise level; Flex-Forcing and the AR baseline) or ``per_clip``
  (one level per clip; the bidirectional baseline).
- ``k_projection``: the zero-initialised projection of earlier chunks' keys, conditioned on the querying
  chunk's noise level (Flex-Forcing only).

``FlexVideoDataConfig`` (``data`` group, schema ``flexforcing_videos_schema``): the simulator clips
(``core.data.video_clips.VideoClipsConfig``: ``sim.render.videos``, rendered on first use) and the evaluation
protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.config import choice, schema
from core.data.video_clips import VideoClipsConfig, frame_hw
from core.errors import ConfigError

CHUNKINGS = ("random", "one", "singletons")
NOISES = ("per_chunk", "per_clip")
REGIMES = ("bidirectional", "autoregressive", "flex", "chunked")
ATTENTIONS = ("auto", "sdpa", "flex")
SINK_ROPES = ("relative", "absolute")
OBJECTIVES = ("diffusion", "self_forcing")


@schema("model", "flexforcing_schema")
@dataclass
class FlexForcingConfig:
    """Sizes and training regime of ``FlexForcingModel`` (Wan video VAE + chunk-causal Wan transformer).

    Frames are ``frame_size`` RGB (an int: square; ``[H, W]``: rectangular). The VAE (``AutoencoderKLWan``:
    ``vae_base_dim``, ``vae_dim_mult``, ``vae_num_res_blocks``, ``vae_temporal_downsample``) is causal in time:
    the first video frame is one latent frame, every ``r = 2 ** sum(vae_temporal_downsample)`` more frames one
    more; it downsamples space by ``2 ** (len(vae_dim_mult) - 1)`` to ``latent_channels`` channels. The
    transformer (``WanTransformer3DModel``: ``num_heads`` x ``head_dim`` wide, ``depth`` blocks, MLP ``ffn_dim``,
    ``patch`` x ``patch`` latent patches, text width ``text_dim``) sees ``num_frames`` *latent* frames per
    training window; ``attention`` picks the masked-pass kernel (``auto``: FlexAttention on CUDA, SDPA elsewhere).

    A user's weights: ``base_path`` is a Wan transformer folder or a diffusers pipeline folder (``transformer/``,
    and ``vae/`` used unless ``vae_path`` is set); ``vae_path`` a Wan VAE folder or an earlier run's stage-1
    ``vae``. They are only read; their diffusers configs are copied into ``transformer_config`` / ``vae_config``
    so a checkpoint of this model rebuilds without them. Set, those two configs override the sizes.

    Training noise: levels ``t`` ~ logit-normal(``t_mean``, ``t_std``) shifted by ``t_shift``. With probability
    ``context_prob`` a clip starts with 1..``max_context`` clean latent frames (t = 0, no loss): the conditioning
    frames of continuation and first-frame-conditioned generation. Random partitions (``chunking=random``)
    are one chunk with probability ``p_one_chunk``, singletons with ``p_singletons``, else random cut points.

    Stage 1 (no ``vae_path``): the VAE trains ``vae_pretrain_steps`` steps on batches of ``vae_batch_clips``
    clips of ``vae_clip_frames`` video frames from different source videos at random offsets, ``vae_crop`` px
    random crops (``core.layers.vae.FrameDiverseClips``; None = whole frames), its convolutions frame-local but
    for the resampling ones, decoding the posterior mean unless ``vae_sample_posterior``.
    Sampling defaults: ``sample_steps`` Euler steps on a grid shifted by ``sample_shift``; ``pyramid_levels``
    levels of the flex schedule (each halves every chunk of the previous one); ``sink_frames`` first latent frames
    kept in every context of a long video (attention sinks), their rotary positions ``sink_rope`` (``relative``:
    just before the recent context; ``absolute``: their own indices) — see ``pipeline_flexforcing``.

    ``objective``: ``diffusion`` (the flow-matching loss above: Flex-Forcing and the rigid baselines) or
    ``self_forcing`` (the Self-Forcing arm, ``perception.video.self_forcing``: AR self-rollout of each window
    scored by DMD against the frozen bidirectional teacher ``teacher_path``, a critic trained online, the student
    starting from ``init_path``; the generator updated every ``sf_gen_every`` steps, DMD / critic
    noise levels uniform in [``sf_t_min``, ``sf_t_max``]; ``sf_rollout_frames`` above the window's new frames:
    Self-Forcing++'s longer self-rollout, scored on a random window of it). ``init_path`` (any objective): a Flex-Forcing
    checkpoint whose weights (VAE, transformer, latent statistics) training starts from.
    """

    frame_size: Any = 32
    latent_channels: int = 8
    vae_base_dim: int = 16
    vae_dim_mult: list[int] = field(default_factory=lambda: [1, 2])
    vae_num_res_blocks: int = 1
    vae_temporal_downsample: list[bool] = field(default_factory=lambda: [True])
    vae_path: str | None = None
    vae_config: dict[str, Any] | None = None
    vae_pretrain_steps: int = 2400
    vae_pretrain_lr: float = 2.0e-3
    vae_batch_clips: int = 8
    vae_clip_frames: int = 5
    vae_crop: int | None = 16
    vae_sample_posterior: bool = False
    vae_kl_weight: float = 1.0e-6
    base_path: str | None = None
    transformer_config: dict[str, Any] | None = None
    patch: int = 4
    num_heads: int = 4
    head_dim: int = 48
    depth: int = 4
    ffn_dim: int = 768
    text_dim: int = 32
    freq_dim: int = 64
    attention: str = "auto"
    num_frames: int = 5
    chunking: str = "random"
    noise: str = "per_chunk"
    k_projection: bool = True
    p_one_chunk: float = 0.2
    p_singletons: float = 0.2
    context_prob: float = 0.5
    max_context: int = 2
    t_mean: float = 0.0
    t_std: float = 1.0
    t_shift: float = 1.0
    sample_steps: int = 8
    sample_shift: float = 1.0
    pyramid_levels: int = 4
    sink_frames: int = 0
    sink_rope: str = "relative"
    objective: str = "diffusion"
    init_path: str | None = None
    teacher_path: str | None = None
    sf_gen_every: int = 1
    sf_rollout_frames: int = 0
    sf_t_min: float = 0.02
    sf_t_max: float = 0.98

    def __post_init__(self):
        choice("model.chunking", self.chunking, CHUNKINGS)
        choice("model.noise", self.noise, NOISES)
        choice("model.attention", self.attention, ATTENTIONS)
        hw = self.frame_hw
        if not self.vae_dim_mult:
            raise ConfigError("model.vae_dim_mult must not be empty")
        if self.vae_config is None and len(self.vae_temporal_downsample) != len(self.vae_dim_mult) - 1:
            raise ConfigError(f"model.vae_temporal_downsample needs {len(self.vae_dim_mult) - 1} flags (one per "
                              f"downsampling level of vae_dim_mult={list(self.vae_dim_mult)}), got "
                              f"{list(self.vae_temporal_downsample)}")
        unit = self.vae_factor * self.patch
        if hw[0] % unit or hw[1] % unit:
            raise ConfigError(f"model.frame_size={list(hw)} must be a multiple of the VAE factor {self.vae_factor} x "
                              f"model.patch={self.patch}")
        if self.transformer_config is None and self.head_dim % 2:
            raise ConfigError(f"model.head_dim={self.head_dim} must be even (rotary pairs)")
        tc = self.transformer_config or {}
        width = int(tc.get("num_attention_heads", self.num_heads)) * int(tc.get("attention_head_dim", self.head_dim))
        patch = int((tc.get("patch_size") or (1, self.patch, self.patch))[1])
        token = int(tc.get("in_channels", self.latent_channels)) * patch * patch
        if width < token:
            # the patch embedding and read-out are (token -> width -> token): the velocity could only move the
            # latents inside a width-dim subspace of each token, and the rest of the initial noise would stay
            raise ConfigError(f"the transformer width {width} is below a token's {token} latent values "
                              f"(latent_channels x patch^2): samples would keep noise outside its span; widen "
                              "num_heads x head_dim or use a smaller patch")
        if self.num_frames < 2:
            raise ConfigError(f"model.num_frames must be >= 2, got {self.num_frames}")
        if not 0 <= self.max_context < self.num_frames:
            raise ConfigError(f"model.max_context must be in [0, num_frames), got {self.max_context}")
        for key in ("p_one_chunk", "p_singletons", "context_prob"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"model.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.p_one_chunk + self.p_singletons > 1.0:
            raise ConfigError("model.p_one_chunk + model.p_singletons must be <= 1")
        choice("model.sink_rope", self.sink_rope, SINK_ROPES)
        choice("model.objective", self.objective, OBJECTIVES)
        if self.objective == "self_forcing" and (self.sf_gen_every < 1 or not 0 < self.sf_t_min < self.sf_t_max < 1):
            raise ConfigError("model.sf_gen_every must be >= 1 and 0 < model.sf_t_min < model.sf_t_max < 1")
        if not 0 <= self.sink_frames < self.num_frames - 1:
            raise ConfigError(f"model.sink_frames must be in [0, num_frames - 1), got {self.sink_frames}")
        if self.sample_steps < 1 or self.pyramid_levels < 1:
            raise ConfigError("model.sample_steps and model.pyramid_levels must be >= 1")
        if self.k_projection and self.chunking == "one":
            raise ConfigError("model.k_projection acts on earlier chunks' keys; with chunking=one there are none")
        if (self.vae_clip_frames - 1) % self.temporal_factor:
            raise ConfigError(f"model.vae_clip_frames={self.vae_clip_frames} must be 1 + {self.temporal_factor} k "
                              "(the VAE encodes the first frame alone, then groups of its temporal factor)")

    @property
    def frame_hw(self) -> tuple[int, int]:
        """(H, W) of a frame."""
        return frame_hw(self.frame_size, "model.frame_size")

    @property
    def vae_factor(self) -> int:
        """Spatial compression of the VAE."""
        if self.vae_config is not None:
            return 2 ** (len(self.vae_config.get("dim_mult", [1, 2, 4, 4])) - 1) * int(
                self.vae_config.get("patch_size") or 1)
        return 2 ** (len(self.vae_dim_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        """Video frames per latent frame after the first (Wan2.1's VAE: 4)."""
        if self.vae_config is not None:
            levels = len(self.vae_config.get("dim_mult", [1, 2, 4, 4])) - 1
            flags = list(self.vae_config.get("temperal_downsample", [False, True, True]))[:levels]
            return 2 ** sum(bool(f) for f in flags)
        return 2 ** sum(bool(f) for f in self.vae_temporal_downsample)

    @property
    def latent_hw(self) -> tuple[int, int]:
        """(h, w) of a latent frame."""
        h, w = self.frame_hw
        return h // self.vae_factor, w // self.vae_factor

    @property
    def latent_size(self) -> int:
        """The latent side of square frames (``latent_hw`` for rectangular ones)."""
        h, w = self.latent_hw
        if h != w:
            raise ConfigError(f"frames are rectangular ({h} x {w} latents): use latent_hw")
        return h

    @property
    def video_frames(self) -> int:
        """Video frames of a training window (``1 + (num_frames - 1) r``)."""
        return 1 + (self.num_frames - 1) * self.temporal_factor

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim


@schema("data", "flexforcing_videos_schema")
@dataclass
class FlexVideoDataConfig(VideoClipsConfig):
    """Simulator clips for Flex-Forcing (the fields of ``VideoClipsConfig``), rendered on first use when ``root``
    is missing; ``size`` is an int or ``[H, W]``.

    Training reads ``model.num_frames``-frame windows (every ``window_step`` frames) of the ``train`` split;
    evaluation continues the first ``context`` frames of each ``test`` clip to ``eval_frames`` frames (the
    test clips are rendered ``test_frames`` long so drift can be measured against ground truth) in every
    regime of ``regimes``, ``max_test`` clips at most, on ``seeds``, with each count of ``sink_frames`` (0: the
    plain cache) and, for counts above 0, each of ``sink_ropes`` (see ``pipeline_flexforcing``).
    """

    window_step: int = 1
    context: int = 2
    eval_frames: int = 73
    regimes: list[str] = field(default_factory=lambda: ["bidirectional", "autoregressive", "flex"])
    max_test: int | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    batch_size: int = 24
    sink_frames: list[int] = field(default_factory=lambda: [0])
    sink_ropes: list[str] = field(default_factory=lambda: ["relative"])

    def __post_init__(self):
        for r in self.regimes:
            choice("data.regimes", r, REGIMES)
        super().__post_init__()
        if self.context < 1:
            raise ConfigError(f"data.context must be >= 1, got {self.context}")
        if not self.context < self.eval_frames <= self.test_frames:
            raise ConfigError(f"need data.context < data.eval_frames <= data.test_frames, got {self.context}, "
                              f"{self.eval_frames}, {self.test_frames}")
        for r in self.sink_ropes:
            choice("data.sink_ropes", r, SINK_ROPES)
        if not self.sink_frames or any(k < 0 for k in self.sink_frames):
            raise ConfigError(f"data.sink_frames must be a non-empty list of counts >= 0, got {self.sink_frames}")
        if self.window_step < 1 or self.batch_size < 1:
            raise ConfigError("data.window_step and data.batch_size must be >= 1")
