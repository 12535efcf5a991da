"""Config tree: every group composes, typos fail naming the key, the resolved config is saved."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from core.config import TrainerConfig, compose, default_config_dir, save_resolved, to_object
from core.errors import ConfigError

GROUPS = ["model", "data", "env", "adapter", "algo", "trainer", "experiment", "debug"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (default_config_dir() / group).glob("*.yaml"))


def test_every_group_has_options():
    for group in GROUPS:
        assert (default_config_dir() / group).is_dir(), group
    assert "tiny" in _options("debug")


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if group != "debug":
        overrides.append("debug=tiny")
    cfg = compose(overrides)
    assert cfg.trainer.max_steps >= 1
    if group in ("model", "data", "env"):
        assert cfg[group] is not None


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["trainer.max_stpes=3"], "did you mean max_steps"),
        (["trainer.optim.lrr=1"], "lrr"),
        (["+methd=x"], "did you mean method"),
        (["debug=tinyy"], "debug/tinyy"),
        (["trainer.max_steps=0"], "trainer.max_steps must be >= 1"),
        (["trainer.precision=fp16"], "trainer.precision must be one of"),
        (["trainer.batch_size=abc"], "batch_size"),
    ],
)
def test_bad_keys_and_values_fail_with_the_name(overrides, needle):
    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)  # one line for the CLI


def test_typo_in_a_yaml_file_is_caught(tmp_path):
    (tmp_path / "trainer").mkdir()
    for name in ("config.yaml",):
        (tmp_path / name).write_text((default_config_dir() / name).read_text())
    (tmp_path / "trainer" / "default.yaml").write_text("defaults:\n  - trainer_schema\n  - _self_\nbach_size: 3\n")
    with pytest.raises(ConfigError, match="bach_size"):
        compose([], config_dir=tmp_path)


def test_structured_nodes_become_validated_dataclasses():
    cfg = compose(["debug=tiny", "trainer.optim.lr=0.5"])
    t = to_object(cfg.trainer)
    assert isinstance(t, TrainerConfig) and t.optim.lr == 0.5 and t.max_steps == 4


def test_resolved_config_saved(tmp_path):
    cfg = compose(["debug=tiny"])
    path = save_resolved(cfg, tmp_path)
    data = json.loads(path.read_text())
    assert data["trainer"]["batch_size"] == 2
    assert OmegaConf.load(tmp_path / "config.yaml").trainer.batch_size == 2
    assert not list(tmp_path.glob(".*tmp*"))  # no temp files left behind


def test_choice_lists_show_no_internal_schema_names():
    with pytest.raises(ConfigError) as e:
        compose(["experiment=bc", "model=nope"])
    msg = str(e.value)
    assert "available: " in msg and "bc_tiny" in msg and "_schema" not in msg
