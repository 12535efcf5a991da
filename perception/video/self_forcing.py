"""Self-Forcing as an arm of the Flex-Forcing experiment: self-rollout training with distribution matching.

Paper: *Self Forcing: Bridging the Train-Test Gap in Autoregressive Video Diffusion* (Huang et al., 2025; the
reference for autoregressive video on Wan2.1). The student generates each training clip autoregressively with its
own KV cache — exactly as at inference, so it is trained on its own context, not the ground truth's (the exposure
bias of teacher forcing / diffusion forcing) — and the rolled-out video is scored by DMD (distribution matching
distillation): the gradient on the generated latents is the difference between a *fake* score (a critic trained
online, by the flow-matching loss, on the student's samples) and the *real* score of a frozen bidirectional
teacher, ``x0_fake(x_t) - x0_real(x_t)``, normalised per sample by ``mean |x - x0_real(x_t)|``, at one noise level
``t ~ U(t_min, t_max)`` per clip; ``loss = 0.5 ||x - sg(x - grad)||^2``.

As in Self-Forcing's code:
- every new frame (a chunk: one latent frame, the AR regime's) draws an exit step ``s`` of the sampler; steps
  before ``s`` run without gradient, step ``s`` predicts ``x0 = x_t - t v`` with gradient and that is the frame;
  the clean frame is then written to the KV cache by one pass at t = 0 *without* gradient — so the gradient
  reaches the student only through each frame's exit step (tested), and the rollout's context is the student's
  own output (tested);
- the critic starts from the teacher's weights and is updated every step, the generator every
  ``sf_gen_every`` steps (Self-Forcing's ``dfake_gen_update_ratio``, 5 in its configs);
- ``sf_rollout_frames`` > the window (Self-Forcing++): a longer self-rollout, DMD on a random window of it.

Our miniature (deviations): the student samples with the model's own Euler grid (``sample_steps`` steps, the
sampler every arm is scored with) instead of a distilled 4-step x0 sampler with re-noising; the student starts
from a trained Flex-Forcing checkpoint (``init_path``) instead of an ODE-regression initialisation; the teacher
is our bidirectional model (``teacher_path``, run with the window's clean context frames as its first chunk and
the new frames as one bidirectional chunk — the layout it was trained on), without classifier-free guidance
(there is no text); the context frames of each rollout are the first ``max_context`` ground-truth latents of the
training window (the eval's given frames), the rollout fills the rest of the window.

The critic is a submodule (``critic.*``: saved, resumed); the teacher is not (frozen, never saved, read again
from ``teacher_path``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from core.diffusion import euler_step, timestep_grid
from core.layers.kv_cache import KVCache
from core.layers.wan import CausalWan

__all__ = ["attach", "critic_loss", "dmd_loss", "rollout", "training_step"]


def attach(model, config) -> None:
    """Give a ``FlexForcingModel`` (objective ``self_forcing``; its ``init_path`` weights already loaded) its critic
    and frozen teacher.

    ``teacher_path``: the frozen teacher (same transformer architecture), which also initialises the critic. None
    (rebuilding a saved run): the critic's architecture only; its weights come from the checkpoint.
    """
    from perception.video.modeling_flexforcing import FlexForcingModel

    model.critic = CausalWan.from_config(dict(model.config.transformer_config), model.config.k_projection, "sdpa")
    object.__setattr__(model, "_sf_teacher", None)  # not a submodule: frozen, never saved
    model._sf_step = 0
    from core.resources import resolve_asset_path

    if config.teacher_path is not None:
        teacher = FlexForcingModel.from_pretrained(resolve_asset_path(config.teacher_path), use_ema=False).dit.eval().requires_grad_(False)
        try:
            model.critic.load_state_dict(teacher.state_dict())
        except RuntimeError as e:
            raise ValueError(f"teacher {config.teacher_path}: its transformer differs from the student's ({e})"
                             ) from None
        object.__setattr__(model, "_sf_teacher", teacher)


def rollout(model, context: torch.Tensor, num_new: int, exits: list[int], grid: torch.Tensor,
            noise: torch.Tensor | None = None, grad_frames: range | None = None) -> torch.Tensor:
    """The student continues ``context`` (B, K, C, h, w) clean latents by ``num_new`` frames, one at a time.

    Frame ``i`` is denoised from ``noise[:, i]`` by Euler steps of ``grid`` against the KV cache until step
    ``exits[i]``, whose ``x0`` prediction (with gradient when enabled) is the frame; the frame is then cached clean
    (a t = 0 pass, no gradient) and the cache rolls to the newest ``num_frames - 1`` frames, as
    ``pipeline_flexforcing`` does at inference. ``grad_frames``: the new frames (0-based) whose exit step keeps
    the gradient (default all; the others run without). Returns (B, num_new, C, h, w).
    """
    from perception.video.pipeline_flexforcing import fill_cache

    dit = model.dit
    b, k = context.shape[:2]
    dev = context.device
    if noise is None:
        noise = torch.randn(b, num_new, *context.shape[2:], device=dev)
    cache = KVCache(len(dit.blocks))
    with torch.no_grad():
        fill_cache(model, cache, context, torch.arange(k, device=dev))
    out = []
    for i in range(num_new):
        f = torch.tensor([k + i], device=dev)
        x = noise[:, i:i + 1]
        s = exits[i]
        with torch.no_grad():
            for j in range(s):
                t = grid[j].expand(b, 1)
                x = euler_step(x, dit(x, t, f, None, caches=[cache]), t, grid[j + 1].expand(b, 1))
        t = grid[s].expand(b, 1)
        with torch.set_grad_enabled(torch.is_grad_enabled() and (grad_frames is None or i in grad_frames)):
            x0 = x - grid[s] * dit(x, t, f, None, caches=[cache])  # (B, 1, C, h, w): the frame
        out.append(x0)
        with torch.no_grad():
            fill_cache(model, cache, x0.detach(), f)
            cache.roll(model.config.num_frames - 1)
    return torch.cat(out, 1)


def _window(net, context: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``x0`` prediction of ``net`` for the noisy new frames ``x_t`` (B, n, ...) at level ``t`` (B,) after the clean
    ``context`` (B, K, ...): one pass, context as chunk 0 (t = 0), the new frames one bidirectional chunk."""
    b, k = context.shape[:2]
    n = x_t.shape[1]
    tt = torch.cat([t.new_zeros(b, k), t[:, None].expand(b, n)], 1)
    chunks = torch.tensor([0] * k + [1] * n, device=x_t.device)
    v = net(torch.cat([context, x_t], 1), tt, torch.arange(k + n, device=x_t.device), chunks)[:, k:]
    return x_t - t.view(b, 1, 1, 1, 1) * v.float()


