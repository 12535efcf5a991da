"""The image-to-video policy: a pretrained latent video DiT that continues a clean first frame, with an SDE sampler
that records every step's Gaussian transition (for GRPO) and a deterministic ODE sampler (for evaluation).

Backbone: a Flex-Forcing checkpoint (``perception/video``), loaded through the model registry
(``core.pretrained.load_pretrained``) — TAGRPO is the one method that post-trains another method's model, and it
does so through the registry and the model's public interface (``dit``, ``encode``, ``decode``, ``config``)
rather than by importing the other method's code. The conditioning frame enters as one clean latent frame
(``t = 0``) that is its own, earlier chunk; the ``N`` new frames are the next chunk (one chunk: they are denoised
together, bidirectionally), exactly the layout the backbone was trained on with its clean-context prefixes.

Rollouts (``rollout``) run ``core.diffusion.sde_step`` along the grid ``1 = t_0 > t_1 > ... > t_S = 0``; a
``Trajectory`` keeps every intermediate latent ``x_i`` (``x_0`` is the initial noise), the transition means
``mu(x_i)`` and the per-step standard deviations, and the per-element mean log-probability of each step (the
Flow-GRPO normalisation: a sum over thousands of latent elements would put the PPO ratio far outside any clip
range after one update).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from core.diffusion import euler_step, sde_step, timestep_grid

__all__ = ["I2VPolicy", "Trajectory", "gaussian_logprob"]


def gaussian_logprob(sample: Tensor, mean: Tensor, std: Tensor | float) -> Tensor:
    """Per-element mean log-density of ``sample`` under ``N(mean, std^2)``, reduced over all but dim 0.

    ``std`` is a positive scalar (or broadcastable tensor); ``mean`` may carry gradients.
    """
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    elem = -((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * torch.log(torch.tensor(2 * torch.pi))
    return elem.flatten(1).mean(1)


@dataclass
class Trajectory:
    """One batch of SDE rollouts.

    Attributes:
        latents: (B, S + 1, N, C, h, w) ``x_0`` (initial noise) ... ``x_S`` (the sample), normalised latents of the
            N new frames.
        means: (B, S, N, C, h, w) mean of the transition ``x_i -> x_{i+1}`` under the sampling policy.
        stds: (S,) its standard deviation (the same for every element: one ``t`` per step).
        log_probs: (B, S) per-element mean log-probability of each sampled ``x_{i+1}``.
    """

    latents: Tensor
    means: Tensor
    stds: Tensor
    log_probs: Tensor

    @property
    def final(self) -> Tensor:
        return self.latents[:, -1]


class I2VPolicy(nn.Module):
    """Image-to-video flow policy around a pretrained video model (see the module docstring).

    Args:
        backbone: A Flex-Forcing model (``dit``, ``encode``, ``decode``, ``config``); its VAE is frozen here.
        frames: Video length with the conditioning frame (default the backbone's ``num_frames``).
        steps / shift: Sampling grid (``core.diffusion.timestep_grid``).
    """

    def __init__(self, backbone: nn.Module, frames: int | None = None, steps: int = 8, shift: float = 1.0):
        super().__init__()
        self.backbone = backbone
        self.frames = int(frames or backbone.config.num_frames)
        if self.frames < 2:
            raise ValueError(f"frames must be >= 2, got {self.frames}")
        self.steps, self.shift = steps, shift
        self.register_buffer("grid", timestep_grid(steps, shift), persistent=False)
        backbone.vae.requires_grad_(False)

    @classmethod
    def from_config(cls, cfg, weights: str | None = None) -> I2VPolicy:
        """Load ``cfg.base_path`` (a ``TAGRPOModelConfig``) through the model registry; optionally replace its
        weights by a post-trained ``model.safetensors`` (a checkpoint folder or a saved policy)."""
        from core.pretrained import load_pretrained

        backbone = load_pretrained(cfg.base_path)
        if weights is not None:
            from core.checkpoint import load_into, load_weights, resolve_checkpoint

            path = resolve_checkpoint(weights) / "model.safetensors"
            load_into(backbone, load_weights(path), source=str(path))
        return cls(backbone, cfg.frames, cfg.sample_steps, cfg.sample_shift)

    # -- shapes -------------------------------------------------------------------------------------------
    @property
    def new_frames(self) -> int:
        return self.frames - 1

    def latent_shape(self) -> tuple[int, int, int, int]:
        """(N, C, h, w) of the generated latents."""
        c = self.backbone.config
        return (self.new_frames, c.latent_channels, c.latent_size, c.latent_size)

    def trainable(self) -> nn.Module:
        """The post-trained part: the DiT."""
        return self.backbone.dit

    # -- conditioning and pixels ------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_first(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) uint8 conditioning images -> (B, 1, C, h, w) normalised latents."""
        s = self.backbone.config.frame_size
        if images.ndim != 4 or images.shape[1] != 3 or tuple(images.shape[-2:]) != (s, s):
            raise ValueError(f"conditioning images must be (B, 3, {s}, {s}), got {tuple(images.shape)}")
        return self.backbone.encode(images[:, None])

    @torch.no_grad()
    def decode_video(self, images: Tensor, latents: Tensor) -> Tensor:
        """The video (B, F, 3, H, W) uint8: the given first frame (exactly) followed by the decoded new frames."""
        new = self.backbone.decode(latents)
        return torch.cat([images[:, None].to(new.device), new], 1)

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """(n, N, C, h, w) standard-normal initial latents (drawn on the CPU generator: device independent)."""
        return torch.randn(n, *self.latent_shape(), generator=generator).to(self.grid.device)

    # -- the flow ---------------------------------------------------------------------------------------------
    def velocity(self, first: Tensor, x: Tensor, t: Tensor | float) -> Tensor:
        """Velocity of the new frames ``x`` (B, N, C, h, w) at shared level ``t`` given the first-frame latent."""
        b, n = x.shape[:2]
        if first.shape[0] != b or first.shape[1] != 1:
            raise ValueError(f"first must be (B={b}, 1, C, h, w), got {tuple(first.shape)}")
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        tt = torch.cat([torch.zeros(b, 1, device=x.device, dtype=x.dtype), t.reshape(-1, 1).expand(b, n)], 1)
        frames = torch.arange(n + 1, device=x.device)
        chunks = torch.ones(n + 1, dtype=torch.long, device=x.device)
        chunks[0] = 0
        return self.backbone.dit(torch.cat([first.to(x.dtype), x], 1), tt, frames, chunks)[:, 1:]

    def transition(self, first: Tensor, x: Tensor, i: int, eta: float) -> tuple[Tensor, Tensor]:
        """Mean (with gradients through the DiT) and std of the SDE transition ``x_i -> x_{i+1}`` at step ``i``."""
        v = self.velocity(first, x, self.grid[i])
        st = sde_step(x, v, self.grid[i], self.grid[i + 1], eta=eta, prev_sample=x)
        return st.mean.to(x.dtype), st.std.reshape(())

    @torch.no_grad()
    def rollout(self, first: Tensor, noise: Tensor, eta: float, generator: torch.Generator | None = None
                ) -> Trajectory:
        """SDE rollouts from initial ``noise`` (B, N, C, h, w), recording the trajectory (see ``Trajectory``)."""
        x = noise
        latents, means, stds, logps = [x], [], [], []
        for i in range(self.steps):
            v = self.velocity(first, x, self.grid[i])
            st = sde_step(x, v, self.grid[i], self.grid[i + 1], eta=eta, generator=generator)
            mean = st.mean.to(x.dtype)
            x = st.prev_sample
            std = st.std.reshape(())
            latents.append(x)
            means.append(mean)
            stds.append(std)
            logps.append(st.log_prob / x[0].numel())  # sde_step's summed log-density, as a per-element mean
        return Trajectory(torch.stack(latents, 1), torch.stack(means, 1), torch.stack(stds), torch.stack(logps, 1))

    @torch.no_grad()
    def sample(self, first: Tensor, noise: Tensor) -> Tensor:
        """Deterministic ODE (Euler) sample from ``noise``: the evaluation sampler."""
        x = noise
        for i in range(self.steps):
            x = euler_step(x, self.velocity(first, x, self.grid[i]), self.grid[i], self.grid[i + 1])
        return x
