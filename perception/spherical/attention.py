"""SoLA attention (softmax and linear variants), an explicit gather reference, and the LPE baseline.

Paper: "SoLA: Spherical SO(3)-Equivariant Local Attention" (ICML 2026); no official code. Reading of the
abstract used here (the most consistent one; recorded as such): queries and keys are lifted with an outer
product with the 4-d direction vector ``a(u) = [sqrt(b), sqrt(w) u_x, sqrt(w) u_y, sqrt(w) u_z]``::

    q~_i = q_i (x) a(u_i),  k~_j = k_j (x) a(u_j)    =>   <q~_i, k~_j> = <q_i, k_j> (b + w cos(theta_ij))

so the similarity is content affinity times a function of the great-circle distance only, unchanged by
any global rotation (``u -> R u``). ``b`` and ``w`` are learned per head (kept >= 0 through a softplus).

Variants (tokens are icosphere vertices; neighbourhood ``N(i)`` a padded index table, self included):
    softmax   ``o_i = sum_{j in N(i)} softmax_j(<q~_i, k~_j> / sqrt(d)) v_j``
    linear    positive feature map ``phi = elu + 1`` on q and k, then per node
              ``S~_i = sum_{j in N(i)} k~_j v_j^T`` and ``z~_i = sum_{j in N(i)} k~_j`` by key-value
              aggregation over the adjacency A (no per-query gather of neighbours), and
              ``o_i = q~_i^T S~_i / (q~_i^T z~_i)``. ``b + w cos(theta) > 0`` on local neighbourhoods keeps
              the denominator positive. Computed without the lift: ``q~_i^T S~_i = q_i^T S_i`` with
              ``S_i = sum_j (b + w u_i . u_j) k_j v_j^T``, one sparse product of the direction-weighted
              adjacency with ``[k v^T | k]`` per head (``sola_linear_attention``; same numbers).
    lpe       the baseline: plain content attention ``<q_i, k_j> / sqrt(d)`` plus a relative position bias
              ``MLP(dphi, dtheta)`` (longitude / latitude differences) and an absolute latitude embedding
              added to the tokens before q / k, as in SphereUFormer. Both depend on where the token is on
              the sphere, which breaks rotation equivariance.

Tensors: features ``(B, N, C)``; per-head ``(B, h, N, d)``; directions ``(N, 3)`` unit vectors in the
panorama camera frame (OpenCV axes, ``core.data.panoramas``).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from perception.spherical.icosphere import gather_neighbours, icosphere

__all__ = [
    "LPEAttention",
    "SoLAAttention",
    "SphereGrid",
    "direction_lift",
    "linear_attention_gather",
    "sola_linear_attention",
    "sola_softmax_attention",
]


class SphereGrid(nn.Module):
    """Geometry of one icosphere level as (non-persistent) buffers: rebuilt, never checkpointed.

    Buffers: ``dirs`` (N, 3) float32, ``index`` (N, K) int64 ``-1``-padded ``ring``-neighbourhoods,
    ``mask`` (N, K) bool (True = real neighbour), ``latlon`` (N, 2) float32 radians.

    Fixed per-level geometry used in every forward (``cos`` of neighbour angles, the LPE latitude features
    and relative offsets, the sparse ``adjacency``) is computed once on first use and cached per (device,
    dtype) of the buffers, outside the state dict (so ``.to()`` / ``.double()`` just build a new entry).
    """

    def __init__(self, level: int, ring: int = 1):
        super().__init__()
        sphere = icosphere(level)
        self.level, self.ring, self.n = level, ring, sphere.n
        index = torch.as_tensor(sphere.ring(ring).copy())
        lat, lon = sphere.latlon()
        self.register_buffer("dirs", torch.as_tensor(sphere.vertices, dtype=torch.float32), persistent=False)
        self.register_buffer("index", index, persistent=False)
        self.register_buffer("mask", index >= 0, persistent=False)
        self.register_buffer("latlon", torch.as_tensor(list(zip(lat, lon, strict=True)), dtype=torch.float32),
                             persistent=False)
        # mean angle between mesh neighbours: the unit the LPE baseline measures offsets in
        e = sphere.edges
        self.spacing = float(torch.as_tensor((sphere.vertices[e[:, 0]] * sphere.vertices[e[:, 1]]).sum(1))
                             .clamp(-1, 1).acos().mean())
        self._adjacency: dict[torch.device, torch.Tensor] = {}
        self._geometry: dict[tuple, torch.Tensor] = {}

    def _cached(self, key: tuple, build) -> torch.Tensor:
        full = (*key, self.dirs.device, self.dirs.dtype)
        if full not in self._geometry:
            # normal (non-inference) tensors even when first built under inference_mode: a later training
            # forward saves them for backward
            with torch.inference_mode(False), torch.no_grad():
                self._geometry[full] = build()
        return self._geometry[full]

    def cos(self) -> torch.Tensor:
        """(N, K) ``u_i . u_j`` for every neighbour slot (padding slots read neighbour 0)."""
        return self._cached(("cos",), lambda: (self.dirs[:, None, :] * self.dirs[self.index.clamp_min(0)]).sum(-1))

    def lat_features(self, freqs: int) -> torch.Tensor:
        """(N, 2 freqs) ``[sin(k lat), cos(k lat)]`` for ``k = 1..freqs`` (the LPE latitude embedding input)."""
        def build() -> torch.Tensor:
            lat = self.latlon[:, 0]
            f = torch.arange(1, freqs + 1, device=lat.device, dtype=lat.dtype)
            return torch.cat([torch.sin(lat[:, None] * f), torch.cos(lat[:, None] * f)], -1)
        return self._cached(("lat", freqs), build)

    def rel_offsets(self) -> torch.Tensor:
        """(N, K, 2) wrapped longitude / latitude differences to each neighbour, in units of ``spacing``."""
        def build() -> torch.Tensor:
            lat, lon = self.latlon[:, 0], self.latlon[:, 1]
            idx = self.index.clamp_min(0)
            dphi = torch.remainder(lon[idx] - lon[:, None] + math.pi, 2 * math.pi) - math.pi  # (N, K)
            dtheta = lat[idx] - lat[:, None]
            return torch.stack([dphi, dtheta], -1) / self.spacing
        return self._cached(("rel",), build)

    def edge_cos(self) -> torch.Tensor:
        """(E,) ``u_i . u_j`` for every stored entry ``(i, j)`` of ``adjacency()``, in its row-major order."""
        def build() -> torch.Tensor:
            rows, cols = self.adjacency().indices().to(self.dirs.device)
            return (self.dirs[rows] * self.dirs[cols]).sum(-1)
        return self._cached(("edge_cos",), build)

    def adjacency(self) -> torch.Tensor:
        """(N, N) sparse COO 0/1 matrix, ``A[i, j] = 1`` iff ``j in N(i)`` (cached per device)."""
        dev = self.index.device
        if dev not in self._adjacency:
            with torch.inference_mode(False), torch.no_grad():
                self._adjacency[dev] = self._build_adjacency(dev)
        return self._adjacency[dev]

    def _build_adjacency(self, dev: torch.device) -> torch.Tensor:
        rows = torch.arange(self.n, device=dev)[:, None].expand_as(self.index)[self.mask]
        cols = self.index[self.mask]
        vals = torch.ones(len(rows), device=dev)
        return torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (self.n, self.n),
                                       check_invariants=False).coalesce()


# ------------------------------------------------------------------------------------------ functional
def direction_lift(x: torch.Tensor, dirs: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x (x) a(u)`` with ``a(u) = [sqrt(b), sqrt(w) u]``.

    Args:
        x: (B, h, N, d) queries or keys. dirs: (N, 3) unit directions. b, w: (h,) non-negative.

    Returns:
        (B, h, N, 4 d): the flattened outer product, ``d``-major (entry ``c * 4 + m`` is ``x_c a_m``).
    """
    sb, sw = b.clamp_min(0).sqrt(), w.clamp_min(0).sqrt()
    a = torch.cat([sb[:, None, None].expand(-1, dirs.shape[0], 1), sw[:, None, None] * dirs[None]], dim=-1)
    return (x.unsqueeze(-1) * a[None, :, :, None, :].to(x.dtype)).flatten(-2)  # (B, h, N, d, 4) -> (B, h, N, 4d)


