"""The shipped AutoMoT policies' measured metrics, written into their model cards (``metrics``).

    python -m driving.automot.card [--episodes 4] [--seed 1000] [--only automot|noreason ...] [--dry-run]

Each shipped policy (``pipeline_automot.SHIPPED``: ``automot`` -> ``assets/checkpoints/automot``, ``noreason`` ->
``assets/checkpoints/automot_noreason``) is driven in closed loop by ``embodied drive eval``'s evaluator
(``driving.evaluate.evaluate_policy``: every scenario, episode ``j`` on seed ``seed + j``, each scenario's own
horizon, no videos) with its ``embodied drive eval --policy NAME`` defaults. The card gets the overall driving score,
success, collision and route-completion rates and each scenario's driving score, in % as every table people read
states them (``*_pct``), with the command that reproduces them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError, EmbodiedError
from core.pretrained import write_card_metrics

EPISODES = 5  # per scenario: 5 x 5 episodes, about 5 minutes per policy on 2 busy CPU cores
SEED = 1000  # the experiment's closed-loop seeds start here (embodied experiment automot --eval-seed)
OVERALL = {"driving_score": "driving_score_pct", "success_rate": "success_rate_pct",
           "collision_rate": "collision_rate_pct", "route_completion": "route_completion_pct"}


def closed_loop_metrics(policy: str, episodes: int = EPISODES, seed: int = SEED, out: str | Path | None = None,
                        ) -> dict[str, Any]:
    """Drive ``policy`` (a registered policy name, its shipped checkpoint) in every scenario -> the card's metrics."""
    from driving.evaluate import evaluate_policy
    from sim.driving.registration import SCENARIOS

    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    with tempfile.TemporaryDirectory(prefix="automot-card-") as tmp:
        report = evaluate_policy(policy, "all", episodes, Path(out) if out else Path(tmp), seed=seed, video=False,
                                 progress=False)
    overall = report["aggregate"]
    pct = lambda v: round(100.0 * float(v), 1)  # noqa: E731
    metrics: dict[str, Any] = {new: pct(overall[old]) for old, new in OVERALL.items() if old in overall}
    metrics["scenario_driving_score_pct"] = {name: pct(r["aggregate"]["driving_score"])
                                             for name, r in report["scenarios"].items()}
    horizons = ", ".join(f"{n} {SCENARIOS[n].horizon_s:g} s" for n in report["scenarios"])
    metrics["split"] = (f"closed loop, {len(report['scenarios'])} scenarios x {episodes} episodes (seeds {seed}.."
                        f"{seed + episodes - 1}), each scenario's horizon ({horizons}): `embodied drive eval --policy "
                        f"{policy} --scenario all --episodes {episodes} --seed {seed} --no-video`")
    metrics["episodes"] = len(report["episodes"])
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m driving.automot.card``: measure the shipped AutoMoT policies and write their cards."""
    from driving.automot.pipeline_automot import SHIPPED

    p = argparse.ArgumentParser(prog="python -m driving.automot.card", description=main.__doc__)
    p.add_argument("--episodes", type=int, default=EPISODES, help="episodes per scenario")
    p.add_argument("--seed", type=int, default=SEED, help="first episode seed")
    p.add_argument("--only", nargs="*", default=list(SHIPPED), choices=list(SHIPPED), help="which shipped policies")
    p.add_argument("--dry-run", action="store_true", help="print the metrics, write nothing")
    a = p.parse_args(argv)
    from core.bootstrap import prepare_process
    from core.resources import asset

    prepare_process()
    try:
        for policy in a.only:
            metrics = closed_loop_metrics(policy, a.episodes, a.seed)
            folder = asset(*SHIPPED[policy])
            if not a.dry_run:
                write_card_metrics(folder, metrics)
            print(f"{policy} ({folder}): " + ", ".join(f"{k}={v}" for k, v in metrics.items() if k != "split"))
    except EmbodiedError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
