"""Multi-task, language-conditioned BC on LIBERO demo files: wrist camera, proprio keys, FiLM, env mapping."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gymnasium import spaces

from worldmodels.bc.modeling_bc import BCPolicyModel, normalize_instruction, tiny_config

TEXTS = ["pick up the black bowl next to the plate", "pick up the black bowl on the stove"]
MULTI = tiny_config(hidden_dim=32, image_key="agentview_rgb", wrist_image_key="eye_in_hand_rgb",
                    proprio_key="ee_states", extra_proprio_keys=["gripper_states"], language=True, task_texts=TEXTS,
                    text_dim=6, action_dim=7, proprio_dim=8, dropout=0.0)


def _model(seed: int = 0, **changes) -> BCPolicyModel:
    torch.manual_seed(seed)
    m = BCPolicyModel(dataclasses.replace(MULTI, **changes))
    m.set_task_embeddings(torch.nn.functional.normalize(torch.randn(2, 6, generator=torch.Generator().manual_seed(9)), dim=-1))
    return m


def _batch(n: int, task: torch.Tensor) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    img = torch.randint(0, 256, (1, 1, 3, 16, 16), generator=g, dtype=torch.uint8).expand(n, -1, -1, -1, -1)
    return {"obs.agentview_rgb": img, "obs.eye_in_hand_rgb": img.flip(-1),
            "obs.ee_states": torch.zeros(n, 1, 6), "obs.gripper_states": torch.zeros(n, 1, 2),
            "task_index": task, "actions": (task.float() * 2 - 1)[:, None, None].expand(n, 4, 7).clone(),
            "actions_is_pad": torch.zeros(n, 4, dtype=torch.bool)}


def test_language_decides_the_action_when_images_and_proprio_are_the_same():
    """Two tasks, identical observations, opposite actions: only the instruction tells them apart."""
    m = _model()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    batch = _batch(16, torch.arange(16) % 2)
    first = m.training_step(batch)["loss"].item()
    for _ in range(150):
        loss = m.training_step(batch)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 0.9 and loss.item() < 0.05  # an unconditioned policy cannot go below L1 = 1 (the mean 0)
    m.eval()
    with torch.no_grad():
        b = _batch(2, torch.tensor([0, 1]))
        out = m(b["obs.agentview_rgb"][:, -1], torch.zeros(2, 8), b["obs.eye_in_hand_rgb"][:, -1],
                m.task_embeddings[torch.tensor([0, 1])])
    assert (out[0] < -0.8).all() and (out[1] > 0.8).all()


def test_film_starts_as_identity_and_every_input_is_required():
    m = _model().eval()
    assert all((lin.weight == 0).all() and (lin.bias == 0).all() for lin in m.film)
    assert len(m.film) == 2 * len(MULTI.channels)  # one per conv block of each camera
    img = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    text = m.task_embeddings
    with pytest.raises(ValueError, match="language"):
        m(img, torch.zeros(2, 8), img)
    with pytest.raises(ValueError, match="wrist"):
        m(img, torch.zeros(2, 8), None, text)
    with pytest.raises(ValueError, match="task_texts"):
        BCPolicyModel(dataclasses.replace(MULTI, task_texts=[]))


def test_random_shift_is_a_crop_of_the_padded_frame_and_only_in_training():
    m = _model(random_shift=2)
    img = torch.arange(2 * 3 * 16 * 16, dtype=torch.float32).reshape(2, 3, 16, 16)
    m.eval()
    assert m._augment(img) is img
    m.train()
    torch.manual_seed(0)
    out = m._augment(img)
    padded = torch.nn.functional.pad(img, (2,) * 4, mode="replicate")
    for b in range(2):
        hits = [(dy, dx) for dy in range(5) for dx in range(5)
                if torch.equal(out[b], padded[b, :, dy : dy + 16, dx : dx + 16])]
        assert len(hits) == 1


def test_instruction_lookup_ignores_case_spacing_and_period():
    m = _model()
    assert m.task_index("Pick up the black bowl  on the stove.") == 1
    assert m.task_index("pick up the red mug") is None
    assert normalize_instruction(" A  b. ") == "a b"


class _LiberoLikeEnv:
    """What make_policy sees of a LiberoEnv: its spaces, metadata and the demo-key mapping."""

    def __init__(self, metadata):
        from sim.libero.env import LiberoEnv

        self.observation_space = spaces.Dict({"image": spaces.Box(0, 255, (16, 16, 3), np.uint8),
                                              "wrist_image": spaces.Box(0, 255, (16, 16, 3), np.uint8),
                                              "proprio": spaces.Box(-np.inf, np.inf, (15,), np.float32)})
        self.action_space = spaces.Box(-1, 1, (7,), np.float32)
        self.metadata = metadata
        self.spec = None
        self.demo_obs_sources = LiberoEnv.demo_obs_sources
        self.demo_obs = LiberoEnv.demo_obs


def test_a_policy_trained_on_demo_files_reads_the_libero_env(tmp_path, monkeypatch):
    from worldmodels.bc import task

    m = _model()
    m.save_pretrained(tmp_path / "ckpt")
    # the demo files' instruction (LIBERO's BDDL text) is in the table; the env's benchmark text is not
    env = _LiberoLikeEnv({"language_instruction": "put the bowl on the stove", "bddl_language": TEXTS[1]})
    monkeypatch.setattr(task, "load_text_encoder", lambda path: pytest.fail("a trained task needs no encoder"))
    policy = task.make_policy(env, tmp_path / "ckpt")
    assert dict(policy.expects.observation) == {"image": (16, 16, 3), "wrist_image": (16, 16, 3), "proprio": (None,)}
    torch.testing.assert_close(policy.text[0], m.task_embeddings[1])
    rng = np.random.default_rng(0)
    obs = {"image": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8),
           "wrist_image": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8),
           "proprio": rng.normal(0, 0.1, 15).astype(np.float32)}
    action = policy.act(obs, {})
    with torch.no_grad():
        ref = m.eval()(torch.as_tensor(obs["image"]).permute(2, 0, 1)[None],
                       torch.as_tensor(np.concatenate([obs["proprio"][0:6], obs["proprio"][6:8]]))[None],
                       torch.as_tensor(obs["wrist_image"]).permute(2, 0, 1)[None], m.task_embeddings[1:2])
    np.testing.assert_allclose(action, np.clip(ref[0, 0].numpy(), -1, 1), atol=1e-6)
    # an instruction it was not trained on is encoded with the model's text encoder
    class Stub:
        def encode(self, texts):
            assert texts == ["stack the bowls"]
            return torch.full((1, 6), 0.5)

    monkeypatch.setattr(task, "load_text_encoder", lambda path: Stub())
    policy = task.make_policy(_LiberoLikeEnv({"language_instruction": "stack the bowls"}), tmp_path / "ckpt")
    torch.testing.assert_close(policy.text[0], torch.full((6,), 0.5))
    from core.errors import ConfigError

    with pytest.raises(ConfigError, match="no language_instruction"):
        task.make_policy(_LiberoLikeEnv({}), tmp_path / "ckpt")


def test_save_load_is_bit_exact_with_the_task_table(tmp_path):
    m = _model(seed=3)
    m.save_pretrained(tmp_path / "m")
    back = BCPolicyModel.from_pretrained(tmp_path / "m")
    assert back.config.task_texts == TEXTS and back.config.extra_proprio_keys == ["gripper_states"]
    for (k, a), (_, b) in zip(m.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k


@pytest.mark.timeout(600)
def test_multitask_training_command_on_a_folder_of_libero_files(tmp_path):
    """`embodied train bc experiment=bc_libero` on a suite folder of hand-written LIBERO files: one task table
    from the files' instructions, real MiniLM embeddings in the checkpoint, the user's files untouched."""
    from core.checkpoint import load_checkpoint
    from core.text import load_text_encoder
    from embodied.cli import main
    from tests.sim.libero.test_demo_layout import write_by_hand

    folder = tmp_path / "libero_spatial"
    folder.mkdir()
    for i, text in enumerate(TEXTS):
        write_by_hand(folder / f"task{i}_demo.hdf5", episodes=2, language=text)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    out = tmp_path / "run"
    args = ["train", "bc", "experiment=bc_libero", "debug=tiny", "model=bc_tiny", "model.image_size=32",
            f"data.paths=[{folder}]", f"out_dir={out}", "trainer.max_steps=3", "trainer.batch_size=8",
            "trainer.ckpt_every=3"]
    assert main(args) == 0
    cfg = load_checkpoint(out)["config"]["model"]
    assert cfg["task_texts"] == TEXTS and cfg["text_dim"] == 384 and cfg["proprio_dim"] == 8
    assert cfg["wrist_image_key"] == "eye_in_hand_rgb" and cfg["language"]
    from core.checkpoint import resolve_checkpoint

    model = BCPolicyModel.from_pretrained(resolve_checkpoint(out))
    torch.testing.assert_close(model.task_embeddings, load_text_encoder().encode(TEXTS))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    (tmp_path / "empty").mkdir()
    assert main([*args[:6], f"data.paths=[{tmp_path / 'empty'}]", f"out_dir={tmp_path / 'run2'}"]) != 0


def test_every_sample_carries_its_episode_s_task(tmp_path):
    from core.data.trajectories import TrajectoryDataset
    from tests.sim.libero.test_demo_layout import write_by_hand
    from worldmodels.bc.task import TaskIndexed, task_texts

    paths = [tmp_path / "a_demo.hdf5", tmp_path / "b_demo.hdf5"]
    for p, text in zip(paths, TEXTS[::-1]):
        write_by_hand(p, episodes=2, language=text)
    ds = TrajectoryDataset(paths, obs_keys=["ee_states"], horizon=4)
    texts = task_texts(ds)
    assert texts == TEXTS[::-1]
    tagged = TaskIndexed(ds, texts)
    got = [int(s["task_index"]) for s in tagged.__getitems__(list(range(len(ds))))]
    want = [texts.index(ds.episode_info(i).language_instruction) for i in range(len(ds))]
    assert got == want and set(got) == {0, 1} and int(tagged[len(ds) - 1]["task_index"]) == want[-1]


def test_gradient_checkpointing_covers_both_cameras_and_keeps_the_loss():
    m = _model()
    assert len(m.checkpoint_units()) == 2 * len(MULTI.channels)
    batch = _batch(4, torch.tensor([0, 1, 0, 1]))
    ref = m.training_step(batch)["loss"]
    m.enable_gradient_checkpointing()
    torch.testing.assert_close(m.training_step(batch)["loss"], ref)


def test_bc_without_a_checkpoint_on_a_libero_env_is_the_shipped_policy():
    """``--policy bc`` on LIBERO, from any folder: the shipped frozen-feature policy, which reads the env's 64 px
    cameras and knows libero_spatial's instructions; another env still needs a checkpoint."""
    from core.errors import ConfigError
    from worldmodels.bc import task

    env = _LiberoLikeEnv({"language_instruction": "pick up the black bowl next to the ramekin and place it on the "
                                                  "plate"})
    env.observation_space = spaces.Dict({k: spaces.Box(0, 255, (64, 64, 3), np.uint8) for k in ("image", "wrist_image")}
                                        | {"proprio": env.observation_space["proprio"]})
    policy = task.make_policy(env)
    texts = policy.model.config.task_texts  # the 10 tasks' instructions, and the rewordings its demos were given
    assert policy.model.config.backbone == "efficientnet_lite0" and len(texts) >= 10 and len(set(texts)) == len(texts)
    assert policy.text is not None
    with pytest.raises(ConfigError, match="trained checkpoint"):
        task.make_policy(type("Env", (), {"action_space": env.action_space, "metadata": {}})())
