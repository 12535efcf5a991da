"""Manipulation-suite speed: env overhead over raw MuJoCo, rendering, vector-env scaling, expert success.

Ratios (measured in one run; absolute times on these shared machines vary 1x-20x between runs):
    env_step_vs_mj_step       time of one env step (state only, 20 Hz control = 25 physics substeps at
                              robosuite's 2 ms timestep) / time of the same number of raw ``mujoco.mj_step``
                              calls on the same compiled model. Lower is better; it is the cost of
                              robosuite's controller + observables + our wrapper per step.
    render_vs_state_step      time of one env step with a 128 px image / without. Lower is better.
    vector_speedup_<k>        env steps/s with ``k`` sub-envs (async workers) / with one sync env.
                              Higher is better; bounded by the number of free cores (2 here).
    lift_expert_success       scripted-expert success rate on Lift-Panda (higher is better; floor 0.7).
    policy_batched_4_vs_1     wall time per env step of a ``sim.rollout`` with a learned policy (BC, default
                              config, randomly initialised, 64 px images, sync vectorisation) over 4 sub-envs
                              / over 1, timed from the first to the last ``act_batch`` call (env creation and
                              first resets left out). The policy acts for the 4 envs with one batched forward
                              per step (``BCPolicy.act_batch``). Lower is better; < 1 means batching saves
                              policy time per env step. Bounded below by the env's share of a step: MuJoCo
                              physics + llvmpipe rendering dominate on CPU, so expect 0.9 - 1 here.
"""

from __future__ import annotations

import functools
import os
import statistics
import time

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402

from benchmarks.common import default_device, parse_args, print_table, write_result  # noqa: E402

ENV_ID = "embodied/Lift-Panda-v0"


def env_steps_per_s(env_id: str, image_size: int, steps: int) -> float:
    """Control steps per second of a registered manipulation env (random small actions, no episode ends)."""
    import sim

    sim.register_envs()
    env = gym.make(env_id, image_size=image_size, terminate_on_success=False, horizon=10**6)
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        env.step(env.action_space.sample())  # warm-up (controller numba JIT, renderer creation)
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step(env.action_space.sample() * 0.2)
        return steps / (time.perf_counter() - t0)
    finally:
        env.close()


def _mj_substeps_per_s(env_id: str, substeps: int) -> tuple[float, int]:
    env = gym.make(env_id, image_size=0)
    try:
        env.reset(seed=0)
        inner = env.unwrapped
        model, data = inner.sim_model, inner.sim_data
        per_control = int(round(1.0 / (20 * model.opt.timestep)))
        t0 = time.perf_counter()
        for _ in range(substeps):
            mujoco.mj_step(model, data)
        return substeps / (time.perf_counter() - t0), per_control
    finally:
        env.close()


def _vector_steps_per_s(env_id: str, num_envs: int, steps: int, vectorization: str) -> float:
    from sim.rollout import make_vector_env

    envs = make_vector_env(env_id, num_envs, vectorization, {"image_size": 0})
    try:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        envs.step(envs.action_space.sample() * 0.2)
        t0 = time.perf_counter()
        for _ in range(steps):
            envs.step(envs.action_space.sample() * 0.2)
        return steps * num_envs / (time.perf_counter() - t0)
    finally:
        envs.close()


def _timed_bc_policy(stamps: list[float], env: gym.Env, device: str = "cpu"):
    """A randomly initialised ``BCPolicy`` (default ``BCConfig``) sized for ``env``'s action / proprio / image
    dims, appending ``time.perf_counter()`` to ``stamps`` at the start of every ``act_batch`` call."""
    import torch

    from worldmodels.bc.configuration_bc import BCConfig
    from worldmodels.bc.modeling_bc import BCPolicy, BCPolicyModel

    class TimedBCPolicy(BCPolicy):
        def act_batch(self, obs, infos=None):
            stamps.append(time.perf_counter())
            return super().act_batch(obs, infos)

    torch.manual_seed(0)
    space = env.observation_space
    cfg = BCConfig(action_dim=env.action_space.shape[0], proprio_dim=space["proprio"].shape[0],
                   image_size=space["image"].shape[0])
    return TimedBCPolicy(BCPolicyModel(cfg), env.action_space.low, env.action_space.high, device=device)


