"""``embodied drive leaderboard``: several policies on every scenario with paired seeds, one table to read beside
Bench2Drive's and NAVSIM's.

Each row is one ``drive eval --scenario all`` run (``driving.evaluate.evaluate_policy``) into ``OUT/rows/<row>``;
every row drives the same episode seeds (episode ``j`` of every scenario uses ``seed + j``), so rows are
paired. A row whose ``summary.json`` exists is not run again: rerun the command to resume after a kill.
``OUT/leaderboard.md`` / ``leaderboard.json`` hold, per row, over all its episodes:

    DS, efficiency, comfortness               mean over episodes and 95 % interval (1.96 standard errors)
    PDMS, EPDMS                               mean over scenes (as NAVSIM defines them) and 95 % interval (1.96
                                              cluster-robust standard errors, episodes as clusters)
    SR                                        share of episodes, Wilson 95 % interval (``core.metrics``)
    latency                                   the policy's time per control step, p50 / p99 [ms]
    abilities                                 Bench2Drive's per-ability success (``sim.driving.metrics.ABILITIES``)

Default rows (``DEFAULT_ROWS``): the privileged expert (``expert``: IDM + MOBIL, the driver ``idm`` names too),
``constant`` (keep lane at constant speed), ``random``, the shipped AutoMoT synchronous (``update_interval=1``:
the VLM prefix every step) and asynchronous (``update_interval=2``, its default, and ``4``), and AutoMoT without
reasoning (``noreason``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigError
from core.io import read_json, write_json, write_text

#: row name -> (policy, policy args)
DEFAULT_ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "expert (IDM)": ("expert", {}),
    "constant": ("constant", {}),
    "random": ("random", {}),
    "AutoMoT sync (N=1)": ("automot", {"update_interval": 1}),
    "AutoMoT async (N=2)": ("automot", {"update_interval": 2}),
    "AutoMoT async (N=4)": ("automot", {"update_interval": 4}),
    "AutoMoT w/o reasoning": ("noreason", {}),
}
COLUMNS = ("DS", "SR", "PDMS", "EPDMS", "efficiency", "comfortness", "latency p50 / p99 ms")


def parse_row(text: str) -> tuple[str, tuple[str, dict[str, Any]]]:
    """``"NAME=POLICY[,key=value ...]"`` -> ``(NAME, (POLICY, {key: value}))`` (values as ``--policy-arg`` parses).

    Raises:
        ConfigError: Without ``NAME=POLICY``.
    """
    from sim.policies import parse_policy_args

    name, sep, rest = text.partition("=")
    parts = rest.split(",")
    if not sep or not name.strip() or not parts[0].strip():
        raise ConfigError(f"--row {text!r}: expected NAME=POLICY[,key=value ...], e.g. 'fast=automot,update_interval=4'")
    return name.strip(), (parts[0].strip(), parse_policy_args([p for p in parts[1:] if p.strip()]))


def row_folder(out: Path, name: str) -> Path:
    """``OUT/rows/<name>`` with the name made a safe folder name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("_") or "row"
    return out / "rows" / safe


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean and 1.96 standard errors (NaNs dropped; a single value has no interval)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    if not len(v):
        return float("nan"), float("nan"), float("nan")
    m = float(v.mean())
    half = 1.96 * float(v.std(ddof=1)) / math.sqrt(len(v)) if len(v) > 1 else 0.0
    return m, m - half, m + half


