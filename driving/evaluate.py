"""``embodied drive eval``: closed-loop driving evaluation of a policy in the highway-env scenarios.

Drives N seeded episodes of one scenario or of all five (``--scenario all``: highway, merge, roundabout,
intersection, racetrack), records them (HDF5 driving logs in the trajectory format, mp4 front-camera
videos of the first K episodes with the policy's overlay) and scores each with ``sim.driving.metrics``
(Bench2Drive-style: route completion x infraction penalties = driving score; DS, SR, collision rate,
progress, comfort). Episode ``j`` of every scenario uses seed ``seed + j`` for every policy, so the rows of
different policies are paired.

Policies (``--policy``, resolved by ``sim.policies.resolve_policy``, the one resolver of every closed loop):
    ``idm`` / ``expert``  the privileged IDM + MOBIL expert (``sim.driving.expert.ExpertPolicy``, no noise);
    ``constant``  keep lane at constant speed (``LaneKeepingPolicy``);  ``random``  uniform random actions;
    NAME          any entry of ``core.registry.POLICIES`` registered by a method (e.g. ``automot``,
                  ``noreason``), built as ``factory(env, **policy_args)``;
    CKPT          a checkpoint folder: its ``config.json`` names the method, whose ``POLICIES`` factory is
                  called as ``core.checkpoint.load_policy`` calls it, ``factory(env, checkpoint=CKPT,
                  **policy_args)``. (``--policy automot --policy-arg checkpoint=CKPT`` is the same.)
    ws://HOST:PORT  a policy served over openpi's protocol (``sim.remote``).
    ``--policy-arg`` keys are checked against the factory's signature before anything runs (one line, with the
    closest option).

Policy factory contract (every ``POLICIES`` entry): ``factory(env: gymnasium.Env, checkpoint=None, **kwargs) ->
sim.api.Policy`` (``reset(seed)``, ``act(obs, info) -> (2,) [acceleration m/s^2, steering rad]``; or a
``BatchedPolicy``), registered with ``core.registry.POLICIES.register(name, "module:factory")`` (a class with
``__init__(self, env, ...)`` works too; a factory that needs a checkpoint refuses ``None`` in one line,
``core.checkpoint.require_checkpoint``). ``kwargs`` come from ``--policy-arg key=value`` (repeatable;
values parsed as int, float, bool (true/false), none, else str), e.g. AutoMoT's ``update_interval=2
refiner=true checkpoint=PATH``. Optional overlay hook: ``policy.overlay() -> {"waypoints": (n, 2) ego-frame
metres, "meta_action": str} | None``, read after every ``act``; the chosen episodes'
videos show it (``driving.report``).

Robustness (design): every policy is wrapped in a guard (``PolicyGuard``) next to its env. When the
policy raises in ``reset`` / ``act`` or returns a NaN / inf / wrong-shape action, the guard records a
one-line reason and hands the env a NaN action; ``DrivingEnv`` ends an episode on a non-finite action
(``terminated``, ``info["failure"]``), so the episode stops at that step without touching ``sim.rollout``.
The episode is scored as FAILED (driving score 0, no success, ``failure`` = the guard's reason), the
policy is reset with the next episode's seed as usual and the run continues. A simulator failure
(``info["failure"]`` on its own) fails the episode the same way. A policy that cannot be BUILT fails the
whole run with a one-line error (``PolicyBuildError``, exit 2) and nothing is written.

Output folder (``--out DIR``, claimed with ``core.outputs.claim_output``: staged, refused if another run's)::

    DIR/config.json                     the run's arguments
    DIR/summary.json                    {"policy", "policy_args", "seed", "episodes", "scenarios": {name:
                                        {"env_id", "aggregate"}}, "overall": aggregate over all episodes}
    DIR/summary.md                      scenario x DS, SR, rates, progress, route completion, comfort, speed
    DIR/index.html                      self-contained page: the table, per-episode rows, the videos
    DIR/<scenario>/episodes.jsonl       one JSON row per episode (metrics, seed, failure)
    DIR/<scenario>/metrics.json         {"scenario", "env_id", "aggregate", "episodes": [...]}
    DIR/<scenario>/<env id>.hdf5        driving logs (``sim.recorder`` layout); config.json: RolloutConfig
    DIR/<scenario>/videos/episode_<j>.mp4   front camera (+ overlay) of the first K episodes
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigError, EmbodiedError
from core.io import write_json, write_text
from sim.remote import latency_summary

ALL_SCENARIOS = ("highway", "merge", "roundabout", "intersection", "racetrack")


class PolicyBuildError(EmbodiedError):
    """The policy could not be constructed (the whole run fails, in one line)."""


# ------------------------------------------------------------------------------------------- arguments
def scenario_env_id(scenario: str) -> str:
    """``"highway"`` -> ``"embodied/Drive-Highway-v0"`` (checked against the registered scenarios)."""
    from sim.driving.registration import SCENARIOS

    if scenario not in SCENARIOS:
        raise ConfigError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)}, or all)")
    return SCENARIOS[scenario].env_id


def scenario_list(scenario: str | Sequence[str]) -> list[str]:
    """``"all"`` -> the five scenarios; a name -> ``[name]`` (checked); a list is checked item by item."""
    names = list(ALL_SCENARIOS) if scenario == "all" else [scenario] if isinstance(scenario, str) else list(scenario)
    for name in names:
        scenario_env_id(name)
    return names


def _reason(e: BaseException) -> str:
    """``"server: <one line>"`` for a lost policy server, else ``"policy raised <one line>"``."""
    from core.serving import ConnectionLost

    if isinstance(e, ConnectionLost):
        import sys

        print(f"drive eval: server: {one_line(e)}; the episode fails and the next one reconnects", file=sys.stderr)
        return f"server: {one_line(e)}"
    return f"policy raised {one_line(e)}"


def _probed(env, factory: Callable) -> Any:
    """``factory(env)``, a per-env policy wrapped in ``sim.remote.LatencyProbe`` (its per-step time is reported)."""
    from sim.api import is_batched
    from sim.remote import LatencyProbe, RemotePolicy

    inner = factory(env)
    return inner if is_batched(inner) or isinstance(inner, RemotePolicy) else LatencyProbe(inner)


def one_line(e: BaseException) -> str:
    """``"ValueError: first line of the message"``."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0]}" if msg else type(e).__name__


