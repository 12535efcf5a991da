"""A method registered from outside the repository is covered by the contract test without a test of its own.

A throwaway distribution (a package and its ``.dist-info`` with an ``embodied.methods`` entry point) is put on
``PYTHONPATH``; the contract test, run in a child process, must collect and pass its checks, and fail the golden
check until the golden file exists (and again when it no longer matches).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MODEL = '''
import dataclasses
import torch
from torch import nn
from core.pretrained import PreTrainedModel
from core.testing import ModelExample


@dataclasses.dataclass
class OutsideConfig:
    width: int = 8
    scale: float = 1.0


class OutsideModel(PreTrainedModel):
    config_class = OutsideConfig
    method = "outside_toy"

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.net = nn.Sequential(nn.Linear(4, config.width), nn.Tanh(), nn.Linear(config.width, 2))

    def forward(self, x):
        return self.net(x) * self.config.scale

    def training_step(self, batch):
        return {"loss": (self(batch["x"]) - 1).pow(2).mean()}


def example(workdir):
    scale = float(__import__("os").environ.get("OUTSIDE_SCALE", "1.0"))
    return ModelExample(build=lambda: OutsideModel(OutsideConfig(scale=scale)),
                        inputs=lambda: {"x": torch.randn(3, 4, generator=torch.Generator().manual_seed(0))})
'''

REGISTER = '''
from core.registry import register_method

register_method("outside_toy", folder="(outside)", description="a toy method from another distribution",
                task="outside_toy.model", model="outside_toy.model:OutsideModel", example="outside_toy.model:example",
                arms={"outside_toy": []})
'''


@pytest.fixture
def outside(tmp_path):
    pkg = tmp_path / "site" / "outside_toy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text(textwrap.dedent(MODEL))
    (pkg / "register.py").write_text(textwrap.dedent(REGISTER))
    info = tmp_path / "site" / "outside_toy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[embodied.methods]\noutside_toy = outside_toy.register\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)]),
           "EMBODIED_GOLDEN_DIR": str(tmp_path / "golden"), "OMP_NUM_THREADS": "1"}
    return env


def _contract(env, fsdp: bool = False) -> subprocess.CompletedProcess:
    """The contract test for the outside method (its FSDP check, a 2-process job, only when asked)."""
    select = "outside_toy" if fsdp else "outside_toy and not fsdp"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select,
                           str(ROOT / "tests" / "test_model_contract.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_outside_method_is_collected_and_checked(outside, tmp_path):
    first = _contract(outside)
    assert "outside_toy" in first.stdout or "1 failed" in first.stdout, first.stdout[-2000:]
    assert first.returncode != 0 and "1 failed" in first.stdout, first.stdout[-2000:]
    assert "no golden file for 'outside_toy'" in first.stdout

    made = subprocess.run([sys.executable, "-m", "core.testing", "golden", "outside_toy", "--why", "test"],
                          cwd=ROOT, env=outside, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert (tmp_path / "golden" / "outside_toy.safetensors").is_file()
    assert "`outside_toy`: test" in (tmp_path / "golden" / "CHANGES.md").read_text()

    second = _contract(outside, fsdp=True)
    assert second.returncode == 0, second.stdout[-2000:]
    n_passed = int(second.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert n_passed >= 12  # 8 ModelChecks + registry / load_pretrained + base folders + golden + FSDP

    changed = _contract({**outside, "OUTSIDE_SCALE": "1.5"})  # the computation changed: only the golden fails
    assert changed.returncode != 0 and "1 failed" in changed.stdout
    assert "differs from its golden file" in changed.stdout
