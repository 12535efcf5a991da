"""TAGRPO: GRPO post-training of an image-to-video flow model (see README.md)."""
