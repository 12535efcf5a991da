"""The workspace's method table: every method that registered itself, where it lives and its arms.

A method exists when it registered itself (``core.registry.register_method`` in its folder's ``register.py``,
named in the ``embodied.methods`` entry points of pyproject.toml or of another distribution); this table
only reads the registry, so it lists a method from outside the repository the same way.
"""

from __future__ import annotations

from core.registry import MethodSpec, method_specs


def arm_names(spec: MethodSpec) -> list[str]:
    """The names ``embodied train|eval METHOD --arm NAME`` accepts (a method without arms: its own name)."""
    return [name for name, _ in spec.arms] or [spec.name]


def status() -> list[dict[str, str]]:
    """One row per registered method, by name: name, folder, description, arms (comma-separated)."""
    return [{"name": s.name, "folder": s.folder, "description": s.description,
             "arms": ", ".join(arm_names(s))} for s in method_specs()]
