"""Every method at its paper's size: one bf16 training step and one inference, peak memory, time and MFU.

For each method the model is built through the method's own public classes with its config at the paper's size
(random initialisation: no weights are here, and cost does not depend on the values), on the device, then:

* **training step**: what ``core.trainer.Trainer`` runs per optimiser step — ``training_step(batch)`` under bf16
  autocast (fp32 master weights, as the trainer keeps them), ``loss.float().backward()``, AdamW
  (``core.trainer.build_optimizer``) — on a per-device micro-batch at the paper's resolution, with gradient
  checkpointing on where the row says so (``enable_gradient_checkpointing``: the paper configs' setting for the
  big models). The first step is the warm-up (kernels, the allocator, AdamW's state); the SAME step's FLOPs are
  counted during it by ``torch.utils.flop_counter.FlopCounterMode`` (the real ops, not a formula); the second
  step is timed (CUDA synchronised) with ``torch.cuda.reset_peak_memory_stats`` before it, so ``peak memory``
  is ``torch.cuda.max_memory_allocated`` of a steady-state step: weights + gradients + optimiser state +
  activations. The global RNG is re-seeded before each step, so both run the same random layout.
* **inference**: the method's own inference call (a pipeline's ``predict``, a sampler, a policy step), under
  ``torch.no_grad`` and the same autocast; counted once (warm-up), timed once, peak memory measured the same way.

FLOPs of a checkpointed step include the recomputed forward. The counter tells those apart (ops dispatched while
autograd runs backward with grad mode on are the recompute of ``torch.utils.checkpoint``): ``train_flops`` is
what ran, ``train_recompute_flops`` the recompute part, and **MFU** (model FLOPs utilisation) uses the model's
FLOPs, ``train_flops - train_recompute_flops``; ``train_hfu`` uses all of them. MFU = FLOPs / seconds / the
device's dense bf16 peak, from ``PEAK_BF16_TFLOPS`` keyed by device name (H200: 989 TFLOP/s), overridden by
``BENCH_PEAK_TFLOPS``; null on CPU or an unknown device. Attention kernels without a FLOP formula in torch (CPU
flash attention) count zero, so CPU FLOPs are a lower bound; every CUDA SDPA kernel is counted.

Limit (what cannot be beaten, and why): MFU <= 1 — the dense bf16 tensor-core peak; elementwise work, norms,
attention softmax, the optimiser and host work count no model FLOPs but take time. Ratios (the JSON's
``ratios``, read by ``benchmarks.summary``): ``<method>_train_mfu`` (CUDA only; higher is better) and
``<method>_infer_vs_train_time`` (one inference over one training step, same run: the baseline measured here).

Sizes (rows, ``--methods``): ``PAPER`` below; ``--tiny`` (or ``--quick``) shrinks every width so that all rows
run on a CPU in seconds (the same code path: tests/benchmarks/test_paper_scale.py). A row that runs out of
memory or misses an optional dependency says so (``status``) and the others go on.

    python -m benchmarks.paper_scale [--methods transnormal deepvrm ...] [--tiny] [--device cuda] [--out F.json]

JSON: ``benchmarks/results/paper_scale.json`` (``figures.rows``: one row per method). Rows of a run are merged
into an existing file of the same device and size, so ``benchmarks/gpu_session.sh`` runs one method per process
under its own time cap.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import DTYPES, RESULTS_DIR, bench_dtype, print_table, synchronize, write_result

NAME = "paper_scale"
METHODS = ("transnormal", "deepvrm", "automot", "flexforcing", "tagrpo", "fera", "sola", "lacwm", "bc")

#: Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, matched as substrings of ``torch.cuda.get_device_name()``
#: (longest key first). The vendors' data sheets (SXM parts unless named).
PEAK_BF16_TFLOPS = {
    "H200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H800": 989.0, "GH200": 989.0,
    "B200": 2250.0, "B100": 1750.0, "A100": 312.0, "A800": 312.0, "A10G": 70.0, "A10": 125.0, "A6000": 155.0,
    "L40S": 362.0, "L40": 181.0, "L4": 121.0, "RTX 4090": 165.0, "RTX 3090": 71.0,
}

# Every reported ratio: held to a goal (its target and where the number comes from) or a plain figure.
GOALS: dict = {}  # none: these ratios describe the cost, nothing claims a number for them
FIGURES_ONLY = ("*_infer_vs_train_time", "*_train_mfu")


def peak_flops(device: str) -> tuple[float | None, str]:
    """(dense bf16 peak in FLOP/s or None, where it came from) for ``device``."""
    env = os.environ.get("BENCH_PEAK_TFLOPS")
    if env:
        try:
            value = float(env)
        except ValueError:
            raise SystemExit(f"BENCH_PEAK_TFLOPS={env!r}: expected a number of TFLOP/s") from None
        if not value > 0:
            raise SystemExit(f"BENCH_PEAK_TFLOPS={env!r}: expected a positive number of TFLOP/s")
        return value * 1e12, "BENCH_PEAK_TFLOPS"
    if not str(device).startswith("cuda"):
        return None, "cpu: no MFU"
    name = torch.cuda.get_device_name(torch.device(device))
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key.lower() in name.lower():
            return PEAK_BF16_TFLOPS[key] * 1e12, f"PEAK_BF16_TFLOPS[{key!r}]"
    return None, f"{name}: not in PEAK_BF16_TFLOPS (set BENCH_PEAK_TFLOPS)"


class _GlobalOnly(contextlib.AbstractContextManager):
    """A stand-in for ``FlopCounterMode``'s module tracker that attributes every FLOP to ``Global``."""

    parents = ("Global",)

    def __exit__(self, *args: Any) -> None:
        return None


