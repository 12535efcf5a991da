"""BC on a frozen ImageNet trunk (``model.backbone=efficientnet_lite0``): the trunk holds the real weights and
never changes, its features are memoised in training (and equal the computed ones), the feature-map shift
moves whole cells, the policy learns, and a checkpoint reloads bit-exact."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from core.metrics.features import build_efficientnet_lite0
from worldmodels.bc.configuration_bc import BCConfig
from worldmodels.bc.modeling_bc import BCPolicyModel, tiny_config

CFG = tiny_config(action_dim=3, proprio_dim=5, backbone="efficientnet_lite0", backbone_size=32, backbone_stage=2,
                  channels=[8], random_shift=8)


def _batch(seed: int = 0, b: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"obs.image": torch.randint(0, 256, (b, 1, 3, 16, 16), generator=g, dtype=torch.uint8),
            "obs.proprio": torch.randn(b, 1, 5, generator=g), "actions": torch.randn(b, 4, 3, generator=g),
            "actions_is_pad": torch.zeros(b, 4, dtype=torch.bool)}


def test_trunk_holds_imagenet_weights_frozen_in_eval_mode():
    model = BCPolicyModel(CFG).train()
    ref = build_efficientnet_lite0()
    assert torch.equal(model.trunk.stem[0].weight, ref.conv_stem.weight)
    assert torch.equal(model.trunk.blocks[2][0].conv_pw.weight, ref.blocks[2][0].conv_pw.weight)
    assert not model.trunk.training and not any(p.requires_grad for p in model.trunk.parameters())
    before = {k: v.clone() for k, v in model.trunk.state_dict().items()}  # BatchNorm statistics included
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        model.training_step(_batch())["loss"].backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(v, model.trunk.state_dict()[k]) for k, v in before.items())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert model.trunk(x).shape == (2, 40, 4, 4)  # stage 2: stride 8, 40 channels


def test_memoised_features_equal_computed_ones_and_run_the_trunk_once_per_frame():
    model = BCPolicyModel(CFG).train()
    frames = _batch()["obs.image"][:, -1]
    calls = []
    hook = model.trunk.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    first = model.trunk_features(frames)
    again = model.trunk_features(torch.cat([frames[:2], frames[:2]]))  # all four already seen
    hook.remove()
    assert calls == [4] and len(model._memo) == 4
    model.eval()  # no memo: computed afresh
    direct = model.trunk_features(frames)
    assert torch.allclose(first, direct) and torch.allclose(again[:2], direct[:2], atol=2e-3, rtol=1e-3)
    assert torch.equal(again[:2], again[2:])


def test_feature_shift_moves_whole_cells():
    model = BCPolicyModel(CFG).train()
    x = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).view(2, 3, 5, 5)
    torch.manual_seed(0)
    y = model._shift(x, 1)
    for i in range(2):  # each sample is its map moved by -1, 0 or +1 cell per axis (edges repeated)
        padded = torch.nn.functional.pad(x[i:i + 1], (1, 1, 1, 1), mode="replicate")[0]
        assert any(torch.equal(y[i], padded[:, dy:dy + 5, dx:dx + 5]) for dy in range(3) for dx in range(3))
    assert torch.equal(model.eval()._shift(x, 1), x)


def test_loss_falls_and_checkpoint_reloads_bit_exact(tmp_path):
    torch.manual_seed(0)
    model = BCPolicyModel(CFG).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    batch = _batch()
    losses = []
    for _ in range(200):
        out = model.training_step(batch)["loss"]
        out.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(out.detach()))
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    model.eval()
    model.save_pretrained(tmp_path / "bc")
    loaded = BCPolicyModel.from_pretrained(tmp_path / "bc").eval()
    obs = _batch(1)
    with torch.no_grad():
        assert torch.equal(model(obs["obs.image"][:, -1], obs["obs.proprio"][:, -1]),
                           loaded(obs["obs.image"][:, -1], obs["obs.proprio"][:, -1]))


@pytest.mark.parametrize("bad, msg", [({"backbone": "resnet"}, "model.backbone must be one of conv, "),
                                      ({"backbone": "efficientnet_lite0", "backbone_stage": 5}, "backbone_stage"),
                                      ({"backbone": "efficientnet_lite0", "backbone_size": 40}, "backbone_size")])
def test_bad_backbone_settings_are_one_line_errors(bad, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        BCConfig(**bad)
    assert "\n" not in str(e.value)
