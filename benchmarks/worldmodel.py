"""World-model speed: imagined frames/s of LAC-WM vs frames/s of the rendered simulator, planning rate, and
imagination against its limit.

Limit (what cannot be beaten): imagination is autoregressive — step t's frame is the FDM's input at step
t + 1 — so a rollout of T steps must run T FDM forward passes one after the other, each on its window of
the last ``context`` frames; nothing else is needed. The limit is the sum of those T forward passes timed
alone on the same (precomputed) windows and latents; ``imagine_vs_limit`` is the rollout's overhead on top
(window stacking, clamping, the uint8 -> float codec conversion). The simulator side has its own limits in
``benchmarks.sim``.

Ratios (measured in one run; absolute times on these shared machines vary between runs):
    imagined_vs_sim_frames    imagined frames/s (batched autoregressive FDM rollouts: projector + FDM,
                              16 rollouts x 8 steps; the ratio grows with that batch) / rendered simulator
                              frames/s (one env step with a camera image of the same size, Reach-Panda,
                              20 Hz control). Higher is better; > 1: imagining is cheaper than simulating.
    planning_decisions_per_s  candidate-selection decisions per second (16 candidates x 4 imagined
                              transitions, scoring against a goal image), absolute rate (higher is better).
    decision_vs_sim_step      time of one planning decision / time of one rendered simulator step
                              (lower is better).
    imagine_vs_limit          time of ``model.imagine`` (16 x 8) / the sum of its 8 FDM forward passes timed
                              alone (lower is better; goal <= 1.10).
The model is the shipped checkpoint in ``assets/checkpoints/lacwm`` when present, else a randomly
initialised model of ``configs/model/lacwm.yaml`` (speed does not depend on the weights).
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import torch  # noqa: E402

from benchmarks.common import (  # noqa: E402
    Goal,
    default_device,
    interleaved,
    parse_args,
    print_table,
    repeated_main,
    timeit,
    write_result,
)
from core.bootstrap import prepare_process  # noqa: E402
from core.resources import asset  # noqa: E402

ASSET = asset("checkpoints", "lacwm")

# Every reported ratio: held to a goal (its target and where the number comes from) or a plain figure.
GOALS = {
    "imagine_vs_limit": Goal("<= 1.10", (
        "limit: the bare model passes of the imagined rollout (docstring); README GPU table (1.02)")),
    "imagined_vs_sim_frames": Goal(">= 1", (
        "claim: imagining frames is cheaper than simulating them; the README's Measured table (73 / 80)")),
}
FIGURES_ONLY = ("planning_decisions_per_s", "decision_vs_sim_step")


def _model(device: str):
    from core.config import compose, to_object
    from worldmodels.lacwm.adaptation import adapt_model
    from worldmodels.lacwm.modeling_lacwm import build_model

    if (ASSET / "model.safetensors").exists():
        from worldmodels.lacwm.modeling_lacwm import WorldModel

        model = WorldModel.from_pretrained(ASSET)
    else:
        model = adapt_model(build_model(to_object(compose(["experiment=lacwm"]).model)), "Panda", 7)
    return model.to(device).eval()


def main() -> None:
    prepare_process()  # the learning stack before the simulator's EGL context
    args = parse_args(__doc__.splitlines()[0])
    device = default_device(args.device)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    model = _model(device)
    c = model.config
    # the adapted embodiment's projector (LAC) / encoder (EAC): the one named in config.projectors, else any
    adapted = next(iter(c.projectors), None) or next(iter(c.action_dims), None) or "Panda"
    enc = model.action_encoder(adapted)
    # the same batch in quick and full runs: the ratio compares batched imagination with one env, so it
    # scales with the batch (--quick only shortens the simulator timing)
    batch, steps = 16, 8
    frame = torch.randint(0, 256, (batch, 3, c.image_size, c.image_size), dtype=torch.uint8, device=device)
    acts = torch.randn(batch, steps, enc.in_dim, device=device)

    def imagine():
        with torch.no_grad():
            model.imagine(frame, enc(acts))

    z_seq = enc(acts).detach()
    # the limit's inputs: the exact windows / latents the rollout feeds its T forward passes
    calls = []
    with torch.no_grad():
        frames = [model.codec.to_float(frame)]
        for t in range(steps):
            lo = max(0, t + 1 - c.context)
            calls.append((torch.stack(frames[lo: t + 1], 1), z_seq[:, lo: t + 1]))
            frames.append(model.predict(*calls[-1])[:, -1].clamp(-1, 1))

    def imagine_only():
        with torch.no_grad():
            model.imagine(frame, z_seq)

    def forward_passes():
        with torch.no_grad():
            for window, z in calls:
                model.predict(window, z)

    t_lim = interleaved({"imagine": imagine_only, "limit": forward_passes}, warmup=1,
                        repeats=3 if args.quick else 10, device=device)
    t_im = timeit(imagine, warmup=1, repeats=3 if args.quick else 10, device=device).median
    imagined_fps = batch * steps / t_im
    try:
        from benchmarks.sim import env_steps_per_s

        sim_fps = env_steps_per_s("embodied/Reach-Panda-v0", c.image_size, 20 if args.quick else 100)
    except ImportError as e:  # a GPU box without the simulator stack: the model-side ratios still stand
        print(f"simulator unavailable ({e}): imagined_vs_sim_frames / decision_vs_sim_step skipped")
        sim_fps = None

    goal = torch.zeros(1, 3, c.image_size, c.image_size, device=device)
    cands = torch.randn(16, 4, enc.in_dim, device=device)
    f16 = frame[:16]

    def decide():
        with torch.no_grad():
            im = model.imagine(f16, enc(cands))
            int(((im[:, -1] - goal) ** 2).flatten(1).mean(1).argmin())

    t_dec = timeit(decide, warmup=1, repeats=5 if args.quick else 20, device=device).median
    rows = [{"what": "imagined frames/s", "value": imagined_fps},
            {"what": "sim frames/s (rendered)", "value": sim_fps if sim_fps else "n/a"},
            {"what": "planning decisions/s", "value": 1.0 / t_dec}]
    print_table(rows)
    write_result("worldmodel", device, args.quick,
                 ratios={"planning_decisions_per_s": 1.0 / t_dec,
                         "imagine_vs_limit": t_lim["imagine"].best / t_lim["limit"].best,
                         **({"imagined_vs_sim_frames": imagined_fps / sim_fps, "decision_vs_sim_step": t_dec * sim_fps}
                            if sim_fps else {})},
                 goals=GOALS, figures_only=FIGURES_ONLY,
                 figures={"imagined_fps": imagined_fps, "sim_fps": sim_fps, "decision_s": t_dec,
                          "imagine_best_s": t_lim["imagine"].best, "limit_best_s": t_lim["limit"].best,
                          "model_params": int(sum(p.numel() for p in model.parameters()))},
                 config={"batch": batch, "steps": steps, "image_size": c.image_size, "candidates": 16,
                         "plan_horizon": 4, "checkpoint": str(ASSET) if (ASSET / "model.safetensors").exists() else None})


if __name__ == "__main__":
    repeated_main(main)
