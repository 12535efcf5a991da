"""AutoMoT end to end at tiny sizes: data -> base VLM -> imitation -> refiner -> policy folder -> closed loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.config import compose
from core.errors import CheckpointError

TINY = ["model=automot_tiny", "data.episodes=1", "data.test_episodes=1", "data.scenarios=[highway,merge]",
        "data.horizon_s=3", "data.workers=1", "data.eval_episodes=0", "trainer.max_steps=3", "trainer.batch_size=4",
        "trainer.ckpt_every=100", "model.refiner_steps=3"]


def _cfg(tmp: Path, arm: str, *extra: str):
    return compose(["experiment=automot", *TINY, f"model.arm={arm}", f"data.root={tmp / 'data'}",
                    f"model.base_path={tmp / 'base'}", f"out_dir={tmp / arm}", *extra])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from driving.automot import task

    tmp = tmp_path_factory.mktemp("automot")
    for arm in ("automot", "noreason"):
        task.train(_cfg(tmp, arm))
    return tmp


def _batch(tmp: Path, policy: dict, n: int = 3):
    from driving.automot.data import collate_driving
    from driving.automot.inputs import model_batch
    from driving.automot.task import samples

    cfg = _cfg(tmp, "automot")
    from core.config import to_object

    ds = samples(to_object(cfg.model), to_object(cfg.data), "test")
    s = collate_driving([ds[i] for i in range(n)])
    return model_batch(s, policy.prompter, policy.spec), s


def test_policy_folder_roundtrip_and_refiner_switch(trained):
    from core.checkpoint import load_weights
    from core.pretrained import load_pretrained, read_config
    from driving.automot.modeling_automot import DrivingVLA
    from driving.automot.task import load_model, predict_waypoints

    a, b = load_model(trained / "automot"), load_model(trained / "automot" / "policy")
    assert isinstance(a, DrivingVLA) and a.refiner is not None and a.prompter is not None
    batch, _ = _batch(trained, a)
    ra, rb = predict_waypoints(a, batch, refine=True), predict_waypoints(b, batch, refine=True)
    assert torch.equal(ra["coarse"], rb["coarse"]) and torch.equal(ra["refined"], rb["refined"])
    off = predict_waypoints(a, batch, refine=False)
    assert "refined" not in off and torch.equal(off["coarse"], a(batch).waypoints)
    assert not torch.equal(ra["refined"], ra["coarse"])  # the refiner changes the plan when on
    # the folder is save_pretrained's: the base referenced (absolute), not copied; load_pretrained builds it
    folder = trained / "automot" / "policy"
    assert read_config(folder)["model"]["base_path"] == str((trained / "base").resolve())
    assert not (folder / "base").exists()
    assert any(k.startswith("refiner.") for k in load_weights(folder / "model.safetensors"))
    c = load_pretrained(folder)
    assert type(c) is DrivingVLA
    with torch.no_grad():  # (not bit-equal: frozen parameters take other CPU kernels, ~1e-8)
        torch.testing.assert_close(c(batch).waypoints, ra["coarse"], atol=1e-6, rtol=0)
    with pytest.raises(CheckpointError, match="not an AutoMoT policy folder"):
        load_model(trained)
    (trained / "legacy").mkdir(exist_ok=True)
    (trained / "legacy" / "automot.json").write_text("{}")
    with pytest.raises(CheckpointError, match="former layout"):
        load_model(trained / "legacy")


def test_frozen_understanding_keeps_the_base(trained, tmp_path):
    """The frozen arm leaves the VLM bit-identical to the base; the automot arm changed it."""
    from core.vlm import load_vlm
    from driving.automot import task

    base, _ = load_vlm(trained / "base")
    tuned = task.load_model(trained / "automot").mot.vlm
    changed = [k for k, v in base.state_dict().items() if not torch.equal(v, tuned.state_dict()[k])]
    assert changed, "the automot arm's understanding expert did not train"
    import shutil

    for sub in ("data", "base"):
        (tmp_path / sub).symlink_to(trained / sub)
    task.train(_cfg(tmp_path, "frozen", "model.refiner_steps=0"))
    frozen = task.load_model(tmp_path / "frozen").mot.vlm
    assert all(torch.equal(v, frozen.state_dict()[k]) for k, v in base.state_dict().items())
    from core.checkpoint import (
        load_weights,  # the frozen arm's folder stores no VLM tensor (the base has them)
    )

    assert not any(k.startswith("mot.vlm.") for k in load_weights(tmp_path / "frozen" / "policy" / "model.safetensors"))
    shutil.rmtree(tmp_path / "frozen")


def test_async_policy_reencodes_the_prefix_every_n_steps(trained):
    import gymnasium as gym

    import sim
    from driving.automot.pipeline_automot import make_policy

    sim.register_envs()
    env = gym.make("embodied/Drive-Highway-v0", image_size=32, horizon_s=3)
    obs, info = env.reset(seed=0)
    calls = []
    for n in (1, 2, 4):
        pol = make_policy(env, checkpoint=str(trained / "automot"), update_interval=n)
        orig = pol.mot.encode_prefix
        count = [0]

        def counted(batch, orig=orig, count=count):
            count[0] += 1
            return orig(batch)

        pol.mot.encode_prefix = counted
        pol.reset(0)
        acts = [pol.act(obs, info) for _ in range(8)]
        calls.append(count[0])
        assert all(a.shape == (2,) and np.isfinite(a).all() for a in acts)
        ov = pol.overlay()
        assert ov["waypoints"].shape == (6, 2) and ov["meta_action"] in pol.names
    env.close()
    assert calls == [8, 4, 2]


def test_closed_loop_through_drive_eval(trained, tmp_path):
    from driving.evaluate import evaluate_policy

    for policy, ckpt in (("automot", trained / "automot"), ("noreason", trained / "noreason")):
        rep = evaluate_policy(policy, "merge", 1, tmp_path / policy, seed=0, video=False, progress=False,
                              policy_args={"checkpoint": str(ckpt), "refiner": policy == "automot"},
                              env_kwargs={"horizon_s": 2})
        row = rep["episodes"][0]
        assert row["failure"] is None and row["steps"] > 0
    # a run folder as --policy: its config names the method, whose factory reads the policy folder
    rep = evaluate_policy(str(trained / "noreason"), "merge", 1, tmp_path / "by_path", seed=0, video=False,
                          progress=False, env_kwargs={"horizon_s": 2})
    assert rep["episodes"][0]["failure"] is None


def test_eval_writes_openloop_and_reasoning(trained):
    from core.io import read_json
    from driving.automot import task

    res = task.evaluate(_cfg(trained, "automot"))
    assert set(res["openloop"]) >= {"coarse", "refined", "meta_accuracy", "gt_collision_rate"}
    assert res["openloop"]["coarse"]["l2_3s"] >= 0 and 0 <= res["qa_token_match"]["acc"] <= 1
    assert 0 <= res["qa_token_match_base"]["acc"] <= 1
    assert read_json(trained / "automot" / "eval.json")["arm"] == "automot"
    # the reported figures are the plan's: recompute ADE, L2 at 3 s and meta-action accuracy on every test step
    policy = task.load_model(trained / "automot")
    batch, s = _batch(trained, policy, n=res["openloop"]["samples"])
    out = policy(batch)
    err = (out.waypoints - s["waypoints"]).norm(dim=-1)
    ol = res["openloop"]
    assert abs(ol["coarse"]["ade"] - float(err.mean())) < 1e-5
    assert abs(ol["coarse"]["l2_3s"] - float(err[:, -1].mean())) < 1e-5
    assert abs(ol["meta_accuracy"] - float((out.meta_logits.argmax(-1) == s["meta_action"]).float().mean())) < 1e-6


def test_meta_action_classes_are_the_experts():
    """The config keeps its own copy (it must import light); it must be the expert's label order."""
    from driving.automot.configuration_automot import META_ACTIONS
    from sim.driving.expert import META_ACTIONS as EXPERT

    assert tuple(META_ACTIONS) == tuple(EXPERT)


def test_shipped_policies_and_the_demo_section(tmp_path):
    """The shipped AutoMoT and noreason policies load strictly, and the demo section drives the shipped AutoMoT
    and the expert on the same seeds, with the recorded experiment below."""
    from core.demo import DemoContext
    from core.pretrained import read_card
    from core.resources import asset
    from driving.automot.demo import demo_section
    from driving.automot.task import load_model

    for name, arm in (("automot", "automot"), ("automot_noreason", "noreason")):
        policy = load_model(asset("checkpoints", name))
        assert policy.config.arm == arm and "command" in read_card(asset("checkpoints", name))
        base = asset("checkpoints", name) / "base"  # self-contained: the shipped folder carries its base
        assert (Path(policy.config.base_path).resolve() == base.resolve()) if arm == "automot" else \
            policy.config.base_path == ""
    section = demo_section(DemoContext(out=tmp_path))
    assert "Recorded experiment" in section.body and "<video" in section.body
    assert any(k.startswith("ds_automot_") for k in section.figures)
