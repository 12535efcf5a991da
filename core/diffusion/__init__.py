"""Shared diffusion machinery.

``flow_matching``: rectified-flow schedules, training targets, and ODE / SDE samplers with per-frame timesteps
(``x_t = (1 - t) x0 + t noise``, velocity ``v = noise - x0``; see the module docstring of
:mod:`core.diffusion.flow_matching` for the conventions).
"""

from core.diffusion.flow_matching import (
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
