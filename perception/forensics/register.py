"""Registers Deep-VRM (named in pyproject's ``embodied.methods`` entry points)."""

from core.registry import Flag, InferSpec, register_method
from perception.forensics.views import DEFAULT_VIEWS

register_method(
    "deepvrm",
    folder="perception/forensics",
    description="AI-generated-image forensics with a VLM and a deep visual residual path (Deep-VRM), against "
                "LoRA-only, full fine-tuning, a frequency CNN and a frozen-feature probe",
    task="perception.forensics.task",
    config="perception.forensics.configuration_deepvrm",
    model="perception.forensics.modeling_deepvrm:DeepVRM",
    example="perception.forensics.modeling_deepvrm:tiny_example",
    experiment="perception.forensics.experiments:EXPERIMENT",
    headline=[("per_generator.*.acc", ""), ("qa_exact_match.acc", ""), ("qa_exact_match_base.acc", "")],
    demo="perception.forensics.demo:demo_section",
    flags=[Flag("--degrade", "data.degrade", "evaluate on degraded val images: jpeg=Q, resize=F, blur=SIGMA (joined "
                "by commas) or none; writes eval_<tag>.json")],
    # same base VLM, data, steps, harness; out_dir follows model.arm
    arms={"deepvrm": [], "lora": ["model.arm=lora"], "full": ["model.arm=full"],
          "freq_cnn": ["model.arm=freq_cnn"], "feature_probe": ["model.arm=feature_probe"]},
    infer=[InferSpec(
        "forensics", "perception.forensics.cli:infer",
        "real or fake? one JSON line per image (verdict, probability, reason) from a Deep-VRM detector",
        (("inputs", dict(nargs="+", metavar="IMAGE|DIR",
                         help="images, or folders of images (walked recursively for every readable format: "
                              ".png .jpg .jpeg .bmp .webp .tif .tiff .gif). One JSON line per input, keyed by "
                              "its path; an input that cannot be read (or a video) gets an error line and is "
                              "skipped; the exit code is then 1")),
         ("--batch", dict(type=int, default=32, help="images per forward")),
         ("--views", dict(type=int, default=DEFAULT_VIEWS, metavar="K",
                          help="square views per image, drawn like the detector's training crops (sides from the "
                               "whole centred square down to a quarter of it, area-resized to its input size; 1: "
                               "the centred square only); P(fake) is the sigmoid of their mean log-odds")),
         ("--no-reason", dict(action="store_true", help="skip generating the reason (faster)"))),
    )],
)
