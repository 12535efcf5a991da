"""What ``embodied train|eval lacwm|eacwm`` run: data, pretraining, adaptation, evaluation, the scaling sweep.

Run layout (``out_dir``)::

    pretrain/            core Trainer run of the pretrained model (checkpoints/, metrics.jsonl)
    adapt/<stage>/       one Trainer run per adaptation stage on the held-out embodiment
    adapted/             the adapted model (model.safetensors + config.json): projector / encoder + FDM
    scratch/, scratch_model/   the scratch arm (same inference architecture, random init)
    eval.json            rollout error, probe, planning, written by ``evaluate``

Scaling sweep (``python -m worldmodels.lacwm.experiments scaling [--workers N] [overrides]``): for each number
of pretraining embodiments, LAC-WM and its EAC-WM arm are pretrained and adapted (the ``core.experiments``
grid, through the public CLI); scratch once; the held-out rollout error table goes to
``<out_dir>/scaling.json``. ``... reeval --plan`` evaluates a finished sweep again
(``reeval.json``, with planning on the largest count).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.config import TrainerConfig, to_container, to_object
from core.errors import DataError
from core.io import write_json
from core.logging import get_logger
from worldmodels.lacwm.configuration_lacwm import LACWMConfig, WorldModelDataConfig

log = get_logger("embodied.lacwm")

LIBERO_PREFIX = "embodied/Libero-"


# ------------------------------------------------------------------------------------------------ data
def data_files(data: WorldModelDataConfig, record: bool = True) -> dict[str, list[Path]]:
    """``{"pretrain", "adapt", "test"}`` -> HDF5 files, recording the missing ones (cached under ``data.root``)."""
    from worldmodels.lacwm.data import RecordSpec, check_cached, record_suite, suite_specs

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
    return out


def transitions(paths: list[Path], model_cfg: LACWMConfig, context: int | None = None, **kw):
    """A ``TransitionDataset`` with the model's skip and (by default) context."""
    from worldmodels.lacwm.data import TransitionDataset

    return TransitionDataset(paths, context=context or model_cfg.context, skip=model_cfg.frame_skip, **kw)


def motion_stats(ds) -> tuple[np.ndarray, np.ndarray]:
    """Per-dim mean / std of the per-transition motion label over (up to 2,000 samples of) ``ds``."""
    idx = np.linspace(0, len(ds) - 1, min(len(ds), 2000)).astype(int)
    m = np.concatenate([ds[int(i)]["motion"].numpy() for i in idx])
    return m.mean(0), m.std(0)


# ------------------------------------------------------------------------------------------- training
def _trainer_cfg(cfg: TrainerConfig, **over) -> TrainerConfig:
    return dataclasses.replace(cfg, **over)


def pretrain(model_cfg: LACWMConfig, files: dict[str, list[Path]], trainer_cfg: TrainerConfig, out_dir: Path,
             run_config: dict[str, Any]):
    """Pretrain LAC-WM / EAC-WM on the pretraining files; returns the trained model."""
    from core.trainer import Trainer, seed_everything
    from worldmodels.lacwm.modeling_lacwm import LACWorldModel, build_model

    probe = transitions(files["pretrain"], model_cfg)
    dims = {e: probe.action_dims[e] for e in probe.embodiments}
    pad = max(dims.values())
    ds = transitions(files["pretrain"], model_cfg, action_pad_to=pad, embodiment_names=list(dims))
    model_cfg = dataclasses.replace(model_cfg, action_dims=dims if model_cfg.conditioning == "explicit" else {})
    seed_everything(trainer_cfg.seed)
    model = build_model(model_cfg)
    if isinstance(model, LACWorldModel):
        model.set_motion_stats(*motion_stats(ds))
    rc = {**run_config, "model": dataclasses.asdict(model_cfg)}
    log.info("pretraining %s on %d transitions of %s", model_cfg.conditioning, len(ds), list(dims))
    Trainer(model, ds, trainer_cfg, out_dir, run_config=rc).fit()
    return model.cpu()


