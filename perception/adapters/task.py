"""``embodied train fera`` / ``embodied eval fera``: few-shot adaptation of a small diffusion model, one arm.

train: [the base: a pixel-space rectified-flow model on a diffusers backbone (``model.kind`` unet | dit),
pretrained on the source domain (simulator motion-clip frames) into ``model.base_path`` unless a finished
checkpoint is there, or read as it is when ``model.base_path`` is an exported base folder
(``FlowDenoiser.save_pretrained``: read-only, never written); several arms share it, a lock keeps two runs from
pretraining it at once] -> the adapter arm ``adapter`` (FeRA, its ablations, or peft's LoRA / DoRA) injected on
the frozen base (``modeling_fera.AdaptedDenoiser``) -> the core Trainer on ``data.shots`` crops of real videos
-> ``<out_dir>/adapter`` (the exported model: ``AdaptedDenoiser.save_pretrained``, adapter tensors only, the base
referenced by its absolute path) and ``<out_dir>/curve.json`` (held-out loss per noise level every
``data.eval_every`` steps; step 0 is the unadapted base). The training checkpoints' ``config.json`` holds the
same model section, so ``load_pretrained(<out_dir>)`` rebuilds the newest one too.

evaluate: the exported model of ``<out_dir>/adapter`` (around the base it references) -> on ``data.test_n``
held-out crops: the denoising loss at each noise level of ``data.levels`` (fixed noise, the same for every arm),
FD-EffNet of ``data.fd_samples`` Euler samples against the held-out crops (the frozen ImageNet EfficientNet-Lite0
of ``core.metrics.features``; small-sample FD: compare arms, not against published FIDs), the trainable
parameter count, and for FeRA the mean routing weights per noise level. Also the base's own figures (cached in
``<base>/eval_base.json`` when the base is a training run of this workspace, else in ``<out_dir>``). Writes
``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.errors import CheckpointError, ConfigError
from core.io import read_json, write_json
from core.logging import get_logger
from perception.adapters.configuration_fera import AdapterConfig, FeRADataConfig, FeRAModelConfig
from perception.adapters.modeling_fera import AdaptedDenoiser

__all__ = ["ADAPTER_DIR", "AdaptedDenoiser", "ensure_base", "evaluate", "export_self_contained", "is_exported_base",
           "load_adapted", "load_base", "ship_models", "train"]

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


def load_base(model_cfg: FeRAModelConfig) -> nn.Module:
    """The pretrained base denoiser of ``model.base_path`` (``backbones.load_denoiser``: an exported base folder
    or the base's run folder, read-only); frozen, eval mode; its architecture must be ``model``'s."""
    from core import checkpoint as ckpt
    from perception.adapters.backbones import load_denoiser

    base_dir = Path(model_cfg.base_path)
    if not is_exported_base(base_dir) and ckpt.latest_checkpoint(base_dir / "checkpoints") is None:
        raise CheckpointError(f"{base_dir}: no base checkpoint (run `embodied train fera` to pretrain it)")
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


def ensure_base(model_cfg: FeRAModelConfig, data: FeRADataConfig, trainer_cfg: TrainerConfig) -> nn.Module:
    """Pretrain the base on the source domain unless ``model.base_path`` holds a finished run; then load it."""
    from core import checkpoint as ckpt
    from core.outputs import lock_folder
    from core.trainer import Trainer, seed_everything

    base_dir = Path(model_cfg.base_path)
    if is_exported_base(base_dir):  # a finished base someone exported: read it, never write into it
        return load_base(model_cfg)
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
            run_config = {"method": "fera", "stage": "base", "model": _backbone_signature(model_cfg),
                          "data": dataclasses.asdict(data)}  # the checkpoints load with load_denoiser
            result = Trainer(model, source_dataset(model_cfg, data), cfg, base_dir, run_config=run_config).fit()
            log.info("base: %s", result["metrics"])
    return load_base(model_cfg)


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
    model = AdaptedDenoiser.around(base, adapter, Path(model_cfg.base_path).absolute())
    run_config = to_container(cfg)
    save_resolved(run_config, out_dir)
    # the checkpoints' config.json: the adapted model's section (load_pretrained(out_dir) rebuilds it)
    ckpt_config = {**export_run_config(run_config), "model": dataclasses.asdict(model.config)}
    shots = ImageTensorDataset(target_split(model_cfg, data, "train"), flip=data.flip)
    test = target_split(model_cfg, data, "test")[:data.curve_n]
    latest = ckpt.latest_checkpoint(out_dir / "checkpoints")
    start = int(latest.name.split("_")[-1]) if latest is not None else 0
    curve = CurveHook(out_dir / CURVE_FILE, test, list(data.levels), data.eval_every, start)
    if start == 0:
        curve.record(model, 0)
    log.info("%s on the %s: %d trainable parameters, %d shots", adapter.name, model_cfg.kind,
             model.trainable_parameters(), len(shots))
    result = Trainer(model, shots, trainer_cfg, out_dir, run_config=ckpt_config, hooks=[curve]).fit()
    if not curve.points or curve.points[-1]["step"] != result["step"]:
        curve.record(model, result["step"])
    card = {"data": f"{data.shots} crops of real videos (bikes.mp4, vtest.avi), first 60 % of each",
            "training_domain": f"{model_cfg.image_size} px real-video crops; base pretrained on simulator renders",
            "command": f"embodied train fera adapter={adapter.name} model=fera_{model_cfg.kind}",
            "metrics": {k: v for k, v in result["metrics"].items() if isinstance(v, (int, float))}}
    model.save_pretrained(out_dir / ADAPTER_DIR, card=card, run_config=export_run_config(run_config),
                          body=f"# FeRA experiment arm `{adapter.name}` ({adapter.kind}) on a {model_cfg.kind} "
                               "base denoiser\n\nAdapter tensors only; the base is referenced by `model.base_path`. "
                               "See perception/adapters/README.md.\n")
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
    model = load_adapted(out_dir)
    base_path = Path(model.config.base_path)  # the base the exported model references
    test = target_split(model_cfg, data, "test")
    # cache the base's figures in its folder only when it is a run of this workspace (an exported base is read-only)
    base_file = (out_dir if is_exported_base(base_path) else base_path) / BASE_EVAL_FILE
    key = json.dumps({"seed": data.seed, "test_n": data.test_n, "levels": list(data.levels), "fd_samples":
                      data.fd_samples, "image_size": model_cfg.image_size, "sample_steps": model_cfg.sample_steps},
                     sort_keys=True)  # what the base's figures depend on
    cached = read_json(base_file) if base_file.is_file() else {}
    if cached.get("key") != key:
        from perception.adapters.backbones import load_denoiser

        cached = {"key": key, **measure(load_denoiser(base_path), test, data, model_cfg)}
        write_json(base_file, cached)
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
