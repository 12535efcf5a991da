"""``pipeline_flexforcing.generate`` pinned per regime on the tiny model: which frames each window makes final and
when (``windows`` / ``on_window``), how many DiT passes it costs, and the latents it returns.

The numbers were recorded before ``generate`` was split into one function per regime and are unchanged by the
split (bit for bit on the machine that recorded them; the tolerance only absorbs other CPUs' float rounding). A
change to the tiny config changes the latents' figures: the failure prints the new ones.
"""

from __future__ import annotations

import pytest
import torch

from perception.video.modeling_flexforcing import FlexForcingModel, tiny_config
from perception.video.pipeline_flexforcing import generate

RIGID = dict(k_projection=False)
MODELS = {
    "flex": {},
    "context3": dict(max_context=3),
    "one": dict(chunking="one", noise="per_clip", **RIGID),
    "singletons": dict(chunking="singletons", noise="per_chunk", **RIGID),
}

# case: (model, generate's arguments, given frames, new frames, windows, forward passes, the new latents' sum,
# absolute sum and sum weighted by fixed random weights)
AR13 = [(f, f + 1) for f in range(1, 14)]
CASES = {
    "flex": ("flex", dict(regime="flex"), 1, 13, [(1, 6), (6, 11), (11, 14)], 26,
             (486.3074, 6175.7471, 40.0138)),
    "bidirectional": ("flex", dict(regime="bidirectional"), 1, 13, [(1, 6), (6, 11), (11, 14)], 15,
                      (487.7227, 6175.9185, 40.3731)),
    "autoregressive": ("flex", dict(regime="autoregressive"), 1, 13, AR13, 66,
                       (499.3921, 6168.7004, 42.6571)),
    "chunked": ("flex", dict(regime="chunked", chunk=2), 1, 13,
                [(1, 3), (3, 5), (5, 7), (7, 9), (9, 11), (11, 13), (13, 14)], 36,
                (498.3843, 6170.4532, 42.3842)),
    "chunked_order": ("flex", dict(regime="chunked", chunk=2, order=[1, 0]), 1, 7,
                      [(3, 5), (1, 3), (5, 7), (7, 8)], 21,
                      (346.8142, 3279.5844, -42.1586)),
    "autoregressive_order": ("flex", dict(regime="autoregressive", order=[2, 0, 1, 4, 3]), 1, 9,
                             [(3, 4), (1, 2), (2, 3), (5, 6), (4, 5), (6, 7), (7, 8), (8, 9), (9, 10)], 46,
                             (386.892, 4224.6368, 48.7122)),
    "flex_context3": ("context3", dict(regime="flex", levels=2, steps=3, shift=2.0), 3, 10,
                      [(3, 6), (6, 9), (9, 12), (12, 13)], 19,
                      (287.0432, 4747.6184, 31.9793)),
    "bidirectional_context3": ("context3", dict(regime="bidirectional"), 3, 10,
                               [(3, 6), (6, 9), (9, 12), (12, 13)], 20,
                               (360.7451, 4727.173, 33.037)),
    "chunked_context3": ("context3", dict(regime="chunked", chunk=3), 3, 10,
                         [(3, 6), (6, 9), (9, 12), (12, 13)], 21,
                         (360.2926, 4727.0629, 33.061)),
    "bidirectional_inline": ("one", dict(regime="bidirectional"), 2, 9, [(2, 6), (6, 10), (10, 11)], 12,
                             (384.3582, 4225.9088, 44.6302)),
    "autoregressive_rigid": ("singletons", dict(regime="autoregressive"), 2, 9, [(f, f + 1) for f in range(2, 11)],
                             46, (387.7435, 4224.5409, 47.3231)),
}


@pytest.fixture(scope="module")
def models() -> dict[str, FlexForcingModel]:
    out = {}
    for name, kw in MODELS.items():
        torch.manual_seed(1)
        model = FlexForcingModel(tiny_config(num_frames=6, sample_steps=4, pyramid_levels=3, **kw)).eval()
        if model.dit.kproj is not None:  # zero-initialised: random values make it matter
            g = torch.Generator().manual_seed(7)
            with torch.no_grad():
                for p in model.dit.kproj.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        out[name] = model
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_every_regime_keeps_its_windows_passes_and_latents(models, case):
    model, kw, k0, n, windows, passes, figures = CASES[case]
    ctx = torch.randn(2, k0, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    seen = []
    g = generate(models[model], ctx, n, generator=torch.Generator().manual_seed(5),
                 on_window=lambda a, e: seen.append((a, e)), **kw)
    new = g.latents[:, k0:].double()
    weights = torch.randn(new.shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    got = tuple(round(v.item(), 4) for v in (new.sum(), new.abs().sum(), (new * weights).sum()))
    assert g.latents.shape == (2, k0 + n, 4, 8, 8) and torch.equal(g.latents[:, :k0], ctx)
    assert g.windows == windows and seen == windows and g.forward_passes == passes
    assert 0 < g.first_frame_s <= g.seconds
    assert got == pytest.approx(figures, rel=0, abs=2e-3), f"{case}: the new latents' figures are {got}"


@pytest.mark.parametrize("model, kw, shape, n, match", [
    ("one", dict(regime="flex"), (1, 1, 4, 8, 8), 3, "trained with chunking='one' and runs bidirectional"),
    ("flex", dict(regime="flex"), (1, 4, 8, 8), 3, r"context must be \(B, K >= 1, C, h, w\) latents"),
    ("flex", dict(regime="flex"), (1, 1, 4, 8, 8), 0, "num_new must be >= 1, got 0"),
    ("flex", dict(regime="chunked", order=[0, 0]), (1, 1, 4, 8, 8), 4, r"order must permute range\(2\)"),
])
def test_bad_arguments_are_refused(models, model, kw, shape, n, match):
    with pytest.raises(ValueError, match=match):
        generate(models[model], torch.zeros(*shape), n, **kw)
