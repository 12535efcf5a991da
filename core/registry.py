"""One registry mechanism for the whole workspace: models, pipelines, datasets, methods, policies.

Entries are registered by name, either as an object or as a lazy string target ``"package.module:attr"``
that is imported only when the entry is first asked for — so registering imports nothing heavy and
``embodied --help`` stays fast. The same mechanism serves every kind of entry::

    MODELS.register("transnormal", "perception.normals.modeling_transnormal:TransNormalModel")

    @MODELS.register("tiny_mlp")
    class TinyMLP(nn.Module): ...

    cls = MODELS.get("transnormal")          # imports on first use
    model = MODELS.build("tiny_mlp", **kwargs)
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
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
# A method bundles what `embodied train|eval METHOD` needs: a module with `train(cfg)` and
# `evaluate(cfg)` task functions and the name of its Hydra experiment config. Methods register
# themselves in core/methods.py (lazy strings), so the CLI can list them without importing them.
METHODS = Registry("method")
