"""QA dataset: ground truth of the renders, determinism, split disjointness, closed answers, save / load."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from core.errors import DataError  # noqa: E402
from perception.forensics import qa  # noqa: E402

SIZE = 32


def _colour_name(rgb: np.ndarray) -> str:
    """The colour word a person would give a mean (3,) RGB in [0, 255]."""
    r, g, b = rgb
    if r > b + 60 and g > b + 60:
        return "yellow"
    return ("red", "green", "blue")[int(np.argmax(rgb))]


@pytest.fixture(scope="module")
def train():
    return qa.build_qa("train", 10, size=SIZE, seed=3)


@pytest.fixture(scope="module")
def test_split():
    return qa.build_qa("test", 10, size=SIZE, seed=3)


def test_exact_match_normalisation():
    assert qa.exact_match("Red.", "red")
    assert qa.exact_match("  two  ", "two")
    assert qa.exact_match("Jack-o'-Lantern", "jack o lantern")
    assert qa.exact_match("SIMULATION!", "simulation")
    assert not qa.exact_match("reddish", "red")
    assert not qa.exact_match("", "one")
    assert qa.normalize(" A  Street-Car, ") == "a street car"


def test_single_object_colour_and_shape_ground_truth():
    rngs = [np.random.default_rng([7, i]) for i in range(16)]
    for img, scene, masks in qa.render_scenes(rngs, size=SIZE, n_objects=1, with_masks=True):
        assert img.shape == (SIZE, SIZE, 3) and img.dtype == np.uint8
        assert scene.n == 1 and masks.shape == (1, SIZE, SIZE)
        inside = masks[0] > 0.99
        assert inside.sum() >= 3, "the object must be visible"
        mean = img[inside].astype(float).mean(0)
        assert _colour_name(mean) == scene.colours[0], (mean, scene.colours[0])
        recs = qa._sim_records(img, scene, "sim:x")
        answers = {r.kind: r.answer for r in recs}
        assert answers == {"count": "one", "colour": scene.colours[0], "shape": scene.shapes[0],
                           "domain": "simulation"}  # fmt: skip


def test_counts_and_largest_match_the_segmentation():
    rngs = [np.random.default_rng([11, i]) for i in range(12)]
    seen = set()
    for img, scene, masks in qa.render_scenes(rngs, size=SIZE, with_masks=True):
        seen.add(scene.n)
        pixels = masks.sum((1, 2))  # (n,) covered output pixels per object
        assert len(pixels) == scene.n and (pixels >= 0.5 * qa.MIN_PIXEL_FRACTION * SIZE * SIZE).all()
        assert int(np.argmax(pixels)) == scene.largest
        sizes = np.array(scene.sizes)
        others = np.delete(sizes, scene.largest)
        assert others.size == 0 or sizes[scene.largest] >= qa.SIZE_MARGIN * others.max() - 1e-9
        # Objects never overlap on the floor (their footprints' bounding circles are apart).
        for i in range(scene.n):
            for j in range(i + 1, scene.n):
                gap = np.linalg.norm(scene.xy[i] - scene.xy[j]) - np.sqrt(2) * (sizes[i] + sizes[j])
                assert gap > 0
        count = {r.kind: r.answer for r in qa._sim_records(img, scene, "s")}["count"]
        assert count == qa.COUNT_WORDS[scene.n - 1]
    assert seen == {1, 2, 3}


def test_build_is_deterministic(train):
    again = qa.build_qa("train", 10, size=SIZE, seed=3)
    assert [(r.question, r.answer, r.kind, r.source) for r in again] == [
        (r.question, r.answer, r.kind, r.source) for r in train
    ]
    assert all(np.array_equal(a.image, b.image) for a, b in zip(again, train))
    other = qa.build_qa("train", 10, size=SIZE, seed=4)
    assert not all(np.array_equal(a.image, b.image) for a, b in zip(other, train))


def test_mix_and_records(train):
    images = {id(r.image): r for r in train}
    assert len(images) == 10
    domains = [r.answer for r in train if r.kind == "domain"]
    assert domains.count("simulation") == 6 and domains.count("photo") == 4
    for r in train:
        assert r.image.shape == (SIZE, SIZE, 3) and r.image.dtype == np.uint8
        assert r.question == qa.QUESTIONS[r.kind]
        assert r.answer == qa.normalize(r.answer) and 1 <= len(r.answer.split()) <= 3
        sim = r.source.startswith("sim:")
        assert (r.kind in ("count", "colour", "shape")) <= sim and (r.kind == "content") <= (not sim)


def test_answer_sets_are_closed_and_small(train, test_split):
    sets = qa.answer_set(train + test_split)
    for kind, answers in sets.items():
        assert answers == sorted(set(answers))
        if kind in qa.ANSWERS:
            assert set(answers) <= set(qa.ANSWERS[kind])
    assert set(sets) <= set(qa.QUESTIONS)
    assert len(sets.get("content", [])) <= 20


def test_train_test_disjoint_by_source(train, test_split):
    assert not {r.source for r in train} & {r.source for r in test_split}
    photos = {split: {s for s, _ in qa._photos(split)} for split in qa.SPLITS}
    assert photos["train"] and photos["test"] and not photos["train"] & photos["test"]
    frames: dict[str, dict[str, list[int]]] = {}
    for split in qa.SPLITS:
        for source, _ in qa._video_frames(split):
            _, name, frame = source.split(":")
            frames.setdefault(name, {}).setdefault(split, []).append(int(frame.removeprefix("frame=")))
    assert frames
    for name, by_split in frames.items():
        assert max(by_split["train"]) < min(by_split["test"]), name


def test_save_load_round_trip(train, tmp_path):
    qa.save_qa(train, tmp_path / "qa")
    back = qa.load_qa(tmp_path / "qa")
    assert len(back) == len(train)
    for a, b in zip(back, train):
        assert (a.question, a.answer, a.kind, a.source) == (b.question, b.answer, b.kind, b.source)
        assert a.image.dtype == np.uint8 and np.array_equal(a.image, b.image)
    assert len(list((tmp_path / "qa" / "images").glob("*.png"))) == 10  # one PNG per image, not per record


def test_ensure_builds_once_and_checks_meta(tmp_path, monkeypatch):
    folder = tmp_path / "ensure"
    first = qa.ensure_qa(folder, "test", 3, size=SIZE, seed=1)
    monkeypatch.setattr(qa, "build_qa", lambda *a, **k: pytest.fail("rebuilt instead of reusing"))
    second = qa.ensure_qa(folder, "test", 3, size=SIZE, seed=1)
    assert [(r.answer, r.source) for r in first] == [(r.answer, r.source) for r in second]
    with pytest.raises(DataError, match="asked for"):
        qa.ensure_qa(folder, "test", 4, size=SIZE, seed=1)
