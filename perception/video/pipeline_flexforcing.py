"""Sampling Flex-Forcing in every regime from the same weights.

All regimes continue ``K`` given clean latent frames (the context; a first frame for image-to-video) to
``K + num_new`` frames with Euler steps of the flow-matching ODE (``core.diffusion``), and all generate videos
longer than the training length ``T`` the same way: in windows, conditioning on the newest frames.

- ``bidirectional``: each window of ``T - Kc`` new frames is one chunk, denoised jointly for ``steps`` steps
  while attending to the ``Kc`` context frames held in a KV cache (for a model trained with one chunk and full
  attention, ``chunking=one``, the context frames sit *inline* in the chunk at t = 0 instead).
- ``autoregressive``: singleton chunks. Each frame is denoised for ``steps`` steps attending to the cache; then
  one pass at t = 0 writes its clean keys / values to the cache, which rolls to the newest ``T - 1`` frames
  (rotary positions make attention depend on offsets only, so absolute indices may grow without bound).
- ``chunked``: the same with chunks of ``chunk`` frames (block autoregression); ``order`` generates the chunks
  of a window in any order (positions stay the frames' time indices; the cache holds them in generation order).
- ``flex``: pyramid timestep chunking per window: step ``s`` uses partition level ``level_of_step(s)`` of
  ``pyramid_schedule(T - Kc, levels)``; inside a step the chunks run in order with a per-step KV cache (equal
  to one chunk-causal masked pass over the window, ``flex_reference``), traversed depth first so the first
  chunk of the finest level is final long before the window is — streaming with a global plan.

Sink frames (``sink_frames = K``, attention sinks as in StreamingLLM; Self-Forcing++, LongLive and Rolling
Forcing keep the first frames of a long video in the cache): the first ``K`` latent frames of the video stay in
every context, *in place of* the oldest context frames, so the attended span stays the training window's. In
``autoregressive`` / ``chunked`` the rolling cache keeps them (``KVCache.roll(max_frames, K)``); in
``bidirectional`` / ``flex`` each window's context is the ``K`` sinks and the newest ``Kc - K`` frames.
``sink_rope``: ``relative`` (default) puts the sinks' rotary positions right before the oldest recent context
frame (the cache stores keys before rotary, so this costs nothing), so every attended offset stays inside the
training window as in StreamingLLM's positions-within-the-cache; ``absolute`` keeps their true frame indices
(offsets grow with the video). ``K = 0`` is the plain rolling cache, bit for bit.

``generate`` returns the latents and timing: ``first_frame_s`` (time to the first new frame being final) and
``seconds``; ``forward_passes`` counts DiT calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from core.diffusion import euler_step, timestep_grid
from core.layers.kv_cache import KVCache
from perception.video.chunking import chunk_ids, level_of_step, pyramid_schedule
from perception.video.configuration_flexforcing import SINK_ROPES

__all__ = ["SINK_ROPES", "Generation", "continue_video", "fill_cache", "flex_reference", "generate",
           "given_video_frames", "sink_window_mask", "supported_regimes"]



@dataclass
class Generation:
    latents: torch.Tensor  # (B, K + num_new, C, h, w)
    seconds: float = 0.0
    first_frame_s: float = float("nan")
    forward_passes: int = 0
    windows: list[tuple[int, int]] = field(default_factory=list)


def supported_regimes(model) -> tuple[str, ...]:
    """The regimes a model was trained for: all for Flex-Forcing, one for each rigid baseline."""
    if model.config.chunking == "one":
        return ("bidirectional",)
    if model.config.chunking == "singletons":
        return ("autoregressive",)
    return ("bidirectional", "autoregressive", "chunked", "flex")


def _tokens(model, frames: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = (h // model.dit.patch) * (w // model.dit.patch)
    return frames.repeat_interleave(n), model.dit.positions(frames, h, w)


def fill_cache(model, cache: KVCache, latents: torch.Tensor, frames: torch.Tensor) -> None:
    """Run clean ``latents`` (B, n, C, h, w) at t = 0 as one chunk after the cache; append their keys / values."""
    b, n, _, h, w = latents.shape
    t = torch.zeros(b, n, device=latents.device)
    _, kv = model.dit(latents, t, frames, None, caches=[cache], return_kv=True)
    tf, pos = _tokens(model, frames, h, w)
    cache.extend([k for k, _ in kv], [v for _, v in kv], tf, pos)


class _Clock:
    def __init__(self, device: torch.device):
        self.device, self.t0, self.first = device, time.perf_counter(), None

    def frame_done(self) -> None:
        if self.first is None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.first = time.perf_counter() - self.t0


def _denoise(model, x: torch.Tensor, frames: torch.Tensor, caches: list[KVCache], grid: torch.Tensor,
             fixed: int = 0) -> tuple[torch.Tensor, int]:
    """Euler over ``grid`` for all frames of ``x`` as one chunk; the first ``fixed`` frames stay clean (t = 0)."""
    b, n = x.shape[:2]
    hold = torch.zeros(n, dtype=torch.bool, device=x.device)
    hold[:fixed] = True
    for i in range(len(grid) - 1):
        t = torch.where(hold, 0.0, grid[i]).expand(b, n)
        t_next = torch.where(hold, 0.0, grid[i + 1]).expand(b, n)
        v = model.dit(x, t, frames, None, caches=caches)
        x = euler_step(x, v, t, t_next)
    return x, len(grid) - 1


def _pyramid_window(model, x: torch.Tensor, frames: torch.Tensor, ctx: KVCache, grid: torch.Tensor, levels: int,
                    clock: _Clock) -> tuple[torch.Tensor, int]:
    """Depth-first pyramid denoising of one window (see the module docstring)."""
    b, n = x.shape[:2]
    steps = len(grid) - 1
    parts = pyramid_schedule(n, levels)
    caches = [KVCache(len(model.dit.blocks)) for _ in range(steps)]
    starts = [[0] + torch.cumsum(torch.tensor(p), 0).tolist() for p in parts]
    x = x.clone()
    passes = 0

    def run(a: int, e: int, i: int) -> None:
        nonlocal passes
        t = grid[i].expand(b, e - a)
        v, kv = model.dit(x[:, a:e], t, frames[a:e], None, caches=[ctx, caches[i]], return_kv=True)
        passes += 1
        h, w = x.shape[-2:]
        tf, pos = _tokens(model, frames[a:e], h, w)
        caches[i].extend([k for k, _ in kv], [vv for _, vv in kv], tf, pos)
        x[:, a:e] = euler_step(x[:, a:e], v, t, grid[i + 1].expand(b, e - a))
        if i + 1 == steps:
            clock.frame_done()
            return
        cuts = starts[level_of_step(i + 1, steps, levels)]
        inner = [c for c in cuts if a < c < e]
        for a2, e2 in zip([a, *inner], [*inner, e], strict=True):
            run(a2, e2, i + 1)

    run(0, n, 0)
    run = None  # noqa: F841 -- break the closure's self-reference: the step caches go now, not at the next GC
    return x, passes


@torch.no_grad()
def flex_reference(model, x: torch.Tensor, frames: torch.Tensor, ctx: KVCache, grid: torch.Tensor,
                   levels: int) -> torch.Tensor:
    """The flex window computed breadth first: one chunk-causal masked forward pass over the window per step.

    Equal (up to float error) to the depth-first cached traversal ``generate`` uses; tests compare the two.
    """
    b, n = x.shape[:2]
    steps = len(grid) - 1
    parts = pyramid_schedule(n, levels)
    for i in range(steps):
        chunks = chunk_ids(parts[level_of_step(i, steps, levels)], device=x.device)
        t, t_next = grid[i].expand(b, n), grid[i + 1].expand(b, n)
        v = model.dit(x, t, frames, chunks if chunks.max() > 0 else None, caches=[ctx])
        x = euler_step(x, v, t, t_next)
    return x


class _Run:
    """One ``generate`` call's state: the output (context, then the new frames as they become final), the initial
    noise of the new frames, the Euler grid, the clock and the ``Generation`` being filled."""

    def __init__(self, model, context: torch.Tensor, num_new: int, grid: torch.Tensor,
                 generator: torch.Generator | None, on_window: Callable[[int, int], None] | None,
                 sinks: int = 0, sink_rope: str = "relative"):
        b, self.k0 = context.shape[:2]
        self.sinks, self.sink_rope = sinks, sink_rope
        shape, device = context.shape[2:], context.device
        self.model, self.grid, self.on_window, self.device = model, grid, on_window, device
        self.end = self.k0 + num_new
        self.out = torch.cat([context, torch.empty(b, num_new, *shape, device=device, dtype=context.dtype)], 1)
        self.gen = Generation(self.out)
        self.clock = _Clock(device)
        self.noise = torch.randn(b, num_new, *shape, generator=generator, device="cpu").to(device, context.dtype)

    def frames(self, a: int, e: int) -> torch.Tensor:
        return torch.arange(a, e, device=self.device)

    def noise_of(self, a: int, e: int) -> torch.Tensor:
        return self.noise[:, a - self.k0:e - self.k0]

    def emit(self, a: int, e: int) -> None:
        """Frames ``a:e`` are final."""
        self.clock.frame_done()
        self.gen.windows.append((a, e))
        if self.on_window is not None:
            self.on_window(a, e)

    def windows(self, kc: int) -> Iterator[tuple[int, int]]:
        """Windows of ``T - kc`` new frames (the last one shorter), each conditioned on the ``kc`` frames before."""
        done = self.k0
        while done < self.end:
            e = done + min(self.model.config.num_frames - kc, self.end - done)
            yield done, e
            done = e

    def context_frames(self, a: int, kc: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, rotary positions) of the ``kc`` context frames of a window starting at ``a``: frames
        ``a - kc:a``, or with ``K`` sinks frames ``0:K`` and ``a - kc + K:a`` (once they no longer touch), the
        sinks positioned at ``a - kc:a - kc + K`` (``relative``) or at ``0:K`` (``absolute``)."""
        k = self.sinks
        if k == 0 or a - kc + k <= k:
            idx = self.frames(a - kc, a)
            return idx, idx
        idx = torch.cat([self.frames(0, k), self.frames(a - kc + k, a)])
        pos = torch.cat([self.frames(a - kc, a - kc + k) if self.sink_rope == "relative" else self.frames(0, k),
                         self.frames(a - kc + k, a)])
        return idx, pos

    def context_cache(self, a: int, kc: int) -> KVCache:
        """A fresh KV cache holding the context frames of a window starting at ``a`` (``context_frames``)."""
        ctx = KVCache(len(self.model.dit.blocks))
        idx, pos = self.context_frames(a, kc)
        fill_cache(self.model, ctx, self.out[:, idx], pos)
        self.gen.forward_passes += 1
        return ctx

    def finish(self) -> Generation:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.gen.seconds = time.perf_counter() - self.clock.t0
        self.gen.first_frame_s = self.clock.first if self.clock.first is not None else float("nan")
        self.gen.latents = self.out
        return self.gen


