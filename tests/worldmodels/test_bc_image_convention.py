"""BC checkpoints record the image convention of their training frames; make_policy converts the env's frames.

A checkpoint from before the field (no ``image_convention`` in config.json) was trained on the old LIBERO frames
(``flipud``: the raw render with rows reversed); the LIBERO env now gives ``rot180`` (rows and columns reversed),
so such a checkpoint must see each frame flipped left-right, which is exactly what it was trained on.
"""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest
import torch

from tests.worldmodels.test_bc_libero import _LiberoLikeEnv  # what make_policy sees of a LiberoEnv
from worldmodels.bc.configuration_bc import BCConfig
from worldmodels.bc.modeling_bc import BCPolicyModel, tiny_config

TINY = tiny_config(action_dim=7, proprio_dim=15, dropout=0.0)


def _raw(seed: int = 0) -> np.ndarray:
    """A (16, 16, 3) uint8 'raw render' with no symmetry, so that any flip shows."""
    img = np.random.default_rng(seed).integers(0, 200, (16, 16, 3), dtype=np.uint8)
    img[0, :4] = 255  # a bright mark near one corner
    return img


LIBERO = {"family": "libero", "image_convention": "rot180", "language_instruction": "pick up the bowl"}


def _checkpoint(tmp_path, config: BCConfig, old: bool = False, name: str = "ckpt"):
    torch.manual_seed(0)
    model = BCPolicyModel(config)
    path = model.save_pretrained(tmp_path / name)
    if old:  # written before the field existed
        cfg = json.loads((path / "config.json").read_text())
        del cfg["model"]["image_convention"]
        (path / "config.json").write_text(json.dumps(cfg))
    return model, path


def _obs(raw: np.ndarray) -> dict[str, np.ndarray]:
    """The env's observation of a scene whose raw render is ``raw``: rot180 frames."""
    return {"image": raw[::-1, ::-1].copy(), "wrist_image": _raw(1)[::-1, ::-1].copy(),
            "proprio": np.linspace(-1, 1, 15).astype(np.float32)}


def test_an_old_libero_checkpoint_sees_exactly_the_flipud_frames(tmp_path):
    from worldmodels.bc.task import make_policy

    model, path = _checkpoint(tmp_path, TINY, old=True)
    policy = make_policy(_LiberoLikeEnv(LIBERO), path)
    raw = _raw()
    obs = _obs(raw)
    seen = policy.obs_adapter({k: v[None] for k, v in obs.items()})
    assert np.array_equal(seen["image"][0], raw[::-1])  # the old env's frame: raw[::-1]
    assert np.array_equal(seen["image"][0], obs["image"][:, ::-1])  # = a horizontal flip of the new one
    assert np.array_equal(seen["proprio"][0], obs["proprio"])
    action = policy.act(obs, {})
    with torch.no_grad():
        flipud = torch.as_tensor(raw[::-1].copy()).permute(2, 0, 1)[None]
        ref = model.eval()(flipud, torch.as_tensor(obs["proprio"])[None])
    np.testing.assert_allclose(action, np.clip(ref[0, 0].numpy(), -1, 1), atol=1e-6)
    pickle.loads(pickle.dumps(policy.obs_adapter))  # spawned evaluation workers may carry it


def test_an_old_demo_file_checkpoint_sees_flipud_frames_under_the_demo_keys(tmp_path):
    from worldmodels.bc.task import make_policy

    cfg = dataclasses.replace(TINY, image_key="agentview_rgb", proprio_key="ee_states", proprio_dim=6)
    _, path = _checkpoint(tmp_path, cfg, old=True)
    policy = make_policy(_LiberoLikeEnv(LIBERO), path)
    raw = _raw()
    seen = policy.obs_adapter({k: v[None] for k, v in _obs(raw).items()})
    assert np.array_equal(seen["agentview_rgb"][0], raw[::-1]) and seen["ee_states"].shape == (1, 6)
    assert np.array_equal(seen["eye_in_hand_rgb"][0], _raw(1)[::-1])


def test_checkpoints_that_state_their_convention(tmp_path):
    from worldmodels.bc.task import make_policy

    _, new = _checkpoint(tmp_path, dataclasses.replace(TINY, image_convention="rot180"), name="new")
    assert json.loads((new / "config.json").read_text())["model"]["image_convention"] == "rot180"
    assert make_policy(_LiberoLikeEnv(LIBERO), new).obs_adapter is None  # the env's frames as they are
    _, flipud = _checkpoint(tmp_path, dataclasses.replace(TINY, image_convention="flipud"), name="flipud")
    raw = _raw()
    seen = make_policy(_LiberoLikeEnv(LIBERO), flipud).obs_adapter({"image": _obs(raw)["image"][None]})
    assert np.array_equal(seen["image"][0], raw[::-1])
    _, unknown = _checkpoint(tmp_path, TINY, name="unknown")  # trained on data that states none: as they are
    assert make_policy(_LiberoLikeEnv(LIBERO), unknown).obs_adapter is None
    _, old = _checkpoint(tmp_path, TINY, old=True, name="old")  # an env without a convention: nothing to convert
    assert make_policy(_LiberoLikeEnv({"language_instruction": "x"}), old).obs_adapter is None


def test_the_convention_comes_from_the_data_and_is_checked():
    from core.errors import ConfigError
    from worldmodels.bc.task import data_image_convention

    class Data:
        def __init__(self, convention):
            self.image_convention = convention

    assert data_image_convention(Data("rot180"), None) == "rot180"
    assert data_image_convention(Data(None), "rot180") == "rot180"  # stated for data that states none
    assert data_image_convention(Data("flipud"), "upright") == "flipud"  # the same layout
    with pytest.raises(ConfigError, match="model.image_convention='flipud', but the data's frames are in 'rot180'"):
        data_image_convention(Data("rot180"), "flipud")
    with pytest.raises(ConfigError, match="model.image_convention: unknown image convention 'rot90'"):
        dataclasses.replace(TINY, image_convention="rot90")
