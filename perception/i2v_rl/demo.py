"""Demo section of TAGRPO: the recorded reward curves of TAGRPO, DanceGRPO and the two ablations, and before /
after videos of the base model and the shipped post-trained policy from the same unseen image and noise."""

from __future__ import annotations

import html

from core.demo import DemoContext, DemoSection, img_tag, table, video_tag
from core.resources import asset

SAMPLES = asset("samples", "tagrpo")
POLICY = asset("checkpoints", "tagrpo")
SCALE = 4


def demo_section(ctx: DemoContext) -> DemoSection:
    import numpy as np
    import torch

    from core.data.video import VideoClipDataset, write_mp4
    from core.pretrained import read_card
    from perception.i2v_rl.cli import FPS
    from perception.i2v_rl.modeling_tagrpo import I2VPolicy
    from perception.i2v_rl.rewards import CompositeReward, RewardInputs
    from sim.render.videos import make_dataset

    card = read_card(POLICY)
    tuned = I2VPolicy.from_pretrained(POLICY)
    base = I2VPolicy(tuned.config).eval()  # the same policy around its base (the shipped Flex-Forcing model)
    size, frames = tuned.frame_hw[0], tuned.video_frames
    root = ctx.path("tagrpo", "clips")
    make_dataset(root, n=6, seed=ctx.seed + 7171, size=size, spp=4, test_fraction=0.0, frames=frames)
    ds = VideoClipDataset(root / "train" / "video", clip_len=frames, step=10**9, cache="all")
    ref = torch.stack([ds[i]["video"] for i in range(len(ds))])
    imgs = ref[:, 0].contiguous()
    reward = CompositeReward(dict(card.get("metrics", {}).get("rewards", {"psnr": 1.0})))
    noise = tuned.initial_noise(len(imgs), torch.Generator().manual_seed(ctx.seed))
    rows, videos = [], {"simulator": ref}
    for name, pol in (("base (Flex-Forcing)", base), ("post-trained (TAGRPO)", tuned)):
        video = pol.decode_video(imgs, pol.sample(pol.encode_first(imgs), noise))
        total, terms = reward(RewardInputs(video, ref))
        videos[name] = video
        rows.append({"model": name, "reward": float(total.mean()), **{k: float(v.mean()) for k, v in terms.items()},
                     "images": len(imgs)})
    from perception.i2v_rl.task import ConditioningSet, reference_rewards

    refs = reference_rewards(base, reward, ConditioningSet(imgs, ref))
    rows += [{"model": "reference: first frame held still", "reward": refs["static"], "images": len(imgs)},
             {"model": "reference: the truth through the VAE (ceiling)", "reward": refs["vae_reconstruction"],
              "images": len(imgs)}]
    for r in rows:
        r.update({k: f"{v:.3f}" for k, v in r.items() if isinstance(v, float)})
    grid = torch.cat([v for v in videos.values()], dim=4)  # (N, F, 3, H, 3W): columns
    grid = torch.cat(list(grid), dim=2).permute(0, 2, 3, 1).numpy()  # clips stacked as rows
    grid = np.repeat(np.repeat(grid, SCALE, 1), SCALE, 2)
    mp4 = ctx.path("tagrpo", "before_after.mp4")
    write_mp4(mp4, grid, fps=FPS // 3)
    body = table(rows, ["model", "reward", *[k for k in rows[0] if k not in ("model", "reward", "images")],
                        "images"])
    body += video_tag(ctx.rel(mp4), "columns: simulator's continuation | base | TAGRPO-post-trained — same image, "
                                    "same noise (ODE sampler)", 3 * size * SCALE)
    body += _recorded(ctx)
    return DemoSection(
        title="TAGRPO: GRPO post-training of an image-to-video model, against DanceGRPO (perception/i2v_rl)",
        lead=f"The shipped Flex-Forcing video model, post-trained as an image-to-video policy "
             f"({html.escape(str(card.get('post_training', '')))}) with a reward from the simulator: the PSNR of "
             f"its frames against the physically correct continuation of the first frame. {len(imgs)} unseen "
             "simulator scenes, base vs post-trained, from the same initial noise.",
        body=body,
        figures={"reward_base": float(rows[0]["reward"]), "reward_tuned": float(rows[1]["reward"])},
    )


def _recorded(ctx: DemoContext) -> str:
    """The recorded comparison (``python -m perception.i2v_rl.experiments``): table and reward curves."""
    from core.io import read_json
    from perception.i2v_rl.experiments import plot

    summary = SAMPLES / "comparison.json"
    if not summary.is_file():
        return "<p><em>No recorded comparison shipped (assets/samples/tagrpo/comparison.json).</em></p>"
    data = read_json(summary)
    pm = lambda s: f"{s['mean']:+.3f} ± {s['sd']:.3f}"  # noqa: E731
    rows = [{"arm": r["arm"], "seeds": r["seeds"], "rollouts": int(r["rollouts"]), "base": f"{r['base']:.3f}",
             "final": f"{r['final']['mean']:.3f}", "gain": pm(r["gain"]),
             "mean gain over the curve": pm(r["mean_gain"]),
             "drops": f"{r['drops']['mean']:.1f}"} for r in data["rows"]]
    p = ctx.path("img", "tagrpo_curves.png")
    plot(data["rows"], p)
    return (f"<h3>TAGRPO vs DanceGRPO and the ablations (recorded: {html.escape(data.get('command', ''))})</h3>"
            f"<p class='lead'>{html.escape(data.get('note', ''))}</p>"
            + table(rows, ["arm", "seeds", "rollouts", "base", "final", "gain", "mean gain over the curve", "drops"])
            + img_tag(ctx.rel(p), "held-out reward against iteration and against rollouts spent (mean ± sd over "
                                  "seeds)", 760))
