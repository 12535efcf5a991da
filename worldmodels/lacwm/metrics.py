"""LAC-WM / EAC-WM's evaluation metrics: imagined-rollout error vs horizon and the linear probe of IDM latents.

``rollout_error`` scores a world model's imagined rollouts (PSNR / SSIM through ``core.metrics.image``, a
learned feature distance with a LAC-WM judge) against shuffled actions and the copy-last-frame baseline;
``linear_probe`` fits a cross-validated ridge regression from frozen IDM latents to the true end-effector motion.
``worldmodels.lacwm.task.evaluate`` writes both to ``eval.json``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from core.errors import DataError


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
