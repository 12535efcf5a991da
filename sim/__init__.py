"""Simulators: environments, scripted experts, vectorised rollouts, recorders and dataset renderers.

Importing ``sim`` is light: it imports no physics engine. Environments are registered with
Gymnasium under the ``embodied/`` namespace by string entry point (``register_envs``); the heavy
modules (robosuite, LIBERO, highway-env, Mitsuba) load only when an environment is made.

Families (one sub-package each, each with a light ``registration.py`` that has ``register()``):
    manipulation   multi-embodiment robosuite suite (arms and a dexterous hand), shared tasks
    libero         LIBERO suites built offline from BDDL files and init states
    driving        highway-env scenarios behind one continuous-control adapter
Dataset renderers for perception live in ``sim.render``.
"""

from __future__ import annotations

import importlib

FAMILIES: tuple[str, ...] = ("manipulation", "libero", "driving")
NAMESPACE = "embodied"

_registered = False


def register_envs() -> None:
    """Register every family's environments with Gymnasium (idempotent, imports no simulator)."""
    global _registered
    if _registered:
        return
    for family in FAMILIES:
        importlib.import_module(f"sim.{family}.registration").register()
    _registered = True