def adapt(pretrained, files: dict[str, list[Path]], held_out: str, trainer_cfg: TrainerConfig, out_dir: Path,
          run_config: dict[str, Any], scratch: bool = False):
    """Adapt ``pretrained`` (or train the scratch arm) on the held-out embodiment's few demonstrations."""
    from core.checkpoint import save_checkpoint
    from core.trainer import Trainer, seed_everything
    from worldmodels.lacwm.adaptation import AdaptationStage, adapt_model, adapted_config, stage_plan
    from worldmodels.lacwm.data import embodiment_name
    from worldmodels.lacwm.modeling_lacwm import build_model

    held_out = embodiment_name(held_out)
    base_cfg = pretrained.config
    ds = transitions(files["adapt"], base_cfg)
    a_dim = ds.action_dims[held_out]
    seed_everything(trainer_cfg.seed)
    model = build_model(adapted_config(base_cfg, held_out, a_dim, scratch=True)) if scratch \
        else adapt_model(pretrained, held_out, a_dim)
    a = base_cfg.adapt
    for stage, steps in stage_plan(model, scratch=scratch):
        wrapper = AdaptationStage(model, stage, held_out, a.align_weight)
        tc = _trainer_cfg(trainer_cfg, max_steps=steps, batch_size=min(a.batch_size, len(ds)),
                          ckpt_every=steps, optim=dataclasses.replace(trainer_cfg.optim, lr=a.lr))
        Trainer(wrapper, ds, tc, out_dir / ("scratch" if scratch else "adapt") / stage, run_config=run_config).fit()
    model = model.cpu().eval()
    for p in model.parameters():
        p.requires_grad_(True)
    name = "scratch_model" if scratch else "adapted"
    save_checkpoint(out_dir / name, model, {**run_config, "model": dataclasses.asdict(model.config),
                                            "held_out": held_out, "stage": name})
    return model


# ------------------------------------------------------------------------------------------- metrics
def _psnr_db(mse: torch.Tensor) -> torch.Tensor:
    """PSNR in dB of an MSE of frames in [-1, 1] (``core.metrics``: peak-to-peak 2, MSE floored at 1e-10)."""
    from core.metrics.image import psnr_from_mse

    return psnr_from_mse(mse, data_range=2.0, min_mse=1e-10)


