"""Flex-Forcing's chunking over the temporal axis and over denoising steps.

A *partition* of ``n`` frames is a list of chunk sizes (summing to ``n``); chunk ids give the generation
order. The attention mask between frames is ``M[i, j] = chunk(j) <= chunk(i)``: bidirectional inside a chunk,
causal across chunks. One chunk is full bidirectional attention; singleton chunks are frame-causal
(autoregressive). Chunk ids need not follow the time axis: any-order generation assigns ids by generation
order while positions (rotary) stay the frames' time indices.

*Pyramid timestep chunking* refines the partition as denoising proceeds: level 0 is one chunk, each next level
halves every chunk (the larger half first), e.g. 21 frames, 4 levels -> [21], [11, 10], [6, 5, 5, 5],
[3, 3, 3, 2, 3, 2, 3, 2]. Early (noisy) steps plan the clip globally; late steps refine locally and stream.
Every level keeps the previous level's boundaries (``refines``).
"""

from __future__ import annotations

import torch

__all__ = [
    "chunk_ids",
    "chunk_mask",
    "level_of_step",
    "pyramid_schedule",
    "random_partition",
    "refines",
    "split_halves",
]


def _check_partition(sizes: list[int], n: int | None = None) -> None:
    if not sizes or any(int(s) < 1 for s in sizes):
        raise ValueError(f"a partition needs positive chunk sizes, got {sizes}")
    if n is not None and sum(sizes) != n:
        raise ValueError(f"partition {sizes} does not cover {n} frames")


def chunk_ids(sizes: list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """Chunk sizes -> (n,) long chunk id per frame, e.g. [2, 1, 3] -> [0, 0, 1, 2, 2, 2]."""
    _check_partition(sizes)
    return torch.repeat_interleave(torch.arange(len(sizes), device=device), torch.tensor(sizes, device=device))


def chunk_mask(query_chunks: torch.Tensor, key_chunks: torch.Tensor | None = None) -> torch.Tensor:
    """(Nq, Nk) bool mask, True where a query frame may attend a key frame: ``chunk(key) <= chunk(query)``."""
    key_chunks = query_chunks if key_chunks is None else key_chunks
    return key_chunks[None, :] <= query_chunks[:, None]


def split_halves(sizes: list[int]) -> list[int]:
    """Halve every chunk (ceil first, floor second; singletons stay)."""
    out: list[int] = []
    for s in sizes:
        out += [s] if s == 1 else [(s + 1) // 2, s // 2]
    return out


def pyramid_schedule(n: int, levels: int) -> list[list[int]]:
    """``levels`` partitions of ``n`` frames, from one chunk, each halving the previous one's chunks."""
    if n < 1 or levels < 1:
        raise ValueError(f"pyramid_schedule needs n >= 1 and levels >= 1, got {n}, {levels}")
    out = [[n]]
    while len(out) < levels:
        out.append(split_halves(out[-1]))
    return out


def boundaries(sizes: list[int]) -> set[int]:
    """Frame indices where a chunk starts (the first frame, 0, excluded)."""
    cuts, acc = set(), 0
    for s in sizes[:-1]:
        acc += s
        cuts.add(acc)
    return cuts


def refines(coarse: list[int], fine: list[int]) -> bool:
    """True when ``fine`` keeps every chunk boundary of ``coarse`` (and covers the same frames)."""
    return sum(coarse) == sum(fine) and boundaries(coarse) <= boundaries(fine)


def level_of_step(step: int, steps: int, levels: int) -> int:
    """The pyramid level used at denoising step ``step`` of ``steps`` (levels spread evenly over steps)."""
    if not 0 <= step < steps:
        raise ValueError(f"step {step} outside [0, {steps})")
    return min(levels - 1, step * levels // steps)


def random_partition(n: int, generator: torch.Generator | None = None, p_one: float = 0.2,
                     p_singletons: float = 0.2) -> list[int]:
    """A random partition of ``n`` frames: one chunk (``p_one``), singletons (``p_singletons``), or random cuts
    (each of the ``n - 1`` gaps cut with a probability drawn uniformly per call, so chunk sizes vary widely)."""
    u = float(torch.rand((), generator=generator))
    if n == 1 or u < p_one:
        return [n]
    if u < p_one + p_singletons:
        return [1] * n
    p_cut = float(torch.rand((), generator=generator))
    cuts = (torch.rand(n - 1, generator=generator) < p_cut).tolist()
    sizes, run = [], 1
    for c in cuts:
        if c:
            sizes.append(run)
            run = 1
        else:
            run += 1
    return sizes + [run]
