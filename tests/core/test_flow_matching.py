"""core.diffusion.flow_matching: rectified-flow conventions (x_t = (1 - t) x0 + t noise, v = noise - x0), per-frame
timesteps, the timestep shift, the Euler ODE step, and the marginal-preserving SDE step with its log-probability,
checked against closed forms (straight paths, a 1-D Gaussian whose marginal velocity is known exactly) and
torch.distributions.Normal."""

from __future__ import annotations

import math

import pytest
import torch

from core.diffusion import (
    FlowMatchScheduler,
    SDEStep,
    add_noise,
    euler_step,
    expand_like,
    predict_noise,
    predict_x0,
    sample_timesteps,
    sde_step,
    shift_timesteps,
    timestep_grid,
    velocity_target,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype)


# ------------------------------------------------------------------------------------------------ forward process
def test_add_noise_endpoints_and_per_frame_mixing():
    x0, noise = _randn(2, 3, 4, 5, seed=1), _randn(2, 3, 4, 5, seed=2)
    assert torch.equal(add_noise(x0, noise, torch.zeros(2)), x0)
    assert torch.equal(add_noise(x0, noise, torch.ones(2)), noise)
    assert torch.equal(add_noise(x0, noise, 0.0), x0)

    # Video (B, F, C, H, W) with one t per frame: each frame is mixed with its own t and no other.
    B, F = 2, 4
    x0, noise = _randn(B, F, 3, 2, 2, seed=3), _randn(B, F, 3, 2, 2, seed=4)
    t = torch.tensor([[0.0, 0.25, 0.5, 1.0], [0.9, 0.1, 1.0, 0.0]])
    xt = add_noise(x0, noise, t)
    assert xt.shape == x0.shape
    for b in range(B):
        for f in range(F):
            tf = t[b, f].item()
            expected = (1 - tf) * x0[b, f] + tf * noise[b, f]
            torch.testing.assert_close(xt[b, f], expected, rtol=0, atol=1e-6)
    assert torch.equal(xt[0, 0], x0[0, 0]) and torch.equal(xt[0, 3], noise[0, 3])

    # Per-sample t of shape (B,) broadcasts over frames.
    xs = add_noise(x0, noise, torch.tensor([0.3, 0.7]))
    torch.testing.assert_close(xs[1], 0.3 * x0[1] + 0.7 * noise[1], rtol=0, atol=1e-6)


def test_velocity_target_and_inverses_per_frame():
    x0, noise = _randn(2, 3, 8, seed=5, dtype=torch.float64), _randn(2, 3, 8, seed=6, dtype=torch.float64)
    t = torch.tensor([[0.0, 0.4, 1.0], [0.2, 0.6, 0.95]], dtype=torch.float64)
    v = velocity_target(x0, noise)
    assert torch.equal(v, noise - x0)
    xt = add_noise(x0, noise, t)
    torch.testing.assert_close(predict_x0(xt, v, t), x0, rtol=0, atol=1e-12)
    torch.testing.assert_close(predict_noise(xt, v, t), noise, rtol=0, atol=1e-12)


def test_expand_like_shapes():
    x = torch.zeros(2, 3, 4, 5)
    assert expand_like(torch.ones(2), x).shape == (2, 1, 1, 1)
    assert expand_like(torch.ones(2, 3), x).shape == (2, 3, 1, 1)
    assert expand_like(torch.tensor(0.5), x).shape == (1, 1, 1, 1)
    assert expand_like(0.5, x).shape == (1, 1, 1, 1)
    t = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(expand_like(t, x)[1, 2, 0, 0], t[1, 2])


def test_low_precision_inputs_keep_their_dtype():
    x0, noise = _randn(2, 4, seed=7).bfloat16(), _randn(2, 4, seed=8).bfloat16()
    t = torch.tensor([0.3, 0.8])
    assert add_noise(x0, noise, t).dtype == torch.bfloat16
    v = velocity_target(x0, noise)
    assert euler_step(x0, v, t, t * 0.5).dtype == torch.bfloat16
    out = sde_step(x0, v, t, t * 0.5, generator=_gen(1))
    assert out.prev_sample.dtype == torch.bfloat16 and out.log_prob.dtype == torch.float32
    # eta = 0 is exactly Euler in bf16 too (both compute in float32 and round once).
    assert torch.equal(sde_step(x0, v, t, t * 0.5, eta=0.0).prev_sample, euler_step(x0, v, t, t * 0.5))


