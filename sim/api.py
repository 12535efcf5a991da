"""The contract every environment in ``sim`` keeps, so that one rollout loop and one recorder serve all.

Observations: a ``gymnasium.spaces.Dict``. Keys used across families:
    ``image``    (H, W, 3) uint8 RGB, upright (row 0 at the top), the main camera.
    ``proprio``  (P,) float32 robot / ego state (documented per env in ``metadata``).
Families add their own keys (``bev`` for driving, ``wrist_image`` ...); every key is written to
HDF5 as ``obs/<key>`` by the recorder.

``env.metadata`` (per registered env) holds:
    ``embodiment``         str, e.g. "Panda", "Sawyer+InspireHand", "ego_car".
    ``task``               str, e.g. "reach", "lift", "libero_spatial/0", "highway".
    ``family``             "manipulation" | "libero" | "driving".
    ``action_space_desc``  dict: ``dim`` (int), ``semantics`` (list[str], one per dim),
                           ``units`` (list[str] or str), ``frame`` (str), ``low`` / ``high``.
    ``language_instruction`` str or None.

``info`` after every ``step`` (and ``reset``) holds:
    ``success``       bool, task solved at this step.
    ``eef_delta``     (6,) float32 end-effector pose change over the step: dx, dy, dz in metres and
                      an axis-angle rotation in radians, both in the world frame (zeros for driving:
                      ``ego_delta`` holds the ego's (dx, dy, dyaw) in the ego frame instead).
    ``failure``       str, present only when the episode ended because the simulator failed
                      (e.g. "physics diverged: NaN in qpos"); the step is then ``terminated``.

Policies: ``env.unwrapped.make_expert(noise=..., seed=...)`` returns a scripted expert; experts and
the random policy follow ``Policy`` below.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

INFO_SUCCESS = "success"
INFO_EEF_DELTA = "eef_delta"
INFO_FAILURE = "failure"


@runtime_checkable
class Policy(Protocol):
    """Maps an observation (and the last ``info``) to an action in the env's action space."""

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode; ``seed`` makes any noise the policy adds reproducible."""

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """Return the action for this step."""


class RandomPolicy:
    """Uniform random actions from the env's action space, seeded through ``reset``."""

    def __init__(self, action_space):
        self.action_space = action_space

    def reset(self, seed: int | None = None) -> None:
        self.action_space.seed(seed)

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        return np.asarray(self.action_space.sample())
