"""`embodied train / eval transnormal` task functions and `embodied infer normals`, end to end on tiny data."""

from __future__ import annotations

import argparse
import json

import cv2
import numpy as np
import pytest
import torch

from core.config import compose
from core.data.images import write_image
from core.errors import ConfigError, DataError
from perception.normals import cli, task


@pytest.fixture(scope="module")
def trained(rendered, tmp_path_factory):
    out = tmp_path_factory.mktemp("transnormal_run")
    cfg = compose(["experiment=transnormal", "debug=tiny", f"data.root={rendered}", f"out_dir={out}",
                   "model.vae_pretrain_steps=2", "model.image_size=32", "trainer.max_steps=3"])
    result = task.train(cfg)
    return cfg, out, result


def test_train_runs_both_stages_and_writes_a_self_contained_checkpoint(trained):
    cfg, out, result = trained
    assert result["step"] == 3
    assert (out / "vae" / "checkpoints" / "latest").is_file()  # stage 1: the VAE auto-encoder
    ckpt = out / "checkpoints" / "step_00000003"
    config = json.loads((ckpt / "config.json").read_text())
    assert config["method"] == "transnormal"
    assert config["model"]["scaling_factor"] == pytest.approx(result["latent_scale"])
    assert result["latent_scale"] != 1.0  # measured from the stage-1 latents
    from perception.normals.modeling_transnormal import TransNormalModel

    model = TransNormalModel.from_pretrained(out)
    assert float(model.latent_scale) == pytest.approx(result["latent_scale"])
    # a second call resumes from the finished checkpoint instead of training again
    again = task.train(cfg)
    assert again["step"] == 3


def test_evaluate_reports_pooled_metrics_and_the_constant_baseline(trained):
    cfg, out, _ = trained
    cfg = compose(["experiment=transnormal", "debug=tiny", f"data.root={cfg.data.root}", f"out_dir={out}"])
    result = task.evaluate(cfg)
    saved = json.loads((out / "eval.json").read_text())
    assert saved["views"] == 1 and set(saved["models"]) == {"transnormal", "constant"}
    for row in saved["models"].values():
        assert {"mean", "median", "rmse", "a11.25", "a30", "pixels"} <= set(row["all"])
        assert 0 <= row["all"]["mean"] <= 180
    # every method is scored on the same valid pixels, and the rows say what was evaluated
    pixels = {row["all"]["pixels"] for row in saved["models"].values()}
    assert len(pixels) == 1 and pixels.pop() > 0
    assert saved["models"]["transnormal"]["checkpoint"].endswith("step_00000003")
    assert np.linalg.norm(saved["models"]["constant"]["direction"]) == pytest.approx(1.0, abs=1e-3)
    assert result["models"]["transnormal"]["mode"] == "single_step"
    bad = compose(["experiment=transnormal", f"data.root={cfg.data.root}", f"out_dir={out}",
                   "eval.baselines=[nope]"])
    with pytest.raises(ConfigError, match="nope"):
        task.evaluate(bad)


def _write_cleargrasp(root, rendered):
    """One object folder in ClearGrasp's layout (x of the normals flipped, as ClearGrasp stores them)."""
    from core.data.images import DenseImageDataset

    ds = DenseImageDataset(rendered, "test", keys=("rgb", "normals", "mask"))
    s = ds[0]
    obj = root / "beaker"
    write_image(obj / "rgb-imgs" / "000-rgb.jpg", s["rgb"].permute(1, 2, 0).numpy())
    n = s["normals"].permute(1, 2, 0).numpy().copy()
    n[..., 0] *= -1
    write_image(obj / "camera-normals" / "000-cameraNormals.exr", n.astype(np.float32))
    write_image(obj / "segmentation-masks" / "000-segmentation-mask.png", (s["mask"].numpy() * 255).astype(np.uint8))


def test_evaluate_on_a_cleargrasp_folder(trained, rendered, tmp_path):
    _, out, _ = trained
    _write_cleargrasp(tmp_path / "cg", rendered)
    cfg = compose(["experiment=transnormal", "data.layout=cleargrasp", f"data.root={tmp_path / 'cg'}",
                   f"out_dir={tmp_path / 'eval'}", f"eval.checkpoint={out}"])
    result = task.evaluate(cfg)
    assert result["layout"] == "cleargrasp" and result["views"] == 1
    assert result["models"]["constant"]["direction"] == [0.0, 0.0, -1.0]  # no train split: facing the camera


def test_missing_data_without_render_settings_is_one_clear_error(tmp_path):
    cfg = compose(["experiment=transnormal", f"data.root={tmp_path / 'none'}", "data.render_n=0"])
    with pytest.raises(DataError, match="meta.json.*data.render_n"):
        task.ensure_data(cfg.data)


def test_render_keys_are_flat_and_old_run_configs_still_read(tmp_path):
    """`data.render_*` as every method spells them; a run folder from before the source / framing keys (the shipped
    transnormal_procedural) reads as procedural / workspace."""
    from core.config import to_object
    from core.io import write_json
    from perception.normals.cli import DEFAULT_CHECKPOINT

    data = to_object(compose(["experiment=transnormal"]).data)
    assert (data.render_n, data.render_size, data.render_source, data.render_framing) == (480, 96, "real", "closeup")
    with pytest.raises(ConfigError, match="data.render_framing"):
        compose(["experiment=transnormal", "data.render_source=procedural"])  # closeup needs real light
    with pytest.raises(ConfigError, match="render"):
        compose(["experiment=transnormal", "data.render.n=8"])  # the nested spelling is gone
    shipped = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text())["data"]
    assert "render" not in shipped and shipped["render_n"] == 480
    assert task.render_settings(DEFAULT_CHECKPOINT) == {"source": "real", "framing": "closeup", "size": 96, "spp": 32}
    write_json(tmp_path / "old" / "config.json", {"data": {"render_n": 320, "render_size": 64, "render_spp": 16}})
    assert task.render_settings(tmp_path / "old") == {"source": "procedural", "framing": "workspace", "size": 64,
                                                      "spp": 16}


