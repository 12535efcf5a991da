"""``embodied train fera`` / ``embodied eval fera``: few-shot adaptation of a diffusion model, one arm.

train: [the base: ``model.base_path`` when given, opened read-only and never written: a user's diffusers pipeline
/ model folder (SD-class UNet, DiT, Wan; ``perception.adapters.latent``, adapted in its VAE's latent space with
its own objective), an exported pixel base or a finished base run; else the workspace's pixel-space
rectified-flow model on a diffusers backbone (``model.kind`` unet | dit), pretrained on the source domain
(simulator motion-clip frames) into ``model.pretrain_dir`` (default ``<out_dir>/base``; a lock lets arms that
share one pretrain it once)] -> the adapter arm ``adapter`` (FeRA, its ablations, or peft's LoRA / DoRA) injected
on the frozen base (``modeling_fera.AdaptedDenoiser``) -> the core Trainer on ``data.shots`` crops (clips for Wan)
of real videos (encoded once through the VAE for a latent base) -> ``<out_dir>/adapter`` (the exported model:
``AdaptedDenoiser.save_pretrained``, adapter tensors only, the base referenced by its absolute path) and
``<out_dir>/curve.json`` (held-out loss per noise level every ``data.eval_every`` steps; step 0 is the unadapted
base). The training checkpoints' ``config.json`` holds the same model section, so ``load_pretrained(<out_dir>)``
rebuilds the newest one too.

evaluate: the exported model of ``<out_dir>/adapter`` (around the base it references) -> on ``data.test_n``
held-out crops: the denoising loss at each noise level of ``data.levels`` (fixed noise, the same for every arm;
the base's objective for a latent base), FD-EffNet of ``data.fd_samples`` samples (decoded through the VAE;
clips' frames) against the held-out crops (the frozen ImageNet EfficientNet-Lite0 of ``core.metrics.features``;
small-sample FD: compare arms, not against published FIDs), the trainable parameter count, and for FeRA the mean
routing weights per noise level. Also the base's own figures (the arm switched off, ``AdaptedDenoiser.base_pass``;
cached in ``<base>/eval_base.json`` when this workspace pretrained that base, else in ``<out_dir>``). Writes
``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.distributed import barrier
from core.errors import CheckpointError, ConfigError
from core.io import read_json, write_json
from core.logging import get_logger
from perception.adapters.configuration_fera import AdapterConfig, FeRADataConfig, FeRAModelConfig
from perception.adapters.modeling_fera import AdaptedDenoiser

__all__ = ["ADAPTER_DIR", "AdaptedDenoiser", "Harness", "LatentDataset", "ensure_base", "evaluate",
           "export_self_contained", "is_exported_base", "is_latent_base", "load_adapted", "load_base", "pretrain_dir",
           "ship_models", "train"]

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


def is_exported_base(path: str | Path) -> bool:
    """Whether ``path`` is an exported base folder (read-only) rather than a training run of the base."""
    from core.checkpoint import CONFIG_FILE, MODEL_FILE

    path = Path(path)
    return (path / CONFIG_FILE).is_file() and (path / MODEL_FILE).is_file() and not (path / "checkpoints").exists()


def is_latent_base(model_cfg: FeRAModelConfig) -> bool:
    """Whether ``model.base_path`` names a diffusers base (adapted in its VAE's latent space)."""
    from perception.adapters.latent import is_diffusers_base

    return bool(model_cfg.base_path) and is_diffusers_base(model_cfg.base_path)


def load_base(model_cfg: FeRAModelConfig, path: str | Path | None = None) -> nn.Module:
    """The pretrained pixel base of ``path`` (default ``model.base_path``): an exported base folder or the base's
    run folder, read-only (``backbones.load_denoiser``); frozen, eval mode; its architecture must be ``model``'s."""
    from core import checkpoint as ckpt
    from perception.adapters.backbones import load_denoiser

    base_dir = Path(path if path is not None else model_cfg.base_path)
    if not is_exported_base(base_dir) and ckpt.latest_checkpoint(base_dir / "checkpoints") is None:
        raise CheckpointError(f"{base_dir}: no base checkpoint (leave model.base_path empty to pretrain one)")
    model = load_denoiser(base_dir)
    if dataclasses.asdict(model.config) != _backbone_signature(model_cfg):
        raise ConfigError(f"{base_dir}: its base was built with another backbone config; pick another "
                          "model.base_path")
    return model


def source_dataset(model_cfg: FeRAModelConfig, data: FeRADataConfig):
    from perception.adapters.data import ImageTensorDataset, source_images

    root = Path(data.source_root) / f"{model_cfg.image_size}px"  # one rendering per resolution
    imgs = source_images(root, model_cfg.image_size, data.source_clips, data.source_frames, data.seed)
    return ImageTensorDataset(imgs, flip=data.flip)


def pretrain_dir(model_cfg: FeRAModelConfig, out_dir: str | Path) -> Path:
    """Where the pixel base is pretrained: ``model.pretrain_dir``, default ``<out_dir>/base``."""
    return Path(model_cfg.pretrain_dir) if model_cfg.pretrain_dir else Path(out_dir) / "base"


def ensure_base(model_cfg: FeRAModelConfig, data: FeRADataConfig, trainer_cfg: TrainerConfig,
                out_dir: str | Path = "") -> tuple[nn.Module, Path]:
    """The frozen base and its folder.

    ``model.base_path`` set: read it, never write it (a diffusers base -> ``latent.LatentDenoiser``; an exported
    pixel base or a finished base run -> ``load_base``). Empty: pretrain the pixel base on the source domain into
    ``pretrain_dir`` (resumed there; a lock lets arms that share it pretrain it once), then load it.
    """
    from core import checkpoint as ckpt
    from core.outputs import lock_folder
    from core.trainer import Trainer, seed_everything
    from perception.adapters.modeling_fera import load_base_denoiser

    if model_cfg.base_path:
        base_dir = Path(model_cfg.base_path)
        if not base_dir.is_dir():
            raise ConfigError(f"model.base_path={base_dir}: no such folder (leave it empty to pretrain the pixel "
                              "base into model.pretrain_dir)")
        if is_latent_base(model_cfg):
            return load_base_denoiser(base_dir, model_cfg.vae_path, model_cfg.latent()), base_dir
        return load_base(model_cfg), base_dir
    base_dir = pretrain_dir(model_cfg, out_dir)
    if base_dir.is_dir() and any(base_dir.iterdir()) and not (base_dir / "checkpoints").is_dir() \
            and not (base_dir / "metrics.jsonl").is_file():
        raise ConfigError(f"model.pretrain_dir={base_dir}: a folder that is not a base run of this workspace; "
                          "pretraining would write into it (to adapt it, pass it as model.base_path)")

    def pretrained() -> bool:
        latest = ckpt.latest_checkpoint(base_dir / "checkpoints")
        return latest is not None and int(latest.name.split("_")[-1]) >= model_cfg.pretrain_steps

    # One rank of a distributed run would pretrain under the lock while the others wait on it: the base Trainer
    # would wait for them to join its process group, forever (as core.vlm.ensure_base_vlm, refuse instead).
    if not pretrained() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"model.pretrain_dir={base_dir}: the pixel base is not pretrained there; pretrain it in "
                          "one process first (embodied train fera with the same model.pretrain_dir) or pass a "
                          "base as model.base_path")
    base_dir.mkdir(parents=True, exist_ok=True)
    with lock_folder(base_dir, wait=4 * 3600):  # parallel arms: the first pretrains, the others wait
        if not pretrained():
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
            run_config = {"method": "fera", "stage": "base", "model": _backbone_signature(model_cfg),
                          "data": dataclasses.asdict(data)}  # the checkpoints load with load_denoiser
            result = Trainer(model, source_dataset(model_cfg, data), cfg, base_dir, run_config=run_config).fit()
            log.info("base: %s", result["metrics"])
    return load_base(model_cfg, base_dir), base_dir


