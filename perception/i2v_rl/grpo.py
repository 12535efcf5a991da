"""Group-relative advantages, the rollout memory bank and the two policy losses (DanceGRPO's and TAGRPO's).

Notation for one sampling step ``i`` of one group (one conditioning image): the states ``x_i^k`` of the group's
fresh rollouts ``k``; the policy's transition mean ``mu_theta(x_i^k)`` and the frozen-at-rollout mean
``mu_old(x_i^k)``; the step's std ``sigma_i``; targets ``y_j = x_{i+1}^j`` with advantages ``A_j`` (the group's
rollouts, and with TAGRPO also banked rollouts of the same image and initial noise). ``D`` is the number of latent
elements. The log-ratio of a target under a state is

    l_kj = [ ||y_j - mu_old(x_i^k)||^2 - ||y_j - mu_theta(x_i^k)||^2 ] / (2 sigma_i^2 D),   r_kj = exp(l_kj)

(the per-element mean log-probability, as Flow-GRPO normalises it), and the clipped surrogate is
``s_kj = min(r_kj A_j, clip(r_kj, 1 - eps, 1 + eps) A_j)``.

- **DanceGRPO** (``grpo_loss``): ``-mean_k s_kk``: each rollout's own sampled transition, as in PPO.
- **TAGRPO** (``contrastive_loss``): ``-mean_k [ s_kk + lambda * mean_{j != k} s_kj ]``. Its gradient at
  ``r = 1`` is ``sum_j A_j (y_j - mu_theta(x_i^k)) / (sigma_i^2 D)``: since advantages are centred in the group,
  this is the direction from the policy's predicted latent towards the advantage-weighted high-reward latents and
  away from the low-reward ones — the contrastive pull / push on intermediate latents. It is only a useful
  direction when the states ``x_i^k`` and the targets' states ``x_i^j`` are comparable, which is what rollouts
  from the same initial noise make them (the paper's observation); with independent noise the differences
  ``y_j - mu(x_i^k)`` are dominated by the unrelated starting points.

Before the first optimizer step of an iteration ``mu_theta == mu_old`` bit for bit (same inputs, same batch, same
weights), so every ratio is exactly 1 there (tested).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["BankEntry", "MemoryBank", "StepCoefficient", "contrastive_loss", "group_advantages", "grpo_loss",
           "pairwise_log_ratio", "step_coefficients", "step_weights"]


def group_advantages(rewards: Tensor, eps: float = 1e-6, clip: float | None = None) -> Tensor:
    """Rewards (..., G) normalised within each group: ``(r - mean) / (std + eps)`` (population std), clipped."""
    if rewards.shape[-1] < 2:
        raise ValueError(f"a group needs >= 2 rollouts, got rewards of shape {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN / inf")
    adv = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, unbiased=False, keepdim=True) + eps)
    return adv.clamp(-clip, clip) if clip is not None else adv


def pairwise_log_ratio(mean_new: Tensor, mean_old: Tensor, targets: Tensor, std: Tensor | float) -> Tensor:
    """``l_kj`` (K, J) of targets (J, ...) under states' means (K, ...) (see the module docstring).

    Computed as ``delta_k . (mu_old_k + mu_new_k - 2 y_j) / (2 sigma^2 D)`` with ``delta = mu_old - mu_new``: one
    (K, D) x (D, J) product, no (K, J, D) tensor, and exactly 0 where ``mu_new == mu_old``.
    """
    old, new, y = mean_old.flatten(1), mean_new.flatten(1), targets.flatten(1)
    delta = old - new
    num = (delta * (old + new)).sum(1, keepdim=True) - 2 * delta @ y.T
    return num / (2 * torch.as_tensor(std) ** 2 * old.shape[1])


def _own_log_ratio(mean_new: Tensor, mean_old: Tensor, samples: Tensor, std: Tensor | float) -> Tensor:
    """``l_kk`` (K,) computed elementwise (exact: no distance expansion)."""
    diff = ((samples - mean_old) ** 2 - (samples - mean_new) ** 2).flatten(1).mean(1)
    return diff / (2 * torch.as_tensor(std) ** 2)


def _surrogate(log_ratio: Tensor, adv: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    ratio = torch.exp(log_ratio)
    s = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return s, ratio


def grpo_loss(mean_new: Tensor, mean_old: Tensor, samples: Tensor, std: Tensor | float, adv: Tensor, clip: float
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """DanceGRPO's clipped policy loss for one step: each rollout's own sampled next latent ``samples`` (K, ...)."""
    s, ratio = _surrogate(_own_log_ratio(mean_new, mean_old, samples, std), adv, clip)
    return -s.mean(), {"ratio": ratio.detach(), "clipped": ((ratio - 1).abs() > clip).float().mean().detach()}


def contrastive_loss(mean_new: Tensor, mean_old: Tensor, targets: Tensor, std: Tensor | float, adv: Tensor,
                     own: Tensor, clip: float, weight: float = 1.0) -> tuple[Tensor, dict[str, Tensor]]:
    """TAGRPO's loss for one step of one group.

    Args:
        mean_new / mean_old: (K, ...) transition means of the K fresh states (policy / at rollout).
        targets: (J, ...) next latents of the group's rollouts and banked ones (J >= K).
        std: The step's std.
        adv: (J,) the targets' advantages.
        own: (K,) index into ``targets`` of each state's own sampled next latent.
        clip: PPO clip range.
        weight: ``lambda`` of the contrastive term.
    """
    k, j = mean_new.shape[0], targets.shape[0]
    rows = torch.arange(k, device=targets.device)
    s_own, ratio_own = _surrogate(_own_log_ratio(mean_new, mean_old, targets[own], std), adv[own], clip)
    lr = pairwise_log_ratio(mean_new, mean_old, targets, std)  # (K, J)
    s_all, ratio_all = _surrogate(lr, adv[None, :].expand(k, j), clip)
    others = torch.ones(k, j, dtype=torch.bool, device=targets.device)
    others[rows, own] = False
    cross = (s_all * others).sum(1) / others.sum(1).clamp_min(1)
    loss = -(s_own + weight * cross).mean()
    return loss, {"ratio": ratio_own.detach(), "clipped": ((ratio_own - 1).abs() > clip).float().mean().detach(),
                  "cross_ratio": ratio_all[others].detach()}


# ------------------------------------------------------------------------------------------------ step coefficients
@dataclass
class StepCoefficient:
    """The policy-gradient figures of one sampling step ``t -> t_next`` of the SDE sampler.

    Attributes:
        t / t_next: The step's grid points.
        sigma_t: The SDE's noise level ``eta sqrt(t_s / (1 - t_s))`` at ``core.diffusion.sde_step``'s clamped
            ``t_s = min(t, 1 + dt)``.
        std: The transition's std ``sigma_i = sigma_t sqrt(-dt)``.
        dmean_dv: ``d mu / d v = dt (1 + sigma_t^2 (1 - t) / (2 t))``: how a change of the velocity moves the mean.
        coefficient: ``dmean_dv / sigma_i^2``, what multiplies ``(y - mu)`` in the per-element log-ratio's gradient
            with respect to ``v`` (before the ``1 / D`` of the per-element mean).
        scale: ``|dmean_dv| / sigma_i``, that gradient's typical size per element: under the sampling policy
            ``y - mu = sigma_i z`` with ``z ~ N(0, 1)``; it is also how fast the step's ratio leaves 1 when the
            velocity changes, so the steps of largest ``scale`` reach the clip range first.
    """

    t: float
    t_next: float
    sigma_t: float
    std: float
    dmean_dv: float
    coefficient: float
    scale: float


def step_coefficients(steps: int, shift: float, eta: float) -> list[StepCoefficient]:
    """Per sampling step of the grid ``core.diffusion.timestep_grid(steps, shift)``, the SDE std and the
    policy-gradient coefficient on the velocity (``StepCoefficient``), read off ``core.diffusion.sde_step`` itself
    (its mean differentiated by autograd, its std as returned), so any clamping there is accounted for.
    """
    from core.diffusion import sde_step, timestep_grid

    if eta <= 0:
        raise ValueError(f"eta must be > 0 (no noise, no log-probability), got {eta}")
    grid = timestep_grid(steps, shift, dtype=torch.float64)
    out = []
    for i in range(steps):
        t, tn = grid[i], grid[i + 1]
        x = torch.zeros(1, dtype=torch.float64)
        v = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        st = sde_step(x, v, t, tn, eta=eta, prev_sample=x)
        (d,) = torch.autograd.grad(st.mean.sum(), v)
        std, d = float(st.std.reshape(-1)[0]), float(d[0])
        out.append(StepCoefficient(float(t), float(tn), std / math.sqrt(float(t - tn)), std, d, d / std**2,
                                   abs(d) / std))
    return out


def step_weights(steps: int, shift: float, eta: float, mode: str = "balanced") -> Tensor:
    """(steps,) loss weights of the sampling steps: ones for ``none``; for ``balanced`` proportional to ``1 / c_i``
    with ``c_i`` the step's ``scale`` (``step_coefficients``), so that ``w_i c_i`` is the same for every step and the
    weights average to 1 (the lr keeps its meaning)."""
    if mode == "none":
        return torch.ones(steps, dtype=torch.float64)
    if mode != "balanced":
        raise ValueError(f"step weighting must be 'none' or 'balanced', got {mode!r}")
    c = torch.tensor([s.scale for s in step_coefficients(steps, shift, eta)], dtype=torch.float64)
    w = 1.0 / c
    return w / w.mean()


# ------------------------------------------------------------------------------------------------ memory bank
@dataclass
class BankEntry:
    """A past rollout: its conditioning image key, initial-noise key, latent trajectory (S + 1, N, C, h, w),
    reward and the iteration that produced it."""

    image: int
    noise: Hashable
    latents: Tensor
    reward: float
    iteration: int


class MemoryBank:
    """Bounded FIFO store of past rollouts: adding past ``capacity`` drops the oldest entry.

    Entries are looked up by (image, noise) key: rollouts of the same conditioning image from the same initial
    noise, whose intermediate latents are comparable to a new rollout's.
    """

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._items: deque[BankEntry] = deque(maxlen=capacity) if capacity else deque(maxlen=0)
        self.added = 0

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def add(self, entry: BankEntry) -> None:
        if self.capacity:
            self._items.append(BankEntry(entry.image, entry.noise, entry.latents.detach().to("cpu"),
                                         float(entry.reward), entry.iteration))
        self.added += 1

    def lookup(self, image: int, noise: Hashable, limit: int | None = None,
               before: int | None = None) -> list[BankEntry]:
        """Entries of ``(image, noise)``, newest first, at most ``limit``, only from iterations < ``before``."""
        out = [e for e in reversed(self._items) if e.image == image and e.noise == noise
               and (before is None or e.iteration < before)]
        return out if limit is None else out[:limit]

    def state_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "added": self.added,
                "entries": [{"image": e.image, "noise": list(e.noise) if isinstance(e.noise, tuple) else e.noise,
                             "latents": e.latents, "reward": e.reward, "iteration": e.iteration}
                            for e in self._items]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"bank capacity {state['capacity']} in the checkpoint, {self.capacity} configured")
        self._items.clear()
        for e in state["entries"]:
            noise = tuple(e["noise"]) if isinstance(e["noise"], list) else e["noise"]
            self._items.append(BankEntry(int(e["image"]), noise, e["latents"], float(e["reward"]),
                                         int(e["iteration"])))
        self.added = int(state["added"])
