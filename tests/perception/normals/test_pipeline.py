"""Pipeline: any image size, tiling, single step = one UNet + one decode, N-step sampler = N UNet calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perception.normals.modeling_transnormal import TransNormalModel
from perception.normals.pipeline_transnormal import TransNormalPipeline, _starts
from tests.perception.normals.conftest import tiny_config


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
