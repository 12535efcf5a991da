"""Demo section: closed-loop driving evaluation of the baseline policies (``embodied drive eval``).

Scores are shown in the units ``embodied drive eval`` prints and the README uses (DS, SR and the rates in %,
``driving.report.SUMMARY_COLUMNS``); the section's figures (summary.json) keep the fractions, as every JSON record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.demo import DemoContext, DemoSection, table, video_tag

#: The columns of ``driving.report.SUMMARY_COLUMNS`` the demo's table shows.
COLUMNS = ("DS %", "SR %", "collision %", "off-road %", "route compl. %", "speed m/s")


def display_cells(aggregate: Mapping[str, Any], columns: Sequence[str] = COLUMNS) -> dict[str, str]:
    """``aggregate`` (fractions, as recorded) as the cells ``embodied drive eval`` prints: title -> formatted value."""
    from driving.report import SUMMARY_COLUMNS

    spec = {title: (key, fmt, scale) for title, key, fmt, scale in SUMMARY_COLUMNS}
    cells = {}
    for title in columns:
        key, fmt, scale = spec[title]
        value = aggregate.get(key)
        cells[title] = "—" if value is None else fmt.format(value * scale if scale != 1 else value)
    return cells


def demo_section(ctx: DemoContext) -> DemoSection:
    from driving.evaluate import evaluate_policy

    rows, videos = [], []
    for policy in ("idm", "constant", "random"):
        out = ctx.path("drive", policy)
        report = evaluate_policy(policy, "highway", episodes=2, out=out, seed=ctx.seed, videos=1, progress=False)
        a = report["aggregate"]
        rows.append({"policy": policy, **display_cells(a), "_ds": a["driving_score"]})
        clips = report["scenarios"]["highway"]["videos"]  # paths relative to the run folder
        if clips:
            videos.append(video_tag(ctx.rel(out / clips[0]["path"]), f"{policy}: front camera", 256))
    return DemoSection(
        title="Closed-loop driving (highway-env)",
        lead="`embodied drive eval --policy idm|constant|random --scenario highway`: paired seeds, route "
             "completion x infraction penalty = driving score (DS), in % as the command prints it. AutoMoT's "
             "section drives the same harness.",
        body=table(rows, ["policy", *COLUMNS]) + "".join(videos),
        figures={f"ds_{r['policy']}": r["_ds"] for r in rows},  # fractions, as in every JSON record
    )
