"""Demo section of the BC reference method: train on the demo's recorded rollouts, act in closed loop."""

from __future__ import annotations

from pathlib import Path

from core.demo import DemoContext, DemoSection, img_tag, table, video_tag


def demo_section(ctx: DemoContext) -> DemoSection:
    from core.config import compose
    from core.logging import read_metrics
    from sim.recorder import record_rollout
    from sim.rollout import RolloutConfig
    from worldmodels.bc import task

    out = ctx.path("bc", "run")
    data = ctx.path("bc", "data", "embodied_Reach-Panda-v0.hdf5")
    overrides = ["experiment=bc", f"out_dir={out}", f"data.paths=[{data}]", "data.record.episodes=12",
                 "trainer.max_steps=300", "trainer.batch_size=32", "trainer.ckpt_every=300", "trainer.log_every=10",
                 "trainer.device=cpu", "trainer.progress=false", "trainer.tensorboard=false",
                 "model.channels=[16,32,64]", "model.hidden_dim=128", "trainer.optim.lr=1e-3",
                 "env.episodes=6", "env.max_episode_steps=60"]
    cfg = compose(overrides)
    result = task.train(cfg)
    evaluation = task.evaluate(cfg)
    # success in %, as `embodied eval bc` prints it (its headline); eval.json and the figures keep the fraction
    rows = [{"policy": k, "success %": 100 * v["success_rate"], "mean_return": v["mean_return"],
             "mean_length": v["mean_length"], "failures": v["failures"], "_success": v["success_rate"]}
            for k, v in evaluation["policies"].items()]
    # loss curve
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = read_metrics(out)
    fig, ax = plt.subplots(figsize=(4, 2.6), dpi=100)
    ax.plot([r["step"] for r in m], [r["loss"] for r in m])
    ax.set_xlabel("step")
    ax.set_ylabel("L1 loss (normalised)")
    ax.set_yscale("log")
    fig.tight_layout()
    curve = ctx.path("img", "bc_loss.png")
    fig.savefig(curve)
    plt.close(fig)
    # one closed-loop episode of the trained policy, on video
    rec = record_rollout(RolloutConfig(env_id=cfg.env.id, episodes=1, seed=cfg.env.seed, policy=str(out),
                                       env_kwargs={"image_size": 64}, max_episode_steps=60, progress=False),
                         ctx.path("bc", "closed_loop"), video=True)
    vids = rec.summary.get("videos") or []
    body = (table(rows, ["policy", "success %", "mean_return", "mean_length", "failures"])
            + img_tag(ctx.rel(curve), "training loss", 320)
            + (video_tag(ctx.rel(Path(vids[0])), "BC policy, closed loop", 192) if vids else ""))
    return DemoSection(
        title="Reference method: behaviour cloning (worldmodels/bc)",
        lead="`embodied train bc` then `embodied eval bc`: 12 recorded expert episodes, 300 steps of the shared "
             "trainer, then closed-loop rollouts on held-out seeds against the scripted expert and random actions.",
        body=body,
        figures={"final_loss": result["loss"], **{f"success_{r['policy']}": r["_success"] for r in rows}},
    )
