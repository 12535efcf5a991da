"""The Wan-VAE pilot: the smallest tiny ``AutoencoderKLWan`` that reconstructs held-out simulator clips well.

``python -m perception.video.vae_pilot [--out outputs/wan_vae_pilot] [--z-dim 8] [--bench]``

The shipped pilot (``outputs/wan_vae_pilot/result.json``, ``vae/``) is ``--z-dim 16`` with the other defaults:
base_dim 16, dim_mult [1, 2] (2x space), temporal_downsample [1] (2x time), 1 res block (484 k parameters); 8
clips of 5 frames as 16 px crops per step, AdamW 2e-3, cosine over 3000 steps, stopped at 600 s (2370 steps, 1
thread): held-out 29.80 dB (min 26.72) against 21.81 dB for repeating the first frame. The default ``--z-dim 8``
(the smallest that passes 28 dB; ``vae_z8/``): 28.85 dB (min 25.84), 2341 steps.

Data: the simulator clips Flex-Forcing trains on (``sim.render.videos``: 240 clips x 24 frames, 32 px, seed 0)
and its held-out clips (24 x 66 frames, seed 5000), read from ``outputs/datasets/videos_flex[_test]`` when those
were rendered with these settings, else rendered into ``<data>/data_train`` and ``<data>/data_test`` (``--data``,
default ``--out``).

Recipe (issue 34): stage-1 training of the VAE alone (``core.layers.vae.VideoAutoencoderTrainer``: L1 + a small
KL on the posterior mean) on frame-diverse batches (``FrameDiverseClips``: many short clips of ``1 + r k``
frames at random offsets from many different sources, as random ``--crop`` px windows), AdamW with warm-up and
cosine decay, on CPU. Two findings shape it (see ``result.json`` of each run under ``<out>/runs``):

- ``--temporal-mixing resample`` (default): trained on 5-frame clips with every 3-D convolution mixing time, the
  VAE learns the causal zero padding at a clip's start and collapses on longer clips (held-out frames 10-65 at
  9 dB while frames 0-4 reach 19 dB, after 150 steps); frame-local convolutions with the temporal mixing in the
  resampling ``time_conv`` (identity-initialised) reconstruct every frame alike.
- ``--crop 16``: 16 px windows of the 32 px frames make a step four times cheaper at about the same progress
  per step.

Evaluation: every held-out clip, all of its frames, encoded and decoded whole (a clip whose length is not
``1 + r k`` is padded by repeating its last frame, which by causality changes no earlier frame, and cropped
back); PSNR per uint8 frame, averaged per clip; mean and min over clips. The reference "repeat the first frame"
scores frames 1.. of the same clips against frame 0. The mean RGB of the shipped sample frame
(``assets/checkpoints/flexforcing/sample_first_frame.png``) before and after the VAE gives its colour shift.

Writes ``<out>/vae`` (``save_pretrained``: a diffusers ``AutoencoderKLWan`` folder with its measured
``latents_mean`` / ``latents_std``; ``build_autoencoder_kl_wan(path=...)`` + ``load_autoencoder_weights`` read it)
and ``<out>/result.json``. ``--bench`` only times a few training steps of each candidate config.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.io import atomic_dir, read_json, write_json
from core.logging import get_logger

log = get_logger("embodied.wan_vae_pilot")

TRAIN = {"n": 240, "frames": 24, "seed": 0, "size": 32, "shared": "outputs/datasets/videos_flex"}
TEST = {"n": 24, "frames": 66, "seed": 5000, "size": 32, "shared": "outputs/datasets/videos_flex_test"}
SAMPLE_FRAME = Path("assets/checkpoints/flexforcing/sample_first_frame.png")

# Candidate configs for --bench: (name, base_dim, z_dim, dim_mult, temporal_downsample)
CANDIDATES = [
    ("s2t1_b16_z8", 16, 8, [1, 2], [False]),
    ("s2t2_b16_z8", 16, 8, [1, 2], [True]),
    ("s2t2_b24_z8", 24, 8, [1, 2], [True]),
    ("s2t2_b16_z16", 16, 16, [1, 2], [True]),
    ("s4t4_b16_z16", 16, 16, [1, 2, 2], [True, True]),
]


def _data_folder(spec: dict[str, Any], own: Path) -> Path:
    """The clips' folder: the shared Flex-Forcing data when rendered with ``spec``, else ``own`` (rendered)."""
    from sim.render.videos import ensure_dataset

    shared = Path(spec["shared"])
    meta = shared / "meta.json"
    if meta.is_file():
        m = read_json(meta)
        if (m.get("width"), m.get("frames"), m.get("seed")) == (spec["size"], spec["frames"], spec["seed"]):
            own = shared
    ensure_dataset(own, spec["n"], spec["frames"], spec["seed"], spec["size"])
    return own / "train" / "video"


