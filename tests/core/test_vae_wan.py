"""The Wan video VAE helpers (core/layers/vae.py): frame counts, causal encoding, folders, stage-1 training."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from core.errors import CheckpointError, ConfigError
from core.layers.vae import (
    FrameDiverseClips,
    VideoAutoencoderTrainer,
    build_autoencoder_kl,
    build_autoencoder_kl_wan,
    load_autoencoder_weights,
    to_signed_unit,
    wan21_vae_size,
    wan_decode,
    wan_encode,
    wan_factors,
    wan_latent_frames,
    wan_latent_stats,
    wan_video_frames,
)

# (dim_mult, temporal_downsample) -> (temporal, spatial) factors
TINY = {"t1": ([1, 2], [False]), "t2": ([1, 2], [True]), "t4": ([1, 2, 2], [True, True])}
FACTORS = {"t1": (1, 2), "t2": (2, 2), "t4": (4, 4)}


def tiny(kind: str = "t2", seed: int = 0):
    torch.manual_seed(seed)
    dm, td = TINY[kind]
    return build_autoencoder_kl_wan(base_dim=8, z_dim=4, dim_mult=dm, num_res_blocks=1, temporal_downsample=td).eval()


def clip(t: int, h: int = 8, w: int = 12, b: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, t, 3, h, w), dtype=torch.uint8, generator=g)


def test_frame_counts():
    assert [wan_latent_frames(t, 4) for t in (1, 5, 81)] == [1, 2, 21]
    assert wan_latent_frames(9, 2) == 5 and wan_latent_frames(7, 1) == 7
    assert [wan_video_frames(f, 4) for f in (1, 2, 21)] == [1, 5, 81]
    for r in (1, 2, 4):
        assert all(wan_latent_frames(wan_video_frames(f, r), r) == f for f in range(1, 8))
    with pytest.raises(ConfigError, match="1 \\+ 4 k"):
        wan_latent_frames(8, 4)
    with pytest.raises(ConfigError):
        wan_latent_frames(0, 2)
    with pytest.raises(ConfigError):
        wan_video_frames(0, 4)


@pytest.mark.parametrize("kind", list(TINY))
def test_factors_shapes_and_rectangular_frames(kind):
    vae = tiny(kind)
    r, s = wan_factors(vae)
    assert (r, s) == FACTORS[kind]
    assert (vae.config.scale_factor_temporal, vae.config.scale_factor_spatial) == (r, s)
    t = wan_video_frames(3, r)
    z = wan_encode(vae, clip(t, 8, 12, b=2))
    assert z.shape == (2, 3, 4, 8 // s, 12 // s) and z.dtype == torch.float32
    video = wan_decode(vae, z)
    assert video.shape == (2, t, 3, 8, 12) and video.dtype == torch.uint8
    floats = wan_encode(vae, clip(t, 8, 12, b=2).float() / 255)  # float input in [0, 1] is the same video
    assert torch.allclose(floats, z, atol=1e-5)
    assert torch.allclose(wan_encode(vae, clip(t, 8, 12, b=2), chunk=1), z, atol=1e-6)


@pytest.mark.parametrize("kind", ["t1", "t4"])
def test_encode_decode_match_diffusers_where_it_steps_by_four(kind):
    vae = tiny(kind)
    v = clip(9, 8, 8, b=2)
    z = wan_encode(vae, v)
    with torch.no_grad():
        ref = vae.encode(to_signed_unit(v).permute(0, 2, 1, 3, 4)).latent_dist.mode().permute(0, 2, 1, 3, 4)
        dec = vae.decode(z.permute(0, 2, 1, 3, 4)).sample.permute(0, 2, 1, 3, 4)
    assert torch.allclose(z, ref, atol=1e-6)
    assert torch.equal(wan_decode(vae, z), ((dec.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8))


def test_encoding_is_causal_in_time():
    vae = tiny("t2")  # latent j >= 1 covers video frames 2j - 1, 2j
    v = clip(9)
    w = v.clone()
    w[:, 5] = 255 - w[:, 5]
    a, b = wan_encode(vae, v), wan_encode(vae, w)
    assert torch.equal(a[:, :3], b[:, :3])  # inputs end at frame 4
    assert not torch.allclose(a[:, 3:], b[:, 3:])
    da, db = wan_decode(vae, a), wan_decode(vae, b)  # decoding is causal too: frames 0..4 from latents 0..2
    assert torch.equal(da[:, :5], db[:, :5])


@pytest.mark.parametrize("kind", ["t2", "t4"])
def test_a_prefix_encodes_to_the_prefix_of_the_whole_clip(kind):
    vae = tiny(kind)
    r = wan_factors(vae)[0]
    v = clip(wan_video_frames(5, r), 8, 8)
    whole = wan_encode(vae, v)
    for k in (0, 1, 3):
        part = wan_encode(vae, v[:, :1 + r * k])
        assert part.shape[1] == 1 + k
        assert torch.allclose(part, whole[:, :1 + k], atol=1e-5)


def test_bad_inputs_are_one_line_errors():
    vae = tiny("t2")
    with pytest.raises(ConfigError, match="1 \\+ 2 k"):
        wan_encode(vae, clip(4))
    with pytest.raises(ConfigError, match="spatial factor 2"):
        wan_encode(vae, clip(3, 9, 8))
    with pytest.raises(ConfigError, match="B, T, 3, H, W"):
        wan_encode(vae, clip(3)[0])
    with pytest.raises(ConfigError, match="latents must be"):
        wan_decode(vae, torch.zeros(1, 2, 5, 4, 4))
    with pytest.raises(ConfigError, match="one flag per downsampling level"):
        build_autoencoder_kl_wan(8, 4, [1, 2], 1, [True, True])


def _listing(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*"))


def test_wan_folder_and_pipeline_folder_load_read_only(tmp_path):
    vae = tiny("t2", seed=1)
    vae.register_to_config(latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.0, 2.0, 0.5, 1.5])
    vae.save_pretrained(str(tmp_path / "wan"))
    pipe = tmp_path / "pipe"
    vae.save_pretrained(str(pipe / "vae"))
    (pipe / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "vae": ["diffusers",
                                                                                            "AutoencoderKLWan"]}))
    before = {p: _listing(p) for p in (tmp_path / "wan", pipe)}
    v = clip(5)
    for folder in (tmp_path / "wan", pipe):
        other = build_autoencoder_kl_wan(base_dim=16, z_dim=8, path=folder)  # the sizes are ignored
        assert other.config.z_dim == 4 and wan_factors(other) == (2, 2)
        assert load_autoencoder_weights(other, folder) is None  # Wan states per-channel statistics instead
        assert torch.equal(wan_encode(other.eval(), v), wan_encode(vae, v))
        mean, std = wan_latent_stats(other)
        assert torch.allclose(mean, torch.tensor([0.1, -0.2, 0.3, 0.0])) and std[1] == 2.0
    assert before == {p: _listing(p) for p in (tmp_path / "wan", pipe)}


def test_other_classes_and_mismatches_are_refused(tmp_path):
    kl = build_autoencoder_kl((8, 8), 4, 1, 4, 16)
    kl.save_pretrained(str(tmp_path / "kl"))
    with pytest.raises(ConfigError, match="names AutoencoderKL, not an AutoencoderKLWan"):
        build_autoencoder_kl_wan(path=tmp_path / "kl")
    with pytest.raises(CheckpointError, match="names AutoencoderKL, not the AutoencoderKLWan"):
        load_autoencoder_weights(tiny(), tmp_path / "kl")
    with pytest.raises(CheckpointError, match="no such VAE folder"):
        build_autoencoder_kl_wan(path=tmp_path / "missing")
    tiny("t2").save_pretrained(str(tmp_path / "wan"))
    with pytest.raises(CheckpointError, match="mismatched"):
        load_autoencoder_weights(build_autoencoder_kl_wan(base_dim=16, z_dim=4), tmp_path / "wan")
    assert isinstance(load_autoencoder_weights(build_autoencoder_kl((8, 8), 4, 1, 4, 16), tmp_path / "kl"), float)


def test_latent_stats_need_one_value_per_channel():
    assert wan_latent_stats(tiny()) is None  # built from sizes: measured on data by the caller
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        wan21 = AutoencoderKLWan()
    mean, std = wan_latent_stats(wan21)
    assert mean.shape == std.shape == (16,) and float(std.min()) > 0
    with torch.device("meta"):
        wrong = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2], temperal_downsample=[True])
    assert wan_latent_stats(wrong) is None  # the default 16 values do not describe 4 channels


def test_wan21_size_on_the_meta_device():
    from diffusers import AutoencoderKLWan

    n = wan21_vae_size()
    with torch.device("meta"):
        ref = AutoencoderKLWan.from_config(AutoencoderKLWan.extract_init_dict({})[0])
    assert n == sum(p.numel() for p in ref.parameters()) == 126_892_531
    assert wan_factors(ref) == (4, 8)


def test_video_trainer_learns_and_saves_under_vae(tmp_path):
    from core.config import TrainerConfig
    from core.trainer import Trainer

    vae = tiny("t2")
    ae = VideoAutoencoderTrainer(vae)
    t, y, x = torch.meshgrid(torch.arange(5.0), torch.arange(8.0), torch.arange(8.0), indexing="ij")
    wave = torch.stack([torch.sin(0.7 * x + 0.5 * t + c) * torch.cos(0.4 * y + c) for c in range(3)], 1)
    v = ((wave + 1) * 127.5).round().to(torch.uint8)[None].repeat(2, 1, 1, 1, 1)  # a smooth moving pattern
    out = ae.training_step({"video": v})
    assert torch.isfinite(out["loss"]) and out["loss"] > 0 and out["kl"] >= 0
    with pytest.raises(ConfigError, match="1 \\+ 2 k"):
        ae.training_step({"video": clip(4)})
    opt = torch.optim.Adam(vae.parameters(), lr=3e-3)
    first = float(out["loss_rec"])
    for _ in range(15):
        loss = ae.training_step({"video": v})["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(ae.training_step({"video": v})["loss_rec"]) < 0.8 * first

    frames = [clip(9, 8, 8, seed=s)[0].numpy() for s in range(3)]
    ds = FrameDiverseClips(frames, clip_len=5, per_source=2)
    cfg = TrainerConfig(max_steps=2, batch_size=2, device="cpu", tensorboard=False, progress=False, ckpt_every=2)
    trained = tiny("t2", seed=3)
    Trainer(VideoAutoencoderTrainer(trained), ds, cfg, tmp_path / "run").fit()
    fresh = tiny("t2", seed=4)
    load_autoencoder_weights(fresh, tmp_path / "run")
    assert all(torch.equal(a, b) for a, b in zip(trained.state_dict().values(), fresh.state_dict().values(),
                                                 strict=True))


def test_frame_diverse_clips_cover_many_sources():
    sources = [np.full((n, 3, 4, 4), i, np.uint8) for i, n in enumerate((24, 24, 24, 3, 24))]
    sources = [s + np.arange(len(s), dtype=np.uint8)[:, None, None, None] * 10 for s in sources]
    ds = FrameDiverseClips(sources, clip_len=5, per_source=8, seed=1)
    assert len(ds) == 4 * 8  # the 3-frame source is too short for a 5-frame clip
    first = [ds[i]["video"] for i in range(4)]
    assert len({int(x[0, 0, 0, 0]) % 10 for x in first}) == 4  # consecutive items: different sources
    starts = set()
    for i in range(len(ds)):
        x = ds[i]["video"]
        assert x.shape == (5, 3, 4, 4) and x.dtype == torch.uint8
        steps = np.diff(x[:, 0, 0, 0].numpy().astype(int))
        assert (steps == 10).all()  # consecutive frames of one source
        starts.add(int(x[0, 0, 0, 0]) // 10)
    assert len(starts) > 4 and max(starts) <= 19  # random offsets, all inside the source
    assert torch.equal(FrameDiverseClips(sources, 5, 8, seed=1)[7]["video"], ds[7]["video"])
    with pytest.raises(ConfigError, match="no source video has 30 frames"):
        FrameDiverseClips(sources, clip_len=30)


def test_frame_diverse_crops_are_windows_of_the_frames():
    y, x = np.meshgrid(np.arange(12), np.arange(16), indexing="ij")
    frame = np.stack([y, x, y * 0], 0).astype(np.uint8)  # pixel (y, x) holds its own coordinates
    sources = [np.repeat(frame[None], 9, 0) for _ in range(3)]
    ds = FrameDiverseClips(sources, clip_len=5, per_source=20, seed=0, crop=8)
    corners = set()
    for i in range(len(ds)):
        v = ds[i]["video"]
        assert v.shape == (5, 3, 8, 8)
        y0, x0 = int(v[0, 0, 0, 0]), int(v[0, 1, 0, 0])
        assert torch.equal(v[0, 0], torch.from_numpy(frame[0, y0:y0 + 8, x0:x0 + 8]))
        corners.add((y0, x0))
    assert len(corners) > 10 and max(c[0] for c in corners) <= 4 and max(c[1] for c in corners) <= 8
    with pytest.raises(ConfigError, match="crop 13"):
        FrameDiverseClips(sources, clip_len=5, crop=13)


def test_frame_local_training_keeps_time_mixing_in_the_resampling_convs():
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    vae = tiny("t2")
    with pytest.raises(ConfigError, match="temporal_mixing"):
        VideoAutoencoderTrainer(vae, temporal_mixing="none")
    ae = VideoAutoencoderTrainer(vae, temporal_mixing="resample")
    convs = [m for n, m in vae.named_modules() if isinstance(m, WanCausalConv3d) and m.weight.shape[2] == 3
             and "time_conv" not in n]
    assert convs and all(not m.weight[:, :, :2].any() and m.weight[:, :, 2].any() for m in convs)
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-2, weight_decay=0.01)
    for _ in range(2):
        loss = ae.training_step({"video": clip(5, 8, 8)})["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(not m.weight[:, :, :2].any() for m in convs)  # held at zero
    v = clip(9, 8, 8)
    w = v.clone()
    w[:, 1] = 255 - w[:, 1]
    a, b = wan_encode(vae.eval(), v), wan_encode(vae, w)
    assert torch.equal(a[:, 0], b[:, 0]) and not torch.allclose(a[:, 1], b[:, 1])
    assert torch.equal(a[:, 2:], b[:, 2:])  # latent j >= 1 sees video frames 2j - 2 .. 2j only
