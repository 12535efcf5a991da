"""LAC-WM / EAC-WM on LIBERO demonstration files, and planning on LIBERO with a policy's chunks as proposals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gymnasium import spaces
from scipy.spatial.transform import Rotation

from worldmodels.lacwm.data import pose_motion

TEXTS = ["pick up the black bowl next to the plate", "pick up the black bowl on the stove"]


def test_pose_motion_composes_rotations_where_subtracting_axis_angles_fails():
    """A gripper pointing down sits near angle pi, where the axis-angle of a small turn about z is nowhere near
    the difference of the two axis-angles; pose_motion must give the turn itself (world frame)."""
    down = Rotation.from_rotvec([np.pi - 0.01, 0.0, 0.0])
    turns = [0.0, 0.3, -0.2]
    rots = [down]
    for a in turns[1:]:
        rots.append(Rotation.from_rotvec([0, 0, a]) * rots[-1])
    poses = np.array([[0.1 * i, -0.05 * i, 0.02, *r.as_rotvec()] for i, r in enumerate(rots)])
    m = pose_motion(poses)
    np.testing.assert_allclose(m[:, :3], np.diff(poses[:, :3], axis=0), atol=1e-6)
    np.testing.assert_allclose(m[:, 3:], [[0, 0, 0.3], [0, 0, -0.2]], atol=1e-5)
    naive = np.diff(poses[:, 3:], axis=0)
    assert np.abs(naive - m[:, 3:]).max() > 0.1  # the shortcut this replaces is wrong here


def test_transitions_read_libero_files_in_rot180_with_motion_from_ee_states(tmp_path):
    """Hand-written LIBERO files (no eef_delta): agent-view frames in the LIBERO env's convention (the raw render
    rotated 180 degrees, openpi's and LeRobot's: the upright picture mirrored), motion = the relative
    pose over each transition's skip steps, actions of those steps concatenated, embodiment Panda."""
    import h5py

    from core.errors import ConfigError
    from tests.sim.libero.test_demo_layout import write_by_hand
    from worldmodels.lacwm.data import TransitionDataset

    path = tmp_path / "a_demo.hdf5"
    upright = write_by_hand(path, episodes=2)
    ds = TransitionDataset([path], context=2, skip=3, image_key="agentview_rgb", motion_key="ee_states")
    assert ds.embodiments == ["Panda"] and ds.action_dims == {"Panda": 21}
    s = ds[0]  # the first anchor of demo_0: t = 6 (two whole transitions behind it)
    with h5py.File(path) as f:
        ee = f["data/demo_0/obs/ee_states"][:]
        acts = f["data/demo_0/actions"][:]
    rot180 = upright["demo_0"][[0, 3, 6]][:, :, ::-1]  # = the stored raw frames [::-1, ::-1]
    np.testing.assert_array_equal(s["frames"].permute(0, 2, 3, 1).numpy(), rot180)
    np.testing.assert_allclose(s["motion"].numpy(), pose_motion(ee[[0, 3, 6]]), atol=1e-6)
    np.testing.assert_allclose(s["actions"].numpy(), acts[:6].reshape(2, 21), atol=1e-6)
    with pytest.raises(ConfigError, match="motion_key"):
        TransitionDataset([path], motion_key="ee_pos")


@pytest.mark.timeout(600)
def test_both_world_models_train_on_a_folder_of_libero_demos_through_the_cli(tmp_path):
    """`embodied train lacwm experiment=lacwm_libero data.demos=[folder]` (and the eacwm arm): nothing recorded,
    the adapted model acts for the demos' Panda, the user's folder untouched; `eval` refuses in one line."""
    from embodied.cli import main
    from tests.sim.libero.test_demo_layout import write_by_hand
    from worldmodels.lacwm.modeling_lacwm import EACWorldModel, LACWorldModel, WorldModel

    folder = tmp_path / "libero_spatial"
    folder.mkdir()
    for i, text in enumerate(TEXTS):
        write_by_hand(folder / f"task{i}_demo.hdf5", episodes=2, language=text)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    common = ["experiment=lacwm_libero", "debug=tiny", f"data.demos=[{folder}]", "trainer.max_steps=2",
              f"data.root={tmp_path / 'never'}"]
    for arm, cls in (("lacwm", LACWorldModel), ("eacwm", EACWorldModel)):
        out = tmp_path / arm
        args = ["train", "lacwm", *(["--arm", arm] if arm != "lacwm" else []), *common, f"model={arm}_tiny",
                f"out_dir={out}"]
        assert main(args) == 0
        model = WorldModel.from_pretrained(out / "adapted")
        assert isinstance(model, cls)
        enc = model.action_encoder("Panda")
        z = enc(torch.zeros(1, 1, 7 * model.config.frame_skip))
        assert torch.isfinite(z).all()
    assert not (tmp_path / "never").exists()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert main(["eval", "lacwm", *common, "model=lacwm_tiny", f"out_dir={tmp_path / 'lacwm'}"]) != 0


