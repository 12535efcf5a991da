"""``embodied train bc`` / ``embodied eval bc``: the task functions, separate from the CLI.

train: (record scripted-expert rollouts if the data is missing) -> TrajectoryDataset -> normalisation
stats -> BCPolicyModel -> core Trainer -> checkpoint whose config.json holds the resolved model dims.
evaluate: closed-loop rollouts of the checkpoint in the simulator, with the scripted expert and the
random policy on the same seeds as baselines; writes ``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from core.config import (
    EnvConfig,
    RecordConfig,
    TrainerConfig,
    TrajectoryDataConfig,
    save_resolved,
    to_container,
    to_object,
)
from core.errors import DataError
from core.io import write_json
from core.logging import get_logger
from worldmodels.bc.configuration_bc import BCConfig

log = get_logger("embodied.bc")


def ensure_data(data: TrajectoryDataConfig) -> list[Path]:
    """The data files, recording a missing one with the simulator first when ``data.record`` allows.

    Recording goes through ``sim.recorder.ensure_recorded``: the file is recorded once (concurrent runs wait
    for it), its ``data.record`` settings are kept beside it, and a file recorded with other settings is refused.
    Files nobody recorded here (no spec beside them) are used as they are.
    """
    from core.data.trajectories import expand_data_paths

    paths = expand_data_paths(data.paths)  # a folder but a LeRobot dataset: its *.hdf5 (a LIBERO suite)
    if not paths:
        raise DataError("data.paths", "no trajectory files configured")
    missing = [p for p in paths if not p.exists()]
    rec: RecordConfig = data.record
    if rec.episodes < 1 or rec.env_id is None:
        if missing:
            raise DataError(missing[0], "no such file (set data.record.env_id and data.record.episodes to record it)")
        return paths
    if len(missing) > 1:
        raise DataError(missing[1], "no such file (data.record records one missing file at a time)")
    from sim.recorder import ensure_recorded, record_rollout
    from sim.rollout import RolloutConfig

    cfg = RolloutConfig(env_id=rec.env_id, episodes=rec.episodes, seed=rec.seed, policy=rec.policy,
                        noise=rec.noise, env_kwargs=rec.env_kwargs())
    spec = {k: v for k, v in cfg.to_dict().items() if k not in ("num_envs", "vectorization", "progress")}

    def record(staging: Path) -> Path:
        log.info("recording %d %s episodes of %s into %s", rec.episodes, rec.policy, rec.env_id, missing[0])
        return Path(record_rollout(cfg, staging, video=False).summary["hdf5"])

    for p in paths:
        ensure_recorded(p, spec, record, hint="set a new data.paths entry, or delete it to record it again")
    return paths


def recorded_camera(path: Path) -> str | None:
    """The camera a file (or LeRobot folder) was recorded with (``env_args.env_kwargs.camera``; None: default)."""
    from core.data.trajectories import open_trajectories

    with open_trajectories(path) as f:
        kwargs = f.env_meta.get("env_kwargs")
    return kwargs.get("camera") if isinstance(kwargs, dict) else None


def check_camera(paths: list[Path], env: EnvConfig) -> None:
    """Refuse data seen through another camera than the one closed-loop evaluation will render.

    Data that names no simulator settings (no ``env_kwargs``: a LeRobot dataset LeRobot wrote, e.g. of a real
    robot) has no camera of this workspace's envs to compare, and passes.
    """
    from core.data.trajectories import open_trajectories
    from core.errors import ConfigError

    for p in paths:
        with open_trajectories(p) as f:
            simulated = isinstance(f.env_meta.get("env_kwargs"), dict)
        if not simulated:
            continue
        cam = recorded_camera(p)
        if (cam or "default") != (env.camera or "default"):
            raise ConfigError(f"{p} was recorded with camera {cam or 'default'!r} but env.camera is "
                              f"{env.camera or 'default'!r}: the policy would be evaluated on another view "
                              "(record again, or set env.camera to match)")


def resolve_data_keys(model_cfg: BCConfig, paths: list[Path]) -> BCConfig:
    """``model_cfg`` with its image and proprio keys fitted to the data (``core.data.trajectories.data_keys`` of
    the first path).

    A key the data has is kept. A key left at its default (``image`` / ``proprio``) that the data lacks is taken
    from what the data states about itself, a LeRobot folder's ``meta/info.json``: its first camera feature (one
    that is not ``wrist_image_key``) and the keys of its ``observation.state``; one log line names the choice,
    and with several cameras the others and how to pick one. Nothing is guessed from key names or shapes.

    Raises:
        ConfigError: A key the data lacks that was set explicitly, or that the data states no replacement for;
            the message lists the data's cameras and obs keys.
    """
    from core.data.trajectories import data_keys
    from core.errors import ConfigError

    keys = data_keys(paths[0])
    default = BCConfig()
    changes: dict[str, Any] = {}
    if model_cfg.image_key not in keys.obs:
        cams = [c for c in keys.cameras if c != model_cfg.wrist_image_key]
        if model_cfg.image_key != default.image_key or not keys.stated or not cams:
            raise ConfigError(f"model.image_key={model_cfg.image_key!r} is not an obs key of {paths[0]} "
                              f"(cameras: {', '.join(keys.cameras) or 'none'}; obs keys: {', '.join(keys.obs)})")
        changes["image_key"] = cams[0]
    if model_cfg.proprio_key not in keys.obs:
        if (model_cfg.proprio_key != default.proprio_key or model_cfg.extra_proprio_keys or not keys.stated
                or not keys.state):
            raise ConfigError(f"model.proprio_key={model_cfg.proprio_key!r} is not an obs key of {paths[0]} "
                              f"(state: {', '.join(keys.state) or 'not stated'}; obs keys: {', '.join(keys.obs)})")
        changes["proprio_key"], changes["extra_proprio_keys"] = keys.state[0], list(keys.state[1:])
    if changes:
        cam = changes.get("image_key", model_cfg.image_key)
        state = [changes.get("proprio_key", model_cfg.proprio_key),
                 *changes.get("extra_proprio_keys", model_cfg.extra_proprio_keys)]
        more = [c for c in keys.cameras if c not in (cam, model_cfg.wrist_image_key)]
        log.info("data keys from %s: camera %r, state %s%s", keys.source, cam, " + ".join(map(repr, state)),
                 f" (other cameras: {', '.join(more)}; model.image_key=NAME picks one)" if more else "")
    return dataclasses.replace(model_cfg, **changes)


def normalization_stats(paths: list[Path], proprio_key: str | list[str]) -> dict[str, np.ndarray]:
    """Per-dim mean / std of actions and proprio (the keys concatenated) over every step of every episode."""
    from core.data.trajectories import open_trajectories

    keys = [proprio_key] if isinstance(proprio_key, str) else list(proprio_key)
    actions, proprio = [], []
    for p in paths:
        with open_trajectories(p) as f:
            for name in f.episodes:
                ep = f.episode(name, keys=["actions", *(f"obs/{k}" for k in keys)])
                actions.append(ep["actions"])
                proprio.append(np.concatenate([np.asarray(ep[f"obs/{k}"], np.float64).reshape(len(ep["actions"]), -1)
                                               for k in keys], -1))
    a, q = np.concatenate(actions), np.concatenate(proprio)
    return {"action_mean": a.mean(0), "action_std": a.std(0), "proprio_mean": q.mean(0), "proprio_std": q.std(0)}


def train(cfg) -> dict[str, Any]:
    """Train the BC policy under the composed config ``cfg`` (see configs/experiment/bc.yaml)."""
    from core.data.trajectories import TrajectoryDataset
    from core.trainer import Trainer, seed_everything
    from worldmodels.bc.modeling_bc import BCPolicyModel

    model_cfg: BCConfig = to_object(cfg.model)
    data_cfg: TrajectoryDataConfig = to_object(cfg.data)
    trainer_cfg: TrainerConfig = to_object(cfg.trainer)
    paths = ensure_data(data_cfg)
    check_camera(paths, to_object(cfg.env))
    model_cfg = resolve_data_keys(model_cfg, paths)
    obs_keys = [*model_cfg.image_keys, *model_cfg.proprio_keys]
    dataset = TrajectoryDataset(paths, obs_keys=obs_keys, horizon=model_cfg.horizon, frame_stack=1,
                                stride=data_cfg.stride, filter_key=data_cfg.filter_key, on_error=data_cfg.on_error,
                                cache=data_cfg.cache)
    sample = dataset[0]
    model_cfg = dataclasses.replace(model_cfg, action_dim=int(sample["actions"].shape[-1]),
                                    proprio_dim=sum(int(sample[f"obs.{k}"].shape[-1]) for k in model_cfg.proprio_keys),
                                    image_convention=data_image_convention(dataset, model_cfg.image_convention))
    texts, embeddings = None, None
    if model_cfg.language:
        texts = task_texts(dataset)
        encoder = load_text_encoder(model_cfg.text_encoder)
        embeddings = encoder.encode(texts)
        model_cfg = dataclasses.replace(model_cfg, task_texts=texts, text_dim=int(embeddings.shape[-1]))
        dataset = TaskIndexed(dataset, texts)
        log.info("language-conditioned on %d tasks (%s, %d-d)", len(texts), encoder.source, model_cfg.text_dim)
    seed_everything(trainer_cfg.seed)
    model = BCPolicyModel(model_cfg)
    model.set_normalization(normalization_stats(paths, model_cfg.proprio_keys))
    if embeddings is not None:
        model.set_task_embeddings(embeddings)
    run_config = to_container(cfg)
    run_config["model"] = dataclasses.asdict(model_cfg)  # the dims the weights were built with
    out_dir = Path(cfg.out_dir)
    save_resolved(run_config, out_dir)
    result = Trainer(model, dataset, trainer_cfg, out_dir, run_config=run_config,
                     collate_fn=_collate).fit()
    log.info("trained on %d windows from %d episodes; final %s", len(dataset), len(dataset.episodes), result["metrics"])
    return {"step": result["step"], "loss": result["metrics"].get("loss"), "checkpoint": str(result["checkpoint"])}


def data_image_convention(dataset, configured: str | None) -> str | None:
    """The convention of the frames the model trains on, for its config: the dataset's (``rot180`` for LIBERO
    data), else ``configured`` (``model.image_convention``, for data that states none).

    Raises:
        ConfigError: ``configured`` contradicts what the data states.
    """
    from core.data.image_convention import same
    from core.errors import ConfigError

    found = dataset.image_convention
    if found is not None and configured is not None and not same(found, configured):
        raise ConfigError(f"model.image_convention={configured!r}, but the data's frames are in {found!r} "
                          "(leave it unset: it is read from the data)")
    return found or configured


def trained_image_convention(model, env_metadata: dict[str, Any]) -> str | None:
    """The convention of the frames a loaded checkpoint was trained on: its config's ``image_convention``; for a
    checkpoint from before the field (no such key in config.json) on a LIBERO env, ``"flipud"``, what the LIBERO
    env and the loader gave then; otherwise None (unknown: frames are passed as the env gives them)."""
    section = ((getattr(model, "loaded_from", None) or {}).get("config") or {}).get("model") or {}
    if "image_convention" in section:
        return model.config.image_convention
    return "flipud" if env_metadata.get("family") == "libero" else None


class ConvertImages:
    """Observation adapter: the env's image keys from the env's convention to the checkpoint's, then ``then``
    (the env's ``demo_obs`` for a policy trained on demo files) if given. Picklable when ``then`` is."""

    def __init__(self, keys, src: str, dst: str, then=None):
        self.keys, self.src, self.dst, self.then = frozenset(keys), src, dst, then

    def __call__(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from core.data.image_convention import convert

        obs = {k: convert(v, self.src, self.dst) if k in self.keys else v for k, v in obs.items()}
        return self.then(obs) if self.then is not None else obs


def load_text_encoder(path: str | None):
    from core.text import load_text_encoder as load

    return load(path)


def task_texts(dataset) -> list[str]:
    """The distinct instructions of the dataset's episodes, in first-seen order.

    Raises:
        DataError: An episode without a language instruction (a language-conditioned policy needs one each).
    """
    out: list[str] = []
    for ep in dataset.episodes:
        if not ep.language_instruction:
            raise DataError(ep.path, f"{ep.name}: no language instruction (model.language needs one per episode)")
        if ep.language_instruction not in out:
            out.append(ep.language_instruction)
    return out


class TaskIndexed:
    """A ``TrajectoryDataset`` whose samples also hold ``task_index``: their episode's instruction in ``texts``."""

    def __init__(self, dataset, texts: list[str]):
        import torch

        self.dataset = dataset
        index = {t: i for i, t in enumerate(texts)}
        by_episode = np.array([index[ep.language_instruction] for ep in dataset.episodes], dtype=np.int64)
        self._task = torch.from_numpy(by_episode[dataset.sample_episodes()])

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["dataset"], name)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self.dataset[i], "task_index": self._task[i]}

    def __getitems__(self, indices) -> list[dict[str, Any]]:
        return [{**s, "task_index": self._task[i]} for s, i in zip(self.dataset.__getitems__(indices), indices)]


