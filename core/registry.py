"""One registry mechanism for the whole workspace: models, pipelines, datasets, methods, policies.

Entries are registered by name, either as an object or as a lazy string target ``"package.module:attr"``
that is imported only when the entry is first asked for — so registering imports nothing heavy and
``embodied --help`` stays fast. The same mechanism serves every kind of entry::

    MODELS.register("mymethod", "mypkg.modeling_mymethod:MyModel")

    @MODELS.register("tiny_mlp")
    class TinyMLP(nn.Module): ...

    cls = MODELS.get("transnormal")          # imports on first use
    model = MODELS.build("tiny_mlp", **kwargs)
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError


def import_target(target: str) -> Any:
    """Import ``"package.module:attr"`` and return the attribute; ``"package.module"`` returns the module."""
    if ":" not in target:
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as e:
            if e.name != target:
                raise
    if ":" in target:
        module_name, _, attr_path = target.partition(":")
    else:
        module_name, _, attr_path = target.rpartition(".")
    if not module_name or not attr_path:
        raise ConfigError(f"bad import target {target!r}: expected 'package.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name == e.name or module_name.startswith(e.name + ".")):
            raise  # a dependency of the module is missing: that is a real bug, keep the traceback
        raise ConfigError(f"import target {target!r}: no module named {e.name!r}") from None
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"import target {target!r}: {module_name} has no attribute {attr_path!r}") from None
    return obj


class Registry:
    """A name -> object table whose values may be lazy ``"module:attr"`` strings."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str, target: Any = None, *, overwrite: bool = False, **meta: Any):
        """Register ``target`` under ``name``; without ``target``, return a decorator.

        Args:
            name: Unique key, lower-case by convention.
            target: The object, or a lazy ``"package.module:attr"`` string.
            overwrite: Allow replacing an existing entry (otherwise a clash is an error).
            **meta: Free-form metadata shown by ``describe`` (e.g. ``paper=``, ``task=``).
        """
        if target is None:

            def decorator(obj: Any) -> Any:
                self.register(name, obj, overwrite=overwrite, **meta)
                return obj

            return decorator
        if name in self._entries and not overwrite and self._entries[name] is not target:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = target
        self._meta[name] = dict(meta)
        return target

    def get(self, name: str) -> Any:
        """Return the entry, importing it if it is a lazy string. Unknown names list the close matches."""
        if name not in self._entries:
            close = difflib.get_close_matches(name, self._entries, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            known = ", ".join(sorted(self._entries)) or "none"
            raise ConfigError(f"unknown {self.kind} {name!r}{hint} (known: {known})")
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = import_target(entry)
            self._entries[name] = entry
        return entry

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Look ``name`` up and call it with the given arguments."""
        factory: Callable[..., Any] = self.get(name)
        return factory(*args, **kwargs)

    def meta(self, name: str) -> dict[str, Any]:
        """Metadata given at registration."""
        self.get(name)
        return dict(self._meta[name])

    def is_loaded(self, name: str) -> bool:
        """Whether the entry has been imported (lazy strings not yet resolved return False)."""
        return name in self._entries and not isinstance(self._entries[name], str)

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


MODELS = Registry("model")
PIPELINES = Registry("pipeline")
DATASETS = Registry("dataset")
POLICIES = Registry("policy")
# `embodied train|eval METHOD`: the task module (train(cfg) / evaluate(cfg)); metadata holds the MethodSpec.
METHODS = Registry("method")
# `embodied infer KIND`: function (args) -> exit code; metadata holds the InferSpec (help + argument specs).
INFER = Registry("inference command")
# `embodied demo` sections: fn(DemoContext) -> DemoSection.
DEMOS = Registry("demo section")

# ----------------------------------------------------------------------------------------------
# Methods register themselves: each method folder has a ``register.py`` that calls ``register_method``,
# and names that module once in the distribution's entry points (group ``embodied.methods``). Core reads
# the entry points generically, so it names no method, and a method living in another distribution
# registers the same way.

ENTRY_POINT_GROUP = "embodied.methods"


@dataclass(frozen=True)
class Flag:
    """A train / eval command-line flag that is shorthand for a config override.

    ``--rotate so3`` with ``Flag("--rotate", "data.rotate", choices=("none", "yaw", "so3"))`` becomes the
    override ``data.rotate=so3``; the config must have the key (checked when composing).
    """

    name: str
    override: str
    help: str = ""
    choices: tuple[str, ...] | None = None
    verbs: tuple[str, ...] = ("eval",)


@dataclass(frozen=True)
class InferSpec:
    """An ``embodied infer KIND`` command: help text, argparse argument specs and the function to call."""

    kind: str
    target: str  # "module:function", called with the parsed args, returns an exit code
    help: str
    arguments: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True)
class MethodSpec:
    """Everything a method declares about itself, in one call of ``register_method``."""

    name: str
    folder: str
    description: str
    task: str  # module with train(cfg) / evaluate(cfg); its experiment config is configs/experiment/<name>.yaml
    config: tuple[str, ...] = ()  # modules whose import registers the method's config schemas (light)
    model: str | None = None  # "module:Class" of its PreTrainedModel (core.pretrained.load_pretrained)
    #: "module:function" (env, checkpoint=None, **options) -> sim.api.Policy, the one factory signature
    #: (``core.checkpoint.load_policy`` passes the checkpoint; a factory that needs one refuses None in one line).
    policy: str | None = None
    demo: str | None = None  # "module:function" (DemoContext) -> DemoSection
    infer: tuple[InferSpec, ...] = ()
    flags: tuple[Flag, ...] = ()
    #: The arms of the method's experiments: name -> the config overrides that select it. The first is the
    #: method itself; the rest are its baselines / ablations. ``embodied train METHOD --arm NAME`` and the
    #: experiment grid (``core.experiments``) choose an arm this one way.
    arms: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: "module:function" (workdir: Path) -> ``core.testing.ModelExample``: a tiny model of the method and a
    #: fixed input, which the contract test (tests/test_model_contract.py) checks for every registered method.
    example: str | None = None
    #: The headline metrics ``embodied eval`` prints: (pattern over the result's flattened keys, unit, display
    #: scale), e.g. ``("policies.*.success_rate", "%", 100)``; empty: the result's first numbers (embodied.results).
    headline: tuple[tuple[str, str, float], ...] = ()
    #: "module:ATTR": the method's paper-comparison studies, a ``core.experiments.Experiment`` or a name ->
    #: Experiment mapping, run by ``embodied experiment METHOD [STUDY] ...``.
    experiment: str | None = None

    def arm_overrides(self, arm: str) -> tuple[str, ...]:
        """The overrides that select ``arm`` (a one-line ``ConfigError`` naming the known arms otherwise)."""
        table = dict(self.arms)
        if arm not in table:
            known = ", ".join(table) or "none (the method has a single arm)"
            raise ConfigError(f"method {self.name!r} has no arm {arm!r} (arms: {known})")
        return table[arm]


def register_method(name: str, *, folder: str, description: str, task: str, config: str | Sequence[str] = (),
                    model: str | None = None, policy: str | None = None, demo: str | None = None,
                    infer: Sequence[InferSpec] = (), flags: Sequence[Flag] = (),
                    arms: dict[str, Sequence[str]] | None = None, example: str | None = None,
                    headline: Sequence[str | tuple] = (), experiment: str | None = None) -> MethodSpec:
    """Register a method's train / eval tasks, config modules, model class, policy, demo and infer commands.

    Everything is given as lazy ``"module:attr"`` strings: registering imports nothing heavy.
    Re-registering the same method (the module imported twice: same folder and task module) replaces its entries.

    Raises:
        ConfigError: ``name`` (or one of its infer commands) belongs to another method; the one line names both.
    """
    spec = MethodSpec(name=name, folder=folder, description=description, task=task,
                      config=(config,) if isinstance(config, str) else tuple(config), model=model, policy=policy,
                      demo=demo, infer=tuple(infer), flags=tuple(flags),
                      arms=tuple((k, tuple(v)) for k, v in (arms or {}).items()), example=example,
                      headline=tuple(_headline_entry(name, h) for h in headline), experiment=experiment)
    _refuse_taken(spec)
    METHODS.register(name, task, overwrite=True, spec=spec, folder=folder, description=description)
    if model:
        MODELS.register(name, model, overwrite=True)
    if policy:
        POLICIES.register(name, policy, overwrite=True)
    if demo:
        DEMOS.register(name, demo, overwrite=True)
    for inf in spec.infer:
        INFER.register(inf.kind, inf.target, overwrite=True, spec=inf, method=name)
    return spec


def _refuse_taken(spec: MethodSpec) -> None:
    """Refuse, in one line, a name (or infer command) that another method (another folder or task module) owns.

    The same method registering again (its module re-imported) is fine.
    """

    def owner(s: MethodSpec) -> str:
        return f"{s.folder} (task {s.task})"

    old = METHODS._meta.get(spec.name, {}).get("spec")
    if old is not None and (old.folder, old.task) != (spec.folder, spec.task):
        raise ConfigError(f"method {spec.name!r} is registered twice: by {owner(old)} and by {owner(spec)}; "
                          "rename one of them")
    for inf in spec.infer:
        other = INFER._meta.get(inf.kind, {}).get("method")
        if other is not None and other != spec.name:
            theirs = METHODS._meta.get(other, {}).get("spec")
            raise ConfigError(f"infer command {inf.kind!r} of method {spec.name!r} ({owner(spec)}) is already "
                              f"registered by method {other!r}" + (f" ({owner(theirs)})" if theirs else "")
                              + "; rename one of them")


def _headline_entry(method: str, entry: str | tuple) -> tuple[str, str, float]:
    """``"key"`` / ``(key, unit)`` / ``(key, unit, scale)`` as ``(key, unit, scale)``; anything else is an error."""
    entry = (entry,) if isinstance(entry, str) else tuple(entry)
    if not 1 <= len(entry) <= 3 or not isinstance(entry[0], str):
        raise ConfigError(f"method {method!r}: headline entry {entry!r} is not (key, unit[, scale])")
    return (entry[0], str(entry[1]) if len(entry) > 1 else "", float(entry[2]) if len(entry) > 2 else 1.0)


def method_specs() -> list[MethodSpec]:
    """The registered methods' specs (after ``load_plugins``), by name."""
    load_plugins()
    return [METHODS._meta[n]["spec"] for n in METHODS.names() if "spec" in METHODS._meta[n]]


_plugins_loaded = False


def load_plugins(force: bool = False) -> list[str]:
    """Import every registration module named in the ``embodied.methods`` entry points (once per process).

    Returns the entry-point names. A name whose module does not exist is a ``ConfigError`` naming it (stale
    install metadata: reinstall with ``make setup``), never a silent skip.
    """
    global _plugins_loaded
    from importlib.metadata import entry_points

    eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    if _plugins_loaded and not force:
        return [e.name for e in eps]
    _plugins_loaded = True  # set first: a registration module may itself ask for the registries
    for ep in eps:
        try:
            importlib.import_module(ep.value.partition(":")[0])
        except ModuleNotFoundError as e:
            target = ep.value.partition(":")[0]
            if e.name is None or not (target == e.name or target.startswith(e.name + ".")):
                raise
            _plugins_loaded = False
            raise ConfigError(f"entry point {ep.name!r} ({ENTRY_POINT_GROUP}) names missing module {target!r}; "
                              "the installed metadata is stale — run `make setup`") from None
    return [e.name for e in eps]
