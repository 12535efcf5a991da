"""TAGRPO: the SDE sampler's log-probabilities, ratios before the update, same-noise advantage variance, latents
moving towards the high-reward trajectory, the memory bank, resume, the configs and `embodied infer i2v`."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from core.config import TrainerConfig, compose
from core.errors import ConfigError, DataError
from core.logging import read_metrics
from core.testing import folder_digest
from perception.i2v_rl.configuration_tagrpo import AlgoConfig, TAGRPOModelConfig
from perception.i2v_rl.grpo import (
    BankEntry,
    MemoryBank,
    contrastive_loss,
    group_advantages,
    grpo_loss,
    pairwise_log_ratio,
)
from perception.i2v_rl.modeling_tagrpo import I2VPolicy, gaussian_logprob
from perception.i2v_rl.modeling_tagrpo import tiny_config as tiny_policy_config
from perception.i2v_rl.rewards import CompositeReward
from perception.i2v_rl.task import ConditioningSet, GRPORunner
from perception.video.modeling_flexforcing import FlexForcingModel, tiny_config

# the tests' Flex-Forcing (modeling_flexforcing.tiny_config) with 5-latent-frame windows
TINY = tiny_config(num_frames=5, sample_steps=4, max_context=1)


def tiny_backbone(seed: int = 0, config=None) -> FlexForcingModel:
    """A random tiny Flex-Forcing model whose zero-initialised K-projection rows are perturbed, so that every
    weight matters."""
    torch.manual_seed(seed)
    model = FlexForcingModel(config or TINY)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (model.dit.kproj.parameters() if model.dit.kproj is not None else ()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def tiny_base(folder, seed: int = 0):
    """``tiny_backbone(seed)`` saved as a Flex-Forcing folder (once) under ``folder``: a policy's base."""
    base = folder / f"flex_base_{seed}"
    if not base.is_dir():
        tiny_backbone(seed).save_pretrained(base)
    return base


def tiny_policy(folder, seed: int = 0, steps: int = 4) -> I2VPolicy:
    return I2VPolicy(tiny_policy_config(base_path=str(tiny_base(folder, seed)), sample_steps=steps))


def scripted_set(n: int = 4, frames: int = 5, size: int = 16, seed: int = 0) -> ConditioningSet:
    """Clips of a bright square moving one pixel per frame on a dark background (known continuation)."""
    g = np.random.default_rng(seed)
    video = np.full((n, frames, 3, size, size), 30, np.uint8)
    for i in range(n):
        r, c = g.integers(2, size - 8, 2)
        col = g.integers(120, 255, 3).astype(np.uint8)
        for f in range(frames):
            video[i, f, :, r:r + 4, c + f:c + f + 4] = col[:, None, None]
    v = torch.from_numpy(video)
    return ConditioningSet(v[:, 0].contiguous(), v)


# -- the SDE sampler ----------------------------------------------------------------------------------------
def test_rollout_log_probs_match_a_direct_gaussian_computation(tmp_path):
    policy = tiny_policy(tmp_path)
    pool = scripted_set(2)
    first = policy.encode_first(pool.images)
    traj = policy.rollout(first, policy.initial_noise(2, torch.Generator().manual_seed(0)), eta=0.7,
                          generator=torch.Generator().manual_seed(1))
    s = policy.steps
    assert traj.latents.shape == (2, s + 1, 4, 4, 8, 8) and traj.log_probs.shape == (2, s)
    for i in range(s):
        direct = torch.distributions.Normal(traj.means[:, i].double(), traj.stds[i].double()).log_prob(
            traj.latents[:, i + 1].double()).flatten(1).mean(1)
        torch.testing.assert_close(traj.log_probs[:, i].double(), direct, rtol=1e-5, atol=1e-5)
    # and the recorded means are the policy's transition at the recorded states
    mean, std = policy.transition(first, traj.latents[:, 2], 2, eta=0.7)
    assert torch.equal(mean, traj.means[:, 2]) and torch.equal(std, traj.stds[2])


def test_ode_sampler_is_deterministic_and_differs_from_sde_draws(tmp_path):
    policy = tiny_policy(tmp_path)
    first = policy.encode_first(scripted_set(2).images)
    noise = policy.initial_noise(2, torch.Generator().manual_seed(3))
    a, b = policy.sample(first, noise), policy.sample(first, noise)
    assert torch.equal(a, b)
    sde = policy.rollout(first, noise, 0.7, torch.Generator().manual_seed(0)).final
    assert not torch.allclose(a, sde)


def test_decoded_video_keeps_the_given_first_frame_exactly(tmp_path):
    policy = tiny_policy(tmp_path)
    pool = scripted_set(2)
    lat = policy.sample(policy.encode_first(pool.images), policy.initial_noise(2))
    video = policy.decode_video(pool.images, lat)
    assert video.shape == (2, 5, 3, 16, 16) and video.dtype == torch.uint8
    assert torch.equal(video[:, 0], pool.images)


# -- losses -------------------------------------------------------------------------------------------------
def test_pairwise_log_ratio_matches_the_gaussian_log_prob_difference():
    g = torch.Generator().manual_seed(0)
    old, new, y = (torch.randn(n, 3, 4, 4, generator=g) for n in (3, 3, 5))
    new = old + 0.1 * new
    std = torch.tensor(0.3)
    lr = pairwise_log_ratio(new, old, y, std)
    direct = torch.stack([gaussian_logprob(y, new[k].expand_as(y), std) - gaussian_logprob(y, old[k].expand_as(y),
                                                                                            std) for k in range(3)])
    torch.testing.assert_close(lr, direct, rtol=1e-4, atol=1e-5)
    assert torch.equal(pairwise_log_ratio(old, old.clone(), y, std), torch.zeros(3, 5))


def test_contrastive_loss_without_the_contrast_is_grpo():
    g = torch.Generator().manual_seed(1)
    old = torch.randn(4, 2, 3, 3, generator=g)
    new = (old + 0.01 * torch.randn(4, 2, 3, 3, generator=g)).requires_grad_()
    y = torch.randn(6, 2, 3, 3, generator=g)
    adv = torch.randn(6, generator=g)
    a, _ = contrastive_loss(new, old, y, 0.5, adv, torch.arange(4), clip=0.2, weight=0.0)
    b, _ = grpo_loss(new, old, y[:4], 0.5, adv[:4], clip=0.2)
    torch.testing.assert_close(a, b)


def test_contrastive_gradient_points_from_the_prediction_to_the_advantage_weighted_targets():
    """At ratio 1, d(-loss)/d(mu_k) = [A_k (y_k - mu_k) + lambda mean_{j != k} A_j (y_j - mu_k)] / (K sigma^2 D)."""
    g = torch.Generator().manual_seed(2)
    k, j, sigma, lam = 3, 5, 0.4, 0.7
    mu = torch.randn(k, 2, 4, generator=g)
    y = torch.randn(j, 2, 4, generator=g)
    adv = torch.randn(j, generator=g)
    new = mu.clone().requires_grad_()
    loss, st = contrastive_loss(new, mu, y, sigma, adv, torch.arange(k), clip=0.1, weight=lam)
    assert torch.equal(st["ratio"], torch.ones(k))
    loss.backward()
    d = mu[0].numel()
    expect = torch.zeros_like(mu)
    for a in range(k):
        expect[a] = adv[a] * (y[a] - mu[a])
        others = [b for b in range(j) if b != a]
        expect[a] += lam * sum(adv[b] * (y[b] - mu[a]) for b in others) / len(others)
    torch.testing.assert_close(-new.grad, expect / (k * sigma**2 * d), rtol=1e-4, atol=1e-6)


