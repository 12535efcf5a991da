"""FeRA end to end: config tree (adapter group), train (base pretraining + one arm), evaluate, infer, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.config import compose, to_object
from core.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


def overrides(root: Path, arm: str = "fera", model: str = "fera_unet_tiny", run: str | None = None) -> list[str]:
    return ["experiment=fera", "debug=tiny", f"model={model}", f"adapter={arm}",
            f"model.base_path={root / ('base_' + model)}", f"data.source_root={root / 'src'}",
            "data.source_clips=2", "data.source_frames=4", "data.shots=8", "data.test_n=8", "data.curve_n=4",
            "data.eval_every=2", "data.fd_samples=4", f"out_dir={root / (run or f'{model}_{arm}')}"]


def test_adapter_group_picks_the_arm_and_checks_keys(tmp_path):
    cfg = compose(overrides(tmp_path, "lora"))
    a = to_object(cfg.adapter)
    assert (a.kind, a.rank, a.name) == ("lora", 12, "lora")
    a = to_object(compose(overrides(tmp_path, "fera_norouter")).adapter)
    assert (a.kind, a.routing, a.fecl_weight, a.kappa_divisor) == ("fera", "uniform", 0.1, 32)
    assert to_object(compose(overrides(tmp_path, "fera_nofecl")).adapter).fecl_weight == 0.0
    assert "fera_unet_tiny_dora" in compose(overrides(tmp_path, "dora")).out_dir
    with pytest.raises(ConfigError, match="rnak"):
        compose(overrides(tmp_path) + ["adapter.rnak=3"])
    with pytest.raises(ConfigError, match="adapter.kind"):
        compose(overrides(tmp_path) + ["adapter.kind=ia3"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from perception.adapters import task

    root = tmp_path_factory.mktemp("fera")
    results = {arm: task.train(compose(overrides(root, arm))) for arm in ("fera", "lora", "dora")}
    return root, results


def test_arms_train_with_matched_parameters_and_write_adapters(trained):
    root, results = trained
    n = {arm: r["trainable_parameters"] for arm, r in results.items()}
    assert abs(n["fera"] - n["lora"]) / n["lora"] < 0.05 and abs(n["dora"] - n["lora"]) / n["lora"] < 0.1
    assert (root / "fera_unet_tiny_fera" / "adapter" / "fera_config.json").is_file()
    assert (root / "fera_unet_tiny_lora" / "adapter" / "adapter_config.json").is_file()
    assert json.loads((root / "fera_unet_tiny_dora" / "adapter" / "adapter_config.json").read_text())["use_dora"]
    curve = json.loads((root / "fera_unet_tiny_fera" / "curve.json").read_text())
    assert [p["step"] for p in curve] == [0, 2, 4] and set(curve[0]) >= {"t0.1", "t0.9", "mean"}
    # every arm starts from the same base: identical step-0 losses
    c0 = [json.loads((root / f"fera_unet_tiny_{a}" / "curve.json").read_text())[0] for a in ("fera", "lora")]
    assert c0[0] == c0[1]


@pytest.mark.parametrize("arm", ["fera", "dora"])
def test_adapter_folder_reproduces_the_trained_model(trained, arm):
    """base + adapter-only folder == the full training checkpoint, exactly."""
    from core import checkpoint as ckpt
    from perception.adapters import task

    root, _ = trained
    cfg = compose(overrides(root, arm))
    model_cfg, _, adapter, _ = task._configs(cfg)
    full = task.AdaptedDenoiser(task.load_base(model_cfg), adapter)
    ckpt.load_checkpoint(ckpt.latest_checkpoint(Path(cfg.out_dir) / "checkpoints"), full)
    loaded = task.load_adapted(model_cfg, cfg.out_dir)
    x, t = torch.randn(3, 3, 16, 16), torch.tensor([0.2, 0.5, 0.9])
    with torch.no_grad():
        assert torch.equal(full.eval()(x, t), loaded(x, t))


def test_evaluate_reports_levels_fd_and_routing(trained):
    from perception.adapters import task

    root, _ = trained
    out = task.evaluate(compose(overrides(root, "fera")))
    assert set(out["heldout_loss"]) == {"t0.1", "t0.3", "t0.5", "t0.7", "t0.9", "mean"}
    assert out["fd"] >= 0 and out["base"]["fd"] >= 0 and out["trainable_parameters"] > 0
    for w in out["routing_by_level"].values():
        assert len(w) == 3 and abs(sum(w) - 1) < 1e-5
    assert "routing_by_level" not in task.evaluate(compose(overrides(root, "lora")))


def test_fecl_only_for_fera_with_weight(tmp_path):
    from perception.adapters import task
    from perception.adapters.backbones import BackboneConfig, FlowDenoiser
    from perception.adapters.configuration_fera import AdapterConfig

    batch = {"image": torch.rand(2, 3, 16, 16) * 2 - 1}
    cfg = BackboneConfig(kind="dit", image_size=16, dit_layers=1, dit_heads=2)
    calls = []
    for adapter, has in ((AdapterConfig(kappa_divisor=16), True), (AdapterConfig(fecl_weight=0.0), False),
                         (AdapterConfig(kind="lora", rank=12), False)):
        m = task.AdaptedDenoiser(FlowDenoiser(cfg), adapter)
        h = m.denoiser.backbone.register_forward_hook(lambda *a: calls.append(1))
        out = m.training_step(batch)
        h.remove()
        assert ("fecl" in out) == has and torch.isfinite(out["loss"])
        assert len(calls) == (2 if has else 1)  # FECL's base pass is one more backbone forward
        calls.clear()


def test_infer_writes_samples_and_bad_run_is_one_line(trained, tmp_path):
    root, _ = trained
    run = root / "fera_unet_tiny_fera"
    cmd = [sys.executable, "-m", "embodied.cli", "infer", "fera-samples", "--run", str(run), "--out",
           str(tmp_path / "s"), "--n", "3", "--steps", "2"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "s" / "grid.png").is_file() and len(list((tmp_path / "s" / "samples").iterdir())) == 3
    cmd[cmd.index(str(run))] = str(tmp_path / "nope")
    cmd[cmd.index(str(tmp_path / "s"))] = str(tmp_path / "s2")
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1 and "config.json" in res.stderr
    assert not (tmp_path / "s2").exists()


def test_experiment_summary_aggregates_seeds(tmp_path):
    from core.io import write_json
    from perception.adapters.experiments import collect, markdown, summarise

    base = {"heldout_loss": {"t0.1": 1.0, "mean": 1.0}, "fd": 50.0}
    for arm, seed, loss, fd in (("fera", 0, 0.5, 10.0), ("fera", 1, 0.7, 14.0), ("lora", 0, 0.6, 12.0)):
        write_json(tmp_path / "unet32" / f"{arm}_s{seed}" / "eval.json",
                   {"arm": arm, "backbone": "unet", "image_size": 32, "trainable_parameters": 100,
                    "heldout_loss": {"t0.1": loss, "mean": loss}, "fd": fd, "base": base})
    rows = summarise(collect(tmp_path))
    fera = next(r for r in rows if r["arm"] == "fera")
    assert fera["seeds"] == 2 and fera["fd"]["mean"] == pytest.approx(12.0)
    assert fera["loss"]["t0.1"]["sd"] == pytest.approx(0.1414, abs=1e-3)
    table = markdown(rows)
    assert "base (no adapter)" in table and "0.6000 ± 0.0000" in table and table.count("\n") == 5


def test_shipped_adapters_load_and_the_demo_section_runs(tmp_path):
    """The shipped base + FeRA / LoRA adapters (assets/checkpoints/fera) load strictly, and both adapters
    lower the base's held-out loss on real crops (what they were trained for)."""
    from core.demo import DemoContext
    from perception.adapters.demo import demo_section

    sec = demo_section(DemoContext(out=tmp_path))
    f = sec.figures
    assert f["fera_heldout_loss"] < f["base_heldout_loss"] and f["lora_heldout_loss"] < f["base_heldout_loss"]
    assert (tmp_path / "img" / "fera_fera.png").is_file() and "routing" in sec.body
