"""AutoMoT on a tokenizer that splits the meta-actions (a Qwen-style BPE: ``change_left`` / ``change_right``
share their first token): the policy adds them as whole tokens itself, resizes the VLM's embeddings, records
what it added, and a saved policy reloads with the same vocabulary and outputs (issue 29)."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from core.testing import folder_digest
from core.vlm import VLMConfig, build_tokenizer, build_vlm, load_tokenizer, load_vlm, save_vlm
from driving.automot.configuration_automot import (
    META_ACTIONS,
    REASON_PROMPT,
    AutoMoTModelConfig,
    DrivingVLAConfig,
)
from driving.automot.modeling_automot import tiny_config

SIZES = tiny_config().vlm  # the tiny base's VLMConfig fields


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny Qwen2.5-VL base whose tokenizer has no meta-action tokens (written like a user's folder)."""
    tok = build_tokenizer([REASON_PROMPT, "change lanes to the left or right, keep the lane, slow down, stop",
                           *[m.replace("_", " ") for m in META_ACTIONS]] * 4, vocab_size=300)
    folder = tmp_path_factory.mktemp("user") / "vlm"
    cfg = VLMConfig(vocab_size=len(tok), **SIZES)
    torch.manual_seed(0)
    save_vlm(folder, build_vlm(cfg), tok, cfg.patch_spec(32))
    return folder


def _model_cfg(folder, arm):  # one frame, 4 route points, 3 waypoints, 2 targets: the batch below
    tiny = tiny_config()
    return tiny_config(arm=arm, base_path=str(folder), history=1, refiner_steps=0,
                       mot={**tiny.mot, "n_route": 4, "n_wp": 3, "n_target": 2, "wp_weights": [2.0, 1.0, 1.0]})


def _batch(policy):
    from driving.automot.inputs import model_batch

    g = torch.Generator().manual_seed(0)
    s = {"images": torch.rand(2, 1, 3, 32, 64, generator=g), "bev": (torch.rand(2, 6, 16, 16, generator=g) > 0.8).float(),
         "target_points": torch.randn(2, 2, 2, generator=g) * 10, "ego": torch.randn(2, 6, generator=g),
         "instruction": ["Turn left in 30 m.", "Follow the road."]}
    return model_batch(s, policy.prompter, policy.spec)


def test_the_tokenizer_splits_the_meta_actions(base):
    from driving.automot.task import meta_token_ids, missing_meta_tokens

    tok = load_tokenizer(base)
    first = {m: tok(m, add_special_tokens=False)["input_ids"][0] for m in META_ACTIONS}
    assert first["change_left"] == first["change_right"]  # the case AutoMoT used to refuse
    with pytest.raises(ConfigError, match="does not tell the meta-actions"):
        meta_token_ids(tok)
    missing = missing_meta_tokens(tok)
    assert {"change_left", "change_right"} <= set(missing) and list(missing) == [m for m in META_ACTIONS
                                                                                 if m in missing]


@pytest.mark.parametrize("arm", ["automot", "frozen"])
def test_policy_adds_meta_tokens_and_reloads_with_the_same_vocabulary(base, tmp_path, arm):
    from driving.automot.modeling_automot import DrivingVLA
    from driving.automot.task import build_policy, missing_meta_tokens

    before = folder_digest(base, recursive=False)
    vlm, tok = load_vlm(base)
    n_base = len(tok)
    missing = missing_meta_tokens(tok)
    vla = build_policy(_model_cfg(base, arm), vlm, tok)
    cfg = vla.config
    assert cfg.added_tokens == missing and len(tok) == n_base + len(missing)
    ids = cfg.mot.meta_action_token_ids
    assert ids == [tok.convert_tokens_to_ids(m) for m in META_ACTIONS] and len(set(ids)) == len(ids)
    assert vlm.get_input_embeddings().weight.shape[0] == len(tok) == vlm.config.text_config.vocab_size
    assert [tok(m, add_special_tokens=False)["input_ids"] for m in missing] == [[len(tok) - len(missing) + i]
                                                                              for i in range(len(missing))]
    vla.eval()
    batch = _batch(vla)
    with torch.no_grad():
        out = vla(batch)
    assert out.meta_logits.shape == (2, len(META_ACTIONS)) and torch.isfinite(out.meta_logits).all()
    if arm == "automot":  # one training step reaches the new rows (the meta-action logits read them)
        vla.train()
        losses = vla.mot.loss(vla(batch), {**batch, "meta_action": torch.tensor([4, 5]),
                                           "route": torch.zeros(2, 4, 2), "waypoints": torch.zeros(2, 3, 2),
                                           "velocity": torch.zeros(2)})
        losses["loss"].backward()
        grad = vlm.get_input_embeddings().weight.grad
        assert grad is not None and grad[ids[4]].abs().sum() > 0 and grad[ids[5]].abs().sum() > 0
        vla.zero_grad(set_to_none=True)
        vla.eval()
        with torch.no_grad():
            out = vla(batch)
    vla.save_pretrained(tmp_path / "policy")
    again = DrivingVLA.from_pretrained(tmp_path / "policy").eval()
    assert again.config.added_tokens == missing and len(again.tokenizer) == len(tok)
    assert again.tokenizer.get_vocab() == tok.get_vocab()
    with torch.no_grad():
        out2 = again(_batch(again))
    torch.testing.assert_close(out2.meta_logits, out.meta_logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(out2.waypoints, out.waypoints, atol=1e-6, rtol=0)
    assert folder_digest(base, recursive=False) == before  # the user's folder: read, never written


def test_no_tokens_added_where_the_tokenizer_tells_them_apart(tmp_path):
    """The shipped tiny bases add the meta-actions at pretraining: nothing changes for them."""
    from driving.automot.task import build_policy

    tok = build_tokenizer([REASON_PROMPT, *META_ACTIONS] * 4, vocab_size=300)
    tok.add_tokens(list(META_ACTIONS))
    cfg = VLMConfig(vocab_size=len(tok), **SIZES)
    torch.manual_seed(0)
    save_vlm(tmp_path / "vlm", build_vlm(cfg), tok, cfg.patch_spec(32))
    vlm, tok = load_vlm(tmp_path / "vlm")
    n = len(tok)
    vla = build_policy(_model_cfg(tmp_path / "vlm", "automot"), vlm, tok)
    assert vla.config.added_tokens == [] and len(tok) == n == vlm.get_input_embeddings().weight.shape[0]


def test_driving_vla_config_defaults_validate():
    cfg = DrivingVLAConfig()
    assert cfg.base_path == AutoMoTModelConfig().base_path and cfg.base_dtype == "float32" and not cfg.added_tokens
    with pytest.raises(ConfigError, match="base_path must be set exactly"):
        DrivingVLAConfig(base_path="")
    with pytest.raises(ConfigError, match="base_dtype"):
        DrivingVLAConfig(base_dtype="int8")
    with pytest.raises(ConfigError, match="base_dtype"):
        AutoMoTModelConfig(base_dtype="fp8")
