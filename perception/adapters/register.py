"""Registers FeRA (named in pyproject's ``embodied.methods`` entry points)."""

from core.registry import InferSpec, register_method

register_method(
    "fera",
    folder="perception/adapters",
    description="frequency-energy routed adapter experts for diffusion fine-tuning, against peft's LoRA, DoRA, "
                "FourierFT and WaveFT and X-LoRA's routing",
    task="perception.adapters.task",
    config="perception.adapters.configuration_fera",
    model="perception.adapters.modeling_fera:AdaptedDenoiser",
    example="perception.adapters.modeling_fera:example",
    experiment="perception.adapters.experiments:EXPERIMENT",
    headline=[("heldout_loss.mean", ""), ("fd", ""), ("base.heldout_loss.mean", ""), ("base.fd", ""),
              ("trainable_parameters", "")],
    demo="perception.adapters.demo:demo_section",
    # same base, shots, steps, harness; out_dir follows adapter.name
    arms={"fera": [], "fera_norouter": ["adapter=fera_norouter"], "fera_nofecl": ["adapter=fera_nofecl"],
          "lora": ["adapter=lora"], "dora": ["adapter=dora"], "xlora": ["adapter=xlora"],
          "fourierft": ["adapter=fourierft"], "waveft": ["adapter=waveft"]},
    infer=[InferSpec(
        "fera-samples", "perception.adapters.cli:infer",
        "sample images (grid.png + samples/) from a FeRA / LoRA / DoRA-adapted diffusion model of "
        "`embodied train fera`",
        (("--run", dict(required=True, metavar="DIR", help="the arm's run folder (its out_dir)")),
         ("--out", dict(required=True, metavar="DIR", help="output folder")),
         ("--n", dict(type=int, default=16, help="number of samples (default 16)")),
         ("--seed", dict(type=int, default=0, help="noise seed")),
         ("--steps", dict(type=int, default=None, help="Euler steps (default: the model's)")),
         ("--base", dict(action="store_true", help="sample the unadapted base instead (same noise)"))),
    )],
)
