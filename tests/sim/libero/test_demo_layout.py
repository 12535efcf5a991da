"""LIBERO's demonstration layout, written by hand from LIBERO's documented keys, through our loader and trainer.

The file here is made with h5py directly, following LIBERO's ``scripts/create_dataset.py``, not our
recorder. It has images stored bottom-up (``macros_image_convention`` "opengl"), uint8 rewards / dones,
``robot_states`` (gripper qpos, eef pos, eef quat) and the env / BDDL attributes. A user's downloaded file
looks like this. Our writer (``sim.libero.demos.write_libero_demo_file``, used by ``embodied libero
record``) must produce the same structure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
T, H = 12, 32
LANGUAGE = "pick up the black bowl between the plate and the ramekin and place it on the plate"


def _frames(n: int, seed: int) -> np.ndarray:
    """Upright frames with a bright top row, so that a flip is visible."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 120, (n, H, H, 3), dtype=np.uint8)
    x[:, 0] = 255
    return x


def write_by_hand(path: Path, episodes: int = 2, language: str = LANGUAGE) -> dict[str, np.ndarray]:
    """A LIBERO demo file as LIBERO writes it; returns the upright agent-view frames of each demo. The file stores
    them with rows reversed (the raw render); the loader returns them rotated 180 degrees from that (openpi's and
    LeRobot's convention), i.e. ``upright[:, :, ::-1]``: the upright picture mirrored left-right."""
    bddl = "libero_spatial/pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate.bddl"
    upright = {}
    with h5py.File(path, "w") as f:
        grp = f.create_group("data")
        grp.attrs["env_name"] = "Libero_Tabletop_Manipulation"
        grp.attrs["problem_info"] = json.dumps({"problem_name": "libero_tabletop_manipulation",
                                                "domain_name": "robosuite", "language_instruction": language})
        grp.attrs["macros_image_convention"] = "opengl"
        grp.attrs["bddl_file_name"] = bddl
        grp.attrs["bddl_file_content"] = "(define (problem LIBERO_Tabletop_Manipulation) ...)"
        grp.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation",
                                            "problem_name": "libero_tabletop_manipulation", "bddl_file": bddl,
                                            "env_kwargs": {"control_freq": 20, "camera_heights": H}})
        total = 0
        rng = np.random.default_rng(0)
        for i in range(episodes):
            ep = grp.create_group(f"demo_{i}")
            obs = ep.create_group("obs")
            ee = rng.normal(0, 0.1, (T, 6))
            agent, wrist = _frames(T, 2 * i), _frames(T, 2 * i + 1)
            upright[f"demo_{i}"] = agent
            obs.create_dataset("gripper_states", data=rng.uniform(-0.04, 0.04, (T, 2)))
            obs.create_dataset("joint_states", data=rng.normal(0, 1, (T, 7)))
            obs.create_dataset("ee_states", data=ee)
            obs.create_dataset("ee_pos", data=ee[:, :3])
            obs.create_dataset("ee_ori", data=ee[:, 3:])
            obs.create_dataset("agentview_rgb", data=agent[:, ::-1])  # OpenGL row order, as LIBERO stores
            obs.create_dataset("eye_in_hand_rgb", data=wrist[:, ::-1])
            ep.create_dataset("actions", data=np.clip(rng.normal(0, 0.3, (T, 7)), -1, 1))
            ep.create_dataset("states", data=rng.normal(0, 1, (T, 79)))
            ep.create_dataset("robot_states", data=rng.normal(0, 1, (T, 9)))
            last = np.zeros(T, np.uint8)
            last[-1] = 1
            ep.create_dataset("rewards", data=last)
            ep.create_dataset("dones", data=last)
            ep.attrs["num_samples"] = T
            ep.attrs["model_file"] = "<mujoco model='base'/>"
            ep.attrs["init_state"] = rng.normal(0, 1, 79)
            total += T
        grp.attrs["num_demos"] = episodes
        grp.attrs["total"] = total
    return upright


