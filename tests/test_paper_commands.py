"""Every method's paper command, as its README and its ``configs/experiment/<method>_paper.yaml`` write it (issue 29).

Fast: each ``*_paper.yaml`` names the exact command a user runs in its header; that command composes through the
CLI's own composition (``embodied.cli._method_config``: arms, flags, the experiment) and validates against the
method's schemas, and the method's README documents the same command.

Slow: the methods with a pretrained base run that command end to end on a folder with the paper backbone's REAL
structure (depths, patch sizes, window attention, M-RoPE split, deepstack, special-token ids after the BPE vocabulary
and an embedding padded beyond the tokenizer, as Qwen's releases have), shrunk widths and random weights, written by
the upstream library's own ``save_pretrained`` (transformers) — then the method's inference command on the result.
Each runs the ``embodied`` CLI as a subprocess in a temporary folder outside the repository, with overrides that only
shrink steps and data. TransNormal's (SD2-structured diffusers UNet + VAE, DINOv3 files) is covered in
tests/perception/normals.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.testing import folder_digest

REPO = Path(__file__).resolve().parents[1]
PAPER_YAMLS = sorted((REPO / "configs" / "experiment").glob("*_paper.yaml"))
FAST = ["trainer.max_steps=2", "trainer.batch_size=2", "trainer.grad_accum=1", "trainer.ckpt_every=2",
        "trainer.log_every=1", "trainer.device=cpu", "trainer.num_workers=0", "trainer.progress=false",
        "trainer.tensorboard=false"]


def documented_commands(path: Path) -> list[list[str]]:
    """The ``embodied ...`` commands of a config's header comment (continuation lines joined), as argv lists."""
    lines, out, current = path.read_text().splitlines(), [], None
    for line in lines:
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if current is not None:
            current += " " + text.rstrip("\\").strip()
            if not text.endswith("\\"):
                out.append(current)
                current = None
        elif text.startswith("embodied "):
            if text.endswith("\\"):
                current = text.rstrip("\\").strip()
            else:
                out.append(text)
    # optional parts ("[data.root=...]") are left out: the command must run without them
    return [shlex.split(re.sub(r"\[[^\]]*\]", "", c)) for c in out]


def train_command(path: Path) -> list[str]:
    cmds = [c for c in documented_commands(path) if c[:2] == ["embodied", "train"]]
    assert cmds, f"{path.name}: the header comment names no `embodied train METHOD experiment=...` command"
    return cmds[0]


def compose_like_the_cli(argv: list[str]):
    """The config ``embodied train METHOD ...`` composes (``embodied.cli._method_config``)."""
    from embodied.cli import _method_config

    rest, arm = list(argv[3:]), None
    if "--arm" in rest:
        i = rest.index("--arm")
        arm = rest[i + 1]
        del rest[i:i + 2]
    args = argparse.Namespace(command=argv[1], method=argv[2], overrides=rest, arm=arm)
    return _method_config(args)[1]


def readme_of(method: str) -> Path:
    from core.registry import METHODS, load_plugins

    load_plugins()
    folder = REPO / METHODS.meta(method)["spec"].folder
    return folder / "README.md"


def test_paper_configs_exist_for_every_method_with_a_paper():
    names = {p.name.removesuffix("_paper.yaml") for p in PAPER_YAMLS}
    assert {"transnormal", "deepvrm", "automot", "flexforcing", "lacwm", "eacwm", "sola", "bc"} <= names


@pytest.mark.parametrize("path", PAPER_YAMLS, ids=lambda p: p.stem)
def test_the_documented_paper_command_composes_and_validates(path):
    """The header's command (placeholders like /weights/... need not exist to compose) gives a valid config of this
    file's experiment: the method's own schemas build (``__post_init__`` ran), ``experiment=`` is this file."""
    from core.config import compose, to_object

    argv = train_command(path)
    chosen = [a.partition("=")[2] for a in argv if a.startswith("experiment=")]
    # EAC-WM is LAC-WM's arm: its command is lacwm's with --arm eacwm on lacwm_paper
    assert chosen and chosen[0] in (path.stem, "lacwm_paper"), f"{path.name}: its command selects {chosen}"
    cfg = compose_like_the_cli(argv)
    model, data, trainer = to_object(cfg.model), to_object(cfg.data), to_object(cfg.trainer)
    assert type(model).__module__.split(".")[0] in ("perception", "driving", "worldmodels")
    assert trainer.max_steps >= 1000, f"{path.name}: a paper schedule, not a smoke run"
    assert "outputs" in str(cfg.out_dir)
    # the file itself also composes directly (the experiment grid / sweeps compose it by name)
    direct = compose([f"experiment={path.stem}", *[a for a in argv[3:] if "_path=" in a]])
    assert direct.method in (argv[2], path.stem.removesuffix("_paper"))
    assert data is not None


