"""TAGRPO video rewards: exact answers on scripted clips (a white square moving on black, intensity ramps,
alternating frames), the real EfficientNet feature reward, learned-model loading and the composite."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from core.errors import CheckpointError, ConfigError, DataError
from perception.i2v_rl.rewards import (
    REWARDS,
    CompositeReward,
    FeatureReward,
    GoalReward,
    LearnedReward,
    PSNRReward,
    RewardInputs,
    SmoothnessReward,
    TrajectoryReward,
    build_reward,
    track_centroids,
)

SIZE, SIDE = 32, 4
CAP = 10 * math.log10(1 / 1e-10)  # 100 dB: PSNR of identical frames with min_mse = 1e-10


def square_clip(positions: list[tuple[int, int]], batch: int = 1) -> torch.Tensor:
    """(batch, F, 3, 32, 32) uint8: black with a white SIDE x SIDE square whose top-left is positions[f]."""
    video = torch.zeros(batch, len(positions), 3, SIZE, SIZE, dtype=torch.uint8)
    for f, (r, c) in enumerate(positions):
        video[:, f, :, r : r + SIDE, c : c + SIDE] = 255
    return video


def moving(v_row: int, v_col: int, frames: int = 4, start: tuple[int, int] = (2, 2)) -> list[tuple[int, int]]:
    return [(start[0] + v_row * f, start[1] + v_col * f) for f in range(frames)]


def noise_clip(shape=(2, 4, 3, SIZE, SIZE), seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------ inputs
def test_inputs_validate_shapes_and_dtypes():
    v = noise_clip()
    RewardInputs(v, v.clone(), goal=v[:, -1].clone())
    RewardInputs(v, None)
    with pytest.raises(ValueError, match="frames must be a"):
        RewardInputs(v[:, :, :2], None)
    with pytest.raises(ValueError, match="uint8"):
        RewardInputs(v.float(), None)
    with pytest.raises(ValueError, match="F >= 2"):
        RewardInputs(v[:, :1], None)
    with pytest.raises(ValueError, match="reference shape"):
        RewardInputs(v, v[:, :3].clone())
    with pytest.raises(ValueError, match="goal must be"):
        RewardInputs(v, v, goal=v[:, -1, :, :16])
    with pytest.raises(ValueError, match="goal must be uint8"):
        RewardInputs(v, v, goal=v[:, -1].float())


def test_registry_names_and_unknown_name():
    assert REWARDS.names() == ["feature", "goal", "learned", "psnr", "smoothness", "trajectory"]
    assert isinstance(build_reward("psnr", min_mse=1e-6), PSNRReward)
    with pytest.raises(ConfigError, match="unknown video reward 'psnrr'.*did you mean psnr"):
        build_reward("psnrr")


# ------------------------------------------------------------------------------------------------ psnr
def test_psnr_identical_is_capped_and_known_mse_gives_known_db():
    v = noise_clip()
    r = PSNRReward()(RewardInputs(v, v.clone()))
    assert r.shape == (2,) and r.dtype == torch.float32
    assert torch.allclose(r, torch.full((2,), CAP))
    # A quarter of the pixels off by 51/255 = 0.2: MSE = 0.04 / 4 = 0.01 (RMS difference 0.1) -> exactly 20 dB.
    ref = torch.full((2, 4, 3, SIZE, SIZE), 100, dtype=torch.uint8)
    gen = ref.clone()
    gen[:, 1:, :, : SIZE // 2, : SIZE // 2] += 51
    assert torch.allclose(PSNRReward()(RewardInputs(gen, ref)), torch.full((2,), 20.0), atol=1e-5)
    # Frame 0 is not scored; every pixel of frames 1.. off by 0.2 gives 10 log10(25).
    gen = ref.clone()
    gen[:, 1:] += 51
    gen[:, 0] = 0
    assert torch.allclose(PSNRReward()(RewardInputs(gen, ref)), torch.full((2,), 10 * math.log10(25)), atol=1e-5)
    # Mean of per-frame PSNRs: frame 1 identical (100 dB), frames 2, 3 off by 0.2 everywhere.
    gen = ref.clone()
    gen[:, 2:] += 51
    want = (CAP + 2 * 10 * math.log10(25)) / 3
    assert torch.allclose(PSNRReward()(RewardInputs(gen, ref)), torch.full((2,), want), atol=1e-4)


def test_reward_needing_reference_raises_without_it():
    v = noise_clip()
    for name in ("psnr", "trajectory", "feature"):
        with pytest.raises(ValueError, match=f"'{name}' needs the simulator's reference"):
            build_reward(name)(RewardInputs(v, None))


# ------------------------------------------------------------------------------------------------ trajectory
def test_track_centroids_is_the_midpoint_of_old_and_new_square():
    pos = moving(1, 5)  # moves 5 px right (no overlap with the start) and 1 px down per frame
    v = square_clip(pos, batch=2)
    cent, present = track_centroids(v, 0.1)
    assert cent.shape == (2, 3, 2) and present.shape == (2, 3) and present.all()
    half = (SIDE - 1) / 2  # centre of a square from its top-left corner
    (r0, c0) = pos[0]
    want = torch.tensor([[(r0 + half + r + half) / 2, (c0 + half + c + half) / 2] for r, c in pos[1:]])
    assert torch.equal(cent[0], want) and torch.equal(cent[1], want)
    assert want[0].tolist() == [4.0, 6.0]  # frame 1: old centre (3.5, 3.5), new (4.5, 8.5)


def test_track_centroids_empty_mask_and_threshold():
    v = square_clip([(2, 2)] * 3)  # static: nothing moves
    cent, present = track_centroids(v, 0.1)
    assert not present.any() and torch.isnan(cent).all()
    # An intensity change of 20/255 = 0.078 is below the 0.1 threshold, 30/255 = 0.118 above it.
    v = torch.zeros(1, 3, 3, SIZE, SIZE, dtype=torch.uint8)
    v[:, 1, 0, 10, 20] = 20
    v[:, 2, 2, 10, 20] = 30
    cent, present = track_centroids(v, 0.1)
    assert present.tolist() == [[False, True]] and cent[0, 1].tolist() == [10.0, 20.0]


def test_trajectory_reward_known_values():
    diag = math.hypot(SIZE, SIZE)
    ref = square_clip(moving(0, 4))
    assert TrajectoryReward()(RewardInputs(ref, ref.clone())).item() == 0.0
    # Generated square moves 6 px/frame, reference 4: the midpoints differ by (6 - 4) f / 2 = f px in frame f.
    gen = square_clip(moving(0, 6))
    want = -((1 + 2 + 3) / 3) / diag
    assert TrajectoryReward()(RewardInputs(gen, ref)).item() == pytest.approx(want, rel=1e-6)
    # Row offset too: generated moves (3, 6), reference (0, 4) -> error sqrt((1.5 f)^2 + f^2) in frame f.
    gen = square_clip(moving(3, 6))
    want = -sum(math.hypot(1.5 * f, f) for f in (1, 2, 3)) / 3 / diag
    assert TrajectoryReward()(RewardInputs(gen, ref)).item() == pytest.approx(want, rel=1e-6)


def test_trajectory_empty_mask_rules():
    ref = square_clip(moving(0, 4))
    static = square_clip([(2, 2)] * 4)
    # Exactly one empty mask: error 1 in every frame.
    assert TrajectoryReward()(RewardInputs(static, ref)).item() == -1.0
    assert TrajectoryReward()(RewardInputs(ref, static)).item() == -1.0
    # Both empty: 0.
    assert TrajectoryReward()(RewardInputs(static, static.clone())).item() == 0.0
    # Generated stops after frame 1 (frames 2, 3 equal frame 0: empty), reference keeps moving:
    # frame 1 matches (0), frames 2, 3 are one-sided (1 each) -> -(0 + 1 + 1) / 3.
    gen = ref.clone()
    gen[:, 2:] = gen[:, :1]
    assert TrajectoryReward()(RewardInputs(gen, ref)).item() == pytest.approx(-2 / 3)
    # Per sample: batch of (identical, one-sided).
    gen2 = torch.cat([ref, static])
    ref2 = torch.cat([ref, ref])
    assert TrajectoryReward()(RewardInputs(gen2, ref2)).tolist() == [0.0, -1.0]


# ------------------------------------------------------------------------------------------------ smoothness
def test_smoothness_zero_for_linear_ramps_and_known_for_alternating():
    # Constant-velocity intensity ramp: pixel value 10 + 40 t (+ a spatial pattern), linear in time.
    base = torch.arange(SIZE * SIZE).reshape(SIZE, SIZE) % 50
    ramp = torch.stack([(base + 10 + 40 * t) for t in range(5)])  # (F, H, W), max 49 + 170 = 219
    v = ramp[None, :, None].expand(1, 5, 3, SIZE, SIZE).to(torch.uint8)
    assert SmoothnessReward()(RewardInputs(v, None)).item() == 0.0
    assert SmoothnessReward()(RewardInputs(square_clip([(5, 5)] * 3), None)).item() == 0.0  # static
    # Alternating black / white: second difference +-2 everywhere, squared 4.
    alt = torch.zeros(2, 5, 3, SIZE, SIZE, dtype=torch.uint8)
    alt[:, 1::2] = 255
    assert SmoothnessReward()(RewardInputs(alt, None)).tolist() == [-4.0, -4.0]
    # One white frame in the middle of 3 black ones... only frame 1 white in F = 4: d2 = (-2, +1) -> (4 + 1) / 2.
    spike = torch.zeros(1, 4, 3, SIZE, SIZE, dtype=torch.uint8)
    spike[:, 1] = 255
    assert SmoothnessReward()(RewardInputs(spike, None)).item() == pytest.approx(-2.5)
    with pytest.raises(ValueError, match="F >= 3"):
        SmoothnessReward()(RewardInputs(spike[:, :2], None))


# ------------------------------------------------------------------------------------------------ goal
def test_goal_reward_cap_and_known_offset():
    ref = noise_clip()
    gen = ref.clone()
    gen[:, 1] = 0  # only the last frame is scored
    assert torch.allclose(GoalReward()(RewardInputs(gen, ref)), torch.full((2,), CAP))
    # Explicit goal: last frame 100, goal 151 everywhere: difference 0.2 -> 10 log10(25) dB; no reference needed.
    gen = torch.full((2, 3, 3, SIZE, SIZE), 100, dtype=torch.uint8)
    goal = torch.full((2, 3, SIZE, SIZE), 151, dtype=torch.uint8)
    r = GoalReward()(RewardInputs(gen, None, goal=goal))
    assert torch.allclose(r, torch.full((2,), 10 * math.log10(25)), atol=1e-5)
    # The explicit goal wins over the reference's last frame.
    assert torch.allclose(GoalReward()(RewardInputs(gen, gen.clone(), goal=goal)), r)
    with pytest.raises(ValueError, match="'goal' needs inputs.goal or"):
        GoalReward()(RewardInputs(gen, None))


# ------------------------------------------------------------------------------------------------ feature
@pytest.fixture(scope="module")
def feature_net():
    from core.metrics import features as fm

    try:
        fm.weights_path()
    except CheckpointError as e:
        pytest.skip(f"{e}")
    return fm.load_feature_network("cpu")


def test_feature_reward_identical_is_zero_and_scrambled_is_lower(feature_net):
    torch.manual_seed(0)
    ref = square_clip(moving(1, 5), batch=1)
    ref[..., 0, :, :16] = 80  # some colour structure
    perm = torch.randperm(SIZE * SIZE, generator=torch.Generator().manual_seed(1))
    scrambled = ref.clone()
    scrambled[:, 1:] = ref[:, 1:].flatten(-2)[..., perm].reshape(ref[:, 1:].shape)
    reward = FeatureReward(network=feature_net)
    both = reward(RewardInputs(torch.cat([ref, scrambled]), torch.cat([ref, ref])))
    assert both.shape == (2,) and both.dtype == torch.float32
    assert abs(both[0].item()) < 1e-5
    assert both[1].item() < -0.05 and both[1].item() >= -2.0


def test_feature_reward_loads_network_lazily(feature_net, monkeypatch):
    from core.metrics import features as fm

    reward = FeatureReward()
    assert reward.network is None
    monkeypatch.setattr(fm, "load_feature_network", lambda device=None: feature_net)
    v = square_clip(moving(0, 4))
    assert abs(reward(RewardInputs(v, v.clone())).item()) < 1e-5
    assert reward.network is feature_net


# ------------------------------------------------------------------------------------------------ learned
class MeanBrightness(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.scale * x.mean(dim=[1, 2, 3, 4])).unsqueeze(1)  # (B, 1)


def brightness_clips() -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.tensor([0, 51, 102, 153, 255], dtype=torch.uint8)
    video = values.view(5, 1, 1, 1, 1).expand(5, 3, 3, 8, 8).contiguous()
    return video, values.float() / 255


def test_learned_reward_runs_model_in_eval_no_grad_in_batches():
    model = MeanBrightness().train()
    calls: list[tuple[int, bool, bool]] = []
    model.register_forward_hook(lambda m, args, out: calls.append((args[0].shape[0], m.training,
                                                                   torch.is_grad_enabled())))
    video, want = brightness_clips()
    r = LearnedReward(model, batch_size=2)(RewardInputs(video, None))
    assert r.shape == (5,) and r.dtype == torch.float32 and not r.requires_grad
    assert torch.allclose(r, want)
    assert calls == [(2, False, False), (2, False, False), (1, False, False)]
    assert model.training  # mode restored
    assert not LearnedReward(model).needs_reference


def test_learned_reward_rejects_wrong_output_shape():
    class Bad(nn.Module):
        def forward(self, x):
            return x.mean(dim=[2, 3, 4])  # (B, F)

    video, _ = brightness_clips()
    with pytest.raises(ValueError, match=r"must return \(5,\) or \(5, 1\) scores, got \(5, 3\)"):
        LearnedReward(Bad())(RewardInputs(video, None))


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_learned_reward_from_path_round_trip_and_errors(tmp_path):
    model = MeanBrightness()
    path = tmp_path / "reward.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    video, want = brightness_clips()
    inputs = RewardInputs(video, None)
    loaded = LearnedReward.from_path(path, batch_size=3)
    assert torch.equal(loaded(inputs), LearnedReward(model)(inputs))
    assert torch.allclose(loaded(inputs), want)

    with pytest.raises(DataError, match="missing.pt: no such TorchScript") as e:
        LearnedReward.from_path(tmp_path / "missing.pt")
    assert e.value.path == str(tmp_path / "missing.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torchscript archive")
    with pytest.raises(DataError, match="bad.pt: cannot load as TorchScript") as e:
        LearnedReward.from_path(bad)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ composite
def test_composite_is_the_weighted_sum_of_known_terms():
    alt = torch.zeros(2, 4, 3, SIZE, SIZE, dtype=torch.uint8)
    alt[:, 1::2] = 255
    comp = CompositeReward({"psnr": 0.5, "smoothness": 2.0, "trajectory": 3.0})
    assert comp.needs_reference
    total, terms = comp(RewardInputs(alt, alt.clone()))
    assert set(terms) == {"psnr", "smoothness", "trajectory"}
    assert torch.allclose(terms["psnr"], torch.full((2,), CAP))
    assert terms["smoothness"].tolist() == [-4.0, -4.0]
    assert terms["trajectory"].tolist() == [0.0, 0.0]  # identical videos
    assert total.shape == (2,) and total.dtype == torch.float32
    assert torch.allclose(total, torch.full((2,), 0.5 * CAP + 2.0 * -4.0 + 0.0))  # 42

    # Per-reward kwargs, and a term with a learned model.
    video, bright = brightness_clips()
    comp = CompositeReward({"learned": -1.0, "psnr": 0.1}, learned={"model": MeanBrightness()},
                           psnr={"min_mse": 1e-4})
    total, terms = comp(RewardInputs(video, video.clone()))
    assert torch.allclose(terms["psnr"], torch.full((5,), 40.0))  # cap 10 log10(1e4)
    assert torch.allclose(total, 0.1 * 40.0 - bright)


def test_composite_errors():
    v = noise_clip()
    comp = CompositeReward({"smoothness": 1.0, "trajectory": 1.0})
    with pytest.raises(ValueError, match="'trajectory' needs the simulator's reference"):
        comp(RewardInputs(v, None))
    assert not CompositeReward({"smoothness": 1.0}).needs_reference
    CompositeReward({"smoothness": 1.0})(RewardInputs(v, None))  # no reference needed
    with pytest.raises(ConfigError, match="unknown video reward 'smooth'"):
        CompositeReward({"smooth": 1.0})
    with pytest.raises(ValueError, match="at least one reward"):
        CompositeReward({})
    for w in (float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="must be a finite number"):
            CompositeReward({"psnr": w})
    with pytest.raises(ValueError, match="kwargs given for rewards not in weights: goal"):
        CompositeReward({"psnr": 1.0}, goal={"min_mse": 1e-3})

    class NaNModel(nn.Module):
        def forward(self, x):
            return torch.full((x.shape[0],), float("nan"))

    with pytest.raises(ValueError, match=r"'learned' is non-finite \(NaN / inf\) for 2 of 2"):
        CompositeReward({"learned": 1.0}, learned={"model": NaNModel()})(RewardInputs(v, None))