def _window_context(model, k0: int) -> int:
    """Frames each window of ``bidirectional`` / ``flex`` conditions on: the given ones, at most the config's
    ``max_context`` and ``T - 1``."""
    return max(1, min(k0, model.config.max_context or 1, model.config.num_frames - 1))


def _bidirectional(run: _Run) -> None:
    """Each window is one chunk, denoised jointly against its context: a KV cache, or inline at t = 0 for a model
    trained with one chunk (``chunking=one``)."""
    model, kc = run.model, _window_context(run.model, run.k0)
    inline = model.config.chunking == "one"
    for a, e in run.windows(kc):
        x = run.noise_of(a, e)
        if inline:
            idx, pos = run.context_frames(a, kc)
            xin = torch.cat([run.out[:, idx], x], 1)
            y, p = _denoise(model, xin, torch.cat([pos, run.frames(a, e)]), [], run.grid, fixed=kc)
            run.out[:, a:e] = y[:, kc:]
        else:
            ctx = run.context_cache(a, kc)
            y, p = _denoise(model, x, run.frames(a, e), [ctx], run.grid)
            run.out[:, a:e] = y
        run.gen.forward_passes += p
        run.emit(a, e)


def _flex(run: _Run, levels: int) -> None:
    """Each window denoised by the depth-first pyramid of ``levels`` levels against its context's KV cache."""
    kc = _window_context(run.model, run.k0)
    for a, e in run.windows(kc):
        ctx = run.context_cache(a, kc)
        y, p = _pyramid_window(run.model, run.noise_of(a, e), run.frames(a, e), ctx, run.grid, levels, run.clock)
        run.out[:, a:e] = y
        run.gen.forward_passes += p
        run.emit(a, e)


