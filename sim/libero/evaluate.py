"""``embodied libero eval``: LIBERO's evaluation protocol, as VLA papers and ``lerobot-eval`` run it.

Protocol:
    * An episode is ``(suite, task index, init state id)``. Episode ``k`` of a task starts from LIBERO's fixed
      init state ``k`` (``reset(options={"init_state_id": k})``), one episode per init state: the default
      ``episodes_per_task=50`` covers all 50. The env is reset with seed ``seed + k`` (LIBERO re-samples
      fixture poses from it) and the policy with the same seed.
    * Settling: the first ``settle_steps`` steps send the no-op ``[0, 0, 0, 0, 0, 0, -1]`` (arm still, gripper
      open) while the objects come to rest, and do NOT count toward the step limit, as OpenVLA's
      ``run_libero_eval`` does (``while t < max_steps + num_steps_wait``, the first ``num_steps_wait`` steps a
      dummy action). The policy is reset after them and acts first on the settled observation.
    * Step limit: ``max_steps`` policy steps, by default the suite's ``sim.libero.suites.MAX_EPISODE_STEPS``
      (spatial 220, object 280, goal 300, libero_10 520, libero_90 400: OpenVLA's / pi0's; LeRobot uses 280
      for spatial). Success is LIBERO's own BDDL goal check (``info["success"]``); the episode ends at the
      first step it holds. ``steps`` in a record counts policy steps (settle steps excluded).

Policies (``policy``):
    ``expert``    the task-solving privileged expert ``sim.libero.solver.LiberoSolver(env, noise=0.0)``;
    ``scripted``  the env's reach-and-grasp script (``env.make_expert()``, ``sim.libero.expert``);
    ``random``    uniform random actions (``sim.api.RandomPolicy``);
    CKPT          a checkpoint path (``core.checkpoint.load_policy``, as ``sim.rollout`` loads it);
    ws://HOST:PORT  a policy served over openpi's websocket protocol (``sim.remote.RemotePolicy``: openpi's
                  LIBERO observation, ``replan_steps`` actions of each chunk); a server lost mid-episode makes the
                  episode run again once it is back (``MAX_SERVER_ATTEMPTS``), never a scored failure;
    a callable    ``factory(env: LiberoEnv) -> sim.api.Policy | BatchedPolicy`` (picklable for ``workers > 1``).
    The three named ones read only sim state, so their envs run with ``images=False`` (proprio only, no
    per-step rendering: ~15x faster on a CPU); checkpoints and callables get images (``images=`` overrides):
    ``image_size`` and the wrist camera follow the policy's ``expects`` (``sim.api.PolicySpec``) when it
    declares one, else 128 px + wrist. A batched policy is driven with one env (``act_batch`` on K = 1).

Workers: ``workers=K`` > 1 runs K processes (multiprocessing "spawn": each builds its own envs, hence its own
EGL context); the main process hands out episodes one at a time, a worker keeping its task (building a
LIBERO env costs 2-10 s) and moving to the task with the fewest workers on it when its own has none left.
``workers=1`` runs in this process. Results do not depend on K: each episode's env state and seeds are set
at its reset. (As with any "spawn" pool, a script that calls ``evaluate_libero(..., workers=K)`` must do so
under ``if __name__ == "__main__":``, and a callable policy must be importable by the workers.)

Crash isolation: a policy that raises in ``reset`` / ``act`` or returns a NaN / inf / wrong-shape action
fails only its episode (``failure = "policy: <one line>"``); a diverging or crashing simulator
(``info["failure"]``, an exception in ``step``) fails only its episode (``"sim: ..."``); a worker process that
dies fails the episode it was running (``"worker: ..."``) and a new worker takes its place. An episode
that reaches the step limit fails with ``"timeout"``. A policy (or env) that cannot be BUILT stops the whole
evaluation with a one-line error (``PolicyBuildError``, exit 2). Policies may offer ``episode_stats() ->
dict`` (``sim.libero.expert`` and ``sim.libero.solver`` do): its JSON-able result is kept as ``policy_stats``
in the record, and a string under its ``"failure"`` key names the cause of a timeout (``"timeout: <cause>"``).
The failure kind (``timeout`` / ``policy`` / ``sim`` / ``worker``) is the text before the first colon.

Output folder ``out`` (``core.outputs.claim_output``, in place, its signature = the settings below)::

    episodes.jsonl    one line per finished episode, appended + fsynced as it ends: suite, task_index,
                      task_name, language, init_state_id, seed, success, steps, failure (None on success),
                      seconds (reset to last step), video (path relative to ``out``, or None)[, policy_stats]
    eval_config.json  the settings (policy, max_steps, settle_steps, seed, images) and the selection
    eval_info.json    per_task / per_group (suite) / overall: n_episodes, successes, pc_success,
                      pc_success_ci95 (Wilson 95 %, in %), failures by kind, video_paths; per_episode; config
    index.html        the suite and task tables and the videos (self-contained apart from the mp4s)
    videos/<suite>/task<i>_init<k>.mp4   the first ``videos`` episodes of each task (agent view, 20 fps)

Resume: rerunning with the same settings on the same folder skips every episode already in
``episodes.jsonl`` (a torn last line, from a kill mid-write, is cut off and its episode rerun) and runs the
rest. The selection (suites, tasks, episodes per task) may change between runs: ``eval_info.json`` covers the
current selection. Other settings in an existing folder are refused unless ``overwrite`` (which starts afresh).
Key names follow ``lerobot-eval``'s ``eval_info.json`` (``per_task`` with ``task_group`` / ``task_id``,
``per_group``, ``overall``, ``pc_success``, ``n_episodes``, ``video_paths``, ``eval_s``, ``eval_ep_s``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigError, DataError, EmbodiedError
from core.io import to_jsonable, write_json, write_text
from sim.api import INFO_FAILURE, INFO_SUCCESS, is_batched, policy_expects
from sim.libero.suites import MAX_EPISODE_STEPS, SUITES, LiberoTask, list_tasks, normalize_suite
from sim.remote import add_remote_arguments, is_remote, latency_summary

COMMAND = "libero eval"
EPISODES_FILE = "episodes.jsonl"
CONFIG_FILE = "eval_config.json"
INFO_FILE = "eval_info.json"
PAGE_FILE = "index.html"
VIDEO_DIR = "videos"
PERTURB_DIR = "perturbations"
NOOP_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
"""The settle-step action: no arm motion, gripper open (OpenVLA's ``get_libero_dummy_action``)."""
"""Named policies that read only the sim state (their envs run without images)."""
DEFAULT_IMAGE_SIZE = 128
VIDEO_FPS = 20  # LIBERO's control rate
MAX_PAGE_ERRORS = 200  # rows of the page's table of episodes that failed by an error
MAX_SERVER_ATTEMPTS = 3  # runs of one episode that a lost server may interrupt before the evaluation stops


class PolicyBuildError(EmbodiedError):
    """The policy (or its env) could not be built: the whole evaluation stops, in one line."""


def one_line(e: BaseException) -> str:
    """``"ValueError: first line of the message"``."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0]}" if msg else type(e).__name__


# ------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class EnvSettings:
    """How the evaluation's ``LiberoEnv`` s are built: camera images in the observation or not, their size."""

    images: bool
    image_size: int = DEFAULT_IMAGE_SIZE
    wrist_image: bool = True
    lazy_images: bool = True  # render a frame when the policy reads it (``LiberoEnv(lazy_images=True)``)


@dataclass(frozen=True)
class _Settings:
    """Everything a worker needs to run episodes (picklable: sent to spawned processes)."""

    factory: Callable[..., Any]
    label: str
    env: EnvSettings
    max_steps: int | None
    settle_steps: int
    videos: int
    seed: int
    out: str
    quiet: bool = False
    learning_stack: bool = False
    perturb: dict[str, int] | None = None

    def step_limit(self, suite: str) -> int:
        return int(self.max_steps) if self.max_steps is not None else MAX_EPISODE_STEPS[suite]


class _OneEnv:
    """A natively batched policy (``act_batch``) driven for one env, as a per-env ``Policy``."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.expects = getattr(inner, "expects", None)

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed=seed, index=0)

    def act(self, obs: Mapping[str, Any], info: dict[str, Any]) -> np.ndarray:
        from sim.api import batch_of_one

        return np.asarray(self.inner.act_batch(batch_of_one(obs), [info]))[0]  # entries batched as read


def _read_only(obs: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the policy is given: a lazy observation as it is (read-only; its frames render if read), else a
    copy of the dict."""
    from sim.api import LazyObservation

    return obs if isinstance(obs, LazyObservation) else dict(obs)


def _env_settings_for(spec: Any, current: EnvSettings) -> EnvSettings:
    """The env settings a policy's ``PolicySpec`` asks for (image side, wrist camera), else ``current``."""
    keys = dict(getattr(spec, "observation", {}) or {})
    if not keys:
        return current
    size = current.image_size
    for key in ("image", "wrist_image"):
        shape = keys.get(key)
        if shape is not None and len(shape) == 3 and shape[0] is not None and shape[0] == shape[1]:
            size = int(shape[0])
            break
    images = "image" in keys or "wrist_image" in keys
    return EnvSettings(images=images, image_size=size, wrist_image=images and "wrist_image" in keys,
                       lazy_images=current.lazy_images)


# ------------------------------------------------------------------------------------------- selection
def expand_suites(suites: str | Sequence[str]) -> list[str]:
    """Suite names from ``--suite``: comma-separated names, ``all`` (the five LIBERO suites), ``pro`` (every
    LIBERO-PRO suite) and ``pro:<suite>`` (the LIBERO-PRO suites that perturb one, e.g. ``pro:spatial``)."""
    from sim.libero.suites import base_suite, list_suites

    items = [p for s in ([suites] if isinstance(suites, str) else suites) for p in str(s).split(",") if p.strip()]
    names: list[str] = []
    for item in (i.strip() for i in items):
        if item == "all":
            names += SUITES
        elif item == "pro" or item.startswith("pro:"):
            base = normalize_suite(item[4:]) if item.startswith("pro:") else None
            names += [s for s in list_suites(pro=True) if s not in SUITES and (base is None or base_suite(s) == base)]
        else:
            names.append(normalize_suite(item))
    return names


def select_episodes(suites: str | Sequence[str], task_ids: Sequence[int] | None = None,
                    episodes_per_task: int = 50) -> list[tuple[LiberoTask, list[int]]]:
    """``[(task, [init state ids])]`` in suite order then task order (``suites``: see :func:`expand_suites`).

    A task with fewer init states than ``episodes_per_task`` (a few LIBERO-PRO suites ship 10) runs all of its.

    Raises:
        ConfigError: An unknown suite, a task index out of a suite's range, or ``episodes_per_task`` not in
            ``1..num_init_states`` (one episode per init state).
    """
    names = expand_suites(suites)
    if not names:
        raise ConfigError("suites: name at least one LIBERO suite (or all)")
    if isinstance(episodes_per_task, bool) or not isinstance(episodes_per_task, int) or episodes_per_task < 1:
        raise ConfigError(f"--episodes-per-task: must be an integer >= 1, got {episodes_per_task!r}")
    plan: list[tuple[LiberoTask, list[int]]] = []
    for suite in dict.fromkeys(normalize_suite(s) for s in names):
        tasks = list_tasks(suite)
        ids = list(range(len(tasks))) if task_ids is None else list(dict.fromkeys(int(i) for i in task_ids))
        if not ids:
            raise ConfigError("--tasks: name at least one task index")
        bad = [i for i in ids if not 0 <= i < len(tasks)]
        if bad:
            raise ConfigError(f"--tasks: task {bad[0]} is out of range for {suite} (its tasks are 0..{len(tasks) - 1})")
        for i in ids:
            task = tasks[i]
            if task.source == "libero_pro":  # its own init-state count (10 for some): run each once
                plan.append((task, list(range(min(episodes_per_task, task.num_init_states)))))
                continue
            if episodes_per_task > task.num_init_states:
                raise ConfigError(f"--episodes-per-task: {episodes_per_task} > {task.num_init_states}, the init "
                                  f"states of {task.task_id} (one episode per init state)")
            plan.append((task, list(range(episodes_per_task))))
    return plan


def parse_task_ids(text: str | None) -> list[int] | None:
    """``"0,3"`` -> [0, 3]; ``"0-2,7"`` -> [0, 1, 2, 7]; None / ``""`` / ``"all"`` -> None (every task).

    Raises:
        ConfigError: Anything but comma-separated non-negative integers and ``a-b`` ranges.
    """
    if text is None or text.strip() in ("", "all"):
        return None
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = (int(lo), int(hi)) if sep else (int(lo), int(lo))
        except ValueError:
            raise ConfigError(f"--tasks: expected task indices like 0,3 or 0-4, got {text!r}") from None
        if a < 0 or b < a:
            raise ConfigError(f"--tasks: expected task indices like 0,3 or 0-4, got {text!r}")
        out.extend(range(a, b + 1))
    return out


# -------------------------------------------------------------------------------------------- episodes
class _TaskRunner:
    """One task's env and policy, built once, and the loop that runs its episodes (``run``)."""

    def __init__(self, task: LiberoTask, settings: _Settings):
        self.task, self.settings = task, settings
        self.env, self.policy = self._build(settings.env)
        spec = policy_expects(self.policy)
        if spec is not None and settings.env.images:
            want = _env_settings_for(spec, settings.env)
            if want != settings.env:  # the policy was built for other cameras: rebuild the env for them
                self.close()
                self.env, self.policy = self._build(want)
            spec.check(self.env.observation_space, self.env.action_space, task.env_id)

    def _build(self, es: EnvSettings) -> tuple[Any, Any]:
        from sim.libero.env import LiberoEnv

        env = LiberoEnv(self.task.suite, self.task.index, image_size=es.image_size, wrist_image=es.wrist_image,
                        render_mode="rgb_array", images=es.images, lazy_images=es.lazy_images)
        try:
            policy = self.settings.factory(env)
        except BaseException as e:
            env.close()
            if isinstance(e, EmbodiedError):
                raise
            raise PolicyBuildError(f"policy {self.settings.label}: building it for {self.task.task_id} failed: "
                                   f"{one_line(e)}") from e
        return env, (_OneEnv(policy) if is_batched(policy) else policy)

    def close(self) -> None:
        env = self.__dict__.pop("env", None)
        if env is not None:
            env.close()

    def run(self, init_state_id: int) -> dict[str, Any]:
        """Run one episode from init state ``init_state_id``; returns its record (see the module docstring).

        A served policy whose server is lost mid-episode: the episode's partial run is dropped with one line on
        stderr, the policy reconnects (back-off, ``sim.remote.SERVER_WAIT_S``) and the episode runs again, so no
        episode is counted for an outage nor counted twice. A server that does not come back stops the evaluation
        (``ServerUnavailable``, one line); rerunning the command resumes it.
        """
        for attempt in range(1, MAX_SERVER_ATTEMPTS + 1):
            record = self._run_once(init_state_id)
            if failure_kind(record.get("failure")) != "server":
                return record
            import sys

            print(f"libero eval: {self.task.task_id} init {init_state_id}: {record['failure']}; retrying when the "
                  f"server is back (attempt {attempt} of {MAX_SERVER_ATTEMPTS})", file=sys.stderr, flush=True)
            self.policy.reconnect()
        from core.serving import ServerUnavailable

        raise ServerUnavailable(f"{self.settings.label}: lost {MAX_SERVER_ATTEMPTS} times in one episode "
                                f"({self.task.task_id} init {init_state_id}); finished episodes are kept: rerun the "
                                "same command to resume")

    def _perturbed_start(self, k: int, seed: int, record: dict[str, Any]) -> tuple[Any, dict[str, Any], bool]:
        """Reset to init state ``k`` under a drawn perturbation (``--perturb``) and run the settle steps; a draw
        that leaves the task unsolvable or solved is drawn again (``sim.libero.perturb.start``). Returns the settled
        observation, info, and whether the settle steps already ran; the draw goes into ``record``."""
        from sim.libero import perturb as P

        pt = self._perturber_of_env()
        obs, info, drawn = P.start(self.env, pt, self.settings.perturb, seed, {"init_state_id": k},
                                   self.settings.settle_steps, np.asarray(NOOP_ACTION, dtype=np.float32),
                                   f"{self.task.task_id} init {k}")
        record["perturbation"] = drawn
        if pt.language is not None:
            record["language"] = pt.language
        return obs, info, True

    def _perturber_of_env(self) -> Any:
        """The ``sim.libero.perturb.Perturber`` of this task's env, made on first use."""
        if getattr(self, "_perturber", None) is None:
            from sim.libero.perturb import Perturber

            self._perturber = Perturber(self.env)
        return self._perturber

    def _give_policy_the_instruction(self, instruction: str) -> None:
        """A perturbed instruction reaches the policy: the env's instruction is set; a served policy reads it with
        every request, an in-process one when it is built, so that one is built again (only when it changed)."""
        meta = self.env.metadata
        if meta.get("language_instruction") == instruction:
            return
        meta["language_instruction"] = meta["bddl_language"] = instruction
        if not callable(getattr(self.policy, "reconnect", None)):  # not a served policy
            self.policy = self.settings.factory(self.env)
            self.policy = _OneEnv(self.policy) if is_batched(self.policy) else self.policy

    def _run_once(self, init_state_id: int) -> dict[str, Any]:
        s, task, env = self.settings, self.task, self.env
        k = int(init_state_id)
        seed = s.seed + k
        record: dict[str, Any] = {
            "suite": task.suite, "task_index": task.index, "task_name": task.name, "language": task.language,
            "init_state_id": k, "seed": seed, "success": False, "steps": 0, "failure": None, "seconds": 0.0,
            "video": None,
        }
        want_video = k < s.videos
        frames: list[np.ndarray] = []
        t0 = time.perf_counter()
        noop = np.asarray(NOOP_ACTION, dtype=np.float32)
        limit = s.step_limit(task.suite)
        success, failure, steps = False, None, 0
        settled = False
        try:
            if s.perturb:
                if k == 0:
                    self._perturbation_gallery(seed)
                obs, info, settled = self._perturbed_start(k, seed, record)
                if self._perturber.language is not None:
                    self._give_policy_the_instruction(self._perturber.language)
                if k == 0:
                    self._perturbation_image()
            else:
                obs, info = env.reset(seed=seed, options={"init_state_id": k})
        except Exception as e:  # noqa: BLE001 - a broken sim fails its episode, not the evaluation
            from sim.libero.perturb import UnsolvablePerturbation

            if isinstance(e, UnsolvablePerturbation):
                raise  # the levels, not the policy: stop with one line
            obs, info, failure = None, {}, f"sim: reset raised {one_line(e)}"
        if failure is None and want_video:
            frames.append(self._frame())
        for _ in range(s.settle_steps if failure is None and not settled else 0):
            obs, info, failure = self._step(noop, obs, info)
            if want_video and failure is None:
                frames.append(self._frame())
            if failure is not None or info.get(INFO_SUCCESS):
                success = failure is None
                break
        from core.serving import ConnectionLost, ServerUnavailable

        if failure is None and not success:
            try:
                self.policy.reset(seed=seed)
            except ServerUnavailable:
                raise  # the server is gone for good: stop (resumable), not an episode's failure
            except ConnectionLost as e:
                failure = f"server: {one_line(e)}"
            except Exception as e:  # noqa: BLE001 - any policy error fails the episode, not the run
                failure = f"policy: reset raised {one_line(e)}"
        seen = self._perturber.observe if s.perturb else _read_only
        while failure is None and not success and steps < limit:
            try:
                action = self.policy.act(seen(obs), info)
            except ConnectionLost as e:
                failure = f"server: {one_line(e)}"
                break
            except Exception as e:  # noqa: BLE001
                failure = f"policy: act raised {one_line(e)}"
                break
            action, failure = _check_action(action, env.action_space.shape)
            if failure is not None:
                break
            obs, info, failure = self._step(action, obs, info)
            steps += 1
            if steps % 50 == 0:
                _exit_if_orphaned()
            if failure is None:
                success = bool(info.get(INFO_SUCCESS))
                if want_video:
                    frames.append(self._frame())
        if failure is None and not success:
            failure = "timeout"
        record.update(success=success, steps=steps, failure=failure, seconds=round(time.perf_counter() - t0, 3))
        stats = getattr(self.policy, "episode_stats", None)
        if callable(stats):
            try:
                record["policy_stats"] = to_jsonable(stats(), default=str)
            except Exception:  # noqa: BLE001 - diagnostics are extras, never a reason to fail
                pass
            said = record.get("policy_stats")
            cause = said.get("failure") if isinstance(said, dict) else None
            if failure == "timeout" and isinstance(cause, str) and cause.strip():
                record["failure"] = f"timeout: {cause.strip().splitlines()[0]}"  # what the policy says went wrong
        if frames:
            record["video"] = self._write_video(frames, k)
        return record

    def _step(self, action: np.ndarray, obs: Any, info: dict[str, Any]) -> tuple[Any, dict[str, Any], str | None]:
        try:
            obs, _, _, _, info = self.env.step(action)
        except Exception as e:  # noqa: BLE001
            return obs, info, f"sim: step raised {one_line(e)}"
        if info.get(INFO_FAILURE):
            return obs, info, f"sim: {info[INFO_FAILURE]}"
        return obs, info, None

    def _frame(self) -> np.ndarray:
        frame = np.asarray(self.env.render(), dtype=np.uint8)
        if self.settings.perturb:  # what the policy sees, pixel noise included
            frame = self._perturber.observe({"image": frame})["image"]
        return frame

    def _perturbation_gallery(self, seed: int) -> None:
        """``perturbations/<suite>/task<i>_<axis>_L<level>.png``: init state 0 under each level (1-3) of each axis
        the run perturbs, one at a time, as the policy would see it (before the episode, which resets anew)."""
        from sim.libero import perturb as P

        pt = self._perturber_of_env()
        for axis in self.settings.perturb:
            for level in P.LEVELS:
                try:
                    self.env.reset(seed=seed, options={"init_state_id": 0})
                    pt.apply(P.draw({axis: level}, seed, self.task.language))
                    self._save_png(f"task{self.task.index}_{axis}_L{level}.png")
                finally:
                    pt.restore()

    def _perturbation_image(self) -> None:
        """``perturbations/<suite>/task<i>.png``: the agent view of init state 0 as the policy sees it perturbed."""
        self._save_png(f"task{self.task.index}.png")

    def _save_png(self, name: str) -> None:
        """The current agent view as the policy sees it, under ``perturbations/<suite>/``."""
        from PIL import Image

        from core.io import atomic_path

        rel = Path(PERTURB_DIR) / self.task.suite / name
        try:
            frame = self._frame()
            with atomic_path(Path(self.settings.out) / rel) as tmp:
                Image.fromarray(frame).save(tmp, format="PNG")
        except Exception:  # noqa: BLE001 - a picture is an extra: the episode's result stands without it
            pass

    def _write_video(self, frames: list[np.ndarray], k: int) -> str | None:
        from core.data.video import write_mp4

        rel = f"{VIDEO_DIR}/{self.task.suite}/task{self.task.index}_init{k}.mp4"
        try:
            write_mp4(Path(self.settings.out) / rel, np.stack(frames), fps=VIDEO_FPS)
        except Exception:  # noqa: BLE001 - a video is an extra: the episode's result stands without it
            return None
        return rel


def _check_action(action: Any, shape: tuple[int, ...]) -> tuple[np.ndarray, str | None]:
    """The action as float32 of ``shape`` and None, or a NaN array and the ``"policy: ..."`` reason."""
    try:
        a = np.asarray(action, dtype=np.float32)
    except (TypeError, ValueError) as e:
        return np.full(shape, np.nan, np.float32), f"policy: returned a non-numeric action ({one_line(e)})"
    if a.shape != tuple(shape):
        if a.size != int(np.prod(shape)) or a.ndim <= len(shape):
            return a, f"policy: returned an action of shape {a.shape}, expected {tuple(shape)}"
        a = a.reshape(shape)  # e.g. (1, 7) for (7,)
    if not np.isfinite(a).all():
        return a, f"policy: returned a non-finite action {np.array2string(a, precision=3)}"
    return a, None


# --------------------------------------------------------------------------------------------- running
def _run_in_process(plan: Sequence[tuple[LiberoTask, list[int]]], settings: _Settings,
                    on_record: Callable[[dict[str, Any]], None]) -> None:
    for task, ids in plan:
        if not ids:
            continue
        runner = _TaskRunner(task, settings)
        try:
            for k in ids:
                on_record(runner.run(k))
        finally:
            runner.close()


class Scheduler:
    """Hands out episodes one at a time: a worker keeps its task while it has episodes left, then moves to the
    task with the fewest workers on it (most episodes left on a tie), so envs are built as rarely as possible."""

    def __init__(self, plan: Iterable[tuple[LiberoTask, Sequence[int]]]):
        self.pending: dict[LiberoTask, collections.deque[int]] = {
            t: collections.deque(ids) for t, ids in plan if len(ids)}
        self.on_task: collections.Counter[LiberoTask] = collections.Counter()
        self._order = {t: i for i, t in enumerate(self.pending)}

    def take(self, current: LiberoTask | None) -> tuple[LiberoTask, int] | None:
        """The next ``(task, init state id)`` for a worker whose env is ``current``'s (None: no env yet)."""
        if current is not None and self.pending.get(current):
            return current, self.pending[current].popleft()
        left = [t for t, q in self.pending.items() if q]
        if not left:
            return None
        task = min(left, key=lambda t: (self.on_task[t], -len(self.pending[t]), self._order[t]))
        if current is not None:
            self.on_task[current] -= 1
        self.on_task[task] += 1
        return task, self.pending[task].popleft()

    def leave(self, task: LiberoTask | None) -> None:
        """A worker on ``task`` stopped (finished or died)."""
        if task is not None and self.on_task[task] > 0:
            self.on_task[task] -= 1


_PARENT_PID: int | None = None  # set in a worker process: the main process that runs the evaluation


def _exit_if_orphaned() -> None:
    """In a worker whose main process died (killed with SIGKILL: nobody stops us), exit mid-episode."""
    if _PARENT_PID is not None and os.getppid() != _PARENT_PID:
        os._exit(0)


def _worker_main(conn: Any, settings: _Settings) -> None:
    """A worker process: build the env of each task it is sent, run the episodes, send back the records."""
    global _PARENT_PID
    _PARENT_PID = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle (it stops us)
    from core.bootstrap import prepare_process

    prepare_process(learning_stack=settings.learning_stack)
    if settings.quiet:
        from core.logging import quiet_third_party

        quiet_third_party()
    runner: _TaskRunner | None = None
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the main process is gone
                return
            if msg is None:
                return
            task, k = msg
            if runner is None or runner.task != task:
                if runner is not None:
                    runner.close()
                    runner = None
                try:
                    runner = _TaskRunner(task, settings)
                except BaseException as e:  # noqa: BLE001 - reported to the main process, which stops
                    conn.send(("fatal", str(e) if isinstance(e, EmbodiedError) else one_line(e)))
                    return
            try:
                record = runner.run(k)
            except EmbodiedError as e:  # a served policy's server gone for good: the main process stops
                conn.send(("fatal", str(e)))
                return
            conn.send(("done", record))
    except (BrokenPipeError, EOFError, OSError):
        return
    finally:
        if runner is not None:
            runner.close()


@dataclass
class _Worker:
    proc: Any
    conn: Any
    task: LiberoTask | None = None
    current: tuple[LiberoTask, int] | None = None


def _death_record(task: LiberoTask, k: int, settings: _Settings, exitcode: int | None, seconds: float) -> dict:
    if exitcode is not None and exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
    else:
        how = f"exit code {exitcode}"
    return {"suite": task.suite, "task_index": task.index, "task_name": task.name, "language": task.language,
            "init_state_id": int(k), "seed": settings.seed + int(k), "success": False, "steps": 0,
            "failure": f"worker: process died ({how}) during this episode", "seconds": round(seconds, 3),
            "video": None}


def _run_pool(plan: Sequence[tuple[LiberoTask, list[int]]], settings: _Settings, workers: int,
              on_record: Callable[[dict[str, Any]], None]) -> int:
    """Run the plan on ``workers`` spawned processes; returns how many workers died (and were replaced)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    sched = Scheduler(plan)
    total = sum(len(q) for q in sched.pending.values())
    started: dict[int, float] = {}
    deaths = 0

    def start() -> _Worker:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child, settings), daemon=True, name="libero-eval-worker")
        proc.start()
        child.close()
        return _Worker(proc, parent)

    def assign(w: _Worker) -> bool:
        job = sched.take(w.task)
        if job is None:  # nothing left for it: let it close its env and exit while the others run
            sched.leave(w.task)
            w.task = w.current = None
            with contextlib.suppress(BrokenPipeError, OSError):
                w.conn.send(None)
            return False
        w.task, w.current = job[0], job
        started[id(w)] = time.perf_counter()
        with contextlib.suppress(BrokenPipeError, OSError):  # if it died, its sentinel wakes the loop below,
            w.conn.send(job)  # which fails this episode and starts a new worker
        return True

    pool = [start() for _ in range(min(workers, total))]
    busy = [w for w in pool if assign(w)]
    try:
        while busy:
            ready = set(wait([x for w in busy for x in (w.conn, w.proc.sentinel)]))
            for w in list(busy):
                if w.conn not in ready and w.proc.sentinel not in ready:
                    continue
                msg = None
                try:
                    if w.conn.poll():
                        msg = w.conn.recv()
                except (EOFError, OSError):
                    msg = None
                if msg is None:  # the worker died in its episode: fail that episode, start a new worker
                    w.proc.join(10)
                    task, k = w.current
                    on_record(_death_record(task, k, settings, w.proc.exitcode,
                                            time.perf_counter() - started.get(id(w), time.perf_counter())))
                    deaths += 1
                    sched.leave(w.task)
                    busy.remove(w)
                    w.conn.close()
                    new = start()
                    pool.append(new)
                    if assign(new):
                        busy.append(new)
                elif msg[0] == "done":
                    on_record(msg[1])
                    if not assign(w):
                        busy.remove(w)
                else:
                    raise PolicyBuildError(msg[1])
    finally:
        for w in pool:
            with contextlib.suppress(BrokenPipeError, OSError):
                w.conn.send(None)  # a second None to one that stopped already is never read
        deadline = time.monotonic() + 10
        for w in pool:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join(5)
            w.conn.close()
    return deaths


# ------------------------------------------------------------------------------------------ the folder
def read_episodes(path: str | Path, repair: bool = False) -> list[dict[str, Any]]:
    """The records of an ``episodes.jsonl`` (none when it does not exist).

    A last line without its newline is what a kill mid-write leaves: it is ignored (and, with ``repair``, cut
    off the file so that appending starts on a fresh line).

    Raises:
        DataError: A complete line that is not a JSON object (the file was edited or damaged).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n") + 1
    if end < len(data) and repair:
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    records = []
    for i, line in enumerate(data[:end].decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, f"line {i} is not JSON ({e.msg}); move the file away or pass --overwrite") from None
        if not isinstance(rec, dict) or not {"suite", "task_index", "init_state_id", "success"} <= set(rec):
            raise DataError(path, f"line {i} is not an episode record; move the file away or pass --overwrite")
        records.append(rec)
    return records


def episode_key(rec: Mapping[str, Any]) -> tuple[str, int, int]:
    """``(suite, task_index, init_state_id)`` of a record."""
    return str(rec["suite"]), int(rec["task_index"]), int(rec["init_state_id"])


class _Appender:
    """Appends records to ``episodes.jsonl``, one line each, flushed and fsynced as each episode ends."""

    def __init__(self, path: Path):
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def __call__(self, rec: dict[str, Any]) -> None:
        self.f.write(json.dumps(to_jsonable(rec, default=str), sort_keys=True) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


def _refuse_other_settings(out: Path, signature: dict[str, Any], overwrite: bool) -> None:
    """Name what differs when ``out`` holds a ``libero eval`` run with other settings (before claiming it)."""
    from core.outputs import OutputError, run_marker

    if overwrite:
        return
    marker = run_marker(out)
    if not marker or marker.get("command") != COMMAND or not isinstance(marker.get("signature"), dict):
        return
    theirs, ours = marker["signature"], to_jsonable(signature, default=str)
    diff = [f"{k} {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in sorted(set(theirs) | set(ours))
            if theirs.get(k) != ours.get(k)]
    if diff:
        raise OutputError(f"{out}: holds a libero eval with other settings ({'; '.join(diff)}); pass --overwrite "
                          "to replace it, or the same settings to resume it")


def _clear(folder: Path) -> None:
    import shutil

    for name in (EPISODES_FILE, INFO_FILE, PAGE_FILE, CONFIG_FILE):
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(folder / VIDEO_DIR, ignore_errors=True)


# ----------------------------------------------------------------------------------------- aggregation
def failure_kind(failure: str | None) -> str | None:
    """``"policy: act raised ..."`` -> ``"policy"``; None (a success) -> None."""
    if failure is None:
        return None
    return str(failure).split(":", 1)[0].strip() or "other"


def _stats(recs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    from core.metrics import wilson_interval

    n = len(recs)
    k = sum(bool(r["success"]) for r in recs)
    lo, hi = wilson_interval(k, n)
    kinds = collections.Counter(failure_kind(r.get("failure")) for r in recs if not r["success"])
    return {
        "n_episodes": n,
        "successes": k,
        "pc_success": 100.0 * k / n if n else float("nan"),
        "pc_success_ci95": [100.0 * lo, 100.0 * hi],
        "mean_steps": float(np.mean([r.get("steps", 0) for r in recs])) if n else float("nan"),
        "failures": dict(sorted((str(kd), c) for kd, c in kinds.items())),
        "video_paths": [r["video"] for r in recs if r.get("video")],
    }


def aggregate(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"per_task": [...], "per_group": {suite: ...}, "per_axis": {axis: ...}, "overall": ...}`` of records.

    ``per_axis`` groups suites by perturbation (``sim.libero.pro.suite_axis``: ``clean`` for LIBERO's own suites,
    ``object`` / ``position`` / ``language`` / ``task`` / ``distractor`` / ``other`` for LIBERO-PRO's) and adds
    ``suites``. Each entry holds ``n_episodes``, ``successes``, ``pc_success`` (in %), ``pc_success_ci95`` (Wilson 95 %
    interval, in %), ``mean_steps``, ``failures`` (count per kind: timeout / policy / sim / worker) and
    ``video_paths``. ``per_task`` entries add ``task_group`` (= ``suite``), ``task_id`` (= ``task_index``),
    ``task_name`` and ``language``, in suite then task order; ``per_group`` and ``overall`` add ``n_tasks``.
    Rates pool the episodes (equal to the mean over tasks when every task has as many episodes).
    """
    by_task: dict[tuple[str, int], list[Mapping[str, Any]]] = collections.defaultdict(list)
    for r in records:
        by_task[(str(r["suite"]), int(r["task_index"]))].append(r)
    order = {s: i for i, s in enumerate(SUITES)}
    keys = sorted(by_task, key=lambda t: (order.get(t[0], len(order)), t[0], t[1]))
    per_task = []
    for suite, index in keys:
        recs = sorted(by_task[(suite, index)], key=lambda r: int(r["init_state_id"]))
        first = recs[0]
        per_task.append({"task_group": suite, "task_id": index, "suite": suite, "task_index": index,
                         "task_name": first.get("task_name"), "language": first.get("language"), **_stats(recs)})
    per_group = {}
    for suite in dict.fromkeys(s for s, _ in keys):
        recs = [r for (s, _), rs in by_task.items() if s == suite for r in rs]
        per_group[suite] = {"n_tasks": sum(1 for s, _ in keys if s == suite), **_stats(recs)}
    from sim.libero.pro import AXES, suite_axis

    per_axis = {}
    for axis in ("clean", *AXES):
        suites = [s for s in per_group if suite_axis(s) == axis]
        if suites:
            recs = [r for (s, _), rs in by_task.items() if s in suites for r in rs]
            per_axis[axis] = {"suites": suites, "n_tasks": sum(per_group[s]["n_tasks"] for s in suites),
                              **_stats(recs)}
    overall = {"n_tasks": len(keys), **_stats([r for rs in by_task.values() for r in rs])}
    return {"per_task": per_task, "per_group": per_group, "per_axis": per_axis, "overall": overall}


# ------------------------------------------------------------------------------------------- reports
def stdout_table(info: Mapping[str, Any], tasks: bool | None = None) -> str:
    """The per-suite table (and the per-task one when ``tasks``, default: at most 10 tasks), success in %."""
    def row(name: str, m: Mapping[str, Any], extra: str = "") -> list[str]:
        lo, hi = m["pc_success_ci95"]
        fails = ", ".join(f"{k} {v}" for k, v in m["failures"].items()) or "-"
        return [name, *([extra] if extra else []), str(m["n_episodes"]), str(m["successes"]),
                f"{m['pc_success']:.1f}", f"[{lo:.1f}, {hi:.1f}]", fails]

    def fmt(head: list[str], rows: list[list[str]]) -> list[str]:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]

    lines: list[str] = []
    per_task = info["per_task"]
    if tasks if tasks is not None else len(per_task) <= 10:
        rows = [row(f"{t['suite']}/{t['task_index']}", t) for t in per_task]
        lines += fmt(["TASK", "EPISODES", "SUCCESSES", "SUCCESS %", "95% CI (%)", "FAILURES"], rows) + [""]
    rows = [row(s, g, str(g["n_tasks"])) for s, g in info["per_group"].items()]
    if len(info["per_group"]) > 1:
        rows.append(row("overall", info["overall"], str(info["overall"]["n_tasks"])))
    lines += fmt(["SUITE", "TASKS", "EPISODES", "SUCCESSES", "SUCCESS %", "95% CI (%)", "FAILURES"], rows)
    axes = info.get("per_axis") or {}
    if len(axes) > 1 or any(a != "clean" for a in axes):
        rows = [row(a, m, str(len(m["suites"]))) for a, m in axes.items()]
        lines += ["", *fmt(["AXIS", "SUITES", "EPISODES", "SUCCESSES", "SUCCESS %", "95% CI (%)", "FAILURES"], rows)]
    lat = info["overall"].get("latency")
    if lat:
        lines.append(f"requests {lat['requests']}: latency p50 {lat['latency_ms_p50']:.1f} ms, p99 "
                     f"{lat['latency_ms_p99']:.1f} ms, mean {lat['latency_ms_mean']:.1f} ms; held steps "
                     f"{lat['held_steps']}")
    return "\n".join(lines)


def html_page(info: Mapping[str, Any]) -> str:
    """``index.html``: settings, the suite and task tables, the videos (``<video src=... controls>``), and the
    episodes that failed by a policy / sim / worker error (not the timeouts)."""
    import html

    from core.demo import video_tag

    esc = html.escape

    def table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
        th = "".join(f"<th>{esc(h)}</th>" for h in head)
        body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"

    def cells(m: Mapping[str, Any]) -> list[str]:
        lo, hi = m["pc_success_ci95"]
        fails = ", ".join(f"{k} {v}" for k, v in m["failures"].items()) or "-"
        return [m["n_episodes"], m["successes"], f"{m['pc_success']:.1f}", f"[{lo:.1f}, {hi:.1f}]", fails]

    cfg = info.get("config", {})
    head = ["episodes", "successes", "success %", "95 % CI (%)", "failures"]
    suites = table(["suite", "tasks", *head],
                   [[s, g["n_tasks"], *cells(g)] for s, g in info["per_group"].items()]
                   + [["overall", info["overall"]["n_tasks"], *cells(info["overall"])]])
    axes = info.get("per_axis") or {}
    by_axis = ""
    if len(axes) > 1 or any(a != "clean" for a in axes):
        by_axis = "<h2>By perturbation axis (LIBERO-PRO)</h2>" + table(
            ["axis", "suites", *head], [[a, ", ".join(m["suites"]), *cells(m)] for a, m in axes.items()])
    perturbed = ""
    if cfg.get("perturb"):
        levels = ", ".join(f"{a} level {lv}" for a, lv in cfg["perturb"].items())
        figs = "".join(f"<figure><img src='{PERTURB_DIR}/{esc(t['suite'])}/task{t['task_index']}.png' width='256'>"
                       f"<figcaption>{esc(t['suite'])}/{t['task_index']} init 0</figcaption></figure>"
                       for t in info["per_task"])
        first = info["per_task"][0] if info["per_task"] else None
        gallery = "".join(
            f"<figure><img src='{PERTURB_DIR}/{esc(first['suite'])}/task{first['task_index']}_{a}_L{lv}.png' "
            f"width='192'><figcaption>{esc(a)} level {lv}</figcaption></figure>"
            for a in cfg["perturb"] for lv in (1, 2, 3)) if first else ""
        perturbed = (f"<h2>Perturbation (LIBERO-Plus axes): {esc(levels)}</h2><p>The agent view of each task's init "
                     "state 0 as the policy sees it; every episode's draw is in episodes.jsonl.</p>" + figs
                     + (f"<h3>Each axis at each level ({esc(first['suite'])}/{first['task_index']}, init state 0)"
                        f"</h3>{gallery}" if gallery else ""))
    tasks = table(["suite", "task", "instruction", *head],
                  [[t["suite"], t["task_index"], t["language"], *cells(t)] for t in info["per_task"]])
    videos = []
    for r in info.get("per_episode", []):
        if r.get("video"):
            verdict = "success" if r["success"] else r.get("failure") or "failure"
            videos.append(video_tag(r["video"], f"{r['suite']}/{r['task_index']} init {r['init_state_id']}: "
                                                f"{verdict} ({r['steps']} steps) - {r['language']}"))
    crashed = [r for r in info.get("per_episode", []) if failure_kind(r.get("failure")) not in (None, "timeout")]
    errors = table(["suite", "task", "init state", "steps", "failure"],
                   [[r["suite"], r["task_index"], r["init_state_id"], r["steps"], r["failure"]]
                    for r in crashed[:MAX_PAGE_ERRORS]])
    if len(crashed) > MAX_PAGE_ERRORS:
        errors += f"<p>and {len(crashed) - MAX_PAGE_ERRORS} more (episodes.jsonl has them all)</p>"
    settings = ", ".join(f"{k} {cfg.get(k)}" for k in ("policy", "step_limits", "settle_steps", "seed", "images",
                                                        "perturb") if k != "perturb" or cfg.get(k))
    style = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}figure{display:inline-block;margin:4px;"
             "vertical-align:top;width:256px}figcaption{font-size:12px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>LIBERO evaluation</title><style>{style}"
            f"</style></head><body><h1>LIBERO evaluation: {esc(str(cfg.get('policy')))}</h1><p>{esc(settings)}. "
            "One episode per init state; success = LIBERO's BDDL goal check; 95 % intervals are Wilson's.</p>"
            f"<h2>Suites</h2>{suites}{by_axis}{perturbed}<h2>Tasks</h2>{tasks}"
            f"<h2>Videos</h2>{''.join(videos) or '<p>none</p>'}"
            f"<h2>Episodes that failed by a policy, sim or worker error</h2>{errors if crashed else '<p>none</p>'}"
            "</body></html>\n")


# -------------------------------------------------------------------------------------------- the API
def evaluate_libero(
    policy: str | Callable[..., Any],
    suites: str | Sequence[str],
    *,
    episodes_per_task: int = 50,
    task_ids: Sequence[int] | None = None,
    workers: int = 1,
    max_steps: int | None = None,
    settle_steps: int = 10,
    videos: int = 2,
    out: str | Path,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    images: bool | None = None,
    api_key_file: str | None = None,
    replan_steps: int | None = None,
    realtime: bool = False,
    policy_args: Mapping[str, Any] | None = None,
    perturb: str | Mapping[str, int] | None = None,
    lazy_images: bool = True,
) -> dict[str, Any]:
    """Evaluate ``policy`` on LIBERO suites with the protocol of the module docstring; returns the eval_info.

    Args:
        policy: ``"expert"`` | ``"scripted"`` | ``"random"`` | a registered name | a checkpoint path |
            ``ws://HOST:PORT`` | ``factory(env) -> Policy``, resolved by ``sim.policies.resolve_policy`` (the
            resolver ``sim rollout`` and ``drive eval`` use).
        policy_args: Options of the policy's factory (``--policy-arg``; checked against its signature).
        suites: A suite name (``"libero_spatial"``, ``"spatial"`` ...), a list of them, or ``"all"``.
        episodes_per_task: Episodes per task; episode ``k`` starts from init state ``k`` (at most 50).
        task_ids: Task indices to run in every suite (None: all of each suite).
        workers: Processes running episodes (1: in this process).
        max_steps: Policy steps per episode (None: the suite's ``MAX_EPISODE_STEPS``); settle steps come on top.
        settle_steps: No-op steps before the policy's first action (not counted toward ``max_steps``).
        videos: Episodes of each task recorded to mp4 (the first ones, init states ``0..videos-1``).
        out: The output folder (resumed when it holds a run with the same settings).
        seed: Episode ``k`` resets its env and policy with ``seed + k``.
        overwrite: Start afresh in a folder that holds another (or the same) evaluation.
        progress: Show a progress bar on stderr.
        images: Camera images in the observation (None: off for expert / scripted / random, else on).
        api_key_file: A served policy's (``ws://``) API key, read from this file.
        replan_steps: A served policy: actions of each returned chunk executed before the next request (None: the
            server's ``replan_steps``). With ``realtime``: the same for an in-process chunk policy.
        realtime: Simulated real time (``sim.remote``): each request's latency costs control periods during which
            the simulator goes on with the current chunk, then holds its last action.
        perturb: LIBERO-Plus axes and levels (``"camera=2,light=1"``, ``sim.libero.perturb``): each episode's draw
            is seeded by its seed, recorded under ``perturbation`` in ``episodes.jsonl``, and redrawn when it
            leaves the task unsolvable.
        lazy_images: Render a camera frame only when the policy reads it (``LiberoEnv(lazy_images=True)``: the
            same frames and episodes, bit for bit); a chunking policy that re-plans every 4 steps renders a
            quarter of them. False renders every step, as robosuite does (``benchmarks/libero_lazy_render.py``).

    Returns:
        The ``eval_info.json`` content: ``per_task``, ``per_group``, ``overall`` (``aggregate``), ``per_episode``
        (the records of the selection), ``config``.

    Raises:
        ConfigError: Bad arguments (unknown suite or policy, task out of range, more episodes than init states).
        OutputError: ``out`` holds other files or an evaluation with other settings (without ``overwrite``).
        PolicyBuildError: The policy could not be built for a task's env.
    """
    for name, value, low in (("workers", workers, 1), ("settle_steps", settle_steps, 0), ("videos", videos, 0),
                             ("max_steps", 1 if max_steps is None else max_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"--{name.replace('_', '-')}: must be an integer >= {low}, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"--seed: must be an integer, got {seed!r}")
    plan = select_episodes(suites, task_ids, episodes_per_task)
    from sim.libero.perturb import parse_perturb
    from sim.policies import resolve_policy

    levels = parse_perturb(perturb)

    resolved = resolve_policy(policy, policy_args, api_key_file=api_key_file, replan_steps=replan_steps,
                              realtime=realtime)
    factory, label, kind = resolved.factory, resolved.label, resolved.kind
    env = EnvSettings(images=(kind != "state") if images is None else bool(images), lazy_images=bool(lazy_images))
    signature = {"policy": label, "max_steps": max_steps, "settle_steps": settle_steps, "seed": seed,
                 "images": env.images}
    if policy_args:  # absent from older folders' signatures, which stay resumable
        signature["policy_args"] = dict(policy_args)
    if realtime or replan_steps is not None:  # absent from older folders' signatures, which stay resumable
        signature.update(realtime=bool(realtime), replan_steps=replan_steps)
    if levels:  # absent from older folders' signatures, which stay resumable
        signature["perturb"] = levels
    step_limits = {t.suite: (max_steps or MAX_EPISODE_STEPS[t.suite]) for t, _ in plan}
    config = {**signature, "step_limits": step_limits, "suites": list(step_limits),
              "task_ids": None if task_ids is None else [int(i) for i in task_ids],
              "episodes_per_task": episodes_per_task, "videos": videos, "workers": workers,
              "lazy_images": env.lazy_images and env.images, "noop_action": list(NOOP_ACTION),
              "protocol": "one episode per init state; settle steps not counted"}
    from core.logging import third_party_quiet

    out = Path(out).absolute()
    _refuse_other_settings(out, signature, overwrite)
    settings = _Settings(factory=factory, label=label, env=env, max_steps=max_steps, settle_steps=settle_steps,
                         videos=videos, seed=seed, out=str(out), quiet=third_party_quiet(),
                         learning_stack=kind != "state", perturb=levels or None)
    t0 = time.perf_counter()
    created = not out.exists()
    try:
        return _evaluate_in(out, plan, settings, signature, config, workers=workers, overwrite=overwrite,
                            progress=progress, t0=t0)
    except BaseException:
        if created and out.is_dir() and not read_episodes(out / EPISODES_FILE):  # nothing ran: leave no folder
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        raise


def _evaluate_in(out: Path, plan: list[tuple[LiberoTask, list[int]]], settings: _Settings, signature: dict[str, Any],
                 config: dict[str, Any], *, workers: int, overwrite: bool, progress: bool, t0: float) -> dict[str, Any]:
    """``evaluate_libero`` in its claimed folder: skip the finished episodes, run the rest, write the reports."""
    from core.logging import progress as progress_bar
    from core.outputs import claim_output

    with claim_output(out, command=COMMAND, overwrite=overwrite, staged=False, signature=signature) as folder:
        if overwrite:
            _clear(folder)
        write_json(folder / CONFIG_FILE, config)
        done = {episode_key(r) for r in read_episodes(folder / EPISODES_FILE, repair=True)}
        todo = [(t, [k for k in ids if (t.suite, t.index, k) not in done]) for t, ids in plan]
        n_todo = sum(len(ids) for _, ids in todo)
        append = _Appender(folder / EPISODES_FILE)
        bar = progress_bar(total=n_todo, desc="libero eval", unit="ep", enabled=progress and n_todo > 0)
        wins = [0, 0]

        def on_record(rec: dict[str, Any]) -> None:
            append(rec)
            wins[0] += bool(rec["success"])
            wins[1] += 1
            bar.set_postfix_str(f"success {wins[0]}/{wins[1]}", refresh=False)
            bar.update(1)

        deaths = 0
        try:
            if n_todo and min(workers, n_todo) > 1:
                deaths = _run_pool(todo, settings, workers, on_record)
            elif n_todo:
                _run_in_process(todo, settings, on_record)
        finally:
            bar.close()
            append.close()
        wanted = {(t.suite, t.index, k) for t, ids in plan for k in ids}
        records: dict[tuple[str, int, int], dict[str, Any]] = {}
        for r in read_episodes(folder / EPISODES_FILE):
            if episode_key(r) in wanted:
                records.setdefault(episode_key(r), r)  # the first line of an episode counts
        per_episode = sorted(records.values(), key=lambda r: (SUITES.index(r["suite"]) if r["suite"] in SUITES
                                                              else len(SUITES), r["task_index"], r["init_state_id"]))
        info = aggregate(per_episode)
        latency = latency_summary([r.get("policy_stats") for r in per_episode])
        if latency:
            info["overall"]["latency"] = latency
        eval_s = time.perf_counter() - t0
        info["overall"].update(eval_s=eval_s, eval_ep_s=float(np.mean([r["seconds"] for r in per_episode]))
                               if per_episode else float("nan"), episodes_this_run=n_todo,
                               worker_restarts=deaths)
        info["per_episode"] = per_episode
        info["config"] = config
        write_json(folder / INFO_FILE, info)
        write_text(folder / PAGE_FILE, html_page(info))
    return info


# --------------------------------------------------------------------------------------------- the CLI
def configure_eval_parser(p: Any, positive_int: Callable[[str], int], non_negative_int: Callable[[str], int]) -> None:
    """The ``embodied libero eval`` flags (argparse ``p``; the CLI's integer parsers)."""
    p.add_argument("--suite", required=True,
                   help=f"{' | '.join(SUITES)} | all | a LIBERO-PRO suite (libero_spatial_swap ...) | pro | "
                        "pro:SUITE (its LIBERO-PRO copies); comma-separated to combine (the short names spatial, "
                        "object, goal, 10, 90, spatial_swap work too; `embodied sim list --family libero` lists all)")
    p.add_argument("--tasks", default=None, metavar="IDS",
                   help="task indices in every chosen suite, e.g. 0,3 or 0-4 (default: all)")
    p.add_argument("--policy", required=True,
                   help="expert | scripted | random | a registered policy | CHECKPOINT | ws://HOST:PORT (a policy "
                        "served over openpi's protocol: `embodied serve`, openpi's serve_policy.py, ...); the same "
                        "names as `sim rollout` and `drive eval` (sim.policies)")
    from sim.policies import add_policy_arg

    add_policy_arg(p)
    add_remote_arguments(p, positive_int, "0.05 s")
    p.add_argument("--episodes-per-task", type=positive_int, default=50, dest="episodes_per_task",
                   help="episode k starts from LIBERO's init state k; at most 50 (default: %(default)s, all)")
    p.add_argument("--workers", type=positive_int, default=1, metavar="K",
                   help="processes running episodes, each with its own envs (default: %(default)s)")
    p.add_argument("--max-steps", type=positive_int, default=None, dest="max_steps",
                   help="policy steps per episode (default: the suite's: spatial 220, object 280, goal 300, "
                        "libero_10 520, libero_90 400)")
    p.add_argument("--settle-steps", type=non_negative_int, default=10, dest="settle_steps",
                   help="no-op steps before the policy acts, not counted toward --max-steps (default: %(default)s)")
    p.add_argument("--videos", type=non_negative_int, default=2, metavar="K",
                   help="record the first K episodes of each task as mp4 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="episode k resets env and policy with seed + k")
    p.add_argument("--perturb", default=None, metavar="AXIS=L,...",
                   help="LIBERO-Plus perturbations, levels 1-3: camera (5/10/15 cm, 5/10/15 deg), robot_init "
                        "(0.1/0.2/0.3 rad a joint), language, light, texture, noise (sigma 4/8/16), layout (2/4/6 cm); "
                        "each episode's draw is recorded in episodes.jsonl (sim/libero/perturb.py)")
    p.add_argument("--out", required=True, type=Path, help="output folder (resumed when rerun with the same settings)")
    p.add_argument("--overwrite", action="store_true", help="start afresh in a folder that holds another evaluation")


def eval_command(args: Any) -> int:
    """``embodied libero eval``: run ``evaluate_libero`` from parsed arguments; print the table and the paths."""
    from core.bootstrap import prepare_process
    from sim.policies import STATE_POLICIES, parse_policy_args

    policy_args = parse_policy_args(args.policy_arg)
    state = args.policy in STATE_POLICIES
    prepare_process(learning_stack=not state)  # a learned policy renders and runs a model: torch + triton first
    if (args.api_key_file is not None) and not is_remote(args.policy):
        raise ConfigError("--api-key-file is for a served policy (--policy ws://HOST:PORT)")
    info = evaluate_libero(args.policy, args.suite, episodes_per_task=args.episodes_per_task,
                           task_ids=parse_task_ids(args.tasks), workers=args.workers, max_steps=args.max_steps,
                           settle_steps=args.settle_steps, videos=args.videos, out=args.out, seed=args.seed,
                           overwrite=args.overwrite, progress=True, api_key_file=args.api_key_file,
                           replan_steps=args.replan_steps, realtime=args.realtime, policy_args=policy_args,
                           perturb=args.perturb)
    print(stdout_table(info))
    out = Path(args.out)
    print(f"-> {out / INFO_FILE}, {out / PAGE_FILE}")
    return 0
