"""TransNormal (perception/normals): single-step diffusion normals for transparent objects.

Modules: ``configuration_transnormal`` (light configs), ``modeling_transnormal`` (the model and weight
loaders), ``losses`` (Haar wavelets, masked losses), ``pipeline_transnormal`` (inference: single step and
the multi-step baseline sampler, any image size), ``metrics`` (pooled angular errors), ``task``
(``embodied train / eval transnormal``), ``cli`` (``embodied infer normals``), ``demo``.
"""