def _gather_heads(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, h, N, K, d) neighbours along the token axis."""
    bsz, h, n, d = x.shape
    return gather_neighbours(x.reshape(bsz * h, n, d), index).reshape(bsz, h, n, index.shape[1], d)


def sola_softmax_attention(q, k, v, dirs, index, mask, b, w, lifted: bool = False,
                           cos: torch.Tensor | None = None) -> torch.Tensor:
    """SoLA with a local softmax.

    Args:
        q, k, v: (B, h, N, d). dirs: (N, 3). index / mask: (N, K) neighbour table and validity.
        b, w: (h,) modulation ``b + w cos(theta)``.
        lifted: score with the explicit 4d lift ``<q~_i, k~_j>``; by default the identical factorised form
            ``<q_i, k_j> (b + w u_i . u_j)`` is used (4x less memory; tested equal).
        cos: optional precomputed (N, K) ``u_i . u_j`` (``SphereGrid.cos()``); computed from ``dirs`` if None.

    Returns:
        (B, h, N, d).
    """
    if lifted:
        qt, kt = direction_lift(q, dirs, b, w), direction_lift(k, dirs, b, w)
        scores = torch.einsum("bhnc,bhnkc->bhnk", qt, _gather_heads(kt, index))
    else:  # the same numbers without materialising the 4d lift: <q~_i, k~_j> = <q_i, k_j> (b + w cos)
        if cos is None:
            cos = (dirs[:, None, :] * dirs[index.clamp_min(0)]).sum(-1)  # (N, K)
        mod = b.clamp_min(0)[:, None, None] + w.clamp_min(0)[:, None, None] * cos  # (h, N, K)
        scores = torch.einsum("bhnc,bhnkc->bhnk", q, _gather_heads(k, index)) * mod.to(q.dtype)
    scores = (scores / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    attn = scores.softmax(-1)
    return torch.einsum("bhnk,bhnkc->bhnc", attn, _gather_heads(v, index))


def _positive(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1.0


def _csr_parts(adjacency: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(crow (N+1,), col (E,), row (E,), values (E,))`` of a sparse COO (coalesced) or CSR (N, N) matrix."""
    n = adjacency.shape[0]
    if adjacency.layout == torch.sparse_csr:
        crow, col = adjacency.crow_indices(), adjacency.col_indices()
        row = torch.repeat_interleave(torch.arange(n, device=crow.device), crow.diff())
        return crow, col, row, adjacency.values()
    if adjacency.layout != torch.sparse_coo:
        raise ValueError(f"adjacency must be a sparse COO or CSR matrix, got layout {adjacency.layout}")
    adj = adjacency if adjacency.is_coalesced() else adjacency.coalesce()
    row, col = adj.indices()
    crow = torch.zeros(n + 1, dtype=row.dtype, device=row.device)
    crow[1:] = torch.bincount(row, minlength=n).cumsum(0)
    return crow, col, row, adj.values()


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the kernels used here are stable
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def sola_linear_attention(q, k, v, dirs, adjacency, b, w, eps: float = 1e-6,
                          edge_cos: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax-free SoLA by key-value aggregation: one sparse product per head, no per-query neighbour gather.

    The lifted state ``S~_i = sum_{j in N(i)} k~_j v_j^T`` (4d x d) is only ever used contracted with
    ``q~_i = q_i (x) a(u_i)``, and ``q~_i^T k~_j = (q_i . k_j)(a(u_i) . a(u_j))``
    ``= (q_i . k_j)(b + w u_i . u_j)``: the direction part folds into the edge weights of the adjacency and
    the aggregated state is d x d:
    ``S_i = sum_j W_ij k_j v_j^T``, ``z_i = sum_j W_ij k_j`` with ``W_ij = A_ij (b + w u_i . u_j)``, and
    ``o_i = q_i^T S_i / (q_i^T z_i + eps)`` — the same numbers as the lifted form (tested against
    ``linear_attention_gather``), computed as one CSR sparse-dense product ``W @ [k v^T | k]`` per head on
    node-major (N, B (d^2 + d)) features: no lifted keys, no permuted copies, no neighbour gather.

    Arithmetic per edge and head: d^2 + d multiply-adds (272 at d = 16) in the aggregation, against
    4 d^2 + 4 d (1088) for the lifted ``A @ [k~ v^T | k~]`` and 4 d + d (80) for the explicit gather; per
    node d^2 (outer product) + d^2 + d (contraction). Memory: O(N B (d^2 + d)) per head at a time, whatever
    K is.

    When ``b`` or ``w`` need gradients the per-head weighted matrix is replaced by the two constant matrices
    ``[A; A cos]`` (one stacked product, twice the aggregation work) so that autograd never differentiates
    through sparse values (torch's CSR value gradient is dense N x N).

    Args:
        q, k, v: (B, h, N, d) float. dirs: (N, 3) unit directions. adjacency: (N, N) sparse COO or CSR,
            ``A_ij`` the weight of key j for query i (0/1 from ``SphereGrid.adjacency``).
        b, w: (h,) modulation (clamped to >= 0). eps: added to the normaliser.
        edge_cos: optional (E,) ``u_i . u_j`` per stored entry of ``adjacency`` in its row-major order
            (``SphereGrid.edge_cos()``, cached); computed from ``dirs`` when None.

    Returns:
        (B, h, N, d) in the dtype of ``v`` (half / bf16 inputs are aggregated in float32: CPU sparse products
        have no half kernels).
    """
    # Under autocast the sparse products would be cast back to bf16 / fp16, which CPU CSR kernels do not have
    # (addmm_out_sparse_csr_impl_mkl): the aggregation runs in float32 with autocast off.
    with torch.autocast(device_type=v.device.type, enabled=False):
        return _linear_attention(q, k, v, dirs, adjacency, b, w, eps, edge_cos)


def _linear_attention(q, k, v, dirs, adjacency, b, w, eps, edge_cos) -> torch.Tensor:
    bsz, h, n, d = v.shape
    dt = torch.float32 if v.dtype in (torch.bfloat16, torch.float16) else v.dtype
    crow, col, row, val = _csr_parts(adjacency)
    val = val.to(dt)
    cos = ((dirs[row] * dirs[col]).sum(-1) if edge_cos is None else edge_cos).to(dt)  # (E,) u_i . u_j
    bb, ww = b.clamp_min(0).to(dt), w.clamp_min(0).to(dt)
    qp, kp, vv = _positive(q).to(dt), _positive(k).to(dt), v.to(dt)
    learn_bw = torch.is_grad_enabled() and (b.requires_grad or w.requires_grad)
    if learn_bw:  # constant [A; A cos] (2N, N): gradients reach b, w through the dense combination below
        e = col.numel()
        stacked = _csr(torch.cat([crow, crow[1:] + e]), torch.cat([col, col]), torch.cat([val, val * cos]),
                       (2 * n, n))
    outs = []
    for i in range(h):
        kn, vn = kp[:, i].transpose(0, 1), vv[:, i].transpose(0, 1)  # (N, B, d) views
        kv = (kn.unsqueeze(-1) * vn.unsqueeze(-2)).reshape(n, bsz * d * d)
        feats = torch.cat([kv, kn.reshape(n, bsz * d)], dim=1)  # (N, B d^2 + B d): [k v^T | k], node-major
        if learn_bw:
            t = torch.sparse.mm(stacked, feats)
            agg = bb[i] * t[:n] + ww[i] * t[n:]
        else:
            agg = torch.sparse.mm(_csr(crow, col, val * (bb[i] + ww[i] * cos), (n, n)), feats)
        s = agg[:, : bsz * d * d].view(n, bsz, d, d)
        z = agg[:, bsz * d * d :].view(n, bsz, d, 1)
        qn = qp[:, i].transpose(0, 1).unsqueeze(-2)  # (N, B, 1, d)
        num, den = (qn @ s).squeeze(-2), (qn @ z).squeeze(-1)  # (N, B, d), (N, B, 1)
        outs.append((num / (den + eps)).transpose(0, 1))
    return torch.stack(outs, dim=1).to(v.dtype)


def linear_attention_gather(q, k, v, dirs, index, mask, b, w, eps: float = 1e-6) -> torch.Tensor:
    """Reference for ``sola_linear_attention``: gather every query's neighbours explicitly.

    ``o_i = sum_j <q~_i, k~_j> v_j / (sum_j <q~_i, k~_j> + eps)`` over ``j in N(i)``; same shapes.
    """
    qt, kt = direction_lift(_positive(q), dirs, b, w), direction_lift(_positive(k), dirs, b, w)
    sims = torch.einsum("bhnc,bhnkc->bhnk", qt, _gather_heads(kt, index)) * mask
    num = torch.einsum("bhnk,bhnkc->bhnc", sims, _gather_heads(v, index))
    return num / (sims.sum(-1, keepdim=True) + eps)


# ------------------------------------------------------------------------------------------ modules
def _inv_softplus(y: float) -> float:
    return math.log(math.expm1(y)) if y > 0 else -20.0


class SoLAAttention(nn.Module):
    """Multi-head SoLA on one icosphere level; ``forward(x (B, N, C), grid) -> (B, N, C)``.

    Args:
        dim: channels C. head_dim: channels per head (``C // head_dim`` heads).
        variant: ``"softmax"`` or ``"linear"``. b_init, w_init: initial ``b``, ``w`` (every head).
        learn_bw: learn ``b``, ``w`` per head (else fixed buffers).
    """

    def __init__(self, dim: int, head_dim: int = 16, variant: str = "softmax", b_init: float = 1.0,
                 w_init: float = 1.0, learn_bw: bool = True):
        super().__init__()
        if variant not in ("softmax", "linear"):
            raise ValueError(f"variant must be softmax or linear, got {variant!r}")
        self.heads, self.head_dim, self.variant = dim // head_dim, head_dim, variant
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        raw = torch.tensor([[_inv_softplus(b_init)], [_inv_softplus(w_init)]]).expand(2, self.heads).clone()
        if learn_bw:
            self.bw_raw = nn.Parameter(raw)
        else:
            self.register_buffer("bw_raw", raw)

    def modulation(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head ``(b, w)``, each (h,) >= 0."""
        bw = F.softplus(self.bw_raw)
        return bw[0], bw[1]

    def forward(self, x: torch.Tensor, grid: SphereGrid) -> torch.Tensor:
        bsz, n, c = x.shape
        q, k, v = self.qkv(x).reshape(bsz, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B,h,N,d)
        b, w = self.modulation()
        if self.variant == "softmax":
            o = sola_softmax_attention(q, k, v, grid.dirs, grid.index, grid.mask, b, w, cos=grid.cos())
        else:
            o = sola_linear_attention(q, k, v, grid.dirs, grid.adjacency(), b, w, edge_cos=grid.edge_cos())
        return self.proj(o.transpose(1, 2).reshape(bsz, n, c))


class LPEAttention(nn.Module):
    """SphereUFormer-style local softmax attention with location-dependent positional embeddings.

    ``scores_ij = <q_i, k_j> / sqrt(d) + MLP(dphi_ij, dtheta_ij)[head]`` with ``dphi`` the wrapped longitude
    difference and ``dtheta`` the latitude difference (both in units of the level's mean neighbour spacing),
    and q / k computed from ``x + E(lat)`` (a sinusoidal latitude embedding through a linear layer).
    """

    def __init__(self, dim: int, head_dim: int = 16, hidden: int = 32, lat_freqs: int = 4):
        super().__init__()
        self.heads, self.head_dim, self.lat_freqs = dim // head_dim, head_dim, lat_freqs
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.rel_bias = nn.Sequential(nn.Linear(2, hidden), nn.GELU(), nn.Linear(hidden, self.heads))
        self.lat_embed = nn.Linear(2 * lat_freqs, dim)

    def forward(self, x: torch.Tensor, grid: SphereGrid) -> torch.Tensor:
        bsz, n, c = x.shape
        emb = self.lat_embed(grid.lat_features(self.lat_freqs).to(x.dtype))
        qk = F.linear(x + emb, self.qkv.weight[: 2 * c], self.qkv.bias[: 2 * c])
        v = F.linear(x, self.qkv.weight[2 * c :], self.qkv.bias[2 * c :])
        q, k = qk.reshape(bsz, n, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        v = v.reshape(bsz, n, self.heads, self.head_dim).transpose(1, 2)
        bias = self.rel_bias(grid.rel_offsets().to(x.dtype)).permute(2, 0, 1)  # (h, N, K)
        scores = torch.einsum("bhnc,bhnkc->bhnk", q, _gather_heads(k, grid.index)) / math.sqrt(self.head_dim)
        scores = (scores + bias).masked_fill(~grid.mask, float("-inf"))
        o = torch.einsum("bhnk,bhnkc->bhnc", scores.softmax(-1), _gather_heads(v, grid.index))
        return self.proj(o.transpose(1, 2).reshape(bsz, n, c))
