"""LIBERO-PRO's suites in the harness: read in place from the unpacked package, one table with LIBERO's, the
base suite's protocol, and every suite buildable on rpent-libero (its object variants registered)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError, DataError
from sim.libero import evaluate as ev
from sim.libero import pro, suites

REPO = Path(__file__).resolve().parents[3]


def _pro_tasks() -> list[suites.LiberoTask]:
    return [t for t in suites.list_tasks(pro=True) if t.source == "libero_pro"]


def test_static_table_is_the_scan_of_the_unpacked_package():
    """tasks_pro.json is what scanning the package's files gives (regenerate: python -m sim.libero.suites
    --write-table); make setup unpacks the package, so a missing one is a failure here, not a skip."""
    assert [dict(t.__dict__) for t in pro.scan_pro_tasks()] == [dict(t.__dict__) for t in _pro_tasks()]


def test_every_shipped_suite_is_a_suite_name_with_its_base_protocol():
    root = pro.pro_root()
    shipped = {p.name for p in (root / "bddl_files").iterdir() if (root / "init_files" / p.name).is_dir()}
    listed = set(suites.list_suites(pro=True)) - set(suites.SUITES)
    # every shipped suite but those whose objects no package has meshes for
    unbuildable = {s for s in shipped - listed - set(suites.SUITES)}
    assert unbuildable and all(any(k in s for k in ("blue_stick", "red_box", "green_mug")) for s in unbuildable)
    assert listed <= shipped and len(listed) == 52
    assert suites.MAX_EPISODE_STEPS["libero_object_temp_x0.3"] == 280
    assert suites.MAX_EPISODE_STEPS["libero_10_swap"] == 520
    assert suites.MAX_EPISODE_STEPS["libero_study_table"] == suites.UNBASED_STEP_LIMIT
    with pytest.raises(KeyError):
        suites.MAX_EPISODE_STEPS["libero_nothing"]
    t = suites.get_task("spatial_swap", 0)
    assert t.source == "libero_pro" and t.bddl_path().is_file() and t.init_states_path().is_file()
    assert t.env_id == "embodied/Libero-spatial_swap-0-v0"
    assert suites.load_init_states(t.init_states_path()).shape == (50, 92)


@pytest.mark.parametrize("suite, axis", [
    ("libero_spatial", "clean"), ("libero_spatial_object", "object"), ("libero_goal_swap", "position"),
    ("libero_object_temp_x0.3", "position"), ("libero_10_lan", "language"), ("libero_object_task", "task"),
    ("libero_spatial_with_mug", "distractor"), ("libero_object_with_trigger_new", "other"),
    ("libero_study_table", "other"), ("libero_mine", "other"),
])
def test_suite_axis(suite, axis):
    assert pro.suite_axis(suite) == axis


def test_language_and_task_suites_give_the_policy_the_new_instruction():
    base, lan, task = (suites.get_task(s, 0) for s in ("libero_spatial", "libero_spatial_lan", "libero_spatial_task"))
    assert lan.name.endswith(base.name.split("SCENE1_")[-1])
    assert lan.language == lan.bddl_language != base.language  # the paraphrase is the perturbation
    assert task.language == task.bddl_language != base.language
    swap = suites.get_task("libero_spatial_swap", 0)
    assert swap.language == base.language  # a moved object does not change the instruction


def test_unknown_suite_is_one_line_naming_the_close_ones():
    with pytest.raises(ConfigError) as e:
        suites.normalize_suite("spatial_swp")
    msg = str(e.value)
    assert "\n" not in msg and "libero_spatial_swap" in msg and "sim list --family libero" in msg


def test_suite_selectors_expand_to_the_base_suites_perturbations():
    names = ev.expand_suites("spatial,pro:spatial")
    assert names[0] == "libero_spatial" and len(names) == 1 + sum(
        s.startswith("libero_spatial_") for s in suites.list_suites(pro=True))
    assert all(pro.suite_axis(s) != "clean" for s in ev.expand_suites("pro"))
    plan = ev.select_episodes("libero_spatial_with_milk", [0], 50)  # that suite ships 10 init states a task
    assert [len(ids) for _, ids in plan] == [10]
    with pytest.raises(ConfigError, match="unknown LIBERO suite"):
        ev.expand_suites("pro:nothing")


def test_npz_init_states_load_and_bad_ones_fail_in_one_line(tmp_path):
    np.savez(tmp_path / "a.pruned_init.npz", states=np.zeros((3, 5)))
    assert suites.load_init_states(tmp_path / "a.pruned_init.npz").shape == (3, 5)
    np.savez(tmp_path / "b.pruned_init.npz", states=np.zeros(0))
    with pytest.raises(DataError, match="2-D float"):
        suites.load_init_states(tmp_path / "b.pruned_init.npz")
    (tmp_path / "c.pruned_init.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="cannot read init states"):
        suites.load_init_states(tmp_path / "c.pruned_init.npz")


def test_aggregate_groups_suites_by_axis():
    recs = [{"suite": s, "task_index": 0, "init_state_id": k, "success": ok, "steps": 5, "failure": None if ok else "timeout"}
            for s, oks in (("libero_spatial", [1, 1]), ("libero_spatial_swap", [1, 0]), ("libero_object_temp_x0.1", [0, 0]),
                           ("libero_spatial_lan", [1, 1])) for k, ok in enumerate(oks)]
    axes = ev.aggregate(recs)["per_axis"]
    assert list(axes) == ["clean", "position", "language"]
    assert axes["position"]["suites"] == ["libero_object_temp_x0.1", "libero_spatial_swap"]  # in suite order
    assert (axes["position"]["successes"], axes["position"]["n_episodes"]) == (1, 4)
    assert "AXIS" in ev.stdout_table(ev.aggregate(recs))


def test_a_pro_table_pointing_at_no_package_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(pro.ENV_VAR, str(tmp_path))
    with pytest.raises(ConfigError, match="make setup"):
        pro.pro_root()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_object_variants_are_their_twins_on_other_meshes():
    from sim.libero._bootstrap import prepare_libero

    prepare_libero()
    from libero.libero.envs.base_object import OBJECTS_DICT
    from libero.libero.envs.objects import FlatStove, WoodenCabinet

    added = pro.register_pro_objects()
    assert pro.register_pro_objects() == added  # once per process
    assert set(pro.TWINS) | {n for n in pro.CUSTOM if pro.custom_xml(n)} <= set(OBJECTS_DICT)
    cab = OBJECTS_DICT["yellow_cabinet"]()
    assert isinstance(cab, WoodenCabinet) and cab.category_name == "yellow_cabinet"
    assert cab.object_properties["articulation"] == WoodenCabinet().object_properties["articulation"]
    assert isinstance(OBJECTS_DICT["yellow_stove"](), FlatStove)
    assert OBJECTS_DICT["red_sticker"]().rotation_axis == "z"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.sweep(sample=lambda p: p["suite"].endswith(("_swap", "_with_mug", "_lan", "temp_x0.3", "_with_red_stick",
                                                         "_object", "study_table")))
@pytest.mark.parametrize("suite", sorted(set(suites.list_suites(pro=True)) - set(suites.SUITES)))
def test_every_pro_suite_builds_resets_and_steps(suite):
    """Task 0 of each LIBERO-PRO suite builds on rpent-libero, resets to its init state 0 (the state sizes
    agree) and steps (`make test`: a sample of suites covering every axis; `make test-all`: all 52)."""
    from sim.libero.env import LiberoEnv

    env = LiberoEnv(suite, 0, images=False)
    try:
        obs, _ = env.reset(options={"init_state_id": 0})
        for _ in range(3):
            obs, _, _, _, info = env.step(np.zeros(7, np.float32))
        assert np.isfinite(obs["proprio"]).all() and info.get("failure") is None
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_command_scores_clean_and_pro_suites_by_axis_from_outside_the_repo(tmp_path):
    """The README's command, run from a folder outside the repository: the expert on task 0 of libero_spatial
    and its PRO copies, one init state each; the summary has the axis table and eval_info.json per_axis."""
    out = tmp_path / "eval"
    env = {**os.environ, "PYTHONPATH": ""}
    res = subprocess.run([sys.executable, "-m", "embodied", "libero", "eval", "--suite", "spatial,pro:spatial",
                          "--tasks", "0", "--episodes-per-task", "1", "--policy", "expert", "--workers", "2",
                          "--videos", "0", "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "AXIS" in res.stdout and "distractor" in res.stdout
    info = json.loads((out / "eval_info.json").read_text())
    assert info["per_axis"]["clean"]["successes"] == 1
    assert set(info["per_axis"]) == {"clean", "object", "position", "language", "task", "distractor"}
    recs = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert {r["suite"] for r in recs} == set(info["per_group"])
