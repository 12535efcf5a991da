"""Closed-loop driving metrics: route completion, infractions and a Bench2Drive-like driving score.

Per episode (``episode_metrics`` from arrays, or ``EpisodeTracker`` fed ``DrivingEnv``'s ``info``):
    route_completion  progress / route length, clipped to [0, 1] (open-ended routes: the length is the
                      scenario's nominal speed x horizon).
    collisions        number of collision events (rising edges of ``info["crashed"]``), split into
                      ``collisions_vehicle`` and ``collisions_static``.
    offroad_events    number of times the ego left the road (rising edges of ``info["offroad"]``).
    progress_m        distance driven along the route [m]; mean_speed_mps [m/s] over the episode's steps.
    mean_abs_jerk_mps3 / max_abs_jerk_mps3  longitudinal jerk [m/s^3] from second differences of the speed
                      (comfort; 0 for fewer than 3 speed samples).
    infraction_penalty  product over events of the coefficients in ``PENALTIES``: vehicle collision 0.6
                      and static collision 0.65 (CARLA leaderboard / Bench2Drive values), off-road 0.7
                      (our choice: the leaderboard instead removes the off-road share from route
                      completion; here leaving the road also ends the episode).
    driving_score     route_completion x infraction_penalty, in [0, 1].
    success           the env reported success and no infraction happened (Bench2Drive's success rate:
                      route completed with no infraction).

``aggregate`` averages over episodes: driving_score (DS), success_rate (SR), collision_rate and
offroad_rate (share of episodes with at least one), and the means of the other fields. All fractions
are in [0, 1]; multiply by 100 for the leaderboard's percentages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

PENALTIES: dict[str, float] = {"collision_vehicle": 0.6, "collision_static": 0.65, "offroad": 0.7}


@dataclass(frozen=True)
class EpisodeMetrics:
    """Closed-loop metrics of one episode (see the module docstring for each field)."""

    route_completion: float
    progress_m: float
    route_length_m: float
    collisions_vehicle: int
    collisions_static: int
    offroad_events: int
    mean_speed_mps: float
    mean_abs_jerk_mps3: float
    max_abs_jerk_mps3: float
    infraction_penalty: float
    driving_score: float
    success: bool
    steps: int

    @property
    def collisions(self) -> int:
        """Total collision events."""
        return self.collisions_vehicle + self.collisions_static

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        return asdict(self)


def infraction_penalty(
    collisions_vehicle: int = 0, collisions_static: int = 0, offroad_events: int = 0
) -> float:
    """Product of the ``PENALTIES`` coefficients over the infraction events."""
    counts = (collisions_vehicle, collisions_static, offroad_events)
    if any(c < 0 for c in counts):
        raise ValueError(f"infraction counts must be >= 0, got {counts}")
    return float(
        PENALTIES["collision_vehicle"] ** collisions_vehicle
        * PENALTIES["collision_static"] ** collisions_static
        * PENALTIES["offroad"] ** offroad_events
    )


def episode_metrics(
    speeds: Sequence[float],
    progress_m: float,
    route_length_m: float,
    dt: float,
    collisions_vehicle: int = 0,
    collisions_static: int = 0,
    offroad_events: int = 0,
    completed: bool = False,
) -> EpisodeMetrics:
    """Metrics of one episode from its per-step speeds and its final progress.

    Args:
        speeds: (T,) ego speed after each step [m/s].
        progress_m: Final distance along the route [m].
        route_length_m: Route length [m] (> 0).
        dt: Time between speed samples [s] (> 0).
        collisions_vehicle: Collision events with other vehicles.
        collisions_static: Collision events with static obstacles.
        offroad_events: Off-road events.
        completed: The env reported success (route end reached / horizon survived).

    Returns:
        The episode's ``EpisodeMetrics``.
    """
    if not route_length_m > 0:
        raise ValueError(f"route_length_m must be > 0, got {route_length_m}")
    if not dt > 0:
        raise ValueError(f"dt must be > 0, got {dt}")
    v = np.asarray(speeds, dtype=np.float64).reshape(-1)
    if not np.isfinite(v).all():
        raise ValueError("speeds contain NaN / inf")
    jerk = np.diff(v, n=2) / dt**2 if len(v) >= 3 else np.zeros(0)
    rc = float(np.clip(progress_m / route_length_m, 0.0, 1.0))
    penalty = infraction_penalty(collisions_vehicle, collisions_static, offroad_events)
    clean = collisions_vehicle == 0 and collisions_static == 0 and offroad_events == 0
    return EpisodeMetrics(
        route_completion=rc,
        progress_m=float(progress_m),
        route_length_m=float(route_length_m),
        collisions_vehicle=int(collisions_vehicle),
        collisions_static=int(collisions_static),
        offroad_events=int(offroad_events),
        mean_speed_mps=float(v.mean()) if len(v) else 0.0,
        mean_abs_jerk_mps3=float(np.abs(jerk).mean()) if len(jerk) else 0.0,
        max_abs_jerk_mps3=float(np.abs(jerk).max()) if len(jerk) else 0.0,
        infraction_penalty=penalty,
        driving_score=rc * penalty,
        success=bool(completed and clean),
        steps=len(v),
    )


class EpisodeTracker:
    """Accumulates ``DrivingEnv`` infos over one episode and returns its ``EpisodeMetrics``.

    Args:
        dt: Policy period of the env [s] (``1 / env.unwrapped.policy_frequency``).

    Usage: ``tracker.update(info)`` after every ``step`` (not after ``reset``), then ``tracker.result()``.
    """

    def __init__(self, dt: float):
        self.dt = float(dt)
        self.speeds: list[float] = []
        self.progress = 0.0
        self.route_length = 0.0
        self.collisions = {"vehicle": 0, "static": 0}
        self.offroad_events = 0
        self.completed = False
        self._crashed = False
        self._offroad = False

    def update(self, info: Mapping[str, Any]) -> None:
        """Add one step's info (speed, progress, route_length, crashed, collision_with, offroad, success)."""
        for key in ("speed", "progress", "route_length", "crashed", "offroad", "success"):
            if key not in info:
                raise KeyError(f"EpisodeTracker.update: info has no {key!r} (is this a DrivingEnv info?)")
        self.speeds.append(float(info["speed"]))
        self.progress = float(info["progress"])
        self.route_length = float(info["route_length"])
        crashed, offroad = bool(info["crashed"]), bool(info["offroad"])
        if crashed and not self._crashed:
            kind = "static" if info.get("collision_with") == "static" else "vehicle"
            self.collisions[kind] += 1
        if offroad and not self._offroad:
            self.offroad_events += 1
        self._crashed, self._offroad = crashed, offroad
        self.completed = self.completed or bool(info["success"])

    def result(self) -> EpisodeMetrics:
        """The episode's metrics so far."""
        return episode_metrics(
            self.speeds,
            self.progress,
            self.route_length,
            self.dt,
            self.collisions["vehicle"],
            self.collisions["static"],
            self.offroad_events,
            self.completed,
        )


