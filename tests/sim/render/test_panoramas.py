import json
import math

import cv2
import numpy as np
import pytest
import torch

import core.data.panoramas as core_panoramas
from core.errors import ConfigError
from core.testing import folder_digest
from sim.render import panoramas as P

H = 32
SIZE = (4.0, 5.0, 2.8)
ORIGIN = np.array([1.5, 2.0, 1.4])


def _box_distance(dirs):
    with np.errstate(divide="ignore"):
        t = np.where(dirs > 0, (np.asarray(SIZE) - ORIGIN) / dirs, -ORIGIN / dirs)
    return np.where(dirs != 0, t, np.inf).min(axis=-1)


@pytest.mark.parametrize("yaw", [0.0, 0.7])
def test_box_room_distance_and_semantics(yaw):
    room = P.Room(size=SIZE, light=(2.0, 2.5, 2.7))
    pano = P.render_panorama(room, ORIGIN, H, yaw=yaw, spp=1)
    dirs = P.equirect_directions(H, 2 * H, yaw)
    np.testing.assert_allclose(pano["depth"], _box_distance(dirs), rtol=1e-6)
    sem = pano["semantic"]
    assert (sem[0] == P.CLASSES.index("ceiling")).all() and (sem[-1] == P.CLASSES.index("floor")).all()
    assert (sem[H // 2] == P.CLASSES.index("wall")).all()  # just below the horizon: walls all round
    assert pano["rgb"].shape == (H, 2 * H, 3) and pano["rgb"].dtype == np.uint8


def test_equirect_convention():
    d = P.equirect_directions(H, 2 * H)
    # Image centre looks along +x, a quarter turn to the right looks along -y (y is left), top is +z.
    np.testing.assert_allclose(d[H // 2, H], [1, 0, 0], atol=0.1)
    np.testing.assert_allclose(d[H // 2, H + H // 2], [0, -1, 0], atol=0.1)
    assert d[0, :, 2].min() > 0.99
    # Same pixel -> direction map as the shared loader (OpenCV axes: x right = -y, y down = -z, z fwd = x).
    ref = core_panoramas.equirect_directions(H, 2 * H, dtype=torch.float64).numpy()
    np.testing.assert_allclose(np.stack([-d[..., 1], -d[..., 2], d[..., 0]], axis=-1), ref, atol=1e-12)
    for yaw in (0.0, 1.3):
        dy = P.equirect_directions(H, 2 * H, yaw)
        for r, c in [(3, 5), (H // 2, H), (H - 1, 2 * H - 1)]:
            assert P.direction_to_pixel(dy[r, c], H, 2 * H, yaw) == (r, c)


def test_door_and_objects_at_known_directions():
    white = P.Material((0.8, 0.8, 0.8))
    door = P.Box("door", (SIZE[0] - 0.02, ORIGIN[1], 1.0), (0.45, 0.02, 1.0), math.pi / 2, white)
    pillar = P.Cylinder("pillar", 1.5, 0.8, 0.2, 0.0, SIZE[2], white)  # 1.2 m towards -y
    lamp = P.Ball("lamp", (0.5, 2.0, 1.4), 0.15, white)  # 1 m towards -x
    room = P.Room(size=SIZE, objects=(door, pillar, lamp), light=(2.0, 2.5, 2.7))
    pano = P.render_panorama(room, ORIGIN, H, spp=1)
    for direction, cls, dist in [
        ((1, 0, -0.2), "door", None),
        ((0, -1, 0), "pillar", 1.0),
        ((-1, 0, 0), "lamp", 0.85),
    ]:
        r, c = P.direction_to_pixel(np.array(direction, float), H, 2 * H)
        assert P.CLASSES[pano["semantic"][r, c]] == cls
        if dist is not None:  # the pixel centre is within half a pixel of the exact direction
            assert pano["depth"][r, c] == pytest.approx(dist, abs=0.02)
    # The door face sits 4 cm in front of the wall at x = Lx.
    d = P.equirect_directions(H, 2 * H)
    on_door = pano["semantic"] == P.CLASSES.index("door")
    t_door = (SIZE[0] - 0.04 - ORIGIN[0]) / d[on_door][:, 0]
    np.testing.assert_allclose(pano["depth"][on_door], t_door, rtol=1e-6)


def test_camera_outside_room_is_rejected():
    with pytest.raises(ConfigError, match="not inside the room"):
        P.render_panorama(P.Room(size=SIZE), np.array([5.0, 1.0, 1.0]), 8)


def test_make_dataset(tmp_path):
    s = P.make_dataset(tmp_path / "a", n=3, seed=1, size=16, spp=4)
    P.make_dataset(tmp_path / "b", n=3, seed=1, size=16, spp=4)
    assert folder_digest(tmp_path / "a") == folder_digest(tmp_path / "b")
    assert s["splits"] == {"train": 2, "test": 1}
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["projection"] == "equirectangular" and meta["classes"] == list(P.CLASSES)
    assert "Euclidean" in meta["depth"]
    depth = cv2.imread(str(tmp_path / "a" / "test" / "depth" / "000002.png"), cv2.IMREAD_UNCHANGED)
    sem = cv2.imread(str(tmp_path / "a" / "test" / "semantic" / "000002.png"), cv2.IMREAD_UNCHANGED)
    assert depth.shape == (16, 32) and depth.dtype == np.uint16 and (depth > 0).all()
    assert sem.dtype == np.uint8 and sem.max() < len(P.CLASSES)
    assert s["class_fractions"]["floor"] > 0.1 and s["class_fractions"]["void"] == 0.0
    ds = core_panoramas.EquirectDataset(tmp_path / "a", "train")
    assert len(ds) == 2 and ds[0]["depth"].shape == (1, 16, 32) and (ds[0]["depth"] > 0).all()
