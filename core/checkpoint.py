"""Checkpoints: safetensors weights + the resolved config as JSON + the full training state. No pickle.

A checkpoint is a directory, written under a temporary name and renamed into place, so a kill at any
moment leaves either the previous checkpoint or the new one — never half of one::

    <run>/checkpoints/step_000100/
        model.safetensors           model weights (state_dict, contiguous CPU tensors)
        ema.safetensors             EMA weights, when the trainer keeps an EMA
        config.json                 the resolved run config (method, model, data, trainer ...)
        training_state.safetensors  optimizer tensors and RNG states (torch CPU / CUDA)
        training_state.json         step, epoch, sample offset, optimizer / scheduler scalars, numpy and
                                    Python RNG states
    <run>/checkpoints/latest        the name of the newest complete checkpoint (written atomically)

Loading reads only tensors (safetensors) and JSON, so it never unpickles arbitrary objects.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from core.errors import CheckpointError
from core.io import atomic_dir, atomic_path, read_json, write_json, write_text

MODEL_FILE = "model.safetensors"
EMA_FILE = "ema.safetensors"
CONFIG_FILE = "config.json"
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
LATEST = "latest"


# ----------------------------------------------------------------------------------------------
# Weights


def state_dict_to_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies; tied (shared-storage) tensors are stored once per name, as safetensors needs."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state_dict.items():
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"state_dict entry {k!r} is a {type(v).__name__}, not a tensor")
        out[k] = v.detach().to("cpu").contiguous().clone()
    return out


def save_weights(state_dict: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None):
    """Write a state_dict to a safetensors file atomically."""
    with atomic_path(path) as tmp:
        save_file(state_dict_to_tensors(state_dict), str(tmp), metadata=metadata)


def load_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read a safetensors file; a missing or corrupt file raises ``CheckpointError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def load_into(module: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str = "checkpoint",
              strict: bool = True, required: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Load ``state_dict`` into ``module`` checking every key and shape.

    ``required`` names the keys the file must hold (default: every key of ``module.state_dict()``); a model that
    wraps a referenced base (``PreTrainedModel.trained_state_dict``) requires only what it trained, and the
    rest of its state comes from the base. Keys the module does not have are always unexpected.

    Returns the report ``{"missing": [...], "unexpected": [...], "mismatched": ["key: ckpt (a,b) vs model (c,d)"]}``.
    With ``strict`` any problem raises ``CheckpointError`` listing (up to 5 of) each kind.
    """
    own = module.state_dict()
    need = list(own) if required is None else list(required)
    missing = [k for k in need if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    mismatched = [
        f"{k}: {tuple(state_dict[k].shape)} in {source} vs {tuple(own[k].shape)} in model"
        for k in own
        if k in state_dict and tuple(state_dict[k].shape) != tuple(own[k].shape)
    ]
    report = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}
    if strict and (missing or unexpected or mismatched):
        parts = []
        for kind, keys in report.items():
            if keys:
                more = f" (+{len(keys) - 5} more)" if len(keys) > 5 else ""
                parts.append(f"{len(keys)} {kind}: {', '.join(keys[:5])}{more}")
        raise CheckpointError(f"{source} does not match the model: " + "; ".join(parts))
    loadable = {k: v for k, v in state_dict.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    module.load_state_dict(loadable, strict=False)
    return report


# ----------------------------------------------------------------------------------------------
# Optimizer / scheduler / RNG state <-> (tensors, JSON)


def _split_state(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Replace every tensor in a nested dict/list by a reference ``{"__tensor__": name}``."""
    if isinstance(obj, torch.Tensor):
        name = prefix
        tensors[name] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": name}
    if isinstance(obj, dict):
        return {"__dict__": [[_key(k), _split_state(v, f"{prefix}.{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"__list__": [_split_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)],
                "tuple": isinstance(obj, tuple)}
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"cannot store training-state value of type {type(obj).__name__} at {prefix}")


def _key(k: Any) -> Any:
    if isinstance(k, (int, str)):
        return k
    raise CheckpointError(f"cannot store a training-state dict key of type {type(k).__name__}")


def _join_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__dict__" in obj:
            return {k: _join_state(v, tensors) for k, v in obj["__dict__"]}
        if "__list__" in obj:
            items = [_join_state(v, tensors) for v in obj["__list__"]]
            return tuple(items) if obj.get("tuple") else items
    return obj


def capture_rng() -> dict[str, Any]:
    """Every RNG the training loop touches: torch CPU (and CUDA), numpy's global, Python's ``random``."""
    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng``."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


# ----------------------------------------------------------------------------------------------
# Whole checkpoints


def save_checkpoint(
    directory: str | Path,
    model: torch.nn.Module,
    config: dict[str, Any] | None = None,
    training_state: dict[str, Any] | None = None,
    ema: torch.nn.Module | None = None,
) -> Path:
    """Write a checkpoint directory atomically (temp directory + rename) and return its path.

    Args:
        directory: Final directory, e.g. ``run/checkpoints/step_000100``; replaced if it exists.
        model: The (unwrapped) model; its ``state_dict`` goes to ``model.safetensors``.
        config: The resolved run config (plain containers), saved as ``config.json``.
        training_state: Anything made of tensors, numbers, strings, lists and dicts (optimizer and
            scheduler state dicts, RNG states, counters).
        ema: Optional EMA copy of the model.
    """
    directory = Path(directory)
    with atomic_dir(directory) as tmp:
        save_weights(model.state_dict(), tmp / MODEL_FILE)
        if ema is not None:
            save_weights(ema.state_dict(), tmp / EMA_FILE)
        write_json(tmp / CONFIG_FILE, config or {})
        if training_state is not None:
            tensors: dict[str, torch.Tensor] = {}
            skeleton = _split_state(training_state, "state", tensors)
            save_weights(tensors, tmp / STATE_TENSORS)
            write_json(tmp / STATE_JSON, skeleton)
    return directory


def trained_keys(model: torch.nn.Module) -> set[str] | None:
    """The state-dict keys a training checkpoint of ``model`` holds: ``None`` for all of them.

    A model around a referenced base folder (a ``PreTrainedModel`` with ``base_fields`` set: LoRA on a VLM,
    adapters on a diffusers UNet) checkpoints only ``trained_state_dict()``, as its exported folder does; its
    frozen base is rebuilt from the base folder, so a 7 B base is not written again at every checkpoint.
    """
    bases = getattr(model, "base_folders", None)
    if bases is None or not bases():
        return None
    return set(model.trained_state_dict())


def load_checkpoint(directory: str | Path, model: torch.nn.Module | None = None,
                    ema: torch.nn.Module | None = None, strict: bool = True) -> dict[str, Any]:
    """Read a checkpoint directory. Loads weights into ``model`` / ``ema`` when given.

    A model around a base needs only its trained tensors in the file (``trained_keys``); any other model every
    key.

    Returns:
        ``{"config": dict, "training_state": dict | None, "path": Path}``.
    """
    directory = resolve_checkpoint(directory)
    if model is not None:
        load_into(model, load_weights(directory / MODEL_FILE), source=str(directory / MODEL_FILE), strict=strict,
                  required=trained_keys(model))
    if ema is not None:
        src = directory / EMA_FILE if (directory / EMA_FILE).exists() else directory / MODEL_FILE
        load_into(ema, load_weights(src), source=str(src), strict=strict, required=trained_keys(ema))
    state = None
    if (directory / STATE_JSON).exists():
        try:
            skeleton = read_json(directory / STATE_JSON)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        tensors = load_weights(directory / STATE_TENSORS)
        try:
            state = _join_state(skeleton, tensors)
        except KeyError as e:
            raise CheckpointError(f"{directory}: training state refers to a missing tensor {e}") from None
    try:
        config = read_json(directory / CONFIG_FILE)
    except (ValueError, FileNotFoundError) as e:
        raise CheckpointError(str(e)) from None
    return {"config": config, "training_state": state, "path": directory}


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a checkpoint directory, a run directory (uses ``checkpoints/latest``) or a ``checkpoints`` dir."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    for candidate in (path, path / "checkpoints"):
        if (candidate / LATEST).is_file():
            name = (candidate / LATEST).read_text().strip()
            return resolve_checkpoint(candidate / name)
    if not (path / MODEL_FILE).is_file():
        raise CheckpointError(f"{path}: not a checkpoint (no {MODEL_FILE})")
    return path


def latest_checkpoint(checkpoints_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in ``checkpoints_dir``, or None."""
    d = Path(checkpoints_dir)
    if (d / LATEST).is_file():
        p = d / (d / LATEST).read_text().strip()
        if (p / MODEL_FILE).is_file():
            return p
    steps = sorted(p for p in d.glob("step_*") if (p / MODEL_FILE).is_file()) if d.is_dir() else []
    return steps[-1] if steps else None


def mark_latest(checkpoints_dir: str | Path, name: str) -> None:
    """Point ``checkpoints/latest`` at ``name`` (atomic)."""
    write_text(Path(checkpoints_dir) / LATEST, name + "\n")


def prune_checkpoints(checkpoints_dir: str | Path, keep_last: int) -> None:
    """Remove all but the ``keep_last`` newest ``step_*`` checkpoints."""
    steps = sorted(Path(checkpoints_dir).glob("step_*"))
    for p in steps[:-keep_last] if keep_last > 0 else steps:
        shutil.rmtree(p, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# A checkpoint's method: its config, its registry entries, its policy


def read_config(directory: str | Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint / exported folder, with a one-line error when missing or corrupt."""
    path = Path(directory) / CONFIG_FILE
    try:
        config = read_json(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file (not an exported model or checkpoint)") from None
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return config


def method_entry(path: str | Path, registry: Any, what: str) -> tuple[Path, Any]:
    """(resolved checkpoint, ``registry``'s entry for the method its ``config.json`` names).

    ``what`` names the entry kind in the one-line error when the method registers none (e.g. "model class").
    """
    from core.registry import load_plugins

    load_plugins()
    try:
        ckpt = resolve_checkpoint(path)
    except CheckpointError:
        # a run folder of a method whose trained artefact is its own folder format (e.g. AutoMoT's policy/, a
        # Deep-VRM detector): its resolved run config names the method, which knows how to read the rest
        if not (Path(path) / CONFIG_FILE).is_file():
            raise
        ckpt = Path(path)
    method = read_config(ckpt).get("method")
    if not method:
        raise CheckpointError(f"{ckpt}/{CONFIG_FILE} names no method, so no {what} can be built from it")
    if method not in registry:
        raise CheckpointError(f"{ckpt}: method {method!r} registers no {what} (known: {', '.join(registry.names())})")
    return ckpt, registry.get(method)


def load_policy(path: str | Path, env: Any, **options: Any) -> Any:
    """A ``sim.api.Policy`` ready to act in ``env``, from a checkpoint, through the method named in its config.

    Methods that can act register a factory in ``core.registry.POLICIES`` under their method name, with the one
    signature ``factory(env, checkpoint=None, **options) -> Policy`` (``checkpoint=None``: the policy by name, e.g. a
    shipped checkpoint, ``embodied drive eval --policy automot``; a factory that needs one says so in one line).
    This calls it as ``factory(env, checkpoint=CKPT, **options)``.
    """
    from core.registry import POLICIES

    ckpt, factory = method_entry(path, POLICIES, "policy for closed-loop rollouts")
    return factory(env, checkpoint=ckpt, **options)


def require_checkpoint(checkpoint: str | Path | None, policy: str) -> Path:
    """``checkpoint`` as a path, for a policy factory that has no default: ``None`` is a one-line ``ConfigError``."""
    if checkpoint is None:
        from core.errors import ConfigError

        raise ConfigError(f"policy {policy!r} is built from a trained checkpoint: pass the checkpoint folder "
                          "(e.g. --policy CKPT)")
    return Path(checkpoint)