def aggregate(episodes: Iterable[EpisodeMetrics]) -> dict[str, float]:
    """Average episode metrics into the leaderboard summary.

    Returns:
        Dict with ``episodes`` (count), ``driving_score`` (DS, mean), ``success_rate`` (SR),
        ``collision_rate`` / ``offroad_rate`` (share of episodes with at least one event),
        ``infraction_penalty``, ``route_completion``, ``progress_m``, ``mean_speed_mps``, ``mean_abs_jerk_mps3``
        (means over episodes). Empty input raises ``ValueError``.
    """
    eps = list(episodes)
    if not eps:
        raise ValueError("aggregate: no episodes")

    def mean(values: Iterable[float]) -> float:
        return float(np.mean(list(values)))

    return {
        "episodes": len(eps),
        "driving_score": mean(e.driving_score for e in eps),
        "success_rate": mean(e.success for e in eps),
        "collision_rate": mean(e.collisions > 0 for e in eps),
        "offroad_rate": mean(e.offroad_events > 0 for e in eps),
        "infraction_penalty": mean(e.infraction_penalty for e in eps),
        "route_completion": mean(e.route_completion for e in eps),
        "progress_m": mean(e.progress_m for e in eps),
        "mean_speed_mps": mean(e.mean_speed_mps for e in eps),
        "mean_abs_jerk_mps3": mean(e.mean_abs_jerk_mps3 for e in eps),
    }
