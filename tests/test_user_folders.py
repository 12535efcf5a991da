"""A user's folder is never written (issue 29, item 2): every ``*_path`` option of every registered method.

The options are found by introspection (each method's model / data schemas, through the registry's config modules),
so a new ``*_path`` field fails ``test_every_path_option_has_a_fixture`` until this file knows how to build such a
folder the upstream way and how the method opens it. Each fixture writes the folder (transformers / diffusers /
timm ``save_pretrained`` or ``save_file``, or a copy of a shipped workspace asset for workspace-format paths), the
method opens it through its own code (load, build, one training step, save its output elsewhere, load that back), and
the folder's tree must be byte-identical after: same files, same contents, nothing added. The paper commands' slow
tests (tests/test_paper_commands.py) check the same for the full CLI runs of Deep-VRM and AutoMoT.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import torch

from core.testing import folder_digest
from tests.test_paper_commands import save_qwen_folder


def path_options() -> set[tuple[str, str]]:
    """(method, "model.x_path" / "data.x_path") for every ``*_path`` field of every registered method's schemas."""
    from core import config as C
    from core.registry import method_specs

    C._import_config_modules()

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name.endswith("_path"):
                yield prefix + f.name
            if dataclasses.is_dataclass(hints.get(f.name)):
                yield from walk(hints[f.name], prefix + f.name + ".")

    out = set()
    for spec in method_specs():
        for (group, _), node in C._SCHEMAS.items():
            if group in ("model", "data") and node.__module__ in spec.config:
                out |= {(spec.name, key) for key in walk(node, group + ".")}
    return out


# -- folders built the upstream way --------------------------------------------------------------------------------
def qwen2_5_vl(tmp: Path) -> Path:
    from perception.forensics.task import tokenizer_corpus

    return save_qwen_folder(tmp / "Qwen2.5-VL", "qwen2_5_vl", tokenizer_corpus([]) * 3)


def qwen3_vl(tmp: Path) -> Path:
    from driving.automot.configuration_automot import META_ACTIONS, REASON_PROMPT, SYSTEM_PROMPT

    corpus = [SYSTEM_PROMPT, REASON_PROMPT, "change lanes to the left or right", *META_ACTIONS] * 6
    return save_qwen_folder(tmp / "Qwen3-VL", "qwen3_vl", corpus)


def sd_unet(tmp: Path, cross_attention_dim: int = 16) -> Path:
    """An SD-style diffusers UNet folder (4 input channels, no class embedding), ``save_pretrained``."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=8, cross_attention_dim=cross_attention_dim, norm_num_groups=8,
        use_linear_projection=True).save_pretrained(tmp / "unet")
    return tmp / "unet"


def dinov3_hf(tmp: Path) -> Path:
    """A ``DINOv3ViTModel.save_pretrained`` folder with the Hub ViT's structure, shrunk to width 16, 1 layer."""
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    torch.manual_seed(0)
    cfg = DINOv3ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                          patch_size=16, num_register_tokens=4, query_bias=True, key_bias=False, value_bias=True,
                          layerscale_value=1e-5, image_size=224)
    DINOv3ViTModel(cfg).save_pretrained(tmp / "dino")
    return tmp / "dino"