def test_policy_training_step_is_one_groups_loss(tmp_path):
    """``I2VPolicy.training_step`` (the contract's training step): TAGRPO's loss of one group at one step; ratio 1
    when the recorded means are the policy's, DanceGRPO's loss with ``weight = 0``."""
    policy = tiny_policy(tmp_path)
    pool = scripted_set(1)
    imgs = pool.images.expand(3, -1, -1, -1)
    first = policy.encode_first(imgs)
    g = torch.Generator().manual_seed(0)
    traj = policy.rollout(first, policy.initial_noise(3, g), 0.7, g)
    adv = group_advantages(torch.tensor([0.0, 1.0, 3.0]))
    batch = {"first": first, "state": traj.latents[:, 2], "step": torch.tensor(2), "old_mean": traj.means[:, 2],
             "targets": traj.latents[:, 3], "adv": adv, "own": torch.arange(3), "eta": torch.tensor(0.7),
             "clip": torch.tensor(0.2), "weight": torch.tensor(1.0)}
    out = policy.training_step(batch)
    assert out["ratio_dev"] == 0.0
    mean, std = policy.transition(first, traj.latents[:, 2], 2, 0.7)
    ref, _ = contrastive_loss(mean, traj.means[:, 2], traj.latents[:, 3], std, adv, torch.arange(3), 0.2, 1.0)
    assert torch.equal(out["loss"], ref)
    dance, _ = grpo_loss(mean, traj.means[:, 2], traj.latents[:, 3], std, adv, 0.2)
    torch.testing.assert_close(policy.training_step({**batch, "weight": torch.tensor(0.0)})["loss"], dance)