def _chunk_by_chunk(run: _Run, size: int, order: list[int] | None) -> None:
    """Chunks of ``size`` frames, each denoised against one rolling KV cache and then written to it clean; ``order``
    permutes the chunks of the first window."""
    model, k0, t_len = run.model, run.k0, run.model.config.num_frames
    cache = KVCache(len(model.dit.blocks))
    hist = min(k0, t_len - size)
    fill_cache(model, cache, run.out[:, k0 - hist:k0], run.frames(k0 - hist, k0))
    run.gen.forward_passes += 1
    done, first = k0, True
    while done < run.end:
        n = max(min(t_len - size, run.end - done), 1)  # frames of this window (several chunks)
        bounds = list(range(done, done + n, size)) + [done + n]
        pieces = list(zip(bounds[:-1], bounds[1:], strict=True))
        if order is not None and first:
            if sorted(order) != list(range(len(pieces))):
                raise ValueError(f"order must permute range({len(pieces)}), got {order}")
            pieces = [pieces[i] for i in order]
        for a, e in pieces:
            x, p = _denoise(model, run.noise_of(a, e), run.frames(a, e), [cache], run.grid)
            run.out[:, a:e] = x
            fill_cache(model, cache, x, run.frames(a, e))
            run.gen.forward_passes += p + 1
            cache.roll(t_len - size, run.sinks)
            if run.sinks and run.sink_rope == "relative":
                _reposition_sinks(cache, run.sinks)
            run.emit(a, e)
        done += n
        first = False


