"""``embodied sim ...``: list environments, roll out policies, make perception datasets.

``embodied/cli.py`` calls ``configure_parser`` on the ``sim`` sub-parser; every sub-command sets ``func`` to a
function ``(args) -> int``. Importing this module is light: simulators load inside the functions.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from core.errors import ConfigError

DATASET_KINDS = ("normals", "panoramas", "videos")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add ``list``, ``rollout``, ``make-dataset`` and ``export-lerobot`` sub-commands to the ``sim`` parser."""
    sub = parser.add_subparsers(dest="sim_command", metavar="COMMAND", required=True)

    p = sub.add_parser("list", help="registered environments with family, embodiment, task, action dim")
    p.add_argument("--family", default=None, help="only this family (manipulation, libero, driving)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "rollout",
        help="run a policy for N episodes; writes HDF5, mp4s, summary.json, config.json",
        description="Roll out a policy over gymnasium vector envs and record the episodes.",
    )
    p.add_argument("env_id", metavar="ENV_ID", help="e.g. embodied/Lift-Panda-v0 (see `embodied sim list`)")
    p.add_argument("--policy", default="scripted",
                   help="expert (the env's task-solving expert; LIBERO: its solver) | scripted | random | idm | "
                        "constant (driving) | a registered policy (e.g. automot) | CHECKPOINT | ws://HOST:PORT (a "
                        "policy served over openpi's websocket protocol, e.g. by `embodied serve`); the same names "
                        "as `libero eval` and `drive eval` (sim.policies)")
    from sim.policies import add_policy_arg
    from sim.remote import add_remote_arguments

    add_policy_arg(p)
    add_remote_arguments(p, int, "the env's")
    p.add_argument("--episodes", type=int, default=10, help="number of episodes")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--num-envs", type=int, default=1, help="sub-environments stepped together")
    p.add_argument("--async", dest="vectorization", action="store_const", const="async", default="sync",
                   help="one worker process per sub-environment (AsyncVectorEnv)")
    p.add_argument("--seed", type=int, default=0, help="episode i uses seed S + i")
    p.add_argument("--noise", type=float, default=0.05, help="action-noise std of the scripted expert")
    p.add_argument("--image-size", type=int, default=None, help="camera image side in pixels (0: none)")
    p.add_argument("--camera", default=None,
                   help="manipulation suite camera: a robosuite camera name or 'workspace' (env default: agentview)")
    p.add_argument("--no-video", action="store_true", help="skip the mp4 files")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder (on success)")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("make-dataset", help="render a perception dataset (sim.render.<kind>)")
    p.add_argument("kind", choices=DATASET_KINDS)
    p.add_argument("--n", type=int, required=True, help="number of samples")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=None, help="image side in pixels (kind's default if unset)")
    p.add_argument("--frames", type=int, default=None, help="videos only: frames per clip (default 16)")
    p.add_argument("--source", default=None,
                   help="what the views are rendered from: normals real|procedural (default procedural), "
                        "panoramas mujoco|analytic (default analytic); recorded in meta.json")
    p.add_argument("--framing", default=None, choices=("workspace", "closeup"),
                   help="normals --source real only: a workspace camera (default) or glass close up")
    p.add_argument("--spp", type=int, default=None, help="samples per pixel (kind's default if unset)")
    p.add_argument("--workers", type=int, default=None,
                   help="render views in this many processes (normals, panoramas; same files as 1)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder (on success)")
    p.set_defaults(func=cmd_make_dataset)

    p = sub.add_parser(
        "export-lerobot",
        help="convert recorded HDF5 trajectories into a LeRobot v3 dataset folder (Parquet + MP4)",
        description="Convert HDF5 trajectory files (manipulation suite, LIBERO, driving, robomimic) into one "
                    "LeRobot v3 dataset folder that lerobot's LeRobotDataset and `embodied train` read.",
    )
    p.add_argument("inputs", nargs="+", type=Path, metavar="IN.hdf5",
                   help="trajectory files or folders of them (read-only): a folder stands for every .hdf5 file "
                        "under it, sub-folders included (a `sim rollout`, `libero record` or `drive eval` output)")
    p.add_argument("--out", type=Path, required=True, help="output dataset folder")
    p.add_argument("--fps", type=int, default=20, help="recording frame rate (timestamps, video rate)")
    p.add_argument("--state-keys", default=None,
                   help="comma-separated low-dim obs keys concatenated into observation.state "
                        "(default: proprio, else every (T,) / (T, D) low-dim key)")
    p.add_argument("--drop-keys", default=None,
                   help="comma-separated obs keys left out of the dataset (meta/info.json `obs_keys` lists the "
                        "kept and dropped ones); multi-axis keys such as a driving recording's agents (T, 8, 8) "
                        "are exported as fixed-shape features otherwise")
    p.add_argument("--crf", type=int, default=None, help="H.264 constant rate factor (default 18; 0 with "
                                                          "--lossless)")
    p.add_argument("--lossless", action="store_true", help="lossless RGB H.264 (libx264rgb, rgb24, crf 0)")
    p.add_argument("--episodes-per-file", type=int, default=None,
                   help="start new data / video files every N episodes (default: one file per kind)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder (on success)")
    p.set_defaults(func=cmd_export_lerobot)


