"""AutoMoT's VLA-oriented action refiner: a small flow-matching model that refines the coarse waypoints.

Paper: AutoMoT (ICML 2026), "VLA-oriented action refiner": a diffusion model on the planned waypoints,
conditioned on the action expert's features, fine-tuned with a diffusion loss after the VLA (the VLA frozen),
switchable at inference. The reference code does not release it; this is our reading.

Inputs (all ego frame: x forward, y left, metres):

- ``features`` (B, cond_dim): the action expert's waypoint-query outputs, flattened
  (``modeling_automot``'s ``features``, cond_dim = n_wp * expert_hidden_size).
- ``coarse`` (B, n_wp, 2): the VLA's waypoint head (positions at 0.5 s spacing, 3 s).
- ``target`` (B, n_wp, 2): ground-truth waypoints (training only).

Flow space. With ``residual=True`` (default) the flow models the *correction* ``(target - coarse) / scale``
instead of absolute waypoints: corrections are small and roughly zero-mean, so they match the unit-Gaussian
noise scale, the model cannot do worse than the coarse plan by much when it has learnt nothing (the
correction starts near 0), and the coarse plan is still given to the network as a condition. With
``residual=False`` the flow models ``target / scale`` (choose ``scale`` ~ the waypoints' spread, e.g. 10 m).

Conventions of ``core.diffusion``: ``x_t = (1 - t) x0 + t noise``, the network predicts ``v = noise - x0``,
sampling runs Euler from ``t_start`` down to 0. ``t_start = 1`` samples from pure noise; ``t_start < 1`` is
SDEdit-style: the starting point is the coarse plan (correction 0 in residual mode, ``coarse / scale``
otherwise) noised to level ``t_start``, so few steps stay close to the coarse plan. The grid is
``t_start * timestep_grid(steps, shift)``. ``steps = 0`` (in the config or per call) disables the refiner:
``refine`` returns the coarse plan bit-exactly.

Network: an MLP velocity field. ``x_t`` (n_wp * 2) -> Linear -> ``layers`` pre-LayerNorm residual MLP
blocks with adaLN-Zero (FiLM shift / scale / gate) from one conditioning vector = MLP([LayerNorm(features),
coarse / COARSE_NORM]) + sinusoidal timestep embedding (``core.layers.dit.TimestepEmbedder``) -> adaLN
read-out, zero-initialised (v = 0 at init). ``cond_dropout``: during training each sample's ``features``
are replaced by zeros with this probability (the coarse plan is always kept).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from core.config import from_dict_strict
from core.diffusion import flow_matching as fm
from core.errors import ConfigError
from core.layers.dit import TimestepEmbedder, modulate

__all__ = ["COARSE_NORM", "RefinerConfig", "WaypointRefiner"]

COARSE_NORM = 10.0  # [m] the coarse plan enters the conditioning MLP divided by this
_T_DISTRIBUTIONS = ("logit_normal", "uniform")


@dataclass
class RefinerConfig:
    """The refiner's configuration (the constructor signature of ``WaypointRefiner`` is this config).

    - ``cond_dim``: width of ``features`` (n_wp * the action expert's hidden size).
    - ``n_wp``: waypoints per plan (6 = 3 s at 2 Hz).
    - ``hidden`` / ``layers``: the velocity MLP's width and number of residual blocks.
    - ``steps``: Euler steps at inference; 0 disables the refiner (the coarse plan passes through).
    - ``t_start``: noise level the refinement starts from, in (0, 1]; < 1 = SDEdit-style partial noising of
      the coarse plan.
    - ``residual``: the flow models ``target - coarse`` (True) or absolute waypoints (False).
    - ``scale``: metres per unit of the flow's data space (the data is divided by it before noising).
    - ``shift``: timestep shift of the training distribution and of the sampling grid (``core.diffusion``).
    - ``t_distribution``: training timesteps, "logit_normal" (SD3) or "uniform".
    - ``cond_dropout``: probability of zeroing a sample's ``features`` during training.
    """

    cond_dim: int
    n_wp: int = 6
    hidden: int = 256
    layers: int = 3
    steps: int = 4
    t_start: float = 1.0
    residual: bool = True
    scale: float = 1.0
    shift: float = 1.0
    t_distribution: str = "logit_normal"
    cond_dropout: float = 0.0

    def __post_init__(self) -> None:
        for key, low in (("cond_dim", 1), ("n_wp", 1), ("hidden", 2), ("layers", 0), ("steps", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"refiner.{key} must be an integer >= {low}, got {value!r}")
        if self.hidden % 2:
            raise ConfigError(f"refiner.hidden must be even (sinusoidal embedding), got {self.hidden}")
        if not isinstance(self.residual, bool):
            raise ConfigError(f"refiner.residual must be a bool, got {self.residual!r}")
        if not _finite(self.t_start) or not 0.0 < self.t_start <= 1.0:
            raise ConfigError(f"refiner.t_start must lie in (0, 1], got {self.t_start!r}")
        for key in ("scale", "shift"):
            if not _finite(getattr(self, key)) or not getattr(self, key) > 0:
                raise ConfigError(f"refiner.{key} must be a finite number > 0, got {getattr(self, key)!r}")
        if not _finite(self.cond_dropout) or not 0.0 <= self.cond_dropout < 1.0:
            raise ConfigError(f"refiner.cond_dropout must lie in [0, 1), got {self.cond_dropout!r}")
        if self.t_distribution not in _T_DISTRIBUTIONS:
            raise ConfigError(f"refiner.t_distribution must be one of {_T_DISTRIBUTIONS}, got {self.t_distribution!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RefinerConfig:
        """Build from a plain dict; an unknown key fails with a one-line ``ConfigError`` naming it."""
        return from_dict_strict(cls, values, "refiner")

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-able dict."""
        return dataclasses.asdict(self)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Block(nn.Module):
    """Pre-LayerNorm residual MLP block with adaLN-Zero modulation from a (B, D) condition."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 3 * dim))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, h: Tensor, c: Tensor) -> Tensor:
        shift, scale, gate = self.ada(c).chunk(3, dim=-1)  # (B, D) each
        return h + gate * self.mlp(modulate(self.norm(h), shift, scale))


class WaypointRefiner(nn.Module):
    """Flow-matching velocity field ``v(x_t, t | features, coarse)`` on (n_wp, 2) waypoints; see module doc.

    Args:
        config: A ``RefinerConfig`` (or a dict of its fields).
    """

    def __init__(self, config: RefinerConfig | dict[str, Any]) -> None:
        super().__init__()
        if isinstance(config, dict):
            config = RefinerConfig.from_dict(config)
        self.config = config
        d, n = config.hidden, config.n_wp * 2
        self.feature_norm = nn.LayerNorm(config.cond_dim)
        self.cond_mlp = nn.Sequential(nn.Linear(config.cond_dim + n, d), nn.SiLU(), nn.Linear(d, d))
        self.time_embed = TimestepEmbedder(d, frequency_dim=d)
        self.x_in = nn.Linear(n, d)
        self.blocks = nn.ModuleList(_Block(d) for _ in range(config.layers))
        self.out_norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.out_ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.out = nn.Linear(d, n)
        for layer in (self.out_ada[1], self.out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    # ------------------------------------------------------------------ network
    def forward(self, x_t: Tensor, t: Tensor, features: Tensor, coarse: Tensor) -> Tensor:
        """Predicted velocity.

        Args:
            x_t: (B, n_wp, 2) noisy sample in flow space.
            t: (B,) noise levels in [0, 1].
            features: (B, cond_dim) condition (already dropped out where wanted).
            coarse: (B, n_wp, 2) coarse waypoints [m, ego frame].

        Returns:
            (B, n_wp, 2) velocity ``noise - x0`` in flow space.
        """
        b = x_t.shape[0]
        dtype = self.x_in.weight.dtype
        cond = torch.cat([self.feature_norm(features.to(dtype)), coarse.reshape(b, -1).to(dtype) / COARSE_NORM], -1)
        c = self.cond_mlp(cond) + self.time_embed(t)  # (B, D)
        h = self.x_in(x_t.reshape(b, -1).to(dtype))  # (B, D)
        for block in self.blocks:
            h = block(h, c)
        shift, scale = self.out_ada(c).chunk(2, dim=-1)
        return self.out(modulate(self.out_norm(h), shift, scale)).reshape(x_t.shape)

    # ------------------------------------------------------------------ flow space
    def _to_flow(self, waypoints: Tensor, coarse: Tensor) -> Tensor:
        base = waypoints - coarse if self.config.residual else waypoints
        return base / self.config.scale

    def _from_flow(self, x: Tensor, coarse: Tensor) -> Tensor:
        out = x * self.config.scale
        return coarse + out if self.config.residual else out

    def _check(self, features: Tensor, coarse: Tensor, target: Tensor | None = None) -> None:
        n = self.config.n_wp
        if not isinstance(coarse, Tensor) or coarse.ndim != 3 or tuple(coarse.shape[1:]) != (n, 2):
            raise ValueError(f"coarse must be a (B, {n}, 2) tensor, got {_shape(coarse)}")
        b = coarse.shape[0]
        if not isinstance(features, Tensor) or tuple(features.shape) != (b, self.config.cond_dim):
            raise ValueError(f"features must be a (B={b}, cond_dim={self.config.cond_dim}) tensor, "
                             f"got {_shape(features)}")
        if target is not None and (not isinstance(target, Tensor) or target.shape != coarse.shape):
            raise ValueError(f"target must have coarse's shape {tuple(coarse.shape)}, got {_shape(target)}")

    # ------------------------------------------------------------------ training
    def loss(self, features: Tensor, coarse: Tensor, target: Tensor,
             generator: torch.Generator | None = None) -> Tensor:
        """Flow-matching loss: mean squared error of the predicted velocity.

        Args:
            features: (B, cond_dim) the action expert's features (detach them: the VLA is frozen).
            coarse: (B, n_wp, 2) the VLA's coarse waypoints [m, ego frame].
            target: (B, n_wp, 2) ground-truth waypoints [m, ego frame].
            generator: RNG for the timesteps, the noise and the condition dropout.

        Returns:
            Scalar float32 loss.

        Raises:
            ValueError: On a bad shape (the message names the argument).
        """
        self._check(features, coarse, target)
        cfg = self.config
        b, device = coarse.shape[0], coarse.device
        coarse = coarse.float()
        x0 = self._to_flow(target.float(), coarse)
        t = fm.sample_timesteps((b,), cfg.t_distribution, shift=cfg.shift, generator=generator, device=device)
        noise = _randn(x0.shape, generator, device)
        x_t = fm.add_noise(x0, noise, t)
        if self.training and cfg.cond_dropout > 0:
            keep = _rand((b, 1), generator, device) >= cfg.cond_dropout
            features = features * keep.to(features.dtype)
        v = self(x_t, t, features, coarse)
        return (v.float() - fm.velocity_target(x0, noise)).square().mean()

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def refine(self, features: Tensor, coarse: Tensor, steps: int | None = None,
               generator: torch.Generator | None = None, noise: Tensor | None = None) -> Tensor:
        """Refined waypoints (B, n_wp, 2) [m, ego frame], in ``coarse``'s dtype.

        Deterministic given ``noise`` (or the ``generator``'s state): Euler on the probability-flow ODE from
        ``t_start`` to 0. ``steps=0`` (or ``config.steps == 0`` with ``steps=None``) returns a copy of
        ``coarse``, bit-exact.

        Args:
            features: (B, cond_dim) the action expert's features.
            coarse: (B, n_wp, 2) the coarse waypoints.
            steps: Euler steps; None = ``config.steps``.
            generator: RNG for the starting noise (ignored when ``noise`` is given).
            noise: (B, n_wp, 2) standard-normal starting noise.

        Raises:
            ValueError: On a bad shape or ``steps``.
        """
        self._check(features, coarse)
        steps = self.config.steps if steps is None else steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        if steps == 0:
            return coarse.clone()
        if noise is not None and noise.shape != coarse.shape:
            raise ValueError(f"noise must have coarse's shape {tuple(coarse.shape)}, got {tuple(noise.shape)}")
        cfg = self.config
        b, device = coarse.shape[0], coarse.device
        c32 = coarse.float()
        noise = _randn(coarse.shape, generator, device) if noise is None else noise.to(device, torch.float32)
        start = self._to_flow(c32, c32)  # the coarse plan in flow space (zeros in residual mode)
        x = fm.add_noise(start, noise, cfg.t_start)
        grid = cfg.t_start * fm.timestep_grid(steps, cfg.shift, device=device)  # t_start -> 0
        for i in range(steps):
            t = grid[i].expand(b)
            v = self(x, t, features, c32).float()
            x = fm.euler_step(x, v, grid[i], grid[i + 1])
        return self._from_flow(x, c32).to(coarse.dtype)


def _shape(x: Any) -> str:
    return str(tuple(x.shape)) if isinstance(x, Tensor) else type(x).__name__


def _randn(shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None, device: torch.device) -> Tensor:
    draw = generator.device if generator is not None else device
    return torch.randn(tuple(shape), generator=generator, device=draw).to(device)


def _rand(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    draw = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=draw).to(device)