# -- the adapted model (modeling_fera.AdaptedDenoiser) -------------------------------------------------------
def load_adapted(run_dir: str | Path) -> AdaptedDenoiser:
    """The exported model of a finished run (``<run_dir>/adapter``), or an exported folder itself, around the base
    it references (read-only)."""
    from core.checkpoint import CONFIG_FILE

    run_dir = Path(run_dir)
    folder = run_dir / ADAPTER_DIR
    if not (folder / CONFIG_FILE).is_file() and (run_dir / CONFIG_FILE).is_file():
        model_section = read_json(run_dir / CONFIG_FILE).get("model")
        if isinstance(model_section, dict) and "adapter" in model_section:
            folder = run_dir  # an exported adapted model (e.g. assets/checkpoints/fera/fera)
    if (folder / "arm.json").is_file() and not (folder / CONFIG_FILE).is_file():
        raise CheckpointError(f"{folder}: an adapter folder of an older version (arm.json); run the same "
                              "`embodied train fera` command again to export it anew (its checkpoints are kept)")
    if not (folder / CONFIG_FILE).is_file():
        raise CheckpointError(f"{folder}: no exported adapted model (train the arm first: embodied train fera)")
    return AdaptedDenoiser.from_pretrained(folder)


def export_run_config(run_config: dict[str, Any]) -> dict[str, Any]:
    """The run config beside an adapted model's ``model`` section: the base's section kept as ``base_model``."""
    out = {k: v for k, v in run_config.items() if k != "model"}
    if "model" in run_config:
        out["base_model"] = run_config["model"]
    return out


