"""Equirectangular panoramas rendered inside real MuJoCo scenes (SoLA training data, second source).

The same output as ``sim.render.panoramas`` (the analytic source), but the scenes are LIBERO's kitchen /
living-room / study scenes and robosuite's arenas, rendered with ``mujoco.Renderer`` as a cube map
and stitched to the equirectangular grid of ``sim.render.panoramas.equirect_directions`` (identical
pixel -> direction convention; see that module's docstring).

Cube map (``render_cube`` / ``stitch``):
    Six faces of 90 deg field of view, square, ``S = face_size`` pixels, in the order ``FACES`` =
    (+x, -x, +y, -y, +z, -z) of the *world* axes (the panorama's ``yaw`` only enters the equirect
    directions). Face ``k`` has forward axis ``f``, image-right axis ``r`` and image-up axis ``u``
    (``FACE_AXES[k]``); its pixel (row i, column j), row 0 at the top, looks along
        ``f + x r + y u``,  ``x = (j + 0.5) * 2 / S - 1``,  ``y = 1 - (i + 0.5) * 2 / S``.
    Side faces have ``u = +z``; the +z face has ``u = -x``, the -z face ``u = +x`` (both ``r = -y``).
    Face maps: ``rgb`` (6, S, S, 3) uint8, ``depth`` (6, S, S) float z-depth along ``f`` in metres
    (0 = void), ``semantic`` (6, S, S) uint8 class ids. ``stitch`` converts z-depth to Euclidean range
    with the face pixel's own ray (``range = z * sqrt(1 + x^2 + y^2)``), samples semantics at the nearest
    face pixel, depth as inverse z-depth interpolated bilinearly where the 4 surrounding face pixels saw
    the same geom, away from the face's outer half-pixel rim (else the nearest pixel's range), and RGB bilinearly (clamped at face edges) at ``k x k`` stratified sub-pixel
    directions per equirect pixel (``k = isqrt(spp)``), averaged: that is the RGB supersampling.

Rendering: a scene camera is re-posed by writing ``data.cam_xpos`` / ``cam_xmat`` and ``model.cam_fovy
= 90`` (restored afterwards; ``mjv_updateScene`` reads them without recomputing kinematics). MuJoCo's
near clip is lowered to <= 1 cm and the far clip raised to >= 100 m for the render. Visible geom groups:
robosuite / LIBERO models put collision geoms in group 0, visual geoms in group 1 and debug markers in
group 2, so when any geom is in group 1 only group 1 is drawn; otherwise MuJoCo's default groups 0-2.
Sites are hidden. Segmentation keeps only ``objtype == mjOBJ_GEOM`` pixels; all else is void.

Semantic classes (``CLASSES``), assigned per geom by ``classify`` from its name, its mesh name and its
body chain (own body first, then the parents up to the world), lower-cased:
    1. robot: any of these names starts with ``robot<k>_``, ``gripper<k>_``, ``mount<k>_`` or
       ``fixed_mount<k>_`` (robosuite's prefixes).
    2. otherwise, for each name in that order, the first rule of ``RULES`` (ordered substring lists)
       that matches decides; e.g. "floor_lamp" -> decor (before floor), "wooden_cabinet" -> cabinet
       (before "bin" -> container), "desk_caddy" -> container (before "desk" -> table),
       "living_room_table" -> table (before "living_room" -> decor).
    3. otherwise a body named ``*_main`` (robosuite / LIBERO ``MujocoObject`` root) -> object.
    4. otherwise the fallback "object" (``FALLBACK``); ``geom_classes`` returns the geoms that needed it.

Scenes (``scene_names``): ``libero:<SCENE>`` (the first libero_90 task of that scene, built through
``sim.libero.env.LiberoEnv``; reset with a seed re-draws the init state and fixture poses) and
``robosuite:<Env>`` (``robosuite.make`` with a Panda; reset with a seeded placement sampler).
"""

from __future__ import annotations

import math
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.data.images import write_dense_sample, write_meta
from core.errors import ConfigError
from core.io import write_json
from sim.render import dataset_io
from sim.render.panoramas import equirect_directions, equirect_meta, equirect_summary

