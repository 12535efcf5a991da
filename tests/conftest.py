"""Suite-wide set-up: headless backends and the learning stack before any render context.

Tests render (MuJoCo / robosuite / LIBERO over EGL) and run models in one pytest process; importing
triton after an EGL context exists segfaults (../shared/ENV.md), so the process is prepared first,
exactly as the CLI does.
"""

from core.bootstrap import prepare_process

prepare_process()