def export_self_contained(model: AdaptedDenoiser, directory: str | Path, card: dict[str, Any] | None = None,
                          body: str = "", run_config: dict[str, Any] | None = None) -> Path:
    """``model.save_pretrained(directory, copy_base=True)`` with a clean base: the base is re-exported first
    (``FlowDenoiser.save_pretrained``: its weights and config, none of a base run's checkpoints or training state)
    and that copy goes into ``<directory>/base``. For shipped assets; ``model`` itself is left as it was."""
    import tempfile

    from perception.adapters.backbones import BASE_RUN_CONFIG, load_denoiser

    run_config = dict(run_config or {})
    if isinstance(run_config.get("base_model"), dict):
        run_config["base_model"] = {**run_config["base_model"], "base_path": "base"}  # where the copy lands
    keep = model.config.base_path
    with tempfile.TemporaryDirectory() as work:
        base = Path(work) / "base"
        load_denoiser(keep).save_pretrained(  # the base as it is on disk, not the in-memory adapted backbone
            base, run_config=dict(BASE_RUN_CONFIG),
            card={"data": "source domain: simulator motion-clip frames (perception/adapters/data.py)"})
        model.config.base_path = str(base)
        try:
            return model.save_pretrained(directory, card=card, body=body, run_config=run_config, copy_base=True)
        finally:
            model.config.base_path = keep


def ship_models(runs: dict[str, Path], dest: str | Path, comparison: str | Path | None = None) -> Path:
    """Ship finished arms as the demo loads them: ``<dest>/<arm>/`` (each a self-contained export of the run's
    ``adapter`` model, its base in ``<arm>/base``) and ``comparison.md``; ``dest`` is replaced atomically."""
    import shutil

    from core.io import atomic_dir
    from core.pretrained import card_body, read_card, read_config

    with atomic_dir(Path(dest)) as tmp:
        for arm, run in runs.items():
            folder = Path(run) / ADAPTER_DIR
            card = {k: v for k, v in read_card(folder).items()
                    if k not in ("method", "model_class", "parameters", "weights", "base")}
            export_self_contained(load_adapted(run), Path(tmp) / arm, card=card, body=card_body(folder),
                                  run_config={k: v for k, v in read_config(folder).items() if k != "model"})
        if comparison is not None:
            shutil.copy2(comparison, Path(tmp) / "comparison.md")
    return Path(dest)


# -- train -----------------------------------------------------------------------------------------------------
def _configs(cfg) -> tuple[FeRAModelConfig, FeRADataConfig, AdapterConfig, TrainerConfig]:
    model_cfg, data, adapter = to_object(cfg.model), to_object(cfg.data), to_object(cfg.adapter)
    if not isinstance(adapter, AdapterConfig):
        raise ConfigError("fera needs an adapter arm: adapter=fera|fera_norouter|fera_nofecl|lora|dora")
    if not isinstance(model_cfg, FeRAModelConfig) or not isinstance(data, FeRADataConfig):
        raise ConfigError("fera needs model=fera_unet|fera_dit and data=fera_domains")
    return model_cfg, data, adapter, to_object(cfg.trainer)


def target_split(model_cfg: FeRAModelConfig, data: FeRADataConfig, split: str, video: bool = False
                 ) -> torch.Tensor:
    """The target domain's ``split``: ``(n, 3, S, S)`` uint8 crops, or ``(n, 3, F, S, S)`` clips when ``video``
    (``model.frames`` frames; a Wan base)."""
    from perception.adapters.data import target_clips, target_images

    n = data.shots if split == "train" else data.test_n
    if video:
        return target_clips(split, model_cfg.image_size, n, model_cfg.frames, seed=data.seed)
    return target_images(split, model_cfg.image_size, n, seed=data.seed)


