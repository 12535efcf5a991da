"""FeRA base models and data: both diffusers backbones (shapes, attention names, the keyword FeRA's router
reads, learning), the fixed-noise held-out loss, the sampler, and the source / target image domains."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from core.errors import ConfigError, DataError
from perception.adapters.backbones import BackboneConfig, FlowDenoiser, heldout_loss_by_level
from perception.adapters.data import (
    SPLITS,
    ImageTensorDataset,
    source_images,
    split_frames,
    target_crop_plan,
    target_images,
    target_videos,
)
from perception.adapters.modeling_fera import tiny_config
from perception.adapters.pipeline_fera import sample_images

KINDS = ("unet", "dit")


def tiny(kind: str, seed: int = 0) -> FlowDenoiser:
    torch.manual_seed(seed)
    return FlowDenoiser(tiny_config(kind).backbone())


def images(n: int = 8, seed: int = 0) -> torch.Tensor:
    """(n, 3, 16, 16) float in [-1, 1]: smooth random colour ramps (a learnable, not white-noise, signal)."""
    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(-1, 1, 16)
    a, b, c = (torch.rand(n, 3, 1, 1, generator=g) * 2 - 1 for _ in range(3))
    return (a * ramp[None, None, :, None] + b * ramp[None, None, None, :] + c).clamp(-1, 1) * 0.8


def needs_target_videos():
    try:
        target_videos()
    except DataError as e:
        pytest.skip(f"target videos not installed: {e}")


# -- config ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    {"kind": "vit"}, {"image_size": 0}, {"block_out_channels": []}, {"block_out_channels": [12, 64]},
    {"image_size": 30, "block_out_channels": [32, 64, 64]}, {"attention_levels": [True]},
    {"kind": "dit", "image_size": 33}, {"kind": "dit", "dit_heads": 0},
])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ConfigError) as e:
        BackboneConfig(**bad)
    assert "\n" not in str(e.value) and "backbone." in str(e.value)


# -- the base folder ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_base_folder_round_trip_is_exact_and_read_only(kind, tmp_path):
    """save_pretrained -> load_denoiser rebuilds the same denoiser (frozen), writes nothing into the folder; the
    base's training run folder (its newest checkpoint) loads the same way."""
    from core.checkpoint import mark_latest, save_checkpoint
    from perception.adapters.backbones import BASE_RUN_CONFIG, load_denoiser

    model = tiny(kind).eval()
    folder = model.save_pretrained(tmp_path / "base", run_config=dict(BASE_RUN_CONFIG))
    before = sorted((p.name, p.read_bytes()) for p in folder.iterdir())
    loaded = load_denoiser(folder)
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints" / "step_00000004", model,
                    {"method": "fera", "stage": "base", "model": json.loads(json.dumps(vars(model.config)))})
    mark_latest(run / "checkpoints", "step_00000004")
    from_run = load_denoiser(run)
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([0.3, 0.8])
    with torch.no_grad():
        want = model(x, t)
        for other in (loaded, from_run):
            assert other.config == model.config and not any(p.requires_grad for p in other.parameters())
            assert torch.equal(want, other(x, t))
    assert sorted((p.name, p.read_bytes()) for p in folder.iterdir()) == before


