"""The shared model checks themselves: each must fail on a model that is broken the way it checks for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from core.testing import ModelChecks, ToyRegressor


class _Checks(ModelChecks):
    """ModelChecks over a model class given per test (the check methods are called directly)."""

    def __init__(self, model_cls: type[nn.Module], no_grad_params: tuple[str, ...] = ()):
        self.model_cls = model_cls
        self.no_grad_params = no_grad_params

    def make_model(self):
        return self.model_cls()

    def make_batch(self):
        return {"x": torch.randn(3, 8, generator=torch.Generator().manual_seed(0))}


class _NumpyInit(nn.Module):
    """Initialised from NumPy's global RNG: two models built after the same torch seed differ."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        with torch.no_grad():
            self.lin.weight.copy_(torch.from_numpy(np.random.randn(4, 8)))

    def forward(self, x):
        return self.lin(x)


class _NoisyEval(nn.Module):
    """Draws noise from torch's global RNG even in eval mode."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x) + 0.1 * torch.randn(x.shape[0], 4)


class _Stateful(nn.Module):
    """Each call changes the next call's output (a counter leaks into the output)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * self.calls


class _Unused(nn.Module):
    """``extra`` never takes part in the forward: it gets no gradient."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.extra = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class _Detached(ToyRegressor):
    """``training_step`` detaches the first layer's output: that layer never learns."""

    def training_step(self, batch):
        h = self.net[0](batch["x"]).detach()
        pred = self.net[3](self.net[1](h))
        return {"loss": nn.functional.mse_loss(pred, batch["y"])}


class _InfGrad(nn.Module):
    """A finite output whose gradient w.r.t. ``scale`` is infinite (d sqrt(s) / ds at s = 0)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.scale = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.lin(x) * torch.sqrt(self.scale).add(1.0)


class _ToyChecks(_Checks):
    def make_train_batch(self):
        g = torch.Generator().manual_seed(0)
        return {"x": torch.randn(3, 8, generator=g), "y": torch.randn(3, 4, generator=g)}


def test_good_model_passes_every_check(tmp_path):
    checks = _ToyChecks(lambda: ToyRegressor(dropout=0.1))
    checks.test_save_load_bit_exact(tmp_path)
    checks.test_deterministic_eval()
    checks.test_forward_does_not_mutate_batch()
    checks.test_outputs_finite()
    checks.test_gradient_flow()


@pytest.mark.parametrize("model_cls", [_NumpyInit, _NoisyEval, _Stateful], ids=["init", "rng", "state"])
def test_deterministic_eval_catches_nondeterminism(model_cls):
    with pytest.raises(AssertionError):
        _Checks(model_cls).test_deterministic_eval()


def test_deterministic_eval_passes_a_deterministic_model():
    _Checks(_Unused).test_deterministic_eval()


def test_gradient_flow_catches_an_unused_parameter():
    with pytest.raises(AssertionError, match="extra.weight"):
        _Checks(_Unused).test_gradient_flow()
    _Checks(_Unused, no_grad_params=("extra.",)).test_gradient_flow()  # declared unused: fine


def test_gradient_flow_uses_training_step():
    with pytest.raises(AssertionError, match="net.0.weight"):
        _ToyChecks(_Detached).test_gradient_flow()


def test_gradient_flow_catches_a_non_finite_gradient():
    with pytest.raises(AssertionError, match="scale"):
        _Checks(_InfGrad).test_gradient_flow()


def test_gradient_flow_rejects_a_stale_no_grad_entry():
    with pytest.raises(AssertionError, match="nothing"):
        _Checks(_Unused, no_grad_params=("extra.", "nothing")).test_gradient_flow()
