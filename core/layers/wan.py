"""Wan as a chunk-causal, cached video transformer: diffusers' ``WanTransformer3DModel`` run chunk by chunk.

``CausalWan`` holds an unmodified diffusers ``WanTransformer3DModel`` (``self.transformer``: a user's Wan2.1 /
Wan2.2 folder loads into it key for key) and runs its own modules in the order Wan's forward does, with four
things Wan's forward cannot express:

- **Per-frame noise levels.** ``t`` is (B, F): every latent frame its own timestep. The time embedding and
  the adaLN modulation are computed per frame and broadcast to the frame's tokens — the (B, seq_len) timestep
  path Wan2.2-TI2V uses for its clean first frame, here for any layout.
- **Chunk-causal attention.** The frames of a pass carry chunk ids (generation order): a token of chunk ``c``
  attends the tokens of chunks ``<= c`` and every cached token. The mask is a FlexAttention ``BlockMask`` where
  FlexAttention runs (``attention="flex"``; ``"auto"`` picks it on CUDA) and a boolean SDPA mask elsewhere.
- **A KV cache with frame-offset rotary positions.** Keys are cached after Wan's QK-RMSNorm and *before*
  rotary positions; positions are applied at attention time from each token's (frame, row, column), shifted
  so the oldest frame of the pass is 0 — attention depends on offsets only, so a rolling cache can run past
  Wan's ``rope_max_seq_len``.
- **The K-projection** (Flex-Forcing, ``k_projection=True``): per block and head, the keys of earlier chunks
  are mapped by ``Pi(k) = k (1 + gamma) + <k, u> v`` with ``(gamma, u, v)`` linear in the querying chunk's time
  embedding. ``gamma`` and ``v`` start at zero, ``u`` random: the identity at init, with gradient for all
  three. Its weights (``kproj.*``) are the only keys a Wan folder lacks.

The attention runs in ``ChunkCausalWanProcessor``, set on every block's self-attention; the per-pass state
(rotary tables, mask, caches, K-projection parameters) reaches it as the blocks' ``rotary_emb`` argument, so
gradient checkpointing of the blocks (``core.layers.checkpointing``) recomputes with the same state.
Text conditioning: Wan cross-attends to umT5 prompt embeddings; without a text encoder here the prompt is one
zero token unless ``prompt_embeds`` are passed (the cross-attention then adds a learned constant per layer).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError, ConfigError
from core.layers.kv_cache import KVCache

__all__ = ["ATTENTIONS", "WAN21_1_3B", "CausalWan", "ChunkCausalWanProcessor", "chunk_attention_mask",
           "chunk_block_mask",
           "load_wan_transformer_weights", "resolve_wan_folder", "wan_parameter_count",
           "wan_transformer_config"]

ATTENTIONS = ("auto", "sdpa", "flex")
TIME_SCALE = 1000.0  # Wan's timesteps are flow-matching sigmas x 1000

# diffusers' WanTransformer3DModel config of Wan2.1-T2V-1.3B (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/)
WAN21_1_3B: dict[str, Any] = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                                  out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                                  rope_max_seq_len=1024)
_WEIGHTS = "diffusion_pytorch_model.safetensors"


def wan_transformer_config(num_heads: int, head_dim: int, num_layers: int, ffn_dim: int, in_channels: int,
                           text_dim: int, patch: int = 2, freq_dim: int = 256) -> dict[str, Any]:
    """A ``WanTransformer3DModel`` config of the given sizes (everything else as Wan2.1's)."""
    return dict(WAN21_1_3B, patch_size=(1, patch, patch), num_attention_heads=num_heads, attention_head_dim=head_dim,
                num_layers=num_layers, ffn_dim=ffn_dim, in_channels=in_channels, out_channels=in_channels,
                text_dim=text_dim, freq_dim=freq_dim)


def resolve_wan_folder(path: str | Path) -> Path:
    """The folder holding a ``WanTransformer3DModel``'s ``config.json``.

    ``path`` itself or its ``transformer/`` (a diffusers pipeline folder); a one-line ``CheckpointError`` otherwise.
    """
    p = Path(path)
    for cand in (p, p / "transformer"):
        f = cand / "config.json"
        if f.is_file():
            try:
                name = json.loads(f.read_text()).get("_class_name")
            except (OSError, json.JSONDecodeError) as e:
                raise CheckpointError(f"{f}: unreadable config ({e})") from None
            if name == "WanTransformer3DModel":
                return cand
            if cand == p and not (p / "transformer").is_dir():
                raise CheckpointError(f"{f}: a {name} config, not a WanTransformer3DModel")
    raise CheckpointError(f"{p}: no WanTransformer3DModel config.json here or in transformer/")


def _weight_files(folder: Path) -> list[Path]:
    index = folder / f"{_WEIGHTS}.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: unreadable shard index ({e})") from None
        return [folder / n for n in names]
    if (folder / _WEIGHTS).is_file():
        return [folder / _WEIGHTS]
    raise CheckpointError(f"{folder}: no {_WEIGHTS} (or its .index.json shards)")