@dataclass
class EpisodeRecord:
    """What the guard saw in one episode: the first failure and the overlay after each ``act``."""

    seed: int | None
    failure: str | None = None
    steps: int = 0
    overlays: list[dict[str, Any] | None] = field(default_factory=list)


class PolicyGuard:
    """Wraps a per-env ``Policy``: turns its exceptions and invalid actions into a failed episode.

    Records per episode (by reset seed) in ``records``; after a failure every ``act`` returns a NaN
    action, which ``DrivingEnv`` answers by ending the episode (``info["failure"]``).
    """

    def __init__(self, inner: Any, action_shape: tuple[int, ...], overlays: bool = True):
        self.inner = inner
        self.action_shape = tuple(action_shape)
        self.want_overlay = overlays and callable(getattr(inner, "overlay", None))
        self.expects = getattr(inner, "expects", None)  # the spaces it was built for: sim.rollout checks them
        self.records: dict[Any, EpisodeRecord] = {}
        self.current = EpisodeRecord(None)

    def _nan(self) -> np.ndarray:
        return np.full(self.action_shape, np.nan, dtype=np.float32)

    def _fail(self, reason: str) -> np.ndarray:
        if self.current.failure is None:
            self.current.failure = f"step {self.current.steps}: {reason}"
        return self._nan()

    def reset(self, seed: int | None = None) -> None:
        from core.serving import ServerUnavailable

        self.current = EpisodeRecord(seed)
        self.records[seed] = self.current
        try:
            self.inner.reset(seed=seed)
        except ServerUnavailable:
            raise  # a served policy's server did not come back: the run stops in one line
        except Exception as e:  # noqa: BLE001 - any policy error fails the episode, not the run
            self.current.failure = f"reset: {_reason(e)}"

    def check_action(self, action: Any) -> np.ndarray:
        """The action as float32 of ``action_shape``, or the NaN action after recording why it is invalid."""
        try:
            a = np.asarray(action, dtype=np.float32)
        except (TypeError, ValueError) as e:
            return self._fail(f"policy returned a non-numeric action ({one_line(e)})")
        if a.shape != self.action_shape:
            if a.size == int(np.prod(self.action_shape)) and a.ndim > len(self.action_shape):
                a = a.reshape(self.action_shape)  # e.g. (1, 2) for (2,)
            else:
                return self._fail(f"policy returned an action of shape {a.shape}, expected {self.action_shape}")
        if not np.isfinite(a).all():
            return self._fail(f"policy returned a non-finite action {np.array2string(a, precision=3)}")
        return a

    def _record_overlay(self) -> None:
        if not self.want_overlay:
            return
        from driving.report import sanitize_overlay

        try:
            ov = sanitize_overlay(self.inner.overlay())
        except Exception:  # noqa: BLE001 - an overlay is a visual extra, never a reason to fail
            ov = None
        self.current.overlays.append(ov)

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        if self.current.failure is not None:
            return self._nan()
        try:
            action = self.inner.act(obs, info)
        except Exception as e:  # noqa: BLE001
            return self._fail(_reason(e))
        a = self.check_action(action)
        self._record_overlay()
        self.current.steps += 1
        return a


