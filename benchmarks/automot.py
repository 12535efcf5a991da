"""AutoMoT inference cost: synchronous vs asynchronous inference, and what the refiner adds.

Limit (what cannot be beaten, and why): asynchronous inference still runs the action expert every control step
against the cached understanding prefix; only the understanding expert's pass (the VLM over the system prompt,
the front frames and the instruction) is amortised over N steps. So the per-step floor is one ``act`` call
(``async_n<N>_vs_limit`` -> 1 as N grows), and the saving is bounded by the prefix's share of a synchronous step.

Ratios (same model, same batch, interleaved, best of N; per control step):
    async_n2_vs_sync / async_n4_vs_sync   per-step time with the prefix re-encoded every 2 / 4 steps over
                                          re-encoding it every step (N = 1, the synchronous VLA). Lower is better.
    async_n4_vs_limit                     N = 4 over the bare action-expert step.
    refiner_vs_coarse                     a step with the flow refiner (its Euler steps on the action expert's
                                          features) over the same step without it.
    joint_forward_vs_sync                 one full joint forward (U + D + P in one pass, what training runs) over
                                          the cached path's encode_prefix + act (should be ~1: same work).

Model: ``configs/model/automot.yaml`` sizes, random weights (no checkpoint needed); batch 1 (a policy acts for
one car). ``--quick``: fewer repeats.
"""

from __future__ import annotations

import time

import torch

from benchmarks.common import default_device, interleaved, parse_args, print_table, write_result


def _model(device: str):
    from core.config import compose, to_object
    from core.vlm import VLMConfig, build_tokenizer, build_vlm
    from driving.automot.configuration_automot import META_ACTIONS
    from driving.automot.refiner import WaypointRefiner
    from driving.automot.task import build_policy_model, refiner_config

    cfg = to_object(compose(["model=automot", "data=automot"]).model)
    tok = build_tokenizer(["keep lane slow down change left right accelerate stop turn in m follow the road"] * 4,
                          vocab_size=300)
    tok.add_tokens(list(META_ACTIONS))
    torch.manual_seed(0)
    vlm = build_vlm(VLMConfig(**{**dict(cfg.vlm), "vocab_size": len(tok)}))
    mot, prompter, spec = build_policy_model(cfg, vlm, tok)
    refiner = WaypointRefiner(refiner_config(cfg, mot))
    return cfg, mot.to(device).eval(), refiner.to(device).eval(), prompter, spec


def _batch(cfg, mot, prompter, spec, device: str):
    from driving.automot.inputs import model_batch, to_device

    g = torch.Generator().manual_seed(0)
    c = mot.cfg
    s = {"images": torch.rand(1, cfg.history, 3, 64, 128, generator=g),
         "bev": (torch.rand(1, c.bev_channels, 64, 64, generator=g) > 0.8).float(),
         "target_points": torch.randn(1, c.n_target, 2, generator=g) * 10,
         "ego": torch.randn(1, c.ego_dim, generator=g),
         "instruction": ["Turn left in 35 m. Drive through the intersection."]}
    return to_device(model_batch(s, prompter, spec), device)


def main(argv=None) -> None:
    args = parse_args(__doc__, argv)
    device = default_device(args.device)
    torch.set_num_threads(1)
    cfg, mot, refiner, prompter, spec = _model(device)
    batch = _batch(cfg, mot, prompter, spec, device)
    steps = 8  # a multiple of every N

    @torch.no_grad()
    def run(n: int, refine: bool = False):
        def go():
            prefix = None
            for t in range(steps):
                if t % n == 0:
                    prefix = mot.encode_prefix(batch)
                out = mot.act(prefix, batch)
                if refine:
                    refiner.refine(out.features, out.waypoints, generator=torch.Generator().manual_seed(t))
        return go

    prefix = mot.encode_prefix(batch)

    @torch.no_grad()
    def limit():
        for _ in range(steps):
            mot.act(prefix, batch)

    @torch.no_grad()
    def joint():
        for _ in range(steps):
            mot(batch)

    fns = {"sync": run(1), "async_n2": run(2), "async_n4": run(4), "limit": limit,
           "sync_refiner": run(1, refine=True), "joint": joint}
    t = interleaved(fns, warmup=1, repeats=3 if args.quick else 10, device=device)
    ms = {k: 1e3 * v.best / steps for k, v in t.items()}
    print_table([{"path": k, "ms per step": v} for k, v in ms.items()])
    ratios = {"async_n2_vs_sync": ms["async_n2"] / ms["sync"], "async_n4_vs_sync": ms["async_n4"] / ms["sync"],
              "async_n4_vs_limit": ms["async_n4"] / ms["limit"], "refiner_vs_coarse": ms["sync_refiner"] / ms["sync"],
              "joint_forward_vs_sync": ms["joint"] / ms["sync"]}
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    write_result("automot", f"{device} ({name})" if device.startswith("cuda") else "cpu", args.quick, ratios,
                 {"ms_per_step": ms, "steps": steps, "wall_clock": time.strftime("%Y-%m-%d %H:%M")},
                 {"model": "configs/model/automot.yaml (random weights)", "batch": 1,
                  "u_tokens": int(batch["input_ids"].shape[1]), "refiner_steps": refiner.config.steps},
                 goals={"async_n4_vs_sync": "<= 0.8", "joint_forward_vs_sync": "<= 1.2"})


if __name__ == "__main__":
    main()
