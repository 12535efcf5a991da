"""Flex-Forcing: chunk masks, pyramid schedules, KV-cache equivalence, the K-projection, per-frame timesteps,
sampling regimes, training, and `embodied infer video` on bad input (the model checks of ``tiny_config()`` run in
tests/test_model_contract.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np
import pytest
import torch

from core.config import compose
from core.errors import ConfigError, DataError
from core.layers.kv_cache import KVCache
from perception.video.chunking import (
    chunk_ids,
    chunk_mask,
    level_of_step,
    pyramid_schedule,
    random_partition,
    refines,
)
from perception.video.configuration_flexforcing import FlexForcingConfig
from perception.video.modeling_flexforcing import FlexForcingModel, tiny_config
from perception.video.pipeline_flexforcing import fill_cache, flex_reference, generate, supported_regimes

TINY = tiny_config()


def perturbed(model: FlexForcingModel, seed: int = 0, std: float = 0.05) -> FlexForcingModel:
    """Give the zero-initialised weights (adaLN-Zero, read-out, K-projection gamma / v) random values, so that
    equalities below are between non-trivial functions."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.dit.parameters():
            if p.abs().sum() == 0:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def tiny(seed: int = 0, **kw) -> FlexForcingModel:
    torch.manual_seed(seed)
    cfg = tiny_config(**kw)
    return perturbed(FlexForcingModel(cfg), seed)


def latents(b: int = 2, f: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, f, 4, 8, 8, generator=torch.Generator().manual_seed(seed))


def put(cache: KVCache, model: FlexForcingModel, kv, frames: torch.Tensor) -> None:
    tf = frames.repeat_interleave(16)
    cache.extend([k for k, _ in kv], [v for _, v in kv], tf, model.dit.positions(frames, 8, 8))


# -- masks and schedules -----------------------------------------------------------------------------------
def test_mask_one_chunk_is_all_ones_singletons_are_causal_mixed_is_block_triangular():
    assert chunk_mask(chunk_ids([5])).all()
    single = chunk_mask(chunk_ids([1] * 5))
    assert torch.equal(single, torch.ones(5, 5, dtype=torch.bool).tril())
    m = chunk_mask(chunk_ids([2, 1, 3]))
    expect = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                           [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expect)
    # any order: chunk ids follow generation order, not time; frame 0 generated last sees everything
    anyorder = chunk_mask(torch.tensor([2, 0, 0, 1]))
    assert anyorder[0].all() and not anyorder[1, 0] and not anyorder[1, 3] and anyorder[3, 1]


def test_pyramid_matches_the_spec_example_and_every_level_refines_the_previous():
    assert pyramid_schedule(21, 4) == [[21], [11, 10], [6, 5, 5, 5], [3, 3, 3, 2, 3, 2, 3, 2]]
    for n in (1, 2, 5, 8, 13, 21):
        levels = pyramid_schedule(n, 6)
        assert all(sum(p) == n for p in levels)
        assert all(refines(a, b) for a, b in zip(levels, levels[1:]))
    assert not refines([3, 3], [2, 4])  # a boundary moved
    assert [level_of_step(s, 8, 4) for s in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_random_partitions_cover_the_clip_and_include_both_extremes():
    g = torch.Generator().manual_seed(0)
    parts = [random_partition(8, g, p_one=0.2, p_singletons=0.2) for _ in range(300)]
    assert all(sum(p) == 8 and min(p) >= 1 for p in parts)
    assert [8] in parts and [1] * 8 in parts
    assert len({tuple(p) for p in parts}) > 20


# -- the DiT: cache equivalence, K-projection, per-frame timesteps ----------------------------------------
@pytest.mark.parametrize("k_projection", [True, False])
@pytest.mark.parametrize("sizes", [[2, 1, 3], [1] * 6, [6]])
def test_chunked_inference_with_kv_cache_equals_one_masked_pass(sizes, k_projection):
    model = tiny(k_projection=k_projection)
    z = latents()
    t = torch.rand(2, 6, generator=torch.Generator().manual_seed(1))
    frames = torch.arange(6)
    with torch.no_grad():
        full = model.dit(z, t, frames, chunk_ids(sizes))
        cache, outs, a = KVCache(2), [], 0
        for s in sizes:
            o, kv = model.dit(z[:, a:a + s], t[:, a:a + s], frames[a:a + s], None, caches=[cache], return_kv=True)
            put(cache, model, kv, frames[a:a + s])
            outs.append(o)
            a += s
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=2e-5, rtol=0)


