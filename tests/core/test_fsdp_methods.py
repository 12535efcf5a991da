"""Every multi-stage method trains end to end under ``trainer=fsdp`` on 2 gloo processes (torchrun, CPU), through
the CLI, and leaves a checkpoint a plain process loads.

What this guards: a model whose forward reads a unit's parameters without calling that unit (AutoMoT's joint
stack), a unit called a rank-dependent number of times (Flex-Forcing's key projections), and a stage that uses
the model after an FSDP stage (``Trainer.release``). Slow: each method is a real tiny training run (~1 minute).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core import checkpoint as ckpt

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _tiny(method: str, tmp: Path) -> list[str]:
    """Overrides that shrink a method's data and model to seconds (on top of ``debug=tiny``)."""
    if method == "automot":
        return ["model=automot_tiny", "data.episodes=1", "data.test_episodes=1", "data.scenarios=[highway,merge]",
                "data.horizon_s=3", "data.workers=1", "data.eval_episodes=0", "trainer.max_steps=3",
                "trainer.batch_size=4", "trainer.ckpt_every=100", "model.refiner_steps=3",
                f"data.root={tmp / 'data'}", f"model.base_path={tmp / 'base'}"]
    if method == "flexforcing":
        return ["model=flexforcing_tiny", "data.size=16", "data.render_n=8", "data.render_frames=8", "data.test_n=2",
                "data.test_frames=8", "data.eval_frames=8", f"data.root={tmp / 'data'}",
                f"data.test_root={tmp / 'test'}"]
    if method == "sola":
        return ["model=sola_tiny", "data.render_n=8", "data.height=16", "data.test_fraction=0.5",
                f"data.root={tmp / 'data'}"]
    if method == "transnormal":
        return ["model.image_size=32", "model.vae_pretrain_steps=2", "trainer.max_steps=3", "data.image_size=32",
                "data.render_n=4", "data.render_size=32", "data.render_spp=4", "data.test_fraction=0.25",
                f"data.root={tmp / 'data'}"]
    if method == "bc":
        return ["model=bc_tiny", "data.record.episodes=1", "data.record.image_size=32",
                f"data.paths=[{tmp / 'data' / 'reach.hdf5'}]"]
    if method == "lacwm":
        return ["model=lacwm_tiny", "data.num_pretrain_embodiments=1", "data.episodes=1", "data.adapt_episodes=1",
                "data.test_episodes=1", "data.max_steps=12", "data.image_size=32", "trainer.max_steps=3",
                "model.frame_skip=1", f"data.root={tmp / 'data'}"]
    if method == "deepvrm":  # data.root: a GenImage layout written by _genimage_layout; the QA set is rendered
        return ["model=deepvrm_tiny", "model.image_size=32", "data.size=32", "data.generators=[blur,box]",
                "data.stage1=[blur]", "data.stage2=[]", "data.holdout=box", "data.qa_train=6", "data.qa_test=3",
                f"data.root={tmp / 'gi'}", f"data.qa_root={tmp / 'qa'}", f"model.base_path={tmp / 'base'}"]
    if method == "fera":
        return ["model=fera_unet_tiny", f"model.pretrain_dir={tmp / 'base'}", f"data.source_root={tmp / 'src'}",
                "data.source_clips=2", "data.source_frames=4", "data.shots=8", "data.test_n=8", "data.curve_n=4",
                "data.eval_every=2", "data.fd_samples=4"]
    raise AssertionError(method)


def _genimage_layout(root: Path) -> None:
    """A user's GenImage layout (generators ``blur`` and ``box``), as Deep-VRM's own tests write it."""
    from tests.perception.forensics.test_deepvrm import _write_layout

    _write_layout(root, n=4, size=32)


def _checkpoint(method: str, out: Path) -> Path:
    """The run's final trained weights (a folder ``ckpt.load_weights`` / the method's loader reads)."""
    folder = {"automot": "policy", "lacwm": "adapted", "deepvrm": "detector", "fera": "adapter"}.get(method)
    return out / folder if folder else ckpt.resolve_checkpoint(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(args: list[str], nproc: int | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "embodied", "train", *args]
    if nproc:
        port = _free_port()
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={port}",
               f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "embodied", "train", *args]
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("method", ["automot", "flexforcing"])
def test_method_trains_under_two_process_fsdp(method, precision, tmp_path):
    tiny = ["debug=tiny", *_tiny(method, tmp_path)]
    if method == "automot":  # the base VLM is pretrained by a single process (a distributed run refuses to)
        prep = _train([method, *tiny, f"out_dir={tmp_path / 'prep'}", "trainer.max_steps=1", "model.refiner_steps=0"],
                      None)
        assert prep.returncode == 0, prep.stderr[-3000:]
    out = tmp_path / "fsdp"
    res = _train([method, *tiny, "trainer=fsdp", f"trainer.precision={precision}", f"out_dir={out}"], 2)
    assert res.returncode == 0, res.stderr[-4000:]
    folder = _checkpoint(method, out)
    weights = ckpt.load_weights(folder / ckpt.MODEL_FILE)
    assert weights and all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    assert not any("_fsdp" in k or "DTensor" in type(v).__name__ for k, v in weights.items())
    if method == "automot":
        from driving.automot.task import load_model

        policy = load_model(out)  # strict: every key and shape
        assert policy.refiner is not None
    else:
        from core.config import compose, to_object
        from perception.video.modeling_flexforcing import FlexForcingModel

        model = FlexForcingModel(to_object(compose([f"experiment={method}", *tiny]).model))
        ckpt.load_checkpoint(out, model)  # strict: every key and shape
        assert model.latent_std.min() > 0 and not torch.equal(model.latent_std, torch.ones_like(model.latent_std))


# Single-stage or data-heavy methods: every rank asks for the same dataset at once (core.distributed.
# main_process_first: one renders or records it, the other waits and reads it). Bases that a distributed run
# refuses to pretrain (Deep-VRM's VLM, FeRA's pixel base) are made by a one-process run first.
@pytest.mark.parametrize("method", ["sola", "transnormal", "bc", "lacwm", "deepvrm", "fera"])
def test_method_trains_from_fresh_data_under_two_process_fsdp(method, tmp_path):
    tiny = ["debug=tiny", *_tiny(method, tmp_path)]
    if method == "deepvrm":
        _genimage_layout(tmp_path / "gi")
    if method in ("deepvrm", "fera"):
        prep = _train([method, *tiny, f"out_dir={tmp_path / 'prep'}", "trainer.max_steps=1"], None)
        assert prep.returncode == 0, prep.stderr[-3000:]
        if method == "deepvrm":  # the distributed run renders its QA sets afresh
            tiny = [t.replace(f"data.qa_root={tmp_path / 'qa'}", f"data.qa_root={tmp_path / 'qa2'}") for t in tiny]
    out = tmp_path / "fsdp"
    res = _train([method, *tiny, "trainer=fsdp", f"out_dir={out}"], 2)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "another process" not in res.stderr and "failed making it" not in res.stderr
    weights = ckpt.load_weights(_checkpoint(method, out) / ckpt.MODEL_FILE)
    assert weights and all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    assert not any("_fsdp" in k or "DTensor" in type(v).__name__ for k, v in weights.items())
    data = tmp_path / ("src" if method == "fera" else "qa2" if method == "deepvrm" else "data")
    left = [p.name for p in data.parent.iterdir() if p.name.endswith((".lock", ".failed.json"))]
    assert left == []  # the data was made once, cleanly: no lock file or failure note left beside it
