"""Image and video auto-encoders for latent diffusion.

A diffusers ``AutoencoderKL`` (per-frame 2-D) or ``AutoencoderKLWan`` (causal 3-D video VAE of Wan2.1) built from
sizes or a local folder, weight loading from a diffusers folder (a pipeline folder's ``vae/`` too) or a project
checkpoint, and training wrappers for the core Trainer.

At tiny scale nothing pretrained is installed (no SD / TAESD VAE, see ENV.md), so methods train the VAE here
as stage 1 (``AutoencoderTrainer``); at paper scale ``path`` points at a real diffusers VAE folder and the
same class loads it. Latents are normalised by the caller with per-channel statistics measured on data.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.errors import CheckpointError, ConfigError

__all__ = ["AutoencoderTrainer", "FrameDiverseClips", "VideoAutoencoderTrainer", "build_autoencoder_kl",
           "build_autoencoder_kl_wan", "load_autoencoder_weights", "to_signed_unit", "wan21_vae_size", "wan_decode",
           "wan_encode", "wan_factors", "wan_latent_frames", "wan_latent_stats", "wan_video_frames"]

_DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model.safetensors", "model.safetensors")


def to_signed_unit(x: torch.Tensor) -> torch.Tensor:
    """Integer [0, 255] images (uint8) -> float32 in [-1, 1]; float images are taken to be in [0, 1]."""
    if not torch.is_floating_point(x):
        return x.float() / 127.5 - 1.0
    return x.float() * 2 - 1


def build_autoencoder_kl(block_out_channels: Sequence[int] = (32, 64, 64), latent_channels: int = 4,
                         layers_per_block: int = 1, norm_num_groups: int = 8, sample_size: int = 32,
                         path: str | Path | None = None, scaling_factor: float = 0.18215) -> nn.Module:
    """A diffusers ``AutoencoderKL`` (downsampling ``2 ** (len(block_out_channels) - 1)``).

    With ``path`` a diffusers VAE folder (``config.json`` of an ``AutoencoderKL``), its architecture is used
    instead of the sizes (weights are loaded separately by ``load_autoencoder_weights``).
    """
    from diffusers import AutoencoderKL

    if path is not None and (Path(path) / "config.json").is_file():
        cfg = dict(AutoencoderKL.load_config(str(path)))
        if cfg.get("_class_name", "AutoencoderKL") == "AutoencoderKL" and "latent_channels" in cfg:
            return AutoencoderKL.from_config(cfg)
    n = len(block_out_channels)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * n,
                         up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=tuple(block_out_channels),
                         layers_per_block=layers_per_block, latent_channels=latent_channels,
                         norm_num_groups=norm_num_groups, sample_size=sample_size, scaling_factor=scaling_factor)


def load_autoencoder_weights(vae: nn.Module, path: str | Path, prefix: str = "vae.") -> float | None:
    """Load ``vae`` from a diffusers folder or from a project checkpoint / run directory.

    A diffusers folder holds ``config.json`` + ``diffusion_pytorch_model.safetensors`` (a pipeline folder's
    ``vae/`` is used when ``path`` is the pipeline); a checkpoint's ``model.safetensors`` holds ``<prefix>*`` keys
    (a stage-1 run, or a whole model that contains the VAE). A diffusers config naming another class than
    ``vae``'s, and any key or shape that does not match, is a ``CheckpointError`` naming them. Nothing is written.

    Returns:
        The latent scale the source states: a diffusers ``AutoencoderKL`` folder's ``scaling_factor`` (a Wan
        folder states per-channel statistics instead, see ``wan_latent_stats``: None); a checkpoint's scalar
        ``latent_std`` buffer (as ``1 / latent_std``) or ``latent_scale``; None when it states none.
    """
    import json

    from core.checkpoint import load_into, load_weights, resolve_checkpoint

    path = Path(path)
    if not (path / "config.json").is_file() and (path / "vae" / "config.json").is_file():
        path = path / "vae"  # a diffusers pipeline folder
    if (path / "config.json").is_file() and not (path / "training_state.json").exists():
        for name in _DIFFUSERS_WEIGHTS:
            f = path / name
            if f.is_file() and not any(k.startswith(prefix) for k in _keys(f)):
                cfg = json.loads((path / "config.json").read_text())
                cls = cfg.get("_class_name", type(vae).__name__)
                if cls != type(vae).__name__:
                    raise CheckpointError(f"{path}: config.json names {cls}, not the {type(vae).__name__} "
                                          "it is loaded into")
                load_into(vae, load_weights(f), str(f))
                if cls == "AutoencoderKLWan":
                    return None
                return float(cfg.get("scaling_factor", 0.18215))
    ckpt = resolve_checkpoint(path)
    sd = load_weights(ckpt / "model.safetensors")
    sub = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    if not sub:
        raise CheckpointError(f"{ckpt}: holds no {prefix}* weights")
    load_into(vae, sub, str(ckpt))
    if "latent_std" in sd and sd["latent_std"].numel() == 1:
        return float(1.0 / sd["latent_std"].clamp_min(1e-6))
    if "latent_scale" in sd and sd["latent_scale"].numel() == 1:
        return float(sd["latent_scale"])
    return None


def _keys(file: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        return set(f.keys())


class AutoencoderTrainer(nn.Module):
    """Stage 1: ``vae`` trained as an auto-encoder (L1 + ``kl_weight`` x KL) on the images under ``key``.

    ``sample_posterior=False`` decodes the posterior mean (a deterministic auto-encoder; the KL term then only
    keeps the latents small): at tiny scale and few steps it reconstructs far better than decoding samples,
    whose noise (std 1 until the encoder learns to shrink it) the decoder must first learn to ignore.

    ``batch[key]`` is (B, ..., 3, H, W) uint8 or float; leading dims (e.g. frames) are flattened. The weights
    are saved under ``vae.*`` so ``load_autoencoder_weights(run_dir)`` reads them back.
    """

    def __init__(self, vae: nn.Module, key: str = "video", kl_weight: float = 1e-6, sample_posterior: bool = True):
        super().__init__()
        self.vae, self.key, self.kl_weight, self.sample_posterior = vae, key, kl_weight, sample_posterior

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The loss (L1 reconstruction + ``kl_weight`` KL) of one batch, with its terms for logging."""
        x = batch[self.key]
        x = to_signed_unit(x.reshape(-1, *x.shape[-3:]))
        post = self.vae.encode(x).latent_dist
        z = post.sample() if self.sample_posterior else post.mode()
        rec = self.vae.decode(z).sample.float()
        loss_rec = (rec - x).abs().mean()
        kl = post.kl().mean() / z[0].numel()
        return {"loss": loss_rec + self.kl_weight * kl, "loss_rec": loss_rec.detach(), "kl": kl.detach()}


