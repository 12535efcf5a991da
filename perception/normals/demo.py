"""Demo section of TransNormal: the shipped tiny checkpoint on freshly rendered, held-out glassware views, the
training data it came from (next to the first release's), and real photos (shipped vs first-release checkpoint)."""

from __future__ import annotations

from pathlib import Path

from core.demo import DemoContext, DemoSection, img_tag, table

HELD_OUT_SEED = 1000  # the shipped checkpoint was trained on seed 0's views
OLD_CHECKPOINT = "transnormal_procedural"  # assets/checkpoints/: the first release, trained on procedural scenes


def demo_section(ctx: DemoContext) -> DemoSection:
    import numpy as np

    from core.data.images import DenseImageDataset
    from core.viz import colorize, normals_to_rgb
    from perception.normals.cli import DEFAULT_CHECKPOINT
    from perception.normals.metrics import angular_error_deg
    from perception.normals.pipeline_transnormal import TransNormalPipeline
    from perception.normals.task import _constant_predictor, evaluate_predictor, mean_normal, render_settings
    from sim.render.normals import make_dataset

    settings = render_settings(DEFAULT_CHECKPOINT)
    source, size = settings["source"], settings["size"]
    root = ctx.path("transnormal", "views")
    # 8 views of an unseen seed, rendered as the checkpoint's training data (source, framing, size, spp); with
    # test_fraction 0.75 six of them use the held-out HDRI / photo textures.
    make_dataset(root, n=8, seed=HELD_OUT_SEED, size=size, spp=settings["spp"], test_fraction=0.75, source=source,
                 framing=settings["framing"])  # its training spp: fewer samples = noisier inputs than it has seen
    ds = DenseImageDataset(root, "test", keys=("rgb", "rgb_twin", "normals", "mask"))
    pipe = TransNormalPipeline.from_pretrained(DEFAULT_CHECKPOINT)
    ours = evaluate_predictor(lambda rgb: pipe(rgb).normals, ds)
    const = evaluate_predictor(_constant_predictor(mean_normal(ds)), ds)
    tags = []
    for i in range(len(ds)):
        s = ds[i]
        pred = pipe(s["rgb"][None]).normals[0]
        err = angular_error_deg(pred, s["normals"]).numpy()
        valid = s["valid"].numpy()
        sid = ds.ids[i]
        for name, img in (("input", s["rgb"].permute(1, 2, 0).numpy()),
                          ("twin (training pair)", s["rgb_twin"].permute(1, 2, 0).numpy()),
                          ("prediction", normals_to_rgb(pred.permute(1, 2, 0).numpy())),
                          ("ground truth", normals_to_rgb(s["normals"].permute(1, 2, 0).numpy(), valid)),
                          ("error 0-60 deg", colorize(np.clip(np.where(valid, err, 0), 0, 60), valid, "magma"))):
            path = ctx.save_image(f"transnormal_{sid}_{name.split()[0]}.png", img, scale=2)
            tags.append(img_tag(path, f"{sid} {name}", 128))
        tags.append("<br>")
    rows = [{"model": name, "pixels": m["all"]["pixels"], "mean": m["all"]["mean"], "median": m["all"]["median"],
             "a11.25 %": m["all"]["a11.25"], "glass mean": m["glass"].get("mean")}
            for name, m in (("TransNormal (shipped, 1 step)", ours), ("constant normal (oracle mean)", const))]
    return DemoSection(
        title="TransNormal: single-step normals of transparent labware (perception/normals)",
        lead=f"`embodied infer normals IMAGE --out DIR` with the tiny checkpoint in assets/ (trained on the "
             f"'{source}' renders) on {len(ds)} path-traced views it never saw (seed 1000, held-out HDRI and photo "
             "textures): input, its diffuse twin, prediction, ground truth and angular error, side by side; pooled "
             "angular errors in degrees against the best constant normal of these very views.",
        body=table(rows) + "".join(tags) + _first_release_views(ctx) + _real_photo(ctx),
        figures={"mean_deg": ours["all"]["mean"], "constant_mean_deg": const["all"]["mean"],
                 "glass_mean_deg": ours["glass"].get("mean")},
    )


