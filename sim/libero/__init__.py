"""LIBERO suites built offline from BDDL files and init states (robosuite 1.5, MuJoCo, EGL).

Importing ``sim.libero`` (and ``sim.libero.suites`` / ``sim.libero.registration``) is light: it
imports neither LIBERO, robosuite, MuJoCo nor torch. The simulator loads only in
``sim.libero.env`` when an environment is built.

Modules:
    suites         suite / task listing (static table checked against LIBERO's benchmark module)
    registration   ``register()``: ``embodied/Libero-<suite>-<task_index>-v0`` for all 130 tasks
    env            ``LiberoEnv``: the Gymnasium env (obs ``image``, ``wrist_image``, ``proprio``)
    expert         ``LiberoReachGraspExpert``: scripted reach-and-grasp policy with noise
    demos          LIBERO demonstration-file layout (HDF5) and the env-obs <-> demo-key mapping

Rendering and the learning stack: importing triton (``import timm``, ``torch._dynamo``,
``torch.compile``) AFTER an EGL render context exists segfaults the process (Mesa llvmpipe and
triton each load their own LLVM). This package never imports torch / timm itself; a process that
renders LIBERO and runs models must import the learning stack first (the CLI bootstrap does), or
render in worker processes.
"""
