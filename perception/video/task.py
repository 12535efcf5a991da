"""``embodied train flexforcing`` / ``embodied eval flexforcing``: the task functions, separate from the CLI.

train: (render the simulator clips with ``sim.render.videos`` if ``data.root`` is missing) -> [stage 1: the
Wan VAE as an auto-encoder on frame-diverse short clips, into ``<out_dir>/vae``, unless ``model.vae_path`` /
``model.base_path`` name one (a user's Wan VAE folder or an earlier run's ``vae``)] -> per-channel latent
statistics (unless the user's VAE states them) -> every source video encoded once (causally, whole) -> windows of
``model.num_frames`` *latent* frames -> ``FlexForcingModel`` with the VAE frozen -> the core Trainer.

evaluate: held-out clips (rendered from ``data.test_seed``, ``data.test_frames`` long) -> the first
``data.context`` latent frames are given (the first ``1 + (context - 1) r`` video frames, encoded), the model
continues them to the latent length of ``data.eval_frames`` video frames in every regime of ``data.regimes`` it
was trained for, on every seed of ``data.seeds`` (with each sink setting of ``data.sink_frames`` x
``data.sink_ropes``: regime ``autoregressive+sink1`` / ``autoregressive+sink1abs`` ...); the whole latent video is decoded (the VAE is causal) and the
new video frames are scored -> metrics per regime (with ``r`` = 1, latent frames are video frames):

- ``psnr`` / ``ssim`` / ``fd`` / ``flicker`` on the new frames inside the first training-length window
  (video frames ``given .. video_frames - 1``): quality of the continuation against ground truth;
- ``drift``: for videos ``m`` = 1, 2, 4, 8 ... times the training length (as many as ``eval_frames`` allows),
  PSNR and FD-EffNet of their last window's new frames against the ground-truth frames at the same indices —
  error growth with length, and whether frames stay on the data manifold;
- ``tf_vbench``: VBench's ``temporal_flickering`` (``perception.video.vbench``) of the whole output video, and
  of each drift window; ``tf_vbench_gt`` of the ground truth;
- ``psnr_per_frame``: the curve behind the drift plot;
- ``fps`` (new frames per second of sampling, latents only, the batch counted), ``fps_decoded`` (with the VAE
  decode) and ``first_frame_s`` (time to the first new frame, whole batch).

Writes ``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.errors import DataError
from core.io import write_json
from core.logging import get_logger
from perception.video.configuration_flexforcing import FlexForcingConfig, FlexVideoDataConfig

log = get_logger("embodied.flexforcing")


def ensure_data(data: FlexVideoDataConfig, split: str) -> Path:
    """The folder of ``split``'s mp4 clips (``train`` or ``test``), rendering them first when missing."""
    from sim.render.videos import ensure_dataset

    if split == "train":
        root = Path(data.root)
        ensure_dataset(root, data.render_n, data.render_frames, data.render_seed, max(data.frame_hw))
    else:
        root = Path(data.test_root)
        ensure_dataset(root, data.test_n, data.test_frames, data.test_seed, max(data.frame_hw))
    folder = root / "train" / "video" if (root / "train" / "video").is_dir() else root
    return folder


def build_dataset(data: FlexVideoDataConfig, clip_len: int, split: str = "train", step: int | None = None):
    """Clips of ``clip_len`` frames (``{"video": (T, 3, H, W) uint8}``) from the rendered ``split``."""
    from core.data.video import VideoClipDataset

    folder = ensure_data(data, split)
    ds = VideoClipDataset(folder, clip_len=clip_len, step=step or data.window_step, size=data.frame_hw,
                          cache="all")
    if len(ds) == 0:
        raise DataError(folder, f"no clip of {clip_len} frames in the {split} videos")
    return ds


