"""Where the workspace's configs and shipped assets are: one rule for a source checkout and an installed wheel.

The rule (``resource_dir(name)`` for ``name`` in ``configs`` / ``assets``):

1. a source checkout or editable install: ``<repository>/<name>``, the repository being the folder above
   ``core/`` that holds this project's ``pyproject.toml``;
2. an installed wheel (``pip install .``): ``core/_resources/<name>``, copied there at build time by
   ``setup.py`` (the same files, so a non-editable install runs every command from any directory).

Anything else is a one-line ``ConfigError``.

Paths to shipped assets in configs (YAML values, command-line overrides and schema defaults alike) are written
``assets/<path>``, e.g. ``model.base_path: assets/checkpoints/flexforcing``. ``resolve_asset_path`` reads such a
value by one rule: relative to the working directory when it exists there (the repository root, or a user's
own ``assets/`` folder), else the shipped asset ``asset(<path>)`` found as above. ``core.config.compose``
applies it to every string value of a composed config, so the commands run from any working directory and the
saved run config records the absolute path that was used. Other relative paths (``outputs/...``, data roots)
stay relative to the working directory.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import ConfigError

NAMES = ("configs", "assets")
ASSET_PREFIX = "assets/"
_PROJECT = 'name = "embodied-workspace"'


def repository_root() -> Path | None:
    """The source checkout holding this ``core/`` package, or None for an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and _PROJECT in pyproject.read_text():
        return root
    return None


def resource_dir(name: str) -> Path:
    """The folder ``name`` (``configs`` or ``assets``) by the rule in the module docstring."""
    if name not in NAMES:
        raise ConfigError(f"unknown resource folder {name!r} (known: {', '.join(NAMES)})")
    root = repository_root()
    if root is not None and (root / name).is_dir():
        return root / name
    packaged = Path(__file__).resolve().parent / "_resources" / name
    if packaged.is_dir():
        return packaged
    raise ConfigError(f"cannot find the workspace's {name}/ folder (neither a source checkout nor packaged in "
                      f"{packaged.parent}); reinstall the project")


def asset(*parts: str) -> Path:
    """A path under the shipped assets, e.g. ``asset("checkpoints", "sola")``."""
    return resource_dir("assets").joinpath(*parts)


def resolve_asset_path(value: str) -> str:
    """``value`` by the asset rule of the module docstring.

    An ``assets/...`` path missing from the working directory becomes the shipped asset's absolute path (when
    that exists); any other value is returned unchanged.
    """
    if not isinstance(value, str) or not value.startswith(ASSET_PREFIX) or Path(value).exists():
        return value
    rest = value[len(ASSET_PREFIX):].strip("/")
    if not rest:
        return value
    shipped = asset(*Path(rest).parts)
    return str(shipped) if shipped.exists() else value