def is_video(model: AdaptedDenoiser) -> bool:
    """Whether the model's base denoises clips (a Wan transformer)."""
    return model.is_latent and model.denoiser.kind == "wan"


class LatentDataset(torch.utils.data.Dataset):
    """Items ``{"latent": z}`` of pre-encoded shots (the VAE is frozen: each shot is encoded once); with ``flipped``
    (the latents of the mirrored shots) each item is the mirrored one with probability 1/2 (torch's global RNG)."""

    def __init__(self, latents: torch.Tensor, flipped: torch.Tensor | None = None):
        self.latents, self.flipped = latents.float().cpu(), None if flipped is None else flipped.float().cpu()

    def __len__(self) -> int:
        return self.latents.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.flipped is not None and bool(torch.rand(()) < 0.5):
            return {"latent": self.flipped[index]}
        return {"latent": self.latents[index]}


class Harness:
    """The evaluation harness of one adapted model on held-out target pixels, for pixel and latent bases alike:
    held-out loss at fixed levels with fixed noise, seeded samples (decoded through the VAE for a latent base),
    FeRA's routing by level; ``base=True`` runs the unadapted base (``AdaptedDenoiser.base_pass``)."""

    def __init__(self, model: AdaptedDenoiser, pixels: torch.Tensor):
        self.model, self.pixels = model, pixels
        self.x0 = model.denoiser.encode(pixels).cpu() if model.is_latent else pixels

    def _ctx(self, base: bool):
        import contextlib

        return self.model.base_pass() if base else contextlib.nullcontext()

    def loss(self, levels: list[float], base: bool = False) -> dict[str, float]:
        from perception.adapters.backbones import heldout_loss_by_level
        from perception.adapters.latent import latent_heldout_loss

        d = self.model.denoiser
        with self._ctx(base):
            if self.model.is_latent:
                return latent_heldout_loss(d, self.x0, d.objective, levels=tuple(levels), seed=0)
            return heldout_loss_by_level(d, self.x0, levels=tuple(levels), seed=0)

    def samples(self, n: int, steps: int, seed: int = 0, base: bool = False) -> torch.Tensor:
        """``n`` uint8 samples: images ``(n, 3, H, W)`` or clips ``(n, 3, F, H, W)``."""
        from perception.adapters.pipeline_fera import sample_pixels

        return sample_pixels(self.model, n, steps, seed, base)

    @torch.no_grad()
    def routing(self, levels: list[float], n: int = 64) -> dict[str, list[float]]:
        """FeRA's mean routing weights over ``n`` held-out shots noised to each level (fixed noise)."""
        from perception.adapters.fera import router_of

        d = self.model.denoiser
        router = router_of(d.backbone)
        x0 = self.x0[:n].float() / 127.5 - 1 if self.x0.dtype == torch.uint8 else self.x0[:n].float()
        x0 = x0.to(next(d.parameters()).device)
        eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0)).to(x0.device)
        out = {}
        for t in levels:
            tt = torch.full((x0.shape[0],), float(t), device=x0.device)
            x_t = d.objective.noisy(x0, eps, tt) if self.model.is_latent else (1 - t) * x0 + t * eps
            out[f"t{t:g}"] = _mean_routing(d, router, x_t, tt)
        return out


class CurveHook:
    """Held-out loss per noise level every ``every`` steps, appended to ``curve.json`` (atomic rewrite)."""

    def __init__(self, path: Path, harness: Harness, levels: list[float], every: int, start: int = 0):
        self.path, self.harness, self.levels, self.every = path, harness, levels, every
        old = read_json(path) if path.is_file() else []
        self.points = [p for p in old if p["step"] <= start]

    def record(self, model: AdaptedDenoiser, step: int) -> None:
        losses = self.harness.loss(self.levels)
        self.points = [p for p in self.points if p["step"] != step] + [{"step": step, **losses}]
        write_json(self.path, self.points)

    def __call__(self, trainer, step: int, metrics: dict[str, float]) -> None:
        # Under FSDP the model is sharded and hooks run on rank 0 alone, which cannot gather it: the curve then
        # keeps its first point and the one recorded after training (Trainer.release).
        if self.every and step % self.every == 0 and trainer.strategy != "fsdp":
            self.record(trainer.model, step)


def _absolute(path: str) -> str:
    return str(Path(path).absolute()) if path else ""