class LatentWindows(torch.utils.data.Dataset):
    """Windows of ``num_frames`` latent frames, every ``step`` latents, of the source videos of a
    ``VideoClipDataset``: each source is encoded once, whole (the VAE is frozen after stage 1 and causal, so a
    window's latents are those of its frames in context), so a training step runs the transformer only.
    Items: ``{"latents": (num_frames, C, h, w)}``."""

    def __init__(self, clips, model, num_frames: int, step: int = 1):
        r = model.config.temporal_factor
        self.latents, index = {}, []
        device = model.latent_mean.device
        for vi in range(len(clips.sources)):
            frames = torch.from_numpy(clips.source_frames(vi))
            usable = 1 + (len(frames) - 1) // r * r  # the longest 1 + r k prefix
            z = model.encode(frames[None, :usable].to(device))[0].to("cpu", torch.float32)
            self.latents[vi] = z
            index += [(vi, s) for s in range(0, len(z) - num_frames + 1, step)]
        if not index:
            raise DataError(str(clips.sources[0].parent) if clips.sources else "videos",
                            f"no source video is {num_frames} latent frames long")
        self.index, self.num_frames = index, num_frames

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        vi, start = self.index[i]
        return {"latents": self.latents[vi][start:start + self.num_frames].clone()}


def pretrain_vae(model, clips, trainer_cfg: TrainerConfig, model_cfg: FlexForcingConfig, out_dir: Path,
                 run_config: dict[str, Any]) -> dict[str, float]:
    """Stage 1: ``model.vae`` trained as a video auto-encoder on frame-diverse short clips of the sources
    (``vae_clip_frames`` frames, ``vae_crop`` px crops), frame-local but for its resampling convolutions (see
    ``core.layers.vae.VideoAutoencoderTrainer``; ``perception.video.vae_pilot`` is the same recipe standalone)."""
    from core.layers.vae import FrameDiverseClips, VideoAutoencoderTrainer
    from core.trainer import Trainer

    # frame-local convolutions but the resampling ones (the pilot's recipe: Wan's VAE otherwise learns the zero
    # padding of short training clips and fails on long videos; a VAE trained here, never a user's)
    model.vae.requires_grad_(True)
    ae = VideoAutoencoderTrainer(model.vae, "video", model_cfg.vae_kl_weight, model_cfg.vae_sample_posterior,
                                 temporal_mixing="resample")
    crop = model_cfg.vae_crop if model_cfg.vae_crop and model_cfg.vae_crop < min(model_cfg.frame_hw) else None
    data = FrameDiverseClips(clips, model_cfg.vae_clip_frames, per_source=64, seed=trainer_cfg.seed, crop=crop)
    steps = model_cfg.vae_pretrain_steps
    cfg = dataclasses.replace(
        trainer_cfg, max_steps=steps, ckpt_every=steps, ema_decay=None, grad_clip=1.0,
        batch_size=model_cfg.vae_batch_clips, gradient_checkpointing=False,
        optim=dataclasses.replace(trainer_cfg.optim, lr=model_cfg.vae_pretrain_lr, param_group_lrs={}),
        scheduler=dataclasses.replace(trainer_cfg.scheduler, warmup_steps=min(50, steps // 10)))
    trainer = Trainer(ae, data, cfg, out_dir, run_config={**run_config, "stage": "vae"})
    result = trainer.fit()
    trainer.release()  # FSDP: the VAE's full parameters back, for the latent statistics and the DiT stage
    model.vae.requires_grad_(False)
    log.info("VAE stage: %s", result["metrics"])
    return result["metrics"]


def train(cfg) -> dict[str, Any]:
    """Train Flex-Forcing (or a rigid baseline: ``model.chunking=one`` / ``singletons``) under ``cfg``."""
    from core.bootstrap import prepare_process
    from core.trainer import Trainer, seed_everything
    from perception.video.modeling_flexforcing import FlexForcingModel

    prepare_process()
    model_cfg: FlexForcingConfig = to_object(cfg.model)
    data: FlexVideoDataConfig = to_object(cfg.data)
    trainer_cfg: TrainerConfig = to_object(cfg.trainer)
    out_dir = Path(cfg.out_dir)
    seed_everything(trainer_cfg.seed)
    run_config = to_container(cfg)
    model = FlexForcingModel(model_cfg)  # reads model.base_path / model.vae_path (only read) when set
    model_cfg = model.config
    if model_cfg.frame_hw != data.frame_hw:
        raise DataError(data.root, f"data.size={data.size} differs from model.frame_size={list(model_cfg.frame_hw)}")
    clips = build_dataset(data, model_cfg.video_frames)
    user_vae = model_cfg.vae_path is not None or (model_cfg.base_path is not None and
                                                  (Path(model_cfg.base_path) / "vae").is_dir())
    started = model_cfg.init_path is not None  # Self-Forcing: VAE and latent statistics come with the checkpoint
    if not user_vae and not started and model_cfg.vae_pretrain_steps > 0:
        pretrain_vae(model, clips, trainer_cfg, model_cfg, out_dir / "vae", run_config)
    from core.layers.vae import wan_latent_stats

    if wan_latent_stats(model.vae) is None and not started:  # a VAE trained here (or stating none): 64 clips
        g = torch.Generator().manual_seed(trainer_cfg.seed)
        idx = torch.randperm(len(clips), generator=g)[:64].tolist()
        model.set_latent_stats(torch.stack([clips[i]["video"] for i in idx]))
    log.info("latent mean %s std %s", model.latent_mean.tolist(), model.latent_std.tolist())
    if model.load_report:
        log.info("loaded %s: missing %s, unexpected %s", model_cfg.base_path, model.load_report["missing"],
                 model.load_report["unexpected"])
    run_config["model"] = dataclasses.asdict(model_cfg)
    save_resolved(run_config, out_dir)
    latents = LatentWindows(clips, model, model_cfg.num_frames, data.window_step)
    # a step with one chunk leaves the K-projections without a gradient, and the chunking is drawn per rank
    result = Trainer(model, latents, trainer_cfg, out_dir, run_config=run_config,
                     find_unused_parameters=model.dit.kproj is not None).fit()
    log.info("trained %s/%s on %d clips; final %s", model_cfg.chunking, model_cfg.noise, len(clips.sources),
             result["metrics"])
    return {"step": result["step"], "loss": result["metrics"].get("loss"), "checkpoint": str(result["checkpoint"])}


# -- evaluation ---------------------------------------------------------------------------------------------
def _fd(a: torch.Tensor, b: torch.Tensor) -> float:
    from core.metrics.features import fd_effnet

    return fd_effnet(a.reshape(-1, *a.shape[-3:]), b.reshape(-1, *b.shape[-3:]))


@torch.no_grad()
def evaluate_regime(model, video: torch.Tensor, regime: str, context: int, seed: int, batch_size: int = 24,
                    sink_frames: int = 0, sink_rope: str = "relative") -> dict[str, Any]:
    """Continue ``video`` (N, L, 3, H, W) uint8 clips from their first ``context`` latent frames in ``regime``.

    The given video frames are the first ``1 + (context - 1) r``; the clips are cut to the longest ``1 + r k``
    frames; metrics are on the new video frames (see the module docstring).
    """
    from core.metrics.image import psnr, ssim, temporal_flicker
    from perception.video.pipeline_flexforcing import generate
    from perception.video.vbench import temporal_flickering

    device = next(model.parameters()).device
    r = model.config.temporal_factor
    video = video[:, :1 + (video.shape[1] - 1) // r * r]
    n, length = video.shape[:2]
    lat_len = 1 + (length - 1) // r
    given = 1 + (context - 1) * r  # video frames given
    t_len = model.config.video_frames  # video frames of a training window
    win = t_len - given
    gens, secs, first, dec_secs = [], 0.0, [], 0.0
    for s in range(0, n, batch_size):
        clip = video[s:s + batch_size].to(device)
        z = model.encode(clip[:, :given])
        g = torch.Generator().manual_seed(seed * 7919 + s)
        out = generate(model, z, lat_len - context, regime, generator=g, sink_frames=sink_frames, sink_rope=sink_rope)
        secs += out.seconds
        first.append(out.first_frame_s)
        t0 = time.perf_counter()
        gens.append(model.decode(out.latents)[:, given:].cpu())  # the whole latent video: the VAE is causal
        dec_secs += time.perf_counter() - t0
    gen = torch.cat(gens)  # (N, L - given, 3, H, W)
    gt = video[:, given:]
    as_f = lambda x: x.float() / 255.0  # noqa: E731
    per_frame = psnr(as_f(gen).flatten(0, 1), as_f(gt).flatten(0, 1)).reshape(n, -1).mean(0)
    q_gen, q_gt = gen[:, :win], gt[:, :win]
    result: dict[str, Any] = {
        "psnr": float(psnr(as_f(q_gen).flatten(0, 1), as_f(q_gt).flatten(0, 1)).mean()),
        "ssim": float(ssim(as_f(q_gen).flatten(0, 1), as_f(q_gt).flatten(0, 1)).mean()),
        "fd": _fd(q_gt, q_gen),
        "flicker": float(temporal_flicker(torch.cat([video[:, given - 1:given], q_gen], 1), 255.0).mean()),
        "flicker_gt": float(temporal_flicker(video[:, given - 1:t_len], 255.0).mean()),
        # VBench's temporal_flickering of the whole output video (given frames + continuation) and of the truth
        "tf_vbench": float(temporal_flickering(torch.cat([video[:, :given], gen], 1)).mean()),
        "tf_vbench_gt": float(temporal_flickering(video).mean()),
        "psnr_per_frame": [round(float(x), 3) for x in per_frame],
        # per clip (first window; the drift windows below): for paired intervals between models on the same clips
        "psnr_per_clip": [round(float(x), 4) for x in psnr(as_f(q_gen).flatten(0, 1), as_f(q_gt).flatten(0, 1))
                          .reshape(n, -1).mean(1)],
        "fps": n * (length - given) / max(secs, 1e-9),
        "fps_decoded": n * (length - given) / max(secs + dec_secs, 1e-9),
        "first_frame_s": float(sum(first) / len(first)),
        "drift": {},
    }
    m = 1
    while m * t_len <= length:  # the last ``win`` new frames of a video m times the training length
        e = m * t_len - given
        a = e - win
        result["drift"][f"{m}x"] = {
            "frames": [a + given, e + given],
            "psnr": float(per_frame[a:e].mean()),
            "psnr_per_clip": [round(float(x), 4) for x in psnr(as_f(gen[:, a:e]).flatten(0, 1),
                                                               as_f(gt[:, a:e]).flatten(0, 1)).reshape(n, -1).mean(1)],
            "fd": _fd(gt[:, a:e], gen[:, a:e]),
            "tf_vbench": float(temporal_flickering(torch.cat([video[:, :given], gen], 1)[:, a + given - 1:e + given])
                               .mean()),
        }
        m *= 2
    result["_video"] = gen
    return result


@torch.no_grad()
def reference_scores(model, video: torch.Tensor, context: int, batch_size: int = 24) -> dict[str, Any]:
    """What the arms are measured against, on the frames ``evaluate_regime`` scores: PSNR of *repeating the last
    given frame* (a static predictor) and of the *VAE's reconstruction of the truth* (the ceiling of anything
    decoded from this latent space), in the first window and in the drift windows."""
    from core.metrics.image import psnr

    r = model.config.temporal_factor
    video = video[:, :1 + (video.shape[1] - 1) // r * r]
    length = video.shape[1]
    given = 1 + (context - 1) * r
    t_len = model.config.video_frames
    win = t_len - given
    rec = torch.cat([model.decode(model.encode(video[s:s + batch_size].to(model.latent_mean.device))).cpu()
                     for s in range(0, len(video), batch_size)])[:, given:]
    gt = video[:, given:]
    still = video[:, given - 1:given].expand_as(gt)
    as_f = lambda x: x.float().flatten(0, 1) / 255.0  # noqa: E731

    def frames_psnr(pred, a, e):
        return float(psnr(as_f(pred[:, a:e]), as_f(gt[:, a:e])).mean())

    out = {"repeat_last_frame": {"psnr": frames_psnr(still, 0, win)},
           "vae_reconstruction": {"psnr": frames_psnr(rec, 0, win)}}
    m = 1
    while m * t_len <= length:
        e = m * t_len - given
        out["repeat_last_frame"][f"psnr_{m}x"] = frames_psnr(still, e - win, e)
        out["vae_reconstruction"][f"psnr_{m}x"] = frames_psnr(rec, e - win, e)
        m *= 2
    return out


def evaluate(cfg) -> dict[str, Any]:
    """Every regime the checkpoint supports on the held-out clips (see the module docstring)."""
    from perception.video.modeling_flexforcing import FlexForcingModel
    from perception.video.pipeline_flexforcing import supported_regimes

    data: FlexVideoDataConfig = to_object(cfg.data)
    ckpt = cfg.eval.checkpoint or cfg.out_dir
    device = "cuda" if torch.cuda.is_available() and cfg.trainer.device != "cpu" else "cpu"
    model = FlexForcingModel.from_pretrained(ckpt, use_ema=cfg.eval.use_ema, device=device).eval()
    ds = build_dataset(data, data.eval_frames, "test", step=10**9)
    n = len(ds) if data.max_test is None else min(len(ds), data.max_test)
    video = torch.stack([ds[i]["video"] for i in range(n)])
    regimes = [r for r in data.regimes if r in supported_regimes(model)]
    out: dict[str, Any] = {"checkpoint": str(ckpt), "weights": model.loaded_from.get("weights"),
                           "chunking": model.config.chunking, "noise": model.config.noise,
                           "k_projection": model.config.k_projection, "clips": n, "context": data.context,
                           "eval_frames": data.eval_frames, "train_frames": model.config.num_frames,
                           "seeds": list(data.seeds), "regimes": {}}
    out["references"] = reference_scores(model, video, data.context, data.batch_size)
    log.info("references: %s", out["references"])
    for regime in regimes:
        for sinks, rope in [(0, None)] * (0 in data.sink_frames) + [(k, r) for k in data.sink_frames if k
                                                                     for r in data.sink_ropes]:
            name = regime if not sinks else f"{regime}+sink{sinks}" + ("abs" if rope == "absolute" else "")
            runs = []
            for seed in data.seeds:
                try:
                    r = evaluate_regime(model, video, regime, data.context, seed, data.batch_size, sinks,
                                        rope or "relative")
                except ValueError as e:  # more sinks than this regime's context holds
                    if not sinks:
                        raise
                    log.warning("%s: skipped (%s)", name, e)
                    break
                r.pop("_video")
                runs.append(r)
                log.info("%s seed %d: PSNR %.2f SSIM %.3f FD %.1f flicker %.4f VBench-TF %.4f fps %.1f", name, seed,
                         r["psnr"], r["ssim"], r["fd"], r["flicker"], r["tf_vbench"], r["fps"])
            if runs:
                out["regimes"][name] = {"mean": _mean(runs), "seeds": runs}
    write_json(Path(cfg.out_dir) / "eval.json", out)
    return out


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed-mean of the scalar metrics (and of the drift entries); per-frame curves averaged too."""
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    res: dict[str, Any] = {k: float(sum(r[k] for r in runs) / len(runs)) for k in keys}
    res["psnr_per_frame"] = [round(sum(vals) / len(vals), 3) for vals in zip(*(r["psnr_per_frame"] for r in runs),
                                                                               strict=True)]
    def avg(vals):  # numbers, or lists of numbers element by element
        if isinstance(vals[0], list):
            return [round(sum(c) / len(c), 4) for c in zip(*vals, strict=True)]
        return float(sum(vals) / len(vals))

    res["psnr_per_clip"] = avg([r["psnr_per_clip"] for r in runs])
    res["drift"] = {m: {k: (v if k == "frames" else avg([r["drift"][m][k] for r in runs]))
                        for k, v in d.items()} for m, d in runs[0]["drift"].items()}
    if len(runs) > 1:
        res["std"] = {k: float(math.sqrt(sum((r[k] - res[k]) ** 2 for r in runs) / (len(runs) - 1))) for k in keys}
    return res
