"""The reference method end to end: model checks, loss falls on recorded demos, closed-loop policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.config import compose
from core.testing import ModelChecks
from worldmodels.bc.configuration_bc import BCConfig
from worldmodels.bc.modeling_bc import BCPolicy, BCPolicyModel, SpatialSoftmax

TINY = BCConfig(channels=[8, 16], num_keypoints=4, hidden_dim=16, horizon=4, n_action_steps=2, image_size=16,
                action_dim=3, proprio_dim=5)


class TestBCModel(ModelChecks):
    def make_model(self):
        return BCPolicyModel(TINY)

    def make_batch(self):
        g = torch.Generator().manual_seed(0)
        return {"image": torch.randint(0, 256, (2, 3, 16, 16), generator=g, dtype=torch.uint8),
                "proprio": torch.randn(2, 5, generator=g)}


def test_spatial_softmax_finds_the_peak():
    ss = SpatialSoftmax(1, 1)
    with torch.no_grad():
        ss.proj.weight.fill_(1.0)
        ss.proj.bias.zero_()
    x = torch.zeros(1, 1, 9, 9)
    x[0, 0, 2, 6] = 50.0  # row 2 (y), column 6 (x)
    kx, ky = ss(x)[0].tolist()
    assert kx == pytest.approx(-1 + 2 * 6 / 8, abs=1e-3) and ky == pytest.approx(-1 + 2 * 2 / 8, abs=1e-3)


def test_normalization_round_trip_and_padding_mask():
    model = BCPolicyModel(TINY).eval()  # no dropout: the two losses must be comparable
    model.set_normalization({"action_mean": np.array([1.0, 2.0, 3.0]), "action_std": np.array([2.0, 0.0, 1.0]),
                             "proprio_mean": np.zeros(5), "proprio_std": np.ones(5)})
    assert model.action_std[1] == pytest.approx(1e-3)  # constant dims stay finite
    batch = {"obs.image": torch.zeros(2, 1, 3, 16, 16, dtype=torch.uint8), "obs.proprio": torch.zeros(2, 1, 5),
             "actions": torch.randn(2, 4, 3), "actions_is_pad": torch.tensor([[False] * 4, [False, True, True, True]])}
    loss = model.training_step(batch)["loss"]
    batch2 = {**batch, "actions": batch["actions"].clone()}
    batch2["actions"][1, 1:] += 100.0  # padded steps must not count
    assert torch.equal(loss, model.training_step(batch2)["loss"])


def test_policy_executes_chunks_and_clips():
    model = BCPolicyModel(TINY).eval()
    calls = []
    orig = model.forward

    def counting(*a, **k):
        calls.append(1)
        return orig(*a, **k) * 0 + 10.0  # out of bounds on purpose

    model.forward = counting
    pol = BCPolicy(model, np.full(3, -1.0, np.float32), np.full(3, 1.0, np.float32))
    pol.reset(0)
    obs = {"image": np.zeros((16, 16, 3), np.uint8), "proprio": np.zeros(5, np.float32)}
    acts = [pol.act(obs, {}) for _ in range(4)]
    assert len(calls) == 2  # n_action_steps=2: re-plans every second step
    assert all(np.all(a == 1.0) for a in acts)


def test_experiment_config_composes_with_tiny_model():
    cfg = compose(["experiment=bc", "debug=tiny", "model=bc_tiny"])
    assert cfg.method == "bc" and cfg.data.horizon == cfg.model.horizon == 4


@pytest.mark.timeout(600)
def test_train_then_act_in_closed_loop(tmp_path):
    """Record 3 expert episodes, train a few steps through `embodied train`, load the policy back."""
    from core.checkpoint import load_checkpoint, load_policy
    from core.cli import main
    from core.logging import read_metrics

    data = tmp_path / "data" / "embodied_Reach-Panda-v0.hdf5"
    out = tmp_path / "run"
    args = ["train", "bc", "debug=tiny", "model=bc_tiny", "data.record.episodes=3", f"data.paths=[{data}]",
            f"out_dir={out}", "trainer.max_steps=30", "trainer.batch_size=8", "trainer.ckpt_every=30",
            "trainer.optim.lr=3e-3", "data.record.image_size=32"]
    assert main(args) == 0
    assert data.exists()
    rows = read_metrics(out)
    assert np.mean([r["loss"] for r in rows[-5:]]) < np.mean([r["loss"] for r in rows[:5]])
    cfg = load_checkpoint(out)["config"]
    assert cfg["model"]["action_dim"] == 7 and cfg["method"] == "bc"  # Panda OSC_POSE + gripper

    import gymnasium as gym

    import sim

    sim.register_envs()
    env = gym.make("embodied/Reach-Panda-v0", image_size=32)
    try:
        policy = load_policy(out, env)
        obs, info = env.reset(seed=0)
        policy.reset(0)
        action = policy.act(obs, info)
        assert action.shape == (7,) and env.action_space.contains(action)
    finally:
        env.close()
    # wrong env for this checkpoint: a clear error
    env2 = gym.make("embodied/Reach-Sawyer-v0", image_size=32)
    try:
        from core.errors import CheckpointError

        with pytest.raises(CheckpointError, match="7-d actions"):
            load_policy(out, env2)
    finally:
        env2.close()
