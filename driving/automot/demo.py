"""Demo section of AutoMoT: the shipped driving VLA in closed loop (front-camera videos with its planned
waypoints and decoded meta-action drawn on every frame), next to the privileged expert on the same seeds, and
the recorded experiment (closed-loop table over every scenario, open loop, frozen vs fine-tuned understanding
expert, latency)."""

from __future__ import annotations

import html

from core.demo import DemoContext, DemoSection, table, video_tag
from core.resources import asset

SAMPLES = asset("samples", "automot")
POLICY = asset("checkpoints", "automot")
SCENARIOS = ("merge", "roundabout", "intersection")


def demo_section(ctx: DemoContext) -> DemoSection:
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
                         "driving_score": round(a["driving_score"], 3), "success": a["success_rate"],
                         "collision": a["collision_rate"], "progress_m": round(a["progress_m"], 1)})
            for clip in r.get("videos", [])[:1]:  # paths relative to the run folder
                videos.append(video_tag(ctx.rel(out / clip["path"]), f"{policy} — {scenario}", 384))
    return DemoSection(
        title="AutoMoT: mixture-of-transformers driving VLA in closed loop (driving/automot)",
        lead="A tiny Qwen2.5-VL-class understanding expert (pretrained here on driving-scene QA and reasoning text) "
             "and an action expert joined by layer-wise joint attention; the understanding prefix is re-encoded "
             "every N = 2 control steps, the action expert plans every step against its cached keys and values, and a "
             "pure-pursuit + PID controller tracks the coarse head's waypoints (the flow refiner did not help here: "
             "driving/automot/README.md). The "
             "videos draw the planned waypoints (yellow dots on a magenta path) and the decoded meta-action (top left). Same episode seeds for both "
             "policies.",
        body=table(rows) + "".join(videos) + _recorded(),
        figures={f"ds_{r['policy'].split()[0]}_{r['scenario']}": r["driving_score"] for r in rows},
    )


def _recorded() -> str:
    md = SAMPLES / "summary.md"
    if not md.is_file():
        return "<p><em>No recorded experiment shipped (assets/samples/automot/summary.md).</em></p>"
    text = md.read_text(encoding="utf-8")
    return ("<h3>Recorded experiment (embodied experiment automot)</h3><pre>" + html.escape(text)
            + "</pre>")
