"""LIBERO suites built offline from BDDL files and init states (robosuite 1.5, MuJoCo, EGL).

Importing ``sim.libero`` (and ``sim.libero.suites`` / ``sim.libero.registration``) is light: it
imports neither LIBERO, robosuite, MuJoCo nor torch. The simulator loads only in
``sim.libero.env`` when an environment is built.

Modules:
    suites         suite / task listing (static table checked against LIBERO's benchmark module)
    registration   ``register()``: ``embodied/Libero-<suite>-<task_index>-v0`` for all 130 tasks and LIBERO-PRO's
    pro            LIBERO-PRO's perturbed suites (``libero_spatial_swap`` ...) read from its unpacked package,
                   their perturbation axes, and the object variants their scenes place
    env            ``LiberoEnv``: the Gymnasium env (obs ``image``, ``wrist_image``, ``proprio``)
    expert         ``LiberoReachGraspExpert``: scripted reach-and-grasp policy with noise (interaction data)
    motion         OSC move-to actions and object geometry from the sim, for scripted policies
    solver         ``LiberoSolver``: the privileged expert that solves tasks from the BDDL goal
    articulated    its skills for drawers, microwave doors and stove knobs
    demos          LIBERO demonstration-file layout (HDF5) and the env-obs <-> demo-key mapping
    record         successful expert episodes per task, in that layout (``embodied libero record``)
    evaluate       the benchmark protocol (``embodied libero eval``): 50 init states per task, workers,
                   resume, ``eval_info.json`` with Wilson intervals, videos, an HTML page
    openpi         openpi's LIBERO example observation (224 px rot180 frames, 8-D state, prompt) both ways,
                   for served policies (``embodied serve``, ``--policy ws://``)

Rendering and the learning stack: importing triton (``import timm``, ``torch._dynamo``,
``torch.compile``) AFTER an EGL render context exists segfaults the process (Mesa llvmpipe and
triton each load their own LLVM). This package never imports torch / timm itself; a process that
renders LIBERO and runs models must import the learning stack first (the CLI bootstrap does), or
render in worker processes.
"""
