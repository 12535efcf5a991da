"""Registers TAGRPO (named in pyproject's ``embodied.methods`` entry points)."""

from core.registry import InferSpec, register_method

register_method(
    "tagrpo",
    folder="perception/i2v_rl",
    description="GRPO post-training of an image-to-video flow model (TAGRPO vs DanceGRPO and MixGRPO), rewards "
                "from the simulator",
    task="perception.i2v_rl.task",
    config="perception.i2v_rl.configuration_tagrpo",
    model="perception.i2v_rl.modeling_tagrpo:I2VPolicy",
    example="perception.i2v_rl.modeling_tagrpo:example",
    experiment="perception.i2v_rl.experiments:EXPERIMENT",
    headline=[("base.reward", ""), ("tuned.reward", ""), ("gain", ""), ("tuned.reward_std", "")],
    demo="perception.i2v_rl.demo:demo_section",
    # same base, images, reward, rollouts, harness; out_dir follows algo.name
    arms={"tagrpo": [], "dancegrpo": ["algo=dancegrpo"], "tagrpo_indep": ["algo=tagrpo_indep"],
          "dancegrpo_same": ["algo=dancegrpo_same"], "tagrpo_reuse": ["algo=tagrpo_reuse"],
          "mixgrpo": ["algo=mixgrpo"]},
    infer=[InferSpec(
        "i2v", "perception.i2v_rl.cli:infer",
        "image-to-video: continue IMAGE with the TAGRPO-post-trained video model (mp4, written atomically)",
        (("image", dict(metavar="IMAGE", help="conditioning image (png / jpg; resized to the model's size)")),
         ("--out", dict(required=True, metavar="FILE.mp4", help="output mp4")),
         ("--sde", dict(action="store_true", help="sample with the SDE (eta of --eta) instead of the ODE")),
         ("--eta", dict(type=float, default=0.7, help="SDE noise scale")),
         ("--seed", dict(type=int, default=0, help="noise seed"))),
    )],
)
