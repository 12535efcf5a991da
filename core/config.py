"""Typed configs: dataclass schemas registered in Hydra's ConfigStore, YAML under ``configs/`` overrides.

Every schema's defaults are the values its paper uses; ``__post_init__`` validates ranges and choices.
Schemas are registered as Hydra structured configs, so an unknown or misspelt key — in a YAML file or a
command-line override — fails with a ``ConfigError`` that names the key and suggests close matches.

Layout of the config tree (``configs/``)::

    config.yaml            root: defaults list + run-level keys (method, out_dir)
    model/ data/ env/ trainer/ experiment/ debug/     groups (debug=tiny shrinks everything)

Typical use::

    cfg = compose(["experiment=bc", "debug=tiny", "trainer.max_steps=5"])
    trainer_cfg = to_object(cfg.trainer)          # a validated TrainerConfig
    save_resolved(cfg, out_dir)                   # out_dir/config.yaml and config.json, atomically
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import ConfigError
from core.io import write_json, write_text

_PRECISIONS = ("auto", "fp32", "bf16")
_OPTIMIZERS = ("adamw", "adam", "sgd")
_SCHEDULES = ("constant", "cosine", "linear")
_STRATEGIES = ("auto", "ddp", "fsdp")


@dataclass
class OptimConfig:
    """Optimizer. ``param_group_lrs`` maps a parameter-group name (the model's ``param_groups``) to its lr."""

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    momentum: float = 0.9
    param_group_lrs: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        choice("optim.name", self.name, _OPTIMIZERS)
        _positive("optim.lr", self.lr)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {list(self.betas)}")
        for k, v in self.param_group_lrs.items():
            _positive(f"optim.param_group_lrs.{k}", v)


@dataclass
class SchedulerConfig:
    """Learning-rate schedule: linear warm-up over ``warmup_steps``, then ``name`` down to ``min_lr_ratio``."""

    name: str = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0

    def __post_init__(self):
        choice("scheduler.name", self.name, _SCHEDULES)
        if self.warmup_steps < 0:
            raise ConfigError(f"scheduler.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"scheduler.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass
class TrainerConfig:
    """The shared trainer (core/trainer.py).

    Batch sizes are per process; the global batch is ``batch_size * grad_accum * world_size``.
    """

    max_steps: int = 1000
    batch_size: int = 8
    grad_accum: int = 1
    grad_clip: float | None = 1.0
    precision: str = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_workers: int = 0
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    ema_decay: float | None = None
    ckpt_every: int = 500
    keep_last: int = 2
    log_every: int = 10
    tensorboard: bool = True
    progress: bool = True
    resume: bool = True
    gradient_checkpointing: bool = False
    # auto: DDP under torchrun with > 1 process, else one process. ddp: the same, spelled out. fsdp: FSDP2
    # (torch fully_shard) -- parameters, gradients and optimizer state sharded over the processes.
    strategy: str = "auto"
    fsdp_reshard_after_forward: bool = True  # free each unit's gathered weights after its forward (ZeRO-3)
    # Class names of the submodules sharded as separate units (e.g. [LlamaDecoderLayer]); null: the model's
    # fsdp_units() when it has one, else every element of an nn.ModuleList (transformer blocks).
    fsdp_wrap: list[str] | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self):
        for key in ("max_steps", "batch_size", "grad_accum", "ckpt_every", "log_every", "keep_last"):
            if getattr(self, key) < 1:
                raise ConfigError(f"trainer.{key} must be >= 1, got {getattr(self, key)}")
        if self.num_workers < 0:
            raise ConfigError(f"trainer.num_workers must be >= 0, got {self.num_workers}")
        choice("trainer.precision", self.precision, _PRECISIONS)
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"trainer.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"trainer.grad_clip must be > 0 or null, got {self.grad_clip}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ConfigError(f"trainer.ema_decay must be in (0, 1) or null, got {self.ema_decay}")
        choice("trainer.strategy", self.strategy, _STRATEGIES)
        if self.strategy == "fsdp" and self.ema_decay is not None:
            raise ConfigError("trainer.ema_decay is not supported with trainer.strategy=fsdp (the EMA would be a "
                              "full unsharded copy on every rank); set trainer.ema_decay=null")
        # OmegaConf.to_object builds nested dataclasses first, but a plain constructor call with
        # dicts (tests, scripts) should work too.
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)
        if isinstance(self.scheduler, dict):
            self.scheduler = SchedulerConfig(**self.scheduler)


