"""AutoMoT's flow-matching waypoint refiner: pass-through, learning a known correction, determinism, shapes."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from driving.automot.refiner import RefinerConfig, WaypointRefiner

COND = 16
N_WP = 6


def _task(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic plans: (features, coarse, target), all known functions of a random condition.

    target: an arc driven at speed 10 + 3 tanh(c0) m/s with curvature 0.03 tanh(c1) 1/m, points at 0.5 s.
    coarse: target + a systematic, condition-dependent error (longitudinal 0.25 m/s * (c2 + sin c3) per
    second of horizon, lateral 0.6 m * tanh(c4) * time / 3 s) + 0.05 m i.i.d. noise.
    """
    c = torch.randn(n, COND, generator=generator)
    time = 0.5 * torch.arange(1, N_WP + 1, dtype=torch.float32)  # (N_WP,) [s]
    speed = 10.0 + 3.0 * torch.tanh(c[:, :1])  # (n, 1)
    kappa = 0.03 * torch.tanh(c[:, 1:2])
    s = speed * time  # (n, N_WP) arc length
    theta = kappa * s
    k_safe = torch.where(kappa.abs() > 1e-6, kappa, torch.full_like(kappa, 1e-6))
    x, y = torch.sin(theta) / k_safe, (1.0 - torch.cos(theta)) / k_safe
    target = torch.stack([x, y], -1)
    err_long = 0.25 * (c[:, 2:3] + torch.sin(c[:, 3:4])) * time
    err_lat = 0.6 * torch.tanh(c[:, 4:5]) * time / 3.0
    coarse = target + torch.stack([err_long, err_lat], -1) + 0.05 * torch.randn(n, N_WP, 2, generator=generator)
    return c, coarse, target


def _ade(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm(dim=-1).mean())


def _tiny(**kw) -> WaypointRefiner:
    torch.manual_seed(0)
    return WaypointRefiner(RefinerConfig(cond_dim=COND, n_wp=N_WP, hidden=32, layers=2, **kw))


def test_disabled_returns_coarse_bit_exact():
    g = torch.Generator().manual_seed(0)
    feats, coarse, _ = _task(8, g)
    model = _tiny()
    assert torch.equal(model.refine(feats, coarse, steps=0), coarse)
    disabled = _tiny(steps=0)
    out = disabled.refine(feats, coarse)
    assert torch.equal(out, coarse) and out is not coarse
    # An untrained model (zero-initialised read-out: v = 0) with t_start < 1 still moves the plan by noise.
    assert not torch.equal(_tiny(t_start=0.5).refine(feats, coarse, generator=g), coarse)


def test_learns_the_systematic_error_and_loss_decreases():
    torch.set_num_threads(1)
    model = _tiny(steps=8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    losses = []
    model.train()
    for _ in range(600):
        feats, coarse, target = _task(256, g)
        loss = model.loss(feats, coarse, target, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:50]) / 50, sum(losses[-50:]) / 50
    assert last < 0.7 * first, (first, last)

    model.eval()
    feats, coarse, target = _task(1024, torch.Generator().manual_seed(123))
    refined = model.refine(feats, coarse, generator=torch.Generator().manual_seed(7))
    ade_coarse, ade_refined = _ade(coarse, target), _ade(refined, target)
    print(f"ADE coarse {ade_coarse:.3f} m -> refined {ade_refined:.3f} m (loss {first:.3f} -> {last:.3f})")
    assert ade_refined < 0.5 * ade_coarse, (ade_coarse, ade_refined)


def test_same_generator_same_output():
    model = _tiny()
    # Give the read-out non-zero weights so that the velocity depends on the noise.
    torch.nn.init.normal_(model.out.weight, std=0.1)
    torch.nn.init.normal_(model.out_ada[1].weight, std=0.1)
    feats, coarse, target = _task(4, torch.Generator().manual_seed(0))
    a = model.refine(feats, coarse, generator=torch.Generator().manual_seed(3))
    b = model.refine(feats, coarse, generator=torch.Generator().manual_seed(3))
    c = model.refine(feats, coarse, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    noise = torch.randn(4, N_WP, 2, generator=torch.Generator().manual_seed(9))
    assert torch.equal(model.refine(feats, coarse, noise=noise), model.refine(feats, coarse, noise=noise))
    la = model.loss(feats, coarse, target, generator=torch.Generator().manual_seed(5))
    lb = model.loss(feats, coarse, target, generator=torch.Generator().manual_seed(5))
    lc = model.loss(feats, coarse, target, generator=torch.Generator().manual_seed(6))
    assert torch.equal(la, lb) and not torch.equal(la, lc)


@pytest.mark.parametrize(
    ("feats_shape", "coarse_shape", "target_shape", "name"),
    [
        ((4, COND + 1), (4, N_WP, 2), (4, N_WP, 2), "features"),
        ((3, COND), (4, N_WP, 2), (4, N_WP, 2), "features"),
        ((4, COND), (4, N_WP + 1, 2), (4, N_WP + 1, 2), "coarse"),
        ((4, COND), (4, N_WP * 2), (4, N_WP * 2), "coarse"),
        ((4, COND), (4, N_WP, 2), (4, N_WP, 3), "target"),
    ],
)
def test_bad_shapes_name_the_argument(feats_shape, coarse_shape, target_shape, name):
    model = _tiny()
    f, c, t = torch.zeros(feats_shape), torch.zeros(coarse_shape), torch.zeros(target_shape)
    with pytest.raises(ValueError, match=name):
        model.loss(f, c, t)
    if name != "target":
        with pytest.raises(ValueError, match=name):
            model.refine(f, c)


def test_refine_rejects_bad_noise_and_steps():
    model = _tiny()
    f, c = torch.zeros(2, COND), torch.zeros(2, N_WP, 2)
    with pytest.raises(ValueError, match="noise"):
        model.refine(f, c, noise=torch.zeros(2, N_WP, 3))
    with pytest.raises(ValueError, match="steps"):
        model.refine(f, c, steps=-1)


def test_config_validation():
    with pytest.raises(ConfigError, match="stpes"):
        RefinerConfig.from_dict({"cond_dim": 8, "stpes": 2})
    for bad in ({"t_start": 0.0}, {"t_start": 1.5}, {"hidden": 31}, {"cond_dropout": 1.0}, {"scale": 0.0},
                {"t_distribution": "beta"}, {"steps": -1}):
        with pytest.raises(ConfigError):
            RefinerConfig(cond_dim=8, **bad)
    cfg = RefinerConfig.from_dict({"cond_dim": 8, "steps": 2})
    assert RefinerConfig.from_dict(cfg.to_dict()) == cfg
    assert isinstance(WaypointRefiner(cfg.to_dict()).config, RefinerConfig)


def test_cond_dropout_and_absolute_mode_train():
    model = _tiny(cond_dropout=0.5, residual=False, scale=10.0)
    feats, coarse, target = _task(16, torch.Generator().manual_seed(0))
    loss = model.loss(feats, coarse, target, generator=torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss)
    out = model.refine(feats, coarse, steps=2, generator=torch.Generator().manual_seed(0))
    assert out.shape == coarse.shape and torch.isfinite(out).all()
