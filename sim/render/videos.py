"""Short mp4 clips of simulated motion, MuJoCo rendered offscreen (EGL), for video models.

Three scene families, each an MJCF written here (independent of the robosuite suite):

    falling_objects   3-6 boxes / spheres / capsules / cylinders dropped with random poses and
                      velocities onto a textured floor
    double_pendulum   a damped double pendulum from random angles, lengths and colours
    arm               a 3-link planar arm whose position servos follow random sinusoids, knocking
                      a ball on a table

Layout (``<root>/meta.json`` lists every clip)::

    <root>/<split>/video/<id>.mp4     H.264 (libx264, yuv420p), ``frames`` frames at ``fps``
    <root>/<split>/qpos/<id>.npy      (frames, nq) float64 joint positions at the rendered frames

Frames are (size, size, 3) uint8 RGB, upright. Camera placement, lighting, colours and initial state
are drawn from ``view_rng(seed, index)``; physics and rendering are deterministic, so the same seed
gives the same frames (and, with the same ffmpeg build, the same mp4 bytes).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from core.data.video import write_mp4
from core.errors import ConfigError, SimulationError
from core.io import atomic_path, write_json
from sim.render import dataset_io

SCENES: tuple[str, ...] = ("falling_objects", "double_pendulum", "arm")
DEFAULT_SIZE = 64
FRAMES = 16
FPS = 15
MAX_MSAA = 4
CRF = 18


def _mujoco():
    """Import MuJoCo with headless EGL rendering unless the caller chose another GL backend."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    import mujoco

    return mujoco


def _rgba(rng: np.random.Generator) -> str:
    c = rng.uniform(0.15, 0.95, 3)
    return f"{c[0]:.3f} {c[1]:.3f} {c[2]:.3f} 1"


def _header(rng: np.random.Generator, msaa: int) -> str:
    floor1, floor2 = rng.uniform(0.1, 0.6, 3), rng.uniform(0.3, 0.9, 3)
    light = rng.uniform([-1.0, -1.0, 2.5], [1.0, 1.0, 3.5])
    return f"""
  <option timestep="0.002"/>
  <visual>
    <global offwidth="256" offheight="256"/>
    <quality shadowsize="1024" offsamples="{msaa}"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.4 0.4 0.4"/>
  </visual>
  <asset>
    <texture name="grid" type="2d" builtin="checker" width="64" height="64"
             rgb1="{floor1[0]:.3f} {floor1[1]:.3f} {floor1[2]:.3f}" rgb2="{floor2[0]:.3f} {floor2[1]:.3f} {floor2[2]:.3f}"/>
    <material name="floor" texture="grid" texrepeat="{rng.integers(2, 8)} {rng.integers(2, 8)}"/>
  </asset>
  <worldbody>
    <light pos="{light[0]:.3f} {light[1]:.3f} {light[2]:.3f}" dir="{-light[0]:.3f} {-light[1]:.3f} {-light[2]:.3f}"
           diffuse="0.6 0.6 0.6" castshadow="true"/>
    <geom name="floor" type="plane" size="6 6 0.1" material="floor"/>"""


def _camera(
    rng: np.random.Generator,
    target: tuple[float, float, float],
    dist: tuple[float, float],
    azimuth: tuple[float, float] = (-180.0, 180.0),
    elevation: tuple[float, float] = (15.0, 40.0),
) -> str:
    """A camera at a random azimuth / elevation (degrees) and distance (metres) looking at ``target``."""
    az = np.radians(rng.uniform(*azimuth))
    el = np.radians(rng.uniform(*elevation))
    d = rng.uniform(*dist)
    pos = np.asarray(target) + d * np.array([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)])
    t = target
    return (
        f'    <camera name="view" mode="targetbody" target="cam_target" '
        f'pos="{pos[0]:.3f} {pos[1]:.3f} {pos[2]:.3f}" fovy="45"/>\n'
        f'    <body name="cam_target" pos="{t[0]:.3f} {t[1]:.3f} {t[2]:.3f}"/>'
    )


