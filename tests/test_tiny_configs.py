"""One tiny config per method: every ``configs/model/<m>_tiny.yaml`` (what users type as ``model=<m>_tiny``, and
what ``debug=tiny`` smoke runs compose) equals its modeling file's ``tiny_config()`` (what the tests and the
contract examples build), field by field, so that the two cannot drift apart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.config import compose, default_config_dir, to_object
from core.registry import import_target

# model=<name> -> (the modeling module's tiny_config, its positional arguments)
TINY = {
    "automot_tiny": ("driving.automot.modeling_automot:tiny_config", ()),
    "bc_tiny": ("worldmodels.bc.modeling_bc:tiny_config", ()),
    "deepvrm_tiny": ("perception.forensics.modeling_deepvrm:tiny_config", ()),
    "eacwm_tiny": ("worldmodels.lacwm.modeling_lacwm:tiny_config", ("eacwm",)),
    "fera_dit_tiny": ("perception.adapters.modeling_fera:tiny_config", ("dit",)),
    "fera_unet_tiny": ("perception.adapters.modeling_fera:tiny_config", ("unet",)),
    "flexforcing_tiny": ("perception.video.modeling_flexforcing:tiny_config", ()),
    "lacwm_tiny": ("worldmodels.lacwm.modeling_lacwm:tiny_config", ("lacwm",)),
    "sola_tiny": ("perception.spherical.modeling_sola:tiny_config", ()),
    "transnormal_tiny": ("perception.normals.modeling_transnormal:tiny_config", ()),
}


def test_every_tiny_yaml_has_a_tiny_config():
    files = sorted(p.stem for p in Path(default_config_dir(), "model").glob("*_tiny.yaml"))
    assert files == sorted(TINY), f"configs/model/*_tiny.yaml without a tiny_config() here: " \
                                  f"{sorted(set(files) - set(TINY))}; listed without a file: {sorted(set(TINY) - set(files))}"


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_yaml_equals_tiny_config(name):
    target, args = TINY[name]
    from_yaml = to_object(compose([f"model={name}"]).model)
    from_code = import_target(target)(*args)
    assert type(from_yaml) is type(from_code), f"{name}: {type(from_yaml).__name__} vs {type(from_code).__name__}"
    differ = {f.name: (getattr(from_yaml, f.name), getattr(from_code, f.name)) for f in dataclasses.fields(from_code)
              if getattr(from_yaml, f.name) != getattr(from_code, f.name)}
    assert not differ, f"configs/model/{name}.yaml vs {target}: " + "; ".join(
        f"model.{k} is {a!r} in the YAML, {b!r} in tiny_config()" for k, (a, b) in differ.items())
