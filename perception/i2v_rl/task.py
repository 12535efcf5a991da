"""``embodied train tagrpo`` / ``embodied eval tagrpo``: GRPO post-training of the image-to-video policy.

train: conditioning images (windows of the simulator clips: first frame + the physically correct continuation)
-> the pretrained video model (``model.base_path``) as ``I2VPolicy`` -> ``GRPORunner`` iterations, trained by the
shared ``core.trainer.Trainer`` (``GRPOLearner``: the rollouts are its on-policy ``prepare_batch``):

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

An iteration is ``algo.updates_per_iteration`` optimizer steps (``trainer.max_steps`` counts optimizer steps).
Checkpoints (``checkpoints/step_N``: weights, optimizer, RNG, bank, curve, an unfinished iteration's rollouts)
every ``trainer.ckpt_every`` optimizer steps; a killed run resumes from the newest to the same weights.
``trainer.precision``, ``trainer.strategy=ddp|fsdp`` and ``trainer.gradient_checkpointing`` apply as to every
method. The final policy is exported to ``<out_dir>/policy``: an
``I2VPolicy`` folder (method ``tagrpo``, loadable by ``core.pretrained.load_pretrained``) holding the post-trained
DiT and referencing the base video model by its absolute path.

evaluate: the held-out images on ``data.eval_seed`` + ``range(eval_noises)`` noises, base model vs post-trained
policy: the trained reward and every simulator-grounded reward (``DIAGNOSTICS``), and two references (the first
frame held still; the truth through the VAE, the ceiling of decoded latents) -> ``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

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
        first = policy.encode_first(imgs)
        lat = policy.sample(first, noise[s:s + batch])
        video = policy.decode_video(imgs, lat, first).cpu()
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
def _seed(*parts: int) -> int:
    """A generator seed from integers (a run's seed, an iteration, a slot, a stream id), order-sensitive."""
    s = 0
    for p in parts:
        s = (s * 1_000_003 + int(p) + 1) % (1 << 62)
    return s


class IterationSchedule(Dataset):
    """Which conditioning images every micro-batch of a run trains on: what the trainer's loader reads, unshuffled.

    The run is ``steps`` optimizer steps of ``micro`` micro-batches each (the trained sampling steps of one update);
    ``updates`` consecutive optimizer steps make one iteration, which trains on ``images`` conditioning images (its
    slots), drawn from the pool by a generator of (``seed``, iteration) alone. Item ``j`` is slot ``j % images`` of
    micro-batch ``j // images`` (counted over all processes). Read in order by ``ResumableDistributedSampler``,
    process ``r`` of ``W`` holds the slots ``r, r + W, ...`` of every micro-batch, so which image goes where, and
    with it every rollout, depends on the seed and the iteration only: not on the world size, not on a resume.
    """

    def __init__(self, pool: ConditioningSet, steps: int, micro: int, updates: int, images: int, seed: int):
        self.pool, self.steps, self.micro, self.updates, self.images, self.seed = (pool, steps, micro, updates,
                                                                                   images, seed)

    def __len__(self) -> int:
        return self.steps * self.micro * self.images

    def picks(self, iteration: int) -> list[int]:
        """The pool indices of ``iteration``'s slots."""
        g = torch.Generator().manual_seed(_seed(self.seed, iteration, 0))
        return torch.randperm(len(self.pool), generator=g)[:self.images].tolist()

    def __getitem__(self, j: int) -> dict[str, torch.Tensor]:
        g, slot = divmod(int(j), self.images)
        step, micro = divmod(g, self.micro)
        iteration, chunk = divmod(step, self.updates)
        pick = self.picks(iteration)[slot]
        return {"image": self.pool.images[pick], "reference": self.pool.reference[pick],
                **{k: torch.tensor(v) for k, v in (("pick", pick), ("slot", slot), ("iteration", iteration),
                                                     ("chunk", chunk), ("micro", micro))}}


class GRPOLearner(nn.Module):
    """What the shared trainer trains: the policy with TAGRPO's / DanceGRPO's rollouts, groups, bank and loss.

    One iteration is ``algo.updates_per_iteration`` optimizer steps. ``prepare_batch`` (the trainer's on-policy
    hook, under no_grad with the current weights) rolls out the micro-batch's images at the iteration's first
    micro-batch — the held-out evaluation first when the iteration is due one — rewards them, forms the groups from
    them and the memory bank, banks them, and keeps them for the iteration's other micro-batches; every micro-batch
    is one trained sampling step of one update (``training_step``: the step's transition under the current weights
    and the loss of every group). Before the iteration's first optimizer step the weights are those of the
    rollouts, so every ratio of its first update is exactly 1.

    The learner's modules are the policy's (``backbone``), so its state-dict keys are the policy's and a training
    checkpoint loads as an ``I2VPolicy``. ``training_state`` (bank, curve, an iteration's rollouts when a
    checkpoint falls inside one) goes into every checkpoint. Under DDP / FSDP each process rolls out its slots
    (``IterationSchedule``) and the fresh rollouts of all processes enter every process's bank in slot order, so
    the bank, the groups and the updates are those of one process.
    """

    def __init__(self, policy, algo: AlgoConfig, reward, heldout: ConditioningSet, schedule: IterationSchedule,
                 out_dir: Path, eval_every: int, eval_seed: int):
        from perception.i2v_rl.grpo import MemoryBank, step_weights

        super().__init__()
        self.backbone = policy.backbone  # the policy's modules: the same keys, sharded / moved with the learner
        self.__dict__["policy"] = policy  # not a submodule: its keys would gain a prefix
        self.algo, self.reward, self.heldout, self.schedule = algo, reward, heldout, schedule
        self.out_dir, self.eval_every, self.eval_seed = Path(out_dir), eval_every, eval_seed
        self.bank = MemoryBank(algo.bank_size)
        # the loss weight of every sampling step (algo.step_weighting, grpo.step_weights)
        self.step_weight = step_weights(policy.steps, policy.shift, algo.eta, algo.step_weighting).tolist()
        self.curve: list[dict[str, Any]] = []
        self.last_train_reward: float | None = None
        self._rollouts: dict[str, Any] | None = None
        self.history: list[dict[str, float]] = []  # the current iteration's training_step outputs
        # GRPO-Guard's diagnostic: per iteration, per trained sampling step, the mean / sd of the importance ratio
        # of the sampled transitions over the update's samples (``ratio_steps``); written to curve.json
        self.ratio_log: list[dict[str, Any]] = []
        self._ratio_iter: list[dict[str, Any]] = []

    # -- scaling: the policy's units -------------------------------------------------------------------------
    def enable_gradient_checkpointing(self) -> None:
        self.policy.enable_gradient_checkpointing()

    def fsdp_units(self) -> list[nn.Module]:
        return self.policy.checkpoint_units()

    # -- the schedule -------------------------------------------------------------------------------------------
    def timesteps(self, iteration: int) -> list[list[int]]:
        """The trained sampling steps of each update of ``iteration`` (``algo.timestep_fraction`` of them, or
        MixGRPO's window, ``algo.sde_window``)."""
        s = self.policy.steps
        steps = self.algo.window(iteration, s)
        if self.algo.timestep_fraction < 1:
            g = torch.Generator().manual_seed(_seed(self.schedule.seed, iteration, 1))
            steps = sorted(torch.randperm(s, generator=g)[:trained_steps(self.algo, s)].tolist())
        return [c.tolist() for c in torch.tensor(steps).chunk(self.algo.updates_per_iteration)]

    def _noise(self, iteration: int, pick: int, slot: int) -> tuple[torch.Tensor, Any]:
        fresh, policy = self.algo.fresh, self.policy
        if self.algo.noise == "same":
            return image_noise(policy, pick, self.schedule.seed).expand(fresh, -1, -1, -1, -1), ("same", pick)
        g = torch.Generator().manual_seed(_seed(self.schedule.seed, iteration, slot, 2))
        return policy.initial_noise(fresh, g), ("independent", iteration, slot)

    # -- the trainer's hooks --------------------------------------------------------------------------------------
    def prepare_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The iteration's rollouts (drawn at its first micro-batch) and this micro-batch's sampling step."""
        from core.trainer import TrainingError

        it, chunk, micro = (int(batch[k][0]) for k in ("iteration", "chunk", "micro"))
        if chunk == 0 and micro == 0:
            self._rollouts, self.history, self._ratio_iter = None, [], []
            self._rollouts = self._roll_out(batch, it)
        elif self._rollouts is None or self._rollouts["iteration"] != it:
            raise TrainingError(f"no rollouts of iteration {it} for its update {chunk} (the training state lost them)")
        last = chunk == self.algo.updates_per_iteration - 1 and micro == self.schedule.micro - 1
        out = {**self._rollouts, "chunk": chunk, "timestep": self.timesteps(it)[chunk][micro], "last": last}
        if last:
            self._rollouts = None  # the iteration's last micro-batch: a checkpoint after it need not keep them
        return out

    def _roll_out(self, batch: dict[str, torch.Tensor], it: int) -> dict[str, Any]:
        from core import distributed as D
        from perception.i2v_rl.grpo import BankEntry, group_advantages
        from perception.i2v_rl.rewards import RewardInputs

        algo, policy, fresh, device = self.algo, self.policy, self.algo.fresh, batch["image"].device
        policy.grid = policy.grid.to(device)
        was_training = self.training
        t_eval = 0.0
        self._t_iter = time.perf_counter()
        if it % self.eval_every == 0:  # the weights after `it` iterations
            t0 = time.perf_counter()
            self.evaluate(it)
            t_eval = time.perf_counter() - t0
        t0 = time.perf_counter()
        picks, slots = batch["pick"].tolist(), batch["slot"].tolist()
        imgs = batch["image"].repeat_interleave(fresh, 0)
        first = policy.encode_first(imgs)
        noises = [self._noise(it, p, s) for p, s in zip(picks, slots, strict=True)]
        noise = torch.cat([n for n, _ in noises]).to(device).contiguous()
        step_noise = torch.cat([  # the SDE's draws, per slot: the same rollouts whichever process draws them
            torch.randn(fresh, policy.steps, *policy.latent_shape(),
                        generator=torch.Generator().manual_seed(_seed(self.schedule.seed, it, s, 3))) for s in slots])
        policy.eval()
        window = None if algo.sde_window is None else algo.window(it, policy.steps)  # MixGRPO: SDE steps only there
        traj = policy.rollout(first, noise, algo.eta, step_noise=step_noise.to(device), sde_steps=window)
        policy.train(was_training)
        video = policy.decode_video(imgs, traj.final, first).cpu()
        ref = batch["reference"].cpu().repeat_interleave(fresh, 0)
        rewards = self.reward(RewardInputs(video, ref))[0].to(device, torch.float32)

        # Groups: fresh rollouts + reused banked ones (advantage set); contrastive targets add the bank's others.
        groups = []
        for g, (pick, (_, key)) in enumerate(zip(picks, noises, strict=True)):
            rows = slice(g * fresh, (g + 1) * fresh)
            banked = self.bank.lookup(pick, key, before=it)
            reuse = banked[:algo.group_size - fresh]
            extra = banked[len(reuse):len(reuse) + algo.group_size] if (algo.loss == "contrastive"
                                                                         and algo.bank_targets) else []
            others = reuse + extra
            r = torch.cat([rewards[rows], torch.tensor([e.reward for e in others], device=device)])
            lat = (torch.cat([traj.latents[rows], torch.stack([e.latents for e in others]).to(device)])
                   if others else traj.latents[rows])
            groups.append({"start": rows.start, "adv": group_advantages(r, clip=algo.adv_clip), "latents": lat,
                           "reward_std": float(r.std(unbiased=False)), "n_targets": len(r)})
        # Every process banks every process's fresh rollouts, in slot order: one bank, as in one process.
        mine = [(s, k, traj.latents[g * fresh + k].cpu(), float(rewards[g * fresh + k]))
                for g, s in enumerate(slots) for k in range(fresh)]
        entries = sorted((e for part in _gather(mine) for e in part), key=lambda e: (e[0], e[1]))
        order = self.schedule.picks(it)
        for s, _, latents, reward in entries:
            key = ("same", order[s]) if algo.noise == "same" else ("independent", it, s)
            self.bank.add(BankEntry(order[s], key, latents, reward, it))
        mean_reward = float(D.all_reduce_mean(rewards.mean().detach()))
        self.last_train_reward = mean_reward
        stats = {"train_reward": mean_reward, "reward_std_in_group": sum(g["reward_std"] for g in groups) / len(groups),
                 "targets_per_group": sum(g["n_targets"] for g in groups) / len(groups),
                 "rollouts": (it + 1) * self.schedule.images * fresh, "iteration": it + 1,
                 "rollout_s": time.perf_counter() - t0, "eval_s": t_eval,
                 "window_start": float(algo.window(it, policy.steps)[0])}
        if it % self.eval_every == 0:
            stats["heldout_reward"] = self.curve[-1]["reward"]
        return {"iteration": it, "first": first, "latents": traj.latents, "means": traj.means, "groups": groups,
                "stats": stats}

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """DanceGRPO's / TAGRPO's loss at one sampling step for every group of the micro-batch."""
        from perception.i2v_rl.grpo import contrastive_loss, grpo_loss

        algo, fresh, i = self.algo, self.algo.fresh, batch["timestep"]
        lat, means, device = batch["latents"], batch["means"], batch["latents"].device
        mean_new, std = self.policy.transition(batch["first"], lat[:, i], i, algo.eta)
        total, devs, clipped, ratios = 0.0, [], [], []
        for grp in batch["groups"]:
            rows = slice(grp["start"], grp["start"] + fresh)
            if algo.loss == "grpo":
                loss, st = grpo_loss(mean_new[rows], means[rows, i], lat[rows, i + 1], std, grp["adv"][:fresh],
                                     algo.clip_range)
            else:
                loss, st = contrastive_loss(mean_new[rows], means[rows, i], grp["latents"][:, i + 1], std, grp["adv"],
                                            torch.arange(fresh, device=device), algo.clip_range, algo.contrast_weight)
            total = total + loss
            devs.append((st["ratio"] - 1).abs().max())
            clipped.append(st["clipped"])
            ratios.append(st["ratio"].double())
        loss = total / len(batch["groups"])
        if self.step_weight[i] != 1.0:
            loss = loss * self.step_weight[i]
        out = {"loss": loss, "ratio_dev_first" if batch["chunk"] == 0 else "ratio_dev": torch.stack(devs).max(),
               "clipped": torch.stack(clipped).mean()}
        out["ratio_mean"] = self._guard(torch.cat(ratios), i, batch)
        out = {**out, **{k: torch.tensor(float(v)) for k, v in batch["stats"].items()}}
        self.history.append({k: float(v.detach()) for k, v in out.items()})
        return out

    def _guard(self, ratio: torch.Tensor, step: int, batch: dict[str, Any]) -> torch.Tensor:
        """GRPO-Guard's diagnostic at sampling step ``step``: mean and sd of the importance ratios ``ratio`` (K,)
        of the sampled transitions over every process's samples; recorded for the iteration, and the iteration's
        record goes to ``ratio_log`` (and curve.json) at its last micro-batch. Returns the mean."""
        from core import distributed as D

        moments = torch.stack([ratio.sum(), (ratio**2).sum(), torch.tensor(float(ratio.numel()), dtype=ratio.dtype,
                                                                           device=ratio.device)])
        moments = D.all_reduce_mean(moments)  # proportional to the sums over processes: the ratios stay exact
        n = float(moments[2])
        mean = float(moments[0]) / n
        sd = math.sqrt(max(float(moments[1]) / n - mean**2, 0.0))
        self._ratio_iter.append({"step": int(step), "update": int(batch["chunk"]), "mean": mean, "sd": sd,
                                 "n": round(n * _world())})
        if batch["last"]:
            it, st = int(batch["iteration"]), batch["stats"]
            # wall seconds of the iteration in this process (a resumed iteration counts from its resume)
            wall = time.perf_counter() - getattr(self, "_t_iter", time.perf_counter())
            self.ratio_log = [r for r in self.ratio_log if r["iteration"] != it] + [
                {"iteration": it, "window": self.algo.window(it, self.policy.steps), "steps": self._ratio_iter,
                 "seconds": {"iteration": wall, "rollout": st["rollout_s"], "eval": st["eval_s"],
                             "update": max(wall - st["rollout_s"] - st["eval_s"], 0.0)}}]
            self._ratio_iter = []
            self._write_curve()
        return torch.tensor(mean)

    def _write_curve(self) -> None:
        """curve.json (rank 0): the held-out curve and GRPO-Guard's per-step ratio log."""
        if _rank() == 0:
            write_json(self.out_dir / "curve.json", {"algo": dataclasses.asdict(self.algo), "curve": self.curve,
                                                     "ratio_steps": self.ratio_log})

    # -- held-out evaluation -------------------------------------------------------------------------------------
    def evaluate(self, iteration: int) -> dict[str, Any]:
        """The held-out reward of the current weights as the curve's point at ``iteration`` (rank 0 writes it).

        Every process samples the whole held-out set (the same forwards on every rank, as FSDP needs).
        """
        was_training = self.training
        self.policy.eval()
        with torch.no_grad():
            r = heldout_reward(self.policy, self.reward, self.heldout, self.eval_seed)
        self.policy.train(was_training)
        entry = {"iteration": iteration, "rollouts": iteration * self.schedule.images * self.algo.fresh,
                 "reward": r["reward"], **r["terms"], "train_reward": self.last_train_reward}
        self.curve = [c for c in self.curve if c["iteration"] != iteration] + [entry]
        self._write_curve()
        log.info("iteration %d (%d rollouts): held-out reward %.4f", iteration, entry["rollouts"], entry["reward"])
        return entry

    # -- the training state (in every checkpoint) ----------------------------------------------------------------
    def training_state(self) -> dict[str, Any]:
        pending = None
        if self._rollouts is not None:  # a checkpoint inside an iteration: its rollouts are needed to resume
            r = self._rollouts
            pending = {"iteration": r["iteration"], "first": r["first"].cpu(), "latents": r["latents"].cpu(),
                       "means": r["means"].cpu(), "stats": r["stats"],
                       "groups": [{**g, "adv": g["adv"].cpu(), "latents": g["latents"].cpu()} for g in r["groups"]]}
        return {"bank": self.bank.state_dict(), "curve": self.curve, "last_train_reward": self.last_train_reward,
                "pending": pending, "ratio_log": self.ratio_log, "ratio_pending": list(self._ratio_iter)}

    def load_training_state(self, state: dict[str, Any]) -> None:
        device = self.policy.grid.device
        self.bank.load_state_dict(state["bank"])
        self.curve, self.last_train_reward = list(state["curve"]), state["last_train_reward"]
        self.ratio_log = list(state.get("ratio_log", []))
        self._ratio_iter = list(state.get("ratio_pending", []))
        p = state["pending"]
        self._rollouts = None if p is None else {
            "iteration": int(p["iteration"]), "stats": dict(p["stats"]),
            **{k: p[k].to(device) for k in ("first", "latents", "means")},
            "groups": [{**g, "adv": g["adv"].to(device), "latents": g["latents"].to(device)} for g in p["groups"]]}


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _gather(obj: Any) -> list[Any]:
    """``obj`` of every process (rank order); ``[obj]`` in one process."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def trained_steps(algo: AlgoConfig, steps: int) -> int:
    """How many of the ``steps`` sampling steps an iteration trains (``algo.timestep_fraction``, or MixGRPO's
    window ``algo.sde_window``)."""
    if algo.sde_window is not None:
        return len(algo.window(0, steps))
    return steps if algo.timestep_fraction >= 1 else max(1, round(algo.timestep_fraction * steps))


class GRPORunner:
    """TAGRPO's post-training on the shared trainer (``core.trainer.Trainer``, see ``GRPOLearner``).

    The trainer brings precision (bf16 autocast), DDP / FSDP2 (``trainer.strategy``), gradient checkpointing,
    clipping, the lr schedule, checkpoints with resume after a kill (the bank and the curve included) and
    ``metrics.jsonl``. ``trainer.max_steps`` counts optimizer steps, ``algo.updates_per_iteration`` per iteration;
    the trainer's batch is this process's share of ``images_per_iteration`` conditioning images and it accumulates
    gradients over the trained sampling steps of one update (``trainer.batch_size`` / ``grad_accum`` / ``shuffle``
    are set here).
    """

    def __init__(self, policy, algo: AlgoConfig, trainer: TrainerConfig, reward, pool: ConditioningSet,
                 heldout: ConditioningSet, out_dir: Path, run_config: dict[str, Any] | None = None,
                 images_per_iteration: int = 2, eval_every: int = 5, eval_seed: int = 0):
        from core.distributed import launched_by_torchrun
        from core.trainer import Trainer

        world = int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else 1
        images = min(images_per_iteration, len(pool))
        updates = algo.updates_per_iteration
        if images % world:
            raise ConfigError(f"data.images_per_iteration={images} must be a multiple of the {world} processes "
                              "(each rolls out an equal share)")
        k = trained_steps(algo, policy.steps)
        if k % updates:
            raise ConfigError(f"algo.updates_per_iteration={updates} must divide the {k} trained sampling steps "
                              f"(model.sample_steps={policy.steps} x algo.timestep_fraction)")
        if trainer.max_steps % updates:
            raise ConfigError(f"trainer.max_steps={trainer.max_steps} (optimizer steps) must be a multiple of "
                              f"algo.updates_per_iteration={updates}")
        if trainer.grad_accum != 1:
            raise ConfigError("trainer.grad_accum: TAGRPO accumulates over the sampling steps of one update "
                              "(algo.updates_per_iteration); leave it at 1")
        self.policy, self.pool, self.algo, self.images, self.updates = policy, pool, algo, images, updates
        cfg = dataclasses.replace(trainer, batch_size=images // world, grad_accum=k // updates, shuffle=False,
                                  drop_last=True)
        self.schedule = IterationSchedule(pool, cfg.max_steps, k // updates, updates, images, cfg.seed)
        self.learner = GRPOLearner(policy, algo, reward, heldout, self.schedule, Path(out_dir), eval_every, eval_seed)
        self.trainer = Trainer(self.learner, self.schedule, cfg, out_dir, run_config)

    @property
    def iteration(self) -> int:
        return self.trainer.step // self.updates

    @property
    def rollouts(self) -> int:
        return self.iteration * self.images * self.algo.fresh

    @property
    def bank(self):
        return self.learner.bank

    @property
    def curve(self) -> list[dict[str, Any]]:
        return self.learner.curve

    def fit(self) -> dict[str, Any]:
        """Train to ``trainer.max_steps`` (resuming from the newest checkpoint), then evaluate the final weights."""
        result = self.trainer.fit()
        if not self.curve or self.curve[-1]["iteration"] != self.iteration:
            self.trainer.call_model("evaluate", self.iteration)
        return {"iteration": self.iteration, "rollouts": self.rollouts, "curve": self.curve, "step": result["step"],
                "metrics": result["metrics"], "seconds": result["seconds"]}

    def step(self) -> dict[str, float]:
        """One more iteration through the trainer (a checkpoint after it); its statistics.

        ``update_s`` is its time without the rollouts and the held-out evaluation (the updates and the checkpoint).
        """
        cfg = self.trainer.cfg
        if self.trainer.step + self.updates > self.schedule.steps:
            raise ConfigError(f"the runner was built for trainer.max_steps={self.schedule.steps}")
        cfg.max_steps = self.trainer.step + self.updates
        self.learner.history = []
        t0 = time.perf_counter()
        self.trainer.fit()
        cfg.resume = False  # the trainer's state is this process's from now on
        wall = time.perf_counter() - t0
        h = self.learner.history
        first = [r for r in h if "ratio_dev_first" in r]
        later = [r for r in h if "ratio_dev" in r]
        stats = {k: v for k, v in h[-1].items() if k not in ("ratio_dev_first", "ratio_dev", "loss", "clipped")}
        return {**stats, "loss": sum(r["loss"] for r in h) / len(h), "clipped": sum(r["clipped"] for r in h) / len(h),
                "ratio_dev_first": max((r["ratio_dev_first"] for r in first), default=0.0),
                "ratio_dev": max((r["ratio_dev"] for r in later), default=0.0),
                "update_s": wall - stats["rollout_s"] - stats["eval_s"]}


# ------------------------------------------------------------------------------------------------ tasks
def _configs(cfg) -> tuple[AlgoConfig, TAGRPOModelConfig, TAGRPODataConfig, TrainerConfig]:
    if cfg.algo is None:
        raise ConfigError("no algorithm: add algo=tagrpo | dancegrpo | tagrpo_indep | dancegrpo_same | tagrpo_reuse | "
                          "mixgrpo")
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

    ``weights`` goes through ``policy_folder``; the policy's frames must be ``data.size`` px (square: the simulator
    clips). A user's Wan folder without ``model.frame_size`` is built at ``data.size``.
    """
    from perception.i2v_rl.modeling_tagrpo import I2VPolicy, is_wan_folder

    if weights is None and model_cfg.frame_size is None and is_wan_folder(model_cfg.base_path):
        model_cfg = dataclasses.replace(model_cfg, frame_size=data.size)
    source = model_cfg.base_path if weights is None else policy_folder(weights)
    policy = (I2VPolicy(model_cfg) if weights is None else I2VPolicy.from_pretrained(source)).to(device)
    hw = policy.frame_hw
    if hw != (data.size, data.size):
        raise DataError(source, f"frames are {hw[0]} x {hw[1]} px, data.size is {data.size}")
    return policy


def train(cfg) -> dict[str, Any]:
    """Post-train the pretrained I2V model with ``cfg.algo`` (see the module docstring)."""
    from core.bootstrap import prepare_process
    from core.distributed import resolve_device
    from perception.i2v_rl.modeling_tagrpo import I2VPolicy
    from perception.i2v_rl.rewards import CompositeReward

    prepare_process()
    algo, model_cfg, data, tcfg = _configs(cfg)
    device = resolve_device(tcfg.device)
    out_dir = Path(cfg.out_dir)
    policy = build_policy(model_cfg, data, device)
    pool = conditioning_set(data, policy.video_frames, "train")
    heldout = conditioning_set(data, policy.video_frames, "test")
    run_config = to_container(cfg)
    save_resolved(run_config, out_dir)
    runner = GRPORunner(policy, algo, tcfg, CompositeReward(dict(data.rewards)), pool, heldout, out_dir,
                        run_config, data.images_per_iteration, data.eval_every, data.eval_seed)
    result = runner.fit()
    first, last = result["curve"][0], result["curve"][-1]
    weights = runner.trainer.full_state_dict()  # gathered to rank 0 under FSDP (a collective)
    out = {"iteration": result["iteration"], "rollouts": result["rollouts"], "reward_before": first["reward"],
           "reward_after": last["reward"], "policy": str(out_dir / POLICY_DIR)}
    if not runner.trainer.dist.is_main:
        return out
    if runner.trainer.strategy == "fsdp":  # the policy holds shards: export a plain copy with the full weights
        policy = I2VPolicy(policy.config)
        policy.load_state_dict(weights)
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
    return out


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
    heldout = conditioning_set(data, base.video_frames, "test")
    out: dict[str, Any] = {"policy": tuned_path, "base": model_cfg.base_path, "rewards": dict(data.rewards),
                           "images": len(heldout), "noises": eval_noises}
    for name, weights in (("base", None), ("tuned", tuned_path)):
        policy = base if weights is None else build_policy(model_cfg, data, device, weights)
        if policy.video_frames != base.video_frames:
            raise ConfigError(f"{tuned_path}: the policy generates {policy.video_frames} frames, the base "
                              f"{base.video_frames} (evaluate both on the same clips: set model.frames)")
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
