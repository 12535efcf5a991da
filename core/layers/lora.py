"""LoRA (Hu et al., ICLR 2022) through Hugging Face ``peft``: low-rank updates ``W + (alpha / r) B A``.

The project used to hand-write its LoRA wrapper; it now builds a ``peft.LoraConfig`` and calls
``peft.inject_adapter_in_model`` (peft 0.21.2), so adapted models hold peft's own layers, train, merge and
save as LoRA users expect, and an adapter written here loads with ``peft.PeftModel.from_pretrained``.
peft can express everything the project asks of LoRA: the shared ``core.layers.Attention`` keeps
separate ``q`` / ``k`` / ``v`` / ``proj`` linears (no fused ``qkv``), which peft wraps by name.

Semantics kept from the former wrapper (tests/core/layers/test_layers.py checks each on fixed inputs):
``inject_lora(module, targets, rank)`` wraps every ``nn.Linear`` whose qualified name matches one of
``targets`` (a suffix such as ``"attn.q"`` or a plain layer name such as ``"q"``; peft's own list matching)
or, when ``targets`` is one string, the regular expression it is (peft's full-match meaning of a string),
optionally only inside the submodules named in ``within``; ``A`` is Kaiming-uniform and ``B`` zero (peft's
default init), so the wrapped module computes exactly what it did before; the wrapped linears are frozen
and every other parameter keeps its ``requires_grad`` (peft alone would freeze the whole root module);
``alpha`` defaults to ``rank`` (scale 1; peft's own default alpha is 8). The forward equals the former
formula ``base(x) + (alpha / r) * x A^T B^T`` to float round-off (1e-6 on the test's inputs).

State-dict keys of a wrapped layer ``attn.q`` (peft's names)::

    attn.q.base_layer.weight / .bias    the frozen linear
    attn.q.lora_A.default.weight        A, (r, in)
    attn.q.lora_B.default.weight        B, (out, r)

Adapter-only save / load: ``lora_state_dict`` / ``load_lora_state_dict`` (peft's
``get_peft_model_state_dict`` / ``set_peft_model_state_dict``: keys without the adapter name, e.g.
``attn.q.lora_A.weight``) and ``save_lora`` / ``load_lora`` (a folder with ``adapter_config.json`` +
``adapter_model.safetensors`` in peft's on-disk layout). ``peft`` is imported on first use, not when
``core.layers`` is imported (it pulls in transformers: ~4 s).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_WEIGHTS_FILE",
    "inject_lora",
    "inject_peft",
    "is_lora_layer",
    "load_lora",
    "load_lora_state_dict",
    "lora_config",
    "lora_parameters",
    "lora_state_dict",
    "matching_linears",
    "merge_lora",
    "save_lora",
]

ADAPTER_CONFIG_FILE = "adapter_config.json"  # peft's file names (PeftModel.save_pretrained / from_pretrained)
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."  # PeftModel's prefix of the wrapped model's keys in adapter files
_DEFAULT = "default"


def is_lora_layer(module: nn.Module) -> bool:
    """Whether ``module`` is a peft LoRA layer (``peft.tuners.lora.Linear``, as ``inject_lora`` makes)."""
    return hasattr(module, "base_layer") and isinstance(getattr(module, "lora_A", None), nn.ModuleDict)


def _inject(module: nn.Module, config: Any, adapter_name: str) -> None:
    """``peft.inject_adapter_in_model``; then only the wrapped base linears stay frozen (peft freezes all)."""
    from peft import inject_adapter_in_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    grad = {id(p): p.requires_grad for p in module.parameters()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        inject_adapter_in_model(config, module, adapter_name=adapter_name)
    frozen = {id(p) for m in module.modules() if isinstance(m, BaseTunerLayer)
              for p in m.get_base_layer().parameters()}
    for p in module.parameters():
        if id(p) in grad and id(p) not in frozen:
            p.requires_grad_(grad[id(p)])


def inject_peft(module: nn.Module, config: Any, adapter_name: str = _DEFAULT) -> list[str]:
    """Inject any peft tuner (``FourierFTConfig``, ``WaveFTConfig``, ...) into ``module`` in place.

    ``inject_lora``'s semantics: the wrapped linears are frozen, every other parameter keeps its ``requires_grad``.
    ``lora_state_dict`` / ``save_lora`` / ``load_lora`` then save and load it in peft's layout. Returns the
    wrapped layers' names.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    _inject(module, config, adapter_name)
    return [n for n, m in module.named_modules() if isinstance(m, BaseTunerLayer)]