def timm_file(tmp: Path) -> Path:
    """A timm ViT's state dict as one ``.safetensors`` file (timm's own weight-file format)."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, patch_size=8,
                            embed_dim=32, depth=1, num_heads=2)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, tmp / "vit.safetensors")
    return tmp / "vit.safetensors"


def assert_untouched(folder: Path, use) -> None:
    before = folder_digest(folder if folder.is_dir() else folder.parent)
    use()
    after = folder_digest(folder if folder.is_dir() else folder.parent)
    assert after == before, f"{folder} was written: {sorted(set(after) ^ set(before)) or 'contents changed'}"


# -- how each method opens each option ------------------------------------------------------------------------------
def use_deepvrm(tmp: Path) -> None:
    from core.config import TrainerConfig
    from perception.forensics.configuration_deepvrm import DeepVRMDataConfig, DeepVRMModelConfig
    from perception.forensics.modeling_deepvrm import DeepVRM
    from perception.forensics.task import build_detector, ensure_base

    base = qwen2_5_vl(tmp)

    def use():
        cfg = DeepVRMModelConfig(base_path=str(base), image_size=56, inject_layer=16, lora_rank=2, va_lora_rank=2)
        vlm, tok = ensure_base(cfg, DeepVRMDataConfig(size=56), TrainerConfig(device="cpu"))
        det = build_detector(vlm, tok, cfg)
        det.set_stage(2)
        images = torch.rand(2, 3, 56, 56)
        batch = det._batch(images, "Is this image real or fake?", ["fake", "real"])
        loss = det.training_step({**batch, "image": images})["loss"]
        loss.backward()
        det.save_pretrained(tmp / "detector")
        DeepVRM.from_pretrained(tmp / "detector")

    assert_untouched(base, use)


def use_automot(tmp: Path) -> None:
    from core.vlm import load_vlm
    from driving.automot.modeling_automot import DrivingVLA, tiny_config
    from driving.automot.task import build_policy

    base = qwen3_vl(tmp)

    def use():
        mot = {**tiny_config().mot, "n_route": 4, "n_wp": 3, "n_target": 2, "wp_weights": [2.0, 1.0, 1.0]}
        cfg = tiny_config(base_path=str(base), history=1, refiner_steps=0, mot=mot)
        vla = build_policy(cfg, *load_vlm(base))
        assert vla.config.added_tokens  # the tokenizer split the meta-actions: added in memory only
        vla.save_pretrained(tmp / "policy")
        DrivingVLA.from_pretrained(tmp / "policy")

    assert_untouched(base, use)


def use_transnormal(tmp: Path, which: str) -> None:
    from perception.normals.modeling_transnormal import TransNormalModel, tiny_config

    if which == "unet":
        folder, kw = sd_unet(tmp), {}
    elif which == "vae":
        folder = tmp / "vae"
        TransNormalModel(tiny_config()).vae.save_pretrained(folder)
        kw = {}
    else:
        folder = dinov3_hf(tmp)
        kw = {"dino_kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2}}

    def use():
        model = TransNormalModel(tiny_config(**{f"{which}_path": str(folder)}, **kw))
        model.save_pretrained(tmp / "out")
        TransNormalModel.from_pretrained(tmp / "out")

    assert_untouched(folder, use)


def use_flexforcing(tmp: Path, option: str) -> None:
    from perception.video.modeling_flexforcing import FlexForcingModel, tiny_config
    from tests.perception.video.conftest import TINY_WAN, TINY_WAN_VAE, save_wan_pipeline

    pipe = save_wan_pipeline(tmp / "Wan", TINY_WAN, TINY_WAN_VAE)  # diffusers Wan transformer/ + vae/ folders
    folder = pipe if option == "base_path" else pipe / "vae"

    def use():
        model = FlexForcingModel(tiny_config(**{option: str(folder)}))
        model.set_latent_stats(torch.rand(2, 3, 3, 16, 16))
        model.save_pretrained(tmp / "out")
        FlexForcingModel.from_pretrained(tmp / "out")

    assert_untouched(folder, use)


def use_flexforcing_start(tmp: Path, option: str) -> None:
    """``init_path`` / ``teacher_path``: a Flex-Forcing model folder of the user's (``save_pretrained``), read to
    start from (any objective) or as the Self-Forcing arm's frozen teacher."""
    from perception.video.modeling_flexforcing import FlexForcingModel, tiny_config

    torch.manual_seed(0)
    start = FlexForcingModel(tiny_config())
    start.set_latent_stats(torch.rand(2, 3, 3, 16, 16))
    folder = start.save_pretrained(tmp / "flex_start")
    extra = {"objective": "self_forcing"} if option == "teacher_path" else {}

    def use():
        model = FlexForcingModel(tiny_config(**{option: str(folder)}, **extra))
        model.save_pretrained(tmp / "out")
        FlexForcingModel.from_pretrained(tmp / "out")

    assert_untouched(folder, use)


