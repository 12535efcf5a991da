"""core.vlm: the offline tokenizer, the chat template, patchify vs the HF processor, collation, folder round trips."""

from __future__ import annotations

import pytest
import torch

from core.errors import CheckpointError, ConfigError
from core.vlm import (
    IGNORE,
    PatchSpec,
    VLMConfig,
    answer_logprob,
    build_tokenizer,
    build_vlm,
    decode_answer,
    encode,
    image_processor,
    load_tokenizer,
    load_vlm,
    next_token_loss,
    patchify,
    save_vlm,
    token_id,
    vlm_collate,
    vlm_inputs,
)
from core.vlm.tokenizer import IM_END, IMAGE_PAD, SPECIAL_TOKENS

CORPUS = ["is this image real or fake? fake. it is upsampled", "how many objects are there? two",
          "what colour is the largest object? red"] * 10


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(CORPUS, vocab_size=320)


def tiny(tok, family="qwen2_5_vl"):
    torch.manual_seed(0)
    cfg = VLMConfig(family=family, vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=3,
                    num_heads=2, num_kv_heads=1, vision_depth=1, vision_hidden=32, vision_intermediate=64,
                    vision_heads=2)
    return cfg, build_vlm(cfg).eval()


def test_tokenizer_special_tokens_and_round_trip(tok, tmp_path):
    assert [token_id(tok, t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    text = "how many objects are there? three!"  # "three" and "!" unseen: byte-level BPE still encodes them
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    assert again.get_vocab() == tok.get_vocab()
    with pytest.raises(CheckpointError, match="no tokenizer"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ConfigError, match="vocab_size"):
        build_tokenizer(CORPUS, vocab_size=100)


def test_template_labels_cover_only_the_answer(tok):
    ex = encode(tok, "how many objects are there?", "two", n_image_tokens=4)
    ids, labels = ex["input_ids"], ex["labels"]
    assert (ids == token_id(tok, IMAGE_PAD)).sum() == 4
    answer = labels[labels != IGNORE]
    assert decode_answer(tok, answer) == "two"
    assert answer[-1] == token_id(tok, IM_END)  # the model learns to stop
    n = int((labels == IGNORE).sum())
    assert torch.equal(ids[n:], answer)  # labels are a suffix: the prompt is never a target
    prompt_only = encode(tok, "how many objects are there?", None, 4)
    assert "labels" not in prompt_only and torch.equal(prompt_only["input_ids"], ids[:n])


def test_collate_pads_right_and_left(tok):
    a = encode(tok, "how many objects are there?", "two", 4)
    b = encode(tok, "what colour is the largest object?", "red", 4)
    for side in ("right", "left"):
        batch = vlm_collate([{**a, "image": torch.zeros(3, 8, 8)}, {**b, "image": torch.ones(3, 8, 8)}],
                            tok.pad_token_id, side)
        L = max(len(a["input_ids"]), len(b["input_ids"]))
        assert batch["input_ids"].shape == (2, L) and batch["image"].shape == (2, 3, 8, 8)
        for i, ex in enumerate((a, b)):
            n = len(ex["input_ids"])
            keep = slice(0, n) if side == "right" else slice(L - n, L)
            assert torch.equal(batch["input_ids"][i, keep], ex["input_ids"])
            assert torch.equal(batch["labels"][i, keep], ex["labels"])
            assert int(batch["attention_mask"][i].sum()) == n
            assert (batch["labels"][i][batch["attention_mask"][i] == 0] == IGNORE).all()


def test_patchify_matches_the_hf_processor():
    spec = PatchSpec(image_size=32, patch_size=8, merge_size=2)
    imgs = torch.randint(0, 256, (3, 32, 32, 3), dtype=torch.uint8)
    ref = image_processor(spec)(images=list(imgs.numpy()), return_tensors="pt")
    pv, grid = patchify(imgs.permute(0, 3, 1, 2).float() / 255.0, spec)
    assert torch.equal(grid, ref["image_grid_thw"])
    torch.testing.assert_close(pv, ref["pixel_values"], atol=1e-5, rtol=0)
    assert spec.tokens_per_image == 4
    with pytest.raises(ConfigError, match="multiple"):
        PatchSpec(image_size=40, patch_size=8, merge_size=2)
    with pytest.raises(ConfigError, match="images must be"):
        patchify(torch.zeros(1, 3, 16, 16), spec)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_save_load_gives_identical_logits(tok, tmp_path, family):
    cfg, model = tiny(tok, family)
    spec = cfg.patch_spec(32)
    ex = vlm_collate([encode(tok, "how many objects are there?", "two", spec.tokens_per_image)] * 2,
                     tok.pad_token_id)
    pv, grid = patchify(torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)), spec)
    with torch.no_grad():
        before = model(**vlm_inputs(model, ex["input_ids"], ex["attention_mask"], pv, grid)).logits
    save_vlm(tmp_path / "vlm", model, tok, spec)
    assert (tmp_path / "vlm" / "preprocessor_config.json").is_file()
    loaded, tok2 = load_vlm(tmp_path / "vlm")
    with torch.no_grad():
        after = loaded.eval()(**vlm_inputs(loaded, ex["input_ids"], ex["attention_mask"], pv, grid)).logits
    assert torch.equal(before, after)
    assert tok2.get_vocab() == tok.get_vocab()