os.environ.setdefault("MUJOCO_GL", "egl")
if os.environ["MUJOCO_GL"] == "egl":
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

CLASSES: tuple[str, ...] = (
    "void",  # no geom hit: skybox / background
    "floor",
    "wall",
    "table",  # tables and desks (tops and legs)
    "cabinet",  # cabinets, drawers, shelves, racks
    "fixture",  # fixed appliances and fixtures: stoves, microwaves, the kitchen counter, doors, pegs
    "container",  # placement receptacles: baskets, trays, caddies, bins
    "object",  # manipulable objects (and the fallback)
    "robot",  # arm, gripper, mount
    "decor",  # wall decorations, paintings, plants, lamps, the living-room background furniture
)
FALLBACK = "object"
_ROBOT = re.compile(r"^(robot|gripper|mount|fixed_mount)\d+_")
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decor", ("decoration", "painting", "painging", "plant", "lamp", "picture")),
    ("cabinet", ("cabinet", "drawer", "shelf", "rack", "cupboard", "wardrobe")),
    ("container", ("basket", "tray", "caddy", "bin", "crate")),
    ("fixture", ("stove", "microwave", "oven", "sink", "faucet", "fridge", "kitchen_background", "door", "peg")),
    ("table", ("table", "desk")),
    ("floor", ("floor", "ground")),
    ("wall", ("wall",)),
    ("decor", ("living_room", "sofa", "couch")),
    (
        "object",
        (
            "bowl", "plate", "mug", "cup", "pot", "pan", "book", "bottle", "ketchup", "soup", "cheese",
            "sauce", "butter", "milk", "juice", "pudding", "dressing", "cube", "can", "cereal", "bread",
            "nut", "cookies", "popcorn", "chocolate", "wine", "cream", "orange", "tomato", "alphabet",
            "lemon", "apple", "banana", "box",
        ),
    ),
)  # fmt: skip
RULES_TEXT = (
    "names = [geom, mesh, own body, parent bodies ... ] lower-cased; robot if any name starts with "
    "robot<k>_/gripper<k>_/mount<k>_/fixed_mount<k>_; else per name in that order the first matching rule of "
    + "; ".join(f"{c}: {'|'.join(k)}" for c, k in RULES)
    + "; else a body named *_main -> object; else fallback object"
)

FACES: tuple[str, ...] = ("+x", "-x", "+y", "-y", "+z", "-z")
# (forward f, image right r, image up u) per face, world axes.
FACE_AXES = np.array(
    [
        [[1, 0, 0], [0, -1, 0], [0, 0, 1]],
        [[-1, 0, 0], [0, 1, 0], [0, 0, 1]],
        [[0, 1, 0], [1, 0, 0], [0, 0, 1]],
        [[0, -1, 0], [-1, 0, 0], [0, 0, 1]],
        [[0, 0, 1], [0, -1, 0], [-1, 0, 0]],
        [[0, 0, -1], [0, -1, 0], [1, 0, 0]],
    ],
    dtype=np.float64,
)

LIBERO_SCENES = tuple(
    [f"KITCHEN_SCENE{k}" for k in range(1, 11)]
    + [f"LIVING_ROOM_SCENE{k}" for k in range(1, 7)]
    + [f"STUDY_SCENE{k}" for k in range(1, 5)]
)
ROBOSUITE_SCENES = ("Lift", "PickPlace", "NutAssembly", "Door")
TEST_SCENES: tuple[str, ...] = (
    "libero:KITCHEN_SCENE9",
    "libero:KITCHEN_SCENE10",
    "libero:LIVING_ROOM_SCENE6",
    "libero:STUDY_SCENE4",
    "robosuite:Door",
)
ALL_SCENES: tuple[str, ...] = tuple(f"libero:{s}" for s in LIBERO_SCENES) + tuple(
    f"robosuite:{s}" for s in ROBOSUITE_SCENES
)
TRAIN_SCENES: tuple[str, ...] = tuple(s for s in ALL_SCENES if s not in TEST_SCENES)

