"""``embodied train|eval lacwm [--arm eacwm]``: the task functions (the CLI only dispatches).

LAC-WM and its baseline arm EAC-WM share this module; the composed config's model (``model=lacwm`` /
``model=eacwm``) decides which world model is built.
train: record missing data -> pretrain -> adapt to the held-out embodiment (LAC-WM: 3-stage LoRA /
    projector / joint; EAC-WM: a new action encoder + LoRA).
evaluate: imagined-rollout error (vs copy-last-frame / shuffled actions), the latent probe (LAC-WM) and
    planning by candidate selection; writes ``<out_dir>/eval.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.config import TrainerConfig, to_container, to_object
from core.io import write_json
from worldmodels.lacwm.configuration_lacwm import LACWMConfig, WorldModelDataConfig
from worldmodels.lacwm.metrics import linear_probe, rollout_error
from worldmodels.lacwm.training import adapt, data_files, data_keys, pretrain, transitions


def configs(cfg) -> tuple[LACWMConfig, WorldModelDataConfig, TrainerConfig]:
    """Validated model / data / trainer configs of a composed run config."""
    return to_object(cfg.model), to_object(cfg.data), to_object(cfg.trainer)


def train(cfg) -> dict[str, Any]:
    """Record data if missing, pretrain, adapt to the held-out embodiment (and the scratch arm)."""
    from core.bootstrap import prepare_process
    from core.config import save_resolved
    from core.distributed import is_main_process

    prepare_process()  # the learning stack before the recorder's EGL context (ENV.md: triton after EGL segfaults)
    model_cfg, data_cfg, trainer_cfg = configs(cfg)
    out = Path(cfg.out_dir)
    files = data_files(data_cfg)
    run_config = to_container(cfg)
    if is_main_process():
        save_resolved(run_config, out)
    keys = data_keys(data_cfg)
    model = pretrain(model_cfg, files, trainer_cfg, out / "pretrain", run_config, keys=keys)
    adapted = adapt(model, files, data_cfg.held_out, trainer_cfg, out, run_config, keys=keys)
    return {"pretrained": str(out / "pretrain"), "adapted": str(out / "adapted"),
            "parameters": sum(p.numel() for p in adapted.parameters())}


def evaluate(cfg, scratch: bool = False, planning: bool = True) -> dict[str, Any]:
    """Rollout error (+ shuffled / copy-last ablations) of the adapted model on the held-out test episodes,
    (LAC-WM) the linear probe of the pretrained IDM latents, and planning success vs random selection."""
    from core.bootstrap import prepare_process
    from worldmodels.lacwm.modeling_lacwm import LACWorldModel, WorldModel

    prepare_process()
    model_cfg, data_cfg, _ = configs(cfg)
    out = Path(cfg.out_dir)
    files = data_files(data_cfg, record=True)
    path = cfg.eval.checkpoint or out / ("scratch_model" if scratch else "adapted")
    if data_cfg.demos:
        from core.errors import ConfigError

        raise ConfigError("data.demos: a model trained on demonstrations has no test split here; score its "
                          "planning on LIBERO with `embodied experiment lacwm libero-plan`")
    model = WorldModel.from_pretrained(path)
    keys = data_keys(data_cfg)
    test = transitions(files["test"], model.config, context=8, **keys)
    judge = None
    pre_path = out / "pretrain"
    result: dict[str, Any] = {"checkpoint": str(path), "held_out": data_cfg.held_out}
    if isinstance(model, LACWorldModel):
        judge = model
        pre = WorldModel.from_pretrained(pre_path)
        pairs = (transitions(files["adapt"], model.config, context=1, **keys),
                 transitions(files["test"], model.config, context=1, **keys))
        result["probe"] = linear_probe(pre, *pairs)
        # the adapted IDM saw the held-out embodiment (stage-1 LoRA with the LAC loss on the adaptation episodes)
        result["probe_adapted"] = linear_probe(model, *pairs)
    from worldmodels.lacwm.data import embodiment_name

    result["rollout"] = rollout_error(model, test, embodiment_name(data_cfg.held_out), judge=judge)
    if planning and data_cfg.plan_episodes > 0:
        from sim.manipulation.registration import env_id
        from worldmodels.lacwm.pipeline_lacwm import planning_eval

        result["planning"] = planning_eval(path, env_id("Reach", data_cfg.held_out), episodes=data_cfg.plan_episodes,
                                           image_size=data_cfg.image_size, max_steps=data_cfg.plan_max_steps,
                                           camera=data_cfg.camera)
    write_json(out / ("eval_scratch.json" if scratch else "eval.json"), result)
    return result


def make_policy(env, checkpoint=None, **options):
    """``core.registry.POLICIES`` factory: a candidate-selection planner on this world model (a checkpoint, required)
    for ``env``; ``options`` go to ``load_planner_policy`` (select, num_candidates, horizon)."""
    from core.checkpoint import require_checkpoint
    from worldmodels.lacwm.pipeline_lacwm import load_planner_policy

    return load_planner_policy(require_checkpoint(checkpoint, "lacwm / eacwm"), env, **options)
