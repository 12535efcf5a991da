"""The foundation's demo sections: methods table, simulators, rendered datasets, data loaders.

Each function is ``fn(ctx: DemoContext) -> DemoSection`` (see ``core.demo``); sizes are small so the
whole demo runs in a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import numpy as np

from core.demo import DemoContext, DemoSection, img_tag, table, video_tag
from core.viz import colorize, normals_to_rgb


def methods_section(ctx: DemoContext) -> DemoSection:
    """The table of registered methods and their arms."""
    from embodied import methods

    rows = methods.status()
    return DemoSection(
        title="Methods",
        lead="The methods that registered themselves, and the arms of each one's experiments: "
             "`embodied train|eval METHOD --arm NAME` runs one (the first is the method itself).",
        body=table(rows, ["name", "folder", "description", "arms"]),
        figures={"methods": [r["name"] for r in rows]},
    )


def _record(ctx: DemoContext, env_id: str, episodes: int, folder: str, image_size: int = 64,
            max_steps: int | None = None, seed: int = 0, policy: str = "scripted"):
    from sim.recorder import record_rollout
    from sim.rollout import RolloutConfig

    cfg = RolloutConfig(env_id=env_id, episodes=episodes, seed=seed, policy=policy,
                        env_kwargs={"image_size": image_size}, max_episode_steps=max_steps, progress=False)
    return record_rollout(cfg, ctx.path("sim", folder), video=True, fps=20)


def simulators_section(ctx: DemoContext) -> DemoSection:
    """The simulators: the registered envs and recorded expert rollouts of a few of them.

    LIBERO's row is its task-solving expert; the others are the scripted policies.
    """
    import gymnasium as gym

    import sim

    sim.register_envs()
    ids = sorted(i for i in gym.registry if i.startswith(f"{sim.NAMESPACE}/"))
    families: dict[str, int] = {}
    for i in ids:
        fam = "libero" if "/Libero-" in i else "driving" if "/Drive-" in i else "manipulation"
        families[fam] = families.get(fam, 0) + 1
    from core.resources import asset

    shipped_bc = asset("checkpoints", "bc_libero")
    runs = [  # LIBERO: the privileged expert that solves the task, to the suite's step limit (220), and the
        # shipped learned policy (images + proprio + instruction) on the same task
        ("reach_panda", "embodied/Reach-Panda-v0", 4, "scripted", "scripted"),
        ("lift_kinova3", "embodied/Lift-Kinova3-v0", 1, "scripted", "scripted"),
        ("drive_highway", "embodied/Drive-Highway-v0", 1, "scripted", "scripted"),
        ("libero_spatial_0", "embodied/Libero-spatial-0-v0", 1, "expert", "expert"),
        ("libero_spatial_0_bc", "embodied/Libero-spatial-0-v0", 1, str(shipped_bc), "shipped BC"),
    ]
    rows, videos = [], []
    for folder, env_id, episodes, policy, name in runs:
        if env_id not in gym.registry:
            rows.append({"env": env_id, "status": "not registered"})
            continue
        res = _record(ctx, env_id, episodes, folder, policy=policy)
        s = res.summary
        rows.append({"env": env_id, "policy": name, "embodiment": s.get("embodiment"), "episodes": s["episodes"],
                     "success_rate": s["success_rate"], "mean_length": s["mean_length"],
                     "steps/s": s.get("steps_per_s", float("nan")), "hdf5": ctx.rel(s["hdf5"])})
        if s.get("videos"):
            videos.append(video_tag(ctx.rel(s["videos"][0]), f"{env_id} ({name})", width=192))
        ctx.artifacts[f"rollout:{env_id}" + ("" if name in ("scripted", "expert") else f" ({name})")] = s["hdf5"]
    fam_rows = [{"family": k, "environments": v} for k, v in sorted(families.items())]
    body = ("<h3>Registered environments</h3>" + table(fam_rows)
            + "<h3>Expert rollouts, recorded as HDF5 (robomimic / LIBERO layout) + mp4</h3>"
            + table(rows) + "".join(videos))
    return DemoSection(
        title="Simulators: manipulation suite, driving, LIBERO",
        lead="`embodied sim list` shows every environment; `embodied sim rollout ENV --policy scripted|expert` "
             "records the episodes below. Success here is over a handful of episodes — see the sim benchmark, "
             "tests and sim/libero/RESULTS.md for measured rates. On LIBERO the task-solving expert acts "
             "(`--policy expert`: it reads the simulator's state; 98 % of libero_spatial's 500 episodes), then "
             "the shipped learned policy (`assets/checkpoints/bc_libero`: the agent-view and wrist cameras, "
             "proprio and the instruction; its libero_spatial rate is in its model card).",
        body=body,
        figures={"environments": len(ids),
                 **{r["env"] + ("" if r.get("policy") in (None, "scripted", "expert") else f" ({r['policy']})"):
                    r.get("success_rate") for r in rows}},
    )


def datasets_section(ctx: DemoContext) -> DemoSection:
    """Samples of the datasets the scene renderers make for perception."""
    from core.data.images import read_depth, read_normals

    figs, parts = {}, []
    # Transparent labware, path-traced (Mitsuba 3): RGB, twin, normals, depth, mask.
    from sim.render import normals as rn

    root = ctx.path("datasets", "normals")
    rn.make_dataset(root, n=3, seed=ctx.seed, size=64, spp=16, test_fraction=0.34)
    ctx.artifacts["normals_root"] = str(root)
    import cv2

    tags = []
    for rgb_path in sorted((root / "train" / "rgb").glob("*.png"))[:2]:
        sid = rgb_path.stem
        rgb = cv2.imread(str(rgb_path))[..., ::-1]
        twin = cv2.imread(str(root / "train" / "rgb_twin" / f"{sid}.png"))[..., ::-1]
        n, valid = read_normals(root / "train" / "normals" / f"{sid}.png")
        depth = read_depth(root / "train" / "depth" / f"{sid}.png")
        mask = cv2.imread(str(root / "train" / "mask" / f"{sid}.png"), cv2.IMREAD_UNCHANGED)
        for name, img in (("rgb", rgb), ("twin", twin), ("normals", normals_to_rgb(n, valid)),
                          ("depth", colorize(depth, depth > 0)), ("mask", mask)):
            tags.append(img_tag(ctx.save_image(f"normals_{sid}_{name}.png", img, scale=2), f"{sid} {name}", 128))
        tags.append("<br>")
    parts.append("<h3>Transparent labware (normals dataset)</h3><p>Glass with real refraction, its "
                 "diffuse twin (same geometry), camera-frame normals (OpenCV axes, colour = (n+1)/2), "
                 "z-depth and the glass mask.</p>" + "".join(tags))
    figs["normals_views"] = 3
    # Panoramas: equirectangular RGB, depth, semantics.
    from sim.render import panoramas as rp

    proot = ctx.path("datasets", "panoramas")
    rp.make_dataset(proot, n=2, seed=ctx.seed, size=64, spp=4, test_fraction=0.5)
    ctx.artifacts["panoramas_root"] = str(proot)
    sid = sorted((proot / "train" / "rgb").glob("*.png"))[0].stem
    rgb = cv2.imread(str(proot / "train" / "rgb" / f"{sid}.png"))[..., ::-1]
    depth = read_depth(proot / "train" / "depth" / f"{sid}.png")
    sem = cv2.imread(str(proot / "train" / "semantic" / f"{sid}.png"), cv2.IMREAD_UNCHANGED)
    parts.append("<h3>Indoor panoramas (equirectangular)</h3>" + "".join(
        img_tag(ctx.save_image(f"pano_{key}.png", img, scale=2), caption, 256)
        for key, caption, img in (("rgb", "rgb", rgb), ("depth", "depth (range, m)", colorize(depth, depth > 0)),
                                  ("semantic", "semantics", colorize(sem.astype(float), None, "tab10")))))
    # Videos of simulated motion.
    from sim.render import videos as rv

    vroot = ctx.path("datasets", "videos")
    rv.make_dataset(vroot, n=2, seed=ctx.seed, size=64, test_fraction=0.5)
    ctx.artifacts["videos_root"] = str(vroot)
    clips = sorted(vroot.rglob("*.mp4"))
    parts.append("<h3>Simulated motion clips</h3>" + "".join(video_tag(ctx.rel(p), p.stem, 128) for p in clips))
    figs["video_clips"] = len(clips)
    return DemoSection(
        title="Datasets rendered for perception",
        lead="`embodied sim make-dataset normals|panoramas|videos --n N --out DIR`: deterministic from a seed, "
             "written in the formats core/data reads (and users already have).",
        body="".join(parts),
        figures=figs,
    )


def loaders_section(ctx: DemoContext) -> DemoSection:
    """The shared data loaders and device-side transforms on a rendered batch."""
    import torch

    from core.data.device import DeviceLoader, RandomHorizontalFlip
    from core.data.images import DenseImageDataset
    from core.data.trajectories import TrajectoryDataset

    rows = []
    hdf5 = ctx.artifacts.get("rollout:embodied/Reach-Panda-v0")
    if hdf5:
        ds = TrajectoryDataset(hdf5, obs_keys=["image", "proprio", "eef_delta"], horizon=8, frame_stack=2)
        sample = ds[0]
        rows += [{"dataset": "TrajectoryDataset (Reach-Panda HDF5)", "key": k, "shape": tuple(v.shape),
                  "dtype": str(v.dtype).replace("torch.", "")} for k, v in sample.items()]
        rows.append({"dataset": "", "key": "windows / episodes", "shape": f"{len(ds)} / {len(ds.episodes)}"})
    parts = []
    root = ctx.artifacts.get("normals_root")
    if root:
        ds = DenseImageDataset(root, "train")
        loader = torch.utils.data.DataLoader(ds, batch_size=len(ds))
        flip = RandomHorizontalFlip(p=1.0)
        dev = DeviceLoader(loader, "cpu", transforms=[flip], seed=0)
        batch = next(iter(dev))
        plain = next(iter(loader))
        rows += [{"dataset": "DenseImageDataset (normals)", "key": k, "shape": tuple(v.shape),
                  "dtype": str(v.dtype).replace("torch.", "")} for k, v in plain.items() if hasattr(v, "shape")]
        n0 = plain["normals"][0].permute(1, 2, 0).numpy()
        n1 = batch["normals"][0].permute(1, 2, 0).numpy()
        v0 = plain["valid"][0].numpy()
        v1 = batch["valid"][0].numpy()
        ok = np.allclose(n1[:, ::-1, 0], -n0[:, :, 0]) and np.allclose(n1[:, ::-1, 1:], n0[:, :, 1:])
        parts.append("<h3>Device-side flip on normals</h3><p>A horizontal flip mirrors the image and negates "
                     f"the normal's x component (checked: {'yes' if ok else 'NO'}).</p>"
                     + img_tag(ctx.save_image("flip_before.png", normals_to_rgb(n0, v0), 2), "normals", 128)
                     + img_tag(ctx.save_image("flip_after.png", normals_to_rgb(n1, v1), 2), "flipped", 128))
    return DemoSection(
        title="Shared data loaders",
        lead="The recorded rollouts and rendered datasets read back through core/data: documented keys, "
             "shapes and dtypes; a device loader that copies on a side stream on GPU and augments there.",
        body=table(rows, ["dataset", "key", "shape", "dtype"]) + "".join(parts),
        figures={"rows": len(rows)},
    )
