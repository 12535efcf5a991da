"""Configuration of LAC-WM, its baseline EAC-WM, their adaptation and their data (light: no torch import).

Paper values (reference encoder V-JEPA2, 64-d continuous latent, 8-frame imagined rollouts) are the
defaults where the project's scale allows; sizes are small because everything trains on CPU here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import schema
from core.errors import ConfigError

_TARGET_CHOICES = ("q", "k", "v", "proj", "fc1", "fc2")


@dataclass
class AdaptConfig:
    """Adapting a pretrained model to a held-out embodiment from a few demonstrations.

    LAC-WM (spec): stage 1 LoRA on IDM + FDM with the LAC loss; stage 2 the action projector a -> z with
    the FDM frozen; stage 3 projector + LoRA jointly. EAC-WM: a new action encoder + LoRA on the FDM in one
    stage (its total steps equal LAC's three stages). Scratch: the same inference model (action encoder +
    FDM) from random init, every weight trained, the same total steps.
    """

    stage_steps: list[int] = field(default_factory=lambda: [200, 200, 200])
    lora_rank: int = 4
    lora_targets: list[str] = field(default_factory=lambda: ["q", "k", "v", "proj"])
    projector_hidden: int = 128
    align_weight: float = 1.0  # ||P(a) - sg(IDM(x_t, x_t+1))||^2 in stages 2 and 3
    lr: float = 1e-3
    batch_size: int = 16

    def __post_init__(self):
        if len(self.stage_steps) != 3 or any(s < 0 for s in self.stage_steps) or sum(self.stage_steps) < 1:
            raise ConfigError(f"model.adapt.stage_steps must be 3 non-negative counts, got {list(self.stage_steps)}")
        if self.lora_rank < 1:
            raise ConfigError(f"model.adapt.lora_rank must be >= 1, got {self.lora_rank}")
        bad = [t for t in self.lora_targets if t not in _TARGET_CHOICES]
        if bad:
            raise ConfigError(f"model.adapt.lora_targets: unknown {bad}; choose from {list(_TARGET_CHOICES)}")


@schema("model", "lacwm_schema")
@dataclass
class LACWMConfig:
    """Sizes of the frame tokenizer, IDM, FDM and motion decoder of LAC-WM.

    Frames are square RGB images of ``image_size`` px cut into ``patch_size`` patches (the built-in frame
    encoder is the pixel-patch space; see ``modeling_lacwm.PatchCodec``). ``context`` is the number of
    transitions the FDM sees at once; ``temporal_attention`` adds causal attention across them (zero-init,
    so it can be switched on late in training from a checkpoint trained without it).
    ``action_dims`` (embodiment -> explicit action dim per transition) and ``projectors`` (embodiment ->
    action dim of an adaptation projector) are filled from the data; ``lora_rank`` > 0 builds the model
    with LoRA adapters in place (an adapted checkpoint).
    """

    conditioning: str = "latent"  # latent (LAC-WM) | explicit (EAC-WM)
    encoder: str = "conv"  # IDM frame encoder: "pixels" (patch space), "conv" (small, trained here), "timm:<name>" (frozen)
    encoder_path: str | None = None  # local weights of the timm encoder (safetensors / timm checkpoint)
    encoder_kwargs: dict[str, int] = field(default_factory=dict)  # e.g. {img_size: 48, patch_size: 8}
    idm_frame_diff: bool = True  # pixels / conv: encode each frame with its difference to the previous one
    image_size: int = 64  # the recorded frames' size (data.image_size); the shipped checkpoints' 64 / 8
    patch_size: int = 8  # a power of two for encoder=conv (strided 2x2 stages)
    width: int = 128
    num_heads: int = 4
    idm_depth: int = 2
    fdm_depth: int = 4
    mlp_ratio: float = 4.0
    latent_dim: int = 64
    latent_tokens: int = 4
    motion_dim: int = 6
    context: int = 1
    temporal_attention: bool = False
    cross_augmentation: bool = True
    aug_shift: int = 4  # px, max translation of each augmented view
    aug_color: float = 0.15  # max relative brightness / contrast change of each augmented view
    recon_weight: float = 1.0
    motion_weight: float = 1.0
    frame_skip: int = 2  # control steps (20 Hz) per transition
    action_hidden: int = 128
    action_dims: dict[str, int] = field(default_factory=dict)
    projectors: dict[str, int] = field(default_factory=dict)
    lora_rank: int = 0
    lora_targets: list[str] = field(default_factory=lambda: ["q", "k", "v", "proj"])
    adapt: AdaptConfig = field(default_factory=AdaptConfig)

    def __post_init__(self):
        if self.conditioning not in ("latent", "explicit"):
            raise ConfigError(f"model.conditioning must be 'latent' or 'explicit', got {self.conditioning!r}")
        if self.image_size % self.patch_size:
            raise ConfigError(f"model.image_size {self.image_size} must be divisible by patch_size {self.patch_size}")
        if self.width % self.num_heads:
            raise ConfigError(f"model.width {self.width} must be divisible by num_heads {self.num_heads}")
        for key in ("idm_depth", "fdm_depth", "latent_dim", "latent_tokens", "context", "frame_skip"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.aug_shift < 0 or not 0.0 <= self.aug_color < 1.0:
            raise ConfigError(f"model.aug_shift must be >= 0 and aug_color in [0, 1), got {self.aug_shift}, "
                              f"{self.aug_color}")
        if self.encoder not in ("pixels", "conv") and not self.encoder.startswith("timm:"):
            raise ConfigError(f"model.encoder must be 'pixels', 'conv' or 'timm:<model name>', got {self.encoder!r}")
        if self.encoder == "conv" and self.patch_size & (self.patch_size - 1):
            raise ConfigError(f"model.encoder=conv needs a power-of-two patch_size, got {self.patch_size}")
        if self.lora_rank < 0:
            raise ConfigError(f"model.lora_rank must be >= 0, got {self.lora_rank}")
        if isinstance(self.adapt, dict):
            self.adapt = AdaptConfig(**self.adapt)

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@schema("model", "eacwm_schema")
@dataclass
class EACWMConfig(LACWMConfig):
    """EAC-WM: the same FDM conditioned on explicit actions through one action encoder per embodiment."""

    conditioning: str = "explicit"
    cross_augmentation: bool = False


@schema("data", "wm_suite_schema")
@dataclass
class WorldModelDataConfig:
    """Recorded pretraining / adaptation / test data (``worldmodels.lacwm.data``), cached under ``root``.

    Pretraining uses the first ``num_pretrain_embodiments`` of ``pretrain_embodiments`` (the scaling
    experiment's knob) on every task in ``tasks``; the ``held_out`` embodiment gets ``adapt_episodes``
    demonstrations per task for adaptation and ``test_episodes`` per task (other seeds) for evaluation.
    ``libero_tasks`` (env ids) add LIBERO interaction to pretraining. ``plan_episodes`` episodes of Reach on
    the held-out embodiment (seeds from 2000) measure planning by candidate selection in ``embodied eval``.
    ``paths`` adds the user's own data to pretraining: robomimic / LIBERO HDF5 files or LeRobot v3
    folders, read in place (never written), each file's embodiment taken from its attributes.
    ``camera`` is the manipulation suite's camera (``"workspace"``: framed on the gripper's working volume;
    robosuite's ``agentview`` loses the gripper off the top edge of small frames).

    ``demos`` (files or folders of LIBERO-layout demonstration files, read in place) replaces the recorded
    suite: the model pretrains on them and adapts to ``held_out`` = their embodiment (``"Panda"`` for
    LIBERO) on the same episodes; nothing is recorded and there is no test split. ``image_key`` /
    ``motion_key`` name the frames and the motion label in the files (LIBERO: ``agentview_rgb`` /
    ``ee_states``, see ``worldmodels.lacwm.data.TransitionDataset``). ``motion_key="ee_states"`` without
    ``demos`` composes (an experiment file that the user completes on the command line) and fails when the
    data is asked for, since recorded suites carry no ``ee_states``.
    """

    root: str = "outputs/lacwm/data_ws"
    pretrain_embodiments: list[str] = field(default_factory=lambda: ["Panda", "Sawyer", "UR5e", "IIWA"])
    num_pretrain_embodiments: int = 3
    held_out: str = "PandaInspireHand"
    tasks: list[str] = field(default_factory=lambda: ["Reach", "Lift"])
    episodes: int = 16
    adapt_episodes: int = 8
    test_episodes: int = 8
    max_steps: int = 45
    image_size: int = 64
    camera: str = "workspace"
    seed: int = 0
    test_seed: int = 500
    libero_tasks: list[str] = field(default_factory=list)
    libero_episodes: int = 2
    paths: list[str] = field(default_factory=list)  # the user's trajectory files / LeRobot folders (read-only)
    plan_episodes: int = 10  # closed-loop planning episodes per arm in `embodied eval` (0: skip)
    plan_max_steps: int = 40
    demos: list[str] = field(default_factory=list)  # demonstration files / folders: the whole data (read-only)
    image_key: str = "image"
    motion_key: str = "eef_delta"

    def __post_init__(self):
        if self.motion_key not in ("eef_delta", "ee_states"):
            raise ConfigError(f"data.motion_key must be 'eef_delta' or 'ee_states', got {self.motion_key!r}")
        if self.demos or self.motion_key == "ee_states":
            return  # demonstration data (ee_states labels exist only in demo files): the suite settings are unused
        if not 1 <= self.num_pretrain_embodiments <= len(self.pretrain_embodiments):
            raise ConfigError(f"data.num_pretrain_embodiments must be in [1, {len(self.pretrain_embodiments)}], "
                              f"got {self.num_pretrain_embodiments}")
        if self.held_out in self.pretrain_embodiments[: self.num_pretrain_embodiments]:
            raise ConfigError(f"data.held_out {self.held_out!r} is also a pretraining embodiment")
        for key in ("episodes", "adapt_episodes", "test_episodes", "max_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key} must be >= 1, got {getattr(self, key)}")
