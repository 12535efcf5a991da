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
    experiment="perception.spherical.experiments:EXPERIMENT",
    headline=[("mae", "m"), ("rmse", "m"), ("absrel", ""), ("delta1", ""), ("miou", "")],
    demo="perception.spherical.demo:demo_section",
    infer=[InferSpec(
        "depth360", "perception.spherical.cli:infer",
        "360 depth + semantics for equirectangular panoramas (SoLA)",
        (("inputs", dict(nargs="+", metavar="PANO|DIR", help=(
            "2:1 equirectangular panoramas (images, .exr / .hdr) or folders of them (walked recursively). "
            "Outputs: OUT/NAME_depth.npy / .png, NAME_semantic.npy / .png and predictions.json; NAME = the "
            "file's stem, its path inside a given folder (subfolders kept), or stem_ext when stems collide "
            "(room.png, room.exr -> room_png, room_exr). An input that cannot be read (or a video) is skipped "
            "with an error line; the exit code is then 1"))),
         ("--out", dict(required=True, metavar="DIR", help="output folder (refused if it holds anything no "
                                                          "embodied run wrote)"))),
    )],
    # the LPE baseline: the U-transformer with location-dependent positional embeddings (= model=sola_lpe)
    arms={"sola": [], "lpe": ["model.attention=lpe", "out_dir=outputs/sola_lpe"]},
    flags=[Flag("--rotate", "data.rotate", "evaluate on rotated panoramas", ("none", "yaw", "so3"))],
)
