import dataclasses
import json

import numpy as np
import pytest

from core.errors import ConfigError
from core.testing import folder_digest
from sim.render import dataset_io
from sim.render import normals as N
from sim.render import real_assets as R

pytestmark = pytest.mark.skipif(
    not R.HDRI_DIR.is_dir() or not R.texture_dirs(), reason="no HDRIs (blender-data) or photo textures"
)

SIZE = 16


def _scene(seed=0, index=0, split="train", size=SIZE):
    return N.sample_scene(dataset_io.view_rng(seed, index), size, source="real", split=split)


def test_load_hdri_and_texture():
    for name in R.HDRI_TRAIN + R.HDRI_TEST:
        env = R.load_hdri(name, width=64)
        assert env.shape == (32, 64, 3) and env.dtype == np.float32
        assert np.isfinite(env).all() and (env >= 0).all() and env.max() > 0
        assert R.hdri_table_irradiance(name, 64) > 0
    assert R.load_hdri("courtyard") is R.load_hdri("courtyard")  # cached
    for ref in (R.texture_refs("table", "test")[0], R.texture_refs("backdrop", "train")[0], "skimage:brick"):
        tex = R.load_texture(ref, res=32)
        assert tex.shape == (32, 32, 3) and tex.dtype == np.float32
        assert tex.min() >= 0.0 and tex.max() <= 1.0 and tex.std() > 0
    info = R.available()
    assert info["hdris"]["test"] == list(R.HDRI_TEST) and info["table"]["train"]


def test_asset_splits_are_disjoint_and_respected():
    assert not set(R.HDRI_TRAIN) & set(R.HDRI_TEST)
    for lists in (R.TABLE_TEXTURES, R.BACKDROP_TEXTURES):
        assert not set(lists["train"]) & set(lists["test"])
    seen = {"train": set(), "test": set()}
    for split in ("train", "test"):
        for i in range(50):
            p = _scene(1, i, split).provenance
            assert p["hdri"] in (R.HDRI_TRAIN if split == "train" else R.HDRI_TEST)
            assert p["table_texture"] in R.TABLE_TEXTURES[split]
            assert p["backdrop_texture"] is None or p["backdrop_texture"] in R.BACKDROP_TEXTURES[split]
            assert 0.0 <= p["hdri_rotation_deg"] < 360.0 and p["exposure"] > 0
            seen[split].add(p["hdri"])
    assert len(seen["train"]) >= 4  # the draw covers the train list


def test_procedural_source_unchanged():
    a = N.sample_scene(dataset_io.view_rng(3, 1), SIZE)
    b = N.sample_scene(dataset_io.view_rng(3, 1), SIZE, source="procedural", split="test")
    assert a.camera == b.camera and len(a.objects) == len(b.objects)
    np.testing.assert_array_equal(a.envmap, b.envmap)
    np.testing.assert_array_equal(a.table.texture, b.table.texture)
    assert a.provenance == {} and a.envmap_rotation_deg == 0.0 and a.light_radiance > 0
    # Fingerprint of the pre-"real"-source sampler (recorded once from the original code).
    assert [o.kind for o in a.objects] == ["erlenmeyer_flask", "beaker", "erlenmeyer_flask"]
    np.testing.assert_allclose(a.camera.origin, [0.34418695, -0.38037166, 0.23780665], atol=1e-7)
    assert a.light_radiance == pytest.approx(21.55415836726699, rel=1e-12)


def test_bad_source():
    with pytest.raises(ConfigError, match="source"):
        N.sample_scene(dataset_io.view_rng(0, 0), SIZE, source="bogus")
    with pytest.raises(ConfigError, match="source"):
        N.make_dataset("/nonexistent/never-written", n=1, source="bogus")
    with pytest.raises(ConfigError, match="workers"):
        N.make_dataset("/nonexistent/never-written", n=1, workers=0)