def train(cfg) -> dict[str, Any]:
    """Pretrain the pixel base if no base is given, then fine-tune one adapter arm on the target shots (in the
    base's latent space for a diffusers base)."""
    from core import checkpoint as ckpt
    from core.bootstrap import prepare_process
    from core.distributed import resolve_device
    from core.trainer import Trainer, seed_everything
    from perception.adapters.data import ImageTensorDataset

    prepare_process()
    model_cfg, data, adapter, trainer_cfg = _configs(cfg)
    out_dir = Path(cfg.out_dir)
    base, base_dir = ensure_base(model_cfg, data, trainer_cfg, out_dir)
    seed_everything(trainer_cfg.seed)
    latent = None
    if is_latent_base(model_cfg):
        latent = dataclasses.replace(model_cfg.latent(), prompt_embeds=_absolute(model_cfg.prompt_embeds))
    model = AdaptedDenoiser.around(base, adapter, base_dir.absolute(), vae_path=_absolute(model_cfg.vae_path),
                                   latent=latent)
    run_config = to_container(cfg)
    save_resolved(run_config, out_dir)
    # the checkpoints' config.json: the adapted model's section (load_pretrained(out_dir) rebuilds it)
    ckpt_config = {**export_run_config(run_config), "model": dataclasses.asdict(model.config)}
    video = is_video(model)
    shots_px = target_split(model_cfg, data, "train", video)
    if model.is_latent:
        model.to(resolve_device(trainer_cfg.device))  # the VAE follows: the shots are encoded once, there
        flipped = model.denoiser.encode(shots_px.flip(-1)) if data.flip else None
        shots = LatentDataset(model.denoiser.encode(shots_px), flipped)
    else:
        shots = ImageTensorDataset(shots_px, flip=data.flip)
    harness = Harness(model, target_split(model_cfg, data, "test", video)[:data.curve_n])
    latest = ckpt.latest_checkpoint(out_dir / "checkpoints")
    start = int(latest.name.split("_")[-1]) if latest is not None else 0
    curve = CurveHook(out_dir / CURVE_FILE, harness, list(data.levels), data.eval_every, start)
    if start == 0:
        curve.record(model, 0)
    kind = model.denoiser.base.class_name if model.is_latent else model_cfg.kind
    log.info("%s on the %s: %d trainable parameters, %d shots", adapter.name, kind, model.trainable_parameters(),
             len(shots))
    trainer = Trainer(model, shots, trainer_cfg, out_dir, run_config=ckpt_config, hooks=[curve])
    result = trainer.fit()
    trainer.release()  # under FSDP: plain parameters again for the last curve point and the export
    if not curve.points or curve.points[-1]["step"] != result["step"]:
        curve.record(model, result["step"])
    if model.is_latent:
        domain = (f"{model_cfg.image_size} px real-video {'clips' if video else 'crops'}, in the latent space of "
                  f"{base_dir} ({kind}; prompt: {model.denoiser.prompt_source or 'none (class-conditional)'})")
        command = f"embodied train fera adapter={adapter.name} model.base_path={base_dir}"
    else:
        domain = f"{model_cfg.image_size} px real-video crops; base pretrained on simulator renders"
        command = f"embodied train fera adapter={adapter.name} model=fera_{model_cfg.kind}"
    card = {"data": f"{data.shots} {'clips' if video else 'crops'} of real videos (bikes.mp4, vtest.avi), first "
                    "60 % of each",
            "training_domain": domain, "command": command,
            "metrics": {k: v for k, v in result["metrics"].items() if isinstance(v, (int, float))}}
    if trainer.dist.is_main:  # under torchrun only rank 0 writes the export (every rank has the full weights)
        model.save_pretrained(out_dir / ADAPTER_DIR, card=card, run_config=export_run_config(run_config),
                              body=f"# FeRA experiment arm `{adapter.name}` ({adapter.kind}) on a {kind} "
                                   "base\n\nAdapter tensors only; the base is referenced by `model.base_path`. "
                                   "See perception/adapters/README.md.\n")
    barrier()
    log.info("trained %s: %s", adapter.name, result["metrics"])
    return {"step": result["step"], "loss": result["metrics"].get("loss"), "checkpoint": str(result["checkpoint"]),
            "trainable_parameters": model.trainable_parameters()}


