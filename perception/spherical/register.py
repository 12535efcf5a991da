"""Registers SoLA (named in pyproject's ``embodied.methods`` entry points)."""

from core.registry import Flag, InferSpec, register_method

register_method(
    "sola",
    folder="perception/spherical",
    description="SO(3)-equivariant spherical local attention, 360 depth + segmentation",
    task="perception.spherical.task",
    config="perception.spherical.configuration_sola",
    model="perception.spherical.modeling_sola:SoLAModel",
    example="perception.spherical.modeling_sola:example",
    demo="perception.spherical.demo:demo_section",
    infer=[InferSpec(
        "depth360", "perception.spherical.cli:infer",
        "360 depth + semantics for equirectangular panoramas (SoLA)",
        (("inputs", dict(nargs="+", metavar="PANO")), ("--out", dict(required=True))),
    )],
    # the LPE baseline: the U-transformer with location-dependent positional embeddings (= model=sola_lpe)
    arms={"sola": [], "lpe": ["model.attention=lpe", "out_dir=outputs/sola_lpe"]},
    flags=[Flag("--rotate", "data.rotate", "evaluate on rotated panoramas", ("none", "yaw", "so3"))],
)
