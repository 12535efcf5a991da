"""Demo section: closed-loop driving evaluation of the baseline policies (``embodied drive eval``)."""

from __future__ import annotations

from core.demo import DemoContext, DemoSection, table, video_tag


def demo_section(ctx: DemoContext) -> DemoSection:
    from driving.evaluate import evaluate_policy

    rows, videos = [], []
    for policy in ("idm", "constant", "random"):
        out = ctx.path("drive", policy)
        report = evaluate_policy(policy, "highway", episodes=2, out=out, seed=ctx.seed, videos=1, progress=False)
        a = report["aggregate"]
        rows.append({"policy": policy, "driving_score": a["driving_score"], "success_rate": a["success_rate"],
                     "collision_rate": a["collision_rate"], "offroad_rate": a["offroad_rate"],
                     "route_completion": a["route_completion"], "mean_speed_mps": a["mean_speed_mps"]})
        clips = report["scenarios"]["highway"]["videos"]  # paths relative to the run folder
        if clips:
            videos.append(video_tag(ctx.rel(out / clips[0]["path"]), f"{policy}: front camera", 256))
    return DemoSection(
        title="Closed-loop driving (highway-env)",
        lead="`embodied drive eval --policy idm|constant|random --scenario highway`: paired seeds, route "
             "completion x infraction penalty = driving score. AutoMoT's section drives the same harness.",
        body=table(rows) + "".join(videos),
        figures={f"ds_{r['policy']}": r["driving_score"] for r in rows},
    )