# -- evaluate --------------------------------------------------------------------------------------------------
@torch.no_grad()
def routing_by_level(model: nn.Module, images: torch.Tensor, levels: list[float]) -> dict[str, list[float]]:
    """FeRA's mean routing weights over ``images`` (uint8) noised to each level (fixed noise): does routing
    follow t? ``model``: an ``AdaptedDenoiser`` or a FeRA-adapted ``FlowDenoiser`` (pixel space)."""
    from perception.adapters.fera import router_of

    denoiser = getattr(model, "denoiser", model)
    router = router_of(denoiser.backbone)
    g = torch.Generator().manual_seed(0)
    x0 = images.float() / 127.5 - 1
    eps = torch.randn(x0.shape, generator=g)
    return {f"t{t:g}": _mean_routing(denoiser, router, (1 - t) * x0 + t * eps, torch.full((len(x0),), float(t)))
            for t in levels}


@torch.no_grad()
def _mean_routing(denoiser: nn.Module, router, x_t: torch.Tensor, t: torch.Tensor) -> list[float]:
    """The routing weights over the experts at ``x_t``, averaged over the batch (and tokens): the router reads
    the latent itself, or (``routing="xlora"``) the base's hidden state of a forward of the denoiser."""
    if router.classifier is None:
        return router.route(x_t).mean(0).tolist()
    denoiser(x_t, t)
    return router.weights.flatten(0, -2).mean(0).tolist()


def _as_frames(pixels: torch.Tensor) -> torch.Tensor:
    """Clips ``(n, 3, F, H, W)`` as frames ``(n F, 3, H, W)`` (for FD); images as they are."""
    return pixels.transpose(1, 2).flatten(0, 1) if pixels.dim() == 5 else pixels


def measure(harness: Harness, data: FeRADataConfig, steps: int, base: bool = False) -> dict[str, Any]:
    from core.metrics.features import fd_effnet

    losses = harness.loss(list(data.levels), base=base)
    samples = harness.samples(data.fd_samples, steps, seed=0, base=base)
    return {"heldout_loss": losses, "fd": fd_effnet(_as_frames(harness.pixels), _as_frames(samples))}


def evaluate(cfg) -> dict[str, Any]:
    """Held-out loss by noise level and FD of one trained arm (and of the unadapted base, cached)."""
    from core.bootstrap import prepare_process
    from core.distributed import resolve_device

    prepare_process()
    model_cfg, data, adapter, trainer_cfg = _configs(cfg)
    out_dir = Path(cfg.out_dir)
    model = load_adapted(out_dir)
    if model.is_latent:
        model.to(resolve_device(trainer_cfg.device))
    base_path = Path(model.config.base_path)  # the base the exported model references
    steps = model.config.latent.sample_steps if model.is_latent else model_cfg.sample_steps
    harness = Harness(model, target_split(model_cfg, data, "test", is_video(model)))
    # the base's figures are cached in its folder only when this workspace pretrained it there (model.base_path
    # empty); a base the user gave (model.base_path) is read-only: they go to the run folder
    own_base = not model_cfg.base_path and not is_exported_base(base_path)
    base_file = (base_path if own_base else out_dir) / BASE_EVAL_FILE
    key = json.dumps({"seed": data.seed, "test_n": data.test_n, "levels": list(data.levels), "fd_samples":
                      data.fd_samples, "image_size": model_cfg.image_size, "sample_steps": steps,
                      "frames": model_cfg.frames if is_video(model) else 1, "base": str(base_path)},
                     sort_keys=True)  # what the base's figures depend on
    cached = read_json(base_file) if base_file.is_file() else {}
    if cached.get("key") != key:
        cached = {"key": key, **measure(harness, data, steps, base=True)}
        write_json(base_file, cached)
    backbone = model.denoiser.base.class_name if model.is_latent else model_cfg.kind
    result = {"arm": model.adapter.name, "kind": model.adapter.kind, "backbone": backbone,
              "image_size": model_cfg.image_size, "trainable_parameters": model.trainable_parameters(),
              **measure(harness, data, steps), "base": {k: cached[k] for k in ("heldout_loss", "fd")}}
    if model.fera is not None:
        result["routing_by_level"] = harness.routing(list(data.levels))
    curve_file = out_dir / CURVE_FILE
    if curve_file.is_file():
        result["curve"] = read_json(curve_file)
    write_json(out_dir / "eval.json", result)
    log.info("%s: loss %s, FD %.2f (base %.2f)", result["arm"], result["heldout_loss"]["mean"], result["fd"],
             result["base"]["fd"])
    return result
