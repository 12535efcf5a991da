"""Configuration of TAGRPO and its baselines (light: no torch import).

Three groups of the config tree:

- ``algo`` (schema ``algo_schema``; ``configs/algo/{tagrpo,dancegrpo,tagrpo_indep,dancegrpo_same,
  tagrpo_reuse,mixgrpo}.yaml``): the post-training algorithm. ``embodied train tagrpo algo=dancegrpo`` picks an arm. A new
  root group of the tree (``RunConfig.algo``), as ``adapter`` is for adapters: any method that post-trains a
  generator by RL may use it.
- ``model`` (``tagrpo_model_schema``): the image-to-video policy, i.e. which pretrained video model (a
  Flex-Forcing checkpoint: its DiT conditioned on a clean first frame) and its sampler.
- ``data`` (``tagrpo_data_schema``): conditioning images (frames of the simulator's motion clips, whose next
  frames are the physically correct continuation: ``core.data.video_clips.VideoClipsConfig``, the clips
  Flex-Forcing trains on), held-out images, and the reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.config import choice, schema
from core.data.video_clips import VideoClipsConfig
from core.errors import ConfigError

LOSSES = ("contrastive", "grpo")
NOISES = ("same", "independent")
STEP_WEIGHTINGS = ("none", "balanced")


@schema("algo", "algo_schema")
@dataclass
class AlgoConfig:
    """One post-training arm.

    - ``loss``: ``contrastive`` (TAGRPO: the clipped GRPO term on a rollout's own next latent plus
      ``contrast_weight`` x the same clipped term on every other target's next latent, weighted by that target's
      advantage: the policy's predicted latent moves towards high-reward trajectories and away from low-reward
      ones) or ``grpo`` (DanceGRPO / Flow-GRPO: the own term only).
    - ``noise``: ``same`` (every rollout of a group starts from the image's initial noise; TAGRPO's observation)
      or ``independent`` (a fresh initial noise per rollout; DanceGRPO).
    - ``group_size`` rollouts per conditioning image (G); ``fresh_per_group`` of them are sampled anew each
      iteration (``None`` = all), the rest are taken from the memory bank (rollout reuse).
    - ``bank_size``: capacity of the FIFO memory bank of past rollouts (0 = no bank); with ``bank_targets`` the
      bank's rollouts of the same image and noise also serve as positives / negatives of the contrastive loss.
    - ``clip_range``: PPO clip of the ratio (log-probabilities are per-element means, as in Flow-GRPO);
      ``adv_clip``: advantages are clipped to +- this.
    - ``eta``: noise scale of the SDE sampler (``core.diffusion.sde_step``).
    - ``updates_per_iteration``: the trained sampling steps are split into this many chunks, one optimizer
      step each (the ratio is exactly 1 in the first chunk); ``timestep_fraction`` of the steps are trained.
    - ``step_weighting``: ``none`` (every trained sampling step's loss counts once) or ``balanced`` (step ``i``'s
      loss is scaled by ``w_i`` proportional to ``1 / c_i`` and averaging 1, with ``c_i`` the size of its
      policy-gradient coefficient on the velocity, ``grpo.step_coefficients``: on a shifted grid ``c_i`` shrinks towards the noise end and grows
      towards the data end, and balancing gives every step the same expected gradient scale).
    - ``sde_window`` (MixGRPO, Li et al. 2025): ``None`` samples every step with the SDE and trains all of them
      (``timestep_fraction`` of them). ``W`` (1..steps) samples only the ``W`` steps of a window with the SDE and
      the others with the deterministic Euler ODE, and trains only the window's steps, so an iteration's update
      costs ``W / steps`` of the full one. The window starts at the highest-noise step and moves by
      ``window_stride`` steps towards the data end every ``window_shift_every`` iterations, then stays at the last
      ``W`` steps (MixGRPO's sliding window with shift interval ``tau`` and stride ``s``).
    """

    name: str = "tagrpo"
    loss: str = "contrastive"
    noise: str = "same"
    group_size: int = 8
    fresh_per_group: int | None = None
    bank_size: int = 256
    bank_targets: bool = True
    contrast_weight: float = 1.0
    clip_range: float = 1.0e-3
    adv_clip: float = 5.0
    eta: float = 0.3
    updates_per_iteration: int = 2
    timestep_fraction: float = 1.0
    step_weighting: str = "none"
    sde_window: int | None = None
    window_shift_every: int = 4
    window_stride: int = 1

    def __post_init__(self) -> None:
        choice("algo.loss", self.loss, LOSSES)
        choice("algo.step_weighting", self.step_weighting, STEP_WEIGHTINGS)
        choice("algo.noise", self.noise, NOISES)
        if self.group_size < 2:
            raise ConfigError(f"algo.group_size must be >= 2 (advantages are normalised in the group), got "
                              f"{self.group_size}")
        if self.fresh_per_group is not None and not 1 <= self.fresh_per_group <= self.group_size:
            raise ConfigError(f"algo.fresh_per_group must be in [1, group_size={self.group_size}], got "
                              f"{self.fresh_per_group}")
        if self.fresh_per_group is not None and self.fresh_per_group < self.group_size and self.bank_size < 1:
            raise ConfigError("algo.fresh_per_group < group_size reuses banked rollouts: set algo.bank_size >= 1")
        if self.bank_size < 0 or self.contrast_weight < 0 or self.clip_range <= 0 or self.adv_clip <= 0:
            raise ConfigError("algo.bank_size, algo.contrast_weight must be >= 0 and algo.clip_range, "
                              "algo.adv_clip > 0")
        if self.eta <= 0:
            raise ConfigError(f"algo.eta must be > 0 (the SDE sampler's log-probabilities need noise), got "
                              f"{self.eta}")
        if self.updates_per_iteration < 1 or not 0 < self.timestep_fraction <= 1:
            raise ConfigError("algo.updates_per_iteration must be >= 1 and algo.timestep_fraction in (0, 1]")
        if self.sde_window is not None:
            if self.sde_window < 1:
                raise ConfigError(f"algo.sde_window must be >= 1 (or null: SDE on every step), got {self.sde_window}")
            if self.timestep_fraction < 1:
                raise ConfigError("algo.sde_window trains the window's steps: leave algo.timestep_fraction at 1")
        if self.window_shift_every < 1 or self.window_stride < 0:
            raise ConfigError("algo.window_shift_every must be >= 1 and algo.window_stride >= 0")

    @property
    def fresh(self) -> int:
        return self.group_size if self.fresh_per_group is None else self.fresh_per_group

    def window(self, iteration: int, steps: int) -> list[int]:
        """The sampling steps (of ``steps``) that iteration ``iteration`` samples with the SDE and trains: all of
        them without ``sde_window``; else ``W`` consecutive steps from ``min(iteration // window_shift_every *
        window_stride, steps - W)`` (step 0 is the noise end)."""
        if self.sde_window is None:
            return list(range(steps))
        if self.sde_window > steps:
            raise ConfigError(f"algo.sde_window={self.sde_window} exceeds the {steps} sampling steps")
        start = min(iteration // self.window_shift_every * self.window_stride, steps - self.sde_window)
        return list(range(start, start + self.sde_window))


@schema("model", "tagrpo_model_schema")
@dataclass
class TAGRPOModelConfig:
    """The image-to-video policy.

    ``base_path``: the pretrained video model whose DiT is post-trained (the VAE stays frozen):

    - a Flex-Forcing checkpoint folder (causal Wan VAE + chunk-causal Wan transformer trained with clean-context
      prefixes, so it continues a given first frame), or another TAGRPO policy folder;
    - or a user's Wan diffusers folder: a pipeline folder (``model_index.json`` naming a Wan pipeline,
      ``transformer/`` and ``vae/``) or a ``WanTransformer3DModel`` folder. The Flex-Forcing model class is then
      built around it through the registry with ``frame_size`` (None: the data's frame size) and
      ``k_projection`` (False: the first frame sits inline, with full attention, as in Wan2.2-TI2V; True: it is its
      own earlier chunk and the zero-initialised K-projection is added). ``vae_path``: a Wan VAE folder for a
      transformer-only folder (a pipeline folder's ``vae/`` is used otherwise). The folders are only read.

    ``frames``: *latent* frames of a rollout, the conditioning frame's latent included (default the base's training
    window); the video has ``1 + (frames - 1) r`` frames for the VAE's temporal factor ``r``.
    ``sample_steps`` / ``sample_shift``: the sampling grid of rollouts (SDE) and evaluation (ODE).
    """

    base_path: str = "assets/checkpoints/flexforcing"
    frames: int | None = None
    sample_steps: int = 8
    sample_shift: float = 1.0
    frame_size: Any = None
    k_projection: bool = False
    vae_path: str | None = None

    def __post_init__(self) -> None:
        if self.frames is not None and self.frames < 2:
            raise ConfigError(f"model.frames must be >= 2 (first frame + at least one new), got {self.frames}")
        if self.sample_steps < 1 or self.sample_shift <= 0:
            raise ConfigError("model.sample_steps must be >= 1 and model.sample_shift > 0")


@schema("data", "tagrpo_data_schema")
@dataclass
class TAGRPODataConfig(VideoClipsConfig):
    """Conditioning images and rewards.

    Training images: ``train_images`` windows drawn (seed ``pool_seed``) from the simulator clips under ``root``
    (the fields of ``VideoClipsConfig``, rendered on first use with ``render_*``): the window's first frame is
    the condition, its frames are the physically correct continuation the rewards compare with.
    ``images_per_iteration`` images per iteration, G rollouts each. Held-out: the first frames of the
    ``heldout_images`` clips under ``test_root`` (other seed, other scenes; by default TAGRPO's own held-out
    folder, rendered shorter than Flex-Forcing's), sampled with the ODE at ``eval_seed``'s fixed noise every
    ``eval_every`` iterations. ``size`` is square (an int). ``rewards``: name -> weight
    (``perception.i2v_rl.rewards.REWARDS``).
    """

    size: int = 32
    test_root: str = "outputs/datasets/videos_flex_test"
    test_frames: int = 66
    train_images: int = 32
    pool_seed: int = 0
    images_per_iteration: int = 2
    heldout_images: int = 24
    eval_every: int = 5
    eval_seed: int = 0
    rewards: dict[str, float] = field(default_factory=lambda: {"psnr": 1.0})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train_images < 1 or self.images_per_iteration < 1 or self.heldout_images < 1:
            raise ConfigError("data.train_images, data.images_per_iteration and data.heldout_images must be >= 1")
        if self.heldout_images > self.test_n:
            raise ConfigError(f"data.heldout_images={self.heldout_images} exceeds data.test_n={self.test_n}")
        if self.eval_every < 1:
            raise ConfigError(f"data.eval_every must be >= 1, got {self.eval_every}")
        if not self.rewards:
            raise ConfigError("data.rewards must name at least one reward")
