"""Two-layer feed-forward network (the transformer MLP)."""

from __future__ import annotations

import torch
from torch import nn


class Mlp(nn.Module):
    """``Linear -> activation -> dropout -> Linear -> dropout`` on the last dim.

    Args:
        in_features: Input width ``C``.
        hidden_features: Hidden width (default ``4 * C``).
        out_features: Output width (default ``C``).
        act_layer: Activation module class.
        drop: Dropout probability after the activation and after the output layer.
    """

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        hidden_features = hidden_features or 4 * in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias, **kw)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias, **kw)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., C_in) -> (..., C_out)."""
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))
