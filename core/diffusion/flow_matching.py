"""Rectified-flow (flow-matching) noise schedules, training targets and ODE / SDE samplers.

Conventions (shared by every method in the workspace):

* Interpolation: ``x_t = (1 - t) * x0 + t * noise`` with ``t`` in ``[0, 1]``; ``t = 1`` is pure Gaussian noise,
  ``t = 0`` is data. Sampling therefore runs ``t`` *downwards*, from 1 to 0, and every step has
  ``dt = t_next - t <= 0``.
* The network predicts the velocity ``v = noise - x0 = dx_t / dt``. Given ``x_t`` and ``v`` the clean sample is
  ``x0 = x_t - t * v`` and the noise is ``noise = x_t + (1 - t) * v``.
* Timesteps are tensors broadcast against ``x`` by appending trailing singleton dims (:func:`expand_like`):
  ``t`` of shape ``()`` is shared by everything, ``(B,)`` is per sample and ``(B, F)`` is per frame of a video
  ``x`` of shape ``(B, F, ...)``. ``t``'s shape must be a prefix of ``x``'s shape. Python floats are accepted
  wherever a timestep is, and mean a shared ``t``.
* A frame whose ``t == t_next`` is held: every step leaves it bit-identical (that is how frames that are
  already clean, or not yet scheduled, are frozen in per-frame schedules).
* Arithmetic runs in at least float32 (float64 stays float64); samples come back in the dtype of ``x``.
* Bad input raises ``ValueError`` with a one-line message. Range checks on tensor timesteps read the values
  (one device sync per call).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, overload

import torch
from torch import Tensor

__all__ = [
    "FlowMatchScheduler",
    "SDEStep",
    "add_noise",
    "euler_step",
    "expand_like",
    "predict_noise",
    "predict_x0",
    "sample_timesteps",
    "sde_step",
    "shift_timesteps",
    "timestep_grid",
    "velocity_target",
]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


# ------------------------------------------------------------------------------------------------ helpers
def _compute_dtype(x: Tensor) -> torch.dtype:
    """At least float32: float16 / bfloat16 are promoted, float64 is kept."""
    return torch.promote_types(x.dtype, torch.float32) if x.is_floating_point() else torch.float32


def _check_shift(shift: float) -> None:
    if not (isinstance(shift, (int, float)) and math.isfinite(shift) and shift > 0):
        raise ValueError(f"shift must be a finite number > 0, got {shift!r}")


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")


def _check_unit_interval(t: Tensor, name: str) -> None:
    # Written as a negation so that NaN is rejected too.
    if t.numel() and not bool(((t >= 0) & (t <= 1)).all()):
        raise ValueError(
            f"{name} must lie in [0, 1], got values in [{t.min().item():.6g}, {t.max().item():.6g}]"
        )


def _check_same_shape(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def expand_like(t: Tensor | float, x: Tensor) -> Tensor:
    """Append trailing singleton dims to ``t`` so that it broadcasts against ``x``.

    Args:
        t: Timesteps of shape ``()``, ``(B,)``, ``(B, F)``, ...: any prefix of ``x.shape``. A float is a 0-d tensor.
        x: The tensor ``t`` applies to, e.g. ``(B, C, H, W)`` or a video ``(B, F, C, H, W)``.

    Returns:
        ``t`` viewed as ``t.shape + (1,) * (x.ndim - t.ndim)``, on ``x``'s device (dtype unchanged).

    Raises:
        ValueError: If ``t.shape`` is not a prefix of ``x.shape``.
    """
    t = torch.as_tensor(t, device=x.device)
    if t.ndim > x.ndim or tuple(t.shape) != tuple(x.shape[: t.ndim]):
        raise ValueError(
            f"timestep shape {tuple(t.shape)} must be a prefix of the data shape {tuple(x.shape)} "
            "(e.g. (B,) per sample or (B, F) per frame)"
        )
    return t.reshape(*t.shape, *([1] * (x.ndim - t.ndim)))


def _timestep(
    t: Tensor | float, x: Tensor, name: str, dtype: torch.dtype, check_range: bool = True
) -> Tensor:
    """Validate ``t`` (shape prefix, optionally range [0, 1]) and expand it against ``x`` in ``dtype``."""
    te = expand_like(t, x)
    if not te.is_floating_point():
        te = te.to(torch.float32)
    if check_range:
        _check_unit_interval(te, name)
    return te.to(dtype)


# ------------------------------------------------------------------------------------------------ schedules
def shift_timesteps(t: Tensor | float, shift: float) -> Tensor:
    """SD3 / Wan timestep shift ``t' = shift * t / (1 + (shift - 1) * t)``.

    ``shift > 1`` moves mass towards the noisy end (``t`` near 1), ``shift < 1`` towards the clean end. The map
    is monotone on ``[0, 1]``, fixes 0 and 1 exactly, and ``shift = 1`` returns ``t`` unchanged.

    Args:
        t: Timesteps in ``[0, 1]``, any shape.
        shift: The shift factor, ``> 0``.

    Returns:
        The shifted timesteps, same shape and (floating) dtype as ``t``.

    Raises:
        ValueError: If ``shift <= 0`` or some ``t`` lies outside ``[0, 1]``.
    """
    _check_shift(shift)
    t = torch.as_tensor(t)
    if not t.is_floating_point():
        t = t.to(torch.float32)
    _check_unit_interval(t, "t")
    if shift == 1:
        return t.clone()
    # Same map written as s*t / (s*t + (1 - t)): exact at both endpoints (1 -> s/s, 0 -> 0/1).
    st = shift * t
    return st / (st + (1.0 - t))


def timestep_grid(
    steps: int,
    shift: float = 1.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The sampling grid: ``steps + 1`` timesteps from 1 down to 0, uniform in ``t`` and then shifted.

    Args:
        steps: Number of sampling steps, ``>= 1``.
        shift: Timestep shift (see :func:`shift_timesteps`), ``> 0``.
        device: Device of the result.
        dtype: Dtype of the result (the grid is computed in float64 first).

    Returns:
        A strictly decreasing ``(steps + 1,)`` tensor with ``grid[0] == 1`` and ``grid[-1] == 0``.

    Raises:
        ValueError: If ``steps < 1`` or ``shift <= 0``.
    """
    _check_steps(steps)
    _check_shift(shift)
    grid = shift_timesteps(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64), shift)
    return grid.to(device=device, dtype=dtype)