@dataclass
class RecordConfig:
    """How to make missing trajectory data by rolling out a policy in the simulator (``sim.recorder``)."""

    env_id: str | None = None
    episodes: int = 0  # 0: never record; a missing file is then an error
    policy: str = "scripted"
    noise: float = 0.05
    seed: int = 0
    image_size: int = 64
    camera: str | None = None  # the env's default camera when None (manipulation: agentview; or "workspace")

    def env_kwargs(self) -> dict:
        """Keyword arguments of the recording env."""
        return {"image_size": self.image_size, **({"camera": self.camera} if self.camera else {})}


@dataclass
class TrajectoryDataConfig:
    """``core.data.trajectories.TrajectoryDataset`` over robomimic / LIBERO HDF5 files."""

    paths: list[str] = field(default_factory=list)
    obs_keys: list[str] = field(default_factory=lambda: ["image", "proprio"])
    horizon: int = 1
    frame_stack: int = 1
    stride: int = 1
    filter_key: str | None = None
    on_error: str = "raise"
    cache: str = "low_dim"  # "none" | "low_dim" | "all" (images in RAM too: the fast choice when they fit)
    record: RecordConfig = field(default_factory=RecordConfig)

    def __post_init__(self):
        choice("data.on_error", self.on_error, ("raise", "skip"))
        choice("data.cache", self.cache, ("none", "low_dim", "all"))
        for key in ("horizon", "frame_stack", "stride"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key} must be >= 1, got {getattr(self, key)}")


@dataclass
class SplitFolderDataConfig:
    """A dataset folder with train / test splits in one of several on-disk layouts (``LAYOUTS``)."""

    LAYOUTS: ClassVar[tuple[str, ...]] = ("embodied-dense",)

    root: str = "outputs/datasets"
    layout: str = "embodied-dense"
    train_split: str = "train"
    test_split: str = "test"

    def __post_init__(self):
        choice("data.layout", self.layout, self.LAYOUTS)


@dataclass
class DenseImageDataConfig(SplitFolderDataConfig):
    """``core.data.images`` folders: the project's "embodied-dense" layout or ClearGrasp's."""

    LAYOUTS: ClassVar[tuple[str, ...]] = ("embodied-dense", "cleargrasp")

    root: str = "outputs/datasets/normals"
    image_size: int = 64


@dataclass
class PanoramaDataConfig(SplitFolderDataConfig):
    """``core.data.panoramas``: equirectangular RGB + depth + semantics (embodied-dense or Stanford2D3D)."""

    LAYOUTS: ClassVar[tuple[str, ...]] = ("embodied-dense", "stanford2d3d")

    root: str = "outputs/datasets/panoramas"
    height: int = 64


@dataclass
class VideoDataConfig:
    """``core.data.video.VideoClipDataset`` over mp4 files or frame folders."""

    root: str = "outputs/datasets/videos"
    clip_length: int = 8
    stride: int = 1
    size: int = 64


@dataclass
class EnvConfig:
    """A simulator environment for rollouts and closed-loop evaluation (``sim``)."""

    id: str = "embodied/Reach-Panda-v0"
    image_size: int = 64
    num_envs: int = 1
    episodes: int = 10
    seed: int = 1000  # evaluation seeds start here, away from the training rollouts' seeds
    max_episode_steps: int | None = None
    camera: str | None = None  # the env's default camera when None; must be the one the policy learned from

    def env_kwargs(self) -> dict:
        """Keyword arguments of the evaluation env."""
        return {"image_size": self.image_size, **({"camera": self.camera} if self.camera else {})}

    def __post_init__(self):
        if self.episodes < 1 or self.num_envs < 1:
            raise ConfigError(f"env.episodes and env.num_envs must be >= 1, got {self.episodes}, {self.num_envs}")


@dataclass
class EvalConfig:
    """What ``embodied eval METHOD`` evaluates: a checkpoint (default: the run's newest) against baselines."""

    checkpoint: str | None = None
    baselines: list[str] = field(default_factory=list)
    video: bool = False
    use_ema: bool | None = None  # None: the EMA weights when the checkpoint has them; False: the raw weights