def _collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    from core.trainer import default_collate

    return default_collate(samples)


def make_policy(env: Any, checkpoint: str | Path | None = None):
    """``core.registry.POLICIES`` factory: a ``BCPolicy`` for ``env`` from a checkpoint directory. Without one, a
    LIBERO env gets the shipped libero_spatial policy (``assets/checkpoints/bc_libero``: ``--policy bc`` from any
    folder); other envs need a checkpoint."""
    from core.checkpoint import require_checkpoint
    from sim.api import PolicySpec
    from worldmodels.bc.modeling_bc import BCPolicyModel
    from worldmodels.bc.pipeline_bc import BCPolicy

    base = getattr(env, "unwrapped", env)
    if checkpoint is None and getattr(base, "demo_obs_sources", None):
        from core.resources import asset

        checkpoint = asset("checkpoints", "bc_libero")
    model = BCPolicyModel.from_pretrained(require_checkpoint(checkpoint, "bc"))
    c = model.config
    space = env.action_space
    env_keys = set(getattr(env.observation_space, "spaces", {}) or {})
    wanted = [*c.image_keys, *(c.proprio_keys if c.proprio_dim else [])]
    adapter, sources = None, {k: k for k in wanted}
    if not set(wanted) <= env_keys and set(wanted) <= set(getattr(base, "demo_obs_sources", {})):
        adapter, sources = base.demo_obs, {k: base.demo_obs_sources[k] for k in wanted}  # trained on demo files
    metadata = getattr(base, "metadata", None) or getattr(env, "metadata", None) or {}
    env_convention, trained = metadata.get("image_convention"), trained_image_convention(model, metadata)
    if env_convention and trained:
        from core.data.image_convention import same

        if not same(env_convention, trained):  # e.g. a checkpoint trained on the old flipud LIBERO frames
            spaces = getattr(env.observation_space, "spaces", {}) or {}
            images = [k for k, sp in spaces.items() if len(getattr(sp, "shape", None) or ()) == 3]
            adapter = ConvertImages(images, env_convention, trained, then=adapter)
            log.info("the env gives %s frames, the checkpoint was trained on %s: converting", env_convention, trained)
    text = None
    if c.language:
        text = instruction_embedding(model, metadata)
    policy = BCPolicy(model, space.low, space.high, text=text, obs_adapter=adapter)
    # what the weights were built for, in the env's keys; sim.rollout refuses an env of other spaces first
    side = c.image_size if adapter is not None else None  # demo-file policies: render at the trained size
    observation: dict[str, tuple] = {}
    for k in c.image_keys:
        observation[sources[k]] = (side, side, 3)
    if c.proprio_dim:
        if adapter is None:
            for k in c.proprio_keys:
                observation[k] = (None,) if len(c.proprio_keys) > 1 else (c.proprio_dim,)
        else:
            for k in c.proprio_keys:
                observation.setdefault(sources[k], (None,))
    policy.expects = PolicySpec(observation, (c.action_dim,), source=model.loaded_from["path"],
                                made_for=(model.loaded_from["config"].get("env") or {}).get("id"))
    # here any image side is accepted (the model resizes; LIBERO's evaluation re-renders at the declared
    # side, a rollout checks the full spec before its first step); keys, proprio and actions must fit now
    relaxed = dataclasses.replace(policy.expects, observation={k: (None, None, v[2]) if len(v) == 3 else v
                                                               for k, v in observation.items()})
    relaxed.check(env.observation_space, space, env.spec.id if env.spec else None)
    return policy