# ----------------------------------------------------------------------------------------------
# Wan video VAE (diffusers ``AutoencoderKLWan``)
#
# Wan's VAE is causal in time: every 3-D convolution pads only the past, and the video is encoded chunk by chunk
# with each convolution's last frames cached, so a latent frame depends on the video frames up to its own last
# one. The first video frame is encoded alone (one latent frame), then every ``r`` frames give one more
# (``r = 2 ** sum(temperal_downsample)``, 4 in Wan2.1): ``T = 1 + r k`` video frames <-> ``F = 1 + k`` latent
# frames. diffusers' ``encode`` always steps 4 frames at a time (it drops frames of a VAE with r != 4 unless
# T = 1 mod 4); the loops here step ``r * max(1, 4 // r)`` frames, which gives the same result for every r.


def wan_latent_frames(num_video_frames: int, temporal_factor: int) -> int:
    """Latent frames of ``num_video_frames`` = ``1 + r k`` video frames: ``1 + k`` (``ConfigError`` otherwise)."""
    t, r = int(num_video_frames), int(temporal_factor)
    if r < 1 or t < 1 or (t - 1) % r:
        raise ConfigError(f"{num_video_frames} video frames: Wan's VAE (temporal factor {temporal_factor}) needs "
                          f"1 + {temporal_factor} k frames (the first alone, then groups of {temporal_factor})")
    return 1 + (t - 1) // r


