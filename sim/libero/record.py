"""Demonstrations offline: successful expert episodes per LIBERO task, in LIBERO's own demo layout.

LIBERO's human demonstrations are a download that cannot happen here, so this module makes the same
files from a policy that solves the tasks (the privileged expert, ``sim.libero.solver``): for each task,
``<out>/<suite>/<task name>_demo.hdf5``. That is LIBERO's dataset tree, and the layout its
``scripts/create_dataset.py`` writes (see ``sim.libero.demos``). A user's downloaded LIBERO demos and
these files go through the same loader (``core.data.trajectories``) and the same training commands.

How one task is recorded:

1. **Blind pass** (``images=False``, about 20x faster on a CPU). Attempt ``k`` resets the env with
   ``seed + k`` to a placement that LIBERO's own samplers draw (``init_state_id="sampled"``). This is the
   distribution the 50 fixed evaluation states come from, but none of them, so an evaluation on those
   states stays held out. The pass sends ``settle_steps`` no-op actions, then runs the policy until
   LIBERO's goal check succeeds or the suite's step limit is reached. It keeps the actions of the
   successful attempts.
2. **Replay with cameras.** Each successful attempt is replayed on an env that renders (``image_size``,
   agent view and wrist). It gets the same seed, the same settle steps and the same actions, and MuJoCo
   is deterministic. Every frame is recorded, and the replay must end in success again; one that does
   not (the two envs diverged: seen on libero_spatial/4 and /9, whose sampled placements involve the
   wooden cabinet) is dropped and counted as ``replay differs``, and the blind attempts go on.

Frames are stored as LIBERO stores them, the raw OpenGL-order render (``demos.libero_obs_from_env`` undoes the env's
``rot180``), with the ``data`` attribute ``image_convention = "rot180"``: the convention the loader returns them in,
which is what ``LiberoEnv`` gives a policy in closed loop.

Rendering therefore costs only what is kept. Unlike LIBERO's regenerated files, ``obs[t]`` here is the
observation *before* ``actions[t]``, consistent with ``states[t]``. LIBERO pairs each action with the
observation after it. The settle steps are not recorded, which plays the role of LIBERO skipping its
first 5 steps. ``rewards`` and ``dones`` are 1 on the last step only, as in LIBERO's files.

With ``perturb`` (``--perturb camera=2,...``), attempt ``k`` is drawn a LIBERO-Plus perturbation from its seed,
as ``libero eval --perturb`` draws an episode's (``sim.libero.perturb.start``, redraws included). The blind pass
applies it, so the expert solves the perturbed scene (robot_init, layout); the replay applies the same draw, so the
frames are what a policy would see (camera, light, texture, pixel noise). The demo's ``perturbation`` attribute
holds the draw and ``language_instruction`` a reworded instruction.

A task whose file exists with the same setting is skipped, so a killed recording resumes at its next
task. Each file is written atomically.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigError
from core.logging import get_logger
from sim.libero.suites import MAX_EPISODE_STEPS, LiberoTask

log = get_logger("embodied.libero")

COMMAND = "libero record"
NOOP_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0], dtype=np.float32)  # hold still, gripper open


@dataclass(frozen=True)
class RecordSetting:
    """What a demo file was recorded with, stored in it (``data`` attr ``embodied_record``) to resume."""

    policy: str
    image_size: int
    wrist_image: bool
    settle_steps: int
    max_steps: int
    seed: int
    init_states: str | None = None  # fixed init states the attempts start from ("10-49"); None: sampled
    perturb: str | None = None  # LIBERO-Plus axes the attempts are perturbed along ("camera=2,...; one"); None: clean


def _id_text(ids: Sequence[int] | None) -> str | None:
    return ",".join(map(str, ids)) if ids else None


def demo_path(out: str | Path, task: LiberoTask) -> Path:
    """``<out>/<suite>/<task name>_demo.hdf5``, LIBERO's dataset tree."""
    return Path(out) / task.suite / f"{task.name}_demo.hdf5"


def _expert_factory(env):
    from sim.libero.solver import LiberoSolver

    return LiberoSolver(env)


