"""LAC-WM / EAC-WM training: the recorded data splits, pretraining and adaptation to the held-out embodiment.

``data_files`` records (once) and returns the HDF5 files of the pretraining, adaptation and test splits;
``pretrain`` trains LAC-WM or EAC-WM on the pretraining embodiments (one ``core.trainer.Trainer`` run in
``<out_dir>/pretrain``); ``adapt`` runs the adaptation stages on the held-out embodiment's few demonstrations
(or trains the scratch arm) and saves the model to ``<out_dir>/adapted`` (``scratch_model``).
``worldmodels.lacwm.task`` chains them into ``embodied train lacwm``.

Run layout (``out_dir``)::

    pretrain/            core Trainer run of the pretrained model (checkpoints/, metrics.jsonl)
    adapt/<stage>/       one Trainer run per adaptation stage on the held-out embodiment
    adapted/             the adapted model (model.safetensors + config.json): projector / encoder + FDM
    scratch/, scratch_model/   the scratch arm (same inference architecture, random init)
    eval.json            rollout error, probe, planning, written by ``worldmodels.lacwm.task.evaluate``
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from core.config import TrainerConfig
from core.errors import ConfigError, DataError
from core.logging import get_logger
from worldmodels.lacwm.configuration_lacwm import LACWMConfig, WorldModelDataConfig

log = get_logger("embodied.lacwm")


# ------------------------------------------------------------------------------------------------ data
def data_files(data: WorldModelDataConfig, record: bool = True) -> dict[str, list[Path]]:
    """``{"pretrain", "adapt", "test"}`` -> HDF5 files, recording the missing ones (cached under ``data.root``);
    the user's ``data.paths`` (HDF5 files or LeRobot folders, read in place) join the pretraining split."""
    from worldmodels.lacwm.data import RecordSpec, check_cached, record_suite, suite_specs

    if data.demos:  # the user's demonstrations are the whole data: nothing recorded, no test split
        from core.data.trajectories import expand_data_paths

        demos = expand_data_paths(Path(p).expanduser() for p in data.demos)
        for p in demos:
            if not p.exists():
                raise DataError(p, "no such file or folder (data.demos: demonstration HDF5 files or folders)")
        return {"pretrain": demos, "adapt": demos, "test": []}
    if data.motion_key == "ee_states":
        raise ConfigError("data.demos is empty: motion_key 'ee_states' reads demonstration files; name them with "
                          "'data.demos=[FILE_OR_FOLDER]'")
    root = Path(data.root)
    embs = data.pretrain_embodiments[: data.num_pretrain_embodiments]
    plan = {
        "pretrain": suite_specs(embs, data.tasks, data.episodes, data.seed, data.max_steps, data.image_size,
                                camera=data.camera)
        + [RecordSpec(t, data.libero_episodes, data.seed, data.max_steps, data.image_size, explore_every=0)
           for t in data.libero_tasks],
        "adapt": suite_specs([data.held_out], data.tasks, data.adapt_episodes, data.seed, data.max_steps,
                             data.image_size, camera=data.camera),
        "test": suite_specs([data.held_out], data.tasks, data.test_episodes, data.test_seed, data.max_steps,
                            data.image_size, explore_every=2, camera=data.camera),
    }
    out: dict[str, list[Path]] = {}
    for split, specs in plan.items():
        from sim.recorder import sanitize_env_id

        paths = [root / split / f"{sanitize_env_id(s.env_id)}.hdf5" for s in specs]
        missing = [s for s, p in zip(specs, paths, strict=True) if not p.exists()]
        for s, p in zip(specs, paths, strict=True):
            if p.exists():
                check_cached(s, p)  # the cache is keyed by env id: refuse files of other settings
        if missing and not record:
            raise DataError(paths[specs.index(missing[0])], "no such file (run `embodied train` to record it)")
        if missing:
            record_suite(missing, root / split)
        out[split] = paths
    user = [Path(p).expanduser() for p in data.paths]
    for p in user:
        if not p.exists():
            raise DataError(p, "no such file or folder (data.paths: trajectory HDF5 files or LeRobot folders)")
    out["pretrain"] = out["pretrain"] + user
    return out


def data_keys(data: WorldModelDataConfig) -> dict[str, str]:
    """The ``TransitionDataset`` keys of the frames and the motion label in ``data``'s files."""
    return {"image_key": data.image_key, "motion_key": data.motion_key}


