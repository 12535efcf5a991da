"""Demo section of AutoMoT: the shipped driving VLA in closed loop (front-camera videos with its planned
waypoints and decoded meta-action drawn on every frame), next to the privileged expert on the same seeds, and
the recorded experiment (closed-loop table over every scenario, open loop, frozen vs fine-tuned understanding
expert, latency)."""

from __future__ import annotations

import html
import re

from core.demo import BETTER, SAME, WORSE, DemoContext, DemoSection, table, verdict, video_tag
from core.resources import asset

SAMPLES = asset("samples", "automot")
POLICY = asset("checkpoints", "automot")
SCENARIOS = ("merge", "roundabout", "intersection")
COLUMNS = ("DS %", "SR %", "collision %", "progress m")  # driving.report's titles and units (drive eval's)
#: Relative change of the recorded DS that the lead still calls "did not help".
REFINER_TOLERANCE = 0.05


def demo_section(ctx: DemoContext) -> DemoSection:
    from driving.demo import display_cells
    from driving.evaluate import evaluate_policy

    rows, videos = [], []
    for policy, args in (("automot", {"checkpoint": str(POLICY), "update_interval": 2}),
                         ("idm", {})):
        out = ctx.path("automot", policy)
        rep = evaluate_policy(policy, list(SCENARIOS), episodes=1, out=out, seed=ctx.seed + 1000, videos=1,
                              policy_args=args, progress=False)
        for scenario, r in rep["scenarios"].items():
            a = r["aggregate"]
            rows.append({"policy": policy if policy == "idm" else "automot (N = 2)", "scenario": scenario,
                         **display_cells(a, COLUMNS), "_ds": a["driving_score"]})
            for clip in r.get("videos", [])[:1]:  # paths relative to the run folder
                videos.append(video_tag(ctx.rel(out / clip["path"]), f"{policy} — {scenario}", 384))
    return DemoSection(
        title="AutoMoT: mixture-of-transformers driving VLA in closed loop (driving/automot)",
        lead="A tiny Qwen2.5-VL-class understanding expert (pretrained here on driving-scene QA and reasoning text) "
             "and an action expert joined by layer-wise joint attention; the understanding prefix is re-encoded "
             "every N = 2 control steps, the action expert plans every step against its cached keys and values, and a "
             "pure-pursuit + PID controller tracks the coarse head's waypoints" + _refiner_clause(_recorded_text())
             + ". The "
             "videos draw the planned waypoints (yellow dots on a magenta path) and the decoded meta-action (top left). Same episode seeds for both "
             "policies.",
        body=table(rows, ["policy", "scenario", *COLUMNS]) + "".join(videos) + _recorded(),
        # fractions, as in every JSON record (the table shows %)
        figures={f"ds_{r['policy'].split()[0]}_{r['scenario']}": r["_ds"] for r in rows},
    )


def _recorded_text() -> str | None:
    md = SAMPLES / "summary.md"
    return md.read_text(encoding="utf-8") if md.is_file() else None


def recorded_all_ds(text: str) -> dict[str, float]:
    """The recorded closed-loop table's DS over all scenarios (%), by row: the first number of its ``all`` cell."""
    out: dict[str, float] = {}
    column = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if not cells:
            if out:  # the first table with an "all" column only
                break
            column = None
            continue
        if column is None:
            column = cells.index("all") if "all" in cells else None
            continue
        m = re.match(r"\s*(-?\d+(?:\.\d+)?)", cells[column]) if column < len(cells) else None
        if m:
            out[cells[0]] = float(m.group(1))
    return out


def _refiner_clause(text: str | None, tolerance: float = REFINER_TOLERANCE) -> str:
    """What the recorded experiment says of the flow refiner, in words chosen from its DS over all scenarios."""
    ds = recorded_all_ds(text) if text else {}
    with_it, without = ds.get("automot_n2_refiner"), ds.get("automot_n2")
    if with_it is None or without is None:
        return ""
    numbers = f"recorded DS over all scenarios {with_it:.1f} % with it, {without:.1f} % without"
    v = verdict(with_it, without, tolerance)
    if v == SAME:
        return f" (the flow refiner did not help here: {numbers}, within ±{100 * tolerance:.0f} %)"
    if v == WORSE:
        return f" (the flow refiner made it worse here: {numbers})"
    if v == BETTER:
        return f" (the flow refiner scored higher in the recorded experiment, {numbers}; the demo runs without it)"
    return ""


def _recorded() -> str:
    text = _recorded_text()
    if text is None:
        return "<p><em>No recorded experiment shipped (assets/samples/automot/summary.md).</em></p>"
    return ("<h3>Recorded experiment (embodied experiment automot)</h3><pre>" + html.escape(text)
            + "</pre>")
