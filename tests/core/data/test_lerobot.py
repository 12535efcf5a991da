"""LeRobot v3 export and import (core/data/lerobot.py): read by lerobot's own LeRobotDataset, round trip
HDF5 -> LeRobot -> TrajectoryDataset, shared MP4 files, multi-axis obs (driving) and dropped keys, folders of
recordings, bad input, the CLI, BC training on an export and on a dataset LeRobot's own API wrote.

lerobot itself lives in the side folder ``.venv/side-lerobot`` (``make setup`` installs it there, --no-deps: it
pins an older torch, with torchcodec, its default video decoder); the tests that need it run it in a subprocess
with that folder on ``sys.path``, unpatched, as a user would.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from core.data.lerobot import LeRobotFile, VideoOptions, export_lerobot
from core.data.trajectories import TrajectoryDataset, TrajectoryWriter
from core.errors import DataError

REPO = Path(__file__).resolve().parents[3]
SIDE = REPO / ".venv" / "side-lerobot"
FPS = 20
LOSSLESS = VideoOptions("libx264rgb", "rgb24", 0)
# Max abs pixel error of the default encoding (H.264 yuv420p, CRF 18) on the smooth 64x64 test frames below:
# chroma is stored at half resolution, so no per-pixel bound follows from the codec; measured 36 (and 31 on the
# second camera) here, through lerobot's reader and ours alike; bound 48 for x264's thread-count dependence.
# The lossless setting (libx264rgb, rgb24, CRF 0) must give 0.
LOSSY_TOL = 48
BDDL = "libero/bddl_files/libero_spatial/pick_up_the_cube.bddl"


def frames(T: int, H: int, W: int, seed: int) -> np.ndarray:
    """(T, H, W, 3) uint8 smooth moving colour waves (a one-frame shift changes pixels by > 40)."""
    yy, xx = np.mgrid[0:H, 0:W] / H
    t = np.arange(T)[:, None, None] / 8.0
    r = 128 + 100 * np.sin(2 * np.pi * (xx + t + seed * 0.1))
    g = 128 + 100 * np.cos(2 * np.pi * (yy - t))
    b = 128 + 60 * np.sin(2 * np.pi * (xx + yy + t) + seed)
    return np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)


def make_demos(path: Path, episodes: int = 3, size: int = 64, libero: bool = False, camera: str | None = None) -> Path:
    """A recorder-style file: 2 cameras, proprio (9), eef_delta (3), 7-d actions, ~20 steps per episode.

    ``libero``: LIBERO's layout instead (agentview_rgb / eye_in_hand_rgb the raw render, i.e. ``frames`` (upright)
    with rows reversed, ee_pos / gripper_states; LIBERO's BDDL attribute), which the loader returns in ``rot180``:
    ``frames[:, :, ::-1]``.
    """
    rng = np.random.default_rng(0)
    kwargs = {"image_size": size, **({"camera": camera} if camera else {})}
    env_meta = {"env_name": "embodied/Lift-Panda-v0", "embodiment": "Panda", "env_kwargs": kwargs}
    if libero:  # LIBERO's env_args
        env_meta = {"env_name": "Libero_Tabletop_Manipulation", "problem_name": "libero_tabletop_manipulation",
                    "bddl_file": BDDL, "embodiment": "Panda", "env_kwargs": kwargs}
    with TrajectoryWriter(path, env_meta=env_meta, language_instruction="pick up the cube" if libero else None) as w:
        for e in range(episodes):
            T = 20 + e
            a, b = frames(T, size, size, e), frames(T, size, size, e + 5)
            if libero:
                obs = {"agentview_rgb": a[:, ::-1].copy(), "eye_in_hand_rgb": b[:, ::-1].copy(),
                       "ee_pos": rng.normal(size=(T, 3)).astype(np.float32),
                       "gripper_states": rng.normal(size=(T, 2)).astype(np.float32)}
                attrs = {}
            else:
                obs = {"image": a, "wrist": b, "proprio": rng.normal(size=(T, 9)).astype(np.float32),
                       "eef_delta": rng.normal(size=(T, 3)).astype(np.float32)}
                attrs = {"embodiment": "Panda", "success": e % 2 == 0, "language_instruction": f"lift cube {e % 2}"}
            w.add_episode(obs, rng.normal(size=(T, 7)).astype(np.float32), rewards=rng.random(T).astype(np.float32),
                          attrs=attrs)
    if libero:
        with h5py.File(path, "a") as f:
            f["data"].attrs["macros_image_convention"] = "opengl"
            f["data"].attrs["bddl_file_name"] = BDDL
    return path


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Path:
    return make_demos(tmp_path_factory.mktemp("in") / "demos.hdf5")


@pytest.fixture(scope="module")
def exports(tmp_path_factory, demos) -> dict[str, Path]:
    """The same file exported three ways: default (lossy, shared MP4), lossless shared, lossless one file each."""
    root = tmp_path_factory.mktemp("out")
    return {
        "lossy": Path(export_lerobot(demos, root / "lossy", fps=FPS)["path"]),
        "lossless": Path(export_lerobot(demos, root / "lossless", fps=FPS, video=LOSSLESS)["path"]),
        "split": Path(export_lerobot(demos, root / "split", fps=FPS, video=LOSSLESS, episodes_per_file=1)["path"]),
    }


# ------------------------------------------------------------------------------------------- lerobot reads it
LEROBOT_READ = r'''
import sys
import numpy as np, torch
root, side, out = sys.argv[1:4]
sys.path.insert(0, side)
from lerobot.datasets.lerobot_dataset import LeRobotDataset

ds = LeRobotDataset(repo_id="local/x", root=root)  # LeRobot's defaults (torchcodec decodes the videos), no patch
items = [ds[i] for i in range(len(ds))]
res = {"fps": np.array(ds.fps), "episodes": np.array(ds.num_episodes), "frames": np.array(ds.num_frames),
       "tasks": np.array([it["task"] for it in items]), "stats_keys": np.array(sorted(ds.meta.stats)),
       "backend": np.array(ds.video_backend),
       "hf_types": np.array([f"{k}:{type(v).__name__}" for k, v in ds.hf_dataset.features.items()])}
for k, v in items[0].items():
    if isinstance(v, torch.Tensor) and k not in ds.meta.video_keys:
        res[k] = torch.stack([it[k] for it in items]).numpy()
for k in ds.meta.video_keys:  # float (3, H, W) in [0, 1] -> uint8 (H, W, 3)
    res[k] = torch.stack([(it[k] * 255).round().to(torch.uint8).permute(1, 2, 0) for it in items]).numpy()
np.savez(out, **res)
'''


def side_env(tmp_path: Path) -> dict[str, str]:
    """The environment lerobot runs in here: offline, its caches inside ``tmp_path``."""
    if not (SIDE / "lerobot").is_dir():
        pytest.fail(f"lerobot is not installed in {SIDE}: run `make setup` (it installs it there for the tests)")
    return {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
            "HF_LEROBOT_HOME": str(tmp_path / "hf" / "lerobot"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def lerobot_read(folder: Path, tmp_path: Path) -> dict[str, np.ndarray]:
    """Every frame of ``folder`` as lerobot's ``LeRobotDataset(repo_id, root=folder)`` gives it (unpatched)."""
    script, out = tmp_path / "read.py", tmp_path / "read.npz"
    script.write_text(LEROBOT_READ)
    r = subprocess.run([sys.executable, str(script), str(folder), str(SIDE), str(out)], env=side_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(out) as z:
        got = dict(z)
    assert str(got.pop("backend")) == "torchcodec"  # LeRobot's default decoder, not a fallback
    return got


def hdf5_steps(path: Path) -> dict[str, np.ndarray]:
    """The file's episodes concatenated in order (images upright)."""
    from core.data.trajectories import TrajectoryFile

    out: dict[str, list] = {}
    with TrajectoryFile(path) as f:
        for name in f.episodes:
            for k, v in f.episode(name).items():
                out.setdefault(k, []).append(v)
            out.setdefault("task", []).append([f.attrs(name).get("language_instruction")] * f.num_samples(name))
            out.setdefault("frame", []).append(np.arange(f.num_samples(name)))
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.mark.parametrize("kind", ["lossy", "lossless", "split"])
def test_lerobot_dataset_reads_the_export(exports, demos, tmp_path, kind):
    got, want = lerobot_read(exports[kind], tmp_path), hdf5_steps(demos)
    n = len(want["actions"])
    assert (int(got["episodes"]), int(got["frames"]), int(got["fps"])) == (3, n, FPS) == (3, 63, 20)
    assert np.array_equal(got["action"], want["actions"])  # exactly: float32 both ways
    assert np.array_equal(got["observation.proprio"], want["obs/proprio"])
    assert np.array_equal(got["observation.state"], want["obs/proprio"])  # state = proprio (the default rule)
    assert np.array_equal(got["next.reward"], want["rewards"]) and np.array_equal(got["next.done"], want["dones"] == 1)
    assert np.array_equal(got["frame_index"], want["frame"]) and np.array_equal(got["index"], np.arange(n))
    assert np.array_equal(got["episode_index"], np.repeat([0, 1, 2], [20, 21, 22]))
    assert np.allclose(got["timestamp"], want["frame"] / FPS, atol=1e-6, rtol=0)
    assert got["tasks"].tolist() == want["task"].tolist()
    assert "observation.images.image" in got["stats_keys"] and "action" in got["stats_keys"]
    for key in ("image", "wrist"):
        err = np.abs(got[f"observation.images.{key}"].astype(int) - want[f"obs/{key}"].astype(int)).max()
        print(f"{kind} {key}: max abs pixel error {err} over {n} frames")
        assert err <= (LOSSY_TOL if kind == "lossy" else 0)


def test_export_meta_is_complete(exports):
    root = exports["lossy"]
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS and info["robot_type"] == "Panda"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 63, 2)
    f = info["features"]
    assert f["observation.images.image"]["shape"] == [64, 64, 3] and f["observation.images.image"]["dtype"] == "video"
    assert f["observation.images.image"]["info"]["video.codec"] == "h264"
    assert f["observation.images.image"]["info"]["video.pix_fmt"] == "yuv420p"
    assert f["observation.state"]["shape"] == [9] and f["action"]["shape"] == [7]
    stats = json.loads((root / "meta/stats.json").read_text())
    want = frames(20, 64, 64, 0), frames(21, 64, 64, 1), frames(22, 64, 64, 2)
    allpix = np.concatenate([w.reshape(-1, 3) for w in want]) / 255.0
    assert np.allclose(np.array(stats["observation.images.image"]["mean"]).ravel(), allpix.mean(0), atol=1e-9)
    assert np.allclose(np.array(stats["observation.images.image"]["std"]).ravel(), allpix.std(0), atol=1e-9)
    assert np.array(stats["observation.images.image"]["min"]).shape == (3, 1, 1)
    assert stats["action"]["count"] == [63] and len(stats["action"]["q50"]) == 7
    assert sorted(p.name for p in (root / "videos/observation.images.image/chunk-000").iterdir()) == ["file-000.mp4"]