EYE_HEIGHT = (0.6, 1.7)  # camera height above the floor, metres
WALL_MARGIN = 0.3  # metres kept from the walls when drawing positions
WORKSPACE_PROB = 0.5  # share of camera draws near the table / robot (the rest: uniform over the room)
WORKSPACE_RADIUS = 1.0  # metres, half side of the square around the workspace centre
CLEARANCE = 0.10  # metres kept from every geom's bounding box (pre-render check)
MIN_RANGE = 0.15  # reject a view whose nearest surface is closer (post-render check)
MAX_VOID_BELOW = 0.02  # reject a view with more void than this share below 10 deg under the horizon
MAX_TRIES = 40


# ----------------------------------------------------------------------------------------------------
# Classes


def classify(geom_name: str | None, body_names=(), mesh_name: str | None = None) -> int:
    """Class id (``CLASSES``) of a geom from its name, its bodies' names (own body first, then the
    parents) and its mesh name; see the module docstring for the rules."""
    cls, _ = _classify(geom_name, body_names, mesh_name)
    return cls


def _classify(geom_name, body_names, mesh_name) -> tuple[int, bool]:
    names = [n.lower() for n in [geom_name, mesh_name, *body_names] if n]
    if any(_ROBOT.match(n) for n in names):
        return CLASSES.index("robot"), False
    for name in names:
        for cls, keys in RULES:
            if any(k in name for k in keys):
                return CLASSES.index(cls), False
    if any(n.endswith("_main") for n in names):
        return CLASSES.index("object"), False
    return CLASSES.index(FALLBACK), True


def geom_classes(model) -> tuple[np.ndarray, list[str]]:
    """(ngeom,) uint8 class id per geom of a ``mujoco.MjModel``, and the descriptions of the geoms that
    got the fallback class."""
    import mujoco

    out = np.zeros(model.ngeom, np.uint8)
    fallback = []
    for g in range(model.ngeom):
        name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g)
        mesh = None
        if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH and model.geom_dataid[g] >= 0:
            mesh = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_MESH, int(model.geom_dataid[g]))
        bodies, b = [], int(model.geom_bodyid[g])
        while b > 0:
            bodies.append(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b))
            b = int(model.body_parentid[b])
        cls, used_fallback = _classify(name, bodies, mesh)
        out[g] = cls
        if used_fallback and model.geom_group[g] in _visible_groups(model):
            fallback.append(f"{g}:{name or ''}/{mesh or ''}/{'/'.join(n or '' for n in bodies)}")
    return out, fallback


def _visible_groups(model) -> tuple[int, ...]:
    return (1,) if (np.asarray(model.geom_group) == 1).any() else (0, 1, 2)


# ----------------------------------------------------------------------------------------------------
# Cube map


def face_rays(face_size: int) -> np.ndarray:
    """(6, S, S, 3) world-frame (unnormalised, forward component 1) ray of every face pixel centre."""
    c = (np.arange(face_size) + 0.5) * 2.0 / face_size - 1.0
    y, x = -c[:, None], c[None, :]
    f, r, u = FACE_AXES[:, 0], FACE_AXES[:, 1], FACE_AXES[:, 2]
    return f[:, None, None] + x[None, ..., None] * r[:, None, None] + y[None, ..., None] * u[:, None, None]


