"""Deep-VRM: a vision-language model whose later layers see a second, low-level view of the image.

    image ──ViT (frozen)──> image tokens ─┐
    text ───embeddings (frozen)───────────┴─> LLM layers 0..K-1 (frozen) ─> h ─┬─> layers K..L-1 (LoRA) ─> answer
    high-pass(image) ──V_a (a copy of the ViT + merger, LoRA)──> a ─────────────┘  h <- (h + a) / 2 at image tokens

Nothing before layer K depends on V_a, so the early layers keep their semantic processing bit for bit; after it,
the trainable layers fuse semantic and signal-level evidence. The same class runs the paper's baselines (``arm``):

=============  ===========================================  ======================================
arm            trainable                                    residual path
=============  ===========================================  ======================================
``deepvrm``    stage 1: LoRA on layers >= K;                 stage 1: off; stage 2: on
               stage 2: + LoRA on V_a
``lora``       LoRA on layers >= K (both stages)             never (Deep-VRM without the residual)
``full``       every weight of the VLM (both stages)         never (full fine-tuning)
=============  ===========================================  ======================================

LoRA is ``core.layers.lora.inject_lora`` (peft's layers, replaced in place: the model keeps its class), on the
linears whose qualified names match the regular expressions below. The injection is a forward hook on decoder
layer K-1 whose output it rewrites, so it works for any Qwen-VL-class model that ``core.vlm`` loads, at any size
(K = 16 of 28 for Qwen2.5-VL-7B).

``DeepVRM`` is a ``core.pretrained.PreTrainedModel`` built from a ``DeepVRMModelConfig`` around the base VLM at
``config.base_path``: a detector folder (``save_pretrained``) stores only ``trained_state_dict()`` (the LoRA
weights; every VLM weight for ``full``) and references the base, which is opened read-only. Beside them it writes
the VLM part in the upstream layouts (``save_upstream``): ``adapter/``, a peft folder of the LLM's LoRA
(``deepvrm`` / ``lora``; V_a and the residual are not peft-expressible and stay in ``model.safetensors``), or
``vlm/``, a transformers folder of the fine-tuned VLM (``full``).

Answers are scored, not only generated: P(fake) = sigmoid(log P("fake" | prompt) - log P("real" | prompt)), the
two answers' sequence log-probabilities under teacher forcing (AP uses it).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from core.pretrained import PreTrainedModel
from core.vlm import (
    IGNORE,
    PatchSpec,
    answer_logprob,
    decode_answer,
    decoder_layers,
    encode,
    encode_images,
    image_token_id,
    next_token_loss,
    patch_spec_of,
    patchify,
    vision_tower,
    vlm_collate,
    vlm_inputs,
)
from perception.forensics.configuration_deepvrm import DeepVRMModelConfig

ARMS = ("deepvrm", "lora", "full")
LLM_TARGETS = r"self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj"
UPSTREAM_ADAPTER = "adapter"  # the export's peft folder (deepvrm / lora arms)
UPSTREAM_VLM = "vlm"  # the export's transformers folder (full arm)
VISION_TARGETS = r"blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(gate_proj|up_proj|down_proj|linear_fc1|linear_fc2))" \
                 r"|merger\.(mlp\.(0|2)|linear_fc1|linear_fc2)"


def high_pass(images: torch.Tensor, gain: float = 4.0) -> torch.Tensor:
    """The low-level view V_a sees: the image minus its 3x3 box blur (a noise residual), re-centred at 0.5.

    (B, 3, H, W) in [0, 1] -> same shape in [0, 1]; smooth regions go to 0.5, fine detail and generator traces
    remain. ``gain`` scales the residual before clipping.
    """
    blur = F.avg_pool2d(F.pad(images, (1, 1, 1, 1), mode="reflect"), 3, stride=1)
    return (0.5 + gain * (images - blur)).clamp(0.0, 1.0)


class DeepVRM(PreTrainedModel):
    """A Qwen-VL-class model with Deep-VRM's residual path and trainable-part policy.

    Built from its config around the base VLM (``core.vlm.load_vlm(config.base_path)``), in stage 2 (the
    residual path on: the detector as it is used); training calls ``set_stage(1)`` first.

    Args:
        config: ``arm`` (``deepvrm`` | ``lora`` | ``full``, see the module docstring; the baseline arms are not
            VLMs), ``base_path``, ``image_size``, ``inject_layer`` (K: the residual joins the input of decoder
            layer K, 1 <= K < number of layers), ``lora_rank`` / ``lora_alpha`` (LoRA on the LLM's layers >= K,
            attention and MLP projections), ``va_lora_rank`` (LoRA on V_a: its attention and MLP projections
            and the merger, alpha = 2 x rank), ``hp_gain`` (gain of the high-pass view).
        base: ``(vlm, tokenizer)`` already loaded from ``config.base_path`` (default: loaded here); it is owned
            and modified in place (LoRA layers injected).
        lora_dropout: Dropout on the LoRA inputs (training only; not part of the saved model).
    """

    config_class = DeepVRMModelConfig
    method = "deepvrm"
    base_fields = ("base_path",)

    def __init__(self, config: DeepVRMModelConfig, base: tuple[nn.Module, Any] | None = None,
                 lora_dropout: float = 0.0):
        from core.layers.lora import inject_lora

        super().__init__()
        if config.arm not in ARMS:
            raise ConfigError(f"DeepVRM: model.arm must be one of {ARMS} (the VLM arms), got {config.arm!r}")
        if base is None:
            from core.vlm import load_vlm

            base = load_vlm(config.base_path, dtype=config.base_dtype)
        vlm, tokenizer = base
        layers = decoder_layers(vlm)
        if not 1 <= config.inject_layer < len(layers):
            raise ConfigError(f"model.inject_layer must be in [1, {len(layers) - 1}] (the LLM has {len(layers)} "
                              f"layers), got {config.inject_layer}")
        self.config = config
        self.vlm, self.tokenizer, self.arm = vlm, tokenizer, config.arm
        self.spec: PatchSpec = patch_spec_of(vlm, config.image_size)
        self.inject_layer, self.hp_gain = config.inject_layer, config.hp_gain
        self.image_token = image_token_id(vlm)
        self.pad_id = int(tokenizer.pad_token_id)
        self.artifact_encoder: nn.Module | None = None
        if config.arm == "deepvrm":
            self.artifact_encoder = copy.deepcopy(vision_tower(vlm))
            inject_lora(self.artifact_encoder, VISION_TARGETS, config.va_lora_rank, 2.0 * config.va_lora_rank,
                        lora_dropout, adapter_name="va")
        if config.arm in ("deepvrm", "lora"):
            later = "|".join(str(i) for i in range(config.inject_layer, len(layers)))
            pattern = rf".*language_model\.layers\.({later})\.({LLM_TARGETS})"
            inject_lora(self.vlm, pattern, config.lora_rank, config.lora_alpha, lora_dropout, adapter_name="llm")
        self.residual_on = False
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        layers[config.inject_layer - 1].register_forward_hook(self._inject)
        self.set_stage(2)

    @classmethod
    def build_for_loading(cls, config: DeepVRMModelConfig) -> DeepVRM:
        """Around the base; for ``full`` without its weights (the folder stores every VLM tensor)."""
        if config.arm == "full":
            from core.vlm import load_vlm

            return cls(config, base=load_vlm(config.base_path, dtype=config.base_dtype, weights=False))
        return cls(config)

    # -- which parts train ---------------------------------------------------------------------------------------
    def set_stage(self, stage: int) -> None:
        """Freeze / unfreeze for training stage 1 or 2 and switch the residual path (Deep-VRM: on in stage 2)."""
        if stage not in (1, 2):
            raise ConfigError(f"stage must be 1 or 2, got {stage}")
        self.stage = stage
        self.requires_grad_(False)
        if self.arm == "full":
            self.vlm.requires_grad_(True)
        else:
            for name, p in self.vlm.named_parameters():
                if "lora_" in name:
                    p.requires_grad_(True)
        if self.arm == "deepvrm":
            self.residual_on = stage == 2
            if stage == 2:
                for name, p in self.artifact_encoder.named_parameters():
                    if "lora_" in name:
                        p.requires_grad_(True)

    def trainable_parameters(self) -> dict[str, int]:
        """Trainable parameter counts: LLM, V_a, total."""
        llm = sum(p.numel() for p in self.vlm.parameters() if p.requires_grad)
        va = sum(p.numel() for p in self.artifact_encoder.parameters() if p.requires_grad) \
            if self.artifact_encoder is not None else 0
        return {"llm": llm, "artifact_encoder": va, "total": llm + va}

    def enable_gradient_checkpointing(self) -> None:
        self.vlm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def fsdp_units(self) -> list[nn.Module]:
        """Modules to shard one by one under FSDP: the LLM's decoder layers and the vision blocks."""
        units = list(decoder_layers(self.vlm)) + list(vision_tower(self.vlm).blocks)
        if self.artifact_encoder is not None:
            units += list(self.artifact_encoder.blocks)
        return units

    # -- the residual path ---------------------------------------------------------------------------------------
    def _inject(self, module: nn.Module, args: Any, output: Any) -> Any:
        if self._pending is None:
            return output
        residual, mask = self._pending
        h = output[0] if isinstance(output, tuple) else output
        if h.shape[:2] != mask.shape:
            raise RuntimeError(f"Deep-VRM injection: hidden states {tuple(h.shape)} do not match the image mask "
                               f"{tuple(mask.shape)} (a KV-cached decoding step? decode without a cache)")
        h = torch.where(mask.unsqueeze(-1), 0.5 * (h + residual.to(h.dtype)), h)
        return (h, *output[1:]) if isinstance(output, tuple) else h

    def artifact_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """V_a(high-pass(images)) -> (B * tokens_per_image, hidden)."""
        pv, grid = patchify(high_pass(images, self.hp_gain), self.spec)
        return encode_images(self.artifact_encoder, pv, grid)

    @contextmanager
    def _residual(self, images: torch.Tensor, input_ids: torch.Tensor):
        if not (self.residual_on and self.artifact_encoder is not None):
            yield
            return
        mask = input_ids == self.image_token
        tokens = self.artifact_tokens(images)
        if int(mask.sum()) != tokens.shape[0]:
            raise ConfigError(f"{int(mask.sum())} image tokens in the text but V_a made {tokens.shape[0]}")
        residual = torch.zeros(*mask.shape, tokens.shape[-1], dtype=tokens.dtype, device=tokens.device)
        residual[mask] = tokens
        self._pending = (residual, mask)
        try:
            yield
        finally:
            self._pending = None

    # -- forward, loss, scoring -----------------------------------------------------------------------------------
    def forward(self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> Any:
        """The VLM's output on (images (B, 3, S, S) in [0, 1], one image per sequence, ids with image tokens)."""
        pv, grid = patchify(images, self.spec)
        with self._residual(images, input_ids):
            return self.vlm(**vlm_inputs(self.vlm, input_ids, attention_mask, pv, grid,
                                         positions=self.config.positions), **kwargs)

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = self(batch["image"], batch["input_ids"], batch["attention_mask"])
        return {"loss": next_token_loss(out.logits, batch["labels"])}

    def _batch(self, images: torch.Tensor, question: str, answers: list[str] | None, side: str = "right"):
        n = self.spec.tokens_per_image
        if answers is None:
            samples = [encode(self.tokenizer, question, None, n) for _ in range(images.shape[0])]
        else:
            samples = [encode(self.tokenizer, question, a, n) for a in answers]
        b = vlm_collate(samples, self.pad_id, side)
        return {k: v.to(images.device) for k, v in b.items() if isinstance(v, torch.Tensor)}

    @torch.no_grad()
    def answer_scores(self, images: torch.Tensor, question: str, candidates: tuple[str, ...]) -> torch.Tensor:
        """(B, len(candidates)) sequence log-probabilities of each candidate answer."""
        scores = []
        for cand in candidates:
            b = self._batch(images, question, [cand] * images.shape[0])
            logits = self(images, b["input_ids"], b["attention_mask"]).logits
            scores.append(answer_logprob(logits, b["labels"]))
        return torch.stack(scores, dim=1)

    @torch.no_grad()
    def prob_fake(self, images: torch.Tensor, question: str) -> torch.Tensor:
        """P(fake) from the answers "fake" and "real" (both single answers, the verdict prompt)."""
        s = self.answer_scores(images, question, ("fake", "real"))
        return torch.sigmoid(s[:, 0] - s[:, 1])

    @torch.no_grad()
    def generate(self, images: torch.Tensor, question: str, max_new_tokens: int = 16) -> list[str]:
        """Greedy answers (left-padded batch, full re-forward per token: the residual hook needs the image
        positions of every forward, and the sequences here are short)."""
        b = self._batch(images, question, None, side="left")
        ids, mask = b["input_ids"], b["attention_mask"]
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        start = ids.shape[1]
        for _ in range(max_new_tokens):
            logits = self(images, ids, mask).logits[:, -1]
            nxt = logits.argmax(-1).masked_fill(done, self.pad_id)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
            done |= nxt == end
            if bool(done.all()):
                break
        return [decode_answer(self.tokenizer, row[start:].tolist()) for row in ids]

    # -- saving the trained part ---------------------------------------------------------------------------------
    def save_upstream(self, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, str]:
        """The VLM part as folders transformers / peft open (``save_pretrained``'s hook; see the README section
        "Opening the export with transformers + peft").

        ``deepvrm`` / ``lora``: ``adapter/``, the LLM's LoRA (adapter "llm") in peft's layout, over the frozen base
        (not copied again: it is this folder's ``base/`` or the referenced path). V_a, its LoRA and the residual
        are not expressible in peft and stay in ``model.safetensors`` only, so the upstream model of the
        ``deepvrm`` arm is the detector with its residual path off (the stage-1 model). ``full``: ``vlm/``, the
        whole fine-tuned VLM with its tokenizer and image processor (a second copy of ``model.safetensors``'s
        ``vlm.*`` tensors).
        """
        from core.io import write_text
        from core.layers.lora import save_lora
        from core.vlm import save_vlm

        sd = state_dict if state_dict is not None else self.state_dict()
        vlm_sd = {k.removeprefix("vlm."): v for k, v in sd.items() if k.startswith("vlm.")}
        cls = f"transformers.{type(self.vlm).__name__}"
        positions = (" Call it without mm_token_type_ids (this detector was trained with 1-D text positions)."
                     if self.config.positions == "text" else "")
        if self.arm == "full":
            save_vlm(directory / UPSTREAM_VLM, self.vlm, self.tokenizer, self.spec, state_dict=vlm_sd)
            return {UPSTREAM_VLM: f"{cls}.from_pretrained('{UPSTREAM_VLM}') with AutoTokenizer / AutoImageProcessor "
                                  "from the same folder: the fully fine-tuned VLM (the same tensors as "
                                  f"model.safetensors' vlm.*).{positions}"}
        copied = (directory / "base").is_dir()
        base = "base" if copied else str(Path(self.config.base_path).resolve())
        out = directory / UPSTREAM_ADAPTER
        save_lora(self.vlm, out, "llm", state_dict=vlm_sd, base_model="../base" if copied else base)
        where = "this folder's base/" if copied else base
        how = (f"peft.PeftModel.from_pretrained({cls}.from_pretrained(<base>), '{UPSTREAM_ADAPTER}'), <base> = "
               f"{where} (frozen, not copied again; tokenizer and image processor there): LoRA on LLM layers >= "
               f"{self.inject_layer}.{positions}")
        left_out = ("" if self.arm != "deepvrm" else
                    " V_a (a LoRA'd copy of the vision tower, adapter 'va') and its residual into layer "
                    f"{self.inject_layer} are not peft-expressible and stay in {{weights}} only: the adapter on the "
                    "base is the detector with its residual path off (Deep-VRM's stage-1 model).")
        write_text(out / "README.md", "# Deep-VRM LLM adapter (peft LoRA)\n\n"
                   + how.replace("this folder's base/", "../base/") + left_out.format(weights="../model.safetensors")
                   + "\n")
        return {UPSTREAM_ADAPTER: how + left_out.format(weights="model.safetensors")}

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        """What training changed: LoRA weights (and V_a's) for deepvrm / lora; every VLM weight for full."""
        state = self.state_dict()
        if self.arm == "full":
            return {k: v for k, v in state.items() if k.startswith("vlm.") or "lora_" in k}
        return {k: v for k, v in state.items() if "lora_" in k}


def hidden_states_before_layers(model: DeepVRM, images: torch.Tensor, input_ids: torch.Tensor,
                                attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The input of every decoder layer (index k = what layer k sees), captured with forward pre-hooks."""
    seen: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(lambda m, a, kw: seen.append(
        (a[0] if a else kw["hidden_states"]).detach().clone()), with_kwargs=True)
        for layer in decoder_layers(model.vlm)]
    try:
        model(images, input_ids, attention_mask)
    finally:
        for h in handles:
            h.remove()
    return seen


def tiny_config(**overrides: Any) -> DeepVRMModelConfig:
    """The tests' and smoke runs' Deep-VRM (``model=deepvrm_tiny``): a tiny Qwen2.5-VL-class base (``vlm`` sizes,
    pretrained a few steps into ``base_path`` on first use), low LoRA ranks (``overrides`` replace fields)."""
    kw: dict[str, Any] = dict(
        base_path="outputs/deepvrm/base_tiny", image_size=32,
        vlm=dict(family="qwen2_5_vl", hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2, num_kv_heads=1,
                 vision_depth=1, vision_hidden=32, vision_intermediate=64, vision_heads=2, patch_size=8,
                 merge_size=2),
        tokenizer_vocab=300, pretrain_steps=4, pretrain_batch=4, inject_layer=2, lora_rank=2, va_lora_rank=2)
    kw.update(overrides)
    return DeepVRMModelConfig(**kw)


def tiny_example(workdir: Path):
    """The contract test's ``ModelExample``: the ``deepvrm`` arm in stage 2 (residual path on, LoRA made to act)
    around a tiny Qwen2.5-VL base written once into ``workdir/base`` with ``core.vlm.save_vlm``."""
    from core.testing import ModelExample
    from core.vlm import VLMConfig, build_tokenizer, build_vlm, load_tokenizer, save_vlm
    from perception.forensics.configuration_deepvrm import EXPLAIN_PROMPT, VERDICT_PROMPT

    base = (Path(workdir) / "base").resolve()
    if not (base / "config.json").is_file():
        tok = build_tokenizer([VERDICT_PROMPT, EXPLAIN_PROMPT, "real", "fake", "fake. it is upsampled"] * 4,
                              vocab_size=300)
        vcfg = VLMConfig(vocab_size=len(tok), **{**tiny_config().vlm, "num_layers": 3})
        with torch.random.fork_rng():
            torch.manual_seed(0)
            vlm = build_vlm(vcfg)
        save_vlm(base, vlm, tok, vcfg.patch_spec(32))
    tok = load_tokenizer(base)
    config = tiny_config(base_path=str(base), inject_layer=1, lora_alpha=4.0)

    def build() -> DeepVRM:
        model = DeepVRM(config)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # LoRA starts as a no-op (B = 0): make it act, so the outputs depend on it
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05, generator=g)
        return model

    def batch(train: bool) -> dict[str, Any]:
        n = PatchSpec(image_size=32).tokens_per_image
        samples = [encode(tok, VERDICT_PROMPT, a if train else None, n) for a in ("fake", "real. upsampled")]
        b = vlm_collate(samples, int(tok.pad_token_id))
        out = {"images": torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),
               "input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
        if train:
            out = {"image": out["images"], "input_ids": out["input_ids"], "attention_mask": out["attention_mask"],
                   "labels": b["labels"]}
        return out

    return ModelExample(build=build, inputs=lambda: batch(False), train_inputs=lambda: batch(True),
                        run=lambda m, b: m(**b).logits)


__all__ = ["ARMS", "DeepVRM", "IGNORE", "hidden_states_before_layers", "high_pass", "tiny_config", "tiny_example"]