def load_wan_transformer_weights(model: CausalWan, path: str | Path) -> tuple[list[str], list[str]]:
    """Load a diffusers Wan transformer folder (only read) into ``model.transformer``.

    Returns:
        ``(missing, unexpected)`` keys of ``model`` (prefixed as in its state dict). ``missing`` may hold only
        the added K-projection (``kproj.*``); anything else, or any shape mismatch, is a ``CheckpointError``.
    """
    from core.checkpoint import load_weights

    folder = resolve_wan_folder(path)
    sd: dict[str, torch.Tensor] = {}
    for f in _weight_files(folder):
        if not f.is_file():
            raise CheckpointError(f"{f}: missing weight shard")
        sd.update(load_weights(f))
    own = model.transformer.state_dict()
    ignored = tuple(getattr(model.transformer, "_keys_to_ignore_on_load_unexpected", None) or ())
    unexpected = sorted(k for k in sd if k not in own and not any(s in k for s in ignored))
    bad = [k for k in sd if k in own and sd[k].shape != own[k].shape]
    if bad:
        raise CheckpointError(f"{folder}: {len(bad)} tensors differ in shape from the config "
                              f"(first: {bad[0]} {tuple(sd[bad[0]].shape)} vs {tuple(own[bad[0]].shape)})")
    missing_t = sorted(k for k in own if k not in sd)
    if missing_t or unexpected:
        raise CheckpointError(f"{folder}: {len(missing_t)} missing ({', '.join(missing_t[:3])}), {len(unexpected)} "
                              f"unexpected ({', '.join(unexpected[:3])}) transformer keys")
    model.transformer.load_state_dict({k: v for k, v in sd.items() if k in own}, strict=True, assign=False)
    missing = [f"kproj.{k}" for k in (model.kproj.state_dict() if model.kproj is not None else {})]
    return missing, unexpected


def chunk_attention_mask(q_chunks: torch.Tensor, num_cached: int, backend: str = "sdpa"):
    """The chunk-causal mask of a pass: query ``i`` sees cached keys and new keys ``j`` with chunk(j) <= chunk(i).

    Args:
        q_chunks: (N,) chunk id of every new token (generation order).
        num_cached: Cached tokens ``M`` in front of the new ones (visible to every query).
        backend: ``sdpa`` -> a (N, M + N) bool tensor; ``flex`` -> a FlexAttention ``BlockMask`` built from
            per-block chunk ranges (``chunk_block_mask``: memory per 128 x 128 block, not per token pair);
            ``flex_reference`` -> the same ``BlockMask`` by torch's eager ``create_block_mask``, which evaluates
            every token pair (10.7 GB at Wan2.1's 21 latent frames: a test reference, not for training).
    """
    kv_chunks = torch.cat([q_chunks.new_full((num_cached,), -1), q_chunks])
    if backend == "sdpa":
        return kv_chunks[None, :] <= q_chunks[:, None]
    if backend == "flex":
        return chunk_block_mask(q_chunks, num_cached)
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_chunks[kv_idx] <= q_chunks[q_idx]

    return create_block_mask(mask_mod, None, None, len(q_chunks), len(kv_chunks), device=q_chunks.device)


