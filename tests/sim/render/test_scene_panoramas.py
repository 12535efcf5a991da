import json

import numpy as np
import pytest

from core.errors import ConfigError
from core.testing import folder_digest
from sim.render import panoramas as P

mujoco = pytest.importorskip("mujoco")
S = pytest.importorskip("sim.render.scene_panoramas")

H = 32


def _sphere_faces(radius, size):
    rays = S.face_rays(size)
    depth = radius / np.linalg.norm(rays, axis=-1)  # z-depth = R cos(angle to the face axis)
    sem = np.broadcast_to(np.arange(1, 7, dtype=np.uint8)[:, None, None], (6, size, size)).copy()
    rgb = np.zeros((6, size, size, 3), np.uint8)
    rgb[..., 0] = sem * 30
    return {"rgb": rgb, "depth": depth, "semantic": sem}


@pytest.mark.parametrize("yaw", [0.0, 0.9])
def test_stitch_sphere_range_and_face_orientation(yaw):
    faces = _sphere_faces(2.5, 24)
    pano = S.stitch(faces, H, yaw=yaw, spp=4)
    assert pano["rgb"].shape == (H, 2 * H, 3) and pano["depth"].shape == (H, 2 * H)
    np.testing.assert_allclose(pano["depth"], 2.5, rtol=2e-3)
    for k, direction in enumerate([(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)]):
        r, c = P.direction_to_pixel(np.array(direction, float), H, 2 * H, yaw)
        assert pano["semantic"][r, c] == k + 1, S.FACES[k]
    # Image "up" of a side face is world +z: the +x face's top row is seen above the horizon.
    d = S.face_rays(8)[0, 0, 4]
    assert d[2] > 0 and d[0] == 1.0


_FLOOR_XML = """<mujoco><visual><map znear="0.05" zfar="20"/></visual><worldbody>
<light pos="0 0 5"/><geom name="floor" type="plane" size="40 40 0.1"/>
<camera name="c" pos="0 0 1"/></worldbody></mujoco>"""

_ROOM_XML = """<mujoco><worldbody><light pos="0 0 0.5"/>
<geom name="wall_e" type="box" pos="2 0 0" size="0.05 3 3"/><geom name="wall_w" type="box" pos="-1 0 0" size="0.05 3 3"/>
<geom name="wall_n" type="box" pos="0 1.5 0" size="3 0.05 3"/><geom name="wall_s" type="box" pos="0 -0.5 0" size="3 0.05 3"/>
<geom name="floor" type="box" pos="0 0 -0.8" size="3 3 0.05"/><geom name="wall_top" type="box" pos="0 0 1.2" size="3 3 0.05"/>
<geom name="mug" type="box" pos="0.3 0 0" size="0.1 0.1 0.1"/>
<camera name="c" pos="0 0 0"/></worldbody></mujoco>"""


def _render(xml, origin, face_size=2 * H, yaw=0.0):
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    r = S.CubeRenderer(m, face_size)
    try:
        faces = r.render(d, origin)
    finally:
        r.close()
    return faces, S.stitch(faces, H, yaw=yaw, spp=4)


@pytest.mark.parametrize("h", [1.0, 0.3])
def test_mujoco_floor_plane_range(h):
    faces, pano = _render(_FLOOR_XML, [0.0, 0.0, h])
    lat = np.arcsin(P.equirect_directions(H, 2 * H)[..., 2])
    below = lat < -np.deg2rad(10)
    np.testing.assert_allclose(pano["depth"][below], h / np.sin(-lat[below]), rtol=0.01)
    assert (pano["depth"][lat > 0] == 0).all() and (pano["semantic"][lat > 0] == 0).all()
    assert (pano["semantic"][below] == S.CLASSES.index("floor")).all()
    assert (faces["depth"][5] > 0).all() and (faces["depth"][4] == 0).all()  # -z sees floor, +z void


@pytest.mark.parametrize("x, near", [(0.0, 0.2), (0.15, 0.05)])  # 5 cm from the box: not clipped
def test_mujoco_box_room_known_distances(x, near):
    faces, pano = _render(_ROOM_XML, [x, 0.0, 0.0])
    expect = {(1, 0, 0): (near, "object"), (-1, 0, 0): (0.95 + x, "wall"), (0, 1, 0): (1.45, "wall"),
              (0, -1, 0): (0.45, "wall"), (0, 0, 1): (1.15, "wall"), (0, 0, -1): (0.75, "floor")}  # fmt: skip
    for direction, (dist, cls) in expect.items():
        r, c = P.direction_to_pixel(np.array(direction, float), H, 2 * H)
        # the pixel centre is within half a pixel of the axis direction: range / cos(<= 0.07 rad)
        assert pano["depth"][r, c] == pytest.approx(dist, rel=0.01), direction
        assert S.CLASSES[pano["semantic"][r, c]] == cls, direction
    assert (pano["depth"] > 0).all()  # closed room: nothing is void
    assert pano["depth"].min() == pytest.approx(near, rel=0.01)


