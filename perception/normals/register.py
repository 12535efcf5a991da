"""Registers TransNormal (named in pyproject's ``embodied.methods`` entry points)."""

from core.registry import InferSpec, register_method

register_method(
    "transnormal",
    folder="perception/normals",
    description="single-step diffusion normals for transparent objects (DINOv3 context)",
    task="perception.normals.task",
    config="perception.normals.configuration_transnormal",
    model="perception.normals.modeling_transnormal:TransNormalModel",
    demo="perception.normals.demo:demo_section",
    infer=[InferSpec(
        "normals", "perception.normals.cli:infer",
        "surface normals (PNG + .npy) for images or folders (TransNormal)",
        (("inputs", dict(nargs="+", metavar="IMAGE|DIR")), ("--out", dict(required=True)),
         ("--pointcloud", dict(action="store_true", help="also write an oriented .ply (needs --depth)")),
         ("--depth", dict(default=None, help="depth map (.npy, metres) for --pointcloud"))),
    )],
)
