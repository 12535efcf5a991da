"""A frame-granular key / value cache for chunked (autoregressive) transformer inference.

Each layer keeps the keys and values of the frames already generated, (B, heads, M, d); beside them the cache
keeps, per cached token, the frame it belongs to and its position (e.g. (frame, row, column) for rotary
embeddings), so keys can be stored *before* positions are applied and a caller may transform them (e.g.
Flex-Forcing's K-projection) before rotating them. ``roll(max_frames, sink_frames)`` drops the oldest frames
(keeping the first ``sink_frames``, attention sinks as in StreamingLLM) so a video many times the training
length is generated in constant memory.
"""

from __future__ import annotations

import itertools

import torch

_IDS = itertools.count()

__all__ = ["KVCache"]


class KVCache:
    """Keys / values of cached frames for ``num_layers`` layers.

    Usage: run a model on new frames, collect per-layer ``(k, v)``, then ``extend(ks, vs, frames, positions)``.
    """

    def __init__(self, num_layers: int):
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.token_frames: torch.Tensor | None = None  # (M,) long: frame index of each cached token
        self.positions: torch.Tensor | None = None  # (M, P): position of each cached token
        # ``(uid, version)`` names the cache's current contents: every change bumps ``version``, so a caller may
        # memoise what it derives from them (e.g. rotary tables of the cached positions) under this key
        self.uid, self.version = next(_IDS), 0

    @property
    def state(self) -> tuple[int, int]:
        """``(uid, version)``: equal for two calls iff the cached tokens did not change in between."""
        return self.uid, self.version

    def __len__(self) -> int:
        """Number of cached frames."""
        return 0 if self.token_frames is None else int(torch.unique(self.token_frames).numel())

    @property
    def num_tokens(self) -> int:
        """Number of cached tokens (over all frames)."""
        return 0 if self.token_frames is None else int(self.token_frames.numel())

    def frames(self) -> list[int]:
        """Sorted indices of the cached frames."""
        return [] if self.token_frames is None else torch.unique(self.token_frames).tolist()

    def get(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k, v) of ``layer``, each (B, h, M, d), or None when empty."""
        if self.keys[layer] is None:
            return None
        return self.keys[layer], self.values[layer]

    def extend(self, keys: list[torch.Tensor], values: list[torch.Tensor], token_frames: torch.Tensor,
               positions: torch.Tensor) -> None:
        """Append new tokens: per-layer ``keys`` / ``values`` (B, h, n, d), ``token_frames`` (n,), ``positions`` (n, P).

        Frames already in the cache may not be added again (``drop_frames`` them first).
        """
        if len(keys) != self.num_layers or len(values) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} layers of keys / values, got {len(keys)} / {len(values)}")
        n = keys[0].shape[2]
        if token_frames.shape != (n,) or positions.shape[0] != n:
            raise ValueError(f"token_frames {tuple(token_frames.shape)} / positions {tuple(positions.shape)} do not "
                             f"match {n} new tokens")
        if self.token_frames is not None and bool(torch.isin(token_frames, self.token_frames).any()):
            raise ValueError("some of these frames are already cached")
        for i in range(self.num_layers):
            self.keys[i] = keys[i] if self.keys[i] is None else torch.cat([self.keys[i], keys[i]], dim=2)
            self.values[i] = values[i] if self.values[i] is None else torch.cat([self.values[i], values[i]], dim=2)
        tf, pos = token_frames.to(torch.long), positions
        self.token_frames = (tf if self.token_frames is None
                             else torch.cat([self.token_frames, tf.to(self.token_frames.device)]))
        self.positions = pos if self.positions is None else torch.cat([self.positions, pos.to(self.positions.device)])
        self.version += 1

    def _keep(self, keep: torch.Tensor) -> None:
        if bool(keep.all()):
            return
        idx = keep.nonzero().squeeze(1)
        for i in range(self.num_layers):
            self.keys[i] = self.keys[i].index_select(2, idx.to(self.keys[i].device))
            self.values[i] = self.values[i].index_select(2, idx.to(self.values[i].device))
        self.token_frames, self.positions = self.token_frames[keep], self.positions[keep.to(self.positions.device)]
        self.version += 1
        if self.token_frames.numel() == 0:
            self.clear()

    def drop_frames(self, frames: list[int] | torch.Tensor) -> None:
        """Remove the given frames' tokens."""
        if self.token_frames is None:
            return
        frames = torch.as_tensor(frames, dtype=torch.long, device=self.token_frames.device)
        self._keep(~torch.isin(self.token_frames, frames))

    def roll(self, max_frames: int, sink_frames: int = 0) -> None:
        """Keep at most ``max_frames`` frames: the first ``sink_frames`` cached and the newest others."""
        if max_frames < 1 or not 0 <= sink_frames < max_frames:
            raise ValueError(f"need max_frames >= 1 and 0 <= sink_frames < max_frames, got {max_frames}, {sink_frames}")
        frames = self.frames()
        if len(frames) <= max_frames:
            return
        keep_frames = frames[:sink_frames] + frames[len(frames) - (max_frames - sink_frames):]
        self._keep(torch.isin(self.token_frames, torch.tensor(keep_frames, device=self.token_frames.device)))

    def clear(self) -> None:
        """Drop every cached token."""
        self.keys = [None] * self.num_layers
        self.values = [None] * self.num_layers
        self.token_frames = self.positions = None
        self.version += 1
