"""FeRA library: indicator, router, experts, FECL, merge / save / load, on real diffusers UNet and DiT classes."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import ConfigError, DataError
from perception.adapters.fera import (
    FeRAConfig,
    FeRALinear,
    apply_fera,
    disable_fera,
    fera_layers,
    fera_parameters,
    fera_state_dict,
    fixed_routing,
    load_fera,
    merge_fera,
    router_of,
    save_fera,
    unmerge_fera,
)
from perception.adapters.frequency import band_energies, decompose, fecl_loss


def tiny_unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=16, in_channels=3, out_channels=3, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=8, norm_num_groups=8).eval()


def tiny_dit():
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    return DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=3, out_channels=3,
                                 num_layers=2, sample_size=16, patch_size=2, num_embeds_ada_norm=1).eval()


def run(model, x, t=None):
    t = torch.full((x.shape[0],), 500.0) if t is None else t
    if type(model).__name__ == "UNet2DConditionModel":
        ctx = torch.ones(x.shape[0], 1, 16)
        return model(sample=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]
    return model(hidden_states=x, timestep=t, class_labels=torch.zeros(x.shape[0], dtype=torch.long),
                 return_dict=False)[0]


def randomise(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in fera_layers(model):
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.1)


CFG = dict(num_bands=3, kappa=1.0)


# -- the indicator -------------------------------------------------------------------------------------------
def test_bands_partition_the_latent_and_energies_sum_to_one():
    x = torch.randn(4, 3, 32, 32)
    bands = decompose(x, 4, kappa=1.0)
    assert len(bands) == 4
    torch.testing.assert_close(sum(bands), x, atol=1e-5, rtol=0)
    e = band_energies(x, 4, kappa=1.0)
    assert e.shape == (4, 4)
    torch.testing.assert_close(e.sum(1), torch.ones(4))
    assert len(decompose(x, 4, kappa=1.0, finest_band="drop")) == 4  # one more built, the finest dropped


def test_white_noise_is_high_band_and_smooth_field_low_band():
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(2, 3, 32, 32, generator=g)
    e = band_energies(noise, 3, kappa=1.0)
    assert (e.argmax(1) == 2).all(), e  # low -> high ordering: index -1 is the finest band
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 32), torch.linspace(0, 1, 32), indexing="ij")
    smooth = torch.sin(math.pi * xx) * torch.cos(math.pi * yy)
    e = band_energies(smooth.expand(2, 3, 32, 32), 3, kappa=1.0)
    assert (e.argmax(1) == 0).all() and (e[:, 0] > 0.9).all(), e
    # and the indicator moves with the noise level of a flow-matching latent
    levels = [band_energies((1 - t) * smooth.expand(1, 3, 32, 32) + t * noise[:1], 3, kappa=1.0)[0, -1]
              for t in (0.1, 0.5, 0.9)]
    assert levels[0] < levels[1] < levels[2]


# -- FECL ----------------------------------------------------------------------------------------------------
def test_fecl_zero_when_update_proportional_to_residual_and_scale_invariant():
    g = torch.Generator().manual_seed(0)
    adapted, target = torch.randn(3, 3, 16, 16, generator=g), torch.randn(3, 3, 16, 16, generator=g)
    r = adapted - target
    for c in (0.3, -2.0):
        base = adapted - c * r  # delta = c * r
        assert fecl_loss(adapted, base, target, 3, kappa=1.0).item() < 1e-10
    # an update that is smooth while the residual is white noise: the bands disagree
    smooth = torch.linspace(-1, 1, 16).view(1, 1, 1, 16).expand(3, 3, 16, 16)
    base = adapted - smooth
    loss = fecl_loss(adapted, base, target, 3, kappa=1.0)
    assert loss.item() > 1e-2
    # rescale delta by 5 and the residual by 0.1: same loss
    base2 = adapted - 5 * (adapted - base)
    target2 = adapted - 0.1 * r
    torch.testing.assert_close(fecl_loss(adapted, base2, target2, 3, kappa=1.0), loss, rtol=1e-5, atol=1e-9)


def test_fecl_gradient_is_finite_at_init():
    adapted = torch.randn(2, 3, 16, 16, requires_grad=True)
    loss = fecl_loss(adapted, adapted.detach(), torch.randn(2, 3, 16, 16), 3, kappa=1.0)
    loss.backward()
    assert torch.isfinite(adapted.grad).all()


# -- layers on diffusers models ------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [tiny_unet, tiny_dit], ids=["unet", "dit"])
def test_zero_up_projections_equal_base_exactly_and_router_runs_once(make):
    model = make()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = run(model, x)
        apply_fera(model, FeRAConfig(**CFG))
        layers = dict(fera_layers(model))
        assert len(layers) >= 8 and all(n.endswith(("to_q", "to_k", "to_v", "to_out.0")) for n in layers)
        out = run(model, x)
    assert torch.equal(out, ref)
    assert router_of(model).calls == 1  # one routing per forward, shared by every adapted layer
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) or n.startswith("fera_router.") for n in trainable)


def test_routing_is_expanded_once_per_forward_and_layers_equal_the_per_layer_formula():
    """Every adapted layer reads the same (N, E * r) expansion of the forward's routing (built once), and its
    output equals the per-layer formula W x + scale * B ((A x) * repeat(routing, r)) bit for bit."""
    model = tiny_dit()
    apply_fera(model, FeRAConfig(**CFG))
    randomise(model)
    router = router_of(model)
    seen = []
    for _, layer in fera_layers(model):
        def hook(mod, args, out, _seen=seen):
            x = args[0]
            w = router.weights.repeat_interleave(mod.rank, dim=1).view(x.shape[0], *([1] * (x.dim() - 2)), -1)
            ref = mod.base_layer(x) + mod.scale * torch.nn.functional.linear(
                torch.nn.functional.linear(x, mod.lora_A) * w, mod.lora_B)
            _seen.append((torch.equal(out, ref), id(router._expanded[2])))
        layer.register_forward_hook(hook)
    run(model, torch.randn(2, 3, 16, 16)).sum().backward()
    assert len(seen) >= 8 and all(ok for ok, _ in seen)
    assert len({i for _, i in seen}) == 1  # one expansion shared by all layers
    assert router._expanded[0] is router.weights
    assert all(p.grad is not None for p in router.parameters())  # gradient reaches the router through it


def test_training_moves_experts_and_router_and_disable_gives_base():
    model = tiny_unet()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = run(model, x)
    apply_fera(model, FeRAConfig(**CFG))
    randomise(model)
    out = run(model, x)
    out.pow(2).mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None for g in grads.values())
    assert any(g.abs().sum() > 0 for n, g in grads.items() if n.startswith("fera_router."))
    assert not torch.equal(out.detach(), ref)
    with torch.no_grad(), disable_fera(model):
        assert torch.equal(run(model, x), ref)


def test_routing_depends_on_the_latent_and_uniform_has_no_router():
    model = tiny_unet()
    apply_fera(model, FeRAConfig(**CFG))
    router = router_of(model)
    smooth = torch.linspace(-1, 1, 16).view(1, 1, 1, 16).expand(1, 3, 16, 16)
    with torch.no_grad():
        w = router.route(torch.cat([smooth, torch.randn(1, 3, 16, 16)]))
    torch.testing.assert_close(w.sum(1), torch.ones(2))
    assert not torch.allclose(w[0], w[1])
    uni = tiny_unet()
    apply_fera(uni, FeRAConfig(routing="uniform", **CFG))
    assert router_of(uni).mlp is None
    assert torch.equal(router_of(uni).route(smooth), torch.full((1, 3), 1 / 3))


def test_xlora_routing_reads_the_base_hidden_state_per_token_and_pools_elsewhere():
    """X-LoRA's routing: a scaling pass of the base (experts off, no gradient) feeds a linear classifier on the
    input of norm_out; the per-token softmax is what every layer of the adapted pass uses (a UNet layer of another
    token count gets the tokens' mean); gradients reach the classifier and the experts; disabled == base."""
    model = tiny_dit()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = run(model, x)
    hidden = []
    model.norm_out.register_forward_pre_hook(lambda m, a: hidden.append(a[0].detach()))
    apply_fera(model, FeRAConfig(routing="xlora", temperature=1.0, **CFG))
    router = router_of(model)
    assert router.mlp is None and router.classifier.in_features == 16 and router.classifier.out_features == 3
    with torch.no_grad():
        assert torch.equal(run(model, x), ref)  # zero up-projections: the base, scaling pass and all
    randomise(model)
    hidden.clear()
    out = run(model, x)
    assert len(hidden) == 2 and router.calls == 2  # the scaling pass and the adapted pass; one routing each
    with torch.no_grad():
        want = torch.softmax(router.classifier(hidden[0]), -1)  # from the base's hidden state (pass 1)
    assert router.weights.shape == (2, 64, 3) and torch.allclose(router.weights, want)
    assert not torch.allclose(router.weights[0, 0], router.weights[0, 5])  # per token
    out.pow(2).mean().backward()
    assert router.classifier.weight.grad.abs().sum() > 0
    assert all(layer.lora_A.grad is not None for _, layer in fera_layers(model))
    with torch.no_grad(), disable_fera(model):
        assert torch.equal(run(model, x), ref)
    unet = tiny_unet()  # conv_norm_out's input is 16 x 16 tokens; the 8 x 8 level's layers pool them
    apply_fera(unet, FeRAConfig(routing="xlora", **CFG))
    randomise(unet)
    y = run(unet, x)
    assert torch.isfinite(y).all() and router_of(unet).weights.shape == (2, 256, 3)
    with pytest.raises(ConfigError, match="xlora_hidden"):
        apply_fera(torch.nn.Sequential(torch.nn.Linear(4, 4)),
                   FeRAConfig(routing="xlora", target_modules=["0"], **CFG))


def test_merged_equals_unmerged_under_frozen_routing():
    model = tiny_dit()
    apply_fera(model, FeRAConfig(**CFG))
    randomise(model)
    x = torch.randn(2, 3, 16, 16)
    routing = torch.tensor([0.2, 0.5, 0.3])
    fixed_routing(model, routing)
    with torch.no_grad():
        ref = run(model, x)
        merge_fera(model)
        merged = run(model, x)
        with pytest.raises(ConfigError):
            with disable_fera(model):
                pass
        unmerge_fera(model)
        back = run(model, x)
    torch.testing.assert_close(merged, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(back, ref, atol=2e-5, rtol=1e-4)
    fixed_routing(model, None)
    with pytest.raises(ConfigError, match="frozen routing"):
        merge_fera(model)


def test_save_load_bit_exact_and_small(tmp_path):
    model = tiny_unet()
    apply_fera(model, FeRAConfig(**CFG))
    randomise(model, seed=3)
    with torch.no_grad():
        router_of(model).mlp[0].weight.mul_(3.0)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = run(model, x)
    save_fera(model, tmp_path / "ad")
    saved = fera_state_dict(model)
    assert sum(t.numel() for t in saved.values()) == sum(p.numel() for p in fera_parameters(model))
    fresh = tiny_unet()
    load_fera(fresh, tmp_path / "ad")
    loaded = fera_state_dict(fresh)
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    with torch.no_grad():
        assert torch.equal(run(fresh, x), ref)
    # errors: corrupt config, missing weights, another model
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "fera_config.json").write_text("{not json")
    with pytest.raises(DataError, match="corrupt"):
        load_fera(tiny_unet(), tmp_path / "bad")
    with pytest.raises(DataError):
        load_fera(tiny_dit(), tmp_path / "ad")


def test_config_errors():
    with pytest.raises(ConfigError):
        FeRAConfig(routing="hard")
    with pytest.raises(ConfigError, match="unknown keys"):
        FeRAConfig.from_dict({"rank": 4, "rnak": 2})
    model = tiny_unet()
    with pytest.raises(ConfigError, match="matches"):
        apply_fera(model, FeRAConfig(target_modules=["no_such_layer"]))
    apply_fera(model, FeRAConfig(**CFG))
    with pytest.raises(ConfigError, match="already"):
        apply_fera(model, FeRAConfig(**CFG))
    assert isinstance(model.get_submodule("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"),
                      FeRALinear)


def test_the_chunk_causal_wan_video_backbone_is_adapted_by_name_pattern():
    """Generality: the workspace's video backbone (core.layers.wan.CausalWan around diffusers' Wan transformer:
    5-D latents, its own attention processor) takes the same library."""
    from core.layers.wan import CausalWan, wan_transformer_config

    torch.manual_seed(0)
    dit = CausalWan.from_config(wan_transformer_config(num_heads=2, head_dim=16, num_layers=2, ffn_dim=64,
                                                       in_channels=4, text_dim=16)).eval()
    x, t, frames = torch.randn(2, 4, 4, 8, 8), torch.rand(2, 4), torch.arange(4)
    with torch.no_grad():
        ref = dit(x, t, frames, torch.tensor([0, 0, 1, 1]))
        apply_fera(dit, FeRAConfig(target_modules=["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0"],
                                   num_bands=3, kappa=1.0))
        assert torch.equal(dit(x, t, frames, torch.tensor([0, 0, 1, 1])), ref)
        randomise(dit)
        assert not torch.equal(dit(x, t, frames, torch.tensor([0, 0, 1, 1])), ref)
    assert router_of(dit).calls == 2 and len(dict(fera_layers(dit))) == 8


def test_gradient_checkpointing_recomputes_with_the_same_routing():
    """Checkpointed blocks re-run their forward in backward (after FECL's disabled base pass): the gradients
    must equal those of the plain model."""
    grads = []
    for ckpt in (False, True):
        model = tiny_unet().train()
        apply_fera(model, FeRAConfig(**CFG))
        randomise(model)
        if ckpt:
            model.enable_gradient_checkpointing()
        x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        out = run(model, x)
        with torch.no_grad(), disable_fera(model):
            run(model, x)  # a base pass between forward and backward, as FECL does
        out.pow(2).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-4, atol=1e-6)
