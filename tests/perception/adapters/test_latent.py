"""FeRA on a user's diffusers base in its latent space: the router's latent layouts, the base's objective, the
folders it reads (never writes), gradient checkpointing, and train / eval / infer on SD2-, DiT- and Wan-structured
bases written by diffusers' own ``save_pretrained`` (shrunk widths, random weights)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.config import compose
from core.errors import ConfigError
from perception.adapters.fera import FeRAConfig, FeRARouter, apply_fera, router_of
from perception.adapters.latent import Objective

REPO = Path(__file__).resolve().parents[3]


# -- tiny bases at the real structures, written with diffusers' save_pretrained --------------------------------
def sd2_unet():
    """Stable Diffusion 2 structure (3 cross-attention levels + a plain one, 2 layers per block, linear
    projections, 4 latent channels), widths shrunk."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(32, 32, 64, 64),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, attention_head_dim=(2, 2, 4, 4),
        cross_attention_dim=32, use_linear_projection=True)


def sd_vae():
    """SD's AutoencoderKL structure (4 levels: 8x down, 4 latent channels), widths shrunk."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 32, 32),
                         layers_per_block=1, latent_channels=4, sample_size=64)


def wan_transformer():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                 out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2,
                                 rope_max_seq_len=32)


def wan_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, attn_scales=[],
                            temperal_downsample=[True], latents_mean=[0.1, -0.2, 0.0, 0.3],
                            latents_std=[1.5, 0.8, 1.0, 2.0])


def save_sd2_pipeline(folder: Path) -> Path:
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    torch.manual_seed(0)
    sched = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                          prediction_type="epsilon", clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    StableDiffusionPipeline(vae=sd_vae(), text_encoder=None, tokenizer=None, unet=sd2_unet(), scheduler=sched,
                            safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(folder)
    return folder


def save_dit_folders(root: Path) -> tuple[Path, Path]:
    """A DiT (learned sigma, 1000 classes + the null class) and its VAE, as two model folders."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
                          sample_size=8, patch_size=2, num_embeds_ada_norm=1000).save_pretrained(root / "dit")
    sd_vae().save_pretrained(root / "sd-vae")
    return root / "dit", root / "sd-vae"


