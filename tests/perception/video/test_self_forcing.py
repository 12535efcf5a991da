"""The Self-Forcing arm: the rollout conditions on the student's own frames, the gradient reaches the student only
through each frame's exit step, DMD and the critic's loss reach disjoint parameters, training moves the student's
samples toward the teacher's, and a trained run reloads as a plain Flex-Forcing model; VBench's
temporal_flickering against its own formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.diffusion import timestep_grid
from perception.video import self_forcing as sf
from perception.video.modeling_flexforcing import FlexForcingModel, tiny_config
from perception.video.vbench import temporal_flickering

CFG = dict(num_frames=5, max_context=2)


def _perturb(model: FlexForcingModel, seed: int, std: float = 0.1) -> FlexForcingModel:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.dit.parameters():
            if p.abs().sum() == 0:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sf")
    torch.manual_seed(0)
    _perturb(FlexForcingModel(tiny_config(**CFG)), 0).save_pretrained(root / "teacher")
    torch.manual_seed(1)
    FlexForcingModel(tiny_config(**CFG)).save_pretrained(root / "init")
    return root


def student(folders, **kw) -> FlexForcingModel:
    return FlexForcingModel(tiny_config(**CFG, objective="self_forcing", init_path=str(folders / "init"),
                                        teacher_path=str(folders / "teacher"), **kw)).train()


def clip(b: int = 4, seed: int = 5) -> torch.Tensor:
    return torch.randn(b, 5, 4, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_student_starts_from_init_critic_from_teacher_and_the_teacher_is_not_saved(folders):
    m = student(folders)
    init = FlexForcingModel.from_pretrained(folders / "init", use_ema=False)
    teacher = FlexForcingModel.from_pretrained(folders / "teacher", use_ema=False)
    for k, v in init.dit.state_dict().items():
        assert torch.equal(m.dit.state_dict()[k], v)
    for k, v in teacher.dit.state_dict().items():
        assert torch.equal(m.critic.state_dict()[k], v)
    assert not any(k.startswith("_sf_teacher") for k in m.state_dict())
    assert all(not p.requires_grad for p in m._sf_teacher.parameters())


def test_rollout_conditions_on_its_own_frames_not_the_ground_truth(folders, monkeypatch):
    from perception.video import pipeline_flexforcing as pf

    m = student(folders)
    z = clip()
    cached = []
    real = pf.fill_cache

    def spy(model, cache, lat, frames):
        cached.append((frames.tolist(), lat.clone()))
        real(model, cache, lat, frames)

    monkeypatch.setattr(pf, "fill_cache", spy)
    grid = timestep_grid(m.config.sample_steps)
    x = sf.rollout(m, z[:, :2], 3, [3, 0, 2], grid, noise=torch.randn(4, 3, 4, 8, 8))
    assert [f for f, _ in cached] == [[0, 1], [2], [3], [4]]
    assert torch.equal(cached[0][1], z[:, :2])  # the given frames ...
    for i in range(3):  # ... then exactly the student's frames, which are not the ground truth's
        assert torch.equal(cached[i + 1][1], x[:, i:i + 1].detach())
        assert (x[:, i] - z[:, 2 + i]).abs().max() > 0.1
    # the context matters: another first generated frame changes the next one
    noise = torch.randn(4, 3, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    other = noise.clone()
    other[:, 0] += 1.0
    a = sf.rollout(m, z[:, :2], 2, [3, 3], grid, noise=noise)
    b = sf.rollout(m, z[:, :2], 2, [3, 3], grid, noise=other)
    assert (a[:, 1] - b[:, 1]).abs().max() > 1e-4


def test_gradient_reaches_the_student_only_through_each_frames_exit_step(folders):
    m = student(folders)
    calls = []
    real = m.dit.forward

    def spy(x, t, frames, *args, **kw):
        calls.append((torch.is_grad_enabled(), float(t.max()), frames.tolist()))
        return real(x, t, frames, *args, **kw)

    m.dit.forward = spy
    grid = timestep_grid(m.config.sample_steps)
    exits = [2, 0, 3]
    x = sf.rollout(m, clip()[:, :2], 3, exits, grid)
    with_grad = [c for c in calls if c[0]]
    assert [(c[1], c[2]) for c in with_grad] == [(pytest.approx(float(grid[s])), [2 + i]) for i, s in enumerate(exits)]
    assert len(calls) == 1 + sum(s + 2 for s in exits)  # context fill; per frame: exit steps, exit, cache fill
    x.sum().backward()
    assert all(p.grad is None for p in m.critic.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.dit.parameters())


def test_dmd_reaches_only_the_generator_and_the_critic_loss_only_the_critic(folders):
    m = student(folders)
    z = clip()
    x = sf.rollout(m, z[:, :2], 3, [1, 1, 1], timestep_grid(m.config.sample_steps))
    with torch.no_grad():  # a critic different from the teacher: a non-zero DMD gradient
        for p in m.critic.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    loss, grad = sf.dmd_loss(x, z[:, :2], m._sf_teacher, m.critic)
    assert grad.abs().mean() > 0
    loss.backward()
    assert all(p.grad is None for p in m.critic.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.dit.parameters())
    m.zero_grad(set_to_none=True)
    sf.critic_loss(m.critic, x, z[:, :2]).backward()
    assert all(p.grad is None for p in m.dit.parameters())
    assert any(p.grad is not None for p in m.critic.parameters())
    # d loss / d x is grad / numel: the DMD direction
    xx = x.detach().requires_grad_(True)
    loss, grad = sf.dmd_loss(xx, z[:, :2], m._sf_teacher, m.critic)
    loss.backward()
    torch.testing.assert_close(xx.grad, grad / xx.numel())


def _teacher_error(m: FlexForcingModel, z: torch.Tensor) -> float:
    """How far the teacher's denoiser moves the student's final samples: small when they lie where the teacher's
    distribution does."""
    torch.manual_seed(123)
    with torch.no_grad():
        steps = m.config.sample_steps
        x = sf.rollout(m, z[:, :2], 3, [steps - 1] * 3, timestep_grid(steps))
        errs = []
        for t in (0.3, 0.6, 0.9):
            tt = torch.full((len(z),), t)
            xt = (1 - t) * x + t * torch.randn_like(x)
            errs.append(float((sf._window(m._sf_teacher, z[:, :2], xt, tt) - x).pow(2).mean()))
    return sum(errs) / len(errs)


def test_training_moves_the_students_samples_toward_the_teacher(folders):
    torch.manual_seed(0)
    m = student(folders)
    z = clip(8)
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], 3e-4)
    before = _teacher_error(m, z)
    torch.manual_seed(0)
    logs = []
    for _ in range(40):
        out = m.training_step({"latents": z})
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()
        logs.append(float(out["critic"]))
    after = _teacher_error(m, z)
    assert after < 0.95 * before, (before, after)
    assert np.mean(logs[-10:]) < np.mean(logs[:10])  # the critic learns the student's samples


def test_a_trained_run_reloads_without_its_starting_folders(folders, tmp_path):
    m = student(folders)
    m.save_pretrained(tmp_path / "run")
    back = FlexForcingModel.from_pretrained(tmp_path / "run", use_ema=False)
    assert back.config.objective == "self_forcing" and back._sf_teacher is None
    for k, v in m.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)
    with pytest.raises(ValueError, match="teacher_path"):
        back.train().training_step({"latents": clip()})


def test_vbench_temporal_flickering_is_vbenchs_formula():
    import cv2

    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, (3, 6, 3, 8, 8), dtype=np.uint8)

    def vbench(frames):  # vbench/temporal_flickering.py: cal_score(mae_seq(frames)), frames (H, W, C) uint8
        maes = [np.mean(cv2.absdiff(np.array(a, dtype=np.float32), np.array(b, dtype=np.float32)))
                for a, b in zip(frames[:-1], frames[1:], strict=True)]
        return (255.0 - np.mean(maes).item()) / 255.0

    ours = temporal_flickering(torch.from_numpy(video))
    for i in range(3):
        assert ours[i].item() == pytest.approx(vbench(list(video[i].transpose(0, 2, 3, 1))), abs=1e-6)  # numpy float32 mean vs float64
    still = torch.zeros(1, 4, 3, 8, 8, dtype=torch.uint8)
    assert temporal_flickering(still).item() == 1.0
    with pytest.raises(ValueError, match="uint8"):
        temporal_flickering(still.float())


def test_a_long_rollout_scores_one_window_of_the_students_own_frames(folders, monkeypatch):
    """Self-Forcing++: 7 frames rolled out, DMD and the critic on a window of 3 after 2 of the student's frames;
    only the window's exit steps carry gradient."""
    m = student(folders, sf_rollout_frames=7)
    z = clip()
    seen = {}
    real_rollout, real_critic = sf.rollout, sf.critic_loss

    def spy_rollout(*a, **kw):
        seen["grad_frames"] = kw["grad_frames"]
        seen["video"] = real_rollout(*a, **kw)
        return seen["video"]

    def spy_critic(critic, x, context, *a):
        seen["x"], seen["context"] = x, context
        return real_critic(critic, x, context, *a)

    monkeypatch.setattr(sf, "rollout", spy_rollout)
    monkeypatch.setattr(sf, "critic_loss", spy_critic)
    for seed in range(6):
        torch.manual_seed(seed)
        out = m.training_step({"latents": z})
        s = int(out["window_start"])
        assert seen["grad_frames"] == range(s, s + 3) and 0 <= s <= 4
        full = torch.cat([z[:, :2], seen["video"]], 1)
        assert torch.equal(seen["x"], full[:, s + 2:s + 5]) and torch.equal(seen["context"], full[:, s:s + 2])
        params = [p for p in m.dit.parameters() if p.requires_grad]
        for j in range(7):
            g = torch.autograd.grad(seen["video"][:, j].sum(), params, allow_unused=True, retain_graph=True)
            assert any(x is not None and x.abs().sum() > 0 for x in g) == (s <= j < s + 3), (s, j)


def test_paired_interval_covers_a_known_shift_and_excludes_zero_only_when_it_should():
    from perception.video.experiments import paired_interval

    rng = np.random.default_rng(0)
    base = rng.normal(20, 2, 24)
    mean, lo, hi = paired_interval((base + 0.5 + rng.normal(0, 0.1, 24)).tolist(), base.tolist())
    assert lo < 0.5 < hi and lo > 0 and mean == pytest.approx(0.5, abs=0.1)
    mean, lo, hi = paired_interval((base + rng.normal(0, 1, 24)).tolist(), base.tolist())
    assert lo < 0 < hi