class BatchedPolicyGuard(PolicyGuard):
    """``PolicyGuard`` for a natively batched policy driven with one env (``act_batch`` on K = 1)."""

    def reset(self, seed: int | None = None, index: int | None = None) -> None:
        self.current = EpisodeRecord(seed)
        self.records[seed] = self.current
        try:
            self.inner.reset(seed=seed, index=index)
        except Exception as e:  # noqa: BLE001
            self.current.failure = f"reset: policy raised {one_line(e)}"

    def act_batch(self, obs: dict[str, np.ndarray], infos: Sequence[dict[str, Any]]) -> np.ndarray:
        if self.current.failure is not None:
            return self._nan()[None]
        try:
            actions = np.asarray(self.inner.act_batch(obs, infos), dtype=np.float32)
        except Exception as e:  # noqa: BLE001
            return self._fail(f"policy raised {one_line(e)}")[None]
        a = self.check_action(actions[0] if actions.ndim == len(self.action_shape) + 1 and len(actions) == 1
                              else actions)
        self._record_overlay()
        self.current.steps += 1
        return a[None]


def guarded_factory(factory: Callable, label: str, guards: list, overlays: bool = True) -> Callable:
    """``factory`` wrapped: the built policy is guarded (and appended to ``guards``); build errors raise
    ``PolicyBuildError`` in one line."""

    def build(env):
        from sim.api import is_batched

        try:
            inner = factory(env)
        except EmbodiedError:
            raise
        except Exception as e:  # noqa: BLE001
            raise PolicyBuildError(f"--policy {label}: building the policy failed: {one_line(e)}") from e
        cls = BatchedPolicyGuard if is_batched(inner) else PolicyGuard
        guard = cls(inner, env.action_space.shape, overlays=overlays)
        guards.append(guard)
        return guard

    return build