# ------------------------------------------------------------------------------------------------ Euler
@pytest.mark.parametrize("steps,shift", [(1, 1.0), (7, 1.0), (25, 3.0), (10, 0.4)])
def test_euler_with_straight_path_velocity_recovers_x0(steps, shift):
    x0, noise = _randn(3, 2, 6, seed=10), _randn(3, 2, 6, seed=11)
    v = noise - x0  # the exact velocity of the straight path through (x0, noise)
    grid = timestep_grid(steps, shift)
    x = noise.clone()
    for i in range(steps):
        x = euler_step(x, v, grid[i], grid[i + 1])
    torch.testing.assert_close(x, x0, rtol=0, atol=1e-5)


def test_euler_per_frame_schedule_holds_frames_with_equal_t():
    B, F, K = 2, 5, 6
    x0, noise = _randn(B, F, 3, 4, seed=12), _randn(B, F, 3, 4, seed=13)
    v = noise - x0
    # Each frame descends 1 -> 0 on its own non-uniform staircase with held steps (t == t_next), e.g. a
    # diffusion-forcing pyramid where later frames wait at t = 1 and earlier ones are done at t = 0.
    sched = torch.empty(K + 1, B, F)
    base = torch.tensor([1.0, 0.8, 0.8, 0.3, 0.1, 0.0, 0.0])
    for b in range(B):
        for f in range(F):
            lag = (f + b) % 3
            sched[:, b, f] = torch.cat([torch.ones(lag), base[: K + 1 - lag - 1], torch.zeros(1)])
    assert (sched[0] == 1).all() and (sched[-1] == 0).all() and (sched[1:] <= sched[:-1]).all()
    held_seen = 0
    x = noise.clone()
    for k in range(K):
        t, t_next = sched[k], sched[k + 1]
        x_new = euler_step(x, v, t, t_next)
        held = t == t_next
        held_seen += int(held.sum())
        for b, f in held.nonzero().tolist():
            assert torch.equal(x_new[b, f], x[b, f])  # bit-identical
        assert not torch.equal(x_new[~held], x[~held])
        x = x_new
    assert held_seen > 10
    torch.testing.assert_close(x, x0, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------ shift / grid
def test_shift_timesteps_endpoints_monotone_identity_and_known_value():
    t = torch.linspace(0, 1, 1001)
    for shift in (0.3, 1.0, 3.0, 7.5):
        s = shift_timesteps(t, shift)
        assert s[0].item() == 0.0 and s[-1].item() == 1.0
        assert (s[1:] > s[:-1]).all()  # strictly monotone
        expected = shift * t.double() / (1 + (shift - 1) * t.double())
        torch.testing.assert_close(s.double(), expected, rtol=0, atol=1e-6)
    assert torch.equal(shift_timesteps(t, 1.0), t)
    assert shift_timesteps(torch.tensor(0.5), 3.0).item() == pytest.approx(0.75)
    assert (shift_timesteps(t[1:-1], 3.0) > t[1:-1]).all() and (shift_timesteps(t[1:-1], 0.5) < t[1:-1]).all()


@pytest.mark.parametrize("steps,shift", [(1, 1.0), (10, 1.0), (28, 3.0), (50, 5.0), (4, 0.5)])
def test_timestep_grid_descends_from_one_to_zero(steps, shift):
    grid = timestep_grid(steps, shift)
    assert grid.shape == (steps + 1,) and grid.dtype == torch.float32
    assert grid[0].item() == 1.0 and grid[-1].item() == 0.0
    assert (grid[1:] < grid[:-1]).all()
    torch.testing.assert_close(
        grid, shift_timesteps(torch.linspace(1, 0, steps + 1), shift), rtol=0, atol=1e-6
    )
    if steps == 10:
        torch.testing.assert_close(grid, torch.linspace(1, 0, 11), rtol=0, atol=1e-7)
    assert timestep_grid(steps, shift, dtype=torch.float64).dtype == torch.float64


# ------------------------------------------------------------------------------------------------ SDE step
def _per_frame_case(seed=20, dtype=torch.float64):
    B, F = 3, 4
    x = _randn(B, F, 2, 3, seed=seed, dtype=dtype)
    v = _randn(B, F, 2, 3, seed=seed + 1, dtype=dtype)
    t = torch.tensor([[1.0, 0.9, 0.5, 0.2], [0.7, 0.7, 0.3, 0.05], [1.0, 0.6, 0.4, 0.1]], dtype=dtype)
    t_next = t * torch.tensor([0.9, 0.8, 0.5, 0.0], dtype=dtype)
    return x, v, t, t_next


def test_sde_with_eta_zero_is_exactly_euler():
    x, v, t, t_next = _per_frame_case(dtype=torch.float32)
    out = sde_step(x, v, t, t_next, eta=0.0, generator=_gen(3))
    assert torch.equal(out.prev_sample, euler_step(x, v, t, t_next))
    assert (out.std == 0).all() and (out.log_prob == 0).all()
    grid = timestep_grid(5, 3.0)
    assert torch.equal(
        sde_step(x, v, grid[0], grid[1], eta=0.0).prev_sample, euler_step(x, v, grid[0], grid[1])
    )


@pytest.mark.parametrize("eta", [0.3, 0.7, 1.0])
def test_sde_mean_std_and_log_prob_match_normal(eta):
    x, v, t, t_next = _per_frame_case()
    out = sde_step(x, v, t, t_next, eta=eta, generator=_gen(4), reduce_dims=2)
    assert isinstance(out, SDEStep)
    assert out.prev_sample.shape == x.shape and out.log_prob.shape == (3, 4)

    # Closed form (independent re-derivation): sigma at min(t, 1 + dt), score = -(x + (1 - t) v) / t.
    te, tne = t[..., None, None], t_next[..., None, None]
    dt = tne - te
    ts = torch.minimum(te, 1 + dt)
    sigma = eta * torch.sqrt(ts / (1 - ts))
    score = -(x + (1 - te) * v) / te
    mean = x + (v - 0.5 * sigma**2 * score) * dt
    std = sigma * torch.sqrt(-dt)
    torch.testing.assert_close(out.mean, mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.std.expand_as(x), std.expand_as(x), rtol=1e-12, atol=1e-12)
    # t = 1 uses the next level (Flow-GRPO): sigma^2 |dt| = eta^2 t_next there.
    assert out.std[0, 0].item() ** 2 == pytest.approx(eta**2 * 0.9, rel=1e-9)

    normal = torch.distributions.Normal(out.mean, out.std.expand_as(x))
    ref = normal.log_prob(out.prev_sample)
    torch.testing.assert_close(out.log_prob, ref.sum(dim=(2, 3)), rtol=1e-10, atol=1e-10)
    per_sample = sde_step(x, v, t, t_next, eta=eta, generator=_gen(4))
    assert per_sample.log_prob.shape == (3,)
    assert torch.equal(per_sample.prev_sample, out.prev_sample)
    torch.testing.assert_close(per_sample.log_prob, ref.sum(dim=(1, 2, 3)), rtol=1e-10, atol=1e-10)

    # The sample really is mean + std * z for the z the generator draws.
    z = torch.randn(x.shape, generator=_gen(4), dtype=x.dtype)
    torch.testing.assert_close(out.prev_sample, mean + std * z, rtol=1e-12, atol=1e-12)
    given = sde_step(x, v, t, t_next, eta=eta, noise=z)
    assert torch.equal(given.prev_sample, out.prev_sample)


def test_sde_prev_sample_replays_log_prob_and_depends_on_velocity():
    x, v, t, t_next = _per_frame_case(dtype=torch.float32)
    drawn = sde_step(x, v, t, t_next, eta=0.7, generator=_gen(5))
    replay = sde_step(x, v, t, t_next, eta=0.7, prev_sample=drawn.prev_sample)
    assert torch.equal(replay.prev_sample, drawn.prev_sample)
    torch.testing.assert_close(replay.log_prob, drawn.log_prob, rtol=0, atol=0)

    # GRPO: the old sample scored under new velocities gives a different, differentiable log-prob.
    v_new = (v + 0.1).requires_grad_(True)
    new = sde_step(x, v_new, t, t_next, eta=0.7, prev_sample=drawn.prev_sample)
    assert not torch.allclose(new.log_prob, drawn.log_prob)
    new.log_prob.sum().backward()
    assert torch.isfinite(v_new.grad).all() and v_new.grad.abs().sum() > 0


def test_sde_held_frames_contribute_zero_and_stay_unchanged():
    B, F = 2, 4
    x = _randn(B, F, 3, 2, seed=30)
    v = _randn(B, F, 3, 2, seed=31).requires_grad_(True)
    # Held frames at t = 1 (not yet scheduled), t = 0 (already clean) and mid-way; the rest move.
    t = torch.tensor([[1.0, 0.6, 0.0, 0.4], [1.0, 1.0, 0.5, 0.0]])
    t_next = torch.tensor([[1.0, 0.5, 0.0, 0.4], [0.95, 1.0, 0.3, 0.0]])
    held = t == t_next
    out = sde_step(x, v, t, t_next, eta=0.9, generator=_gen(6), reduce_dims=2)
    for tensor in (out.prev_sample, out.log_prob, out.mean, out.std):
        assert torch.isfinite(tensor).all()
    assert (out.log_prob[held] == 0).all() and (out.log_prob[~held] != 0).all()
    assert torch.equal(out.prev_sample[held], x[held]) and torch.equal(out.mean[held], x[held])
    assert (out.std.expand_as(x)[held] == 0).all()
    assert not torch.equal(out.prev_sample[~held], x[~held])

    moving = torch.distributions.Normal(out.mean[~held], out.std.expand_as(x)[~held])
    ref = moving.log_prob(out.prev_sample[~held]).sum(dim=(1, 2))
    torch.testing.assert_close(out.log_prob[~held], ref.detach(), rtol=1e-5, atol=1e-4)
    per_sample = sde_step(x, v, t, t_next, eta=0.9, prev_sample=out.prev_sample.detach())
    torch.testing.assert_close(per_sample.log_prob, out.log_prob.sum(dim=1), rtol=1e-5, atol=1e-4)
    per_sample.log_prob.sum().backward()
    assert torch.isfinite(v.grad).all()
    assert (v.grad[held] == 0).all() and (v.grad[~held] != 0).any()


# ------------------------------------------------------------------------------------------------ marginals
_M, _S = 2.0, 0.5


def _gaussian_marginal_velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """E[noise - x0 | x_t] for x0 ~ N(m, s^2): x_t ~ N((1 - t) m, (1 - t)^2 s^2 + t^2), Cov(v, x_t) = t - (1 - t) s^2."""
    var = (1 - t) ** 2 * _S**2 + t**2
    return -_M + (t - (1 - t) * _S**2) / var * (x - (1 - t) * _M)


def _integrate(mode: str, steps: int = 200, eta: float = 0.7, shift: float = 1.0, n: int = 20000):
    g = _gen(123)
    x = torch.randn(n, 1, generator=g, dtype=torch.float64)
    x = (x - x.mean()) / x.std()  # remove the start's sampling error: the ODE then is nearly deterministic
    sched = FlowMatchScheduler(steps, shift)
    for i in range(steps):
        v = _gaussian_marginal_velocity(x, sched.timesteps[i].double())
        x = (
            sched.step(x, v, i)
            if mode == "ode"
            else sched.step(x, v, i, mode="sde", eta=eta, generator=g).prev_sample
        )
    return x.mean().item(), x.std().item()


@pytest.mark.parametrize("mode,eta,shift", [("ode", 0.0, 1.0), ("sde", 0.7, 1.0), ("sde", 1.0, 3.0)])
def test_ode_and_sde_reach_the_data_distribution(mode, eta, shift):
    mean, std = _integrate(mode, eta=eta, shift=shift)
    # Monte-Carlo error at n = 20000: ~0.004 on the mean, ~0.003 on the std.
    assert mean == pytest.approx(_M, abs=0.02)
    assert std == pytest.approx(_S, abs=0.02)


def test_sde_marginal_test_would_catch_a_wrong_drift():
    # The same integration with the score correction's sign flipped (or left out) must miss the target, so
    # the tolerances above have teeth. Flipping: x + (v - c eps_hat) dt = 2 * euler - (SDE mean) + noise.
    g = _gen(123)
    x = torch.randn(20000, 1, generator=g, dtype=torch.float64)
    grid = timestep_grid(200)
    for i in range(200):
        t, t_next = grid[i].double(), grid[i + 1].double()
        v = _gaussian_marginal_velocity(x, t)
        out = sde_step(x, v, t, t_next, eta=0.7, generator=g)
        flipped_mean = 2 * euler_step(x, v, t, t_next) - out.mean
        x = out.prev_sample - out.mean + flipped_mean
    assert abs(x.std().item() - _S) > 0.1 or abs(x.mean().item() - _M) > 0.1


# ------------------------------------------------------------------------------------------------ training t
def test_sample_timesteps_shapes_ranges_and_shift():
    for dist in ("logit_normal", "uniform"):
        for shape in ((4096,), (512, 8)):
            t = sample_timesteps(shape, dist, generator=_gen(7))
            assert t.shape == shape and t.dtype == torch.float32
            assert (t > 0).all() and (t < 1).all()
        base = sample_timesteps((20000,), dist, generator=_gen(8))
        shifted = sample_timesteps((20000,), dist, shift=3.0, generator=_gen(8))
        assert base.median().item() == pytest.approx(0.5, abs=0.02)
        assert shifted.median().item() == pytest.approx(0.75, abs=0.02)  # shift_timesteps(0.5, 3)
        assert (shifted >= base).all()
    lo = sample_timesteps((20000,), "logit_normal", mean=1.0, generator=_gen(9))
    assert lo.median().item() == pytest.approx(1 / (1 + math.exp(-1)), abs=0.02)
    u = sample_timesteps((20000,), "uniform", generator=_gen(9))
    assert u.mean().item() == pytest.approx(0.5, abs=0.01) and u.std().item() == pytest.approx(
        12**-0.5, abs=0.01
    )
    # Extreme logits are clamped into the open interval; generator makes draws reproducible.
    wide = sample_timesteps((10000,), std=100.0, generator=_gen(10))
    assert (wide > 0).all() and (wide < 1).all()
    assert torch.equal(sample_timesteps(5, generator=_gen(11)), sample_timesteps(5, generator=_gen(11)))


# ------------------------------------------------------------------------------------------------ scheduler
def test_scheduler_matches_functions_and_resets():
    sched = FlowMatchScheduler(8, shift=2.0)
    assert len(sched) == 8 and torch.equal(sched.timesteps, timestep_grid(8, 2.0))
    x, v = _randn(2, 3, 4, seed=40), _randn(2, 3, 4, seed=41)
    g = sched.timesteps
    assert torch.equal(sched.step(x, v, 3), euler_step(x, v, g[3], g[4]))
    out = sched.step(x, v, 0, mode="sde", eta=0.5, generator=_gen(2))
    ref = sde_step(x, v, g[0], g[1], eta=0.5, generator=_gen(2))
    assert torch.equal(out.prev_sample, ref.prev_sample) and torch.equal(out.log_prob, ref.log_prob)
    replay = sched.step(x, v, 0, mode="sde", eta=0.5, prev_sample=out.prev_sample)
    assert torch.equal(replay.log_prob, out.log_prob)
    sched.set_steps(3)
    assert (
        len(sched) == 3
        and sched.timesteps.shape == (4,)
        and torch.equal(sched.timesteps, timestep_grid(3, 2.0))
    )


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_input_raises_value_error():
    x = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="steps"):
        timestep_grid(0)
    with pytest.raises(ValueError, match="steps"):
        FlowMatchScheduler(0)
    with pytest.raises(ValueError, match="steps"):
        FlowMatchScheduler(4).set_steps(-1)
    for shift in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="shift"):
            shift_timesteps(torch.tensor([0.5]), shift)
        with pytest.raises(ValueError, match="shift"):
            timestep_grid(4, shift)
        with pytest.raises(ValueError, match="shift"):
            sample_timesteps(3, shift=shift)
    for bad_t in (torch.zeros(3), torch.zeros(2, 4), torch.zeros(2, 3, 4, 1), torch.zeros(1)):
        with pytest.raises(ValueError, match="prefix"):
            expand_like(bad_t, x)
        with pytest.raises(ValueError, match="prefix"):
            add_noise(x, x, bad_t)
        with pytest.raises(ValueError, match="prefix"):
            euler_step(x, x, bad_t, torch.zeros(2))
        with pytest.raises(ValueError, match="prefix"):
            sde_step(x, x, torch.ones(2), bad_t)
    with pytest.raises(ValueError, match="same shape"):
        add_noise(x, torch.zeros(2, 3, 5), torch.zeros(2))
    with pytest.raises(ValueError, match="same shape"):
        euler_step(x, torch.zeros(2, 3), torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        add_noise(x, x, torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        shift_timesteps(torch.tensor([-0.1]), 2.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sde_step(x, x, torch.tensor([0.5, float("nan")]), torch.zeros(2))
    with pytest.raises(ValueError, match="t_next must be <= t"):
        sde_step(x, x, torch.tensor([0.5, 0.5]), torch.tensor([0.4, 0.6]))
    with pytest.raises(ValueError, match="eta"):
        sde_step(x, x, torch.ones(2), torch.zeros(2), eta=-0.1)
    with pytest.raises(ValueError, match="reduce_dims"):
        sde_step(x, x, torch.ones(2), torch.zeros(2), reduce_dims=4)
    with pytest.raises(ValueError, match="at most one"):
        sde_step(x, x, torch.ones(2), torch.zeros(2), noise=x, prev_sample=x)
    with pytest.raises(ValueError, match="distribution"):
        sample_timesteps(3, "cosine")
    with pytest.raises(ValueError, match="std"):
        sample_timesteps(3, std=-1.0)
    sched = FlowMatchScheduler(4)
    for i in (-1, 4):
        with pytest.raises(ValueError, match="step index"):
            sched.step(x, x, i)
    with pytest.raises(ValueError, match="mode"):
        sched.step(x, x, 0, mode="ddim")
