"""World-model speed: imagined frames/s of LAC-WM vs frames/s of the rendered simulator, and planning rate.

Ratios (measured in one run; absolute times on these shared machines vary between runs):
    imagined_vs_sim_frames    imagined frames/s (batched autoregressive FDM rollouts: projector + FDM,
                              16 rollouts x 8 steps; the ratio grows with that batch) / rendered simulator frames/s (one env step
                              with a camera image of the same size, Reach-Panda, 20 Hz control).
                              Higher is better; > 1 means imagining is cheaper than simulating.
    planning_decisions_per_s  candidate-selection decisions per second (16 candidates x 4 imagined
                              transitions, scoring against a goal image), absolute rate (higher is better).
    decision_vs_sim_step      time of one planning decision / time of one rendered simulator step
                              (lower is better).
The model is the shipped checkpoint in ``assets/checkpoints/lacwm`` when present, else a randomly
initialised model of ``configs/model/lacwm.yaml`` (speed does not depend on the weights).
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import torch  # noqa: E402

from benchmarks.common import default_device, parse_args, print_table, timeit, write_result  # noqa: E402
from benchmarks.sim import env_steps_per_s  # noqa: E402
from core.bootstrap import prepare_process  # noqa: E402
from core.resources import asset  # noqa: E402

ASSET = asset("checkpoints", "lacwm")


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

    t_im = timeit(imagine, warmup=1, repeats=3 if args.quick else 10, device=device).median
    imagined_fps = batch * steps / t_im
    sim_fps = env_steps_per_s("embodied/Reach-Panda-v0", c.image_size, 20 if args.quick else 100)

    goal = torch.zeros(1, 3, c.image_size, c.image_size, device=device)
    cands = torch.randn(16, 4, enc.in_dim, device=device)
    f16 = frame[:16]

    def decide():
        with torch.no_grad():
            im = model.imagine(f16, enc(cands))
            int(((im[:, -1] - goal) ** 2).flatten(1).mean(1).argmin())

    t_dec = timeit(decide, warmup=1, repeats=5 if args.quick else 20, device=device).median
    rows = [{"what": "imagined frames/s", "value": imagined_fps}, {"what": "sim frames/s (rendered)", "value": sim_fps},
            {"what": "planning decisions/s", "value": 1.0 / t_dec}]
    print_table(rows)
    write_result("worldmodel", device, args.quick,
                 ratios={"imagined_vs_sim_frames": imagined_fps / sim_fps, "planning_decisions_per_s": 1.0 / t_dec,
                         "decision_vs_sim_step": t_dec * sim_fps},
                 figures={"imagined_fps": imagined_fps, "sim_fps": sim_fps, "decision_s": t_dec,
                          "model_params": int(sum(p.numel() for p in model.parameters()))},
                 config={"batch": batch, "steps": steps, "image_size": c.image_size, "candidates": 16,
                         "plan_horizon": 4, "checkpoint": str(ASSET) if (ASSET / "model.safetensors").exists() else None})


if __name__ == "__main__":
    main()
