"""TransNormal experiments, rerunnable, every number through the public CLI (one thread per run).

``realism`` — old data vs new data: both checkpoints on both held-out sets and on real photos.

    embodied experiment transnormal realism --out outputs/transnormal_realism \
        [--old assets/checkpoints/transnormal_procedural] [--new outputs/transnormal_workspace] [--train]

``--old`` was trained on glassware in front of procedural backdrops under a procedural sky
(``data.render_source=procedural``), ``--new`` on glassware under the real HDR panoramas with real photo
textures, same camera distances and sizes (``embodied train transnormal experiment=transnormal_workspace``;
``--train`` runs it first when ``--new`` has no checkpoint). Both are scored by ``embodied eval transnormal``
on each held-out split (the other checkpoint and the constant normal as ``eval.baselines``), whole image and
glass pixels, and run by ``embodied infer normals`` on real photos (no ground truth: qualitative, with the
domain check's distance). ``summary.json`` / ``summary.md`` hold the tables.

``glass`` — does a pretrained context encoder help on transparent objects? Glass-dominated close-up renders
(``data.render_framing=closeup``, real HDR light; rendered once on first use), one VAE pre-trained once and
shared by every arm, then each arm x seed trained for the same steps on the same data (the ``core.experiments``
grid, ``--workers`` runs at a time) and scored on the held-out split's glass pixels (and the whole image):

    embodied experiment transnormal glass --out outputs/transnormal_glass --seeds 0 1 \
        --arms effnet dino none diffusion effnet_nocons effnet_nowav --steps 1500 [--size 96] [--crop 64] \
        [--workers 2]

Arms: TransNormal's registered arms (``perception/normals/register.py``), the method's own under the name
``effnet`` (the frozen ImageNet EfficientNet-Lite0 as context, pretrained); ``dino`` the random frozen DINOv3,
``none`` one learned null token, ``diffusion`` the multi-step baseline (same UNet, 10 DDIM steps, with the
pretrained context), ``*_nocons`` / ``*_nowav`` the appearance-consistency or the wavelet loss switched off.

``ship RUN`` exports a run's checkpoint into ``assets/checkpoints/transnormal`` (self-contained, with the
``unet/`` and ``vae/`` diffusers opens: see ``ship``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core import experiments as ex
from core.io import read_json

TEST_SETS = {  # name -> (data.root, data.render_source); both rendered n 320, seed 0, 64 px, 32 spp
    "procedural": ("outputs/datasets/transnormal_procedural", "procedural"),
    "real light + textures": ("outputs/datasets/transnormal", "real"),
}
REAL_PHOTOS = ("coffee", "astronaut")  # scikit-image photos; no real photo of glassware installs offline


def _eval(out: Path, ckpt_new: str, ckpt_old: str, test: str) -> dict[str, Any]:
    root, source = TEST_SETS[test]
    run_dir = out / f"eval_{source}"
    if not (run_dir / "eval.json").is_file():
        ex.run_cli(["eval", "transnormal", "experiment=transnormal_workspace", f"out_dir={run_dir}",
                    f"eval.checkpoint={ckpt_new}", f"eval.baselines=[constant,{ckpt_old}]", f"data.root={root}",
                    f"data.render_source={source}", "trainer.progress=false"], run_dir.with_suffix(".log"))
    return read_json(run_dir / "eval.json")


def real_photos(out: Path, ckpts: dict[str, str]) -> dict[str, Any]:
    """Each checkpoint's normal map on the real photos, with the domain check's feature distance."""
    import cv2

    from core import domain
    from core.data.images import write_image
    from core.data.samples import skimage_photo

    src = out / "photos"
    src.mkdir(parents=True, exist_ok=True)
    photos = {}
    for name in REAL_PHOTOS:
        photos[name] = cv2.resize(skimage_photo(name), (192, 128), interpolation=cv2.INTER_AREA)
        write_image(src / f"{name}.png", photos[name])
    rows: dict[str, Any] = {}
    for tag, ckpt in ckpts.items():
        d = out / f"real_{tag}"
        if not all((d / f"{name}_normals.png").is_file() for name in REAL_PHOTOS):
            ex.run_cli(["infer", "normals", *(str(src / f"{n}.png") for n in REAL_PHOTOS), "--out", str(d),
                        "--checkpoint", ckpt, "--overwrite"], d.with_suffix(".log"))
        dist = domain.check(Path(ckpt), list(photos.values()))
        for k, name in enumerate(REAL_PHOTOS):
            rows.setdefault(name, {})[tag] = {"normals_png": str(d / f"{name}_normals.png"),
                                              "domain_distance": None if dist is None else round(dist[k], 3)}
    return rows


def _resolve(ckpt: str) -> str:
    from core.checkpoint import resolve_checkpoint

    return str(resolve_checkpoint(ckpt))


REALISM_COLUMNS = [ex.Column(h, k, digits=1, template="{} %" if k.endswith("a11.25") else None)  # already in %
                   for h, k in (("mean (deg)", "mean"), ("median", "median"), ("< 11.25 deg", "a11.25"),
                                ("glass mean", "glass_mean"), ("glass median", "glass_median"),
                                ("glass < 11.25", "glass_a11.25"))]


def realism_table(rows: list[dict[str, Any]], photos: dict[str, Any]) -> str:
    """The markdown of ``realism``: one row per (model, test set), then the real photos' domain distances."""
    body = ([r["model"], r["test set"], *(c.cell({k: v for k, v in r.items() if v is not None})
                                          for c in REALISM_COLUMNS)] for r in rows)
    table = ex.markdown_table(["model", "test set", *(c.header for c in REALISM_COLUMNS)], body)
    return table + "\n\nReal photos (no ground truth): domain-check feature distance old / new: " + ", ".join(
        f"{n} {p['old']['domain_distance']} / {p['new']['domain_distance']}" for n, p in photos.items())


