"""The paper's comparison in miniature: Flex-Forcing in three regimes against the rigid-schedule baselines.

``embodied experiment flexforcing --out outputs/flex_exp [--seeds 0 1] [--steps 2500] [--workers 1]``

Same data, budget and harness for every arm: Flex-Forcing's registered arms (``perception/video/register.py``:
the method, bidirectional-only and autoregressive-only) are trained by the project's own command (the
``core.experiments`` grid: ``embodied train flexforcing <arm> trainer.seed=<s>``) on the same rendered clips for
the same number of steps and batch size, on every training seed; all share one VAE trained first (stage 1 of
``perception.video.task`` on the same clips, into ``<out>/vae``, passed as ``model.vae_path``), so the latents
are identical. Each run is evaluated by ``embodied eval flexforcing`` on the same held-out clips
(data.test_seed) with the same sampling noise. Runs already finished (an ``eval.json``) are not run again.

Writes ``<out>/comparison.json`` (rows: Flex-Forcing per regime, bidirectional-only, AR-only; seed means and
per-seed values) and, with ``--ship DIR``, the comparison plus side-by-side videos of every arm on three held-out
clips into ``DIR`` (``assets/samples/flexforcing`` for the demo).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core import experiments as ex

LABELS = {"bidirectional_only": "bidirectional-only", "autoregressive_only": "AR-only",
          "self_forcing": "Self-Forcing"}  # the baselines' rows
METRICS = ("psnr", "ssim", "fd", "flicker", "tf_vbench", "fps", "first_frame_s")
DRIFT = ("psnr", "fd", "tf_vbench")
# arms that post-train the shipped checkpoint (Self-Forcing and its control): not part of this from-scratch grid;
# run them with `embodied train flexforcing --arm NAME` (perception/video/RESULTS.md)
POST_TRAINING = ("self_forcing", "continued")


def row_name(arm: str, regime: str, method: bool) -> str:
    """A table row: ``Flex-Forcing (flex)``, ``AR-only``, ``Self-Forcing + 1 sink`` ... (``regime`` may carry
    ``+sinkK`` / ``+sinkKabs``, see ``task.evaluate``)."""
    base, _, sink = regime.partition("+")
    name = f"Flex-Forcing ({base})" if method else LABELS.get(arm, arm)
    if sink:
        k = sink[len("sink"):].removesuffix("abs")
        name += f" + {k} sink{'s' if k != '1' else ''}" + (" (absolute positions)" if sink.endswith("abs") else "")
    return name


def ensure_vae(out: Path, extra: list[str]) -> Path:
    """The shared VAE: stage 1 of the Flex-Forcing task on the experiment's training clips, once."""
    vae = out / "vae"
    if (vae / "checkpoints").is_dir():
        return vae
    from core.config import compose, to_container, to_object
    from perception.video.modeling_flexforcing import FlexForcingModel
    from perception.video.task import build_dataset, pretrain_vae

    cfg = compose(["experiment=flexforcing", *extra])
    model_cfg, data, trainer_cfg = to_object(cfg.model), to_object(cfg.data), to_object(cfg.trainer)
    pretrain_vae(FlexForcingModel(model_cfg), build_dataset(data, model_cfg.video_frames), trainer_cfg, model_cfg,
                 vae, to_container(cfg))
    return vae


def grid(out: Path, seeds: list[int], steps: int, extra: list[str], workers: int = 1, vae: Path | None = None
         ) -> ex.Grid:
    """The arm x seed grid on the shared VAE (``vae``, default ``<out>/vae``: see ``ensure_vae``), run ``workers``
    at a time."""
    vae = (vae or out / "vae").resolve()
    arms = {k: v for k, v in ex.method_arms("flexforcing").items() if k not in POST_TRAINING}
    return ex.Grid("flexforcing", out, arms, seeds,
                   [f"trainer.max_steps={steps}", "trainer.progress=false", f"model.vae_path={vae}", *extra],
                   threads=None if workers == 1 else 1)