def test_infer_cli_writes_png_npy_and_an_oriented_point_cloud(trained, rendered, tmp_path):
    _, out, _ = trained
    img = rendered / "test" / "rgb" / "000003.png"
    args = argparse.Namespace(inputs=[str(img)], out=str(tmp_path / "pred"), checkpoint=str(out), pointcloud=True,
                              depth=str(rendered / "test" / "depth" / "000003.png"))
    assert cli.infer(args) == 0
    n = np.load(tmp_path / "pred" / "000003_normals.npy")
    assert n.shape == (32, 32, 3) and n.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(n, axis=-1), 1.0, atol=1e-4)
    png = cv2.imread(str(tmp_path / "pred" / "000003_normals.png"))[..., ::-1]
    np.testing.assert_array_equal(png, cli.normals_to_rgb(n))
    import open3d as o3d

    pc = o3d.io.read_point_cloud(str(tmp_path / "pred" / "000003.ply"))
    assert len(pc.points) > 0 and pc.has_normals()
    # points lie in front of the camera at the stored depth
    assert np.asarray(pc.points)[:, 2].min() > 0
    # folders work
    args = argparse.Namespace(inputs=[str(rendered / "train" / "rgb")], out=str(tmp_path / "dir"),
                              checkpoint=str(out), pointcloud=False, depth=None)
    assert cli.infer(args) == 0
    assert len(list((tmp_path / "dir").glob("*_normals.npy"))) == 3
    # a video gives a colour-coded mp4 and the per-frame normals
    from core.data.video import read_frames, write_mp4

    frames = np.stack([cv2.imread(str(p))[..., ::-1] for p in sorted((rendered / "train" / "rgb").glob("*.png"))])
    write_mp4(tmp_path / "clip.mp4", frames, fps=5)
    args = argparse.Namespace(inputs=[str(tmp_path / "clip.mp4")], out=str(tmp_path / "vid"), checkpoint=str(out),
                              pointcloud=False, depth=None)
    assert cli.infer(args) == 0
    assert np.load(tmp_path / "vid" / "clip_normals.npy").shape == (3, 32, 32, 3)
    assert read_frames(tmp_path / "vid" / "clip_normals.mp4").shape == (3, 32, 32, 3)
    # a missing file is skipped with its own error line (the others would still run): exit 1
    assert cli.infer(argparse.Namespace(inputs=[str(tmp_path / "nope.png")], out=str(tmp_path / "none"),
                                        checkpoint=str(out), pointcloud=False, depth=None)) == 1
    assert not list((tmp_path / "none").iterdir())
    with pytest.raises(DataError, match="--depth"):
        cli.infer(argparse.Namespace(inputs=[str(img)], out=str(tmp_path), checkpoint=str(out), pointcloud=True,
                                     depth=None))


def test_training_augmentation_flips_normals_consistently(rendered):
    cfg = compose(["experiment=transnormal", f"data.root={rendered}", "data.flip_p=1.0", "model.image_size=32"])
    from core.config import to_object

    ts = task._transforms(to_object(cfg.model), to_object(cfg.data), (32, 32))
    ds = task._dataset(to_object(cfg.data), "train", task.TRAIN_KEYS)
    s = ds[0]
    batch = {k: v[None] for k, v in s.items()}
    out = batch
    for t in ts:
        out = t(out, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out["normals"][0, 0], -s["normals"][0].flip(-1))
    assert torch.equal(out["rgb_twin"][0], s["rgb_twin"].flip(-1)) and torch.equal(out["valid"][0], s["valid"].flip(-1))


def test_configs_compose_and_bad_values_are_named():
    from core.config import to_object

    paper = to_object(compose(["experiment=transnormal_paper"]).model)
    assert (paper.image_size, paper.timestep, paper.cross_attention_dim, paper.vae_factor) == (768, 999, 1024, 8)
    assert paper.w_wav == 0.1 and paper.dino_model == "vit_large_patch16_dinov3"
    trainer = to_object(compose(["experiment=transnormal_paper"]).trainer)
    assert trainer.optim.param_group_lrs == {"unet": 3e-5, "projector": 3e-4} and trainer.scheduler.warmup_steps == 300
    with pytest.raises(ConfigError, match="model.mode"):
        compose(["experiment=transnormal", "model.mode=ddim"])
    with pytest.raises(ConfigError, match="image_size"):
        compose(["experiment=transnormal", "model.image_size=40"])


def test_loading_names_a_missing_weight_source_and_unknown_keys(tmp_path):
    """Was: the loader dropped unknown config keys and nulled missing weight paths (a shape mismatch later)."""
    import json

    import pytest

    from core.errors import CheckpointError
    from perception.normals.cli import DEFAULT_CHECKPOINT
    from perception.normals.modeling_transnormal import TransNormalModel

    model = TransNormalModel.from_pretrained(DEFAULT_CHECKPOINT)
    folder = model.save_pretrained(tmp_path / "m")
    import shutil

    shutil.rmtree(folder / "vae")  # an export's own vae/ stands in for a moved vae_path (tests/test_upstream_diffusers)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model"]["vae_path"] = str(tmp_path / "moved_vae")
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model.vae_path=.*moved_vae' does not exist"):
        TransNormalModel.from_pretrained(folder)
    cfg["model"]["vae_path"] = None
    cfg["model"]["unet_channles"] = [32]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown config key"):
        TransNormalModel.from_pretrained(folder)