def _structure(path: Path) -> dict[str, object]:
    """Every dataset's (dtype kind, ndim) and the attribute names, per group, with demo numbers dropped."""
    out: dict[str, object] = {}

    def visit(name, obj):
        key = "/".join("demo_i" if p.startswith("demo_") else p for p in name.split("/"))
        if isinstance(obj, h5py.Dataset):
            out[key] = (obj.dtype.kind, obj.ndim)
        else:
            out[key + "@"] = sorted(obj.attrs)

    with h5py.File(path, "r") as f:
        f.visititems(visit)
        out["data@"] = sorted(f["data"].attrs)
    return out


def test_hand_written_libero_file_reads_rot180_with_its_language(tmp_path):
    """LIBERO's own file (raw frames, no convention of ours) reads in openpi's and LeRobot's LIBERO convention, the
    one LiberoEnv gives policies: the raw render rotated 180 degrees."""
    from core.data.trajectories import TrajectoryDataset, TrajectoryFile

    path = tmp_path / "task_demo.hdf5"
    upright = write_by_hand(path)
    with h5py.File(path, "r") as h:
        assert "image_convention" not in h["data"].attrs
        raw = h["data/demo_0/obs/agentview_rgb"][()]
    with TrajectoryFile(path) as f:
        assert f.episodes == ["demo_0", "demo_1"] and f.language_instruction == LANGUAGE
        assert f.file_attrs["bddl_file_name"].endswith(".bddl") and f.image_convention == "rot180"
        ep = f.episode("demo_0")
    assert np.array_equal(ep["obs/agentview_rgb"], raw[:, ::-1, ::-1])  # openpi: obs["agentview_image"][::-1, ::-1]
    assert np.array_equal(ep["obs/agentview_rgb"], upright["demo_0"][:, :, ::-1])
    assert (ep["obs/agentview_rgb"][:, 0] == 255).all()  # the top row stays on top
    ds = TrajectoryDataset([path], obs_keys=["agentview_rgb", "ee_states"], horizon=4, frame_stack=1)
    sample = ds[0]
    assert sample["obs.agentview_rgb"].shape == (1, 3, H, H) and (sample["obs.agentview_rgb"][0, :, 0] == 255).all()
    assert np.array_equal(sample["obs.agentview_rgb"][0].permute(1, 2, 0).numpy(), raw[0, ::-1, ::-1])
    assert ds.image_convention == "rot180"
    assert sample["actions"].shape == (4, 7) and sample["obs.ee_states"].shape == (1, 6)


@pytest.mark.timeout(600)
def test_bc_trains_on_a_hand_written_libero_file(tmp_path):
    """The training command a user runs on LIBERO's own files runs unchanged on this one."""
    from core.checkpoint import load_checkpoint
    from core.logging import read_metrics
    from embodied.cli import main

    path = tmp_path / "libero_spatial" / "task_demo.hdf5"
    path.parent.mkdir()
    write_by_hand(path, episodes=3)
    before = path.read_bytes()
    out = tmp_path / "run"
    args = ["train", "bc", "debug=tiny", "model=bc_tiny", "data.record.episodes=0", f"data.paths=[{path}]",
            "env=libero_spatial_0", "model.image_key=agentview_rgb", "model.proprio_key=ee_states", f"out_dir={out}",
            "trainer.max_steps=4", "trainer.batch_size=8", "trainer.ckpt_every=4"]
    assert main(args) == 0
    rows = read_metrics(out)
    assert rows[-1]["step"] == 4 and np.isfinite(rows[-1]["loss"])
    model = load_checkpoint(out)["config"]["model"]
    assert model["action_dim"] == 7 and model["proprio_dim"] == 6  # dims resolved from the LIBERO file
    assert model["image_convention"] == "rot180"  # the frames it trained on, for closed loop to match
    assert path.read_bytes() == before  # the user's file is read-only to training