class _Env:
    """What the planner reads of an env: action space, unwrapped (init_state_id, metadata)."""

    def __init__(self):
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.unwrapped = self
        self.init_state_id = 3
        self.metadata = {"embodiment": "Panda"}


class _ChunkPolicy:
    def __init__(self):
        self.resets = 0

    def reset(self, seed=None):
        self.resets += 1

    def action_chunk(self, obs, info):
        t = np.arange(5, dtype=np.float32)[:, None]
        chunk = np.concatenate([np.repeat(0.1 * t, 6, 1), np.ones((5, 1), np.float32)], 1)
        return chunk  # 5 actions: padded to horizon * skip = 6 by repeating the last


def _planner(select, proposal, goals):
    from worldmodels.lacwm.adaptation import adapt_model
    from worldmodels.lacwm.modeling_lacwm import build_model, tiny_config
    from worldmodels.lacwm.pipeline_lacwm import ProposalPlanner

    torch.manual_seed(0)
    model = adapt_model(build_model(tiny_config(frame_skip=3)), "Panda", 21)
    return ProposalPlanner(model, "Panda", _Env(), lambda k, seed: goals.append((k, seed)) or
                           np.zeros((16, 16, 3), np.uint8), proposal=proposal, num_candidates=5, horizon=2,
                           select=select, noise=0.1, score_pool=1)  # no clipping


def test_proposal_planner_candidates_are_the_chunk_plus_offsets_with_the_gripper_kept():
    goals = []
    prop = _ChunkPolicy()
    planner = _planner("model", prop, goals)
    planner.reset(7)
    assert goals == [(3, 7)] and prop.resets == 1  # the goal of this episode's init state and seed
    obs = {"image": np.zeros((16, 16, 3), np.uint8)}
    c = planner.candidates(obs, {})
    chunk = np.concatenate([prop.action_chunk(obs, {}), prop.action_chunk(obs, {})[-1:]]).reshape(2, 3, 7)
    assert c.shape == (5, 2, 3, 7)
    np.testing.assert_allclose(c[0], chunk)  # candidate 0: the policy's own chunk
    np.testing.assert_array_equal(c[..., 6], 1.0)  # the gripper is never perturbed
    offsets = c[1:, ..., :6] - chunk[None, ..., :6]
    assert (np.abs(offsets[:, 0, 0]) > 1e-4).all()  # every other candidate moved off the chunk
    np.testing.assert_allclose(offsets, offsets[:, :1, :1].repeat(2, 1).repeat(3, 2), atol=1e-6)  # one per cand.


def test_model_selection_executes_the_best_scored_candidate_and_policy_mode_the_chunk(monkeypatch):
    from worldmodels.lacwm.pipeline_lacwm import ProposalPlanner

    obs = {"image": np.zeros((16, 16, 3), np.uint8)}
    planner = _planner("model", _ChunkPolicy(), [])
    planner.reset(0)
    monkeypatch.setattr(ProposalPlanner, "scores", lambda self, frame, cands: np.array([5.0, 4.0, 0.5, 3.0, 9.0]))
    seen = {}
    orig = ProposalPlanner.candidates

    def spy(self, o, i):
        seen["c"] = orig(self, o, i)
        return seen["c"]

    monkeypatch.setattr(ProposalPlanner, "candidates", spy)
    acts = [planner.act(obs, {}) for _ in range(3)]
    np.testing.assert_allclose(np.stack(acts), seen["c"][2, 0])  # the first transition of candidate 2
    assert planner.episode_stats() == {"decisions": 1, "goal_solved": None}
    planner.act(obs, {})
    assert planner.decisions == 2
    planner.reset(1)
    assert planner.decisions == 0
    goals = []
    policy = _planner("policy", _ChunkPolicy(), goals)
    policy.reset(0)
    assert goals == []  # the proposal alone needs no goal image
    np.testing.assert_allclose(np.stack([policy.act(obs, {}) for _ in range(3)]), _ChunkPolicy().action_chunk(obs, {})[:3])
    with pytest.raises(ValueError, match="needs a proposal"):
        _planner("policy", None, [])