def test_group_advantages_are_normalised_per_group_and_reject_nan():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    a = group_advantages(r)
    torch.testing.assert_close(a[0].mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(a[0].std(unbiased=False), torch.tensor(1.0), atol=1e-5, rtol=0)
    assert torch.equal(a[1], torch.zeros(4))
    assert group_advantages(torch.tensor([0.0, 100.0, 0.0, 0.0]), clip=1.0).max() == 1.0
    with pytest.raises(ValueError, match="NaN"):
        group_advantages(torch.tensor([0.0, float("nan")]))


# -- the memory bank ----------------------------------------------------------------------------------------
def test_memory_bank_is_fifo_and_bounded_and_round_trips():
    bank = MemoryBank(3)
    for n in range(5):
        bank.add(BankEntry(image=n % 2, noise=("same", n % 2), latents=torch.full((2, 1), float(n)), reward=n,
                           iteration=n))
    assert len(bank) == 3 and bank.added == 5
    assert [e.iteration for e in bank] == [2, 3, 4]  # the two oldest were dropped
    assert [e.iteration for e in bank.lookup(0, ("same", 0))] == [4, 2]  # newest first
    assert [e.iteration for e in bank.lookup(0, ("same", 0), before=4)] == [2]
    assert bank.lookup(0, ("same", 1)) == [] and bank.lookup(0, ("same", 0), limit=1)[0].iteration == 4
    other = MemoryBank(3)
    other.load_state_dict(bank.state_dict())
    assert [(e.image, e.noise, e.reward, e.iteration) for e in other] == [(e.image, e.noise, e.reward, e.iteration)
                                                                         for e in bank]
    assert all(torch.equal(a.latents, b.latents) for a, b in zip(other, bank, strict=True))
    with pytest.raises(ValueError, match="capacity"):
        MemoryBank(4).load_state_dict(bank.state_dict())
    empty = MemoryBank(0)
    empty.add(BankEntry(0, 0, torch.zeros(1), 0.0, 0))
    assert len(empty) == 0 and empty.added == 1


# -- the runner ---------------------------------------------------------------------------------------------
def _runner(tmp_path, algo: AlgoConfig, seed: int = 0, pool: ConditioningSet | None = None, images: int = 2,
            **trainer_kw) -> GRPORunner:
    """A runner on the shared trainer; ``max_steps`` counts optimizer steps (``updates_per_iteration`` each)."""
    tcfg = TrainerConfig(**{"seed": seed, "max_steps": 8, "ckpt_every": 2, "log_every": 1, "tensorboard": False,
                            "device": "cpu", "grad_clip": 1.0, "progress": False, **trainer_kw})
    if "optim" not in trainer_kw:
        tcfg.optim.lr = 3e-3
        tcfg.optim.weight_decay = 0.0
    tcfg.scheduler.name = "constant"
    tcfg.scheduler.warmup_steps = 0
    return GRPORunner(tiny_policy(tmp_path), algo, tcfg, CompositeReward({"psnr": 1.0}),
                      scripted_set(4) if pool is None else pool, scripted_set(2, seed=9), tmp_path,
                      images_per_iteration=images, eval_every=2)


@pytest.mark.parametrize("loss", ["contrastive", "grpo"])
def test_ratio_is_exactly_one_before_the_first_update_and_not_after(tmp_path, loss):
    algo = AlgoConfig(loss=loss, noise="same", group_size=4, bank_size=16, updates_per_iteration=2)
    runner = _runner(tmp_path, algo)
    for _ in range(3):
        st = runner.step()
        assert st["ratio_dev_first"] == 0.0  # bit-exact: same inputs, same batch, same weights
        assert st["ratio_dev"] > 0.0  # the second chunk runs after an optimizer step
    assert runner.rollouts == 3 * 2 * 4 and len(runner.bank) == 24 - 8  # 16 = capacity
    rows = [r for r in read_metrics(tmp_path) if "ratio_dev_first" in r or "ratio_dev" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # metrics.jsonl: one row per optimizer step
    assert all(r["ratio_dev_first"] == 0.0 for r in rows[0::2]) and all(r["ratio_dev"] > 0 for r in rows[1::2])


def test_same_noise_groups_have_lower_reward_variance_than_independent_noise(tmp_path):
    """On a fixed model (the shipped pretrained video model, on rendered simulator clips), the spread of rewards
    inside a group (the un-normalised advantages) is smaller when the group shares its initial noise: what is left
    is the SDE's choices, which the policy's log-probabilities account for."""
    from core.resources import asset
    from perception.i2v_rl.rewards import RewardInputs
    from sim.render.videos import make_dataset

    policy = I2VPolicy(TAGRPOModelConfig(base_path=str(asset("checkpoints", "flexforcing")))).eval()
    make_dataset(tmp_path, n=6, seed=11, size=32, spp=1, test_fraction=0.0, frames=policy.video_frames)
    from core.data.video import VideoClipDataset

    ds = VideoClipDataset(tmp_path / "train" / "video", clip_len=policy.video_frames, step=10**9, cache="all")
    ref = torch.stack([ds[i]["video"] for i in range(len(ds))])
    reward = CompositeReward({"psnr": 1.0})
    spreads = {}
    for noise in ("same", "independent"):
        g = torch.Generator().manual_seed(0)
        var = []
        for i in range(len(ref)):
            imgs = ref[i:i + 1, 0].expand(8, -1, -1, -1)
            first = policy.encode_first(imgs)
            x0 = (policy.initial_noise(1, g).expand(8, -1, -1, -1, -1) if noise == "same"
                  else policy.initial_noise(8, g))
            traj = policy.rollout(first, x0.contiguous(), 0.3, g)
            r, _ = reward(RewardInputs(policy.decode_video(imgs, traj.final), ref[i:i + 1].expand(8, -1, -1, -1, -1)))
            var.append(float(r.var(unbiased=False)))
        spreads[noise] = sum(var) / len(var)
    assert spreads["same"] < 0.8 * spreads["independent"], spreads


def test_one_update_moves_predicted_latents_towards_the_high_reward_trajectory(tmp_path):
    policy = tiny_policy(tmp_path, 2)
    pool = scripted_set(1)
    imgs = pool.images.expand(6, -1, -1, -1)
    first = policy.encode_first(imgs)
    g = torch.Generator().manual_seed(0)
    traj = policy.rollout(first, policy.initial_noise(1, g).expand(6, -1, -1, -1, -1).contiguous(), 0.7, g)
    rewards = torch.tensor([0.0, 1.0, 0.2, 3.0, 0.1, 0.5])  # trajectory 3 is the high-reward one
    adv = group_advantages(rewards)
    i = 1
    before, std = policy.transition(first, traj.latents[:, i], i, 0.7)
    target, worst = traj.latents[3, i + 1], traj.latents[0, i + 1]
    opt = torch.optim.SGD(policy.trainable().parameters(), lr=0.5)
    mean, std = policy.transition(first, traj.latents[:, i], i, 0.7)
    loss, _ = contrastive_loss(mean, traj.means[:, i], traj.latents[:, i + 1], std, adv, torch.arange(6), clip=10.0)
    loss.backward()
    opt.step()
    with torch.no_grad():
        after, _ = policy.transition(first, traj.latents[:, i], i, 0.7)
    d = lambda m, y: (m - y).flatten(1).norm(dim=1)  # noqa: E731
    others = [0, 1, 2, 4, 5]
    assert (d(after, target)[others] < d(before, target)[others]).all()
    assert d(after, worst).mean() > d(before, worst).mean()


def test_bank_targets_and_reuse_enter_the_group(tmp_path):
    algo = AlgoConfig(loss="contrastive", noise="same", group_size=4, fresh_per_group=2, bank_size=64)
    runner = _runner(tmp_path, algo, pool=scripted_set(1), images=1)  # every later iteration finds it banked
    first = runner.step()
    assert first["targets_per_group"] == 2 and runner.rollouts == 2  # nothing banked yet
    runner.step()
    third = runner.step()
    assert runner.rollouts == 6  # two fresh rollouts per iteration only
    assert third["targets_per_group"] == 2 + 2 + 2  # fresh + reused (G - fresh) + the bank's other rollouts


def _same_policy_weights(a: GRPORunner, b: GRPORunner, exact: bool = True) -> None:
    for (n, p), q in zip(a.policy.trainable().named_parameters(), b.policy.trainable().parameters(), strict=True):
        if exact:
            assert torch.equal(p, q), n
        else:
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("kill_after", [4, 3])  # between iterations; inside one (after its first update)
def test_resume_after_a_kill_continues_bit_exactly(tmp_path, kill_after):
    """N optimizer steps straight == the same run killed after its step-k checkpoint and started again: weights,
    optimizer, the memory bank and the held-out curve come back from the trainer's checkpoint."""
    from core import checkpoint as ckpt

    algo = AlgoConfig(loss="contrastive", noise="same", group_size=3, bank_size=8)
    straight = _runner(tmp_path / "a", algo, ckpt_every=1, keep_last=10)
    straight.fit()
    killed = tmp_path / "b" / "checkpoints"
    killed.mkdir(parents=True)
    import shutil

    name = f"step_{kill_after:08d}"  # only the step-k checkpoint survived the kill
    shutil.copytree(tmp_path / "a" / "checkpoints" / name, killed / name)
    ckpt.mark_latest(killed, name)
    st = ckpt.load_checkpoint(killed)["training_state"]["model_state"][0]
    assert (st["pending"] is None) == (kill_after % 2 == 0)  # inside an iteration its rollouts are kept
    resumed = _runner(tmp_path / "b", algo, ckpt_every=1)
    resumed.fit()
    _same_policy_weights(straight, resumed)
    assert straight.curve == resumed.curve and resumed.rollouts == straight.rollouts == 4 * 2 * 3
    assert [(e.image, e.iteration, e.reward) for e in resumed.bank] == [(e.image, e.iteration, e.reward)
                                                                        for e in straight.bank]
    moved = tiny_policy(tmp_path / "c")  # and training moved the weights: the equality is not trivial
    assert not all(torch.equal(p, q) for p, q in zip(moved.trainable().parameters(),
                                                     straight.policy.trainable().parameters(), strict=True))


@pytest.mark.parametrize("noise", ["same", "independent"])
def test_gradient_checkpointing_and_bf16_autocast_keep_the_algorithm(tmp_path, noise):
    """``trainer.gradient_checkpointing`` gives the same updates; under bf16 autocast (``trainer.precision``)
    the first update's ratios are still exactly 1 (rollouts and updates share the precision) and the run learns."""
    from core.layers.checkpointing import is_checkpointed

    algo = AlgoConfig(loss="contrastive", noise=noise, group_size=3, bank_size=8)
    plain = _runner(tmp_path / "plain", algo, max_steps=4)
    plain.fit()
    ckpt_run = _runner(tmp_path / "ckpt", algo, max_steps=4, gradient_checkpointing=True)
    assert all(is_checkpointed(b) for b in ckpt_run.policy.trainable().blocks)
    ckpt_run.fit()
    _same_policy_weights(plain, ckpt_run, exact=False)
    bf16 = _runner(tmp_path / "bf16", algo, max_steps=4, precision="bf16")
    assert bf16.trainer.autocast_dtype == torch.bfloat16
    st = bf16.step()
    assert st["ratio_dev_first"] == 0.0 and st["ratio_dev"] > 0 and math.isfinite(st["loss"])


def test_the_runner_refuses_what_the_schedule_cannot_split(tmp_path):
    with pytest.raises(ConfigError, match="updates_per_iteration"):
        _runner(tmp_path, AlgoConfig(updates_per_iteration=3, group_size=3))  # 4 sampling steps
    with pytest.raises(ConfigError, match="max_steps"):
        _runner(tmp_path, AlgoConfig(group_size=3), max_steps=3)
    with pytest.raises(ConfigError, match="grad_accum"):
        _runner(tmp_path, AlgoConfig(group_size=3), grad_accum=2)


# -- configs and the CLI ------------------------------------------------------------------------------------
def test_algo_configs_compose_and_validate():
    for arm, (loss, noise) in {"tagrpo": ("contrastive", "same"), "dancegrpo": ("grpo", "independent"),
                               "tagrpo_indep": ("contrastive", "independent"),
                               "dancegrpo_same": ("grpo", "same"), "tagrpo_reuse": ("contrastive", "same"),
                               "mixgrpo": ("grpo", "same")}.items():
        cfg = compose(["experiment=tagrpo", f"algo={arm}"])
        assert (cfg.algo.loss, cfg.algo.noise, cfg.algo.name) == (loss, noise, arm)
        assert cfg.out_dir.startswith(f"outputs/tagrpo/{arm}_s")
    mix = compose(["experiment=tagrpo", "algo=mixgrpo"]).algo
    assert (mix.sde_window, mix.window_shift_every, mix.window_stride, mix.bank_size) == (2, 10, 1, 0)
    with pytest.raises(ConfigError):
        compose(["experiment=tagrpo", "algo.no_such_key=1"])
    with pytest.raises(ConfigError, match="bank_size"):
        AlgoConfig(fresh_per_group=2, bank_size=0)
    with pytest.raises(ConfigError, match="group_size"):
        AlgoConfig(group_size=1)
    with pytest.raises(ConfigError, match="loss"):
        AlgoConfig(loss="ppo")


def _saved_policy(tmp_path):
    """A post-trained tiny policy (its DiT moved off the base's) exported to ``tmp_path / "policy"``."""
    policy = tiny_policy(tmp_path)
    with torch.no_grad():
        for p in policy.trainable().parameters():
            p.add_(0.01)
    return policy.save_pretrained(tmp_path / "policy", card={"data": "test"})


def _args(**kw):
    base = dict(image=None, out=None, checkpoint=None, sde=False, eta=0.7, seed=0, overwrite=False)
    return argparse.Namespace(**{**base, **kw})


def test_infer_i2v_writes_the_video_and_refuses_bad_input_without_a_file(tmp_path):
    import cv2

    from core.data.video import probe_video
    from perception.i2v_rl.cli import infer

    policy_dir = _saved_policy(tmp_path)
    img = tmp_path / "first.png"
    cv2.imwrite(str(img), np.full((40, 30, 3), 128, np.uint8))
    out = tmp_path / "v.mp4"
    assert infer(_args(image=str(img), out=str(out), checkpoint=str(policy_dir))) == 0
    frames, _, hw = probe_video(out)
    assert (frames, hw) == (5, (16, 16))
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataError, match="bad.png"):
        infer(_args(image=str(bad), out=str(tmp_path / "b.mp4"), checkpoint=str(policy_dir)))
    with pytest.raises(DataError, match="no such file"):
        infer(_args(image=str(tmp_path / "missing.png"), out=str(tmp_path / "c.mp4"), checkpoint=str(policy_dir)))
    assert not (tmp_path / "b.mp4").exists() and not (tmp_path / "c.mp4").exists()
    with pytest.raises(ConfigError, match="exists"):
        infer(_args(image=str(img), out=str(out), checkpoint=str(policy_dir)))
    with pytest.raises(ConfigError, match="mp4"):
        infer(_args(image=str(img), out=str(tmp_path / "v.gif"), checkpoint=str(policy_dir)))


def test_policy_folder_stores_the_dit_and_references_its_base_read_only(tmp_path):
    from core.checkpoint import load_weights, save_weights
    from core.errors import CheckpointError
    from core.pretrained import load_pretrained, read_config

    base = tiny_base(tmp_path)
    before = folder_digest(base)
    policy_dir = _saved_policy(tmp_path)
    stored = load_weights(policy_dir / "model.safetensors")
    assert stored and all(k.startswith("backbone.dit.") for k in stored)  # the VAE comes from the base
    assert read_config(policy_dir)["method"] == "tagrpo"
    assert read_config(policy_dir)["model"]["base_path"] == str(base.resolve())
    policy = load_pretrained(policy_dir)
    assert isinstance(policy, I2VPolicy) and policy.frames == 5
    ref = tiny_backbone()
    for k, v in policy.backbone.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]) == (not k.startswith("dit.")), k  # only the DiT moved
    assert folder_digest(base) == before  # the base was only read
    # strict: a file missing one DiT tensor does not load
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((policy_dir / "config.json").read_text())
    save_weights(dict(list(stored.items())[1:]), broken / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing"):
        I2VPolicy.from_pretrained(broken)
    # a whole Flex-Forcing folder is a base, not a policy
    with pytest.raises(CheckpointError, match="flexforcing"):
        I2VPolicy.from_pretrained(base)
    # a policy folder may itself be the base of further post-training: its backbone is used
    again = I2VPolicy(TAGRPOModelConfig(base_path=str(policy_dir)))
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), policy.state_dict().values(),
                                                 strict=True))


