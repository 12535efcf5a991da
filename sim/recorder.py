"""Record rollouts to disk: HDF5 trajectories, mp4 videos, the summary and the resolved config.

Output folder layout::

    <out>/<env_id sanitized>.hdf5     robomimic / LIBERO layout via core.data.trajectories.TrajectoryWriter
    <out>/videos/episode_<i>.mp4      the ``image`` stream of episode i (H.264, 20 fps by default)
    <out>/summary.json                sim.rollout summary (success rate, returns, lengths, failures)
    <out>/config.json                 the resolved RolloutConfig (+ recorder options)

Per episode ``data/demo_<i>`` (``i`` = episode index, env seed = config seed + i):
    obs/<key>       (T, ...) observations before each action (``image`` (T, H, W, 3) uint8, ``proprio``)
    obs/eef_delta   (T, 6) float32 end-effector motion caused by each action: dx, dy, dz (m) and an
                    axis-angle rotation (rad), world frame (the LAC-WM motion label)
    next_obs/<key>  (T, ...) observations after each action (so the last frame is kept), for every obs key;
                    next_obs/eef_delta[t] = obs/eef_delta[t + 1], the motion of the next action, and zeros
                    after the last action (no motion follows it)
    actions (T, A), rewards (T,), dones (T,) (1 where the episode terminated or was truncated)
    attrs: embodiment, task, family, action_space (dict), success (bool), seed, failure (str, "" if
           none), language_instruction
Every file is published atomically (temp file + rename).

``ensure_recorded(path, spec, record)`` is the one "record the dataset if it is missing" of the workspace: it
records ``path`` once (under a lock, so concurrent callers record it once), keeps the settings it was recorded
with in ``<path>.spec.json`` beside it, and refuses to reuse data recorded with other settings.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import DataError
from core.io import fsync_dir, read_json, to_jsonable, write_json
from sim.api import INFO_EEF_DELTA
from sim.rollout import Episode, PolicyFactory, RolloutConfig, RolloutResult, check_env_id, rollout

VIDEO_KEY = "image"


def sanitize_env_id(env_id: str) -> str:
    """File-name-safe env id: ``embodied/Lift-Panda-v0`` -> ``embodied_Lift-Panda-v0``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", env_id).strip("_")


