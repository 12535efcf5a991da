import json

import cv2
import numpy as np
import pytest

from core.data.images import DenseImageDataset, decode_normals
from core.errors import ConfigError
from core.testing import folder_digest
from sim.render import dataset_io
from sim.render import normals as N
from sim.render.glassware import revolve

SIZE = 48


def _pixel_rays(camera: N.Camera) -> np.ndarray:
    """(H, W, 3) unit rays through the pixel centres in the OpenCV camera frame."""
    k = camera.intrinsics()
    v, u = np.mgrid[0 : camera.height, 0 : camera.width].astype(float)
    rays = np.stack([(u - k["cx"]) / k["fx"], (v - k["cy"]) / k["fy"], np.ones_like(u)], axis=-1)
    return rays / np.linalg.norm(rays, axis=-1, keepdims=True)


def _sphere_truth(camera: N.Camera, center, radius):
    r = camera.rotation()
    d = _pixel_rays(camera) @ r.T  # world-frame rays
    oc = np.asarray(camera.origin) - np.asarray(center)
    b = d @ oc
    disc = b * b - (oc @ oc - radius**2)
    hit = disc > 0
    t = -b - np.sqrt(np.maximum(disc, 0))
    p = np.asarray(camera.origin) + t[..., None] * d
    n_world = (p - np.asarray(center)) / radius
    return hit, n_world @ r, (p - np.asarray(camera.origin)) @ r[:, 2]


def _angle_deg(a, b):
    return np.degrees(np.arccos(np.clip(np.einsum("...c,...c->...", a, b), -1, 1)))


CAMERA = N.Camera(origin=(0.31, -0.42, 0.27), target=(0.0, 0.0, 0.05), width=SIZE, height=SIZE)
CENTER, RADIUS = (0.01, -0.02, 0.06), 0.06


@pytest.mark.parametrize("twin", [False, True], ids=["glass", "diffuse"])
def test_sphere_normals_match_analytic(twin):
    scene = N.LabScene(camera=CAMERA, objects=(N.GlassObject("sphere", N.Sphere(CENTER, RADIUS)),))
    gt = N.render_ground_truth(scene, twin=twin)
    hit, n_true, z_true = _sphere_truth(CAMERA, CENTER, RADIUS)
    assert 50 < hit.sum() < hit.size
    inter = (gt["mask"] & hit).sum()
    assert inter / (gt["mask"] | hit).sum() > 0.99
    both = gt["mask"] & hit
    err = _angle_deg(gt["normals"][both], n_true[both])
    assert err.mean() < 1.0, err.mean()
    np.testing.assert_allclose(gt["depth"][both], z_true[both], atol=1e-4)
    assert (gt["semantic"][gt["mask"]] == N.CLASSES.index("sphere")).all()


def test_mesh_sphere_normals_match_analytic():
    """The mesh path (smooth vertex normals of a revolved profile) on a tessellated sphere."""
    a = np.linspace(-np.pi / 2, np.pi / 2, 65)
    prof = np.stack([RADIUS * np.cos(a), RADIUS * np.sin(a)], axis=1)
    prof[[0, -1], 0] = 0.0
    mesh = revolve(prof, np.stack([np.cos(a), np.sin(a)], axis=1), segments=128)
    mesh = mesh.transformed(np.eye(3), np.asarray(CENTER))
    scene = N.LabScene(camera=CAMERA, objects=(N.GlassObject("sphere", mesh),))
    gt = N.render_ground_truth(scene)
    hit, n_true, _ = _sphere_truth(CAMERA, CENTER, RADIUS)
    both = gt["mask"] & hit
    assert both.sum() > 50
    assert _angle_deg(gt["normals"][both], n_true[both]).mean() < 1.0


def test_plane_depth_is_exact():
    # A backdrop facing the camera 0.8 m along the optical axis fills the view.
    camera = N.Camera(origin=(0.0, -1.0, 0.5), target=(0.0, 0.0, 0.5), width=SIZE, height=SIZE)
    backdrop = N.Surface(
        N._rectangle(
            np.array([0.0, -0.2, 0.5]), np.array([0.0, -1.0, 0.0]), np.array([0.0, 0.0, 1.0]), 3.0, 3.0
        ),
        np.full((4, 4, 3), 0.5, np.float32),
    )
    gt = N.render_ground_truth(N.LabScene(camera=camera, objects=(), backdrop=backdrop))
    assert gt["valid"].all() and not gt["mask"].any()
    np.testing.assert_allclose(gt["depth"], 0.8, atol=1e-5)
    assert (np.rint(gt["depth"] * 1000) == 800).all()
    np.testing.assert_allclose(
        gt["normals"], np.broadcast_to([0.0, 0.0, -1.0], gt["normals"].shape), atol=1e-5
    )
    assert (gt["semantic"] == N.CLASSES.index("backdrop")).all()


