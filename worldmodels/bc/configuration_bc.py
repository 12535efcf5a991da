"""Configuration of the behaviour-cloning policy (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import schema
from core.errors import ConfigError

BACKBONES = ("conv", "efficientnet_lite0")


@schema("model", "bc_schema")
@dataclass
class BCConfig:
    """Sizes and I/O of ``BCPolicyModel``.

    ``action_dim`` / ``proprio_dim`` of 0 are filled in from the training data before the model is built
    (and then stored in the checkpoint's config). Defaults follow robomimic's BC-RNN-free image policy with
    ACT-style action chunking: predict ``horizon`` actions, execute ``n_action_steps``, re-plan.

    Multi-task LIBERO policies (LIBERO's ResNet-T / BC baselines read the same inputs) add a wrist camera
    (``wrist_image_key``, its own encoder), more proprio keys (``extra_proprio_keys``, concatenated after
    ``proprio_key``) and language: with ``language`` each episode's instruction is embedded by the text
    encoder (``text_encoder``: a folder, or None for the installed all-MiniLM-L6-v2, see ``core.text``) and
    conditions every conv block by FiLM (Perez et al., AAAI 2018) and the head. ``task_texts`` is filled
    from the data; their embeddings are stored in the checkpoint, so evaluation on those tasks needs no
    encoder. ``random_shift`` pads by that many pixels and crops back at a random offset per sample during
    training (DrQ's augmentation, which image BC on few demos needs to generalise across placements).

    ``head`` is how the chunk is predicted: ``"l1"`` regresses it (ACT's L1 in normalised units, one answer
    per observation) and ``"flow"`` samples it by conditional flow matching (Lipman et al., ICLR 2023; the
    action expert of pi0 and flow-matching policies): a velocity network on (noisy chunk, time, features) is
    integrated from Gaussian noise with ``flow_steps`` Euler steps, so demonstrations that do one thing two
    ways (grasp this rim or that one) give one of the ways instead of their average.

    ``backbone`` is what turns each camera's frame into a feature map: ``"conv"`` learns ``channels`` strided
    conv blocks from scratch (robomimic's image BC); ``"efficientnet_lite0"`` runs the frame, resized to
    ``backbone_size`` px, through the first stages of ImageNet EfficientNet-Lite0 (frozen, stages 0 ..
    ``backbone_stage``: stage 2 keeps stride 8 and 40 channels, so a 64 px frame gives an 8 x 8 map, the conv
    encoder's own final size), then
    learns ``channels`` stride-1 conv blocks on it (FiLM-conditioned like the conv encoder's) before the
    keypoints. Frozen features make a policy trainable on a few CPU cores: the trunk runs once per training frame
    (its outputs are memoised in training), only the blocks after it learn, and ``random_shift`` moves the
    feature map by whole cells (``ceil(random_shift / stride)``) instead of the pixels.

    ``image_convention`` is the convention of the frames the model was trained on (``core.data.image_convention``;
    ``"rot180"`` for LIBERO data), filled in from the dataset like ``action_dim``; None when the data states none.
    In closed loop ``load_policy`` converts an env's frames to it. A checkpoint from before the field existed has no
    such key in its config.json; on a LIBERO env it is read as ``"flipud"``, the frames it was trained on.
    """

    image_key: str = "image"
    proprio_key: str = "proprio"
    wrist_image_key: str | None = None
    extra_proprio_keys: list[str] = field(default_factory=list)
    language: bool = False
    text_encoder: str | None = None
    task_texts: list[str] = field(default_factory=list)
    text_dim: int = 0
    random_shift: int = 0
    image_size: int = 64
    channels: list[int] = field(default_factory=lambda: [32, 64, 128])
    num_keypoints: int = 32
    hidden_dim: int = 256
    dropout: float = 0.1
    backbone: str = "conv"
    backbone_size: int = 64
    backbone_stage: int = 2
    head: str = "l1"
    flow_steps: int = 10
    horizon: int = 8
    n_action_steps: int = 4
    action_dim: int = 0
    proprio_dim: int = 0
    image_convention: str | None = None

    def __post_init__(self):
        if not self.channels or any(c < 1 for c in self.channels):
            raise ConfigError(f"model.channels must be positive, got {list(self.channels)}")
        if not 1 <= self.n_action_steps <= self.horizon:
            raise ConfigError(f"model.n_action_steps must be in [1, horizon={self.horizon}], got {self.n_action_steps}")
        if self.backbone not in BACKBONES:
            raise ConfigError(f"model.backbone must be one of {', '.join(BACKBONES)}, got {self.backbone!r}")
        if self.backbone != "conv" and not 0 <= self.backbone_stage <= 4:
            raise ConfigError(f"model.backbone_stage must be in 0..4 (EfficientNet-Lite0's stages up to stride 16), "
                              f"got {self.backbone_stage}")
        if self.backbone != "conv" and (self.backbone_size < 32 or self.backbone_size % 16):
            raise ConfigError(f"model.backbone_size must be >= 32 and a multiple of 16, got {self.backbone_size}")
        if self.backbone == "conv" and (self.image_size < 16 or self.image_size % (2 ** len(self.channels))):
            raise ConfigError(f"model.image_size must be >= 16 and divisible by 2**len(channels), got {self.image_size}")
        if self.random_shift < 0:
            raise ConfigError(f"model.random_shift must be >= 0, got {self.random_shift}")
        if self.wrist_image_key is not None and self.wrist_image_key == self.image_key:
            raise ConfigError(f"model.wrist_image_key must differ from model.image_key ({self.image_key!r})")
        if self.head not in ("l1", "flow"):
            raise ConfigError(f"model.head must be 'l1' or 'flow', got {self.head!r}")
        if self.flow_steps < 1:
            raise ConfigError(f"model.flow_steps must be >= 1, got {self.flow_steps}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.image_convention is not None:
            from core.data.image_convention import check

            try:
                check(self.image_convention)
            except ConfigError as e:
                raise ConfigError(f"model.image_convention: {e}") from None

    @property
    def proprio_keys(self) -> list[str]:
        """The proprio observation keys, concatenated in this order."""
        return [self.proprio_key, *self.extra_proprio_keys]

    @property
    def image_keys(self) -> list[str]:
        return [self.image_key] + ([self.wrist_image_key] if self.wrist_image_key else [])
