"""Equirectangular indoor panoramas with exact distance and semantics (SoLA training data).

An analytic ray caster in numpy: rays from the equirectangular pixel grid are intersected with the
room's box (floor, ceiling, four walls), oriented boxes (cabinets, table tops, doors, windows),
vertical cylinders (pillars, table legs, lamp stands) and spheres (lamp shades). Shading is Lambert
from a ceiling point light with hard shadows plus an ambient term, over procedural textures; windows
are bright. Depth and semantics are taken at the pixel centres and are exact; RGB averages a
``k x k`` stratified grid of sub-pixel rays, ``k = isqrt(spp)``.

Conventions:
    World frame: z up, metres; the room spans ``[0, Lx] x [0, Ly] x [0, Lz]``.
    Equirectangular image (H, W) with W = 2 H, pixel (row i, column j) centred at
        longitude ``lon = -pi + (j + 0.5) * 2 pi / W``   (-pi at the left edge, +pi at the right)
        latitude  ``lat = pi / 2 - (i + 0.5) * pi / H``  (+pi/2 at the top row, the zenith)
    and looking along the z-up camera-frame direction
        ``d = (cos(lat) cos(lon), -cos(lat) sin(lon), sin(lat))``
    (x forward at the image centre, y left, z up; longitude grows clockwise seen from above, so the
    panorama is not mirrored). This is exactly ``core.data.panoramas``' convention written in OpenCV
    axes, ``(cos lat sin lon, -sin lat, cos lat cos lon)`` = (-y, -z, x) of the frame above. The
    camera frame is the world frame turned by ``yaw`` about z (world azimuth = yaw - lon).
    Depth: Euclidean distance from the camera centre in metres (not z-depth), uint16 mm in files.

Deviation from the SoLA spec's suggestion (cube-map MuJoCo renders stitched to equirect): a direct
equirectangular ray cast is exact per pixel and has no seams.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.data.images import write_dense_sample, write_meta
from core.errors import ConfigError
from core.io import write_json
from sim.render import dataset_io

CLASSES: tuple[str, ...] = (
    "void",
    "floor",
    "ceiling",
    "wall",
    "door",
    "window",
    "cabinet",
    "table",
    "pillar",
    "lamp",
)
DEFAULT_HEIGHT = 64
_INF = np.inf
SOURCES = ("analytic", "mujoco")
EQUIRECT_TEXT = (
    "core.data.panoramas convention: pixel (u, v) centre at lon = (u + 0.5) / W * 2pi - pi (left to "
    "right), lat = pi/2 - (v + 0.5) / H * pi (top row = zenith); OpenCV camera-frame direction "
    "(cos lat sin lon, -sin lat, cos lat cos lon); the camera is upright (y along world -z) with "
    "its forward axis at world azimuth yaw (cameras.json)"
)
"""The ``meta.json`` "equirect" text, shared with ``sim.render.scene_panoramas``."""


@dataclass(frozen=True)
class Material:
    """Albedo: ``color`` (3,) linear RGB, a 2-D ``pattern`` ("plain", "checker", "stripes") mixing towards
    ``color2`` with period ``scale`` metres, and ``emission`` (added radiance, e.g. windows)."""

    color: tuple[float, float, float]
    pattern: str = "plain"
    color2: tuple[float, float, float] = (0.0, 0.0, 0.0)
    scale: float = 0.5
    emission: float = 0.0


@dataclass(frozen=True)
class Box:
    """An oriented box: centre (3,), half extents (3,) in its own frame, rotated by ``yaw`` about z."""

    cls: str
    center: tuple[float, float, float]
    half: tuple[float, float, float]
    yaw: float
    material: Material


@dataclass(frozen=True)
class Cylinder:
    """A vertical closed cylinder: axis at ``(x, y)``, radius, from ``z0`` to ``z1``."""

    cls: str
    x: float
    y: float
    radius: float
    z0: float
    z1: float
    material: Material


@dataclass(frozen=True)
class Ball:
    """A sphere: centre (3,) and radius."""

    cls: str
    center: tuple[float, float, float]
    radius: float
    material: Material


@dataclass(frozen=True)
class Room:
    """An axis-aligned room ``[0, size[0]] x [0, size[1]] x [0, size[2]]`` with its contents.

    Attributes:
        size: (Lx, Ly, Lz) in metres.
        objects: boxes, cylinders and balls inside (doors and windows are thin boxes on the walls).
        floor, ceiling, walls: materials of the room's own surfaces.
        light: (3,) position of the point light inside the room; ``light_power`` its intensity
            (radiance = albedo * (ambient + power * cos / distance^2) + emission).
    """

    size: tuple[float, float, float]
    objects: tuple[Box | Cylinder | Ball, ...] = ()
    floor: Material = Material((0.5, 0.4, 0.3))
    ceiling: Material = Material((0.9, 0.9, 0.9))
    walls: Material = Material((0.7, 0.7, 0.65))
    light: tuple[float, float, float] = (1.0, 1.0, 2.4)
    light_power: float = 6.0
    ambient: float = 0.25


# ----------------------------------------------------------------------------------------------------
# Equirectangular geometry


def equirect_directions(height: int, width: int, yaw: float = 0.0, offsets: tuple[float, float] = (0.5, 0.5)):
    """Unit world-frame ray directions of an equirectangular grid.

    Args:
        height, width: image size (W = 2 H for full coverage).
        yaw: camera heading in radians (rotation of the camera frame about world z).
        offsets: sub-pixel sample position (row, column) inside each pixel, (0.5, 0.5) = centre.

    Returns:
        (H, W, 3) float64 unit directions.
    """
    lat = np.pi / 2 - (np.arange(height) + offsets[0]) * np.pi / height
    lon = -np.pi + (np.arange(width) + offsets[1]) * 2 * np.pi / width
    lat, lon = np.meshgrid(lat, lon, indexing="ij")
    ang = yaw - lon  # the camera frame turned by yaw about z: world azimuth = yaw - lon
    return np.stack([np.cos(lat) * np.cos(ang), np.cos(lat) * np.sin(ang), np.sin(lat)], axis=-1)


def direction_to_pixel(direction: np.ndarray, height: int, width: int, yaw: float = 0.0) -> tuple[int, int]:
    """The (row, column) of the pixel that contains a world-frame direction (inverse of the grid)."""
    d = np.asarray(direction, float) / np.linalg.norm(direction)
    lat = math.asin(float(np.clip(d[2], -1, 1)))
    lon = (yaw - math.atan2(d[1], d[0]) + np.pi) % (2 * np.pi) - np.pi
    row = min(int((np.pi / 2 - lat) / np.pi * height), height - 1)
    col = min(int((lon + np.pi) / (2 * np.pi) * width), width - 1)
    return row, col


# ----------------------------------------------------------------------------------------------------
# Ray casting: origins (N, 3) or (3,), unit directions (N, 3) -> distance (N,) (inf = miss), normal (N, 3)


def _yaw_matrix(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])  # local -> world


def _hit_room(o: np.ndarray, d: np.ndarray, size) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distance to the room's inside; also the axis (0-2) and side (0 low, 1 high) that was hit."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.where(d > 0, np.asarray(size, dtype=np.float64), 0.0)
        t = np.where(d != 0, (bound - o) / d, _INF)
    rows = np.arange(len(d))
    axis = np.argmin(t, axis=1)
    return t[rows, axis], axis, (d[rows, axis] > 0).astype(np.int64)


def _hit_box(o: np.ndarray, d: np.ndarray, box: Box) -> tuple[np.ndarray, np.ndarray]:
    rot = _yaw_matrix(box.yaw)
    lo = (o - np.asarray(box.center)) @ rot
    ld = d @ rot
    half = np.asarray(box.half)
    inside = np.abs(lo) <= half
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = np.where(ld != 0, (-half - lo) / ld, np.where(inside, -_INF, _INF))
        t2 = np.where(ld != 0, (half - lo) / ld, np.where(inside, _INF, -_INF))
    tn, tf = np.minimum(t1, t2), np.maximum(t1, t2)
    rows = np.arange(len(d))
    axis = np.argmax(tn, axis=1)
    t_near, t_far = tn[rows, axis], tf.min(axis=1)
    n_local = np.zeros_like(d)
    n_local[rows, axis] = -np.sign(ld[rows, axis])
    return np.where((t_near <= t_far) & (t_near > 1e-6), t_near, _INF), n_local @ rot.T


def _hit_cylinder(o: np.ndarray, d: np.ndarray, cyl: Cylinder) -> tuple[np.ndarray, np.ndarray]:
    o = np.broadcast_to(o, d.shape)
    ox, oy, oz = o[:, 0] - cyl.x, o[:, 1] - cyl.y, o[:, 2]
    a = d[:, 0] ** 2 + d[:, 1] ** 2
    b = 2 * (ox * d[:, 0] + oy * d[:, 1])
    disc = b * b - 4 * a * (ox * ox + oy * oy - cyl.radius**2)
    normal = np.zeros_like(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where((disc >= 0) & (a > 0), (-b - np.sqrt(np.maximum(disc, 0))) / (2 * a), _INF)
        z = oz + t * d[:, 2]
        t = np.where((t > 1e-6) & (z >= cyl.z0) & (z <= cyl.z1), t, _INF)
        side = np.isfinite(t)
        normal[side, 0] = (ox + t * d[:, 0])[side] / cyl.radius
        normal[side, 1] = (oy + t * d[:, 1])[side] / cyl.radius
        for zc, nz in ((cyl.z0, -1.0), (cyl.z1, 1.0)):
            tc = (zc - oz) / d[:, 2]
            px, py = ox + tc * d[:, 0], oy + tc * d[:, 1]
            cap = (tc > 1e-6) & (px * px + py * py <= cyl.radius**2) & (tc < t) & (d[:, 2] * nz < 0)
            t = np.where(cap, tc, t)
            normal[cap] = (0.0, 0.0, nz)
    return t, normal


def _hit_ball(o: np.ndarray, d: np.ndarray, ball: Ball) -> tuple[np.ndarray, np.ndarray]:
    oc = np.broadcast_to(o - np.asarray(ball.center), d.shape)
    b = np.einsum("nc,nc->n", d, oc)
    disc = b * b - (np.einsum("nc,nc->n", oc, oc) - ball.radius**2)
    t = np.where(disc >= 0, -b - np.sqrt(np.maximum(disc, 0)), _INF)
    t = np.where(t > 1e-6, t, _INF)
    normal = (oc + np.where(np.isfinite(t), t, 0.0)[:, None] * d) / ball.radius
    return t, normal


def _hit_object(o: np.ndarray, d: np.ndarray, obj: Box | Cylinder | Ball) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(obj, Box):
        return _hit_box(o, d, obj)
    if isinstance(obj, Cylinder):
        return _hit_cylinder(o, d, obj)
    return _hit_ball(o, d, obj)


def cast(room: Room, origin: np.ndarray, dirs: np.ndarray) -> dict[str, np.ndarray]:
    """Intersect rays from one origin with the room and its contents.

    Args:
        room: the scene.
        origin: (3,) ray origin strictly inside the room (metres, world frame).
        dirs: (N, 3) unit world-frame directions.

    Returns:
        ``t`` (N,) float64 distance in metres; ``normal`` (N, 3) world unit normals facing the ray;
        ``surface`` (N,) int64 (-1 = the room's own floor / ceiling / walls, k = ``room.objects[k]``);
        ``axis`` / ``side`` (N,) the room face the ray would hit (axis 0-2, side 0 = low, 1 = high);
        ``semantic`` (N,) uint8 class ids (``CLASSES``).
    """
    o = np.asarray(origin, dtype=np.float64)
    if o.shape != (3,) or not all(0.0 < o[k] < room.size[k] for k in range(3)):
        raise ConfigError(f"camera origin {o.tolist()} is not inside the room {list(room.size)}")
    t, axis, side = _hit_room(o, dirs, room.size)
    normal = np.zeros_like(dirs)
    normal[np.arange(len(dirs)), axis] = np.where(side == 1, -1.0, 1.0)
    surface = np.full(len(dirs), -1, dtype=np.int64)
    for k, obj in enumerate(room.objects):
        tk, nk = _hit_object(o, dirs, obj)
        closer = tk < t
        t = np.where(closer, tk, t)
        normal[closer] = nk[closer]
        surface[closer] = k
    shell = np.where(
        axis == 2,
        np.where(side == 1, CLASSES.index("ceiling"), CLASSES.index("floor")),
        CLASSES.index("wall"),
    )
    obj_cls = np.array([CLASSES.index(obj.cls) for obj in room.objects] + [0], dtype=np.int64)
    semantic = np.where(surface >= 0, obj_cls[surface], shell).astype(np.uint8)
    normal[np.einsum("nc,nc->n", normal, dirs) > 0] *= -1
    return {"t": t, "normal": normal, "surface": surface, "axis": axis, "side": side, "semantic": semantic}


def _material(room: Room, surface: int, axis: int, side: int) -> Material:
    if surface >= 0:
        return room.objects[surface].material
    if axis == 2:
        return room.ceiling if side == 1 else room.floor
    return room.walls


def _shade(room: Room, origin: np.ndarray, dirs: np.ndarray, hit: dict[str, np.ndarray]) -> np.ndarray:
    """Linear RGB radiance (N, 3) of the hit points: Lambert + hard shadows + ambient + emission."""
    p = origin + hit["t"][:, None] * dirs
    n = hit["normal"]
    # Texture coordinates: the two world axes most orthogonal to the normal.
    dominant = np.argmax(np.abs(n), axis=1)
    rows = np.arange(len(p))
    uv = np.stack([p[rows, np.where(dominant == 0, 1, 0)], p[rows, np.where(dominant == 2, 1, 2)]], axis=1)

    albedo = np.zeros_like(p)
    emission = np.zeros(len(p))
    keys = (hit["surface"] + 1) * 8 + hit["axis"] * 2 + hit["side"]  # shell faces split by axis / side
    for key in np.unique(keys):
        sel = keys == key
        first = int(np.argmax(sel))
        mat = _material(room, int(hit["surface"][first]), int(hit["axis"][first]), int(hit["side"][first]))
        q = uv[sel] / mat.scale
        if mat.pattern == "checker":
            w = (np.floor(q[:, 0] + 1e-7) + np.floor(q[:, 1] + 1e-7)) % 2
        elif mat.pattern == "stripes":
            w = 0.5 + 0.5 * np.sin(2 * np.pi * q[:, 0] + 0.6 * np.sin(2 * np.pi * 0.37 * q[:, 1]))
        else:
            w = np.zeros(len(q))
        albedo[sel] = np.asarray(mat.color) * (1 - w[:, None]) + np.asarray(mat.color2) * w[:, None]
        emission[sel] = mat.emission

    to_light = np.asarray(room.light) - p
    dist = np.linalg.norm(to_light, axis=1)
    ldir = to_light / dist[:, None]
    cos = np.clip(np.einsum("nc,nc->n", n, ldir), 0.0, None)
    lit = cos > 0
    start = p + 1e-4 * n
    for obj in room.objects:  # the room's shell cannot occlude a light inside it
        lit &= ~(_hit_object(start, ldir, obj)[0] < dist)
    direct = room.light_power * cos * lit / np.maximum(dist * dist, 1e-6)
    return albedo * (room.ambient + direct)[:, None] + emission[:, None]


def render_panorama(
    room: Room, origin: np.ndarray, height: int = DEFAULT_HEIGHT, yaw: float = 0.0, spp: int = 16
) -> dict[str, np.ndarray]:
    """Render one equirectangular panorama (width = 2 * height).

    Args:
        room: the scene.
        origin: (3,) camera centre in the world frame (metres), strictly inside the room.
        height: image height H in pixels.
        yaw: camera heading in radians (see the module docstring).
        spp: RGB anti-aliasing samples per pixel (a ``k x k`` stratified grid, ``k = isqrt(spp)``).

    Returns:
        ``rgb`` (H, 2H, 3) uint8 sRGB; ``depth`` (H, 2H) float32 Euclidean distance in metres;
        ``semantic`` (H, 2H) uint8 class ids; ``normals`` (H, 2H, 3) float32 world-frame unit normals.
    """
    width = 2 * height
    o = np.asarray(origin, dtype=np.float64)
    dirs = equirect_directions(height, width, yaw).reshape(-1, 3)
    hit = cast(room, o, dirs)
    k = max(1, math.isqrt(spp))
    radiance = np.zeros((height * width, 3))
    for a in range(k):
        for b in range(k):
            sub = equirect_directions(height, width, yaw, ((a + 0.5) / k, (b + 0.5) / k)).reshape(-1, 3)
            radiance += _shade(room, o, sub, cast(room, o, sub))
    radiance /= k * k
    x = np.clip(radiance, 0.0, 1.0)
    srgb = np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1 / 2.4) - 0.055)
    return {
        "rgb": np.rint(srgb * 255).astype(np.uint8).reshape(height, width, 3),
        "depth": hit["t"].astype(np.float32).reshape(height, width),
        "semantic": hit["semantic"].reshape(height, width),
        "normals": hit["normal"].astype(np.float32).reshape(height, width, 3),
    }


# ----------------------------------------------------------------------------------------------------
# Random rooms


def _random_material(rng: np.random.Generator, patterns=("plain", "checker", "stripes"), lo=0.1, hi=0.9):
    pattern = patterns[int(rng.integers(len(patterns)))]
    return Material(
        tuple(rng.uniform(lo, hi, 3).tolist()),
        pattern,
        tuple(rng.uniform(lo, hi, 3).tolist()),
        float(rng.uniform(0.2, 0.8)),
    )


def _wall_frame(size, wall: int, along: float) -> tuple[np.ndarray, float, np.ndarray]:
    """A point on wall ``wall`` (0: y=0, 1: x=Lx, 2: y=Ly, 3: x=0) at ``along`` (0..1), its yaw, inward normal."""
    lx, ly = size[0], size[1]
    if wall == 0:
        return np.array([along * lx, 0.0]), 0.0, np.array([0.0, 1.0])
    if wall == 1:
        return np.array([lx, along * ly]), np.pi / 2, np.array([-1.0, 0.0])
    if wall == 2:
        return np.array([along * lx, ly]), 0.0, np.array([0.0, -1.0])
    return np.array([0.0, along * ly]), np.pi / 2, np.array([1.0, 0.0])


def random_room(rng: np.random.Generator) -> tuple[Room, np.ndarray, float]:
    """Draw a furnished room and a camera pose inside it (deterministic for a given ``rng`` state).

    Returns:
        ``(room, origin (3,), yaw)``: the camera stands clear of the furniture at eye height.
    """
    size = (float(rng.uniform(3.0, 7.0)), float(rng.uniform(3.0, 7.0)), float(rng.uniform(2.5, 3.2)))
    wall_len = (size[0], size[1], size[0], size[1])
    objects: list[Box | Cylinder | Ball] = []
    footprints: list[tuple[np.ndarray, float]] = []  # (xy centre, radius) of floor-standing things

    def free(xy: np.ndarray, radius: float) -> bool:
        inside = radius < xy[0] < size[0] - radius and radius < xy[1] < size[1] - radius
        return inside and all(np.linalg.norm(xy - c) > radius + r for c, r in footprints)

    used: list[tuple[int, float, float]] = []  # (wall, centre along, half width) of openings
    for cls, count in (("door", int(rng.integers(1, 3))), ("window", int(rng.integers(0, 4)))):
        for _ in range(count):
            wall = int(rng.integers(4))
            width = 0.9 if cls == "door" else float(rng.uniform(0.8, 1.6))
            length = wall_len[wall]
            if length < width + 0.6:
                continue
            along = float(rng.uniform((0.3 + width / 2) / length, 1 - (0.3 + width / 2) / length))
            if any(w == wall and abs(a - along) * length < h + width / 2 + 0.1 for w, a, h in used):
                continue
            used.append((wall, along, width / 2))
            xy, yaw, inward = _wall_frame(size, wall, along)
            if cls == "door":
                z0, z1 = 0.0, 2.05
                mat = _random_material(rng, ("plain", "stripes"), 0.2, 0.7)
            else:
                z0 = float(rng.uniform(0.8, 1.0))
                z1 = min(z0 + float(rng.uniform(1.0, 1.4)), size[2] - 0.2)
                mat = Material((0.75, 0.85, 0.95), emission=float(rng.uniform(0.4, 0.9)))
            c = xy + inward * 0.02
            objects.append(Box(cls, (c[0], c[1], (z0 + z1) / 2), (width / 2, 0.02, (z1 - z0) / 2), yaw, mat))
            if cls == "door":  # keep the floor in front of doors clear
                footprints.append((xy + inward * 0.5, 0.45))

    for _ in range(int(rng.integers(2, 7))):
        kind = ("cabinet", "table", "pillar", "lamp")[int(rng.integers(4))]
        mat = _random_material(rng)
        for _attempt in range(20):
            if kind == "cabinet":  # against a wall
                wall = int(rng.integers(4))
                hw, hd = float(rng.uniform(0.3, 0.9)), float(rng.uniform(0.2, 0.35))
                along = float(rng.uniform(0.1, 0.9))
                xy, yaw, inward = _wall_frame(size, wall, along)
                xy = xy + inward * (hd + 0.01)
                radius = math.hypot(hw, hd)
                if not (hw < along * wall_len[wall] < wall_len[wall] - hw) or not free(xy, 0.0):
                    continue
                if any(np.linalg.norm(xy - c) < radius + r for c, r in footprints):
                    continue
                h = float(rng.uniform(0.8, 2.0))
                objects.append(Box("cabinet", (xy[0], xy[1], h / 2), (hw, hd, h / 2), yaw, mat))
            else:
                radius = {
                    "table": float(rng.uniform(0.5, 0.9)),
                    "pillar": float(rng.uniform(0.12, 0.3)),
                    "lamp": 0.25,
                }[kind]
                xy = rng.uniform([0, 0], size[:2])
                if not free(xy, radius):
                    continue
                if kind == "table":
                    yaw, hw = float(rng.uniform(0, np.pi)), radius / math.sqrt(2)
                    top = float(rng.uniform(0.7, 0.78))
                    objects.append(Box("table", (xy[0], xy[1], top - 0.02), (hw, hw * 0.7, 0.02), yaw, mat))
                    rot = _yaw_matrix(yaw)[:2, :2]
                    for sx, sy in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
                        leg = xy + rot @ np.array([sx * (hw - 0.06), sy * (hw * 0.7 - 0.06)])
                        objects.append(Cylinder("table", leg[0], leg[1], 0.03, 0.0, top - 0.04, mat))
                elif kind == "pillar":
                    objects.append(Cylinder("pillar", xy[0], xy[1], radius, 0.0, size[2], mat))
                else:
                    stand = float(rng.uniform(1.2, 1.6))
                    objects.append(Cylinder("lamp", xy[0], xy[1], 0.02, 0.0, stand, mat))
                    shade = Material((0.95, 0.9, 0.7), emission=float(rng.uniform(0.3, 0.8)))
                    objects.append(Ball("lamp", (xy[0], xy[1], stand + 0.15), 0.15, shade))
            footprints.append((xy, radius))
            break

    for _attempt in range(200):
        xy = rng.uniform([0.5, 0.5], [size[0] - 0.5, size[1] - 0.5])
        if free(xy, 0.3):
            break
    else:  # a crowded room: stand in the middle anyway (the camera may then be near furniture)
        xy = np.array([size[0] / 2, size[1] / 2])
    origin = np.array([xy[0], xy[1], float(rng.uniform(1.2, 1.7))])
    room = Room(
        size=size,
        objects=tuple(objects),
        floor=_random_material(rng, ("checker", "stripes", "plain"), 0.15, 0.7),
        ceiling=Material(tuple(rng.uniform(0.75, 0.95, 3).tolist())),
        walls=_random_material(rng, ("plain", "plain", "stripes"), 0.4, 0.9),
        light=(
            float(rng.uniform(0.3, size[0] - 0.3)),
            float(rng.uniform(0.3, size[1] - 0.3)),
            size[2] - 0.05,
        ),
        light_power=float(rng.uniform(3.0, 8.0)),
        ambient=float(rng.uniform(0.15, 0.35)),
    )
    return room, origin, float(rng.uniform(-np.pi, np.pi))


# ----------------------------------------------------------------------------------------------------
# Dataset


def equirect_summary(out: Path, n: int, counts: dict, height: int, classes, class_pixels: np.ndarray,
                     seconds: float, meta: dict, **extra) -> dict:
    """The summary ``make_dataset`` of every equirectangular source returns (class shares from pixel counts)."""
    total = max(int(class_pixels.sum()), 1)
    return {"root": str(out), "n": n, "splits": counts, "height": height, "width": 2 * height,
            "class_fractions": {c: float(v) / total for c, v in zip(classes, class_pixels, strict=True)},
            "seconds": seconds, "meta": meta, **extra}


def equirect_meta(height: int, spp: int) -> dict:
    """The ``meta.json`` entries every equirectangular source writes: projection, size, convention, spp, maps."""
    return {"projection": "equirectangular", "width": 2 * height, "height": height, "equirect": EQUIRECT_TEXT,
            "spp": max(1, math.isqrt(spp)) ** 2, "maps": ["rgb", "depth", "semantic"]}


def make_dataset(
    out: Path,
    n: int,
    seed: int = 0,
    size: int | None = None,
    spp: int = 32,
    test_fraction: float = 0.2,
    source: str = "analytic",
    **kwargs,
) -> dict:
    """Render ``n`` indoor panoramas into ``out`` in the ``embodied-dense/1`` layout.

    Sources: ``"analytic"`` (this module's ray-cast box rooms, the default, documented below) or
    ``"mujoco"`` (cube-map renders inside LIBERO / robosuite scenes: ``sim.render.scene_panoramas.
    make_dataset``, which also takes ``face_size``, ``workers``, ``scenes`` through ``kwargs``).

    Written per view: ``rgb`` (H, 2H, 3) uint8, ``depth`` (H, 2H) uint16 millimetres of Euclidean
    distance from the camera centre (0 = invalid; never here: every ray hits the room), ``semantic``
    (H, 2H) uint8 class ids (``CLASSES``); ``<split>/cameras.json`` holds each camera's origin (metres,
    world frame) and yaw (radians) and the room size. View ``i`` is drawn from ``view_rng(seed, i)``.

    Args:
        out: dataset root folder.
        n: number of panoramas.
        seed: dataset seed (same seed -> bit-identical files).
        size: panorama height H in pixels (width 2H); default ``DEFAULT_HEIGHT``.
        spp: RGB anti-aliasing samples per pixel (``isqrt(spp)^2`` are used).
        test_fraction: share of views (the last ones) that go to ``test``.
        source: ``"analytic"`` or ``"mujoco"`` (see above); ``kwargs`` only go to the mujoco source.

    Returns:
        Summary dict: root, n, splits, height, width, seconds, class pixel fractions, and "meta".
    """
    if source not in SOURCES:
        raise ConfigError(f"source: expected one of {list(SOURCES)}, got {source!r}")
    if source == "mujoco":
        from sim.render import scene_panoramas

        return scene_panoramas.make_dataset(out, n, seed, size, spp, test_fraction, **kwargs)
    if kwargs:
        raise ConfigError(f"unexpected argument(s) {sorted(kwargs)} for source 'analytic'")
    dataset_io.check_make_args(n, seed, size, spp, test_fraction)
    height = DEFAULT_HEIGHT if size is None else size
    out = Path(out)
    t0 = time.perf_counter()
    counts = dict.fromkeys(dataset_io.SPLITS, 0)
    cameras: dict[str, dict] = {s: {} for s in dataset_io.SPLITS}
    class_pixels = np.zeros(len(CLASSES), np.int64)
    for split, sid, index in dataset_io.split_ids(n, test_fraction):
        room, origin, yaw = random_room(dataset_io.view_rng(seed, index))
        pano = render_panorama(room, origin, height, yaw, spp)
        write_dense_sample(out, split, sid, rgb=pano["rgb"], depth=pano["depth"], semantic=pano["semantic"])
        counts[split] += 1
        dataset_io.view_done()
        cameras[split][sid] = {
            "origin": origin.round(9).tolist(),
            "yaw": round(yaw, 9),
            "room_size": [round(v, 9) for v in room.size],
        }
        class_pixels += np.bincount(pano["semantic"].ravel(), minlength=len(CLASSES))
    for split in dataset_io.SPLITS:
        if counts[split]:
            write_json(out / split / "cameras.json", cameras[split])
    meta = write_meta(
        out,
        generator="sim.render.panoramas (numpy analytic ray caster)",
        source="analytic",
        seed=seed,
        depth="Euclidean distance from the camera centre in metres (uint16 millimetres in files, 0 invalid)",
        classes=list(CLASSES),
        splits=counts,
        **equirect_meta(height, spp),
    )
    return equirect_summary(out, n, counts, height, CLASSES, class_pixels, time.perf_counter() - t0, meta)