def test_classify_rules():
    c = S.CLASSES.index
    assert S.classify("floor", []) == c("floor")
    assert S.classify("wall_left_visual", []) == c("wall")
    assert S.classify("wall_decoration", []) == c("decor")
    assert S.classify("", [], mesh_name="floor_lamp_vis") == c("decor")
    assert S.classify("table_leg1_visual", ["table"]) == c("table")
    assert S.classify("", ["living_room_table_col", "living_room_table"]) == c("table")
    assert S.classify("living_room", []) == c("decor")
    assert S.classify("wooden_cabinet_1_g10", ["wooden_cabinet_1_cabinet_top", "wooden_cabinet_1_main"]) == c(
        "cabinet"
    )
    assert S.classify("office_book_shelf", []) == c("cabinet")
    assert S.classify("desk_caddy_1_g0", ["desk_caddy_1_main"]) == c("container")
    assert S.classify("", ["bin1"]) == c("container")
    assert S.classify("flat_stove_1_g4", ["flat_stove_1_button"]) == c("fixture")
    assert S.classify("", [], mesh_name="kitchen_background_stove_vis") == c("fixture")
    assert S.classify("Door_panel_visual", ["Door_door", "Door_frame", "Door_main"]) == c("fixture")
    assert S.classify("robot0_g0_vis", ["robot0_link0", "robot0_base"]) == c("robot")
    assert S.classify("gripper0_right_finger1_visual", []) == c("robot")
    assert S.classify("fixed_mount0_pedestal_vis", ["fixed_mount0_pedestal"]) == c("robot")
    assert S.classify("akita_black_bowl_1_g0", ["akita_black_bowl_1_main"]) == c("object")
    assert S.classify("weird_thing_g0", ["weird_thing_main"]) == c("object")
    assert S._classify("zzz", ["yyy"], None) == (c("object"), True)  # the counted fallback
    assert len(S.CLASSES) == 10 and S.CLASSES[0] == "void"


def test_scene_lists_and_bad_source(tmp_path):
    train, test = S.scene_names("train"), S.scene_names("test")
    assert not set(train) & set(test) and len(test) == 5 and len(train) + len(test) == len(S.ALL_SCENES)
    with pytest.raises(ConfigError, match="source"):
        P.make_dataset(tmp_path, n=2, source="bogus")
    with pytest.raises(ConfigError):
        S.scene_names("val")


def test_real_scene_classes_and_determinism(tmp_path):
    scenes = {"train": ["robosuite:Lift"], "test": ["robosuite:Door"]}
    s = P.make_dataset(tmp_path / "a", n=3, seed=3, size=16, source="mujoco", scenes=scenes)
    P.make_dataset(tmp_path / "b", n=3, seed=3, size=16, source="mujoco", scenes=scenes)
    a, b = (folder_digest(tmp_path / run, exclude=("meta.json",)) for run in ("a", "b"))
    assert a == b
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["projection"] == "equirectangular" and meta["classes"] == list(S.CLASSES)
    assert meta["equirect"] == P.EQUIRECT_TEXT and meta["views"]["000002"]["split"] == "test"
    assert (
        meta["views"]["000002"]["scene"] == "robosuite:Door"
        and meta["views"]["000000"]["scene"] == "robosuite:Lift"
    )
    assert s["splits"] == {"train": 2, "test": 1} and not any(s["fallback_geoms"].values())
    assert s["class_fractions"]["floor"] > 0.05 and s["class_fractions"]["wall"] > 0.05


def test_libero_scene_semantics():
    scene = S.build_scene("libero:KITCHEN_SCENE1")
    try:
        scene.reset(0)
        r = S.CubeRenderer(scene.model, 32)
        try:
            faces = r.render(scene.data, [0.8, 0.0, 1.3])  # in front of the table, facing the robot
        finally:
            r.close()
        assert faces["semantic"].max() < len(S.CLASSES)
        present = {S.CLASSES[k] for k in np.unique(faces["semantic"])}
        assert {"floor", "wall", "table", "robot", "cabinet"} <= present
        assert not S.geom_classes(scene.model)[1]
    finally:
        scene.close()
