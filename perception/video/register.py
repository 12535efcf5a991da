"""Registers Flex-Forcing (named in pyproject's ``embodied.methods`` entry points)."""

from core.registry import InferSpec, register_method

register_method(
    "flexforcing",
    folder="perception/video",
    description="one video diffusion transformer for bidirectional, autoregressive and flexible chunked "
                "generation",
    task="perception.video.task",
    config="perception.video.configuration_flexforcing",
    model="perception.video.modeling_flexforcing:FlexForcingModel",
    example="perception.video.modeling_flexforcing:example",
    experiment="perception.video.experiments:EXPERIMENT",
    headline=[("regimes.*.mean.psnr", "dB"), ("regimes.*.mean.ssim", ""), ("regimes.*.mean.fd", ""),
              ("regimes.*.mean.fps", "frames/s")],
    demo="perception.video.demo:demo_section",
    # the rigid-schedule baselines, same sizes (= model=flexforcing_bidirectional / _autoregressive; set
    # as fields, so that they also apply to model=flexforcing_tiny)
    arms={
        "flexforcing": [],
        "bidirectional_only": ["model.chunking=one", "model.noise=per_clip", "model.k_projection=false",
                               "out_dir=outputs/flex_bidir"],
        "autoregressive_only": ["model.chunking=singletons", "model.noise=per_chunk",
                                "model.k_projection=false", "out_dir=outputs/flex_ar"],
        # the peer (perception/video/self_forcing.py): the shipped Flex-Forcing model post-trained by AR
        # self-rollout + DMD against a frozen bidirectional teacher (the same model run bidirectionally); a
        # post-training at a fine-tuning learning rate, scored in the AR regime it trains
        "self_forcing": ["model.objective=self_forcing", "model.sf_gen_every=5",
                         "model.init_path=assets/checkpoints/flexforcing",
                         "model.teacher_path=assets/checkpoints/flexforcing", "trainer.optim.lr=5.0e-5",
                         "trainer.scheduler.warmup_steps=20", "data.regimes=[autoregressive]",
                         "out_dir=outputs/flex_sf"],
        # its control: the same start, steps, batch and learning rate on Flex-Forcing's own loss
        "continued": ["model.init_path=assets/checkpoints/flexforcing", "trainer.optim.lr=5.0e-5",
                      "trainer.scheduler.warmup_steps=20", "data.regimes=[autoregressive]",
                      "out_dir=outputs/flex_continued"],
    },
    infer=[InferSpec(
        "video", "perception.video.cli:infer",
        "generate a video (Flex-Forcing): continue a first frame / the shipped model's sample scene",
        (("--out", dict(required=True, metavar="FILE.mp4", help="output mp4")),
         ("--mode", dict(choices=["bidirectional", "autoregressive", "flex"], default="flex",
                         help="sampling regime (default flex)")),
         ("--frames", dict(type=int, default=32, help="frames in the output video, first frame included")),
         ("--first-frame", dict(default=None, metavar="IMAGE",
                                help="condition on this image (resized)")),
         ("--seed", dict(type=int, default=0, help="noise seed")),
         ("--steps", dict(type=int, default=None, help="Euler steps per frame (default: the model's)"))),
    )],
)
