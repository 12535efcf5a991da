"""SoLA: SO(3)-equivariant spherical local attention and a spherical U-transformer for 360 depth + segmentation.

Modules: ``configuration_sola`` (configs, light), ``icosphere`` (grids, neighbourhoods, pooling, equirect <->
sphere), ``attention`` (SoLA softmax / linear, gather reference, LPE baseline), ``modeling_sola`` (the
U-transformer), ``metrics``, ``task`` (train / evaluate), ``cli`` (``embodied infer depth360``), ``demo``.
"""