def instruction_embedding(model, metadata: dict[str, Any]):
    """The embedding of the env's instruction: from the checkpoint's task table when it holds the text
    (``language_instruction`` or, for LIBERO, the demo files' ``bddl_language``), else encoded anew with
    the model's text encoder.

    Raises:
        ConfigError: The env names no instruction.
    """
    from core.errors import ConfigError

    texts = [metadata.get(k) for k in ("language_instruction", "bddl_language") if metadata.get(k)]
    if not texts:
        raise ConfigError("this BC policy is language-conditioned but the env gives no language_instruction")
    for t in texts:
        i = model.task_index(t)
        if i is not None:
            return model.task_embeddings[i]
    log.info("instruction %r is not among the %d trained tasks: encoding it", texts[0], len(model.config.task_texts))
    return load_text_encoder(model.config.text_encoder).encode([texts[0]])[0]


def evaluate(cfg) -> dict[str, Any]:
    """Closed-loop success of the checkpoint vs the configured baselines, on identical seeds."""
    from core.checkpoint import resolve_checkpoint
    from sim.rollout import RolloutConfig, rollout

    env_cfg: EnvConfig = to_object(cfg.env)
    ckpt = resolve_checkpoint(cfg.eval.checkpoint or cfg.out_dir)
    rows: dict[str, Any] = {}
    for name in [str(ckpt), *cfg.eval.baselines]:
        rc = RolloutConfig(env_id=env_cfg.id, episodes=env_cfg.episodes, num_envs=env_cfg.num_envs, seed=env_cfg.seed,
                           policy=name, env_kwargs=env_cfg.env_kwargs(),
                           max_episode_steps=env_cfg.max_episode_steps, progress=True)
        summary = rollout(rc).summary
        key = "bc" if name == str(ckpt) else name
        rows[key] = {k: summary[k] for k in ("success_rate", "mean_return", "mean_length", "failures")}
        log.info("%s on %s: success %.2f", key, env_cfg.id, summary["success_rate"])
    result = {"env": env_cfg.id, "episodes": env_cfg.episodes, "seed": env_cfg.seed, "checkpoint": str(ckpt),
              "policies": rows}
    write_json(Path(cfg.out_dir) / "eval.json", result)
    return result