class CubeRenderer:
    """Renders cube maps of one ``mujoco.MjModel`` (keep one per model; ``close()`` frees the GL context).

    Args:
        model: the model (a camera is borrowed and restored; the model needs ``ncam >= 1``).
        face_size: face side S in pixels.
        classes: (ngeom,) uint8 class id per geom (default ``geom_classes(model)``).
    """

    def __init__(self, model, face_size: int, classes: np.ndarray | None = None):
        import mujoco

        if model.ncam < 1:
            raise ConfigError("CubeRenderer: the model needs at least one camera to borrow")
        self.model = model
        self.face_size = int(face_size)
        self.classes = geom_classes(model)[0] if classes is None else np.asarray(classes, np.uint8)
        self.lut = np.concatenate([self.classes, [0]]).astype(np.uint8)  # index -1 -> void
        gl = model.vis.global_
        gl.offwidth, gl.offheight = max(gl.offwidth, self.face_size), max(gl.offheight, self.face_size)
        self.renderer = mujoco.Renderer(model, self.face_size, self.face_size)
        self.option = mujoco.MjvOption()
        self.option.geomgroup[:] = 0
        for g in _visible_groups(model):
            self.option.geomgroup[g] = 1
        self.option.sitegroup[:] = 0
        self.cam = 0
        self._mj = mujoco

    def close(self) -> None:
        self.renderer.close()

    def render(self, data, origin) -> dict[str, np.ndarray]:
        """Cube map at world point ``origin`` (3,): ``rgb`` (6, S, S, 3) uint8, ``depth`` (6, S, S)
        float32 z-depth in metres (0 = void), ``semantic`` (6, S, S) uint8, ``geom`` (6, S, S) int32
        geom id (-1 = void)."""
        mj, m, c, s = self._mj, self.model, self.cam, self.face_size
        saved = (
            float(m.cam_fovy[c]),
            data.cam_xpos[c].copy(),
            data.cam_xmat[c].copy(),
            float(m.vis.map.znear),
            float(m.vis.map.zfar),
        )
        sensor = m.cam_sensorsize[c].copy() if hasattr(m, "cam_sensorsize") else None
        ortho = int(m.cam_orthographic[c]) if hasattr(m, "cam_orthographic") else None
        extent = float(m.stat.extent)
        rgb = np.zeros((6, s, s, 3), np.uint8)
        depth = np.zeros((6, s, s), np.float32)
        geom = np.full((6, s, s), -1, np.int32)
        try:
            m.cam_fovy[c] = 90.0
            m.vis.map.znear = min(saved[3], 0.01 / extent)
            m.vis.map.zfar = max(saved[4], 100.0 / extent)
            if sensor is not None:
                m.cam_sensorsize[c] = 0.0
            if ortho is not None:
                m.cam_orthographic[c] = 0
            data.cam_xpos[c] = np.asarray(origin, np.float64)
            r = self.renderer
            for k in range(6):
                f, right, up = FACE_AXES[k]
                data.cam_xmat[c] = np.stack([right, up, -f], axis=1).ravel()  # columns: camera x, y, z
                r.update_scene(data, camera=c, scene_option=self.option)
                rgb[k] = r.render()
                r.enable_depth_rendering()
                z = r.render()
                r.disable_depth_rendering()
                r.enable_segmentation_rendering()
                seg = r.render()
                r.disable_segmentation_rendering()
                is_geom = (seg[..., 1] == mj.mjtObj.mjOBJ_GEOM) & (seg[..., 0] >= 0)
                geom[k] = np.where(is_geom, seg[..., 0], -1)
                depth[k] = np.where(is_geom, z, 0.0)
        finally:
            m.cam_fovy[c] = saved[0]
            data.cam_xpos[c] = saved[1]
            data.cam_xmat[c] = saved[2]
            m.vis.map.znear, m.vis.map.zfar = saved[3], saved[4]
            if sensor is not None:
                m.cam_sensorsize[c] = sensor
            if ortho is not None:
                m.cam_orthographic[c] = ortho
        return {"rgb": rgb, "depth": depth, "semantic": self.lut[geom], "geom": geom}