def test_our_writer_makes_libero_s_structure(tmp_path):
    """``write_libero_demo_file`` (the recorder's writer) has the hand-written file's datasets and attributes."""
    from sim.libero.demos import LiberoDemo, write_libero_demo_file

    ref = tmp_path / "ref.hdf5"
    write_by_hand(ref, episodes=2)
    rng = np.random.default_rng(1)
    demos = []
    for i in range(2):
        ee = rng.normal(0, 0.1, (T, 6))
        obs = {"agentview_rgb": _frames(T, i)[:, ::-1], "eye_in_hand_rgb": _frames(T, i + 5)[:, ::-1],
               "ee_pos": ee[:, :3], "ee_ori": ee[:, 3:], "ee_states": ee,
               "gripper_states": rng.normal(0, 1, (T, 2)), "joint_states": rng.normal(0, 1, (T, 7))}
        last = np.eye(T, dtype=np.uint8)[-1]
        demos.append(LiberoDemo(actions=rng.normal(0, 0.3, (T, 7)), states=rng.normal(0, 1, (T, 79)), obs=obs,
                                rewards=last, dones=last, robot_states=rng.normal(0, 1, (T, 9)),
                                attrs={"init_state": rng.normal(0, 1, 79), "model_file": "<mujoco/>"}))
    ours = tmp_path / "ours.hdf5"
    write_libero_demo_file(ours, demos, problem_info={"problem_name": "p", "domain_name": "robosuite",
                                                      "language_instruction": LANGUAGE},
                           bddl_file_name="x.bddl", bddl_file_content="(define ...)",
                           env_args={"type": 1, "env_name": "E", "problem_name": "p", "bddl_file": "x.bddl",
                                     "env_kwargs": {}})
    a, b = _structure(ref), _structure(ours)
    b["data@"].remove("image_convention")  # ours state the convention the loader returns the frames in
    assert a == b, {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
    with h5py.File(ours, "r") as f:
        assert f["data"].attrs["image_convention"] == "rot180"


def _embodied(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.timeout(900)
def test_recorded_expert_demo_has_libero_s_layout_and_replays_to_success(tmp_path):
    """``embodied libero record`` run from a user's folder writes a successful expert episode from a sampled
    placement in LIBERO's layout; its actions, replayed from the stored seed, solve the task again; a rerun
    keeps the finished task; a folder holding the user's own files is refused."""
    from core.data.trajectories import TrajectoryFile
    from sim.libero.env import LiberoEnv
    from sim.libero.record import NOOP_ACTION
    from sim.libero.suites import get_task

    task = get_task("libero_object", 0)
    flags = ["--suite", "libero_object", "--tasks", "0", "--demos-per-task", "1", "--image-size", str(H)]
    r = _embodied("libero", "record", *flags, "--out", "demos", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "demos" / "libero_object" / f"{task.name}_demo.hdf5"
    assert path.is_file() and "1 / 1 tasks complete" in r.stdout
    ref = tmp_path / "ref.hdf5"
    write_by_hand(ref, episodes=1)
    a, b = _structure(ref), _structure(path)
    missing = {k for k in a if k not in b}
    assert not missing, missing  # every key and attribute LIBERO writes (ours add e.g. embodied_record, seed)
    with TrajectoryFile(path) as f:
        assert f.language_instruction == task.bddl_language
        assert f.file_attrs["image_convention"] == "rot180" and f.file_attrs["macros_image_convention"] == "opengl"
        ep, attrs = f.episode("demo_0"), f.attrs("demo_0")
        raw = {k: f.raw("demo_0", f"obs/{k}", 0) for k in ("agentview_rgb", "eye_in_hand_rgb")}
    n = len(ep["actions"])
    cam = LiberoEnv(task.suite, task.index, image_size=H)  # the recorder's camera env: its first recorded frame
    try:
        obs, _ = cam.reset(seed=int(attrs["seed"]), options={"init_state_id": "sampled"})
        for _ in range(10):
            obs, *_ = cam.step(NOOP_ACTION)
        # stored: LIBERO's raw render; read: what the env gives the policy (rot180)
        assert np.array_equal(raw["agentview_rgb"], cam.raw_obs["agentview_image"])
        assert np.array_equal(raw["eye_in_hand_rgb"], cam.raw_obs["robot0_eye_in_hand_image"])
        assert np.array_equal(ep["obs/agentview_rgb"][0], obs["image"])
        assert np.array_equal(ep["obs/eye_in_hand_rgb"][0], obs["wrist_image"])
    finally:
        cam.close()
    assert ep["obs/agentview_rgb"].shape == (n, H, H, 3) and ep["rewards"].tolist() == [0] * (n - 1) + [1]
    env = LiberoEnv(task.suite, task.index, images=False)
    try:
        env.reset(seed=int(attrs["seed"]), options={"init_state_id": "sampled"})
        for _ in range(9):
            env.step(NOOP_ACTION)
        obs, *_ = env.step(NOOP_ACTION)
        np.testing.assert_array_equal(env.sim.get_state().flatten(), attrs["init_state"])
        # what a policy trained on the file reads in closed loop (LiberoEnv.demo_obs) is what the file holds
        seen = LiberoEnv.demo_obs(obs)
        for key in ("ee_states", "ee_pos", "ee_ori", "gripper_states", "joint_states"):
            np.testing.assert_allclose(seen[key], ep[f"obs/{key}"][0], rtol=0, atol=1e-6, err_msg=key)
        assert set(LiberoEnv.demo_obs_sources) >= {"agentview_rgb", "eye_in_hand_rgb", "ee_states", "gripper_states"}
        infos = [env.step(a)[-1] for a in ep["actions"]]
        assert infos[-1]["success"] and not any(i["success"] for i in infos[:-1])  # success on the last step
    finally:
        env.close()
    before = path.read_bytes()
    r = _embodied("libero", "record", *flags, "--out", "demos", cwd=tmp_path)
    assert r.returncode == 0 and "(kept)" in r.stdout and path.read_bytes() == before, r.stderr
    mine = tmp_path / "my_libero_datasets"
    (mine / "libero_object").mkdir(parents=True)
    write_by_hand(mine / "libero_object" / path.name, episodes=1)
    theirs = (mine / "libero_object" / path.name).read_bytes()
    r = _embodied("libero", "record", *flags, "--out", str(mine), "--overwrite", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (mine / "libero_object" / path.name).read_bytes() == theirs  # never replaced, even with --overwrite


def test_record_from_fixed_init_states_flags_and_old_files(tmp_path):
    """``--init-states`` is validated in one line before any env is built; a file recorded before the option
    existed (its setting has no ``init_states``) still counts as recorded from sampled placements."""
    import h5py

    from sim.libero.record import RecordSetting, _recorded

    for bad in ("60", "a-b"):
        r = _embodied("libero", "record", "--suite", "libero_spatial", "--tasks", "7", "--init-states", bad,
                      "--out", "demos", cwd=tmp_path)
        assert r.returncode == 2 and "--init-states" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "demos").exists()
    path = tmp_path / "old_demo.hdf5"
    write_by_hand(path, episodes=2)
    old = {"policy": "expert", "image_size": 32, "wrist_image": True, "settle_steps": 10, "max_steps": 220, "seed": 0}
    with h5py.File(path, "a") as f:
        f["data"].attrs["embodied_record"] = json.dumps(old)
        f["data"].attrs["num_demos"] = 2
    assert _recorded(path, RecordSetting(**old), 2) is not None
    assert _recorded(path, RecordSetting(**old, init_states="10,11"), 2) is None


@pytest.mark.timeout(600)
def test_a_replay_that_diverges_is_dropped_not_fatal(tmp_path, monkeypatch):
    from sim.libero import record
    from sim.libero.suites import get_task

    real, calls = record.replay_with_cameras, []

    def flaky(env, seed, *args, **kwargs):
        calls.append(seed)
        if len(calls) == 1:
            raise record.ReplayMismatch("diverged")
        return real(env, seed, *args, **kwargs)

    monkeypatch.setattr(record, "replay_with_cameras", flaky)
    summary = record.record_task(get_task("libero_object", 0), 1, tmp_path, image_size=H)
    assert summary["demos"] == 1 and summary["attempts"] == 2 and summary["failures"] == {"replay differs": 1}
    assert calls == [0, 1] and Path(summary["path"]).is_file()
