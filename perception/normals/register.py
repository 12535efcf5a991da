"""Registers TransNormal (named in pyproject's ``embodied.methods`` entry points)."""

from core.registry import InferSpec, register_method

_EFFNET = ["model.context_encoder=efficientnet_lite0", "model.dino_image_size=128"]  # the experiment's
_ABLATIONS = {
    "dino": ["model.context_encoder=dinov3", "model.dino_image_size=null"],
    "none": ["model.use_dino=false"],
    "diffusion": ["model.mode=diffusion", *_EFFNET],
    "effnet_nocons": [*_EFFNET, "model.w_cons=0"],
    "effnet_nowav": [*_EFFNET, "model.w_wav=0"],
    "dino_nocons": ["model.context_encoder=dinov3", "model.dino_image_size=null", "model.w_cons=0"],
    "none_nocons": ["model.use_dino=false", "model.w_cons=0"],
}

register_method(
    "transnormal",
    folder="perception/normals",
    description="single-step diffusion normals for transparent objects (DINOv3 context)",
    task="perception.normals.task",
    config="perception.normals.configuration_transnormal",
    model="perception.normals.modeling_transnormal:TransNormalModel",
    example="perception.normals.modeling_transnormal:example",
    experiment="perception.normals.experiments:STUDIES",
    headline=[("models.*.all.mean", "deg"), ("models.*.all.median", "deg"), ("models.*.all.a11.25", "%")],
    demo="perception.normals.demo:demo_section",
    # the context-encoder study (embodied experiment transnormal glass): the method as
    # configs/experiment/transnormal.yaml sets it (frozen ImageNet EfficientNet-Lite0 context), then the
    # random-init DINOv3, no context (a learned null token), the multi-step diffusion baseline, the loss
    # ablations; each into its own out_dir
    arms={"transnormal": [], **{k: [*v, f"out_dir=outputs/transnormal_{k}"] for k, v in _ABLATIONS.items()}},
    infer=[InferSpec(
        "normals", "perception.normals.cli:infer",
        "surface normals (PNG + .npy) for images or folders (TransNormal)",
        (("inputs", dict(nargs="+", metavar="IMAGE|DIR|VIDEO", help=(
            "images, videos, or folders (walked recursively for every readable image format and videos). "
            "Outputs: OUT/NAME_normals.png + .npy, NAME = the file's stem, its path inside a given folder "
            "(subfolders kept), or stem_ext when stems collide (coffee.bmp, coffee.gif -> coffee_bmp, "
            "coffee_gif). An input that cannot be read is skipped with an error line; the exit code is then 1"))),
         ("--out", dict(required=True, metavar="DIR", help="output folder (refused if it holds anything no "
                                                          "embodied run wrote)")),
         ("--max-frames", dict(type=int, default=16, metavar="N", help=(
             "a video: run its first N frames (default 16; 0 = all). Its frame count and the size of "
             "NAME_normals.npy ((T, H, W, 3) float16) are stated before it starts"))),
         ("--pointcloud", dict(action="store_true", help="also write an oriented .ply (needs --depth)")),
         ("--depth", dict(default=None, help="depth map (.npy, metres) for --pointcloud"))),
    )],
)