def env_metadata(env_id: str, env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``sim.api`` metadata of a registered env (builds it once, then closes it)."""
    import gymnasium as gym

    check_env_id(env_id)
    env = gym.make(env_id, **(env_kwargs or {}))
    try:
        return dict(env.unwrapped.metadata)
    finally:
        env.close()


class EpisodeRecorder:
    """Stream finished episodes into one HDF5 file and optional mp4s (use as a context manager).

    Args:
        out: Output folder.
        env_id: The env the episodes come from (names the HDF5 file).
        metadata: That env's ``metadata`` dict (``sim.api``).
        env_kwargs: Keyword arguments the env was made with (stored in ``env_args``).
        video: Write ``videos/episode_<i>.mp4`` from the ``image`` observations.
        fps: Video frame rate.
    """

    def __init__(
        self,
        out: str | Path,
        env_id: str,
        metadata: dict[str, Any],
        env_kwargs: dict[str, Any] | None = None,
        video: bool = True,
        fps: float = 20.0,
    ):
        from core.data.trajectories import TrajectoryWriter

        self.out = Path(out)
        self.env_id = env_id
        self.metadata = metadata
        self.video = video
        self.fps = fps
        self.path = self.out / f"{sanitize_env_id(env_id)}.hdf5"
        env_meta = {
            "env_name": env_id,
            "env_type": metadata.get("family", ""),
            "env_kwargs": dict(env_kwargs or {}),
            "embodiment": metadata.get("embodiment"),
            "task": metadata.get("task"),
            "action_space_desc": metadata.get("action_space_desc"),
            "proprio_desc": metadata.get("proprio_desc"),
            **({"image_convention": metadata["image_convention"]} if metadata.get("image_convention") else {}),
        }
        self._writer = TrajectoryWriter(
            self.path, env_meta=env_meta, language_instruction=metadata.get("language_instruction")
        )
        self.video_paths: list[Path] = []
        self._pending: dict[int, Episode] = {}
        self._next = 0

    def add(self, episode: Episode) -> None:
        """Queue a finished episode; episodes are written in index order (``demo_<i>`` = episode i)."""
        self._pending[episode.index] = episode
        while self._next in self._pending:
            self.write(self._pending.pop(self._next))
            self._next += 1

    def write(self, episode: Episode) -> str:
        """Write one episode now; returns its HDF5 group name."""
        T = len(episode)
        obs = {k: v[:T] for k, v in episode.obs.items()}
        next_obs = {k: v[1 : T + 1] for k, v in episode.obs.items()}
        eef = episode.eef_delta.astype(np.float32)
        obs[INFO_EEF_DELTA] = eef
        next_obs[INFO_EEF_DELTA] = np.concatenate([eef[1:], np.zeros_like(eef[:1])])
        dones = (episode.terminated | episode.truncated).astype(np.uint8)
        meta = self.metadata
        name = self._writer.add_episode(
            obs,
            episode.actions,
            rewards=episode.rewards,
            dones=dones,
            next_obs=next_obs,
            attrs={
                "embodiment": meta.get("embodiment", ""),
                "task": meta.get("task", ""),
                "family": meta.get("family", ""),
                "action_space": meta.get("action_space_desc", {}),
                "success": episode.solved,
                "seed": episode.seed,
                "episode_index": episode.index,
                "failure": episode.failure or "",
                "language_instruction": meta.get("language_instruction") or "",
            },
        )
        if self.video and VIDEO_KEY in episode.obs:
            from core.data.video import write_mp4

            path = self.out / "videos" / f"episode_{episode.index}.mp4"
            write_mp4(path, episode.obs[VIDEO_KEY], fps=self.fps)
            self.video_paths.append(path)
        return name

    def close(self) -> None:
        """Write any queued episodes and publish the HDF5 file."""
        for index in sorted(self._pending):
            self.write(self._pending.pop(index))
        self._writer.close()

    def __enter__(self) -> EpisodeRecorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._writer.__exit__(exc_type, exc, tb)


def record_rollout(config: RolloutConfig, out: str | Path, video: bool = True, fps: float = 20.0,
                   policy: PolicyFactory | None = None) -> RolloutResult:
    """Run ``sim.rollout.rollout`` and write everything to ``out`` (layout in the module docstring).

    Episodes are streamed to the HDF5 file as they finish, in index order (``demo_<i>`` is episode i).
    """
    check_env_id(config.env_id)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metadata = env_metadata(config.env_id, config.env_kwargs)
    write_json(out / "config.json", {**config.to_dict(), "video": video, "fps": fps})
    with EpisodeRecorder(out, config.env_id, metadata, config.env_kwargs, video=video, fps=fps) as rec:
        result = rollout(config, policy=policy, on_episode=rec.add)
    summary = {
        **result.summary,
        "env_id": config.env_id,
        "embodiment": metadata.get("embodiment"),
        "task": metadata.get("task"),
        "family": metadata.get("family"),
        "hdf5": rec.path.name,
        "videos": [p.name for p in rec.video_paths],
    }
    write_json(out / "summary.json", summary)  # file names relative to the folder: it may be moved (staged)
    result.summary = {**summary, "hdf5": str(rec.path), "videos": [str(p) for p in rec.video_paths]}
    return result


# ------------------------------------------------------------------------------------ record if missing
SPEC_SUFFIX = ".spec.json"
_STAGING = ".recording-"  # staging folders: .<name>.recording-<pid>-<random>


def spec_path(path: str | os.PathLike) -> Path:
    """Where ``ensure_recorded`` keeps the spec of ``path``: ``<path>.spec.json`` beside it."""
    path = Path(path)
    return path.with_name(path.name + SPEC_SUFFIX)


def recorded_spec(path: str | os.PathLike) -> dict[str, Any] | None:
    """The spec ``path`` was recorded with by ``ensure_recorded``; None when it has none (e.g. a user's data).

    Raises:
        DataError: The spec file exists but is not a JSON object of the expected layout.
    """
    file = spec_path(path)
    if not file.is_file():
        return None
    try:
        stored = read_json(file)
    except ValueError as e:
        raise DataError(file, f"unreadable ({e}); delete it and {Path(path).name} to record again") from None
    if not isinstance(stored, dict) or not isinstance(stored.get("spec"), dict):
        raise DataError(file, "not a recording spec (expected {\"spec\": {...}})")
    return stored["spec"]


def ensure_recorded(
    path: str | os.PathLike,
    spec: dict[str, Any],
    record: Callable[[Path], str | os.PathLike | None],
    *,
    check_unrecorded: Callable[[Path], None] | None = None,
    hint: str | None = None,
    wait: float = 3600.0,
) -> bool:
    """Make sure ``path`` (a data file or folder) holds the data ``spec`` describes, recording it when missing.

    * ``path`` missing: ``record(staging)`` records into ``staging``, an empty hidden folder beside ``path``,
      and returns the file or folder inside it that is the data (None: ``staging`` itself is). The spec is
      written (``<path>.spec.json``, atomically) and then the data is renamed onto ``path``, so the data
      appears only when complete and never without its spec: a recording killed halfway leaves only a
      hidden staging folder, which the next call removes before recording again.
    * ``path`` exists with a spec: reused when the spec equals ``spec`` (compared as JSON), else refused.
    * ``path`` exists without a spec (data a user brought, or recorded before specs were kept): reused as it
      is, after ``check_unrecorded(path)`` (which raises to refuse it) when given. Nothing is written there.

    Concurrent callers (processes or threads) are safe: one records under the lock of ``path``
    (``core.distributed.main_process_first``), the others wait up to ``wait`` seconds and then reuse its data
    (or raise a one-line ``DataError`` naming the recorder's error, when it failed).

    Args:
        path: The data file or folder.
        spec: JSON-serialisable settings that determine the data (env id, episodes, seeds, image size, ...).
        record: Records the data into the folder it is given; returns the data's path inside it (or None).
        check_unrecorded: Validates existing data that has no spec.
        hint: How to fix a mismatch, ending the error (default: use a new path, or delete the data).
        wait: Seconds to wait for another process that is recording ``path``.

    Returns:
        True when the data was recorded by this call, False when existing data was reused.

    Raises:
        DataError: ``path`` was recorded with another spec (the message names the differing keys), or
            ``record`` produced nothing.
    """
    from core.distributed import main_process_first
    from core.outputs import pid_alive

    path = Path(path).absolute()
    if not isinstance(spec, dict):
        raise TypeError(f"spec must be a dict, got {type(spec).__name__}")
    want = to_jsonable(spec)  # as JSON round-trips it (tuples -> lists, paths -> str, numpy scalars -> numbers)
    with main_process_first(path.with_name(path.name + ".recording"), wait=wait):
        if path.exists():
            _check_spec(path, want, check_unrecorded, hint)
            return False
        for stale in path.parent.glob(f".{path.name}{_STAGING}*"):  # left by a killed recording
            pid = stale.name[len(f".{path.name}{_STAGING}"):].split("-", 1)[0]
            if not (pid.isdigit() and pid_alive(int(pid))):
                shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}{_STAGING}{os.getpid()}-", dir=path.parent))
        try:
            produced = record(staging)
            data = staging if produced is None else Path(produced)
            if not data.exists() or (data != staging and staging not in data.absolute().parents):
                raise DataError(path, f"recording produced no data at {data} (expected inside {staging})")
            if data.is_dir():
                fsync_dir(data)
            write_json(spec_path(path), {"spec": want, "data": path.name})
            if path.exists():  # recorded meanwhile by a caller that did not share our lock
                _check_spec(path, want, check_unrecorded, hint)
                return False
            os.replace(data, path)
            fsync_dir(path.parent)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return True


def _check_spec(path: Path, want: dict[str, Any], check_unrecorded: Callable[[Path], None] | None,
                hint: str | None) -> None:
    """Refuse existing data at ``path`` recorded with another spec than ``want`` (see ``ensure_recorded``)."""
    have = recorded_spec(path)
    if have is None:
        if check_unrecorded is not None:
            check_unrecorded(path)
        return
    if have == want:
        return
    missing = object()
    diffs = []
    for key in sorted(set(have) | set(want)):
        a, b = have.get(key, missing), want.get(key, missing)
        if a != b:
            diffs.append(f"{key} {_short(a, missing)} (asked {_short(b, missing)})")
    fix = hint or f"use a new path, or delete it and {spec_path(path).name} to record it again"
    raise DataError(path, f"recorded with other settings: {', '.join(diffs)}; {fix}")


def _short(value: Any, missing: object, limit: int = 40) -> str:
    text = "unset" if value is missing else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