def wan_video_frames(num_latent_frames: int, temporal_factor: int) -> int:
    """Video frames that ``num_latent_frames`` = ``F`` latent frames decode to: ``1 + (F - 1) r``."""
    if int(num_latent_frames) < 1 or int(temporal_factor) < 1:
        raise ConfigError(f"latent frames and temporal factor must be >= 1, got {num_latent_frames} and "
                          f"{temporal_factor}")
    return 1 + (int(num_latent_frames) - 1) * int(temporal_factor)


def wan_factors(vae: nn.Module) -> tuple[int, int]:
    """``(temporal, spatial)`` compression factors of an ``AutoencoderKLWan``.

    ``2 ** sum(temperal_downsample)`` and ``2 ** (len(dim_mult) - 1)`` (times ``patch_size`` for a Wan2.2-style
    patchified VAE).
    """
    cfg = vae.config
    levels = len(cfg.dim_mult) - 1  # the encoder reads temperal_downsample[i] for these levels only
    temporal = 2 ** sum(bool(t) for t in list(cfg.temperal_downsample)[:levels])
    return temporal, 2 ** levels * int(cfg.patch_size or 1)


def wan_latent_stats(vae: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The per-channel ``(latents_mean, latents_std)`` (each (C,) float32) a Wan VAE's config states, or None.

    None when they are missing, not ``z_dim`` long or not positive (a VAE built here from sizes states none; the
    caller measures them on data).
    """
    cfg = vae.config
    mean, std = getattr(cfg, "latents_mean", None), getattr(cfg, "latents_std", None)
    if mean is None or std is None or len(mean) != cfg.z_dim or len(std) != cfg.z_dim:
        return None
    mean_t, std_t = torch.tensor(list(mean), dtype=torch.float32), torch.tensor(list(std), dtype=torch.float32)
    if not bool((std_t > 0).all()):
        return None
    return mean_t, std_t


def _wan_config(path: str | Path) -> dict[str, Any] | None:
    """The ``AutoencoderKLWan`` config under ``path`` (a VAE folder or a pipeline folder's ``vae/``).

    None when ``path`` holds no diffusers model config (e.g. a project run directory); a config of another class
    is a ``ConfigError``.
    """
    import json

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such VAE folder")
    for folder in (path, path / "vae"):
        f = folder / "config.json"
        if not f.is_file():
            continue
        try:
            cfg = json.loads(f.read_text())
        except ValueError as e:
            raise CheckpointError(f"{f}: not valid JSON ({e})") from None
        if "_class_name" not in cfg:
            continue  # a project checkpoint's config, not a diffusers model's
        if cfg["_class_name"] != "AutoencoderKLWan":
            raise ConfigError(f"{f}: names {cfg['_class_name']}, not an AutoencoderKLWan (a Wan video VAE)")
        return cfg
    return None


def build_autoencoder_kl_wan(base_dim: int = 16, z_dim: int = 8, dim_mult: Sequence[int] = (1, 2),
                             num_res_blocks: int = 1, temporal_downsample: Sequence[bool] = (True,),
                             path: str | Path | None = None) -> nn.Module:
    """A diffusers ``AutoencoderKLWan``: a causal 3-D video VAE.

    Spatial factor ``2 ** (len(dim_mult) - 1)``, temporal factor ``2 ** sum(temporal_downsample)`` (one flag per
    downsampling level).

    With ``path`` a Wan VAE folder (``config.json`` naming ``AutoencoderKLWan``) or a pipeline folder holding
    ``vae/config.json``, that config gives the architecture and the sizes are ignored; the folder is only read
    (weights: ``load_autoencoder_weights``). Built from sizes, the config states no latent statistics
    (``latents_mean`` / ``latents_std`` empty: measure them on data).
    """
    from diffusers import AutoencoderKLWan

    if path is not None:
        cfg = _wan_config(path)
        if cfg is not None:
            return AutoencoderKLWan.from_config(cfg)
    dim_mult, temporal_downsample = [int(m) for m in dim_mult], [bool(t) for t in temporal_downsample]
    if base_dim < 1 or z_dim < 1 or num_res_blocks < 1 or not dim_mult or min(dim_mult) < 1:
        raise ConfigError(f"Wan VAE sizes must be >= 1, got base_dim={base_dim} z_dim={z_dim} "
                          f"num_res_blocks={num_res_blocks} dim_mult={dim_mult}")
    if len(temporal_downsample) != len(dim_mult) - 1:
        raise ConfigError(f"temporal_downsample needs one flag per downsampling level ({len(dim_mult) - 1} for "
                          f"dim_mult={dim_mult}), got {temporal_downsample}")
    return AutoencoderKLWan(base_dim=base_dim, z_dim=z_dim, dim_mult=dim_mult, num_res_blocks=num_res_blocks,
                            temperal_downsample=temporal_downsample, latents_mean=[], latents_std=[],
                            scale_factor_temporal=2 ** sum(temporal_downsample),
                            scale_factor_spatial=2 ** (len(dim_mult) - 1))


def wan21_vae_size() -> int:
    """Parameters of the default (Wan2.1) ``AutoencoderKLWan()``, built on the meta device (nothing allocated)."""
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        vae = AutoencoderKLWan()
    return sum(p.numel() for p in vae.parameters())


class _Slots:
    """A fixed-length mutable sequence that is not a ``list``: Wan's causal feature cache and its cursor.

    Wan's blocks update the cache (``feat_cache[i] = ...``) and its cursor (``feat_idx[0] += 1``) in place, for
    the caller to see. A block that FSDP2 shards (``fully_shard``) gets its arguments rebuilt first: a copy of every
    ``list`` / ``tuple`` / ``dict`` argument when it casts inputs to the mixed-precision dtype, and of any holding a
    tensor that requires grad when it registers its backward hook. The block then updates the copies, and the
    caller's cache goes stale: with bf16 the cursor is lost and the next block reads another convolution's
    features (``Sizes of tensors must match``); in fp32 the cached frames are lost, silently (the resampling
    ``time_conv`` of later chunks never runs). FSDP passes any other object through as it is.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Sequence[Any]):
        self._items = list(items)

    def __getitem__(self, i: int) -> Any:
        return self._items[i]

    def __setitem__(self, i: int, value: Any) -> None:
        self._items[i] = value

    def __len__(self) -> int:
        return len(self._items)


def _causal_pass(net: nn.Module, x: torch.Tensor, sizes: Sequence[int], decoder: bool) -> torch.Tensor:
    """Run Wan's encoder / decoder over ``x`` (B, C, T, H, W) chunk by chunk, ``sizes`` frames each.

    With its causal feature cache, as diffusers' ``_encode`` / ``_decode`` do; a fresh cache, so calls are
    independent (and re-entrant). The cache and its cursor are ``_Slots``, not lists, so that they stay shared
    when the blocks are FSDP units (see ``_Slots``).
    """
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    cache = _Slots([None] * sum(isinstance(m, WanCausalConv3d) for m in net.modules()))
    outs, t = [], 0
    for i, n in enumerate(sizes):
        kwargs = {"first_chunk": True} if decoder and i == 0 else {}
        outs.append(net(x[:, :, t:t + n], feat_cache=cache, feat_idx=_Slots([0]), **kwargs))
        t += n
    return torch.cat(outs, 2)


def _wan_moments(vae: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, 3, T, H, W) in [-1, 1] -> the posterior's (B, 2 C, F, h, w) mean and log-variance."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

    r, s = wan_factors(vae)
    t = x.shape[2]
    wan_latent_frames(t, r)
    if x.shape[-2] % s or x.shape[-1] % s:
        raise ConfigError(f"frame size {tuple(x.shape[-2:])}: must be a multiple of the VAE's spatial factor {s}")
    if vae.config.patch_size is not None:
        x = patchify(x, patch_size=vae.config.patch_size)
    step = r * max(1, 4 // r)
    sizes = [1] + [min(step, t - s0) for s0 in range(1, t, step)]
    return vae.quant_conv(_causal_pass(vae.encoder, x, sizes, decoder=False))


def _wan_decode_signed(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """(B, C, F, h, w) latents -> (B, 3, T, H, W) float, unclamped (training needs the gradient beyond [-1, 1])."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    out = _causal_pass(vae.decoder, vae.post_quant_conv(z), [1] * z.shape[2], decoder=True)
    if vae.config.patch_size is not None:
        out = unpatchify(out, patch_size=vae.config.patch_size)
    return out


def _param(vae: nn.Module) -> torch.Tensor:
    return next(vae.parameters())


@torch.no_grad()
def wan_encode(vae: nn.Module, video: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Video (B, T, 3, H, W) -> the posterior mode (B, F, C, h, w) float32, F = 1 + k.

    ``video`` is uint8, or float in [0, 1]; T = 1 + r k; H, W multiples of the spatial factor. ``chunk`` clips
    go through the VAE per call (all when None). No gradient.
    """
    if video.ndim != 5 or video.shape[2] != 3:
        raise ConfigError(f"wan_encode: video must be (B, T, 3, H, W), got {tuple(video.shape)}")
    p = _param(vae)
    c = vae.config.z_dim
    outs = []
    for part in video.split(chunk or len(video)):
        x = to_signed_unit(part.to(p.device)).to(p.dtype).permute(0, 2, 1, 3, 4)  # (B, 3, T, H, W)
        outs.append(_wan_moments(vae, x)[:, :c].float().permute(0, 2, 1, 3, 4))
    return torch.cat(outs)


@torch.no_grad()
def wan_decode(vae: nn.Module, latents: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Latents (B, F, C, h, w) -> video (B, T, 3, H, W) uint8, T = 1 + (F - 1) r; ``chunk`` clips per call."""
    if latents.ndim != 5 or latents.shape[2] != vae.config.z_dim:
        raise ConfigError(f"wan_decode: latents must be (B, F, {vae.config.z_dim}, h, w), got "
                          f"{tuple(latents.shape)}")
    p = _param(vae)
    outs = []
    for part in latents.split(chunk or len(latents)):
        x = _wan_decode_signed(vae, part.to(p.device, p.dtype).permute(0, 2, 1, 3, 4))
        outs.append(((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 1, 3, 4))
    return torch.cat(outs)


def _frame_local_conv_forward(self: nn.Module, input: torch.Tensor, weight: torch.Tensor,
                              bias: torch.Tensor | None) -> torch.Tensor:
    """``Conv3d._conv_forward`` of a frame-local convolution (``_frame_local``): past taps get no gradient.

    The weight's gradient is masked to its current slice, so the past taps stay at zero. The gradient hook goes on
    the tensor the convolution is given, the first time it is given it: in one process the parameter itself (as a
    hook registered on it up front would be), under FSDP2 the gathered weight that FSDP swaps in for the forward
    and backward (a hook on the registered parameter never runs there, and the past taps would train), after
    ``Trainer.release`` the new full parameter.
    """
    if weight.requires_grad and (self.frame_local_hooked is None or self.frame_local_hooked() is not weight):
        weight.register_hook(lambda g, m=self: g * m.frame_local_mask.to(g.device, g.dtype))
        self.frame_local_hooked = weakref.ref(weight)
    return nn.Conv3d._conv_forward(self, input, weight, bias)


def _frame_local(vae: nn.Module) -> int:
    """Keep every causal 3-D convolution of ``vae`` frame-local, except the resampling ones' ``time_conv``.

    The past taps (all temporal slices but the last) of those convolutions are zeroed, the current slice scaled
    by ``sqrt(k_t)`` to keep the output variance (Wan inflates its 3-D VAE from a 2-D one the same way, current
    slice only), and a gradient hook on the weight each such convolution is given (``_frame_local_conv_forward``)
    keeps the past taps at zero during training, under FSDP too. The resampling ``time_conv`` start as the
    identity in time (downsampling: the mean of a latent frame's two video frames; upsampling: the latent frame
    repeated), so the VAE starts as a per-frame one. Returns how many convolutions were made frame-local.
    """
    import math

    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, WanResample

    keep = set()
    with torch.no_grad():
        for m in vae.modules():
            if not (isinstance(m, WanResample) and hasattr(m, "time_conv")):
                continue
            keep.add(id(m.time_conv))
            w = m.time_conv.weight  # (C_out, C, 3, 1, 1)
            eye = torch.eye(w.shape[1], dtype=w.dtype, device=w.device)
            w.zero_()
            m.time_conv.bias.zero_()
            if m.mode == "downsample3d":  # latent frame j: the mean of its two video frames 2j - 1, 2j
                w[:, :, 1, 0, 0] = w[:, :, 2, 0, 0] = 0.5 * eye
            else:  # upsample3d: both output frames start as the current latent frame
                w[:w.shape[1], :, 2, 0, 0] = w[w.shape[1]:, :, 2, 0, 0] = eye
    n = 0
    for m in vae.modules():
        if not isinstance(m, WanCausalConv3d) or id(m) in keep or m.weight.shape[2] < 2:
            continue
        kt = m.weight.shape[2]
        mask = torch.zeros_like(m.weight)
        mask[:, :, -1] = 1.0
        with torch.no_grad():
            m.weight[:, :, -1] *= math.sqrt(kt)
            m.weight.mul_(mask)
        m.register_buffer("frame_local_mask", mask, persistent=False)  # not a weight: checkpoints are unchanged
        m.frame_local_hooked = None  # a weak reference to the weight tensor that has the gradient hook
        m._conv_forward = types.MethodType(_frame_local_conv_forward, m)
        n += 1
    return n


class VideoAutoencoderTrainer(nn.Module):
    """Stage 1 for a Wan video VAE: ``vae`` trained as an auto-encoder (L1 + ``kl_weight`` x KL).

    ``batch[key]`` holds the clips, (B, T, 3, H, W) uint8 or float in [0, 1], T = 1 + r k.

    The reconstruction is compared unclamped (diffusers' ``decode`` clamps to [-1, 1], which would stop the
    gradient of a pixel pushed past it); ``sample_posterior=False`` decodes the posterior mean (see
    ``AutoencoderTrainer``). The KL is the mean per latent element. The weights are saved under ``vae.*`` so
    ``load_autoencoder_weights(run_dir)`` reads them back.

    ``temporal_mixing="resample"`` is for a VAE trained from scratch on clips shorter than the videos it will
    encode: every 3-D convolution but the resampling ones' ``time_conv`` is made frame-local (its past taps
    zeroed, then held at zero; this changes the weights, so never on a pretrained VAE). Wan's VAE mixes time in
    every convolution, over a causal receptive field of ~30 frames; trained here on 5-frame clips it learns the
    zero padding at a clip's start and fails beyond it (measured: frames 10-65 of the held-out clips at 9 dB,
    frames 0-4 at 19 dB, after 150 steps). Frame-local, a latent frame sees only the video frames of its own
    resampling window, which every short training clip covers. ``"all"`` trains every tap.
    """

    def __init__(self, vae: nn.Module, key: str = "video", kl_weight: float = 1e-6, sample_posterior: bool = False,
                 temporal_mixing: str = "all"):
        super().__init__()
        if temporal_mixing not in ("all", "resample"):
            raise ConfigError(f"temporal_mixing must be 'all' or 'resample', got {temporal_mixing!r}")
        self.vae, self.key, self.kl_weight, self.sample_posterior = vae, key, kl_weight, sample_posterior
        self.temporal_mixing = temporal_mixing
        if temporal_mixing == "resample":
            _frame_local(vae)

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The loss (L1 reconstruction + ``kl_weight`` KL) of one batch of clips, with its terms for logging."""
        video = batch[self.key]
        if video.ndim != 5 or video.shape[2] != 3:
            raise ConfigError(f"batch[{self.key!r}] must be (B, T, 3, H, W) clips, got {tuple(video.shape)}")
        x = to_signed_unit(video).to(_param(self.vae).dtype).permute(0, 2, 1, 3, 4)  # (B, 3, T, H, W)
        moments = _wan_moments(self.vae, x)
        mean, logvar = moments.float().chunk(2, dim=1)
        logvar = logvar.clamp(-30.0, 20.0)
        z = mean + torch.randn_like(mean) * (0.5 * logvar).exp() if self.sample_posterior else mean
        rec = _wan_decode_signed(self.vae, z.to(moments.dtype)).float()
        loss_rec = (rec - x.float()).abs().mean()
        kl = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean()
        return {"loss": loss_rec + self.kl_weight * kl, "loss_rec": loss_rec.detach(), "kl": kl.detach()}


class FrameDiverseClips(torch.utils.data.Dataset):
    """Short clips from many source videos: the stage-1 batches of a video VAE.

    Item ``i`` is ``clip_len`` consecutive frames of source ``i % n_sources`` at a start drawn (once, from
    ``seed``) uniformly over that source; ``per_source`` items per source. With the loader's shuffle, a batch
    of B items comes from ~B different sources at random offsets -- more diverse frames per step than whole
    long clips from a few sources (the recipe that capped the per-frame VAE at 21 dB).

    Args:
        sources: a ``core.data.video.VideoClipDataset`` (its ``source_frames``; ``cache="all"`` keeps them in
            memory), or a sequence of (N, 3, H, W) uint8 arrays / tensors.
        clip_len: frames per item, ``1 + r k`` for a VAE of temporal factor ``r``.
        per_source: items drawn from each source (the dataset's length is ``n_sources * per_source``).
        seed: the start offsets' (and crops') seed.
        crop: when set, every item is a random ``crop`` x ``crop`` window (drawn with its start): convolutions
            are translation-equivariant, so a VAE trains on crops and runs on whole frames, and a step on 16 px
            crops of 32 px frames costs a quarter of one on whole frames. A multiple of the spatial factor.

    Items: ``{"video": (clip_len, 3, H, W) uint8}`` (``H = W = crop`` when cropping).
    """

    def __init__(self, sources: Any, clip_len: int, per_source: int = 16, seed: int = 0, crop: int | None = None):
        import numpy as np

        if hasattr(sources, "source_frames"):
            sources = [sources.source_frames(i) for i in range(len(sources.sources))]
        self.frames = [torch.as_tensor(np.asarray(s)) for s in sources]
        if clip_len < 1 or per_source < 1:
            raise ConfigError(f"clip_len and per_source must be >= 1, got {clip_len} and {per_source}")
        self.frames = [f for f in self.frames if f.ndim == 4 and len(f) >= clip_len]
        if not self.frames:
            raise ConfigError(f"FrameDiverseClips: no source video has {clip_len} frames")
        if crop is not None and (crop < 1 or any(crop > min(f.shape[-2:]) for f in self.frames)):
            raise ConfigError(f"crop {crop}: must be >= 1 and fit every source frame")
        self.clip_len, self.crop = clip_len, crop
        rng = np.random.default_rng(seed)
        index = []
        for _ in range(per_source):
            for v, f in enumerate(self.frames):
                start = int(rng.integers(0, len(f) - clip_len + 1))
                y, x = ((int(rng.integers(0, f.shape[-2] - crop + 1)), int(rng.integers(0, f.shape[-1] - crop + 1)))
                        if crop else (0, 0))
                index.append((v, start, y, x))
        self.index = np.array(index, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        v, start, y, x = (int(k) for k in self.index[i])
        clip = self.frames[v][start:start + self.clip_len]
        if self.crop:
            clip = clip[..., y:y + self.crop, x:x + self.crop]
        return {"video": clip.clone()}
