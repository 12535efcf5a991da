"""Activation (gradient) checkpointing of a model's blocks, without changing its state-dict keys.

``checkpoint_modules(units)`` makes each unit's forward run under ``torch.utils.checkpoint`` (non-reentrant,
RNG state preserved, so dropout draws the same masks in the recompute) while autograd records: the unit keeps
only its inputs for backward and recomputes its activations there. Unlike wrapping the unit in another module
(torch's ``checkpoint_wrapper``), the forward is replaced on the instance, so parameter names — and therefore
checkpoints, golden files and FSDP unit selection — stay what they were. Under FSDP2 ``fully_shard`` the
unit's pre-forward hook still runs around the checkpointed forward, and the recompute in backward runs after
the unit's pre-backward unshard, which is the order torchtitan applies them in.

``block_units(model)`` is the default choice of units, shared with the trainer's FSDP units: every element of
the model's outermost ``nn.ModuleList``s (transformer / U-Net blocks in every model here).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["block_units", "checkpoint_modules", "is_checkpointed", "uncheckpoint_modules"]

_ORIGINAL = "_embodied_forward_before_checkpointing"


def block_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every element of the outermost ``nn.ModuleList``s of ``model`` (pre-order).

    An element that is itself a ``ModuleList`` / ``ModuleDict`` (a list of stages) is replaced by its own
    elements: a container has no forward to checkpoint or shard.
    """
    named: list[tuple[str, nn.Module]] = []
    expanded: set[str] = set()

    def add(prefix: str, container: nn.Module) -> None:
        expanded.add(prefix)
        for k, c in container.named_children():
            name = f"{prefix}.{k}" if prefix else k
            if isinstance(c, (nn.ModuleList, nn.ModuleDict)):  # a list of stages: its blocks are the units
                add(name, c)
            else:
                named.append((name, c))

    for n, m in model.named_modules():  # pre-order: an outer ModuleList is met before any inner one
        inside = n in expanded or any(n.startswith(u + ".") for u, _ in named)
        if isinstance(m, nn.ModuleList) and not inside:
            add(n, m)
    return named


def _checkpointed_forward(module: nn.Module, *args, **kwargs):
    forward = getattr(module, _ORIGINAL)
    if not (torch.is_grad_enabled() and module.training):
        return forward(*args, **kwargs)  # eval / no_grad: nothing is saved for backward anyway
    return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


def checkpoint_modules(units: Iterable[nn.Module]) -> int:
    """Checkpoint each unit's forward in training mode (idempotent); returns how many units are checkpointed.

    Raises:
        ValueError: ``units`` is empty (checkpointing would silently do nothing).
    """
    count = 0
    for unit in units:
        if not hasattr(unit, _ORIGINAL):
            setattr(unit, _ORIGINAL, unit.forward)
            unit.forward = functools.partial(_checkpointed_forward, unit)
        count += 1
    if count == 0:
        raise ValueError("no module to checkpoint: the model has no block units (define checkpoint_units())")
    return count


def uncheckpoint_modules(model: nn.Module) -> None:
    """Undo ``checkpoint_modules`` on every submodule of ``model``."""
    for m in model.modules():
        if hasattr(m, _ORIGINAL):
            m.forward = getattr(m, _ORIGINAL)
            delattr(m, _ORIGINAL)


def is_checkpointed(module: nn.Module) -> bool:
    """Whether ``checkpoint_modules`` wrapped this module's forward."""
    return hasattr(module, _ORIGINAL)
