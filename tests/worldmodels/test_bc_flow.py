"""The BC flow-matching head: contract checks, both modes of bimodal demonstrations, seeded sampling."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from core.testing import ModelChecks
from worldmodels.bc.modeling_bc import BCPolicyModel, FlowHead, tiny_config
from worldmodels.bc.pipeline_bc import BCPolicy

FLOW = tiny_config(hidden_dim=32, action_dim=3, proprio_dim=5, head="flow", flow_steps=4, dropout=0.0)


class TestBCFlowModel(ModelChecks):
    def make_model(self):
        return BCPolicyModel(FLOW)

    def make_batch(self):
        g = torch.Generator().manual_seed(0)
        return {"image": torch.randint(0, 256, (2, 3, 16, 16), generator=g, dtype=torch.uint8),
                "proprio": torch.randn(2, 5, generator=g)}

    def run(self, model, batch):  # a sample: the same noise for both models compared
        return model(**batch, generator=torch.Generator().manual_seed(3))

    def make_train_batch(self):
        b = self.make_batch()
        g = torch.Generator().manual_seed(1)
        return {"obs.image": b["image"][:, None], "obs.proprio": b["proprio"][:, None],
                "actions": torch.randn(2, 4, 3, generator=g),
                "actions_is_pad": torch.tensor([[False] * 4, [False, False, True, True]])}


def _bimodal_batch(n: int) -> dict[str, torch.Tensor]:
    """One observation, demonstrated chunks of all +1 or all -1 (half each): two ways of doing one thing."""
    g = torch.Generator().manual_seed(1)
    img = torch.randint(0, 256, (1, 1, 3, 16, 16), generator=g, dtype=torch.uint8).expand(n, -1, -1, -1, -1)
    sign = (torch.arange(n) % 2).float() * 2 - 1
    return {"obs.image": img, "obs.proprio": torch.zeros(n, 1, 5),
            "actions": sign[:, None, None].expand(n, 4, 3).clone(), "actions_is_pad": torch.zeros(n, 4, dtype=torch.bool)}


def _fit(model: BCPolicyModel, steps: int) -> BCPolicyModel:
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = _bimodal_batch(64)
    for _ in range(steps):
        loss = model.training_step(batch)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_flow_head_gives_both_demonstrated_modes_where_l1_averages_them():
    """The reason for the head: L1 regression on two equally likely chunks answers between them (the hand
    hovers); the flow head's samples are one chunk or the other, in about equal shares."""
    torch.manual_seed(0)
    flow = _fit(BCPolicyModel(dataclasses.replace(FLOW, flow_steps=10)), 400)
    torch.manual_seed(0)
    l1 = _fit(BCPolicyModel(dataclasses.replace(FLOW, head="l1")), 400)
    obs = _bimodal_batch(200)
    with torch.no_grad():
        samples = flow(obs["obs.image"][:, -1], obs["obs.proprio"][:, -1], generator=torch.Generator().manual_seed(5))
        answer = l1(obs["obs.image"][:1, -1], obs["obs.proprio"][:1, -1])
    chunk_mean = samples.mean(dim=(1, 2))  # (200,) each sample's mean action
    assert (chunk_mean.abs() > 0.5).float().mean() > 0.9  # near one mode or the other, not in between
    share = (chunk_mean > 0).float().mean().item()
    assert 0.25 < share < 0.75  # both modes, in comparable shares
    assert answer.abs().max() < 0.5  # L1 lands between the modes: neither demonstrated chunk


def test_flow_loss_falls_and_ignores_padded_steps():
    torch.manual_seed(0)
    model = BCPolicyModel(FLOW)
    batch = _bimodal_batch(8)
    batch["actions"] = batch["actions"].abs()  # one way only: the velocity is learnable everywhere

    def loss() -> float:  # averaged over draws of time and noise
        torch.manual_seed(7)
        return float(np.mean([model.training_step(batch)["loss"].item() for _ in range(8)]))

    first = loss()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(400):
        step = model.training_step(batch)["loss"]
        opt.zero_grad()
        step.backward()
        opt.step()
    assert loss() < 0.4 * first
    padded = {**batch, "actions": batch["actions"].clone(), "actions_is_pad": batch["actions_is_pad"].clone()}
    padded["actions"][:, 2:] = 1e6  # garbage past the episode end ...
    padded["actions_is_pad"][:, 2:] = True
    torch.manual_seed(7)
    a = model.training_step(padded)["loss"]
    assert torch.isfinite(a) and a.item() < 1e3  # ... is not in the loss


def test_flow_sampling_is_euler_integration_from_the_given_noise():
    torch.manual_seed(0)
    head = FlowHead(feat=6, hidden=16, out=4, dropout=0.0).eval()
    cond, noise = torch.randn(3, 16), torch.randn(3, 4)
    with torch.no_grad():
        x = noise.clone()
        for k in range(5):
            x = x + 0.2 * head(cond, x, torch.full((3,), k * 0.2))
        np.testing.assert_allclose(head.sample(cond, 4, 5, noise=noise).numpy(), x.numpy(), rtol=1e-6, atol=1e-6)


def test_policy_reseeds_the_flow_noise_at_reset():
    torch.manual_seed(0)
    pol = BCPolicy(BCPolicyModel(FLOW))
    obs = {"image": np.full((16, 16, 3), 80, np.uint8), "proprio": np.zeros(5, np.float32)}

    def episode(seed):
        pol.reset(seed=seed)
        return np.stack([pol.act(obs, {}) for _ in range(4)])

    np.testing.assert_array_equal(episode(11), episode(11))
    assert not np.array_equal(episode(11), episode(12))


def test_head_must_be_known():
    with pytest.raises(ConfigError, match="model.head"):
        dataclasses.replace(FLOW, head="diffusion")
    with pytest.raises(ConfigError, match="flow_steps"):
        dataclasses.replace(FLOW, flow_steps=0)