class _PathGoal:
    """A goal_fn keeping an expert path: frame i is a flat image of value 20 * i."""

    def __init__(self, length=10):
        self.path = np.stack([np.full((16, 16, 3), 20 * i, np.uint8) for i in range(length)])

    def __call__(self, init_state_id, seed):
        return self.path[-1]


def test_subgoal_tracks_the_expert_path_forward_only_and_scores_against_the_frame_k_ahead():
    from worldmodels.lacwm.adaptation import adapt_model
    from worldmodels.lacwm.modeling_lacwm import build_model, tiny_config
    from worldmodels.lacwm.pipeline_lacwm import ProposalPlanner

    torch.manual_seed(0)
    model = adapt_model(build_model(tiny_config(frame_skip=3)), "Panda", 21)
    goal = _PathGoal(10)
    planner = ProposalPlanner(model, "Panda", _Env(), goal, proposal=_ChunkPolicy(), num_candidates=5, horizon=2,
                              select="model", noise=0.1, score_pool=1, subgoal=2)
    planner.reset(0)
    frame = lambda v: np.full((16, 16, 3), v, np.uint8)  # noqa: E731
    as_float = lambda i: model.codec.to_float(torch.from_numpy(goal.path[i]).permute(2, 0, 1)[None])  # noqa: E731
    assert planner.track(frame(61)) == 5 and planner.progress == 3  # nearest of frames 0-4 is 3 (60); goal 3 + 2
    torch.testing.assert_close(planner.goal, as_float(5))
    assert planner.track(frame(0)) == 5 and planner.progress == 3  # looking like the start does not go back
    assert planner.track(frame(180)) == 9 and planner.progress == 7  # the window is 2k ahead: 3..7, not 9
    assert planner.track(frame(180)) == 9 and planner.progress == 9  # the goal stays at the path's end
    planner.act({"image": frame(180)}, {})
    assert planner.episode_stats() == {"decisions": 1, "goal_solved": None, "path_progress": 9, "path_length": 9}
    planner.reset(1)
    assert planner.progress == 0
    end = ProposalPlanner(model, "Panda", _Env(), lambda k, s: goal.path[-1], proposal=_ChunkPolicy(),
                          num_candidates=5, horizon=2, select="model", score_pool=1)  # subgoal 0: the end frame
    end.reset(0)
    end.scores(frame(61), end.candidates({"image": frame(61)}, {}))
    torch.testing.assert_close(end.goal, as_float(9))
    # with the hand's states on the path, they decide (here against what the pixels would say)
    goal.path_states = np.stack([np.array([0.1 * i, 0, 0, 0.04, 0.04], np.float32) for i in range(10)])
    goal.TRACK_DIMS = (0, 1, 2, 6, 7)
    planner.reset(2)
    proprio = np.zeros(9, np.float32)
    proprio[[0, 6, 7]] = 0.42, 0.04, 0.04  # nearest state: 4
    assert planner.track(frame(0), proprio) == 6 and planner.progress == 4
    planner.act({"image": frame(0), "proprio": proprio}, {})  # act passes its observation's proprio on
    assert planner.progress == 4
    proprio[0] = 0.71
    planner.act({"image": frame(0), "proprio": proprio}, {})
    planner.act({"image": frame(0), "proprio": proprio}, {})
    planner.act({"image": frame(0), "proprio": proprio}, {})  # the next decision
    assert planner.progress == 7
    with pytest.raises(ValueError, match="keeps the expert's path"):
        ProposalPlanner(model, "Panda", _Env(), lambda k, s: goal.path[-1], proposal=_ChunkPolicy(),
                        select="model", subgoal=3).reset(0)
    with pytest.raises(ValueError, match="subgoal must be >= 0"):
        ProposalPlanner(model, "Panda", _Env(), goal, proposal=_ChunkPolicy(), subgoal=-1)


