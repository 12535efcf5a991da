"""Demo section of TAGRPO: the recorded comparisons (TAGRPO, DanceGRPO and the two ablations; TAGRPO vs the MixGRPO
peer with GRPO-Guard's ratio diagnostic) with their reward curves, and before / after videos of the base model and
the shipped post-trained policy from the same unseen image and noise."""

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
        title="TAGRPO: GRPO post-training of an image-to-video model, against DanceGRPO and MixGRPO "
              "(perception/i2v_rl)",
        lead=f"The shipped Flex-Forcing video model, post-trained as an image-to-video policy "
             f"({html.escape(str(card.get('post_training', '')))}) with a reward from the simulator ("
             f"{html.escape(_reward_words(card.get('metrics', {}).get('rewards', {'psnr': 1.0})))}) against the "
             f"physically correct continuation of the first frame. {len(imgs)} unseen simulator scenes, base vs "
             "post-trained, from the same initial noise.",
        body=body,
        figures={"reward_base": float(rows[0]["reward"]), "reward_tuned": float(rows[1]["reward"])},
    )


WORDS = {"trajectory": "agreement of the moving object's tracked path", "psnr": "the frames' PSNR",
         "feature": "EfficientNet feature distance", "smoothness": "temporal smoothness",
         "goal": "the last frame's PSNR to the goal"}


def _reward_words(rewards: dict[str, float]) -> str:
    """The shipped policy's reward in words, from its card: ``{'trajectory': 1.0, 'psnr': 0.005}`` ->
    "agreement of the moving object's tracked path + 0.005 x the frames' PSNR"."""
    terms = sorted(rewards.items(), key=lambda kv: -abs(kv[1]))
    return " + ".join(("" if w == 1 else f"{w:g} x ") + WORDS.get(k, k) for k, w in terms)


# the recorded comparisons (``embodied experiment tagrpo ... --ship`` / ``--record NAME``), in the page's order
RECORDED = (("comparison", "TAGRPO vs DanceGRPO and the ablations"),
            ("peers", "TAGRPO vs the MixGRPO peer (sliding SDE window), with GRPO-Guard's ratio diagnostic"))


def _recorded(ctx: DemoContext) -> str:
    """Every recorded comparison shipped in ``assets/samples/tagrpo``: its table, GRPO-Guard's per-step ratio means
    where recorded, and the reward curves."""
    from core.io import read_json
    from perception.i2v_rl.experiments import plot

    found = [(name, title) for name, title in RECORDED if (SAMPLES / f"{name}.json").is_file()]
    if not found:
        return "<p><em>No recorded comparison shipped (assets/samples/tagrpo/comparison.json).</em></p>"
    pm = lambda s: f"{s['mean']:+.4f} ± {s['sd']:.4f}"  # noqa: E731
    body = ""
    for name, title in found:
        data = read_json(SAMPLES / f"{name}.json")
        rows = [{"arm": r["arm"], "seeds": r["seeds"], "iterations": r.get("iterations", "-"),
                 "rollouts": int(r["rollouts"]), "base": f"{r['base']:.4f}", "final": f"{r['final']['mean']:.4f}",
                 "gain": pm(r["gain"]), "mean gain over the curve": pm(r["mean_gain"]),
                 "drops": f"{r['drops']['mean']:.1f}",
                 "flat from iteration": "no" if r.get("flattens_at") is None else r["flattens_at"],
                 "train s / run": (f"{r['seconds']['iteration']['mean']:.0f}" if r.get("seconds") else "-"),
                 "update s / run": (f"{r['seconds']['update']['mean']:.0f}" if r.get("seconds") else "-")}
                for r in data["rows"]]
        columns = ["arm", "seeds", "iterations", "rollouts", "base", "final", "gain", "mean gain over the curve",
                   "drops"]
        if any(r.get("seconds") for r in data["rows"]):
            columns += ["flat from iteration", "train s / run", "update s / run"]
        p = ctx.path("img", f"tagrpo_{name}_curves.png")
        plot(data["rows"], p)
        body += (f"<h3>{html.escape(title)} (recorded: {html.escape(data.get('command', ''))})</h3>"
                 f"<p class='lead'>{html.escape(data.get('note', ''))}</p>" + table(rows, columns))
        body += _guard_table(data["rows"])
        body += img_tag(ctx.rel(p), "held-out reward against iteration and against rollouts spent (mean ± sd over "
                                    "seeds)", 760)
    return body


def _guard_table(rows: list[dict]) -> str:
    """GRPO-Guard's diagnostic of a recorded comparison: per arm and sampling step (0 = the noise end), the
    importance-ratio mean minus 1 (x 1e-3) over the runs' last iterations; '0 (on-policy)' for a step trained
    in an iteration's first update, '-' for a step not trained then."""
    rows = [r for r in rows if r.get("guard")]
    if not rows:
        return ""
    steps = sorted({int(i) for r in rows for i in r["guard"]})

    def cell(r, i):
        g = r["guard"].get(str(i))
        if g is None:
            return "-"
        return "0 (on-policy)" if g["update"] == 0 else f"{1e3 * g['mean']:+.2f} ± {1e3 * g['sd']:.2f}"

    out = [{"arm": r["arm"], **{f"step {i}": cell(r, i) for i in steps}} for r in rows]
    return ("<p>GRPO-Guard's diagnostic: importance-ratio mean − 1 (×10⁻³) per sampling step (0 = noise end), "
            "last iterations, mean ± sd over seeds</p>" + table(out, ["arm", *(f"step {i}" for i in steps)]))
