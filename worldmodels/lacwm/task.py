"""``embodied train|eval lacwm`` and ``embodied train|eval eacwm``: the task functions (the CLI only dispatches).

Both methods share this module; the composed config's model (``configs/experiment/{lacwm,eacwm}.yaml``)
decides which world model is built.
train: record missing data -> pretrain -> adapt to the held-out embodiment (LAC-WM: 3-stage LoRA /
    projector / joint; EAC-WM: a new action encoder + LoRA).
evaluate: imagined-rollout error (vs copy-last-frame / shuffled actions), the latent probe (LAC-WM) and
    planning by candidate selection; writes ``<out_dir>/eval.json``.
"""

from __future__ import annotations

from typing import Any

from worldmodels.lacwm import experiments


def train(cfg) -> dict[str, Any]:
    """Pretrain and adapt the configured world model."""
    return experiments.train(cfg)


def evaluate(cfg) -> dict[str, Any]:
    """Evaluate the adapted world model on the held-out embodiment; writes ``<out_dir>/eval.json``."""
    return experiments.evaluate(cfg)


def load_policy(checkpoint, env):
    """``core.registry.POLICIES`` entry: a candidate-selection planner on this world model for ``env``."""
    from worldmodels.lacwm.planning import load_planner_policy

    return load_planner_policy(checkpoint, env)
