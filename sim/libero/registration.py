"""Register every LIBERO task with Gymnasium as ``embodied/Libero-<suite>-<task_index>-v0``.

``<suite>`` is the suite name without ``libero_``: ``spatial``, ``object``, ``goal``, ``10``, ``90``
(e.g. ``embodied/Libero-spatial-0-v0``, ``embodied/Libero-90-41-v0``), and LIBERO-PRO's perturbed suites the
same way (``embodied/Libero-spatial_swap-0-v0``, ``sim.libero.pro``). Registration reads the static
task table (``sim.libero.suites``) and imports neither LIBERO, robosuite, MuJoCo nor torch; the env
class is given as a string entry point and loads only on ``gymnasium.make``.
"""

from __future__ import annotations

import gymnasium as gym

from sim.libero.suites import MAX_EPISODE_STEPS, list_tasks

ENTRY_POINT = "sim.libero.env:LiberoEnv"


def register() -> list[str]:
    """Register all 130 LIBERO tasks and LIBERO-PRO's (idempotent); return their env ids."""
    ids = []
    for task in list_tasks(pro=True):
        if task.env_id not in gym.registry:
            gym.register(
                id=task.env_id,
                entry_point=ENTRY_POINT,
                max_episode_steps=MAX_EPISODE_STEPS[task.suite],
                kwargs={"suite": task.suite, "task_index": task.index},
            )
        ids.append(task.env_id)
    return ids
