"""``embodied train lacwm`` / ``embodied eval lacwm``: the task functions (the CLI only dispatches).

train: record missing data -> pretrain LAC-WM -> 3-stage adaptation to the held-out embodiment.
evaluate: imagined-rollout error (vs copy-last-frame / shuffled actions) and the latent probe; eval.json.
"""

from __future__ import annotations

from typing import Any

from worldmodels.lacwm import experiments


def train(cfg) -> dict[str, Any]:
    """Pretrain and adapt LAC-WM under the composed config (configs/experiment/lacwm.yaml)."""
    return experiments.train(cfg)


def evaluate(cfg) -> dict[str, Any]:
    """Evaluate the adapted LAC-WM on the held-out embodiment; writes ``<out_dir>/eval.json``."""
    return experiments.evaluate(cfg)


def load_policy(checkpoint, env):
    """``core.registry.POLICIES`` entry: a candidate-selection planner on this world model for ``env``."""
    from worldmodels.lacwm.planning import load_planner_policy

    return load_planner_policy(checkpoint, env)