def _ssim(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``core.metrics`` SSIM (uniform 7 x 7 windows) of frames in [-1, 1], mapped to [0, 1]: (..., 3, H, W) -> (...)."""
    from core.metrics.image import ssim

    return ssim((pred.clamp(-1, 1) + 1) / 2, (target.clamp(-1, 1) + 1) / 2)


def feature_distance(pred: torch.Tensor, target: torch.Tensor, judge) -> torch.Tensor:
    """Learned feature distance: 1 - cosine similarity of ``judge`` IDM frame tokens, (..., 3, H, W) -> (...)."""
    lead = pred.shape[:-3]
    p = judge.codec.patchify(pred.reshape(-1, *pred.shape[-3:]))
    t = judge.codec.patchify(target.reshape(-1, *target.shape[-3:]))
    fp, ft = judge.idm.tokens(p), judge.idm.tokens(t)
    for blk in judge.idm.blocks:
        fp, ft = blk(fp), blk(ft)
    return (1 - torch.nn.functional.cosine_similarity(fp, ft, dim=-1).mean(-1)).reshape(lead)


@torch.no_grad()
def rollout_error(model, ds, embodiment: str, horizon: int = 8, max_samples: int = 64, seed: int = 0,
                  judge=None) -> dict[str, Any]:
    """Imagined-rollout error vs horizon on windows of ``horizon`` transitions.

    Arms: ``model`` (true actions through its projector / encoder), ``shuffled`` (actions of another window),
    ``copy_last`` (the first frame repeated). Returns per-arm lists of mean PSNR / SSIM (/ feature
    distance with a ``judge`` LAC-WM) at horizons 1..``horizon``; PSNR is that of the mean squared error over
    windows (a mean of per-window PSNRs is dominated by the few near-perfect windows).
    """
    if len(ds) == 0:
        raise DataError("test episodes", f"no window of {horizon} transitions fits in them (episodes too short "
                        "for this horizon x model.frame_skip; raise data.max_steps)")
    g = np.random.default_rng(seed)
    idx = g.choice(len(ds), size=min(max_samples, len(ds)), replace=False)
    batch = {k: torch.stack([ds[int(i)][k] for i in idx]) for k in ("frames", "actions")}
    model = model.eval()
    target = model.codec.to_float(batch["frames"])[:, 1:]
    perm = torch.from_numpy(np.roll(np.arange(len(idx)), 1))
    enc = model.action_encoder(embodiment)
    arms = {
        "model": model.imagine(batch["frames"][:, 0], enc(batch["actions"].float())),
        "shuffled": model.imagine(batch["frames"][:, 0], enc(batch["actions"][perm].float())),
        "copy_last": model.codec.to_float(batch["frames"][:, :1]).expand_as(target),
    }
    out: dict[str, Any] = {"samples": len(idx), "horizon": horizon}
    for name, pred in arms.items():
        mse = ((pred - target) ** 2).flatten(2).mean(-1).mean(0)  # (T,): mean over windows, then PSNR
        row = {"psnr": _psnr_db(mse).tolist(), "ssim": _ssim(pred, target).mean(0).tolist()}
        if judge is not None:
            row["feature_distance"] = feature_distance(pred, target, judge).mean(0).tolist()
        out[name] = row
    return out


RIDGES = tuple(10.0**k for k in range(-3, 5))


def _ridge_fit(x: np.ndarray, y: np.ndarray, ridge: np.ndarray) -> np.ndarray:
    """Ridge weights (D+1, L) with an unpenalised bias; ``ridge`` (L,) is the penalty of each label dim."""
    xb = np.c_[x, np.ones(len(x))]
    gram, xty = xb.T @ xb, xb.T @ y
    w = np.empty((xb.shape[1], y.shape[1]))
    for lam in np.unique(ridge):  # one solve per distinct penalty, all its label dims at once
        cols = ridge == lam
        reg = lam * np.eye(xb.shape[1])
        reg[-1, -1] = 0.0
        w[:, cols] = np.linalg.solve(gram + reg, xty[:, cols])
    return w


def _ridge_cv(x: np.ndarray, y: np.ndarray, folds: int = 5) -> np.ndarray:
    """Per label dim, the penalty of ``RIDGES`` with the lowest squared error over ``folds`` contiguous folds
    (samples come in episode order, so contiguous folds mostly hold out whole episodes)."""
    edges = np.linspace(0, len(x), folds + 1).astype(int)
    err = np.zeros((len(RIDGES), y.shape[1]))
    for i, lam in enumerate(RIDGES):
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            keep = np.r_[0:a, b:len(x)]
            w = _ridge_fit(x[keep], y[keep], np.full(y.shape[1], lam))
            err[i] += ((np.c_[x[a:b], np.ones(b - a)] @ w - y[a:b]) ** 2).sum(0)
    return np.asarray(RIDGES)[err.argmin(0)]


@torch.no_grad()
def linear_probe(model, train_ds, test_ds, seed: int = 0, shuffles: int = 10) -> dict[str, Any]:
    """R^2 of a ridge-regression probe from frozen IDM latents to the true end-effector motion.

    Trained on ``train_ds``, scored on ``test_ds`` (both of the held-out embodiment). Latents are standardised
    with the training statistics; the penalty of each label dim is chosen by 5-fold cross-validation on the
    training set (``RIDGES``), so a dim the latent does not predict gets a large penalty and R^2 near 0 instead
    of an overfit negative value. ``r2`` pools the 6 dims (dx, dy, dz, rx, ry, rz), ``r2_translation`` the first
    three, ``r2_per_dim`` each; ``r2_shuffled`` trains on permuted labels (mean over ``shuffles`` permutations;
    should be ~0 or below: a shift of the test episodes' mean motion from the training episodes' pushes it
    below 0).
    """

    def collect(ds):
        zs, ms = [], []
        for i in range(0, len(ds), 64):
            items = [ds[j] for j in range(i, min(len(ds), i + 64))]
            zs.append(model.latent_actions(torch.stack([s["frames"] for s in items])).flatten(0, 1))
            ms.append(torch.stack([s["motion"] for s in items]).flatten(0, 1))
        return torch.cat(zs).double().numpy(), torch.cat(ms).double().numpy()

    model = model.eval()
    z_tr, m_tr = collect(train_ds)
    z_te, m_te = collect(test_ds)
    z_mu, z_sd = z_tr.mean(0), z_tr.std(0) + 1e-9
    z_tr, z_te = (z_tr - z_mu) / z_sd, (z_te - z_mu) / z_sd
    mu, sd = m_tr.mean(0), m_tr.std(0) + 1e-9
    m_tr, m_te = (m_tr - mu) / sd, (m_te - mu) / sd

    def predict(labels, ridge=None):
        ridge = _ridge_cv(z_tr, labels) if ridge is None else ridge
        return np.c_[z_te, np.ones(len(z_te))] @ _ridge_fit(z_tr, labels, ridge)

    def r2(pred, dims=slice(None)):
        p, t = pred[:, dims], m_te[:, dims]
        return float(1 - ((p - t) ** 2).sum() / ((t - t.mean(0)) ** 2).sum())

    rng = np.random.default_rng(seed)
    shuffled = [r2(predict(m_tr[rng.permutation(len(m_tr))])) for _ in range(shuffles)]
    ridge = _ridge_cv(z_tr, m_tr)
    pred = predict(m_tr, ridge)
    # rotations of a small end effector are barely visible at 48-64 px: translation is reported on its own
    per_dim = [r2(pred, slice(j, j + 1)) for j in range(m_te.shape[1])]
    return {"r2": r2(pred), "r2_shuffled": float(np.mean(shuffled)), "r2_translation": r2(pred, slice(0, 3)),
            "r2_per_dim": per_dim, "ridge": ridge.tolist(), "train": len(z_tr), "test": len(z_te)}


# ------------------------------------------------------------------------------------------ tasks
def configs(cfg) -> tuple[LACWMConfig, WorldModelDataConfig, TrainerConfig]:
    """Validated model / data / trainer configs of a composed run config."""
    return to_object(cfg.model), to_object(cfg.data), to_object(cfg.trainer)


def train(cfg) -> dict[str, Any]:
    """Record data if missing, pretrain, adapt to the held-out embodiment (and the scratch arm)."""
    from core.bootstrap import prepare_process
    from core.config import save_resolved

    prepare_process()  # the learning stack before the recorder's EGL context (ENV.md: triton after EGL segfaults)
    model_cfg, data_cfg, trainer_cfg = configs(cfg)
    out = Path(cfg.out_dir)
    files = data_files(data_cfg)
    run_config = to_container(cfg)
    save_resolved(run_config, out)
    model = pretrain(model_cfg, files, trainer_cfg, out / "pretrain", run_config)
    adapted = adapt(model, files, data_cfg.held_out, trainer_cfg, out, run_config)
    return {"pretrained": str(out / "pretrain"), "adapted": str(out / "adapted"),
            "parameters": sum(p.numel() for p in adapted.parameters())}


def evaluate(cfg, scratch: bool = False, planning: bool = True) -> dict[str, Any]:
    """Rollout error (+ shuffled / copy-last ablations) of the adapted model on the held-out test episodes,
    (LAC-WM) the linear probe of the pretrained IDM latents, and planning success vs random selection."""
    from core.bootstrap import prepare_process
    from worldmodels.lacwm.modeling_lacwm import LACWorldModel, WorldModel

    prepare_process()
    model_cfg, data_cfg, _ = configs(cfg)
    out = Path(cfg.out_dir)
    files = data_files(data_cfg, record=True)
    path = cfg.eval.checkpoint or out / ("scratch_model" if scratch else "adapted")
    model = WorldModel.from_pretrained(path)
    test = transitions(files["test"], model.config, context=8)
    judge = None
    pre_path = out / "pretrain"
    result: dict[str, Any] = {"checkpoint": str(path), "held_out": data_cfg.held_out}
    if isinstance(model, LACWorldModel):
        judge = model
        pre = WorldModel.from_pretrained(pre_path)
        pairs = transitions(files["adapt"], model.config, context=1), transitions(files["test"], model.config, context=1)
        result["probe"] = linear_probe(pre, *pairs)
        # the adapted IDM saw the held-out embodiment (stage-1 LoRA with the LAC loss on the adaptation episodes)
        result["probe_adapted"] = linear_probe(model, *pairs)
    from worldmodels.lacwm.data import embodiment_name

    result["rollout"] = rollout_error(model, test, embodiment_name(data_cfg.held_out), judge=judge)
    if planning and data_cfg.plan_episodes > 0:
        from sim.manipulation.registration import env_id
        from worldmodels.lacwm.planning import planning_eval

        result["planning"] = planning_eval(path, env_id("Reach", data_cfg.held_out), episodes=data_cfg.plan_episodes,
                                           image_size=data_cfg.image_size, max_steps=data_cfg.plan_max_steps,
                                           camera=data_cfg.camera)
    write_json(out / ("eval_scratch.json" if scratch else "eval.json"), result)
    return result


# ------------------------------------------------------------------------------------------ scaling
ARMS = ("lacwm", "eacwm", "scratch")  # LAC-WM's registered arms, then the scratch arm (no CLI: in process)


def scaling(overrides: list[str], counts: list[int], out_root: str, arms: tuple[str, ...] = ARMS,
            workers: int = 1) -> dict[str, Any]:
    """The scaling experiment: LAC-WM vs EAC-WM vs scratch on the held-out embodiment for each count.

    The LAC-WM / EAC-WM cells (``<out_root>/<arm>_n<count>``) are a ``core.experiments`` grid: each runs
    ``embodied train lacwm <arm> data.num_pretrain_embodiments=<count>`` then ``embodied eval lacwm`` (no
    planning) in its own process, ``workers`` at a time, the first alone (it records the data); a cell with an
    ``eval.json`` is not rerun. The scratch arm trains in this process (``<out_root>/scratch``). ``arms`` picks a
    subset; the table goes to ``scaling.json`` (all arms) or ``scaling_<arms>.json``.
    """
    from core import experiments as ex
    from core.io import read_json

    root = Path(out_root)
    seed = next((int(o.split("=", 1)[1]) for o in reversed(overrides) if o.startswith("trainer.seed=")), 0)
    registered = ex.method_arms("lacwm")
    grid = {f"{arm}_n{n}": (*registered[arm], f"data.num_pretrain_embodiments={n}")
            for arm in ("lacwm", "eacwm") if arm in arms for n in counts}
    cells = ex.Grid("lacwm", root, grid, [seed], overrides, eval_overrides=["data.plan_episodes=0"],
                    name="{arm}").cells() if grid else []
    scratch_dir = root / "scratch"

    def scratch() -> bool:
        if (scratch_dir / "eval_scratch.json").is_file():
            return False
        from core.config import compose
        from worldmodels.lacwm.modeling_lacwm import build_model

        cfg = compose(["experiment=lacwm", *registered["eacwm"], *overrides, "data.num_pretrain_embodiments=1",
                       f"out_dir={scratch_dir}"])
        model_cfg, data_cfg, trainer_cfg = configs(cfg)
        adapt(build_model(dataclasses.replace(model_cfg, action_dims={})), data_files(data_cfg), data_cfg.held_out,
              trainer_cfg, scratch_dir, to_container(cfg), scratch=True)
        evaluate(cfg, scratch=True, planning=False)
        return True

    jobs = [(c.name, c.run) for c in cells] + ([("scratch", scratch)] if "scratch" in arms else [])
    failures = ex.run_jobs(jobs, workers, first_alone=True, logs={c.name: c.log for c in cells})
    rows = [_row(c.arm.rsplit("_n", 1)[0], int(c.arm.rsplit("_n", 1)[1]), read_json(c.result))
            for c in cells if c.done()]
    if (scratch_dir / "eval_scratch.json").is_file() and "scratch" in arms:
        rows.append(_row("scratch", 0, read_json(scratch_dir / "eval_scratch.json")))
    table = {"counts": counts, "rows": rows, "failed": [str(f) for f in failures]}
    write_json(root / ("scaling.json" if tuple(arms) == ARMS else f"scaling_{'_'.join(arms)}.json"), table)
    ex.report(failures)
    return table


def _row(method: str, n: int, ev: dict[str, Any]) -> dict[str, Any]:
    r = ev["rollout"]
    row = {"method": method, "pretrain_embodiments": n,
           "psnr@1": r["model"]["psnr"][0], "psnr@8": r["model"]["psnr"][-1],
           "psnr_mean": float(np.mean(r["model"]["psnr"])), "ssim_mean": float(np.mean(r["model"]["ssim"])),
           "shuffled_psnr_mean": float(np.mean(r["shuffled"]["psnr"])),
           "copy_last_psnr_mean": float(np.mean(r["copy_last"]["psnr"]))}
    if "feature_distance" in r["model"]:
        row["feat_dist_mean"] = float(np.mean(r["model"]["feature_distance"]))
        row["shuffled_feat_dist_mean"] = float(np.mean(r["shuffled"]["feature_distance"]))
        row["copy_last_feat_dist_mean"] = float(np.mean(r["copy_last"]["feature_distance"]))
    if "probe" in ev:
        row["probe_r2"] = ev["probe"]["r2"]
        row["probe_r2_shuffled"] = ev["probe"]["r2_shuffled"]
        row["probe_r2_translation"] = ev["probe"].get("r2_translation")
        if "probe_adapted" in ev:
            row["probe_adapted_r2_translation"] = ev["probe_adapted"]["r2_translation"]
    if "planning" in ev:
        row["plan_success"] = ev["planning"]["model"]["success_rate"]
        row["random_select_success"] = ev["planning"]["random"]["success_rate"]
    return row


def reevaluate(overrides: list[str], counts: list[int], out_root: str, plan: bool = False) -> dict[str, Any]:
    """Evaluate every finished run of a sweep again (current metrics; planning on the largest count and the
    scratch arm when ``plan``); writes ``<out_root>/reeval.json`` with the table rows and the full evaluations."""
    from core.config import compose
    from core.experiments import method_arms

    root = Path(out_root)
    rows, full = [], {}
    arms = method_arms("lacwm")
    for method in ("lacwm", "eacwm"):
        for n in counts:
            run = root / f"{method}_n{n}"
            if (run / "adapted").exists():
                cfg = compose(["experiment=lacwm", *arms[method], *overrides, f"data.num_pretrain_embodiments={n}",
                               f"out_dir={run}"])
                full[run.name] = ev = evaluate(cfg, planning=plan and n == max(counts))
                rows.append(_row(method, n, ev))
    if (root / "scratch" / "scratch_model").exists():
        cfg = compose(["experiment=lacwm", *arms["eacwm"], *overrides, "data.num_pretrain_embodiments=1",
                       f"out_dir={root / 'scratch'}"])
        full["scratch"] = ev = evaluate(cfg, scratch=True, planning=plan)
        rows.append(_row("scratch", 0, ev))
    table = {"rows": rows, "full": full}
    write_json(root / "reeval.json", table)
    return table


def markdown(table: dict[str, Any]) -> str:
    """The README tables of a ``reeval.json``: scaling (rollout error + probe), PSNR vs horizon, planning."""

    def f(v, nd=2):
        return "–" if v is None else f"{v:.{nd}f}"

    out = ["| method | pretrain emb. | PSNR@1 | PSNR@8 | PSNR 1-8 | shuffled | copy-last | SSIM 1-8 | feat. dist "
           "(shuf. / copy) | probe R2 trans. | (all 6) | shuffled R2 | adapted IDM R2 trans. |", "|" + "---|" * 13]
    for r in sorted(table["rows"], key=lambda r: (ARMS.index(r["method"]), r["pretrain_embodiments"])):
        fd = (f"{f(r['feat_dist_mean'], 3)} ({f(r['shuffled_feat_dist_mean'], 3)} / {f(r['copy_last_feat_dist_mean'], 3)})"
              if "feat_dist_mean" in r else "–")
        out.append(f"| {r['method']} | {r['pretrain_embodiments']} | {f(r['psnr@1'])} | {f(r['psnr@8'])} | "
                   f"{f(r['psnr_mean'])} | {f(r['shuffled_psnr_mean'])} | {f(r['copy_last_psnr_mean'])} | "
                   f"{f(r['ssim_mean'], 3)} | {fd} | {f(r.get('probe_r2_translation'))} | {f(r.get('probe_r2'))} | "
                   f"{f(r.get('probe_r2_shuffled'))} | {f(r.get('probe_adapted_r2_translation'))} |")
    full = table.get("full", {})
    h = max((len(ev["rollout"]["model"]["psnr"]) for ev in full.values()), default=0)
    if h:
        top = max((r["pretrain_embodiments"] for r in table["rows"]), default=0)
        out += ["", "| run / arm (PSNR at horizon) | " + " | ".join(str(i + 1) for i in range(h)) + " |",
                "|---|" + "---|" * h]
        for run, ev in full.items():
            for arm in ("model", "shuffled", "copy_last"):
                if not (run.endswith(f"_n{top}") or run == "scratch" and arm == "model"):
                    continue
                out.append(f"| {run} {arm} | " + " | ".join(f(v) for v in ev["rollout"][arm]["psnr"]) + " |")
    plans = {run: ev["planning"] for run, ev in full.items() if "planning" in ev}
    if plans:
        out += ["", "| model | episodes | success (model selection) | success (random selection) | return (model) | "
                "return (random) |", "|" + "---|" * 6]
        for run, p in plans.items():
            out.append(f"| {run} | {p['episodes']} | {f(p['model']['success_rate'])} | {f(p['random']['success_rate'])} "
                       f"| {f(p['model']['mean_return'])} | {f(p['random']['mean_return'])} |")
    return "\n".join(out)


def seed_markdown(tables: list[dict[str, Any]]) -> str:
    """Scaling table over several seeds' ``reeval.json`` (one per seed): per-seed PSNR 1-8 and probe, and means."""
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for t in tables:
        for r in t["rows"]:
            rows.setdefault((r["method"], r["pretrain_embodiments"]), []).append(r)

    def mean(rs, k):
        return float(np.mean([r[k] for r in rs]))

    out = ["| method | pretrain emb. | PSNR 1-8 per seed | mean | shuffled (mean) | copy-last | PSNR@1 (mean) | "
           "PSNR@8 (mean) | SSIM (mean) | probe R2 trans. per seed | shuffled R2 (mean) |", "|" + "---|" * 11]
    for key in sorted(rows, key=lambda k: (ARMS.index(k[0]), k[1])):
        rs = rows[key]
        probe = " / ".join(f"{r['probe_r2_translation']:.2f}" for r in rs) if rs[0].get("probe_r2_translation") \
            is not None else "–"
        shuf = f"{mean(rs, 'probe_r2_shuffled'):.2f}" if "probe_r2_shuffled" in rs[0] else "–"
        out.append(f"| {key[0]} | {key[1]} | " + " / ".join(f"{r['psnr_mean']:.2f}" for r in rs)
                   + f" | **{mean(rs, 'psnr_mean'):.2f}** | {mean(rs, 'shuffled_psnr_mean'):.2f} | "
                   f"{mean(rs, 'copy_last_psnr_mean'):.2f} | {mean(rs, 'psnr@1'):.2f} | {mean(rs, 'psnr@8'):.2f} | "
                   f"{mean(rs, 'ssim_mean'):.3f} | {probe} | {shuf} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m worldmodels.lacwm.experiments scaling|reeval --counts 1 2 3 --out DIR [--plan] [--arms A,B]
    [overrides]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["scaling", "reeval", "table"])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", default="outputs/lacwm/scaling")
    parser.add_argument("--plan", action="store_true", help="reeval: also run planning for the largest count")
    parser.add_argument("--seeds", nargs="+", default=None,
                        help="table: sweep folders of other seeds (the same sweep, other trainer.seed) to average with --out")
    parser.add_argument("--arms", default=",".join(ARMS), help="scaling: comma-separated arms to run (of "
                        f"{','.join(ARMS)})")
    parser.add_argument("--workers", type=int, default=1, help="scaling: runs at a time (one process, one thread each)")
    parser.add_argument("overrides", nargs="*")
    args, extra = parser.parse_known_args(argv)
    overrides = [*args.overrides, *extra]
    if args.what == "table":  # markdown of a finished reeval.json
        from core.io import read_json

        table = read_json(Path(args.out) / "reeval.json")
        print(markdown(table))
        if args.seeds:
            print("\n" + seed_markdown([table, *(read_json(Path(d) / "reeval.json") for d in args.seeds)]))
        return 0
    if args.what == "reeval":
        table = reevaluate(overrides, args.counts, args.out, plan=args.plan)
    else:
        arms = tuple(a for a in args.arms.split(",") if a)
        bad = [a for a in arms if a not in ARMS]
        if bad or not arms:
            parser.error(f"--arms: unknown {bad}; choose from {','.join(ARMS)}")
        table = scaling(overrides, args.counts, args.out, arms=arms, workers=args.workers)
    print(json.dumps(table["rows"], indent=1))
    return 1 if table.get("failed") else 0


if __name__ == "__main__":
    from core.bootstrap import prepare_process

    prepare_process()
    raise SystemExit(main())
