"""Old data vs new data for SoLA, rerunnable: both checkpoints on both held-out sets and on a real panorama.

    embodied experiment sola --out outputs/sola_realism \
        [--old assets/checkpoints/sola_analytic] [--new outputs/sola] [--train]

``--old`` is the checkpoint trained on the analytic rooms (``data.render_source=analytic``), ``--new`` the one
trained on panoramas rendered inside MuJoCo scenes (the default ``embodied train sola``; ``--train`` runs that
command first when ``--new`` has no checkpoint). Every number goes through the public CLI
(``embodied eval sola`` with ``eval.checkpoint`` / ``data.root`` / ``data.render_source`` / ``data.rotate``,
``embodied infer depth360``). Depth metrics compare across test sets; mIoU only within a set whose class list
the checkpoint was trained on (the two sources have different lists). ``summary.json`` / ``summary.md`` hold the
tables, and the depth range and class histogram each checkpoint predicts on the real indoor HDRI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from core import experiments as ex
from core.experiments import run_cli
from core.io import read_json

TEST_SETS = {  # name -> (data.root, data.render_source): the experiment config's render settings (n 200, seed 0)
    "analytic rooms": ("outputs/datasets/panoramas_sola_analytic", "analytic"),
    "MuJoCo scenes": ("outputs/datasets/panoramas_sola", "mujoco"),
}
TRAINED_ON = {"old": "analytic", "new": "mujoco"}


def _eval(out: Path, tag: str, ckpt: str, test: str, rotate: str) -> dict[str, Any]:
    root, source = TEST_SETS[test]
    run_dir = out / f"{tag}_{source}"
    result = run_dir / f"eval_{rotate}.json"
    if not result.is_file():
        run_cli(["eval", "sola", f"out_dir={run_dir}", f"eval.checkpoint={ckpt}", f"data.root={root}",
                 f"data.render_source={source}", f"data.rotate={rotate}", "trainer.progress=false"],
                run_dir.with_suffix(".log"))
    return read_json(result)


def real_panorama(out: Path, tag: str, ckpt: str, pano: Path) -> dict[str, Any]:
    """Depth statistics and the class histogram ``ckpt`` predicts on the real panorama ``pano``."""
    d = out / f"real_{tag}"
    if not (d / "predictions.json").is_file():
        run_cli(["infer", "depth360", str(pano), "--out", str(d), "--checkpoint", ckpt], d.with_suffix(".log"))
    classes = read_json(d / "predictions.json")["classes"]
    depth = np.load(d / f"{pano.stem}_depth.npy")
    sem = np.load(d / f"{pano.stem}_semantic.npy")
    counts = np.bincount(sem.ravel(), minlength=len(classes)) / sem.size
    return {"depth_min": float(depth.min()), "depth_p5": float(np.percentile(depth, 5)),
            "depth_median": float(np.median(depth)), "depth_p95": float(np.percentile(depth, 95)),
            "depth_max": float(depth.max()), "classes_present": int((counts > 0.01).sum()),
            "class_fractions": {c: round(float(v), 4) for c, v in zip(classes, counts, strict=True) if v > 0},
            "depth_png": str(d / f"{pano.stem}_depth.png"), "semantic_png": str(d / f"{pano.stem}_semantic.png")}


def realism(args) -> dict[str, Any]:
    """``embodied experiment sola``: both checkpoints on both held-out sets and on a real panorama."""
    out = args.out
    if args.train and not (Path(args.new) / "checkpoints").is_dir() and not (Path(args.new) / "model.safetensors").is_file():
        run_cli(["train", "sola", f"out_dir={args.new}", "trainer.progress=false", "trainer.tensorboard=false"],
                out / "train_new.log")
    ckpts = {"old": args.old, "new": args.new}
    rows = []
    for tag, ckpt in ckpts.items():
        for test, (_, source) in TEST_SETS.items():
            for rotate in ("none", "so3"):
                m = _eval(out, tag, ckpt, test, rotate)
                same = TRAINED_ON[tag] == source
                rows.append({"checkpoint": f"{tag} ({TRAINED_ON[tag]} data)", "test set": test, "rotation": rotate,
                             **{k: round(m[k], 3) for k in ("mae", "rmse", "absrel", "delta1")},
                             "miou": round(m["miou"], 3) if same else None, "n": m["n"]})
    from core.data.samples import blender_hdri

    pano = blender_hdri("interior")
    real = {tag: real_panorama(out, tag, ckpt, pano) for tag, ckpt in ckpts.items()}
    summary = {"checkpoints": ckpts, "heldout": rows, "real_panorama": {"input": str(pano), **real}}
    heldout = ex.markdown_table(
        ["checkpoint", "test set", "rotation", "MAE (m)", "RMSE (m)", "AbsRel", "delta1", "mIoU"],
        ([r["checkpoint"], f"{r['test set']} ({r['n']})", r["rotation"], r["mae"], r["rmse"], r["absrel"], r["delta1"],
          r["miou"] if r["miou"] is not None else "n/a (other classes)"] for r in rows))
    pano_rows = []
    for tag, r in real.items():
        hist = ", ".join(f"{c} {v:.2f}" for c, v in sorted(r["class_fractions"].items(), key=lambda kv: -kv[1]))
        pano_rows.append([tag, " / ".join(f"{r[k]:.2f}" for k in ("depth_min", "depth_p5", "depth_median", "depth_p95",
                                                                   "depth_max")), r["classes_present"], hist])
    print(ex.write_summary(out, summary, "\n".join([
        heldout, "", f"Real indoor panorama ({pano.name}, no ground truth):", "",
        ex.markdown_table(["checkpoint", "depth min / p5 / median / p95 / max (m)", "classes > 1 %", "class fractions"],
                          pano_rows)])))
    return summary


EXPERIMENT = ex.Experiment(
    realism,
    options=(("--out", dict(type=Path, default=Path("outputs/sola_realism"))),
             ("--old", dict(default="assets/checkpoints/sola_analytic")),
             ("--new", dict(default="outputs/sola")),
             ("--train", dict(action="store_true", help="train --new first (embodied train sola) if it is missing"))))

if __name__ == "__main__":
    raise SystemExit(ex.moved("perception.spherical.experiments", "sola"))