def realism(args) -> dict[str, Any]:
    """Old vs new data: both checkpoints on both held-out sets and on real photos (``summary.json`` / ``.md``)."""
    out = args.out
    new = Path(args.new)
    if args.train and not (new / "checkpoints").is_dir() and not (new / "model.safetensors").is_file():
        ex.run_cli(["train", "transnormal", "experiment=transnormal_workspace", f"out_dir={args.new}",
                    "trainer.progress=false", "trainer.tensorboard=false"], out / "train_new.log")
    rows = []
    for test in TEST_SETS:
        e = _eval(out, args.new, args.old, test)
        for key, m in e["models"].items():
            label = {"transnormal": "new (real-light data)", "constant": "constant normal (train mean)"}.get(
                key, "old (procedural data)")
            rows.append({"model": label, "test set": f"{test} ({e['views']} views)", "mean": m["all"]["mean"],
                         "median": m["all"]["median"], "a11.25": m["all"]["a11.25"],
                         "glass_mean": m["glass"].get("mean"), "glass_median": m["glass"].get("median"),
                         "glass_a11.25": m["glass"].get("a11.25")})
    photos = real_photos(out, {"old": _resolve(args.old), "new": _resolve(args.new)})
    summary = {"checkpoints": {"old": args.old, "new": args.new}, "heldout": rows, "real_photos": photos}
    print(ex.write_summary(out, summary, realism_table(rows, photos)), end="")
    return summary


def glass_arms() -> dict[str, tuple[str, ...]]:
    """The registered arms, the method's own (EfficientNet-Lite0 context) named ``effnet`` as in the study."""
    arms = ex.method_arms("transnormal")
    first = next(iter(arms))
    return {("effnet" if a == first else a): over for a, over in arms.items()}


def _glass_root(args) -> str:
    """The glass renders' dataset root (``--data``, default ``outputs/datasets/transnormal_glass<size>``)."""
    return args.data or f"outputs/datasets/transnormal_glass{args.size}"