def cmd_list(args: argparse.Namespace) -> int:
    """Print a table of registered ``embodied/`` env ids."""
    rows = list_envs(args.family)
    header = ("ENV ID", "FAMILY", "EMBODIMENT", "TASK", "ACT DIM")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def list_envs(family: str | None = None) -> list[tuple[str, str, str, str, str]]:
    """Rows ``(id, family, embodiment, task, action dim)``; manipulation rows come from its light tables.

    Raises:
        ConfigError: ``family`` is not one of ``sim.FAMILIES``.
    """
    import gymnasium as gym

    import sim

    if family is not None and family not in sim.FAMILIES:
        raise ConfigError(f"--family: unknown {family!r}; choose from {', '.join(sim.FAMILIES)}")
    rows: list[tuple[str, str, str, str, str]] = []
    for fam in sim.FAMILIES if family is None else (family,):
        reg = importlib.import_module(f"sim.{fam}.registration")
        reg.register()
        prefix = f"sim.{fam}."
        ids = sorted(
            k for k in gym.registry if k.startswith(f"{sim.NAMESPACE}/") and gym_entry_point(k).startswith(prefix)
        )
        for env_id in ids:
            rows.append((env_id, fam, *_describe(fam, env_id)))
    return rows


def gym_entry_point(env_id: str) -> str:
    """The string entry point of a registered env (``""`` for callables)."""
    import gymnasium as gym

    ep = gym.registry[env_id].entry_point
    return ep if isinstance(ep, str) else getattr(ep, "__module__", "")


def _describe(family: str, env_id: str) -> tuple[str, str, str]:
    import gymnasium as gym

    kwargs = gym.registry[env_id].kwargs or {}
    if family == "manipulation":
        from sim.manipulation.registration import EMBODIMENTS

        emb = EMBODIMENTS[kwargs["embodiment"]]
        return emb.name, kwargs["task"], str(emb.action_dim)
    if family == "libero":  # from the task table and the env module's constants: no env is built
        from sim.libero.env import ACTION_DIM, EMBODIMENT
        from sim.libero.suites import get_task

        return EMBODIMENT, get_task(kwargs["suite"], kwargs["task_index"]).name, str(ACTION_DIM)
    if family == "driving":
        from sim.driving.env import ACTION_DIM, EMBODIMENT

        return EMBODIMENT, kwargs["scenario"], str(ACTION_DIM)
    raise ConfigError(f"sim list: no description for family {family!r}")


def cmd_rollout(args: argparse.Namespace) -> int:
    """Roll out and record; prints the success-rate summary."""
    from core.bootstrap import prepare_process
    from sim.policies import STATE_POLICIES, parse_policy_args, resolve_policy
    from sim.recorder import record_rollout
    from sim.rollout import RolloutConfig

    if args.replan_steps is not None and args.replan_steps < 1:
        raise ConfigError(f"--replan-steps: must be >= 1, got {args.replan_steps}")
    policy_args = parse_policy_args(args.policy_arg)
    # an unknown name, a missing checkpoint or a wrong --policy-arg: one line now, before any env or model loads
    resolve_policy(args.policy, policy_args, api_key_file=args.api_key_file, replan_steps=args.replan_steps)
    # a learned policy runs a model in the process that renders: torch + triton first (core.bootstrap)
    prepare_process(learning_stack=args.policy not in STATE_POLICIES)
    env_kwargs = {}
    if args.image_size is not None:
        if args.image_size < 0:
            raise ConfigError(f"--image-size: must be >= 0, got {args.image_size}")
        env_kwargs["image_size"] = args.image_size
    if args.camera is not None:
        env_kwargs["camera"] = args.camera
    if args.episodes < 1:
        raise ConfigError(f"--episodes: must be >= 1, got {args.episodes}")
    if args.num_envs < 1:
        raise ConfigError(f"--num-envs: must be >= 1, got {args.num_envs}")
    from sim.rollout import check_env_id, check_env_kwargs

    check_env_id(args.env_id)
    check_env_kwargs(args.env_id, env_kwargs)  # before anything builds the env (e.g. --camera for driving)
    config = RolloutConfig(
        env_id=args.env_id,
        episodes=args.episodes,
        num_envs=args.num_envs,
        seed=args.seed,
        policy=args.policy,
        policy_args=policy_args,
        noise=args.noise,
        vectorization=args.vectorization,
        env_kwargs=env_kwargs,
        api_key_file=args.api_key_file,
        replan_steps=args.replan_steps,
        realtime=args.realtime,
        progress=True,  # episodes and steps on stderr (core.logging.progress: redrawn sparsely in a log)
    )
    from core.outputs import claim_output

    with claim_output(args.out, command="sim rollout", overwrite=args.overwrite) as out:
        result = record_rollout(config, out, video=not args.no_video)
    s = result.summary
    print(
        f"{args.env_id}: success {s['success_rate']:.2f} over {s['episodes']} episodes, "
        f"mean return {s['mean_return']:.3f}, mean length {s['mean_length']:.1f} steps, failures {s['failures']} "
        f"-> {args.out}"
    )
    return 0