def sample_timesteps(
    shape: int | tuple[int, ...] | torch.Size,
    distribution: Literal["logit_normal", "uniform"] = "logit_normal",
    mean: float = 0.0,
    std: float = 1.0,
    shift: float = 1.0,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Training-time noise levels in the open interval ``(0, 1)``.

    Use ``shape=(B,)`` for one level per clip or ``shape=(B, F)`` for one per frame (diffusion forcing).

    Args:
        shape: Output shape.
        distribution: ``"logit_normal"`` (``t = sigmoid(mean + std * z)``, SD3) or ``"uniform"`` on ``[0, 1)``.
        mean: Location of the logit-normal (ignored for ``"uniform"``).
        std: Scale of the logit-normal, ``>= 0`` (ignored for ``"uniform"``).
        shift: Timestep shift applied after drawing (see :func:`shift_timesteps`); ``> 1`` favours noisier ``t``.
        generator: Optional RNG; numbers are drawn on its device and then moved to ``device``.
        device: Device of the result (default: the generator's device, else CPU).
        dtype: Floating dtype of the result.

    Returns:
        Timesteps of the given shape, clamped to ``[tiny, 1 - eps]`` of ``dtype`` so that they never hit the
        endpoints.

    Raises:
        ValueError: On an unknown distribution, ``std < 0`` or ``shift <= 0``.
    """
    _check_shift(shift)
    if distribution not in ("logit_normal", "uniform"):
        raise ValueError(f"distribution must be 'logit_normal' or 'uniform', got {distribution!r}")
    if not (math.isfinite(std) and std >= 0) or not math.isfinite(mean):
        raise ValueError(f"logit-normal needs a finite mean and std >= 0, got mean={mean!r}, std={std!r}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    draw_device = generator.device if generator is not None else device
    if distribution == "uniform":
        t = torch.rand(shape, generator=generator, device=draw_device, dtype=torch.float64)
    else:
        z = torch.randn(shape, generator=generator, device=draw_device, dtype=torch.float64)
        t = torch.sigmoid(mean + std * z)
    t = shift_timesteps(t, shift)
    info = torch.finfo(dtype)
    return t.to(device=device, dtype=dtype).clamp(info.tiny, 1.0 - info.eps)


# ------------------------------------------------------------------------------------------------ targets
def add_noise(x0: Tensor, noise: Tensor, t: Tensor | float) -> Tensor:
    """Forward process ``x_t = (1 - t) * x0 + t * noise``.

    Args:
        x0: Clean data ``(B, ...)``.
        noise: Standard Gaussian noise, same shape as ``x0``.
        t: Timesteps in ``[0, 1]`` whose shape is a prefix of ``x0.shape`` (per sample or per frame).

    Returns:
        ``x_t`` in ``x0``'s dtype.

    Raises:
        ValueError: On a shape mismatch or ``t`` outside ``[0, 1]``.
    """
    _check_same_shape(x0, noise, "x0", "noise")
    ct = _compute_dtype(x0)
    te = _timestep(t, x0, "t", ct)
    return ((1.0 - te) * x0.to(ct) + te * noise.to(ct)).to(x0.dtype)


def velocity_target(x0: Tensor, noise: Tensor) -> Tensor:
    """The flow-matching regression target ``v = noise - x0`` (independent of ``t``).

    Raises:
        ValueError: If the shapes differ.
    """
    _check_same_shape(x0, noise, "x0", "noise")
    return noise - x0


def predict_x0(x_t: Tensor, v: Tensor, t: Tensor | float) -> Tensor:
    """Clean-sample estimate ``x0 = x_t - t * v`` from a velocity prediction.

    Raises:
        ValueError: On a shape mismatch or ``t`` outside ``[0, 1]``.
    """
    _check_same_shape(x_t, v, "x_t", "v")
    ct = _compute_dtype(x_t)
    te = _timestep(t, x_t, "t", ct)
    return (x_t.to(ct) - te * v.to(ct)).to(x_t.dtype)


def predict_noise(x_t: Tensor, v: Tensor, t: Tensor | float) -> Tensor:
    """Noise estimate ``noise = x_t + (1 - t) * v`` from a velocity prediction.

    Raises:
        ValueError: On a shape mismatch or ``t`` outside ``[0, 1]``.
    """
    _check_same_shape(x_t, v, "x_t", "v")
    ct = _compute_dtype(x_t)
    te = _timestep(t, x_t, "t", ct)
    return (x_t.to(ct) + (1.0 - te) * v.to(ct)).to(x_t.dtype)


# ------------------------------------------------------------------------------------------------ samplers
def euler_step(x_t: Tensor, v: Tensor, t: Tensor | float, t_next: Tensor | float) -> Tensor:
    """One Euler step of the probability-flow ODE: ``x_next = x_t + (t_next - t) * v``.

    Per-frame ``t`` / ``t_next`` are allowed; a frame with ``t == t_next`` is returned unchanged. The step is
    a plain linear update, so ``t`` values are not range-checked (a forward step ``t_next > t`` also works).

    Args:
        x_t: Current sample ``(B, ...)``.
        v: Predicted velocity, same shape.
        t: Current timesteps (shape a prefix of ``x_t.shape``).
        t_next: Next timesteps (shape a prefix of ``x_t.shape``).

    Returns:
        The next sample, in ``x_t``'s dtype.

    Raises:
        ValueError: On a shape mismatch.
    """
    _check_same_shape(x_t, v, "x_t", "v")
    ct = _compute_dtype(x_t)
    dt = _timestep(t_next, x_t, "t_next", ct, check_range=False) - _timestep(
        t, x_t, "t", ct, check_range=False
    )
    return (x_t.to(ct) + v.to(ct) * dt).to(x_t.dtype)


class SDEStep(NamedTuple):
    """Result of :func:`sde_step`.

    Attributes:
        prev_sample: The next (less noisy) sample, in ``x_t``'s dtype, shape of ``x_t``.
        log_prob: Gaussian log-density of ``prev_sample``, summed over all but the leading ``reduce_dims`` dims.
        mean: Mean of the Gaussian transition (compute dtype, shape of ``x_t``).
        std: Standard deviation of the transition, broadcastable to ``x_t`` (``t``'s shape plus singleton dims).
    """

    prev_sample: Tensor
    log_prob: Tensor
    mean: Tensor
    std: Tensor


def sde_step(
    x_t: Tensor,
    v: Tensor,
    t: Tensor | float,
    t_next: Tensor | float,
    eta: float = 0.7,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    prev_sample: Tensor | None = None,
    reduce_dims: int = 1,
) -> SDEStep:
    """One Euler–Maruyama step of the marginal-preserving reverse SDE (Flow-GRPO), with its log-probability.

    With ``dt = t_next - t <= 0``, ``sigma_t = eta * sqrt(t / (1 - t))`` and the noise estimate
    ``eps_hat = x_t + (1 - t) * v``::

        mean = x_t + (v + sigma_t**2 / (2 t) * eps_hat) * dt
        std  = sigma_t * sqrt(-dt)
        prev_sample = mean + std * z,   z ~ N(0, I)

    Derivation: ``p_t`` is data blurred by Gaussian noise of std ``t`` (scaled by ``1 - t``), so Tweedie gives
    the score ``grad log p_t(x) = -E[noise | x_t] / t = -eps_hat / t``. For any ``sigma``, the reverse-time SDE
    ``dx = (v - sigma^2 / 2 * score) dt + sigma dW`` (``dt < 0``) has the same Fokker–Planck marginals as the ODE
    ``dx = v dt``: the extra drift's divergence cancels the diffusion term. Substituting the score gives the
    drift ``v + sigma^2 / (2 t) * eps_hat``. ``eta = 0`` is exactly :func:`euler_step`.

    Clamping: ``sigma_t`` diverges at ``t = 1``, so the noise level is evaluated at
    ``t_sigma = min(t, 1 + dt)``, i.e. never closer to 1 than one step (at ``t = 1`` this is ``t_next``, the
    Flow-GRPO rule); the injected variance ``sigma^2 * |dt|`` is then at most ``eta^2`` per step. At ``t -> 0``
    nothing diverges (``sigma^2 / t`` stays finite); ``t`` only appears in a denominator for moving frames,
    where ``t > t_next >= 0``.

    Held frames (``t == t_next``) get ``mean = x_t``, ``std = 0``, are returned unchanged and contribute 0 to
    ``log_prob``. More generally every element with ``std == 0`` (held frames, or ``eta = 0``) is treated as
    deterministic and contributes 0.

    Args:
        x_t: Current sample ``(B, ...)``.
        v: Predicted velocity, same shape.
        t: Current timesteps in ``[0, 1]`` (shape a prefix of ``x_t.shape``).
        t_next: Next timesteps in ``[0, 1]``, ``<= t`` elementwise.
        eta: Noise scale, ``>= 0``.
        noise: Optional standard-normal ``z`` (shape of ``x_t``) instead of drawing one.
        generator: RNG for drawing ``z`` (drawn on its device, then moved to ``x_t``'s device).
        prev_sample: If given, no sample is drawn: the step evaluates the log-probability of this sample
            (e.g. GRPO re-scoring an old trajectory under the current model's velocities).
        reduce_dims: Number of leading dims kept in ``log_prob``: 1 gives ``(B,)``, 2 gives per-frame ``(B, F)``.

    Returns:
        An :class:`SDEStep` ``(prev_sample, log_prob, mean, std)``.

    Raises:
        ValueError: On shape mismatches, ``t`` / ``t_next`` outside ``[0, 1]``, ``t_next > t``, ``eta < 0``,
            a bad ``reduce_dims``, or both ``noise`` and ``prev_sample`` given.
    """
    _check_same_shape(x_t, v, "x_t", "v")
    if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be a finite number >= 0, got {eta!r}")
    if isinstance(reduce_dims, bool) or not isinstance(reduce_dims, int) or not 0 <= reduce_dims <= x_t.ndim:
        raise ValueError(f"reduce_dims must be an integer in [0, {x_t.ndim}], got {reduce_dims!r}")
    if noise is not None and prev_sample is not None:
        raise ValueError("pass at most one of noise and prev_sample")
    if noise is not None:
        _check_same_shape(x_t, noise, "x_t", "noise")
    if prev_sample is not None:
        _check_same_shape(x_t, prev_sample, "x_t", "prev_sample")

    ct = _compute_dtype(x_t)
    t_e = _timestep(t, x_t, "t", ct)
    tn_e = _timestep(t_next, x_t, "t_next", ct)
    t_e, tn_e = torch.broadcast_tensors(t_e, tn_e)
    dt = tn_e - t_e
    if bool((dt > 0).any()):
        raise ValueError("sde_step runs from noise to data: t_next must be <= t everywhere")

    x = x_t.to(ct)
    vel = v.to(ct)
    moving = dt < 0
    # Noise level, clamped away from t = 1 (see docstring); held frames get sigma = 0.
    t_sigma = torch.where(moving, torch.minimum(t_e, 1.0 + dt), torch.zeros_like(t_e))
    sigma = eta * torch.sqrt(t_sigma / (1.0 - t_sigma))
    # sigma^2 / (2 t): the safe denominator only matters for held frames, where sigma = 0 anyway.
    coef = sigma.square() / (2.0 * torch.where(moving, t_e, torch.ones_like(t_e)))
    drift = vel + coef * (x + (1.0 - t_e) * vel)
    mean = torch.where(moving, x + drift * dt, x)
    std = sigma * torch.sqrt(-dt)

    if prev_sample is None:
        if noise is None:
            draw_device = generator.device if generator is not None else x.device
            noise = torch.randn(x.shape, generator=generator, device=draw_device, dtype=ct).to(x.device)
        sample = (mean + std * noise.to(ct)).to(x_t.dtype)
    else:
        sample = prev_sample

    deterministic = std == 0
    safe_std = torch.where(deterministic, torch.ones_like(std), std)
    elem = -((sample.to(ct) - mean) ** 2) / (2.0 * safe_std**2) - torch.log(safe_std) - _LOG_SQRT_2PI
    elem = torch.where(deterministic, torch.zeros_like(elem), elem)
    log_prob = elem.sum(dim=tuple(range(reduce_dims, x.ndim))) if reduce_dims < x.ndim else elem
    return SDEStep(prev_sample=sample, log_prob=log_prob, mean=mean, std=std)


# ------------------------------------------------------------------------------------------------ scheduler
class FlowMatchScheduler:
    """A fixed sampling grid (:func:`timestep_grid`) with ODE / SDE steps along it for the whole batch.

    For per-frame schedules call :func:`euler_step` / :func:`sde_step` with per-frame ``t`` directly.

    Attributes:
        steps: Number of sampling steps.
        shift: Timestep shift of the grid.
        timesteps: The ``(steps + 1,)`` float32 grid from 1 down to 0 (CPU).
    """

    def __init__(self, steps: int, shift: float = 1.0) -> None:
        """Build the grid.

        Args:
            steps: Number of sampling steps, ``>= 1``.
            shift: Timestep shift, ``> 0``.

        Raises:
            ValueError: If ``steps < 1`` or ``shift <= 0``.
        """
        _check_shift(shift)
        self.shift = float(shift)
        self.set_steps(steps)

    def set_steps(self, steps: int) -> None:
        """Rebuild the grid for a new number of steps (same shift).

        Raises:
            ValueError: If ``steps < 1``.
        """
        self.timesteps = timestep_grid(steps, self.shift)
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __repr__(self) -> str:
        return f"{type(self).__name__}(steps={self.steps}, shift={self.shift})"

    @overload
    def step(
        self,
        x_t: Tensor,
        v: Tensor,
        i: int,
        mode: Literal["ode"] = ...,
        eta: float = ...,
        generator: torch.Generator | None = ...,
        prev_sample: Tensor | None = ...,
        reduce_dims: int = ...,
    ) -> Tensor: ...

    @overload
    def step(
        self,
        x_t: Tensor,
        v: Tensor,
        i: int,
        mode: Literal["sde"],
        eta: float = ...,
        generator: torch.Generator | None = ...,
        prev_sample: Tensor | None = ...,
        reduce_dims: int = ...,
    ) -> SDEStep: ...

    def step(
        self,
        x_t: Tensor,
        v: Tensor,
        i: int,
        mode: Literal["ode", "sde"] = "ode",
        eta: float = 0.7,
        generator: torch.Generator | None = None,
        prev_sample: Tensor | None = None,
        reduce_dims: int = 1,
    ) -> Tensor | SDEStep:
        """Step from ``timesteps[i]`` to ``timesteps[i + 1]``.

        Args:
            x_t: Current sample at ``timesteps[i]``.
            v: Predicted velocity, same shape.
            i: Step index in ``[0, steps)``.
            mode: ``"ode"`` (Euler, returns the next sample) or ``"sde"`` (returns an :class:`SDEStep`).
            eta: SDE noise scale (``"sde"`` only).
            generator: SDE RNG (``"sde"`` only).
            prev_sample: Sample whose log-probability to evaluate instead of drawing one (``"sde"`` only).
            reduce_dims: Leading dims kept in the SDE ``log_prob``.

        Returns:
            The next sample (``"ode"``) or an :class:`SDEStep` (``"sde"``).

        Raises:
            ValueError: On a bad ``i`` or ``mode`` (and whatever the step functions raise).
        """
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.steps:
            raise ValueError(f"step index must be an integer in [0, {self.steps}), got {i!r}")
        t, t_next = self.timesteps[i], self.timesteps[i + 1]
        if mode == "ode":
            return euler_step(x_t, v, t, t_next)
        if mode == "sde":
            return sde_step(
                x_t,
                v,
                t,
                t_next,
                eta=eta,
                generator=generator,
                prev_sample=prev_sample,
                reduce_dims=reduce_dims,
            )
        raise ValueError(f"mode must be 'ode' or 'sde', got {mode!r}")