def test_ship_policy_references_the_sibling_base_relatively(tmp_path):
    import shutil

    from core.pretrained import read_card, read_config
    from perception.i2v_rl.modeling_tagrpo import ship_policy

    assets = tmp_path / "assets"
    base = tiny_backbone().save_pretrained(assets / "flex")
    policy = I2VPolicy(TAGRPOModelConfig(base_path=str(base)))
    with torch.no_grad():
        policy.trainable().transformer.patch_embedding.bias.add_(0.1)
    run_policy = policy.save_pretrained(tmp_path / "run" / "policy", card={"post_training": "tagrpo, test"})
    with pytest.raises(ConfigError, match="base_ref"):
        ship_policy(run_policy, assets / "tagrpo", base_ref="../elsewhere")
    shipped = ship_policy(run_policy, assets / "tagrpo", base_ref="../flex")
    assert read_config(shipped)["model"]["base_path"] == "../flex"
    assert read_card(shipped)["post_training"] == "tagrpo, test" and read_card(shipped)["method"] == "tagrpo"
    shutil.move(str(assets), tmp_path / "moved")  # the assets tree is relocatable
    loaded = I2VPolicy.from_pretrained(tmp_path / "moved" / "tagrpo")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), policy.state_dict().values(),
                                                 strict=True))


def test_shipped_policy_is_a_tagrpo_folder_beside_its_base():
    from core.checkpoint import load_weights
    from core.pretrained import load_pretrained, read_card, read_config
    from core.resources import asset

    folder = asset("checkpoints", "tagrpo")
    config = read_config(folder)
    assert config["method"] == "tagrpo" and config["model"]["base_path"] == "../flexforcing"
    assert read_card(folder)["post_training"].startswith("tagrpo")
    assert all(k.startswith("backbone.dit.") for k in load_weights(folder / "model.safetensors"))
    policy = load_pretrained(folder)
    base = load_pretrained(asset("checkpoints", "flexforcing"))
    assert isinstance(policy, I2VPolicy) and policy.steps == 8
    sd, base_sd = policy.backbone.state_dict(), base.state_dict()
    assert all(torch.equal(sd[k], base_sd[k]) for k in sd if not k.startswith("dit."))
    assert not all(torch.equal(sd[k], base_sd[k]) for k in sd if k.startswith("dit."))


def test_train_and_evaluate_end_to_end(tmp_path):
    """`embodied train tagrpo` / `embodied eval tagrpo` as tasks: render, post-train, export, compare."""
    from core.io import read_json
    from core.pretrained import load_pretrained
    from perception.i2v_rl import task

    base = tiny_base(tmp_path)
    before = folder_digest(base)
    over = ["experiment=tagrpo", "debug=tiny", "algo=tagrpo_reuse", "algo.group_size=4", "algo.fresh_per_group=2",
            f"model.base_path={base}", f"data.root={tmp_path / 'data'}", f"data.test_root={tmp_path / 'test'}",
            "data.size=16", "data.render_n=3", "data.render_frames=6", "data.test_n=2", "data.test_frames=6",
            "data.heldout_images=2", "data.train_images=2", "data.eval_every=2", f"out_dir={tmp_path / 'run'}"]
    result = task.train(compose(over))  # debug=tiny: 4 optimizer steps, 2 per iteration
    assert result["iteration"] == 2 and result["rollouts"] == 2 * 2 * 2
    curve = read_json(tmp_path / "run" / "curve.json")["curve"]
    assert [c["iteration"] for c in curve] == [0, 2] and curve[-1]["rollouts"] == 8
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [1, 2, 3, 4]
    assert (tmp_path / "run" / "checkpoints" / "latest").is_file()
    exported = load_pretrained(tmp_path / "run" / "policy")  # a TAGRPO policy folder around the base
    assert isinstance(exported, I2VPolicy) and Path(exported.config.base_path) == base.resolve()
    moved = [k for k, v in exported.trained_state_dict().items()
             if not torch.equal(v, tiny_backbone().state_dict()[k.removeprefix("backbone.")])]
    assert moved  # the DiT was post-trained
    assert folder_digest(base) == before  # the base was only read
    # the newest training checkpoint loads as the same policy (`--checkpoint RUN`)
    from perception.i2v_rl.task import policy_folder

    assert policy_folder(tmp_path / "run") == tmp_path / "run" / "policy"
    latest = I2VPolicy.from_pretrained(tmp_path / "run" / "checkpoints")
    assert all(torch.equal(a, b) for a, b in zip(latest.state_dict().values(), exported.state_dict().values(),
                                                 strict=True))
    import cv2

    from perception.i2v_rl.cli import infer

    cv2.imwrite(str(tmp_path / "first.png"), np.full((16, 16, 3), 90, np.uint8))
    assert infer(_args(image=str(tmp_path / "first.png"), out=str(tmp_path / "run.mp4"),
                       checkpoint=str(tmp_path / "run"))) == 0
    out = task.evaluate(compose(over))
    assert set(out) >= {"base", "tuned", "gain"} and out["images"] == 2
    assert out["gain"] == pytest.approx(out["tuned"]["reward"] - out["base"]["reward"])
    assert set(out["tuned"]["diagnostics"]) == set(task.DIAGNOSTICS)
    assert set(out["references"]) == {"static", "vae_reconstruction"}
    d = out["tuned"]["diagnostics"]  # the trained reward is the motion reward: trajectory + 0.005 psnr
    assert out["rewards"] == {"trajectory": 1.0, "psnr": 0.005}
    assert d["trajectory"] + 0.005 * d["psnr"] == pytest.approx(out["tuned"]["reward"], abs=1e-5)
    with pytest.raises(ConfigError, match="no algorithm"):
        task.train(compose([o for o in over if not o.startswith("algo")] + ["~algo"]))


