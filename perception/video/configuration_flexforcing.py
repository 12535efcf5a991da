"""Configuration of Flex-Forcing and its data (light: no torch import).

``FlexForcingConfig`` (``model`` group, schema ``flexforcing_schema``) sizes the per-frame VAE and the latent
video DiT and says how the model is *trained*:

- ``chunking``: ``random`` (Flex-Forcing: a random partition of the clip into chunks every step, chunk-causal
  mask), ``one`` (the bidirectional-only baseline: one chunk, full attention) or ``singletons`` (the
  autoregressive-only baseline: frame-causal, Diffusion-Forcing style).
- ``noise``: ``per_chunk`` (every chunk its own noise level; Flex-Forcing and the AR baseline) or ``per_clip``
  (one level per clip; the bidirectional baseline).
- ``k_projection``: the zero-initialised projection of earlier chunks' keys, conditioned on the querying
  chunk's noise level (Flex-Forcing only).

``VideoDataConfig`` (``data`` group, schema ``flexforcing_videos_schema``): the simulator clips
(``sim.render.videos``, rendered on first use) and the evaluation protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import choice, schema
from core.errors import ConfigError

CHUNKINGS = ("random", "one", "singletons")
NOISES = ("per_chunk", "per_clip")
REGIMES = ("bidirectional", "autoregressive", "flex", "chunked")


@schema("model", "flexforcing_schema")
@dataclass
class FlexForcingConfig:
    """Sizes and training regime of ``FlexForcingModel`` (per-frame VAE + latent video DiT).

    Frames are ``frame_size`` square RGB; the VAE (diffusers ``AutoencoderKL``, ``vae_channels`` blocks)
    downsamples them by ``2 ** (len(vae_channels) - 1)`` to ``latent_channels`` channels; the DiT patchifies
    latents by ``patch`` and runs ``depth`` adaLN-Zero blocks of width ``dim`` with 3-D rotary positions.
    ``num_frames`` is the training clip length (latent frames = video frames: the VAE is per frame).

    Training noise: levels ``t`` ~ logit-normal(``t_mean``, ``t_std``) shifted by ``t_shift``. With probability
    ``context_prob`` a clip starts with 1..``max_context`` clean frames (t = 0, no loss): the conditioning
    frames of continuation and first-frame-conditioned generation. Random partitions (``chunking=random``)
    are one chunk with probability ``p_one_chunk``, singletons with ``p_singletons``, else random cut points.

    Stage 1 (no ``vae_path``): the VAE trains ``vae_pretrain_steps`` steps on batches of ``vae_batch_frames``
    frames (whole clips), decoding the posterior mean unless ``vae_sample_posterior`` (see
    ``core.layers.vae.AutoencoderTrainer``). Sampling defaults: ``sample_steps`` Euler steps on a grid shifted by ``sample_shift``; ``pyramid_levels``
    levels of the flex schedule (each halves every chunk of the previous one).
    """

    frame_size: int = 32
    latent_channels: int = 4
    vae_channels: list[int] = field(default_factory=lambda: [32, 64, 64])
    vae_layers_per_block: int = 1
    vae_norm_groups: int = 8
    vae_path: str | None = None
    vae_pretrain_steps: int = 1200
    vae_pretrain_lr: float = 5.0e-4
    vae_batch_frames: int = 32
    vae_sample_posterior: bool = False
    vae_kl_weight: float = 1.0e-6
    patch: int = 2
    dim: int = 128
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0
    num_frames: int = 8
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

    def __post_init__(self):
        choice("model.chunking", self.chunking, CHUNKINGS)
        choice("model.noise", self.noise, NOISES)
        if not self.vae_channels:
            raise ConfigError("model.vae_channels must not be empty")
        factor = 2 ** (len(self.vae_channels) - 1)
        if self.frame_size % (factor * self.patch):
            raise ConfigError(f"model.frame_size={self.frame_size} must be a multiple of the VAE factor {factor} x "
                              f"model.patch={self.patch}")
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 2:
            raise ConfigError(f"model.dim={self.dim} must split into num_heads={self.num_heads} heads of even width")
        if self.num_frames < 2:
            raise ConfigError(f"model.num_frames must be >= 2, got {self.num_frames}")
        if not 0 <= self.max_context < self.num_frames:
            raise ConfigError(f"model.max_context must be in [0, num_frames), got {self.max_context}")
        for key in ("p_one_chunk", "p_singletons", "context_prob"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"model.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.p_one_chunk + self.p_singletons > 1.0:
            raise ConfigError("model.p_one_chunk + model.p_singletons must be <= 1")
        if self.sample_steps < 1 or self.pyramid_levels < 1:
            raise ConfigError("model.sample_steps and model.pyramid_levels must be >= 1")
        if self.k_projection and self.chunking == "one":
            raise ConfigError("model.k_projection acts on earlier chunks' keys; with chunking=one there are none")

    @property
    def vae_factor(self) -> int:
        return 2 ** (len(self.vae_channels) - 1)

    @property
    def latent_size(self) -> int:
        return self.frame_size // self.vae_factor


@schema("data", "flexforcing_videos_schema")
@dataclass
class FlexVideoDataConfig:
    """Simulator clips for Flex-Forcing (``sim.render.videos``), rendered on first use when ``root`` is missing.

    Training reads ``model.num_frames``-frame windows (every ``window_step`` frames) of the ``train`` split;
    evaluation continues the first ``context`` frames of each ``test`` clip to ``eval_frames`` frames (the
    test clips are rendered ``test_frames`` long so drift can be measured against ground truth) in every
    regime of ``regimes``, ``max_test`` clips at most, on ``seeds``.
    """

    root: str = "outputs/datasets/videos_flex"
    size: int = 32
    render_n: int = 240
    render_frames: int = 24
    render_seed: int = 0
    test_root: str = "outputs/datasets/videos_flex_test"
    test_n: int = 24
    test_frames: int = 66
    test_seed: int = 5000
    window_step: int = 2
    context: int = 2
    eval_frames: int = 66
    regimes: list[str] = field(default_factory=lambda: ["bidirectional", "autoregressive", "flex"])
    max_test: int | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    batch_size: int = 24

    def __post_init__(self):
        for r in self.regimes:
            choice("data.regimes", r, REGIMES)
        if self.size < 8 or self.size % 2:
            raise ConfigError(f"data.size must be even and >= 8, got {self.size}")
        if self.render_n < 2 or self.test_n < 1:
            raise ConfigError("data.render_n must be >= 2 and data.test_n >= 1")
        if self.context < 1:
            raise ConfigError(f"data.context must be >= 1, got {self.context}")
        if not self.context < self.eval_frames <= self.test_frames:
            raise ConfigError(f"need data.context < data.eval_frames <= data.test_frames, got {self.context}, "
                              f"{self.eval_frames}, {self.test_frames}")
        if self.window_step < 1 or self.batch_size < 1:
            raise ConfigError("data.window_step and data.batch_size must be >= 1")