@dataclass
class RunConfig:
    """Root of every composed config.

    ``model`` / ``data`` / ``env`` are filled by their groups, each with its own structured schema (registered
    by the method that owns it).
    """

    method: str | None = None
    arm: str | None = None  # the experiment arm chosen by name (`--arm`; MethodSpec.arms), recorded with the run
    out_dir: str = "outputs/run"
    model: Any = None
    data: Any = None
    env: Any = None
    adapter: Any = None  # a parameter-efficient adapter arm (configs/adapter/; FeRA / LoRA / DoRA)
    algo: Any = None  # a post-training (RL) algorithm arm (configs/algo/; TAGRPO / DanceGRPO)
    eval: EvalConfig = field(default_factory=EvalConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# ----------------------------------------------------------------------------------------------
# Schema registration

_SCHEMAS: dict[tuple[str | None, str], type] = {
    (None, "run_schema"): RunConfig,
    ("trainer", "trainer_schema"): TrainerConfig,
    ("data", "trajectories_schema"): TrajectoryDataConfig,
    ("data", "dense_images_schema"): DenseImageDataConfig,
    ("data", "panoramas_schema"): PanoramaDataConfig,
    ("data", "videos_schema"): VideoDataConfig,
    ("env", "env_schema"): EnvConfig,
}
_registered_in_store: set[tuple[str | None, str]] = set()


def register_schema(group: str | None, name: str, node: type) -> type:
    """Register a dataclass schema under ``group/name`` in Hydra's ConfigStore.

    Methods call this (usually at import of their ``configuration_*.py``) so that their YAML files can
    start with ``defaults: [<name>, _self_]`` and inherit strict key checking.
    """
    if not dataclasses.is_dataclass(node):
        raise TypeError(f"schema {name!r} must be a dataclass, got {node!r}")
    _SCHEMAS[(group, name)] = node
    return node


def schema(group: str | None, name: str):
    """Class decorator form of ``register_schema``."""

    def decorator(cls: type) -> type:
        return register_schema(group, name, cls)

    return decorator


def _store_schemas() -> None:
    from hydra.core.config_store import ConfigStore

    _import_config_modules()
    cs = ConfigStore.instance()
    for (group, name), node in _SCHEMAS.items():
        if (group, name) in _registered_in_store:
            continue
        node = _open_mappings(OmegaConf.structured(node))
        if group is None:
            cs.store(name=name, node=node)
        else:
            cs.store(group=group, name=name, node=node)
        _registered_in_store.add((group, name))


def _open_mappings(node: DictConfig) -> DictConfig:
    """Let every ``dict[str, X]`` field of a schema take new keys without Hydra's ``+`` (in place; returns it).

    Such a field's keys are data, not schema (constructor kwargs, per-group values): ``model.dino_kwargs.depth=4``
    adds a key. Its values keep their declared type, and the dataclass fields around it stay strict.
    """
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            if child._metadata.object_type is dict:
                child._set_flag("struct", False)
            else:
                _open_mappings(child)
    return node


def _import_config_modules() -> None:
    """Import the config modules every registered method declares (``register_method(config=...)``).

    A declared module that does not exist is a ``ConfigError`` naming it and its method, never skipped.
    """
    import importlib

    from core.registry import method_specs

    for spec in method_specs():
        for mod in spec.config:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as e:
                if e.name is None or not (mod == e.name or mod.startswith(e.name + ".")):
                    raise
                raise ConfigError(f"method {spec.name!r} declares config module {mod!r}, which does not "
                                  "exist") from None


def default_config_dir() -> Path:
    """The config tree (``configs/``; see ``core.resources`` for where it is in a checkout and a wheel)."""
    from core.resources import resource_dir

    return resource_dir("configs")


# ----------------------------------------------------------------------------------------------
# Composition


def compose(
    overrides: Sequence[str] = (),
    config_name: str = "config",
    config_dir: str | Path | None = None,
    validate: bool = True,
) -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with Hydra overrides; errors become one-line ``ConfigError``s.

    Args:
        overrides: Hydra override strings, e.g. ``["debug=tiny", "trainer.max_steps=5"]``.
        config_name: Root config file (without ``.yaml``).
        config_dir: The config tree; defaults to ``default_config_dir()``.
        validate: Also build every structured node into its dataclass (runs ``__post_init__``).

    Returns:
        The composed config with interpolations left in place (``resolve`` resolves them).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    _store_schemas()
    config_dir = Path(config_dir or default_config_dir()).resolve()
    if not config_dir.is_dir():
        raise ConfigError(f"config directory {config_dir} does not exist")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except Exception as e:  # Hydra wraps OmegaConf errors in several exception types
        message = _explain(e, overrides)
    else:
        message = None
    finally:
        GlobalHydra.instance().clear()
    if message is not None:
        raise ConfigError(_with_dotted_hint(message, overrides, config_name, config_dir)) from None
    resolve_asset_paths(cfg)
    if validate:
        check(cfg)
    return cfg


def resolve_asset_paths(node: Any) -> None:
    """Rewrite, in place, every string value ``assets/...`` by the asset rule of ``core.resources``.

    Interpolations and missing values (``???``) are left as they are.
    """
    from omegaconf import ListConfig

    from core.resources import resolve_asset_path

    if not isinstance(node, (DictConfig, ListConfig)) or node._is_missing() or node._is_none():
        return
    keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
    for key in keys:
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)):
            resolve_asset_paths(child)
        elif child is not None and not child._is_missing() and not child._is_interpolation():
            value = child._value()
            if isinstance(value, str) and resolve_asset_path(value) != value:
                node[key] = resolve_asset_path(value)