def _glass_common(args) -> list[str]:
    """Data and model size overrides shared by every arm (and the VAE run)."""
    return [f"data.root={_glass_root(args)}", f"data.image_size={args.size}", f"data.render_size={args.size}",
            f"data.render_n={args.n}", "data.render_source=real", "data.render_framing=closeup",
            f"data.render_workers={args.workers}", f"model.image_size={args.crop}",
            f"model.processing_res={args.size}", "trainer.progress=false", "trainer.tensorboard=false"]


KEYS = ("mean", "median", "a11.25")
METRICS = {f"{part}_{k}": f"{part if part == 'glass' else 'all'}/{k}" for part in ("glass", "all") for k in KEYS}
COLUMNS = [ex.Column("seeds", "seeds"), ex.Column("sampler steps", "steps"),
           *(ex.Column(f"{part} {h}", f"{part}_{k}", digits=1) for part in ("glass", "all")
             for h, k in zip(("mean (deg)", "median", "< 11.25 (%)"), KEYS, strict=True)),
           ex.Column("glass mean per seed", "per_seed_glass_mean")]


def glass(args) -> dict[str, Any]:
    out = args.out
    vae = out / "vae_base"
    failures: list[ex.Failure] = []
    if not args.collect_only:
        if not (vae / "vae").is_dir():  # renders the data on first use, then stage 1 only (one UNet step)
            ex.run_cli(["train", "transnormal", *_glass_common(args), "trainer.max_steps=1", f"out_dir={vae}"],
                       out / "vae_base.log", threads=max(1, args.workers))
        grid = ex.Grid("transnormal", out, ex.pick_arms(glass_arms(), args.arms), args.seeds,
                       [*_glass_common(args), f"model.vae_path={vae / 'vae'}", f"trainer.max_steps={args.steps}",
                        f"trainer.ckpt_every={args.steps}"], eval_overrides=["eval.baselines=[constant]"])
        failures = grid.run(args.workers)
    runs = ex.collect(out, arms=args.arms, seeds=args.seeds)
    rows = []
    for arm, by_seed in runs.items():
        m = [e["models"]["transnormal"] for e in by_seed.values()]
        rows.append({"arm": arm, **ex.seed_stats(m, METRICS), "steps": m[0].get("steps"),
                     "per_seed_glass_mean": [round(x["glass"]["mean"], 2) for x in m]})
    if runs:
        const = next(iter(next(iter(runs.values())).values()))["models"]["constant"]
        rows.append({"arm": "constant normal (train mean)", **ex.seed_stats([const], METRICS), "steps": None,
                     "per_seed_glass_mean": [round(const["glass"]["mean"], 2)]})
    meta_file = Path(_glass_root(args)) / "meta.json"
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not k.startswith("_")}
    summary = {"settings": settings, "rows": rows, "failed": [str(f) for f in failures],
               "mean_glass_fraction": read_json(meta_file).get("mean_glass_fraction") if meta_file.is_file() else None}
    print(ex.write_summary(out, summary, ex.arm_table({r["arm"]: r for r in rows}, COLUMNS)))
    ex.report(failures)
    return summary


#: Card fields ``save_pretrained`` writes itself (not carried over from the destination's card).
_CORE_CARD_KEYS = ("method", "model_class", "parameters", "weights", "upstream", "base")


