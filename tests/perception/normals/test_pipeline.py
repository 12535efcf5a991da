"""Pipeline: any image size, tiling, single step = one UNet + one decode, N-step sampler = N UNet calls; the
multi-step sampler equals a DDIMScheduler-driven reference loop, and diffusers' Marigold pipeline cannot
condition TransNormal's UNet (why the sampler is the project's own, issue #21)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perception.normals.modeling_transnormal import TransNormalModel, tiny_config
from perception.normals.pipeline_transnormal import TransNormalPipeline, _starts


def _count_calls(module: torch.nn.Module) -> list[int]:
    calls: list[int] = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_single_step_is_one_unet_and_one_decode():
    model = TransNormalModel(tiny_config())
    unet_calls = _count_calls(model.unet)
    decode_calls = []
    orig = model.vae.decode
    model.vae.decode = lambda *a, **k: (decode_calls.append(1), orig(*a, **k))[1]
    pipe = TransNormalPipeline(model)
    out = pipe(torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)).normals
    assert out.shape == (3, 3, 32, 32)
    assert len(unet_calls) == 1 and len(decode_calls) == 1  # one batched pass for the three images
    assert pipe.default_steps == 1


def test_multistep_sampler_calls_the_unet_n_times_and_is_seeded():
    model = TransNormalModel(tiny_config(mode="diffusion"))
    calls = _count_calls(model.unet)
    pipe = TransNormalPipeline(model)
    img = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    a = pipe(img, num_steps=4, seed=1).normals
    assert len(calls) == 4
    b = pipe(img, num_steps=4, seed=1).normals
    c = pipe(img, num_steps=4, seed=2).normals
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert pipe.default_steps == model.config.inference_steps
    # the DDIM scheduler is built once and reused: another step count in between changes nothing
    sched = pipe._ddim_scheduler()
    pipe(img, num_steps=2, seed=1)
    assert pipe._ddim_scheduler() is sched
    assert torch.equal(pipe(img, num_steps=4, seed=1).normals, a)
    assert torch.equal(TransNormalPipeline(model)(img, num_steps=4, seed=1).normals, a)  # = a fresh scheduler


def _diffusion_model_and_input(seed: int = 0):
    torch.manual_seed(seed)
    model = TransNormalModel(tiny_config(mode="diffusion")).eval()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed + 1)) * 2 - 1
    return model, x


def test_multistep_sampler_equals_a_ddim_scheduler_reference_loop():
    """Same normals as a freshly built DDIMScheduler (Marigold's settings) driving the UNet step by step
    (1e-6), and as the DDIM v-prediction update written out in float64 (trailing spacing, final alpha =
    alphas_cumprod[0]; 1e-4: float32 vs float64 arithmetic, amplified by the final normalisation)."""
    from diffusers import DDIMScheduler

    from perception.normals.modeling_transnormal import task_embedding

    model, x = _diffusion_model_and_input()
    steps, seed = 5, 3
    got = TransNormalPipeline(model).predict(x, steps, generator=torch.Generator().manual_seed(seed))

    sched = DDIMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                          beta_schedule="scaled_linear", prediction_type="v_prediction",
                          timestep_spacing="trailing", set_alpha_to_one=False, clip_sample=False)
    sched.set_timesteps(steps)
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    abar = torch.cumprod(1 - betas, 0)
    assert sched.timesteps.tolist() == [999, 799, 599, 399, 199]
    with torch.no_grad():
        z_rgb = model.vae.encode(x).latent_dist.mode() * model.latent_scale
        ctx = model.context(x)
        emb = task_embedding("normals", 2, x.device, x.dtype)
        z = torch.randn(z_rgb.shape, generator=torch.Generator().manual_seed(seed))
        z_hand = z.double()
        for t in sched.timesteps:
            v = model.unet(torch.cat([z_rgb, z], 1), t.expand(2), encoder_hidden_states=ctx,
                           class_labels=emb).sample
            z = sched.step(v, t, z).prev_sample
            v = model.unet(torch.cat([z_rgb, z_hand.float()], 1), t.expand(2), encoder_hidden_states=ctx,
                           class_labels=emb).sample.double()
            a, a_prev = abar[t], abar[t - 200] if t >= 200 else abar[0]
            x0 = a.sqrt() * z_hand - (1 - a).sqrt() * v
            eps = a.sqrt() * v + (1 - a).sqrt() * z_hand
            z_hand = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
        def normals(latent):
            return torch.nn.functional.normalize(model.vae.decode(latent / model.latent_scale).sample, dim=1,
                                                 eps=1e-6)

        want, hand = normals(z), normals(z_hand.float())
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got, hand, atol=1e-4, rtol=0)  # float64 hand update vs the float32 scheduler
    fewer = TransNormalPipeline(model).predict(x, num_steps=2, generator=torch.Generator().manual_seed(seed))
    assert (fewer - got).abs().max() > 1e-3  # the reference is not trivially equal to any sampler output


def test_marigold_pipeline_cannot_condition_the_transnormal_unet():
    """Why the multi-step arm is not diffusers' MarigoldNormalsPipeline: it calls the UNet without
    class_labels (TransNormal's task switch) and with one cached prompt embedding for every image (not each
    image's DINOv3 context). If a diffusers release lifts this, this test fails: reconsider the switch."""
    from diffusers import DDIMScheduler, MarigoldNormalsPipeline

    model, x = _diffusion_model_and_input()
    pipe = MarigoldNormalsPipeline(unet=model.unet, vae=model.vae, scheduler=DDIMScheduler(),
                                   text_encoder=None, tokenizer=None, prediction_type="normals")
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        pipe.empty_text_embedding = model.context(x[:1])  # closest fit: one image's context as "the prompt"
    with pytest.raises(ValueError, match="class_labels"):
        pipe((x[:1] + 1) / 2, num_inference_steps=2, processing_resolution=32, output_type="pt")


@pytest.mark.parametrize("hw", [(45, 70), (100, 30)])
def test_any_size_comes_back_at_the_input_size_as_unit_vectors(hw):
    pipe = TransNormalPipeline(TransNormalModel(tiny_config()))
    img = np.random.default_rng(0).integers(0, 256, (*hw, 3), dtype=np.uint8)
    n = pipe(img).normals
    assert n.shape == (1, 3, *hw)
    torch.testing.assert_close(n.norm(dim=1), torch.ones(1, *hw), atol=1e-4, rtol=0)


def test_tiled_inference_covers_the_image_and_matches_single_tile():
    torch.manual_seed(0)
    model = TransNormalModel(tiny_config())
    calls = _count_calls(model.unet)
    pipe = TransNormalPipeline(model)
    img = torch.randint(0, 256, (1, 3, 40, 72), dtype=torch.uint8)
    n = pipe(img, tile=32, batch_size=100).normals
    assert n.shape == (1, 3, 40, 72) and torch.isfinite(n).all()
    assert len(calls) == 1  # all tiles in one batch
    assert _starts(72, 32, 16) == [0, 16, 32, 40] and _starts(32, 32, 16) == [0]
    # an image that is exactly one tile gives exactly the untiled prediction
    one = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    torch.testing.assert_close(pipe(one, tile=32).normals, pipe(one, processing_res=32).normals, atol=1e-5, rtol=0)


def test_bad_input_shape_is_refused():
    pipe = TransNormalPipeline(TransNormalModel(tiny_config()))
    with pytest.raises(ValueError):
        pipe(np.zeros((8, 8), np.uint8))
