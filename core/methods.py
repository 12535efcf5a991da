"""Which methods exist, and where the CLI finds their entry points.

Each method is registered here by lazy string (nothing is imported until a command needs it). A method
module provides ``train(cfg) -> dict`` and ``evaluate(cfg) -> dict`` task functions (separate from the
CLI, so tests call them directly), and its experiment config is ``configs/experiment/<name>.yaml``.
Inference commands (``embodied infer KIND``) map to functions ``(args) -> int`` of the method that serves
them. A name listed in ``PLANNED`` but not registered answers "not built yet" with one line.
"""

from __future__ import annotations

from core.registry import METHODS, POLICIES, Registry

# Methods of the workspace: name -> (folder, one-line description). The table the CLI and the demo show.
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

# `embodied infer KIND` -> the method that serves it.
INFER_KINDS: dict[str, str] = {
    "normals": "transnormal",
    "depth360": "sola",
    "forensics": "deepvrm",
    "video": "flexforcing",
    "i2v": "tagrpo",
}

# Inference entry points, by kind (lazy "module:function" strings taking parsed args, returning an exit code).
INFER = Registry("inference command")

# Registered (built) methods. Entry: the task module with train(cfg) / evaluate(cfg); a method that can
# act in the simulator also registers a policy factory (checkpoint_dir, env) -> sim.api.Policy.
METHODS.register("bc", "worldmodels.bc.task", folder="worldmodels/bc",
                 description="behaviour-cloning proposal policy (reference method; the planners' sampler)")
POLICIES.register("bc", "worldmodels.bc.task:load_policy")
METHODS.register("transnormal", "perception.normals.task", folder="perception/normals",
                 description=PLANNED["transnormal"][1])
INFER.register("normals", "perception.normals.cli:infer")
METHODS.register("lacwm", "worldmodels.lacwm.task", folder="worldmodels/lacwm",
                 description=PLANNED["lacwm"][1])
METHODS.register("eacwm", "worldmodels.lacwm.task", folder="worldmodels/lacwm",
                 description=PLANNED["eacwm"][1])
POLICIES.register("lacwm", "worldmodels.lacwm.task:load_policy")
POLICIES.register("eacwm", "worldmodels.lacwm.task:load_policy")
METHODS.register("sola", "perception.spherical.task", folder="perception/spherical",
                 description=PLANNED["sola"][1])
INFER.register("depth360", "perception.spherical.cli:infer")


def status() -> list[dict[str, str]]:
    """One row per planned method: name, folder, description, built (yes / no)."""
    return [
        {"name": n, "folder": f, "description": d, "built": "yes" if n in METHODS else "no"}
        for n, (f, d) in PLANNED.items()
    ] + [
        {"name": n, "folder": METHODS.meta(n).get("folder", "?"), "description": METHODS.meta(n).get("description", ""),
         "built": "yes"}
        for n in METHODS.names()
        if n not in PLANNED
    ]
