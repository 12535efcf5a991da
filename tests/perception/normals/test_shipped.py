"""The checkpoint shipped in assets/ beats a constant-normal baseline on held-out synthetic views."""

from __future__ import annotations

from perception.normals.cli import DEFAULT_CHECKPOINT


def test_shipped_checkpoint_beats_the_constant_normal_baseline(tmp_path):
    from core.data.images import DenseImageDataset
    from perception.normals.pipeline_transnormal import TransNormalPipeline
    from perception.normals.task import _constant_predictor, evaluate_predictor, mean_normal
    from sim.render.normals import make_dataset

    assert (DEFAULT_CHECKPOINT / "model.safetensors").is_file(), "run the command in assets/checkpoints/transnormal"
    assert (DEFAULT_CHECKPOINT / "model.safetensors").stat().st_size < 5 * 2**20  # the weights' budget
    size = sum(f.stat().st_size for f in DEFAULT_CHECKPOINT.iterdir())
    assert size < 6 * 2**20  # + card, config and the domain check's training features (0.4 MiB)
    # 4 views from a seed the checkpoint never saw (it trained on seed 0), fewer samples per pixel
    make_dataset(tmp_path, n=4, seed=777, size=64, spp=8, test_fraction=0.0)
    ds = DenseImageDataset(tmp_path, "train", keys=("rgb", "normals", "mask"))
    pipe = TransNormalPipeline.from_pretrained(DEFAULT_CHECKPOINT)
    ours = evaluate_predictor(lambda rgb: pipe(rgb).normals, ds)["all"]
    # the strongest constant: the mean normal of these very views (an oracle the model does not get)
    const = evaluate_predictor(_constant_predictor(mean_normal(ds)), ds)["all"]
    assert ours["pixels"] == const["pixels"] == 4 * 64 * 64
    assert ours["mean"] < const["mean"] - 5.0, (ours, const)
    assert ours["a22.5"] > const["a22.5"]
