"""``embodied train tagrpo`` / ``embodied eval tagrpo``: GRPO post-training of the image-to-video policy.

train: conditioning images (windows of the simulator clips: first frame + the physically correct continuation)
-> the pretrained video model (``model.base_path``) as ``I2VPolicy`` -> ``GRPORunner`` iterations:

1. ``data.images_per_iteration`` images, ``algo.fresh`` SDE rollouts each, from the image's fixed initial noise
   (``algo.noise=same``) or from independent noise;
2. decode, reward (``data.rewards``) against the simulator's continuation;
3. the group: the fresh rollouts plus ``G - fresh`` banked rollouts of the same image and noise (reuse); TAGRPO's
   targets also take the bank's other rollouts of that image and noise; advantages normalised over them;
4. the trained sampling steps split into ``algo.updates_per_iteration`` chunks, one optimizer step each, with
   DanceGRPO's or TAGRPO's loss (``perception.i2v_rl.grpo``);
5. the fresh rollouts enter the FIFO memory bank;
6. every ``data.eval_every`` iterations the held-out reward (ODE sampler, fixed noise) goes to ``curve.json``
   against iteration and rollouts spent.

Checkpoints (``checkpoints/step_N``: weights, optimizer, RNG, bank, curve) every ``trainer.ckpt_every``
iterations; a killed run resumes from the newest. The final policy is exported to ``<out_dir>/policy``: an
``I2VPolicy`` folder (method ``tagrpo``, loadable by ``core.pretrained.load_pretrained``) holding the post-trained
DiT and referencing the base video model by its absolute path.

evaluate: the held-out images on ``data.eval_seed`` + ``range(eval_noises)`` noises, base model vs post-trained
policy: the trained reward and every simulator-grounded reward (``DIAGNOSTICS``), and two references (the first
frame held still; the truth through the VAE, the ceiling of decoded latents) -> ``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.errors import ConfigError, DataError
from core.io import write_json
from core.logging import get_logger
from perception.i2v_rl.configuration_tagrpo import AlgoConfig, TAGRPODataConfig, TAGRPOModelConfig

log = get_logger("embodied.tagrpo")

POLICY_DIR = "policy"
# Every simulator-grounded reward, reported by ``evaluate`` beside the trained one: a gain in the trained reward
# that comes with worse motion (trajectory), jerkier or blurrier frames (smoothness, feature) would show here.
DIAGNOSTICS = ("psnr", "trajectory", "smoothness", "goal", "feature")


# ------------------------------------------------------------------------------------------------ data
@dataclasses.dataclass
class ConditioningSet:
    """Conditioning images (N, 3, H, W) uint8 and their simulated continuations (N, F, 3, H, W) uint8."""

    images: torch.Tensor
    reference: torch.Tensor

    def __len__(self) -> int:
        return len(self.images)


def _clips(root: str, n: int, frames: int, seed: int, size: int, clip_len: int, step: int):
    from core.data.video import VideoClipDataset
    from sim.render.videos import ensure_dataset

    root_p = Path(root)
    ensure_dataset(root_p, n, frames, seed, size)
    folder = root_p / "train" / "video"
    ds = VideoClipDataset(folder, clip_len=clip_len, step=step, size=(size, size), cache="all")
    if len(ds) == 0:
        raise DataError(folder, f"no clip of {clip_len} frames")
    return ds


def conditioning_set(data: TAGRPODataConfig, frames: int, split: str) -> ConditioningSet:
    """``train``: ``data.train_images`` windows of ``frames`` frames drawn (``data.pool_seed``) from the training
    clips; ``test``: the first ``frames`` frames of the first ``data.heldout_images`` held-out clips."""
    if split == "train":
        ds = _clips(data.root, data.render_n, data.render_frames, data.render_seed, data.size, frames, 1)
        g = torch.Generator().manual_seed(data.pool_seed)
        idx = torch.randperm(len(ds), generator=g)[:data.train_images].tolist()
    else:
        ds = _clips(data.test_root, data.test_n, data.test_frames, data.test_seed, data.size, frames, 10**9)
        idx = list(range(min(len(ds), data.heldout_images)))
    video = torch.stack([ds[i]["video"] for i in idx])
    return ConditioningSet(video[:, 0].contiguous(), video)


def image_noise(policy, image: int, seed: int) -> torch.Tensor:
    """The fixed initial noise (1, N, C, h, w) of conditioning image ``image`` in a run of ``seed``."""
    return policy.initial_noise(1, torch.Generator().manual_seed(1_000_003 * (seed + 1) + image))


# ------------------------------------------------------------------------------------------------ reward
@torch.no_grad()
def heldout_reward(policy, reward, heldout: ConditioningSet, seed: int, batch: int = 64,
                   diagnostics=None) -> dict[str, Any]:
    """Mean reward (and terms, and per image) of ODE samples on the held-out images from fixed noise of ``seed``;
    ``diagnostics`` (a ``CompositeReward``) scores the same videos with other rewards, reported as ``diag``."""
    from perception.i2v_rl.rewards import RewardInputs

    device = policy.grid.device
    g = torch.Generator().manual_seed(10_007 * (seed + 1))
    noise = policy.initial_noise(len(heldout), g)
    totals, terms, diag = [], {}, {}
    for s in range(0, len(heldout), batch):
        imgs = heldout.images[s:s + batch].to(device)
        lat = policy.sample(policy.encode_first(imgs), noise[s:s + batch])
        video = policy.decode_video(imgs, lat).cpu()
        total, parts = reward(RewardInputs(video, heldout.reference[s:s + batch]))
        totals.append(total.cpu())
        for k, v in parts.items():
            terms.setdefault(k, []).append(v.cpu())
        if diagnostics is not None:
            for k, v in diagnostics(RewardInputs(video, heldout.reference[s:s + batch]))[1].items():
                diag.setdefault(k, []).append(v.cpu())
    per_image = torch.cat(totals)
    return {"reward": float(per_image.mean()), "terms": {k: float(torch.cat(v).mean()) for k, v in terms.items()},
            "diag": {k: float(torch.cat(v).mean()) for k, v in diag.items()},
            "per_image": [round(float(x), 4) for x in per_image]}


# ------------------------------------------------------------------------------------------------ runner
class GRPORunner:
    """The post-training loop (see the module docstring): rollouts, rewards, bank, updates, curve, checkpoints."""

    def __init__(self, policy, algo: AlgoConfig, trainer: TrainerConfig, reward, pool: ConditioningSet,
                 heldout: ConditioningSet, out_dir: Path, run_config: dict[str, Any] | None = None,
                 images_per_iteration: int = 2, eval_every: int = 5, eval_seed: int = 0):
        from core.trainer import build_optimizer, lr_lambda
        from perception.i2v_rl.grpo import MemoryBank

        self.policy, self.algo, self.cfg, self.reward = policy, algo, trainer, reward
        self.pool, self.heldout, self.out_dir = pool, heldout, Path(out_dir)
        self.run_config = run_config or {}
        self.images_per_iteration = min(images_per_iteration, len(pool))
        self.eval_every, self.eval_seed = eval_every, eval_seed
        self.device = policy.grid.device
        self.optimizer = build_optimizer(policy.trainable(), trainer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(trainer))
        self.bank = MemoryBank(algo.bank_size)
        self.generator = torch.Generator().manual_seed(trainer.seed)
        self.iteration = 0
        self.rollouts = 0
        self.curve: list[dict[str, Any]] = []
        self.last_stats: dict[str, float] = {}

    # -- noise ------------------------------------------------------------------------------------------------
    def _noise(self, images: list[int]) -> tuple[torch.Tensor, list[Any]]:
        fresh = self.algo.fresh
        if self.algo.noise == "same":
            noise = torch.cat([image_noise(self.policy, i, self.cfg.seed).expand(fresh, -1, -1, -1, -1)
                               for i in images])
            keys = [("same", i) for i in images]
        else:
            noise = self.policy.initial_noise(len(images) * fresh, self.generator)
            keys = [("independent", self.iteration, g) for g in range(len(images))]
        return noise.contiguous(), keys

    # -- one iteration ----------------------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        from perception.i2v_rl.grpo import BankEntry, contrastive_loss, group_advantages, grpo_loss
        from perception.i2v_rl.rewards import RewardInputs

        algo, policy, fresh = self.algo, self.policy, self.algo.fresh
        t0 = time.perf_counter()
        picks = torch.randperm(len(self.pool), generator=self.generator)[:self.images_per_iteration].tolist()
        imgs = self.pool.images[picks].to(self.device).repeat_interleave(fresh, 0)
        ref = self.pool.reference[picks].repeat_interleave(fresh, 0)
        first = policy.encode_first(imgs)
        noise, keys = self._noise(picks)
        policy.eval()
        traj = policy.rollout(first, noise, algo.eta, self.generator)
        video = policy.decode_video(imgs, traj.final).cpu()
        rewards, _ = self.reward(RewardInputs(video, ref))
        rewards = rewards.to(self.device, torch.float32)
        self.rollouts += len(imgs)
        t_rollout = time.perf_counter() - t0

        # Groups: fresh rollouts + reused banked ones (advantage set); contrastive targets add the bank's others.
        groups = []
        for g, (img, key) in enumerate(zip(picks, keys, strict=True)):
            rows = slice(g * fresh, (g + 1) * fresh)
            banked = self.bank.lookup(img, key, before=self.iteration)
            reuse = banked[:algo.group_size - fresh]
            extra = banked[len(reuse):len(reuse) + algo.group_size] if (algo.loss == "contrastive"
                                                                         and algo.bank_targets) else []
            others = reuse + extra
            r = torch.cat([rewards[rows], torch.tensor([e.reward for e in others], device=self.device)])
            adv = group_advantages(r, clip=algo.adv_clip)
            lat = (torch.cat([traj.latents[rows], torch.stack([e.latents for e in others]).to(self.device)])
                   if others else traj.latents[rows])
            groups.append({"rows": rows, "adv": adv, "latents": lat, "reward_std": float(r.std(unbiased=False)),
                           "n_targets": len(r)})

        steps = list(range(policy.steps))
        if algo.timestep_fraction < 1:
            k = max(1, round(algo.timestep_fraction * policy.steps))
            steps = sorted(torch.randperm(policy.steps, generator=self.generator)[:k].tolist())
        chunks = [c.tolist() for c in torch.tensor(steps).chunk(algo.updates_per_iteration)]
        policy.train()
        stats: dict[str, list[float]] = {"loss": [], "ratio_dev_first": [], "ratio_dev": [], "clipped": []}
        for c_i, chunk in enumerate(chunks):
            self.optimizer.zero_grad(set_to_none=True)
            for i in chunk:
                mean_new, std = policy.transition(first, traj.latents[:, i], i, algo.eta)
                total = 0.0
                for grp in groups:
                    rows = grp["rows"]
                    if algo.loss == "grpo":
                        loss, st = grpo_loss(mean_new[rows], traj.means[rows, i], traj.latents[rows, i + 1], std,
                                             grp["adv"][:fresh], algo.clip_range)
                    else:
                        loss, st = contrastive_loss(mean_new[rows], traj.means[rows, i], grp["latents"][:, i + 1],
                                                    std, grp["adv"], torch.arange(fresh, device=self.device),
                                                    algo.clip_range, algo.contrast_weight)
                    total = total + loss
                    dev = float((st["ratio"] - 1).abs().max())
                    stats["ratio_dev_first" if c_i == 0 else "ratio_dev"].append(dev)
                    stats["clipped"].append(float(st["clipped"]))
                total = total / (len(chunk) * len(groups))
                total.backward()
                stats["loss"].append(float(total.detach()) * len(chunk))
            if self.cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(policy.trainable().parameters(), self.cfg.grad_clip)
            self.optimizer.step()
            self.scheduler.step()

        t_update = time.perf_counter() - t0 - t_rollout
        for b in range(len(imgs)):
            self.bank.add(BankEntry(picks[b // fresh], keys[b // fresh], traj.latents[b], float(rewards[b]),
                                    self.iteration))
        self.iteration += 1
        out = {"train_reward": float(rewards.mean()),
               "reward_std_in_group": sum(g["reward_std"] for g in groups) / len(groups),
               "targets_per_group": sum(g["n_targets"] for g in groups) / len(groups),
               "loss": sum(stats["loss"]) / max(len(stats["loss"]), 1),
               "ratio_dev_first": max(stats["ratio_dev_first"], default=0.0),
               "ratio_dev": max(stats["ratio_dev"], default=0.0),
               "clipped": sum(stats["clipped"]) / max(len(stats["clipped"]), 1),
               "rollouts": self.rollouts, "lr": self.scheduler.get_last_lr()[0],
               "rollout_s": t_rollout, "update_s": t_update}
        self.last_stats = out
        return out

    # -- evaluation / state -----------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        self.policy.eval()
        r = heldout_reward(self.policy, self.reward, self.heldout, self.eval_seed)
        entry = {"iteration": self.iteration, "rollouts": self.rollouts, "reward": r["reward"], **r["terms"],
                 "train_reward": self.last_stats.get("train_reward")}
        self.curve = [c for c in self.curve if c["iteration"] != self.iteration] + [entry]
        write_json(self.out_dir / "curve.json", {"algo": dataclasses.asdict(self.algo), "curve": self.curve})
        return entry

    def state(self) -> dict[str, Any]:
        from core.checkpoint import capture_rng

        return {"iteration": self.iteration, "rollouts": self.rollouts, "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "generator": self.generator.get_state(),
                "rng": capture_rng(), "bank": self.bank.state_dict(), "curve": self.curve}

    def save(self) -> Path:
        from core import checkpoint as ckpt

        name = f"step_{self.iteration:08d}"
        d = self.out_dir / "checkpoints"
        path = ckpt.save_checkpoint(d / name, self.policy, self.run_config, self.state())
        ckpt.mark_latest(d, name)
        ckpt.prune_checkpoints(d, self.cfg.keep_last)
        return path

    def resume(self) -> bool:
        from core import checkpoint as ckpt

        latest = ckpt.latest_checkpoint(self.out_dir / "checkpoints")
        if latest is None:
            return False
        st = ckpt.load_checkpoint(latest, self.policy)["training_state"]
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.generator.set_state(st["generator"])
        ckpt.restore_rng(st["rng"])
        self.bank.load_state_dict(st["bank"])
        self.iteration, self.rollouts, self.curve = int(st["iteration"]), int(st["rollouts"]), list(st["curve"])
        log.info("resumed from %s (iteration %d, %d rollouts)", latest, self.iteration, self.rollouts)
        return True

    def fit(self, iterations: int) -> dict[str, Any]:
        from core.logging import MetricsLogger
        from core.trainer import seed_everything

        resumed = self.cfg.resume and self.resume()
        if not resumed:
            seed_everything(self.cfg.seed)
        logger = MetricsLogger(self.out_dir, tensorboard=self.cfg.tensorboard,
                               resume_step=self.iteration if resumed else None)
        if not self.curve:
            e = self.evaluate()
            log.info("iteration 0: held-out reward %.4f", e["reward"])
        t0 = time.perf_counter()
        while self.iteration < iterations:
            stats = self.step()
            if self.iteration % self.cfg.log_every == 0 or self.iteration == iterations:
                logger.log(self.iteration, stats)
            if self.iteration % self.eval_every == 0 or self.iteration == iterations:
                e = self.evaluate()
                logger.log(self.iteration, {"heldout_reward": e["reward"]})
                log.info("iteration %d (%d rollouts, %.0f s): train %.4f held-out %.4f, ratio dev first %.1e",
                         self.iteration, self.rollouts, time.perf_counter() - t0, stats["train_reward"], e["reward"],
                         stats["ratio_dev_first"])
            if self.iteration % self.cfg.ckpt_every == 0 or self.iteration == iterations:
                self.save()
        logger.close()
        return {"iteration": self.iteration, "rollouts": self.rollouts, "curve": self.curve}


# ------------------------------------------------------------------------------------------------ tasks
def _configs(cfg) -> tuple[AlgoConfig, TAGRPOModelConfig, TAGRPODataConfig, TrainerConfig]:
    if cfg.algo is None:
        raise ConfigError("no algorithm: add algo=tagrpo | dancegrpo | tagrpo_indep | dancegrpo_same | tagrpo_reuse")
    return to_object(cfg.algo), to_object(cfg.model), to_object(cfg.data), to_object(cfg.trainer)


def policy_folder(path: str | Path) -> Path:
    """A run's exported ``<path>/policy`` when there is one, else ``path`` itself.

    ``path`` itself may be a policy folder, a training checkpoint, or a run whose newest checkpoint
    ``I2VPolicy.from_pretrained`` finds.
    """
    path = Path(path)
    return path / POLICY_DIR if (path / POLICY_DIR / "config.json").is_file() else path


def build_policy(model_cfg: TAGRPOModelConfig, data: TAGRPODataConfig, device, weights: str | None = None):
    """The policy around ``model_cfg.base_path`` (the base model), or the post-trained one saved at ``weights``.

    ``weights`` goes through ``policy_folder``; the policy's frames must be ``data.size`` px.
    """
    from perception.i2v_rl.policy import I2VPolicy

    source = model_cfg.base_path if weights is None else policy_folder(weights)
    policy = (I2VPolicy(model_cfg) if weights is None else I2VPolicy.from_pretrained(source)).to(device)
    size = policy.backbone.config.frame_size
    if size != data.size:
        raise DataError(source, f"frames are {size} px, data.size is {data.size}")
    return policy


def train(cfg) -> dict[str, Any]:
    """Post-train the pretrained I2V model with ``cfg.algo`` (see the module docstring)."""
    from core.bootstrap import prepare_process
    from core.distributed import resolve_device
    from perception.i2v_rl.rewards import CompositeReward

    prepare_process()
    algo, model_cfg, data, tcfg = _configs(cfg)
    device = resolve_device(tcfg.device)
    out_dir = Path(cfg.out_dir)
    policy = build_policy(model_cfg, data, device)
    pool = conditioning_set(data, policy.frames, "train")
    heldout = conditioning_set(data, policy.frames, "test")
    run_config = to_container(cfg)
    save_resolved(run_config, out_dir)
    runner = GRPORunner(policy, algo, tcfg, CompositeReward(dict(data.rewards)), pool, heldout, out_dir,
                        run_config, data.images_per_iteration, data.eval_every, data.eval_seed)
    result = runner.fit(tcfg.max_steps)
    first, last = result["curve"][0], result["curve"][-1]
    policy.save_pretrained(
        out_dir / POLICY_DIR, run_config={k: v for k, v in run_config.items() if k not in ("model",)},
        card={"post_training": f"{algo.name} (perception/i2v_rl), {result['iteration']} iterations, "
                               f"{result['rollouts']} rollouts",
              "command": f"embodied train tagrpo algo={algo.name} trainer.seed={tcfg.seed} "
                         f"trainer.max_steps={tcfg.max_steps}",
              "training_domain": "first frames of simulator motion clips (sim.render.videos), "
                                 f"{data.size} px; reward {dict(data.rewards)} against their continuation",
              "metrics": {"heldout_reward_before": round(first["reward"], 4),
                          "heldout_reward_after": round(last["reward"], 4), "rewards": dict(data.rewards)}},
        body="Image-to-video policy post-trained by `embodied train tagrpo` (see perception/i2v_rl/README.md).\n")
    log.info("%s: held-out reward %.4f -> %.4f over %d rollouts", algo.name, first["reward"], last["reward"],
             result["rollouts"])
    return {"iteration": result["iteration"], "rollouts": result["rollouts"], "reward_before": first["reward"],
            "reward_after": last["reward"], "policy": str(out_dir / POLICY_DIR)}


@torch.no_grad()
def reference_rewards(policy, reward, heldout: ConditioningSet) -> dict[str, float]:
    """Rewards of two non-generative references on the held-out set: ``static`` (the first frame repeated: no
    motion at all) and ``vae_reconstruction`` (the simulator's own continuation through the backbone's VAE: the
    ceiling of anything decoded from its latents)."""
    from perception.i2v_rl.rewards import RewardInputs

    static = heldout.images[:, None].expand_as(heldout.reference).contiguous()
    recon = policy.backbone.decode(policy.backbone.encode(heldout.reference.to(policy.grid.device))).cpu()
    recon[:, 0] = heldout.reference[:, 0]
    return {"static": float(reward(RewardInputs(static, heldout.reference))[0].mean()),
            "vae_reconstruction": float(reward(RewardInputs(recon, heldout.reference))[0].mean())}


def evaluate(cfg, eval_noises: int = 3) -> dict[str, Any]:
    """Held-out rewards of the base model and the post-trained policy on the same images and noises."""
    from core.distributed import resolve_device
    from perception.i2v_rl.rewards import CompositeReward

    _, model_cfg, data, tcfg = _configs(cfg)
    device = resolve_device(tcfg.device)
    tuned_path = cfg.eval.checkpoint or str(Path(cfg.out_dir) / POLICY_DIR)
    if not Path(tuned_path).exists():
        raise DataError(tuned_path, "no post-trained policy (run `embodied train tagrpo` first or set "
                                    "eval.checkpoint)")
    reward = CompositeReward(dict(data.rewards))
    diagnostics = CompositeReward(dict.fromkeys(DIAGNOSTICS, 1.0))
    base = build_policy(model_cfg, data, device)
    heldout = conditioning_set(data, base.frames, "test")
    out: dict[str, Any] = {"policy": tuned_path, "base": model_cfg.base_path, "rewards": dict(data.rewards),
                           "images": len(heldout), "noises": eval_noises}
    for name, weights in (("base", None), ("tuned", tuned_path)):
        policy = base if weights is None else build_policy(model_cfg, data, device, weights)
        if policy.frames != base.frames:
            raise ConfigError(f"{tuned_path}: the policy generates {policy.frames} frames, model.frames gives "
                              f"{base.frames} (evaluate both on the same clips: set model.frames)")
        runs = [heldout_reward(policy, reward, heldout, data.eval_seed + s, diagnostics=diagnostics)
                for s in range(eval_noises)]
        vals = [r["reward"] for r in runs]
        mean = sum(vals) / len(vals)
        out[name] = {"reward": mean,
                     "reward_std": math.sqrt(sum((v - mean) ** 2 for v in vals) / max(len(vals) - 1, 1)),
                     "terms": {k: sum(r["terms"][k] for r in runs) / len(runs) for k in runs[0]["terms"]},
                     "diagnostics": {k: sum(r["diag"][k] for r in runs) / len(runs) for k in runs[0]["diag"]}}
        log.info("%s: held-out reward %.4f", name, mean)
    out["gain"] = out["tuned"]["reward"] - out["base"]["reward"]
    out["references"] = reference_rewards(base, reward, heldout)
    write_json(Path(cfg.out_dir) / "eval.json", out)
    return out