class StepFlopCounter(FlopCounterMode):
    """``FlopCounterMode`` that also tallies the FLOPs of activation-checkpointing recompute.

    ``torch.utils.checkpoint`` (non-reentrant) recomputes a unit's forward inside the backward pass with grad mode
    enabled; backward formulas themselves run with grad mode off (no ``create_graph``). So an op counted while
    autograd executes a graph task (``torch._C._current_graph_task_id() != -1``) with grad mode on is recompute.
    """

    def __init__(self) -> None:
        super().__init__(display=False)
        self.mod_tracker = _GlobalOnly()  # totals only: no per-module hooks (cheaper on 8 B models, and torch's
        self.recompute_flops = 0  # ModuleTracker fails on some no-grad views: "Expected gradient function")

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet in self.flop_registry and torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1:
            self.recompute_flops += int(self.flop_registry[func_packet](*args, **kwargs, out_val=out))
        return super()._count_flops(func_packet, out, args, kwargs)


@dataclass
class Case:
    """One method's model at one size, with its training step and its inference call.

    ``batch()`` makes a fresh training batch on the device; ``loss(batch)`` is the training objective (default
    ``model.training_step(batch)["loss"]``); ``infer()`` one inference call; ``optimized`` the module whose
    trainable parameters AdamW updates (default the model).
    """

    model: nn.Module
    what: str
    resolution: str
    batch_size: int
    batch: Callable[[], dict[str, Any]]
    infer: Callable[[], Any]
    infer_what: str
    loss: Callable[[dict[str, Any]], torch.Tensor] | None = None
    optimized: nn.Module | None = None
    checkpointing: bool = False
    notes: list[str] = field(default_factory=list)

    def objective(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.loss(batch) if self.loss is not None else self.model.training_step(batch)["loss"]


@dataclass
class Ctx:
    """What a builder gets: the size, the device, the autocast dtype and a scratch folder."""

    tiny: bool
    device: str
    dtype: str
    workdir: Path

    @property
    def bf16(self) -> bool:
        return self.dtype == "bfloat16"

    @contextlib.contextmanager
    def on_device(self):
        """Build parameters directly on the device (an 8 B model is not initialised on the host first)."""
        with torch.device(self.device):
            yield

    def rand(self, *shape: int, seed: int = 0, uint8: bool = False, normal: bool = False) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        if uint8:
            t = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        else:
            t = torch.randn(shape, generator=g) if normal else torch.rand(shape, generator=g)
        return t.to(self.device)


def build_on(ctx: Ctx, fn: Callable[[], nn.Module], notes: list[str]) -> nn.Module:
    """``fn()`` under the device context, moved to the device; on failure there, built on the host and moved."""
    try:
        with ctx.on_device():
            model = fn()
    except (RuntimeError, TypeError, ValueError) as e:
        if ctx.device == "cpu":
            raise
        notes.append(f"built on the host ({type(e).__name__} under torch.device({ctx.device!r}))")
        model = fn()
    return model.to(ctx.device)


def checkpointing(model: nn.Module, notes: list[str]) -> bool:
    """``model.enable_gradient_checkpointing()``; False (with a note) where the model cannot."""
    try:
        model.enable_gradient_checkpointing()
        return True
    except (AttributeError, ValueError, NotImplementedError, RuntimeError, TypeError) as e:
        notes.append(f"no gradient checkpointing ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
        return False


# ------------------------------------------------------------------------------------------------ the rows
def _vlm_sizes(family: str, tiny: bool) -> dict[str, Any]:
    """``core.vlm.VLMConfig`` fields: the published Qwen2.5-VL-7B / Qwen3-VL-4B (tests/test_paper_sizes.py) or tiny.

    ``VLMConfig`` gives Qwen2.5-VL's ViT full attention in every block (the release windows 28 of 32 blocks to 112
    px): the same parameters, slightly more vision FLOPs.
    """
    if tiny:
        sizes = dict(family=family, vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                     num_kv_heads=2, vision_depth=2, vision_hidden=32, vision_intermediate=64, vision_heads=2,
                     patch_size=8, merge_size=2)
        return {**sizes, "head_dim": 16, "deepstack_indexes": [0]} if family == "qwen3_vl" else sizes
    if family == "qwen2_5_vl":
        return dict(family=family, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                    num_heads=28, num_kv_heads=4, vision_depth=32, vision_hidden=1280, vision_intermediate=3420,
                    vision_heads=16, patch_size=14, merge_size=2, temporal_patch_size=2, max_positions=128000,
                    tie_word_embeddings=False)
    return dict(family=family, vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36,
                num_heads=32, num_kv_heads=8, vision_depth=24, vision_hidden=1024, vision_intermediate=4096,
                vision_heads=16, patch_size=16, merge_size=2, temporal_patch_size=2, max_positions=262144,
                tie_word_embeddings=True, head_dim=128, mrope_section=[24, 20, 20], deepstack_indexes=[5, 11, 17],
                vision_position_embeddings=2304)


def transnormal(ctx: Ctx) -> Case:
    """SD2 UNet + SD VAE + DINOv3 ViT-L/16 at 768 px (``experiment=transnormal_paper``), micro-batch 2."""
    from core.config import compose, to_object
    from perception.normals.modeling_transnormal import TransNormalModel, tiny_config
    from perception.normals.pipeline_transnormal import TransNormalPipeline

    notes: list[str] = []
    if ctx.tiny:
        cfg = tiny_config()
    else:
        cfg = to_object(compose(["experiment=transnormal_paper"]).model)
    s, b = cfg.image_size, 2
    model = build_on(ctx, lambda: TransNormalModel(cfg), notes)
    ckpt = checkpointing(model, notes)  # the paper config's trainer.gradient_checkpointing
    pipe = TransNormalPipeline(model, device=ctx.device, dtype=torch.bfloat16 if ctx.bf16 else None)
    x = ctx.rand(1, 3, s, s, seed=1) * 2 - 1

    def batch() -> dict[str, Any]:
        return {"rgb": ctx.rand(b, 3, s, s, uint8=True), "rgb_twin": ctx.rand(b, 3, s, s, seed=1, uint8=True),
                "normals": torch.nn.functional.normalize(ctx.rand(b, 3, s, s, seed=2, normal=True), dim=1),
                "valid": ctx.rand(b, s, s, seed=3) > 0.1}

    return Case(model, "SD2 UNet + SD VAE + DINOv3 ViT-L/16 (single-step)", f"{s}x{s}", b, batch,
                lambda: pipe.predict(x), "pipeline.predict, 1 image", checkpointing=ckpt, notes=notes)


def deepvrm(ctx: Ctx) -> Case:
    """Deep-VRM on Qwen2.5-VL-7B (``model=deepvrm_paper``: 448 px, K = 16, LoRA 16 + V_a), micro-batch 4."""
    import dataclasses

    from core.config import compose, to_object
    from core.vlm import VLMConfig, build_tokenizer, build_vlm, encode, vlm_collate
    from perception.forensics.configuration_deepvrm import VERDICT_PROMPT
    from perception.forensics.modeling_deepvrm import DeepVRM
    from perception.forensics.task import tokenizer_corpus

    notes: list[str] = []
    name = "deepvrm_tiny" if ctx.tiny else "deepvrm_paper"
    m = to_object(compose([f"model={name}", "model.base_path=unused"]).model)
    if ctx.tiny:
        m = dataclasses.replace(m, image_size=32, inject_layer=2)
    tok = build_tokenizer(tokenizer_corpus([]), vocab_size=400)
    vcfg = VLMConfig(**_vlm_sizes("qwen2_5_vl", ctx.tiny))

    def make() -> nn.Module:
        vlm = build_vlm(vcfg)
        if ctx.bf16:  # model.base_dtype=bfloat16, as the paper config advises for the 7B (the base is frozen)
            vlm.to(torch.bfloat16)
        return DeepVRM(dataclasses.replace(m, base_dtype="bfloat16" if ctx.bf16 else m.base_dtype),
                       base=(vlm, tok))

    model = build_on(ctx, make, notes)
    ckpt = checkpointing(model, notes)
    b, s = 4, m.image_size
    n = model.spec.tokens_per_image
    images = ctx.rand(b, 3, s, s)
    answers = ["fake", "real", "fake. it is upsampled", "real"][:b]
    coll = vlm_collate([encode(tok, VERDICT_PROMPT, a, n) for a in answers], int(tok.pad_token_id))

    def batch() -> dict[str, Any]:
        return {"image": images, **{k: coll[k].to(ctx.device) for k in ("input_ids", "attention_mask", "labels")}}

    return Case(model, "Deep-VRM (LoRA r16 on layers >= 16 + V_a) on Qwen2.5-VL-7B", f"{s}x{s}", b, batch,
                lambda: model.prob_fake(images, VERDICT_PROMPT), f"prob_fake (2 answers scored), {b} images",
                checkpointing=ckpt, notes=notes)


def automot(ctx: Ctx) -> Case:
    """AutoMoT: Qwen3-VL-4B understanding expert + a 36-layer action expert of width 1024 (``AutoMoTConfig``'s
    defaults), 2 front frames at 448 px (196 tokens each), the ``automot`` arm (both experts trained)."""
    import dataclasses

    from core.config import compose, to_object
    from core.vlm import VLMConfig, build_tokenizer, build_vlm
    from driving.automot.configuration_automot import META_ACTIONS, REASON_PROMPT
    from driving.automot.inputs import model_batch
    from driving.automot.task import build_policy, predict_waypoints

    notes: list[str] = []
    m = to_object(compose(["model=automot"]).model)
    if ctx.tiny:
        m = dataclasses.replace(m, image_size=32, history=1, mot={**m.mot, "expert_hidden_size": 32,
                                                                  "expert_intermediate_size": 64})
    else:
        m = dataclasses.replace(m, image_size=448, mot={**m.mot, "expert_hidden_size": 1024,
                                                        "expert_intermediate_size": 4096})
    tok = build_tokenizer([REASON_PROMPT, "keep lane slow down change left right accelerate stop turn in m "
                           "follow the road a car ahead the road is free", *META_ACTIONS] * 4, vocab_size=300)
    vcfg = VLMConfig(**_vlm_sizes("qwen3_vl", ctx.tiny))
    vla = build_on(ctx, lambda: build_policy(m, build_vlm(vcfg), tok), notes)
    ckpt = checkpointing(vla, notes)
    b, c, s = 2, vla.mot.cfg, m.image_size

    def sample(train: bool) -> dict[str, Any]:
        g = torch.Generator().manual_seed(0)
        x = {"images": torch.rand(b, m.history, 3, s, s, generator=g),
             "bev": (torch.rand(b, c.bev_channels, 64, 64, generator=g) > 0.8).float(),
             "target_points": torch.randn(b, c.n_target, 2, generator=g) * 10,
             "ego": torch.randn(b, c.ego_dim, generator=g),
             "instruction": ["Turn left in 35 m. Drive through the intersection.", "Follow the road."][:b]}
        if train:
            x.update(meta_action=torch.tensor([0, 2][:b]), route=torch.randn(b, c.n_route, 2, generator=g),
                     waypoints=torch.randn(b, c.n_wp, 2, generator=g).cumsum(1),
                     velocity=torch.rand(b, generator=g) * 10)
        out = model_batch(x, vla.prompter, vla.spec, questions=[REASON_PROMPT] * b if train else None,
                          lm_answers=["slow_down: a car ahead", "keep_lane: the road is free"][:b] if train else None)
        return {k: v.to(ctx.device) if isinstance(v, torch.Tensor) else v for k, v in out.items()}

    train_batch, act_batch = sample(True), sample(False)
    return Case(vla, "AutoMoT: Qwen3-VL-4B + action expert (w 1024, 36 layers), joint attention",
                f"{m.history}x{s}x{s} front frames", b, lambda: train_batch,
                lambda: predict_waypoints(vla, act_batch, refine=True), f"one control step (+ refiner), {b} cars",
                checkpointing=ckpt, notes=notes)


def _wan21_vae_config() -> dict[str, Any]:
    """The default diffusers ``AutoencoderKLWan()`` config (Wan2.1's VAE: z 16, 8x space, 4x time), read off a
    meta-device build."""
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        vae = AutoencoderKLWan()
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dict(vae.config).items() if not k.startswith("_")}


def _flex_config(tiny: bool):
    """Flex-Forcing's ``FlexForcingConfig`` on Wan2.1-T2V-1.3B itself: ``core.layers.wan.WAN21_1_3B`` (dim 1536, 30
    blocks, 12 heads, FFN 8960, 16 latent channels, patch 1 x 2 x 2) run by ``CausalWan`` with the K-projection,
    behind the default Wan2.1 ``AutoencoderKLWan()``, over 21 latent frames (Wan's 81-frame clip) of 480 x 832 px
    (60 x 104 latents: 1,560 tokens a frame, 32,760 a clip). ``--tiny``: the tests' ``tiny_config()``."""
    from perception.video.configuration_flexforcing import FlexForcingConfig

    if tiny:
        from perception.video.modeling_flexforcing import tiny_config

        return tiny_config(sample_steps=2, pyramid_levels=2)
    from core.layers.wan import WAN21_1_3B

    return FlexForcingConfig(frame_size=[480, 832], transformer_config=dict(WAN21_1_3B),
                             vae_config=_wan21_vae_config(), num_frames=21, k_projection=True)


def flexforcing_sizes(tiny: bool = False) -> dict[str, Any]:
    """Parameter counts and token layout of the flexforcing row's model.

    At paper size its parts are built on the meta device (no memory): ``CausalWan.from_config(WAN21_1_3B,
    k_projection=True)`` and ``AutoencoderKLWan(**vae_config)``; ``tiny`` builds the tiny model on the CPU.
    Returns ``transformer`` (the diffusers ``WanTransformer3DModel``: 1,418,996,800 at Wan2.1-1.3B), ``kproj`` (the
    added K-projection), ``vae`` and the latent layout of one training window.
    """
    from diffusers import AutoencoderKLWan

    from core.layers.wan import CausalWan
    from perception.video.modeling_flexforcing import FlexForcingModel

    cfg = _flex_config(tiny)
    if cfg.transformer_config is not None and cfg.vae_config is not None:
        with torch.device("meta"):
            dit = CausalWan.from_config(cfg.transformer_config, cfg.k_projection)
            vae = AutoencoderKLWan(**cfg.vae_config)
        patch = int(cfg.transformer_config["patch_size"][1])
    else:
        model = FlexForcingModel(cfg)
        dit, vae, patch = model.dit, model.vae, model.config.patch
    h, w = cfg.latent_hw
    per_frame = (h // patch) * (w // patch)
    return {"transformer": sum(p.numel() for p in dit.transformer.parameters()),
            "kproj": sum(p.numel() for p in dit.kproj.parameters()) if dit.kproj is not None else 0,
            "vae": sum(p.numel() for p in vae.parameters()), "latent_frames": cfg.num_frames,
            "video_frames": cfg.video_frames, "frame_hw": list(cfg.frame_hw), "latent_hw": [h, w],
            "latent_channels": int(vae.config.z_dim), "tokens_per_frame": per_frame,
            "tokens": per_frame * cfg.num_frames}


def flexforcing(ctx: Ctx) -> Case:
    """Flex-Forcing's ``FlexForcingModel`` on Wan2.1-T2V-1.3B + the Wan2.1 VAE (``_flex_config``), one clip per step.

    The training step runs on pre-encoded latents, as ``perception.video.task`` trains (every source video is
    encoded once by the frozen VAE); inference is flex generation of the clip from one first-frame latent, decoded.
    """
    from perception.video.modeling_flexforcing import FlexForcingModel
    from perception.video.pipeline_flexforcing import generate

    notes: list[str] = []
    cfg = _flex_config(ctx.tiny)
    sizes = flexforcing_sizes(ctx.tiny)
    notes.append(f"sizes ({'CPU' if ctx.tiny else 'meta device'}): transformer {sizes['transformer']:,} + "
                 f"K-projection {sizes['kproj']:,} parameters, VAE {sizes['vae']:,}; "
                 f"{sizes['tokens_per_frame']:,} tokens a latent frame, {sizes['tokens']:,} a clip")
    model = build_on(ctx, lambda: FlexForcingModel(cfg), notes)
    ckpt = checkpointing(model, notes)
    mc = model.config
    f, (h, w), (hh, ww) = mc.num_frames, mc.frame_hw, mc.latent_hw
    latents = ctx.rand(1, f, mc.latent_channels, hh, ww, normal=True)
    first = ctx.rand(1, 1, mc.latent_channels, hh, ww, seed=1, normal=True)

    def infer():
        gen = generate(model, first, f - 1, "flex", generator=torch.Generator().manual_seed(0))
        return model.decode(gen.latents)

    what = ("Flex-Forcing on Wan2.1-T2V-1.3B (diffusers WanTransformer3DModel via CausalWan, + K-projection) + Wan2.1 "
            "AutoencoderKLWan" if not ctx.tiny else "Flex-Forcing tiny_config() (Wan classes)")
    return Case(model, what, f"{f} latent frames ({mc.video_frames} video) x {h}x{w}", 1,
                lambda: {"latents": latents}, infer,
                f"flex generation of {f - 1} latent frames ({mc.sample_steps} steps) + VAE decode to "
                f"{mc.video_frames} frames", checkpointing=ckpt, notes=notes)


def tagrpo(ctx: Ctx) -> Case:
    """TAGRPO's ``I2VPolicy`` around the flexforcing row's base (Wan2.1-T2V-1.3B, saved with its own
    ``save_pretrained`` and loaded through the registry), a group of 2 rollouts of one image."""
    from perception.i2v_rl.configuration_tagrpo import AlgoConfig, TAGRPOModelConfig
    from perception.i2v_rl.grpo import contrastive_loss, group_advantages
    from perception.i2v_rl.modeling_tagrpo import I2VPolicy
    from perception.video.modeling_flexforcing import FlexForcingModel

    notes: list[str] = []
    cfg = _flex_config(ctx.tiny)
    base = ctx.workdir / "flexforcing_base"
    backbone = build_on(ctx, lambda: FlexForcingModel(cfg), notes)
    backbone.save_pretrained(base, card={"data": "random (benchmarks.paper_scale)"})
    del backbone
    policy = build_on(ctx, lambda: I2VPolicy(TAGRPOModelConfig(base_path=str(base))), notes)
    ckpt = checkpointing(policy.backbone, notes)
    algo = AlgoConfig()
    k, (h, w) = 2, cfg.frame_hw  # a group of 2 rollouts of one image: the smallest group with an advantage
    images = ctx.rand(k, 3, h, w, uint8=True)
    first = policy.encode_first(images)
    policy.eval()
    with torch.no_grad(), _autocast(ctx):
        traj = policy.rollout(first, policy.initial_noise(k, torch.Generator().manual_seed(0)), algo.eta,
                              torch.Generator().manual_seed(1))
    adv = group_advantages(torch.tensor([1.0, 0.0], device=ctx.device))
    step = policy.steps // 2  # one SDE transition of the trajectory per update (timestep_fraction = 1 / steps)

    def loss(_: dict[str, Any]) -> torch.Tensor:
        mean_new, std = policy.transition(first, traj.latents[:, step], step, algo.eta)
        value, _ = contrastive_loss(mean_new, traj.means[:, step], traj.latents[:, step + 1], std, adv,
                                    torch.arange(k, device=ctx.device), algo.clip_range, algo.contrast_weight)
        return value

    def infer():
        return policy.decode_video(images[:1], policy.sample(first[:1], traj.latents[:1, 0]))

    notes.append(f"step = one TAGRPO update on 1 of {policy.steps} transitions of a group of {k} rollouts")
    what = "TAGRPO I2VPolicy on the Flex-Forcing " + ("tiny_config() base" if ctx.tiny else "Wan2.1-T2V-1.3B base")
    return Case(policy, what + " (first frame a clean latent, Wan2.2-TI2V's layout)",
                f"{policy.frames} latent frames ({policy.video_frames} video) x {h}x{w}", k, lambda: {}, infer,
                f"ODE sample ({policy.steps} steps) + decode, 1 video", loss=loss, optimized=policy.trainable(),
                checkpointing=ckpt, notes=notes)


def fera(ctx: Ctx) -> Case:
    """FeRA (``adapter=fera``: 3 rank-4 experts, 3 bands, FECL) on an SD2-class UNet (320-640-1280-1280, 2 layers
    per block, 64-wide heads, 1024-d cross-attention) over SD's 64 x 64 x 4 latents (512 px images)."""
    from core.config import compose, to_object
    from perception.adapters.backbones import BackboneConfig, FlowDenoiser
    from perception.adapters.modeling_fera import AdaptedDenoiser, tiny_config
    from perception.adapters.pipeline_fera import sample_images

    notes: list[str] = []
    adapter = to_object(compose(["adapter=fera"]).adapter)
    if ctx.tiny:
        bcfg = tiny_config("unet", channels=4).backbone()
    else:
        bcfg = BackboneConfig(kind="unet", image_size=64, channels=4, block_out_channels=[320, 640, 1280, 1280],
                              layers_per_block=2, attention_head_dim=64, cross_attention_dim=1024, context_tokens=77,
                              norm_num_groups=32, attention_levels=[True, True, True, False])
    model = build_on(ctx, lambda: AdaptedDenoiser.around(FlowDenoiser(bcfg), adapter), notes)
    b, s, steps = 8, bcfg.image_size, 2 if ctx.tiny else 20
    latents = ctx.rand(b, bcfg.channels, s, s, normal=True).clamp(-1, 1)
    return Case(model, "FeRA experts on an SD2-class UNet (latent space)", f"{s}x{s}x{bcfg.channels} latents", b,
                lambda: {"image": latents}, lambda: sample_images(model, 4, steps=steps, batch_size=4),
                f"{steps}-step Euler sampling of 4 latents", notes=notes)


def sola(ctx: Ctx) -> Case:
    """SoLA at the schema's (GPU) size: icosphere level 5 (10,242 vertices), 4 stages 32-256, on 512 x 1024
    equirectangular panoramas."""
    from perception.spherical.configuration_sola import SoLAConfig
    from perception.spherical.modeling_sola import SoLAModel, tiny_config

    notes: list[str] = []
    cfg = tiny_config() if ctx.tiny else SoLAConfig()
    h = 16 if ctx.tiny else 512
    model = build_on(ctx, lambda: SoLAModel(cfg), notes)
    b = 4
    rgb = ctx.rand(b, 3, h, 2 * h, uint8=True)
    data = {"rgb": rgb, "depth": 0.5 + 4 * ctx.rand(b, 1, h, 2 * h, seed=1),
            "semantic": (ctx.rand(b, h, 2 * h, seed=2) * cfg.num_classes).long()}
    return Case(model, f"SoLA U-transformer, icosphere level {cfg.level}", f"{h}x{2 * h} panoramas", b,
                lambda: data, lambda: model.predict(rgb), f"predict, {b} panoramas", notes=notes)


def lacwm(ctx: Ctx) -> Case:
    """LAC-WM at its schema's (paper) sizes: 64 px frames, 8 px patches, width 128, IDM 2 + FDM 4 blocks."""
    from worldmodels.lacwm.configuration_lacwm import LACWMConfig
    from worldmodels.lacwm.modeling_lacwm import LACWorldModel, tiny_config

    notes: list[str] = []
    cfg = tiny_config(fdm_depth=1) if ctx.tiny else LACWMConfig()
    model = build_on(ctx, lambda: LACWorldModel(cfg), notes)
    b, s, k = 32, cfg.image_size, cfg.context
    frames = ctx.rand(b, k + 1, 3, s, s, uint8=True)
    data = {"frames": frames, "motion": ctx.rand(b, k, cfg.motion_dim, seed=1, normal=True),
            "embodiment_id": torch.zeros(b, dtype=torch.int64, device=ctx.device)}
    horizon = 8

    def infer():
        x = model.codec.to_float(frames)
        z = model.encode_pairs(x)[:, :1].expand(b, horizon, -1)
        return model.imagine(frames[:, 0], z)

    return Case(model, "LAC-WM (IDM -> latent action -> FDM)", f"{s}x{s}", b, lambda: data, infer,
                f"{horizon}-step imagined rollout, {b} clips", notes=notes)


def bc(ctx: Ctx) -> Case:
    """Behaviour cloning at its schema's sizes (64 px, keypoint CNN 32-64-128, hidden 256, 8-step chunks) with a
    7-d action and 9-d proprio (a Franka arm's), batch 64."""
    from worldmodels.bc.configuration_bc import BCConfig
    from worldmodels.bc.modeling_bc import BCPolicyModel, tiny_config

    notes: list[str] = []
    cfg = tiny_config(action_dim=7, proprio_dim=9) if ctx.tiny else BCConfig(action_dim=7, proprio_dim=9)
    model = build_on(ctx, lambda: BCPolicyModel(cfg), notes)
    b, s = 64, cfg.image_size
    image, proprio = ctx.rand(b, 3, s, s, uint8=True), ctx.rand(b, cfg.proprio_dim, seed=1, normal=True)
    data = {"obs.image": image[:, None], "obs.proprio": proprio[:, None],
            "actions": ctx.rand(b, cfg.horizon, cfg.action_dim, seed=2, normal=True),
            "actions_is_pad": torch.zeros(b, cfg.horizon, dtype=torch.bool, device=ctx.device)}
    return Case(model, "BC keypoint-CNN policy with action chunks", f"{s}x{s}", b, lambda: data,
                lambda: model(image, proprio), f"action chunk for {b} observations", notes=notes)


BUILDERS: dict[str, Callable[[Ctx], Case]] = {
    "transnormal": transnormal, "deepvrm": deepvrm, "automot": automot, "flexforcing": flexforcing,
    "tagrpo": tagrpo, "fera": fera, "sola": sola, "lacwm": lacwm, "bc": bc,
}
assert tuple(BUILDERS) == METHODS


# ------------------------------------------------------------------------------------------------ measuring
def _autocast(ctx: Ctx) -> contextlib.AbstractContextManager:
    if not ctx.bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=ctx.device.split(":")[0], dtype=torch.bfloat16)


def _rss_hwm() -> int | None:
    """This process's resident-set high-water mark (bytes; Linux), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak(device: str) -> None:
    synchronize(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current resident set
            f.write("5")


def _peak(device: str) -> int | None:
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device)) if device.startswith("cuda") else _rss_hwm()


def _timed(fn: Callable[[], Any], device: str) -> tuple[float, int | None]:
    """(seconds, peak memory bytes) of one call, device synchronised."""
    _reset_peak(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0, _peak(device)


def _counted(fn: Callable[[], Any], device: str) -> tuple[int, int]:
    """(FLOPs, recompute FLOPs) of one call (the warm-up)."""
    counter = StepFlopCounter()
    with counter:
        fn()
    synchronize(device)
    return int(counter.get_total_flops()), int(counter.recompute_flops)


def _status(e: BaseException) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower():
        return "OOM: " + str(e).splitlines()[0][:160]
    if isinstance(e, ImportError):
        return f"missing dependency: {getattr(e, 'name', None) or str(e).splitlines()[0][:120]}"
    return f"error: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def measure(case: Case, ctx: Ctx, peak: float | None) -> dict[str, Any]:
    """The row's measurements (see the module docstring); a failing phase sets ``status`` and the other runs."""
    from core.config import TrainerConfig
    from core.layers.checkpointing import is_checkpointed, uncheckpoint_modules
    from core.trainer import build_optimizer

    device, model = ctx.device, case.model
    row: dict[str, Any] = {"status": "ok"}
    optimizer = build_optimizer(case.optimized if case.optimized is not None else model, TrainerConfig())

    def step() -> None:
        torch.manual_seed(0)
        optimizer.zero_grad(set_to_none=True)
        with _autocast(ctx):
            loss = case.objective(case.batch())
        if not torch.isfinite(loss.detach()).all():
            raise FloatingPointError(f"non-finite loss {float(loss)}")
        loss.float().backward()
        optimizer.step()

    def train() -> None:
        model.train()
        flops, recompute = _counted(step, device)  # the warm-up step, counted
        seconds, mem = _timed(step, device)
        row.update(train_step_s=seconds, train_peak_memory_bytes=mem, train_flops=flops,
                   train_recompute_flops=recompute, train_model_flops=flops - recompute)
        if peak:
            row.update(train_mfu=(flops - recompute) / seconds / peak, train_hfu=flops / seconds / peak)

    try:
        try:
            train()
        except Exception as e:
            # the generic checkpointing (core.layers.checkpointing) broke the step: say so, measure without it
            if not case.checkpointing or _status(e).startswith("OOM") or not any(
                    is_checkpointed(m) for m in model.modules()):
                raise
            case.notes.append(f"the step fails with gradient checkpointing ({_status(e)}): measured without")
            uncheckpoint_modules(model)
            case.checkpointing = False
            _free(device)
            train()
    except Exception as e:  # noqa: BLE001 - the row reports it; the other rows go on
        row["status"] = "train " + _status(e)
        row["traceback"] = traceback.format_exc(limit=-3)
    row["checkpointing"] = case.checkpointing
    optimizer.zero_grad(set_to_none=True)
    optimizer.state.clear()  # AdamW's moments: inference's peak memory is the model's alone
    _free(device)

    def infer() -> None:
        torch.manual_seed(0)
        with torch.no_grad(), _autocast(ctx):
            case.infer()

    try:
        model.eval()
        flops, _ = _counted(infer, device)
        seconds, mem = _timed(infer, device)
        row.update(infer_s=seconds, infer_peak_memory_bytes=mem, infer_flops=flops)
        if peak:
            row["infer_mfu"] = flops / seconds / peak
    except Exception as e:  # noqa: BLE001
        row["status"] = ("" if row["status"] == "ok" else row["status"] + "; ") + "infer " + _status(e)
        row.setdefault("traceback", traceback.format_exc(limit=-3))
    if "train_step_s" in row and "infer_s" in row:
        row["infer_vs_train_time"] = row["infer_s"] / row["train_step_s"]
    return row


def run_method(method: str, ctx: Ctx, peak: float | None) -> dict[str, Any]:
    """Build ``method``'s case and measure it; a failure to build becomes the row's status."""
    row: dict[str, Any] = {"method": method}
    t0 = time.perf_counter()
    case = None
    try:
        torch.manual_seed(0)
        case = BUILDERS[method](ctx)
        model = case.model
        trainable = case.optimized if case.optimized is not None else model
        row.update(what=case.what, resolution=case.resolution, batch=case.batch_size,
                   parameters=sum(p.numel() for p in model.parameters()),
                   trainable_parameters=sum(p.numel() for p in trainable.parameters() if p.requires_grad),
                   checkpointing=case.checkpointing, infer_what=case.infer_what)
        row["build_s"] = time.perf_counter() - t0
        row.update(measure(case, ctx, peak))
        row["notes"] = list(case.notes)
    except Exception as e:  # noqa: BLE001 - the row reports it; the other rows go on
        row["status"] = "build " + _status(e)
        row["traceback"] = traceback.format_exc(limit=-3)
        row["notes"] = list(case.notes) if case is not None else []
    row.setdefault("checkpointing", False)
    for key in ("train_step_s", "train_peak_memory_bytes", "train_flops", "train_mfu", "infer_s",
                "infer_peak_memory_bytes", "infer_flops", "infer_mfu"):
        row.setdefault(key, None)
    row["wall_s"] = time.perf_counter() - t0
    del case
    _free(ctx.device)
    return row


# ------------------------------------------------------------------------------------------------ main
def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=list(METHODS), metavar="METHOD",
                   help=f"rows to run (default all: {' '.join(METHODS)}; commas also separate)")
    p.add_argument("--tiny", action="store_true", help="shrunk widths: every row in seconds on a CPU (tests)")
    p.add_argument("--quick", action="store_true", help="the same as --tiny (make bench)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu) | cpu | cuda[:i]")
    p.add_argument("--dtype", default=os.environ.get("BENCH_DTYPE", "auto"), choices=DTYPES,
                   help="autocast precision (auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / f"{NAME}.json", help="result JSON")
    args = p.parse_args(argv)
    methods = [m for item in args.methods for m in item.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        p.error(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    args.methods = list(dict.fromkeys(methods))
    args.tiny = args.tiny or args.quick
    return args


def _previous_rows(path: Path, device: str, tiny: bool) -> list[dict[str, Any]]:
    """Rows of an earlier run in ``path`` on the same device and size (merged with this run's)."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return []
    if rec.get("device") != device or bool(rec.get("quick")) != tiny:
        return []
    rows = rec.get("figures", {}).get("rows", [])
    return [r for r in rows if isinstance(r, dict) and r.get("method") in METHODS]


def _fmt_bytes(n: int | None) -> str:
    return "" if n is None else f"{n / 2**30:.2f} GiB"


def _fmt(v: float | None, scale: float = 1.0, spec: str = ".3g") -> str:
    return "" if v is None or not math.isfinite(v) else format(v * scale, spec)


def table(rows: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The printed view of the rows."""
    def count(n: int | None) -> str:
        return "" if not n else f"{n / 1e9:.3f} B" if n >= 1e8 else f"{n / 1e6:.3g} M"

    return [{"method": r["method"], "params": count(r.get("parameters")), "resolution": r.get("resolution", ""), "batch": str(r.get("batch", "")),
             "ckpt": "yes" if r.get("checkpointing") else "no",
             "train s": _fmt(r.get("train_step_s")), "train peak": _fmt_bytes(r.get("train_peak_memory_bytes")),
             "train TFLOP": _fmt(r.get("train_flops"), 1e-12), "MFU": _fmt(r.get("train_mfu"), 100, ".1f"),
             "infer s": _fmt(r.get("infer_s")), "infer peak": _fmt_bytes(r.get("infer_peak_memory_bytes")),
             "infer MFU": _fmt(r.get("infer_mfu"), 100, ".1f"), "infer/train": _fmt(r.get("infer_vs_train_time")),
             "status": r["status"]} for r in rows]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: CUDA is not available here")
    os.environ["BENCH_DTYPE"] = args.dtype
    dtype = bench_dtype(device)
    peak, peak_source = peak_flops(device)
    dev_name = f"{device} ({torch.cuda.get_device_name(torch.device(device))})" if device.startswith("cuda") else device
    if device == "cpu":
        torch.set_num_threads(max(1, min(torch.get_num_threads(), 4)))
    rows = []
    with tempfile.TemporaryDirectory(prefix="paper_scale_") as tmp:
        for method in args.methods:
            ctx = Ctx(tiny=args.tiny, device=device, dtype=dtype, workdir=Path(tmp) / method)
            ctx.workdir.mkdir(parents=True)
            print(f"== {method} ({'tiny' if args.tiny else 'paper size'}, {dtype}, {device})", flush=True)
            row = run_method(method, ctx, peak)
            if row["status"] != "ok":
                print(f"   {row['status']}")
            rows.append(row)
    done = {r["method"] for r in rows}
    merged = [r for r in _previous_rows(args.out, dev_name, args.tiny) if r["method"] not in done] + rows
    merged.sort(key=lambda r: METHODS.index(r["method"]))
    print_table(table(merged))
    ratios: dict[str, float] = {}
    for r in merged:
        if r.get("infer_vs_train_time") is not None:
            ratios[f"{r['method']}_infer_vs_train_time"] = r["infer_vs_train_time"]
        if r.get("train_mfu") is not None:
            ratios[f"{r['method']}_train_mfu"] = r["train_mfu"]
    figures = {"rows": merged, "peak_flops": peak, "peak_source": peak_source,
               "memory": "torch.cuda.max_memory_allocated of the timed call (weights, gradients, optimiser state "
                         "and activations); CPU: the process's resident-set high-water mark (VmHWM) over it",
               "flops": "torch.utils.flop_counter.FlopCounterMode on the warm-up call; MFU from model FLOPs "
                        "(without checkpointing recompute)",
               "wall_clock": time.strftime("%Y-%m-%d %H:%M")}
    config = {"methods": [r["method"] for r in merged], "tiny": args.tiny, "dtype": dtype,
              "optimizer": "core.trainer.build_optimizer(TrainerConfig()) (AdamW)", "torch": torch.__version__}
    write_result(args.out.stem, dev_name, args.tiny, ratios, figures, config, results_dir=args.out.parent,
                 goals=GOALS, figures_only=FIGURES_ONLY)


if __name__ == "__main__":
    main()
