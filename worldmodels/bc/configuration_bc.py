"""Configuration of the behaviour-cloning policy (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import schema
from core.errors import ConfigError


@schema("model", "bc_schema")
@dataclass
class BCConfig:
    """Sizes and I/O of ``BCPolicyModel``.

    ``action_dim`` / ``proprio_dim`` of 0 are filled in from the training data before the model is built
    (and then stored in the checkpoint's config). Defaults follow robomimic's BC-RNN-free image policy with
    ACT-style action chunking: predict ``horizon`` actions, execute ``n_action_steps``, re-plan.
    """

    image_key: str = "image"
    proprio_key: str = "proprio"
    image_size: int = 64
    channels: list[int] = field(default_factory=lambda: [32, 64, 128])
    num_keypoints: int = 32
    hidden_dim: int = 256
    dropout: float = 0.1
    horizon: int = 8
    n_action_steps: int = 4
    action_dim: int = 0
    proprio_dim: int = 0

    def __post_init__(self):
        if not self.channels or any(c < 1 for c in self.channels):
            raise ConfigError(f"model.channels must be positive, got {list(self.channels)}")
        if not 1 <= self.n_action_steps <= self.horizon:
            raise ConfigError(f"model.n_action_steps must be in [1, horizon={self.horizon}], got {self.n_action_steps}")
        if self.image_size < 16 or self.image_size % (2 ** len(self.channels)):
            raise ConfigError(f"model.image_size must be >= 16 and divisible by 2**len(channels), got {self.image_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
