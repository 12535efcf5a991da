"""``embodied train transnormal`` / ``embodied eval transnormal``: the task functions, separate from the CLI.

train: (render the synthetic set with ``sim.render.normals`` when ``data.root`` is missing) ->
``DenseImageDataset`` -> [stage 1: the VAE as an auto-encoder on RGB + normal maps, into
``<out_dir>/vae``, when no ``model.vae_path`` is given and ``model.vae_pretrain_steps`` > 0] ->
``TransNormalModel`` with the VAE frozen -> the shared Trainer (AdamW, per-group lrs for ``unet`` /
``projector``, warm-up, clipping, bf16 autocast on CUDA) with random crops and horizontal flips (normal x
negated) on the device.

evaluate: pooled angular metrics of the checkpoint on the held-out split (embodied-dense ``test`` or a
ClearGrasp folder with ``data=cleargrasp data.root=...``), next to the baselines named in
``eval.baselines``: ``constant`` (the mean training normal everywhere) and other run / checkpoint
directories (the no-DINOv3 and multi-step runs). Writes ``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.errors import ConfigError, DataError
from core.io import write_json
from core.logging import get_logger
from perception.normals.configuration_transnormal import TransNormalConfig

log = get_logger("embodied.transnormal")

TRAIN_KEYS = ("rgb", "rgb_twin", "normals")
EVAL_KEYS = ("rgb", "normals", "mask")


def render_settings(checkpoint: str | Path) -> dict:
    """How a checkpoint's training views were rendered (its run config's ``data.render_*``): ``source``
    ("procedural" for checkpoints made before sources existed), ``framing``, ``size`` and ``spp``.
    """
    from core.io import read_json

    cfg = Path(checkpoint) / "config.json"
    data = (read_json(cfg).get("data") or {}) if cfg.is_file() else {}
    render = {k[len("render_"):]: v for k, v in data.items() if k.startswith("render_")}
    return {"source": str(render.get("source", "procedural")),
            "framing": str(render.get("framing", "workspace")),
            "size": int(render.get("size", 64)), "spp": int(render.get("spp", 32))}


def render_source(checkpoint: str | Path) -> str:
    """The ``sim.render.normals`` source a checkpoint's training data came from (``render_settings``)."""
    return render_settings(checkpoint)["source"]


def ensure_data(data) -> Path:
    """The dataset root, rendered with ``sim.render.normals.make_dataset`` first when it is missing (several ranks or
    runs at once: the first renders under the folder's lock, the others wait and read it)."""
    root = Path(data.root)
    if not (root / "meta.json").is_file() and data.layout != "cleargrasp" and getattr(data, "render_n", 0) > 0:
        from core.distributed import main_process_first

        with main_process_first(root):
            if not (root / "meta.json").is_file():
                _render(data, root)
    if (root / "meta.json").is_file() or data.layout == "cleargrasp":
        if not root.exists():
            raise DataError(root, "no such folder")
        if data.layout != "cleargrasp" and getattr(data, "render_n", 0) > 0:  # data=normals: no render keys
            from sim.render.dataset_io import check_source

            check_source(root, data.render_source, "data.render_source")
            check_source(root, data.render_framing, "data.render_framing", field="framing",
                         default="workspace")
        return root
    raise DataError(root / "meta.json", "no such file (set data.render_n to render the synthetic set)")


def _render(data, root: Path) -> None:
    from sim.render.normals import make_dataset

    log.info("rendering %d %s views (seed %d, %d px, %d spp) into %s", data.render_n, data.render_source,
             data.render_seed, data.render_size, data.render_spp, root)
    make_dataset(root, n=data.render_n, seed=data.render_seed, size=data.render_size, spp=data.render_spp,
                 test_fraction=data.test_fraction, source=data.render_source, workers=data.render_workers,
                 framing=data.render_framing)


def _dataset(data, split: str, keys: tuple[str, ...]):
    from core.data.images import ClearGraspDataset, DenseImageDataset

    if data.layout == "cleargrasp":
        keys = tuple(k for k in keys if k in ("rgb", "normals", "mask"))
        # A root with split folders (ClearGrasp's archives, or train/ val/ test/) is split as asked. A bare
        # folder of objects is one split: it may be evaluated as the test split but is never trained on, so
        # train and test cannot silently be the same images.
        bare = not any(ClearGraspDataset.split_dirs(data.root, s) for s in ClearGraspDataset.SPLIT_DIRS)
        if bare and split == data.test_split:
            return ClearGraspDataset(data.root, keys=keys)
        return ClearGraspDataset(data.root, split=split, keys=keys)
    meta_keys = keys if split == data.train_split else tuple(k for k in keys if k != "rgb_twin")
    return DenseImageDataset(data.root, split, keys=meta_keys)


def _transforms(model_cfg: TransNormalConfig, data, sample_hw: tuple[int, int]) -> list:
    from core.data.device import RandomCrop, RandomHorizontalFlip

    ts = []
    size = model_cfg.image_size
    if sample_hw != (size, size) and min(sample_hw) > size:
        ts.append(RandomCrop(size, keys=("rgb", "rgb_twin", "normals", "valid")))
    if getattr(data, "flip_p", 0.5) > 0:
        ts.append(RandomHorizontalFlip(p=getattr(data, "flip_p", 0.5), keys=("rgb", "rgb_twin", "normals", "valid"),
                                       normal_keys=("normals",)))
    return ts