# ------------------------------------------------------------------------------------------------ round trip
def windows(ds: TrajectoryDataset) -> list[dict]:
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("kind,cache", [("lossless", "none"), ("split", "all"), ("lossy", "low_dim")])
def test_round_trip_gives_the_same_windows(exports, demos, kind, cache):
    kw = {"horizon": 4, "frame_stack": 3, "stride": 2, "cache": cache}
    a, b = TrajectoryDataset(demos, **kw), TrajectoryDataset(exports[kind], **kw)
    assert len(a) == len(b) == 32 and a.obs_keys == b.obs_keys == ["eef_delta", "image", "proprio", "wrist"]
    for x, y in zip(a.episodes, b.episodes, strict=True):
        assert (x.name, x.length, x.embodiment, x.action_dim, x.language_instruction, x.success) == \
               (y.name, y.length, y.embodiment, y.action_dim, y.language_instruction, y.success)
    err = 0
    for x, y in zip(windows(a), windows(b), strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if k in ("obs.image", "obs.wrist"):
                assert x[k].shape == y[k].shape == (3, 3, 64, 64)
                err = max(err, int((x[k].int() - y[k].int()).abs().max()))
            else:
                assert x[k].dtype == y[k].dtype and x[k].equal(y[k]), k
    print(f"round trip {kind}: {len(a)} windows, max abs pixel error {err}")
    assert err <= (LOSSY_TOL if kind == "lossy" else 0)
    # batched reads (DataLoader's __getitems__) agree too
    idx = list(range(0, len(b), 3))
    for x, y in zip(a.__getitems__(idx), b.__getitems__(idx), strict=True):
        assert x["actions"].equal(y["actions"]) and x["obs.proprio"].equal(y["obs.proprio"])


def test_libero_layout_exports_rot180_and_round_trips(tmp_path):
    """LIBERO frames are exported in openpi's and LeRobot's convention (the raw render rotated 180 degrees), which
    info.json states; LeRobot's own reader sees exactly those frames."""
    src = make_demos(tmp_path / "libero.hdf5", episodes=2, libero=True)
    out = export_lerobot(src, tmp_path / "lr", fps=FPS, video=LOSSLESS)
    info = json.loads((tmp_path / "lr/meta/info.json").read_text())
    feats = info["features"]
    assert feats["observation.state"]["names"][:3] == ["ee_pos_0", "ee_pos_1", "ee_pos_2"]  # sorted low-dim keys
    assert feats["observation.state"]["shape"] == [5] and out["tasks"] == ["pick up the cube"]
    assert info["image_convention"] == "rot180"
    with h5py.File(src, "r") as h:
        raw = [h[f"data/demo_{i}/obs/agentview_rgb"][()] for i in range(2)]
    rot180 = [r[:, ::-1, ::-1] for r in raw]  # openpi: obs["agentview_image"][::-1, ::-1]
    assert np.array_equal(rot180[1], frames(21, 64, 64, 1)[:, :, ::-1])  # = the upright picture mirrored
    with LeRobotFile(tmp_path / "lr") as f:
        assert f.image_convention == "rot180"
        assert f.read("demo_1", "obs/agentview_rgb").tobytes() == rot180[1].tobytes()
        assert f.language_instruction == "pick up the cube"
    got = lerobot_read(tmp_path / "lr", tmp_path)
    assert np.array_equal(got["observation.images.agentview_rgb"], np.concatenate(rot180))
    a = TrajectoryDataset(src, horizon=2, frame_stack=2)
    b = TrajectoryDataset(tmp_path / "lr", horizon=2, frame_stack=2)
    assert len(a) == len(b) == 41 and a.image_convention == b.image_convention == "rot180"
    for x, y in zip(windows(a), windows(b), strict=True):
        assert all(x[k].equal(y[k]) for k in x)


def test_an_old_libero_export_reads_rot180(tmp_path):
    """An export of ours from before conventions were stated (no ``image_convention`` in info.json, LIBERO frames
    in the old flipud: the raw render with rows reversed) is read in rot180, like the source file."""
    src = make_demos(tmp_path / "libero.hdf5", episodes=2, libero=True)
    old_src = tmp_path / "flipud.hdf5"
    old_src.write_bytes(src.read_bytes())
    with h5py.File(old_src, "a") as f:  # the loader then returns flipud frames, what old exports hold
        f["data"].attrs["image_convention"] = "flipud"
    export_lerobot(old_src, tmp_path / "old", fps=FPS, video=LOSSLESS)
    info_path = tmp_path / "old/meta/info.json"
    info = json.loads(info_path.read_text())
    assert info.pop("image_convention") == "flipud"
    info_path.write_text(json.dumps(info))
    with LeRobotFile(tmp_path / "old") as f:
        assert f.image_convention == "rot180"
        with h5py.File(src, "r") as h:
            raw = h["data/demo_1/obs/eye_in_hand_rgb"][()]
        assert f.read("demo_1", "obs/eye_in_hand_rgb").tobytes() == raw[:, ::-1, ::-1].tobytes()
    a = TrajectoryDataset(src, horizon=2, frame_stack=2)
    b = TrajectoryDataset(tmp_path / "old", horizon=2, frame_stack=2)
    assert b.image_convention == "rot180"
    for x, y in zip(windows(a), windows(b), strict=True):
        assert all(x[k].equal(y[k]) for k in x)
    # a dataset of LeRobot's own (no embodied.json, no image_convention) is read as it is
    (tmp_path / "old/meta/embodied.json").unlink()
    with LeRobotFile(tmp_path / "old") as f:
        assert f.image_convention is None
        assert f.read("demo_1", "obs/eye_in_hand_rgb").tobytes() == raw[:, ::-1].tobytes()


def test_export_refuses_frames_of_unknown_and_known_conventions_together(tmp_path):
    libero = make_demos(tmp_path / "libero.hdf5", episodes=1, libero=True)
    other = make_demos(tmp_path / "other.hdf5", episodes=1, libero=True)
    with h5py.File(other, "a") as f:  # the same keys, but not a LIBERO file: no convention
        del f["data"].attrs["bddl_file_name"]
        f["data"].attrs["env_args"] = json.dumps({"env_name": "Lift", "env_kwargs": {"robots": ["Panda"]}})
    with pytest.raises(DataError, match="convention"):
        export_lerobot([libero, other], tmp_path / "mixed", fps=FPS, video=LOSSLESS)
    flipped = make_demos(tmp_path / "flipud.hdf5", episodes=1, libero=True)
    with h5py.File(flipped, "a") as f:
        f["data"].attrs["image_convention"] = "flipud"
    export_lerobot([libero, flipped], tmp_path / "both", fps=FPS, video=LOSSLESS)  # converted to the first's
    with LeRobotFile(tmp_path / "both") as f, h5py.File(flipped, "r") as h:
        assert f.image_convention == "rot180"
        raw = h["data/demo_0/obs/agentview_rgb"][()]
        assert np.array_equal(f.read("demo_1", "obs/agentview_rgb"), raw[:, ::-1, ::-1])


def test_episodes_share_one_mp4_and_read_frame_accurately(exports, demos):
    root = exports["lossless"]
    import pyarrow.parquet as pq

    rows = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    key = "videos/observation.images.wrist"
    assert [r[f"{key}/file_index"] for r in rows] == [0, 0, 0]
    assert [(r[f"{key}/from_timestamp"], r[f"{key}/to_timestamp"]) for r in rows] == [(0, 1.0), (1.0, 2.05),
                                                                                       (2.05, 3.15)]
    with LeRobotFile(root, video_cache_bytes=1) as f:  # cache of one episode: every read below decodes
        for i in (2, 0, 1):  # seek backwards and forwards inside the shared file
            assert np.array_equal(f.read(f"demo_{i}", "obs/wrist"), frames(20 + i, 64, 64, i + 5))
        assert len(f._decoded) == 1
    with LeRobotFile(root) as f:
        f.read("demo_1", "obs/image", np.s_[3:5])
        first = f._decoded[("observation.images.image", 1)]
        assert f.read("demo_1", "obs/image", np.s_[5:9]).base is first  # the LRU hands out the decoded episode
    assert len(list((exports["split"] / "videos/observation.images.wrist").rglob("*.mp4"))) == 3


# ------------------------------------------------------------------------------------------------- bad input
def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_bad_folders_raise_one_line_data_errors(exports, demos, tmp_path):
    bad = _copy(exports["lossless"], tmp_path / "no_info")
    (bad / "meta/info.json").unlink()
    with pytest.raises(DataError, match=r"info\.json: no such file") as e:
        TrajectoryDataset(bad)
    assert "\n" not in str(e.value)

    bad = _copy(exports["lossless"], tmp_path / "truncated")
    data = bad / "data/chunk-000/file-000.parquet"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(DataError, match=r"file-000\.parquet: cannot read as Parquet") as e:
        TrajectoryDataset(bad)  # low-dim cache: read at construction
    assert "\n" not in str(e.value)

    bad = _copy(exports["lossless"], tmp_path / "no_video")
    (bad / "videos/observation.images.image/chunk-000/file-000.mp4").unlink()
    ds = TrajectoryDataset(bad, cache="low_dim")
    with pytest.raises(DataError, match=r"file-000\.mp4: no such file \(video of episode 0\)") as e:
        ds[0]
    assert "\n" not in str(e.value)

    bad = _copy(exports["lossless"], tmp_path / "cut_video")
    mp4 = bad / "videos/observation.images.image/chunk-000/file-000.mp4"
    mp4.write_bytes(mp4.read_bytes()[: mp4.stat().st_size // 3])
    with pytest.raises(DataError, match=r"file-000\.mp4: ") as e:
        LeRobotFile(bad).read("demo_2", "obs/image")
    assert "\n" not in str(e.value)

    with pytest.raises(DataError, match="is an input"):
        export_lerobot(demos, demos)  # the output would replace the input


# ------------------------------------------------------------------------------------------------------- CLI
def _hash_tree(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p.relative_to(folder)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_cli_export_next_to_the_input_and_overwrite(tmp_path):
    user = tmp_path / "user"
    src = make_demos((user / "recordings").mkdir(parents=True) or user / "recordings" / "demos.hdf5", episodes=2,
                     size=32)
    before = _hash_tree(user / "recordings")
    r = _cli(["sim", "export-lerobot", "recordings/demos.hdf5", "--out", "demos_lerobot", "--fps", "10"], cwd=user)
    assert r.returncode == 0, r.stderr
    assert "2 episodes, 41 frames at 10 fps" in r.stdout
    assert _hash_tree(user / "recordings") == before  # the input folder is untouched
    assert json.loads((user / "demos_lerobot/meta/info.json").read_text())["fps"] == 10
    assert TrajectoryDataset(user / "demos_lerobot").episodes[1].length == 21
    # an existing export is refused without --overwrite, replaced with it
    r = _cli(["sim", "export-lerobot", str(src), "--out", "demos_lerobot"], cwd=user)
    assert r.returncode == 2 and "--overwrite" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli(["sim", "export-lerobot", str(src), "--out", "demos_lerobot", "--overwrite", "--lossless"], cwd=user)
    assert r.returncode == 0, r.stderr
    info = json.loads((user / "demos_lerobot/meta/info.json").read_text())
    assert info["fps"] == 20 and info["features"]["observation.images.image"]["info"]["video.pix_fmt"] == "rgb24"
    # an output inside the input's folder, and a missing input: one line, exit 2
    r = _cli(["sim", "export-lerobot", "recordings", "--out", "recordings/lr"], cwd=user)
    assert r.returncode == 2 and "is an input" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli(["sim", "export-lerobot", "missing.hdf5", "--out", "lr2"], cwd=user)
    assert r.returncode == 2 and "missing.hdf5: no such file" in r.stderr
    assert _hash_tree(user / "recordings") == before and not (user / "lr2").exists()
    # a folder of recordings (a `sim rollout` output) exports its .hdf5 files
    r = _cli(["sim", "export-lerobot", "recordings", "--out", "from_folder"], cwd=user)
    assert r.returncode == 0 and "2 episodes, 41 frames" in r.stdout, r.stderr
    r = _cli(["sim", "export-lerobot", "from_folder/meta", "--out", "lr3"], cwd=user)
    assert r.returncode == 2 and "without .hdf5" in r.stderr and not (user / "lr3").exists()


# ------------------------------------------------------------------------------------ training on an export
@pytest.mark.timeout(600)
def test_bc_trains_on_a_lerobot_folder(tmp_path):
    from core.logging import read_metrics
    from embodied.cli import main

    src = make_demos(tmp_path / "demos.hdf5", episodes=3, size=32, camera="workspace")  # bc's eval camera
    folder = Path(export_lerobot(src, tmp_path / "lr", fps=FPS)["path"])
    out = tmp_path / "run"
    args = ["train", "bc", "debug=tiny", "model=bc_tiny", "data.record.episodes=0", f"data.paths=[{folder}]",
            f"out_dir={out}", "trainer.max_steps=4", "trainer.batch_size=8", "trainer.ckpt_every=4"]
    assert main(args) == 0
    rows = read_metrics(out)
    assert rows[-1]["step"] == 4 and np.isfinite(rows[-1]["loss"])
    from core.checkpoint import load_checkpoint

    assert load_checkpoint(out)["config"]["model"]["action_dim"] == 7  # dims resolved from the LeRobot folder


def test_lacwm_transitions_read_a_lerobot_folder(exports, demos):
    from worldmodels.lacwm.data import TransitionDataset

    a = TransitionDataset([demos], context=2, skip=2, image_key="wrist")
    b = TransitionDataset([exports["lossless"]], context=2, skip=2, image_key="wrist")
    assert len(a) == len(b) == 51 and a.embodiments == b.embodiments == ["Panda"]
    for i in (0, 17, 50):
        x, y = a[i], b[i]
        assert all(x[k].equal(y[k]) for k in x)


def test_lacwm_pretraining_takes_the_users_lerobot_folder(exports, tmp_path):
    """``data.paths`` puts a user's LeRobot folder into LAC-WM's pretraining split, read in place."""
    from core.errors import DataError
    from worldmodels.lacwm.configuration_lacwm import WorldModelDataConfig
    from worldmodels.lacwm.training import data_files

    folder = exports["lossless"]
    before = sorted((p.relative_to(folder), p.stat().st_mtime_ns) for p in folder.rglob("*"))
    root = tmp_path / "cache"
    for split in ("pretrain", "adapt", "test"):  # no recording: the cache is keyed by env id, so empty splits
        (root / split).mkdir(parents=True)
    cfg = WorldModelDataConfig(root=str(root), tasks=[], paths=[str(folder)])
    files = data_files(cfg, record=False)
    assert files["pretrain"] == [folder] and files["adapt"] == [] and files["test"] == []
    assert sorted((p.relative_to(folder), p.stat().st_mtime_ns) for p in folder.rglob("*")) == before
    with pytest.raises(DataError, match="no such file or folder"):
        data_files(WorldModelDataConfig(root=str(root), tasks=[], paths=[str(tmp_path / "absent")]), record=False)


# ---------------------------------------------------------------------- multi-axis obs (driving), dropped keys
def make_driving(path: Path, episodes: int = 2) -> Path:
    """A driving-recorder-style file: front camera (T, 32, 64, 3), agents (T, 8, 8), route (T, 20, 2), channel-first
    BEV masks (T, 6, 16, 16) uint8, speed (T,), proprio (T, 4); 2-d actions; T = 12 + episode."""
    rng = np.random.default_rng(1)
    env_meta = {"env_name": "embodied/Drive-Highway-v0", "env_type": "driving", "env_kwargs": {},
                "embodiment": "ego_car"}
    with TrajectoryWriter(path, env_meta=env_meta, language_instruction="drive along the highway") as w:
        for e in range(episodes):
            T = 12 + e
            obs = {"image": np.concatenate([frames(T, 32, 32, e), frames(T, 32, 32, e + 3)], axis=2),
                   "agents": rng.normal(size=(T, 8, 8)).astype(np.float32),
                   "route": rng.normal(size=(T, 20, 2)).astype(np.float32),
                   "bev": rng.integers(0, 2, (T, 6, 16, 16), dtype=np.uint8),
                   "speed": rng.normal(size=T).astype(np.float32),
                   "proprio": rng.normal(size=(T, 4)).astype(np.float32)}
            w.add_episode(obs, rng.normal(size=(T, 2)).astype(np.float32), attrs={"embodiment": "ego_car"})
    return path


def test_multi_axis_obs_become_fixed_shape_features_lerobot_reads(tmp_path):
    """(T, 8, 8) / (T, 20, 2) / (T, 6, H, W) obs are exported with their shapes; LeRobot's reader loads them as the
    Array2D / Array3D features its ``get_hf_features_from_features`` maps those shapes to, value for value."""
    src = make_driving(tmp_path / "drive.hdf5")
    export_lerobot(src, tmp_path / "lr", fps=FPS, video=LOSSLESS)
    info = json.loads((tmp_path / "lr/meta/info.json").read_text())
    f = info["features"]
    assert (f["observation.agents"]["shape"], f["observation.agents"]["dtype"]) == ([8, 8], "float32")
    assert (f["observation.route"]["shape"], f["observation.route"]["dtype"]) == ([20, 2], "float32")
    assert (f["observation.bev"]["shape"], f["observation.bev"]["dtype"]) == ([6, 16, 16], "uint8")
    assert f["observation.speed"]["shape"] == [1] and f["observation.state"]["shape"] == [4]  # state = proprio
    assert f["observation.images.image"]["shape"] == [32, 64, 3]
    assert info["obs_keys"] == {"kept": {"agents": "observation.agents", "bev": "observation.bev",
                                         "image": "observation.images.image", "proprio": "observation.proprio",
                                         "route": "observation.route", "speed": "observation.speed"},
                                "dropped": []}
    want = hdf5_steps(src)
    stats = json.loads((tmp_path / "lr/meta/stats.json").read_text())  # LeRobot's shape: per last axis
    assert np.allclose(stats["observation.agents"]["mean"], want["obs/agents"].reshape(-1, 8).mean(0), atol=1e-6)
    assert np.allclose(stats["observation.bev"]["max"], want["obs/bev"].reshape(-1, 16).max(0))
    assert stats["observation.route"]["count"] == [25]

    got = lerobot_read(tmp_path / "lr", tmp_path)
    types = set(got["hf_types"].tolist())
    assert {"observation.agents:Array2D", "observation.route:Array2D", "observation.bev:Array3D",
            "observation.speed:Value", "observation.state:List"} <= types, types
    assert np.array_equal(got["observation.agents"], want["obs/agents"])
    assert np.array_equal(got["observation.route"], want["obs/route"])
    assert np.array_equal(got["observation.bev"], want["obs/bev"])
    assert np.array_equal(got["observation.speed"], want["obs/speed"])
    assert np.array_equal(got["observation.state"], want["obs/proprio"])
    assert np.array_equal(got["observation.images.image"], want["obs/image"])  # lossless
    # and back: the same windows as the HDF5 file
    a = TrajectoryDataset(src, horizon=2, frame_stack=2)
    b = TrajectoryDataset(tmp_path / "lr", horizon=2, frame_stack=2)
    assert a.obs_keys == b.obs_keys == ["agents", "bev", "image", "proprio", "route", "speed"]
    for x, y in zip(windows(a), windows(b), strict=True):
        assert all(x[k].equal(y[k].reshape(x[k].shape)) for k in x)  # speed: (T,) there, (T, 1) here


def test_drop_keys_are_left_out_and_stated(tmp_path):
    src = make_driving(tmp_path / "drive.hdf5")
    export_lerobot(src, tmp_path / "lr", fps=FPS, drop_keys=["bev", "agents"])
    info = json.loads((tmp_path / "lr/meta/info.json").read_text())
    assert not {"observation.agents", "observation.bev"} & set(info["features"])
    assert info["obs_keys"]["dropped"] == ["agents", "bev"]
    assert sorted(info["obs_keys"]["kept"]) == ["image", "proprio", "route", "speed"]
    with LeRobotFile(tmp_path / "lr") as f:
        assert f.obs_keys("demo_0") == ["image", "proprio", "route", "speed"]
    with pytest.raises(DataError, match=r"drop key\(s\) \['nope'\] are not obs keys of demo_0"):
        export_lerobot(src, tmp_path / "x", drop_keys=["nope"])
    with pytest.raises(DataError, match=r"state key\(s\) \['route'\] are not \(T,\) / \(T, D\) low-dim"):
        export_lerobot(src, tmp_path / "x", state_keys=["route"])
    with pytest.raises(DataError, match=r"state key\(s\) \['agents'\]"):  # a dropped key is no state key
        export_lerobot(src, tmp_path / "x", state_keys=["agents"], drop_keys=["agents"])
    assert not (tmp_path / "x").exists()
    user = tmp_path / "user"
    user.mkdir()
    r = _cli(["sim", "export-lerobot", str(src), "--out", "lr", "--drop-keys", "agents", "--state-keys",
              "speed,proprio"], cwd=user)
    assert r.returncode == 0, r.stderr
    assert "obs keys left out: agents" in r.stdout
    info = json.loads((user / "lr/meta/info.json").read_text())
    assert info["obs_keys"]["dropped"] == ["agents"] and info["features"]["observation.state"]["shape"] == [5]
    r = _cli(["sim", "export-lerobot", str(src), "--out", "lr2", "--state-keys", "speedd"], cwd=user)
    assert r.returncode == 2 and "speedd" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (user / "lr2").exists()


def test_cli_folder_argument_finds_files_in_sub_folders(tmp_path):
    """``embodied libero record`` writes <out>/<suite>/<task>_demo.hdf5: a folder argument finds them at any depth,
    in path order, skipping hidden staging folders; a tree without any is refused. ``data.paths`` does the same."""
    from core.data.trajectories import expand_data_paths

    user = tmp_path / "user"
    suite = user / "rec" / "libero_spatial"
    suite.mkdir(parents=True)
    make_demos(suite / "b_task_demo.hdf5", episodes=2, size=32, libero=True)
    make_demos(suite / "a_task_demo.hdf5", episodes=1, size=32, libero=True)
    (user / "rec" / ".staging").mkdir()
    make_driving(user / "rec" / ".staging" / "half_written.hdf5", episodes=1)  # other keys: would be refused
    before = _hash_tree(user / "rec")
    r = _cli(["sim", "export-lerobot", "rec", "--out", "lr"], cwd=user)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "rec: 2 .hdf5 file(s) found (sub-folders included)"
    assert "3 episodes, 61 frames" in r.stdout  # a: 1 episode (20 steps), b: 2 (20 + 21)
    extra = json.loads((user / "lr/meta/embodied.json").read_text())
    assert [s["path"] for s in extra["sources"]] == ["a_task_demo.hdf5", "b_task_demo.hdf5"]
    assert [e["source"] for e in extra["episodes"]] == [0, 1, 1]
    assert _hash_tree(user / "rec") == before
    assert expand_data_paths([user / "rec", user / "lr"]) == [suite / "a_task_demo.hdf5",
                                                              suite / "b_task_demo.hdf5", user / "lr"]
    (user / "empty" / "sub").mkdir(parents=True)
    (user / "empty" / "sub" / "notes.txt").write_text("no recordings here")
    r = _cli(["sim", "export-lerobot", "empty", "--out", "lr2"], cwd=user)
    assert r.returncode == 2 and "empty: a folder without .hdf5 trajectory files" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (user / "lr2").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cli_exports_a_drive_eval_output(tmp_path):
    """A real ``drive eval`` recording (its HDF5 one folder down, agents / route / BEV multi-axis) exports."""
    r = _cli(["drive", "eval", "--policy", "idm", "--episodes", "1", "--out", "de"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    from core.data.trajectories import TrajectoryFile

    r = _cli(["sim", "export-lerobot", "de", "--out", "de_lr"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0] == "de: 1 .hdf5 file(s) found (sub-folders included)"
    src = next((tmp_path / "de").rglob("*.hdf5"))
    feats = json.loads((tmp_path / "de_lr/meta/info.json").read_text())["features"]
    with TrajectoryFile(src) as h, LeRobotFile(tmp_path / "de_lr") as f:
        for k in h.obs_keys("demo_0"):
            shape = h.dataset("demo_0", f"obs/{k}").shape
            if len(shape) > 2 and k != "image":
                assert feats[f"observation.{k}"]["shape"] == list(shape[1:]), k
                assert np.array_equal(f.read("demo_0", f"obs/{k}"), h.read("demo_0", f"obs/{k}")), k


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readme_lerobot_snippet_runs(tmp_path):
    """The README's commands for reading an export with LeRobot's reader, run as written from a folder outside the
    repository (only the workspace line set to this checkout)."""
    readme = (REPO / "README.md").read_text()
    at = readme.index("LeRobot's own reader opens an export")
    block = readme[readme.index("```\n", at) + 4: readme.index("\n```", readme.index("```\n", at) + 4)]
    assert "LeRobotDataset(" in block and "PYTHONPATH=$WS/.venv/side-lerobot" in block
    assert block.startswith("WS=/path/to/the/workspace\n")  # the one line a user edits
    script = block.replace("WS=/path/to/the/workspace", f"WS={REPO}", 1)  # run as written, from tmp_path
    env = {k: v for k, v in side_env(tmp_path).items() if not k.startswith("HF_") or k == "HF_HOME"}
    r = subprocess.run(["bash", "-ec", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[-2].startswith("2 episodes,") and "cameras ['observation.images.image']" in lines[-2], lines
    assert "'observation.agents': (8, 8)" in lines[-1] and "'observation.route': (20, 2)" in lines[-1], lines


# ------------------------------------------------------------------ a dataset LeRobot's own API wrote -> BC
LEROBOT_WRITE = r'''
import sys
import numpy as np
root, side, kind = sys.argv[1:4]
sys.path.insert(0, side)
from lerobot.datasets.lerobot_dataset import LeRobotDataset

cams = ["cam", "wrist"] if kind == "video" else ["cam"]
features = {f"observation.images.{c}": {"dtype": kind, "shape": (32, 32, 3), "names": ["height", "width", "channels"]}
            for c in cams}
features["observation.state"] = {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]}
features["action"] = {"dtype": "float32", "shape": (4,), "names": [f"motor_{i}" for i in range(4)]}
ds = LeRobotDataset.create("user/pick_cube", fps=10, root=root, features=features, robot_type="so100",
                           use_videos=kind == "video")
rng = np.random.default_rng(0)
for e in range(3):
    for t in range(20):
        frame = {f"observation.images.{c}": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for c in cams}
        frame["observation.state"] = rng.normal(size=6).astype(np.float32)
        frame["action"] = rng.normal(size=4).astype(np.float32)
        frame["task"] = "pick up the cube"
        ds.add_frame(frame)
    ds.save_episode()
ds.finalize()
'''


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["video", "image"])
def test_bc_trains_on_a_dataset_lerobot_wrote(tmp_path, kind):
    """``embodied train bc 'data.paths=[DIR]'`` on a dataset of LeRobot's own API (cameras named ``cam`` / ``wrist``,
    ``observation.state``, no simulator camera): the keys come from its info.json, nothing else is set but sizes."""
    from core.checkpoint import load_checkpoint
    from core.logging import read_metrics

    user = tmp_path / "user"
    user.mkdir()
    folder = user / "pick_cube"
    script = tmp_path / "write.py"
    script.write_text(LEROBOT_WRITE)
    r = subprocess.run([sys.executable, str(script), str(folder), str(SIDE), kind], env=side_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((folder / "meta/info.json").read_text())
    assert info["features"]["observation.images.cam"]["dtype"] == kind and not (folder / "meta/embodied.json").exists()
    before = _hash_tree(folder)
    r = _cli(["train", "bc", "data.paths=[pick_cube]", "debug=tiny", "model=bc_tiny"], cwd=user)
    assert r.returncode == 0, r.stderr[-3000:]
    line = "data keys from pick_cube/meta/info.json: camera 'cam', state 'state'"
    if kind == "video":  # several cameras: the line names the others and how to pick one
        line += " (other cameras: wrist; model.image_key=NAME picks one)"
    assert [ln.split(" embodied.bc: ")[-1] for ln in r.stderr.splitlines() if "data keys from" in ln] == [line]
    out = user / "outputs/bc"
    rows = read_metrics(out)
    assert rows[-1]["step"] == 4 and np.isfinite(rows[-1]["loss"])
    model = load_checkpoint(out)["config"]["model"]
    assert (model["image_key"], model["proprio_key"], model["action_dim"], model["proprio_dim"]) == ("cam", "state", 4, 6)
    assert _hash_tree(folder) == before  # the user's dataset is read, never written
    if kind == "video":  # a key set explicitly is used as set: a wrong one is refused, naming the cameras
        r = _cli(["train", "bc", "data.paths=[pick_cube]", "debug=tiny", "model=bc_tiny", "model.image_key=front",
                  "out_dir=run2"], cwd=user)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "model.image_key='front' is not an obs key" in r.stderr and "cameras: cam, wrist" in r.stderr