def save_wan_pipeline(folder: Path) -> Path:
    from diffusers import UniPCMultistepScheduler, WanPipeline

    torch.manual_seed(0)
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    WanPipeline(tokenizer=None, text_encoder=None, transformer=wan_transformer(), vae=wan_vae(),
                scheduler=sched).save_pretrained(folder)
    return folder


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder``: a file's bytes, a folder as None."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's downloads: an SD2 pipeline folder, a DiT + VAE model folder pair, a Wan pipeline folder."""
    root = tmp_path_factory.mktemp("user_weights")
    sd2 = save_sd2_pipeline(root / "sd2")
    dit, vae = save_dit_folders(root)
    wan = save_wan_pipeline(root / "wan")
    return {"root": root, "sd2": sd2, "dit": dit, "vae": vae, "wan": wan, "before": snapshot(root)}


# -- the router reads every latent layout ---------------------------------------------------------------------
def _router(layout: str = "auto", seed: int = 0) -> FeRARouter:
    torch.manual_seed(seed)
    return FeRARouter(FeRAConfig(num_bands=3, kappa=1.0, video_layout=layout))


def test_same_content_routes_the_same_in_every_layout():
    g = torch.Generator().manual_seed(0)
    clip = torch.randn(2, 4, 5, 8, 8, generator=g)  # (B, C, F, H, W); frames of different noise levels
    clip = clip * torch.linspace(0.1, 2.0, 5).view(1, 1, 5, 1, 1) + torch.linspace(-1, 1, 8).view(1, 1, 1, 1, 8)
    bcfhw, ntchw = _router("bcfhw"), _router("ntchw")
    ntchw.load_state_dict(bcfhw.state_dict())
    want = bcfhw.route(clip)
    torch.testing.assert_close(ntchw.route(clip.transpose(1, 2).contiguous()), want, rtol=0, atol=0)
    auto = _router("auto")
    auto.load_state_dict(bcfhw.state_dict())
    auto.in_channels = 4  # channel count tells the axes apart
    torch.testing.assert_close(auto.route(clip), want, rtol=0, atol=0)
    torch.testing.assert_close(auto.route(clip.transpose(1, 2).contiguous()), want, rtol=0, atol=0)
    # reading a channels-first clip as frames-first (the old router) routes it differently
    assert not torch.allclose(ntchw.route(clip), want, atol=1e-4)


def test_image_and_a_clip_of_that_image_route_identically():
    img = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    r = _router("auto")
    want = r.route(img)
    r.in_channels = 4
    for clip in (img[:, :, None].expand(-1, -1, 3, -1, -1), img[:, None].expand(-1, 3, -1, -1, -1)):
        torch.testing.assert_close(r.route(clip.contiguous()), want, rtol=1e-6, atol=1e-7)


def test_auto_layout_falls_back_to_the_model_kind_when_channels_cannot_tell():
    from perception.adapters.fera import _default_layout

    r = _router("auto")
    r.in_channels = 4
    assert r.layout_of((2, 4, 4, 8, 8)) == "ntchw"  # ambiguous: the workspace's frames-first default
    r.default_layout = "bcfhw"
    assert r.layout_of((2, 4, 4, 8, 8)) == "bcfhw"
    assert r.layout_of((2, 5, 4, 8, 8)) == "ntchw" and r.layout_of((2, 4, 5, 8, 8)) == "bcfhw"
    assert _default_layout(wan_transformer()) == "bcfhw" and _default_layout(torch.nn.Linear(2, 2)) == "ntchw"
    with pytest.raises(ConfigError, match="video_layout"):
        FeRAConfig(video_layout="tchw")


def test_wan_forward_routes_its_channels_first_latent_per_frame():
    """The pre-hook on a Wan transformer reads (B, C, F, H, W) with C = 4 = F: the class decides (channels first);
    the weights equal those of the same clip given frames-first to an explicit router."""
    torch.manual_seed(0)
    model = wan_transformer().eval()
    apply_fera(model, FeRAConfig(num_bands=3, kappa=1.0))
    x = torch.randn(2, 4, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    x = x * torch.linspace(0.2, 1.5, 4).view(1, 1, 4, 1, 1)
    with torch.no_grad():
        model(hidden_states=x, timestep=torch.tensor([100.0, 700.0]), encoder_hidden_states=torch.randn(2, 3, 16))
    ref = _router("ntchw")
    ref.load_state_dict(router_of(model).state_dict())
    torch.testing.assert_close(router_of(model).weights, ref.route(x.transpose(1, 2).contiguous()), rtol=0, atol=0)


# -- the objective --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["flow", "epsilon", "v_prediction"])
def test_objective_round_trips_and_matches_the_ddpm_schedule(kind):
    from perception.adapters.latent import _betas

    ab = torch.cumprod(1 - _betas("scaled_linear", 0.00085, 0.012, 1000), 0)
    obj = Objective(kind, 1.0, None if kind == "flow" else ab)
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(3, 4, 8, 8, generator=g), torch.randn(3, 4, 8, 8, generator=g)
    t = torch.tensor([0.05, 0.5, 0.95])
    x_t, target = obj.noisy(x0, eps, t), obj.target(x0, eps, t)
    rx0, reps = obj.split(target, x_t, t)  # a perfect prediction gives back x0 and eps
    torch.testing.assert_close(rx0, x0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(reps, eps, rtol=1e-4, atol=1e-4)
    a, s = obj.coeffs(torch.tensor([0.0, 999 / 999]))
    if kind == "flow":
        assert a.tolist() == [1.0, 0.0] and s.tolist() == [0.0, 1.0]
        # DDIM on the flow parametrisation is the Euler step
        v = torch.randn(3, 4, 8, 8, generator=g)
        t2 = torch.tensor([0.3, 0.3, 0.3])
        torch.testing.assert_close(obj.noisy(*obj.split(v, x_t, t), t2), x_t + (t2 - t).view(-1, 1, 1, 1) * v)
    else:
        torch.testing.assert_close(a ** 2, ab[[0, 999]].float())
        assert obj.timestep(torch.tensor([1.0])).item() == 999


def test_objective_comes_from_the_pipeline_scheduler(user, tmp_path):
    from perception.adapters.latent import resolve_base

    sd2 = Objective.for_base(resolve_base(user["sd2"]))
    assert sd2.kind == "epsilon" and sd2.train_steps == 1000
    wan = Objective.for_base(resolve_base(user["wan"]))
    assert (wan.kind, wan.shift) == ("flow", 3.0)
    dit = Objective.for_base(resolve_base(user["dit"], user["vae"]))  # no pipeline: DiT's linear betas
    assert dit.kind == "epsilon" and abs(float(dit.coeffs(torch.tensor([1.0]))[0]) ** 2 - 4.04e-5) < 1e-5
    assert Objective.for_base(resolve_base(user["sd2"]), "v_prediction").kind == "v_prediction"


# -- the folders ------------------------------------------------------------------------------------------------
def test_resolve_base_finds_the_vae_the_way_users_download(user, tmp_path):
    from perception.adapters.latent import is_diffusers_base, resolve_base

    b = resolve_base(user["sd2"])
    assert (b.model_dir, b.vae_dir, b.kind, b.pipeline_dir) == (user["sd2"] / "unet", user["sd2"] / "vae", "unet",
                                                                user["sd2"])
    assert resolve_base(user["sd2"] / "unet").vae_dir == user["sd2"] / "vae"  # the unet/ inside a pipeline
    assert resolve_base(user["wan"]).kind == "wan" and resolve_base(user["dit"], user["vae"]).kind == "dit"
    with pytest.raises(ConfigError, match="model.vae_path") as e:
        resolve_base(user["dit"])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="not a diffusers"):
        resolve_base(user["dit"], user["dit"])
    assert not is_diffusers_base(tmp_path) and is_diffusers_base(user["wan"] / "transformer")


# -- the adapted model in latent space ---------------------------------------------------------------------------
def _adapted(base: Path, vae: Path | str = "", kind: str = "fera", **latent):
    from perception.adapters.configuration_fera import AdaptedDenoiserConfig, AdapterConfig, LatentSettings
    from perception.adapters.modeling_fera import AdaptedDenoiser

    adapter = AdapterConfig(kind=kind, rank=2, num_experts=2, kappa_divisor=8.0, router_hidden=8) \
        if kind == "fera" else AdapterConfig(kind=kind, rank=4)
    return AdaptedDenoiser(AdaptedDenoiserConfig(base_path=str(base), vae_path=str(vae), adapter=adapter,
                                                 latent=LatentSettings(**latent)))


CASES = {"sd2": dict(image_size=64), "dit": dict(image_size=64), "wan": dict(image_size=32, frames=5)}


def _case(user, name):
    base, vae = (user["dit"], user["vae"]) if name == "dit" else (user[name], "")
    return base, vae, CASES[name]


@pytest.mark.parametrize("name", ["sd2", "dit", "wan"])
def test_latent_round_trip_and_zero_init_equals_the_base(user, name):
    base, vae, latent = _case(user, name)
    model = _adapted(base, vae, **latent)
    d = model.denoiser
    shape = d.latent_shape(latent["image_size"], latent.get("frames", 1))
    pixels = torch.randint(0, 256, (2, 3, *([latent["frames"]] if "frames" in latent else []), latent["image_size"],
                                    latent["image_size"]), dtype=torch.uint8)
    z = d.encode(pixels)
    assert tuple(z.shape[1:]) == shape and d.decode(z).shape == pixels.shape
    x_t, t, target = d.noisy_batch(z, torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(x_t, t)
        with model.base_pass():
            assert torch.equal(model(x_t, t), out)  # B = 0: the adapter is the identity at init
    assert out.shape == target.shape == z.shape
    loss = model.training_step({"latent": z})
    assert torch.isfinite(loss["loss"]) and "fecl" in loss
    loss["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)
    assert not any(p.requires_grad for p in d.vae.parameters())
    assert all(k.startswith("denoiser.backbone.") for k in model.state_dict())  # the VAE is not in the state


@pytest.mark.parametrize("name,kind", [("sd2", "fera"), ("dit", "fera"), ("wan", "fera"), ("sd2", "lora")])
def test_gradient_checkpointing_gives_the_same_gradients(user, name, kind):
    base, vae, latent = _case(user, name)
    z = None
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)  # the same experts' A and router at init
        model = _adapted(base, vae, kind, **latent).train()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.requires_grad and "lora_B" in n:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(n)))
        if ckpt:
            model.enable_gradient_checkpointing()
            assert model.denoiser.backbone.is_gradient_checkpointing
        if z is None:
            z = torch.randn(2, *model.denoiser.latent_shape(latent["image_size"], latent.get("frames", 1)),
                            generator=torch.Generator().manual_seed(0))
        torch.manual_seed(3)
        model.training_step({"latent": z})["loss"].backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-4, atol=1e-6)


def test_prompt_embeds_file_is_used_and_checked(user, tmp_path):
    from core.checkpoint import save_weights

    emb = torch.randn(5, 32)
    save_weights({"prompt_embeds": emb}, tmp_path / "p.safetensors")
    model = _adapted(user["sd2"], image_size=64, prompt_embeds=str(tmp_path / "p.safetensors"))
    assert torch.equal(model.denoiser.context[0], emb) and "file" in model.denoiser.prompt_source
    fixed = _adapted(user["sd2"], image_size=64, prompt_tokens=7).denoiser
    assert fixed.context.shape == (1, 7, 32) and "no text encoder" in fixed.prompt_source
    assert fixed.context[0].std(0).min() > 0  # distinct tokens: cross-attention's q / k get gradient
    save_weights({"prompt_embeds": torch.randn(5, 16)}, tmp_path / "bad.safetensors")
    with pytest.raises(ConfigError, match="expected"):
        _adapted(user["sd2"], image_size=64, prompt_embeds=str(tmp_path / "bad.safetensors"))
    assert _adapted(user["dit"], user["vae"], image_size=64).denoiser.class_label == 1000  # DiT's null class


# -- the CLI: train / eval / infer on each base; the user's folders stay byte-identical ---------------------------
def small(out: Path, *extra: str) -> list[str]:
    return ["experiment=fera_paper", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.ckpt_every=2",
            "trainer.progress=false", "data.shots=4", "data.test_n=4", "data.curve_n=4", "data.eval_every=2",
            "data.fd_samples=4", "model.sample_steps=2", f"out_dir={out}", *extra]


@pytest.mark.parametrize("name", ["sd2", "dit", pytest.param("wan", marks=pytest.mark.slow)])  # wan: ~25 s
def test_train_eval_infer_on_a_user_base_leave_it_untouched(user, tmp_path, name):
    import json

    from core.pretrained import load_pretrained
    from perception.adapters import cli, task

    base, vae, latent = _case(user, name)
    extra = [f"model.base_path={base}", f"model.image_size={latent['image_size']}",
             f"model.frames={latent.get('frames', 1)}"] + ([f"model.vae_path={vae}"] if vae else [])
    cfg = compose(small(tmp_path / "run", *extra))
    result = task.train(cfg)
    assert result["step"] == 2 and result["trainable_parameters"] > 0
    out = task.evaluate(cfg)
    assert out["fd"] >= 0 and set(out["heldout_loss"]) >= {"t0.1", "mean"} and out["base"]["fd"] >= 0
    assert len(out["routing_by_level"]["t0.5"]) == 3
    curve = json.loads((tmp_path / "run" / "curve.json").read_text())
    assert [p["step"] for p in curve] == [0, 2]
    assert curve[0]["mean"] == pytest.approx(out["base"]["heldout_loss"]["mean"], rel=1e-5)  # step 0 = the base
    exported = json.loads((tmp_path / "run" / "adapter" / "config.json").read_text())["model"]
    assert Path(exported["base_path"]) == base.absolute() and exported["latent"]["image_size"] == latent["image_size"]
    args = argparse.Namespace(run=str(tmp_path / "run"), out=str(tmp_path / "s"), n=2, seed=0, steps=2, base=False)
    assert cli.infer(args) == 0 and len(list((tmp_path / "s" / "samples").iterdir())) == 2
    z = torch.randn(1, *task.load_adapted(tmp_path / "run").denoiser.latent_shape(latent["image_size"],
                                                                              latent.get("frames", 1)))
    with torch.no_grad():  # the export and the newest checkpoint rebuild the same model
        a, b = load_pretrained(tmp_path / "run" / "adapter"), load_pretrained(tmp_path / "run")
        torch.testing.assert_close(a(z, torch.tensor([0.4])), b(z, torch.tensor([0.4])))
    assert snapshot(user["root"]) == user["before"]  # nothing written, added or removed in the user's folders


def test_a_user_folder_is_never_a_pretraining_target(user, tmp_path):
    """The pixel path pretrains into model.pretrain_dir (default outputs/fera/base_<kind>_<size>), never into a folder it did not
    make; a missing base_path is a one-line error instead of a new pretraining folder."""
    from perception.adapters import task

    cfg = compose(["experiment=fera", "debug=tiny", "model=fera_unet_tiny", f"model.pretrain_dir={user['sd2']}",
                   f"out_dir={tmp_path / 'r'}"])
    with pytest.raises(ConfigError, match="not a base run"):
        task.train(cfg)
    cfg = compose(["experiment=fera", "debug=tiny", "model=fera_unet_tiny", f"model.base_path={tmp_path / 'nope'}",
                   f"out_dir={tmp_path / 'r2'}"])
    with pytest.raises(ConfigError, match="no such folder"):
        task.train(cfg)
    assert not (tmp_path / "nope").exists() and snapshot(user["root"]) == user["before"]
    # the default is one shared workspace base per backbone and size (the arms pretrain it once); empty: per run
    assert task.pretrain_dir(compose(["experiment=fera"]).model, tmp_path / "o") == Path("outputs/fera/base_unet_32")
    assert task.pretrain_dir(compose(["experiment=fera", "model.pretrain_dir="]).model, tmp_path / "o") \
        == tmp_path / "o" / "base"


def _embodied(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sd2", "wan"])
def test_paper_command_as_documented_on_a_user_folder(tmp_path, name):
    """The README's paper commands (experiment=fera_paper), run from a folder outside the repository on a user's
    pipeline folder written by diffusers' save_pretrained, shrunk to 2 steps and a small resolution."""
    user = tmp_path / "weights"
    (save_sd2_pipeline if name == "sd2" else save_wan_pipeline)(user)
    before = snapshot(user)
    work = tmp_path / "work"
    work.mkdir()
    size = ["model.image_size=64"] if name == "sd2" else ["model.image_size=32", "model.frames=5"]
    shrink = [a for a in small(Path("unused")) if not a.startswith("out_dir=")] + size
    for verb in ("train", "eval"):
        res = _embodied([verb, "fera", "experiment=fera_paper", f"model.base_path={user}", *shrink[1:]], work)
        assert res.returncode == 0, res.stderr[-3000:]
    run = work / "outputs" / "fera_paper" / "fera_s0"
    assert (run / "adapter" / "model.safetensors").is_file() and (run / "eval.json").is_file()
    res = _embodied(["infer", "fera-samples", "--run", str(run), "--out", str(work / "samples"), "--n", "2",
                     "--steps", "2"], work)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (work / "samples" / "grid.png").is_file()
    assert snapshot(user) == before
