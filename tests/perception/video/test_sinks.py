"""Sink frames in every AR / flex regime: the rolling cache with sinks equals recomputing its attention pattern
without a cache, the mask has the sink / window structure, and ``sink_frames=0`` is the plain cache bit for bit."""

from __future__ import annotations

import pytest
import torch

from core.diffusion import euler_step, timestep_grid
from core.errors import ConfigError
from perception.video.modeling_flexforcing import FlexForcingModel, tiny_config
from perception.video.pipeline_flexforcing import generate, sink_window_mask


def tiny(**kw) -> FlexForcingModel:
    torch.manual_seed(0)
    model = FlexForcingModel(tiny_config(**kw))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the zero-initialised weights get values: equalities between non-trivial functions
        for p in model.dit.parameters():
            if p.abs().sum() == 0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def context(b: int = 1, k: int = 2) -> torch.Tensor:
    return torch.randn(b, k, 4, 8, 8, generator=torch.Generator().manual_seed(3))


def test_sink_window_mask_structure():
    m = sink_window_mask(12, given=2, window=5, sinks=2)
    assert m[:2, :2].all() and not m[:2, 2:].any()  # the given frames attend each other only
    assert not torch.triu(m[2:], 1 + 2).any()  # nothing attends the future
    for i in range(2, 12):
        row = m[i].nonzero().squeeze(1).tolist()
        expect = list(range(i + 1)) if i <= 5 else [0, 1] + list(range(i - 3, i + 1))
        assert row == expect, (i, row)
        assert len(row) <= 5 + 1  # the window and the frame itself: constant memory
    plain = sink_window_mask(12, given=2, window=5, sinks=0)
    assert plain[11].nonzero().squeeze(1).tolist() == [6, 7, 8, 9, 10, 11]


@pytest.mark.parametrize("k_projection", [True, False])
def test_rolling_cache_with_sinks_equals_one_masked_pass_without_cache(k_projection):
    """``autoregressive`` with a rolling cache of T - 1 frames, 2 of them sinks at their own positions
    (``sink_rope=absolute``), against a recomputation: every frame's Euler steps as one pass over all frames so
    far (clean ones at t = 0), no cache, under ``sink_window_mask`` — 3x past the cache's length."""
    kw = {} if k_projection else dict(chunking="singletons", k_projection=False)
    model = tiny(**kw)
    ctx, n_new = context(), 14
    g = generate(model, ctx, n_new, "autoregressive", generator=torch.Generator().manual_seed(0), sink_frames=2,
                 sink_rope="absolute").latents
    cfg = model.config
    grid = timestep_grid(cfg.sample_steps, cfg.sample_shift)
    noise = torch.randn(1, n_new, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    total = 2 + n_new
    mask = sink_window_mask(total, 2, cfg.num_frames - 1, 2)
    out = ctx.clone()
    with torch.no_grad():
        for i in range(2, total):
            x = noise[:, i - 2:i - 1]
            chunks = torch.tensor([0, 0] + list(range(1, i - 1 + 1)))
            for s in range(len(grid) - 1):
                t = torch.zeros(1, i + 1)
                t[:, -1] = grid[s]
                v = model.dit(torch.cat([out, x], 1), t, torch.arange(i + 1), chunks, frame_mask=mask[:i + 1, :i + 1])
                x = euler_step(x, v[:, -1:], grid[s], grid[s + 1])
            out = torch.cat([out, x], 1)
    torch.testing.assert_close(g, out, atol=5e-5, rtol=0)
    plain = generate(model, ctx, n_new, "autoregressive", generator=torch.Generator().manual_seed(0)).latents
    assert (plain[:, -4:] - g[:, -4:]).abs().max() > 1e-4  # the sinks change what long videos attend


@pytest.mark.parametrize("regime", ["bidirectional", "autoregressive", "chunked", "flex"])
def test_zero_sinks_is_the_plain_cache_bit_for_bit(regime):
    model = tiny()
    gen = lambda **kw: generate(model, context(), 20, regime, generator=torch.Generator().manual_seed(1),  # noqa: E731
                                **kw).latents
    assert torch.equal(gen(), gen(sink_frames=0)) and torch.equal(gen(), gen(sink_frames=0, sink_rope="absolute"))


@pytest.mark.parametrize("regime", ["bidirectional", "autoregressive", "chunked", "flex"])
def test_sinks_act_only_once_the_context_rolls_past_them(regime):
    """Until the window leaves frame 0 the sinks are just the oldest context frames: same video; later the
    context differs; ``relative`` and ``absolute`` differ only in the sinks' rotary positions."""
    model = tiny()
    gen = lambda n, **kw: generate(model, context(), n, regime, generator=torch.Generator().manual_seed(1),  # noqa: E731
                                   **kw).latents
    short = 2 if regime in ("bidirectional", "flex") else 3  # inside the first window / before the cache rolls
    torch.testing.assert_close(gen(short), gen(short, sink_frames=1), atol=0, rtol=0)
    long, rel, ab = gen(24), gen(24, sink_frames=1), gen(24, sink_frames=1, sink_rope="absolute")
    assert (long[:, -3:] - rel[:, -3:]).abs().max() > 1e-4 and (rel[:, -3:] - ab[:, -3:]).abs().max() > 1e-4
    assert torch.isfinite(rel).all()


def test_relative_sinks_sit_right_before_the_recent_frames_in_the_cache(monkeypatch):
    from perception.video import pipeline_flexforcing as pf

    seen = []
    real = pf._reposition_sinks

    def spy(cache, sinks):
        real(cache, sinks)
        seen.append((cache.frames(), torch.unique(cache.positions[:, 0]).tolist()))

    monkeypatch.setattr(pf, "_reposition_sinks", spy)
    model = tiny()
    generate(model, context(), 12, "autoregressive", sink_frames=2)
    frames, pos = seen[-1]
    assert frames == [0, 1, 11, 12, 13] and pos == [9, 10, 11, 12, 13]  # true indices kept; positions contiguous


def test_sink_arguments_are_checked():
    model = tiny()
    with pytest.raises(ValueError, match="sink_frames=2"):
        generate(model, context(), 4, "flex", sink_frames=2)  # flex keeps 2 context frames: at most 1 sink
    with pytest.raises(ValueError, match="sink_rope"):
        generate(model, context(), 4, "autoregressive", sink_frames=1, sink_rope="nope")
    with pytest.raises(ConfigError, match="sink_frames"):
        tiny_config(sink_frames=9)
