"""sim.policies: one resolver for --policy in sim rollout, libero eval, drive eval and serve."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import sim
from core.errors import ConfigError
from embodied.cli import main
from sim.policies import BUILTIN_POLICIES, known_policies, resolve_policy

sim.register_envs()


def _built(name: str, env_id: str, **kwargs):
    env = gym.make(env_id, **kwargs)
    try:
        policy = resolve_policy(name).factory(env)
        obs, info = env.reset(seed=0)
        policy.reset(seed=0)
        action = np.asarray(policy.act(obs, info))
        assert action.shape == env.action_space.shape and np.isfinite(action).all()
        return type(policy).__name__
    finally:
        env.close()


@pytest.mark.parametrize("name", ["expert", "scripted", "random"])
def test_the_generic_names_build_in_every_family(name):
    """expert / scripted / random act in a manipulation, a driving and a LIBERO env alike."""
    kinds = {env_id: _built(name, env_id) for env_id in ("embodied/Lift-Panda-v0", "embodied/Drive-Highway-v0")}
    kinds["libero"] = _built(name, "embodied/Libero-spatial-0-v0", images=False)
    if name == "expert":  # LIBERO's expert is its task solver, not the reach-and-grasp script
        assert kinds["libero"] == "LiberoSolver"
        assert _built("scripted", "embodied/Libero-spatial-0-v0", images=False) != "LiberoSolver"


def test_driving_names_build_on_driving_and_refuse_elsewhere_in_one_line():
    assert _built("idm", "embodied/Drive-Highway-v0") == _built("expert", "embodied/Drive-Highway-v0")
    _built("constant", "embodied/Drive-Highway-v0")
    env = gym.make("embodied/Lift-Panda-v0")
    with pytest.raises(ConfigError, match="--policy constant: a driving policy"):
        resolve_policy("constant").factory(env)
    env.close()


def test_unknown_names_and_options_are_one_line_with_the_closest_match(tmp_path):
    with pytest.raises(ConfigError, match="did you mean expert") as e:
        resolve_policy("exprt")
    assert all(n in str(e.value) for n in BUILTIN_POLICIES) and "automot" in str(e.value)
    with pytest.raises(ConfigError, match="takes no option 'update_intervall'; did you mean update_interval"):
        resolve_policy("automot", {"update_intervall": 2})
    with pytest.raises(ConfigError, match="the idm policy takes no option 'nois'; did you mean noise"):
        resolve_policy("idm", {"nois": 0.1})
    with pytest.raises(ConfigError, match="served elsewhere"):
        resolve_policy("ws://127.0.0.1:1", {"update_interval": 2})
    assert resolve_policy("automot", {"update_interval": 3}).factory.keywords == {"update_interval": 3}
    assert resolve_policy("scripted", noise=0.2).factory.keywords == {"noise": 0.2}
    assert resolve_policy("scripted", {"noise": 0.0}, noise=0.2).factory.keywords == {"noise": 0.0}
    assert set(BUILTIN_POLICIES) <= set(known_policies())


@pytest.mark.parametrize("argv", [
    ["sim", "rollout", "embodied/Drive-Highway-v0", "--episodes", "1"],
    ["libero", "eval", "--suite", "libero_spatial", "--tasks", "0", "--episodes-per-task", "1"],
    ["drive", "eval", "--episodes", "1"],
])
def test_the_three_loops_answer_alike(tmp_path, capsys, argv):
    """The same unknown name and the same wrong option get the same line from every loop, and nothing is written."""
    lines = []
    for extra in (["--policy", "exprt"], ["--policy", "automot", "--policy-arg", "update_intervall=2"]):
        assert main([*argv, *extra, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        lines.append(err[0])
    assert "--policy 'exprt': neither a policy name nor an existing checkpoint path; did you mean expert?" in lines[0]
    assert "--policy-arg update_intervall: the automot policy takes no option 'update_intervall'; did you mean " \
           "update_interval?" in lines[1]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_sim_rollout_records_a_successful_libero_episode_with_the_expert(tmp_path, capsys):
    """`sim rollout ... --policy expert` on LIBERO runs the task solver (the scripted reach-and-grasp never succeeds)."""
    out = tmp_path / "lib"
    assert main(["sim", "rollout", "embodied/Libero-spatial-0-v0", "--policy", "expert", "--episodes", "1",
                 "--no-video", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success_rate"] == 1.0 and summary["episodes"] == 1