def test_cli_bad_image_is_one_line_and_non_zero_without_output(tmp_path):
    import subprocess
    import sys

    policy_dir = _saved_policy(tmp_path)
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8 truncated")
    out = tmp_path / "v.mp4"
    r = subprocess.run([sys.executable, "-m", "embodied.cli", "infer", "i2v", str(bad), "--out", str(out),
                        "--checkpoint", str(policy_dir)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and not out.exists()
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "broken.jpg" in lines[0], r.stderr


def test_experiment_summary_aggregates_seeds_by_iteration(tmp_path):
    from core.io import write_json
    from perception.i2v_rl.experiments import summarise, table

    for seed, (r0, r1) in enumerate([(10.0, 11.0), (10.0, 13.0)]):
        d = tmp_path / f"tagrpo_s{seed}"
        curve = [{"iteration": 0, "rollouts": 0, "reward": r0}, {"iteration": 5, "rollouts": 80, "reward": r1}]
        write_json(d / "curve.json", {"algo": {"name": "tagrpo"}, "curve": curve})
        write_json(d / "eval.json", {"gain": r1 - r0, "base": {"diagnostics": {"psnr": r0}},
                                     "tuned": {"diagnostics": {"psnr": r1}}})
    other = tmp_path / "tagrpo_same_s0"  # another arm whose folder starts like this one's
    write_json(other / "curve.json", {"algo": {"name": "tagrpo_same"}, "curve": curve})
    write_json(other / "eval.json", {"gain": 99.0, "base": {"diagnostics": {"psnr": 0.0}},
                                     "tuned": {"diagnostics": {"psnr": 99.0}}})
    row, _ = sorted(summarise(tmp_path), key=lambda r: r["arm"])
    assert row["arm"] == "tagrpo" and row["seeds"] == 2 and row["iterations"] == 5 and row["rollouts"] == 80
    assert row["final"]["mean"] == 12.0 and row["final"]["sd"] == pytest.approx(2**0.5)
    assert row["gain_per_seed"] == [1.0, 3.0] and row["diagnostics"]["tuned"]["psnr"]["mean"] == 12.0
    assert row["eval_gain"]["mean"] == 2.0  # the other arm's eval.json is not mixed in
    assert "| tagrpo | 2 | 5 | 80 |" in table([row])


# -- scaling: FSDP2 on 2 processes ----------------------------------------------------------------------------
# plain SGD: Adam would blow the reduction-order noise of the sharded gradients up to a fraction of its lr
SGD = {"name": "sgd", "lr": 0.5, "momentum": 0.0, "weight_decay": 0.0}
_FSDP_CHILD = """
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, {tests!r})
from test_tagrpo import _runner, tiny_base
from perception.i2v_rl.configuration_tagrpo import AlgoConfig
from test_tagrpo import SGD

out = Path(sys.argv[1])
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    tiny_base(out)  # the base, written once
dist.barrier()
algo = AlgoConfig(loss="contrastive", noise="same", group_size=3, bank_size=8)
_runner(out, algo, max_steps=4, strategy="fsdp", gradient_checkpointing=True, optim=SGD).fit()
"""


@pytest.mark.slow  # 75-90 s measured on the 2 shared CPU cores at load 5 (33 s of CPU for both processes)
def test_fsdp_on_two_processes_equals_one_process(tmp_path):
    """torchrun, 2 gloo processes under ``trainer.strategy=fsdp`` (with gradient checkpointing), each rolling out
    one of the iteration's 2 images == 1 plain process rolling out both: same rollouts, bank, curve and weights."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from core import checkpoint as ckpt

    algo = AlgoConfig(loss="contrastive", noise="same", group_size=3, bank_size=8)
    single = _runner(tmp_path / "single", algo, max_steps=4, optim=SGD)
    single.fit()
    script = tmp_path / "child.py"
    script.write_text(_FSDP_CHILD.format(tests=str(Path(__file__).parent)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           f"--rdzv-endpoint=127.0.0.1:{port}", str(script), str(tmp_path / "fsdp")]
    res = subprocess.run(cmd, env=env, cwd=repo, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = ckpt.load_weights(ckpt.resolve_checkpoint(tmp_path / "fsdp") / ckpt.MODEL_FILE)  # gathered, full
    ref = ckpt.load_weights(ckpt.resolve_checkpoint(tmp_path / "single") / ckpt.MODEL_FILE)
    init = {f"backbone.{k}": v for k, v in tiny_backbone().state_dict().items()}
    assert got.keys() == ref.keys() == init.keys()
    # reduction order (reduce-scatter, the sharded grad-norm) only: 4 SGD steps move the weights 1000x further
    diff = max(float((got[k] - ref[k]).abs().max()) for k in ref)
    moved = max(float((ref[k] - init[k]).abs().max()) for k in ref)
    assert diff < 1e-3 * moved and moved > 1e-3, (diff, moved)
    fsdp_state = ckpt.load_checkpoint(tmp_path / "fsdp")["training_state"]
    banks = [s["bank"] for s in fsdp_state["model_state"]]
    assert len(banks) == 2 and banks[0]["added"] == banks[1]["added"] == single.bank.added == 12  # one bank
    assert banks[0]["entries"][-1]["iteration"] == 1 and len(banks[1]["entries"]) == len(single.bank) == 8
    assert [e["reward"] for e in banks[0]["entries"]] == pytest.approx([e.reward for e in single.bank], abs=1e-4)
    curve = json.loads((tmp_path / "fsdp" / "curve.json").read_text())["curve"]
    assert [c["iteration"] for c in curve] == [c["iteration"] for c in single.curve] == [0, 2]
    assert [c["reward"] for c in curve] == pytest.approx([c["reward"] for c in single.curve], abs=1e-4)


# -- the Wan backbone: Wan2.2-TI2V's layout, temporal compression, rectangular frames, a user's Wan folder -------
def test_video_of_a_temporally_compressing_vae_on_rectangular_frames(tmp_path):
    """r = 2 and 16 x 24 frames: N new latent frames decode with the first latent into 1 + N r video frames, the
    given image is frame 0 exactly, and the rewards compare them with as many simulator frames."""
    from perception.i2v_rl.rewards import RewardInputs

    cfg = tiny_config(frame_size=[16, 24], vae_temporal_downsample=[True], num_frames=3, max_context=1,
                      sample_steps=4)
    base = tiny_backbone(0, cfg).save_pretrained(tmp_path / "flex_r2")
    policy = I2VPolicy(tiny_policy_config(base_path=str(base), sample_steps=3))
    assert policy.temporal_factor == 2 and policy.latent_shape() == (2, 4, 8, 12) and policy.video_frames == 5
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (2, 3, 16, 24), generator=g, dtype=torch.uint8)
    first = policy.encode_first(images)
    assert first.shape == (2, 1, 4, 8, 12)
    traj = policy.rollout(first, policy.initial_noise(2, g), 0.3, g)
    video = policy.decode_video(images, traj.final, first)
    assert video.shape == (2, 5, 3, 16, 24) and torch.equal(video[:, 0], images)
    assert torch.equal(video, policy.decode_video(images, traj.final))  # the first latent re-encoded is the same
    ref = torch.randint(0, 256, (2, 5, 3, 16, 24), generator=g, dtype=torch.uint8)
    ref[:, 0] = images
    total, terms = CompositeReward({"trajectory": 1.0, "psnr": 0.01})(RewardInputs(video, ref))
    assert total.shape == (2,) and torch.isfinite(total).all() and set(terms) == {"trajectory", "psnr"}
    with pytest.raises(ValueError, match="16, 24"):
        policy.encode_first(torch.zeros(1, 3, 16, 16, dtype=torch.uint8))


@pytest.mark.parametrize("chunking", ["random", "one"])
def test_the_first_frame_is_a_clean_latent_in_its_own_chunk_or_inline(tmp_path, chunking):
    """Chunked bases: the first frame is chunk 0 (its output cannot see the new frames); a ``chunking=one`` base:
    it sits inline under full attention, as in Wan2.2-TI2V. Both at t = 0 and frame position 0."""
    kw = {"chunking": "one", "noise": "per_clip", "k_projection": False} if chunking == "one" else {}
    base = tiny_backbone(0, tiny_config(num_frames=5, max_context=1, **kw)).save_pretrained(tmp_path / chunking)
    policy = I2VPolicy(tiny_policy_config(base_path=str(base)))
    assert policy.inline_first == (chunking == "one")
    g = torch.Generator().manual_seed(0)
    first, x = torch.randn(2, 1, 4, 8, 8, generator=g), torch.randn(2, 4, 4, 8, 8, generator=g)
    seen = {}

    def spy(dit, args, kwargs):
        seen.update(x=args[0], t=args[1], frames=args[2], chunks=args[3] if len(args) > 3 else kwargs.get("chunks"))

    hook = policy.backbone.dit.register_forward_pre_hook(spy, with_kwargs=True)
    v = policy.velocity(first, x, 0.6)
    hook.remove()
    assert v.shape == x.shape and torch.equal(seen["x"][:, :1], first)
    assert torch.equal(seen["t"][:, 0], torch.zeros(2)) and bool((seen["t"][:, 1:] == 0.6).all())
    assert torch.equal(seen["frames"], torch.arange(5))
    dit = policy.backbone.dit
    tt = seen["t"]
    out_a = dit(torch.cat([first, x], 1), tt, torch.arange(5), seen["chunks"])
    out_b = dit(torch.cat([first, x + 1.0], 1), tt, torch.arange(5), seen["chunks"])
    if chunking == "one":
        assert seen["chunks"] is None and not torch.allclose(out_a[:, 0], out_b[:, 0])  # full attention
    else:
        assert seen["chunks"].tolist() == [0, 1, 1, 1, 1]
        torch.testing.assert_close(out_a[:, 0], out_b[:, 0])  # the clean first frame is an earlier chunk


def _wan_pipeline(folder: Path, k: int = 4) -> Path:
    """A tiny Wan2.1-structured diffusers pipeline folder written by ``save_pretrained``: transformer/ + vae/."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    from core.layers.wan import wan_transformer_config

    torch.manual_seed(5)
    WanTransformer3DModel(**wan_transformer_config(num_heads=2, head_dim=16, num_layers=2, ffn_dim=64, in_channels=k,
                                                   text_dim=16, patch=2, freq_dim=32)).save_pretrained(
        folder / "transformer")
    AutoencoderKLWan(base_dim=8, z_dim=k, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False]
                     ).save_pretrained(folder / "vae")
    (folder / "model_index.json").write_text('{"_class_name": "WanPipeline", "_diffusers_version": "0.42.1", '
                                             '"transformer": ["diffusers", "WanTransformer3DModel"], '
                                             '"vae": ["diffusers", "AutoencoderKLWan"]}')
    return folder


def test_a_users_wan_pipeline_folder_is_a_base_from_outside_the_repository(tmp_path, monkeypatch):
    """`embodied train tagrpo model.base_path=<a Wan diffusers folder>` from another working directory: the
    registry's Flex-Forcing class is built around it, the policy stores the DiT and references the folder, loading
    rebuilds from it, and the folder is byte-identical afterwards."""
    from core.checkpoint import load_weights
    from core.pretrained import load_pretrained, read_config
    from perception.i2v_rl import task
    from perception.i2v_rl.modeling_tagrpo import is_wan_folder

    wan = _wan_pipeline(tmp_path / "Wan2.1-tiny-Diffusers")
    assert is_wan_folder(wan) and is_wan_folder(wan / "transformer") and not is_wan_folder(wan / "vae")
    before = folder_digest(wan)
    monkeypatch.chdir(tmp_path)
    over = ["experiment=tagrpo", "debug=tiny", "algo.group_size=2", f"model.base_path={wan}", "model.frames=3",
            "model.sample_steps=2", "algo.updates_per_iteration=1", "data.root=data", "data.test_root=test",
            "data.size=16", "data.render_n=2", "data.render_frames=4", "data.test_n=1", "data.test_frames=4",
            "data.heldout_images=1", "data.train_images=1", "data.images_per_iteration=1", "data.eval_every=2",
            "out_dir=run"]
    result = task.train(compose(over))
    assert result["iteration"] == 4
    folder = tmp_path / "run" / "policy"
    config = read_config(folder)
    assert config["model"]["base_path"] == str(wan.resolve()) and config["model"]["frame_size"] == 16
    stored = load_weights(folder / "model.safetensors")
    assert stored and all(k.startswith("backbone.dit.transformer.") for k in stored)  # no K-projection: inline
    policy = load_pretrained(folder)
    assert isinstance(policy, I2VPolicy) and policy.inline_first and policy.latent_shape() == (2, 4, 8, 8)
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in stored.items())
    fresh = I2VPolicy(TAGRPOModelConfig(base_path=str(wan), frame_size=16, frames=3))
    assert any(not torch.equal(fresh.state_dict()[k], v) for k, v in stored.items())  # it was post-trained
    assert folder_digest(wan) == before  # only read
    with pytest.raises(ConfigError, match="vae_path"):
        I2VPolicy(TAGRPOModelConfig(base_path=str(tiny_base(tmp_path)), vae_path=str(wan / "vae")))