def scene_mean_interval(episodes: Sequence[Mapping[str, Any]], key: str) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of a per-scene score (``pdms`` / ``epdms``) over every scene of ``episodes``.

    The mean is over scenes (as the score is defined); scenes of one episode are not independent, so the interval is
    the ratio estimator's: 1.96 cluster-robust standard errors with the episodes as clusters,
    ``sqrt(sum_e (S_e - m n_e)^2 * E / (E - 1)) / sum_e n_e`` (``S_e``: the episode's scene scores summed, ``n_e``
    its scene count, ``E`` episodes).
    """
    sums = np.array([sum(float(s[key]) for s in e.get("scenes") or ()) for e in episodes])
    counts = np.array([len(e.get("scenes") or ()) for e in episodes], dtype=np.float64)
    if counts.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(sums.sum() / counts.sum())
    k = len(episodes)
    if k < 2:
        return m, m, m
    half = 1.96 * math.sqrt(float(((sums - m * counts) ** 2).sum()) * k / (k - 1)) / float(counts.sum())
    return m, m - half, m + half


def row_figures(summary: Mapping[str, Any], episodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One row's figures from its ``summary.json`` and episode rows (``<scenario>/episodes.jsonl``)."""
    from core.metrics import wilson_interval

    out: dict[str, Any] = {"episodes": len(episodes)}
    for key in ("driving_score", "efficiency", "comfortness", "pdms", "epdms"):
        if key in ("pdms", "epdms"):  # per scene, then averaged: summary.json's overall figure
            m, lo, hi = scene_mean_interval(episodes, key)
        else:
            m, lo, hi = mean_interval([e.get(key) for e in episodes])
        if key != "efficiency":  # scores in [0, 1]; efficiency is a speed ratio, unbounded above
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        out[key] = {"mean": m, "lo": lo, "hi": hi}
    k = sum(bool(e["success"]) for e in episodes)
    lo, hi = wilson_interval(k, len(episodes))
    out["success_rate"] = {"mean": k / len(episodes) if episodes else float("nan"), "lo": lo, "hi": hi}
    lat = summary.get("latency") or {}
    out["latency_ms"] = {"p50": lat.get("latency_ms_p50"), "p99": lat.get("latency_ms_p99")}
    out["abilities"] = summary.get("abilities") or {}
    return out


def read_row(folder: Path) -> dict[str, Any]:
    """A finished row's figures (its ``summary.json`` and the episodes of every scenario)."""
    import json

    summary = read_json(folder / "summary.json")
    episodes = [json.loads(line) for name in summary["scenarios"]
                for line in (folder / name / "episodes.jsonl").read_text().splitlines() if line.strip()]
    return {"summary": summary, **row_figures(summary, episodes)}


def _pct(f: Mapping[str, float]) -> str:
    if not np.isfinite(f["mean"]):
        return "—"
    return f"{100 * f['mean']:.1f} [{100 * f['lo']:.1f}, {100 * f['hi']:.1f}]"


