"""Deep-VRM's image size has one source of truth: ``data.size`` follows ``model.image_size`` (issue 29).

``configs/data/deepvrm.yaml`` sets ``size: ${model.image_size}``, so ``model=deepvrm_paper`` reads its images at
448 px without a second override, and a run that sets the two apart stops with one line before any work.
"""

from __future__ import annotations

import json

import pytest
import yaml

from embodied.cli import EXIT_BAD_INPUT, main
from tests.perception.forensics.test_deepvrm import _write_layout


def _printed(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--print-config"]) == 0, capsys.readouterr().err
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("overrides, size", [
    (["model=deepvrm_paper", "model.base_path=/nowhere/Qwen2.5-VL-7B-Instruct"], 448),
    (["model=deepvrm_tiny"], 32),
    ([], 64),
    (["model=deepvrm_tiny", "model.image_size=48"], 48),
])
def test_data_size_follows_model_image_size(capsys, overrides, size):
    cfg = _printed(capsys, ["train", "deepvrm", *overrides])
    assert cfg["model"]["image_size"] == size and cfg["data"]["size"] == size


def test_paper_config_loads_in_the_dtype_asked_for(capsys):
    cfg = _printed(capsys, ["train", "deepvrm", "model=deepvrm_paper", "model.base_path=/x",
                            "model.base_dtype=bfloat16"])
    assert cfg["model"]["base_dtype"] == "bfloat16"
    assert main(["train", "deepvrm", "model=deepvrm_paper", "model.base_path=/x", "model.base_dtype=int4",
                 "--print-config"]) == EXIT_BAD_INPUT
    assert "model.base_dtype must be one of" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_tiny_run_reads_its_data_at_the_models_size(tmp_path, capsys):
    """Files on disk at 40 px, model at 32 px, no data.size given: the run trains on 32 px images (what the
    model takes); an explicit data.size that disagrees is refused in one line before anything is built."""
    data = tmp_path / "gi"
    _write_layout(data, n=3, size=40)
    common = ["debug=tiny", "model=deepvrm_tiny", f"data.root={data}", "data.generators=[blur,box]",
              "data.stage1=[blur]", "data.stage2=[]", "data.holdout=box", "data.qa_train=4", "data.qa_test=2",
              f"data.qa_root={tmp_path / 'qa'}", f"model.base_path={tmp_path / 'base'}", "trainer.max_steps=2",
              "model.pretrain_steps=1"]
    bad = main(["train", "deepvrm", *common, "data.size=40", f"out_dir={tmp_path / 'bad'}"])
    err = capsys.readouterr().err
    assert bad == EXIT_BAD_INPUT and "data.size (40) must equal model.image_size (32)" in err
    assert not (tmp_path / "base").exists()  # refused before the base is built
    assert main(["train", "deepvrm", *common, f"out_dir={tmp_path / 'run'}"]) == 0, capsys.readouterr().err
    resolved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert resolved["data"]["size"] == resolved["model"]["image_size"] == 32
    detector = json.loads((tmp_path / "run" / "detector" / "config.json").read_text())
    assert detector["model"]["image_size"] == detector["data"]["size"] == 32
    assert detector["model"]["base_dtype"] == "float32"  # the default: loaded as before
