from __future__ import annotations

import numpy as np
import pytest
import torch

from core.data.images import (
    ClearGraspDataset,
    DenseImageDataset,
    read_normals,
    write_dense_sample,
    write_image,
    write_meta,
)
from core.errors import DataError

H, W = 6, 10


def unit_normals(rng: np.random.Generator) -> np.ndarray:
    n = rng.normal(size=(H, W, 3))
    n[..., 2] = -np.abs(n[..., 2])  # facing the camera (OpenCV: towards -z)
    n /= np.linalg.norm(n, axis=-1, keepdims=True)
    n[0, :3] = 0.0  # invalid pixels
    return n.astype(np.float32)


@pytest.fixture
def dense_root(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "dense"
    write_meta(root, intrinsics={"fx": 10.0, "fy": 10.0, "cx": 5.0, "cy": 3.0}, classes=["bg", "glass"])
    truth = []
    for i, (nf, df) in enumerate([("png", "png"), ("exr", "exr"), ("exr", "npy")]):
        s = {
            "rgb": rng.integers(0, 256, (H, W, 3), dtype=np.uint8),
            "rgb_twin": rng.integers(0, 256, (H, W, 3), dtype=np.uint8),
            "normals": unit_normals(rng),
            "depth": rng.uniform(0.3, 3.0, (H, W)).astype(np.float32),
            "mask": rng.random((H, W)) > 0.5,
            "semantic": rng.integers(0, 300, (H, W)),
        }
        s["depth"][1, 1] = 0.0
        write_dense_sample(root, "train", f"{i:04d}", normals_format=nf, depth_format=df, **s)
        truth.append(s)
    return root, truth


def test_dense_round_trip(dense_root):
    root, truth = dense_root
    ds = DenseImageDataset(root, "train")
    assert len(ds) == 3 and ds.ids == ["0000", "0001", "0002"]
    assert ds.meta["intrinsics"]["fx"] == 10.0 and ds.meta["normals_frame"] == "opencv_camera"
    for i, t in enumerate(truth):
        s = ds[i]
        assert s["rgb"].dtype == torch.uint8 and s["rgb"].shape == (3, H, W)
        np.testing.assert_array_equal(s["rgb"].permute(1, 2, 0).numpy(), t["rgb"])
        np.testing.assert_array_equal(s["rgb_twin"].permute(1, 2, 0).numpy(), t["rgb_twin"])
        assert s["normals"].dtype == torch.float32 and s["normals"].shape == (3, H, W)
        valid = np.linalg.norm(t["normals"], axis=-1) > 0
        np.testing.assert_array_equal(s["valid"].numpy(), valid)
        tol = 1e-4 if i == 0 else 1e-6  # 16-bit PNG quantisation vs float EXR
        np.testing.assert_allclose(
            s["normals"].permute(1, 2, 0).numpy()[valid], t["normals"][valid], atol=tol
        )
        assert (s["normals"][:, ~s["valid"]] == 0).all()
        np.testing.assert_allclose(s["depth"][0].numpy(), t["depth"], atol=5e-4 if i == 0 else 1e-6)
        assert s["depth"].shape == (1, H, W) and s["depth"][0, 1, 1] == 0
        np.testing.assert_array_equal(s["mask"].numpy(), t["mask"].astype(np.int64))
        np.testing.assert_array_equal(s["semantic"].numpy(), t["semantic"])  # > 255: stored as 16-bit
        assert s["semantic"].dtype == torch.int64


def test_dense_key_subset_and_errors(dense_root, tmp_path):
    root, _ = dense_root
    ds = DenseImageDataset(root, keys=["rgb", "depth"])
    assert set(ds[0]) == {"rgb", "depth", "index"}
    with pytest.raises(DataError, match="meta.json: no such file"):
        DenseImageDataset(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"val: no rgb/ folder"):
        DenseImageDataset(root, "val")
    # a corrupt PNG: raises naming the file when read; skip mode drops it and counts it
    (root / "train" / "normals" / "0000.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DataError, match=r"normals/0000.png: cannot decode image"):
        DenseImageDataset(root)[0]
    with pytest.raises(DataError, match=r"0000.png"):
        DenseImageDataset(root, validate=True)
    ds = DenseImageDataset(root, on_error="skip")
    assert len(ds) == 2 and ds.skipped == 1 and ds.ids == ["0001", "0002"]
    # a missing map when the key is requested explicitly
    (root / "train" / "depth" / "0001.exr").unlink()
    ds = DenseImageDataset(root, keys=["rgb", "depth"], on_error="skip")
    assert ds.ids == ["0000", "0002"] and ds.skipped == 1
    with pytest.raises(DataError, match="no depth file for sample '0001'"):
        DenseImageDataset(root, keys=["rgb", "depth"])


def test_wrong_format_in_meta(tmp_path):
    write_meta(tmp_path, format="something-else/2")
    with pytest.raises(DataError, match="expected 'embodied-dense/1'"):
        DenseImageDataset(tmp_path)


def test_cleargrasp_layout_converts_normals(tmp_path):
    rng = np.random.default_rng(1)
    obj = tmp_path / "cup-with-waves-train"
    n_cv = unit_normals(rng)
    n_cg = n_cv.copy()
    n_cg[..., 0] *= -1  # ClearGrasp: x flipped relative to OpenCV
    rgb = np.broadcast_to(np.array([200, 60, 10], np.uint8), (H, W, 3))  # flat colour: JPEG keeps it
    mask = np.zeros((H, W, 3), np.uint8)
    mask[2:4, 3:7] = 255
    for sid in ("000000000", "000000001"):
        write_image(obj / "rgb-imgs" / f"{sid}-rgb.jpg", rgb)
        write_image(obj / "camera-normals" / f"{sid}-cameraNormals.exr", n_cg)
        write_image(obj / "segmentation-masks" / f"{sid}-segmentation-mask.png", mask)
    ds = ClearGraspDataset(tmp_path)
    assert ds.ids == ["cup-with-waves-train/000000000", "cup-with-waves-train/000000001"]
    s = ds[1]
    valid = s["valid"].numpy()
    np.testing.assert_allclose(s["normals"].permute(1, 2, 0).numpy()[valid], n_cv[valid], atol=1e-6)
    assert s["mask"].sum() == 8 and s["mask"][2, 3] == 1
    assert np.abs(s["rgb"].permute(1, 2, 0).numpy().astype(int) - rgb).max() <= 3  # RGB order, not BGR
    (obj / "camera-normals" / "000000001-cameraNormals.exr").unlink()
    with pytest.raises(DataError, match="000000001-cameraNormals.exr: no such file"):
        ClearGraspDataset(tmp_path)
    assert len(ClearGraspDataset(tmp_path, on_error="skip")) == 1


def _cleargrasp_object(obj, ids=("000000000",)):
    """One ClearGrasp object folder with a sample per id (flat colour, normals facing the camera)."""
    n = np.zeros((H, W, 3), np.float32)
    n[..., 2] = -1.0
    for sid in ids:
        write_image(obj / "rgb-imgs" / f"{sid}-rgb.jpg", np.full((H, W, 3), 128, np.uint8))
        write_image(obj / "camera-normals" / f"{sid}-cameraNormals.exr", n)
        write_image(obj / "segmentation-masks" / f"{sid}-segmentation-mask.png", np.zeros((H, W), np.uint8))


def test_cleargrasp_splits_select_their_folders(tmp_path):
    """The download's layout: a train archive and a test-val archive with synthetic-{val,test} inside."""
    train, test_val = tmp_path / "cleargrasp-dataset-train", tmp_path / "cleargrasp-dataset-test-val"
    _cleargrasp_object(train / "cup-with-waves-train", ("000000000", "000000001"))
    _cleargrasp_object(train / "flower-bath-bomb-train")
    _cleargrasp_object(test_val / "synthetic-val" / "cup-with-waves-val")
    _cleargrasp_object(test_val / "synthetic-test" / "glass-square-potion-test")
    (test_val / "real-test" / "d435").mkdir(parents=True)  # real captures: no normals, never picked
    assert ClearGraspDataset(tmp_path, split="train").ids == [
        "cup-with-waves-train/000000000", "cup-with-waves-train/000000001", "flower-bath-bomb-train/000000000"]
    assert ClearGraspDataset(tmp_path, split="val").ids == ["cup-with-waves-val/000000000"]
    assert ClearGraspDataset(tmp_path, split="test").ids == ["glass-square-potion-test/000000000"]
    # the root may also be one archive, or one split folder itself
    assert ClearGraspDataset(test_val, split="test").ids == ["glass-square-potion-test/000000000"]
    assert ClearGraspDataset(train, split="train").ids[0] == "cup-with-waves-train/000000000"
    assert ClearGraspDataset(test_val / "synthetic-val", split="val").ids == ["cup-with-waves-val/000000000"]
    assert len(ClearGraspDataset(test_val / "synthetic-val")) == 1  # split=None: the root is one split
    with pytest.raises(DataError, match=r"cleargrasp-dataset-test-val: no 'train' split \(looked for ") as e:
        ClearGraspDataset(test_val, split="train")
    assert "\n" not in str(e.value)


def test_cleargrasp_plain_split_folders_and_missing_split(tmp_path):
    _cleargrasp_object(tmp_path / "train" / "beaker", ("000", "001"))
    _cleargrasp_object(tmp_path / "test" / "beaker")
    assert len(ClearGraspDataset(tmp_path, split="train")) == 2
    assert ClearGraspDataset(tmp_path, split="test").ids == ["beaker/000000000"]
    with pytest.raises(DataError, match="no 'val' split"):
        ClearGraspDataset(tmp_path, split="val")
    with pytest.raises(DataError, match="no 'tset' split"):
        ClearGraspDataset(tmp_path, split="tset")
    with pytest.raises(DataError, match="no 'test' split"):  # a folder of objects holds no splits to choose
        ClearGraspDataset(tmp_path / "train", split="test")


def test_normals_png_encoding_is_16bit(tmp_path):
    rng = np.random.default_rng(2)
    n = unit_normals(rng)
    paths = write_dense_sample(tmp_path, "s", "a", rgb=np.zeros((H, W, 3), np.uint8), normals=n)
    import cv2

    raw = cv2.imread(str(paths["normals"]), cv2.IMREAD_UNCHANGED)
    assert raw.dtype == np.uint16
    raw = raw[..., ::-1]  # file is BGR
    np.testing.assert_array_equal(raw[0, 0], 0)
    np.testing.assert_allclose(raw[1, 1] / 65535.0 * 2 - 1, n[1, 1], atol=2e-5)
    decoded, valid = read_normals(paths["normals"])
    assert not valid[0, 0] and valid[1, 1]