def policy_rollout_step_s(num_envs: int, steps: int, image_size: int, device: str) -> float:
    """Wall seconds per env step of a ``sim.rollout`` with a BC policy on ``num_envs`` sync sub-envs.

    ``num_envs`` episodes of ``steps`` steps run side by side (no resets mid-way); the clock runs from the
    first ``act_batch`` call to the last, so it covers ``steps - 1`` whole vector steps (act + env step +
    bookkeeping) and leaves out env creation and first resets, whose cost grows with ``num_envs``.
    """
    from sim.rollout import RolloutConfig, rollout

    stamps: list[float] = []
    rc = RolloutConfig(ENV_ID, episodes=num_envs, num_envs=num_envs, seed=0, env_kwargs={"image_size": image_size},
                       max_episode_steps=steps, progress=False)
    rollout(rc, policy=functools.partial(_timed_bc_policy, stamps, device=device))
    return (stamps[-1] - stamps[0]) / ((len(stamps) - 1) * num_envs)


def main() -> None:
    args = parse_args(__doc__)
    import sim
    from sim.rollout import RolloutConfig, rollout

    sim.register_envs()
    steps = 60 if args.quick else 300
    state_sps = env_steps_per_s(ENV_ID, 0, steps)
    render_sps = env_steps_per_s(ENV_ID, 128, steps // 2)
    raw_sps, per_control = _mj_substeps_per_s(ENV_ID, steps * 25)
    raw_control_sps = raw_sps / per_control

    rows = [{"setting": "sync x1 (state)", "steps_per_s": state_sps}]
    ratios = {
        "env_step_vs_mj_step": raw_control_sps / state_sps,
        "render_vs_state_step": state_sps / render_sps,
    }
    counts = (2,) if args.quick else (2, 4)
    vec = {}
    for k in counts:
        vec[k] = _vector_steps_per_s(ENV_ID, k, steps // 2, "async")
        ratios[f"vector_speedup_{k}"] = vec[k] / state_sps
        rows.append({"setting": f"async x{k} (state)", "steps_per_s": vec[k]})
    rows.append({"setting": "sync x1 (128 px image)", "steps_per_s": render_sps})
    rows.append({"setting": f"raw mj_step x{per_control} (one control step)", "steps_per_s": raw_control_sps})

    n_eps = 5 if args.quick else 20
    res = rollout(RolloutConfig(ENV_ID, episodes=n_eps, env_kwargs={"image_size": 0}, progress=False))
    ratios["lift_expert_success"] = res.summary["success_rate"]

    device = default_device(args.device)
    pol_steps, pol_repeats, pol_px = (8, 3, 64) if args.quick else (48, 5, 64)
    policy_rollout_step_s(1, 3, pol_px, device)  # warm-up: torch, renderer
    per_step: dict[int, list[float]] = {1: [], 4: []}
    for _ in range(pol_repeats):  # interleaved, so drift on a shared machine hits both alike
        for k in per_step:
            per_step[k].append(policy_rollout_step_s(k, pol_steps, pol_px, device))
    pol = {k: statistics.median(v) for k, v in per_step.items()}
    ratios["policy_batched_4_vs_1"] = pol[4] / pol[1]
    for k, v in pol.items():
        rows.append({"setting": f"sync x{k} + BC policy ({pol_px} px, batched)", "steps_per_s": 1.0 / v})
    print_table(rows)
    write_result(
        "sim",
        device="cpu (MuJoCo, EGL llvmpipe rendering)",
        quick=args.quick,
        ratios=ratios,
        figures={
            "env_steps_per_s_state": state_sps,
            "env_steps_per_s_128px": render_sps,
            "render_frames_per_s_128px": render_sps,
            "raw_mj_substeps_per_s": raw_sps,
            "physics_substeps_per_control_step": per_control,
            "vector_steps_per_s": {str(k): v for k, v in vec.items()},
            "expert_episodes": n_eps,
            "expert_mean_length": res.summary["mean_length"],
            "bc_policy_rollout_s_per_env_step": {str(k): v for k, v in pol.items()},
        },
        config={"env_id": ENV_ID, "steps": steps, "vector_counts": list(counts), "cpu_count": os.cpu_count(),
                "policy_rollout": {"steps": pol_steps, "repeats": pol_repeats, "image_size": pol_px,
                                   "num_envs": list(per_step), "device": device}},
    )


if __name__ == "__main__":
    main()