def test_bc_action_chunk_is_the_whole_prediction_and_leaves_the_queue_alone():
    from worldmodels.bc.configuration_bc import BCConfig
    from worldmodels.bc.modeling_bc import BCPolicyModel
    from worldmodels.bc.pipeline_bc import BCPolicy

    torch.manual_seed(0)
    cfg = BCConfig(channels=[8], num_keypoints=4, hidden_dim=16, horizon=6, n_action_steps=2, image_size=16,
                   action_dim=3, proprio_dim=2, dropout=0.0)
    policy = BCPolicy(BCPolicyModel(cfg), -0.5 * np.ones(3), 0.5 * np.ones(3))
    obs = {"image": np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8),
           "proprio": np.ones(2, np.float32)}
    first = policy.act(obs, {})
    chunk = policy.action_chunk(obs, {})
    assert chunk.shape == (6, 3) and np.all(np.abs(chunk) <= 0.5)
    np.testing.assert_allclose(chunk[0], first, atol=1e-6)
    np.testing.assert_allclose(policy.act(obs, {}), chunk[1], atol=1e-6)  # the queue went on where it was
    assert dataclasses.asdict(cfg)["n_action_steps"] == 2


@pytest.mark.timeout(600)
def test_libero_planner_runs_in_libero_s_eval_harness_with_a_solved_goal(tmp_path):
    """Random shooting with a (tiny, untrained) world model on libero_spatial/0, init state 0: the env renders
    at the model's size, the goal comes from the expert solving the same start, decisions every frame_skip."""
    import functools

    from core.checkpoint import save_checkpoint
    from sim.libero.evaluate import evaluate_libero
    from worldmodels.lacwm.adaptation import adapt_model
    from worldmodels.lacwm.modeling_lacwm import build_model, tiny_config
    from worldmodels.lacwm.pipeline_lacwm import libero_planner

    torch.manual_seed(0)
    model = adapt_model(build_model(tiny_config(frame_skip=3)), "Panda", 21)
    save_checkpoint(tmp_path / "wm", model, {"model": dataclasses.asdict(model.config)})
    factory = functools.partial(libero_planner, world_model=str(tmp_path / "wm"), proposal=None, select="model",
                                num_candidates=4, horizon=2)
    info = evaluate_libero(factory, "libero_spatial", task_ids=[0], episodes_per_task=1, max_steps=6, videos=0,
                           out=tmp_path / "eval", progress=False)
    (rec,) = info["per_episode"]
    assert rec["steps"] == 6 and rec["failure"] == "timeout"
    assert rec["policy_stats"] == {"decisions": 2, "goal_solved": True}
    assert info["config"]["images"] is True
    # subgoals: the shadow expert keeps its path (one frame per step, ending at the goal it returns)
    sub = evaluate_libero(functools.partial(factory, subgoal=3), "libero_spatial", task_ids=[0], episodes_per_task=1,
                          max_steps=6, videos=0, out=tmp_path / "eval_sub", progress=False)
    stats = sub["per_episode"][0]["policy_stats"]
    assert stats["goal_solved"] is True and stats["decisions"] == 2
    assert 20 < stats["path_length"] <= 220 and 0 <= stats["path_progress"] <= 12  # 2 matches, <= 2k ahead each


def test_the_libero_experiment_composes_without_demos_and_asks_for_them():
    from core.config import compose
    from core.errors import ConfigError
    from worldmodels.lacwm.configuration_lacwm import WorldModelDataConfig
    from worldmodels.lacwm.training import data_files

    cfg = compose(["experiment=lacwm_libero", "debug=tiny"])
    assert cfg.data.held_out == "Panda" and cfg.data.motion_key == "ee_states"
    data = WorldModelDataConfig(held_out="Panda", motion_key="ee_states", image_key="agentview_rgb")
    with pytest.raises(ConfigError, match="data.demos is empty"):
        data_files(data)
    with pytest.raises(ConfigError, match="also a pretraining embodiment"):  # the suite's check still holds
        WorldModelDataConfig(held_out="Panda")