def _reposition_sinks(cache: KVCache, sinks: int) -> None:
    """Rotary positions of the cache's first ``sinks`` frames right before its oldest other frame (their keys are
    stored before rotary: only the positions change; ``token_frames`` keep the true indices, for ``roll``)."""
    frames = cache.frames()
    if len(frames) <= sinks:
        return
    start = frames[sinks] - sinks
    pos = cache.positions.clone()
    for j, f in enumerate(frames[:sinks]):
        pos[cache.token_frames.to(pos.device) == f, 0] = start + j
    if not torch.equal(pos, cache.positions):
        cache.positions = pos
        cache.version += 1  # the model memoises the cached tokens' rotary tables under (uid, version)


def sink_window_mask(num_frames: int, given: int, window: int, sinks: int) -> torch.Tensor:
    """(F, F) bool: which frames each frame attends under ``autoregressive`` with a rolling cache of ``window``
    frames and ``sinks`` sink frames (``given`` context frames attend each other; generated frame ``i`` attends
    itself, the first ``sinks`` frames and the newest ``window - sinks`` frames before it, or every earlier
    frame while fewer than ``window`` exist). With ``sink_rope=absolute`` one pass of ``CausalWan`` under this mask
    (``frame_mask``) computes what the cached generation does; tests check it."""
    i = torch.arange(num_frames)
    q, k = i[:, None], i[None, :]
    recent = (k < q) & (k >= q - (window - sinks))
    full = (k < q) & (q <= window)  # the cache has not rolled yet: every earlier frame (<= window of them)
    sink = (k < q) & (k < sinks)
    mask = recent | full | sink | (k == q)
    mask[:given, :given] = True
    return mask


def _autoregressive(run: _Run, order: list[int] | None) -> None:
    """Singleton chunks."""
    _chunk_by_chunk(run, 1, order)


def _chunked(run: _Run, chunk: int, order: list[int] | None) -> None:
    """Chunks of ``chunk`` frames (at most ``T - 1``)."""
    _chunk_by_chunk(run, max(1, min(chunk, run.model.config.num_frames - 1)), order)


