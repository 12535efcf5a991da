"""Light registration of the driving scenarios: a plain-data scenario table, no highway-env import.

Env ids are ``embodied/Drive-<Scenario>-v0`` (e.g. ``embodied/Drive-Highway-v0``); every id builds
``sim.driving.env:DrivingEnv`` with ``scenario=<name>``. Keyword arguments given to ``gymnasium.make``
(``horizon_s``, ``image_size``, ...) override the table's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "embodied"
ENTRY_POINT = "sim.driving.env:DrivingEnv"


@dataclass(frozen=True)
class ScenarioSpec:
    """One highway-env scenario behind the continuous-control adapter.

    Attributes:
        name: Scenario name, ``metadata["task"]`` and the lower-case form of the env id's middle part.
        env_class: Import path of the highway-env class (``module:Class``).
        config: Overrides of that class's default config (merged over highway-env's defaults).
        horizon_s: Episode length in simulated seconds before truncation.
        expert_speed: Cruise speed the IDM expert aims for [m/s] (IDM clips it to the lane speed limit).
        destination: Road-network node the route leads to, or None for an open-ended route that follows
            the road (highway, racetrack).
        goal_s: Where the route ends on its last lane [m along that lane]; reaching it is success.
            None for open-ended routes: there success means surviving the horizon.
        nominal_speed: For open-ended routes, the route length is ``nominal_speed * horizon_s`` [m/s].
        instruction: The navigation instruction, ``metadata["language_instruction"]``.
        yield_roads: On the route's first ``yield_roads`` roads (the approach) the expert applies gap
            acceptance before entering (intersection: priority rules; roundabout: circulating traffic).
        junction_radius_m: The junction is the disc of this radius around highway-env's origin (its centre in
            the intersection and roundabout maps); 0: no junction. NAVSIM's lane keeping is off inside it.
    """

    name: str
    env_class: str
    config: dict
    horizon_s: float
    expert_speed: float
    destination: str | None = None
    goal_s: float | None = None
    nominal_speed: float = 0.0
    instruction: str = ""
    yield_roads: int = 0
    junction_radius_m: float = 0.0

    @property
    def env_id(self) -> str:
        """The Gymnasium id, e.g. ``embodied/Drive-Highway-v0``."""
        return f"{NAMESPACE}/Drive-{self.name.capitalize()}-v0"

    @property
    def open_ended(self) -> bool:
        """True when the route has no end point (success = surviving the horizon)."""
        return self.destination is None and self.goal_s is None


SCENARIOS: dict[str, ScenarioSpec] = {
    s.name: s
    for s in (
        # highway-fast-v0: 3 lanes, 20 IDM cars, 5 Hz physics (ENV.md: ~6x faster than highway-v0).
        ScenarioSpec(
            "highway",
            "highway_env.envs.highway_env:HighwayEnvFast",
            {},
            horizon_s=30.0,
            expert_speed=28.0,
            nominal_speed=25.0,
            instruction="Drive along the highway, overtake slower traffic and avoid collisions.",
        ),
        # Ego on the right lane of a 2-lane highway with an on-ramp; the route ends where highway-env's
        # merge-v0 ends (x = 370 m, i.e. 60 m into the last road segment "c" -> "d").
        ScenarioSpec(
            "merge",
            "highway_env.envs.merge_env:MergeEnv",
            {},
            horizon_s=20.0,
            expert_speed=28.0,
            destination="d",
            goal_s=60.0,
            instruction="Drive past the on-ramp and let merging vehicles in.",
        ),
        # Enter the roundabout from the south and leave it to the north (highway-env's own ego route),
        # 20 m down the exit road.
        ScenarioSpec(
            "roundabout",
            "highway_env.envs.roundabout_env:RoundaboutEnv",
            {},
            horizon_s=25.0,
            expert_speed=10.0,
            destination="nxr",
            goal_s=20.0,
            instruction="Enter the roundabout, go straight through it and take the north exit.",
            yield_roads=2,
            junction_radius_m=40.0,  # the ring (radius 20-24 m) and its entry / exit curves
        ),
        # Four-way intersection, ego from the south to exit "o1"; arrival is highway-env's own test
        # (25 m down the exit lane).
        ScenarioSpec(
            "intersection",
            "highway_env.envs.intersection_env:IntersectionEnv",
            {"destination": "o1"},
            horizon_s=20.0,
            expert_speed=9.0,
            destination="o1",
            goal_s=25.0,
            instruction="Cross the intersection, yield to traffic with priority, and take the exit.",
            yield_roads=1,
            junction_radius_m=20.0,  # the crossing area and its turning curves
        ),
        # Two-lane closed circuit with one slower car ahead, speed limit 10 m/s.
        ScenarioSpec(
            "racetrack",
            "highway_env.envs.racetrack_env:RacetrackEnv",
            {},
            horizon_s=30.0,
            expert_speed=10.0,
            nominal_speed=9.0,
            instruction="Follow the circuit, stay on the track and pass the slower car.",
        ),
    )
}


def register() -> None:
    """Register every scenario with Gymnasium (idempotent; imports no simulator)."""
    import gymnasium as gym

    for spec in SCENARIOS.values():
        if spec.env_id not in gym.registry:
            gym.register(id=spec.env_id, entry_point=ENTRY_POINT, kwargs={"scenario": spec.name})
