"""AutoMoT: a mixture-of-transformers vision-language-action model for end-to-end driving (ICML 2026).

Two experts of the same depth share ONE attention per layer over one sequence::

    U  understanding  system prompt + front-camera frame(s) + instruction   VLM weights     causal
    D  decision       n_reason learned reasoning queries                     expert weights  full
    P  planning       BEV | target points | ego | route q. | waypoint q.     expert weights  full

In every layer U goes through the VLM decoder layer's norms and q/k/v projections (and q/k norms if it has
them), D+P through the action expert's own; the queries, keys and values are concatenated and one
``F.scaled_dot_product_attention`` runs with the block mask (``block_mask``: every block sees all earlier
blocks, never a later one), then each expert applies its own o-projection and MLP. So U's hidden states are
exactly the plain VLM's (they never see D or P), and D never sees P.

Positions: U keeps the VLM's own multimodal RoPE (``get_rope_index``: 3-D positions for image tokens); D+P
get text-style positions continuing after U's largest position, per sample (the three mrope sections
equal). The ``noreason`` arm has no VLM: D+P alone, positions from 0, standard RoPE with ``ROPE_THETA``.

Asynchronous inference: ``encode_prefix`` runs U once and keeps every layer's keys / values (after RoPE);
``act`` runs D+P against them without writing to them, so the prefix can be refreshed every N control steps.
What every ``act`` on one prefix shares is built once, at its first ``act`` (``_ActState``): the action rows'
mask (as SDPA's additive float mask), D+P's rotary tables, and per layer a key / value buffer holding the
prefix already expanded to the query heads, whose tail each ``act`` overwrites with D+P's keys / values
(instead of concatenating and repeating the whole prefix per layer per step). Same numbers as the joint pass.

Heads (on the action expert's final-RMSNorm outputs):

- meta-action: the reasoning queries' mean -> Linear to the VLM width -> the VLM's final norm -> the VLM's
  LM head, read at ``meta_action_token_ids`` only -> (B, n_meta) logits (CE). The noreason arm uses a
  Linear instead.
- route: route queries -> Linear -> (B, n_route, 2) ego-frame metres (L1).
- waypoints: waypoint queries -> Linear -> (B, n_wp, 2) offsets; cumulative sum -> waypoints (weighted L1).
- velocity: the ego token -> Linear -> (B,) m/s (smooth-L1).
- ``features`` (B, n_wp * expert_hidden_size): the waypoint queries' outputs, flattened in waypoint order;
  what the action refiner conditions on.

``DrivingVLA`` is the trained policy around this model (a ``core.pretrained.PreTrainedModel``): the joint
model, the optional waypoint refiner, the two training stages, and the folder format (``save_pretrained`` /
``from_pretrained``; the base VLM referenced, not copied; the understanding expert also as a transformers folder
``vlm/``, see ``DrivingVLA.save_upstream``).

Deviations from the paper: the VLM and the expert must already have the same number of heads / kv heads /
head_dim (the paper pads heads); the meta-action is read from the LM head at one token per class instead of
decoding reasoning text; the BEV input is a rasterised (B, C, H, W) map patch-embedded by a conv rather than
a camera/LiDAR BEV encoder; the diffusion action refiner is not part of this model (it consumes
``features``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError, ConfigError
from core.pretrained import PreTrainedModel
from core.vlm import (
    decoder_layers,
    image_token_id,
    language_model,
    mm_token_type_ids,
    next_token_loss,
    vision_tower,
    vlm_inputs,
)
from driving.automot.configuration_automot import AutoMoTConfig, AutoMoTModelConfig, DrivingVLAConfig

ROPE_THETA = 1_000_000.0  # the noreason arm's RoPE base (Qwen's)
BLOCK_KINDS = ("causal", "full")


# -- the block mask ----------------------------------------------------------------------------------------------
def block_mask(sizes: Sequence[int], kinds: Sequence[str], key_padding: torch.Tensor | None = None,
               device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean attention mask (True = may attend) of a sequence made of consecutive blocks.

    A ``"causal"`` block is causal inside, a ``"full"`` block bidirectional inside; every block sees all earlier
    blocks and no later one.

    Args:
        sizes: Tokens per block, in sequence order (S = their sum).
        kinds: ``"causal"`` or ``"full"`` per block.
        key_padding: Optional (B, S) bool, True at PADDING keys (torch's ``key_padding_mask`` convention); those
            keys are masked for every query.
        device: Where to build the mask (default: ``key_padding``'s device, else CPU).

    Returns:
        (S, S) bool, or (B, S, S) with ``key_padding``; ``[..., i, j]`` = query i may attend key j.
    """
    if len(sizes) != len(kinds):
        raise ValueError(f"block_mask: {len(sizes)} sizes but {len(kinds)} kinds")
    for kind in kinds:
        if kind not in BLOCK_KINDS:
            raise ValueError(f"block_mask: kind must be one of {BLOCK_KINDS}, got {kind!r}")
    if any(int(s) < 0 for s in sizes):
        raise ValueError(f"block_mask: sizes must be >= 0, got {list(sizes)}")
    if device is None:
        device = key_padding.device if key_padding is not None else "cpu"
    counts = torch.tensor([int(s) for s in sizes], device=device)
    block = torch.repeat_interleave(torch.arange(len(sizes), device=device), counts)  # (S,) block of each token
    causal = torch.tensor([k == "causal" for k in kinds], dtype=torch.bool, device=device)[block]  # (S,)
    idx = torch.arange(block.numel(), device=device)
    same = block[:, None] == block[None, :]
    inside = same & (~causal[:, None] | (idx[None, :] <= idx[:, None]))
    mask = (block[None, :] < block[:, None]) | inside
    if key_padding is not None:
        if key_padding.ndim != 2 or key_padding.shape[1] != block.numel():
            raise ValueError(f"block_mask: key_padding must be (B, {block.numel()}), got {tuple(key_padding.shape)}")
        mask = mask[None] & ~key_padding.bool()[:, None, :]
    return mask