def stitch(
    faces: dict[str, np.ndarray], height: int, yaw: float = 0.0, spp: int = 1
) -> dict[str, np.ndarray]:
    """Resample a cube map (module docstring: face order / orientation) to an equirect panorama.

    Args:
        faces: ``rgb`` (6, S, S, 3) uint8, ``depth`` (6, S, S) z-depth metres (0 = void), ``semantic``
            (6, S, S) uint8.
        height: panorama height H (width 2H).
        yaw: camera heading (``sim.render.panoramas`` convention).
        spp: RGB samples per pixel (``k x k`` stratified, ``k = isqrt(spp)``), bilinear each.

    Returns:
        ``rgb`` (H, 2H, 3) uint8, ``depth`` (H, 2H) float32 Euclidean range in metres (0 = void),
        ``semantic`` (H, 2H) uint8.
    """
    depth_f = np.asarray(faces["depth"], np.float64)
    s = depth_f.shape[-1]
    range_f = depth_f * np.linalg.norm(face_rays(s), axis=-1)
    width = 2 * height

    def project(dirs):
        d = dirs.reshape(-1, 3)
        axis = np.argmax(np.abs(d), axis=1)
        rows = np.arange(len(d))
        face = 2 * axis + (d[rows, axis] < 0)
        f, r, u = FACE_AXES[face, 0], FACE_AXES[face, 1], FACE_AXES[face, 2]
        t = np.einsum("nc,nc->n", d, f)
        x = np.einsum("nc,nc->n", d, r) / t
        y = np.einsum("nc,nc->n", d, u) / t
        return face, (1.0 - y) * s / 2 - 0.5, (x + 1.0) * s / 2 - 0.5  # continuous (row, col)

    face, row, col = project(equirect_directions(height, width, yaw))
    ri = np.clip(np.rint(row), 0, s - 1).astype(np.int64)
    ci = np.clip(np.rint(col), 0, s - 1).astype(np.int64)
    sem_f = np.asarray(faces["semantic"])
    ids_f = np.asarray(faces["geom"]) if "geom" in faces else sem_f
    rng = range_f[face, ri, ci]
    sem = sem_f[face, ri, ci].astype(np.uint8)
    # Where the 4 face pixels around the sample saw the same surface (same geom id, or class when no ids
    # are given, z within a factor 2), interpolate 1 / z bilinearly (exact on planes: inverse depth is affine
    # in the image) and take the range along the sample's own ray; elsewhere the nearest pixel's range.
    r0, c0 = np.floor(row).astype(np.int64), np.floor(col).astype(np.int64)
    wr, wc = row - r0, col - c0
    quad = [(np.clip(r0 + a, 0, s - 1), np.clip(c0 + b, 0, s - 1)) for a in (0, 1) for b in (0, 1)]
    z4 = np.stack([depth_f[face, r, c] for r, c in quad])
    id4 = np.stack([ids_f[face, r, c] for r, c in quad])
    smooth = (z4 > 0).all(axis=0) & (id4 == id4[0]).all(axis=0)
    smooth &= (row >= 0) & (row <= s - 1) & (col >= 0) & (col <= s - 1)  # no clamped neighbours
    smooth &= z4.max(axis=0) <= 2.0 * np.where(z4.min(axis=0) > 0, z4.min(axis=0), np.inf)
    w4 = np.stack([(1 - wr) * (1 - wc), (1 - wr) * wc, wr * (1 - wc), wr * wc])
    with np.errstate(divide="ignore"):
        inv_z = (w4 / np.where(z4 > 0, z4, np.inf)).sum(axis=0)
        x_q, y_q = (col + 0.5) * 2 / s - 1, 1 - (row + 0.5) * 2 / s
        smooth_range = np.sqrt(1 + x_q**2 + y_q**2) / inv_z
    rng = np.where(smooth & (inv_z > 0), smooth_range, rng)
    rng = np.where(sem == 0, 0.0, rng)

    rgb_f = np.asarray(faces["rgb"], np.float64)
    k = max(1, math.isqrt(spp))
    acc = np.zeros((height * width, 3))
    for a in range(k):
        for b in range(k):
            face, row, col = project(equirect_directions(height, width, yaw, ((a + 0.5) / k, (b + 0.5) / k)))
            r0 = np.clip(np.floor(row), 0, s - 1).astype(np.int64)
            c0 = np.clip(np.floor(col), 0, s - 1).astype(np.int64)
            r1, c1 = np.minimum(r0 + 1, s - 1), np.minimum(c0 + 1, s - 1)
            wr = np.clip(row - r0, 0.0, 1.0)[:, None]
            wc = np.clip(col - c0, 0.0, 1.0)[:, None]
            acc += (1 - wr) * ((1 - wc) * rgb_f[face, r0, c0] + wc * rgb_f[face, r0, c1]) + wr * (
                (1 - wc) * rgb_f[face, r1, c0] + wc * rgb_f[face, r1, c1]
            )
    return {
        "rgb": np.clip(np.rint(acc / (k * k)), 0, 255).astype(np.uint8).reshape(height, width, 3),
        "depth": rng.astype(np.float32).reshape(height, width),
        "semantic": sem.reshape(height, width),
    }