def transitions(paths: list[Path], model_cfg: LACWMConfig, context: int | None = None, **kw):
    """A ``TransitionDataset`` with the model's skip and (by default) context; ``kw`` as the dataset takes it
    (``image_key`` / ``motion_key`` from ``data_keys``)."""
    from worldmodels.lacwm.data import TransitionDataset

    return TransitionDataset(paths, context=context or model_cfg.context, skip=model_cfg.frame_skip, **kw)


def motion_stats(ds) -> tuple[np.ndarray, np.ndarray]:
    """Per-dim mean / std of the per-transition motion label over (up to 2,000 samples of) ``ds``."""
    idx = np.linspace(0, len(ds) - 1, min(len(ds), 2000)).astype(int)
    m = np.concatenate([ds[int(i)]["motion"].numpy() for i in idx])
    return m.mean(0), m.std(0)


# ------------------------------------------------------------------------------------------- training
def pretrain(model_cfg: LACWMConfig, files: dict[str, list[Path]], trainer_cfg: TrainerConfig, out_dir: Path,
             run_config: dict[str, Any], keys: dict[str, str] | None = None):
    """Pretrain LAC-WM / EAC-WM on the pretraining files (``keys``: ``data_keys``); returns the trained model."""
    from core.trainer import Trainer, seed_everything
    from worldmodels.lacwm.modeling_lacwm import LACWorldModel, build_model

    keys = keys or {}
    probe = transitions(files["pretrain"], model_cfg, **keys)
    dims = {e: probe.action_dims[e] for e in probe.embodiments}
    pad = max(dims.values())
    ds = transitions(files["pretrain"], model_cfg, action_pad_to=pad, embodiment_names=list(dims), **keys)
    model_cfg = dataclasses.replace(model_cfg, action_dims=dims if model_cfg.conditioning == "explicit" else {})
    seed_everything(trainer_cfg.seed)
    model = build_model(model_cfg)
    if isinstance(model, LACWorldModel):
        model.set_motion_stats(*motion_stats(ds))
    rc = {**run_config, "model": dataclasses.asdict(model_cfg)}
    log.info("pretraining %s on %d transitions of %s", model_cfg.conditioning, len(ds), list(dims))
    trainer = Trainer(model, ds, trainer_cfg, out_dir, run_config=rc)
    trainer.fit()
    trainer.release()  # under FSDP: plain parameters again for adaptation / saving
    return model.cpu()


def adapt(pretrained, files: dict[str, list[Path]], held_out: str, trainer_cfg: TrainerConfig, out_dir: Path,
          run_config: dict[str, Any], scratch: bool = False, keys: dict[str, str] | None = None):
    """Adapt ``pretrained`` (or train the scratch arm) on the held-out embodiment's few demonstrations
    (``keys``: ``data_keys``)."""
    from core.checkpoint import save_checkpoint
    from core.distributed import barrier, is_main_process
    from core.trainer import Trainer, seed_everything
    from worldmodels.lacwm.adaptation import AdaptationStage, adapt_model, adapted_config, stage_plan
    from worldmodels.lacwm.data import embodiment_name
    from worldmodels.lacwm.modeling_lacwm import build_model

    held_out = embodiment_name(held_out)
    base_cfg = pretrained.config
    ds = transitions(files["adapt"], base_cfg, embodiments=[held_out], **(keys or {}))
    if not len(ds):
        raise DataError(files["adapt"][0], f"no {held_out!r} episodes to adapt to")
    a_dim = ds.action_dims[held_out]
    seed_everything(trainer_cfg.seed)
    model = build_model(adapted_config(base_cfg, held_out, a_dim, scratch=True)) if scratch \
        else adapt_model(pretrained, held_out, a_dim)
    a = base_cfg.adapt
    for stage, steps in stage_plan(model, scratch=scratch):
        wrapper = AdaptationStage(model, stage, held_out, a.align_weight)
        tc = dataclasses.replace(trainer_cfg, max_steps=steps, batch_size=min(a.batch_size, len(ds)),
                                 ckpt_every=steps, optim=dataclasses.replace(trainer_cfg.optim, lr=a.lr))
        trainer = Trainer(wrapper, ds, tc, out_dir / ("scratch" if scratch else "adapt") / stage, run_config=run_config)
        trainer.fit()
        trainer.release()  # the next stage (or the save below) needs plain parameters under FSDP
    model = model.cpu().eval()
    for p in model.parameters():
        p.requires_grad_(True)
    name = "scratch_model" if scratch else "adapted"
    if is_main_process():  # under torchrun every rank holds the same weights; two writers of one folder race
        save_checkpoint(out_dir / name, model, {**run_config, "model": dataclasses.asdict(model.config),
                                                "held_out": held_out, "stage": name})
    barrier()  # the other ranks go on once the checkpoint is on disk
    return model
