"""Inference pipeline of TransNormal: pre-/post-processing, tiling, and the samplers.

``TransNormalPipeline(model)(images)`` returns normal maps for images of any size:

* single step (``model.config.mode == "single_step"``, TransNormal): RGB latent -> one UNet pass at
  t = ``config.timestep`` -> VAE decode -> unit normals. Costs one VAE encode, one UNet pass, one
  decode (and one DINOv3 pass).
* multi-step (``mode == "diffusion"``, the Marigold-style baseline): start from Gaussian noise in the
  normal latent, run N DDIM steps (``timestep_spacing="trailing"``) of the UNet conditioned on the RGB
  latent (channel concatenation) and the same context, decode the result. The sampling loop lives here,
  not in the model (diffusers' split of models, schedulers and pipelines); each step is diffusers'
  ``DDIMScheduler.step``.

Why the multi-step arm is not diffusers' ``MarigoldNormalsPipeline`` (diffusers 0.42.1; checked, issue #21):
the latent layout matches (RGB latent concatenated to the noisy normal latent, v-prediction, DDIM with
trailing spacing), but the conditioning does not. (1) Marigold calls ``unet(latent, t,
encoder_hidden_states=text)`` without ``class_labels``, while TransNormal's UNet has the "projection" class
embedding (the normals / RGB task switch) and then refuses to run: ``ValueError: class_labels should be
provided when num_class_embeds > 0``. (2) Its ``encoder_hidden_states`` is ONE cached empty-prompt text
embedding repeated over the batch; TransNormal needs each image's own DINOv3 tokens. (3) It scales latents
by ``vae.config.scaling_factor`` (TransNormal: the model's ``latent_scale``, measured on the VAE stage)
and clips the decoded map to [-1, 1] before normalising (TransNormal normalises the raw output). So the
loop stays here; ``tests/perception/normals/test_pipeline.py`` shows the Marigold pipeline failing on the
project's UNet and this sampler equal to a ``DDIMScheduler``-driven reference loop to 1e-6 (and to the DDIM
update written out in float64 to 1e-4).

Images are resized so the longest side is ``processing_res`` (sides rounded to the model's
``size_multiple``) and predictions are resized back to the input size and re-normalised — or, with
``tile`` set, processed at native resolution in overlapping tiles blended with a feathered window.
Output normals: (B, 3, H, W) float32 unit vectors, OpenCV camera frame (x right, y down, z forward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from perception.normals.modeling_transnormal import TransNormalModel, to_unit_range


@dataclass
class NormalsOutput:
    """``normals``: (B, 3, H, W) float32 unit vectors, OpenCV camera frame, at the input size."""

    normals: torch.Tensor


class TransNormalPipeline:
    """Normal maps from RGB images with a ``TransNormalModel``.

    Args:
        model: A trained model (moved to ``device``, eval mode).
        device: Torch device; the model's when None.
        dtype: Compute dtype under autocast (``torch.bfloat16`` on CUDA as in the paper; fp16 gives NaNs in
            DINOv3); None computes in float32.
    """

    def __init__(self, model: TransNormalModel, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None):
        self.model = model.eval()
        if device is not None:
            self.model.to(device)
        self.device = next(model.parameters()).device
        self.dtype = dtype
        self._scheduler = None  # the diffusion baseline's DDIM scheduler, built on first use

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None, use_ema: bool | None = None) -> TransNormalPipeline:
        """Load an exported model, a run or a checkpoint directory (e.g. ``assets/checkpoints/transnormal``).

        Weights are the EMA ones when the folder has them (``use_ema=None``); ``dtype`` is the autocast dtype
        on CUDA (the weights stay float32).
        """
        return cls(TransNormalModel.from_pretrained(path, use_ema=use_ema, device=device), dtype=dtype)

    @property
    def default_steps(self) -> int:
        """1 for single-step models, ``config.inference_steps`` for the diffusion baseline."""
        c = self.model.config
        return 1 if c.mode == "single_step" else c.inference_steps

    # -- samplers --------------------------------------------------------------------------------
    def _autocast(self):
        if self.dtype is None or self.device.type != "cuda":
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast("cuda", dtype=self.dtype)

    @torch.no_grad()
    def predict(self, x: torch.Tensor, num_steps: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, 3, H, W) float [-1, 1] with sides multiples of ``size_multiple`` -> (B, 3, H, W) unit normals."""
        m = self.model
        with self._autocast():
            z_rgb = m.encode(x)
            ctx = m.context(x)
            if m.config.mode == "single_step":
                z = m.denoise(z_rgb, m.config.timestep, ctx, "normals")
            else:
                z = self._sample(z_rgb, ctx, num_steps or m.config.inference_steps, generator)
            out = m.decode(z).float()
        return F.normalize(out, dim=1, eps=1e-6)

    def _sample(self, z_rgb: torch.Tensor, ctx: torch.Tensor, steps: int,
                generator: torch.Generator | None) -> torch.Tensor:
        m = self.model
        sched = self._ddim_scheduler()
        sched.set_timesteps(steps, device=z_rgb.device)  # resets the timesteps: reusing the scheduler is exact
        z = torch.randn(z_rgb.shape, generator=generator, device="cpu").to(z_rgb.device, z_rgb.dtype)
        for t in sched.timesteps:
            out = m.denoise(torch.cat([z_rgb, z], 1), t, ctx, "normals")
            z = sched.step(out, t, z).prev_sample
        return z

    def _ddim_scheduler(self):
        """The DDIM scheduler (built once per pipeline; ``set_timesteps`` is called on every sample)."""
        if self._scheduler is None:
            from diffusers import DDIMScheduler

            c = self.model.config
            self._scheduler = DDIMScheduler(
                num_train_timesteps=c.num_train_timesteps, beta_start=0.00085, beta_end=0.012,
                beta_schedule="scaled_linear", prediction_type=c.prediction_type, timestep_spacing="trailing",
                set_alpha_to_one=False, clip_sample=False)
        return self._scheduler

    # -- images of any size ----------------------------------------------------------------------
    def __call__(self, images: torch.Tensor | np.ndarray | list[np.ndarray], num_steps: int | None = None,
                 processing_res: int | None = None, tile: int | None = None, batch_size: int = 8,
                 seed: int = 0) -> NormalsOutput:
        """Normal maps at the input size.

        Args:
            images: (B, 3, H, W) uint8 / [-1, 1] float tensor, or (H, W, 3) uint8 array(s) (one size per call
                when batched as a tensor; a list may mix sizes).
            num_steps: DDIM steps of the diffusion baseline (ignored by single-step models).
            processing_res: Longest side the model sees (default ``config.processing_res`` or
                ``config.image_size``); ignored when tiling.
            tile: Tile side in pixels (rounded to ``size_multiple``): process at native resolution in tiles
                overlapping by a quarter, blended with a feathered window.
            batch_size: Images (or tiles) per forward pass.
            seed: Seed of the diffusion baseline's initial noise.
        """
        if isinstance(images, list):
            outs = [self(img, num_steps, processing_res, tile, batch_size, seed).normals for img in images]
            return NormalsOutput(outs[0] if len(outs) == 1 else _stack_or_list(outs))
        x = _as_batch(images).to(self.device)
        generator = torch.Generator().manual_seed(seed)
        if tile is not None:
            return NormalsOutput(torch.cat([self._tiled(x[i: i + 1], tile, num_steps, generator, batch_size)
                                            for i in range(x.shape[0])]))
        c = self.model.config
        res = processing_res or c.processing_res or c.image_size
        H, W = x.shape[-2:]
        mult = c.size_multiple
        scale = res / max(H, W)
        h, w = (max(mult, int(round(s * scale / mult)) * mult) for s in (H, W))
        xs = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=True) if (h, w) != (H, W) \
            else x
        preds = torch.cat([self.predict(xs[i: i + batch_size], num_steps, generator)
                           for i in range(0, xs.shape[0], batch_size)])
        if (h, w) != (H, W):
            preds = F.normalize(F.interpolate(preds, size=(H, W), mode="bilinear", align_corners=False), dim=1)
        return NormalsOutput(preds.cpu())

    def _tiled(self, x: torch.Tensor, tile: int, num_steps: int | None, generator: torch.Generator,
               batch_size: int) -> torch.Tensor:
        mult = self.model.config.size_multiple
        tile = max(mult, int(round(tile / mult)) * mult)
        _, _, H, W = x.shape
        Hp, Wp = max(H, tile), max(W, tile)
        Hp, Wp = math.ceil(Hp / mult) * mult, math.ceil(Wp / mult) * mult
        xp = F.pad(x, (0, Wp - W, 0, Hp - H), mode="replicate")
        stride = max(mult, (tile * 3 // 4) // mult * mult)
        ys = _starts(Hp, tile, stride)
        xs = _starts(Wp, tile, stride)
        ramp = torch.minimum(torch.arange(tile) + 1, torch.arange(tile).flip(0) + 1).float()
        window = torch.minimum(ramp[:, None], ramp[None, :]).clamp(max=tile / 4).to(x.device)
        acc = torch.zeros(1, 3, Hp, Wp, device=x.device)
        weight = torch.zeros(1, 1, Hp, Wp, device=x.device)
        coords = [(y, x0) for y in ys for x0 in xs]
        for i in range(0, len(coords), batch_size):
            chunk = coords[i: i + batch_size]
            crops = torch.cat([xp[..., y: y + tile, x0: x0 + tile] for y, x0 in chunk])
            preds = self.predict(crops, num_steps, generator)
            for (y, x0), p in zip(chunk, preds):
                acc[..., y: y + tile, x0: x0 + tile] += p * window
                weight[..., y: y + tile, x0: x0 + tile] += window
        out = acc / weight.clamp_min(1e-8)
        return F.normalize(out[..., :H, :W], dim=1).cpu()


def _starts(size: int, tile: int, stride: int) -> list[int]:
    if size <= tile:
        return [0]
    starts = list(range(0, size - tile, stride))
    return [*starts, size - tile]


def _as_batch(images: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(images, np.ndarray):
        if images.ndim != 3 or images.shape[2] not in (3, 4):
            raise ValueError(f"expected an (H, W, 3) image, got {images.shape}")
        images = torch.from_numpy(np.array(images[..., :3])).permute(2, 0, 1)[None]  # a writable copy
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected (B, 3, H, W) images, got {tuple(images.shape)}")
    return to_unit_range(images)


def _stack_or_list(outs: list[torch.Tensor]):
    if all(o.shape == outs[0].shape for o in outs):
        return torch.cat(outs)
    return outs
