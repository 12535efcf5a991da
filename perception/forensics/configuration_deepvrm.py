"""Configuration of Deep-VRM and its baselines (light: no torch import).

- ``model`` (``deepvrm_model_schema``, ``configs/model/deepvrm*.yaml``): which arm, the VLM it starts from and
  Deep-VRM's knobs. ``arm``: ``deepvrm`` | ``lora`` (no residual path) | ``full`` (full fine-tuning) run on the
  VLM; ``freq_cnn`` | ``feature_probe`` are the non-VLM baselines in the same harness.
- ``data`` (``deepvrm_data_schema``): the GenImage-layout set (built by ``perception.forensics.generators`` on
  first use), which generators each stage trains on (one family is held out of training), and the QA set that
  measures general ability.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.config import choice, schema
from core.errors import ConfigError

VLM_ARMS = ("deepvrm", "lora", "full")
BASELINE_ARMS = ("freq_cnn", "feature_probe")
ARMS = VLM_ARMS + BASELINE_ARMS
BASE_DTYPES = ("float32", "bfloat16", "float16", "auto")  # core.vlm.DTYPES (this module imports no torch)

VERDICT_PROMPT = "Is this image real or fake? Please just answer 'real' or 'fake'."
EXPLAIN_PROMPT = "Is this image real or fake? Answer, then give a short reason."


@schema("model", "deepvrm_model_schema")
@dataclass
class DeepVRMModelConfig:
    """One arm on one base VLM.

    - ``base_path``: the pretrained VLM folder (``save_pretrained`` layout: a user's Qwen2.5-VL / Qwen3-VL, or the
      tiny one pretrained here on image QA: built there on first use from ``vlm`` sizes with ``pretrain_*``).
    - ``vlm``: sizes of the model pretrained here (``core.vlm.VLMConfig`` fields); ignored for a user's folder.
    - ``base_dtype``: the dtype the base VLM's parameters are loaded in (``core.vlm.load_vlm``: ``float32`` |
      ``bfloat16`` | ``float16`` | ``auto`` = the folder's own); ``bfloat16`` halves a 7B base's memory (pair it
      with ``trainer.precision`` bf16 autocast on a GPU).
    - ``positions``: ``mrope`` (Qwen-VL's 3-D multimodal positions, the default) or ``text`` (1-D positions for
      the whole sequence: how the shipped detector and its base were trained, kept so it runs as trained;
      ``core.vlm.vlm_inputs``).
    - ``inject_layer`` (K): frozen LLM layers 0..K-1; V_a's tokens join the input of layer K.
    - ``lora_rank`` / ``lora_alpha``: LoRA on the LLM's layers >= K; ``va_lora_rank``: LoRA on V_a.
    - ``hp_gain``: gain of V_a's high-pass view.
    - ``stage1_fraction``: share of ``trainer.max_steps`` spent in stage 1 (stage 2 adds the hard negatives and,
      for Deep-VRM, the residual path).
    - ``full_lr_scale``: the full fine-tuning arm's lr = trainer lr x this (LoRA and full FT usually need different
      learning rates; chosen in the pilot, never to weaken the baseline).
    - ``paper``: a note of the paper size this config stands for (documentation only).
    """

    arm: str = "deepvrm"
    base_path: str = "outputs/deepvrm/base"
    image_size: int = 64
    vlm: dict[str, Any] = field(default_factory=dict)
    base_dtype: str = "float32"
    positions: str = "mrope"
    tokenizer_vocab: int = 1024
    pretrain_steps: int = 2000
    pretrain_batch: int = 32
    pretrain_lr: float = 1.0e-3
    inject_layer: int = 4
    lora_rank: int = 8
    lora_alpha: float = 16.0
    va_lora_rank: int = 8
    hp_gain: float = 4.0
    stage1_fraction: float = 0.5
    full_lr_scale: float = 0.1
    paper: str = ""

    def __post_init__(self) -> None:
        choice("model.arm", self.arm, ARMS)
        choice("model.base_dtype", self.base_dtype, BASE_DTYPES)
        choice("model.positions", self.positions, ("mrope", "text"))
        if self.inject_layer < 1:
            raise ConfigError(f"model.inject_layer must be >= 1, got {self.inject_layer}")
        if not 0.0 <= self.stage1_fraction <= 1.0:
            raise ConfigError(f"model.stage1_fraction must be in [0, 1], got {self.stage1_fraction}")
        if self.lora_rank < 1 or self.va_lora_rank < 1 or self.pretrain_steps < 0 or self.full_lr_scale <= 0:
            raise ConfigError("model.lora_rank / va_lora_rank must be >= 1, pretrain_steps >= 0, full_lr_scale > 0")


@schema("data", "deepvrm_data_schema")
@dataclass
class DeepVRMDataConfig:
    """Forensic data (GenImage layout) and the general-ability QA set.

    ``root``: ``<generator>/<split>/{ai,nature}``; built with ``generators`` / ``size`` / ``n_train`` / ``n_val``
    / ``build_seed`` unless it is there (a user's GenImage folder is used as is). ``stage1`` generators train stage
    1; stage 2 trains on ``stage1`` + ``stage2`` (the VAE reconstructions: hard negatives that differ from real only
    in low-level signal). ``holdout``: a family never trained on (reported as the generalisation column).
    ``size`` is also the side the images are read at, so for the VLM arms it must equal ``model.image_size``
    (``configs/data/deepvrm.yaml`` sets it to ``${model.image_size}``: one source of truth).
    ``explain_fraction``: share of training examples asked with the explain prompt (answer + reason) instead of
    the verdict-only prompt. QA: ``qa_train`` / ``qa_test`` images under ``qa_root`` (``perception.forensics.qa``);
    ``eval_qa`` caps the QA questions scored at evaluation, ``eval_n`` the images per generator and class.
    ``degrade``: evaluate on degraded val images (``perception.forensics.degrade``: ``jpeg=75``, ``resize=0.5``,
    ``blur=1``, joined by commas; ``none``), written to ``eval_<tag>.json`` without the QA; ``embodied eval
    deepvrm --degrade jpeg=75`` sets it.
    """

    root: str = "outputs/datasets/genimage"
    generators: list[str] = field(default_factory=lambda: ["vae", "flow", "gan", "upsample"])
    size: int = 64
    n_train: int = 400
    n_val: int = 150
    build_seed: int = 0
    stage1: list[str] = field(default_factory=lambda: ["flow", "upsample"])
    stage2: list[str] = field(default_factory=lambda: ["vae"])
    holdout: str = "gan"
    explain_fraction: float = 0.5
    qa_root: str = "outputs/datasets/forensics_qa"
    qa_train: int = 3000
    qa_test: int = 500
    qa_seed: int = 0
    eval_qa: int | None = None
    eval_n: int | None = None
    eval_batch: int = 64
    degrade: str = "none"

    def __post_init__(self) -> None:
        from perception.forensics.degrade import canonical

        if not self.stage1:
            raise ConfigError("data.stage1 must name at least one generator")
        self.degrade = canonical(self.degrade)
        trained = set(self.stage1) | set(self.stage2)
        unknown = trained - set(self.generators)
        if unknown:
            raise ConfigError(f"data.stage1 / stage2 name generators not in data.generators: {sorted(unknown)}")
        if self.holdout and self.holdout in trained:
            raise ConfigError(f"data.holdout {self.holdout!r} is also a training generator")
        if not 0.0 <= self.explain_fraction <= 1.0:
            raise ConfigError(f"data.explain_fraction must be in [0, 1], got {self.explain_fraction}")
        if self.size < 16 or self.n_train < 1 or self.n_val < 1:
            raise ConfigError("data.size must be >= 16 and data.n_train, data.n_val >= 1")
