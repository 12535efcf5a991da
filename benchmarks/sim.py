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
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402

from benchmarks.common import parse_args, print_table, write_result  # noqa: E402

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
        },
        config={"env_id": ENV_ID, "steps": steps, "vector_counts": list(counts), "cpu_count": os.cpu_count()},
    )


if __name__ == "__main__":
    main()
