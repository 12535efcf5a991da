"""``embodied train fera`` / ``embodied eval fera``: few-shot adaptation of a small diffusion model, one arm.

train: [the base: a pixel-space rectified-flow model on a diffusers backbone (``model.kind`` unet | dit),
pretrained on the source domain (simulator motion-clip frames) into ``model.base_path`` unless a finished
checkpoint is there; several arms share it, a lock keeps two runs from pretraining it at once] -> the adapter
arm ``adapter`` (FeRA, its ablations, or peft's LoRA / DoRA) injected on the frozen base -> the core Trainer on
``data.shots`` crops of real videos -> ``<out_dir>/adapter`` (adapter-only folder: ``save_fera`` /
``save_lora``) and ``<out_dir>/curve.json`` (held-out loss per noise level every ``data.eval_every`` steps;
step 0 is the unadapted base).

evaluate: the base from ``model.base_path`` + the adapter folder -> on ``data.test_n`` held-out crops: the
denoising loss at each noise level of ``data.levels`` (fixed noise, the same for every arm), FD-EffNet of
``data.fd_samples`` Euler samples against the held-out crops (the frozen ImageNet EfficientNet-Lite0 of
``core.metrics.features``; small-sample FD: compare arms, not against published FIDs), the trainable
parameter count, and for FeRA the mean routing weights per noise level. Also the base's own figures
(cached in ``model.base_path/eval_base.json``). Writes ``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.errors import CheckpointError, ConfigError
from core.io import read_json, write_json
from core.logging import get_logger
from perception.adapters.configuration_fera import AdapterConfig, FeRADataConfig, FeRAModelConfig

log = get_logger("embodied.fera")

ADAPTER_DIR = "adapter"
CURVE_FILE = "curve.json"
BASE_EVAL_FILE = "eval_base.json"


# -- the base --------------------------------------------------------------------------------------------------
def build_denoiser(model_cfg: FeRAModelConfig) -> nn.Module:
    from perception.adapters.backbones import FlowDenoiser

    return FlowDenoiser(model_cfg.backbone())


def _backbone_signature(model_cfg: FeRAModelConfig) -> dict[str, Any]:
    return dataclasses.asdict(model_cfg.backbone())


def load_base(model_cfg: FeRAModelConfig) -> nn.Module:
    """The pretrained base denoiser from ``model.base_path`` (its newest checkpoint); frozen, eval mode."""
    from core import checkpoint as ckpt

    base_dir = Path(model_cfg.base_path)
    latest = ckpt.latest_checkpoint(base_dir / "checkpoints")
    if latest is None:
        raise CheckpointError(f"{base_dir}: no base checkpoint (run `embodied train fera` to pretrain it)")
    model = build_denoiser(model_cfg)
    loaded = ckpt.load_checkpoint(latest, model)
    saved = loaded["config"].get("backbone")
    if saved is not None and saved != _backbone_signature(model_cfg):
        raise ConfigError(f"{base_dir}: its base was built with another backbone config; pick another "
                          "model.base_path")
    return model.eval().requires_grad_(False)


def source_dataset(model_cfg: FeRAModelConfig, data: FeRADataConfig):
    from perception.adapters.data import ImageTensorDataset, source_images

    root = Path(data.source_root) / f"{model_cfg.image_size}px"  # one rendering per resolution
    imgs = source_images(root, model_cfg.image_size, data.source_clips, data.source_frames, data.seed)
    return ImageTensorDataset(imgs, flip=data.flip)


def ensure_base(model_cfg: FeRAModelConfig, data: FeRADataConfig, trainer_cfg: TrainerConfig) -> nn.Module:
    """Pretrain the base on the source domain unless ``model.base_path`` holds a finished run; then load it."""
    from core import checkpoint as ckpt
    from core.outputs import lock_folder
    from core.trainer import Trainer, seed_everything

    base_dir = Path(model_cfg.base_path)
    base_dir.mkdir(parents=True, exist_ok=True)
    with lock_folder(base_dir, wait=4 * 3600):  # parallel arms: the first pretrains, the others wait
        latest = ckpt.latest_checkpoint(base_dir / "checkpoints")
        done = latest is not None and int(latest.name.split("_")[-1]) >= model_cfg.pretrain_steps
        if not done:
            seed_everything(trainer_cfg.seed)
            model = build_denoiser(model_cfg)
            cfg = dataclasses.replace(
                trainer_cfg, max_steps=model_cfg.pretrain_steps, batch_size=model_cfg.pretrain_batch,
                ckpt_every=max(1, min(1000, model_cfg.pretrain_steps)), ema_decay=None, grad_clip=1.0,
                optim=dataclasses.replace(trainer_cfg.optim, lr=model_cfg.pretrain_lr, weight_decay=0.0),
                scheduler=dataclasses.replace(trainer_cfg.scheduler, name="cosine",
                                              warmup_steps=min(100, model_cfg.pretrain_steps // 10)))
            log.info("pretraining the %s base on the source domain for %d steps into %s", model_cfg.kind,
                     model_cfg.pretrain_steps, base_dir)
            run_config = {"method": "fera", "stage": "base", "backbone": _backbone_signature(model_cfg),
                          "data": dataclasses.asdict(data)}
            result = Trainer(model, source_dataset(model_cfg, data), cfg, base_dir, run_config=run_config).fit()
            log.info("base: %s", result["metrics"])
    return load_base(model_cfg)


# -- the adapted model -----------------------------------------------------------------------------------------
class AdaptedDenoiser(nn.Module):
    """A frozen base denoiser with one adapter arm on its backbone; ``training_step`` adds FECL for FeRA."""

    def __init__(self, denoiser: nn.Module, adapter: AdapterConfig, inject: bool = True):
        super().__init__()
        from core.layers.lora import inject_lora
        from perception.adapters.fera import apply_fera

        self.adapter = adapter
        self.denoiser = denoiser.requires_grad_(False)
        self.fera = adapter.fera_config() if adapter.kind == "fera" else None
        if not inject:  # load_adapted injects from the saved adapter folder
            return
        if self.fera is not None:
            apply_fera(denoiser.backbone, self.fera)
        else:
            inject_lora(denoiser.backbone, adapter.target_modules, rank=adapter.rank, alpha=adapter.alpha,
                        use_dora=adapter.kind == "dora")

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.denoiser(x_t, t)

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        from perception.adapters.fera import disable_fera
        from perception.adapters.frequency import fecl_loss

        x_t, t, target = self.denoiser.noisy_batch(batch["image"])
        pred = self.denoiser(x_t, t)
        mse = F.mse_loss(pred, target)
        out = {"mse": mse}
        loss = mse
        if self.fera is not None and self.fera.fecl_weight > 0:
            with torch.no_grad(), disable_fera(self.denoiser.backbone):
                base = self.denoiser(x_t, t)  # FECL's extra no-grad pass (benchmarks/fera.py measures it)
            fecl = fecl_loss(pred, base, target, self.fera.num_bands, self.fera.kappa, self.fera.finest_band,
                             weight=self.fera.fecl_weight, kappa_divisor=self.fera.kappa_divisor)
            out["fecl"] = fecl
            loss = loss + fecl
        out["loss"] = loss
        return out

    def save_adapter(self, directory: str | Path) -> Path:
        from core.io import atomic_dir
        from core.layers.lora import save_lora
        from perception.adapters.fera import save_fera

        directory = Path(directory)
        with atomic_dir(directory) as tmp:
            if self.fera is not None:
                save_fera(self.denoiser.backbone, tmp)
            else:
                save_lora(self.denoiser.backbone, tmp)
            write_json(Path(tmp) / "arm.json", dataclasses.asdict(self.adapter))
        return directory


def load_adapted(model_cfg: FeRAModelConfig, run_dir: str | Path) -> AdaptedDenoiser:
    """The base of ``model.base_path`` with the adapter folder of a finished run loaded onto it."""
    from core.layers.lora import load_lora
    from perception.adapters.fera import load_fera

    folder = Path(run_dir) / ADAPTER_DIR
    arm_file = folder / "arm.json"
    if not arm_file.is_file():
        raise CheckpointError(f"{folder}: no adapter (train the arm first: embodied train fera)")
    adapter = AdapterConfig(**read_json(arm_file))
    model = AdaptedDenoiser(load_base(model_cfg), adapter, inject=False)
    (load_fera if adapter.kind == "fera" else load_lora)(model.denoiser.backbone, folder)
    return model.eval()


# -- train -----------------------------------------------------------------------------------------------------
def _configs(cfg) -> tuple[FeRAModelConfig, FeRADataConfig, AdapterConfig, TrainerConfig]:
    model_cfg, data, adapter = to_object(cfg.model), to_object(cfg.data), to_object(cfg.adapter)
    if not isinstance(adapter, AdapterConfig):
        raise ConfigError("fera needs an adapter arm: adapter=fera|fera_norouter|fera_nofecl|lora|dora")
    if not isinstance(model_cfg, FeRAModelConfig) or not isinstance(data, FeRADataConfig):
        raise ConfigError("fera needs model=fera_unet|fera_dit and data=fera_domains")
    return model_cfg, data, adapter, to_object(cfg.trainer)


def target_split(model_cfg: FeRAModelConfig, data: FeRADataConfig, split: str) -> torch.Tensor:
    from perception.adapters.data import target_images

    n = data.shots if split == "train" else data.test_n
    return target_images(split, model_cfg.image_size, n, seed=data.seed)


class CurveHook:
    """Held-out loss per noise level every ``every`` steps, appended to ``curve.json`` (atomic rewrite)."""

    def __init__(self, path: Path, images: torch.Tensor, levels: list[float], every: int, start: int = 0):
        self.path, self.images, self.levels, self.every = path, images, levels, every
        old = read_json(path) if path.is_file() else []
        self.points = [p for p in old if p["step"] <= start]

    def record(self, model: AdaptedDenoiser, step: int) -> None:
        from perception.adapters.backbones import heldout_loss_by_level

        losses = heldout_loss_by_level(model.denoiser, self.images, levels=tuple(self.levels), seed=0)
        self.points = [p for p in self.points if p["step"] != step] + [{"step": step, **losses}]
        write_json(self.path, self.points)

    def __call__(self, trainer, step: int, metrics: dict[str, float]) -> None:
        if self.every and step % self.every == 0:
            self.record(trainer.model, step)


def train(cfg) -> dict[str, Any]:
    """Pretrain the base if needed, then fine-tune one adapter arm on the target shots."""
    from core import checkpoint as ckpt
    from core.bootstrap import prepare_process
    from core.trainer import Trainer, seed_everything
    from perception.adapters.data import ImageTensorDataset

    prepare_process()
    model_cfg, data, adapter, trainer_cfg = _configs(cfg)
    out_dir = Path(cfg.out_dir)
    base = ensure_base(model_cfg, data, trainer_cfg)
    seed_everything(trainer_cfg.seed)
    model = AdaptedDenoiser(base, adapter)
    run_config = to_container(cfg)
    save_resolved(run_config, out_dir)
    shots = ImageTensorDataset(target_split(model_cfg, data, "train"), flip=data.flip)
    test = target_split(model_cfg, data, "test")[:data.curve_n]
    latest = ckpt.latest_checkpoint(out_dir / "checkpoints")
    start = int(latest.name.split("_")[-1]) if latest is not None else 0
    curve = CurveHook(out_dir / CURVE_FILE, test, list(data.levels), data.eval_every, start)
    if start == 0:
        curve.record(model, 0)
    log.info("%s on the %s: %d trainable parameters, %d shots", adapter.name, model_cfg.kind,
             model.trainable_parameters(), len(shots))
    result = Trainer(model, shots, trainer_cfg, out_dir, run_config=run_config, hooks=[curve]).fit()
    if not curve.points or curve.points[-1]["step"] != result["step"]:
        curve.record(model, result["step"])
    model.save_adapter(out_dir / ADAPTER_DIR)
    log.info("trained %s: %s", adapter.name, result["metrics"])
    return {"step": result["step"], "loss": result["metrics"].get("loss"), "checkpoint": str(result["checkpoint"]),
            "trainable_parameters": model.trainable_parameters()}


# -- evaluate --------------------------------------------------------------------------------------------------
@torch.no_grad()
def routing_by_level(model: nn.Module, images: torch.Tensor, levels: list[float]) -> dict[str, list[float]]:
    """FeRA's mean routing weights over ``images`` (uint8) noised to each level (fixed noise): does routing
    follow t? ``model``: an ``AdaptedDenoiser`` or a FeRA-adapted ``FlowDenoiser``."""
    from perception.adapters.fera import router_of

    denoiser = getattr(model, "denoiser", model)
    router = router_of(denoiser.backbone)
    g = torch.Generator().manual_seed(0)
    x0 = images.float() / 127.5 - 1
    eps = torch.randn(x0.shape, generator=g)
    return {f"t{t:g}": router.route((1 - t) * x0 + t * eps).mean(0).tolist() for t in levels}


def measure(denoiser: nn.Module, test: torch.Tensor, data: FeRADataConfig, model_cfg: FeRAModelConfig
            ) -> dict[str, Any]:
    from core.metrics.features import fd_effnet
    from perception.adapters.backbones import heldout_loss_by_level, sample_images

    losses = heldout_loss_by_level(denoiser, test, levels=tuple(data.levels), seed=0)
    samples = sample_images(denoiser, data.fd_samples, steps=model_cfg.sample_steps, seed=0)
    return {"heldout_loss": losses, "fd": fd_effnet(test, samples)}


def evaluate(cfg) -> dict[str, Any]:
    """Held-out loss by noise level and FD of one trained arm (and of the unadapted base, cached)."""
    from core.bootstrap import prepare_process

    prepare_process()
    model_cfg, data, adapter, _ = _configs(cfg)
    out_dir = Path(cfg.out_dir)
    test = target_split(model_cfg, data, "test")
    base_file = Path(model_cfg.base_path) / BASE_EVAL_FILE
    key = json.dumps({"seed": data.seed, "test_n": data.test_n, "levels": list(data.levels), "fd_samples":
                      data.fd_samples, "image_size": model_cfg.image_size, "sample_steps": model_cfg.sample_steps},
                     sort_keys=True)  # what the base's figures depend on
    cached = read_json(base_file) if base_file.is_file() else {}
    if cached.get("key") != key:
        base = load_base(model_cfg)
        cached = {"key": key, **measure(base, test, data, model_cfg)}
        write_json(base_file, cached)
    model = load_adapted(model_cfg, out_dir)
    result = {"arm": model.adapter.name, "kind": model.adapter.kind, "backbone": model_cfg.kind,
              "image_size": model_cfg.image_size, "trainable_parameters": model.trainable_parameters(),
              **measure(model.denoiser, test, data, model_cfg),
              "base": {k: cached[k] for k in ("heldout_loss", "fd")}}
    if model.fera is not None:
        result["routing_by_level"] = routing_by_level(model, test[:64], list(data.levels))
    curve_file = out_dir / CURVE_FILE
    if curve_file.is_file():
        result["curve"] = read_json(curve_file)
    write_json(out_dir / "eval.json", result)
    log.info("%s: loss %s, FD %.2f (base %.2f)", result["arm"], result["heldout_loss"]["mean"], result["fd"],
             result["base"]["fd"])
    return result