# ----------------------------------------------------------------------------------------------------
# Scenes


def scene_names(split: str) -> list[str]:
    """Scene names of a split: ``"train"`` (``TRAIN_SCENES``) or ``"test"`` (held out, ``TEST_SCENES``)."""
    if split == "train":
        return list(TRAIN_SCENES)
    if split == "test":
        return list(TEST_SCENES)
    raise ConfigError(f"split: expected 'train' or 'test', got {split!r}")


@dataclass
class Scene:
    """A built scene: ``env`` (LiberoEnv or robosuite env), raw ``model`` / ``data``, and ``reset(seed)``."""

    name: str
    env: object
    kind: str
    _closed: bool = field(default=False, repr=False)

    @property
    def model(self):
        sim = self.env.sim
        return sim.model._model

    @property
    def data(self):
        return self.env.sim.data._data

    def reset(self, seed: int) -> None:
        """Re-draw the scene's init state / object placement deterministically from ``seed``."""
        if self.kind == "libero":
            self.env.reset(seed=int(seed))
            return
        from sim.api import seeded_robosuite_reset

        seeded_robosuite_reset(self.env, seed)

    def close(self) -> None:
        if not self._closed:
            self.env.close()
            self._closed = True


def build_scene(name: str) -> Scene:
    """Build ``libero:<SCENE>`` or ``robosuite:<Env>`` (see ``ALL_SCENES``)."""
    kind, _, which = name.partition(":")
    if kind == "libero" and which in LIBERO_SCENES:
        from sim.libero.env import LiberoEnv
        from sim.libero.suites import list_tasks

        tasks = list_tasks("libero_90")
        index = next(i for i, t in enumerate(tasks) if t.name.startswith(which + "_"))
        env = LiberoEnv("libero_90", index, image_size=8, wrist_image=False)
        return Scene(name, env, "libero")
    if kind == "robosuite" and which in ROBOSUITE_SCENES:
        import robosuite

        # robosuite draws some model parameters (Lift's cube size) from the env's own RNG while it builds the
        # model (unseeded by default); seed it from the scene name so a scene is the same in every process.
        env = robosuite.make(
            which,
            robots="Panda",
            has_renderer=False,
            has_offscreen_renderer=False,
            use_camera_obs=False,
            hard_reset=False,
            ignore_done=True,
            seed=zlib.crc32(name.encode()),
        )
        return Scene(name, env, "robosuite")
    raise ConfigError(f"unknown scene {name!r}; known: {list(ALL_SCENES)}")