def _dotted_keys(node: Any, prefix: str = "") -> list[str]:
    """Every key of a composed config as a dotted path (``trainer.optim.lr``), interpolations unresolved."""
    if not isinstance(node, DictConfig) or node._is_missing() or node._is_none():
        return []
    out = []
    for key in node.keys():
        path = f"{prefix}{key}"
        out.append(path)
        out += _dotted_keys(node._get_node(key), path + ".")
    return out


def _suggest_dotted(bad: str, keys: Sequence[str]) -> str:
    """``; did you mean trainer.max_steps?`` for ``max_steps``: the keys whose last part is (close to) ``bad``'s."""
    leaf = bad.split(".")[-1]
    same = [k for k in keys if k.split(".")[-1] == leaf and k != bad]
    if not same:
        close = set(difflib.get_close_matches(leaf, {k.split(".")[-1] for k in keys}, n=3, cutoff=0.8))
        same = [k for k in keys if k.split(".")[-1] in close and k != bad]
    return f"; did you mean {', '.join(same[:3])}?" if same else ""


def _with_dotted_hint(message: str, overrides: Sequence[str], config_name: str, config_dir: Path) -> str:
    """An unknown-key message without a close match gains the dotted keys elsewhere in the config that match.

    The config is composed again without the bad override to find them (only on this error path).
    """
    m = re.match(r"unknown config key '([^' ]+)'", message)
    if m is None or "did you mean" in message:
        return message
    bad = m.group(1)
    rest = [o for o in overrides if o.lstrip("+~").partition("=")[0] != bad]
    if len(rest) == len(overrides):
        return message
    try:
        cfg = compose(rest, config_name=config_name, config_dir=config_dir, validate=False)
    except ConfigError:
        return message
    return message + _suggest_dotted(bad, _dotted_keys(cfg))


def check(cfg: DictConfig) -> None:
    """Resolve interpolations and build every structured node (runs each schema's validation)."""
    allowed = {f.name for f in dataclasses.fields(RunConfig)}
    for key in cfg:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else _suggest_dotted(str(key), _dotted_keys(cfg))
            raise ConfigError(f"unknown top-level config key {key!r}{hint}")
    try:
        OmegaConf.resolve(cfg)
        OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        raise ConfigError(_explain(e, ())) from None


def to_object(node: Any) -> Any:
    """A validated dataclass (or plain container) from a config node."""
    if isinstance(node, DictConfig):
        try:
            return OmegaConf.to_object(node)
        except OmegaConfBaseException as e:
            raise ConfigError(_explain(e, ())) from None
    return node