def table(rows: Mapping[str, Mapping[str, Any]], episodes: int, seed: int) -> str:
    """``leaderboard.md``: the policy x score table, then the policies' Bench2Drive abilities."""
    lines = [f"# Closed-loop driving leaderboard: {episodes} episodes per scenario, seeds {seed}..{seed + episodes - 1} "
             "(paired: every row drives the same episodes)", "",
             "Scores in % with 95 % intervals (DS, efficiency, comfortness: 1.96 standard errors over episodes; SR: "
             "Wilson; PDMS / EPDMS: NAVSIM's scores of each 4 s scene averaged over scenes, 1.96 cluster-robust "
             "standard errors with episodes as clusters; sim/driving/pdm.py); latency is the policy's time per "
             "control step on this machine.", "",
             "| policy | " + " | ".join(COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for name, r in rows.items():
        lat = r["latency_ms"]
        latency = "—" if lat.get("p50") is None else f"{lat['p50']:.1f} / {lat['p99']:.1f}"
        cells = [_pct(r["driving_score"]), _pct(r["success_rate"]), _pct(r["pdms"]), _pct(r["epdms"]),
                 _pct(r["efficiency"]), _pct(r["comfortness"]), latency]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    from sim.driving.metrics import ABILITIES

    abilities = next((r["abilities"] for r in rows.values() if r["abilities"]), {})
    if abilities:
        names = [n for n in ABILITIES if n in abilities]
        lines += ["", "Bench2Drive's abilities (success rate in % over the episodes of the scenarios that exercise "
                      "each; " + "; ".join(f"{n}: {abilities[n]['reason']}" for n in names
                                           if not abilities[n].get("scenarios")) + ")", "",
                  "| policy | " + " | ".join(f"{n} ({', '.join(abilities[n]['scenarios'])})" for n in names
                                            if abilities[n].get("scenarios")) + " |",
                  "|---|" + "---|" * sum(1 for n in names if abilities[n].get("scenarios"))]
        for name, r in rows.items():
            cells = []
            for n in names:
                a = r["abilities"].get(n) or {}
                if not abilities[n].get("scenarios"):
                    continue
                cells.append("—" if a.get("success_rate") is None else f"{100 * a['success_rate']:.0f}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_leaderboard(out: str | Path, rows: Mapping[str, tuple[str, Mapping[str, Any]]] | None = None,
                    episodes: int = 10, seed: int = 0, progress: bool = True,
                    env_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Drive every row (resuming: finished rows are read, not run), then write the table; returns its figures.

    Raises:
        ConfigError: No rows, a bad episode count, or a policy that does not resolve (checked before any runs).
    """
    from driving.evaluate import evaluate_policy
    from sim.policies import resolve_policy

    rows = dict(DEFAULT_ROWS if rows is None else rows)
    if not rows:
        raise ConfigError("drive leaderboard: no rows")
    if not isinstance(episodes, int) or episodes < 1:
        raise ConfigError(f"--episodes: must be an integer >= 1, got {episodes!r}")
    for policy, args in rows.values():  # a typo fails now, not after an hour of other rows
        resolve_policy(policy, args)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"episodes": episodes, "seed": seed, "env_kwargs": dict(env_kwargs or {})}
    figures: dict[str, Any] = {}
    for name, (policy, args) in rows.items():
        folder = row_folder(out, name)
        done = (folder / "summary.json").is_file() and (folder / "leaderboard_row.json").is_file() and \
            read_json(folder / "leaderboard_row.json") == {**settings, "policy": policy, "policy_args": dict(args)}
        if not done:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)  # a killed or differently-set row: start it over
            evaluate_policy(policy, "all", episodes, folder, seed=seed, video=False, policy_args=dict(args),
                            env_kwargs=env_kwargs, progress=progress)
            write_json(folder / "leaderboard_row.json", {**settings, "policy": policy, "policy_args": dict(args)})
        figures[name] = read_row(folder)
    write_json(out / "leaderboard.json", {**settings, "rows": {n: {k: v for k, v in f.items() if k != "summary"}
                                                               for n, f in figures.items()}})
    write_text(out / "leaderboard.md", table(figures, episodes, seed))
    return figures


def leaderboard_command(args: Any) -> int:
    """CLI entry (``embodied drive leaderboard``)."""
    from core.bootstrap import prepare_process
    from core.outputs import claim_output

    prepare_process()
    from sim.policies import resolve_policy

    rows = dict(parse_row(r) for r in args.row) if args.row else dict(DEFAULT_ROWS)
    for policy, policy_args in rows.values():  # a typo: one line, and no folder claimed
        resolve_policy(policy, policy_args)
    env_kwargs = {"horizon_s": args.horizon_s} if args.horizon_s else None
    signature = {"episodes": args.episodes, "seed": args.seed, "env_kwargs": env_kwargs,
                 "rows": {n: [p, dict(a)] for n, (p, a) in rows.items()}}
    # in place, resumable: the same command continues its folder; another leaderboard there needs --overwrite
    with claim_output(args.out, command="drive leaderboard", staged=False, signature=signature,
                      overwrite=args.overwrite) as out:
        run_leaderboard(out, rows, episodes=args.episodes, seed=args.seed, env_kwargs=env_kwargs)
    print((Path(args.out) / "leaderboard.md").read_text())
    print(f"-> {Path(args.out) / 'leaderboard.md'}, {Path(args.out) / 'leaderboard.json'}")
    return 0
