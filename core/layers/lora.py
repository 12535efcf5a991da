"""LoRA (Hu et al., ICLR 2022): low-rank updates ``W + (alpha / r) B A`` on frozen linear layers.

``inject_lora(module, targets, rank)`` replaces every ``nn.Linear`` whose qualified name matches one of
``targets`` (a suffix such as ``"attn.q"`` or a plain layer name such as ``"q"``) by a ``LoRALinear`` that
wraps it; the base weights are frozen and ``B`` starts at zero, so the wrapped module computes exactly what
it did before. ``lora_parameters`` lists the trainable adapter weights, ``merge_lora`` folds them back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable rank-``r`` update.

    ``y = base(x) + (alpha / r) * dropout(x) @ A^T @ B^T`` with ``A`` (r, in) Kaiming-uniform and ``B``
    (out, r) zero at init.

    Args:
        base: The linear layer to adapt (its parameters are set to ``requires_grad=False``).
        rank: ``r`` >= 1.
        alpha: Scale numerator (default ``rank``: scale 1).
        dropout: Dropout on the adapter input.
    """

    def __init__(self, base: nn.Linear, rank: int = 4, alpha: float | None = None, dropout: float = 0.0):
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.rank = rank
        self.scale = (alpha if alpha is not None else rank) / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **kw))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **kw))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in) -> (..., out)."""
        return self.base(x) + (self.dropout(x) @ self.lora_A.t() @ self.lora_B.t()) * self.scale

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` with the update folded into its weight (one-way: the factors are gone).

        The merged parameters keep the base layer's ``requires_grad`` (a frozen base stays frozen).
        """
        out = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None,
                        device=self.base.weight.device, dtype=self.base.weight.dtype)
        out.weight.copy_(self.base.weight + self.scale * self.lora_B @ self.lora_A)
        out.weight.requires_grad_(self.base.weight.requires_grad)
        if self.base.bias is not None:
            out.bias.copy_(self.base.bias)
            out.bias.requires_grad_(self.base.bias.requires_grad)
        return out


def _matches(name: str, targets: Sequence[str]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def inject_lora(module: nn.Module, targets: Sequence[str], rank: int = 4, alpha: float | None = None,
                dropout: float = 0.0) -> list[str]:
    """Wrap every matching ``nn.Linear`` inside ``module`` in a ``LoRALinear`` (in place).

    Args:
        module: Root module.
        targets: Qualified-name suffixes of the linears to adapt (e.g. ``["q", "k", "v", "proj"]``).
        rank, alpha, dropout: See ``LoRALinear``.

    Returns:
        The qualified names that were wrapped (already-wrapped layers are skipped).

    Raises:
        ValueError: No linear layer matched ``targets``.
    """
    found = [(n, m) for n, m in module.named_modules()
             if isinstance(m, nn.Linear) and _matches(n.removesuffix(".base"), targets)]
    wrapped_bases = {id(m.base) for m in module.modules() if isinstance(m, LoRALinear)}
    done = []
    for name, lin in found:
        if id(lin) in wrapped_bases:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, LoRALinear(lin, rank, alpha, dropout))
        done.append(name)
    if not found:
        raise ValueError(f"inject_lora: no nn.Linear in {type(module).__name__} matches {list(targets)}")
    return done


def lora_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The ``lora_A`` / ``lora_B`` parameters of every ``LoRALinear`` in ``module``."""
    return [p for m in module.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]


def lora_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapter weights of ``module`` (keys as in ``module.state_dict()``)."""
    return {k: v for k, v in module.state_dict().items() if k.endswith(("lora_A", "lora_B"))}


def merge_lora(module: nn.Module, names: Iterable[str] | None = None) -> nn.Module:
    """Replace every ``LoRALinear`` (or those named) by its merged ``nn.Linear``, in place; returns ``module``."""
    wanted = set(names) if names is not None else None
    for name, m in list(module.named_modules()):
        if isinstance(m, LoRALinear) and (wanted is None or name in wanted):
            parent_name, _, child = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            setattr(parent, child, m.merged())
    return module