def scene_xml(scene: str, rng: np.random.Generator, msaa: int = 1) -> str:
    """The MJCF of one random instance of ``scene`` (one of ``SCENES``)."""
    head = _header(rng, msaa)
    if scene == "falling_objects":
        bodies = []
        for k in range(int(rng.integers(3, 7))):
            kind = ("box", "sphere", "capsule", "cylinder")[int(rng.integers(4))]
            s = rng.uniform(0.04, 0.1)
            size = {
                "box": f"{s:.3f} {rng.uniform(0.04, 0.1):.3f} {rng.uniform(0.04, 0.1):.3f}",
                "sphere": f"{s:.3f}",
            }.get(kind, f"{s:.3f} {rng.uniform(0.04, 0.1):.3f}")
            pos = rng.uniform([-0.25, -0.25, 0.3], [0.25, 0.25, 0.9])
            quat = rng.normal(size=4)
            quat /= np.linalg.norm(quat)
            bodies.append(
                f'    <body name="obj{k}" pos="{pos[0]:.3f} {pos[1]:.3f} {pos[2]:.3f}" '
                f'quat="{quat[0]:.4f} {quat[1]:.4f} {quat[2]:.4f} {quat[3]:.4f}">\n'
                f'      <freejoint/>\n      <geom type="{kind}" size="{size}" rgba="{_rgba(rng)}" density="500"/>\n'
                f"    </body>"
            )
        body = "\n".join(bodies) + "\n" + _camera(rng, (0.0, 0.0, 0.15), (1.2, 1.6))
    elif scene == "double_pendulum":
        l1, l2 = rng.uniform(0.25, 0.4), rng.uniform(0.2, 0.35)
        damping = rng.uniform(0.0, 0.02)
        body = f"""
    <geom type="cylinder" fromto="0 -0.1 0 0 -0.1 1.0" size="0.02" rgba="0.4 0.4 0.4 1"/>
    <body name="link1" pos="0 0 1.0">
      <joint name="j1" type="hinge" axis="0 1 0" damping="{damping:.4f}"/>
      <geom type="capsule" fromto="0 0 0 0 0 -{l1:.3f}" size="0.025" rgba="{_rgba(rng)}"/>
      <body name="link2" pos="0 0 -{l1:.3f}">
        <joint name="j2" type="hinge" axis="0 1 0" damping="{damping:.4f}"/>
        <geom type="capsule" fromto="0 0 0 0 0 -{l2:.3f}" size="0.02" rgba="{_rgba(rng)}"/>
        <geom type="sphere" pos="0 0 -{l2:.3f}" size="0.05" rgba="{_rgba(rng)}"/>
      </body>
    </body>
""" + _camera(rng, (0.0, 0.0, 0.65), (1.1, 1.4), azimuth=(60.0, 120.0), elevation=(5.0, 20.0))
    elif scene == "arm":
        links = rng.uniform(0.15, 0.25, 3)
        ball = rng.uniform([0.2, -0.2], [0.4, 0.2])
        body = f"""
    <geom type="box" pos="0.25 0 0.2" size="0.35 0.35 0.02" rgba="{_rgba(rng)}"/>
    <body name="ball" pos="{ball[0]:.3f} {ball[1]:.3f} 0.26">
      <freejoint/>
      <geom type="sphere" size="0.04" rgba="{_rgba(rng)}" density="300"/>
    </body>
    <body name="base" pos="0 0 0.25">
      <geom type="cylinder" size="0.05 0.03" rgba="0.3 0.3 0.3 1"/>
      <body name="l1" pos="0 0 0.03">
        <joint name="a1" type="hinge" axis="0 0 1" damping="0.5"/>
        <geom type="capsule" fromto="0 0 0.01 {links[0]:.3f} 0 0.01" size="0.02" rgba="{_rgba(rng)}"/>
        <body name="l2" pos="{links[0]:.3f} 0 0">
          <joint name="a2" type="hinge" axis="0 0 1" damping="0.5"/>
          <geom type="capsule" fromto="0 0 0.01 {links[1]:.3f} 0 0.01" size="0.018" rgba="{_rgba(rng)}"/>
          <body name="l3" pos="{links[1]:.3f} 0 0">
            <joint name="a3" type="hinge" axis="0 0 1" damping="0.5"/>
            <geom type="capsule" fromto="0 0 0.01 {links[2]:.3f} 0 0.01" size="0.015" rgba="{_rgba(rng)}"/>
          </body>
        </body>
      </body>
    </body>
""" + _camera(rng, (0.2, 0.0, 0.25), (1.0, 1.3))
        body += """
  </worldbody>
  <actuator>
    <position joint="a1" kp="20"/>
    <position joint="a2" kp="20"/>
    <position joint="a3" kp="20"/>
  </actuator>
</mujoco>"""
        return f'<mujoco model="arm">{head}{body}'
    else:
        raise ConfigError(f"scene: unknown video scene {scene!r}; expected one of {SCENES}")
    return f'<mujoco model="{scene}">{head}{body}\n  </worldbody>\n</mujoco>'