def walkable_region(model, data, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(xy low (2,), xy high (2,), floor z) from the wall geoms' centres (minus ``WALL_MARGIN``) and the
    highest floor geom; a 4 x 4 m box around the origin when the model has no walls."""
    walls = np.flatnonzero(classes == CLASSES.index("wall"))
    floors = np.flatnonzero(classes == CLASSES.index("floor"))
    floor_z = float(data.geom_xpos[floors, 2].max()) if len(floors) else 0.0
    if len(walls) == 0:
        return np.array([-2.0, -2.0]), np.array([2.0, 2.0]), floor_z
    xy = data.geom_xpos[walls, :2]
    return xy.min(axis=0) + WALL_MARGIN, xy.max(axis=0) - WALL_MARGIN, floor_z


def workspace_centre(model, data, classes: np.ndarray) -> np.ndarray | None:
    """(2,) xy centre of the table geoms (else the robot's), where half of the cameras are placed near
    (``WORKSPACE_PROB``, within ``WORKSPACE_RADIUS``): uniform positions over a room see mostly floor and walls."""
    for cls in ("table", "robot"):
        ids = np.flatnonzero(classes == CLASSES.index(cls))
        if len(ids):
            return data.geom_xpos[ids, :2].mean(axis=0)
    return None


def _clear(model, data, p: np.ndarray, groups) -> bool:
    """True when ``p`` is outside every visible non-plane geom's oriented bounding box grown by CLEARANCE."""
    import mujoco

    sel = np.isin(model.geom_group, groups) & (model.geom_type != mujoco.mjtGeom.mjGEOM_PLANE)
    ids = np.flatnonzero(sel)
    local = np.einsum("nji,nj->ni", data.geom_xmat[ids].reshape(-1, 3, 3), p - data.geom_xpos[ids])
    aabb = model.geom_aabb[ids]
    inside = (np.abs(local - aabb[:, :3]) < aabb[:, 3:] + CLEARANCE).all(axis=1)
    return not inside.any()


def render_view(
    scene: Scene, renderer: CubeRenderer, rng: np.random.Generator, height: int, spp: int
) -> tuple[dict[str, np.ndarray], np.ndarray, float, int]:
    """Draw a clear camera pose in the (already reset) scene and render it.

    Returns ``(panorama, origin (3,), yaw, tries)``; after ``MAX_TRIES`` rejections the last draw is kept.
    """
    m, d = scene.model, scene.data
    lo, hi, floor_z = walkable_region(m, d, renderer.classes)
    groups = _visible_groups(m)
    lat = np.pi / 2 - (np.arange(height) + 0.5) * np.pi / height
    below = lat < -np.deg2rad(10)
    pano = origin = yaw = None
    centre = workspace_centre(m, d, renderer.classes)
    for tries in range(1, MAX_TRIES + 1):
        if centre is not None and rng.random() < WORKSPACE_PROB:  # near the table: where the robot works
            xy = np.clip(centre + rng.uniform(-WORKSPACE_RADIUS, WORKSPACE_RADIUS, 2), lo, hi)
        else:
            xy = rng.uniform(lo, hi)
        origin = np.array([*xy, floor_z + rng.uniform(*EYE_HEIGHT)])
        yaw = float(rng.uniform(-np.pi, np.pi))
        if not _clear(m, d, origin, groups) and tries < MAX_TRIES:
            continue
        pano = stitch(renderer.render(d, origin), height, yaw, spp)
        hit = pano["depth"] > 0
        near = hit.any() and float(pano["depth"][hit].min()) < MIN_RANGE
        void_below = float((~hit[below]).mean()) if below.any() else 0.0
        if not near and void_below <= MAX_VOID_BELOW:
            break
    return pano, origin, yaw, tries


# ----------------------------------------------------------------------------------------------------
# Dataset


def make_dataset(
    out: Path,
    n: int,
    seed: int = 0,
    size: int | None = None,
    spp: int = 4,
    test_fraction: float = 0.2,
    face_size: int | None = None,
    workers: int = 1,
    scenes: dict[str, list[str]] | None = None,
) -> dict:
    """Render ``n`` panoramas inside MuJoCo scenes into ``out`` (``embodied-dense/1``, as
    ``sim.render.panoramas.make_dataset``): ``rgb``, ``depth`` (Euclidean range, uint16 mm, 0 = void),
    ``semantic`` (``CLASSES``).

    View ``i`` draws from ``view_rng(seed, i)``: its scene (uniform over its split's scenes), the scene
    reset seed, then camera positions (half near the table / robot, the rest uniform over the walkable region, ``EYE_HEIGHT`` above the floor,
    redrawn while too close to geometry) and yaw. Views are rendered grouped by scene, one env alive at
    a time. ``<split>/cameras.json`` holds per view the scene, reset seed, origin, yaw and tries;
    ``meta.json`` lists classes, rules, scenes and per-view sources. Same seed -> identical image and
    camera files (``meta.json`` differs only in ``seconds_per_view``).

    Args:
        out, n, seed, size, test_fraction: as the analytic source (size = H, default 64).
        spp: RGB samples per equirect pixel (``isqrt(spp)^2`` bilinear samples of the faces).
        face_size: cube face side in pixels (default H: face pixels are at most as large as the
            equirect pixels at the equator).
        workers: only 1 is supported.
        scenes: optional {"train": [...], "test": [...]} overriding ``TRAIN_SCENES`` / ``TEST_SCENES``.
    """
    dataset_io.check_make_args(n, seed, size, spp, test_fraction)
    if workers != 1:
        raise ConfigError(f"workers: only 1 is supported, got {workers!r}")
    height = 64 if size is None else size
    face_size = height if face_size is None else int(face_size)
    if face_size < 8:
        raise ConfigError(f"face_size: expected an int >= 8, got {face_size!r}")
    split_scenes = {s: list((scenes or {}).get(s) or scene_names(s)) for s in dataset_io.SPLITS}
    for s, names in split_scenes.items():
        for name in names:
            if name not in ALL_SCENES:
                raise ConfigError(f"scenes[{s!r}]: unknown scene {name!r}; known: {list(ALL_SCENES)}")
    out = Path(out)
    t0 = time.perf_counter()

    plan = []  # (scene, index, split, sid, reset_seed, rng)
    for split, sid, index in dataset_io.split_ids(n, test_fraction):
        rng = dataset_io.view_rng(seed, index)
        names = split_scenes[split]
        scene_name = names[int(rng.integers(len(names)))]
        plan.append((scene_name, index, split, sid, int(rng.integers(2**31 - 1)), rng))
    plan.sort(key=lambda v: (v[0], v[1]))

    counts = dict.fromkeys(dataset_io.SPLITS, 0)
    cameras: dict[str, dict] = {s: {} for s in dataset_io.SPLITS}
    views: dict[str, dict] = {}
    class_pixels = np.zeros(len(CLASSES), np.int64)
    fallback: dict[str, list[str]] = {}
    render_seconds = 0.0
    scene = renderer = None
    try:
        for scene_name, _index, split, sid, reset_seed, rng in plan:
            if scene is None or scene.name != scene_name:
                if renderer is not None:
                    renderer.close()
                if scene is not None:
                    scene.close()
                scene = renderer = None
                scene = build_scene(scene_name)
                scene.reset(reset_seed)
                renderer = CubeRenderer(scene.model, face_size)
                fallback[scene_name] = geom_classes(scene.model)[1]
            else:
                scene.reset(reset_seed)
            t1 = time.perf_counter()
            pano, origin, yaw, tries = render_view(scene, renderer, rng, height, spp)
            render_seconds += time.perf_counter() - t1
            write_dense_sample(
                out, split, sid, rgb=pano["rgb"], depth=pano["depth"], semantic=pano["semantic"]
            )
            counts[split] += 1
            dataset_io.view_done()
            cameras[split][sid] = {
                "scene": scene_name,
                "reset_seed": reset_seed,
                "origin": np.round(origin, 9).tolist(),
                "yaw": round(yaw, 9),
                "tries": tries,
            }
            views[sid] = {"scene": scene_name, "split": split}
            class_pixels += np.bincount(pano["semantic"].ravel(), minlength=len(CLASSES))
    finally:
        if renderer is not None:
            renderer.close()
        if scene is not None:
            scene.close()
    for split in dataset_io.SPLITS:
        if counts[split]:
            write_json(out / split / "cameras.json", {k: cameras[split][k] for k in sorted(cameras[split])})
    seconds = time.perf_counter() - t0
    meta = write_meta(
        out,
        generator="sim.render.scene_panoramas (MuJoCo cube map stitched to equirect)",
        source="mujoco",
        seed=seed,
        depth="Euclidean distance from the camera centre in metres (uint16 millimetres in files, 0 = void)",
        classes=list(CLASSES),
        class_rules=RULES_TEXT,
        splits=counts,
        **equirect_meta(height, spp),
        face_size=face_size,
        train_scenes=split_scenes["train"],
        test_scenes=split_scenes["test"],
        views={k: views[k] for k in sorted(views)},
        fallback_geoms={k: len(v) for k, v in sorted(fallback.items())},
        seconds_per_view=round(seconds / n, 3),
    )
    return equirect_summary(out, n, counts, height, CLASSES, class_pixels, seconds, meta, fallback_geoms=fallback,
                            render_seconds_per_view=render_seconds / n)
