"""``embodied drive eval``: closed-loop driving evaluation of a policy in the highway-env scenarios.

Drives N seeded episodes of a scenario, records them (HDF5 driving logs in the trajectory format +
mp4 front-camera videos), and scores each with ``sim.driving.metrics`` (route completion, collisions,
off-road, comfort, driving score). Policies: ``idm`` (the privileged IDM + MOBIL expert), ``constant``
(keep lane at constant speed), ``random``, a checkpoint directory of a method that drives, or ``automot``
(the driving VLA, once it is built). Episode ``j`` uses seed ``seed + j`` for every policy, so the rows of
different policies are paired.

Outputs in ``--out``: ``metrics.json`` (per-episode rows + the aggregate), the recorder's HDF5 /
``videos/`` / ``summary.json``, and ``config.json``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from core.errors import ConfigError, NotBuiltError
from core.io import write_json

BUILTIN_POLICIES = ("idm", "constant", "random")


def _lane_keeping(env):
    from sim.driving.expert import LaneKeepingPolicy

    return LaneKeepingPolicy(env.unwrapped)


def scenario_env_id(scenario: str) -> str:
    """``"highway"`` -> ``"embodied/Drive-Highway-v0"`` (checked against the registered scenarios)."""
    from sim.driving.registration import SCENARIOS

    if scenario not in SCENARIOS:
        raise ConfigError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    return SCENARIOS[scenario].env_id


def evaluate_policy(policy: str, scenario: str, episodes: int, out: str | Path, seed: int = 0,
                    video: bool = True) -> dict[str, Any]:
    """Run and score ``episodes`` episodes; returns ``{"aggregate": {...}, "episodes": [...]}``."""
    import sim
    from sim.driving.metrics import EpisodeTracker, aggregate
    from sim.recorder import record_rollout
    from sim.rollout import RolloutConfig, policy_factory

    sim.register_envs()
    env_id = scenario_env_id(scenario)
    if policy == "automot":
        raise NotBuiltError("policy 'automot' needs the AutoMoT driving VLA (driving/), which is not built yet")
    if policy == "idm":
        factory, name = policy_factory("scripted", noise=0.0), "scripted"
    elif policy == "constant":
        factory, name = functools.partial(_lane_keeping), "constant"
    elif policy == "random":
        factory, name = policy_factory("random"), "random"
    elif Path(policy).exists():
        factory, name = policy_factory(policy), policy
    else:
        raise ConfigError(f"--policy {policy!r}: expected automot, idm, constant, random or a checkpoint path")
    cfg = RolloutConfig(env_id=env_id, episodes=episodes, seed=seed, policy=name, noise=0.0)
    result = record_rollout(cfg, out, video=video, policy=factory)
    import gymnasium as gym

    probe = gym.make(env_id)
    dt = 1.0 / probe.unwrapped.policy_frequency
    probe.close()
    rows, metrics = [], []
    for ep in result.episodes:
        tracker = EpisodeTracker(dt)
        for info in ep.infos:
            tracker.update(info)
        m = tracker.result()
        metrics.append(m)
        rows.append({"episode": ep.index, "seed": ep.seed, **m.to_dict(), "failure": ep.failure})
    report = {"policy": policy, "scenario": scenario, "env_id": env_id, "seed": seed,
              "aggregate": aggregate(metrics), "episodes": rows}
    write_json(Path(out) / "metrics.json", report)
    return report


def drive_eval(args) -> int:
    """CLI entry (``embodied drive eval``)."""
    from core.bootstrap import prepare_process

    prepare_process()
    from core.outputs import claim_output

    with claim_output(args.out, command="drive eval", overwrite=getattr(args, "overwrite", False)) as out:
        report = evaluate_policy(args.policy, args.scenario, args.episodes, out, seed=args.seed,
                                 video=not args.no_video)
    a = report["aggregate"]
    print(f"{report['env_id']} / {args.policy} over {a['episodes']} episodes: driving score {a['driving_score']:.3f}, "
          f"success rate {a['success_rate']:.2f}, collision rate {a['collision_rate']:.2f}, off-road rate "
          f"{a['offroad_rate']:.2f}, route completion {a['route_completion']:.2f} (all fractions in [0, 1]), "
          f"mean speed {a['mean_speed_mps']:.1f} m/s -> {args.out}")
    return 0
