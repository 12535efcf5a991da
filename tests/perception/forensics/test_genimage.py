"""GenImage layer: the loader on a hand-made layout, the real-image pool (determinism, train/val source
disjointness), each generator family's contract, and the builder / ensure / CLI at toy size."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from core.errors import ConfigError, DataError
from core.outputs import OutputError
from perception.forensics.generators import (
    GENERATORS,
    Generator,
    build_genimage,
    ensure_genimage,
    image_pool,
    main,
    pool_crops,
    psnr,
)
from perception.forensics.genimage import (
    META_NAME,
    GenImageDataset,
    list_generators,
    read_meta,
    scan,
    write_meta,
)


def _png(path, value: int, size: int = 12, ext: str = "png") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = np.full((size, size + 4, 3), value, np.uint8)
    Image.fromarray(img).save(path.with_suffix(f".{ext}"))


@pytest.fixture
def layout(tmp_path):
    root = tmp_path / "gi"
    for g in ("sdv1", "adm"):
        for split in ("train", "val"):
            for cls, v in (("ai", 200), ("nature", 50)):
                for i in range(2):
                    _png(root / g / split / cls / f"{i}", v)
    _png(root / "adm" / "train" / "ai" / "x", 201, ext="jpg")
    (root / "adm" / "train" / "ai" / "notes.txt").write_text("not an image")
    (root / "stray" / "train").mkdir(parents=True)  # no ai/nature: not a generator
    (root / "readme.txt").write_text("x")
    return root


# ------------------------------------------------------------------------------------------------ loader
def test_loader_layout(layout):
    assert list_generators(layout) == ["adm", "sdv1"]
    items = scan(layout, "train")
    assert [(i.generator, i.label, i.path.name) for i in items] == [
        ("adm", 0, "0.png"), ("adm", 0, "1.png"), ("adm", 1, "0.png"), ("adm", 1, "1.png"), ("adm", 1, "x.jpg"),
        ("sdv1", 0, "0.png"), ("sdv1", 0, "1.png"), ("sdv1", 1, "0.png"), ("sdv1", 1, "1.png")]
    assert all(i.path.parent.name == ("ai" if i.label else "nature") for i in items)
    assert len(scan(layout, "val", ["sdv1"])) == 4
    ds = GenImageDataset(items, size=8)
    s = ds[2]
    assert s["image"].shape == (8, 8, 3) and s["image"].dtype == np.uint8 and s["label"] == 1
    assert s["generator"] == "adm" and s["path"].endswith("0.png") and int(s["image"].mean()) == 200


def test_loader_errors(layout, tmp_path):
    with pytest.raises(DataError, match="no such dataset folder"):
        list_generators(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a GenImage layout"):
        scan(tmp_path / "empty", "train")
    with pytest.raises(DataError, match=r"unknown generator.*'midjourney'.*available: adm, sdv1"):
        scan(layout, "train", ["midjourney"])
    with pytest.raises(DataError, match="splits present: train, val"):
        scan(layout, "test")
    bad = layout / "sdv1" / "val" / "ai" / "0.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    ds = GenImageDataset(scan(layout, "val", ["sdv1"]), size=8)
    with pytest.raises(DataError, match=str(bad)):
        ds[[str(i.path) for i in ds.items].index(str(bad))]


def test_meta_round_trip(tmp_path):
    with pytest.raises(DataError, match=META_NAME):
        read_meta(tmp_path)
    write_meta(tmp_path, generators=["vae"], seed=3)
    assert read_meta(tmp_path) == {"generators": ["vae"], "seed": 3}
    assert not [p for p in tmp_path.iterdir() if p.name != META_NAME]  # no temp file left


# ------------------------------------------------------------------------------------------------ pool
def test_pool_deterministic_and_split_by_source():
    a, ca = pool_crops("train", 200, 32, seed=1)
    b, cb = pool_crops("train", 200, 32, seed=1)
    assert a.shape == (200, 32, 32, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and ca == cb
    assert not np.array_equal(a, image_pool("train", 200, 32, seed=2))
    v, cv = pool_crops("val", 200, 32, seed=1)
    assert all(c.side >= 32 for c in ca + cv)  # real crops are only ever downsampled
    kinds = {c.source.kind for c in ca}
    assert kinds == {"photo", "video", "panorama"}
    whole = {(c.source.kind, c.source.name) for c in ca if c.source.kind != "video"}
    assert whole and whole.isdisjoint({(c.source.kind, c.source.name) for c in cv if c.source.kind != "video"})
    train_frames = {c.source for c in ca if c.source.kind == "video"}
    val_frames = {c.source for c in cv if c.source.kind == "video"}
    assert train_frames and val_frames and train_frames.isdisjoint(val_frames)
    for name in {s.name for s in val_frames}:  # every val frame lies after every train frame, with a gap
        last_train = max((s.frame for s in train_frames if s.name == name), default=-10)
        assert min(s.frame for s in val_frames if s.name == name) > last_train + 1


# ------------------------------------------------------------------------------------------------ generators
def _hf_energy(images: np.ndarray) -> float:
    """Share of spectral energy (grey, mean removed) above half the Nyquist frequency."""
    g = images.astype(np.float64).mean(-1)
    g = g - g.mean(axis=(1, 2), keepdims=True)
    p = np.abs(np.fft.fft2(g)) ** 2
    f = np.abs(np.fft.fftfreq(g.shape[1]))
    hf = (f[:, None] > 0.25) | (f[None, :] > 0.25)
    return float(p[:, hf].sum() / p.sum())


@pytest.fixture(scope="module")
def pools():
    return image_pool("train", 128, 16, seed=0), image_pool("val", 16, 16, seed=0)


# Fakes must stay close to their source (the difference is a trace, not visible blur) and must not be noisy:
# their high-frequency share stays below twice the source's. Bars are for 16 px and a few dozen steps.
@pytest.mark.parametrize("name,cfg,steps,min_psnr",
                         [("vae", {}, 80, 18.0), ("gan", {}, 60, 20.0), ("flow", {}, 120, 17.0)])
def test_trained_generator(pools, name, cfg, steps, min_psnr, tmp_path):
    train, val = pools
    gen = GENERATORS[name](size=16, **cfg)
    logs = gen.fit(train, seed=0, steps=steps)
    assert np.isfinite(logs["loss"])
    fake = gen.generate(val, seed=0)
    assert fake.shape == val.shape and fake.dtype == np.uint8
    assert not np.array_equal(fake, val)
    assert psnr(fake, val) > min_psnr, psnr(fake, val)
    assert _hf_energy(fake) < 2 * _hf_energy(val), (_hf_energy(fake), _hf_energy(val))
    assert psnr(fake, val) > psnr(fake, np.roll(val, 1, axis=0)) + 3  # content follows its own source
    assert np.array_equal(fake, gen.generate(val, seed=0))  # deterministic in seed
    weights = gen.save(tmp_path / name)
    assert weights.suffix == ".safetensors"
    assert np.array_equal(Generator.load(tmp_path / name).generate(val, seed=0), fake)
    refit = GENERATORS[name](size=16, **cfg)
    refit.fit(train, seed=0, steps=3)
    gen.fit(train, seed=0, steps=3)
    assert all(np.array_equal(a, b) for a, b in zip(refit.state_dict().values(), gen.state_dict().values(),
                                                      strict=True))


def test_upsample_removes_high_frequencies():
    images = image_pool("val", 32, 32, seed=0)
    gen = GENERATORS["upsample"](size=32)
    assert gen.fit(images) == {} and gen.state_dict() == {}
    fake = gen.generate(images, seed=0)
    assert fake.shape == images.shape and fake.dtype == np.uint8 and not np.array_equal(fake, images)
    assert _hf_energy(fake) < 0.7 * _hf_energy(images)
    assert psnr(fake, images) > 22.0, psnr(fake, images)


def test_generator_contract_and_bad_input():
    with pytest.raises(TypeError, match="name"):
        type("Nameless", (Generator,), {})
    with pytest.raises(ConfigError, match="multiple of 4"):
        GENERATORS["gan"](size=18)
    with pytest.raises(ConfigError, match="power of 2"):
        GENERATORS["gan"](size=16, scale=3)
    with pytest.raises(ConfigError, match="factors"):
        GENERATORS["upsample"](size=16, factors=(1.0,))
    with pytest.raises(ValueError, match="uint8"):
        GENERATORS["upsample"](size=16).generate(np.zeros((2, 16, 16, 3), np.float32))


# ------------------------------------------------------------------------------------------------ builder
TINY = {"size": 32, "n_train": 3, "n_val": 2, "steps": {"vae": 2, "flow": 2, "gan": 2}, "progress": False}


def test_build_and_ensure(tmp_path):
    out = tmp_path / "gi"
    meta = build_genimage(out, **TINY)
    assert list_generators(out) == ["flow", "gan", "upsample", "vae"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gi"]  # nothing staged is left behind
    for g in meta["generators"]:
        for split, n in (("train", 3), ("val", 2)):
            items = scan(out, split, [g])
            assert [i.label for i in items] == [0] * n + [1] * n
            assert {i.path.suffix for i in items} == {".png"}
    nature = np.stack([GenImageDataset(scan(out, "train"), 32)[i]["image"] for i in range(len(scan(out, "train")))])
    assert len({a.tobytes() for a in nature}) == len(nature)  # all crops differ (real and fake sources too)
    disk = read_meta(out)
    assert disk["holdout"] == "gan" and set(disk["timings"]) == set(disk["generators"])
    assert disk["steps"] == {"vae": 2, "flow": 2, "gan": 2} and "--n-train 3" in disk["command"]
    assert set(disk["psnr_db"]["flow"]) == {"train", "val"}

    stamp = (out / META_NAME).stat().st_mtime_ns
    assert ensure_genimage(out, **TINY) == disk
    assert (out / META_NAME).stat().st_mtime_ns == stamp  # not rebuilt
    with pytest.raises(OutputError, match="overwrite"):
        build_genimage(out, **TINY)
    with pytest.raises(ConfigError, match="holdout"):
        build_genimage(tmp_path / "x", **{**TINY, "holdout": "midjourney"})
    ensure_genimage(out, **{**TINY, "generators": ["upsample"], "holdout": None})  # stale args: rebuilt
    assert list_generators(out) == ["upsample"]


def test_cli(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "a"), "--generators", "upsample", "--holdout", "none", "--size", "16",
                 "--n-train", "2", "--n-val", "1"]) == 0
    assert "1 generators" in capsys.readouterr().out
    assert main(["--out", str(tmp_path / "b"), "--generators", "midjourney"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "c"), "--size", "big"])
    assert e.value.code == 2
