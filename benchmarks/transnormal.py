"""TransNormal inference cost: single step vs its limit and vs the multi-step (Marigold-style) sampler.

Measured in one run on one device, with random weights (cost does not depend on the values):

* ``single_step``: the whole single-step prediction of one image (VAE encode + DINOv3 + ONE UNet pass +
  VAE decode), as ``TransNormalPipeline.predict`` runs it.
* ``limit``: one bare UNet forward + one VAE decode on precomputed latents / context — what a
  single-step model cannot go below.
* ``multistep``: the same UNet architecture run as the diffusion baseline with N DDIM steps.

Ratios (in ``benchmarks/results/transnormal.json``):
    ``single_step_vs_unet_forward``  single_step / limit  (lower is better; 1.0 is the limit, the spec's
                                     "costs ~one UNet + VAE pass"; the rest is the encoder and DINOv3)
    ``multistep_vs_single_step``     multistep / single_step  (how much the single step saves; ~N + 1)
    ``peak_memory_multistep_vs_single``  peak allocated memory of the two (CUDA only; 1.0 on CPU, where
                                     it is not measured)

``--quick``: the tiny config at 64 px, N = 10. Full: the paper-sized SD2 UNet + SD VAE + DINOv3 ViT-L/16
at 768 px on CUDA in bf16 (256 px, fp32 on CPU), N = 50 (Marigold's default).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from benchmarks.common import default_device, parse_args, print_table, synchronize, timeit, write_result


def _configs(quick: bool, device: str):
    from core.config import compose, to_object

    if quick:
        cfg = to_object(compose(["model=transnormal_tiny"]).model)
        return dataclasses.replace(cfg, image_size=64), 64, 10
    cfg = to_object(compose(["model=transnormal"]).model)
    size = 768 if device.startswith("cuda") else 256
    return dataclasses.replace(cfg, image_size=size), size, 50


def main(argv=None) -> None:
    args = parse_args(__doc__, argv)
    device = default_device(args.device)
    from perception.normals.modeling_transnormal import TransNormalModel
    from perception.normals.pipeline_transnormal import TransNormalPipeline

    cfg, size, steps = _configs(args.quick, device)
    dtype = torch.bfloat16 if device.startswith("cuda") else None
    repeats = 3 if args.quick else 5
    t0 = time.perf_counter()
    torch.manual_seed(0)
    single = TransNormalPipeline(TransNormalModel(cfg), device=device, dtype=dtype)
    x = torch.rand(1, 3, size, size, device=device) * 2 - 1
    m = single.model
    with torch.no_grad(), single._autocast():
        z = m.encode(x)
        ctx = m.context(x)

    def limit():
        with torch.no_grad(), single._autocast():
            m.decode(m.denoise(z, cfg.timestep, ctx, "normals"))

    def peak(fn):
        if not device.startswith("cuda"):
            return None
        torch.cuda.reset_peak_memory_stats()
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated() / 2**20

    t_single = timeit(lambda: single.predict(x), warmup=1, repeats=repeats, device=device)
    t_limit = timeit(limit, warmup=1, repeats=repeats, device=device)
    mem_single = peak(lambda: single.predict(x))
    single = m = None  # free the single-step model before building the multi-step one
    multi = TransNormalPipeline(TransNormalModel(dataclasses.replace(cfg, mode="diffusion")), device=device,
                                dtype=dtype)
    t_multi = timeit(lambda: multi.predict(x, num_steps=steps), warmup=1, repeats=max(1, repeats - 2),
                     device=device)
    mem_multi = peak(lambda: multi.predict(x, num_steps=steps))
    rows = [{"path": "limit: UNet + decode", "ms": t_limit.median * 1e3},
            {"path": "TransNormal single step", "ms": t_single.median * 1e3},
            {"path": f"multi-step sampler, {steps} steps", "ms": t_multi.median * 1e3}]
    print_table(rows)
    ratios = {"single_step_vs_unet_forward": t_single.median / t_limit.median,
              "multistep_vs_single_step": t_multi.median / t_single.median,
              "peak_memory_multistep_vs_single": (mem_multi / mem_single) if mem_single else 1.0}
    figures = {"single_step_ms": round(t_single.median * 1e3, 2), "limit_ms": round(t_limit.median * 1e3, 2),
               "multistep_ms": round(t_multi.median * 1e3, 2), "peak_mem_single_mib": mem_single,
               "peak_mem_multistep_mib": mem_multi, "wall_s": round(time.perf_counter() - t0, 1)}
    name = f"{device} ({torch.cuda.get_device_name()})" if device.startswith("cuda") else device
    write_result("transnormal", name, args.quick, ratios, figures,
                 {"image_size": size, "steps": steps, "repeats": repeats, "dtype": str(dtype or torch.float32),
                  "unet_blocks": list(cfg.block_out_channels), "dino_model": cfg.dino_model})


if __name__ == "__main__":
    main()