def use_lacwm(tmp: Path, conditioning: str) -> None:
    from worldmodels.lacwm.configuration_lacwm import EACWMConfig, LACWMConfig
    from worldmodels.lacwm.modeling_lacwm import PatchCodec, PretrainedFrameEncoder

    file = timm_file(tmp)

    def use():
        cls = LACWMConfig if conditioning == "latent" else EACWMConfig
        cfg = cls(encoder="timm:vit_tiny_patch16_224", encoder_path=str(file), image_size=32, patch_size=8,
                  encoder_kwargs={"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2})
        enc = PretrainedFrameEncoder(cfg.encoder.removeprefix("timm:"), cfg.encoder_path,
                                     PatchCodec(cfg.image_size, cfg.patch_size), dict(cfg.encoder_kwargs))
        assert enc.num_tokens == 16 and enc.dim == 32

    assert_untouched(file, use)


def use_fera(tmp: Path) -> None:
    from perception.adapters.latent import is_diffusers_base

    folder = sd_unet(tmp, cross_attention_dim=32)
    assert_untouched(folder, lambda: is_diffusers_base(folder))


def use_fera_vae(tmp: Path) -> None:
    from perception.adapters.latent import resolve_base
    from perception.normals.modeling_transnormal import TransNormalModel, tiny_config

    unet, vae = sd_unet(tmp, cross_attention_dim=32), tmp / "vae"
    TransNormalModel(tiny_config()).vae.save_pretrained(vae)  # a diffusers AutoencoderKL folder
    before = folder_digest(unet)
    assert_untouched(vae, lambda: resolve_base(unet, vae))
    assert folder_digest(unet) == before


def use_tagrpo(tmp: Path, option: str) -> None:
    from perception.i2v_rl.configuration_tagrpo import TAGRPODataConfig, TAGRPOModelConfig
    from perception.i2v_rl.task import build_policy
    from tests.perception.video.conftest import TINY_WAN, TINY_WAN_VAE, save_wan_pipeline

    pipe = save_wan_pipeline(tmp / "Wan", TINY_WAN, TINY_WAN_VAE)  # a user's Wan diffusers folder
    cfg = (TAGRPOModelConfig(base_path=str(pipe), frame_size=32, frames=3) if option == "base_path" else
           TAGRPOModelConfig(base_path=str(pipe / "transformer"), vae_path=str(pipe / "vae"), frame_size=32, frames=3))
    folder = pipe if option == "base_path" else pipe / "vae"
    assert_untouched(folder, lambda: build_policy(cfg, TAGRPODataConfig(), "cpu"))


#: (method, option) -> (fixture kind: what a user's folder is, the fast use). Add a row for a new ``*_path`` option.
FIXTURES = {
    ("deepvrm", "model.base_path"): ("transformers Qwen2.5-VL folder", use_deepvrm),
    ("automot", "model.base_path"): ("transformers Qwen3-VL folder", use_automot),
    ("transnormal", "model.unet_path"): ("diffusers UNet2DConditionModel folder", lambda t: use_transnormal(t, "unet")),
    ("transnormal", "model.vae_path"): ("diffusers AutoencoderKL folder", lambda t: use_transnormal(t, "vae")),
    ("transnormal", "model.dino_path"): ("transformers DINOv3ViTModel folder", lambda t: use_transnormal(t, "dino")),
    ("flexforcing", "model.vae_path"): ("diffusers AutoencoderKLWan folder", lambda t: use_flexforcing(t, "vae_path")),
    ("flexforcing", "model.base_path"): ("diffusers Wan pipeline folder (transformer/ + vae/)",
                                         lambda t: use_flexforcing(t, "base_path")),
    ("flexforcing", "model.init_path"): ("a Flex-Forcing model folder (save_pretrained) to start from",
                                         lambda t: use_flexforcing_start(t, "init_path")),
    ("flexforcing", "model.teacher_path"): ("a Flex-Forcing model folder (save_pretrained): Self-Forcing's teacher",
                                            lambda t: use_flexforcing_start(t, "teacher_path")),
    ("lacwm", "model.encoder_path"): ("timm .safetensors file", lambda t: (use_lacwm(t, "latent"),
                                                                          use_lacwm(t / "e", "explicit"))),
    ("fera", "model.base_path"): ("diffusers UNet2DConditionModel folder", use_fera),
    ("fera", "model.vae_path"): ("diffusers AutoencoderKL folder", use_fera_vae),
    ("tagrpo", "model.base_path"): ("diffusers Wan pipeline folder", lambda t: use_tagrpo(t, "base_path")),
    ("tagrpo", "model.vae_path"): ("diffusers AutoencoderKLWan folder (beside a Wan transformer folder)",
                                   lambda t: use_tagrpo(t, "vae_path")),
}


def test_every_path_option_has_a_fixture():
    found = path_options()
    assert {("deepvrm", "model.base_path"), ("transnormal", "model.dino_path")} <= found  # introspection works
    missing = sorted(found - set(FIXTURES))
    assert not missing, (f"*_path options without a user-folder fixture: {missing}; add a row to FIXTURES in "
                         "tests/test_user_folders.py: a builder that writes such a folder the upstream way "
                         "(save_pretrained / save_file, or a copy of a shipped asset) and a use that opens it "
                         "through the method's own code")
    assert not sorted(set(FIXTURES) - found), "FIXTURES names options that no longer exist"


@pytest.mark.parametrize("option", sorted(FIXTURES), ids=lambda o: f"{o[0]}-{o[1]}")
def test_the_method_leaves_a_user_folder_byte_identical(option, tmp_path):
    tmp_path.joinpath("e").mkdir()
    FIXTURES[option][1](tmp_path)