def cmd_make_dataset(args: argparse.Namespace) -> int:
    """Dispatch to ``sim.render.<kind>.make_dataset(out, n, seed, size, ...)`` (``--source`` etc. when given)."""
    if args.n < 1:
        raise ConfigError(f"--n: must be >= 1, got {args.n}")
    extra = {}
    if args.frames is not None:
        if args.kind != "videos":
            raise ConfigError(f"--frames: only for make-dataset videos, not {args.kind}")
        if args.frames < 1:
            raise ConfigError(f"--frames: must be >= 1, got {args.frames}")
        extra["frames"] = args.frames
    for flag, kinds in (("source", ("normals", "panoramas")), ("spp", ("normals", "panoramas")),
                        ("workers", ("normals", "panoramas")), ("framing", ("normals",))):
        value = getattr(args, flag)
        if value is None:
            continue
        if args.kind not in kinds:
            raise ConfigError(f"--{flag}: only for make-dataset {' / '.join(kinds)}, not {args.kind}")
        if flag not in ("source", "framing") and value < 1:
            raise ConfigError(f"--{flag}: must be >= 1, got {value}")
        extra[flag] = value
    try:
        module = importlib.import_module(f"sim.render.{args.kind}")
    except ModuleNotFoundError as e:
        if e.name == f"sim.render.{args.kind}":
            raise ConfigError(f"make-dataset: no renderer for {args.kind!r} yet (sim/render/{args.kind}.py)") from None
        raise
    from core.outputs import claim_output
    from sim.render.dataset_io import view_progress

    with (claim_output(args.out, command=f"sim make-dataset {args.kind}", overwrite=args.overwrite) as out,
          view_progress(args.n, f"make-dataset {args.kind}")):
        module.make_dataset(out, args.n, seed=args.seed, size=args.size, **extra)
    print(f"{args.kind}: {args.n} samples{' from ' + args.source if args.source else ''} -> {args.out}")
    return 0


def cmd_export_lerobot(args: argparse.Namespace) -> int:
    """Export HDF5 trajectories to a LeRobot v3 folder (``core.data.lerobot.export_lerobot``)."""
    from core.data.hdf5 import trajectory_files
    from core.data.lerobot import VideoOptions, check_not_input, export_lerobot
    from core.outputs import claim_output

    if args.fps < 1:
        raise ConfigError(f"--fps: must be >= 1, got {args.fps}")
    if args.episodes_per_file is not None and args.episodes_per_file < 1:
        raise ConfigError(f"--episodes-per-file: must be >= 1, got {args.episodes_per_file}")
    if args.crf is not None and not 0 <= args.crf <= 51:
        raise ConfigError(f"--crf: must be in 0..51, got {args.crf}")
    video = VideoOptions("libx264rgb", "rgb24", 0) if args.lossless else VideoOptions()
    if args.crf is not None:
        video = VideoOptions(video.vcodec, video.pix_fmt, args.crf, video.gop)
    state_keys = [k for k in args.state_keys.split(",") if k] if args.state_keys else None
    drop_keys = [k for k in args.drop_keys.split(",") if k] if args.drop_keys else []
    check_not_input(args.inputs, args.out)
    files = []
    for path in args.inputs:
        found = trajectory_files(path)
        if path.is_dir():
            print(f"{path}: {len(found)} .hdf5 file(s) found (sub-folders included)")
        files.extend(found)
    with claim_output(args.out, command="sim export-lerobot", overwrite=args.overwrite) as out:
        s = export_lerobot(files, out, fps=args.fps, state_keys=state_keys, drop_keys=drop_keys, video=video,
                           episodes_per_file=args.episodes_per_file, in_place=True)
    print(f"LeRobot v3: {s['episodes']} episodes, {s['frames']} frames at {s['fps']} fps, {len(s['tasks'])} task(s), "
          f"video {video.vcodec}/{video.pix_fmt} crf {video.crf}"
          f"{', obs keys left out: ' + ','.join(drop_keys) if drop_keys else ''} -> {args.out}")
    return 0