def summarise(results: dict[str, dict[int, dict[str, Any]]], method_arm: str = "flexforcing") -> dict[str, Any]:
    """Rows per (arm, regime): seed means of the metrics, drift and per-frame PSNR, and the per-seed values;
    ``method_arm`` (Flex-Forcing itself) gets one row per regime."""
    rows: dict[str, Any] = {}
    first_arm = method_arm if method_arm in results else next(iter(results))
    for arm, evals in results.items():
        regimes = next(iter(evals.values()))["regimes"]
        for regime in regimes:
            name = row_name(arm, regime, arm == first_arm)
            per_seed = {s: e["regimes"][regime]["mean"] for s, e in evals.items()}
            vals = list(per_seed.values())
            row = {k: sum(v.get(k, float("nan")) for v in vals) / len(vals) for k in METRICS}
            row["drift"] = {m: {k: sum(v["drift"][m].get(k, float("nan")) for v in vals) / len(vals) for k in DRIFT}
                            for m in vals[0]["drift"]}
            row["psnr_per_frame"] = [round(sum(c) / len(c), 3) for c in zip(*(v["psnr_per_frame"] for v in vals),
                                                                           strict=True)]
            row["per_seed"] = {str(s): {k: v.get(k) for k in METRICS} | {"drift": v["drift"]}
                               for s, v in per_seed.items()}
            rows[name] = row
    first = next(iter(results[first_arm].values()))
    return {"rows": rows, "references": first.get("references", {}), "context": first["context"], "train_frames": first["train_frames"],
            "eval_frames": first["eval_frames"], "clips": first["clips"], "seeds": sorted(results[first_arm])}