def test_load_vlm_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such VLM folder"):
        load_vlm(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_vlm(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(CheckpointError, match="not a supported VLM|unreadable"):
        load_vlm(tmp_path / "bad")


def test_answer_logprob_and_loss_fall_when_training(tok):
    cfg, model = tiny(tok)
    model.train()
    spec = cfg.patch_spec(32)
    g = torch.Generator().manual_seed(0)
    images = torch.rand(4, 3, 32, 32, generator=g)
    answers = ["two", "red", "two", "red"]
    batch = vlm_collate([encode(tok, "q?", a, spec.tokens_per_image) for a in answers], tok.pad_token_id)
    pv, grid = patchify(images, spec)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        out = model(**vlm_inputs(model, batch["input_ids"], batch["attention_mask"], pv, grid))
        loss = next_token_loss(out.logits, batch["labels"])
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.25 * losses[0]
    lp = answer_logprob(out.logits.detach(), batch["labels"])
    # the sequence log-probability is the negative summed token loss
    n_tok = (batch["labels"][:, 1:] != IGNORE).sum()
    torch.testing.assert_close(-lp.sum() / n_tok, next_token_loss(out.logits.detach(), batch["labels"]))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_vlm_inputs_give_image_tokens_3d_positions_in_every_family(tok, family):
    """vlm_inputs adds mm_token_type_ids (1 at image tokens) for both families, so the image tokens get the 3-D
    multimodal positions: the logits equal a forward with the positions from get_rope_index, and differ from
    1-D text positions (what Qwen2.5-VL falls back to without them)."""
    from core.vlm import image_token_id, mm_token_type_ids

    cfg, model = tiny(tok, family)
    spec = cfg.patch_spec(32)
    ex = vlm_collate([encode(tok, "how many objects are there?", "two", spec.tokens_per_image)], tok.pad_token_id)
    pv, grid = patchify(torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)), spec)
    kw = vlm_inputs(model, ex["input_ids"], ex["attention_mask"], pv, grid)
    types = kw["mm_token_type_ids"]
    assert torch.equal(types, mm_token_type_ids(model, ex["input_ids"]))
    assert int(types.sum()) == spec.tokens_per_image and torch.equal(types.bool(),
                                                                     ex["input_ids"] == image_token_id(model))
    assert "mm_token_type_ids" not in vlm_inputs(model, ex["input_ids"], ex["attention_mask"], None, None)
    positions, _ = model.model.get_rope_index(ex["input_ids"], image_grid_thw=grid,
                                              attention_mask=ex["attention_mask"], mm_token_type_ids=types)
    assert not torch.equal(positions[1], positions[2])  # height and width differ at the image tokens: 3-D
    flat = torch.arange(ex["input_ids"].shape[1])[None, None].expand(3, 1, -1)
    with torch.no_grad():
        got = model(**kw).logits
        want = model(**{k: v for k, v in kw.items() if k != "mm_token_type_ids"}, position_ids=positions).logits
        text_positions = model(**{k: v for k, v in kw.items() if k != "mm_token_type_ids"},
                               position_ids=flat).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert not torch.allclose(got, text_positions, atol=1e-4)
    # positions="text" (how the first checkpoints here were trained) is exactly Qwen2.5-VL's 1-D fallback
    if family == "qwen2_5_vl":
        legacy = vlm_inputs(model, ex["input_ids"], ex["attention_mask"], pv, grid, positions="text")
        assert "mm_token_type_ids" not in legacy
        with torch.no_grad():
            torch.testing.assert_close(model(**legacy).logits, text_positions, atol=1e-5, rtol=0)
    else:
        with pytest.raises(ConfigError, match="always uses its 3-D positions"):
            vlm_inputs(model, ex["input_ids"], ex["attention_mask"], pv, grid, positions="text")
    with pytest.raises(ConfigError, match="positions must be one of"):
        vlm_inputs(model, ex["input_ids"], ex["attention_mask"], pv, grid, positions="2d")


