"""Suite / task listing and registration: checked against LIBERO's own benchmark module."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import zipfile

import gymnasium as gym
import pytest

from core.errors import ConfigError, DataError
from sim.libero import suites
from sim.libero.registration import register

EXPECTED_COUNTS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}


def test_counts():
    assert {s: len(suites.list_tasks(s)) for s in suites.SUITES} == EXPECTED_COUNTS
    assert len(suites.list_tasks()) == 130
    assert all(t.num_init_states == 50 for t in suites.list_tasks())


def test_static_table_matches_libero_benchmark_module():
    from sim.libero._bootstrap import ensure_config

    ensure_config()
    from libero.libero import benchmark  # imports torch

    for suite in suites.SUITES:
        bench = benchmark.get_benchmark(suite)(task_order_index=0)
        ours = suites.list_tasks(suite)
        assert bench.get_num_tasks() == len(ours)
        for i, task in enumerate(ours):
            theirs = bench.get_task(i)
            assert (task.name, task.language) == (theirs.name, theirs.language)
            assert task.bddl_file == f"{theirs.problem_folder}/{theirs.bddl_file}"
            assert task.init_states_file == f"{theirs.problem_folder}/{theirs.init_states_file}"
            assert task.bddl_path().is_file()
    # and the table is exactly what a fresh scan of LIBERO's files gives (languages, init-state counts)
    assert suites.scan_tasks() == suites.list_tasks()


def test_init_states_load_without_torch_and_match_torch():
    import numpy as np
    import torch

    task = suites.get_task("spatial", 3)
    ours = suites.load_init_states(task.init_states_path())
    theirs = torch.load(task.init_states_path(), weights_only=False)
    assert ours.shape == (50, theirs.shape[1]) and np.array_equal(ours, theirs)


def test_init_states_refuse_arbitrary_pickles(tmp_path):
    bad = tmp_path / "evil.pruned_init"
    buf = io.BytesIO()
    pickle.dump(print, buf, protocol=2)  # any non-NumPy global must be refused
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("archive/data.pkl", buf.getvalue())
    with pytest.raises(DataError, match="evil.pruned_init"):
        suites.load_init_states(bad)
    with pytest.raises(DataError, match="not found"):
        suites.load_init_states(tmp_path / "missing.pruned_init")


def test_lookup_errors_and_ids():
    assert suites.get_task("LIBERO_SPATIAL", 3) == suites.parse_task_id("spatial/3")
    assert suites.get_task("10", 0).env_id == "embodied/Libero-10-0-v0"
    assert suites.get_task("libero_90", 89).task_id == "libero_90/89"
    with pytest.raises(ConfigError, match="0..9"):
        suites.get_task("goal", 10)
    with pytest.raises(ConfigError, match="unknown LIBERO suite"):
        suites.get_task("libero_100", 0)
    assert suites.language_from_task_name("KITCHEN_SCENE10_close_the_top_drawer") == "close the top drawer"


def test_register_every_task():
    ids = register()
    pro = [t for t in suites.list_tasks(pro=True) if t.source == "libero_pro"]
    assert len(ids) == len(set(ids)) == 130 + len(pro)  # LIBERO's tasks, then LIBERO-PRO's
    assert ids[:130] == [t.env_id for t in suites.list_tasks()]
    assert gym.spec("embodied/Libero-spatial_swap-0-v0").max_episode_steps == 220  # its base suite's limit
    assert register() == ids  # idempotent
    spec = gym.spec("embodied/Libero-spatial-0-v0")
    assert spec.entry_point == "sim.libero.env:LiberoEnv"
    assert spec.kwargs == {"suite": "libero_spatial", "task_index": 0}
    assert spec.max_episode_steps == 220
    assert gym.spec("embodied/Libero-90-89-v0").kwargs["task_index"] == 89


def test_registration_imports_nothing_heavy():
    code = (
        "import sys; import sim.libero.registration as r; r.register(); "
        "heavy = [m for m in ('libero', 'robosuite', 'mujoco', 'torch') if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
