"""Exported folders that diffusers / peft open themselves (issue #32 item 3: TransNormal and FeRA).

TransNormal: ``save_pretrained`` writes ``unet/`` and ``vae/`` with diffusers' own ``save_pretrained``; the classes
``UNet2DConditionModel`` / ``AutoencoderKL`` open them and compute exactly what the workspace's model computes.
FeRA: under a frozen routing vector the adapter is a peft LoRA (``fera_to_peft``) that ``PeftModel`` opens.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
SHIPPED_TRANSNORMAL = REPO / "assets" / "checkpoints" / "transnormal"


# -- TransNormal ---------------------------------------------------------------------------------------------
def _tiny_transnormal(tmp_path: Path, **overrides):
    from perception.normals.modeling_transnormal import TransNormalModel, example

    torch.manual_seed(0)
    model = example(tmp_path).build().eval()
    if overrides:
        model = TransNormalModel(dataclasses.replace(model.config, **overrides)).eval()
    with torch.no_grad():  # a non-trivial latent scale, so a VAE folder without it would be caught
        model.latent_scale.fill_(0.37)
    return model


def _rgb(size: int = 32, batch: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (batch, 3, size, size), generator=g, dtype=torch.uint8)


def _upstream_diffs(model, folder: Path, rgb: torch.Tensor) -> dict[str, float]:
    """Max abs differences between the workspace model and diffusers' classes opened on ``folder``'s sub-folders,
    on the same inputs: VAE encode (scaled posterior mode), UNet (latent, t, context, task code), VAE decode, and
    the whole single-step prediction assembled from the upstream parts."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    from perception.normals.modeling_transnormal import task_embedding, to_unit_range

    unet = UNet2DConditionModel.from_pretrained(folder / "unet").eval()
    vae = AutoencoderKL.from_pretrained(folder / "vae").eval()
    sf = vae.config.scaling_factor
    x = to_unit_range(rgb)
    b = x.shape[0]
    out = {}
    with torch.no_grad():
        z_ours, z_up = model.encode(x), vae.encode(x).latent_dist.mode() * sf
        out["vae_encode"] = float((z_ours - z_up).abs().max())
        ctx = model.context(x)  # the context encoder + projector are the workspace's (model.safetensors)
        t = torch.full((b,), model.config.timestep)
        for task in ("normals", "rgb"):
            emb = task_embedding(task, b, x.device, x.dtype)
            ours = model.unet(z_ours, t, encoder_hidden_states=ctx, class_labels=emb).sample
            up = unet(z_ours, t, encoder_hidden_states=ctx, class_labels=emb).sample
            out[f"unet_{task}"] = float((ours - up).abs().max())
        out["vae_decode"] = float((model.decode(ours) - vae.decode(ours / sf).sample).abs().max())
        emb = task_embedding("normals", b, x.device, x.dtype)
        pred = vae.decode(unet(z_up, t, encoder_hidden_states=ctx, class_labels=emb).sample / sf).sample
        out["normals"] = float((F.normalize(pred.float(), dim=1, eps=1e-6) - model(rgb)).abs().max())
    return out