def simulate_clip(
    scene: str,
    rng: np.random.Generator,
    size: int = DEFAULT_SIZE,
    frames: int = FRAMES,
    fps: int = FPS,
    msaa: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Simulate one random instance of ``scene`` and render it.

    Returns:
        ``(video, qpos)``: (frames, size, size, 3) uint8 RGB frames and (frames, nq) float64 joint
        positions at those frames (the first frame is the initial state).
    """
    mujoco = _mujoco()
    model = mujoco.MjModel.from_xml_string(scene_xml(scene, rng, msaa))
    data = mujoco.MjData(model)
    if scene == "double_pendulum":
        data.qpos[:] = rng.uniform([-2.5, -2.5], [2.5, 2.5])
    elif scene == "falling_objects":
        for j in range(model.njnt):
            adr = model.jnt_dofadr[j]
            data.qvel[adr : adr + 6] = np.r_[rng.uniform(-0.5, 0.5, 3), rng.uniform(-4, 4, 3)]
    amp, freq, phase = rng.uniform(0.6, 1.5, 3), rng.uniform(0.6, 1.5, 3), rng.uniform(0, 2 * np.pi, 3)
    mujoco.mj_forward(model, data)
    steps = max(1, int(round(1.0 / (fps * model.opt.timestep))))
    video = np.empty((frames, size, size, 3), np.uint8)
    qpos = np.empty((frames, model.nq))
    renderer = mujoco.Renderer(model, size, size)
    try:
        for f in range(frames):
            renderer.update_scene(data, camera="view")
            video[f] = renderer.render()
            qpos[f] = data.qpos
            for _ in range(steps):
                if model.nu:
                    data.ctrl[:] = amp * np.sin(2 * np.pi * freq * data.time + phase)
                mujoco.mj_step(model, data)
            if not np.all(np.isfinite(data.qpos)):
                raise SimulationError(f"{scene}: physics diverged (NaN in qpos) at frame {f}")
    finally:
        renderer.close()
    return video, qpos


def make_dataset(
    out: Path, n: int, seed: int = 0, size: int | None = None, spp: int = 32, test_fraction: float = 0.2,
    frames: int = FRAMES,
) -> dict:
    """Simulate and render ``n`` clips (scenes cycle through ``SCENES``) into ``out``.

    Args:
        out: dataset root folder.
        n: number of clips.
        seed: dataset seed (clip ``i`` is drawn from ``view_rng(seed, i)``).
        size: square frame size in pixels, even (default ``DEFAULT_SIZE``).
        spp: offscreen multisampling samples, capped at ``MAX_MSAA`` (MuJoCo rasterises; no path tracing).
        test_fraction: share of clips (the last ones) that go to ``test``.
        frames: frames per clip (at ``FPS``); long clips are what video models' drift is measured on.

    Returns:
        Summary dict: root, n, splits, size, frames, fps, seconds, and "meta".
    """
    dataset_io.check_make_args(n, seed, size, spp, test_fraction)
    size = DEFAULT_SIZE if size is None else size
    if frames < 1:
        raise ConfigError(f"frames: must be >= 1, got {frames}")
    if size % 2:
        raise ConfigError(f"size: H.264 (yuv420p) needs an even frame size, got {size}")
    out = Path(out)
    t0 = time.perf_counter()
    msaa = min(spp, MAX_MSAA)
    counts = dict.fromkeys(dataset_io.SPLITS, 0)
    clips = {}
    for split, sid, index in dataset_io.split_ids(n, test_fraction):
        scene = SCENES[index % len(SCENES)]
        video, qpos = simulate_clip(scene, dataset_io.view_rng(seed, index), size, frames, FPS, msaa)
        write_mp4(out / split / "video" / f"{sid}.mp4", video, fps=FPS, crf=CRF)
        with atomic_path(out / split / "qpos" / f"{sid}.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, qpos)
        counts[split] += 1
        dataset_io.view_done()
        clips[f"{split}/{sid}"] = {
            "split": split,
            "id": sid,
            "scene": scene,
            "frames": frames,
            "nq": qpos.shape[1],
        }
    meta = {
        "format": "embodied-video/1",
        "generator": "sim.render.videos (MuJoCo offscreen, libx264)",
        "seed": seed,
        "classes": list(SCENES),
        "splits": counts,
        "width": size,
        "height": size,
        "frames": frames,
        "fps": FPS,
        "codec": f"h264 yuv420p crf {CRF}",
        "msaa": msaa,
        "clips": clips,
    }
    write_json(out / "meta.json", meta)
    return {
        "root": str(out),
        "n": n,
        "splits": counts,
        "size": size,
        "frames": frames,
        "fps": FPS,
        "seconds": time.perf_counter() - t0,
        "meta": meta,
    }


def ensure_dataset(root: str | Path, n: int, frames: int, seed: int = 0, size: int | None = None, spp: int = 4,
                   wait: float = 3600.0) -> dict:
    """``root``'s clips (all in ``train``), rendered by ``make_dataset`` first when ``root`` has none; returns
    its ``meta.json``.

    Several runs may ask for the same folder at once: one renders under the folder's lock, the others wait
    for it (up to ``wait`` s). A non-empty folder without ``meta.json``, or one rendered with other settings
    (size, frames, seed, clip count), is a one-line ``DataError`` rather than data silently reused.
    """
    from core.distributed import main_process_first
    from core.errors import DataError
    from core.io import read_json
    from core.logging import get_logger

    root = Path(root)
    meta_path = root / "meta.json"
    with main_process_first(root, wait=wait):  # one renders; the others wait, then read (or see it fail)
        if not meta_path.is_file():
            if root.exists() and any(root.iterdir()):
                raise DataError(root, "exists but has no meta.json (not a sim.render.videos folder)")
            get_logger("embodied.sim").info("rendering %d clips of %d frames (%s px, seed %d) into %s", n, frames,
                                            size, seed, root)
            make_dataset(root, n=n, seed=seed, size=size, spp=spp, test_fraction=0.0, frames=frames)
    meta = read_json(meta_path)
    clips = sum(1 for c in meta.get("clips", {}).values() if c.get("split") == "train")
    have = (meta.get("width"), meta.get("frames"), meta.get("seed"), clips)
    want = (size if size is not None else meta.get("width"), frames, seed, n)
    if have != want:
        raise DataError(meta_path, f"rendered as {have[0]} px, {have[1]} frames, seed {have[2]}, {have[3]} clips; "
                                   f"asked for {want[0]} px, {frames} frames, seed {seed}, {n} clips "
                                   "(use another folder)")
    return meta



def calibrate_clip_domain(checkpoint: str | Path, size: int, work: str | Path, n_train: int = 48, n_cal: int = 48,
                          n_heldout: int = 48) -> dict:
    """Fit the ``core.domain`` check of a video model trained on these clips (Flex-Forcing, TAGRPO).

    The training sample is frames 0, 8, 16 and 23 of the first ``n_train`` clips of the training data (seed 0,
    ``size`` px, 24 frames); the calibration and held-out splits are the first frames of clips of seeds 1000 and
    2000. Clips are rendered once into ``work``. Returns the ``domain_check`` card entry.
    """
    from core import domain
    from core.data.video import read_frames

    def load_split(name: str, seed: int, n: int) -> list[np.ndarray]:
        frames = 24 if name == "train" else 1
        root = Path(work) / f"{size}px_{name}_seed{seed}_n{n}_f{frames}"
        if not (root / "meta.json").is_file():
            make_dataset(root, n=n, seed=seed, size=size, test_fraction=0.0, frames=frames)
        picks = (0, 8, 16, 23) if frames == 24 else (0,)
        return [read_frames(clip)[i] for clip in sorted((root / "train" / "video").glob("*.mp4")) for i in picks]

    sizes = {"train": (0, n_train), "calibration": (1000, n_cal), "heldout": (2000, n_heldout)}
    return domain.calibrate(Path(checkpoint), load_split, sizes,
                            f"sim.render.videos seeds 0 (frames 0 / 8 / 16 / 23 of the first {n_train} training "
                            f"clips), 1000 and 2000 (first frames); {size} px")
