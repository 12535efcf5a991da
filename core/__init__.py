"""The ground floor every method shares: registries, configs, the pretrained-model contract, trainer, data, layers.

``core`` imports nothing above it: no method, no simulator, no app layer.
"""