class ReplayMismatch(RuntimeError):
    """A successful blind attempt whose replay on the rendering env did not succeed (the two envs diverged)."""


def _start(init_state: int | None) -> dict[str, Any]:
    return {"init_state_id": "sampled" if init_state is None else int(init_state)}


def _settle(env, seed: int, settle_steps: int, init_state: int | None, perturbation: dict[str, Any] | None,
            pt=None):
    """Reset to the placement of ``seed`` (or ``init_state``), apply ``perturbation`` (a ``perturb.draw`` result,
    with ``pt``, the env's ``Perturber``) and run the settle steps; ``(obs, info)``."""
    obs, info = env.reset(seed=seed, options=_start(init_state))
    if perturbation is not None:
        pt.apply(perturbation)
        obs = env._obs
    for _ in range(settle_steps):
        obs, _, _, _, info = env.step(NOOP_ACTION)
    return obs, info


def blind_attempt(env, policy, seed: int, settle_steps: int, max_steps: int,
                  init_state: int | None = None, started: tuple[Any, dict[str, Any]] | None = None
                  ) -> tuple[bool, list[np.ndarray], str]:
    """One episode on a (fast) env from the sampled placement of ``seed`` (or fixed ``init_state``). ``started``:
    the ``(obs, info)`` of an env already reset and settled (under a perturbation, by ``perturb.start``), so it is
    not reset again. Returns ``(success, actions after the settle steps, reason)``; ``reason`` is "" on success."""
    obs, info = started if started is not None else _settle(env, seed, settle_steps, init_state, None)
    policy.reset(seed=seed)
    actions: list[np.ndarray] = []
    for _ in range(max_steps):
        action = np.asarray(policy.act(obs, info), dtype=np.float32)
        actions.append(action)
        obs, _, _, _, info = env.step(action)
        if info.get("failure"):
            return False, actions, str(info["failure"])
        if info.get("success"):
            return True, actions, ""
    return False, actions, "step limit"


def replay_with_cameras(env, seed: int, settle_steps: int, actions: Sequence[np.ndarray],
                        init_state: int | None = None, perturbation: dict[str, Any] | None = None, pt=None):
    """Replay ``actions`` from the sampled placement of ``seed`` (or ``init_state``) on a rendering env, under
    ``perturbation`` when given (the frames are what a policy sees: its camera, light, colours and pixel noise);
    a ``LiberoDemo``."""
    from sim.libero.demos import LiberoDemo, libero_obs_from_env

    obs, _ = _settle(env, seed, settle_steps, init_state, perturbation, pt)
    seen = pt.observe if perturbation is not None else (lambda o: o)
    frames, states, robot = [], [], []
    success = False
    for action in actions:
        frames.append(libero_obs_from_env(seen(obs)))
        states.append(env.sim.get_state().flatten())
        raw = env.raw_obs
        robot.append(np.concatenate([raw["robot0_gripper_qpos"], raw["robot0_eef_pos"], raw["robot0_eef_quat"]]))
        obs, _, _, _, info = env.step(action)
        success = bool(info.get("success"))
    if not success:
        raise ReplayMismatch(f"{env.task.task_id} seed {seed}: the replay with cameras did not succeed "
                             "(the blind and the rendering env disagree)")
    n = len(actions)
    last = np.eye(n, dtype=np.uint8)[-1]
    return LiberoDemo(
        actions=np.stack(actions).astype(np.float64),
        states=np.stack(states),
        obs={k: np.stack([f[k] for f in frames]) for k in frames[0]},
        rewards=last,
        dones=last.copy(),
        robot_states=np.stack(robot),
        attrs={"init_state": states[0], "model_file": env.sim.model.get_xml(), "seed": int(seed),
               **({"init_state_id": int(init_state)} if init_state is not None else {}),
               **_perturbation_attrs(perturbation, pt)},
    )


