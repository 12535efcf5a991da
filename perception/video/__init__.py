"""Flex-Forcing: one latent video diffusion transformer for bidirectional, autoregressive and flexible chunked
generation (``modeling_flexforcing``, ``pipeline_flexforcing``, ``chunking``)."""
