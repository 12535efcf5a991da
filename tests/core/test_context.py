"""core.layers.context: the frozen pretrained EfficientNet-Lite0 token encoder."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core.layers.context import EFFNET_STAGES, EfficientNetTokens, freeze_as_buffers


def test_freeze_as_buffers_keeps_weights_out_of_state_dict_but_moves_them():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    x = torch.randn(1, 3, 8, 8)
    m.eval()
    before = m(x)
    freeze_as_buffers(m)
    assert list(m.parameters()) == [] and m.state_dict() == {}
    torch.testing.assert_close(m(x), before)
    m.to(torch.float64)
    assert m[0].weight.dtype == torch.float64 and m[1].running_mean.dtype == torch.float64


def test_tokens_are_the_pretrained_network_stage_output():
    from core.metrics.features import build_efficientnet_lite0

    enc = EfficientNetTokens(stage=4, image_size=64)
    assert enc.num_features == EFFNET_STAGES[4][1] == 112 and enc.state_dict() == {}
    x = torch.rand(2, 3, 48, 48) * 2 - 1
    tokens = enc(x)
    assert tokens.shape == (2, (64 // 16) ** 2, 112)
    net = build_efficientnet_lite0().eval()
    with torch.no_grad():
        f = net.bn1(net.conv_stem(F.interpolate(x, size=(64, 64), mode="bilinear", align_corners=False,
                                                antialias=True)))
        for block in list(net.blocks)[:5]:
            f = block(f)
    torch.testing.assert_close(tokens, f.flatten(2).transpose(1, 2))
    enc.train()
    assert not enc.training  # frozen BatchNorm
    with pytest.raises(ValueError, match="stage"):
        EfficientNetTokens(stage=7)
    with pytest.raises(ValueError, match="B, 3, H, W"):
        enc(torch.zeros(3, 8, 8))