# ------------------------------------------------------------------------------------------- evaluation
def evaluate_scenario(factory: Callable, label: str, scenario: str, episodes: int, out: str | Path, seed: int = 0,
                      videos: int = 2, env_kwargs: Mapping[str, Any] | None = None,
                      progress: bool = True) -> dict[str, Any]:
    """Drive and score ``episodes`` episodes of one scenario into ``out`` (``DIR/<scenario>`` of a run).

    Returns:
        ``{"scenario", "env_id", "aggregate", "episodes": [rows], "videos": [{"episode", "seed", "path",
        ...}]}`` (video paths relative to ``out``).
    """
    from sim.driving.metrics import EpisodeTracker, aggregate
    from sim.driving.pdm import SUBSCORES, mean_scores
    from sim.driving.registration import SCENARIOS
    from sim.recorder import EpisodeRecorder, env_metadata
    from sim.rollout import RolloutConfig, rollout

    env_id = scenario_env_id(scenario)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = dict(env_kwargs or {})
    cfg = RolloutConfig(env_id=env_id, episodes=episodes, seed=seed, policy=label, noise=0.0,
                        env_kwargs=env_kwargs, progress=progress)
    metadata = env_metadata(env_id, env_kwargs)
    dt = 1.0 / float(metadata["policy_frequency"])
    finite_route = not SCENARIOS[scenario].open_ended
    write_json(out / "config.json", {**cfg.to_dict(), "video_episodes": videos})
    guards: list[PolicyGuard] = []
    rows: list[dict[str, Any]] = []
    metrics = []
    clips: list[dict[str, Any]] = []
    latencies: list[dict[str, Any]] = []

    def on_episode(ep) -> None:
        rec.add(ep)
        record = guards[0].records.pop(ep.seed, None) if guards else None
        tracker = EpisodeTracker(dt, finite_route=finite_route, start_info=ep.reset_info)
        for info, truncated in zip(ep.infos, ep.truncated, strict=True):
            tracker.update(info, bool(truncated))
        m = tracker.result(failure=record.failure if record is not None else None)
        metrics.append(m)
        row = {"scenario": scenario, "episode": ep.index, "seed": ep.seed, **m.to_dict()}
        if m.scenes:  # each NAVSIM sub-score's mean over the episode's scenes (index.html shows them)
            row.update({f"pdm_{k}": v for k, v in mean_scores(m.scenes).items() if k in SUBSCORES})
        probe = getattr(guards[0].inner, "episode_stats", None) if guards else None
        if callable(probe):
            with contextlib.suppress(Exception):  # diagnostics never fail an episode
                stats = probe()
                latencies.append(stats)
                row.update({k: stats[k] for k in ("latency_ms_p50", "latency_ms_p99", "held_steps") if k in stats})
        rows.append(row)
        if ep.index < videos and "image" in ep.obs:
            from core.data.video import write_mp4
            from driving.report import overlay_frames

            rel = f"videos/episode_{ep.index}.mp4"
            frames = overlay_frames(ep.obs["image"], record.overlays if record is not None else None, m.failure)
            write_mp4(out / rel, frames, fps=1.0 / dt)
            clips.append({"episode": ep.index, "seed": ep.seed, "path": rel, "driving_score": m.driving_score,
                          "failure": m.failure})

    with EpisodeRecorder(out, env_id, metadata, env_kwargs, video=False) as rec:
        rollout(cfg, policy=guarded_factory(factory, label, guards), on_episode=on_episode)
    rows.sort(key=lambda r: r["episode"])
    clips.sort(key=lambda c: c["episode"])
    result = {"scenario": scenario, "env_id": env_id, "aggregate": aggregate(metrics), "episodes": rows,
              "videos": clips, "latency": latency_summary(latencies), "latency_stats": latencies}
    write_text(out / "episodes.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write_json(out / "metrics.json", result)
    return result


def evaluate_policy(policy: str | Callable, scenario: str | Sequence[str] = "highway", episodes: int = 5,
                    out: str | Path = "outputs/drive", seed: int = 0, video: bool = True, videos: int = 2,
                    policy_args: Mapping[str, Any] | None = None, env_kwargs: Mapping[str, Any] | None = None,
                    progress: bool = True, api_key_file: str | None = None, replan_steps: int | None = None,
                    realtime: bool = False) -> dict[str, Any]:
    """Run and score ``episodes`` episodes of each scenario into ``out`` (layout in the module docstring).

    Args:
        policy: ``idm`` | ``expert`` | ``constant`` | ``random`` | ``scripted`` | a ``POLICIES`` name | a checkpoint
            path | ``ws://HOST:PORT``, or a factory callable ``(env, **policy_args) -> Policy``, resolved by
            ``sim.policies.resolve_policy`` (the resolver ``sim rollout`` and ``libero eval`` use).
        scenario: A scenario name, ``"all"``, or a list of names.
        episodes: Episodes per scenario; episode ``j`` uses seed ``seed + j``.
        out: The run folder (written directly; the CLI claims it first with ``claim_output``).
        video: Record videos at all; ``videos``: how many (the first K episodes of each scenario).
        policy_args: Keyword arguments of the policy factory.
        env_kwargs: Extra ``gym.make`` keyword arguments (e.g. ``{"horizon_s": 5.0}``).
        api_key_file, replan_steps: For a served policy (``ws://HOST:PORT``, ``sim.remote``).
        realtime: Simulated real time (``sim.remote``): each request's latency costs control periods (0.2 s)
            in which the car goes on with the current plan, then holds its last action.

    Returns:
        ``{"policy", "policy_args", "seed", "n_episodes" (per scenario), "env_id" (or "all"), "scenarios":
        {name: evaluate_scenario's result}, "aggregate": over all episodes, "episodes": all rows (each with its
        "scenario")}``.
    """
    import sim
    from sim.driving.metrics import EpisodeMetrics, ability_table, aggregate
    from sim.driving.pdm import NOT_COMPUTABLE

    if not isinstance(episodes, int) or episodes < 1:
        raise ConfigError(f"--episodes: must be an integer >= 1, got {episodes!r}")
    if videos < 0:
        raise ConfigError(f"--videos: must be >= 0, got {videos}")
    names = scenario_list(scenario)
    sim.register_envs()
    policy_args = dict(policy_args or {})
    from sim.policies import resolve_policy

    resolved = resolve_policy(policy, policy_args, api_key_file=api_key_file, replan_steps=replan_steps,
                              realtime=realtime)
    factory, label = resolved.factory, resolved.label
    if not realtime and resolved.kind != "remote":
        factory = functools.partial(_probed, factory=factory)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n_videos = videos if video else 0
    write_json(out / "config.json", {"policy": label, "policy_args": policy_args, "scenarios": names,
                                     "episodes": episodes, "seed": seed, "videos": n_videos, "realtime": realtime,
                                     "replan_steps": replan_steps,
                                     "env_kwargs": dict(env_kwargs or {})})
    results = {}
    for name in names:
        results[name] = evaluate_scenario(factory, label, name, episodes, out / name, seed=seed, videos=n_videos,
                                          env_kwargs=env_kwargs, progress=progress)
        for clip in results[name]["videos"]:
            clip["path"] = f"{name}/{clip['path']}"  # relative to the run folder
    fields = set(EpisodeMetrics.__dataclass_fields__)
    all_rows = [r for res in results.values() for r in res["episodes"]]
    overall = aggregate(EpisodeMetrics(**{k: v for k, v in r.items() if k in fields}) for r in all_rows)
    latency = latency_summary([s for r in results.values() for s in r["latency_stats"]])
    abilities = ability_table({n: [bool(row["success"]) for row in r["episodes"]] for n, r in results.items()})
    report = {"policy": label, "policy_args": policy_args, "seed": seed, "n_episodes": episodes,
              "env_id": results[names[0]]["env_id"] if len(names) == 1 else "all",
              "scenarios": results, "aggregate": overall, "episodes": all_rows, "realtime": realtime,
              "latency": latency, "abilities": abilities, "not_computable": dict(NOT_COMPUTABLE)}
    write_json(out / "summary.json", {
        "policy": label, "policy_args": policy_args, "seed": seed, "episodes": episodes,
        "scenarios": {n: {"env_id": r["env_id"], "aggregate": r["aggregate"], "latency": r["latency"],
                          "videos": [c["path"] for c in r["videos"]]} for n, r in results.items()},
        "overall": overall, "realtime": realtime, "latency": latency, "abilities": abilities,
        "not_computable": dict(NOT_COMPUTABLE),
    })
    from driving.report import write_reports

    write_reports(out, report)
    return report


def drive_eval(args) -> int:
    """CLI entry (``embodied drive eval``)."""
    from core.bootstrap import prepare_process

    prepare_process()
    from core.outputs import claim_output
    from sim.policies import parse_policy_args, resolve_policy

    policy_args = parse_policy_args(getattr(args, "policy_arg", None))
    names = scenario_list(args.scenario)  # bad input fails before the folder is claimed
    remote = dict(api_key_file=getattr(args, "api_key_file", None), replan_steps=getattr(args, "replan_steps", None),
                  realtime=bool(getattr(args, "realtime", False)))
    resolve_policy(args.policy, policy_args, **remote)
    env_kwargs = {"horizon_s": args.horizon_s} if getattr(args, "horizon_s", None) else None
    with claim_output(args.out, command="drive eval", overwrite=getattr(args, "overwrite", False)) as out:
        report = evaluate_policy(args.policy, names if len(names) > 1 else names[0], args.episodes, out,
                                 seed=args.seed, video=not args.no_video, videos=args.videos,
                                 policy_args=policy_args, env_kwargs=env_kwargs, **remote)
    if getattr(args, "json", False):  # every figure, as summary.json holds it (fractions), on stdout
        from core.io import to_jsonable

        print(json.dumps(to_jsonable(json.loads((Path(args.out) / "summary.json").read_text())), indent=1))
        return 0
    from driving.report import stdout_table

    print(f"policy {report['policy']}, seeds {args.seed}..{args.seed + args.episodes - 1} "
          f"(scores and rates in %; summary.json holds them as fractions; --json prints every figure)")
    print(stdout_table(report))
    for name, res in report["scenarios"].items() if report.get("realtime") else ():
        lat = res.get("latency") or {}
        if lat:
            print(f"{name}: under simulated real time, {lat.get('held_steps', 0)} steps held the last action "
                  f"over {lat['requests']} requests")
    print(f"-> {args.out}/index.html, {args.out}/summary.json")
    return 0