def _first_release_views(ctx: DemoContext) -> str:
    """Two views of the first release's procedural scenes, for comparison with the data above."""
    from core.data.images import DenseImageDataset
    from sim.render.normals import make_dataset

    root = ctx.path("transnormal", "views_procedural")
    make_dataset(root, n=2, seed=HELD_OUT_SEED, size=64, spp=16, test_fraction=0.0, source="procedural")
    ds = DenseImageDataset(root, "train", keys=("rgb",))
    tags = "".join(img_tag(ctx.save_image(f"transnormal_procedural_{ds.ids[i]}.png",
                                          ds[i]["rgb"].permute(1, 2, 0).numpy(), scale=2), "procedural", 128)
                   for i in range(len(ds)))
    return ("<h3>The first release's training scenes (procedural sky and backdrops), for comparison</h3>"
            "<p class='lead'>`embodied sim make-dataset normals --source procedural`: what the first checkpoint "
            "(assets/checkpoints/transnormal_procedural) was trained on; the views above are `--source real` (real "
            "HDR light, real photo textures).</p>" + tags)


def _real_photo(ctx: DemoContext) -> str:
    """``embodied infer normals`` on real photos (scikit-image's ``coffee`` and ``astronaut``) with the shipped
    checkpoint and the first release's, side by side: qualitative only (no real photo of glassware installs
    offline, and these have no ground truth)."""
    import argparse
    import html

    import cv2

    from core import domain
    from core.data.samples import skimage_photo
    from core.errors import DataError
    from core.resources import asset
    from perception.normals.cli import DEFAULT_CHECKPOINT, infer
    from perception.normals.task import render_source

    checkpoints = {"shipped": Path(DEFAULT_CHECKPOINT), "first release": asset("checkpoints", OLD_CHECKPOINT)}
    checkpoints = {k: v for k, v in checkpoints.items() if (v / "model.safetensors").is_file()}
    tags, notes = [], []
    for name in ("coffee", "astronaut"):
        try:
            photo = skimage_photo(name)  # (H, W, 3) uint8 RGB
        except DataError as e:
            return f"<p><em>Real photo skipped: {html.escape(str(e))}</em></p>"
        photo = cv2.resize(photo, (192, 128), interpolation=cv2.INTER_AREA)
        src = ctx.save_image(f"transnormal_real_{name}.png", photo)
        tags.append(img_tag(src, f"real photo (scikit-image {name})", 192))
        for label, ckpt in checkpoints.items():
            out = ctx.path("transnormal", "real_" + label.replace(" ", "_"))
            infer(argparse.Namespace(inputs=[str(ctx.out / src)], out=str(out), checkpoint=str(ckpt),
                                     pointcloud=False, depth=None))
            pred = cv2.imread(str(out / f"transnormal_real_{name}_normals.png"))[..., ::-1]
            dist, entry = domain.check(ckpt, [photo]), domain.load(ckpt)
            flag = "" if dist is None else f", domain distance {dist[0]:.2f} / {entry[1]['threshold']:.2f}"
            tags.append(img_tag(ctx.save_image(f"transnormal_real_{name}_{label.split()[0]}.png", pred.copy()),
                                f"{label} ({render_source(ckpt)} data){flag}", 192))
        tags.append("<br>")
    notes.append("A distance above the threshold is flagged by the command's warning line.")
    return ("<h3>On real photos (out of the training domain — qualitative, no ground truth)</h3>"
            "<p class='lead'><code>embodied infer normals PHOTO</code> with the shipped checkpoint and with the first "
            "release's (trained on procedural scenes). Both tiny models were trained on 64 px table-top glassware "
            "renders; no real photo of glassware installs offline, so this shows how each reads a real image, not "
            "accuracy. " + " ".join(notes) + "</p>" + "".join(tags))