def _perturbation_attrs(perturbation: dict[str, Any] | None, pt) -> dict[str, str]:
    """A perturbed demo's attrs: its draw (JSON, replayable with ``perturb.Perturber.apply``) and, when the
    instruction was reworded, the reworded one as the demo's ``language_instruction`` (what the loader gives a
    language-conditioned policy for this demo instead of the file's)."""
    if perturbation is None:
        return {}
    out = {"perturbation": json.dumps(perturbation)}
    if pt.language is not None:
        out["language_instruction"] = pt.language
    return out


def record_task(task: LiberoTask, demos: int, out: str | Path, *, policy: str = "expert",
                policy_factory: Callable | None = None, image_size: int = 128, wrist_image: bool = True,
                settle_steps: int = 10, max_steps: int | None = None, max_attempts: int | None = None,
                seed: int = 0, init_states: Sequence[int] | None = None, perturb: str | None = None,
                perturb_mode: str = "all") -> dict[str, Any]:
    """Record ``demos`` successful episodes of ``task`` into its demo file; a summary dict.

    Args:
        policy: name stored with the file (``"expert"``); ``policy_factory(env) -> Policy`` builds it
            (default: ``sim.libero.solver.LiberoSolver``).
        max_attempts: blind attempts before giving up on the task (default ``3 * demos``); a task with
            fewer successes writes what it has and says so in the summary.
        init_states: start attempt ``k`` from fixed init state ``init_states[k % n]`` instead of a sampled
            placement (for a task whose sampled placements the expert cannot solve). An evaluation of a
            policy trained on these demos must then run other init states.
        perturb: LIBERO-Plus axes and levels (``"camera=2,light=2"``, ``sim.libero.perturb``): attempt ``k`` is
            perturbed along all of them (``perturb_mode="all"``) or along one drawn from its seed (``"one"``).
            The expert acts from the perturbed state (robot_init, layout); the replay renders what a policy
            would see. A draw that leaves the task unsolvable is drawn again, as in ``libero eval --perturb``.
    """
    from sim.libero.demos import write_libero_demo_file
    from sim.libero.env import LiberoEnv

    max_steps = int(max_steps or MAX_EPISODE_STEPS[task.suite])
    max_attempts = int(max_attempts or 3 * demos)
    states = [int(k) for k in init_states] if init_states else None
    from sim.libero import perturb as P

    levels = P.parse_perturb(perturb)
    P.for_episode(levels, 0, perturb_mode)  # an unknown mode: one line before anything runs
    setting = RecordSetting(policy, int(image_size), bool(wrist_image), int(settle_steps), max_steps, int(seed),
                            _id_text(states), perturb_text(levels, perturb_mode))
    path = demo_path(out, task)
    done = _recorded(path, setting, demos)
    if done is not None:
        return {**done, "skipped": True}
    factory = policy_factory or _expert_factory
    t0 = time.perf_counter()
    episodes = []
    reasons: dict[str, int] = {}
    attempts = 0
    blind = LiberoEnv(task.suite, task.index, images=False)
    cam = None
    try:
        agent = factory(blind)
        cam = LiberoEnv(task.suite, task.index, image_size=image_size, wrist_image=wrist_image)
        pts = (P.Perturber(blind), P.Perturber(cam)) if levels else (None, None)
        while len(episodes) < demos and attempts < max_attempts:
            s, k = seed + attempts, (states[attempts % len(states)] if states else None)
            attempts += 1
            drawn, started, reason = None, None, ""
            if levels:
                try:  # the draw on the blind env, with its redraws, settled; the replay applies the kept one
                    *started, drawn = P.start(blind, pts[0], P.for_episode(levels, s, perturb_mode), s, _start(k),
                                              settle_steps, NOOP_ACTION, f"{task.task_id} seed {s}")
                except P.UnsolvablePerturbation:
                    reason = "perturbation unsolvable"
            ok = False
            if not reason:
                ok, actions, reason = blind_attempt(blind, agent, s, settle_steps, max_steps, k, started)
            if ok:
                try:
                    episodes.append(replay_with_cameras(cam, s, settle_steps, actions, k, drawn, pts[1]))
                except ReplayMismatch:
                    reason = "replay differs"
            if reason:
                reasons[reason] = reasons.get(reason, 0) + 1
        problem = cam.libero_env.parsed_problem
        env_name = type(cam.libero_env).__name__
        convention = cam.metadata["image_convention"]  # what the policy sees; the file keeps raw frames
        kwargs = {"bddl_file_name": task.bddl_file, "robots": ["Panda"], "camera_names": ["agentview", "robot0_eye_in_hand"],
                  "camera_heights": image_size, "camera_widths": image_size, "control_freq": 20,
                  "ignore_done": True, "use_camera_obs": True}
    finally:
        blind.close()
        if cam is not None:
            cam.close()

    bddl_text = task.bddl_path().read_text()
    if episodes:
        write_libero_demo_file(
            path, episodes,
            problem_info={"problem_name": problem["problem_name"], "domain_name": problem.get("domain_name", ""),
                          "language_instruction": task.bddl_language},
            bddl_file_name=task.bddl_file,
            bddl_file_content=bddl_text,
            env_args={"type": 1, "env_name": env_name, "problem_name": problem["problem_name"],
                      "bddl_file": task.bddl_file, "env_kwargs": kwargs},
            extra_attrs={"embodied_record": json.dumps(asdict(setting)), "language": task.language},
            image_convention=convention,
        )
    summary = {"task": task.task_id, "name": task.name, "path": str(path) if episodes else None,
               "demos": len(episodes), "attempts": attempts, "failures": reasons,
               "frames": int(sum(len(e.actions) for e in episodes)), "seconds": round(time.perf_counter() - t0, 1)}
    log.info("%s: %d / %d demos in %d attempts (%s)", task.task_id, len(episodes), demos, attempts,
             ", ".join(f"{k} {v}" for k, v in reasons.items()) or "no failures")
    return summary


