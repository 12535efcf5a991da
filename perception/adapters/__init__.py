"""FeRA: frequency-energy routed adapters for fine-tuning diffusion models."""
