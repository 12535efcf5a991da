"""Process-wide start-up shared by the CLI, the demo and the benchmarks.

Two things must happen before any simulator renders (../shared/ENV.md, "A crash to design around"):
headless rendering backends are chosen (EGL for MuJoCo / robosuite / LIBERO, a dummy SDL video driver
for highway-env's pygame), and the learning stack — torch and triton — is imported. Triton and Mesa's
llvmpipe each load their own LLVM; when triton is imported AFTER an EGL context exists the process
segfaults, while the other order is fine. Anything that renders and then runs a model in one process
calls ``prepare_process()`` first.
"""

from __future__ import annotations

import importlib.util
import os

_prepared = False


def set_headless_env() -> None:
    """Pick headless backends unless the user chose others; never reach for a model hub."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    gl = os.environ["MUJOCO_GL"]
    os.environ.setdefault("PYOPENGL_PLATFORM", gl if gl in ("egl", "osmesa") else "egl")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OPENCV_IO_ENABLE_OPENEXR", "1")


def prepare_process(learning_stack: bool = True) -> None:
    """Set headless backends and (by default) import torch + triton before any render context exists."""
    global _prepared
    set_headless_env()
    if _prepared or not learning_stack:
        return
    import torch  # noqa: F401

    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401
    _prepared = True