@pytest.mark.parametrize("path", PAPER_YAMLS, ids=lambda p: p.stem)
def test_the_readme_documents_the_same_command(path):
    """The method's README holds the header's train command verbatim (whitespace and line breaks aside)."""
    argv = train_command(path)
    readme = readme_of(argv[2])
    assert readme.is_file(), f"{argv[2]}: no README at {readme}"
    flat = " ".join(readme.read_text().replace("\\\n", " ").split())
    assert " ".join(argv) in flat, f"{readme.relative_to(REPO)} does not document `{' '.join(argv)}`"


# -- user folders of the paper backbones (real structure, shrunk widths, random weights) -------------------------
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>")


def qwen_tokenizer(corpus: list[str], vocab: int = 600):
    """A Qwen-style tokenizer: byte-level BPE, the special tokens AFTER the BPE vocabulary (as in Qwen's
    tokenizer.json, ids 151643+), meta-action-like words split into pieces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": list(SPECIALS)})
    fast.pad_token, fast.eos_token = "<|endoftext|>", "<|im_end|>"
    assert fast.convert_tokens_to_ids("<|endoftext|>") >= 256  # after the vocabulary, not 0..6
    return fast


def save_qwen_folder(folder: Path, family: str, corpus: list[str]) -> Path:
    """A transformers folder of ``family`` at its released structure with shrunk widths, written by
    ``save_pretrained`` (model, tokenizer, image processor) exactly as a download holds it."""
    import transformers

    tok = qwen_tokenizer(corpus)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    padded = (len(tok) + 63) // 64 * 64 + 64  # Qwen pads its embeddings beyond the tokenizer (152064 vs 151665)
    token_ids = dict(bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    common = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    if family == "qwen2_5_vl":  # Qwen2.5-VL-7B: 28 layers, GQA 7:1, M-RoPE 1/4 3/8 3/8, 32 ViT blocks (window
        # attention except 7 / 15 / 23 / 31), patch 14, merge 2, window 112
        text = dict(vocab_size=padded, hidden_size=112, intermediate_size=160, num_hidden_layers=28,
                    num_attention_heads=7, num_key_value_heads=1, hidden_act="silu", max_position_embeddings=4096,
                    rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, **token_ids,
                    rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
        vision = dict(depth=32, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=112,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                      fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu", in_chans=3)
        cfg = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **common)
        model = transformers.Qwen2_5_VLForConditionalGeneration(cfg)
    else:  # Qwen3-VL-4B: 36 layers, head_dim set apart from hidden / heads, interleaved M-RoPE, 24 ViT blocks with
        # deepstack mergers at 5 / 11 / 17, patch 16, a learned 48 x 48 position grid, tied embeddings
        text = dict(vocab_size=padded, hidden_size=64, intermediate_size=96, num_hidden_layers=36,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=32, hidden_act="silu",
                    max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=5e6, tie_word_embeddings=True,
                    attention_bias=False, **token_ids,
                    rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True})
        vision = dict(depth=24, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                      patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                      deepstack_visual_indexes=[5, 11, 17], hidden_act="gelu_pytorch_tanh", in_channels=3)
        cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **common)
        model = transformers.Qwen3VLForConditionalGeneration(cfg)
    torch.manual_seed(0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    patch = cfg.vision_config.patch_size
    transformers.Qwen2VLImageProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2).save_pretrained(folder)
    return folder


def write_genimage(root: Path, generators=("stable_diffusion_v_1_4", "midjourney"), n: int = 4, size: int = 48):
    """A GenImage-layout folder (``<generator>/<split>/{ai,nature}/*.png``), as Deep-VRM's own tests write it."""
    from tests.perception.forensics.test_deepvrm import _write_layout

    _write_layout(root, n=n, size=size, generators=generators)
    return root


def run_cli(args: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    # the serial tests run alone and get every core (the Makefile's SERIAL_PYTEST); the others one thread each
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    r = subprocess.run([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"`embodied {' '.join(args)}` exited {r.returncode}:\n{r.stderr[-3000:]}"
    return r


@pytest.fixture
def outside(tmp_path):
    """A working folder outside the repository (a user's), where relative ``outputs/`` land."""
    work = tmp_path / "work"
    work.mkdir()
    assert REPO not in work.resolve().parents
    return work


def substitute(argv: list[str], **paths: str) -> list[str]:
    """The documented command with the user's paths put in for its placeholders (``model.base_path=...``)."""
    out = []
    for a in argv:
        key = a.partition("=")[0]
        out.append(f"{key}={paths[key]}" if key in paths else a)
    missing = set(paths) - {a.partition("=")[0] for a in argv}
    assert not missing, f"the documented command has no {sorted(missing)}"
    return out


@pytest.mark.slow
@pytest.mark.serial  # a VLM-sized model (~17 GB for AutoMoT's paper-geometry expert): alone, after the parallel part
@pytest.mark.timeout(1500)
def test_deepvrm_paper_command_on_a_qwen2_5_vl_folder(outside, tmp_path):
    """`embodied train deepvrm experiment=deepvrm_paper model.base_path=<Qwen2.5-VL folder>` (448 px, K = 16 of 28,
    bf16 base + autocast, gradient checkpointing) for 2 steps on a GenImage folder, then `embodied infer forensics`
    on the detector; the user's base and data folders stay byte-identical and the detector references the base."""
    from perception.forensics.task import tokenizer_corpus

    base = save_qwen_folder(tmp_path / "Qwen2.5-VL-7B-Instruct", "qwen2_5_vl", tokenizer_corpus([]) * 3)
    data = write_genimage(tmp_path / "GenImage")
    before = {"base": folder_digest(base), "data": folder_digest(data)}
    argv = substitute(train_command(REPO / "configs/experiment/deepvrm_paper.yaml"), **{"model.base_path": str(base)})
    run_cli([*argv[1:], f"data.root={data}", "data.generators=[stable_diffusion_v_1_4,midjourney]",
             "data.stage1=[stable_diffusion_v_1_4]", "data.stage2=[]", "data.holdout=midjourney", "data.qa_train=4",
             "data.qa_test=3", "data.eval_qa=3", "data.eval_batch=4", *FAST], outside)
    detector = outside / "outputs/deepvrm_paper/deepvrm_s0/detector"
    cfg = json.loads((detector / "config.json").read_text())
    assert cfg["model"]["image_size"] == 448 and cfg["model"]["inject_layer"] == 16
    assert Path(cfg["model"]["base_path"]).resolve() == base.resolve()  # referenced, not copied
    assert not (detector / "base").exists()
    images = sorted((data / "midjourney" / "val" / "ai").glob("*.png"))[:2]
    r = run_cli(["infer", "forensics", *map(str, images), "--checkpoint", str(detector), "--batch", "2"], outside)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["path"] for x in lines] == [str(p) for p in images]
    assert all(x["verdict"] in ("real", "fake") and 0.0 <= x["probability"] <= 1.0 for x in lines)
    assert {"base": folder_digest(base), "data": folder_digest(data)} == before


@pytest.mark.slow
@pytest.mark.serial  # a VLM-sized model (~17 GB for AutoMoT's paper-geometry expert): alone, after the parallel part
@pytest.mark.timeout(1500)
def test_automot_paper_command_on_a_qwen3_vl_folder(outside, tmp_path):
    """`embodied train automot experiment=automot_paper model.base_path=<Qwen3-VL folder>` (448 px frames, the
    action expert at the VLM's depth and geometry, bf16) for 1 step on tiny logs — the tokenizer splits the
    meta-actions, so the policy adds them to its own vocabulary — then `embodied drive eval` with the policy; the
    user's folder stays byte-identical."""
    from driving.automot.configuration_automot import META_ACTIONS, REASON_PROMPT, SYSTEM_PROMPT

    corpus = [SYSTEM_PROMPT, REASON_PROMPT, "change lanes to the left or right, keep the lane, slow down, stop",
              *[m.replace("_", " ") for m in META_ACTIONS]] * 6
    base = save_qwen_folder(tmp_path / "Qwen3-VL-4B-Instruct", "qwen3_vl", corpus)
    before = folder_digest(base)
    argv = substitute(train_command(REPO / "configs/experiment/automot_paper.yaml"), **{"model.base_path": str(base)})
    tiny_data = ["data.root=logs", "data.image_size=32", "data.episodes=1", "data.test_episodes=1",
                 "data.scenarios=[highway]", "data.horizon_s=2", "data.workers=1", "data.eval_episodes=0",
                 "model.refiner_steps=2", "model.refiner.hidden=32", "model.refiner.layers=1"]
    # the paper-geometry expert (36 layers of width 1024, bf16, 448 px frames) on a CPU without AVX-512 bf16: two
    # steps of two samples on one thread ran past 900 s; one step of one sample on 2 threads: 330 s (2026-12-07)
    one_step = [a for a in FAST if a.split("=")[0] not in ("trainer.max_steps", "trainer.batch_size",
                                                            "trainer.ckpt_every")]
    one_step += ["trainer.max_steps=1", "trainer.batch_size=1", "trainer.ckpt_every=1"]
    run_cli([*argv[1:], *tiny_data, *one_step], outside, timeout=1400)
    run = outside / "outputs/automot_paper/automot_s0"
    cfg = json.loads((run / "policy" / "config.json").read_text())
    assert cfg["model"]["image_size"] == 448 and cfg["model"]["mot"]["expert_hidden_size"] == 1024
    assert Path(cfg["model"]["base_path"]).resolve() == base.resolve()
    assert {"change_left", "change_right"} <= set(cfg["model"]["added_tokens"])
    run_cli(["drive", "eval", "--policy", str(run), "--scenario", "highway", "--episodes", "1", "--horizon-s", "1",
             "--no-video", "--out", str(outside / "drive")], outside)
    summary = json.loads(next((outside / "drive").glob("*.json")).read_text())
    assert summary
    assert folder_digest(base) == before


VIT_G_TINY = {"img_size": 32, "embed_dim": 44, "depth": 2, "num_heads": 2}  # ViT-g/16: 224 px, 1408, 40, 16


def timm_vit_giant_file(folder: Path) -> Path:
    """A ``vit_giant_patch16_gap_224`` weights file at timm's real structure (16 px patches, mlp ratio 48/11, no
    class token, average pool) with shrunk widths (44 = 1408 / 32, so the MLP is a whole 192) and random weights:
    the state dict as one ``.safetensors`` file, timm's own weight-file format."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = timm.create_model("vit_giant_patch16_gap_224", pretrained=False, num_classes=0, **VIT_G_TINY)
    assert net.num_prefix_tokens == 0 and net.patch_embed.patch_size == (16, 16)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, folder / "vit_giant_patch16.safetensors")
    return folder / "vit_giant_patch16.safetensors"



@pytest.mark.slow
@pytest.mark.timeout(900)
def test_lacwm_paper_commands_on_a_timm_vit_giant_file(outside, tmp_path):
    """`embodied train lacwm experiment=lacwm_paper model.encoder_path=<timm ViT-g/16 .safetensors>` (the frozen
    timm encoder in the IDM, temporal attention, bf16, gradient checkpointing) for 2 pretraining steps and one per
    adaptation stage on tiny recorded data, then the documented `embodied eval lacwm ...` on the result; the user's
    weights file stays byte-identical and nothing is written next to it."""
    weights = timm_vit_giant_file(tmp_path / "weights")
    before = folder_digest(weights.parent)
    yaml = REPO / "configs/experiment/lacwm_paper.yaml"
    evals = [c for c in documented_commands(yaml) if c[:2] == ["embodied", "eval"]]
    assert evals, "lacwm_paper.yaml documents no `embodied eval lacwm ...` command"
    paths = {"model.encoder_path": str(weights)}
    kwargs = "{" + ",".join(f"{k}:{v}" for k, v in VIT_G_TINY.items()) + "}"
    shrink = ["model.image_size=32", "model.patch_size=16", f"model.encoder_kwargs={kwargs}", "model.width=32",
              "model.num_heads=2", "model.idm_depth=1", "model.fdm_depth=1", "model.latent_dim=8",
              "model.latent_tokens=2", "model.action_hidden=32", "model.aug_shift=2", "model.frame_skip=1",
              "model.adapt.stage_steps=[1,1,1]", "model.adapt.lora_rank=2", "model.adapt.projector_hidden=16",
              "model.adapt.batch_size=2", f"data.root={tmp_path / 'data'}", "data.image_size=32",
              "data.num_pretrain_embodiments=1", "data.episodes=1", "data.adapt_episodes=1", "data.test_episodes=1",
              "data.max_steps=12", "data.plan_episodes=1", "data.plan_max_steps=4", f"out_dir={tmp_path / 'run'}",
              *FAST]
    run_cli([*substitute(train_command(yaml), **paths)[1:], *shrink], outside)
    run_cli([*substitute(evals[0], **paths)[1:], *shrink], outside)
    run = tmp_path / "run"
    cfg = json.loads(next(run.rglob("config.json")).read_text())
    assert cfg["model"]["encoder"] == "timm:vit_giant_patch16_gap_224" and cfg["model"]["temporal_attention"]
    assert Path(cfg["model"]["encoder_path"]).resolve() == weights.resolve()  # referenced, not copied
    result = json.loads((run / "eval.json").read_text())
    assert set(result["rollout"]) >= {"model", "shuffled", "copy_last"} and "probe" in result
    assert folder_digest(weights.parent) == before


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_flexforcing_paper_command_on_a_wan21_pipeline_folder(outside, tmp_path):
    """`embodied train flexforcing experiment=flexforcing_paper model.base_path=<Wan2.1-T2V-1.3B pipeline folder>`
    on a folder at Wan2.1's real structure (30 blocks, 12 heads, text width 4096; its VAE: 8x space, 4x time),
    shrunk widths, written by diffusers' save_pretrained — rectangular frames, latent frames counted as Wan's VAE
    makes them — for 2 steps, then the documented `embodied infer video` on the run; the folder stays
    byte-identical and the checkpoint records the Wan configs it rebuilds from."""
    from tests.perception.video.conftest import save_wan_pipeline

    base = save_wan_pipeline(tmp_path / "Wan2.1-T2V-1.3B-Diffusers")
    before = folder_digest(base)
    yaml = REPO / "configs/experiment/flexforcing_paper.yaml"
    argv = substitute(train_command(yaml), **{"model.base_path": str(base)})
    shrink = ["model.frame_size=[16,32]", "data.size=[16,32]", "model.num_frames=3", "model.max_context=1",
              "data.render_n=2", "data.render_frames=9", "data.test_n=1", "data.test_frames=9", "data.eval_frames=9",
              "data.root=clips", "data.test_root=clips_test", *FAST]
    run_cli([*argv[1:], *shrink], outside)
    run = outside / "outputs/flexforcing_paper"
    cfg = json.loads((run / "checkpoints" / "latest" / "config.json").read_text()
                     if (run / "checkpoints" / "latest").is_dir() else (run / "config.json").read_text())
    model = cfg["model"]
    assert model["transformer_config"]["num_layers"] == 30 and model["transformer_config"]["text_dim"] == 4096
    assert model["vae_config"]["temperal_downsample"] == [False, True, True] and model["frame_size"] == [16, 32]
    infer = [c for c in documented_commands(yaml) if c[:3] == ["embodied", "infer", "video"]][0]
    infer = [a if a != "81" else "9" for a in infer]
    run_cli(infer[1:], outside)
    from core.data.video import read_frames

    frames = read_frames(outside / "clip.mp4", 0, 9)
    assert frames.shape[0] == 9 and frames.shape[1:3] == (16, 32)
    assert folder_digest(base) == before
