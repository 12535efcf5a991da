"""AutoMoT as a driving policy: asynchronous inference, the optional refiner, a waypoint controller.

Every control step (5 Hz) the action expert plans from the current BEV raster, target points and ego state
against the understanding expert's cached prefix; the prefix (system prompt + the last ``history`` front frames
+ the navigation instruction) is re-encoded every ``update_interval`` steps (N = 1: synchronous). The plan —
the refined one when ``refiner`` is on, else the coarse head's — goes to ``driving.controller``'s waypoint
tracker (pure pursuit + PID speed), which returns ``[acceleration, steering]``.

``overlay()`` returns the last plan and meta-action for ``embodied drive eval``'s videos.

Factories (``core.registry.POLICIES``; ``embodied drive eval --policy automot|noreason [--policy-arg k=v]``):
``make_policy(env, checkpoint=None, update_interval=2, refiner=False, device="cpu", seed=0)`` — the shipped
AutoMoT checkpoint unless ``checkpoint`` names a policy folder; ``make_noreason_policy`` the same for the
VLA without its understanding expert.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.errors import CheckpointError, ConfigError

SHIPPED = {"automot": ("checkpoints", "automot"), "noreason": ("checkpoints", "automot_noreason")}


class AutoMoTPolicy:
    """``sim.api.Policy`` over a trained AutoMoT folder (see the module docstring)."""

    def __init__(self, env: Any, checkpoint: str | Path, update_interval: int = 2, refiner: bool = False,
                 device: str = "cpu", seed: int = 0):
        from driving.automot.task import load_model
        from driving.controller import WaypointController

        if int(update_interval) < 1:
            raise ConfigError(f"update_interval must be >= 1, got {update_interval}")
        self.vla = load_model(checkpoint, device)
        if refiner and self.vla.refiner is None:
            raise CheckpointError(f"{checkpoint}: refiner=true but this policy folder has no refiner")
        self.mot, self.device = self.vla.mot, device
        self.update_interval, self.use_refiner, self.seed = int(update_interval), bool(refiner), int(seed)
        self.history = int(self.vla.config.history)
        inner = env.unwrapped
        self.scenario = getattr(inner, "scenario", "highway")
        self.controller = WaypointController(dt=1.0 / float(getattr(inner, "policy_frequency", 5)))
        self.names = list(self.mot.cfg.meta_action_names)
        self.expects = _expects(checkpoint)
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        self.frames: deque[np.ndarray] = deque(maxlen=self.history)
        self.calls, self.prefix, self._overlay = 0, None, None
        self.generator = torch.Generator().manual_seed(self.seed if seed is None else int(seed))
        self.controller.reset()

    @torch.no_grad()
    def plan(self, obs: dict[str, Any], info: dict[str, Any]) -> tuple[np.ndarray, str]:
        """The waypoints (6, 2) (ego frame, m, 0.5 s apart) and meta-action for this step."""
        from driving.automot.inputs import live_sample, model_batch, to_device

        frame = np.asarray(obs["image"])
        if not self.frames:
            self.frames.extend([frame] * self.history)
        else:
            self.frames.append(frame)
        s = live_sample(list(self.frames), obs, info, self.scenario, self.mot.cfg.n_target, self.mot.cfg.n_route)
        fresh = self.mot.vlm is not None and (self.prefix is None or self.calls % self.update_interval == 0)
        batch = to_device(model_batch(s, self.vla.prompter if fresh else None, self.vla.spec), self.device)
        if fresh:
            self.prefix = self.mot.encode_prefix(batch)
        out = self.mot.act(self.prefix, batch)
        self.calls += 1
        wp = out.waypoints
        if self.use_refiner:
            wp = self.vla.refiner.refine(out.features, out.waypoints, generator=self.generator)
        return wp[0].float().cpu().numpy(), self.names[int(out.meta_logits[0].argmax())]

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        wp, meta = self.plan(obs, info)
        self._overlay = {"waypoints": wp, "meta_action": meta}
        return self.controller(wp, float(obs["ego_state"][3]))

    def overlay(self) -> dict[str, Any] | None:
        return self._overlay


def _expects(checkpoint: str | Path):
    """The driving env's spaces the policy reads (``sim.api.PolicySpec``; ``sim.rollout`` checks them)."""
    from sim.api import PolicySpec
    from sim.driving.env import ACTION_DIM, EGO_STATE_FIELDS
    from sim.driving.render import BEV_CHANNELS

    obs = {"image": (None, None, 3), "bev": (len(BEV_CHANNELS), None, None), "ego_state": (len(EGO_STATE_FIELDS),),
           "route": (None, 2)}
    return PolicySpec(obs, (ACTION_DIM,), source=str(checkpoint))


def _checkpoint(name: str, checkpoint: str | Path | None) -> Path:
    if checkpoint is not None:
        return Path(checkpoint)
    from core.resources import asset

    path = asset(*SHIPPED[name])
    if not Path(path).exists():
        raise CheckpointError(f"no shipped {name} checkpoint at {path}; train one (embodied train automot) and "
                              "pass --policy-arg checkpoint=DIR")
    return Path(path)


def make_policy(env: Any, checkpoint: str | Path | None = None, update_interval: int = 2, refiner: bool = False,
                device: str = "cpu", seed: int = 0) -> AutoMoTPolicy:
    """AutoMoT (the shipped checkpoint unless ``checkpoint`` is given)."""
    return AutoMoTPolicy(env, _checkpoint("automot", checkpoint), update_interval, refiner, device, seed)


def make_noreason_policy(env: Any, checkpoint: str | Path | None = None, update_interval: int = 1,
                         refiner: bool = False, device: str = "cpu", seed: int = 0) -> AutoMoTPolicy:
    """The VLA without its understanding expert (``model.arm=noreason``)."""
    return AutoMoTPolicy(env, _checkpoint("noreason", checkpoint), update_interval, refiner, device, seed)