def test_base_folder_errors_are_one_line(tmp_path):
    from core.errors import CheckpointError
    from core.pretrained import load_pretrained
    from perception.adapters.backbones import BASE_RUN_CONFIG, load_denoiser

    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_denoiser(tmp_path / "nope")
    folder = tiny("dit").save_pretrained(tmp_path / "base", run_config=dict(BASE_RUN_CONFIG))
    with pytest.raises(CheckpointError, match="base denoiser") as e:
        load_pretrained(folder)  # a base, not the method's model: says what to call instead
    assert "\n" not in str(e.value) and "load_denoiser" in str(e.value)
    config = json.loads((folder / "config.json").read_text())
    config["model"]["dit_layers"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not match"):
        load_denoiser(folder)


# -- backbones ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_shapes_and_attention_projection_names(kind):
    model = tiny(kind).eval()
    x = torch.randn(2, 3, 16, 16)
    out = model(x, torch.tensor([0.2, 0.9]))
    assert out.shape == x.shape and torch.isfinite(out).all()
    # A float t is shared by the batch.
    torch.testing.assert_close(model(x, 0.5), model(x, torch.full((2,), 0.5)))
    names = dict(model.backbone.named_modules())
    attn = [n for n, m in names.items() if type(m).__name__ == "Attention"]
    assert attn
    for n in attn:
        for proj in ("to_q", "to_k", "to_v", "to_out.0"):
            assert isinstance(names[f"{n}.{proj}"], nn.Linear), f"{n}.{proj}"
    if kind == "unet":
        # SD layout: self- and cross-attention at full resolution (outer blocks) and in the mid block.
        assert any(n.startswith("down_blocks.0.attentions") for n in attn)
        assert any(n.startswith("mid_block.attentions") for n in attn)
        assert any(n.endswith("attn2") for n in attn)
        assert not any(n.startswith("down_blocks.1.attentions") for n in attn)
        # attention_head_dim is the true head width (diffusers' argument of that name counts heads).
        assert names["down_blocks.0.attentions.0.transformer_blocks.0.attn1"].heads == 16 // 8


@pytest.mark.parametrize("kind", KINDS)
def test_router_keyword_reaches_the_backbone_pre_hook(kind):
    model = tiny(kind).eval()
    seen = {}
    model.backbone.register_forward_pre_hook(lambda mod, args, kwargs: seen.update(args=args, kwargs=kwargs),
                                             with_kwargs=True)
    x = torch.randn(2, 3, 16, 16)
    model(x, torch.tensor([0.1, 0.6]))
    key = "sample" if kind == "unet" else "hidden_states"
    assert seen["args"] == () and seen["kwargs"][key] is x
    torch.testing.assert_close(seen["kwargs"]["timestep"], torch.tensor([100.0, 600.0]))


def test_unet_layout_follows_attention_levels():
    cfg = tiny_config("unet", attention_levels=[False, True]).backbone()
    names = [n for n, m in FlowDenoiser(cfg).backbone.named_modules() if type(m).__name__ == "Attention"]
    assert any(n.startswith("down_blocks.1.attentions") for n in names)
    assert not any(n.startswith("down_blocks.0.attentions") for n in names)


def test_noisy_batch_follows_the_workspace_convention():
    model = tiny("dit")
    x0 = images(4)
    x_t, t, target = model.noisy_batch(x0, torch.Generator().manual_seed(0), t=torch.tensor([0.0, 1.0, 0.5, 0.25]))
    noise = target + x0
    torch.testing.assert_close(x_t[0], x0[0])
    torch.testing.assert_close(x_t[1], noise[1])
    torch.testing.assert_close(x_t[2], 0.5 * x0[2] + 0.5 * noise[2])
    a = model.noisy_batch(x0, torch.Generator().manual_seed(3))
    b = model.noisy_batch(x0, torch.Generator().manual_seed(3))
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v)
    assert a[1].shape == (4,) and bool(((a[1] > 0) & (a[1] < 1)).all())


@pytest.mark.parametrize("kind", KINDS)
def test_overfits_a_fixed_batch(kind):
    model = tiny(kind).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x_t, t, target = model.noisy_batch(images(8), torch.Generator().manual_seed(1))
    losses = []
    for _ in range(60):
        loss = nn.functional.mse_loss(model(x_t, t), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.5 * first, (first, last)
    # training_step is the same loss on a fresh draw: a finite scalar with gradients into the backbone.
    out = model.training_step({"image": images(4)})
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.backbone.parameters())


def test_heldout_loss_is_deterministic_and_model_dependent():
    model = tiny("unet").train()
    u8 = ((images(6) + 1) * 127.5).round().to(torch.uint8)
    a = heldout_loss_by_level(model, u8, batch_size=4)
    assert model.training  # restored
    assert a == heldout_loss_by_level(model, u8, batch_size=4)
    assert set(a) == {"t0.1", "t0.3", "t0.5", "t0.7", "t0.9", "mean"}
    assert a["mean"] == pytest.approx(sum(a[k] for k in a if k != "mean") / 5)
    other = heldout_loss_by_level(tiny("unet", seed=1), u8, batch_size=4)
    assert all(other[k] != a[k] for k in a)
    assert heldout_loss_by_level(model, u8, seed=1)["mean"] != a["mean"]  # the noise does depend on the seed
    # uint8 input means the same as the [-1, 1] float images.
    assert heldout_loss_by_level(model, u8.float() / 127.5 - 1, batch_size=6)["mean"] == pytest.approx(a["mean"])