def test_twin_has_identical_ground_truth_and_normals_face_camera():
    scene = N.sample_scene(dataset_io.view_rng(3, 0), size=SIZE)
    glass, twin = N.render_ground_truth(scene, twin=False), N.render_ground_truth(scene, twin=True)
    for key in ("normals", "depth", "mask", "semantic", "valid"):
        np.testing.assert_array_equal(glass[key], twin[key], err_msg=key)
    assert glass["mask"].any()
    valid = glass["valid"]
    ndv = np.einsum("hwc,hwc->hw", glass["normals"], _pixel_rays(scene.camera))
    assert (ndv[valid] < 0).all()
    np.testing.assert_allclose(np.linalg.norm(glass["normals"][valid], axis=-1), 1.0, atol=1e-5)
    rgb, rgb_twin = N.render_rgb(scene, spp=2), N.render_rgb(scene, twin=True, spp=2)
    assert np.abs(rgb.astype(int) - rgb_twin).mean() > 1.0  # the material change is visible


def test_make_dataset_layout_and_determinism(tmp_path):
    a = N.make_dataset(tmp_path / "a", n=3, seed=7, size=24, spp=2, test_fraction=0.34)
    N.make_dataset(tmp_path / "b", n=3, seed=7, size=24, spp=2, test_fraction=0.34)
    da, db = folder_digest(tmp_path / "a"), folder_digest(tmp_path / "b")
    assert da == db and len(da) == 3 * 6 + 2 + 1
    assert a["splits"] == {"train": 2, "test": 1}
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["format"] == "embodied-dense/1" and meta["projection"] == "pinhole"
    assert meta["classes"] == list(N.CLASSES) and meta["splits"] == {"train": 2, "test": 1}
    root = tmp_path / "a" / "train"
    rgb = cv2.imread(str(root / "rgb" / "000000.png"), cv2.IMREAD_UNCHANGED)
    nrm = cv2.imread(str(root / "normals" / "000000.png"), cv2.IMREAD_UNCHANGED)[..., ::-1]
    depth = cv2.imread(str(root / "depth" / "000000.png"), cv2.IMREAD_UNCHANGED)
    mask = cv2.imread(str(root / "mask" / "000000.png"), cv2.IMREAD_UNCHANGED)
    assert rgb.shape == (24, 24, 3) and rgb.dtype == np.uint8
    assert nrm.dtype == np.uint16 and depth.dtype == np.uint16 and depth.shape == (24, 24)
    assert set(np.unique(mask)) <= {0, 255}
    n, valid = decode_normals(nrm)
    assert valid.all() and (depth > 0).all()
    assert (n[..., 2] < 0.2).mean() > 0.9  # OpenCV frame: visible surfaces mostly face -z
    # The shared loader reads it back.
    ds = DenseImageDataset(tmp_path / "a", "train")
    sample = ds[0]
    assert len(ds) == 2 and sample["normals"].shape == (3, 24, 24) and sample["rgb_twin"].shape == (3, 24, 24)
    np.testing.assert_allclose(sample["normals"].permute(1, 2, 0).numpy(), n, atol=1e-6)
    # A different seed gives different data; view i does not depend on n.
    c = N.make_dataset(tmp_path / "c", n=1, seed=7, size=24, spp=2, test_fraction=0.0)
    assert folder_digest(tmp_path / "c")["train/rgb/000000.png"] == da["train/rgb/000000.png"]
    assert c["splits"] == {"train": 1, "test": 0}


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"n": 0}, "n"),
        ({"n": 1, "spp": 0}, "spp"),
        ({"n": 1, "test_fraction": 1.0}, "test_fraction"),
        ({"n": 1, "size": 4}, "size"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, key):
    with pytest.raises(ConfigError, match=key):
        N.make_dataset(tmp_path, **kwargs)
