"""Icosphere grids: vertices, k-ring / k-NN neighbourhoods, pooling / unpooling, equirect <-> sphere sampling.

An icosphere of level ``l`` is the regular icosahedron subdivided ``l`` times (every triangle split into four
at its edge midpoints, new vertices pushed onto the unit sphere). It has ``N_l = 10 * 4**l + 2`` vertices
(12, 42, 162, 642, 2562, 10242, ...). Vertices of level ``l`` are the first ``N_l`` vertices of level
``l + 1`` (midpoints are appended), which is what pooling and unpooling rely on.

Directions are unit vectors in the panorama's camera frame with OpenCV axes (x right, y down, z forward),
the convention of ``core.data.panoramas`` (so "up" is ``-y``, latitude ``asin(-y)``, longitude
``atan2(x, z)``). The base icosahedron is placed with two vertices on the up / down axis.

Everything here is built once per (level, ...) in float64 numpy and cached; the torch side only gathers.
Neighbourhoods are stored as padded index tables ``(N, K)`` (``-1`` = padding, first column = the vertex
itself), so a vertex of valence 5 (the 12 original ones) simply has fewer neighbours.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from core.data.panoramas import direction_to_equirect, equirect_directions
from core.errors import ConfigError

__all__ = [
    "Icosphere",
    "SphereSampler",
    "icosahedral_rotations",
    "icosphere",
    "num_vertices",
    "rotate_equirect",
    "sample_equirect",
    "vertex_permutation",
]

MAX_LEVEL = 7


def num_vertices(level: int) -> int:
    """Number of vertices of the level-``level`` icosphere: ``10 * 4**level + 2``."""
    return 10 * 4**level + 2


def _base_icosahedron() -> tuple[np.ndarray, np.ndarray]:
    """12 unit vertices (two on the up / down axis -y / +y) and 20 outward-oriented faces."""
    z = 1.0 / math.sqrt(5.0)  # height of the two pentagon rings
    r = 2.0 / math.sqrt(5.0)  # their radius
    verts = [(0.0, -1.0, 0.0)]  # up (OpenCV: -y)
    for k in range(5):
        a = 2 * math.pi * k / 5
        verts.append((r * math.sin(a), -z, r * math.cos(a)))
    for k in range(5):
        a = 2 * math.pi * (k + 0.5) / 5
        verts.append((r * math.sin(a), z, r * math.cos(a)))
    verts.append((0.0, 1.0, 0.0))  # down
    v = np.asarray(verts, dtype=np.float64)
    faces = []
    for k in range(5):
        a, b = 1 + k, 1 + (k + 1) % 5
        c, d = 6 + k, 6 + (k + 1) % 5
        faces += [(0, a, b), (a, c, b), (b, c, d), (c, 11, d)]
    f = np.asarray(faces, dtype=np.int64)
    # orient every face outward (counter-clockwise seen from outside)
    n = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])
    flip = np.einsum("fc,fc->f", n, v[f].mean(1)) < 0
    f[flip] = f[flip][:, [0, 2, 1]]
    return v, f


@dataclass(frozen=True)
class Icosphere:
    """One subdivision level.

    Attributes:
        level: subdivision level ``l``.
        vertices: (N, 3) float64 unit directions (OpenCV camera frame).
        faces: (F, 3) int64 vertex indices, outward oriented, ``F = 20 * 4**l``.
        parents: (N, 2) int64: for a vertex created at this level the two endpoints of the edge it splits,
            for a vertex inherited from the coarser level itself twice.
    """

    level: int
    vertices: np.ndarray
    faces: np.ndarray
    parents: np.ndarray

    @property
    def n(self) -> int:
        return len(self.vertices)

    @functools.cached_property
    def edges(self) -> np.ndarray:
        """(E, 2) unique undirected edges, ``i < j``."""
        e = np.concatenate([self.faces[:, [0, 1]], self.faces[:, [1, 2]], self.faces[:, [2, 0]]])
        e = np.sort(e, axis=1)
        return np.unique(e, axis=0)

    def ring(self, k: int = 1) -> np.ndarray:
        """k-ring neighbourhoods: every vertex within ``k`` mesh edges, itself first.

        Returns:
            (N, K) int64, ``-1``-padded; ``K`` is the largest k-ring (7 / 19 / 37 for k = 1 / 2 / 3).
            Exactly equivariant under the icosahedral symmetries (a graph property of the mesh).
        """
        return _ring(self.level, k)

    def knn(self, k: int) -> np.ndarray:
        """The ``k`` nearest vertices by great-circle distance (itself first), (N, k) int64.

        Ties at the k-th distance are broken by index, so unlike ``ring`` this is not exactly
        equivariant under the icosahedral symmetries; use ``ring`` where equivariance is tested.
        """
        if not 1 <= k <= self.n:
            raise ConfigError(f"knn k must be in [1, {self.n}], got {k}")
        v = self.vertices
        out = np.empty((self.n, k), dtype=np.int64)
        for s in range(0, self.n, 4096):
            cos = v[s : s + 4096] @ v.T
            idx = np.argsort(-cos, axis=1, kind="stable")[:, :k]
            out[s : s + 4096] = idx
        return out

    def latlon(self) -> tuple[np.ndarray, np.ndarray]:
        """Latitude (up = +pi/2) and longitude in [-pi, pi) of every vertex, radians, (N,) each."""
        v = self.vertices
        return np.arcsin(np.clip(-v[:, 1], -1, 1)), np.arctan2(v[:, 0], v[:, 2])


@functools.cache
def icosphere(level: int) -> Icosphere:
    """The level-``level`` icosphere (cached)."""
    if not 0 <= level <= MAX_LEVEL:
        raise ConfigError(f"icosphere level must be in [0, {MAX_LEVEL}], got {level}")
    if level == 0:
        v, f = _base_icosahedron()
        return Icosphere(0, v, f, np.repeat(np.arange(12)[:, None], 2, axis=1))
    coarse = icosphere(level - 1)
    v = [coarse.vertices]
    parents = [np.repeat(np.arange(coarse.n)[:, None], 2, axis=1)]
    edges = coarse.edges
    mid = coarse.vertices[edges[:, 0]] + coarse.vertices[edges[:, 1]]
    v.append(mid / np.linalg.norm(mid, axis=1, keepdims=True))
    parents.append(edges)
    lookup = {(int(a), int(b)): coarse.n + i for i, (a, b) in enumerate(edges)}

    def m(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.array([lookup[(min(x, y), max(x, y))] for x, y in zip(a.tolist(), b.tolist(), strict=True)])

    f = coarse.faces
    a, b, c = f[:, 0], f[:, 1], f[:, 2]
    ab, bc, ca = m(a, b), m(b, c), m(c, a)
    faces = np.concatenate([np.stack(t, 1) for t in ((a, ab, ca), (ab, b, bc), (ca, bc, c), (ab, bc, ca))])
    return Icosphere(level, np.concatenate(v), faces, np.concatenate(parents))


@functools.cache
def _adjacency_lists(level: int) -> tuple[tuple[int, ...], ...]:
    sphere = icosphere(level)
    nbrs: list[set[int]] = [set() for _ in range(sphere.n)]
    for i, j in sphere.edges.tolist():
        nbrs[i].add(j)
        nbrs[j].add(i)
    return tuple(tuple(sorted(s)) for s in nbrs)


@functools.cache
def _ring(level: int, k: int) -> np.ndarray:
    if k < 0:
        raise ConfigError(f"ring size must be >= 0, got {k}")
    adj = _adjacency_lists(level)
    rings = []
    for i in range(len(adj)):
        seen, frontier = [i], [i]
        members = {i}
        for _ in range(k):
            nxt = []
            for u in frontier:
                for w in adj[u]:
                    if w not in members:
                        members.add(w)
                        nxt.append(w)
            seen += sorted(nxt)
            frontier = nxt
        rings.append(seen)
    width = max(map(len, rings))
    out = np.full((len(rings), width), -1, dtype=np.int64)
    for i, r in enumerate(rings):
        out[i, : len(r)] = r
    out.setflags(write=False)
    return out


@functools.cache
def pool_table(level: int) -> tuple[np.ndarray, np.ndarray]:
    """Average pooling level ``level`` -> ``level - 1``: coarse vertex i averages its fine 1-ring.

    Returns:
        index (N_{l-1}, 7) int64 into level-``l`` vertices (``-1`` padded) and weights (N_{l-1}, 7) float32
        (uniform over the valid entries, summing to 1).
    """
    if level < 1:
        raise ConfigError(f"cannot pool below level 0 (got level {level})")
    idx = _ring(level, 1)[: num_vertices(level - 1)]
    valid = idx >= 0
    w = valid / valid.sum(1, keepdims=True)
    return idx, w.astype(np.float32)


@functools.cache
def unpool_table(level: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear unpooling level ``level - 1`` -> ``level``: inherited vertices copy, midpoints average parents.

    Returns:
        index (N_l, 2) int64 into level-``l - 1`` vertices and weights (N_l, 2) float32 (0.5 each).
    """
    if level < 1:
        raise ConfigError(f"cannot unpool to level {level}")
    return icosphere(level).parents, np.full((num_vertices(level), 2), 0.5, dtype=np.float32)


