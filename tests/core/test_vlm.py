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
