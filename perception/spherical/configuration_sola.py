"""Configuration of SoLA and its data / evaluation settings (light: no torch import).

``SoLAConfig`` (``model`` group, schema ``sola_schema``) sizes the spherical U-transformer and picks the
attention: ``sola_softmax`` / ``sola_linear`` (the method) or ``lpe`` (the SphereUFormer-style baseline with
location-dependent positional embeddings, everything else equal).

``SoLADataConfig`` (``data`` group, schema ``sola_panoramas_schema``) extends the shared panorama config with
how to render the synthetic set on first use and the evaluation rotation protocol: ``data.rotate=so3``
evaluates every test panorama under a random rotation (seeded by ``rotate_seed`` and the sample index), which
is what ``embodied eval sola data.rotate=so3`` (or ``--rotate so3``) runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import PanoramaDataConfig, choice, schema
from core.errors import ConfigError

ATTENTIONS = ("sola_softmax", "sola_linear", "lpe")
ROTATIONS = ("none", "yaw", "so3")


@schema("model", "sola_schema")
@dataclass
class SoLAConfig:
    """Sizes of ``SoLAModel`` (a U-shaped transformer on icosphere levels ``level, level - 1, ...``).

    Stage ``s`` (0 = finest) runs at icosphere level ``level - s`` with ``channels[s]`` features and
    ``depths[s]`` transformer blocks; the last stage is the bottleneck. Heads have ``head_dim`` channels
    each (``channels[s] // head_dim`` heads). Neighbourhoods are ``ring``-rings of the mesh (self included).
    ``b_init`` / ``w_init`` initialise the per-head modulation ``b + w cos(theta)``; with ``learn_bw`` False
    they stay fixed. ``train_rotate`` is a training augmentation (default none: trained upright, as in the
    rotation-robustness protocol). ``ignore_index`` is the label left out of CE and mIoU (void / unknown).
    """

    attention: str = "sola_softmax"
    level: int = 5
    channels: list[int] = field(default_factory=lambda: [32, 64, 128, 256])
    depths: list[int] = field(default_factory=lambda: [2, 2, 2, 2])
    head_dim: int = 16
    ring: int = 1
    mlp_ratio: float = 2.0
    b_init: float = 1.0
    w_init: float = 1.0
    learn_bw: bool = True
    num_classes: int = 10
    ignore_index: int = 0
    depth_weight: float = 1.0
    seg_weight: float = 0.5
    berhu_c: float = 0.2
    max_depth: float = 10.0
    train_rotate: str = "none"

    def __post_init__(self):
        choice("model.attention", self.attention, ATTENTIONS)
        choice("model.train_rotate", self.train_rotate, ROTATIONS)
        if not self.channels or len(self.channels) != len(self.depths):
            raise ConfigError(f"model.channels and model.depths need the same non-zero length, got "
                              f"{list(self.channels)} and {list(self.depths)}")
        if any(c < 1 or c % self.head_dim for c in self.channels):
            raise ConfigError(f"model.channels must be positive multiples of head_dim={self.head_dim}, "
                              f"got {list(self.channels)}")
        if any(d < 0 for d in self.depths):
            raise ConfigError(f"model.depths must be >= 0, got {list(self.depths)}")
        if not len(self.channels) - 1 <= self.level <= 7:
            raise ConfigError(f"model.level must be in [{len(self.channels) - 1}, 7] for {len(self.channels)} "
                              f"stages, got {self.level}")
        if self.ring < 1:
            raise ConfigError(f"model.ring must be >= 1, got {self.ring}")
        if self.b_init < 0 or self.w_init < 0:
            raise ConfigError(f"model.b_init and model.w_init must be >= 0, got {self.b_init}, {self.w_init}")
        if self.num_classes < 2:
            raise ConfigError(f"model.num_classes must be >= 2, got {self.num_classes}")
        if self.berhu_c <= 0 or self.max_depth <= 0:
            raise ConfigError("model.berhu_c and model.max_depth must be > 0")


@schema("data", "sola_panoramas_schema")
@dataclass
class SoLADataConfig(PanoramaDataConfig):
    """Panorama folders for SoLA (+ the synthetic set's render settings and the evaluation rotation).

    ``layout: embodied-dense`` reads ``root`` with ``core.data.panoramas.EquirectDataset`` (rendered by
    ``sim.render.panoramas.make_dataset(root, render_n, render_seed, height, render_spp, test_fraction,
    source=render_source)`` when the folder is missing: ``render_source`` "mujoco" = cube-map renders inside
    LIBERO / robosuite scenes, "analytic" = the fast flat-shaded boxes); ``layout: stanford2d3d`` reads ``Stanford2D3DDataset`` with
    ``train_areas`` / ``test_areas``. Panoramas are resized to ``height`` x ``2 height``.
    """

    render_n: int = 240
    render_seed: int = 0
    render_spp: int = 4
    render_source: str = "mujoco"
    test_fraction: float = 0.2
    train_areas: list[str] = field(default_factory=lambda: ["area_1", "area_2", "area_3", "area_4", "area_6"])
    test_areas: list[str] = field(default_factory=lambda: ["area_5a", "area_5b"])
    rotate: str = "none"
    rotate_seed: int = 1234
    max_test: int | None = None

    def __post_init__(self):
        super().__post_init__()
        choice("data.rotate", self.rotate, ROTATIONS)
        choice("data.render_source", self.render_source, ("mujoco", "analytic"))
        if self.render_n < 2:
            raise ConfigError(f"data.render_n must be >= 2, got {self.render_n}")
        if self.height < 8:
            raise ConfigError(f"data.height must be >= 8, got {self.height}")