def test_ensure_base_vlm_pretrains_once_under_a_lock_and_then_only_loads(tok, tmp_path):
    """A missing base is pretrained (tokenizer from the corpus, the next-token loss on image-QA answers, save_vlm +
    pretraining.json); asked again, the folder is loaded as is (the callbacks are not called, nothing is
    written); a user's folder (no pretraining.json) is loaded read-only."""
    import json

    from core.config import TrainerConfig
    from core.vlm import BasePretraining, ensure_base_vlm, is_workspace_base
    from core.vlm.pretrain import PRETRAINING_FILE

    corpus_calls = []

    def corpus():
        corpus_calls.append(1)
        return CORPUS

    def dataset(tok_, spec):
        g = torch.Generator().manual_seed(0)
        return [{**encode(tok_, "how many objects are there?", a, spec.tokens_per_image),
                 "image": torch.rand(3, 32, 32, generator=g)} for a in ("two", "three") * 4]

    sizes = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, vision_depth=1,
                 vision_hidden=32, vision_intermediate=64, vision_heads=2)
    how = BasePretraining(sizes=sizes, image_size=32, tokenizer_vocab=300, steps=3, batch_size=4, lr=1e-3,
                          extra_tokens=("keep_lane",), method="test", what="a test base")
    tcfg = TrainerConfig(device="cpu", progress=False, tensorboard=False, log_every=1, ckpt_every=100)
    base = tmp_path / "base"
    vlm, tok2 = ensure_base_vlm(base, how, tcfg, corpus=corpus, dataset=dataset, card={"note": 1})
    assert corpus_calls == [1] and is_workspace_base(base)
    meta = json.loads((base / PRETRAINING_FILE).read_text())
    assert meta["what"] == "a test base" and meta["steps"] == 3 and meta["note"] == 1 and meta["examples"] == 8
    assert "keep_lane" in tok2.get_vocab() and vlm.config.text_config.vocab_size == len(tok2)
    assert (tmp_path / "base.run" / "tokenizer" / "tokenizer.json").is_file()  # a resumed run keeps it
    assert (tmp_path / "base.run" / "checkpoints" / "latest").is_file()
    stamp = sorted((p.name, p.stat().st_mtime_ns) for p in base.iterdir())

    def fail(*_):
        raise AssertionError("the base exists: nothing may be rebuilt")

    again, _ = ensure_base_vlm(base, how, tcfg, corpus=fail, dataset=fail)
    assert all(torch.equal(a, b) for a, b in zip(vlm.state_dict().values(), again.state_dict().values(), strict=True))
    assert sorted((p.name, p.stat().st_mtime_ns) for p in base.iterdir()) == stamp
    cfg, model = tiny(tok)
    save_vlm(tmp_path / "user", model, tok, cfg.patch_spec(32))
    ensure_base_vlm(tmp_path / "user", how, tcfg, corpus=fail, dataset=fail)
    assert not is_workspace_base(tmp_path / "user") and not (tmp_path / "user.pretrain").exists()


def test_ensure_base_vlm_refuses_to_pretrain_under_torchrun(tmp_path, monkeypatch):
    from core.config import TrainerConfig
    from core.vlm import BasePretraining, ensure_base_vlm

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="pretrain it in one process first"):
        ensure_base_vlm(tmp_path / "base", BasePretraining(sizes={}, image_size=32, method="x"), TrainerConfig(),
                        corpus=list, dataset=lambda *_: [])


