"""LeRobot v3 export and import (core/data/lerobot.py): read by lerobot's own LeRobotDataset, round trip
HDF5 -> LeRobot -> TrajectoryDataset, shared MP4 files, bad input, the CLI and BC training on an export.

lerobot itself lives in the side folder ``.venv/side-lerobot`` (``make setup`` installs it there, --no-deps: it
pins an older torch); the tests that need it run it in a subprocess with that folder on ``sys.path``.
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
import numpy as np, torch, torchvision, av
root, side, out = sys.argv[1:4]
sys.path.insert(0, side)

class PyAVReader:
    """torchvision.io.VideoReader's "pyav" backend (removed from torchvision 0.29), on PyAV, for LeRobot's decoder."""
    def __init__(self, path, stream="video"):
        self.container = av.open(path)
        self._s = self.container.streams.video[0]
    def seek(self, ts, keyframes_only=True):  # the key frame at or before ts, as torchvision's pyav seek did
        self.container.seek(max(0, int(ts / self._s.time_base)), stream=self._s, backward=True, any_frame=False)
        return self
    def __iter__(self):
        for fr in self.container.decode(self._s):
            yield {"data": torch.from_numpy(fr.to_ndarray(format="rgb24")).permute(2, 0, 1), "pts": float(fr.time)}

torchvision.io.VideoReader = PyAVReader
torchvision.set_video_backend = lambda backend: None
from lerobot.datasets.lerobot_dataset import LeRobotDataset

ds = LeRobotDataset(repo_id="local/x", root=root, video_backend="pyav")
items = [ds[i] for i in range(len(ds))]
res = {"fps": np.array(ds.fps), "episodes": np.array(ds.num_episodes), "frames": np.array(ds.num_frames),
       "tasks": np.array([it["task"] for it in items]), "stats_keys": np.array(sorted(ds.meta.stats))}
for k in ("action", "observation.state", "observation.proprio", "timestamp", "frame_index", "episode_index",
          "index", "next.reward", "next.done"):
    if k in items[0]:
        res[k] = torch.stack([it[k] for it in items]).numpy()
for k in ds.meta.video_keys:  # float (3, H, W) in [0, 1] -> uint8 (H, W, 3)
    res[k] = torch.stack([(it[k] * 255).round().to(torch.uint8).permute(1, 2, 0) for it in items]).numpy()
np.savez(out, **res)
'''


def lerobot_read(folder: Path, tmp_path: Path) -> dict[str, np.ndarray]:
    """Every frame of ``folder`` as lerobot's ``LeRobotDataset(..., video_backend="pyav")`` gives it."""
    if not (SIDE / "lerobot").is_dir():
        pytest.fail(f"lerobot is not installed in {SIDE}: run `make setup` (it installs it there for the tests)")
    script, out = tmp_path / "read.py", tmp_path / "read.npz"
    script.write_text(LEROBOT_READ)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
           "HF_LEROBOT_HOME": str(tmp_path / "hf" / "lerobot"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(script), str(folder), str(SIDE), str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(out) as z:
        return dict(z)


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
