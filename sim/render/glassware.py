"""Closed triangle meshes of laboratory glassware with wall thickness (pure numpy).

Every vessel is a surface of revolution about the object's +z axis (z up, the base at z = 0, metres).
It is built from the *outer* 2-D profile ``(r, z)`` — a polyline from the axis at the bottom to the
top of the wall, its corners rounded with circular fillets so that the curve is tangent-continuous.
The inner wall is that curve offset inwards by the wall thickness along its normals, the rim is a
half circle joining the two, so the full profile runs::

    outer bottom (axis) -> outer wall -> rounded rim -> inner wall -> inner bottom (axis)

and revolving it gives one closed, watertight, genus-0 shell (glass between the two walls). Vertex
normals are the analytic profile normals revolved: smooth everywhere, pointing out of the glass —
away from the material on the outer wall, into the cavity on the inner wall.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("beaker", "erlenmeyer_flask", "round_flask", "test_tube", "bottle")


@dataclass(frozen=True)
class TriMesh:
    """An indexed triangle mesh in the object frame (metres).

    Attributes:
        vertices: (V, 3) float64 positions.
        normals: (V, 3) float64 unit vertex normals (outward from the glass).
        faces: (F, 3) int32 vertex indices, counter-clockwise seen from outside.
    """

    vertices: np.ndarray
    normals: np.ndarray
    faces: np.ndarray

    def transformed(self, rotation: np.ndarray, translation: np.ndarray, scale: float = 1.0) -> TriMesh:
        """Return ``x -> R (s x) + t`` applied to the mesh (normals rotated; uniform scale only)."""
        rotation = np.asarray(rotation, dtype=np.float64)
        v = (scale * self.vertices) @ rotation.T + np.asarray(translation, dtype=np.float64)
        return TriMesh(v, self.normals @ rotation.T, self.faces)


def fillet_polyline(points: np.ndarray, radii: np.ndarray | float, arc_step_deg: float = 7.5):
    """Round the interior corners of a 2-D polyline with tangent circular arcs.

    Args:
        points: (P, 2) corner points ``(r, z)``.
        radii: fillet radius per interior corner, (P - 2,) or a scalar; clamped so that two arcs never
            use more than 45% of a segment each.
        arc_step_deg: angular spacing of samples along each arc.

    Returns:
        (Q, 2) dense points and (Q, 2) unit tangents along the direction of travel.
    """
    pts = np.asarray(points, dtype=np.float64)
    radii = np.broadcast_to(np.asarray(radii, dtype=np.float64), (len(pts) - 2,))
    seg = np.diff(pts, axis=0)
    seg_len = np.linalg.norm(seg, axis=1)
    if np.any(seg_len <= 0):
        raise ValueError("profile has a zero-length segment")
    seg_dir = seg / seg_len[:, None]
    out_p, out_t = [pts[0]], [seg_dir[0]]
    for k in range(1, len(pts) - 1):
        d0, d1 = seg_dir[k - 1], seg_dir[k]
        turn = np.arctan2(d0[0] * d1[1] - d0[1] * d1[0], float(d0 @ d1))  # signed turning angle
        if abs(turn) < 1e-9:
            continue
        tan_half = np.tan(abs(turn) / 2)
        r = min(radii[k - 1], 0.45 * min(seg_len[k - 1], seg_len[k]) / tan_half)
        back = r * tan_half  # distance from the corner to the tangent points
        start = pts[k] - d0 * back
        normal_side = np.array([-d0[1], d0[0]]) * np.sign(turn)  # towards the arc centre
        centre = start + normal_side * r
        n_steps = max(2, int(np.ceil(np.degrees(abs(turn)) / arc_step_deg)))
        a0 = np.arctan2(*(start - centre)[::-1])
        for s in np.linspace(0.0, 1.0, n_steps + 1):
            a = a0 + s * turn
            p = centre + r * np.array([np.cos(a), np.sin(a)])
            t = np.sign(turn) * np.array([-np.sin(a), np.cos(a)])
            out_p.append(p)
            out_t.append(t)
    out_p.append(pts[-1])
    out_t.append(seg_dir[-1])
    p, t = np.asarray(out_p), np.asarray(out_t)
    keep = np.r_[True, np.linalg.norm(np.diff(p, axis=0), axis=1) > 1e-9]
    return p[keep], t[keep] / np.linalg.norm(t[keep], axis=1, keepdims=True)


def shell_profile(outer: np.ndarray, thickness: float, fillet: np.ndarray | float, rim_steps: int = 8):
    """Close an outer profile into the full shell profile (outer wall, rim, inner wall).

    Args:
        outer: (P, 2) corner points ``(r, z)`` from ``(0, 0)`` on the axis to the top of the wall.
        thickness: wall thickness in metres (the inner wall is the outer one offset inwards).
        fillet: fillet radius per interior corner (P - 2,) or a scalar, in metres; keep it above
            ``thickness`` at convex corners or the inner wall folds.
        rim_steps: samples along the half-circle rim.

    Returns:
        (Q, 2) profile points and (Q, 2) unit outward normals, starting and ending on the axis.
    """
    outer = np.asarray(outer, dtype=np.float64)
    if outer[0, 0] != 0.0:
        raise ValueError("the outer profile must start on the axis (r = 0)")
    p, t = fillet_polyline(outer, fillet)
    n = np.stack([t[:, 1], -t[:, 0]], axis=1)  # outward: tangent rotated clockwise
    inner_p = p - thickness * n
    if np.any(inner_p[1:, 0] <= 0):
        raise ValueError("wall thickness is larger than the vessel's radius")
    # Rim: half circle from the outer top over to the inner top, centred between them.
    centre = p[-1] - 0.5 * thickness * n[-1]
    th = np.linspace(0.0, np.pi, rim_steps + 1)[1:-1]
    rim_n = np.cos(th)[:, None] * n[-1] + np.sin(th)[:, None] * t[-1]
    rim_p = centre + 0.5 * thickness * rim_n
    inner_p[0, 0] = 0.0  # exactly on the axis
    profile = np.concatenate([p, rim_p, inner_p[::-1]])
    normals = np.concatenate([n, rim_n, -n[::-1]])
    return profile, normals


def revolve(profile: np.ndarray, normals: np.ndarray, segments: int = 48) -> TriMesh:
    """Revolve a closed profile (both ends on the axis) about +z into a watertight mesh.

    Args:
        profile: (Q, 2) points ``(r, z)``; the first and last have ``r = 0`` and become poles.
        normals: (Q, 2) unit 2-D normals ``(n_r, n_z)``.
        segments: number of angular steps.
    """
    if profile[0, 0] != 0.0 or profile[-1, 0] != 0.0:
        raise ValueError("a revolved profile must start and end on the axis")
    ring = profile[1:-1]
    ring_n = normals[1:-1]
    q = len(ring)
    phi = np.arange(segments) * (2 * np.pi / segments)
    c, s = np.cos(phi), np.sin(phi)
    verts = np.empty((q, segments, 3))
    verts[..., 0] = ring[:, :1] * c
    verts[..., 1] = ring[:, :1] * s
    verts[..., 2] = ring[:, 1:2]
    norms = np.empty((q, segments, 3))
    norms[..., 0] = ring_n[:, :1] * c
    norms[..., 1] = ring_n[:, :1] * s
    norms[..., 2] = ring_n[:, 1:2]
    vertices = np.concatenate(
        [[[0.0, 0.0, profile[0, 1]]], verts.reshape(-1, 3), [[0.0, 0.0, profile[-1, 1]]]]
    )
    vnormals = np.concatenate(
        [[[0.0, 0.0, normals[0, 1]]], norms.reshape(-1, 3), [[0.0, 0.0, normals[-1, 1]]]]
    )
    vnormals /= np.linalg.norm(vnormals, axis=1, keepdims=True)

    def idx(i, j):
        return 1 + i * segments + (j % segments)

    j = np.arange(segments)
    bottom = np.stack([np.zeros(segments, int), idx(0, j + 1), idx(0, j)], axis=1)
    top_pole = len(vertices) - 1
    top = np.stack([np.full(segments, top_pole), idx(q - 1, j), idx(q - 1, j + 1)], axis=1)
    i = np.arange(q - 1)[:, None]
    a, b, cc, d = idx(i, j), idx(i, j + 1), idx(i + 1, j + 1), idx(i + 1, j)
    quads = np.concatenate([np.stack([a, b, cc], -1).reshape(-1, 3), np.stack([a, cc, d], -1).reshape(-1, 3)])
    faces = np.concatenate([bottom, quads, top]).astype(np.int32)
    mesh = TriMesh(vertices, vnormals, faces)
    # Orient the winding to agree with the analytic normals (one global decision).
    fn = face_normals(mesh)
    if float(np.sum(fn * vnormals[faces].mean(axis=1))) < 0:
        mesh = TriMesh(vertices, vnormals, faces[:, ::-1].copy())
    return mesh


def face_normals(mesh: TriMesh) -> np.ndarray:
    """(F, 3) unit geometric face normals from the winding (right-hand rule)."""
    v = mesh.vertices[mesh.faces]
    n = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    return n / np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-300)


def signed_volume(mesh: TriMesh) -> float:
    """Enclosed volume in cubic metres (positive for outward winding of a closed mesh)."""
    v = mesh.vertices[mesh.faces]
    return float(np.einsum("ij,ij->i", v[:, 0], np.cross(v[:, 1], v[:, 2])).sum() / 6.0)


def is_watertight(mesh: TriMesh) -> bool:
    """True if every undirected edge is used by exactly two faces, once in each direction."""
    f = mesh.faces
    directed = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
    uniq_dir, counts = np.unique(directed, axis=0, return_counts=True)
    if np.any(counts != 1):
        return False
    rev = {tuple(e) for e in uniq_dir[:, ::-1].tolist()}
    return all(tuple(e) in rev for e in uniq_dir.tolist())


def make_vessel(kind: str, rng: np.random.Generator | None = None, segments: int = 48) -> TriMesh:
    """Build one glass vessel with randomised proportions (deterministic for a given ``rng`` state).

    Args:
        kind: one of ``KINDS``.
        rng: source of the proportions; ``None`` gives the nominal shape.
        segments: angular resolution of the revolution.

    Returns:
        The vessel's ``TriMesh`` in metres, base centred at the origin, axis +z, about 5-20 cm tall.
    """

    def u(lo: float, hi: float) -> float:
        return (lo + hi) / 2 if rng is None else float(rng.uniform(lo, hi))

    def arc(cz: float, radius: float, a0: float, a1: float, steps: int) -> list[tuple[float, float, float]]:
        # Corners on a circle centred on the axis at height cz, each rounded with the circle's radius.
        return [(radius * np.cos(a), cz + radius * np.sin(a), radius) for a in np.linspace(a0, a1, steps)]

    t = u(0.0025, 0.004)  # wall thickness
    f = max(2.0 * t, 0.006)  # fillet radius of ordinary corners
    if kind == "beaker":
        r, h = u(0.035, 0.055), u(0.07, 0.12)
        corners = [(0, 0, 0), (r, 0, f), (r, h, 0)]
    elif kind == "erlenmeyer_flask":
        r, h, rn = u(0.045, 0.06), u(0.10, 0.15), u(0.012, 0.018)
        hc = h * u(0.6, 0.7)
        corners = [(0, 0, 0), (r, 0, f), (rn, hc, 2 * f), (rn, h, 0)]
    elif kind == "round_flask":
        rb, rn, hn = u(0.035, 0.05), u(0.010, 0.015), u(0.05, 0.08)
        a_top = np.arccos(rn / rb)
        body = arc(rb, rb, -np.pi / 2, a_top, 12)
        corners = [(0, 0, 0), *body[1:-1], (rn, body[-1][1], f), (rn, body[-1][1] + hn, 0)]
    elif kind == "test_tube":
        r, h = u(0.008, 0.012), u(0.10, 0.15)
        t = min(t, 0.2 * r)
        corners = [(0, 0, 0), *arc(r, r, -np.pi / 2, 0.0, 7)[1:-1], (r, r, r), (r, h, 0)]
    elif kind == "bottle":
        r, h, rn = u(0.03, 0.045), u(0.12, 0.18), u(0.010, 0.014)
        hs = h * u(0.55, 0.7)
        corners = [(0, 0, 0), (r, 0, f), (r, hs, 2 * f), (rn, hs + 0.8 * (r - rn), 2 * f), (rn, h, 0)]
    else:
        raise ValueError(f"unknown vessel kind {kind!r}; expected one of {KINDS}")
    c = np.asarray(corners, dtype=np.float64)
    profile, normals = shell_profile(c[:, :2], thickness=t, fillet=c[1:-1, 2])
    return revolve(profile, normals, segments=segments)
