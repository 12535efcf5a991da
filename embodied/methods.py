"""The workspace's method table: which methods exist, which are built, and where each lives.

``PLANNED`` is the roadmap (the eight methods of the workspace). What is *built* is whatever registered
itself (``core.registry.register_method`` in a method folder's ``register.py``, named in the
``embodied.methods`` entry points of pyproject.toml) — this table is only for the rows and the "not built
yet" answers of methods that have not landed.
"""

from __future__ import annotations

from core.registry import METHODS, load_plugins, method_specs

# Methods of the workspace: name -> (folder, one-line description).
PLANNED: dict[str, tuple[str, str]] = {
    "transnormal": ("perception/normals", "single-step diffusion normals for transparent objects (DINOv3 context)"),
    "sola": ("perception/spherical", "SO(3)-equivariant spherical local attention, 360 depth + segmentation"),
    "deepvrm": ("perception/forensics", "forensics MLLM: real / generated image verdicts with reasons"),
    "flexforcing": ("perception/video", "video diffusion with flexible (bi-directional / autoregressive) forcing"),
    "fera": ("perception/adapters", "frequency-energy adapters for diffusion fine-tuning"),
    "tagrpo": ("perception/i2v_rl", "GRPO for image-to-video generation"),
    "lacwm": ("worldmodels/lacwm", "latent-action-conditioned cross-embodiment world model"),
    "eacwm": ("worldmodels/lacwm", "explicit-action-conditioned world model (LAC-WM's baseline)"),
    "automot": ("driving", "driving VLA with an action refiner, evaluated in closed loop"),
}

# `embodied infer KIND` of methods not built yet -> the method that will serve it (for the one-line answer).
PLANNED_INFER: dict[str, tuple[str, str, list[tuple[str, dict]]]] = {
    "forensics": ("deepvrm", "real / generated verdict, probability and reason per image, one JSON line each "
                  "(Deep-VRM)", [("inputs", dict(nargs="+", metavar="IMAGE"))]),
    "i2v": ("tagrpo", "image-to-video (TAGRPO-tuned video model)",
            [("image", dict(metavar="IMAGE")), ("--out", dict(required=True, metavar="FILE.mp4"))]),
}


def status() -> list[dict[str, str]]:
    """One row per method, planned or registered: name, folder, description, built (yes / no)."""
    load_plugins()
    specs = {s.name: s for s in method_specs()}
    rows = [{"name": n, "folder": f, "description": specs[n].description if n in specs else d,
             "built": "yes" if n in METHODS else "no"} for n, (f, d) in PLANNED.items()]
    rows += [{"name": s.name, "folder": s.folder, "description": s.description, "built": "yes"}
             for n, s in specs.items() if n not in PLANNED]
    return rows