def matching_linears(module: nn.Module, targets: Sequence[str] | str) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` s of ``module`` whose qualified names match ``targets`` (``inject_lora``'s matching).

    Raises:
        ValueError: none matches.
    """
    found = {n: m for n, m in module.named_modules() if type(m) is nn.Linear and _matches(n, targets)}
    if not found:
        shown = targets if isinstance(targets, str) else list(targets)
        raise ValueError(f"no nn.Linear in {type(module).__name__} matches {shown!r}")
    return found


def _matches(name: str, targets: Sequence[str] | str) -> bool:
    if isinstance(targets, str):  # a regular expression over the qualified name (peft's str target_modules)
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def _inside(name: str, prefixes: Sequence[str] | None) -> bool:
    return prefixes is None or any(p == "" or name == p or name.startswith(p + ".") for p in prefixes)


def lora_config(targets: Iterable[str], rank: int = 4, alpha: float | None = None, dropout: float = 0.0,
                use_dora: bool = False):
    """The ``peft.LoraConfig`` of an adapter on the linears named ``targets`` (alpha defaults to ``rank``).

    ``use_dora``: DoRA (Liu et al., ICML 2024), peft's weight-decomposed LoRA: a trainable per-output magnitude
    times the direction of ``W + scale * B A`` (``out_features`` more parameters per layer).
    """
    from peft import LoraConfig

    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    return LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else rank, lora_dropout=dropout,
                      target_modules=sorted(targets), bias="none", use_dora=use_dora)


def inject_lora(module: nn.Module, targets: Sequence[str] | str, rank: int = 4, alpha: float | None = None,
                dropout: float = 0.0, within: Sequence[str] | None = None,
                adapter_name: str = _DEFAULT, use_dora: bool = False) -> list[str]:
    r"""Wrap every matching ``nn.Linear`` inside ``module`` in a peft LoRA layer (in place).

    Args:
        module: Root module (it receives peft's ``peft_config`` attribute).
        targets: Qualified-name suffixes of the linears to adapt (e.g. ``["q", "k", "v", "proj"]``), or one
            string: a regular expression the whole qualified name must match (peft's meaning of a string
            ``target_modules``), e.g. ``r".*layers\.(4|5)\.self_attn\.(q|v)_proj"``.
        rank: ``r`` >= 1.
        alpha: Scale numerator (default ``rank``: scale 1).
        dropout: Dropout on the adapter input.
        within: Qualified names of the submodules to search (default: all of ``module``).
        adapter_name: peft's adapter name.
        use_dora: Wrap in peft's DoRA layers instead (see ``lora_config``).

    Returns:
        The qualified names that were wrapped (already-wrapped layers are skipped).

    Raises:
        ValueError: No linear layer matched ``targets``.
    """
    prefixes = None if within is None else list(within)
    wrapped = [n for n, m in module.named_modules() if is_lora_layer(m)]
    in_wrapped = tuple(n + "." for n in wrapped)
    new = [n for n, m in module.named_modules() if type(m) is nn.Linear and _matches(n, targets)
           and _inside(n, prefixes) and not n.startswith(in_wrapped)]
    if not new:
        if not any(_matches(n, targets) and _inside(n, prefixes) for n in wrapped):
            shown = targets if isinstance(targets, str) else list(targets)
            raise ValueError(f"inject_lora: no nn.Linear in {type(module).__name__} matches {shown!r}")
        return []
    previous = getattr(module, "peft_config", {}).get(adapter_name)
    _inject(module, lora_config(new, rank, alpha, dropout, use_dora), adapter_name)
    if previous is not None:  # a second call: the stored config names every wrapped layer
        module.peft_config[adapter_name].target_modules = set(previous.target_modules) | set(new)
    return new


def lora_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The ``lora_A`` / ``lora_B`` parameters of every LoRA layer in ``module``."""
    return [p for n, p in module.named_parameters() if ".lora_A." in f".{n}" or ".lora_B." in f".{n}"]


def merge_lora(module: nn.Module, names: Iterable[str] | None = None) -> nn.Module:
    """Fold each LoRA layer (or the named ones) into its base linear and unwrap it, in place; returns module.

    peft's ``merge`` + ``get_base_layer`` (what ``LoraModel.merge_and_unload`` does). One-way: the factors are
    gone; the merged linear keeps the base layer's ``requires_grad`` (a frozen base stays frozen).
    """
    wanted = set(names) if names is not None else None
    for name, m in list(module.named_modules()):
        if is_lora_layer(m) and (wanted is None or name in wanted):
            m.merge(safe_merge=True)
            parent_name, _, child = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            setattr(parent, child, m.get_base_layer())
    left = {n for n, m in module.named_modules() if is_lora_layer(m)}
    if hasattr(module, "peft_config"):
        if not left:
            del module.peft_config
        else:
            for cfg in module.peft_config.values():
                if isinstance(cfg.target_modules, (set, list)):
                    cfg.target_modules = {t for t in cfg.target_modules if t in left or "." not in t}
    return module


def _require_peft_config(module: nn.Module, adapter_name: str) -> Any:
    cfg = getattr(module, "peft_config", {}).get(adapter_name)
    if cfg is None:
        raise ValueError(f"{type(module).__name__} has no LoRA adapter {adapter_name!r} (inject_lora on this "
                         "module first)")
    return cfg


def lora_state_dict(module: nn.Module, adapter_name: str = _DEFAULT,
                    state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Only the adapter weights of ``module`` (peft's ``get_peft_model_state_dict``: ``x.lora_A.weight``).

    ``state_dict``: take the values from this state dict of ``module`` (its own key names, e.g. an EMA copy's)
    instead of the live parameters.
    """
    from peft.utils import get_peft_model_state_dict

    _require_peft_config(module, adapter_name)
    return get_peft_model_state_dict(module, state_dict=state_dict, adapter_name=adapter_name)


def load_lora_state_dict(module: nn.Module, state: dict[str, torch.Tensor],
                         adapter_name: str = _DEFAULT) -> None:
    """Load adapter weights (keys as ``lora_state_dict`` writes them); every adapter key must be given.

    Raises:
        CheckpointError: A key is missing or unknown, or a shape differs.
    """
    from peft.utils import set_peft_model_state_dict

    from core.errors import CheckpointError

    own = lora_state_dict(module, adapter_name)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    mismatched = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or mismatched:
        raise CheckpointError(f"LoRA adapter does not match the model: missing {missing[:3]}, unexpected "
                              f"{unexpected[:3]}, mismatched {mismatched[:3]}")
    set_peft_model_state_dict(module, state, adapter_name=adapter_name)


def save_lora(module: nn.Module, directory: str | Path, adapter_name: str = _DEFAULT,
              state_dict: dict[str, torch.Tensor] | None = None, base_model: str | None = None) -> Path:
    """Write the adapter alone in peft's layout: ``adapter_config.json`` + ``adapter_model.safetensors``.

    ``peft.PeftModel.from_pretrained(<the un-adapted model>, directory)`` loads it; so does ``load_lora``.
    ``state_dict``: values to write instead of the live ones (``lora_state_dict``); ``base_model``: recorded as
    the config's ``base_model_name_or_path`` (the folder the adapter goes on; documentation for peft's loaders).
    """
    from core.checkpoint import save_weights
    from core.io import write_text

    cfg = _require_peft_config(module, adapter_name)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {_PEFT_PREFIX + k: v for k, v in lora_state_dict(module, adapter_name, state_dict).items()}
    save_weights(state, directory / ADAPTER_WEIGHTS_FILE, metadata={"format": "pt"})
    fields = cfg.to_dict()
    if base_model is not None:
        fields["base_model_name_or_path"] = base_model
    config = json.dumps(fields, indent=2, sort_keys=True, default=list)
    write_text(directory / ADAPTER_CONFIG_FILE, config + "\n")
    return directory


def load_lora(module: nn.Module, directory: str | Path, adapter_name: str = _DEFAULT) -> nn.Module:
    """Load an adapter folder (``save_lora`` or ``PeftModel.save_pretrained``) into ``module``, in place.

    The adapter's layers are injected first when ``module`` has none yet (from ``adapter_config.json``).
    """
    from peft import PeftConfig
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    from core.checkpoint import load_weights

    directory = Path(directory)
    state = load_weights(directory / ADAPTER_WEIGHTS_FILE)
    state = {k.removeprefix(_PEFT_PREFIX): v for k, v in state.items()}
    if getattr(module, "peft_config", {}).get(adapter_name) is None:
        kind = PeftConfig.from_pretrained(str(directory)).peft_type  # LoRA, FOURIERFT, WAVEFT, ...
        _inject(module, PEFT_TYPE_TO_CONFIG_MAPPING[kind].from_pretrained(str(directory)), adapter_name)
    load_lora_state_dict(module, state, adapter_name)
    return module