def _block_ranges(ids: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(min, max, padded) chunk id of every ``block``-token block of ``ids`` (the last block may be short)."""
    n = len(ids)
    nb = -(-n // block)
    pad = nb * block - n
    big = torch.iinfo(torch.long).max
    lo = torch.cat([ids, ids.new_full((pad,), big)]).view(nb, block).amin(1)
    hi = torch.cat([ids, ids.new_full((pad,), -big)]).view(nb, block).amax(1)
    padded = torch.zeros(nb, dtype=torch.bool, device=ids.device)
    padded[-1] = pad > 0
    return lo, hi, padded


def chunk_block_mask(q_chunks: torch.Tensor, num_cached: int, block: int = 128):
    """The chunk-causal FlexAttention ``BlockMask`` from per-block chunk ranges (equal to ``create_block_mask``'s).

    A (query block, key block) pair is *full* iff every key's chunk id <= every query's (max key <= min query) and
    neither block is padded, *empty* iff no key id <= any query id (min key > max query), else *partial* (the
    ``mask_mod``, the token rule, decides inside). Memory O((N / block)^2).
    """
    from torch.nn.attention.flex_attention import BlockMask

    kv_chunks = torch.cat([q_chunks.new_full((num_cached,), -1), q_chunks])
    qlo, qhi, qpad = _block_ranges(q_chunks, block)
    klo, khi, kpad = _block_ranges(kv_chunks, block)
    any_true = klo[None, :] <= qhi[:, None]  # (Qb, KVb)
    full = (khi[None, :] <= qlo[:, None]) & ~qpad[:, None] & ~kpad[None, :]
    partial = any_true & ~full

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_chunks[kv_idx] <= q_chunks[q_idx]

    def lists(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = m.to(torch.int8)[None, None]  # (1, 1, Qb, KVb): one mask for every batch row and head
        return m.sum(-1).to(torch.int32), torch.argsort(m, dim=-1, descending=True, stable=True).to(torch.int32)

    kv_num, kv_idx = lists(partial)
    full_num, full_idx = lists(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(block, block), mask_mod=mask_mod,
                                    seq_lengths=(len(q_chunks), len(kv_chunks)))


_FLEX = {}


def _flex_attention(q, k, v, block_mask):
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type != "cuda":
        return flex_attention(q, k, v, block_mask=block_mask)
    if "fn" not in _FLEX:  # compiled once per process: eager FlexAttention on CUDA materialises the scores
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"](q, k, v, block_mask=block_mask)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved rotary embedding of (B, H, N, d) ``x`` with (N, d) tables (pairs (2i, 2i + 1))."""
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)
    return out.to(x.dtype)


@dataclass
class _ChunkKeys:
    """One chunk of a K-projection pass, as every block's attention needs it.

    Built once per pass, not per block: the selections, their indices and the keys' rotary tables are the same
    in every layer.

    Attributes:
        emb: (B, D) the chunk's time embedding (its K-projection's input).
        rows: (n,) long indices of the chunk's queries among the pass's new tokens; None = all of them.
        earlier: (N,) bool, the new keys of earlier chunks (projected); None = there are none.
        sel: (n_k,) long indices of the new keys the chunk sees (earlier chunks' and its own); None = all.
        rope_k: (cos, sin) of the keys it sees, cached ones first, each (M + n_k, head_dim).
    """

    emb: torch.Tensor
    rows: torch.Tensor | None
    earlier: torch.Tensor | None
    sel: torch.Tensor | None
    rope_k: tuple[torch.Tensor, torch.Tensor]


@dataclass
class _PassState:
    """What every block's self-attention needs in one forward pass (passed as the blocks' ``rotary_emb``)."""

    rope_q: tuple[torch.Tensor, torch.Tensor]
    rope_k: tuple[torch.Tensor, torch.Tensor]
    caches: list[KVCache]
    mask: Any = None  # bool (N, M + N), a BlockMask, or None (full attention)
    chunks: list[_ChunkKeys] = field(default_factory=list)  # the K-projection's chunks (empty without it)
    kv_out: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None
    owner: Any = None  # the CausalWan (for the K-projection's weights)


class ChunkCausalWanProcessor:
    """Self-attention of one Wan block over cached + new tokens, chunk-causal, with the K-projection.

    Same projections, QK-RMSNorm (across heads), rotary convention and output projection as diffusers'
    ``WanAttnProcessor``; only the keys / values attended and the mask differ.
    """

    def __init__(self, layer: int, attention: str = "sdpa"):
        self.layer, self.attention = layer, attention

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None,
                 **kwargs):
        """Self-attention of ``attn``; ``rotary_emb`` carries the pass state (Wan's own tables: Wan's attention)."""
        st: _PassState = rotary_emb
        if not isinstance(st, _PassState):  # called from Wan's own forward (e.g. a WanPipeline): Wan's attention
            from diffusers.models.transformers.transformer_wan import WanAttnProcessor

            return WanAttnProcessor()(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)  # (B, H, N, d)
        if st.kv_out is not None:
            st.kv_out[self.layer] = (k, v)
        ctx = [c.get(self.layer) for c in st.caches]
        ck = (ctx[0][0] if len(ctx) == 1 else torch.cat([c[0] for c in ctx], 2)).to(k.dtype) if ctx else None
        vals = torch.cat([c[1].to(v.dtype) for c in ctx] + [v], 2) if ctx else v
        qr = _rotate(q, *st.rope_q)
        if not st.chunks:  # one pass over all queries: full attention, or the chunk-causal mask
            keys = torch.cat([ck, k], 2) if ctx else k
            kr = _rotate(keys, *st.rope_k)
            if st.mask is not None and not isinstance(st.mask, torch.Tensor):
                out = _flex_attention(qr, kr, vals, st.mask)
            else:
                out = F.scaled_dot_product_attention(qr, kr, vals, attn_mask=st.mask)
        else:  # the K-projection: each chunk's queries see earlier keys projected with that chunk's parameters
            m = 0 if ck is None else ck.shape[2]
            out = None if len(st.chunks) == 1 and st.chunks[0].rows is None else torch.empty_like(qr)
            for ch in st.chunks:
                params = st.owner.kproj_params(ch.emb, self.layer)
                kk = k if ch.earlier is None else torch.where(ch.earlier[None, None, :, None],
                                                              CausalWan.project_keys(k, params), k)
                keys = kk if ch.sel is None else kk[:, :, ch.sel]
                if ch.sel is None:
                    vv = vals
                else:
                    vv = vals[:, :, m:][:, :, ch.sel]
                    if ck is not None:
                        vv = torch.cat([vals[:, :, :m], vv], 2)
                if ck is not None:
                    keys = torch.cat([CausalWan.project_keys(ck, params), keys], 2)
                att = F.scaled_dot_product_attention(qr if ch.rows is None else qr[:, :, ch.rows],
                                                     _rotate(keys, *ch.rope_k), vv)
                if out is None:
                    out = att
                else:
                    out[:, :, ch.rows] = att
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class CausalWan(nn.Module):
    """A diffusers ``WanTransformer3DModel`` run with per-frame timesteps, chunk-causal attention and KV caches.

    ``forward(x, t, frames, chunks, caches, return_kv)`` takes latents frame-major, (B, F, C, h, w); see the
    module docstring. Build from a config dict (``from_config``) or a user's folder (``from_pretrained``).

    Args:
        transformer: The diffusers model (temporal patch 1; no CLIP image cross-attention).
        k_projection: Add the K-projection of earlier chunks' keys (``kproj``, identity at init).
        attention: ``sdpa`` | ``flex`` | ``auto`` (flex on CUDA, sdpa elsewhere) for masked passes.
    """

    def __init__(self, transformer: nn.Module, k_projection: bool = False, attention: str = "auto"):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ConfigError(f"attention={attention!r}: choose one of {', '.join(ATTENTIONS)}")
        cfg = transformer.config
        if tuple(cfg.patch_size)[0] != 1 or cfg.patch_size[1] != cfg.patch_size[2]:
            raise ConfigError(f"Wan patch_size {tuple(cfg.patch_size)}: need (1, p, p) (frames are tokenised alone)")
        if cfg.image_dim is not None or cfg.added_kv_proj_dim is not None:
            raise ConfigError("a Wan I2V-14B transformer (CLIP image cross-attention) is not supported; use a T2V or "
                              "TI2V folder (the first frame enters as a clean latent frame)")
        self.transformer = transformer
        self.attention = attention
        self.patch = int(cfg.patch_size[1])
        self.in_channels = int(cfg.in_channels)
        self.num_heads, self.head_dim = int(cfg.num_attention_heads), int(cfg.attention_head_dim)
        self.dim = self.num_heads * self.head_dim
        self.kproj = None
        if k_projection:
            width = self.num_heads * (1 + 2 * self.head_dim)
            self.kproj = nn.ModuleList(nn.Linear(self.dim, width) for _ in range(len(transformer.blocks)))
            self.reset_kproj()
        for i, block in enumerate(transformer.blocks):
            block.attn1.set_processor(ChunkCausalWanProcessor(i))
        rope = transformer.rope
        self._rope_dims = (rope.t_dim, rope.h_dim, rope.w_dim)
        self._rope_memo: dict = {}  # (cache states, frame origin, device) -> the cached tokens' rotary tables

    # -- construction --------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: dict[str, Any], k_projection: bool = False, attention: str = "auto") -> CausalWan:
        """A randomly initialised ``WanTransformer3DModel`` of ``config``, wrapped."""
        from diffusers import WanTransformer3DModel

        return cls(WanTransformer3DModel(**config), k_projection, attention)

    @classmethod
    def from_pretrained(cls, path: str | Path, k_projection: bool = False, attention: str = "auto"
                        ) -> tuple[CausalWan, list[str], list[str]]:
        """A user's Wan transformer folder (``path`` or ``path/transformer``), only read.

        Returns:
            ``(model, missing, unexpected)``: the keys of the wrapper the folder did not hold (the K-projection)
            and the folder's keys the wrapper did not take (none).
        """
        from diffusers import WanTransformer3DModel
        from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

        folder = resolve_wan_folder(path)
        try:
            cfg = dict(WanTransformer3DModel.load_config(str(folder)))
            with torch.device("meta"):
                base = WanTransformer3DModel.from_config(cfg)
        except (OSError, ValueError, TypeError) as e:
            raise CheckpointError(f"{folder}: not a loadable WanTransformer3DModel config ({e})") from None
        base.to_empty(device="cpu")
        c = base.config  # the rotary tables are not saved: rebuild them off the meta device
        base.rope = WanRotaryPosEmbed(c.attention_head_dim, tuple(c.patch_size), c.rope_max_seq_len)
        model = cls(base, k_projection, attention)
        missing, unexpected = load_wan_transformer_weights(model, folder)
        return model, missing, unexpected

    @torch.no_grad()
    def reset_kproj(self) -> None:
        """``gamma`` and ``v`` of every K-projection to zero (``u`` keeps its random init): the identity."""
        d = self.head_dim
        for lin in self.kproj:
            w = lin.weight.view(self.num_heads, 1 + 2 * d, self.dim)
            b = lin.bias.view(self.num_heads, 1 + 2 * d)
            w[:, 0].zero_()
            b[:, 0].zero_()
            w[:, 1 + d:].zero_()
            b[:, 1 + d:].zero_()

    @property
    def blocks(self) -> nn.ModuleList:
        """Wan's transformer blocks (what checkpointing recomputes and FSDP shards)."""
        return self.transformer.blocks

    # -- positions ------------------------------------------------------------------------------------------
    def positions(self, frames: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """(F,) frame indices -> (F * h/p * w/p, 3) (frame, row, column) of every token, frame-major."""
        gh, gw = h // self.patch, w // self.patch
        rows = torch.arange(gh, device=frames.device).repeat_interleave(gw)
        cols = torch.arange(gw, device=frames.device).repeat(gh)
        n = gh * gw
        return torch.stack([frames.repeat_interleave(n), rows.repeat(len(frames)), cols.repeat(len(frames))], 1)

    def rotary(self, pos: torch.Tensor, frame_origin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, 3) positions -> Wan's (cos, sin) tables, each (N, head_dim), frames counted from ``frame_origin``."""
        outs_c, outs_s = [], []
        p = pos.to(torch.float64)
        p = torch.stack([p[:, 0] - frame_origin, p[:, 1], p[:, 2]], 1)
        for axis, dim in enumerate(self._rope_dims):
            inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device)[: dim // 2] / dim))
            ang = p[:, axis:axis + 1] * inv[None]
            outs_c.append(ang.cos().repeat_interleave(2, 1))
            outs_s.append(ang.sin().repeat_interleave(2, 1))
        return torch.cat(outs_c, 1).float(), torch.cat(outs_s, 1).float()

    # -- the K-projection -----------------------------------------------------------------------------------
    def kproj_params(self, emb: torch.Tensor, layer: int):
        """(B, D) chunk time embedding -> gamma (B, H, 1, 1), u (B, H, 1, d), v (B, H, 1, d)."""
        prm = self.kproj[layer](emb.to(self.kproj[layer].weight.dtype)).view(-1, self.num_heads, 1,
                                                                             1 + 2 * self.head_dim)
        return prm[..., :1], prm[..., 1:1 + self.head_dim], prm[..., 1 + self.head_dim:]

    @staticmethod
    def project_keys(k: torch.Tensor, params) -> torch.Tensor:
        """``Pi(k) = k (1 + gamma) + <k, u> v`` per head."""
        gamma, u, v = params
        return (k * (1 + gamma) + (k * u).sum(-1, keepdim=True) * v).to(k.dtype)

    def _time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        """(...,) noise levels in [0, 1] -> (..., D) Wan's time embedding ``temb``."""
        ce = self.transformer.condition_embedder
        shape = t.shape
        proj = ce.timesteps_proj(t.reshape(-1).float() * TIME_SCALE)
        dtype = next(iter(ce.time_embedder.parameters())).dtype
        return ce.time_embedder(proj.to(dtype)).reshape(*shape, -1)

    # -- forward --------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, t: torch.Tensor, frames: torch.Tensor, chunks: torch.Tensor | None = None,
                caches: Sequence[KVCache] = (), return_kv: bool = False, prompt_embeds: torch.Tensor | None = None,
                frame_mask: torch.Tensor | None = None):
        """Velocity of latent frames ``x`` at noise levels ``t`` (Wan's flow-matching prediction).

        Args:
            x: (B, F, C, h, w) noisy latent frames.
            t: (B, F) noise level of every frame in [0, 1] (0 = clean; Wan's timestep / 1000).
            frames: (F,) time index of every frame (rotary positions; any order, any offset).
            chunks: (F,) chunk ids (generation order) for the chunk-causal mask; None = one chunk.
            caches: KV caches every query may attend (earlier chunks: cached clean frames, or the earlier
                chunks of the same denoising step).
            return_kv: Also return per-layer ``(k, v)`` of these frames (pre-rotary keys) for a cache.
            prompt_embeds: (B, L, text_dim) text-encoder states; default one zero token.
            frame_mask: (F, F) bool, query frame x key frame among this pass's frames: a further restriction of
                the chunk rule (e.g. a sliding window with sink frames, to recompute without a cache what a
                rolling cache attends). Cached tokens stay visible. Frames of one chunk must share a row when the
                K-projection is on (it is computed per chunk). A reference path: masked passes use SDPA.

        Returns:
            (B, F, C, h, w) velocity; with ``return_kv``, ``(velocity, [(k, v) per layer])``.
        """
        wan = self.transformer
        b, f, c, h, w = x.shape
        if t.shape != (b, f) or frames.shape != (f,):
            raise ValueError(f"t must be (B, F) = {(b, f)} and frames ({f},), got {tuple(t.shape)}, "
                             f"{tuple(frames.shape)}")
        if c != self.in_channels or h % self.patch or w % self.patch:
            raise ValueError(f"latents must have {self.in_channels} channels and sides divisible by {self.patch}, "
                             f"got {tuple(x.shape)}")
        dev = x.device
        n_per = (h // self.patch) * (w // self.patch)
        tokens = wan.patch_embedding(x.transpose(1, 2).to(wan.patch_embedding.weight.dtype))
        tokens = tokens.flatten(2).transpose(1, 2).contiguous()  # (B, N, D), frame-major
        # time embedding and modulation per frame, broadcast to its tokens (Wan2.2-TI2V's per-token timestep path)
        ce = wan.condition_embedder
        if prompt_embeds is None:
            prompt_embeds = x.new_zeros(b, 1, wan.config.text_dim)
        temb = self._time_embedding(t)  # (B, F, D)
        proj = ce.time_proj(ce.act_fn(temb))  # (B, F, 6 D)
        text = ce.text_embedder(prompt_embeds.to(ce.text_embedder.linear_1.weight.dtype))
        temb_tok = temb.repeat_interleave(n_per, 1)
        proj_tok = proj.repeat_interleave(n_per, 1).unflatten(2, (6, -1))  # (B, N, 6, D)
        # positions: the oldest frame of the pass (cached or new) is frame 0
        pos = self.positions(frames.to(dev), h, w)
        ctx = [cc for cc in caches if cc.num_tokens]
        pos_ctx = torch.cat([cc.positions.to(dev) for cc in ctx]) if ctx else pos[:0]
        origin = int(torch.cat([pos[:, 0], pos_ctx[:, 0]]).min())
        rope_q = self.rotary(pos, origin)
        if ctx:  # the cached tokens' tables are the same for every pass until a cache changes (a frame's steps)
            key = (tuple(cc.state for cc in ctx), origin, str(dev))
            cached = self._rope_memo.get(key)
            if cached is None:
                cached = self.rotary(pos_ctx, origin)
                self._rope_memo = {key: cached}  # one entry: the caches of the current frame
            rope_k = (torch.cat([cached[0], rope_q[0]]), torch.cat([cached[1], rope_q[1]]))
        else:
            rope_k = rope_q
        state = _PassState(rope_q, rope_k, ctx, kv_out={} if return_kv else None, owner=self)
        uniq = [0] if chunks is None else torch.unique(chunks).tolist()
        m = sum(cc.num_tokens for cc in ctx)
        if frame_mask is not None and frame_mask.shape != (f, f):
            raise ValueError(f"frame_mask must be (F, F) = {(f, f)}, got {tuple(frame_mask.shape)}")
        fm_tok = None if frame_mask is None else frame_mask.to(dev, torch.bool).repeat_interleave(
            n_per, 0).repeat_interleave(n_per, 1)  # (N, N) token pairs
        if chunks is not None and len(uniq) > 1 or (self.kproj is not None and ctx) or fm_tok is not None:
            tok_chunks = (torch.zeros(f, dtype=torch.long, device=dev) if chunks is None
                          else chunks.to(dev).long()).repeat_interleave(n_per)
            if self.kproj is not None:
                n_new = tok_chunks.numel()
                for cid in uniq:
                    rows = tok_chunks == cid
                    earlier = tok_chunks < cid
                    seen = earlier | rows
                    if fm_tok is not None:  # the chunk's queries share one row of the frame mask
                        allowed = fm_tok[rows.nonzero()[0, 0]]
                        if not bool((fm_tok[rows] == allowed).all()):
                            raise ValueError("frame_mask: the frames of one chunk must attend the same frames when "
                                             "the K-projection is on")
                        seen = seen & allowed
                    n_rows, n_earlier, n_seen = (int(x) for x in torch.stack([rows.sum(), earlier.sum(), seen.sum()]))
                    sel = None if n_seen == n_new else seen.nonzero().squeeze(1)
                    rope = rope_k if sel is None else tuple(torch.cat([r[:m], r[m:][sel]]) for r in rope_k)
                    state.chunks.append(_ChunkKeys(
                        emb=self._time_embedding(t[:, rows[::n_per]].mean(1)),
                        rows=None if n_rows == n_new else rows.nonzero().squeeze(1),
                        earlier=earlier if n_earlier else None, sel=sel, rope_k=rope))
            elif fm_tok is not None:
                mask = chunk_attention_mask(tok_chunks, m, "sdpa")
                mask[:, m:] &= fm_tok
                state.mask = mask
            elif len(uniq) > 1:
                backend = self.attention if self.attention != "auto" else ("flex" if dev.type == "cuda" else "sdpa")
                if backend == "flex" and dev.type == "cpu" and torch.is_grad_enabled():
                    backend = "sdpa"  # FlexAttention has no CPU backward
                state.mask = chunk_attention_mask(tok_chunks, m, backend)
        for block in wan.blocks:
            tokens = block(tokens, text, proj_tok, state)
        shift, scale = (wan.scale_shift_table.unsqueeze(0) + temb_tok.unsqueeze(2)).chunk(2, dim=2)
        tokens = (wan.norm_out(tokens.float()) * (1 + scale.squeeze(2)) + shift.squeeze(2)).type_as(tokens)
        out = wan.proj_out(tokens)  # (B, N, p p C)
        p = self.patch
        out = out.reshape(b, f, h // p, w // p, p, p, -1).permute(0, 1, 6, 2, 4, 3, 5).reshape(b, f, -1, h, w)
        if return_kv:
            return out, [state.kv_out[i] for i in range(len(wan.blocks))]
        return out


def wan_parameter_count(config: dict[str, Any]) -> int:
    """Parameters of a ``WanTransformer3DModel`` of ``config``, built on the meta device (no memory)."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        return sum(p.numel() for p in WanTransformer3DModel(**config).parameters())