def peer_rows(evals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Rows of the peers' comparison (``assets/samples/flexforcing/peers.json``, shown by the demo): for every
    named ``eval.json`` (label -> its parsed content) and every regime in it (sink settings included), the
    first-window metrics, the 4x / 8x windows and VBench's temporal_flickering; per-seed values are the eval's
    own ``seeds`` (sampling seeds), the label names the training run."""
    rows: dict[str, Any] = {}
    for label, ev in evals.items():
        for regime, r in ev["regimes"].items():
            m = r["mean"]
            base, _, sink = regime.partition("+")
            if sink:
                k = sink[len("sink"):].removesuffix("abs")
                base += f", {k} sink{'s' if k != '1' else ''}" + (" (absolute positions)" if sink.endswith("abs")
                                                                  else "")
            name = f"{label} ({base})"
            row = {k: m.get(k) for k in ("psnr", "ssim", "fd", "flicker", "tf_vbench", "fps")}
            for h in ("4x", "8x"):
                d = m["drift"].get(h, {})
                row.update({f"{k}_{h}": d.get(k) for k in DRIFT})
            row["tf_vbench_gt"] = m.get("tf_vbench_gt")
            row["psnr_per_frame"] = m.get("psnr_per_frame")
            rows[name] = row
    return rows


def paired_interval(a: list[float], b: list[float], n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` over paired items (the same held-out clips) and its 95 % bootstrap interval (clips
    resampled with replacement): ``(mean, low, high)``."""
    import numpy as np

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.ndim != 1 or len(d) < 2:
        raise ValueError(f"need two equal-length lists of >= 2 paired values, got {len(a)} and {len(b)}")
    idx = np.random.default_rng(seed).integers(0, len(d), (n_boot, len(d)))
    means = d[idx].mean(1)
    return float(d.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def ship_videos(runs: dict[str, dict[int, Path]], ship: Path, seed: int, n_clips: int = 3) -> list[str]:
    """Side-by-side mp4s (ground truth | model) of each arm's seed-``seed`` model on the first held-out clips."""
    import numpy as np
    import torch

    from core.config import compose, to_object
    from core.data.video import write_mp4
    from perception.video.modeling_flexforcing import FlexForcingModel
    from perception.video.pipeline_flexforcing import continue_video, supported_regimes
    from perception.video.task import build_dataset

    data = to_object(compose(["experiment=flexforcing"]).data)
    ds = build_dataset(data, data.eval_frames, "test", step=10**9)
    video = torch.stack([ds[i]["video"] for i in range(n_clips)])
    names = []
    for arm, by_seed in runs.items():
        model = FlexForcingModel.from_pretrained(by_seed[seed], use_ema=False).eval()  # see the experiment config
        for regime in supported_regimes(model):
            if regime == "chunked":
                continue
            frames, _ = continue_video(model, video, video.shape[1], regime, context=data.context,
                                       generator=torch.Generator().manual_seed(0))
            both = torch.cat([video, frames], dim=-1)  # (N, T, 3, H, 2W): truth | model
            grid = both.permute(1, 0, 3, 4, 2).reshape(both.shape[1], -1, both.shape[-1], 3).numpy()
            grid = np.repeat(np.repeat(grid, 3, axis=1), 3, axis=2)
            name = f"flex_{regime}.mp4" if arm == next(iter(runs)) else f"{arm}.mp4"
            write_mp4(ship / name, grid, fps=15)
            names.append(name)
    return names


def export_checkpoint(run: Path, dest: Path, summary: dict[str, Any], steps: int, seed: int) -> Path:
    """The seed's Flex-Forcing model (raw weights, see the experiment config) as a shipped folder with its card
    and a sample first frame."""
    import dataclasses

    import cv2

    from core.config import compose, to_object
    from perception.video.cli import SAMPLE_FRAME
    from perception.video.modeling_flexforcing import FlexForcingModel
    from perception.video.task import build_dataset

    model = FlexForcingModel.from_pretrained(run, use_ema=False)
    model.config = dataclasses.replace(model.config, vae_path=None)  # the VAE's weights are in the folder
    data = to_object(compose(["experiment=flexforcing"]).data)
    first = build_dataset(data, 1, "test", step=10**9)[0]["video"][0].permute(1, 2, 0).numpy()
    metrics = {name.split("(")[1].rstrip(")"): {k: round(float(r[k]), 3) for k in ("psnr", "ssim", "fd", "flicker")}
               for name, r in summary["rows"].items() if name.startswith("Flex-Forcing")}
    card = {
        "training_domain": "simulated motion clips (sim.render.videos: falling objects, double pendulum, 3-link arm), "
                           "32 x 32 px, 15 fps; not real video",
        "data": f"sim.render.videos.make_dataset(n={data.render_n}, seed={data.render_seed}, size={data.size}, "
                f"frames={data.render_frames}); windows of 8 frames",
        "command": f"embodied train flexforcing trainer.max_steps={steps} trainer.seed={seed} "
                   "model.vae_path=<shared VAE> (embodied experiment flexforcing)",
        "metrics": {**metrics, "split": f"{summary['clips']} held-out clips (seed {data.test_seed}), continuation of "
                                        f"{summary['context']} frames, first training window, seed-mean"},
    }
    out = model.save_pretrained(dest, card=card, body="Flex-Forcing at workspace scale: see perception/video/README.md.")
    cv2.imwrite(str(out / SAMPLE_FRAME), first[..., ::-1])
    return out


def run(args) -> int:
    """``embodied experiment flexforcing``: train every arm on the same clips and VAE, evaluate, tabulate."""
    g = grid(args.out, args.seeds, args.steps, args.overrides, args.workers, args.vae)
    if not args.collect_only:
        if args.vae is None:
            ensure_vae(args.out, args.overrides)
        from core.config import compose, to_object
        from perception.video.task import ensure_data

        data = to_object(compose(["experiment=flexforcing", *args.overrides]).data)
        for split in ("train", "test"):  # rendered once, before the parallel runs would race to render them
            ensure_data(data, split)
        failures = g.run(args.workers)
        if failures:
            return ex.report(failures)
    results = g.collect()
    if not results:
        print(f"{args.out}: no finished runs")
        return 0
    runs = {c.arm: {} for c in g.cells()}
    for c in g.cells():
        runs[c.arm][c.seed] = c.run_dir
    summary = summarise(results, next(iter(g.arms)))
    summary["command"] = f"embodied experiment flexforcing --seeds {' '.join(map(str, args.seeds))} " \
                         f"--steps {args.steps}"
    from core.io import write_json

    write_json(args.out / "comparison.json", summary)
    if args.ship:
        args.ship.mkdir(parents=True, exist_ok=True)
        summary["videos"] = ship_videos(runs, args.ship, args.seeds[0])
        summary["note"] = ("Every model trained by `embodied train flexforcing` for the same steps on the same clips "
                           "and VAE; scored by `embodied eval flexforcing` on the same held-out clips; means over "
                           "training seeds. Videos: seed-0 models, ground truth left, model right.")
        for row in summary["rows"].values():
            row.pop("per_seed", None)
        write_json(args.ship / "comparison.json", summary)
    if args.export:
        export_checkpoint(next(iter(runs.values()))[args.seeds[0]], args.export, summary, args.steps, args.seeds[0])
    for name, ref in summary["references"].items():
        print(f"{'reference: ' + name:32s} " + " ".join(f"{k} {v:.2f}" for k, v in ref.items()))
    for name, row in summary["rows"].items():
        print(f"{name:32s} PSNR {row['psnr']:.2f} SSIM {row['ssim']:.3f} FD {row['fd']:.1f} flicker "
              f"{row['flicker']:.4f} FD4x {row['drift'].get('4x', {}).get('fd', float('nan')):.1f} FD8x "
              f"{row['drift'].get('8x', {}).get('fd', float('nan')):.1f} fps {row['fps']:.1f}")
    return 0


EXPERIMENT = ex.Experiment(
    run, out="outputs/flex_exp", workers=1,
    options=(("--steps", dict(type=int, default=1500)),
             ("--vae", dict(type=Path, default=None,
                            help="a trained Wan VAE folder every arm shares (e.g. the pilot's "
                                 "outputs/wan_vae_pilot/vae) instead of training <out>/vae first")),
             ("--ship", dict(type=Path, default=None, help="copy the comparison and videos here (for the demo)")),
             ("--export", dict(type=Path, default=None, help="export the first seed's Flex-Forcing model here")),
             ("overrides", dict(nargs="*", help="extra config overrides for every run"))))

if __name__ == "__main__":
    raise SystemExit(ex.moved("perception.video.experiments", "flexforcing"))