def test_real_scene_determinism_and_rotation_only_changes_rgb():
    a, b = _scene(2, 0), _scene(2, 0)
    assert a.provenance == b.provenance and a.camera == b.camera
    va, vb = N.render_view(a, spp=2, seed=0), N.render_view(b, spp=2, seed=0)
    for key in va:
        np.testing.assert_array_equal(va[key], vb[key], err_msg=key)
    assert va["mask"].any()
    rotated = dataclasses.replace(a, envmap_rotation_deg=a.envmap_rotation_deg + 120.0)
    gt = N.render_ground_truth(rotated)
    for key in ("normals", "depth", "mask", "semantic", "valid"):
        np.testing.assert_array_equal(gt[key], va[key], err_msg=key)
    rgb = N.render_rgb(rotated, spp=2, seed=0)
    assert np.abs(rgb.astype(int) - va["rgb"]).mean() > 1.0


def test_sky_is_up():
    """Looking straight up sees the panorama's top rows (the sky), looking down its bottom rows."""
    env = R.load_hdri("forest", 64)
    lum = env.mean(-1)
    top, bottom = lum[:4].mean(), lum[-4:].mean()
    scale = 0.3 / max(top, bottom)
    for rot in (0.0, 137.0):
        seen = []
        for target in ((0.05, 0.0, 1.0), (0.05, 0.0, -1.0)):
            cam = N.Camera((0.0, 0.0, 0.0), target, 8, 8, fov_deg=20.0)
            scene = N.LabScene(
                camera=cam,
                objects=(),
                envmap=env,
                light_radiance=0.0,
                envmap_scale=scale,
                envmap_rotation_deg=rot,
            )
            srgb = N.render_rgb(scene, spp=4).astype(float) / 255
            seen.append(np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4).mean())
        np.testing.assert_allclose(seen, [top * scale, bottom * scale], rtol=0.2, err_msg=str(rot))


def test_make_dataset_real_meta(tmp_path):
    N.make_dataset(tmp_path / "a", n=2, seed=4, size=SIZE, spp=1, test_fraction=0.5, source="real")
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["source"] == "real" and meta["hdris"]["test"] == list(R.HDRI_TEST)
    assert set(meta["views"]) == {"000000", "000001"}
    assert meta["views"]["000001"]["split"] == "test"
    assert meta["views"]["000001"]["hdri"] in R.HDRI_TEST
    assert set(meta["views"]["000000"]) >= {
        "hdri",
        "hdri_rotation_deg",
        "exposure",
        "table_texture",
        "backdrop_texture",
    }
    assert (tmp_path / "a" / "train" / "cameras.json").is_file()


@pytest.mark.slow
def test_make_dataset_workers_identical(tmp_path):
    kw = {"n": 3, "seed": 5, "size": SIZE, "spp": 2, "test_fraction": 0.34, "source": "real"}
    N.make_dataset(tmp_path / "a", workers=1, **kw)
    N.make_dataset(tmp_path / "b", workers=2, **kw)
    da, db = folder_digest(tmp_path / "a"), folder_digest(tmp_path / "b")
    assert da == db and len(da) == 3 * 6 + 2 + 1


def test_closeup_framing_puts_glass_in_most_of_the_frame():
    # ground truth only (exact, fast): the glass share of the frame, workspace vs close-up cameras
    share = {}
    for framing in N.FRAMINGS:
        masks = [N.render_ground_truth(N.sample_scene(dataset_io.view_rng(4, i), 24, source="real",
                                                      framing=framing))["mask"] for i in range(12)]
        share[framing] = float(np.mean([m.mean() for m in masks]))
    assert share["closeup"] > 0.15 and share["closeup"] > 2 * share["workspace"], share  # 30 views: 0.38 vs 0.08
    with pytest.raises(ConfigError, match="framing"):
        N.sample_scene(dataset_io.view_rng(0, 0), 16, source="procedural", framing="closeup")
    with pytest.raises(ConfigError, match="framing"):
        N.make_dataset("/tmp/unused", n=1, framing="macro")
