"""LAC-WM and EAC-WM: cross-embodiment world models with latent / explicit actions (see modeling_lacwm.py)."""
