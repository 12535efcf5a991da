"""The model contract, checked for every registered method — including ones registered from another distribution.

Each method declares ``register_method(..., model="module:Class", example="module:function")``; the example is a
tiny model and a fixed input (``core.testing.ModelExample``). For every method this module checks:

* the model is the registered ``core.pretrained.PreTrainedModel`` class and ``load_pretrained`` rebuilds it;
* ``ModelChecks``: determinism, gradient flow, save -> load bit-exactness (checkpoint and export), the bf16 round
  trip, finite outputs, the batch left unchanged;
* a model around a base folder (``base_fields``) references it without writing to it;
* a bf16-autocast training step agrees with fp32; gradient checkpointing gives the same gradients with fewer
  saved activations; one training step under FSDP2 on 2 gloo processes gives one process's gradients (one
  torchrun job for all methods);
* the output on the fixed input equals the committed golden file ``tests/golden/<method>.safetensors``
  (regenerate: ``python -m core.testing golden METHOD --why "..."``; see tests/golden/README.md).

The method list is read from the registry when the tests are collected, so nothing here names a method.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.registry import MODELS, load_plugins, method_specs
from core.testing import check_golden, example_checks, example_of, folder_digest

load_plugins()
METHODS = [s.name for s in method_specs()]
CHECKS = ("save_load_bit_exact", "save_pretrained_from_pretrained_same_output", "dtype_round_trip",
          "deterministic_eval", "gradient_flow", "gradient_checkpointing", "bf16_autocast_step", "forward_does_not_mutate_batch",
          "outputs_finite")

_examples: dict[str, object] = {}


@pytest.fixture
def example(request, tmp_path_factory):
    """The method's ``ModelExample``, built once per session (a VLM method's example writes a tiny base)."""
    method = request.param
    spec = next(s for s in method_specs() if s.name == method)
    assert spec.model, f"method {method!r} registers no model class (register_method(..., model='module:Class'))"
    assert spec.example, f"method {method!r} declares no example= (a core.testing.ModelExample factory)"
    if method not in _examples:
        _examples[method] = example_of(method, tmp_path_factory.mktemp(f"example_{method}"))
    return method, _examples[method]


def test_method_list_is_not_empty():
    assert len(METHODS) >= 1
    # every registered method is in the contract: it declares its model class and its example
    missing = [s.name for s in method_specs() if not (s.model and s.example)]
    assert not missing, f"methods without model= / example= in register_method: {missing}"


@pytest.mark.parametrize("example", METHODS, indirect=True)
@pytest.mark.parametrize("check", CHECKS)
def test_model_checks(example, check, tmp_path):
    _, ex = example
    checks = example_checks(ex)
    fn = getattr(checks, f"test_{check}")
    fn(tmp_path) if "tmp_path" in fn.__code__.co_varnames[:fn.__code__.co_argcount] else fn()


@pytest.mark.parametrize("example", METHODS, indirect=True)
def test_registered_class_and_load_pretrained(example, tmp_path):
    """``load_pretrained`` on an exported folder builds the method's registered class with the same outputs."""
    from core.pretrained import PreTrainedModel, load_pretrained

    method, ex = example
    torch.manual_seed(0)
    model = ex.build().eval()
    cls = MODELS.get(method)
    assert isinstance(model, cls) and issubclass(cls, PreTrainedModel), \
        f"{method}: the example builds {type(model).__name__}, the registry names {cls.__name__}"
    assert model.method == method or cls._accepts_method(method)
    folder = model.save_pretrained(tmp_path / "export")
    loaded = load_pretrained(folder)
    assert isinstance(loaded, cls) and type(loaded) is type(model)
    run = ex.run or (lambda m, b: m(**b))
    from core.testing import ModelChecks

    with torch.no_grad():
        for a, b in zip(ModelChecks._flat(run(model, ex.inputs())), ModelChecks._flat(run(loaded, ex.inputs())),
                        strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("example", METHODS, indirect=True)
def test_base_folders_referenced_not_written(example, tmp_path):
    """A model around a base stores only what it trained, references the base, and leaves the base byte-identical;
    ``copy_base=True`` gives a self-contained folder that loads with the base moved away."""
    import shutil

    method, ex = example
    torch.manual_seed(0)
    model = ex.build().eval()
    bases = model.base_folders()
    if not bases:
        assert not model.base_fields or all(getattr(model.config, f) in (None, "") for f in model.base_fields)
        return
    before = {k: folder_digest(v, dirs=True) for k, v in bases.items()}
    trained = model.trained_state_dict()
    assert 0 < len(trained) <= len(model.state_dict())
    ref = model.save_pretrained(tmp_path / "ref")
    from core.checkpoint import load_weights
    from core.pretrained import read_config

    assert sorted(load_weights(ref / "model.safetensors")) == sorted(trained)
    for name, base in bases.items():
        assert Path(read_config(ref)["model"][name]) == base.resolve()
        assert not (ref / "base").exists()
    type(model).from_pretrained(ref)
    with pytest.raises(Exception, match="base"):
        model.save_pretrained(next(iter(bases.values())) / "inside")
    assert {k: folder_digest(v, dirs=True) for k, v in bases.items()} == before, "a base folder was written"
    own = model.save_pretrained(tmp_path / "own", copy_base=True)
    moved = tmp_path / "moved"
    shutil.move(str(own), moved)
    loaded = type(model).from_pretrained(moved)
    sd_a, sd_b = model.state_dict(), loaded.state_dict()
    assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


@pytest.mark.parametrize("example", METHODS, indirect=True)
def test_golden_output(example):
    method, ex = example
    check_golden(method, ex)


_FSDP_REPORT: dict[str, dict] = {}


def _fsdp_report(request, tmp_path_factory) -> dict[str, dict]:
    """The FSDP2 check (``python -m core.testing fsdp``) of every method selected in this session, from one
    2-process gloo job run once (``-k outside_toy`` shards only that method)."""
    import json
    import os
    import socket
    import subprocess
    import sys

    if not _FSDP_REPORT:
        selected = [it.callspec.params["method"] for it in request.session.items
                    if getattr(it, "originalname", "") == "test_fsdp_step_equals_one_process"]
        work = tmp_path_factory.mktemp("fsdp_contract")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        repo = Path(__file__).resolve().parents[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
               f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "core.testing", "fsdp", *selected,
               "--workdir", str(work / "examples"), "--out", str(work / "report.json")]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        report = work / "report.json"
        # the report is written before teardown, so a gloo abort at process exit does not hide it
        assert report.is_file(), f"the FSDP job wrote no report (exit {res.returncode}):\n{res.stderr[-3000:]}"
        _FSDP_REPORT.update(json.loads(report.read_text()))
    return _FSDP_REPORT


@pytest.mark.parametrize("method", METHODS)
def test_fsdp_step_equals_one_process(method, request, tmp_path_factory):
    """One training step of the method's example under FSDP2 on 2 gloo processes (gradient checkpointing on, as
    ``trainer=fsdp`` sets it; sharded with the trainer's own ``shard_fsdp``) gives one process's gradients."""
    row = _fsdp_report(request, tmp_path_factory).get(method)
    assert row is not None, f"{method}: missing from the FSDP report"
    assert row["error"] is None, f"{method} under FSDP: {row['error']}\n{row.get('trace', '')}"
    assert row["params"] > 0 and row["ok"], \
        f"{method}: sharded gradients differ by {row['max_abs_diff']:.3g} (largest gradient {row['max_ref']:.3g})"