def test_sample_images_deterministic_per_seed():
    model = tiny("dit")
    a = sample_images(model, 3, steps=3, seed=0, batch_size=2)
    assert a.dtype == torch.uint8 and a.shape == (3, 3, 16, 16)
    assert torch.equal(a, sample_images(model, 3, steps=3, seed=0, batch_size=3))
    assert not torch.equal(a, sample_images(model, 3, steps=3, seed=1))


# -- data --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [4, 10, 250, 795])
def test_split_frames_are_disjoint_with_a_gap(n):
    train, test = split_frames(n, "train"), split_frames(n, "test")
    assert train.start == 0 and test.stop == n and len(train) >= 1 and len(test) >= 1
    assert train.stop <= test.start
    assert len(train) >= int(0.6 * n) and len(test) >= int(0.3 * n)
    if n >= 100:
        assert test.start - train.stop >= 0.1 * n - 1
    with pytest.raises(ConfigError):
        split_frames(n, "val")


def test_target_crop_plans_stay_in_their_split():
    needs_target_videos()
    import cv2

    counts = []
    for p in target_videos():
        cap = cv2.VideoCapture(str(p))
        counts.append((int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                       int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))))
        cap.release()
    for split in SPLITS:
        plan = target_crop_plan(split, 300, seed=0)
        assert {c.video for c in plan} == {0, 1}
        for c in plan:
            frames, h, w = counts[c.video]
            assert c.frame in split_frames(frames, split)
            assert 0.4 * min(h, w) - 1 <= c.side <= 0.9 * min(h, w) + 1
            assert 0 <= c.y <= h - c.side and 0 <= c.x <= w - c.side
        assert target_crop_plan(split, 20, seed=0) == plan[:20]
    assert target_crop_plan("train", 20, 0) != target_crop_plan("train", 20, 1)


def test_target_images_deterministic_and_shaped():
    needs_target_videos()
    train = target_images("train", 16, 6, seed=0)
    assert train.dtype == torch.uint8 and train.shape == (6, 3, 16, 16)
    assert torch.equal(train, target_images("train", 16, 6, seed=0))
    assert not torch.equal(train, target_images("train", 16, 6, seed=1))
    test = target_images("test", 24, 5, seed=0)
    assert test.shape == (5, 3, 24, 24)
    assert torch.equal(test, target_images("test", 24, 5, seed=0))
    assert train.float().std() > 10  # real content, not a constant


def test_source_images_render_once_and_check_the_folder(tmp_path):
    root = tmp_path / "sim"
    imgs = source_images(root, size=16, n_clips=2, frames=4, seed=0)
    assert imgs.dtype == torch.uint8 and imgs.shape == (8, 3, 16, 16) and imgs.float().std() > 1
    stamp = (root / "meta.json").stat().st_mtime_ns
    assert torch.equal(imgs, source_images(root, size=16, n_clips=2, frames=4, seed=0))
    assert (root / "meta.json").stat().st_mtime_ns == stamp  # not rendered again
    with pytest.raises(DataError, match="asked for"):
        source_images(root, size=32, n_clips=2, frames=4, seed=0)
    other = tmp_path / "other"
    other.mkdir()
    (other / "stray.txt").write_text("x")
    with pytest.raises(DataError, match="no meta.json"):
        source_images(other, size=16, n_clips=2, frames=4)
    json.loads((root / "meta.json").read_text())  # still intact


def test_image_tensor_dataset():
    u8 = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).reshape(2, 3, 4, 4) * 2
    ds = ImageTensorDataset(u8)
    item = ds[1]["image"]
    assert len(ds) == 2 and item.dtype == torch.float32 and item.shape == (3, 4, 4)
    torch.testing.assert_close(item, u8[1].float() / 127.5 - 1)
    extremes = ImageTensorDataset(torch.tensor([0, 255], dtype=torch.uint8).reshape(1, 1, 1, 2))[0]["image"]
    assert extremes.flatten().tolist() == [-1.0, 1.0]
    flipped = ImageTensorDataset(u8, flip=True)
    torch.manual_seed(0)
    seen = {bool(torch.equal(flipped[0]["image"], ds[0]["image"])) for _ in range(20)}
    assert seen == {True, False}
    with pytest.raises(ValueError):
        ImageTensorDataset(u8.float())
