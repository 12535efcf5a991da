"""Measure every scripted expert's success rate (and the random policy's), one table for the notes.

    python -m sim.report --episodes 10 --out outputs/sim_report.json [--families manipulation driving]

Manipulation envs run state-only (``image_size=0``: the expert never looks at pixels, and images cost
~6x the step time); driving runs with its observations. Episode ``j`` uses seed ``seed + j``.
"""

from __future__ import annotations

import argparse

from core.io import write_json


def measure(env_id: str, episodes: int, seed: int, policy: str, env_kwargs: dict) -> dict:
    from sim.rollout import RolloutConfig, rollout

    s = rollout(RolloutConfig(env_id=env_id, episodes=episodes, seed=seed, policy=policy, env_kwargs=env_kwargs,
                              progress=False)).summary
    return {"env": env_id, "policy": policy, "episodes": episodes, "success_rate": s["success_rate"],
            "mean_length": s["mean_length"], "failures": s["failures"], "steps_per_s": s.get("steps_per_s"),
            "wall_s": round(s["wall_s"], 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--families", nargs="+", choices=["manipulation", "driving"], default=["manipulation", "driving"])
    p.add_argument("--random", action="store_true", help="also measure the random policy")
    p.add_argument("--out", default="outputs/sim_report.json")
    args = p.parse_args(argv)

    from core.bootstrap import prepare_process

    prepare_process(learning_stack=False)
    rows = []
    if "manipulation" in args.families:
        from sim.manipulation.registration import env_ids

        for env_id in env_ids():
            for policy in ["scripted"] + (["random"] if args.random else []):
                rows.append(measure(env_id, args.episodes, args.seed, policy, {"image_size": 0}))
                print(rows[-1], flush=True)
    if "driving" in args.families:
        from sim.driving.registration import SCENARIOS

        for spec in SCENARIOS.values():
            for policy in ["scripted"] + (["random"] if args.random else []):
                rows.append(measure(spec.env_id, args.episodes, args.seed, policy, {}))
                print(rows[-1], flush=True)
    write_json(args.out, {"episodes": args.episodes, "seed": args.seed, "rows": rows})
    w = max((len(r["env"]) for r in rows), default=0)
    for r in rows:
        print(f"{r['env']:<{w}}  {r['policy']:<8}  success rate {r['success_rate']:.2f}  length {r['mean_length']:.0f} steps  "
              f"failures {r['failures']}  {r['steps_per_s'] or 0:.0f} steps/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