def test_inject_lora_with_a_regular_expression_wraps_exactly_the_matching_linears(tok):
    """core.layers.lora.inject_lora with one string: peft's full-match regex over qualified names (what Deep-VRM
    uses to adapt only the LLM layers >= K)."""
    from core.layers.lora import inject_lora, is_lora_layer

    _, model = tiny(tok)
    wrapped = inject_lora(model, r".*language_model\.layers\.(1|2)\.self_attn\.(q|v)_proj", rank=2, alpha=4.0,
                          adapter_name="llm")
    assert sorted(wrapped) == sorted(f"model.language_model.layers.{i}.self_attn.{p}_proj"
                                     for i in (1, 2) for p in ("q", "v"))
    assert sorted(n for n, m in model.named_modules() if is_lora_layer(m)) == sorted(wrapped)
    assert all(".lora_A.llm." in n or ".lora_B.llm." in n for n, _ in model.named_parameters() if "lora_" in n)
    with pytest.raises(ValueError, match="matches"):
        inject_lora(model, r"nothing\.here", rank=2)


# -- dtype, paper-size config fields, added tokens ---------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("weights", [True, False])
def test_load_vlm_in_bf16_never_materialises_fp32_parameters(tok, tmp_path, family, weights):
    """Every parameter the load creates off the meta device is bf16 (a registration hook sees each one): the
    folder's weights are read straight into bf16, no fp32 model is built first."""
    cfg, model = tiny(tok, family)
    save_vlm(tmp_path / "vlm", model, tok, cfg.patch_spec(32))
    made = []
    hook = torch.nn.modules.module.register_module_parameter_registration_hook(
        lambda module, name, p: made.append((name, p.dtype, p.device.type)))
    try:
        loaded, _ = load_vlm(tmp_path / "vlm", dtype="bfloat16", weights=weights)
    finally:
        hook.remove()
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    materialised = [(n, d) for n, d, dev in made if dev != "meta"]
    assert materialised and all(d == torch.bfloat16 for _, d in materialised), materialised[:3]
    if weights:  # the same values as the fp32 model, rounded once
        ref = dict(model.named_parameters())
        for name, p in loaded.named_parameters():
            assert torch.equal(p, ref[name].to(torch.bfloat16)), name


def test_load_vlm_dtype_default_auto_and_errors(tok, tmp_path):
    cfg, model = tiny(tok)
    save_vlm(tmp_path / "fp32", model, tok, cfg.patch_spec(32))
    save_vlm(tmp_path / "bf16", model.to(torch.bfloat16), tok, cfg.patch_spec(32))
    assert {p.dtype for p in load_vlm(tmp_path / "bf16")[0].parameters()} == {torch.float32}  # default: fp32
    assert {p.dtype for p in load_vlm(tmp_path / "bf16", dtype="auto")[0].parameters()} == {torch.bfloat16}
    assert {p.dtype for p in load_vlm(tmp_path / "fp32", dtype="auto")[0].parameters()} == {torch.float32}
    assert {p.dtype for p in load_vlm(tmp_path / "fp32", dtype=torch.float16)[0].parameters()} == {torch.float16}
    with pytest.raises(ConfigError, match="dtype must be one of"):
        load_vlm(tmp_path / "fp32", dtype="int8")