def _levels(b: int, t_min: float, t_max: float, device) -> torch.Tensor:
    return t_min + (t_max - t_min) * torch.rand(b, device=device)


def dmd_loss(x: torch.Tensor, context: torch.Tensor, teacher, critic, t_min: float = 0.02, t_max: float = 0.98
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """DMD on generated frames ``x`` (B, n, C, h, w; with gradient) after their ``context``.

    Returns ``(loss, grad)``: ``loss = 0.5 mean (x - sg(x - grad))^2`` whose gradient in ``x`` is ``grad / numel``,
    ``grad = (x0_fake - x0_real) / mean|x - x0_real|`` (per sample; Self-Forcing's / DMD's normaliser).
    """
    b = x.shape[0]
    with torch.no_grad():
        t = _levels(b, t_min, t_max, x.device)
        xs = x.detach().float()
        x_t = (1 - t.view(b, 1, 1, 1, 1)) * xs + t.view(b, 1, 1, 1, 1) * torch.randn_like(xs)
        real = _window(teacher, context, x_t, t)
        fake = _window(critic, context, x_t, t)
        norm = (xs - real).abs().mean(dim=(1, 2, 3, 4), keepdim=True).clamp_min(1e-6)
        grad = torch.nan_to_num((fake - real) / norm)
    loss = 0.5 * F.mse_loss(x.float(), (xs - grad).detach())
    return loss, grad


def critic_loss(critic, x: torch.Tensor, context: torch.Tensor, t_min: float = 0.02, t_max: float = 0.98
                ) -> torch.Tensor:
    """The critic's flow-matching loss on the student's (detached) frames ``x``: it learns the fake score."""
    b = x.shape[0]
    x = x.detach().float()
    t = _levels(b, t_min, t_max, x.device)
    eps = torch.randn_like(x)
    x_t = (1 - t.view(b, 1, 1, 1, 1)) * x + t.view(b, 1, 1, 1, 1) * eps
    k, n = context.shape[1], x.shape[1]
    tt = torch.cat([t.new_zeros(b, k), t[:, None].expand(b, n)], 1)
    chunks = torch.tensor([0] * k + [1] * n, device=x.device)
    v = critic(torch.cat([context, x_t], 1), tt, torch.arange(k + n, device=x.device), chunks)[:, k:]
    return (v.float() - (eps - x)).pow(2).mean()


def training_step(model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One Self-Forcing step on ``{"latents": (B, T, C, h, w)}``: roll out the window's last ``T - K`` frames from
    its first ``K = max_context`` (ground truth), DMD on them (every ``sf_gen_every`` steps), the critic's loss on
    them (every step). With ``sf_rollout_frames`` above ``T - K`` (Self-Forcing++'s long rollout) the student
    rolls out that many frames with its rolling cache and DMD / the critic score a random window of ``T - K`` of
    them after its ``K`` preceding frames (the student's own, once past the given ones); only that window's exit
    steps carry gradient. The returned ``loss`` is their sum: the two terms reach disjoint parameters (the DMD target
    and the rollout's cache carry no gradient into the critic; the critic's loss sees detached frames)."""
    cfg = model.config
    teacher = model._sf_teacher
    if teacher is None:
        raise ValueError("model.objective=self_forcing needs model.teacher_path (the frozen teacher) to train")
    z = batch["latents"].float()
    if next(teacher.parameters()).device != z.device:
        teacher.to(z.device)
    b, t_len = z.shape[:2]
    k = max(1, cfg.max_context)
    w = t_len - k  # frames DMD scores: the rest of a training window
    n = max(w, cfg.sf_rollout_frames)
    start = int(torch.randint(0, n - w + 1, ()))  # the scored window's first new frame (0 for plain Self-Forcing)
    grid = timestep_grid(cfg.sample_steps, cfg.sample_shift, device=z.device)
    exits = [cfg.sample_steps - 1] * n  # frames outside the window: the inference sampler, no gradient
    exits[start:start + w] = torch.randint(0, cfg.sample_steps, (w,)).tolist()
    gen_update = model._sf_step % cfg.sf_gen_every == 0
    model._sf_step += 1
    with torch.set_grad_enabled(gen_update and torch.is_grad_enabled()):
        video = torch.cat([z[:, :k], rollout(model, z[:, :k], n, exits, grid, grad_frames=range(start, start + w))], 1)
    context = video[:, start:start + k].detach()  # the window's K frames before it: given or the student's own
    x = video[:, start + k:start + k + w]
    out: dict[str, torch.Tensor] = {"exit_step": torch.tensor(sum(exits[start:start + w]) / w),
                                    "window_start": torch.tensor(float(start))}
    loss = critic_loss(model.critic, x, context, cfg.sf_t_min, cfg.sf_t_max)
    out["critic"] = loss.detach()
    if gen_update:
        dmd, grad = dmd_loss(x, context, teacher, model.critic, cfg.sf_t_min, cfg.sf_t_max)
        loss = loss + dmd
        out["dmd"] = dmd.detach()
        out["dmd_grad"] = grad.abs().mean()
    out["loss"] = loss
    return out
