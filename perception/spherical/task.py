"""``embodied train sola`` / ``embodied eval sola``: the task functions, separate from the CLI.

train: (render the synthetic panoramas with ``sim.render.panoramas`` if the folder is missing) -> panorama
dataset -> ``SoLAModel`` -> core Trainer -> checkpoint. evaluate: depth (MAE, RMSE, AbsRel, delta1) and
segmentation (mIoU) on the held-out split, upright (``data.rotate=none``) or with every panorama turned by a
random rotation (``data.rotate=so3``; ``yaw`` for rotations about the up axis). The rotation of test sample
``i`` is drawn from ``data.rotate_seed`` and ``i`` only, so every model sees the same rotated panoramas.
Metrics are taken at the vertices of the model's finest icosphere level (targets sampled at the nearest
pixel), so upright and rotated numbers go through the same sampling. Writes ``<out_dir>/eval_<rotate>.json``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.errors import DataError
from core.io import write_json
from core.logging import get_logger
from perception.spherical.configuration_sola import SoLAConfig, SoLADataConfig
from perception.spherical.modeling_sola import SoLAModel

log = get_logger("embodied.sola")


class ResizedPanoramas(Dataset):
    """A panorama dataset resized to ``height`` x ``2 height`` (RGB area-averaged, depth / labels nearest).

    Items: ``rgb`` (3, H, 2H) uint8, ``depth`` (1, H, 2H) float32 metres (0 = invalid), ``semantic`` (H, 2H)
    int64, ``index`` () int64.
    """

    def __init__(self, base: Dataset, height: int):
        self.base, self.height = base, height

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        import torch.nn.functional as F

        s = dict(self.base[i])
        size = (self.height, 2 * self.height)
        if "rgb" in s and tuple(s["rgb"].shape[-2:]) != size:
            rgb = F.interpolate(s["rgb"][None].float(), size=size, mode="area")[0]
            s["rgb"] = rgb.round().clamp(0, 255).to(torch.uint8)
        if "depth" in s and tuple(s["depth"].shape[-2:]) != size:
            s["depth"] = F.interpolate(s["depth"][None].float(), size=size, mode="nearest")[0]
        if "semantic" in s and tuple(s["semantic"].shape[-2:]) != size:
            sem = F.interpolate(s["semantic"][None, None].float(), size=size, mode="nearest")[0, 0]
            s["semantic"] = sem.long()
        s.setdefault("index", torch.tensor(i))
        return {k: s[k] for k in ("rgb", "depth", "semantic", "index") if k in s}


def ensure_data(data: SoLADataConfig) -> Path:
    """The dataset root, rendering the synthetic panoramas first when it is missing (embodied-dense only)."""
    root = Path(data.root)
    if data.layout != "embodied-dense":
        return root
    if not (root / "meta.json").is_file():
        from core.distributed import main_process_first

        with main_process_first(root):  # several ranks (or runs) at once: the first renders, the others read it
            if not (root / "meta.json").is_file():
                _render(data, root)
    from sim.render.dataset_io import check_source

    check_source(root, data.render_source, "data.render_source")
    return root


def _render(data: SoLADataConfig, root: Path) -> None:
    if root.exists() and any(root.iterdir()):
        raise DataError(root, "exists but has no meta.json (not an embodied-dense panorama folder)")
    from sim.render.panoramas import make_dataset

    log.info("rendering %d %s panoramas (H=%d, seed %d) into %s", data.render_n, data.render_source, data.height,
             data.render_seed, root)
    make_dataset(root, n=data.render_n, seed=data.render_seed, size=data.height, spp=data.render_spp,
                 test_fraction=data.test_fraction, source=data.render_source)


def build_dataset(data: SoLADataConfig, split: str) -> Dataset:
    """``split`` is ``"train"`` or ``"test"``: the configured split (or Stanford2D3D areas) of ``data``."""
    root = ensure_data(data)
    if data.layout == "stanford2d3d":
        from core.data.panoramas import Stanford2D3DDataset

        base: Dataset = Stanford2D3DDataset(root, areas=data.train_areas if split == "train" else data.test_areas)
    else:
        from core.data.panoramas import EquirectDataset

        base = EquirectDataset(root, data.train_split if split == "train" else data.test_split)
    if len(base) == 0:
        raise DataError(root, f"the {split} split is empty")
    return ResizedPanoramas(base, data.height)


def train(cfg) -> dict[str, Any]:
    """Train SoLA (or the LPE baseline, ``model.attention=lpe``) under the composed config ``cfg``."""
    from core.bootstrap import prepare_process
    from core.trainer import Trainer, seed_everything
    from perception.spherical.modeling_sola import SoLAModel

    prepare_process()
    model_cfg: SoLAConfig = to_object(cfg.model)
    data_cfg: SoLADataConfig = to_object(cfg.data)
    trainer_cfg: TrainerConfig = to_object(cfg.trainer)
    dataset = build_dataset(data_cfg, "train")
    seed_everything(trainer_cfg.seed)
    model = SoLAModel(model_cfg)
    run_config = to_container(cfg)
    run_config["model"] = dataclasses.asdict(model_cfg)
    out_dir = Path(cfg.out_dir)
    save_resolved(run_config, out_dir)
    result = Trainer(model, dataset, trainer_cfg, out_dir, run_config=run_config).fit()
    log.info("trained %s on %d panoramas; final %s", model_cfg.attention, len(dataset), result["metrics"])
    return {"step": result["step"], "loss": result["metrics"].get("loss"), "checkpoint": str(result["checkpoint"])}


def rotation_for(index: int, kind: str, seed: int) -> torch.Tensor:
    """The (3, 3) evaluation rotation of test sample ``index`` (a function of ``seed`` and ``index`` only)."""
    from perception.spherical.modeling_sola import random_rotations

    g = torch.Generator().manual_seed(seed * 1_000_003 + int(index))
    return random_rotations(1, kind, g)[0]


@torch.no_grad()
def evaluate_model(model, dataset: Dataset, rotate: str = "none", rotate_seed: int = 1234, batch_size: int = 8,
                   max_samples: int | None = None) -> dict[str, Any]:
    """Depth + segmentation metrics of ``model`` on ``dataset`` (optionally every sample rotated).

    Returns:
        ``{"mae", "rmse", "absrel", "delta1", "miou", "per_class_iou", "n"}``.
    """
    from perception.spherical.metrics import DepthMetrics, confusion_matrix, mean_iou

    device = next(model.parameters()).device
    k = model.config.num_classes
    depth, cm, n = DepthMetrics(), 0, len(dataset) if max_samples is None else min(len(dataset), max_samples)
    for start in range(0, n, batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, n))]
        batch = {key: torch.stack([it[key] for it in items]).to(device) for key in items[0]}
        rots = torch.stack([rotation_for(int(it["index"]), rotate, rotate_seed) for it in items]).to(device)
        s = model.sample(batch, None if rotate == "none" else rots)
        out = model(s["rgb"])
        if "depth" in s:
            depth.update(out["depth"], s["depth"])
        if "semantic" in s:
            cm = cm + confusion_matrix(out["logits"].argmax(-1), s["semantic"], k)
    miou, per_class = mean_iou(cm, model.config.ignore_index) if not isinstance(cm, int) else (float("nan"), [])
    return {**depth.compute(), "miou": miou, "per_class_iou": [None if x != x else float(x) for x in per_class],
            "n": n}


def evaluate(cfg) -> dict[str, Any]:
    """Held-out metrics of the checkpoint (``eval.checkpoint``, default the run's newest) under ``data.rotate``."""
    data_cfg: SoLADataConfig = to_object(cfg.data)
    ckpt = cfg.eval.checkpoint or cfg.out_dir
    device = "cuda" if torch.cuda.is_available() and cfg.trainer.device != "cpu" else "cpu"
    model = SoLAModel.from_pretrained(ckpt, device=device)
    dataset = build_dataset(data_cfg, "test")
    metrics = evaluate_model(model, dataset, data_cfg.rotate, data_cfg.rotate_seed, max_samples=data_cfg.max_test)
    result = {"checkpoint": str(ckpt), "attention": model.config.attention, "rotate": data_cfg.rotate,
              "rotate_seed": data_cfg.rotate_seed, "data": str(data_cfg.root), **metrics}
    write_json(Path(cfg.out_dir) / f"eval_{data_cfg.rotate}.json", result)
    log.info("%s (%s rotation): MAE %.3f delta1 %.3f mIoU %.3f", model.config.attention, data_cfg.rotate,
             metrics["mae"], metrics["delta1"], metrics["miou"])
    return result


def calibrate_domain(checkpoint: str | Path | None = None, work: str | Path = "outputs/domain/sola",
                     n_train: int = 64, n_cal: int = 48, n_heldout: int = 48) -> dict[str, Any]:
    """Fit the checkpoint's out-of-domain check (``core.domain``) on panoramas like its training data.

    Training sample: panoramas 0..n_train-1 of the training seed (0, 64 x 128, 4 spp); calibration and held-out
    splits: seeds 1000 and 2000. Reproduce with
    ``python -c "from perception.spherical.task import calibrate_domain; calibrate_domain()"``.
    """
    from core.bootstrap import prepare_process

    prepare_process()  # the learning stack before any render context (MuJoCo EGL then triton segfaults)
    from core import domain
    from core.data.imread import read_image
    from perception.spherical.cli import DEFAULT_CHECKPOINT, render_source
    from sim.render.panoramas import make_dataset

    checkpoint = Path(checkpoint or DEFAULT_CHECKPOINT)
    source = render_source(checkpoint)  # the panoramas the checkpoint was trained on

    def load_split(name: str, seed: int, n: int) -> list:
        root = Path(work) / f"{source}_{name}"
        if not (root / "meta.json").is_file():
            make_dataset(root, n=n, seed=seed, size=64, spp=4, test_fraction=0.0, source=source)
        return [read_image(p) for p in sorted((root / "train" / "rgb").glob("*.png"))]

    sizes = {"train": (0, n_train), "calibration": (1000, n_cal), "heldout": (2000, n_heldout)}
    return domain.calibrate(checkpoint, load_split, sizes,
                            f"sim.render.panoramas source {source}, seeds 0 (train sample), 1000, 2000; 64 x 128")
