"""Fixtures of the TransNormal tests: the tiny config (``modeling_transnormal.tiny_config``) and a tiny rendered
dataset (session-wide)."""

from __future__ import annotations

import pytest

from perception.normals.modeling_transnormal import tiny_config


@pytest.fixture
def tiny():
    return tiny_config


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """4 path-traced close-up views (3 train, 1 test) at 32 px, 4 spp, real HDR light (the default experiment's
    source and framing): seconds to make."""
    from sim.render.normals import make_dataset

    root = tmp_path_factory.mktemp("transnormal_data") / "normals"
    make_dataset(root, n=4, seed=3, size=32, spp=4, test_fraction=0.25, source="real", framing="closeup")
    return root