def test_a_wan_transformer_folder_with_a_vae_folder_and_the_k_projection(tmp_path):
    from core.pretrained import load_pretrained

    wan = _wan_pipeline(tmp_path / "wan")
    before = folder_digest(wan)
    policy = I2VPolicy(TAGRPOModelConfig(base_path=str(wan / "transformer"), vae_path=str(wan / "vae"),
                                         frame_size=[16, 24], k_projection=True, frames=3, sample_steps=2))
    assert not policy.inline_first and policy.latent_shape() == (2, 4, 8, 12)
    assert any(k.startswith("backbone.dit.kproj.") for k in policy.trained_state_dict())
    with torch.no_grad():
        policy.trainable().transformer.proj_out.bias.add_(0.1)
    loaded = load_pretrained(policy.save_pretrained(tmp_path / "policy"))
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), policy.state_dict().values(),
                                                 strict=True))
    images = torch.randint(0, 256, (1, 3, 16, 24), dtype=torch.uint8)
    lat = loaded.sample(loaded.encode_first(images), loaded.initial_noise(1))
    assert loaded.decode_video(images, lat).shape == (1, 3, 3, 16, 24)
    assert folder_digest(wan) == before


# -- the policy-gradient coefficient under the time shift -------------------------------------------------------
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_step_coefficients_match_the_closed_form_and_balancing_equalises_them(shift):
    from core.diffusion import timestep_grid
    from perception.i2v_rl.grpo import step_coefficients, step_weights

    steps, eta = 8, 0.3
    rows = step_coefficients(steps, shift, eta)
    grid = timestep_grid(steps, shift, dtype=torch.float64).tolist()
    for i, r in enumerate(rows):
        t, tn = grid[i], grid[i + 1]
        dt = tn - t
        ts = min(t, 1 + dt)  # sde_step's clamp away from t = 1
        sigma = eta * math.sqrt(ts / (1 - ts))
        assert r.std == pytest.approx(sigma * math.sqrt(-dt), rel=1e-9)
        assert r.dmean_dv == pytest.approx(dt * (1 + sigma**2 * (1 - t) / (2 * t)), rel=1e-9)
        assert r.coefficient == pytest.approx(r.dmean_dv / r.std**2, rel=1e-9)
        if ts == t:  # unclamped: sigma_t^2 (1 - t) / (2 t) = eta^2 / 2
            assert r.dmean_dv == pytest.approx(dt * (1 + eta**2 / 2), rel=1e-9)
    scale = [r.scale for r in rows]
    assert all(a < b for a, b in zip(scale, scale[1:], strict=False))  # grows towards the data end
    assert scale[-1] / scale[0] > (15 if shift == 3.0 else 6)
    w = step_weights(steps, shift, eta)
    assert float(w.mean()) == pytest.approx(1.0)
    prod = w * torch.tensor(scale, dtype=torch.float64)
    assert float(prod.max() - prod.min()) < 1e-9 * float(prod.mean())
    assert torch.equal(step_weights(steps, shift, eta, "none"), torch.ones(steps, dtype=torch.float64))


def test_balanced_step_weighting_scales_each_steps_loss_by_its_weight(tmp_path):
    from torch.utils.data import default_collate

    from perception.i2v_rl.grpo import step_weights

    losses = {}
    for mode in ("none", "balanced"):
        algo = AlgoConfig(loss="contrastive", group_size=3, bank_size=8, step_weighting=mode)
        runner = _runner(tmp_path / mode, algo)
        learner = runner.learner
        batch = default_collate([runner.schedule[j] for j in range(2)])
        prepared = learner.prepare_batch(batch)
        losses[mode] = learner.training_step(prepared)["loss"].detach()
        step = prepared["timestep"]
    w = step_weights(4, 1.0, 0.3)
    torch.testing.assert_close(losses["balanced"], losses["none"] * float(w[step]))
    assert float(w[step]) != pytest.approx(1.0)
    with pytest.raises(ConfigError, match="step_weighting"):
        AlgoConfig(step_weighting="snr")


