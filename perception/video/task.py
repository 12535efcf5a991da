"""``embodied train flexforcing`` / ``embodied eval flexforcing``: the task functions, separate from the CLI.

train: (render the simulator clips with ``sim.render.videos`` if ``data.root`` is missing) -> windows of
``model.num_frames`` frames -> [stage 1: the per-frame VAE as an auto-encoder, into ``<out_dir>/vae``, unless
``model.vae_path`` names one (a diffusers folder or an earlier run's ``vae``)] -> per-channel latent statistics
-> ``FlexForcingModel`` with the VAE frozen -> the core Trainer -> checkpoints.

evaluate: held-out clips (rendered from ``data.test_seed``, ``data.test_frames`` long) -> the first
``data.context`` frames are given, the model continues them to ``data.eval_frames`` frames in every regime of
``data.regimes`` it was trained for, on every seed of ``data.seeds`` -> metrics per regime:

- ``psnr`` / ``ssim`` / ``fd`` / ``flicker`` on the new frames inside the first training-length window
  (frames ``context .. num_frames - 1``): quality of the continuation against ground truth;
- ``drift``: for videos ``m`` = 1, 2, 4, 8 ... times the training length (``m * num_frames`` frames, as many as
  ``eval_frames`` allows), PSNR and FD-EffNet of their last ``num_frames - context`` generated frames against the
  ground-truth frames at the same indices — error growth with length, and whether frames stay on the data
  manifold;
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
        ensure_dataset(root, data.render_n, data.render_frames, data.render_seed, data.size)
    else:
        root = Path(data.test_root)
        ensure_dataset(root, data.test_n, data.test_frames, data.test_seed, data.size)
    folder = root / "train" / "video" if (root / "train" / "video").is_dir() else root
    return folder


def build_dataset(data: FlexVideoDataConfig, clip_len: int, split: str = "train", step: int | None = None):
    """Clips of ``clip_len`` frames (``{"video": (T, 3, H, W) uint8}``) from the rendered ``split``."""
    from core.data.video import VideoClipDataset

    folder = ensure_data(data, split)
    ds = VideoClipDataset(folder, clip_len=clip_len, step=step or data.window_step, size=(data.size, data.size),
                          cache="all")
    if len(ds) == 0:
        raise DataError(folder, f"no clip of {clip_len} frames in the {split} videos")
    return ds


class LatentWindows(torch.utils.data.Dataset):
    """The windows of a ``VideoClipDataset`` as normalised latents: every source video is encoded once (the VAE
    is frozen after stage 1), so a training step runs the DiT only. Items: ``{"latents": (T, C, h, w)}``."""

    def __init__(self, clips, model, batch: int = 256):
        if clips.stride != 1:
            raise ValueError("LatentWindows needs clips of consecutive frames (stride 1)")
        self.clip_len = clips.clip_len
        self.index = clips.clip_index.copy()
        self.latents = {}
        device = model.latent_mean.device
        for vi in sorted({int(v) for v, _ in self.index}):
            frames = torch.from_numpy(clips.source_frames(vi)).to(device)
            self.latents[vi] = model.encode(frames[None], chunk=batch)[0].to("cpu", torch.float32)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        vi, start = (int(x) for x in self.index[i])
        return {"latents": self.latents[vi][start:start + self.clip_len].clone()}


def pretrain_vae(model, dataset, trainer_cfg: TrainerConfig, model_cfg: FlexForcingConfig, out_dir: Path,
                 run_config: dict[str, Any]) -> dict[str, float]:
    """Stage 1: ``model.vae`` trained as a per-frame auto-encoder on the training clips."""
    from core.layers.vae import AutoencoderTrainer
    from core.trainer import Trainer

    ae = AutoencoderTrainer(model.vae, "video", model_cfg.vae_kl_weight, model_cfg.vae_sample_posterior)
    model.vae.requires_grad_(True)
    steps = model_cfg.vae_pretrain_steps
    cfg = dataclasses.replace(
        trainer_cfg, max_steps=steps, ckpt_every=steps, ema_decay=None, grad_clip=1.0,
        batch_size=max(1, model_cfg.vae_batch_frames // model_cfg.num_frames),
        optim=dataclasses.replace(trainer_cfg.optim, lr=model_cfg.vae_pretrain_lr, param_group_lrs={}),
        scheduler=dataclasses.replace(trainer_cfg.scheduler, warmup_steps=min(50, steps // 10)))
    trainer = Trainer(ae, dataset, cfg, out_dir, run_config={**run_config, "stage": "vae"})
    result = trainer.fit()
    trainer.release()  # FSDP: the VAE's full parameters back, for the latent statistics and the DiT stage
    model.vae.requires_grad_(False)
    log.info("VAE stage: %s", result["metrics"])
    return result["metrics"]


def train(cfg) -> dict[str, Any]:
    """Train Flex-Forcing (or a rigid baseline: ``model.chunking=one`` / ``singletons``) under ``cfg``."""
    from core.bootstrap import prepare_process
    from core.layers.vae import load_autoencoder_weights
    from core.trainer import Trainer, seed_everything
    from perception.video.modeling_flexforcing import FlexForcingModel

    prepare_process()
    model_cfg: FlexForcingConfig = to_object(cfg.model)
    data: FlexVideoDataConfig = to_object(cfg.data)
    trainer_cfg: TrainerConfig = to_object(cfg.trainer)
    if data.size != model_cfg.frame_size:
        raise DataError(data.root, f"data.size={data.size} differs from model.frame_size={model_cfg.frame_size}")
    out_dir = Path(cfg.out_dir)
    dataset = build_dataset(data, model_cfg.num_frames)
    seed_everything(trainer_cfg.seed)
    run_config = to_container(cfg)
    model = FlexForcingModel(model_cfg)
    if model_cfg.vae_path is not None:
        load_autoencoder_weights(model.vae, model_cfg.vae_path)
    elif model_cfg.vae_pretrain_steps > 0:
        pretrain_vae(model, dataset, trainer_cfg, model_cfg, out_dir / "vae", run_config)
    g = torch.Generator().manual_seed(trainer_cfg.seed)
    idx = torch.randperm(len(dataset), generator=g)[:64].tolist()
    model.set_latent_stats(torch.stack([dataset[i]["video"] for i in idx]))
    log.info("latent mean %s std %s", model.latent_mean.tolist(), model.latent_std.tolist())
    run_config["model"] = dataclasses.asdict(model_cfg)
    save_resolved(run_config, out_dir)
    latents = LatentWindows(dataset, model)
    result = Trainer(model, latents, trainer_cfg, out_dir, run_config=run_config).fit()
    log.info("trained %s/%s on %d clips; final %s", model_cfg.chunking, model_cfg.noise, len(dataset),
             result["metrics"])
    return {"step": result["step"], "loss": result["metrics"].get("loss"), "checkpoint": str(result["checkpoint"])}


# -- evaluation ---------------------------------------------------------------------------------------------
def _fd(a: torch.Tensor, b: torch.Tensor) -> float:
    from core.metrics.features import fd_effnet

    return fd_effnet(a.reshape(-1, *a.shape[-3:]), b.reshape(-1, *b.shape[-3:]))


@torch.no_grad()
def evaluate_regime(model, video: torch.Tensor, regime: str, context: int, seed: int, batch_size: int = 24
                    ) -> dict[str, Any]:
    """Continue ``video`` (N, L, 3, H, W) uint8 clips from their first ``context`` frames in ``regime``."""
    from core.metrics.image import psnr, ssim, temporal_flicker
    from perception.video.sampling import generate

    device = next(model.parameters()).device
    n, length = video.shape[:2]
    t_len = model.config.num_frames
    win = t_len - context
    gens, secs, first, dec_secs = [], 0.0, [], 0.0
    for s in range(0, n, batch_size):
        clip = video[s:s + batch_size].to(device)
        z = model.encode(clip[:, :context])
        g = torch.Generator().manual_seed(seed * 7919 + s)
        out = generate(model, z, length - context, regime, generator=g)
        secs += out.seconds
        first.append(out.first_frame_s)
        t0 = time.perf_counter()
        gens.append(model.decode(out.latents[:, context:]).cpu())
        dec_secs += time.perf_counter() - t0
    gen = torch.cat(gens)  # (N, L - context, 3, H, W)
    gt = video[:, context:]
    as_f = lambda x: x.float() / 255.0  # noqa: E731
    per_frame = psnr(as_f(gen).flatten(0, 1), as_f(gt).flatten(0, 1)).reshape(n, -1).mean(0)
    q_gen, q_gt = gen[:, :win], gt[:, :win]
    result: dict[str, Any] = {
        "psnr": float(psnr(as_f(q_gen).flatten(0, 1), as_f(q_gt).flatten(0, 1)).mean()),
        "ssim": float(ssim(as_f(q_gen).flatten(0, 1), as_f(q_gt).flatten(0, 1)).mean()),
        "fd": _fd(q_gt, q_gen),
        "flicker": float(temporal_flicker(torch.cat([video[:, context - 1:context], q_gen], 1), 255.0).mean()),
        "flicker_gt": float(temporal_flicker(video[:, context - 1:t_len], 255.0).mean()),
        "psnr_per_frame": [round(float(x), 3) for x in per_frame],
        "fps": n * (length - context) / max(secs, 1e-9),
        "fps_decoded": n * (length - context) / max(secs + dec_secs, 1e-9),
        "first_frame_s": float(sum(first) / len(first)),
        "drift": {},
    }
    m = 1
    while m * t_len <= length:  # the last ``win`` new frames of a video m times the training length
        e = m * t_len - context
        a = e - win
        result["drift"][f"{m}x"] = {
            "frames": [a + context, e + context],
            "psnr": float(per_frame[a:e].mean()),
            "fd": _fd(gt[:, a:e], gen[:, a:e]),
        }
        m *= 2
    result["_video"] = gen
    return result


def evaluate(cfg) -> dict[str, Any]:
    """Every regime the checkpoint supports on the held-out clips (see the module docstring)."""
    from perception.video.modeling_flexforcing import FlexForcingModel
    from perception.video.sampling import supported_regimes

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
    for regime in regimes:
        runs = []
        for seed in data.seeds:
            r = evaluate_regime(model, video, regime, data.context, seed, data.batch_size)
            r.pop("_video")
            runs.append(r)
            log.info("%s seed %d: PSNR %.2f SSIM %.3f FD %.1f flicker %.4f fps %.1f", regime, seed, r["psnr"],
                     r["ssim"], r["fd"], r["flicker"], r["fps"])
        out["regimes"][regime] = {"mean": _mean(runs), "seeds": runs}
    write_json(Path(cfg.out_dir) / "eval.json", out)
    return out


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed-mean of the scalar metrics (and of the drift entries); per-frame curves averaged too."""
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    res: dict[str, Any] = {k: float(sum(r[k] for r in runs) / len(runs)) for k in keys}
    res["psnr_per_frame"] = [round(sum(vals) / len(vals), 3) for vals in zip(*(r["psnr_per_frame"] for r in runs),
                                                                               strict=True)]
    res["drift"] = {m: {k: (v if k == "frames" else float(sum(r["drift"][m][k] for r in runs) / len(runs)))
                        for k, v in d.items()} for m, d in runs[0]["drift"].items()}
    if len(runs) > 1:
        res["std"] = {k: float(math.sqrt(sum((r[k] - res[k]) ** 2 for r in runs) / (len(runs) - 1))) for k in keys}
    return res
