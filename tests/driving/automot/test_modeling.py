"""AutoMoT's model: the block mask, block causality, exactness of U against the plain VLM, prefix-cache equivalence,
the noreason arm, training, freezing and input errors (tiny random Qwen-VL models, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration

from core.errors import ConfigError
from core.vlm import (
    IGNORE,
    VLMConfig,
    build_tokenizer,
    build_vlm,
    mm_token_type_ids,
    patchify,
    vlm_collate,
    vlm_inputs,
)
from core.vlm.tokenizer import IM_END, IM_START, IMAGE_PAD, VISION_END, VISION_START
from driving.automot.configuration_automot import AutoMoTConfig
from driving.automot.modeling_automot import AutoMoT, block_mask

CORPUS = ["you drive the ego car. turn left at the next junction", "go straight, then change lane to the right",
          "keep lane", "slow down", "stop"] * 10
IMAGE_SIZE, FRAMES, B = 32, 2, 2
INSTRUCTIONS = ("turn left at the next junction", "go straight")


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(CORPUS, vocab_size=320)


def tiny_vlm(tok, family="qwen2_5_vl"):
    """The sizes of tests/core/test_vlm.py; Qwen3-VL with one deepstack level (vision block 0 -> LLM layer 0)."""
    torch.manual_seed(0)
    cfg = VLMConfig(family=family, vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=3,
                    num_heads=2, num_kv_heads=1, vision_depth=1, vision_hidden=32, vision_intermediate=64,
                    vision_heads=2)
    if family == "qwen2_5_vl":
        return cfg, build_vlm(cfg).eval()
    hf = cfg.hf_config()
    hf.vision_config.deepstack_visual_indexes = [0]
    return cfg, Qwen3VLForConditionalGeneration(hf).eval()


def tiny_cfg(**kw) -> AutoMoTConfig:
    base = dict(expert_hidden_size=24, expert_intermediate_size=48, n_reason=2, bev_patch=8, n_target=2, ego_dim=4,
                meta_action_names=["keep_lane", "slow_down", "change_left", "change_right"],
                meta_action_token_ids=[300, 301, 302, 303])
    base.update(kw)
    return AutoMoTConfig(**base)


def tiny_model(tok, family="qwen2_5_vl", **kw):
    vcfg, vlm = tiny_vlm(tok, family)
    torch.manual_seed(1)
    return vcfg, AutoMoT(tiny_cfg(**kw), vlm).eval()


def make_batch(tok, vcfg, seed=0, instructions=INSTRUCTIONS):
    """B samples, FRAMES front-camera frames each, right-padded prompts of different lengths."""
    spec = vcfg.patch_spec(IMAGE_SIZE)
    image = f"{VISION_START}{IMAGE_PAD * spec.tokens_per_image}{VISION_END}" * FRAMES
    seqs = []
    for instr in instructions:
        text = f"{IM_START}system\nyou drive the ego car.{IM_END}\n{IM_START}user\n{image}{instr}{IM_END}\n" \
               f"{IM_START}assistant\n"
        seqs.append({"input_ids": torch.tensor(tok(text, add_special_tokens=False)["input_ids"])})
    batch = vlm_collate(seqs, tok.pad_token_id, side="right")
    g = torch.Generator().manual_seed(seed)
    pv, grid = patchify(torch.rand(len(instructions) * FRAMES, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g), spec)
    n = len(instructions)
    batch.update(pixel_values=pv, image_grid_thw=grid, bev=torch.rand(n, 6, 16, 16, generator=g),
                 target_points=10 * torch.randn(n, 2, 2, generator=g), ego=torch.randn(n, 4, generator=g))
    return batch


def targets(n=B, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"meta_action": torch.tensor([0, 2])[:n], "route": torch.randn(n, 20, 2, generator=g),
            "waypoints": torch.randn(n, 6, 2, generator=g).cumsum(1), "velocity": 5 * torch.rand(n, generator=g)}


HEADS = ("meta_logits", "route", "waypoints", "wp_offsets", "velocity", "features")


def test_block_mask_structure():
    sizes, kinds = [3, 2, 4], ["causal", "full", "full"]
    m = block_mask(sizes, kinds)
    block = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert m.shape == (9, 9) and m.dtype == torch.bool
    for i in range(9):
        for j in range(9):
            bi, bj = block[i], block[j]
            want = bj < bi or (bi == bj and (kinds[bi] == "full" or j <= i))
            assert bool(m[i, j]) == want, (i, j)
    # a literal check of the causal block and of a full block
    assert m[:3, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert m[5:, 5:].all() and not m[:5, 5:].any() and not m[:3, 3:].any()
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 2] = True  # sample 1's last U token is padding
    mp = block_mask(sizes, kinds, key_padding=pad)
    assert mp.shape == (2, 9, 9)
    assert torch.equal(mp[0], m)
    assert not mp[1, :, 2].any() and torch.equal(mp[1][:, [0, 1, *range(3, 9)]], m[:, [0, 1, *range(3, 9)]])
    with pytest.raises(ValueError, match="kind"):
        block_mask([1], ["bidirectional"])


def test_later_blocks_do_not_change_earlier_outputs(tok):
    vcfg, model = tiny_model(tok)
    batch = make_batch(tok, vcfg)
    with torch.no_grad():
        ref = model(batch)
        for key in ("bev", "target_points", "ego"):  # perturb P's inputs
            other = {**batch, key: batch[key] + 1.0}
            out = model(other)
            assert torch.equal(out.understanding_hidden, ref.understanding_hidden), key
            assert torch.equal(out.meta_logits, ref.meta_logits), key
            assert not torch.allclose(out.waypoints, ref.waypoints), key  # P itself does see them
        model.reason_queries.add_(0.5)  # perturb D
        out = model(batch)
    assert torch.equal(out.understanding_hidden, ref.understanding_hidden)
    assert not torch.allclose(out.meta_logits, ref.meta_logits)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_understanding_hidden_states_equal_the_plain_vlm(tok, family):
    vcfg, model = tiny_model(tok, family)
    batch = make_batch(tok, vcfg)
    assert (batch["attention_mask"] == 0).any()  # the batch really is padded
    kw = vlm_inputs(model.vlm, batch["input_ids"], batch["attention_mask"], batch["pixel_values"],
                    batch["image_grid_thw"])
    with torch.no_grad():
        ref = model.vlm.model(**kw).last_hidden_state
        out = model(batch).understanding_hidden
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=0)


def sample(batch, i):
    """Sample i of a batch on its own, unpadded."""
    n = int(batch["attention_mask"][i].sum())
    rows = batch["image_grid_thw"].prod(-1)
    start = int(rows[: i * FRAMES].sum())
    stop = start + int(rows[i * FRAMES: (i + 1) * FRAMES].sum())
    return {"input_ids": batch["input_ids"][i: i + 1, :n], "attention_mask": batch["attention_mask"][i: i + 1, :n],
            "pixel_values": batch["pixel_values"][start:stop],
            "image_grid_thw": batch["image_grid_thw"][i * FRAMES: (i + 1) * FRAMES],
            **{k: batch[k][i: i + 1] for k in ("bev", "target_points", "ego")}}


def test_padding_changes_nothing(tok):
    vcfg, model = tiny_model(tok)
    batch = make_batch(tok, vcfg)
    short = int(batch["attention_mask"].sum(1).argmin())
    assert int(batch["attention_mask"][short].sum()) < batch["input_ids"].shape[1]
    with torch.no_grad():
        padded = model(batch | {"input_ids": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 17)})
        alone = model(sample(batch, short))
        cached = model.act(model.encode_prefix(sample(batch, short)), sample(batch, short))
    for name in HEADS:
        torch.testing.assert_close(getattr(padded, name)[short], getattr(alone, name)[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(getattr(cached, name)[0], getattr(alone, name)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_act_with_the_prefix_cache_equals_the_joint_forward(tok, family):
    vcfg, model = tiny_model(tok, family)
    batch = make_batch(tok, vcfg)
    with torch.no_grad():
        full = model(batch)
        prefix = model.encode_prefix(batch)
        snapshot = copy.deepcopy(prefix)
        fast = model.act(prefix, {k: batch[k] for k in ("bev", "target_points", "ego")})
        for name in HEADS:
            torch.testing.assert_close(getattr(fast, name), getattr(full, name), atol=1e-5, rtol=0, msg=name)
        for a, b in zip(prefix.keys + prefix.values, snapshot.keys + snapshot.values, strict=True):
            assert torch.equal(a, b)  # act read the cache, never wrote it
        assert torch.equal(prefix.key_padding, snapshot.key_padding)
        assert torch.equal(prefix.next_position, snapshot.next_position)
        # D+P positions continue after U's largest (multimodal) position, per sample
        kw = {"mm_token_type_ids": mm_token_type_ids(model.vlm, batch["input_ids"])}
        _, deltas = model.vlm.model.get_rope_index(batch["input_ids"], image_grid_thw=batch["image_grid_thw"],
                                                    attention_mask=batch["attention_mask"], **kw)
        assert torch.equal(prefix.next_position, deltas.view(-1) + batch["attention_mask"].sum(1))
        shifted = copy.copy(prefix)
        shifted.next_position = prefix.next_position - prefix.next_position.min()  # positions from 0 instead
        assert not torch.allclose(model.act(shifted, batch).waypoints, full.waypoints, atol=1e-4)
        # a prefix from a different earlier observation (same shapes) changes the actions: the cache is used
        stale = model.encode_prefix(make_batch(tok, vcfg, seed=7))
        other = model.act(stale, batch)
    assert not torch.allclose(other.meta_logits, full.meta_logits, atol=1e-4)
    assert not torch.allclose(other.waypoints, full.waypoints, atol=1e-4)


def test_act_builds_its_shared_state_once_and_equals_the_uncached_stack(tok):
    """act's per-prefix state (mask, rotary tables, head-expanded key / value buffers) is built at the first act,
    reused by the next ones, rebuilt when the prefix's tensors change, and gives the uncached path's numbers
    bit for bit (the joint stack over the prefix with the boolean block mask, keys concatenated per layer)."""
    vcfg, model = tiny_model(tok)
    batch = make_batch(tok, vcfg)
    with torch.no_grad():
        prefix = model.encode_prefix(batch)
        first = model.act(prefix, batch)
        state = next(iter(prefix._act.values()))
        again = model.act(prefix, batch)
        assert len(prefix._act) == 1 and next(iter(prefix._act.values())) is state  # reused, not rebuilt
        a, plan = model._action_tokens(batch)
        n_u = prefix.length
        pad = torch.cat([prefix.key_padding, torch.zeros(a.shape[0], a.shape[1], dtype=torch.bool)], dim=1)
        mask = block_mask([n_u, model.cfg.n_reason, sum(plan)], ["causal", "full", "full"], key_padding=pad)
        _, h_a, _, _ = model._stack(mask[:, None, n_u:], a=(a, *model._action_rope(a, prefix.next_position)),
                                    cached=prefix)
        ref = model._heads(h_a, plan, prefix.hidden)
        for name in HEADS:
            assert torch.equal(getattr(first, name), getattr(ref, name)), name
            assert torch.equal(getattr(again, name), getattr(ref, name)), name
        moved = copy.copy(prefix)
        moved.next_position = prefix.next_position + 3  # a replaced tensor: the state is rebuilt for it
        assert not torch.equal(model.act(moved, batch).waypoints, ref.waypoints)
        assert torch.equal(model.act(prefix, batch).waypoints, ref.waypoints)


def test_noreason_arm_runs_without_a_vlm(tok):
    cfg = tiny_cfg(use_understanding=False, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                   meta_action_token_ids=[])
    torch.manual_seed(0)
    model = AutoMoT(cfg, None).eval()
    vcfg, _ = tiny_vlm(tok)
    batch = {k: v for k, v in make_batch(tok, vcfg).items() if k in ("bev", "target_points", "ego")}
    with torch.no_grad():
        ref = model(batch)
        assert ref.meta_logits.shape == (B, 4) and ref.waypoints.shape == (B, 6, 2)
        assert ref.understanding_hidden is None
        assert torch.equal(model.act(None, batch).waypoints, ref.waypoints)
        for key in ("bev", "ego"):
            out = model(batch | {key: batch[key] + 1.0})
            assert not torch.allclose(out.waypoints, ref.waypoints), key
            assert not torch.allclose(out.velocity, ref.velocity), key
    with pytest.raises(ConfigError, match="num_layers"):
        AutoMoTConfig(use_understanding=False)
    with pytest.raises(ConfigError, match="VLM"):
        AutoMoT(cfg, build_vlm(vcfg))


def test_loss_falls_and_freezing_keeps_the_vlm(tok):
    vcfg, model = tiny_model(tok)
    model.train()
    batch, tgt = make_batch(tok, vcfg), targets()
    out = model(batch)
    assert out.features.shape == (B, 6 * 24) and out.route.shape == (B, 20, 2) and out.velocity.shape == (B,)
    torch.testing.assert_close(out.waypoints, out.wp_offsets.cumsum(1))
    opt = torch.optim.Adam(model.trainable_parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        parts = model.loss(model(batch), tgt)
        losses.append(parts["loss"].item())
        opt.zero_grad()
        parts["loss"].backward()
        opt.step()
    assert set(parts) == {"loss", "meta", "route", "waypoints", "velocity"}
    assert losses[-1] < 0.6 * losses[0], losses

    # freeze_understanding: the VLM gets no gradient and does not move; the expert does
    vcfg, frozen = tiny_model(tok, freeze_understanding=True)
    frozen.train()
    vlm_ids = {id(p) for p in frozen.vlm.parameters()}
    assert not any(id(p) in vlm_ids for p in frozen.trainable_parameters())
    before = {k: v.clone() for k, v in frozen.vlm.state_dict().items()}
    expert_before = frozen.layers[0].self_attn.q_proj.weight.clone()
    opt = torch.optim.Adam(frozen.trainable_parameters(), lr=1e-2)
    frozen.loss(frozen(batch), tgt)["loss"].backward()
    opt.step()
    assert all(p.grad is None for p in frozen.vlm.parameters())
    assert all(torch.equal(v, before[k]) for k, v in frozen.vlm.state_dict().items())
    assert not torch.equal(frozen.layers[0].self_attn.q_proj.weight, expert_before)

    # the understanding next-token loss reaches the (unfrozen) VLM
    labels = batch["input_ids"].clone()
    labels[:, : labels.shape[1] - 4] = IGNORE
    labels[batch["attention_mask"] == 0] = IGNORE
    lm = model.understanding_lm_loss(batch | {"labels": labels})
    assert torch.isfinite(lm)
    model.zero_grad()
    lm.backward()
    assert model.vlm.get_input_embeddings().weight.grad is not None


def test_bad_input_and_config_errors(tok):
    vcfg, model = tiny_model(tok)
    batch = make_batch(tok, vcfg)
    with pytest.raises(ValueError, match=r"batch\['bev'\]"):
        model(batch | {"bev": torch.rand(B, 3, 16, 16)})
    with pytest.raises(ValueError, match=r"batch\['bev'\]"):
        model(batch | {"bev": torch.rand(B, 6, 12, 16)})
    with pytest.raises(ValueError, match="target_points"):
        model(batch | {"target_points": torch.rand(B, 3, 2)})
    with pytest.raises(ValueError, match="'ego'"):
        model({k: v for k, v in batch.items() if k != "ego"})
    with pytest.raises(ValueError, match="right-padded"):
        model(batch | {"attention_mask": batch["attention_mask"].flip(1)})
    with pytest.raises(ValueError, match="act"):
        model.act(None, batch)
    with pytest.raises(ValueError, match="velocity"):
        model.loss(model(batch), {k: v for k, v in targets().items() if k != "velocity"})
    with pytest.raises(ConfigError, match="'bev_chanels'.*'bev_channels'"):
        AutoMoTConfig.from_dict({"bev_chanels": 6})
    assert AutoMoTConfig.from_dict(tiny_cfg().to_dict()) == tiny_cfg()
    with pytest.raises(ConfigError, match="wp_weights"):
        tiny_cfg(wp_weights=[1.0, 1.0])
    with pytest.raises(ConfigError, match="meta_action_token_ids"):
        tiny_cfg(meta_action_token_ids=[1, 2])
    with pytest.raises(ConfigError, match="meta_action_token_ids"):
        AutoMoT(tiny_cfg(meta_action_token_ids=[]), tiny_vlm(tok)[1])
