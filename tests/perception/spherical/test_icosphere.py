"""Icosphere grids, neighbourhoods, pooling and equirect <-> sphere sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.data.panoramas import equirect_directions
from core.errors import ConfigError
from perception.spherical.icosphere import (
    SphereSampler,
    apply_table,
    icosahedral_rotations,
    icosphere,
    num_vertices,
    pool_table,
    rotate_equirect,
    sample_equirect,
    unpool_table,
    vertex_permutation,
)


def smooth(d: torch.Tensor) -> torch.Tensor:
    """A smooth function on the sphere (degree <= 2 polynomial of the direction)."""
    x, y, z = d.unbind(-1)
    return 0.5 + 0.3 * x - 0.2 * y * z + 0.15 * z * z - 0.1 * x * y


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_grid_counts_nesting_and_valence(level):
    s = icosphere(level)
    assert s.n == num_vertices(level) and len(s.faces) == 20 * 4**level
    np.testing.assert_allclose(np.linalg.norm(s.vertices, axis=1), 1.0, atol=1e-12)
    if level:
        np.testing.assert_array_equal(s.vertices[: num_vertices(level - 1)], icosphere(level - 1).vertices)
    valence = (s.ring(1) >= 0).sum(1) - 1
    assert (valence[:12] == 5).all() and (valence[12:] == 6).all()
    assert (s.ring(1)[:, 0] == np.arange(s.n)).all()  # itself first


def test_knn_is_sorted_by_great_circle_distance():
    s = icosphere(2)
    idx = s.knn(7)
    cos = np.einsum("nc,nkc->nk", s.vertices, s.vertices[idx])
    assert (idx[:, 0] == np.arange(s.n)).all() and (np.diff(cos, axis=1) <= 1e-12).all()
    with pytest.raises(ConfigError):
        s.knn(0)


def test_pool_and_unpool_preserve_constants_and_interpolate_linear_functions():
    x = torch.full((1, num_vertices(3), 2), 2.5)
    pooled = apply_table(x, *(torch.tensor(t) for t in pool_table(3)))
    assert pooled.shape == (1, num_vertices(2), 2) and torch.allclose(pooled, torch.full_like(pooled, 2.5))
    coarse = torch.as_tensor(icosphere(2).vertices, dtype=torch.float32)[None]
    up = apply_table(coarse, *(torch.tensor(t) for t in unpool_table(3)))  # midpoints of a linear function
    fine = torch.as_tensor(icosphere(3).vertices, dtype=torch.float32)
    cos = torch.nn.functional.cosine_similarity(up[0], fine, dim=-1)
    assert cos.min() > 0.995
    # a scalar linear function f(v) = a . v: unpooling averages the parents' values, so each fine vertex gets
    # f(midpoint) = f(fine) * |midpoint| (the fine vertex is the normalised midpoint; |midpoint| = 1 for
    # inherited vertices, < 1 for new ones: the shrink of the chord midpoint)
    a = torch.tensor([0.3, -1.2, 0.7], dtype=torch.float64)
    v2 = torch.as_tensor(icosphere(2).vertices, dtype=torch.float64)
    v3 = torch.as_tensor(icosphere(3).vertices, dtype=torch.float64)
    index, weight = unpool_table(3)
    up_f = apply_table((v2 @ a)[None, :, None], torch.tensor(index), torch.tensor(weight, dtype=torch.float64))[0, :, 0]
    mid = v2[torch.tensor(index)].mean(1)  # (N_3, 3) chord midpoints of the parents
    torch.testing.assert_close(mid / mid.norm(dim=-1, keepdim=True), v3, atol=1e-9, rtol=0)
    torch.testing.assert_close(up_f, (v3 @ a) * mid.norm(dim=-1), atol=1e-6, rtol=0)
    # and never further from f(fine) than the largest shrink allows: 1 - cos(half the longest coarse edge)
    e = torch.as_tensor(icosphere(2).edges)
    half = (v2[e[:, 0]] * v2[e[:, 1]]).sum(-1).clamp(-1, 1).acos().max() / 2
    assert (up_f - v3 @ a).abs().max() <= a.norm() * (1 - half.cos()) + 1e-6
    inherited = index[:, 0] == index[:, 1]
    torch.testing.assert_close(up_f[inherited], (v3 @ a)[inherited], atol=1e-6, rtol=0)


def test_sixty_icosahedral_rotations_permute_the_vertices():
    rots = icosahedral_rotations()
    assert rots.shape == (60, 3, 3)
    np.testing.assert_allclose(rots[0], np.eye(3), atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(rots), 1.0, atol=1e-9)
    assert len({tuple(np.round(r, 6).ravel()) for r in rots}) == 60
    for r in rots[::7]:
        perm = vertex_permutation(r, 3)
        v = icosphere(3).vertices
        np.testing.assert_allclose(v @ r.T, v[perm], atol=1e-9)
    with pytest.raises(ValueError):
        vertex_permutation(np.array([[1.0, 0, 0], [0, np.cos(0.1), -np.sin(0.1)], [0, np.sin(0.1), np.cos(0.1)]]), 2)


def test_equirect_to_sphere_to_equirect_is_accurate_on_smooth_images():
    h, w = 64, 128
    img = smooth(equirect_directions(h, w))[None, None]  # (1, 1, H, W)
    dirs = torch.as_tensor(icosphere(5).vertices, dtype=torch.float32)
    on_sphere = sample_equirect(img, dirs)  # (1, N, 1)
    assert (on_sphere[0, :, 0] - smooth(dirs)).abs().max() < 1e-2
    back = SphereSampler(5, h, w)(on_sphere)
    assert back.shape == img.shape
    assert (back - img).abs().max() < 5e-3 and (back - img).abs().mean() < 5e-4


def test_rotate_equirect_matches_the_rotated_function():
    from e3nn import o3

    torch.manual_seed(0)
    r = o3.rand_matrix().float()
    h, w = 64, 128
    d = equirect_directions(h, w)
    rotated = rotate_equirect(smooth(d)[None, None], r)
    expected = smooth(d @ r)  # f(R^T d)
    assert (rotated[0, 0] - expected).abs().max() < 1e-2


def test_sampler_nearest_returns_vertex_labels():
    labels = torch.arange(num_vertices(2))[None]  # (1, N)
    out = SphereSampler(2, 16, 32).nearest(labels)
    assert out.shape == (1, 16, 32) and out.dtype == labels.dtype
    d = equirect_directions(16, 32).reshape(-1, 3).double()
    v = torch.as_tensor(icosphere(2).vertices)
    picked = v[out.reshape(-1)]
    assert ((d * picked).sum(-1) > 0.9).all()  # one of the nearby vertices


def test_rotate_equirect_agrees_with_e3nn_wigner_matrices():
    """Independent check of the rotation convention: f = c . Y_l(d) turned by R is (D_l(R) c) . Y_l(d)."""
    from e3nn import o3

    torch.manual_seed(1)
    irreps = o3.Irreps("1x0e + 1x1o + 1x2e")
    c = torch.randn(irreps.dim)
    r = o3.rand_matrix()
    h, w = 64, 128
    d = equirect_directions(h, w)
    y = o3.spherical_harmonics(irreps, d, normalize=True)  # (H, W, 9)
    turned = rotate_equirect((y @ c)[None, None], r)[0, 0]
    expected = y @ (irreps.D_from_matrix(r) @ c)
    assert (turned - expected).abs().max() < 2e-2 * (y @ c).abs().max()