@pytest.mark.slow  # 28 s (renders two clips, four CLI runs); the video side runs in the fast suite
def test_infer_i2v_continues_the_scene_it_is_given(tmp_path):
    """`embodied infer i2v` on a policy around the shipped Flex-Forcing base (its DiT as the base trained it): on
    the shipped sample frame and on held-out simulator first frames, the first generated frames stay closer to the
    given frame than to a blank (mid-grey) control frame, and closer to it than the video of a blank image is."""
    import cv2

    from core.data.video import VideoClipDataset, read_frames
    from core.resources import asset
    from perception.i2v_rl.cli import infer
    from perception.i2v_rl.configuration_tagrpo import TAGRPOModelConfig
    from perception.i2v_rl.modeling_tagrpo import I2VPolicy
    from sim.render.videos import make_dataset

    base = asset("checkpoints", "flexforcing")
    policy_dir = I2VPolicy(TAGRPOModelConfig(base_path=str(base))).save_pretrained(tmp_path / "policy")
    make_dataset(tmp_path / "clips", n=2, seed=7000, size=32, spp=4, test_fraction=0.0, frames=2)
    ds = VideoClipDataset(tmp_path / "clips" / "train" / "video", clip_len=1, step=10**9, cache="all")
    images = [cv2.imread(str(base / "sample_first_frame.png"))]
    images += [ds[i]["video"][0].permute(1, 2, 0).numpy()[..., ::-1] for i in range(len(ds))]
    images.append(np.full((32, 32, 3), 128, np.uint8))  # the blank control
    videos = []
    for i, im in enumerate(images):
        cv2.imwrite(str(tmp_path / f"{i}.png"), im)
        assert infer(_args(image=str(tmp_path / f"{i}.png"), out=str(tmp_path / f"{i}.mp4"),
                           checkpoint=str(policy_dir))) == 0
        videos.append(torch.from_numpy(read_frames(tmp_path / f"{i}.mp4", 0, 5)).float())  # (T, H, W, 3) RGB
    blank_video = videos.pop()
    for v in videos:
        given, new = v[0], v[1:3]  # mp4 round trip: compare decoded frames with the decoded first frame
        to_given = float((new - given).abs().mean())
        assert to_given < float((new - 128.0).abs().mean())
        assert to_given < float((blank_video[1:3] - given).abs().mean())


# -- MixGRPO's sliding SDE window and GRPO-Guard's ratio diagnostic -------------------------------------------
def test_outside_the_window_the_rollout_is_the_deterministic_ode(tmp_path):
    """Steps outside ``sde_steps`` are the ODE's: two rollouts with different SDE draws agree up to the window and
    differ after it; those steps record std 0 and log-probability 0; a rollout with no SDE step is ``sample``."""
    policy = tiny_policy(tmp_path)  # 4 steps
    first = policy.encode_first(scripted_set(2).images)
    noise = policy.initial_noise(2, torch.Generator().manual_seed(3))
    a = policy.rollout(first, noise, 0.7, torch.Generator().manual_seed(0), sde_steps=[2])
    b = policy.rollout(first, noise, 0.7, torch.Generator().manual_seed(1), sde_steps=[2])
    assert torch.equal(a.latents[:, :3], b.latents[:, :3])  # x_0, x_1, x_2: ODE steps 0 and 1
    assert not torch.allclose(a.latents[:, 3], b.latents[:, 3])  # the SDE step 2 drew different noise
    assert torch.equal(a.stds[[0, 1, 3]], torch.zeros(3)) and a.stds[2] > 0
    assert torch.equal(a.log_probs[:, [0, 1, 3]], torch.zeros(2, 3)) and (a.log_probs[:, 2] != 0).all()
    # the ODE step after the window is deterministic given its state
    from core.diffusion import euler_step

    v = policy.velocity(first, a.latents[:, 3], policy.grid[3])
    assert torch.equal(a.latents[:, 4], euler_step(a.latents[:, 3], v, policy.grid[3], policy.grid[4]))
    ode = policy.rollout(first, noise, 0.7, torch.Generator().manual_seed(5), sde_steps=[])
    assert torch.equal(ode.final, policy.sample(first, noise))
    full = policy.rollout(first, noise, 0.7, torch.Generator().manual_seed(0))  # None: the SDE everywhere
    assert (full.stds > 0).all()


def test_the_window_slides_from_the_noise_end_to_the_data_end_and_stays():
    algo = AlgoConfig(sde_window=2, window_shift_every=3, window_stride=1)
    starts = [algo.window(it, 8)[0] for it in range(24)]
    assert starts == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3 + [4] * 3 + [5] * 3 + [6] * 6
    assert algo.window(100, 8) == [6, 7] and algo.window(4, 8) == [1, 2]
    assert AlgoConfig(sde_window=4, window_shift_every=1, window_stride=2).window(1, 8) == [2, 3, 4, 5]
    assert AlgoConfig().window(7, 8) == list(range(8))  # no window: every step
    with pytest.raises(ConfigError, match="sde_window"):
        AlgoConfig(sde_window=0)
    with pytest.raises(ConfigError, match="timestep_fraction"):
        AlgoConfig(sde_window=2, timestep_fraction=0.5)
    with pytest.raises(ConfigError, match="exceeds"):
        AlgoConfig(sde_window=9).window(0, 8)


def test_mixgrpo_trains_only_the_windows_steps_with_the_ode_elsewhere(tmp_path):
    """A MixGRPO run's rollouts are the ODE outside the window and its loss is taken at the window's steps only
    (the window moving every iteration here, clamped at the data end): GRPO-Guard's log, written by the loss at
    every step it computes, names exactly the window's steps."""
    algo = AlgoConfig(loss="grpo", noise="independent", group_size=3, bank_size=0, sde_window=2,
                      window_shift_every=1, updates_per_iteration=2)
    runner = _runner(tmp_path, algo)
    assert runner.schedule.micro == 1  # one trained step per update: 2 of the 4 steps per iteration
    learner = runner.learner
    seen = []
    orig = learner.policy.rollout

    def spy(*a, **kw):
        traj = orig(*a, **kw)
        seen.append(((traj.stds > 0).nonzero().flatten().tolist(), kw["sde_steps"]))
        return traj

    learner.policy.rollout = spy
    for _ in range(4):
        runner.step()
    assert [s for s, _ in seen] == [w for _, w in seen] == [[0, 1], [1, 2], [2, 3], [2, 3]]
    log = learner.ratio_log
    assert [r["iteration"] for r in log] == [0, 1, 2, 3]
    assert [[e["step"] for e in r["steps"]] for r in log] == [[0, 1], [1, 2], [2, 3], [2, 3]]
    assert all(r["window"] == [e["step"] for e in r["steps"]] for r in log)


@pytest.mark.parametrize("algo", [
    AlgoConfig(loss="contrastive", noise="same", group_size=3, bank_size=8),
    AlgoConfig(loss="grpo", noise="independent", group_size=3, bank_size=0),
    AlgoConfig(loss="grpo", noise="independent", group_size=3, bank_size=0, sde_window=2, window_shift_every=1)],
    ids=["tagrpo", "dancegrpo", "mixgrpo"])
def test_grpo_guard_ratio_mean_is_one_in_the_first_update_and_logged_per_trained_step(tmp_path, algo):
    """GRPO-Guard's diagnostic for every arm: per iteration, one entry per trained step; in the first update the
    policy is the old policy, so every ratio is 1: mean exactly 1, sd exactly 0; after an optimizer step the mean
    moves; the log goes to curve.json and survives in the checkpoint."""
    from core.io import read_json

    runner = _runner(tmp_path, algo, max_steps=6)
    runner.fit()
    log = runner.learner.ratio_log
    assert [r["iteration"] for r in log] == [0, 1, 2]
    for r in log:
        trained = [s for chunk in runner.learner.timesteps(r["iteration"]) for s in chunk]
        assert [e["step"] for e in r["steps"]] == trained
        first = [e for e in r["steps"] if e["update"] == 0]
        later = [e for e in r["steps"] if e["update"] == 1]
        assert first and later
        assert all(e["mean"] == 1.0 and e["sd"] == 0.0 and e["n"] == 2 * 3 for e in first)
        assert all(e["mean"] != 1.0 and e["sd"] > 0 for e in later)
    assert read_json(tmp_path / "curve.json")["ratio_steps"] == log
    rows = [r for r in read_metrics(tmp_path) if "ratio_mean" in r]
    assert len(rows) == 6 and all(r["ratio_mean"] == 1.0 for r in rows[0::2])