def load_clips(folder: Path, size: int) -> list[np.ndarray]:
    """Every clip of ``folder`` as (N, 3, H, W) uint8."""
    from core.data.video import VideoClipDataset

    ds = VideoClipDataset(folder, clip_len=1, size=(size, size), cache="all")
    return [ds.source_frames(i) for i in range(len(ds.sources))]


def reconstruct(vae, clips: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """(N, L, 3, H, W) uint8 clips -> their reconstruction, all L frames (padded to ``1 + r k`` and cropped)."""
    from core.layers.vae import wan_decode, wan_encode, wan_factors

    r = wan_factors(vae)[0]
    n, length = clips.shape[:2]
    pad = (-(length - 1)) % r
    x = torch.cat([clips, clips[:, -1:].expand(-1, pad, -1, -1, -1)], 1) if pad else clips
    return torch.cat([wan_decode(vae, wan_encode(vae, x[s:s + batch]))[:, :length] for s in range(0, n, batch)])


def frame_psnr(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """PSNR per uint8 frame: (N, L, 3, H, W) x 2 -> (N, L) dB."""
    from core.metrics.image import psnr

    return psnr(pred.float().flatten(0, 1), target.float().flatten(0, 1), data_range=255.0).reshape(pred.shape[:2])


def evaluate(vae, test: torch.Tensor) -> dict[str, Any]:
    """Held-out reconstruction PSNR (mean / min over clips), the repeat-first-frame reference and the sample
    frame's colour shift."""
    vae.eval()
    rec = reconstruct(vae, test)
    per_clip = frame_psnr(rec, test).mean(1)
    repeat = frame_psnr(test[:, :1].expand_as(test[:, 1:]), test[:, 1:]).mean(1)
    out = {"heldout_psnr_mean": float(per_clip.mean()), "heldout_psnr_min": float(per_clip.min()),
           "repeat_first_frame_psnr_mean": float(repeat.mean()), "heldout_clips": int(len(test)),
           "heldout_frames": int(test.shape[1])}
    if SAMPLE_FRAME.is_file():
        from core.data.imread import read_square

        img = torch.from_numpy(read_square(SAMPLE_FRAME, test.shape[-1])).permute(2, 0, 1)[None, None]
        r = reconstruct(vae, img)
        out["sample_frame"] = {"path": str(SAMPLE_FRAME),
                               "mean_rgb_truth": [round(float(c), 1) for c in img.float().mean((0, 1, 3, 4))],
                               "mean_rgb_reconstruction": [round(float(c), 1) for c in r.float().mean((0, 1, 3, 4))],
                               "psnr": float(frame_psnr(r, img).mean())}
    return out


@torch.no_grad()
def measure_latent_stats(vae, clips: list[np.ndarray], n: int = 48) -> tuple[list[float], list[float]]:
    """Per-channel mean / std of the posterior mode over the first ``n`` training clips (whole, ``1 + r k``)."""
    from core.layers.vae import wan_encode, wan_factors

    r = wan_factors(vae)[0]
    length = 1 + (len(clips[0]) - 1) // r * r
    x = torch.from_numpy(np.stack([c[:length] for c in clips[:n]]))
    z = wan_encode(vae, x, chunk=8)  # (N, F, C, h, w)
    zc = z.transpose(0, 2).flatten(1)
    return [float(v) for v in zc.mean(1)], [float(v) for v in zc.std(1)]


def build(args) -> torch.nn.Module:
    from core.layers.vae import build_autoencoder_kl_wan

    return build_autoencoder_kl_wan(args.base_dim, args.z_dim, args.dim_mult, args.num_res_blocks,
                                    [bool(t) for t in args.temporal_downsample])


def train(vae, clips: list[np.ndarray], args, budget_s: float | None = None,
          probe: torch.Tensor | None = None) -> dict[str, Any]:
    """Stage-1 training; stops at ``args.steps`` (or ``budget_s`` seconds). Returns steps, seconds, last loss and
    the held-out PSNR of the ``probe`` clips every ``args.eval_every`` steps (not counted in the seconds)."""
    from core.layers.vae import FrameDiverseClips, VideoAutoencoderTrainer, wan_factors

    r = wan_factors(vae)[0]
    clip_len = 1 + r * args.clip_groups
    ds = FrameDiverseClips(clips, clip_len, per_source=args.per_source, seed=args.seed, crop=args.crop)
    g = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, drop_last=True, generator=g)
    ae = VideoAutoencoderTrainer(vae, kl_weight=args.kl_weight, sample_posterior=False,
                                 temporal_mixing=args.temporal_mixing).train()
    opt = torch.optim.AdamW(vae.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    warm = max(1, min(100, args.steps // 20))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    step, t0, c0, hist, curve, paused, paused_cpu = 0, time.perf_counter(), time.process_time(), [], [], 0.0, 0.0
    while step < args.steps:
        for batch in loader:
            loss = ae.training_step(batch)
            opt.zero_grad(set_to_none=True)
            loss["loss"].backward()
            torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            hist.append(float(loss["loss_rec"]))
            if step % 50 == 0 or step == args.steps:
                log.info("step %d  l1 %.4f  (%.0f s)", step, sum(hist[-50:]) / len(hist[-50:]),
                         time.perf_counter() - t0 - paused)
            if probe is not None and getattr(args, "eval_every", 0) and step % args.eval_every == 0:
                t1, c1 = time.perf_counter(), time.process_time()
                vae.eval()
                per_frame = frame_psnr(reconstruct(vae, probe), probe).mean(0)  # (L,)
                db = float(per_frame.mean())
                parts = {f"{a}-{b - 1}": round(float(per_frame[a:b].mean()), 2)
                         for a, b in ((0, 1), (1, clip_len), (clip_len, 2 * clip_len), (2 * clip_len, len(per_frame)))
                         if a < len(per_frame)}
                vae.train()
                paused += time.perf_counter() - t1
                paused_cpu += time.process_time() - c1
                curve.append({"step": step, "seconds": round(t1 - t0 - paused, 1), "probe_psnr": round(db, 2),
                              "by_frames": parts})
                log.info("step %d  probe PSNR %.2f dB  by frames %s", step, db, parts)
            if step >= args.steps or (budget_s is not None and time.perf_counter() - t0 - paused > budget_s):
                break
        if budget_s is not None and time.perf_counter() - t0 - paused > budget_s:
            break
    return {"steps": step, "train_seconds": time.perf_counter() - t0 - paused,
            "train_cpu_seconds": time.process_time() - c0 - paused_cpu, "clip_len": clip_len,
            "final_l1": sum(hist[-50:]) / max(1, len(hist[-50:])), "probe_curve": curve}


def bench(clips: list[np.ndarray], args) -> None:
    """Seconds per training step of each candidate config (after two warm-up steps)."""
    rows = []
    for name, base, z, dm, td in CANDIDATES:
        a = argparse.Namespace(**{**vars(args), "base_dim": base, "z_dim": z, "dim_mult": dm,
                                  "temporal_downsample": [int(t) for t in td], "steps": 2})
        torch.manual_seed(0)
        vae = build(a)
        train(vae, clips, a)
        a.steps = args.bench_steps
        res = train(vae, clips, a)
        n_par = sum(p.numel() for p in vae.parameters())
        rows.append({"config": name, "params": n_par, "clip_len": res["clip_len"],
                     "s_per_step": res["train_seconds"] / res["steps"]})
        log.info("%s: %d params, clip %d, %.3f s/step", name, n_par, res["clip_len"], rows[-1]["s_per_step"])
    write_json(Path(args.out) / "bench.json", {"batch": args.batch, "threads": args.threads, "rows": rows})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perception.video.vae_pilot", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="outputs/wan_vae_pilot")
    p.add_argument("--data", default=None, help="where to render the clips when the shared ones are missing "
                   "(default: --out)")
    p.add_argument("--base-dim", type=int, default=16)
    p.add_argument("--z-dim", type=int, default=8)
    p.add_argument("--dim-mult", type=int, nargs="+", default=[1, 2])
    p.add_argument("--temporal-downsample", type=int, nargs="*", default=[1])
    p.add_argument("--num-res-blocks", type=int, default=1)
    p.add_argument("--steps", type=int, default=3000, help="the cosine schedule's length")
    p.add_argument("--budget-s", type=float, default=600.0, help="stop training after this many seconds")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--clip-groups", type=int, default=2, help="k: training clips of 1 + r k frames")
    p.add_argument("--per-source", type=int, default=64)
    p.add_argument("--crop", type=int, default=16, help="train on random crop x crop windows")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--kl-weight", type=float, default=1e-6)
    p.add_argument("--temporal-mixing", choices=["all", "resample"], default="resample")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=250, help="held-out PSNR of --eval-clips clips every N steps")
    p.add_argument("--eval-clips", type=int, default=6)
    p.add_argument("--bench", action="store_true", help="only time the candidate configs")
    p.add_argument("--bench-steps", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data or out)
    train_clips = load_clips(_data_folder(TRAIN, data / "data_train"), TRAIN["size"])
    if args.bench:
        bench(train_clips, args)
        return 0
    test = torch.from_numpy(np.stack(load_clips(_data_folder(TEST, data / "data_test"), TEST["size"])))
    torch.manual_seed(args.seed)
    vae = build(args)
    res = train(vae, train_clips, args, args.budget_s, probe=test[:args.eval_clips])
    metrics = evaluate(vae, test)
    mean, std = measure_latent_stats(vae, train_clips)
    vae.register_to_config(latents_mean=mean, latents_std=std)
    with atomic_dir(out / "vae") as tmp:
        vae.save_pretrained(str(tmp))
    result = {"config": {k: getattr(args, k) for k in ("base_dim", "z_dim", "dim_mult", "temporal_downsample",
                                                       "num_res_blocks")},
              "params": sum(q.numel() for q in vae.parameters()), "batch": args.batch, "lr": args.lr,
              "kl_weight": args.kl_weight, "temporal_mixing": args.temporal_mixing, "crop": args.crop, "per_source": args.per_source, "threads": args.threads,
              "seed": args.seed, **res, **metrics, "latents_mean": mean, "latents_std": std,
              "data": {"train": TRAIN, "test": TEST}}
    write_json(out / "result.json", result)
    log.info("held-out PSNR %.2f dB (min %.2f; repeat-first-frame %.2f) after %d steps, %.0f s",
             metrics["heldout_psnr_mean"], metrics["heldout_psnr_min"], metrics["repeat_first_frame_psnr_mean"],
             res["steps"], res["train_seconds"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