def ship(args) -> dict[str, Any]:
    """Export a run's checkpoint into ``--dst`` as a self-contained folder (``save_pretrained``: ``unet/`` and
    ``vae/`` that diffusers opens + ``model.safetensors`` with the rest, see ``modeling_transnormal``).

    The VAE's weights are in the export, so ``model.vae_path`` (the study's shared stage-1 folder, not shipped)
    becomes null and ``scaling_factor`` the stored latent scale; the export must predict exactly what the run's
    checkpoint does. The destination's model card (fields and text) is kept; its ``domain.safetensors`` is kept
    only when the destination already held these very weights (a re-export in a new layout:
    ``ship assets/checkpoints/transnormal``), else it is dropped (recalibrate with ``calibrate_domain``).
    """
    import dataclasses
    import shutil
    import tempfile

    import torch

    from core.checkpoint import resolve_checkpoint
    from core.errors import CheckpointError
    from core.pretrained import card_body, read_card, read_config
    from perception.normals.modeling_transnormal import TransNormalModel
    from perception.normals.pipeline_transnormal import TransNormalPipeline

    src, dst = resolve_checkpoint(args.run), Path(args.dst)
    cfg = read_config(src)
    model = TransNormalModel.from_pretrained(src)
    model.config = dataclasses.replace(model.config, vae_path=None, scaling_factor=float(model.latent_scale))
    run_config = {k: v for k, v in cfg.items() if k not in ("method", "model")}
    run_config.setdefault("data", {})["render_workers"] = 1
    size = int(run_config["data"].get("render_size", 64))
    x = torch.randint(0, 256, (2, 3, size, size), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    want = TransNormalPipeline(model)(x).normals
    card = {k: v for k, v in read_card(dst).items() if k not in _CORE_CARD_KEYS}
    body = card_body(dst)
    same = False
    if (dst / "config.json").is_file() and (dst / "domain.safetensors").is_file():
        try:
            same = bool(torch.equal(TransNormalPipeline.from_pretrained(dst)(x).normals, want))
        except CheckpointError:
            same = False
    with tempfile.TemporaryDirectory() as keep:
        if same:
            shutil.copy(dst / "domain.safetensors", Path(keep) / "domain.safetensors")
        model.save_pretrained(dst, card=card, run_config=run_config, body=body)
        if same:
            shutil.copy(Path(keep) / "domain.safetensors", dst / "domain.safetensors")
    diff = float((want - TransNormalPipeline.from_pretrained(dst)(x).normals).abs().max())
    if diff != 0.0:
        raise CheckpointError(f"{dst}: predictions differ from {src} by {diff}")
    print(f"{src} -> {dst} (latent scale {model.config.scaling_factor:.4f}, identical predictions; unet/ and vae/ "
          f"open with diffusers); " + ("domain check kept (same weights)" if same else "now run calibrate_domain"))
    return {"src": str(src), "dst": str(dst), "domain_kept": same}


STUDIES = {
    "realism": ex.Experiment(
        realism, help="old data vs new data (both checkpoints, both test sets, real photos)",
        options=(("--out", dict(type=Path, default=Path("outputs/transnormal_realism"))),
                 ("--old", dict(default="assets/checkpoints/transnormal_procedural")),
                 ("--new", dict(default="outputs/transnormal_workspace")),
                 ("--train", dict(action="store_true",
                                  help="train --new first (embodied train transnormal) if missing")))),
    "glass": ex.Experiment(
        glass, help="context encoders and losses on glass-dominated renders", out="outputs/transnormal_glass",
        arms=["effnet", "none"],
        options=(("--steps", dict(type=int, default=1500)),
                 ("--size", dict(type=int, default=96, help="rendered view side (px)")),
                 ("--crop", dict(type=int, default=64, help="training crop side (model.image_size)")),
                 ("--n", dict(type=int, default=480, help="views to render (the last 20 %% are the test split)")),
                 ("--data", dict(default=None,
                                 help="dataset root (default outputs/datasets/transnormal_glass<size>)")))),
    "ship": ex.Experiment(
        ship, help="export a run's checkpoint into assets/ as a self-contained folder",
        options=(("run", dict(help="run folder or checkpoint, e.g. outputs/transnormal_glass/effnet_s0")),
                 ("--dst", dict(default="assets/checkpoints/transnormal")))),
}


if __name__ == "__main__":
    raise SystemExit(ex.moved("perception.normals.experiments", "transnormal"))