def test_any_order_generation_with_the_cache_equals_the_masked_pass():
    """Chunks generated out of time order (last frames first): positions stay time indices."""
    model = tiny()
    z, t = latents(), torch.rand(2, 6, generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([1, 1, 2, 2, 0, 0])  # frames 4-5 first, then 0-1, then 2-3
    with torch.no_grad():
        full = model.dit(z, t, torch.arange(6), ids)
        cache, out = KVCache(2), torch.empty_like(z)
        for cid in range(3):
            sel = (ids == cid).nonzero().squeeze(1)
            o, kv = model.dit(z[:, sel], t[:, sel], sel, None, caches=[cache], return_kv=True)
            put(cache, model, kv, sel)
            out[:, sel] = o
        torch.testing.assert_close(out, full, atol=2e-5, rtol=0)
        # and the order matters: left-to-right chunks give other outputs for frames 0-1
        l2r = model.dit(z, t, torch.arange(6), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert (l2r[:, :2] - full[:, :2]).abs().max() > 1e-3


def test_k_projection_at_init_leaves_outputs_unchanged_and_learns_away_from_identity():
    torch.manual_seed(0)
    with_k = FlexForcingModel(FlexForcingConfig(**{**TINY.__dict__, "k_projection": True}))
    without = FlexForcingModel(FlexForcingConfig(**{**TINY.__dict__, "k_projection": False}))
    perturbed(without)
    missing, unexpected = with_k.load_state_dict(without.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("dit.kproj.") for k in missing)
    with_k.eval()
    z, t = latents(), torch.rand(2, 6, generator=torch.Generator().manual_seed(3))
    ids = chunk_ids([2, 2, 2])
    with torch.no_grad():
        a = with_k.dit(z, t, torch.arange(6), ids)
        b = without.dit(z, t, torch.arange(6), ids)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        # u starts random, gamma / v at zero: the rank-one term has a gradient path once v moves
        head = with_k.dit.kproj[0].weight.view(2, 1 + 2 * 16, 32)
        assert head[:, 0].abs().sum() == 0 and head[:, 17:].abs().sum() == 0 and head[:, 1:17].abs().sum() > 0
        with_k.dit.kproj[0].bias.view(2, 33)[:, 0] += 0.5  # gamma = 0.5 on earlier chunks' keys
        c = with_k.dit(z, t, torch.arange(6), ids)
    assert torch.equal(c[:, :2], a[:, :2])  # the first chunk has no earlier keys
    assert (c[:, 2:] - a[:, 2:]).abs().max() > 1e-4


def test_k_projection_receives_gradient_after_init():
    model = FlexForcingModel(TINY).train()
    perturbed(model)
    with torch.no_grad():
        for lin in model.dit.kproj:  # back to the init of the projection itself
            w = lin.weight.view(2, 33, 32)
            w[:, 0].zero_()
            w[:, 17:].zero_()
            lin.bias.view(2, 33)[:, 0].zero_()
            lin.bias.view(2, 33)[:, 17:].zero_()
    z = latents()
    out = model.dit(z, torch.rand(2, 6), torch.arange(6), chunk_ids([3, 3]))
    out.square().mean().backward()
    g = model.dit.kproj[0].weight.grad.view(2, 33, 32)
    assert g[:, 0].abs().sum() > 0 and g[:, 17:].abs().sum() > 0  # gamma and v move off zero


def test_per_frame_timesteps_reach_their_own_frames_tokens():
    model = tiny()
    z = latents()
    t = torch.full((2, 6), 0.5)
    seen = {}

    def grab(module, inputs):
        seen.setdefault("c", inputs[2].detach())  # the block's modulation input (Wan's timestep_proj), per token

    hook = model.dit.blocks[0].register_forward_pre_hook(grab)
    t2 = t.clone()
    t2[:, 3] = 0.9
    with torch.no_grad():
        a = model.dit(z, t, torch.arange(6), chunk_ids([1] * 6))
        seen.clear()
        b = model.dit(z, t2, torch.arange(6), chunk_ids([1] * 6))
        ce = model.dit.transformer.condition_embedder
        emb = ce.time_proj(ce.act_fn(model.dit._time_embedding(t2)))  # (B, F, 6 D)
    hook.remove()
    c = seen["c"].view(2, 6, 16, 6 * 32)
    torch.testing.assert_close(c, emb[:, :, None].expand(2, 6, 16, 6 * 32))
    assert torch.equal(a[:, :3], b[:, :3])  # frame-causal: earlier frames do not see frame 3's level
    assert (a[:, 3] - b[:, 3]).abs().max() > 1e-4


def test_kv_cache_roll_keeps_sinks_and_newest_frames():
    cache = KVCache(1)
    for f in range(6):
        k = torch.full((1, 1, 2, 4), float(f))
        cache.extend([k], [k], torch.tensor([f, f]), torch.zeros(2, 3))
    cache.roll(3, sink_frames=1)
    assert cache.frames() == [0, 4, 5] and cache.keys[0][0, 0, :, 0].tolist() == [0, 0, 4, 4, 5, 5]
    with pytest.raises(ValueError, match="already cached"):
        cache.extend([k], [k], torch.tensor([5, 5]), torch.zeros(2, 3))


# -- sampling ----------------------------------------------------------------------------------------------
def test_flex_depth_first_cached_window_equals_breadth_first_masked_passes():
    from core.diffusion import timestep_grid
    from perception.video.pipeline_flexforcing import _Clock, _pyramid_window

    model = tiny()
    z = latents()
    with torch.no_grad():
        ctx = KVCache(2)
        fill_cache(model, ctx, z[:, :2], torch.arange(2))
        grid = timestep_grid(6)
        x = torch.randn(2, 4, 4, 8, 8, generator=torch.Generator().manual_seed(4))
        dfs, passes = _pyramid_window(model, x, torch.arange(2, 6), ctx, grid, 3, _Clock(torch.device("cpu")))
        bfs = flex_reference(model, x, torch.arange(2, 6), ctx, grid, 3)
    torch.testing.assert_close(dfs, bfs, atol=2e-5, rtol=0)
    assert passes == 2 * 1 + 2 * 2 + 2 * 4  # levels [4], [2, 2], [1, 1, 1, 1], two steps each


def test_one_model_runs_every_regime_and_long_videos_keep_a_bounded_cache(monkeypatch):
    from perception.video import pipeline_flexforcing

    model = tiny()
    ctx = latents(1, 2)
    sizes = []
    real = pipeline_flexforcing.fill_cache

    def spy(m, cache, lat, frames):
        real(m, cache, lat, frames)
        sizes.append(len(cache))

    monkeypatch.setattr(pipeline_flexforcing, "fill_cache", spy)
    outs = {}
    for regime in ("bidirectional", "autoregressive", "flex", "chunked"):
        # 8x length
        g = pipeline_flexforcing.generate(model, ctx, 48, regime, generator=torch.Generator().manual_seed(0))
        assert g.latents.shape == (1, 50, 4, 8, 8) and torch.isfinite(g.latents).all()
        assert torch.equal(g.latents[:, :2], ctx) and g.first_frame_s <= g.seconds
        assert g.windows[-1][1] == 50
        outs[regime] = g.latents
    assert max(sizes) == TINY.num_frames  # the rolling cache never exceeds the training window (T frames right
    # after a fill, T - 1 once rolled, whatever the video length)
    assert (outs["flex"] - outs["bidirectional"]).abs().max() > 1e-4  # different schedules, different videos


def test_rigid_baselines_refuse_the_regimes_they_were_not_trained_for():
    bi = tiny(chunking="one", noise="per_clip", k_projection=False)
    ar = tiny(chunking="singletons", k_projection=False)
    assert supported_regimes(bi) == ("bidirectional",) and supported_regimes(ar) == ("autoregressive",)
    with pytest.raises(ValueError, match="trained with chunking='one'"):
        generate(bi, latents(1, 2), 4, "flex")
    g = generate(bi, latents(1, 2), 8, "bidirectional")  # context inline at t = 0, kept as given
    assert torch.equal(g.latents[:, :2], latents(1, 2))


def test_first_frame_conditioning_changes_the_video():
    model = tiny()
    a = generate(model, latents(1, 1, seed=0), 5, "flex", generator=torch.Generator().manual_seed(0)).latents
    b = generate(model, latents(1, 1, seed=1), 5, "flex", generator=torch.Generator().manual_seed(0)).latents
    assert (a[:, 1:] - b[:, 1:]).abs().max() > 1e-3


# -- training ----------------------------------------------------------------------------------------------
def test_training_layouts_follow_the_configured_regime():
    g = torch.Generator().manual_seed(0)
    flex = FlexForcingModel(TINY)
    layouts = [flex.sample_training_layout(6, g) for _ in range(200)]
    assert all(sum(p) == 6 and (ctx == 0 or p[0] == ctx) for ctx, p in layouts)
    assert {ctx for ctx, _ in layouts} == {0, 1, 2}
    bi = FlexForcingModel(FlexForcingConfig(**{**TINY.__dict__, "chunking": "one", "k_projection": False}))
    assert all(p == [6] for _, p in (bi.sample_training_layout(6, g) for _ in range(50)))
    ar = FlexForcingModel(FlexForcingConfig(**{**TINY.__dict__, "chunking": "singletons"}))
    for ctx, p in (ar.sample_training_layout(6, g) for _ in range(50)):
        assert p == ([ctx] if ctx else []) + [1] * (6 - ctx)


def test_loss_falls_on_a_small_set():
    torch.manual_seed(0)
    model = FlexForcingModel(TINY).train()
    z = latents(4, 6) * 0.3 + torch.linspace(-1, 1, 6)[None, :, None, None, None]  # structured, learnable
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(120):
        loss = model.training_step({"latents": z})["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.mean(losses[-20:]) < 0.6 * np.mean(losses[:20])


def test_config_errors_are_one_line():
    with pytest.raises(ConfigError, match="model.chunking"):
        FlexForcingConfig(chunking="diagonal")
    with pytest.raises(ConfigError, match="frame_size"):
        FlexForcingConfig(frame_size=30)
    with pytest.raises(ConfigError, match="k_projection"):
        FlexForcingConfig(chunking="one", k_projection=True)
    with pytest.raises(ConfigError):
        compose(["experiment=flexforcing", "model.no_such_key=1"])


# -- end to end: train, evaluate, infer; bad input ---------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from perception.video import task

    root = tmp_path_factory.mktemp("flex")
    base = ["experiment=flexforcing", "debug=tiny", "model=flexforcing_tiny", f"data.root={root / 'data'}",
            f"data.test_root={root / 'test'}", "data.size=16", "data.render_n=4", "data.render_frames=8",
            "data.test_n=2", "data.test_frames=14", "data.eval_frames=14", f"out_dir={root / 'run'}"]
    result = task.train(compose(base))
    return root, base, result


def test_train_and_evaluate_end_to_end(trained):
    from perception.video import task

    root, base, result = trained
    assert result["step"] == 4 and (root / "run" / "vae" / "checkpoints").is_dir()
    out = task.evaluate(compose(base))
    assert set(out["regimes"]) == {"bidirectional", "autoregressive", "flex"}
    for r in out["regimes"].values():
        m = r["mean"]
        assert 0 < m["psnr"] < 100 and -1 <= m["ssim"] <= 1 and m["fd"] >= 0 and m["fps"] > 0
        assert len(m["psnr_per_frame"]) == 12 and set(m["drift"]) == {"1x", "2x"}
    assert (root / "run" / "eval.json").is_file()


def test_self_forcing_arm_trains_from_a_run_and_evaluates_with_sinks(trained):
    """The Self-Forcing arm end to end on the tiny run (student and teacher: that run), then the evaluation with
    and without a sink frame, with VBench's temporal_flickering beside the other metrics."""
    from perception.video import task
    from perception.video.experiments import peer_rows, row_name

    root, base, _ = trained
    run = root / "run"
    sf = [*base, "model.objective=self_forcing", "model.sf_gen_every=2", f"model.init_path={run}",
          f"model.teacher_path={run}", f"out_dir={root / 'sf'}", "data.regimes=[autoregressive]",
          "data.sink_frames=[0,1]", "data.sink_ropes=[relative,absolute]"]
    result = task.train(compose(sf))
    assert result["step"] == 4 and not (root / "sf" / "vae").exists()  # VAE and statistics came with the start
    out = task.evaluate(compose(sf))
    assert set(out["regimes"]) == {"autoregressive", "autoregressive+sink1", "autoregressive+sink1abs"}
    for r in out["regimes"].values():
        m = r["mean"]
        assert 0 < m["tf_vbench"] <= 1 and 0 < m["tf_vbench_gt"] <= 1 and "tf_vbench" in m["drift"]["2x"]
    rows = peer_rows({"Self-Forcing": out})
    assert list(rows) == ["Self-Forcing (autoregressive)", "Self-Forcing (autoregressive, 1 sink)",
                          "Self-Forcing (autoregressive, 1 sink (absolute positions))"]
    assert row_name("self_forcing", "autoregressive+sink2abs", False) == "Self-Forcing + 2 sinks (absolute positions)"
    assert row_name("flexforcing", "flex", True) == "Flex-Forcing (flex)"


def _infer_args(**kw):
    base = dict(out=None, mode="flex", frames=8, first_frame=None, seed=0, steps=None, checkpoint=None,
                overwrite=False)
    return argparse.Namespace(**{**base, **kw})


def test_infer_video_writes_the_frames_asked_for(trained, tmp_path):
    import cv2

    from core.data.video import probe_video
    from perception.video.cli import infer

    root = trained[0]
    img = tmp_path / "first.png"
    cv2.imwrite(str(img), np.full((40, 60, 3), 120, np.uint8))
    out = tmp_path / "v.mp4"
    assert infer(_infer_args(out=str(out), first_frame=str(img), checkpoint=str(root / "run"), frames=9)) == 0
    n, _, hw = probe_video(out)
    assert n == 9 and hw == (16, 16)
    with pytest.raises(ConfigError, match="exists"):
        infer(_infer_args(out=str(out), first_frame=str(img), checkpoint=str(root / "run")))


@pytest.mark.parametrize("case", ["missing", "broken", "zero_frames"])
def test_infer_video_bad_input_is_one_line_and_leaves_no_file(trained, tmp_path, case):
    root = trained[0]
    first = tmp_path / "first.png"
    frames = "8"
    if case == "broken":
        first.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    elif case == "zero_frames":
        frames = "0"
        import cv2

        cv2.imwrite(str(first), np.zeros((16, 16, 3), np.uint8))
    out = tmp_path / "out.mp4"
    r = subprocess.run([sys.executable, "-m", "embodied.cli", "infer", "video", "--out", str(out), "--frames", frames,
                        "--first-frame", str(first), "--checkpoint", str(root / "run")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not out.exists() and not list(tmp_path.glob("*.mp4*"))


def test_read_first_frame_errors_name_the_file(tmp_path):
    from perception.video.cli import read_first_frame

    with pytest.raises(DataError, match="nope.png"):
        read_first_frame(tmp_path / "nope.png", 16)


# -- the shipped checkpoint --------------------------------------------------------------------------------
def test_shipped_checkpoint_loads_runs_every_regime_and_the_demo_section_runs(tmp_path):
    from core.demo import DemoContext
    from core.pretrained import read_card
    from perception.video.cli import DEFAULT_CHECKPOINT, SAMPLE_FRAME
    from perception.video.demo import demo_section

    model = FlexForcingModel.from_pretrained(DEFAULT_CHECKPOINT)  # strict: every key and shape must match the code
    assert model.config.chunking == "random" and model.config.k_projection
    assert (DEFAULT_CHECKPOINT / SAMPLE_FRAME).is_file() and "metrics" in read_card(DEFAULT_CHECKPOINT)
    section = demo_section(DemoContext(out=tmp_path))
    for regime in ("bidirectional", "autoregressive", "flex"):
        assert section.figures[f"{regime}_psnr_first_window"] > 18.0  # far above noise (~8 dB)
    assert section.figures["scene_l1_to_given"] < section.figures["scene_l1_to_blank"]
    assert (tmp_path / "flexforcing" / "regimes.mp4").is_file()
    assert (tmp_path / "flexforcing" / "real_bikes_flex.mp4").is_file()


def test_infer_video_without_a_first_frame_uses_the_shipped_sample(tmp_path):
    from core.data.video import probe_video
    from perception.video.cli import infer

    out = tmp_path / "v.mp4"
    assert infer(_infer_args(out=str(out), mode="autoregressive", frames=6, steps=2)) == 0
    n, _, hw = probe_video(out)
    assert n == 6 and hw == (32, 32)


def _held_out_first_frames(tmp_path, n: int = 2, size: int = 32):
    """First frames of ``n`` simulator clips the model never saw (render seed 7000), (n, 3, H, W) uint8."""
    from core.data.video import VideoClipDataset
    from sim.render.videos import make_dataset

    make_dataset(tmp_path / "clips", n=n, seed=7000, size=size, spp=4, test_fraction=0.0, frames=2)
    ds = VideoClipDataset(tmp_path / "clips" / "train" / "video", clip_len=1, step=10**9, cache="all")
    return torch.stack([ds[i]["video"][0] for i in range(len(ds))])


def test_infer_video_continues_the_scene_it_is_given(tmp_path):
    """The issue-34 failure (frame 0 the sample scene, frames 1-15 a blur without its objects): on the shipped
    sample frame and on held-out simulator frames, the first generated frames stay closer to the given frame than
    to a blank (mid-grey) control frame, and closer to it than the continuation of a blank control frame is."""
    import cv2

    from perception.video.cli import DEFAULT_CHECKPOINT, SAMPLE_FRAME
    from perception.video.pipeline_flexforcing import continue_video

    model = FlexForcingModel.from_pretrained(DEFAULT_CHECKPOINT)
    r = model.config.temporal_factor
    sample = cv2.imread(str(DEFAULT_CHECKPOINT / SAMPLE_FRAME))[..., ::-1].copy()
    firsts = torch.cat([torch.from_numpy(sample).permute(2, 0, 1)[None], _held_out_first_frames(tmp_path)])
    blank = torch.full_like(firsts[:1], 128)
    for mode in ("flex", "autoregressive", "bidirectional"):
        frames, _ = continue_video(model, torch.cat([firsts, blank])[:, None], 1 + 2 * r, mode, context=1,
                                   generator=torch.Generator().manual_seed(0))
        new = frames[:, 1:1 + 2 * r].float()  # the first two latent frames' video frames
        given = firsts[:, None].float()
        to_given = (new[:-1] - given).abs().mean(dim=(1, 2, 3, 4))
        to_blank = (new[:-1] - 128.0).abs().mean(dim=(1, 2, 3, 4))
        blank_to_given = (new[-1:] - given).abs().mean(dim=(1, 2, 3, 4))
        assert bool((to_given < to_blank).all()), (mode, to_given.tolist(), to_blank.tolist())
        assert bool((to_given < blank_to_given).all()), (mode, to_given.tolist(), blank_to_given.tolist())
        assert float(to_given.max()) < 20.0, (mode, to_given.tolist())  # of 255: the scene, not a blur of it


# -- a user's Wan folders ------------------------------------------------------------------------------------------
def test_a_wan_pipeline_folder_loads_with_only_the_k_projection_missing_and_fine_tunes(tmp_path):
    """FlexForcingModel(base_path=<a diffusers Wan pipeline folder>) takes its transformer key for key (only
    ``kproj.*`` is new) and its VAE with Wan's latent statistics; a training step moves the weights; the export
    rebuilds without the folder; the folder is byte-identical afterwards."""
    from core.testing import folder_digest
    from tests.perception.video.conftest import TINY_WAN, TINY_WAN_VAE, save_wan_pipeline

    base = save_wan_pipeline(tmp_path / "Wan-tiny", TINY_WAN, dict(TINY_WAN_VAE, latents_mean=[0.1, -0.2, 0.3, 0.0],
                                                                     latents_std=[1.5, 2.0, 0.5, 1.0]))
    before = folder_digest(base)
    model = FlexForcingModel(tiny_config(base_path=str(base)))
    assert model.load_report["unexpected"] == []
    assert model.load_report["missing"] and all(k.startswith("kproj.") for k in model.load_report["missing"])
    assert model.latent_std.tolist() == [1.5, 2.0, 0.5, 1.0]  # the user's VAE states its normalisation
    from diffusers import WanTransformer3DModel

    ref = WanTransformer3DModel.from_pretrained(base / "transformer")
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in model.dit.transformer.state_dict().items())
    model.train()
    opt = torch.optim.SGD([p for p in model.dit.parameters() if p.requires_grad], lr=1e-2)
    w0 = model.dit.transformer.blocks[0].attn1.to_q.weight.clone()
    out = model.training_step({"video": torch.randint(0, 256, (2, 6, 3, 16, 16), dtype=torch.uint8)})
    out["loss"].backward()
    opt.step()
    assert not torch.equal(model.dit.transformer.blocks[0].attn1.to_q.weight, w0)
    model.save_pretrained(tmp_path / "out")
    moved = tmp_path / "moved"
    base.rename(moved)  # the export is self-contained: the user's folder is not needed to load it
    again = FlexForcingModel.from_pretrained(tmp_path / "out")
    assert torch.equal(again.dit.transformer.blocks[0].attn1.to_q.weight, model.dit.transformer.blocks[0].attn1.to_q.weight)
    moved.rename(base)
    assert folder_digest(base) == before


def test_rectangular_frames_and_a_temporal_factor_of_two_run_every_regime():
    """frame_size=[H, W] with H != W (Wan2.1's 480 x 832 in miniature) and a VAE that compresses time 2x: latent
    frames are counted as the VAE makes them (1 + k for 1 + 2 k video frames) and every regime runs."""
    from perception.video.pipeline_flexforcing import continue_video

    model = tiny(frame_size=[16, 32], vae_temporal_downsample=[True], vae_clip_frames=5)
    assert model.config.latent_hw == (8, 16) and model.config.temporal_factor == 2
    video = torch.randint(0, 256, (1, 5, 3, 16, 32), dtype=torch.uint8)
    z = model.encode(video)
    assert z.shape == (1, 3, 4, 8, 16)
    assert model.decode(z).shape == (1, 5, 3, 16, 32)
    for regime in ("bidirectional", "autoregressive", "flex"):
        frames, gen = continue_video(model, video[:, :1], 15, regime, context=1,
                                     generator=torch.Generator().manual_seed(0))
        assert frames.shape == (1, 15, 3, 16, 32) and torch.equal(frames[:, 0], video[:, 0])
        assert gen.latents.shape[1] == 8  # 1 + ceil(14 / 2)


def test_a_transformer_narrower_than_a_token_is_refused():
    """A token of C p^2 latent values embedded into fewer dimensions can only be moved inside that span: the rest of
    the initial noise would survive sampling (the first Wan miniature, 16 channels x 4^2 into width 128, sampled
    pure noise). The config refuses it with a one-line error."""
    with pytest.raises(ConfigError, match="below a token's 256 latent values"):
        FlexForcingConfig(latent_channels=16, patch=4, num_heads=4, head_dim=32)
    FlexForcingConfig(latent_channels=8, patch=4, num_heads=4, head_dim=48)  # 192 >= 128: fine
