from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from core.data.images import write_dense_sample, write_image, write_meta
from core.data.panoramas import (
    S2D3D_CLASSES,
    EquirectDataset,
    Stanford2D3DDataset,
    direction_to_equirect,
    equirect_directions,
    equirect_to_direction,
)
from core.errors import DataError


def test_equirect_convention():
    H, W = 8, 16
    d = equirect_directions(H, W)
    assert d.shape == (H, W, 3)
    torch.testing.assert_close(d.norm(dim=-1), torch.ones(H, W))
    # centre of the image looks along +z; right quarter along +x; top rows point up (-y, OpenCV)
    c = equirect_to_direction(np.array(W / 2 - 0.5), np.array(H / 2 - 0.5), W, H)
    np.testing.assert_allclose(c, [0, 0, 1], atol=1e-12)
    r = equirect_to_direction(np.array(3 * W / 4 - 0.5), np.array(H / 2 - 0.5), W, H)
    np.testing.assert_allclose(r, [1, 0, 0], atol=1e-12)
    assert (d[0, :, 1] < -0.9).all() and (d[-1, :, 1] > 0.9).all()
    # round trip pixel -> direction -> pixel (numpy and torch)
    v, u = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    uu, vv = direction_to_equirect(equirect_to_direction(u, v, W, H) * 3.0, W, H)
    np.testing.assert_allclose(uu, u, atol=1e-9)
    np.testing.assert_allclose(vv, v, atol=1e-9)
    ut, vt = direction_to_equirect(d.double(), W, H)
    torch.testing.assert_close(ut, torch.from_numpy(u).double(), atol=1e-6, rtol=0)
    assert math.isclose(float(vt[0, 0]), 0.0, abs_tol=1e-6)


def test_equirect_dataset(tmp_path):
    rng = np.random.default_rng(0)
    write_meta(tmp_path, projection="equirectangular")
    rgb = rng.integers(0, 256, (8, 16, 3), dtype=np.uint8)
    depth = rng.uniform(0.5, 5, (8, 16)).astype(np.float32)
    sem = rng.integers(0, 13, (8, 16))
    write_dense_sample(tmp_path, "train", "p0", rgb=rgb, depth=depth, semantic=sem)
    s = EquirectDataset(tmp_path)[0]
    assert s["rgb"].shape == (3, 8, 16) and s["depth"].shape == (1, 8, 16)
    np.testing.assert_allclose(s["depth"][0].numpy(), depth, atol=5e-4)
    np.testing.assert_array_equal(s["semantic"].numpy(), sem)
    write_dense_sample(tmp_path, "bad", "p1", rgb=rgb[:, :12], depth=depth[:, :12], semantic=sem[:, :12])
    with pytest.raises(DataError, match="p1.png: panorama is 12x8"):
        EquirectDataset(tmp_path, "bad")[0]
    write_meta(tmp_path / "pinhole")
    write_dense_sample(tmp_path / "pinhole", "train", "a", rgb=rgb)
    with pytest.raises(DataError, match="expected 'equirectangular'"):
        EquirectDataset(tmp_path / "pinhole")


def test_stanford2d3d_layout(tmp_path):
    rng = np.random.default_rng(1)
    pano = tmp_path / "area_1" / "pano"
    name = "camera_0d600f92f8d14e288ddc590c32584a5a_office_1_frame_equirectangular_domain"
    rgb = rng.integers(0, 256, (8, 16, 3), dtype=np.uint8)
    depth_m = rng.uniform(0.5, 5, (8, 16))
    raw = np.round(depth_m * 512).astype(np.uint16)
    raw[0, 0] = 65535
    inst = rng.integers(0, 3, (8, 16))
    sem = np.stack([inst // 65536, inst // 256 % 256, inst % 256], -1).astype(np.uint8)
    sem[1, 1] = 13  # 0x0D0D0D: missing label
    write_image(pano / "rgb" / f"{name}_rgb.png", rgb)
    write_image(pano / "depth" / f"{name}_depth.png", raw)
    write_image(pano / "semantic" / f"{name}_semantic.png", sem)
    s = Stanford2D3DDataset(tmp_path)[0]
    np.testing.assert_array_equal(s["rgb"].permute(1, 2, 0).numpy(), rgb)
    assert s["depth"][0, 0, 0] == 0
    np.testing.assert_allclose(s["depth"][0, 1:].numpy(), depth_m[1:], atol=1 / 1024)
    raw_idx = s["semantic"].numpy()
    assert raw_idx[1, 1] == 13 * 65536 + 13 * 256 + 13 and raw_idx[2, 2] == inst[2, 2]
    (tmp_path / "semantic_labels.json").write_text(
        json.dumps(["wall_1_office_1", "chair_3_office_1", "floor_1_x"])
    )
    s = Stanford2D3DDataset(tmp_path)[0]
    classes = np.array([S2D3D_CLASSES.index(c) for c in ("wall", "chair", "floor")])
    expect = classes[inst]
    expect[1, 1] = 0
    np.testing.assert_array_equal(s["semantic"].numpy(), expect)
    (pano / "depth" / f"{name}_depth.png").unlink()
    with pytest.raises(DataError, match="_depth.png: no such file"):
        Stanford2D3DDataset(tmp_path)
    with pytest.raises(DataError, match="not a Stanford2D3D layout"):
        Stanford2D3DDataset(tmp_path, areas=["area_9"])