def gather_neighbours(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[..., index, :]`` with padding (``-1``) rows reading vertex 0 (mask them yourself).

    Args:
        x: (B, N, C) features on a grid of N vertices.
        index: (M, K) int64 neighbour table.

    Returns:
        (B, M, K, C).
    """
    m, k = index.shape
    flat = index.clamp_min(0).reshape(-1)
    return x.index_select(1, flat).reshape(x.shape[0], m, k, x.shape[-1])


def apply_table(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted gather ``out[:, i] = sum_k weight[i, k] * x[:, index[i, k]]`` (pool / unpool).

    Args:
        x: (B, N, C). index: (M, K) int64 (``-1`` padded, weight 0 there). weight: (M, K) float.

    Returns:
        (B, M, C).
    """
    return torch.einsum("bmkc,mk->bmc", gather_neighbours(x, index), weight.to(x.dtype))


# ---------------------------------------------------------------------------------------- symmetries
@functools.cache
def icosahedral_rotations() -> np.ndarray:
    """The 60 rotations of the icosahedron (the base icosphere's vertex set maps onto itself).

    Returns:
        (60, 3, 3) float64 rotation matrices, the identity first.
    """
    v = icosphere(0).vertices
    nb = _adjacency_lists(0)
    a0, b0 = 0, nb[0][0]
    src = _frame(v[a0], v[b0])
    mats = []
    for a in range(12):
        for b in nb[a]:
            mats.append(_frame(v[a], v[b]) @ src.T)
    mats = np.stack(mats)
    ident = np.argmin(np.abs(mats - np.eye(3)).sum((1, 2)))
    order = [int(ident)] + [i for i in range(60) if i != ident]
    return mats[order]


def _frame(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    e1 = a / np.linalg.norm(a)
    e2 = b - (b @ e1) * e1
    e2 /= np.linalg.norm(e2)
    return np.stack([e1, e2, np.cross(e1, e2)], axis=1)


def vertex_permutation(rotation: np.ndarray, level: int, tol: float = 1e-6) -> np.ndarray:
    """The vertex permutation ``perm`` with ``R u_i = u_{perm[i]}`` for an icosahedral rotation ``R``.

    Raises:
        ValueError: when ``R`` does not map the grid onto itself (within ``tol``).
    """
    v = icosphere(level).vertices
    rv = v @ np.asarray(rotation, dtype=np.float64).T
    cos = rv @ v.T
    perm = np.argmax(cos, axis=1)
    if np.abs(1 - cos[np.arange(len(v)), perm]).max() > tol or len(np.unique(perm)) != len(v):
        raise ValueError("rotation does not permute the icosphere vertices")
    return perm


# ------------------------------------------------------------------------------------ equirect <-> sphere
def sample_equirect(image: torch.Tensor, dirs: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """Sample equirectangular images at unit directions (``core.data.panoramas`` convention).

    Longitude wraps around; latitude is clamped at the poles.

    Args:
        image: (B, C, H, W) float (any range); integer labels need ``mode="nearest"`` (cast to float).
        dirs: (N, 3) or (B, N, 3) directions (camera frame, OpenCV axes).
        mode: ``"bilinear"`` or ``"nearest"``.

    Returns:
        (B, N, C) samples, same dtype as ``image``.
    """
    b, c, h, w = image.shape
    if dirs.dim() == 2:
        dirs = dirs.unsqueeze(0).expand(b, -1, -1)
    u, v = direction_to_equirect(dirs.to(torch.float32), w, h)  # (B, N) continuous pixel coords
    padded = torch.cat([image[..., -1:], image, image[..., :1]], dim=-1)  # wrap one column each side
    # pixel centre x of the padded image lies at x + 1; grid_sample(align_corners=True) maps -1..1 to 0..W+1
    gx = (u + 1.0) / (w + 1) * 2 - 1
    gy = v.clamp(0, h - 1) / max(h - 1, 1) * 2 - 1
    grid = torch.stack([gx, gy], dim=-1).unsqueeze(1)  # (B, 1, N, 2)
    out = F.grid_sample(padded, grid.to(image.dtype), mode=mode, padding_mode="border", align_corners=True)
    return out[:, :, 0].transpose(1, 2)  # (B, N, C)


def rotate_equirect(image: torch.Tensor, rotation: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """Rotate panoramas about the camera centre: ``out(d) = image(R^T d)`` (resampled).

    Args:
        image: (B, C, H, W) float. rotation: (3, 3) or (B, 3, 3) rotation(s) in the camera frame.
        mode: ``"bilinear"`` (RGB, depth far from edges) or ``"nearest"`` (labels, depth).

    Returns:
        (B, C, H, W).
    """
    b, c, h, w = image.shape
    d = equirect_directions(h, w, device=image.device).reshape(1, -1, 3).expand(b, -1, -1)
    r = rotation.to(d).expand(b, 3, 3) if rotation.dim() == 2 else rotation.to(d)
    src = d @ r  # row vectors: (R^T d)^T = d^T R
    return sample_equirect(image, src, mode).transpose(1, 2).reshape(b, c, h, w)


class SphereSampler:
    """Barycentric interpolation from icosphere vertices back to an equirectangular grid.

    For every pixel centre the containing triangle (among the faces around its nearest vertex) and the
    barycentric weights of the gnomonic projection onto it are found once per (level, H, W) and cached.
    """

    def __init__(self, level: int, height: int, width: int):
        self.level, self.height, self.width = level, height, width
        self.index, self.weight = _barycentric_table(level, height, width)
        self._tensors: dict[tuple, torch.Tensor] = {}  # device copies of the tables, built on first use

    def _tensor(self, name: str, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
        key = (name, device, dtype)
        if key not in self._tensors:
            table = {"index": self.index, "weight": self.weight, "argmax": self.weight.argmax(1)}[name]
            with torch.inference_mode(False):  # usable by a later autograd forward
                self._tensors[key] = torch.as_tensor(table, device=device, dtype=dtype)
        return self._tensors[key]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) vertex values -> (B, C, H, W) panorama."""
        idx = self._tensor("index", x.device)
        w = self._tensor("weight", x.device, x.dtype)
        out = apply_table(x, idx, w)  # (B, H*W, C)
        return out.transpose(1, 2).reshape(x.shape[0], x.shape[-1], self.height, self.width)

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, ...) vertex values (e.g. labels) -> (B, ..., H, W) of the nearest-weight vertex."""
        idx = self._tensor("index", x.device)
        best = self._tensor("argmax", x.device)
        pick = idx.gather(1, best[:, None])[:, 0]  # (H*W,)
        out = x.index_select(1, pick)  # (B, H*W, ...)
        out = out.reshape(x.shape[0], self.height, self.width, *x.shape[2:])
        return out.permute(0, *range(3, out.dim()), 1, 2) if out.dim() > 3 else out


@functools.lru_cache(maxsize=16)
def _barycentric_table(level: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    sphere = icosphere(level)
    v, faces = sphere.vertices, sphere.faces
    d = equirect_directions(height, width, dtype=torch.float64).reshape(-1, 3).numpy()
    nearest = np.empty(len(d), dtype=np.int64)
    for s in range(0, len(d), 2048):
        nearest[s : s + 2048] = np.argmax(d[s : s + 2048] @ v.T, axis=1)
    # faces incident to every vertex (5 or 6), padded with the first one
    inc: list[list[int]] = [[] for _ in range(sphere.n)]
    for fi, f in enumerate(faces.tolist()):
        for vi in f:
            inc[vi].append(fi)
    inc_arr = np.array([r + [r[0]] * (6 - len(r)) for r in inc], dtype=np.int64)  # (N, 6)
    cand = faces[inc_arr[nearest]]  # (P, 6, 3)
    tri = v[cand]  # (P, 6, 3 verts, 3 xyz)
    # solve d = sum_k a_k v_k for each candidate triangle, then normalise a to sum 1 (gnomonic projection)
    mat = np.transpose(tri, (0, 1, 3, 2))  # columns are the vertices
    a = np.linalg.solve(mat, np.broadcast_to(d[:, None, :, None], (*mat.shape[:2], 3, 1)))[..., 0]
    a = a / a.sum(-1, keepdims=True)
    best = np.argmax(a.min(-1), axis=1)  # the containing triangle has all weights >= 0
    rows = np.arange(len(d))
    return cand[rows, best], a[rows, best].astype(np.float32)