@torch.no_grad()
def generate(model, context: torch.Tensor, num_new: int, regime: str = "flex", steps: int | None = None,
             shift: float | None = None, chunk: int = 2, order: list[int] | None = None, levels: int | None = None,
             generator: torch.Generator | None = None,
             on_window: Callable[[int, int], None] | None = None, sink_frames: int | None = None,
             sink_rope: str | None = None) -> Generation:
    """Continue ``context`` (B, K, C, h, w) normalised latents by ``num_new`` frames in ``regime``.

    Args:
        model: A ``FlexForcingModel`` (eval mode).
        context: Given clean frames (K >= 1; a single first frame for image-to-video).
        num_new: Frames to generate (may be many times the training length).
        regime: ``bidirectional`` | ``autoregressive`` | ``chunked`` | ``flex`` (see the module docstring).
        steps / shift: Euler steps and grid shift (default: the model config's).
        chunk: Chunk size of ``chunked``.
        order: ``chunked`` / ``autoregressive`` only: the order in which the chunks of the first window are
            generated (a permutation of ``range(number of chunks)``); default left to right.
        levels: Pyramid levels of ``flex`` (default the config's).
        generator: Seeds the initial noise.
        on_window: Called with (first, end) frame indices each time frames become final.
        sink_frames / sink_rope: Sink frames kept in every context and their rotary positions (module
            docstring; default the config's).
    """
    cfg = model.config
    if regime not in supported_regimes(model):
        raise ValueError(f"regime {regime!r}: this model was trained with chunking={cfg.chunking!r} and runs "
                         f"{', '.join(supported_regimes(model))}")
    if context.ndim != 5 or context.shape[1] < 1:
        raise ValueError(f"context must be (B, K >= 1, C, h, w) latents, got {tuple(context.shape)}")
    if num_new < 1:
        raise ValueError(f"num_new must be >= 1, got {num_new}")
    grid = timestep_grid(steps or cfg.sample_steps, shift if shift is not None else cfg.sample_shift,
                         device=context.device)
    sinks = cfg.sink_frames if sink_frames is None else sink_frames
    sink_rope = sink_rope or cfg.sink_rope
    if sink_rope not in SINK_ROPES:
        raise ValueError(f"sink_rope {sink_rope!r}: choose one of {', '.join(SINK_ROPES)}")
    if sinks:
        span = (_window_context(model, context.shape[1]) if regime in ("bidirectional", "flex")
                else cfg.num_frames - (1 if regime == "autoregressive" else max(1, min(chunk, cfg.num_frames - 1))))
        if not 0 <= sinks < span or sinks > context.shape[1]:
            raise ValueError(f"sink_frames={sinks}: {regime} keeps {span} context frames here and {context.shape[1]} "
                             f"are given; sinks must be fewer than the first and at most the second")
    run = _Run(model, context, num_new, grid, generator, on_window, sinks, sink_rope)
    if regime == "bidirectional":
        _bidirectional(run)
    elif regime == "autoregressive":
        _autoregressive(run, order)
    elif regime == "chunked":
        _chunked(run, chunk, order)
    else:
        _flex(run, levels or cfg.pyramid_levels)
    return run.finish()


def given_video_frames(model, context: int) -> int:
    """Video frames behind ``context`` latent frames: the first alone, then the VAE's temporal factor each."""
    return 1 + (context - 1) * model.config.temporal_factor


@torch.no_grad()
def continue_video(model, video: torch.Tensor, num_frames: int, regime: str = "flex", context: int | None = None,
                   generator: torch.Generator | None = None, steps: int | None = None
                   ) -> tuple[torch.Tensor, Generation]:
    """Continue the first frames of ``video`` (B, T, 3, H, W) uint8 to about ``num_frames`` video frames.

    The first ``context`` latent frames are given (``given_video_frames`` video frames; default as many as
    ``video`` holds, at most the model's ``max_context``); the latent video is extended to cover ``num_frames``
    frames (rounded up to ``1 + r k``) and decoded whole (the VAE is causal), and the given frames are put back
    exactly. Returns ``(frames (B, num_frames, 3, H, W) uint8, Generation)``.
    """
    r = model.config.temporal_factor
    if context is None:
        context = max(1, min(1 + (video.shape[1] - 1) // r, model.config.max_context or 1))
    given = given_video_frames(model, context)
    if video.shape[1] < given:
        raise ValueError(f"{context} latent frames need {given} given video frames, got {video.shape[1]}")
    if num_frames <= given:
        raise ValueError(f"num_frames={num_frames} must exceed the {given} given frames")
    device = model.latent_mean.device
    z = model.encode(video[:, :given].to(device))
    latents = 1 + -(-(num_frames - 1) // r)  # ceil: enough latent frames for num_frames video frames
    gen = generate(model, z, latents - context, regime, steps=steps, generator=generator)
    frames = model.decode(gen.latents)[:, :num_frames].cpu()
    frames[:, :given] = video[:, :given].to(frames.device)
    return frames, gen
