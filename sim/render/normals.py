"""Transparent-labware dataset for surface-normal estimation (TransNormal-Synthetic style), Mitsuba 3.

Each view is one random table-top scene — glass beakers, flasks, test tubes and bottles (closed shells
with wall thickness, ``sim.render.glassware``) on a coloured / textured table in front of a backdrop,
lit by a procedural environment map and a spherical area light — path traced with real refraction
(``dielectric``, IOR ~1.5, some ``roughdielectric`` / tinted glass). Per view the dataset holds:

    rgb        (H, W, 3) uint8 sRGB path-traced image
    rgb_twin   the same view with every glass object swapped for a coloured diffuse material
               (same geometry: identical normals / depth / mask)
    normals    (H, W, 3) unit normals in the camera frame, OpenCV axes (x right, y down, z forward),
               pointing out of the surface towards the camera (n . view_dir < 0); every pixel that
               hits a surface (glass, table, backdrop) is valid
    depth      (H, W) z-depth in metres along the optical axis, from the ``position`` AOV
    mask       (H, W) glass objects (255) vs everything else (0)
    semantic   (H, W) class ids, names in ``CLASSES``

Ground truth comes from Mitsuba's ``aov`` integrator at the pixel centres (stratified sampler, no
jitter, 1 spp, box filter), so it is exact for the rendered geometry. Mitsuba's camera frame is x left,
y up, z forward; it is converted to OpenCV here. Intrinsics (pixel centres at integer coordinates):
``fx = fy = W / (2 tan(fov_x / 2))``, ``cx = (W - 1) / 2``, ``cy = (H - 1) / 2``.

Two scene sources (``sample_scene`` / ``make_dataset`` ``source=``): "procedural" (the above) and
"real": a real CC0 HDRI panorama (randomly rotated about the vertical, auto-exposed) as the only light,
real material photos on the table and, in 60 % of the views, on a wall behind (``sim.render.real_assets``;
test views use only held-out HDRIs / photos), and a robot-workspace camera looking down 25-60 deg.

Deviation from TransNormal-Synthetic: no "view without the object" image, one table-top per view
rather than sequences, and a few hundred small views instead of thousands of large ones.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.data.images import write_dense_sample, write_meta
from core.errors import ConfigError
from core.io import write_json
from sim.render import dataset_io
from sim.render.glassware import KINDS, TriMesh, make_vessel

CLASSES: tuple[str, ...] = ("void", "table", "backdrop", *KINDS, "sphere")
DEFAULT_SIZE = 64
FOV_DEG = 45.0
MAX_DEPTH = 12  # path length; 8 loses light through stacked glass walls

_VARIANT = "scalar_rgb"


def _mitsuba():
    """Import Mitsuba lazily and select the CPU scalar variant (deterministic, works everywhere)."""
    import mitsuba as mi

    if mi.variant() != _VARIANT:
        mi.set_variant(_VARIANT)
    return mi


# ----------------------------------------------------------------------------------------------------
# Scene description (plain data, independent of Mitsuba)


@dataclass(frozen=True)
class Camera:
    """A pinhole camera looking from ``origin`` at ``target`` (world frame: z up, metres).

    Attributes:
        origin: (3,) camera centre.
        target: (3,) point on the optical axis.
        width, height: image size in pixels.
        fov_deg: horizontal field of view in degrees.
    """

    origin: tuple[float, float, float]
    target: tuple[float, float, float]
    width: int
    height: int
    fov_deg: float = FOV_DEG

    def rotation(self) -> np.ndarray:
        """(3, 3) camera-to-world rotation, columns = OpenCV camera axes (x right, y down, z forward)."""
        o, t = np.asarray(self.origin, float), np.asarray(self.target, float)
        f = (t - o) / np.linalg.norm(t - o)
        right = np.cross(f, [0.0, 0.0, 1.0])
        if np.linalg.norm(right) < 1e-6:
            raise ConfigError("camera: the optical axis is vertical; the look-at frame is undefined")
        right /= np.linalg.norm(right)
        down = np.cross(f, right)
        return np.stack([right, down, f], axis=1)

    def cam_to_world(self) -> np.ndarray:
        """(4, 4) OpenCV camera-to-world transform."""
        m = np.eye(4)
        m[:3, :3] = self.rotation()
        m[:3, 3] = self.origin
        return m

    def intrinsics(self) -> dict[str, float]:
        """Pinhole intrinsics in pixels, pixel centres at integer coordinates."""
        fx = self.width / (2.0 * math.tan(math.radians(self.fov_deg) / 2.0))
        return {"fx": fx, "fy": fx, "cx": (self.width - 1) / 2.0, "cy": (self.height - 1) / 2.0}


@dataclass(frozen=True)
class Sphere:
    """An analytic sphere (used for calibration scenes): centre (3,) and radius in metres."""

    center: tuple[float, float, float]
    radius: float


@dataclass(frozen=True)
class GlassObject:
    """One object: its world-frame geometry, the glass it is made of and its twin's diffuse colour.

    Attributes:
        kind: class name (an entry of ``CLASSES``).
        geometry: a world-frame ``TriMesh`` or ``Sphere``.
        roughness: ``None`` for smooth glass, else the GGX alpha of a ``roughdielectric``.
        ior: interior index of refraction.
        tint: (3,) specular transmittance (1, 1, 1 = clear glass).
        twin_color: (3,) linear reflectance of the diffuse material in the twin.
    """

    kind: str
    geometry: TriMesh | Sphere
    roughness: float | None = None
    ior: float = 1.5
    tint: tuple[float, float, float] = (1.0, 1.0, 1.0)
    twin_color: tuple[float, float, float] = (0.8, 0.2, 0.2)


@dataclass(frozen=True)
class Surface:
    """A textured rectangle (table or backdrop).

    Attributes:
        to_world: (4, 4) transform of Mitsuba's ``rectangle`` ([-1, 1]^2 in the z = 0 plane, normal +z).
        texture: (h, w, 3) float32 linear RGB albedo image, stretched over the rectangle.
        uv_scale: (u, v) repeats of the texture across the rectangle (1, 1 = stretched once).
        name: where the texture came from (a ``real_assets`` ref, or "procedural").
    """

    to_world: np.ndarray
    texture: np.ndarray
    uv_scale: tuple[float, float] = (1.0, 1.0)
    name: str = "procedural"


@dataclass(frozen=True)
class LabScene:
    """Everything needed to render one view (both the glass render and its twin).

    Attributes:
        envmap: (h, 2h, 3) float32 linear-RGB latitude-longitude map (top row = world +z, the sky).
        envmap_rotation_deg: rotation of the environment about the world's vertical (+z) axis.
        envmap_scale: multiplier of the environment's radiance (the exposure of an HDRI).
        light_radiance: radiance of the spherical area light; 0 = no sphere light.
        provenance: where the assets came from (source "real": hdri, hdri_rotation_deg, exposure,
            table_texture, backdrop_texture); empty for procedural scenes.
    """

    camera: Camera
    objects: tuple[GlassObject, ...]
    table: Surface | None = None
    backdrop: Surface | None = None
    envmap: np.ndarray = field(default_factory=lambda: np.full((8, 16, 3), 0.5, np.float32))
    light_position: tuple[float, float, float] = (0.5, -0.5, 1.5)
    light_radius: float = 0.15
    light_radiance: float = 30.0
    envmap_rotation_deg: float = 0.0
    envmap_scale: float = 1.0
    provenance: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------
# Random scenes


def _texture(rng: np.random.Generator, res: int = 64) -> np.ndarray:
    """A procedural albedo image: plain, checker, stripes (wood-like) or smooth blotches."""
    base = rng.uniform(0.05, 0.85, 3)
    other = rng.uniform(0.05, 0.85, 3)
    y, x = np.mgrid[0:res, 0:res] / res
    style = rng.integers(4)
    if style == 0:
        w = np.zeros((res, res))
    elif style == 1:
        k = rng.integers(4, 16)
        w = ((np.floor(x * k) + np.floor(y * k)) % 2).astype(float)
    elif style == 2:
        k, phase = rng.uniform(6, 30), rng.uniform(0, 2 * np.pi)
        w = 0.5 + 0.5 * np.sin(2 * np.pi * k * x + 2.0 * np.sin(2 * np.pi * 3 * y) + phase)
    else:
        w = np.zeros((res, res))
        for _ in range(6):
            c, s = rng.uniform(0, 1, 2), rng.uniform(0.05, 0.2)
            w += np.exp(-((x - c[0]) ** 2 + (y - c[1]) ** 2) / (2 * s * s))
        w = np.clip(w, 0, 1)
    return (base * (1 - w[..., None]) + other * w[..., None]).astype(np.float32)


def _envmap(rng: np.random.Generator) -> np.ndarray:
    """A (16, 32, 3) latitude-longitude environment: sky-ish gradient with a few bright 'windows'."""
    h, w = 16, 32
    lat = (0.5 - (np.arange(h) + 0.5) / h)[:, None, None]
    top, bottom = rng.uniform(0.3, 1.0, 3), rng.uniform(0.05, 0.3, 3)
    env = np.broadcast_to(bottom + (top - bottom) * np.clip(lat + 0.5, 0, 1), (h, w, 3)).copy()
    for _ in range(rng.integers(1, 4)):
        r0, c0 = rng.integers(1, h // 2), rng.integers(0, w - 4)
        env[r0 : r0 + rng.integers(2, 4), c0 : c0 + rng.integers(2, 5)] = rng.uniform(2.0, 6.0)
    return (env * rng.uniform(0.3, 0.8)).astype(np.float32)


def _rectangle(center: np.ndarray, normal: np.ndarray, up: np.ndarray, half_w: float, half_h: float):
    """(4, 4) transform placing the unit rectangle at ``center`` facing ``normal``."""
    n = normal / np.linalg.norm(normal)
    x = np.cross(up, n)
    x /= np.linalg.norm(x)
    y = np.cross(n, x)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = x * half_w, y * half_h, n, center
    return m


def _rot_z(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


SOURCES: tuple[str, ...] = ("procedural", "real")


def _sample_objects(
    rng: np.random.Generator, count: tuple[int, int] = (1, 4), spread: float = 0.1
) -> tuple[list[GlassObject], list[tuple[np.ndarray, float]]]:
    """``count[0]`` .. ``count[1] - 1`` non-overlapping glass vessels within ``spread`` metres of the origin,
    and their (xy, radius) footprints."""
    objects: list[GlassObject] = []
    placed: list[tuple[np.ndarray, float]] = []
    for _ in range(int(rng.integers(*count))):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        mesh = make_vessel(kind, rng)
        radius = float(np.linalg.norm(mesh.vertices[:, :2], axis=1).max()) + 0.005
        for _attempt in range(20):
            xy = rng.uniform(-spread, spread, 2)
            if all(np.linalg.norm(xy - c) > radius + r for c, r in placed):
                break
        else:
            continue
        placed.append((xy, radius))
        mesh = mesh.transformed(_rot_z(rng.uniform(0, 2 * np.pi)), np.array([xy[0], xy[1], 0.0]))
        rough = float(rng.uniform(0.03, 0.2)) if rng.random() < 0.2 else None
        tint = (1.0, 1.0, 1.0)
        if kind == "bottle" and rng.random() < 0.4:
            tint = (0.95, 0.65, 0.35)  # amber
        color = rng.uniform(0.1, 0.9, 3)
        color[rng.integers(3)] = rng.uniform(0.6, 0.95)  # keep it saturated-ish and not black
        objects.append(
            GlassObject(
                kind,
                mesh,
                roughness=rough,
                ior=float(rng.uniform(1.47, 1.53)),
                tint=tint,
                twin_color=tuple(float(c) for c in color),
            )
        )
    return objects, placed


def _look_at_objects(
    rng: np.random.Generator,
    objects,
    placed,
    size: int,
    elevation_deg: tuple[float, float],
    dist_m: tuple[float, float],
) -> tuple[Camera, np.ndarray, np.ndarray]:
    """A camera on a random azimuth looking at the objects; returns (camera, footprint centre, heading)."""
    centre = np.mean([c for c, _ in placed], axis=0)
    top = max(float(o.geometry.vertices[:, 2].max()) for o in objects if isinstance(o.geometry, TriMesh))
    target = np.array([centre[0], centre[1], 0.4 * top])
    azimuth = rng.uniform(0, 2 * np.pi)
    elevation = math.radians(rng.uniform(*elevation_deg))
    dist = rng.uniform(*dist_m)
    heading = np.array([math.cos(azimuth), math.sin(azimuth), 0.0])
    origin = target + dist * (math.cos(elevation) * heading + np.array([0, 0, math.sin(elevation)]))
    return Camera(tuple(origin), tuple(target), size, size), centre, heading


# Real source, auto exposure: the HDRI's scale puts the table (a diffuse, upward-facing surface of the
# table texture's mean albedo) at this linear radiance (18 % grey, sRGB ~0.46), i.e. exposure =
# REAL_TABLE_RADIANCE * pi / (irradiance * clip(mean albedo, 0.08, 0.8)), jittered log-uniformly by
# REAL_EXPOSURE_JITTER.
REAL_TABLE_RADIANCE = 0.18
REAL_EXPOSURE_JITTER = (0.7, 1.4)
REAL_BACKDROP_PROB = 0.6
REAL_ELEVATION_DEG = (25.0, 60.0)
REAL_DIST_M = (0.3, 0.65)
# framing "closeup" (the glass decides the score): 2-4 vessels packed within 6 cm, a camera 0.2-0.32 m away
# looking down 15-45 deg, so that glass covers a large share of the frame (measured in the README).
FRAMINGS: tuple[str, ...] = ("workspace", "closeup")
CLOSEUP_COUNT = (2, 5)
CLOSEUP_SPREAD_M = 0.06
CLOSEUP_ELEVATION_DEG = (15.0, 45.0)
CLOSEUP_DIST_M = (0.2, 0.32)


def sample_scene(
    rng: np.random.Generator,
    size: int = DEFAULT_SIZE,
    source: str = "procedural",
    split: str = "train",
    framing: str = "workspace",
) -> LabScene:
    """Draw one random table-top scene of 1-3 glass vessels (deterministic for a given ``rng`` state).

    Args:
        rng: the random source (use ``dataset_io.view_rng(seed, index)`` for dataset views).
        size: square image size in pixels.
        source: "procedural" (procedural textures, a 16 x 32 procedural envmap and a sphere light) or
            "real" (a real HDRI panorama, real material photos: ``sim.render.real_assets``; see
            ``_sample_real``).
        split: "train" | "test": which held-out assets a "real" scene may use (ignored by "procedural").
        framing: "real" only: "workspace" (a robot's table camera, 1-3 vessels) or "closeup" (2-4 vessels
            packed together, a close camera: glass fills much of the frame).
    """
    if source not in SOURCES:
        raise ConfigError(f"source: expected one of {SOURCES}, got {source!r}")
    if framing not in FRAMINGS:
        raise ConfigError(f"framing: expected one of {FRAMINGS}, got {framing!r}")
    if framing != "workspace" and source != "real":
        raise ConfigError(f"framing {framing!r} needs source 'real', got {source!r}")
    if split not in dataset_io.SPLITS:
        raise ConfigError(f"split: expected one of {dataset_io.SPLITS}, got {split!r}")
    if source == "real":
        return _sample_real(rng, size, split, framing)
    objects, placed = _sample_objects(rng)
    camera, centre, heading = _look_at_objects(rng, objects, placed, size, (10.0, 45.0), (0.35, 0.55))

    table = Surface(
        _rectangle(np.zeros(3), np.array([0.0, 0, 1]), np.array([0.0, 1, 0]), 2.0, 2.0), _texture(rng)
    )
    back_dist = rng.uniform(0.25, 0.6)
    back_centre = np.array([centre[0], centre[1], 0.0]) - back_dist * heading + np.array([0, 0, 0.75])
    backdrop = Surface(_rectangle(back_centre, heading, np.array([0.0, 0, 1]), 1.5, 0.75), _texture(rng))
    light_dir = rng.normal(size=3)
    light_dir[2] = abs(light_dir[2]) + 0.8
    light_dir /= np.linalg.norm(light_dir)
    light_dist, light_radius = rng.uniform(1.2, 2.0), rng.uniform(0.3, 0.6)  # large: fewer fireflies
    irradiance = rng.uniform(1.5, 4.0)
    return LabScene(
        camera=camera,
        objects=tuple(objects),
        table=table,
        backdrop=backdrop,
        envmap=_envmap(rng),
        light_position=tuple(float(v) for v in light_dir * light_dist),
        light_radius=float(light_radius),
        light_radiance=float(irradiance * light_dist**2 / (math.pi * light_radius**2)),
    )


def _sample_real(rng: np.random.Generator, size: int, split: str, framing: str = "workspace") -> LabScene:
    """A scene under a real HDRI with real material photos (assets of ``split`` only).

    Camera like a robot's workspace camera (elevation 25-60 deg, 0.3-0.65 m, no roll). The table is a
    0.7-2 m x 0.6-1.6 m photo-textured rectangle (random offset, yaw and tile size 0.3-1.2 m), so the
    HDRI's own ground shows beyond its edge at low elevations; a photo-textured wall stands behind the
    objects in ``REAL_BACKDROP_PROB`` of the views, otherwise the panorama itself is what the glass
    refracts. Lighting is the HDRI alone (no sphere light): rotated uniformly about +z, with an auto
    exposure that puts the table at ``REAL_TABLE_RADIANCE`` from the HDRI's upper-hemisphere irradiance
    (``real_assets.hdri_table_irradiance``) and the table texture's mean albedo, times a log-uniform
    jitter; this also makes the dark "night" / "studio" panoramas usable without an extra light.
    """
    from sim.render import real_assets

    hdris = real_assets.hdri_names(split)
    tables = real_assets.texture_refs("table", split)
    backdrops = real_assets.texture_refs("backdrop", split)

    if framing == "closeup":
        objects, placed = _sample_objects(rng, CLOSEUP_COUNT, CLOSEUP_SPREAD_M)
        camera, centre, heading = _look_at_objects(rng, objects, placed, size, CLOSEUP_ELEVATION_DEG,
                                                   CLOSEUP_DIST_M)
    else:
        objects, placed = _sample_objects(rng)
        camera, centre, heading = _look_at_objects(rng, objects, placed, size, REAL_ELEVATION_DEG, REAL_DIST_M)

    table_ref = tables[int(rng.integers(len(tables)))]
    half = rng.uniform([0.35, 0.3], [1.0, 0.8])
    yaw = rng.uniform(0, 2 * np.pi)
    offset = rng.uniform(-0.15, 0.15, 2)
    tile = rng.uniform(0.3, 1.2)
    table = Surface(
        _rectangle(
            np.array([offset[0], offset[1], 0.0]),
            np.array([0.0, 0, 1]),
            np.array([-math.sin(yaw), math.cos(yaw), 0.0]),
            float(half[0]),
            float(half[1]),
        ),
        real_assets.load_texture(table_ref),
        uv_scale=(float(2 * half[0] / tile), float(2 * half[1] / tile)),
        name=table_ref,
    )
    backdrop = None
    backdrop_ref = None
    if rng.random() < REAL_BACKDROP_PROB:
        backdrop_ref = backdrops[int(rng.integers(len(backdrops)))]
        back_dist = rng.uniform(0.25, 0.6)
        back_centre = np.array([centre[0], centre[1], 0.0]) - back_dist * heading + np.array([0, 0, 0.75])
        tile = rng.uniform(0.6, 2.0)
        backdrop = Surface(
            _rectangle(back_centre, heading, np.array([0.0, 0, 1]), 1.5, 0.75),
            real_assets.load_texture(backdrop_ref),
            uv_scale=(float(3.0 / tile), float(1.5 / tile)),
            name=backdrop_ref,
        )
    hdri = hdris[int(rng.integers(len(hdris)))]
    rotation = float(rng.uniform(0.0, 360.0))
    jitter = math.exp(rng.uniform(*np.log(REAL_EXPOSURE_JITTER)))
    albedo = float(np.clip(table.texture.mean(), 0.08, 0.8))
    exposure = REAL_TABLE_RADIANCE * math.pi / (real_assets.hdri_table_irradiance(hdri) * albedo) * jitter
    return LabScene(
        camera=camera,
        objects=tuple(objects),
        table=table,
        backdrop=backdrop,
        envmap=real_assets.load_light_probe(hdri),
        light_radiance=0.0,
        envmap_rotation_deg=rotation,
        envmap_scale=float(exposure),
        provenance={
            "hdri": hdri,
            "hdri_rotation_deg": rotation,
            "exposure": float(exposure),
            "table_texture": table_ref,
            "backdrop_texture": backdrop_ref,
        },
    )


# ----------------------------------------------------------------------------------------------------
# Mitsuba


def _mesh(mi, name: str, mesh: TriMesh, bsdf) -> Any:
    props = mi.Properties()
    props["bsdf"] = bsdf
    m = mi.Mesh(name, len(mesh.vertices), len(mesh.faces), props=props, has_vertex_normals=True)
    params = mi.traverse(m)
    params["vertex_positions"] = mesh.vertices.astype(np.float32).ravel()
    params["vertex_normals"] = mesh.normals.astype(np.float32).ravel()
    params["faces"] = mesh.faces.astype(np.uint32).ravel()
    params.update()
    return m


def _object_bsdf(obj: GlassObject, twin: bool) -> dict:
    if twin:
        return {"type": "diffuse", "reflectance": {"type": "rgb", "value": list(obj.twin_color)}}
    bsdf: dict[str, Any] = {"type": "dielectric", "int_ior": obj.ior, "ext_ior": 1.0}
    if obj.roughness is not None:
        bsdf = {**bsdf, "type": "roughdielectric", "distribution": "ggx", "alpha": obj.roughness}
    bsdf["specular_transmittance"] = {"type": "rgb", "value": list(obj.tint)}
    return bsdf


def _sensor(mi, camera: Camera, sampler: dict, rfilter: str) -> dict:
    r = camera.rotation()
    to_world = np.eye(4)
    to_world[:3, 0], to_world[:3, 1], to_world[:3, 2] = -r[:, 0], -r[:, 1], r[:, 2]  # Mitsuba: x left, y up
    to_world[:3, 3] = camera.origin
    return {
        "type": "perspective",
        "fov": camera.fov_deg,
        "fov_axis": "x",
        "near_clip": 0.01,
        "far_clip": 100.0,
        "to_world": mi.ScalarTransform4f(to_world.tolist()),
        "film": {
            "type": "hdrfilm",
            "width": camera.width,
            "height": camera.height,
            "pixel_format": "rgb",
            "rfilter": {"type": rfilter},
        },
        "sampler": sampler,
    }


def _bitmap(mi, img: np.ndarray):
    """``mi.Bitmap`` of a float32 image (Mitsuba refuses read-only arrays such as the cached assets)."""
    if not img.flags.writeable or not img.flags.c_contiguous or img.dtype != np.float32:
        img = np.array(img, dtype=np.float32, order="C", copy=True)
    return mi.Bitmap(img)


def _env_to_world(mi, rotation_deg: float):
    """Envmap transform: +90 deg about x (map top -> world +z), then ``rotation_deg`` about world +z."""
    base = mi.ScalarTransform4f().rotate([1.0, 0.0, 0.0], 90.0)
    if rotation_deg == 0.0:
        return base  # exactly the transform procedural scenes have always used
    return mi.ScalarTransform4f().rotate([0.0, 0.0, 1.0], float(rotation_deg)) @ base


def _scene_dict(mi, scene: LabScene, twin: bool, integrator: dict, sampler: dict, rfilter: str) -> dict:
    d: dict[str, Any] = {
        "type": "scene",
        "integrator": integrator,
        "sensor": _sensor(mi, scene.camera, sampler, rfilter),
        # Mitsuba's environment maps have +y up; rotate so that the map's top is the world's +z, then
        # (optionally) about the world's +z.
        "env": {
            "type": "envmap",
            "bitmap": _bitmap(mi, scene.envmap),
            "to_world": _env_to_world(mi, scene.envmap_rotation_deg),
        },
    }
    if scene.envmap_scale != 1.0:
        d["env"]["scale"] = float(scene.envmap_scale)
    if scene.light_radiance > 0:
        d["light"] = {
            "type": "sphere",
            "center": list(scene.light_position),
            "radius": scene.light_radius,
            "emitter": {"type": "area", "radiance": {"type": "rgb", "value": [scene.light_radiance] * 3}},
        }
    for name, surf in (("table", scene.table), ("backdrop", scene.backdrop)):
        if surf is not None:
            tex: dict[str, Any] = {
                "type": "bitmap",
                "bitmap": _bitmap(mi, surf.texture),
                "raw": True,
            }
            if tuple(surf.uv_scale) != (1.0, 1.0):
                tex["to_uv"] = mi.ScalarTransform4f().scale([surf.uv_scale[0], surf.uv_scale[1], 1.0])
            d[name] = {
                "type": "rectangle",
                "to_world": mi.ScalarTransform4f(surf.to_world.tolist()),
                "bsdf": {"type": "diffuse", "reflectance": tex},
            }
    for i, obj in enumerate(scene.objects):
        name = f"object_{i:02d}"
        bsdf = _object_bsdf(obj, twin)
        if isinstance(obj.geometry, Sphere):
            d[name] = {
                "type": "sphere",
                "center": list(obj.geometry.center),
                "radius": obj.geometry.radius,
                "bsdf": bsdf,
            }
        else:
            d[name] = _mesh(mi, name, obj.geometry, mi.load_dict(bsdf))
    return d


def _to_srgb8(linear: np.ndarray) -> np.ndarray:
    x = np.clip(np.nan_to_num(linear, nan=0.0), 0.0, 1.0)
    srgb = np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1 / 2.4) - 0.055)
    return np.rint(srgb * 255.0).astype(np.uint8)


def render_rgb(scene: LabScene, twin: bool = False, spp: int = 32, seed: int = 0) -> np.ndarray:
    """Path-trace one view.

    Args:
        scene: the view.
        twin: render the material-changed twin (glass -> coloured diffuse).
        spp: samples per pixel.
        seed: sampler seed (the render is a deterministic function of scene, spp and seed).

    Returns:
        (H, W, 3) uint8 sRGB image.
    """
    mi = _mitsuba()
    integrator = {"type": "path", "max_depth": MAX_DEPTH}
    sampler = {"type": "independent", "sample_count": spp}
    ms = mi.load_dict(_scene_dict(mi, scene, twin, integrator, sampler, "gaussian"), optimize=False)
    img = np.array(mi.render(ms, seed=seed, spp=spp), dtype=np.float32)
    return _to_srgb8(img[..., :3])


def render_ground_truth(scene: LabScene, twin: bool = False) -> dict[str, np.ndarray]:
    """Exact per-pixel geometry at the pixel centres from Mitsuba's ``aov`` integrator.

    Returns:
        Dict with ``normals`` (H, W, 3) float32 unit camera-frame normals (OpenCV axes, facing the
        camera, zero where invalid), ``depth`` (H, W) float32 z-depth in metres (0 where invalid),
        ``valid`` (H, W) bool (a surface was hit), ``mask`` (H, W) bool (glass objects),
        ``instance`` (H, W) int16 (-1 none, else index into ``scene.objects``), ``semantic`` (H, W) uint8.
    """
    mi = _mitsuba()
    integrator = {"type": "aov", "aovs": "pp:position,nn:sh_normal,gn:geo_normal,si:shape_index"}
    sampler = {"type": "stratified", "sample_count": 1, "jitter": False}
    ms = mi.load_dict(_scene_dict(mi, scene, twin, integrator, sampler, "box"), optimize=False)
    aov = np.array(mi.render(ms, seed=0, spp=1), dtype=np.float64)
    pos, sh, gn, si = aov[..., 0:3], aov[..., 3:6], aov[..., 6:9], np.rint(aov[..., 9]).astype(int)

    # Shape indices are 1-based positions in ms.shapes() (0 = miss); map them to names every load.
    names = ["<miss>"] + [s.id() for s in ms.shapes()]
    lut_sem = np.zeros(len(names), np.uint8)
    lut_inst = np.full(len(names), -1, np.int16)
    for k, name in enumerate(names):
        if name in ("table", "backdrop"):
            lut_sem[k] = CLASSES.index(name)
        elif name.startswith("object_"):
            i = int(name.split("_")[1])
            lut_inst[k] = i
            lut_sem[k] = CLASSES.index(scene.objects[i].kind)
    valid = (si > 0) & np.array([n != "light" for n in names])[si]
    semantic = np.where(valid, lut_sem[si], 0).astype(np.uint8)
    instance = np.where(valid, lut_inst[si], -1).astype(np.int16)

    origin = np.asarray(scene.camera.origin)
    r = scene.camera.rotation()
    ray = pos - origin
    depth = ray @ r[:, 2]
    view = ray / np.maximum(np.linalg.norm(ray, axis=-1, keepdims=True), 1e-12)
    # Hits from behind (a one-sided rectangle seen from its back): flip to face the camera.
    flip = np.sign(np.einsum("hwc,hwc->hw", gn, view))[..., None]
    sh = np.where(flip > 0, -sh, sh)
    sh /= np.maximum(np.linalg.norm(sh, axis=-1, keepdims=True), 1e-12)
    # Interpolated shading normals can lean slightly away at grazing angles: project them back so
    # that n . view_dir < 0 holds for every valid pixel.
    eps = 1e-3
    ndv = np.einsum("hwc,hwc->hw", sh, view)[..., None]
    sh = np.where(ndv > -eps, sh - (ndv + eps) * view, sh)
    sh /= np.maximum(np.linalg.norm(sh, axis=-1, keepdims=True), 1e-12)
    normals = sh @ r  # world -> OpenCV camera frame (R^T n for each pixel)
    normals[~valid] = 0.0
    depth[~valid] = 0.0
    return {
        "normals": normals.astype(np.float32),
        "depth": depth.astype(np.float32),
        "valid": valid,
        "mask": instance >= 0,
        "instance": instance,
        "semantic": semantic,
    }


def render_view(scene: LabScene, spp: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    """Render everything for one view: ``rgb``, ``rgb_twin`` (uint8) and ``render_ground_truth``'s maps.

    The twin shares geometry, so the ground truth is rendered once (tests check it is identical).
    """
    out = render_ground_truth(scene)
    out["rgb"] = render_rgb(scene, twin=False, spp=spp, seed=seed)
    out["rgb_twin"] = render_rgb(scene, twin=True, spp=spp, seed=seed)
    return out


# ----------------------------------------------------------------------------------------------------
# Dataset


def _real_meta(views: dict[str, dict[str, Any]], source: str) -> dict[str, Any]:
    """meta.json keys of the "real" source: asset lists per split and per-view provenance."""
    if source != "real":
        return {}
    from sim.render import real_assets

    return {
        "hdris": {"train": list(real_assets.HDRI_TRAIN), "test": list(real_assets.HDRI_TEST)},
        "hdri_dir": str(real_assets.HDRI_DIR),
        "table_textures": {k: list(v) for k, v in real_assets.TABLE_TEXTURES.items()},
        "backdrop_textures": {k: list(v) for k, v in real_assets.BACKDROP_TEXTURES.items()},
        "exposure": {
            "table_radiance": REAL_TABLE_RADIANCE,
            "jitter": list(REAL_EXPOSURE_JITTER),
            "rule": "envmap scale = table_radiance * pi / (upper-hemisphere irradiance of the HDRI * clip(mean table albedo, 0.08, 0.8)) * jitter",
        },
        "views": views,
    }


def _render_dataset_view(args: tuple) -> tuple[LabScene, dict[str, np.ndarray]]:
    """Worker of ``make_dataset``: sample and render view ``index`` (a pure function of its arguments)."""
    seed, index, split, size, spp, source, framing = args
    scene = sample_scene(dataset_io.view_rng(seed, index), size, source=source, split=split, framing=framing)
    view = render_view(scene, spp=spp, seed=index)
    # Only what the parent writes travels back (the scene keeps its meshes, not its textures).
    light = LabScene(camera=scene.camera, objects=scene.objects, provenance=scene.provenance)
    return light, {k: view[k] for k in ("rgb", "rgb_twin", "normals", "depth", "mask", "semantic")}


def make_dataset(
    out: Path,
    n: int,
    seed: int = 0,
    size: int | None = None,
    spp: int = 32,
    test_fraction: float = 0.2,
    source: str = "procedural",
    workers: int = 1,
    framing: str = "workspace",
) -> dict:
    """Render ``n`` views of random glass labware into ``out`` in the ``embodied-dense/1`` layout.

    View ``i`` is drawn from ``dataset_io.view_rng(seed, i)``, so the same seed gives bit-identical files
    and a view does not change when ``n`` grows. ``meta.json`` is written last. Besides the maps listed
    in the module docstring, ``<split>/cameras.json`` holds each view's (4, 4) OpenCV camera-to-world
    transform (world frame: z up, metres, table top at z = 0).

    Args:
        out: dataset root folder (created; files of the same ids are overwritten).
        n: number of views.
        seed: dataset seed.
        size: square image size in pixels (default ``DEFAULT_SIZE``).
        spp: path-tracing samples per pixel.
        test_fraction: share of views (the last ones) that go to the ``test`` split.
        source: "procedural" or "real" (``sample_scene``); with "real", test views use only the held-out
            HDRIs / textures of ``sim.render.real_assets`` and meta.json lists them and, per view, the
            HDRI, its rotation, the exposure and the texture refs (``views``).
        workers: processes rendering views in parallel (spawn context); the files are identical to
            ``workers=1`` because every view is seeded by its index and written by this process.
        framing: "workspace" or "closeup" (source "real" only; ``sample_scene``).

    Returns:
        Summary dict: root, n, splits, size, spp, seconds, and the meta.json contents under "meta".
    """
    dataset_io.check_make_args(n, seed, size, spp, test_fraction)
    if source not in SOURCES:
        raise ConfigError(f"source: expected one of {SOURCES}, got {source!r}")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"workers: expected an int >= 1, got {workers!r}")
    if framing not in FRAMINGS or (framing != "workspace" and source != "real"):
        raise ConfigError(f"framing: expected one of {FRAMINGS} ('closeup' with source 'real'), got {framing!r}")
    size = DEFAULT_SIZE if size is None else size
    out = Path(out)
    t0 = time.perf_counter()
    counts = dict.fromkeys(dataset_io.SPLITS, 0)
    cameras: dict[str, dict[str, Any]] = {s: {} for s in dataset_io.SPLITS}
    views: dict[str, dict[str, Any]] = {}
    glass_fraction = []
    jobs = dataset_io.split_ids(n, test_fraction)
    args = [(seed, index, split, size, spp, source, framing) for split, _sid, index in jobs]
    if workers > 1 and len(args) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(min(workers, len(args)), mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_render_dataset_view, args)
    else:
        pool = None
        results = map(_render_dataset_view, args)
    try:
        for (split, sid, _index), (scene, view) in zip(jobs, results):
            write_dense_sample(
                out,
                split,
                sid,
                rgb=view["rgb"],
                rgb_twin=view["rgb_twin"],
                normals=view["normals"],  # zero vectors where invalid
                depth=view["depth"],  # 0 where invalid
                mask=view["mask"],  # bool -> 0 / 255
                semantic=view["semantic"],
            )
            counts[split] += 1
            dataset_io.view_done()
            cameras[split][sid] = {
                "cam_to_world": scene.camera.cam_to_world().round(9).tolist(),
                "objects": [o.kind for o in scene.objects],
            }
            if scene.provenance:
                views[sid] = {"split": split, **scene.provenance}
            glass_fraction.append(float(view["mask"].mean()))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    for split in dataset_io.SPLITS:
        if counts[split]:
            write_json(out / split / "cameras.json", cameras[split])
    intr = Camera((0, 0, 0), (1, 0, 0), size, size).intrinsics()
    meta = write_meta(
        out,
        generator="sim.render.normals (Mitsuba 3 scalar_rgb path tracer)",
        seed=seed,
        normal_frame=dataset_io.NORMAL_FRAME,
        depth="z-depth in metres",
        mask="uint8: 255 = glass object, 0 = everything else (table, backdrop, no hit)",
        classes=list(CLASSES),
        splits=counts,
        projection="pinhole",
        width=size,
        height=size,
        intrinsics=intr,
        fov_x_deg=FOV_DEG,
        spp=spp,
        max_depth=MAX_DEPTH,
        maps=["rgb", "rgb_twin", "normals", "depth", "mask", "semantic"],
        source=source,
        framing=framing,
        mean_glass_fraction=round(float(np.mean(glass_fraction)), 4),
        **_real_meta(views, source),
    )
    return {
        "root": str(out),
        "n": n,
        "splits": counts,
        "size": size,
        "spp": spp,
        "mean_mask_fraction": float(np.mean(glass_fraction)),
        "seconds": time.perf_counter() - t0,
        "meta": meta,
    }
