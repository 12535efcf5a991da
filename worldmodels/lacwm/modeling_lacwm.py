"""LAC-WM (latent-action-conditioned cross-embodiment world model) and its baseline EAC-WM.

Paper: "Cross-Embodiment Robot Foundation World Models with Latent Actions" (ICML 2026; no official code).
Components: an inverse dynamics model (IDM) maps a frame pair to a continuous latent action z (no VQ;
causal self-attention over the two frames, then cross-attention from one learned query); the forward
dynamics model (FDM, the world model) predicts the next frame from the current one and z (self-attention
on frame tokens, self-attention on z tokens, cross-attention frame -> z); a motion decoder maps z to the
end-effector motion (auxiliary loss); cross-augmentation feeds the IDM view A1 and asks the FDM for the
A2 view. EAC-WM replaces the IDM by one explicit-action encoder per embodiment. Adaptation adds an
action projector a -> z (LAC) or a new action encoder (EAC), plus LoRA (``adaptation.py``).

Deviations: no V-JEPA2 weights here, so the FDM works in the pixel-patch space (``PatchCodec``; it predicts
pixels as a residual on the current frame, and PSNR / SSIM are measured in pixel space) and the IDM's frame
encoder is a small conv encoder trained with the model (``ConvFrameEmbed``; a frozen timm ViT plugs in by
local path). The IDM encodes each frame with its difference to the previous frame (``idm_frame_diff``), which
puts the motion into the tokens where it happens: with a few thousand transitions and plain tokens, the
pretraining motion loss stayed near its variance (README of this folder). Models are tiny (64 px, width 64)
and train on CPU.

Tensors: frames are (B, 3, H, W) uint8 RGB (upright) on input, float in [-1, 1] inside; windows are
(B, K+1, 3, H, W) for K transitions; z is (B, latent_dim) float32; motion (B, 6) is the end-effector
delta (dx, dy, dz m; axis-angle rad; world frame) summed over ``frame_skip`` control steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.layers import Attention, Mlp, TransformerBlock, inject_lora
from core.pretrained import PreTrainedModel
from worldmodels.lacwm.configuration_lacwm import LACWMConfig

if TYPE_CHECKING:
    from core.testing import ModelExample


# ------------------------------------------------------------------------------------------- frames
class PatchCodec(nn.Module):
    """Frame encoder in pixel-patch space: (B, 3, H, W) <-> (B, N, p*p*3) patch tokens, no parameters."""

    def __init__(self, image_size: int, patch_size: int):
        super().__init__()
        self.image_size, self.patch_size = image_size, patch_size
        self.grid = image_size // patch_size
        self.patch_dim = patch_size * patch_size * 3

    def to_float(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 [0, 255] (or float [-1, 1]) (..., 3, H, W) -> float [-1, 1], resized to ``image_size``."""
        x = frames.float() / 127.5 - 1.0 if frames.dtype == torch.uint8 else frames.float()
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            lead = x.shape[:-3]
            x = F.interpolate(x.reshape(-1, *x.shape[-3:]), size=(self.image_size,) * 2, mode="bilinear",
                              align_corners=False).reshape(*lead, 3, self.image_size, self.image_size)
        return x

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) float -> (B, N, p*p*3), patches row-major."""
        b, p, g = x.shape[0], self.patch_size, self.grid
        return x.reshape(b, 3, g, p, g, p).permute(0, 2, 4, 3, 5, 1).reshape(b, g * g, -1)

    def unpatchify(self, t: torch.Tensor) -> torch.Tensor:
        """(B, N, p*p*3) -> (B, 3, H, W)."""
        b, p, g = t.shape[0], self.patch_size, self.grid
        return t.reshape(b, g, g, p, p, 3).permute(0, 5, 1, 3, 2, 4).reshape(b, 3, g * p, g * p)


class FrameEmbed(nn.Module):
    """Patch tokens -> (B, N, C) with a learned position embedding."""

    def __init__(self, patch_dim: int, num_patches: int, width: int):
        super().__init__()
        self.proj = nn.Linear(patch_dim, width)
        self.pos = nn.Parameter(torch.randn(1, num_patches, width) * 0.02)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.proj(patches) + self.pos


class PretrainedFrameEncoder(nn.Module):
    """A frozen timm ViT as the IDM's frame encoder: (B, N, p*p*3) patches -> (B, N', D) patch tokens.

    Weights load from a local file (no hub): ``timm.create_model(name, pretrained=False, **kwargs)`` then
    ``core.checkpoint.load_weights(path)`` checked key by key. Inputs are the pixel patches (unpatchified
    back to images in [-1, 1] and mapped to the encoder's mean / std).
    """

    def __init__(self, name: str, path: str | None, codec: PatchCodec, kwargs: dict[str, int]):
        super().__init__()
        import timm

        self.codec = codec
        self.net = timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
        if path is not None:
            from core.checkpoint import load_into, load_weights

            load_into(self.net, load_weights(path), source=path, strict=True)
        for p in self.net.parameters():
            p.requires_grad_(False)
        cfg = self.net.pretrained_cfg
        self.register_buffer("mean", torch.tensor(cfg.get("mean", (0.5,) * 3)).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(cfg.get("std", (0.5,) * 3)).view(1, 3, 1, 1), persistent=False)
        self.prefix = getattr(self.net, "num_prefix_tokens", 0)
        with torch.no_grad():
            probe = self(torch.zeros(1, codec.grid**2, codec.patch_dim))
        self.num_tokens, self.dim = probe.shape[1], probe.shape[2]

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = (self.codec.unpatchify(patches) + 1) / 2
        with torch.no_grad():
            return self.net.forward_features((x - self.mean) / self.std)[:, self.prefix:]


class ConvFrameEmbed(nn.Module):
    """A small trained conv encoder: patches (B, N, p*p*c_in) -> (B, N, C) tokens on the same grid.

    ``log2(patch_size)`` stride-2 4x4 convolutions (channels 32, 64, ... up to ``width``) over the image
    rebuilt from the patches, plus a learned position embedding. ``in_channels`` is 3 (a frame) or 6 (a
    frame and its difference to the previous frame).
    """

    def __init__(self, image_size: int, patch_size: int, width: int, in_channels: int = 3):
        super().__init__()
        stages = int(round(np.log2(patch_size)))
        if 2**stages != patch_size:
            raise ValueError(f"conv frame encoder needs a power-of-two patch_size, got {patch_size}")
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        chans = [in_channels] + [min(width, 32 * 2**i) for i in range(stages - 1)] + [width]
        layers: list[nn.Module] = []
        for i in range(stages):
            layers += [nn.Conv2d(chans[i], chans[i + 1], 4, 2, 1), nn.GroupNorm(min(8, chans[i + 1]), chans[i + 1])]
            if i < stages - 1:
                layers.append(nn.SiLU())
        self.net = nn.Sequential(*layers)
        self.pos = nn.Parameter(torch.randn(1, (image_size // patch_size) ** 2, width) * 0.02)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        b, p, g = patches.shape[0], self.patch_size, self.image_size // self.patch_size
        x = patches.reshape(b, g, g, p, p, self.in_channels).permute(0, 5, 1, 3, 2, 4).reshape(b, -1, g * p, g * p)
        return self.net(x).flatten(2).transpose(1, 2) + self.pos


class TokenEmbed(nn.Module):
    """Frozen encoder tokens (B, N', D) -> (B, N', C) with a learned position embedding."""

    def __init__(self, encoder: PretrainedFrameEncoder, width: int):
        super().__init__()
        self.encoder = encoder
        self.proj = nn.Linear(encoder.dim, width)
        self.pos = nn.Parameter(torch.randn(1, encoder.num_tokens, width) * 0.02)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.proj(self.encoder(patches)) + self.pos


# ------------------------------------------------------------------------------------------- IDM
class InverseDynamics(nn.Module):
    """(x_t, x_t+1) -> z_t: causal self-attention over the two frames' tokens, then one learned query.

    Frame tokens come from the pixel patches (``encoder="pixels"``: ``FrameEmbed``), a small conv encoder
    trained with the model (``"conv"``: ``ConvFrameEmbed``) or a frozen pretrained encoder
    (``"timm:<name>"``, weights from ``config.encoder_path``). With ``config.idm_frame_diff`` (pixels / conv)
    each frame is encoded together with its difference to the previous frame (zero for x_t), so that frame
    t+1's tokens carry the motion at their own position; the frame-causal mask is unchanged.
    """

    def __init__(self, cfg: LACWMConfig, patch_dim: int):
        super().__init__()
        n, c = cfg.num_patches, cfg.width
        self.diff = cfg.idm_frame_diff and cfg.encoder in ("pixels", "conv")
        mult = 2 if self.diff else 1
        if cfg.encoder == "pixels":
            self.embed = FrameEmbed(patch_dim * mult, n, c)
        elif cfg.encoder == "conv":
            self.embed = ConvFrameEmbed(cfg.image_size, cfg.patch_size, c, 3 * mult)
        else:
            codec = PatchCodec(cfg.image_size, cfg.patch_size)
            self.embed = TokenEmbed(PretrainedFrameEncoder(cfg.encoder.removeprefix("timm:"), cfg.encoder_path,
                                                           codec, dict(cfg.encoder_kwargs)), c)
            n = self.embed.encoder.num_tokens
        self.frame_emb = nn.Parameter(torch.randn(1, 2, 1, c) * 0.02)
        self.blocks = nn.ModuleList([TransformerBlock(c, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.idm_depth)])
        self.query = nn.Parameter(torch.randn(1, 1, c) * 0.02)
        self.pool = TransformerBlock(c, cfg.num_heads, cfg.mlp_ratio, cross_attention=True, self_attention=False)
        self.norm = nn.LayerNorm(c)
        self.head = nn.Linear(c, cfg.latent_dim)
        # frame-causal mask: frame t tokens see frame t only; frame t+1 tokens see both (True = may attend)
        causal = torch.ones(2 * n, 2 * n, dtype=torch.bool)
        causal[:n, n:] = False
        self.register_buffer("mask", causal, persistent=False)

    def tokens(self, p: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        """Frame tokens (B, N, C) of patches ``p`` (B, N, P), with the difference to ``prev`` (None: zero)
        when the IDM uses frame differences."""
        if not self.diff:
            return self.embed(p)
        d = torch.zeros_like(p) if prev is None else p - prev
        if isinstance(self.embed, ConvFrameEmbed):  # channels last inside each patch: (.., p*p, 3) -> (.., p*p, 6)
            b, n, _ = p.shape
            return self.embed(torch.cat([p.view(b, n, -1, 3), d.view(b, n, -1, 3)], -1).flatten(2))
        return self.embed(torch.cat([p, d], -1))

    def forward(self, p0: torch.Tensor, p1: torch.Tensor) -> torch.Tensor:
        """(B, N, P) patches of x_t and x_t+1 -> (B, latent_dim)."""
        b = p0.shape[0]
        tok = torch.stack([self.tokens(p0), self.tokens(p1, p0)], 1) + self.frame_emb  # (B, 2, N, C)
        tok = tok.flatten(1, 2)  # (B, 2N, C)
        for blk in self.blocks:
            tok = blk(tok, attn_mask=self.mask)
        q = self.pool(self.query.expand(b, -1, -1), context=tok)  # (B, 1, C)
        return self.head(self.norm(q[:, 0]))


# ------------------------------------------------------------------------------------------- FDM
class FDMBlock(nn.Module):
    """Frame tokens: self-attention + cross-attention to z tokens + MLP; z tokens: self-attention + MLP;
    optional causal temporal attention of each patch across the K context frames (zero-init output)."""

    def __init__(self, width: int, num_heads: int, mlp_ratio: float, temporal: bool):
        super().__init__()
        self.x_block = TransformerBlock(width, num_heads, mlp_ratio, cross_attention=True)
        self.z_block = TransformerBlock(width, num_heads, mlp_ratio)
        self.temporal = None
        if temporal:
            self.t_norm = nn.LayerNorm(width)
            self.temporal = Attention(width, num_heads)
            nn.init.zeros_(self.temporal.proj.weight)
            nn.init.zeros_(self.temporal.proj.bias)

    def forward(self, x: torch.Tensor, z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B*K, N, C), z (B*K, M, C), K context frames -> updated (x, z)."""
        z = self.z_block(z)
        x = self.x_block(x, context=z)
        if self.temporal is not None and k > 1:
            bk, n, c = x.shape
            xt = x.reshape(bk // k, k, n, c).transpose(1, 2).reshape(-1, k, c)  # (B*N, K, C)
            xt = xt + self.temporal(self.t_norm(xt), is_causal=True)
            x = xt.reshape(bk // k, n, k, c).transpose(1, 2).reshape(bk, n, c)
        return x, z


class ForwardDynamics(nn.Module):
    """The world model: (x_t, z_t) -> x_t+1 in pixel space, predicted as a residual on x_t."""

    def __init__(self, cfg: LACWMConfig, patch_dim: int):
        super().__init__()
        c = cfg.width
        self.embed = FrameEmbed(patch_dim, cfg.num_patches, c)
        self.z_proj = nn.Linear(cfg.latent_dim, cfg.latent_tokens * c)
        self.z_pos = nn.Parameter(torch.randn(1, cfg.latent_tokens, c) * 0.02)
        self.blocks = nn.ModuleList([FDMBlock(c, cfg.num_heads, cfg.mlp_ratio, cfg.temporal_attention)
                                     for _ in range(cfg.fdm_depth)])
        self.norm = nn.LayerNorm(c)
        self.head = nn.Linear(c, patch_dim)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.latent_tokens, self.width = cfg.latent_tokens, c

    def forward(self, patches: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """patches (B, K, N, P) of x_t for K context steps, z (B, K, latent_dim) -> (B, K, N, P) of x_t+1."""
        b, k, n, p = patches.shape
        flat = patches.reshape(b * k, n, p)
        x = self.embed(flat)
        zt = self.z_proj(z.reshape(b * k, -1)).view(b * k, self.latent_tokens, self.width) + self.z_pos
        for blk in self.blocks:
            x, zt = blk(x, zt, k)
        return (flat + self.head(self.norm(x))).view(b, k, n, p)


class ActionMLP(nn.Sequential):
    """Explicit action (..., A) -> (..., out_dim): the EAC action encoder and the LAC action projector.

    Inputs wider than ``in_dim`` (zero-padded batches of mixed embodiments) are cut to their first ``in_dim``.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__(nn.Linear(in_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                         nn.Linear(hidden, out_dim))
        self.in_dim = in_dim

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return super().forward(a[..., : self.in_dim])


def action_mlp(in_dim: int, hidden: int, out_dim: int) -> ActionMLP:
    """An ``ActionMLP``."""
    return ActionMLP(in_dim, hidden, out_dim)


def _key(embodiment: str) -> str:
    return embodiment.replace("+", "_").replace(".", "_")


# --------------------------------------------------------------------------------------- augmentation
def random_view(x: torch.Tensor, shift: int, color: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """One random augmentation per sample, applied identically to every frame of its window.

    Args:
        x: (B, T, 3, H, W) float frames in [-1, 1].
        shift: Max translation in px (replicate-padded crop).
        color: Max relative brightness / contrast change.

    Returns:
        (B, T, 3, H, W) augmented frames in [-1, 1].
    """
    b, t, c, h, w = x.shape
    dev = x.device
    out = x
    if shift > 0:
        pad = F.pad(x.reshape(b, t * c, h, w), (shift,) * 4, mode="replicate")
        dx = torch.randint(0, 2 * shift + 1, (b,), generator=generator).to(dev)
        dy = torch.randint(0, 2 * shift + 1, (b,), generator=generator).to(dev)
        rows = (dy[:, None] + torch.arange(h, device=dev))[:, None, :, None]  # (B, 1, H, 1)
        cols = (dx[:, None] + torch.arange(w, device=dev))[:, None, None, :]  # (B, 1, 1, W)
        batch = torch.arange(b, device=dev)[:, None, None, None]
        chan = torch.arange(t * c, device=dev)[None, :, None, None]
        out = pad[batch, chan, rows, cols].view(b, t, c, h, w)  # one crop per window, no Python loop
    if color > 0:
        gain = 1 + color * (2 * torch.rand(b, 1, 3, 1, 1, generator=generator) - 1)
        bias = color * (2 * torch.rand(b, 1, 1, 1, 1, generator=generator) - 1)
        out = (out * gain.to(dev) + bias.to(dev)).clamp(-1, 1)
    return out


# --------------------------------------------------------------------------------------- world models
class WorldModel(PreTrainedModel):
    """Shared base of LAC-WM and EAC-WM: tokenizer, FDM, adaptation heads, multi-step imagination.

    Subclasses define ``latent(batch)`` (the training-time conditioning) and their loss. ``from_pretrained``
    on this base builds the subclass that ``config.conditioning`` names (a LAC-WM or EAC-WM checkpoint).
    """

    config_class = LACWMConfig

    @classmethod
    def config_from_dict(cls, data: dict[str, Any]) -> LACWMConfig:
        """``EACWMConfig`` for explicit-action checkpoints, ``LACWMConfig`` otherwise (the family's two configs)."""
        from core.pretrained import dataclass_from_dict
        from worldmodels.lacwm.configuration_lacwm import EACWMConfig

        return dataclass_from_dict(EACWMConfig if data.get("conditioning") == "explicit" else LACWMConfig, data)

    @classmethod
    def build_for_loading(cls, config: LACWMConfig) -> WorldModel:
        return build_model(config)

    @classmethod
    def _accepts_method(cls, method: str) -> bool:
        return method in ("lacwm", "eacwm")

    def __init__(self, config: LACWMConfig):
        super().__init__()
        self.config = config
        self.codec = PatchCodec(config.image_size, config.patch_size)
        self.fdm = ForwardDynamics(config, self.codec.patch_dim)
        self.projectors = nn.ModuleDict({_key(e): action_mlp(a, config.action_hidden, config.latent_dim)
                                         for e, a in config.projectors.items()})

    def _apply_lora(self) -> None:
        """peft LoRA (``core.layers.inject_lora``: ``LoraConfig`` + ``inject_adapter_in_model``) on the
        linears of ``lora_parts`` named by ``config.lora_targets``, injected once at the model root (adapter
        "default")."""
        c = self.config
        if c.lora_rank > 0:
            names = {id(m): n for n, m in self.named_modules()}
            parts = [names[id(p)] for p in self.lora_parts()]
            inject_lora(self, c.lora_targets, rank=c.lora_rank, within=parts)

    def lora_parts(self) -> list[nn.Module]:
        """The sub-networks that get LoRA on adaptation."""
        return [self.fdm]

    def action_encoder(self, embodiment: str) -> nn.Module:
        """Explicit action (B, A) of ``embodiment`` -> z (B, latent_dim) at inference (projector / encoder)."""
        key = _key(embodiment)
        if key in self.projectors:
            return self.projectors[key]
        raise KeyError(f"no action projector / encoder for embodiment {embodiment!r} (has {list(self.projectors)})")

    def predict(self, frames: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """One step: frames (B, K, 3, H, W) uint8 or float, z (B, K, latent_dim) -> (B, K, 3, H, W) float."""
        b, k = frames.shape[:2]
        x = self.codec.to_float(frames)
        patches = self.codec.patchify(x.flatten(0, 1)).view(b, k, self.config.num_patches, -1)
        out = self.fdm(patches, z)
        return self.codec.unpatchify(out.flatten(0, 1)).view(b, k, 3, self.config.image_size, -1)

    @torch.no_grad()
    def imagine(self, frame: torch.Tensor, z_seq: torch.Tensor) -> torch.Tensor:
        """Autoregressive rollout: frame (B, 3, H, W), z_seq (B, T, latent_dim) -> (B, T, 3, H, W) in [-1, 1].

        The FDM sees the last ``context`` frames (its own predictions fed back) and their latents.
        """
        k = self.config.context
        frames = [self.codec.to_float(frame)]
        for t in range(z_seq.shape[1]):
            lo = max(0, t + 1 - k)
            window = torch.stack(frames[lo: t + 1], 1)
            nxt = self.predict(window, z_seq[:, lo: t + 1])[:, -1].clamp(-1, 1)
            frames.append(nxt)
        return torch.stack(frames[1:], 1)

    def forward(self, frames: torch.Tensor, actions: torch.Tensor | None = None,
                embodiment: str | None = None) -> torch.Tensor:
        """Imagine from the first frame of a window under explicit actions (inference path: encoder/projector
        + FDM). frames (B, K+1, 3, H, W) uint8, actions (B, K, A) -> (B, K, 3, H, W) float in [-1, 1]."""
        enc = self.action_encoder(embodiment)
        z = enc(actions.float())
        return self.imagine(frames[:, 0], z)

    def _frames(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.codec.to_float(batch["frames"])  # (B, K+1, 3, H, W)


class LACWorldModel(WorldModel):
    """LAC-WM: IDM -> continuous latent action -> FDM, with the motion decoder and cross-augmentation."""

    method = "lacwm"

    def __init__(self, config: LACWMConfig):
        super().__init__(config)
        self.idm = InverseDynamics(config, self.codec.patch_dim)
        self.motion_decoder = Mlp(config.latent_dim, 2 * config.latent_dim, config.motion_dim)
        self.register_buffer("motion_mean", torch.zeros(config.motion_dim))
        self.register_buffer("motion_std", torch.ones(config.motion_dim))
        self._apply_lora()

    def lora_parts(self) -> list[nn.Module]:
        parts = [self.idm.blocks, self.idm.pool, self.fdm]
        if isinstance(self.idm.embed, FrameEmbed):  # never inside a frozen pretrained encoder (conv: no LoRA names)
            parts.insert(0, self.idm.embed)
        return parts

    @torch.no_grad()
    def set_motion_stats(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Per-dim motion normalisation (std floored at 1e-6)."""
        self.motion_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.motion_std.copy_(torch.as_tensor(std, dtype=torch.float32).clamp_min(1e-6))

    def encode_pairs(self, x: torch.Tensor) -> torch.Tensor:
        """Latent actions of a window: x (B, K+1, 3, H, W) float -> z (B, K, latent_dim)."""
        b, t = x.shape[:2]
        p = self.codec.patchify(x.flatten(0, 1)).view(b, t, self.config.num_patches, -1)
        return self.idm(p[:, :-1].flatten(0, 1), p[:, 1:].flatten(0, 1)).view(b, t - 1, -1)

    @torch.no_grad()
    def latent_actions(self, frames: torch.Tensor) -> torch.Tensor:
        """Frozen-latent readout for probes: frames (B, K+1, 3, H, W) uint8 -> (B, K, latent_dim)."""
        return self.encode_pairs(self.codec.to_float(frames))

    def views(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The IDM's view A1 and the FDM's view A2 of the window (equal without cross-augmentation)."""
        x = self._frames(batch)
        c = self.config
        if not (self.training and c.cross_augmentation):
            return x, x
        return random_view(x, c.aug_shift, c.aug_color), random_view(x, c.aug_shift, c.aug_color)

    def losses(self, batch: dict[str, torch.Tensor], z: torch.Tensor | None = None,
               views: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Reconstruction (A2 target from A2 current frame and A1 latent) and motion losses."""
        c = self.config
        a1, a2 = views if views is not None else self.views(batch)
        if z is None:
            z = self.encode_pairs(a1)  # (B, K, D)
        pred = self.predict(a2[:, :-1], z)
        recon = F.mse_loss(pred, a2[:, 1:])
        motion_t = (batch["motion"].float() - self.motion_mean) / self.motion_std
        motion = F.mse_loss(self.motion_decoder(z), motion_t)
        return {"loss": c.recon_weight * recon + c.motion_weight * motion, "recon": recon.detach(),
                "motion": motion.detach()}

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """l_recon ||x^ - x||^2 + l_motion ||a^ - a||^2 (spec), with cross-augmentation."""
        return self.losses(batch)

    def reconstruct(self, frames: torch.Tensor) -> torch.Tensor:
        """Teacher-forced reconstruction through IDM + FDM: (B, K+1, 3, H, W) -> (B, K, 3, H, W) float."""
        x = self.codec.to_float(frames)
        return self.predict(x[:, :-1], self.encode_pairs(x))


class EACWorldModel(WorldModel):
    """EAC-WM: one explicit-action encoder per embodiment (disjoint action spaces) -> the same FDM."""

    method = "eacwm"

    def __init__(self, config: LACWMConfig):
        super().__init__(config)
        self.encoders = nn.ModuleDict({_key(e): action_mlp(a, config.action_hidden, config.latent_dim)
                                       for e, a in config.action_dims.items()})
        self.embodiments = list(config.action_dims)
        self._apply_lora()

    def action_encoder(self, embodiment: str) -> nn.Module:
        key = _key(embodiment)
        if key in self.encoders:
            return self.encoders[key]
        return super().action_encoder(embodiment)

    def latent(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """z (B, K, D) from explicit actions, each sample through its embodiment's encoder
        (``embodiment_id`` indexes ``config.action_dims`` in insertion order)."""
        ids = batch["embodiment_id"]
        acts = batch["actions"].float()
        out = None
        for i in ids.unique().tolist():
            sel = ids == i
            zi = self.action_encoder(self.embodiments[i])(acts[sel])
            out = zi.new_zeros(*acts.shape[:2], zi.shape[-1]) if out is None else out
            out[sel] = zi
        return out

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """||x^ - x||^2 with z from the batch's embodiment encoder (one random view for both frames)."""
        c = self.config
        x = self._frames(batch)
        if self.training and c.aug_shift + c.aug_color > 0 and c.cross_augmentation:
            x = random_view(x, c.aug_shift, c.aug_color)
        z = self.latent(batch)
        recon = F.mse_loss(self.predict(x[:, :-1], z), x[:, 1:])
        return {"loss": recon, "recon": recon.detach()}


def build_model(config: LACWMConfig) -> WorldModel:
    """LAC-WM or EAC-WM from ``config.conditioning``."""
    return LACWorldModel(config) if config.conditioning == "latent" else EACWorldModel(config)


def tiny_config(arm: str = "lacwm", **overrides: Any) -> LACWMConfig:
    """The tests' and smoke runs' world model (``model=lacwm_tiny`` / ``model=eacwm_tiny``): small frames, thin
    transformers, a few adaptation steps per stage (``overrides`` replace fields).

    Args:
        arm: ``lacwm`` (an ``LACWMConfig``) or ``eacwm`` (an ``EACWMConfig``: explicit actions).
    """
    from worldmodels.lacwm.configuration_lacwm import AdaptConfig, EACWMConfig

    classes = {"lacwm": LACWMConfig, "eacwm": EACWMConfig}
    if arm not in classes:
        raise ValueError(f"arm must be one of {sorted(classes)}, got {arm!r}")
    kw: dict[str, Any] = dict(image_size=16, patch_size=4, width=32, num_heads=2, idm_depth=1, fdm_depth=2,
                              latent_dim=8, latent_tokens=2, action_hidden=32, aug_shift=2,
                              adapt=AdaptConfig(stage_steps=[2, 2, 2], batch_size=4))
    kw.update(overrides)
    return classes[arm](**kw)


def example(workdir: Path) -> ModelExample:
    """The contract test's tiny LAC-WM (``tiny_config()`` with a 2-frame context and one embodiment's projector):
    reconstruction and a one-step prediction from explicit actions. The projectors train only in adaptation, so
    no gradient here."""
    from core.testing import ModelExample

    cfg = tiny_config(context=2, temporal_attention=True, projectors={"Arm": 5})

    def inputs() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"frames": torch.randint(0, 256, (3, 3, 3, 16, 16), generator=g, dtype=torch.uint8),
                "motion": torch.randn(3, 2, 6, generator=g), "actions": torch.randn(3, 2, 5, generator=g),
                "embodiment_id": torch.zeros(3, dtype=torch.int64)}

    def run(model, batch):
        return model.reconstruct(batch["frames"]), model(batch["frames"], batch["actions"], "Arm")

    return ModelExample(build=lambda: LACWorldModel(cfg), inputs=inputs, run=run, no_grad_params=("projectors.",))