def test_vlm_config_head_dim_mrope_and_deepstack(tok, tmp_path):
    """Qwen3-VL's own head width (not hidden / heads), M-RoPE split, deepstack mergers and position grid."""
    cfg = VLMConfig(family="qwen3_vl", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=3,
                    num_heads=2, num_kv_heads=1, vision_depth=2, vision_hidden=32, vision_intermediate=64,
                    vision_heads=2, head_dim=24, mrope_section=[4, 4, 4], deepstack_indexes=[0, 1],
                    vision_position_embeddings=144)
    torch.manual_seed(0)
    model = build_vlm(cfg).eval()
    attn = model.model.language_model.layers[0].self_attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.o_proj.in_features) == (48, 24, 48)
    assert len(model.model.visual.deepstack_merger_list) == 2
    assert model.model.visual.pos_embed.num_embeddings == 144
    assert model.config.text_config.rope_scaling["mrope_section"] == [4, 4, 4]
    spec = cfg.patch_spec(32)
    ex = vlm_collate([encode(tok, "how many objects are there?", "two", spec.tokens_per_image)], tok.pad_token_id)
    pv, grid = patchify(torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)), spec)
    with torch.no_grad():
        before = model(**vlm_inputs(model, ex["input_ids"], ex["attention_mask"], pv, grid)).logits
    save_vlm(tmp_path / "vlm", model, tok, spec)
    loaded, _ = load_vlm(tmp_path / "vlm")
    with torch.no_grad():
        after = loaded.eval()(**vlm_inputs(loaded, ex["input_ids"], ex["attention_mask"], pv, grid)).logits
    assert torch.equal(before, after)
    # defaults unchanged: head_dim = hidden / heads, the derived split, no deepstack
    plain = VLMConfig(family="qwen3_vl").hf_config()
    assert plain.text_config.head_dim == 32 and plain.vision_config.deepstack_visual_indexes == []
    assert plain.text_config.rope_scaling["mrope_section"] == [4, 6, 6]
    for bad, match in [(dict(head_dim=24), "Qwen2.5-VL's attention"),
                       (dict(family="qwen3_vl", mrope_section=[8, 8, 8]), "mrope_section"),
                       (dict(family="qwen3_vl", deepstack_indexes=[4]), "deepstack_indexes"),
                       (dict(deepstack_indexes=[0]), "only the qwen3_vl"),
                       (dict(family="qwen3_vl", vision_position_embeddings=50), "square")]:
        with pytest.raises(ConfigError, match=match):
            VLMConfig(**bad)


@pytest.mark.parametrize("tie", [True, False])
def test_add_tokens_whole_tokens_resized_and_reproducible(tmp_path, tie):
    """Names that share a first token become whole tokens; rows grow; the added rows are the mean of the rows
    of the pieces they replaced, so adding again to a fresh copy of the same base gives the same model."""
    from core.vlm import add_tokens, has_token

    tok = build_tokenizer(["change lanes to the left or right, keep the lane"] * 10, vocab_size=280)
    names = ["change_left", "change_right"]
    first = [tok(n, add_special_tokens=False)["input_ids"] for n in names]
    assert first[0][0] == first[1][0] and not any(has_token(tok, n) for n in names)  # the case AutoMoT refused
    cfg = VLMConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                    num_kv_heads=1, vision_depth=1, vision_hidden=32, vision_intermediate=64, vision_heads=2,
                    tie_word_embeddings=tie)
    torch.manual_seed(0)
    save_vlm(tmp_path / "base", build_vlm(cfg), tok, cfg.patch_spec(32))
    copies = []
    for _ in range(2):
        vlm, t = load_vlm(tmp_path / "base")
        rows = vlm.get_input_embeddings().weight.detach().clone()
        out_rows = vlm.get_output_embeddings().weight.detach().clone()
        assert add_tokens(vlm, t, [*names, names[0]]) == names
        ids = [t.convert_tokens_to_ids(n) for n in names]
        assert ids == [len(tok), len(tok) + 1] and len(t) == len(tok) + 2
        assert [t(n, add_special_tokens=False)["input_ids"] for n in names] == [[i] for i in ids]
        emb = vlm.get_input_embeddings().weight
        assert emb.shape[0] == len(t) and vlm.get_output_embeddings().weight.shape[0] == len(t)
        assert torch.equal(emb[: len(tok)], rows)  # the old rows untouched
        for n, i, pieces in zip(names, ids, first, strict=True):
            assert torch.allclose(emb[i], rows[pieces].mean(0)), n
            if not tie:
                assert torch.allclose(vlm.get_output_embeddings().weight[i], out_rows[pieces].mean(0))
        assert (vlm.get_output_embeddings().weight is emb) == tie
        assert add_tokens(vlm, t, names) == []  # already whole: nothing changes
        copies.append(vlm.state_dict())
    assert copies[0].keys() == copies[1].keys()
    assert all(torch.equal(copies[0][k], copies[1][k]) for k in copies[0])
