"""Closed-loop driving metrics: route completion, infractions and a Bench2Drive-like driving score.

Per episode (``episode_metrics`` from arrays, or ``EpisodeTracker`` fed ``DrivingEnv``'s ``info``):
    route_completion  progress / route length, clipped to [0, 1] (open-ended routes: the length is the
                      scenario's nominal speed x horizon).
    collisions        number of collision events (rising edges of ``info["crashed"]``), split into
                      ``collisions_vehicle`` and ``collisions_static``.
    offroad_events    number of times the ego left the road (rising edges of ``info["offroad"]``).
    timed_out         a FINITE route (merge, roundabout, intersection) was not completed when the horizon
                      ended (the episode was truncated, not terminated): Bench2Drive's "scenario timeout".
                      Never set on open-ended routes (highway, racetrack), where surviving is success.
    progress_m        distance driven along the route [m]; mean_speed_mps [m/s] over the episode's steps.
    mean_abs_jerk_mps3 / max_abs_jerk_mps3  longitudinal jerk [m/s^3] from second differences of the speed
                      (comfort; 0 for fewer than 3 speed samples).
    mean_abs_lat_acc_mps2 / max_abs_lat_acc_mps2  lateral acceleration speed x yaw rate [m/s^2], the yaw
                      rate from ``info["ego_delta"][2] / dt`` (0 when the infos carry no ``ego_delta``).
    max_abs_yaw_rate_rps  [rad/s].
    comfortable       every step within nuPlan's comfort bounds (``COMFORT_LIMITS``: |longitudinal jerk|
                      <= 4.13 m/s^3, |lateral acceleration| <= 4.89 m/s^2, |yaw rate| <= 0.95 rad/s).
    infraction_penalty  product over events of the coefficients in ``PENALTIES``: vehicle collision 0.6,
                      static collision 0.65 and scenario timeout 0.7 (CARLA leaderboard / Bench2Drive
                      values), off-road 0.7 (our choice: the leaderboard instead removes the off-road share
                      from route completion; here leaving the road also ends the episode).
    driving_score     route_completion x infraction_penalty, in [0, 1]; 0 for a FAILED episode.
    success           the env reported success and no infraction happened (Bench2Drive's success rate:
                      route completed with no infraction); False for a failed episode.
    failure           None, or the one-line reason the episode failed (the policy raised or returned a
                      NaN / inf / wrong-shape action, or the simulator diverged). A failed episode scores 0.

NAVSIM and Bench2Drive's further scores (per episode):
    pdms / epdms      NAVSIM v1's PDM score and v2's extended score, the mean over the episode's 4 s scenes
                      (``sim.driving.pdm``, which defines every sub-score); ``scenes`` holds each scene's
                      sub-scores, so a scenario's score is the mean over all its scenes (per scene, then averaged).
    efficiency        Bench2Drive's efficiency: the ego's speed over the mean speed of the vehicles within 50 m
                      (``info["neighbour_speed_mps"]``, None without any), averaged over 1 s checkpoints where such
                      traffic moves (> ``EFFICIENCY_MIN_SPEED``); NaN when it never does. Above 1: faster than the traffic.
    comfortness       Bench2Drive's comfortness: the share of 1 s segments (Bench2Drive: 20 frames at 20 Hz) whose
                      motion is within nuPlan's comfort bounds (``pdm.comfortable``).

``aggregate`` averages over episodes: driving_score (DS), success_rate (SR), collision_rate,
offroad_rate, timeout_rate and failure_rate (share of episodes with at least one such event),
comfort_rate (share of comfortable episodes), and the means of the other fields; pdms / epdms (and each
NAVSIM sub-score's mean, ``pdm_<name>``) over all scenes of all episodes; efficiency (over the episodes that
have one) and comfortness. All fractions are in [0, 1]; multiply by 100 for the leaderboard's percentages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

EFFICIENCY_MIN_SPEED = 0.1  # [m/s] checkpoints whose surrounding traffic is slower than this are skipped
CHECKPOINT_S = 1.0  # [s] Bench2Drive's efficiency checkpoints and comfortness segments (20 frames at 20 Hz)
PENALTIES: dict[str, float] = {"collision_vehicle": 0.6, "collision_static": 0.65, "offroad": 0.7, "timeout": 0.7}
# nuPlan's ego-comfort bounds (``ego_is_comfortable``): |lon. jerk| m/s^3, |lat. acceleration| m/s^2, |yaw rate| rad/s
COMFORT_LIMITS: dict[str, float] = {"jerk_mps3": 4.13, "lat_acc_mps2": 4.89, "yaw_rate_rps": 0.95}


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
    timed_out: bool = False
    mean_abs_lat_acc_mps2: float = 0.0
    max_abs_lat_acc_mps2: float = 0.0
    max_abs_yaw_rate_rps: float = 0.0
    comfortable: bool = True
    failure: str | None = None
    pdms: float = float("nan")
    epdms: float = float("nan")
    efficiency: float = float("nan")
    comfortness: float = float("nan")
    scenes: tuple = ()

    @property
    def collisions(self) -> int:
        """Total collision events."""
        return self.collisions_vehicle + self.collisions_static

    @property
    def failed(self) -> bool:
        """Whether the episode failed (policy error / invalid action / simulator failure)."""
        return self.failure is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        return asdict(self)


def infraction_penalty(
    collisions_vehicle: int = 0, collisions_static: int = 0, offroad_events: int = 0, timeouts: int = 0
) -> float:
    """Product of the ``PENALTIES`` coefficients over the infraction events."""
    counts = (collisions_vehicle, collisions_static, offroad_events, timeouts)
    if any(c < 0 for c in counts):
        raise ValueError(f"infraction counts must be >= 0, got {counts}")
    return float(
        PENALTIES["collision_vehicle"] ** collisions_vehicle
        * PENALTIES["collision_static"] ** collisions_static
        * PENALTIES["offroad"] ** offroad_events
        * PENALTIES["timeout"] ** timeouts
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
    timed_out: bool = False,
    yaw_rates: Sequence[float] | None = None,
    failure: str | None = None,
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
        timed_out: A finite route was not completed when the horizon ended (penalty ``PENALTIES["timeout"]``).
        yaw_rates: (T,) ego yaw rate over each step [rad/s] (lateral comfort); None: not measured (zeros).
        failure: The one-line reason the episode failed, or None; a failed episode scores 0, no success.

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
    w = np.zeros_like(v) if yaw_rates is None else np.asarray(yaw_rates, dtype=np.float64).reshape(-1)
    if w.shape != v.shape:
        raise ValueError(f"yaw_rates: expected {v.shape} like speeds, got {w.shape}")
    w = np.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
    jerk = np.diff(v, n=2) / dt**2 if len(v) >= 3 else np.zeros(0)
    lat = np.abs(v * w)
    rc = float(np.clip(progress_m / route_length_m, 0.0, 1.0))
    timed_out = bool(timed_out and not completed)
    penalty = infraction_penalty(collisions_vehicle, collisions_static, offroad_events, int(timed_out))
    clean = collisions_vehicle == 0 and collisions_static == 0 and offroad_events == 0
    max_jerk = float(np.abs(jerk).max()) if len(jerk) else 0.0
    max_lat = float(lat.max()) if len(lat) else 0.0
    max_yaw = float(np.abs(w).max()) if len(w) else 0.0
    comfortable = (max_jerk <= COMFORT_LIMITS["jerk_mps3"] and max_lat <= COMFORT_LIMITS["lat_acc_mps2"]
                   and max_yaw <= COMFORT_LIMITS["yaw_rate_rps"])
    return EpisodeMetrics(
        route_completion=rc,
        progress_m=float(progress_m),
        route_length_m=float(route_length_m),
        collisions_vehicle=int(collisions_vehicle),
        collisions_static=int(collisions_static),
        offroad_events=int(offroad_events),
        mean_speed_mps=float(v.mean()) if len(v) else 0.0,
        mean_abs_jerk_mps3=float(np.abs(jerk).mean()) if len(jerk) else 0.0,
        max_abs_jerk_mps3=max_jerk,
        infraction_penalty=penalty,
        driving_score=0.0 if failure is not None else rc * penalty,
        success=bool(completed and clean and failure is None),
        steps=len(v),
        timed_out=timed_out,
        mean_abs_lat_acc_mps2=float(lat.mean()) if len(lat) else 0.0,
        max_abs_lat_acc_mps2=max_lat,
        max_abs_yaw_rate_rps=max_yaw,
        comfortable=bool(comfortable),
        failure=None if failure is None else str(failure),
    )


class EpisodeTracker:
    """Accumulates ``DrivingEnv`` infos over one episode and returns its ``EpisodeMetrics``.

    Args:
        dt: Policy period of the env [s] (``1 / env.unwrapped.policy_frequency``).
        finite_route: The scenario's route has an end (merge, roundabout, intersection): a truncation
            before success is a timeout. False for open-ended routes (highway, racetrack).

    Usage: ``tracker.update(info, truncated)`` after every ``step`` (not after ``reset``), then
    ``tracker.result()``. An ``info["failure"]`` (simulator failure) marks the episode failed.
    """

    def __init__(self, dt: float, finite_route: bool = False, start_info: Mapping[str, Any] | None = None):
        self.dt = float(dt)
        self.finite_route = bool(finite_route)
        self.start_info = start_info  # the reset info: the first NAVSIM scene starts there
        self.infos: list[Mapping[str, Any]] = []
        self.failure_step: int | None = None
        self.speeds: list[float] = []
        self.yaw_rates: list[float] = []
        self.progress = 0.0
        self.route_length = 0.0
        self.collisions = {"vehicle": 0, "static": 0}
        self.offroad_events = 0
        self.completed = False
        self.truncated = False
        self.failure: str | None = None
        self._crashed = False
        self._offroad = False

    def update(self, info: Mapping[str, Any], truncated: bool = False) -> None:
        """Add one step's info (speed, progress, route_length, crashed, collision_with, offroad, success,
        optional ego_delta and failure); ``truncated``: the env truncated the episode at this step."""
        for key in ("speed", "progress", "route_length", "crashed", "offroad", "success"):
            if key not in info:
                raise KeyError(f"EpisodeTracker.update: info has no {key!r} (is this a DrivingEnv info?)")
        self.speeds.append(float(info["speed"]))
        delta = info.get("ego_delta")
        self.yaw_rates.append(float(np.asarray(delta).reshape(-1)[2]) / self.dt if delta is not None else 0.0)
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
        self.truncated = bool(truncated)
        if info.get("failure") and self.failure is None:
            self.failure = f"simulator failure: {info['failure']}"
            self.failure_step = len(self.infos)
        self.infos.append(info)

    def result(self, failure: str | None = None) -> EpisodeMetrics:
        """The episode's metrics so far; ``failure`` (e.g. the policy's error) overrides a simulator failure."""
        import dataclasses

        m = episode_metrics(
            self.speeds,
            self.progress,
            self.route_length,
            self.dt,
            self.collisions["vehicle"],
            self.collisions["static"],
            self.offroad_events,
            self.completed,
            timed_out=self.finite_route and self.truncated and not self.completed,
            yaw_rates=self.yaw_rates,
            failure=failure if failure is not None else self.failure,
        )
        if not self.infos:
            return m
        from sim.driving import pdm

        fail_at = self.failure_step if self.failure_step is not None else (
            len(self.infos) - 1 if failure is not None else None)
        start = self.start_info if self.start_info is not None else self.infos[0]
        scenes = pdm.episode_scenes(self.infos, start, self.dt,
                                    self.route_length if self.finite_route else None, failure_step=fail_at)
        means = pdm.mean_scores(scenes)
        return dataclasses.replace(
            m, pdms=means["pdms"], epdms=means["epdms"], scenes=tuple(scenes),
            efficiency=efficiency(self.speeds, [_nan(i.get("neighbour_speed_mps")) for i in self.infos], self.dt),
            comfortness=comfortness([float(start["speed"]), *self.speeds],
                                    [pdm.yaw_rate(start, self.dt), *self.yaw_rates], self.dt))


def _nan(value: Any) -> float:
    return float("nan") if value is None else float(value)


def efficiency(speeds: Sequence[float], neighbour_speeds: Sequence[float], dt: float) -> float:
    """Bench2Drive's efficiency: mean over ``CHECKPOINT_S`` checkpoints of ego speed / surrounding traffic's speed."""
    every = max(int(round(CHECKPOINT_S / dt)), 1)
    ratios = [float(speeds[k]) / float(neighbour_speeds[k]) for k in range(every - 1, len(speeds), every)
              if np.isfinite(neighbour_speeds[k]) and neighbour_speeds[k] > EFFICIENCY_MIN_SPEED]
    return float(np.mean(ratios)) if ratios else float("nan")


def comfortness(speeds: Sequence[float], yaw_rates: Sequence[float], dt: float) -> float:
    """Bench2Drive's comfortness: the share of ``CHECKPOINT_S`` segments within nuPlan's comfort bounds.

    ``speeds`` / ``yaw_rates``: the motion from the first state on (the reset state, then every step).
    """
    from sim.driving.pdm import comfortable

    every = max(int(round(CHECKPOINT_S / dt)), 1)
    segments = [(speeds[k:k + every + 1], yaw_rates[k:k + every + 1]) for k in range(0, len(speeds) - 1, every)]
    segments = [(v, w) for v, w in segments if len(v) >= 2]
    return float(np.mean([comfortable(v, w, dt) for v, w in segments])) if segments else 1.0


def aggregate(episodes: Iterable[EpisodeMetrics]) -> dict[str, float]:
    """Average episode metrics into the leaderboard summary.

    Returns:
        Dict with ``episodes`` (count), ``driving_score`` (DS, mean), ``success_rate`` (SR),
        ``collision_rate`` / ``offroad_rate`` / ``timeout_rate`` / ``failure_rate`` (share of episodes with
        at least one such event), ``comfort_rate`` (share of comfortable episodes), ``infraction_penalty``,
        ``route_completion``, ``progress_m``, ``mean_speed_mps``, ``mean_abs_jerk_mps3``,
        ``max_abs_jerk_mps3``, ``mean_abs_lat_acc_mps2`` (means over episodes). Empty input raises ``ValueError``.
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
        "timeout_rate": mean(e.timed_out for e in eps),
        "failure_rate": mean(e.failed for e in eps),
        "comfort_rate": mean(e.comfortable for e in eps),
        "infraction_penalty": mean(e.infraction_penalty for e in eps),
        "route_completion": mean(e.route_completion for e in eps),
        "progress_m": mean(e.progress_m for e in eps),
        "mean_speed_mps": mean(e.mean_speed_mps for e in eps),
        "mean_abs_jerk_mps3": mean(e.mean_abs_jerk_mps3 for e in eps),
        "max_abs_jerk_mps3": mean(e.max_abs_jerk_mps3 for e in eps),
        "mean_abs_lat_acc_mps2": mean(e.mean_abs_lat_acc_mps2 for e in eps),
        **navsim_aggregate(eps),
        "efficiency": nanmean(e.efficiency for e in eps),
        "comfortness": nanmean(e.comfortness for e in eps),
    }


