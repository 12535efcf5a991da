"""Configuration of AutoMoT's model (light: no torch import).

``AutoMoTConfig`` holds the action expert's sizes, the action-token layout, the heads' and losses' knobs
and the two switches that define the arms:

- ``use_understanding``: True = the full model (a VLM understanding expert + the action expert, joint
  attention); False = the ``noreason`` arm (no VLM at all: the action expert alone over the decision and
  planning blocks).
- ``freeze_understanding``: the VLM's weights (vision tower included) get no gradient.

The action expert's depth and attention geometry (heads, kv heads, head_dim) are the VLM's (both experts
share one attention per layer); ``num_layers`` / ``num_heads`` / ``num_kv_heads`` / ``head_dim`` are only
needed for the ``noreason`` arm, and when given with a VLM they must agree with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from core.config import from_dict_strict, schema
from core.errors import ConfigError

# the expert's label order (sim.driving.expert.META_ACTIONS; kept here so that this module imports light, tested equal)
META_ACTIONS = ("keep_lane", "accelerate", "slow_down", "stop", "change_left", "change_right")


@dataclass
class AutoMoTConfig:
    """AutoMoT's model.

    - ``expert_hidden_size`` / ``expert_intermediate_size``: the action expert's residual width and its
      SiLU-gated MLP width (may be smaller than the VLM's).
    - ``num_layers`` / ``num_heads`` / ``num_kv_heads`` / ``head_dim``: the shared attention geometry;
      ``None`` = the VLM's. Required (all four) for the ``noreason`` arm.
    - ``n_reason``: learned reasoning queries (the decision block, decoded through the VLM's LM head).
    - ``n_route`` / ``n_wp``: route-point and waypoint queries (20 route points; 6 waypoints = 3 s at 2 Hz).
    - ``bev_channels`` / ``bev_patch``: the BEV raster's channels and the patch-embedding conv's patch size
      (the raster's sides must divide by it).
    - ``n_target``: target points per sample (ego frame, metres); ``ego_dim``: ego-state features (speed
      m/s, acceleration m/s^2, steering, yaw rate rad/s, ...).
    - ``meta_action_names``: the meta-action classes; ``meta_action_token_ids``: one VLM vocabulary id per
      class (the LM-head rows the meta-action logits are read from). Required with a VLM.
    - ``wp_weights``: per-waypoint L1 weights (normalised to sum 1).
    - ``meta_loss_weight`` / ``route_loss_weight`` / ``wp_loss_weight`` / ``velocity_loss_weight``: the
      loss mix.
    - ``rms_norm_eps``: the action expert's RMSNorm epsilon; ``init_std``: its weights' init std.
    """

    use_understanding: bool = True
    freeze_understanding: bool = False
    expert_hidden_size: int = 1024
    expert_intermediate_size: int = 4096
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    n_reason: int = 8
    n_route: int = 20
    n_wp: int = 6
    bev_channels: int = 6
    bev_patch: int = 8
    n_target: int = 2
    ego_dim: int = 4
    meta_action_names: list[str] = field(default_factory=lambda: list(META_ACTIONS))
    meta_action_token_ids: list[int] = field(default_factory=list)
    wp_weights: list[float] = field(default_factory=lambda: [3.0, 3.0, 2.0, 2.0, 1.0, 1.0])
    meta_loss_weight: float = 1.0
    route_loss_weight: float = 1.0
    wp_loss_weight: float = 1.0
    velocity_loss_weight: float = 1.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for key in ("expert_hidden_size", "expert_intermediate_size", "n_reason", "n_route", "n_wp",
                    "bev_channels", "bev_patch", "n_target", "ego_dim"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model.{key} must be an integer >= 1, got {value!r}")
        for key in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"model.{key} must be None or an integer >= 1, got {value!r}")
        if self.num_heads is not None and self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model.num_heads ({self.num_heads}) must divide by num_kv_heads ({self.num_kv_heads})")
        if not self.use_understanding:
            missing = [k for k in ("num_layers", "num_heads", "num_kv_heads", "head_dim") if getattr(self, k) is None]
            if missing:
                raise ConfigError(f"model.use_understanding=false (the noreason arm has no VLM to copy the attention "
                                  f"geometry from): set model.{', model.'.join(missing)}")
            if self.freeze_understanding:
                raise ConfigError("model.freeze_understanding=true needs model.use_understanding=true")
        self.meta_action_names = list(self.meta_action_names)
        self.meta_action_token_ids = [int(i) for i in self.meta_action_token_ids]
        self.wp_weights = [float(w) for w in self.wp_weights]
        if len(self.meta_action_names) < 2 or len(set(self.meta_action_names)) != len(self.meta_action_names):
            raise ConfigError(f"model.meta_action_names must be >= 2 distinct names, got {self.meta_action_names}")
        ids = self.meta_action_token_ids
        if ids and (len(ids) != len(self.meta_action_names) or len(set(ids)) != len(ids) or min(ids) < 0):
            raise ConfigError(f"model.meta_action_token_ids must be {len(self.meta_action_names)} distinct ids >= 0 "
                              f"(one per meta_action_names entry), got {ids}")
        if len(self.wp_weights) != self.n_wp or min(self.wp_weights) < 0 or sum(self.wp_weights) <= 0:
            raise ConfigError(f"model.wp_weights must be {self.n_wp} (n_wp) weights >= 0 with a positive sum, "
                              f"got {self.wp_weights}")
        for key in ("meta_loss_weight", "route_loss_weight", "wp_loss_weight", "velocity_loss_weight"):
            if getattr(self, key) < 0:
                raise ConfigError(f"model.{key} must be >= 0, got {getattr(self, key)}")
        if not self.rms_norm_eps > 0 or not self.init_std > 0:
            raise ConfigError("model.rms_norm_eps and model.init_std must be > 0")

    @property
    def n_meta(self) -> int:
        return len(self.meta_action_names)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AutoMoTConfig:
        """Build from a plain dict; an unknown key fails with a one-line ``ConfigError`` naming it."""
        return from_dict_strict(cls, values, "AutoMoT")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


ARMS = ("automot", "frozen", "noreason")
BASE_DTYPES = ("float32", "bfloat16", "float16", "auto")  # core.vlm.DTYPES (this module imports no torch)
SYSTEM_PROMPT = "You are driving the ego car. Look at the front camera and follow the instruction."
REASON_PROMPT = "What should I do next, and why?"


@schema("model", "automot_model_schema")
@dataclass
class AutoMoTModelConfig:
    """One AutoMoT arm, the understanding expert it starts from, and the refiner.

    - ``arm``: ``automot`` (the understanding expert fine-tuned with the action expert, with ``lm_loss_weight``
      x its next-token loss on the samples' reasoning text to keep its language), ``frozen`` (the understanding
      expert frozen: only the action expert learns) or ``noreason`` (no understanding expert at all).
    - ``base_path``: the VLM folder (a user's Qwen2.5-VL / Qwen3-VL ``save_pretrained`` folder, or the tiny one
      pretrained here on driving-scene QA and reasoning text: built there on first use from ``vlm`` sizes with
      the ``pretrain_*`` settings; ``tokenizer_vocab`` is its BPE size). A tokenizer that does not tell the
      meta-actions apart by one token each (a Qwen tokenizer splits ``change_left`` / ``change_right`` after the
      same first token) gets them added as whole tokens, the VLM's embeddings resized (``core.vlm.add_tokens``).
    - ``base_dtype``: the dtype the base VLM's parameters are loaded in (``core.vlm.load_vlm``: ``float32`` |
      ``bfloat16`` | ``float16`` | ``auto`` = the folder's own).
    - ``image_size``: side of the square VLM input each front frame is resized to; ``history``: frames per
      sample (oldest first).
    - ``mot``: ``AutoMoTConfig`` fields (the action expert's sizes, token layout, loss weights); the geometry
      and the meta-action token ids are filled in from the VLM.
    - ``refiner``: ``driving.automot.refiner.RefinerConfig`` fields (``cond_dim`` is filled in);
      ``refiner_steps``: its training steps after the VLA (0 = no refiner); ``refiner_lr``.
    - ``update_interval``: N of asynchronous inference at evaluation (the understanding prefix is re-encoded
      every N control steps; the action expert runs every step).
    """

    arm: str = "automot"
    base_path: str = "outputs/automot/base"
    base_dtype: str = "float32"
    image_size: int = 64
    history: int = 2
    vlm: dict[str, Any] = field(default_factory=dict)
    tokenizer_vocab: int = 1024
    pretrain_steps: int = 1500
    pretrain_batch: int = 32
    pretrain_lr: float = 1.0e-3
    lm_loss_weight: float = 0.5
    mot: dict[str, Any] = field(default_factory=dict)
    refiner: dict[str, Any] = field(default_factory=dict)
    refiner_steps: int = 600
    refiner_lr: float = 1.0e-3
    update_interval: int = 2

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise ConfigError(f"model.arm must be one of {ARMS}, got {self.arm!r}")
        if self.base_dtype not in BASE_DTYPES:
            raise ConfigError(f"model.base_dtype must be one of {BASE_DTYPES}, got {self.base_dtype!r}")
        for key in ("image_size", "history", "pretrain_batch"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if int(self.update_interval) < 1:
            raise ConfigError(f"model.update_interval must be >= 1, got {self.update_interval}")
        if self.pretrain_steps < 0 or self.refiner_steps < 0 or self.lm_loss_weight < 0:
            raise ConfigError("model.pretrain_steps, model.refiner_steps and model.lm_loss_weight must be >= 0")
        known = {f.name for f in dataclasses.fields(AutoMoTConfig)}
        unknown = set(self.mot) - known
        if unknown:
            raise ConfigError(f"model.mot: unknown key(s) {sorted(unknown)} (AutoMoTConfig fields: {sorted(known)})")


@dataclass
class DrivingVLAConfig:
    """A trained AutoMoT policy: what ``DrivingVLA(config)`` builds, and a policy folder's ``config.json`` model
    section (``AutoMoTModelConfig`` is the training recipe; this is the resolved model it produced).

    - ``arm``: ``automot`` | ``frozen`` | ``noreason`` (see ``AutoMoTModelConfig``).
    - ``base_path``: the understanding expert's VLM folder (its config and tokenizer; in the ``frozen`` arm its
      weights too, which the policy folder then does not store); ``""`` in the ``noreason`` arm (no VLM).
    - ``base_dtype``: the dtype the base is loaded in (``AutoMoTModelConfig``).
    - ``added_tokens``: tokens added to the base's tokenizer, in order, with the VLM's embeddings resized
      (``core.vlm.add_tokens``: the meta-action names when the base's tokenizer lacks them); added again, to
      the same ids and rows, whenever the policy is built from the base.
    - ``image_size`` / ``history``: the square VLM input per front frame, frames per prompt.
    - ``mot``: the resolved ``AutoMoTConfig`` (attention geometry and meta-action token ids filled in).
    - ``refiner``: the resolved ``driving.automot.refiner.RefinerConfig`` fields, or None (no refiner).
    - ``lm_loss_weight``: weight of the understanding expert's next-token loss on reasoning text in the imitation
      objective (0 unless the ``automot`` arm trains it).
    """

    arm: str = "automot"
    base_path: str = "outputs/automot/base"
    base_dtype: str = "float32"
    added_tokens: list[str] = field(default_factory=list)
    image_size: int = 64
    history: int = 2
    mot: AutoMoTConfig = field(default_factory=AutoMoTConfig)
    refiner: dict[str, Any] | None = None
    lm_loss_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise ConfigError(f"model.arm must be one of {ARMS}, got {self.arm!r}")
        if isinstance(self.mot, dict):
            self.mot = AutoMoTConfig.from_dict(self.mot)
        if self.mot.use_understanding != (self.arm != "noreason") or \
                self.mot.freeze_understanding != (self.arm == "frozen"):
            raise ConfigError(f"model.mot: use_understanding={self.mot.use_understanding} / freeze_understanding="
                              f"{self.mot.freeze_understanding} contradict arm={self.arm!r}")
        if (self.arm == "noreason") == bool(self.base_path):
            raise ConfigError(f"model.base_path must be set exactly when the arm has an understanding expert "
                              f"(arm={self.arm!r}, base_path={self.base_path!r})")
        if int(self.image_size) < 1 or int(self.history) < 1 or self.lm_loss_weight < 0:
            raise ConfigError("model.image_size and model.history must be >= 1, model.lm_loss_weight >= 0")
        if self.base_dtype not in BASE_DTYPES:
            raise ConfigError(f"model.base_dtype must be one of {BASE_DTYPES}, got {self.base_dtype!r}")
        self.added_tokens = [str(t) for t in self.added_tokens]
        if self.added_tokens and self.arm == "noreason":
            raise ConfigError("model.added_tokens: the noreason arm has no tokenizer to add tokens to")
        if self.refiner is not None:
            self.refiner = dict(self.refiner)


@schema("data", "automot_data_schema")
@dataclass
class AutoMoTDataConfig:
    """The expert's driving logs (``driving.automot.data.make_driving_dataset``), built on first use.

    ``root/<split>/<scenario>/...hdf5``; ``episodes`` / ``test_episodes`` per scenario, seeds from ``seed``
    (train) and ``seed + 10000`` (test); ``image_size`` is the env's front camera height (width 2x); ``horizon_s`` caps episodes (None: each
    scenario's own horizon);
    ``stride`` subsamples training steps. Evaluation: ``eval_samples`` held-out logged steps (open loop),
    ``eval_episodes`` closed-loop episodes per scenario from seed ``eval_seed`` (0 = open loop only).
    """

    root: str = "outputs/datasets/automot"
    scenarios: list[str] = field(default_factory=lambda: ["highway", "merge", "roundabout", "intersection",
                                                          "racetrack"])
    episodes: int = 20
    test_episodes: int = 10
    seed: int = 0
    image_size: int = 64
    horizon_s: float | None = None
    stride: int = 1
    workers: int = 1
    eval_samples: int | None = 2000
    eval_episodes: int = 5
    eval_seed: int = 1000

    def __post_init__(self) -> None:
        if not self.scenarios:
            raise ConfigError("data.scenarios must name at least one scenario")
        if self.eval_episodes < 0:
            raise ConfigError(f"data.eval_episodes must be >= 0, got {self.eval_episodes}")
        if self.episodes < 1 or self.test_episodes < 1 or self.stride < 1 or self.workers < 1:
            raise ConfigError("data.episodes, data.test_episodes, data.stride and data.workers must be >= 1")


__all__ = ["ARMS", "BASE_DTYPES", "META_ACTIONS", "REASON_PROMPT", "SYSTEM_PROMPT", "AutoMoTConfig", "AutoMoTDataConfig",
           "AutoMoTModelConfig", "DrivingVLAConfig"]