def to_container(cfg: Any) -> Any:
    """Plain dicts / lists with interpolations resolved (dataclasses converted too)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, structured_config_mode=_sc_mode())
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    return cfg


def _sc_mode():
    from omegaconf import SCMode

    return SCMode.DICT


def save_resolved(cfg: Any, out_dir: str | Path) -> Path:
    """Write the resolved config next to an output as ``config.yaml`` (for people) and ``config.json``."""
    out_dir = Path(out_dir)
    container = to_container(cfg)
    write_text(out_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(container)))
    write_json(out_dir / "config.json", container)
    return out_dir / "config.json"


def _explain(e: Exception, overrides: Sequence[str]) -> str:
    """One line saying which key or option was wrong, with close matches where we can find them."""
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    text = "\n".join(str(c) for c in chain)
    where = re.search(r"In '([^']+)'", text)
    place = f" (in {where.group(1)}.yaml)" if where and "/" in where.group(1) else ""
    m = re.search(r"Key '([^']+)' (?:not in|is not in struct)", text)
    override = re.search(r"Could not override '([^']+)'", text)
    if m or override:
        bad = override.group(1) if override else m.group(1)
        hint = ""
        parent_type = next((getattr(c, "object_type", None) for c in chain if getattr(c, "object_type", None)), None)
        if parent_type is not None and dataclasses.is_dataclass(parent_type):
            leaf = (m.group(1) if m else bad).split(".")[-1]
            close = difflib.get_close_matches(leaf, [f.name for f in dataclasses.fields(parent_type)], n=3)
            if close:
                hint = f"; did you mean {', '.join(close)}?"
        if m and override and m.group(1) != bad.split(".")[-1]:
            bad = f"{bad} ({m.group(1)})"
        return f"unknown config key {bad!r}{place}{hint}"
    value = re.search(r"Value '([^']*)' (?:of type '[^']+' )?could not be converted to (\w+)", text)
    if value:
        key = re.search(r"full_key: (\S+)", text)
        return f"bad value {value.group(1)!r} for {key.group(1) if key else 'a config key'}: expected {value.group(2)}"
    missing = re.search(r"Could not find '([^']+)'", text)
    if missing:
        opts = re.search(r"Available options in '[^']+':\s*((?:\s*\S+\n?)+?)(?:\n\s*\n|Config search path|$)", text)
        # schemas registered in the ConfigStore (``*_schema``) are the YAML files' bases, not user choices
        names = ", ".join(n for n in opts.group(1).split() if not n.endswith("_schema")) if opts else "none"
        return f"no config {missing.group(1)!r} (available: {names})"
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.strip().startswith(("full_key", "object_type"))]
    return f"config error: {lines[-1] if lines else type(e).__name__}{place}"


def from_dict_strict(cls: type, values: Mapping[str, Any], what: str, *,
                     error: type[Exception] = ConfigError) -> Any:
    """Build dataclass ``cls`` from a plain dict, recursing into fields typed as a dataclass; strict.

    The workspace's one dict -> dataclass (``core.pretrained.dataclass_from_dict`` is this with
    ``CheckpointError``). An unknown key is not dropped nor a ``TypeError``: it is a one-line ``error``
    naming the key, the class and the closest field, e.g. ``model: unknown config key(s) ['hiden'] for
    ToyConfig (did you mean 'hidden'?)``.

    Args:
        cls: The dataclass.
        values: Its fields by name (a nested dict for a field typed as a dataclass).
        what: Names the dict in the message (``model``; a nested one ``model.inner``).
        error: The exception class raised.
    """
    if not isinstance(values, Mapping):
        raise error(f"{what}: expected a mapping for {cls.__name__}, got {type(values).__name__}")
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted((k for k in values if k not in known), key=str)
    if unknown:
        close = {k: difflib.get_close_matches(str(k), known, n=1) for k in unknown}
        hints = [f"{c[0]!r}" + (f" for {k!r}" if len(unknown) > 1 else "") for k, c in close.items() if c]
        hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
        raise error(f"{what}: unknown config key(s) {unknown} for {cls.__name__}{hint}")
    try:
        hints_of = typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: build flat
        hints_of = {}
    kwargs = {}
    for name, value in values.items():
        hint = hints_of.get(name)
        if isinstance(value, dict) and isinstance(hint, type) and dataclasses.is_dataclass(hint):
            value = from_dict_strict(hint, value, f"{what}.{name}", error=error)
        kwargs[name] = value
    return cls(**kwargs)


def choice(key: str, value: Any, options: Sequence[Any]) -> None:
    """Raise a one-line ``ConfigError`` naming ``key`` unless ``value`` is one of ``options``."""
    if value not in options:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, options))}; got {value!r}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key} must be > 0, got {value}")
