import numpy as np
import pytest

from sim.render import glassware as G


@pytest.mark.parametrize("kind", G.KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_vessels_are_closed_outward_shells(kind, seed):
    mesh = G.make_vessel(kind, np.random.default_rng(seed))
    assert G.is_watertight(mesh)
    assert G.signed_volume(mesh) > 0  # outward winding, glass volume = outer - inner
    # Smooth vertex normals agree with the winding everywhere (no flipped patch).
    agree = np.einsum("ij,ij->i", G.face_normals(mesh), mesh.normals[mesh.faces].mean(axis=1))
    assert agree.min() > 0.9
    np.testing.assert_allclose(np.linalg.norm(mesh.normals, axis=1), 1.0, atol=1e-9)
    assert mesh.vertices[:, 2].min() == pytest.approx(0.0, abs=1e-12)


def test_beaker_glass_volume_matches_cylinders():
    mesh = G.make_vessel("beaker", None, segments=256)
    r, h, t = 0.045, 0.095, 0.00325  # the nominal beaker
    expected = np.pi * r**2 * h - np.pi * (r - t) ** 2 * (h - t)
    # Fillets and the rounded rim remove a little glass; the shell is otherwise exact.
    assert G.signed_volume(mesh) == pytest.approx(expected, rel=0.05)


def test_watertight_check_has_teeth():
    mesh = G.make_vessel("test_tube")
    holed = G.TriMesh(mesh.vertices, mesh.normals, mesh.faces[1:])
    assert not G.is_watertight(holed)
    flipped = G.TriMesh(mesh.vertices, mesh.normals, mesh.faces[:, ::-1])
    assert G.signed_volume(flipped) < 0


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown vessel kind"):
        G.make_vessel("teapot")
