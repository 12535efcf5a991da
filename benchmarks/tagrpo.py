"""TAGRPO cost: rollouts, the update step, and what the memory bank saves.

Policy: the shipped Flex-Forcing model (``assets/checkpoints/flexforcing``: 32 px, 8 frames, 8 sampling steps) as
``perception.i2v_rl.modeling_tagrpo.I2VPolicy``; conditioning images: scripted clips (a square moving one pixel per
frame), reward ``psnr`` against them. Timed with the compared functions interleaved round-robin in one process (shared,
noisy cores), best of N, CUDA synchronised:

* ``rollout``: one group batch (``--images`` x G = 8) of SDE rollouts with the trajectory recorded
  (``I2VPolicy.rollout``: every latent, mean and log-probability) vs ``ode``: the plain deterministic sampler of
  the same batch (``I2VPolicy.sample``). Limit: the same number of DiT forwards, so ``rollout_vs_ode_time`` has
  goal <= 1.15 (what remains is the SDE arithmetic and the stored trajectory).
* ``update``: one iteration's optimizer work on a recorded batch (every sampling step: forward + backward through
  the DiT, clipped surrogate, AdamW step), DanceGRPO's loss vs TAGRPO's (``GRPORunner.step``'s update phase,
  measured inside a full ``step``). TAGRPO's contrastive term is one (K, D) x (D, J) product per group and step:
  ``update_tagrpo_vs_dancegrpo_time`` goal <= 1.1.
* ``iteration``: a whole ``GRPORunner.step`` (rollouts, decode, reward, update, bank) of TAGRPO reusing half of
  every group from the bank (``fresh_per_group = G / 2``) vs TAGRPO sampling every rollout:
  ``iteration_reuse_vs_fresh_time`` (the rollout cost the bank saves per update, lower is better).
* ``mixgrpo``: a whole iteration and its update phase of the MixGRPO arm (``algo=mixgrpo``: the SDE only in a
  2-step window, the ODE elsewhere, only the window trained) vs DanceGRPO's: ``update_mixgrpo_vs_dancegrpo_time``
  (arithmetic floor 2 / 8 trained steps = 0.25) and ``iteration_mixgrpo_vs_dancegrpo_time`` (the rollouts still
  pass every step, so the saving is the update's share of an iteration; MixGRPO reports about half of DanceGRPO's
  training time at its scale). Plain figures.
* With ``--experiment DIR`` (a ``python -m perception.i2v_rl.experiments`` output with ``tagrpo`` and
  ``tagrpo_reuse`` runs), also ``rollouts_to_reward_reuse_vs_fresh``: rollouts each arm spent until its held-out
  reward (seed mean) first reached the lower of the two arms' best rewards — the rollout cost the bank saves at
  equal reward (recorded curves, not timed here).

Rates in the figures: ``rollouts_per_s`` (SDE rollouts incl. decode + reward, per second), ``update_s``.
``--quick``: 1 image, 2 repeats. JSON: ``--out`` (default ``benchmarks/results/tagrpo.json``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import (
    RESULTS_DIR,
    Goal,
    default_device,
    interleaved,
    print_table,
    repeated_main,
    write_result,
)

G = 8

# Every reported ratio: held to a goal (its target and where the number comes from) or a plain figure.
GOALS = {
    "rollout_vs_ode_time": Goal("<= 1.15", (
        "limit: the same DiT passes as the plain ODE sampler; the README's Measured table (1.005)")),
    "update_tagrpo_vs_dancegrpo_time": Goal("<= 1.1", (
        "anchor: the contrastive terms cost one (K, D) x (D, J) product; the README's Measured table "
        "(1.05)")),
}
FIGURES_ONLY = ("iteration_reuse_vs_fresh_time", "rollouts_to_reward_reuse_vs_fresh",
                "update_mixgrpo_vs_dancegrpo_time", "iteration_mixgrpo_vs_dancegrpo_time")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 image per iteration, 2 repeats (smoke run)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu) | cpu | cuda[:i]")
    p.add_argument("--images", type=int, default=None, help="conditioning images per iteration (default 2)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; --quick 2)")
    p.add_argument("--experiment", type=Path, default=None, help="experiment folder for the equal-reward ratio")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "tagrpo.json", help="result JSON (<name>.json)")
    return p.parse_args(argv)


def scripted(n: int, frames: int, size: int):
    from perception.i2v_rl.task import ConditioningSet

    g = np.random.default_rng(0)
    video = np.full((n, frames, 3, size, size), 40, np.uint8)
    for i in range(n):
        r, c = g.integers(2, size - 12, 2)
        for f in range(frames):
            video[i, f, :, r:r + 6, c + f:c + f + 6] = g.integers(120, 255, 3, dtype=np.uint8)[:, None, None]
    v = torch.from_numpy(video)
    return ConditioningSet(v[:, 0].contiguous(), v)


def runner(arm: str, images: int, device: str, out: Path):
    from core.config import TrainerConfig
    from core.resources import asset
    from perception.i2v_rl.configuration_tagrpo import AlgoConfig, TAGRPOModelConfig
    from perception.i2v_rl.modeling_tagrpo import I2VPolicy
    from perception.i2v_rl.rewards import CompositeReward
    from perception.i2v_rl.task import GRPORunner

    algo = {"dancegrpo": AlgoConfig(name=arm, loss="grpo", noise="independent", bank_size=0),
            "tagrpo": AlgoConfig(name=arm),
            "tagrpo_reuse": AlgoConfig(name=arm, fresh_per_group=G // 2),
            "mixgrpo": AlgoConfig(name=arm, loss="grpo", noise="same", bank_size=0, sde_window=2,
                                  window_shift_every=10)}[arm]
    policy = I2VPolicy(TAGRPOModelConfig(base_path=str(asset("checkpoints", "flexforcing")))).to(device)
    pool = scripted(images, policy.video_frames, policy.frame_hw[0])
    tcfg = TrainerConfig(seed=0, device=device, tensorboard=False, grad_clip=1.0)
    tcfg.optim.lr = 1e-5
    return GRPORunner(policy, algo, tcfg, CompositeReward({"psnr": 1.0}), pool, pool, out / arm,
                      images_per_iteration=images)


def rollouts_to_reward(experiment: Path) -> dict[str, float] | None:
    from core.io import read_json

    f = experiment / "summary.json"
    if not f.is_file():
        return None
    rows = {r["arm"]: r for r in read_json(f)}
    if not {"tagrpo", "tagrpo_reuse"} <= set(rows):
        return None
    level = min(max(p["mean"] for p in rows[a]["curve"][1:]) for a in ("tagrpo", "tagrpo_reuse"))
    spent = {a: next(p["rollouts"] for p in rows[a]["curve"][1:] if p["mean"] >= level)
             for a in ("tagrpo", "tagrpo_reuse")}
    return {"level": level, **spent, "ratio": spent["tagrpo_reuse"] / spent["tagrpo"]}


def main(argv: Sequence[str] | None = None) -> None:
    import tempfile

    args = parse(argv)
    device = default_device(None if args.device == "auto" else args.device)
    images = args.images or (1 if args.quick else 2)
    repeats = args.repeats or (2 if args.quick else 5)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runners = {a: runner(a, images, device, Path(tmp)) for a in ("dancegrpo", "tagrpo", "tagrpo_reuse", "mixgrpo")}
        for r in runners.values():  # the bank holds a group of every image before reuse is timed
            r.step()
        pol = runners["tagrpo"].policy
        imgs = runners["tagrpo"].pool.images.to(device).repeat_interleave(G, 0)
        first = pol.encode_first(imgs)
        noise = pol.initial_noise(len(imgs), torch.Generator().manual_seed(0))
        gen = torch.Generator().manual_seed(1)
        sampling = interleaved({"rollout": lambda: pol.rollout(first, noise, 0.3, gen),
                                "ode": lambda: pol.sample(first, noise)}, warmup=1, repeats=repeats, device=device)
        steps: dict[str, dict[str, list[float]]] = {a: {"update_s": [], "rollout_s": [], "total": []} for a in runners}
        for _ in range(repeats):
            for a, r in runners.items():
                t0 = time.perf_counter()
                st = r.step()
                steps[a]["total"].append(time.perf_counter() - t0)
                steps[a]["update_s"].append(st["update_s"])
                steps[a]["rollout_s"].append(st["rollout_s"])
    best = {a: {k: min(v) for k, v in s.items()} for a, s in steps.items()}
    ratios = {
        "rollout_vs_ode_time": sampling["rollout"].best / sampling["ode"].best,
        "update_tagrpo_vs_dancegrpo_time": best["tagrpo"]["update_s"] / best["dancegrpo"]["update_s"],
        "iteration_reuse_vs_fresh_time": best["tagrpo_reuse"]["total"] / best["tagrpo"]["total"],
        "update_mixgrpo_vs_dancegrpo_time": best["mixgrpo"]["update_s"] / best["dancegrpo"]["update_s"],
        "iteration_mixgrpo_vs_dancegrpo_time": best["mixgrpo"]["total"] / best["dancegrpo"]["total"],
    }
    equal = rollouts_to_reward(args.experiment) if args.experiment else None
    if equal is not None:
        ratios["rollouts_to_reward_reuse_vs_fresh"] = equal["ratio"]
    rows = [{"what": "sde rollout (trajectory recorded)", "seconds": sampling["rollout"].best},
            {"what": "ode sample", "seconds": sampling["ode"].best}]
    rows += [{"what": f"{a} iteration: {k}", "seconds": v} for a, b in best.items() for k, v in b.items()]
    print_table(rows)
    figures = {
        "rollouts_per_s": len(imgs) / best["tagrpo"]["rollout_s"],
        "sde_rollout_s": sampling["rollout"].best, "ode_sample_s": sampling["ode"].best,
        "iteration_s": best, "equal_reward": equal, "threads": torch.get_num_threads(),
        "wall_s": round(time.perf_counter() - t_start, 1),
        "timing": "best of N; rollout / ode interleaved round-robin; iterations of the four arms round-robin",
    }
    dev_name = f"{device} ({torch.cuda.get_device_name()})" if device.startswith("cuda") else device
    config = {"images_per_iteration": images, "group_size": G, "repeats": repeats, "sample_steps": pol.steps,
              "frames": pol.video_frames, "frame_size": pol.frame_hw[0], "eta": 0.3, "dtype": "float32"}
    write_result(args.out.stem, dev_name, args.quick, ratios, figures, config, results_dir=args.out.parent,
                 goals=GOALS, figures_only=FIGURES_ONLY)


if __name__ == "__main__":
    repeated_main(main)