def _recorded(path: Path, setting: RecordSetting, demos: int) -> dict[str, Any] | None:
    """The summary of an existing file recorded with ``setting`` holding >= ``demos`` demos, else None."""
    if not path.is_file():
        return None
    import h5py

    try:
        with h5py.File(path, "r") as f:
            stored = f["data"].attrs.get("embodied_record")
            n = int(f["data"].attrs.get("num_demos", 0))
            frames = int(f["data"].attrs.get("total", 0))
    except (OSError, KeyError):
        return None
    if stored is None or n < demos:
        return None
    if {"init_states": None, "perturb": None, **json.loads(stored)} != asdict(setting):  # older files: the defaults
        return None
    return {"path": str(path), "demos": n, "frames": frames}


def perturb_text(levels: dict[str, int], mode: str) -> str | None:
    """How a recording is perturbed, as stored in its files and its folder's signature: ``"camera=2,light=2"``,
    with ``"; one axis an episode"`` for ``mode="one"``; None when clean."""
    if not levels:
        return None
    text = ",".join(f"{a}={lv}" for a, lv in levels.items())
    return text + ("; one axis an episode" if mode == "one" and len(levels) > 1 else "")


def record_command(args: Any) -> int:
    """``embodied libero record``: record ``--demos-per-task`` expert demos per chosen task; print a table."""
    from core.bootstrap import prepare_process
    from core.io import write_json
    from core.outputs import claim_output
    from sim.libero.evaluate import parse_task_ids, select_episodes

    prepare_process(learning_stack=False)
    tasks = [t for t, _ in select_episodes(args.suite, parse_task_ids(args.tasks))]
    if args.demos_per_task < 1:
        raise ConfigError(f"--demos-per-task: must be >= 1, got {args.demos_per_task}")
    try:
        states = parse_task_ids(args.init_states) if args.init_states else None
    except ConfigError:
        raise ConfigError(f"--init-states: expected init state ids like 10-49 or 3,7, got {args.init_states!r}") from None
    if states and (min(states) < 0 or max(states) >= 50):
        raise ConfigError(f"--init-states: LIBERO tasks have init states 0..49, got {args.init_states!r}")
    from sim.libero import perturb as P

    levels = P.parse_perturb(args.perturb)
    if args.perturb_mode != "all" and not levels:
        raise ConfigError("--perturb-mode: needs --perturb (the axes to choose from)")
    perturbed = perturb_text(levels, args.perturb_mode)
    signature = {"policy": "expert", "image_size": args.image_size, "wrist_image": not args.no_wrist,
                 "settle_steps": args.settle_steps, "max_steps": args.max_steps, "seed": args.seed,
                 **({"init_states": _id_text(states)} if states else {}),
                 **({"perturb": perturbed} if perturbed else {})}
    rows = []
    with claim_output(args.out, command=COMMAND, overwrite=args.overwrite, staged=False,
                      signature=signature) as folder:
        for task in tasks:
            rows.append(record_task(task, args.demos_per_task, folder, image_size=args.image_size,
                                    wrist_image=not args.no_wrist, settle_steps=args.settle_steps,
                                    max_steps=args.max_steps, max_attempts=args.max_attempts, seed=args.seed,
                                    init_states=states, perturb=args.perturb, perturb_mode=args.perturb_mode))
            write_json(folder / "record_summary.json", {"setting": signature, "tasks": rows})
    print(f"{'TASK':<18}{'DEMOS':>6}{'ATTEMPTS':>10}{'FRAMES':>8}  FAILURES")
    for r in rows:
        fails = ", ".join(f"{k} {v}" for k, v in r.get("failures", {}).items()) or ("(kept)" if r.get("skipped") else "-")
        print(f"{r.get('task', '?'):<18}{r['demos']:>6}{r.get('attempts', 0):>10}{r['frames']:>8}  {fails}")
    short = [r for r in rows if r["demos"] < args.demos_per_task]
    print(f"-> {Path(args.out)} ({len(rows) - len(short)} / {len(rows)} tasks complete)")
    return 0 if not short else 1