def pretrain_vae(model, dataset, trainer_cfg: TrainerConfig, model_cfg: TransNormalConfig, out_dir: Path,
                 transforms: list, run_config: dict[str, Any]) -> float:
    """Stage 1: train ``model.vae`` as an auto-encoder on RGB + normal maps; returns the latent scale."""
    from core.trainer import Trainer
    from perception.normals.modeling_transnormal import VAEAutoencoder

    ae = VAEAutoencoder(model.vae, model_cfg.vae_kl_weight)
    model.vae.requires_grad_(True)
    steps = model_cfg.vae_pretrain_steps
    cfg = dataclasses.replace(
        trainer_cfg, max_steps=steps, ckpt_every=steps, ema_decay=None, grad_clip=1.0,
        optim=dataclasses.replace(trainer_cfg.optim, lr=model_cfg.vae_pretrain_lr, param_group_lrs={}),
        scheduler=dataclasses.replace(trainer_cfg.scheduler, warmup_steps=min(50, steps // 10)))
    trainer = Trainer(ae, dataset, cfg, out_dir, run_config={**run_config, "stage": "vae"}, transforms=transforms)
    result = trainer.fit()
    trainer.release()  # under FSDP: plain parameters again for the UNet stage, which shards anew
    model.vae.requires_grad_(False)
    log.info("VAE stage: %s", result["metrics"])
    return float(1.0 / ae.latent_std.clamp_min(1e-6))


def train(cfg) -> dict[str, Any]:
    """Train TransNormal under the composed config (configs/experiment/transnormal.yaml)."""
    from core.bootstrap import prepare_process
    from core.trainer import Trainer, seed_everything
    from perception.normals.modeling_transnormal import TransNormalModel

    prepare_process()
    model_cfg: TransNormalConfig = to_object(cfg.model)
    data = to_object(cfg.data)
    trainer_cfg: TrainerConfig = to_object(cfg.trainer)
    out_dir = Path(cfg.out_dir)
    ensure_data(data)
    if data.layout == "cleargrasp":
        dataset = _dataset(data, data.train_split, ("rgb", "normals"))
    else:
        dataset = _dataset(data, data.train_split, TRAIN_KEYS)
    if len(dataset) == 0:
        raise DataError(data.root, f"split {data.train_split!r} is empty")
    hw = tuple(dataset[0]["rgb"].shape[-2:])
    transforms = _transforms(model_cfg, data, hw)
    seed_everything(trainer_cfg.seed)
    run_config = to_container(cfg)
    stage_vae = model_cfg.vae_path is None and model_cfg.vae_pretrain_steps > 0
    model = TransNormalModel(model_cfg)
    if stage_vae:
        scale = pretrain_vae(model, dataset, trainer_cfg, model_cfg, out_dir / "vae", transforms, run_config)
        model.latent_scale.fill_(scale)
        model_cfg = dataclasses.replace(model_cfg, scaling_factor=scale)
    run_config["model"] = dataclasses.asdict(model_cfg)
    save_resolved(run_config, out_dir)
    result = Trainer(model, dataset, trainer_cfg, out_dir, run_config=run_config, transforms=transforms).fit()
    log.info("trained on %d views; final %s", len(dataset), result["metrics"])
    return {"step": result["step"], "loss": result["metrics"].get("loss"), "checkpoint": str(result["checkpoint"]),
            "latent_scale": float(model.latent_scale)}


# ------------------------------------------------------------------------------------------ evaluation
def mean_normal(dataset, limit: int = 256) -> np.ndarray:
    """The mean ground-truth normal (unit (3,) vector) over up to ``limit`` samples: the constant baseline."""
    acc = np.zeros(3)
    for i in range(min(len(dataset), limit)):
        s = dataset[i]
        acc += s["normals"][:, s["valid"]].double().sum(1).numpy()
    n = np.linalg.norm(acc)
    return acc / n if n > 0 else np.array([0.0, 0.0, -1.0])


def evaluate_predictor(predict, dataset, batch_size: int = 8) -> dict[str, dict[str, float]]:
    """Pooled metrics of ``predict((B, 3, H, W) uint8) -> (B, 3, H, W) normals`` over ``dataset``.

    Returns ``{"all": metrics over every valid pixel, "glass": over valid pixels of the object mask}``.
    """
    import torch

    from perception.normals.metrics import NormalMetrics

    everything, glass = NormalMetrics(), NormalMetrics()
    for start in range(0, len(dataset), batch_size):
        samples = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        rgb = torch.stack([s["rgb"] for s in samples])
        gt = torch.stack([s["normals"] for s in samples])
        valid = torch.stack([s["valid"] for s in samples])
        with torch.no_grad():
            pred = predict(rgb).float().cpu()
        everything.update(pred, gt, valid)
        if "mask" in samples[0]:
            glass.update(pred, gt, valid & (torch.stack([s["mask"] for s in samples]) > 0))
    return {"all": everything.compute(), "glass": glass.compute()}


def _constant_predictor(direction: np.ndarray):
    import torch

    d = torch.as_tensor(direction, dtype=torch.float32).view(1, 3, 1, 1)
    return lambda rgb: d.expand(rgb.shape[0], 3, *rgb.shape[-2:])


def evaluate(cfg) -> dict[str, Any]:
    """Metrics of the checkpoint and the baselines on the held-out split; writes ``<out_dir>/eval.json``."""
    from core.checkpoint import resolve_checkpoint
    from perception.normals.cli import inference_device
    from perception.normals.pipeline_transnormal import TransNormalPipeline

    data = to_object(cfg.data)
    check_eval_config(cfg)
    ensure_data(data)
    test = _dataset(data, data.test_split, EVAL_KEYS)
    if len(test) == 0:
        raise DataError(data.root, f"split {data.test_split!r} is empty")
    ckpt = resolve_checkpoint(cfg.eval.checkpoint or cfg.out_dir)
    rows: dict[str, Any] = {}
    for name in ["transnormal", *cfg.eval.baselines]:
        if name == "constant":
            train_split = None
            if data.layout != "cleargrasp" and (Path(data.root) / data.train_split).is_dir():
                train_split = _dataset(data, data.train_split, ("rgb", "normals"))
            direction = mean_normal(train_split) if train_split is not None else np.array([0.0, 0.0, -1.0])
            rows[name] = evaluate_predictor(_constant_predictor(direction), test)
            rows[name]["direction"] = [round(float(v), 4) for v in direction]
            continue
        path = ckpt if name == "transnormal" else resolve_checkpoint(name)
        pipe = TransNormalPipeline.from_pretrained(path, **inference_device())
        key = name if name == "transnormal" else _run_name(path)
        rows[key] = evaluate_predictor(lambda rgb, p=pipe: p(rgb).normals, test)
        rows[key]["mode"] = pipe.model.config.mode
        rows[key]["steps"] = pipe.default_steps
        rows[key]["use_dino"] = pipe.model.config.use_dino
        rows[key]["checkpoint"] = str(path)
        log.info("%s: mean %.2f deg, median %.2f deg", key, rows[key]["all"]["mean"], rows[key]["all"]["median"])
    result = {"dataset": str(data.root), "layout": data.layout, "split": data.test_split, "views": len(test),
              "checkpoint": str(ckpt), "models": rows}
    write_json(Path(cfg.out_dir) / "eval.json", result)
    return result


def _run_name(ckpt: Path) -> str:
    """``outputs/transnormal_nodino/checkpoints/step_N`` -> ``transnormal_nodino``."""
    parts = ckpt.resolve().parts
    if "checkpoints" in parts:
        return parts[parts.index("checkpoints") - 1]
    return ckpt.name


def check_eval_config(cfg) -> None:
    """Raise ``ConfigError`` for baselines that are neither ``constant`` nor an existing path."""
    for b in cfg.eval.baselines:
        if b != "constant" and not Path(b).exists():
            raise ConfigError(f"eval.baselines: {b!r} is neither 'constant' nor an existing checkpoint / run folder")


def calibrate_domain(checkpoint: str | Path | None = None, work: str | Path = "outputs/domain/transnormal",
                     n_train: int = 160, n_cal: int = 48, n_heldout: int = 32) -> dict[str, Any]:
    """Fit the checkpoint's out-of-domain check (``core.domain``) on renders like its training data.

    Training sample: views 0..n_train-1 of the training seed (0; source, framing and size as the checkpoint's
    data, 32 spp);
    calibration and held-out splits: renders of seeds 1000 and 2000 that no model saw. Reproduce with
    ``python -c "from perception.normals.task import calibrate_domain; calibrate_domain()"``.
    """
    from core.bootstrap import prepare_process

    prepare_process()  # the learning stack before any render context (MuJoCo EGL then triton segfaults)
    from core import domain
    from core.data.images import DenseImageDataset
    from perception.normals.cli import DEFAULT_CHECKPOINT
    from sim.render.normals import make_dataset

    checkpoint = Path(checkpoint or DEFAULT_CHECKPOINT)
    settings = render_settings(checkpoint)  # the renders the checkpoint was trained on
    source, framing, size = settings["source"], settings["framing"], settings["size"]

    def load_split(name: str, seed: int, n: int) -> list[np.ndarray]:
        root = Path(work) / f"{source}_{framing}_{size}_{name}"
        if not (root / "meta.json").is_file():
            make_dataset(root, n=n, seed=seed, size=size, spp=32, test_fraction=0.0, source=source, framing=framing)
        ds = DenseImageDataset(root, "train", keys=("rgb",))
        return [ds[i]["rgb"].permute(1, 2, 0).numpy() for i in range(len(ds))]

    sizes = {"train": (0, n_train), "calibration": (1000, n_cal), "heldout": (2000, n_heldout)}
    return domain.calibrate(checkpoint, load_split, sizes,
                            f"sim.render.normals source {source}, framing {framing}, seeds 0 (train sample), 1000, "
                            f"2000; {size} px")