def nanmean(values: Iterable[float]) -> float:
    """Mean of the finite values (NaN when none)."""
    v = [float(x) for x in values if np.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def navsim_aggregate(eps: Sequence[EpisodeMetrics]) -> dict[str, float]:
    """``pdms``, ``epdms`` and ``pdm_<sub-score>`` over every scene of ``eps`` (per scene, then averaged)."""
    from sim.driving.pdm import mean_scores

    scenes = [s for e in eps for s in e.scenes]
    if not scenes:
        return {"pdms": float("nan"), "epdms": float("nan")}
    means = mean_scores(scenes)
    return {"pdms": means.pop("pdms"), "epdms": means.pop("epdms"),
            **{f"pdm_{k}": v for k, v in means.items()}}


#: Bench2Drive's five abilities and the scenarios of ours that exercise each (its success rate there is the
#: ability's); an ability with no scenario says why our simulator cannot express it. The racetrack (curved lane
#: following at speed) exercises none of the five.
ABILITIES: dict[str, dict[str, Any]] = {
    "merging": {"scenarios": ("merge",)},
    "overtaking": {"scenarios": ("highway",)},
    "give_way": {"scenarios": ("roundabout", "intersection")},
    "emergency_brake": {"scenarios": (), "reason": "no scripted hazard: the traffic never brakes suddenly or cuts "
                                                   "in ahead of the ego"},
    "traffic_sign": {"scenarios": (), "reason": "highway-env has no traffic lights or signs"},
}


def ability_table(success: Mapping[str, Sequence[bool]]) -> dict[str, dict[str, Any]]:
    """Per ability: ``{"scenarios", "episodes", "success_rate"}`` from ``{scenario: [success per episode]}``
    (only the scenarios that were run; ``success_rate`` None when none was), or ``{"scenarios": (), "reason"}``."""
    out: dict[str, dict[str, Any]] = {}
    for name, spec in ABILITIES.items():
        if not spec["scenarios"]:
            out[name] = {"scenarios": [], "reason": spec["reason"]}
            continue
        runs = [bool(x) for sc in spec["scenarios"] for x in success.get(sc, ())]
        out[name] = {"scenarios": list(spec["scenarios"]), "episodes": len(runs),
                     "success_rate": float(np.mean(runs)) if runs else None}
    return out