def configure_record_parser(p: Any, positive_int: Callable[[str], int], non_negative_int: Callable[[str], int]) -> None:
    """The ``embodied libero record`` flags (argparse ``p``; the CLI's integer parsers)."""
    p.add_argument("--suite", required=True, help="libero_spatial | libero_object | libero_goal | libero_10 | "
                                                  "libero_90 | all (short names work too)")
    p.add_argument("--tasks", default=None, metavar="IDS", help="task indices, e.g. 0,3 or 0-4 (default: all)")
    p.add_argument("--demos-per-task", type=positive_int, default=50, dest="demos_per_task",
                   help="successful episodes per task (LIBERO ships 50 human ones; default: %(default)s)")
    p.add_argument("--max-attempts", type=positive_int, default=None, dest="max_attempts",
                   help="expert attempts per task before giving up (default: 3 x demos)")
    p.add_argument("--image-size", type=positive_int, default=128, dest="image_size",
                   help="camera side in pixels (LIBERO's demos: 128)")
    p.add_argument("--no-wrist", action="store_true", help="leave out the eye-in-hand camera")
    p.add_argument("--max-steps", type=positive_int, default=None, dest="max_steps",
                   help="policy steps per attempt (default: the suite's evaluation limit)")
    p.add_argument("--settle-steps", type=non_negative_int, default=10, dest="settle_steps",
                   help="no-op steps after reset, not recorded (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="attempt k draws its placement from seed + k")
    p.add_argument("--init-states", default=None, dest="init_states", metavar="IDS",
                   help="start from these fixed init states (e.g. 10-49) instead of sampled placements; evaluate "
                        "a policy trained on them on the others (--episodes-per-task 10 runs states 0-9)")
    p.add_argument("--perturb", default=None, metavar="AXIS=L,...",
                   help="record under LIBERO-Plus perturbations, as `libero eval --perturb` draws them (axes: camera, "
                        "robot_init, language, light, texture, noise, layout; levels 1-3); each demo keeps its draw")
    p.add_argument("--perturb-mode", default="all", choices=("all", "one"), dest="perturb_mode",
                   help="all: every demo perturbed along every --perturb axis; one: each along one of them, drawn "
                        "from its seed (default: %(default)s)")
    p.add_argument("--out", required=True, type=Path,
                   help="dataset folder (<out>/<suite>/<task>_demo.hdf5; resumed when rerun with the same settings)")
    p.add_argument("--overwrite", action="store_true", help="start afresh in a folder that holds another recording")