def test_transnormal_export_holds_unet_and_vae_that_diffusers_opens(tmp_path):
    from safetensors import safe_open

    from perception.normals.modeling_transnormal import TransNormalModel

    model = _tiny_transnormal(tmp_path)
    folder = model.save_pretrained(tmp_path / "export")
    for sub in ("unet", "vae"):
        assert sorted(p.name for p in (folder / sub).iterdir()) == ["config.json",
                                                                    "diffusion_pytorch_model.safetensors"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # no tensor stored twice
        assert sorted({k.split(".")[0] for k in f.keys()}) == ["dino", "latent_scale", "projector"]
    from core.pretrained import read_card

    assert set(read_card(folder)["upstream"]) == {"unet", "vae", "model.safetensors"}
    from diffusers import AutoencoderKL

    assert AutoencoderKL.load_config(folder / "vae")["scaling_factor"] == pytest.approx(0.37)
    diffs = _upstream_diffs(model, folder, _rgb())
    print("transnormal tiny export, max abs diff upstream vs workspace:", diffs)
    assert diffs == {k: 0.0 for k in diffs}, diffs
    # the workspace's own load reads the three files back bit-exactly
    loaded = TransNormalModel.from_pretrained(folder)
    assert loaded.loaded_from["upstream"] == ["unet", "vae"]
    sd_a, sd_b = model.state_dict(), loaded.state_dict()
    assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    # weight folders the run was trained from (model.vae_path / unet_path) are not needed: the export's own
    # vae/ and unet/ give the architecture
    import json

    cfg = json.loads((folder / "config.json").read_text())
    cfg["model"]["vae_path"] = cfg["model"]["unet_path"] = str(tmp_path / "moved_away")
    (folder / "config.json").write_text(json.dumps(cfg))
    moved = TransNormalModel.from_pretrained(folder)
    assert (moved.config.vae_path, moved.config.unet_path) == (str(folder / "vae"), str(folder / "unet"))
    assert all(torch.equal(sd_a[k], moved.state_dict()[k]) for k in sd_a)


def test_transnormal_export_writes_the_given_state_dict_and_checks_every_key(tmp_path):
    """An export of other weights than the live module's (an EMA copy) puts those in unet/ and vae/; a folder
    missing a UNet tensor is refused with the key named."""
    from diffusers import UNet2DConditionModel

    from core.errors import CheckpointError
    from perception.normals.modeling_transnormal import TransNormalModel, read_diffusers_weights

    model = _tiny_transnormal(tmp_path)
    ema = {k: (v + 0.5 if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    folder = model.save_pretrained(tmp_path / "ema", state_dict=ema)
    unet = UNet2DConditionModel.from_pretrained(folder / "unet")
    for k, v in unet.state_dict().items():
        assert torch.equal(v, ema["unet." + k]), k
    loaded = TransNormalModel.from_pretrained(folder)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in ema.items())
    from core.checkpoint import save_weights

    sd = read_diffusers_weights(folder / "unet")
    sd.pop("conv_in.weight")
    save_weights(sd, folder / "unet" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(CheckpointError, match="unet.conv_in.weight"):
        TransNormalModel.from_pretrained(folder)


def test_transnormal_diffusion_mode_export_and_vae_path_to_an_export(tmp_path):
    """The multi-step baseline's 8-channel UNet opens too; ``model.vae_path`` may name an export (its ``vae/``)."""
    from diffusers import UNet2DConditionModel

    from perception.normals.modeling_transnormal import TransNormalModel

    model = _tiny_transnormal(tmp_path, mode="diffusion")
    folder = model.save_pretrained(tmp_path / "diffusion")
    unet = UNet2DConditionModel.from_pretrained(folder / "unet").eval()
    assert unet.config.in_channels == 2 * model.config.latent_channels
    g = torch.Generator().manual_seed(1)
    sample = torch.randn(2, unet.config.in_channels, 16, 16, generator=g)
    ctx = torch.randn(2, 5, model.config.cross_attention_dim, generator=g)
    with torch.no_grad():
        want = model.denoise(sample, torch.tensor([10, 500]), ctx)
        from perception.normals.modeling_transnormal import task_embedding

        got = unet(sample, torch.tensor([10, 500]), encoder_hidden_states=ctx,
                   class_labels=task_embedding("normals", 2, sample.device, sample.dtype)).sample
    assert float((want - got).abs().max()) == 0.0
    # a new model whose VAE comes from the export (its vae/ folder, scale included)
    other = TransNormalModel(dataclasses.replace(model.config, vae_path=str(folder), mode="single_step"))
    assert float(other.latent_scale) == pytest.approx(0.37)
    assert all(torch.equal(a, b) for a, b in zip(other.vae.state_dict().values(), model.vae.state_dict().values(),
                                                 strict=True))


def test_shipped_transnormal_holds_the_upstream_folders():
    """The shipped checkpoint was re-exported in this layout: diffusers opens unet/ and vae/, they compute exactly
    what the workspace's load does, and the card keeps its metrics."""
    from core.pretrained import read_card
    from perception.normals.modeling_transnormal import TransNormalModel

    model = TransNormalModel.from_pretrained(SHIPPED_TRANSNORMAL)
    assert model.loaded_from["upstream"] == ["unet", "vae"]
    card = read_card(SHIPPED_TRANSNORMAL)
    assert card["metrics"]["glass_mean_angular_error_deg"] == 36.07 and card["metrics"]["within_11.25_deg"] == 0.271
    assert "unet" in card["upstream"] and "vae" in card["upstream"]
    diffs = _upstream_diffs(model, SHIPPED_TRANSNORMAL, _rgb(size=64, batch=1))
    print("shipped transnormal, max abs diff upstream vs workspace:", diffs)
    assert diffs == {k: 0.0 for k in diffs}, diffs


# -- FeRA ----------------------------------------------------------------------------------------------------
SHIPPED_FERA = REPO / "assets" / "checkpoints" / "fera"


def _fera_base(tmp_path: Path) -> Path:
    from perception.adapters.modeling_fera import example

    example(tmp_path)  # writes the contract test's tiny pixel base (a seeded FlowDenoiser) once
    return tmp_path / "fera_base"


def _xt():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, 8, 8, generator=g), torch.tensor([0.25, 0.75])


def _with_peft(base: Path, adapter: Path):
    """The base pixel denoiser with its diffusers backbone wrapped by peft's own loader."""
    from peft import PeftModel

    from perception.adapters.backbones import load_denoiser

    fresh = load_denoiser(base)
    fresh.backbone = PeftModel.from_pretrained(fresh.backbone, str(adapter)).eval()
    return fresh.eval()


@pytest.mark.parametrize("kind", ["lora", "dora", "uniform", "fourierft", "waveft"])
def test_fera_arm_exports_a_peft_adapter_folder(tmp_path, kind):
    """The lora / dora / fourierft / waveft arms and uniformly routed FeRA write adapter/, which ``PeftModel.from_pretrained`` opens on
    the un-adapted backbone with the same outputs as the workspace's own load."""
    from perception.adapters.configuration_fera import AdaptedDenoiserConfig, AdapterConfig
    from perception.adapters.modeling_fera import AdaptedDenoiser

    base = _fera_base(tmp_path)
    if kind == "uniform":
        adapter = AdapterConfig(name="fera_norouter", kind="fera", rank=2, num_experts=2, alpha=4.0,
                                kappa_divisor=8.0, router_hidden=8, routing="uniform")
    else:
        adapter = AdapterConfig(name=kind, kind=kind, rank=4, alpha=4.0)
    torch.manual_seed(0)
    model = AdaptedDenoiser(AdaptedDenoiserConfig(base_path=str(base), adapter=adapter)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "_spectrum" in name:
                p.normal_(0.0, 0.2)
    folder = model.save_pretrained(tmp_path / "export")
    assert sorted(p.name for p in (folder / "adapter").iterdir()) == ["adapter_config.json",
                                                                      "adapter_model.safetensors"]
    from core.pretrained import read_card

    assert "PeftModel.from_pretrained" in read_card(folder)["upstream"]["adapter"]
    ours = AdaptedDenoiser.from_pretrained(folder)
    x_t, t = _xt()
    with torch.no_grad():
        want = ours(x_t, t)
        got = _with_peft(base, folder / "adapter")(x_t, t)
    diff = float((want - got).abs().max())
    print(f"fera arm {kind}: PeftModel vs workspace load, max abs diff {diff:.3g}")
    assert diff < 1e-5, diff
    from perception.adapters.backbones import load_denoiser

    with torch.no_grad():  # the adapter is not a no-op, so the comparison above can fail
        assert float((load_denoiser(base)(x_t, t) - want).abs().max()) > 1e-3
    # an export of other weights (an EMA copy) writes those into adapter/
    from core.checkpoint import load_weights

    ema = {k: v + 1.0 for k, v in model.trained_state_dict().items()}
    written = load_weights(model.save_pretrained(tmp_path / "ema", state_dict=ema) / "adapter" /
                           "adapter_model.safetensors")
    if kind in ("fourierft", "waveft"):  # peft's key: <layer>.<kind>_spectrum (ours: ... .default)
        s_keys = sorted(k for k in written if "_spectrum" in k)
        assert s_keys and all(torch.equal(written[k], ema["denoiser.backbone." + k.removeprefix("base_model.model.")
                                                         + ".default"]) for k in s_keys)
        return
    a_keys = sorted(k for k in written if ".lora_A." in k)
    assert a_keys and all(torch.equal(written[k], ema["denoiser.backbone." + k.removeprefix("base_model.model.")
                                                     .replace(".lora_A.weight", ".lora_A" + (
                                                         "" if kind == "uniform" else ".default.weight"))])
                          for k in a_keys)


def test_soft_routed_fera_has_no_peft_folder_but_a_frozen_routing_is_one(tmp_path):
    """The shipped FeRA arm (trained, soft router): its export names why there is no adapter/; with a frozen routing
    vector, ``fera_to_peft`` writes a peft LoRA that ``PeftModel`` runs to the same outputs."""
    from core.errors import ConfigError
    from perception.adapters.fera import fera_to_peft, fixed_routing
    from perception.adapters.modeling_fera import AdaptedDenoiser

    model = AdaptedDenoiser.from_pretrained(SHIPPED_FERA / "fera")
    backbone = model.denoiser.backbone
    with pytest.raises(ConfigError, match="input-dependent"):
        fera_to_peft(backbone, tmp_path / "no")
    folder = model.save_pretrained(tmp_path / "export", copy_base=True)
    from core.pretrained import read_card

    assert not (folder / "adapter").exists()
    assert "no peft equivalent" in read_card(folder)["upstream"]["model.safetensors"]
    routing = [0.2, 0.5, 0.3]
    fera_to_peft(backbone, tmp_path / "peft", routing)
    fixed_routing(backbone, routing)
    g = torch.Generator().manual_seed(0)
    x_t, t = torch.randn(2, 3, 32, 32, generator=g), torch.tensor([0.1, 0.9])
    with torch.no_grad():
        want = model(x_t, t)
        got = _with_peft(SHIPPED_FERA / "fera" / "base", tmp_path / "peft")(x_t, t)
        fixed_routing(backbone, None)
        soft = model(x_t, t)
    diff = float((want - got).abs().max())
    print(f"shipped fera arm, routing {routing}: PeftModel vs FeRA with that routing, max abs diff {diff:.3g}; "
          f"vs soft routing {float((soft - got).abs().max()):.3g}")
    assert diff < 1e-5
    assert float((soft - got).abs().max()) > 10 * max(diff, 1e-7)  # the frozen vector is not the router's choice