def test_experiment_summary_reports_grpo_guard_flattening_and_seconds(tmp_path):
    from core.io import write_json
    from perception.i2v_rl.experiments import GUARD_LAST, flattens_at, guard, summarise, table

    def ratio_steps(seed):
        out = []
        for it in range(GUARD_LAST + 5):
            early = it < 5  # left out of the summary: before the last GUARD_LAST iterations
            out.append({"iteration": it, "window": [0, 1], "seconds": {"iteration": 3.0, "rollout": 1.0, "eval": 0.5,
                                                                        "update": 1.5},
                        "steps": [{"step": 0, "update": 0, "mean": 1.0, "sd": 0.0, "n": 16},
                                  {"step": 1, "update": 1, "mean": 0.5 if early else 1 - 0.002 * (seed + 1),
                                   "sd": 0.001, "n": 16}]})
        return out

    for seed in (0, 1):
        curve = [{"iteration": i, "rollouts": 16 * i, "reward": r}
                 for i, r in zip(range(0, 35, 5), [0.0, 0.5, 0.8, 1.0, 1.01, 0.99, 1.0 + 0.01 * seed], strict=True)]
        write_json(tmp_path / f"mixgrpo_s{seed}" / "curve.json",
                   {"algo": {"name": "mixgrpo"}, "curve": curve, "ratio_steps": ratio_steps(seed)})
    g = guard(ratio_steps(0))
    assert g["steps"][0] == {"ratio_m1": 0.0, "sd": 0.0, "update": 0}
    assert g["steps"][1]["ratio_m1"] == pytest.approx(-0.002) and g["off_policy"] == pytest.approx(-0.002)
    assert g["seconds"] == {"iteration": 45.0, "rollout": 15.0, "eval": 7.5, "update": 22.5}
    moving = [{"iteration": 0, "steps": [{"step": 3, "update": 1, "mean": 0.99, "sd": 0.0}]},
              {"iteration": 1, "steps": [{"step": 3, "update": 0, "mean": 1.0, "sd": 0.0}]}]
    assert guard(moving)["steps"][3] == {"ratio_m1": pytest.approx(-0.01), "sd": 0.0, "update": 1}
    (row,) = summarise(tmp_path)
    assert row["guard"]["1"]["mean"] == pytest.approx(-0.003) and row["guard"]["1"]["sd"] == pytest.approx(
        0.002 / 2**0.5)
    assert row["guard"]["0"]["mean"] == 0.0 and row["guard_off_policy"]["mean"] == pytest.approx(-0.003)
    assert row["seconds"]["iteration"]["mean"] == 45.0 and row["flattens_at"] == 15
    text = table([row])
    assert "| 0 * | -3.00 ± 1.41 | -3.00 |" in text and "| 15 | 45 ± 0 | 22 ± 0 |" in text
    # a curve still rising at its end flattens only there; a short one has no answer
    rising = [{"iteration": i, "mean": float(i), "sd": 0.1} for i in range(0, 30, 5)]
    assert flattens_at(rising) is None and flattens_at(rising[:3]) is None
    assert flattens_at(rising + [{"iteration": i, "mean": 25.05, "sd": 0.1} for i in (30, 35, 40)]) == 25


def test_demo_shows_every_recorded_comparison_with_the_guard_rows(tmp_path, monkeypatch):
    """The demo's recorded part: the shipped comparison.json and a peers.json with the MixGRPO arm, its seconds and
    GRPO-Guard's per-step ratio means, each as a table (and the guard table) with its curves."""
    from core.demo import DemoContext
    from core.io import write_json
    from perception.i2v_rl import demo

    stat = {"mean": 0.001, "sd": 0.0005}
    row = {"arm": "mixgrpo", "seeds": 3, "iterations": 60, "rollouts": 960.0, "base": 0.0012, "final": stat,
           "gain": stat, "mean_gain": stat, "drops": stat, "flattens_at": 40,
           "curve": [{"iteration": 0, "rollouts": 0, "mean": 0.0012, "sd": 0.0}, {"iteration": 5, "rollouts": 80,
                                                                                    "mean": 0.002, "sd": 0.001}],
           "seconds": {"iteration": {"mean": 200.0, "sd": 5.0}, "update": {"mean": 50.0, "sd": 1.0}},
           "guard": {"5": {"mean": 0.0, "sd": 0.0, "update": 0}, "6": {"mean": -0.0021, "sd": 0.0003, "update": 1}}}
    old = {k: v for k, v in row.items() if k not in ("seconds", "guard", "flattens_at")} | {"arm": "tagrpo"}
    write_json(tmp_path / "samples" / "comparison.json", {"command": "old", "rows": [old]})
    write_json(tmp_path / "samples" / "peers.json", {"command": "new", "rows": [row, old]})
    monkeypatch.setattr(demo, "SAMPLES", tmp_path / "samples")
    html = demo._recorded(DemoContext(tmp_path / "page"))
    assert html.count("<h3>") == 2 and "MixGRPO" in html and "mixgrpo" in html
    assert "-2.10 ± 0.30" in html and "0 (on-policy)" in html and ">200<" in html and ">40<" in html
    assert (tmp_path / "page" / "img" / "tagrpo_peers_curves.png").is_file()


def test_the_per_element_ratio_drifts_below_one_by_the_mean_shift_over_sigma_squared():
    """GRPO-Guard's drift, derived: for targets sampled under the old mean, y = mu_old + sigma z, and a new mean
    mu_old + delta, the per-element log-ratio is z.delta / (sigma D) - mean(delta^2) / (2 sigma^2): its mean is
    biased by -mean(delta^2) / (2 sigma^2) while its spread shrinks like 1 / sqrt(D), so the ratio mean sits below 1
    by that much, most at the low-noise steps (small sigma). The full-dimensional density ratio is unbiased."""
    from perception.i2v_rl.grpo import grpo_loss

    g = torch.Generator().manual_seed(0)
    k, d = 4096, 2048
    old = torch.randn(k, d, generator=g, dtype=torch.float64)
    delta = 0.002 * torch.randn(k, d, generator=g, dtype=torch.float64)
    drift = {}
    for sigma in (0.28, 0.04):  # the noise-end and the data-end step of the 8-step grid
        y = old + sigma * torch.randn(k, d, generator=g, dtype=torch.float64)
        _, st = grpo_loss(old + delta, old, y, sigma, torch.ones(k, dtype=torch.float64), clip=1.0)
        bias = float((delta**2).mean() / (2 * sigma**2))
        log_r = torch.log(st["ratio"])
        assert float(log_r.mean()) == pytest.approx(-bias, rel=0.2)
        assert float(st["ratio"].mean()) - 1 == pytest.approx(-bias, rel=0.2)
        assert float(log_r.std()) == pytest.approx(float(delta.norm(dim=1).mean()) / (sigma * d), rel=0.1)
        drift[sigma] = float(st["ratio"].mean()) - 1
        if sigma == 0.28:
            full = torch.exp(d * log_r)  # the unnormalised density ratio: unbiased
            assert abs(float(full.mean()) - 1) < 6 * float(full.std()) / k**0.5
    assert drift[0.04] < 20 * drift[0.28] < 0  # (0.28 / 0.04)^2 = 49 times the drift at the data end


def test_demo_lead_names_the_shipped_reward():
    """The demo's lead says the reward the shipped policy was trained on (its card), not a fixed one: the shipped
    card's trajectory + 0.005 PSNR reads with the trajectory term first and PSNR's weight."""
    from core.pretrained import read_card
    from perception.i2v_rl.demo import POLICY, _reward_words

    assert _reward_words({"psnr": 1.0}) == "the frames' PSNR"
    words = _reward_words(read_card(POLICY)["metrics"]["rewards"])
    assert words.startswith("agreement of the moving object's tracked path") and "0.005 x the frames' PSNR" in words
    assert _reward_words({"mystery": 2.0}) == "2 x mystery"