# -- outputs -----------------------------------------------------------------------------------------------------
@dataclass
class PrefixCache:
    """The understanding prefix of one batch, as every layer's attention sees it.

    Attributes:
        keys / values: One (B, n_kv_heads, L, head_dim) tensor per layer (keys after RoPE).
        key_padding: (B, L) bool, True at padding.
        next_position: (B,) long: the first position after U (D+P positions start here).
        hidden: (B, L, D_vlm) U's final hidden states (after the VLM's final norm).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_padding: torch.Tensor
    next_position: torch.Tensor
    hidden: torch.Tensor
    _act: dict[Any, _ActState] = field(default_factory=dict, repr=False, compare=False)

    @property
    def length(self) -> int:
        return int(self.key_padding.shape[1])


@dataclass
class _ActState:
    """What every ``act`` on one prefix shares (built at the first; La = D+P tokens, L = the prefix's length).

    Attributes:
        mask: (B, 1, La, L + La) float, 0 where a D+P query may attend and -inf elsewhere (SDPA's additive form
            of ``block_mask``'s action rows: the same numbers as the boolean mask).
        cos / sin: (B, La, head_dim) D+P's rotary tables.
        keys / values: Per layer (B, n_kv_heads, rep, L + La, head_dim), rep = heads / kv heads: the prefix's
            keys / values repeated for the query heads in ``[..., :L, :]``; ``act`` writes D+P's in the tail.
        made_from: The prefix tensors these were built from (rebuilt when any of them is replaced).
    """

    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    made_from: tuple[torch.Tensor, ...]


@dataclass
class AutoMoTOutput:
    """What one forward gives (B = batch; coordinates in the ego frame, metres; x forward, y left).

    Attributes:
        meta_logits: (B, n_meta) meta-action logits.
        route: (B, n_route, 2) route points.
        waypoints: (B, n_wp, 2) waypoints (the cumulative sum of ``wp_offsets``).
        wp_offsets: (B, n_wp, 2) per-step displacements.
        velocity: (B,) target speed, m/s.
        features: (B, n_wp * expert_hidden_size) the waypoint queries' outputs, flattened (refiner condition).
        understanding_hidden: (B, L, D_vlm) U's final hidden states (VLM final norm applied); None without a VLM.
    """

    meta_logits: torch.Tensor
    route: torch.Tensor
    waypoints: torch.Tensor
    wp_offsets: torch.Tensor
    velocity: torch.Tensor
    features: torch.Tensor
    understanding_hidden: torch.Tensor | None = None


# -- the action expert -------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps) in float32, fused (one op instead of six; the same bits on CPU)
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class ExpertAttention(nn.Module):
    """The action expert's projections (its width -> the shared heads) and per-head RMS q/k norms."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)


class ExpertMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ExpertLayer(nn.Module):
    """One action-expert layer; its submodule names mirror a HF decoder layer's (one joint step drives both)."""

    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = ExpertAttention(hidden, heads, kv_heads, head_dim, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = ExpertMLP(hidden, intermediate)


class TextRope(nn.Module):
    """Standard 1-D RoPE (the noreason arm's): positions (3, B, L), rows equal -> cos, sin (B, L, hd)."""

    def __init__(self, head_dim: int, theta: float = ROPE_THETA):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.inv_freq = nn.Buffer(inv, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[0, ..., None].float() * self.inv_freq.to(x.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, hd), cos/sin (B, L, hd)."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


def _project(layer: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int):
    """A decoder layer's pre-norm, q/k/v (+ q/k norms) and RoPE.

    h (B, L, D) -> q (B, H, L, hd), k and v (B, KV, L, hd).
    """
    attn = layer.self_attn
    x = layer.input_layernorm(h)
    b, n = x.shape[:2]
    q = attn.q_proj(x).view(b, n, -1, head_dim)
    k = attn.k_proj(x).view(b, n, -1, head_dim)
    v = attn.v_proj(x).view(b, n, -1, head_dim).transpose(1, 2)
    if getattr(attn, "q_norm", None) is not None:
        q = attn.q_norm(q)
    if getattr(attn, "k_norm", None) is not None:
        k = attn.k_norm(k)
    return _rope(q.transpose(1, 2), cos, sin), _rope(k.transpose(1, 2), cos, sin), v


def joint_parts(layer: nn.Module) -> list[nn.Module]:
    """The submodules of a decoder / expert layer that the joint stack calls (``_project`` and ``_finish``).

    The joint stack never calls a layer's own ``forward``: it calls these parts one by one, each through its
    ``__call__``. They are therefore the units FSDP gathers (its pre-forward hook runs on a unit's ``__call__``)
    -- a whole layer as a unit would never be gathered here.
    """
    attn = layer.self_attn
    parts = [layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj]
    parts += [m for m in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)) if isinstance(m, nn.Module)]
    return [*parts, attn.o_proj, layer.post_attention_layernorm, layer.mlp]


def _finish(layer: nn.Module, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    """Residual o-projection, then the residual MLP block, with ``layer``'s own weights."""
    h = h + layer.self_attn.o_proj(attn_out)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q (B, H, Lq, hd), k/v (B, KV, Lk, hd), mask (B, 1, Lq, Lk) bool -> (B, Lq, H * hd); GQA: kv repeated."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=q.shape[-1] ** -0.5)
    return out.transpose(1, 2).flatten(2)


@functools.lru_cache(maxsize=8)
def _sincos_2d(h: int, w: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Fixed 2-D sine-cosine embedding of an (h, w) token grid -> (h * w, dim), row-major (built once per grid,
    device and dtype; callers only read it)."""
    quarter = dim // 4
    omega = 1.0 / (10000.0 ** (torch.arange(quarter, device=device, dtype=torch.float) / max(quarter, 1)))
    ys, xs = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float),
                            torch.arange(w, device=device, dtype=torch.float), indexing="ij")
    y, x = ys.reshape(-1, 1) * omega, xs.reshape(-1, 1) * omega
    emb = torch.cat([y.sin(), y.cos(), x.sin(), x.cos()], dim=1)
    return F.pad(emb, (0, dim - emb.shape[1])).to(dtype)


# -- the model ---------------------------------------------------------------------------------------------------
class AutoMoT(nn.Module):
    """AutoMoT's joint model (see the module docstring).

    Batch (a dict; B = batch):

    - ``input_ids`` (B, L) long, ``attention_mask`` (B, L) 0/1, RIGHT-padded: U's tokens (ChatML prompt with one
      ``<|vision_start|><|image_pad|> x N<|vision_end|>`` run per frame). Not needed without a VLM.
    - ``pixel_values`` (sum of patches, patch_dim) and ``image_grid_thw`` (n_images, 3): ``core.vlm.patchify`` of
      the B*T front-camera frames, sample-major (sample 0's T frames, then sample 1's, ...). Optional.
    - ``bev`` (B, bev_channels, Hb, Wb) float in [0, 1], Hb and Wb multiples of ``bev_patch``; ego-centred raster.
    - ``target_points`` (B, n_target, 2) float, ego frame, metres.
    - ``ego`` (B, ego_dim) float: speed m/s, acceleration m/s^2, steering, yaw rate rad/s, ...

    Args:
        cfg: The model config.
        vlm: A Qwen2.5-VL / Qwen3-VL ``...ForConditionalGeneration`` (``core.vlm.build_vlm`` / ``load_vlm``); must
            be None exactly when ``cfg.use_understanding`` is False.
    """

    def __init__(self, cfg: AutoMoTConfig, vlm: nn.Module | None):
        super().__init__()
        if cfg.use_understanding != (vlm is not None):
            raise ConfigError("AutoMoT: pass a VLM exactly when model.use_understanding is true "
                              f"(use_understanding={cfg.use_understanding}, vlm={'given' if vlm else 'None'})")
        self.cfg = cfg
        self.vlm = vlm
        geometry = {"num_layers": cfg.num_layers, "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
                    "head_dim": cfg.head_dim}
        if vlm is not None:
            text = vlm.config.text_config
            heads = text.num_attention_heads
            have = {"num_layers": len(decoder_layers(vlm)), "num_heads": heads,
                    "num_kv_heads": text.num_key_value_heads,
                    "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads}
            for key, value in geometry.items():
                if value is not None and value != have[key]:
                    raise ConfigError(f"model.{key}={value} differs from the VLM's {have[key]} (the experts share "
                                      "one attention; leave it unset to take the VLM's)")
            geometry = have
            ids = cfg.meta_action_token_ids
            if not ids:
                raise ConfigError("model.meta_action_token_ids is required with a VLM (one vocabulary id per "
                                  "meta-action class)")
            if max(ids) >= text.vocab_size:
                raise ConfigError(f"model.meta_action_token_ids {ids} exceed the VLM's vocabulary ({text.vocab_size})")
            self.image_token = image_token_id(vlm)
            self.register_buffer("meta_ids", torch.tensor(ids, dtype=torch.long), persistent=False)
            if cfg.freeze_understanding:
                vlm.requires_grad_(False)
        self.num_layers, self.num_heads = geometry["num_layers"], geometry["num_heads"]
        self.num_kv_heads, self.head_dim = geometry["num_kv_heads"], geometry["head_dim"]

        d, eps = cfg.expert_hidden_size, cfg.rms_norm_eps
        self.layers = nn.ModuleList(ExpertLayer(d, cfg.expert_intermediate_size, self.num_heads, self.num_kv_heads,
                                                self.head_dim, eps) for _ in range(self.num_layers))
        self.norm = RMSNorm(d, eps)
        self.rope = TextRope(self.head_dim) if vlm is None else None
        # action tokens
        self.bev_embed = nn.Conv2d(cfg.bev_channels, d, kernel_size=cfg.bev_patch, stride=cfg.bev_patch)
        self.target_embed = nn.Linear(2, d)
        self.ego_embed = nn.Linear(cfg.ego_dim, d)
        self.type_embed = nn.Parameter(torch.zeros(3, d))  # BEV / target / ego token types
        self.reason_queries = nn.Parameter(torch.zeros(cfg.n_reason, d))
        self.route_queries = nn.Parameter(torch.zeros(cfg.n_route, d))
        self.wp_queries = nn.Parameter(torch.zeros(cfg.n_wp, d))
        # heads
        if vlm is not None:
            self.reason_proj = nn.Linear(d, vlm.config.text_config.hidden_size)
            self.meta_head = None
        else:
            self.reason_proj = None
            self.meta_head = nn.Linear(d, cfg.n_meta)
        self.route_head = nn.Linear(d, 2)
        self.wp_head = nn.Linear(d, 2)
        self.velocity_head = nn.Linear(d, 1)
        self._init_expert()

    def _init_expert(self) -> None:
        std = self.cfg.init_std
        for name, module in self.named_modules():
            if name.startswith("vlm"):
                continue
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for p in (self.type_embed, self.reason_queries, self.route_queries, self.wp_queries):
            nn.init.normal_(p, std=std)

    # -- parameters ----------------------------------------------------------------------------------------------
    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimizer should get (the VLM's are excluded when ``freeze_understanding``)."""
        return [p for p in self.parameters() if p.requires_grad]

    @property
    def _dtype(self) -> torch.dtype:
        return self.reason_queries.dtype

    # -- scaling -------------------------------------------------------------------------------------------------
    def fsdp_units(self) -> list[nn.Module]:
        """The modules FSDP shards as units of their own: the vision blocks (called whole by the VLM) and, of
        every layer of both streams, the parts the joint stack calls (``joint_parts``). The rest (embeddings,
        final norms, LM head -- read directly by the meta-action head -- and the action tokens' layers) belong
        to the root, gathered for the whole step."""
        units: list[nn.Module] = []
        if self.vlm is not None:
            units += list(vision_tower(self.vlm).blocks)
            for layer in decoder_layers(self.vlm):
                units += joint_parts(layer)
        for layer in self.layers:
            units += joint_parts(layer)
        return units

    def checkpoint_units(self) -> list[nn.Module]:
        """The modules gradient checkpointing recomputes: the vision blocks and every layer's MLP (the largest
        activations: 3 x intermediate size per token) of both streams; each is also an FSDP unit of its own, so
        the recompute runs inside the unit's gathered parameters. Attention activations are kept."""
        units: list[nn.Module] = list(vision_tower(self.vlm).blocks) if self.vlm is not None else []
        layers = [*(decoder_layers(self.vlm) if self.vlm is not None else []), *self.layers]
        return units + [layer.mlp for layer in layers]

    # -- inputs --------------------------------------------------------------------------------------------------
    def _check(self, batch: dict[str, Any], need_text: bool) -> int:
        cfg = self.cfg

        def get(key: str) -> torch.Tensor:
            if key not in batch or not isinstance(batch[key], torch.Tensor):
                raise ValueError(f"AutoMoT batch: missing tensor {key!r}")
            return batch[key]

        bev, tp, ego = get("bev"), get("target_points"), get("ego")
        if bev.ndim != 4 or bev.shape[1] != cfg.bev_channels or bev.shape[2] % cfg.bev_patch \
                or bev.shape[3] % cfg.bev_patch or bev.shape[2] == 0 or bev.shape[3] == 0:
            raise ValueError(f"AutoMoT batch['bev'] must be (B, {cfg.bev_channels}, H, W) with H and W multiples of "
                             f"bev_patch={cfg.bev_patch}, got {tuple(bev.shape)}")
        b = bev.shape[0]
        if tuple(tp.shape) != (b, cfg.n_target, 2):
            raise ValueError(f"AutoMoT batch['target_points'] must be ({b}, {cfg.n_target}, 2), got {tuple(tp.shape)}")
        if tuple(ego.shape) != (b, cfg.ego_dim):
            raise ValueError(f"AutoMoT batch['ego'] must be ({b}, {cfg.ego_dim}), got {tuple(ego.shape)}")
        if need_text:
            ids, am = get("input_ids"), get("attention_mask")
            if ids.ndim != 2 or ids.shape[0] != b or ids.dtype != torch.long:
                raise ValueError(f"AutoMoT batch['input_ids'] must be ({b}, L) long, got {tuple(ids.shape)} {ids.dtype}")
            if tuple(am.shape) != tuple(ids.shape):
                raise ValueError(f"AutoMoT batch['attention_mask'] must match input_ids {tuple(ids.shape)}, "
                                 f"got {tuple(am.shape)}")
            valid = am.bool()
            if not bool(valid[:, 0].all()) or bool((valid[:, 1:] & ~valid[:, :-1]).any()):
                raise ValueError("AutoMoT batch['attention_mask'] must be right-padded (ones then zeros), each row "
                                 "with at least one token")
            if (batch.get("pixel_values") is None) != (batch.get("image_grid_thw") is None):
                raise ValueError("AutoMoT batch: 'pixel_values' and 'image_grid_thw' come together")
        return b

    def _embed_understanding(self, batch: dict[str, Any]):
        """U's input embeddings (B, L, D_vlm), 3-D positions (3, B, L), padding (B, L), next position (B,),
        the image-token mask (B, L) and Qwen3-VL's deepstack features (one (n_image_tokens, D_vlm) per early
        layer)."""
        model = self.vlm.model
        ids, am = batch["input_ids"], batch["attention_mask"]
        emb = model.get_input_embeddings()(ids)
        image_mask = ids == self.image_token
        pv, grid = batch.get("pixel_values"), batch.get("image_grid_thw")
        deepstack = None
        if pv is not None:
            feats = model.get_image_features(pv, grid, return_dict=True)
            images = torch.cat(list(feats.pooler_output), dim=0).to(emb.dtype)
            if images.shape[0] != int(image_mask.sum()):
                raise ValueError(f"AutoMoT batch: {int(image_mask.sum())} image tokens in 'input_ids' but the images "
                                 f"in 'pixel_values' / 'image_grid_thw' make {images.shape[0]}")
            emb = emb.masked_scatter(image_mask[..., None], images)
            extra = getattr(feats, "deepstack_features", None)
            if extra:
                deepstack = [torch.cat(list(f), dim=0).to(emb.dtype) for f in extra]
        elif bool(image_mask.any()):
            raise ValueError("AutoMoT batch: 'input_ids' has image tokens but no 'pixel_values'")
        positions, _ = model.get_rope_index(ids, mm_token_type_ids=mm_token_type_ids(self.vlm, ids),
                                            image_grid_thw=grid, attention_mask=am)
        valid = am.bool()
        next_position = positions.masked_fill(~valid[None], -1).amax(dim=(0, 2)) + 1
        return emb, positions, ~valid, next_position, image_mask, deepstack

    def _action_tokens(self, batch: dict[str, Any]) -> tuple[torch.Tensor, list[int]]:
        """D+P input tokens (B, n_reason + n_plan, d) and the planning block's parts' sizes
        [n_bev, n_target, 1, n_route, n_wp]."""
        dt = self._dtype
        bev = self.bev_embed(batch["bev"].to(dt))  # (B, d, Hb/p, Wb/p)
        b, d, hb, wb = bev.shape
        bev = bev.flatten(2).transpose(1, 2) + _sincos_2d(hb, wb, d, bev.device, dt) + self.type_embed[0]
        target = self.target_embed(batch["target_points"].to(dt)) + self.type_embed[1]  # (B, K, d)
        ego = self.ego_embed(batch["ego"].to(dt))[:, None] + self.type_embed[2]  # (B, 1, d)
        parts = [self.reason_queries.expand(b, -1, -1), bev, target, ego,
                 self.route_queries.expand(b, -1, -1), self.wp_queries.expand(b, -1, -1)]
        return torch.cat(parts, dim=1), [hb * wb, target.shape[1], 1, self.cfg.n_route, self.cfg.n_wp]

    def _rotary(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (3, B, L) -> cos, sin (B, L, head_dim)."""
        if self.vlm is None:
            return self.rope(x, positions)
        return language_model(self.vlm).rotary_emb(x, positions)

    def _action_rope(self, a: torch.Tensor, next_position: torch.Tensor):
        pos = next_position[:, None] + torch.arange(a.shape[1], device=a.device)  # (B, La)
        return self._rotary(a, pos[None].expand(3, -1, -1))

    # -- the joint stack -----------------------------------------------------------------------------------------
    def _stack(self, mask: torch.Tensor, u: tuple | None = None, a: tuple | None = None,
               cached: PrefixCache | None = None, image_mask: torch.Tensor | None = None,
               deepstack: list[torch.Tensor] | None = None, collect: bool = False):
        """Run every layer jointly.

        Args:
            mask: (B, 1, Lq, Lk) bool; queries = live U (if ``u``) then live D+P (if ``a``); keys = U (live or
                ``cached``) then D+P.
            u / a: (hidden (B, L, width), cos, sin) of the live U / D+P streams, or None.
            cached: U's keys / values per layer, when U is not live (read, never written).
            collect: Also return U's per-layer keys / values.

        Returns:
            (U hidden, D+P hidden, keys, values): the streams' last-layer hidden states (before any final norm).
        """
        vlm_layers = decoder_layers(self.vlm) if self.vlm is not None else None
        h_u = u[0] if u is not None else None
        h_a = a[0] if a is not None else None
        keys, values = [], []
        for i in range(self.num_layers):
            qs, ks, vs = [], [], []
            if u is not None:
                q, k, v = _project(vlm_layers[i], h_u, u[1], u[2], self.head_dim)
                qs.append(q)
                ks.append(k)
                vs.append(v)
                if collect:
                    keys.append(k)
                    values.append(v)
            elif cached is not None:
                ks.append(cached.keys[i])
                vs.append(cached.values[i])
            if a is not None:
                q, k, v = _project(self.layers[i], h_a, a[1], a[2], self.head_dim)
                qs.append(q)
                ks.append(k)
                vs.append(v)
            out = _attend(torch.cat(qs, 2), torch.cat(ks, 2), torch.cat(vs, 2), mask)
            if u is not None:
                n_u = h_u.shape[1]
                h_u = _finish(vlm_layers[i], h_u, out[:, :n_u])
                out = out[:, n_u:]
                if deepstack is not None and i < len(deepstack):
                    h_u = h_u.clone()
                    h_u[image_mask] = h_u[image_mask] + deepstack[i]
            if a is not None:
                h_a = _finish(self.layers[i], h_a, out)
        return h_u, h_a, keys, values

    def _heads(self, h_a: torch.Tensor, plan: list[int], hidden: torch.Tensor | None) -> AutoMoTOutput:
        cfg = self.cfg
        h = self.norm(h_a)  # (B, n_reason + n_plan, d)
        reason = h[:, : cfg.n_reason].mean(dim=1)  # (B, d)
        if self.vlm is not None:
            z = language_model(self.vlm).norm(self.reason_proj(reason))  # (B, D_vlm)
            lm_head = self.vlm.get_output_embeddings()
            meta = F.linear(z, lm_head.weight[self.meta_ids],
                            lm_head.bias[self.meta_ids] if lm_head.bias is not None else None)
        else:
            meta = self.meta_head(reason)
        start = cfg.n_reason + plan[0] + plan[1]
        ego = h[:, start]
        route = h[:, start + 1: start + 1 + cfg.n_route]
        wp = h[:, start + 1 + cfg.n_route: start + 1 + cfg.n_route + cfg.n_wp]
        offsets = self.wp_head(wp)
        return AutoMoTOutput(meta_logits=meta, route=self.route_head(route), waypoints=offsets.cumsum(dim=1),
                             wp_offsets=offsets, velocity=self.velocity_head(ego).squeeze(-1),
                             features=wp.flatten(1), understanding_hidden=hidden)

    # -- public API ----------------------------------------------------------------------------------------------
    def forward(self, batch: dict[str, Any]) -> AutoMoTOutput:
        """The full joint pass over U + D + P (or D + P alone in the noreason arm)."""
        b = self._check(batch, need_text=self.vlm is not None)
        a, plan = self._action_tokens(batch)  # (B, La, d)
        sizes, kinds = [self.cfg.n_reason, sum(plan)], ["full", "full"]
        if self.vlm is None:
            mask = block_mask(sizes, kinds, device=a.device)[None, None].expand(b, 1, -1, -1)
            _, h_a, _, _ = self._stack(mask, a=(a, *self._action_rope(a, torch.zeros(b, dtype=torch.long,
                                                                                      device=a.device))))
            return self._heads(h_a, plan, None)
        emb, pos, pad, next_position, image_mask, deepstack = self._embed_understanding(batch)
        a = a.to(emb.dtype)
        pad = torch.cat([pad, torch.zeros(b, a.shape[1], dtype=torch.bool, device=pad.device)], dim=1)
        mask = block_mask([emb.shape[1], *sizes], ["causal", *kinds], key_padding=pad)[:, None]
        h_u, h_a, _, _ = self._stack(mask, u=(emb, *self._rotary(emb, pos)),
                                     a=(a, *self._action_rope(a, next_position)),
                                     image_mask=image_mask, deepstack=deepstack)
        return self._heads(h_a, plan, language_model(self.vlm).norm(h_u))

    def encode_prefix(self, batch: dict[str, Any]) -> PrefixCache:
        """Run U once through the VLM's weights; keep each layer's keys (after RoPE) and values (no D, P)."""
        if self.vlm is None:
            raise ConfigError("encode_prefix needs the understanding expert (model.use_understanding=false here)")
        self._check(batch, need_text=True)
        emb, pos, pad, next_position, image_mask, deepstack = self._embed_understanding(batch)
        mask = block_mask([emb.shape[1]], ["causal"], key_padding=pad)[:, None]
        h_u, _, keys, values = self._stack(mask, u=(emb, *self._rotary(emb, pos)), image_mask=image_mask,
                                           deepstack=deepstack, collect=True)
        return PrefixCache(keys=keys, values=values, key_padding=pad, next_position=next_position,
                           hidden=language_model(self.vlm).norm(h_u))

    def act(self, prefix: PrefixCache | None, batch: dict[str, Any]) -> AutoMoTOutput:
        """Run D + P through the action expert against a cached prefix (read only; the cache is not written).

        ``prefix`` must be None in the noreason arm (then this equals ``forward``); ``batch`` needs only ``bev``,
        ``target_points`` and ``ego``.
        """
        b = self._check(batch, need_text=False)
        if self.vlm is None:
            if prefix is not None:
                raise ValueError("act: the noreason arm has no understanding prefix; pass prefix=None")
            return self.forward(batch)
        if prefix is None:
            raise ValueError("act: pass the PrefixCache from encode_prefix (the model has an understanding expert)")
        if prefix.key_padding.shape[0] != b or len(prefix.keys) != self.num_layers:
            raise ValueError(f"act: the prefix holds {prefix.key_padding.shape[0]} samples x {len(prefix.keys)} "
                             f"layers; the batch has {b} samples and the model {self.num_layers} layers")
        a, plan = self._action_tokens(batch)
        a = a.to(prefix.keys[0].dtype)
        st = self._act_state(prefix, a, plan)
        n_u, h_a = prefix.length, a
        for i, layer in enumerate(self.layers):
            q, k, v = _project(layer, h_a, st.cos, st.sin, self.head_dim)  # q (B, H, La, hd), k / v (B, KV, La, hd)
            kb, vb = st.keys[i], st.values[i]
            kb[:, :, :, n_u:] = k[:, :, None]  # the tail of (B, KV, rep, L + La, hd): GQA's repeat, in place
            vb[:, :, :, n_u:] = v[:, :, None]
            out = F.scaled_dot_product_attention(q, kb.flatten(1, 2), vb.flatten(1, 2), attn_mask=st.mask,
                                                 scale=q.shape[-1] ** -0.5)
            h_a = _finish(layer, h_a, out.transpose(1, 2).flatten(2))
        return self._heads(h_a, plan, prefix.hidden)

    def _act_state(self, prefix: PrefixCache, a: torch.Tensor, plan: list[int]) -> _ActState:
        """The ``_ActState`` of ``prefix`` for D+P tokens ``a`` (B, La, d): built once, then reused while the
        prefix's tensors, La, dtype and device stay the same."""
        made_from = (prefix.key_padding, prefix.next_position, *prefix.keys, *prefix.values)
        key = (tuple(plan), a.shape[0], a.dtype, a.device)
        st = prefix._act.get(key)
        if st is not None and len(st.made_from) == len(made_from) \
                and all(x is y for x, y in zip(st.made_from, made_from, strict=True)):
            return st
        b, n_u, n_a = a.shape[0], prefix.length, a.shape[1]
        pad = torch.cat([prefix.key_padding, torch.zeros(b, n_a, dtype=torch.bool, device=a.device)], dim=1)
        allowed = block_mask([n_u, self.cfg.n_reason, sum(plan)], ["causal", "full", "full"], key_padding=pad)
        allowed = allowed[:, None, n_u:]  # (B, 1, La, L + La): the action rows only
        mask = torch.zeros(allowed.shape, dtype=a.dtype, device=a.device).masked_fill_(~allowed, float("-inf"))
        cos, sin = self._action_rope(a, prefix.next_position)
        rep = self.num_heads // self.num_kv_heads
        keys, values = [], []
        for k, v in zip(prefix.keys, prefix.values, strict=True):
            kb = k.new_empty(b, k.shape[1], rep, n_u + n_a, k.shape[-1])
            vb = v.new_empty(b, v.shape[1], rep, n_u + n_a, v.shape[-1])
            kb[:, :, :, :n_u] = k[:, :, None]
            vb[:, :, :, :n_u] = v[:, :, None]
            keys.append(kb)
            values.append(vb)
        prefix._act.clear()  # one state per prefix: a new La / dtype replaces the old one
        st = prefix._act[key] = _ActState(mask, cos, sin, keys, values, made_from)
        return st

    def loss(self, out: AutoMoTOutput, targets: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """CE(meta-action), L1(route), wp_weights-weighted L1 on the cumulative waypoints, smooth-L1(speed).

        Args:
            out: This model's output.
            targets: ``meta_action`` (B,) long class index; ``route`` (B, n_route, 2); ``waypoints`` (B, n_wp, 2)
                cumulative, ego frame, metres; ``velocity`` (B,) m/s.

        Returns:
            ``loss`` (the weighted total) and the parts ``meta``, ``route``, ``waypoints``, ``velocity``.
        """
        cfg = self.cfg
        b = out.route.shape[0]
        shapes = {"meta_action": (b,), "route": (b, cfg.n_route, 2), "waypoints": (b, cfg.n_wp, 2), "velocity": (b,)}
        for key, shape in shapes.items():
            if key not in targets:
                raise ValueError(f"AutoMoT targets: missing {key!r}")
            if tuple(targets[key].shape) != shape:
                raise ValueError(f"AutoMoT targets[{key!r}] must be {shape}, got {tuple(targets[key].shape)}")
        meta = F.cross_entropy(out.meta_logits.float(), targets["meta_action"].long())
        route = F.l1_loss(out.route.float(), targets["route"].float())
        w = torch.tensor(cfg.wp_weights, device=out.waypoints.device)
        per_step = (out.waypoints.float() - targets["waypoints"].float()).abs().mean(dim=-1)  # (B, n_wp)
        wp = (per_step * (w / w.sum())).sum(dim=-1).mean()
        vel = F.smooth_l1_loss(out.velocity.float(), targets["velocity"].float())
        total = (cfg.meta_loss_weight * meta + cfg.route_loss_weight * route + cfg.wp_loss_weight * wp
                 + cfg.velocity_loss_weight * vel)
        return {"loss": total, "meta": meta, "route": route, "waypoints": wp, "velocity": vel}

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """``loss(forward(batch), batch)``: the batch carries the targets too."""
        return self.loss(self(batch), batch)

    def understanding_lm_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """The VLM's next-token loss on U's text (``labels`` (B, L), ``IGNORE`` off the answer), with the same
        multimodal positions as the joint pass; for keeping general reasoning while fine-tuning."""
        if self.vlm is None:
            raise ConfigError("understanding_lm_loss needs the understanding expert (model.use_understanding=false)")
        if "labels" not in batch:
            raise ValueError("AutoMoT understanding_lm_loss: missing 'labels'")
        kw = vlm_inputs(self.vlm, batch["input_ids"], batch["attention_mask"], batch.get("pixel_values"),
                        batch.get("image_grid_thw"))
        return next_token_loss(self.vlm(**kw).logits, batch["labels"])


# -- the trained policy ------------------------------------------------------------------------------------------
STAGES = ("vla", "refiner")
UPSTREAM_VLM = "vlm"  # the export's transformers folder of the understanding expert


class DrivingVLA(PreTrainedModel):
    """The trained AutoMoT policy: the joint model (``mot``), its optional waypoint refiner (``refiner``), and
    the understanding expert's tokenizer / prompt / patching, built from a ``DrivingVLAConfig`` around the base VLM
    at ``config.base_path`` (``core.vlm.load_vlm``; none in the ``noreason`` arm).

    Training has two stages (``set_stage``): ``vla`` (the imitation objective of ``AutoMoT.loss``, plus
    ``lm_loss_weight`` x the understanding expert's next-token loss on the batch's ``lm_*`` reasoning text; the
    refiner frozen) and ``refiner`` (flow matching on the frozen VLA's features and coarse plan; everything else
    frozen and in eval mode). A folder written by ``save_pretrained`` stores ``trained_state_dict()``: everything
    but the VLM in the ``frozen`` arm (it is the base's, unchanged), everything in the other arms; it references
    the base folder (a shipped folder carries a copy in ``base/``).

    Args:
        config: The policy's config.
        base: ``(vlm, tokenizer)`` already loaded from ``config.base_path`` (default: loaded here).
    """

    config_class = DrivingVLAConfig
    method = "automot"
    base_fields = ("base_path",)

    def __init__(self, config: DrivingVLAConfig, base: tuple[nn.Module, Any] | None = None):
        from core.vlm import add_tokens, load_vlm, patch_spec_of
        from driving.automot.inputs import Prompter
        from driving.automot.refiner import RefinerConfig, WaypointRefiner

        super().__init__()
        self.config = config
        vlm = tok = None
        if config.mot.use_understanding:
            vlm, tok = base if base is not None else load_vlm(config.base_path, dtype=config.base_dtype)
            if config.added_tokens:  # the vocabulary the policy was trained with (a no-op where already added)
                add_tokens(vlm, tok, config.added_tokens)
                ids = [tok.convert_tokens_to_ids(t) for t in config.added_tokens]
                known = dict(zip(config.mot.meta_action_names, config.mot.meta_action_token_ids, strict=False))
                if any(known.get(t, i) != i for t, i in zip(config.added_tokens, ids, strict=True)):
                    raise CheckpointError(f"{config.base_path}: adding {config.added_tokens} to its tokenizer gives "
                                          f"ids {ids}, not the policy's meta_action_token_ids "
                                          f"{config.mot.meta_action_token_ids} (a different base?)")
        elif base is not None:
            raise ConfigError("DrivingVLA: the noreason arm has no understanding expert; pass no base")
        self.mot = AutoMoT(config.mot, vlm)
        self.tokenizer = tok
        self.spec = patch_spec_of(vlm, config.image_size) if vlm is not None else None
        self.prompter = Prompter(tok, self.spec.tokens_per_image, config.history) if vlm is not None else None
        self.refiner = WaypointRefiner(RefinerConfig.from_dict(config.refiner)) if config.refiner else None
        self.set_stage("vla")

    @classmethod
    def build_for_loading(cls, config: DrivingVLAConfig) -> DrivingVLA:
        """Around the base's architecture and tokenizer; in the ``automot`` arm without its weights (the folder
        stores every VLM tensor, fine-tuned)."""
        if config.arm == "automot":
            from core.vlm import load_vlm

            return cls(config, base=load_vlm(config.base_path, dtype=config.base_dtype, weights=False))
        return cls(config)

    def save_upstream(self, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, str]:
        """The understanding expert as a folder transformers opens (``save_pretrained``'s hook; see the README
        section "Opening the export with transformers + peft").

        ``automot``: ``vlm/``, the fine-tuned VLM (every weight trains, so there is no LoRA and no peft adapter)
        with its tokenizer (added tokens included) and image processor, written by transformers' own
        ``save_pretrained``: a second copy of ``model.safetensors``' ``mot.vlm.*`` tensors. ``frozen``: nothing
        new (the VLM is the base's, unchanged); the entry names the base. ``noreason``: no VLM, no entry. The
        action expert, the heads and the refiner are not a transformers / peft architecture and stay in
        ``model.safetensors`` only.
        """
        vlm = self.mot.vlm
        if vlm is None:
            return {}
        cls = f"transformers.{type(vlm).__name__}"
        rest = ("The action expert, its heads and the refiner are not transformers / peft modules and stay in "
                "model.safetensors only; the upstream model's hidden states are this policy's understanding stream.")
        if self.config.arm == "frozen" and not self.config.added_tokens:
            copied = (directory / "base").is_dir()
            where = "this folder's base/" if copied else str(Path(self.config.base_path).resolve())
            return {"base": f"{cls}.from_pretrained(<base>), <base> = {where}: the frozen understanding expert, "
                            f"the base unchanged (not copied again). {rest}"}
        from core.vlm import save_vlm

        sd = state_dict if state_dict is not None else self.state_dict()
        vlm_sd = {k.removeprefix("mot.vlm."): v for k, v in sd.items() if k.startswith("mot.vlm.")} or None
        save_vlm(directory / UPSTREAM_VLM, vlm, self.tokenizer, self.spec, state_dict=vlm_sd)
        what = "fine-tuned" if self.config.arm == "automot" else "frozen base with the added tokens"
        return {UPSTREAM_VLM: f"{cls}.from_pretrained('{UPSTREAM_VLM}') with AutoTokenizer / AutoImageProcessor "
                              f"from the same folder: the {what} understanding expert (no LoRA, so no peft adapter). "
                              f"{rest}"}

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything but the (frozen, unchanged) VLM in the ``frozen`` arm; everything otherwise."""
        state = self.state_dict()
        if self.config.arm == "frozen":
            return {k: v for k, v in state.items() if not k.startswith("mot.vlm.")}
        return state

    def set_stage(self, stage: str) -> None:
        """Which part trains: ``vla`` (the joint model, the VLM unless frozen) or ``refiner``."""
        if stage not in STAGES:
            raise ConfigError(f"DrivingVLA stage must be one of {STAGES}, got {stage!r}")
        if stage == "refiner" and self.refiner is None:
            raise ConfigError("DrivingVLA: no refiner to train (model.refiner_steps=0)")
        self.stage = stage
        self.mot.requires_grad_(stage == "vla")
        if self.mot.vlm is not None and self.config.mot.freeze_understanding:
            self.mot.vlm.requires_grad_(False)
        if self.refiner is not None:
            self.refiner.requires_grad_(stage == "refiner")
        self.train(self.training)

    def train(self, mode: bool = True) -> DrivingVLA:
        super().train(mode)
        if getattr(self, "stage", "vla") == "refiner":
            self.mot.eval()  # the refiner learns from the VLA as it runs at inference
        return self

    def fsdp_units(self) -> list[nn.Module]:
        """``AutoMoT.fsdp_units`` and the refiner's blocks."""
        return self.mot.fsdp_units() + (list(self.refiner.blocks) if self.refiner is not None else [])

    def checkpoint_units(self) -> list[nn.Module]:
        """``AutoMoT.checkpoint_units`` and the refiner's blocks (what ``enable_gradient_checkpointing`` wraps)."""
        return self.mot.checkpoint_units() + (list(self.refiner.blocks) if self.refiner is not None else [])

    def forward(self, batch: dict[str, Any]) -> AutoMoTOutput:
        """The joint model's output (``AutoMoT.forward``)."""
        return self.mot(batch)

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        if self.stage == "refiner":
            with torch.no_grad():
                out = self.mot(batch)
            return {"loss": self.refiner.loss(out.features, out.waypoints, batch["waypoints"])}
        losses = self.mot.loss(self.mot(batch), batch)
        if self.config.lm_loss_weight > 0 and "lm_input_ids" in batch:
            lm = self.mot.understanding_lm_loss({
                "input_ids": batch["lm_input_ids"], "attention_mask": batch["lm_attention_mask"],
                "labels": batch["lm_labels"], "pixel_values": batch["pixel_values"],
                "image_grid_thw": batch["image_grid_thw"]})
            losses["lm"] = lm
            losses["loss"] = losses["loss"] + self.config.lm_loss_weight * lm
        return losses


def tiny_config(**overrides: Any) -> AutoMoTModelConfig:
    """The tests' and smoke runs' AutoMoT (``model=automot_tiny``): a tiny Qwen2.5-VL-class understanding expert
    (``vlm`` sizes, pretrained a few steps into ``base_path`` on first use), a narrow action expert, a small refiner
    trained a few steps (``overrides`` replace fields)."""
    kw: dict[str, Any] = dict(
        base_path="outputs/automot/base_tiny", image_size=32,
        vlm=dict(family="qwen2_5_vl", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                 vision_depth=1, vision_hidden=32, vision_intermediate=64, vision_heads=2, patch_size=8,
                 merge_size=2),
        tokenizer_vocab=400, pretrain_steps=4, pretrain_batch=4,
        mot=dict(expert_hidden_size=32, expert_intermediate_size=64, n_reason=2, n_route=20, n_wp=6, bev_channels=6,
                 bev_patch=8, n_target=4, ego_dim=6),
        refiner=dict(hidden=32, layers=1, steps=2), refiner_steps=4)
    kw.update(overrides)
    return AutoMoTModelConfig(**kw)


def tiny_example(workdir: Path):
    """The contract test's ``ModelExample``: the ``automot`` arm (understanding expert fine-tuned, reasoning-text
    loss, a refiner) around a tiny Qwen2.5-VL base written once into ``workdir/base``."""
    from core.testing import ModelExample
    from core.vlm import VLMConfig, build_tokenizer, build_vlm, load_tokenizer, save_vlm
    from driving.automot.configuration_automot import META_ACTIONS, REASON_PROMPT

    base = (Path(workdir) / "base").resolve()
    sizes = dict(tiny_config().vlm)
    if not (base / "config.json").is_file():
        tok = build_tokenizer([REASON_PROMPT, "Follow the road. Turn left in 30 m.", *META_ACTIONS] * 4,
                              vocab_size=300)
        tok.add_tokens(list(META_ACTIONS))
        vcfg = VLMConfig(vocab_size=len(tok), **sizes)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            vlm = build_vlm(vcfg)
        save_vlm(base, vlm, tok, vcfg.patch_spec(32))
    tok = load_tokenizer(base)
    mot = AutoMoTConfig(expert_hidden_size=32, expert_intermediate_size=64, n_reason=2, n_route=4, n_wp=3,
                        n_target=2, ego_dim=6, bev_patch=8, wp_weights=[2.0, 1.0, 1.0],
                        meta_action_token_ids=[tok.convert_tokens_to_ids(m) for m in META_ACTIONS])
    config = DrivingVLAConfig(arm="automot", base_path=str(base), image_size=32, history=1, mot=mot,
                              refiner={"cond_dim": 3 * 32, "n_wp": 3, "hidden": 16, "layers": 1, "steps": 2},
                              lm_loss_weight=0.5)

    spec = VLMConfig(vocab_size=len(tok), **sizes).patch_spec(32)

    def batch(train: bool) -> dict[str, Any]:
        from driving.automot.inputs import Prompter, model_batch

        g = torch.Generator().manual_seed(0)
        s = {"images": torch.rand(2, 1, 3, 32, 64, generator=g),
             "bev": (torch.rand(2, 6, 16, 16, generator=g) > 0.8).float(),
             "target_points": torch.randn(2, 2, 2, generator=g) * 10, "ego": torch.randn(2, 6, generator=g),
             "instruction": ["Turn left in 30 m.", "Follow the road."]}
        if train:
            s.update(meta_action=torch.tensor([0, 2]), route=torch.randn(2, 4, 2, generator=g),
                     waypoints=torch.randn(2, 3, 2, generator=g).cumsum(1), velocity=torch.rand(2, generator=g) * 10)
        answers = ["slow_down: a car ahead", "keep_lane: the road is free"] if train else None
        return model_batch(s, Prompter(tok, spec.tokens_per_image, 1), spec,
                           questions=[REASON_PROMPT] * 2 if train else None, lm_answers=answers)

    return ModelExample(build=lambda: DrivingVLA(config), inputs=lambda: batch(False),
                        train_inputs=lambda: batch(True), run=lambda m, b: m(b))


__all__ = ["AutoMoT", "AutoMoTOutput", "DrivingVLA", "PrefixCache", "block_mask", "tiny_config", "tiny_example"]
