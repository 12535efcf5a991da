"""``embodied train automot`` / ``embodied eval automot``: the AutoMoT driving VLA, one arm.

train:
  [driving logs: the privileged expert in every scenario, ``data.root/{train,test}/<scenario>/*.hdf5``, built on
  first use by ``driving.automot.data.make_driving_dataset``] ->
  [the understanding expert: ``model.base_path`` — a user's Qwen-VL folder, or a tiny Qwen2.5-VL pretrained here
  on driving-scene QA and templated reasoning text from the training logs (``driving.automot.reasoning``), under
  a lock so that several arms share it] ->
  imitation (``<out_dir>/vla``, a resumable ``core.trainer.Trainer`` run): meta-action CE + route L1 + weighted
  waypoint L1 + speed smooth-L1; the ``automot`` arm also trains the understanding expert (plus
  ``model.lm_loss_weight`` x its next-token loss on the samples' reasoning text), ``frozen`` keeps it frozen,
  ``noreason`` has none ->
  the refiner (``<out_dir>/refiner``): flow matching on the waypoints, conditioned on the frozen VLA's features
  and coarse plan ->
  ``<out_dir>/policy``: the ``DrivingVLA``'s ``save_pretrained`` folder (``config.json`` + ``model.safetensors``
  + ``README.md``: the trained weights and the refiner; the base VLM referenced by its absolute path).

evaluate: open loop on the held-out logs (L2 at 1 / 2 / 3 s, ADE, meta-action accuracy, coarse and refined;
general reasoning: ``qa_token_match`` of the understanding expert on held-out scene QA, next to the base's), then
closed loop
through ``driving.evaluate`` in every scenario (``data.eval_episodes`` episodes, update interval
``model.update_interval``, refiner on / off). Writes ``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.errors import CheckpointError, ConfigError
from core.io import write_json
from core.logging import get_logger
from driving.automot.configuration_automot import (
    META_ACTIONS,
    REASON_PROMPT,
    SYSTEM_PROMPT,
    AutoMoTConfig,
    AutoMoTDataConfig,
    AutoMoTModelConfig,
    DrivingVLAConfig,
)

log = get_logger("embodied.automot")

POLICY_DIR = "policy"
LEGACY_POLICY_FILE = "automot.json"  # the folder format before DrivingVLA.save_pretrained


# -- data ----------------------------------------------------------------------------------------------------------
def ensure_data(data: AutoMoTDataConfig) -> Path:
    """Build (or resume) the train and test splits of the expert's driving logs."""
    from driving.automot.data import make_driving_dataset

    for split, n in (("train", data.episodes), ("test", data.test_episodes)):
        make_driving_dataset(data.root, tuple(data.scenarios), episodes=n, seed=data.seed,
                             image_size=data.image_size, workers=data.workers, split=split, horizon_s=data.horizon_s)
    return Path(data.root)


def samples(model_cfg: AutoMoTModelConfig, data: AutoMoTDataConfig, split: str, qa: bool = False,
            stride: int | None = None):
    from driving.automot.data import DrivingSamples

    mot = AutoMoTConfig.from_dict(dict(model_cfg.mot))
    return DrivingSamples(data.root, split, scenarios=list(data.scenarios), history=model_cfg.history,
                          stride=stride or data.stride, n_target_points=mot.n_target, route_n=mot.n_route, qa=qa,
                          qa_seed=data.seed)


def reasoning_answer(meta_action: int, reasoning: str) -> str:
    """``"slow_down: a vehicle 12 m ahead ..."``: the meta-action's token, then the scene-grounded reason."""
    reason = reasoning.split(":", 1)[1].strip() if ":" in reasoning else reasoning
    return f"{META_ACTIONS[int(meta_action)]}: {reason}"


def meta_answer(answer: str) -> str:
    """A QA answer naming a meta-action in words ("slow down") -> its token ("slow_down")."""
    words = {m.replace("_", " "): m for m in META_ACTIONS}
    return words.get(answer, answer)


class UnderstandingSet(torch.utils.data.Dataset):
    """Pretraining examples of the understanding expert: per logged step, the reasoning question or one of the
    scene-QA pairs (chosen by a seeded draw), with the step's front frames."""

    def __init__(self, base: Any, seed: int):
        self.base, self.seed = base, int(seed)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self.base[i]
        pairs = [(REASON_PROMPT, reasoning_answer(int(s["meta_action"]), s["reasoning"]))]
        pairs += [(q, meta_answer(a)) for q, a in s.get("qa", [])]
        q, a = pairs[int(np.random.default_rng((self.seed, i)).integers(len(pairs)))]
        return {"images": s["images"], "question": q, "answer": a}


def understanding_collate(items: list[dict[str, Any]], prompter: Any, spec: Any) -> dict[str, Any]:
    from core.vlm import patchify
    from driving.automot.inputs import _pad, square_frames

    images = torch.stack([it["images"] for it in items])
    pv, grid = patchify(square_frames(images, spec.image_size), spec)
    exs = [prompter.example(it["question"], it["answer"]) for it in items]
    ids, mask = _pad([e["input_ids"] for e in exs], prompter.pad_id)
    labels, _ = _pad([e["labels"] for e in exs], -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "pixel_values": pv, "image_grid_thw": grid}


def tokenizer_corpus(base: Any, limit: int = 4000) -> list[str]:
    """Text the tokenizer is trained on: prompts, instructions, reasoning answers and QA pairs of the logs."""
    lines = [SYSTEM_PROMPT, REASON_PROMPT, *META_ACTIONS]
    step = max(1, len(base) // limit)
    for i in range(0, len(base), step):
        s = base[i]
        lines += [s["instruction"], reasoning_answer(int(s["meta_action"]), s["reasoning"])]
        lines += [f"{q} {meta_answer(a)}" for q, a in s.get("qa", [])]
    return lines


def meta_token_ids(tok: Any, names: tuple[str, ...] = META_ACTIONS) -> list[int]:
    """One vocabulary id per meta-action: its own token when the tokenizer has one (the tiny VLMs trained here
    add them), else the first token of the name (must differ between names)."""
    ids = []
    for n in names:
        t = tok.convert_tokens_to_ids(n)
        ids.append(t if t is not None and t != tok.unk_token_id and t >= 0 else tok(n, add_special_tokens=False)
                   ["input_ids"][0])
    if len(set(ids)) != len(ids):
        raise ConfigError(f"the tokenizer does not tell the meta-actions {names} apart by one token each ({ids}); "
                          "add them as tokens (tokenizer.add_tokens) and resize the VLM's embeddings")
    return ids


def missing_meta_tokens(tok: Any, names: tuple[str, ...] = META_ACTIONS) -> list[str]:
    """The meta-action names to add as whole tokens: none when ``meta_token_ids`` already tells every name apart
    (the tokenizer is used as it is); else every name that is not one token yet."""
    try:
        meta_token_ids(tok, names)
        return []
    except ConfigError:
        from core.vlm import has_token

        return [n for n in names if not has_token(tok, n)]


def ensure_base(model_cfg: AutoMoTModelConfig, data: AutoMoTDataConfig, tcfg: TrainerConfig):
    """(vlm, tokenizer) from ``model.base_path``; pretrained there on driving QA + reasoning if it holds none
    (``core.vlm.ensure_base_vlm``: under a lock, resumable; the meta-action names become whole tokens)."""
    from core.vlm import BasePretraining, ensure_base_vlm
    from driving.automot.inputs import Prompter

    train = functools.cache(lambda: samples(model_cfg, data, "train", qa=True))
    how = BasePretraining(sizes=dict(model_cfg.vlm), image_size=model_cfg.image_size,
                          tokenizer_vocab=model_cfg.tokenizer_vocab, steps=model_cfg.pretrain_steps,
                          batch_size=model_cfg.pretrain_batch, lr=model_cfg.pretrain_lr,
                          extra_tokens=tuple(META_ACTIONS), method="automot",
                          what="tiny Qwen2.5-VL-class model pretrained on driving-scene QA and reasoning text by "
                               "`embodied train automot`")
    return ensure_base_vlm(
        model_cfg.base_path, how, tcfg, corpus=lambda: tokenizer_corpus(train()),
        dataset=lambda tok, spec: UnderstandingSet(train(), tcfg.seed),
        collate=lambda tok, spec: functools.partial(understanding_collate, spec=spec,
                                                    prompter=Prompter(tok, spec.tokens_per_image, model_cfg.history)),
        run_config={"model": dataclasses.asdict(model_cfg)}, card={"meta_action_tokens": list(META_ACTIONS)},
        dtype=model_cfg.base_dtype)


# -- the VLA ------------------------------------------------------------------------------------------------------
def mot_config(model_cfg: AutoMoTModelConfig, vlm: nn.Module | None, tok: Any | None) -> AutoMoTConfig:
    values = dict(model_cfg.mot)
    values["use_understanding"] = model_cfg.arm != "noreason"
    values["freeze_understanding"] = model_cfg.arm == "frozen"
    if vlm is not None:
        values["meta_action_token_ids"] = meta_token_ids(tok, tuple(values.get("meta_action_names", META_ACTIONS)))
    else:  # the noreason expert keeps the attention geometry and depth the VLM arms' expert has
        v = model_cfg.vlm
        values.update(num_layers=int(v["num_layers"]), num_heads=int(v["num_heads"]),
                      num_kv_heads=int(v["num_kv_heads"]),
                      head_dim=int(v.get("head_dim") or v["hidden_size"] // v["num_heads"]))
        values["meta_action_token_ids"] = []
    return AutoMoTConfig.from_dict(values)


def vla_collate(items: list[dict[str, Any]], prompter: Any, spec: Any, lm: bool) -> dict[str, Any]:
    from driving.automot.data import collate_driving
    from driving.automot.inputs import model_batch

    s = collate_driving(items)
    answers = ([reasoning_answer(int(m), r) for m, r in zip(s["meta_action"], s["reasoning"], strict=True)]
               if lm else None)
    return model_batch(s, prompter, spec, questions=[REASON_PROMPT] * len(items) if lm else None,
                       lm_answers=answers)


def policy_config(model_cfg: AutoMoTModelConfig, vlm: nn.Module | None, tok: Any | None,
                  added_tokens: list[str] | None = None) -> DrivingVLAConfig:
    """The resolved ``DrivingVLAConfig`` an arm trains (geometry and meta-action ids from the VLM, the refiner's
    ``cond_dim``; ``added_tokens``: what ``build_policy`` added to ``tok``)."""
    mot = mot_config(model_cfg, vlm, tok)
    lm = model_cfg.arm == "automot" and model_cfg.lm_loss_weight > 0
    return DrivingVLAConfig(arm=model_cfg.arm, base_path=model_cfg.base_path if vlm is not None else "",
                            base_dtype=model_cfg.base_dtype, added_tokens=list(added_tokens or []),
                            image_size=model_cfg.image_size, history=model_cfg.history, mot=mot,
                            refiner=refiner_config(model_cfg, mot).to_dict() if model_cfg.refiner_steps > 0 else None,
                            lm_loss_weight=model_cfg.lm_loss_weight if lm else 0.0)


def build_policy(model_cfg: AutoMoTModelConfig, vlm: nn.Module | None, tok: Any | None):
    """The ``DrivingVLA`` of an arm around an already loaded base (``vlm``, ``tok``; None for noreason).

    A tokenizer that does not tell the meta-actions apart by one token each gets them as whole tokens first
    (``core.vlm.add_tokens``: ``tok`` and ``vlm`` are changed in place; the policy records what was added).
    """
    from core.vlm import add_tokens
    from driving.automot.modeling_automot import DrivingVLA

    added: list[str] = []
    if vlm is not None:
        names = tuple(dict(model_cfg.mot).get("meta_action_names", META_ACTIONS))
        added = add_tokens(vlm, tok, missing_meta_tokens(tok, names))
        if added:
            log.info("the tokenizer lacked the meta-action tokens %s: added, the VLM's embeddings resized", added)
    return DrivingVLA(policy_config(model_cfg, vlm, tok, added), base=(vlm, tok) if vlm is not None else None)


def build_policy_model(model_cfg: AutoMoTModelConfig, vlm: nn.Module | None, tok: Any | None):
    """(AutoMoT, Prompter | None, PatchSpec | None) of an arm (the joint model alone, e.g. for benchmarks)."""
    vla = build_policy(model_cfg, vlm, tok)
    return vla.mot, vla.prompter, vla.spec


def refiner_config(model_cfg: AutoMoTModelConfig, mot: Any):
    """The refiner's ``RefinerConfig`` for a joint model (an ``AutoMoT`` or its ``AutoMoTConfig``)."""
    from driving.automot.refiner import RefinerConfig

    cfg = getattr(mot, "cfg", mot)
    cond = cfg.n_wp * cfg.expert_hidden_size
    return RefinerConfig.from_dict({**dict(model_cfg.refiner), "cond_dim": cond, "n_wp": cfg.n_wp})


# -- the policy folder ---------------------------------------------------------------------------------------------
def load_model(folder: str | Path, device: str | torch.device = "cpu"):
    """A policy folder (or a run folder holding ``policy/``) -> the ``DrivingVLA``, in eval mode and frozen
    (``DrivingVLA.from_pretrained``: strict, the base resolved from the folder's reference).

    Raises:
        CheckpointError: Not an AutoMoT policy folder, one in the former layout, or unreadable files.
    """
    from core.checkpoint import CONFIG_FILE
    from driving.automot.modeling_automot import DrivingVLA

    folder = Path(folder)
    if (folder / POLICY_DIR / CONFIG_FILE).is_file() or (folder / POLICY_DIR / LEGACY_POLICY_FILE).is_file():
        folder = folder / POLICY_DIR
    if (folder / LEGACY_POLICY_FILE).is_file():
        raise CheckpointError(f"{folder}: an AutoMoT policy folder in the former layout ({LEGACY_POLICY_FILE}); "
                              "retrain it with `embodied train automot` (the folder is now "
                              "DrivingVLA.save_pretrained's)")
    if not (folder / CONFIG_FILE).is_file() or not (folder / "model.safetensors").is_file():
        raise CheckpointError(f"{folder}: not an AutoMoT policy folder (no {CONFIG_FILE} + model.safetensors); "
                              "train one with `embodied train automot`")
    vla = DrivingVLA.from_pretrained(folder, device=device)
    return vla.requires_grad_(False)


# -- train / evaluate ----------------------------------------------------------------------------------------------
def _configs(cfg) -> tuple[AutoMoTModelConfig, AutoMoTDataConfig, TrainerConfig]:
    model_cfg, data, tcfg = to_object(cfg.model), to_object(cfg.data), to_object(cfg.trainer)
    if not isinstance(model_cfg, AutoMoTModelConfig) or not isinstance(data, AutoMoTDataConfig):
        raise ConfigError("automot needs model=automot* and data=automot (the experiment preset sets both)")
    return model_cfg, data, tcfg


def train(cfg) -> dict[str, Any]:
    """Train one arm (see the module docstring)."""
    from core.bootstrap import prepare_process
    from core.distributed import barrier, is_main_process
    from core.trainer import Trainer, seed_everything

    prepare_process()
    model_cfg, data, tcfg = _configs(cfg)
    out_dir = Path(cfg.out_dir)
    run_config = to_container(cfg)
    if is_main_process():
        save_resolved(run_config, out_dir)
    ensure_data(data)
    seed_everything(tcfg.seed)
    vlm, tok = ensure_base(model_cfg, data, tcfg) if model_cfg.arm != "noreason" else (None, None)
    seed_everything(tcfg.seed)
    vla = build_policy(model_cfg, vlm, tok)
    lm = vla.config.lm_loss_weight > 0
    ds = samples(model_cfg, data, "train")
    collate = functools.partial(vla_collate, prompter=vla.prompter, spec=vla.spec, lm=lm)
    log.info("%s: imitation on %d logged steps for %d steps (trainable %d parameters)", model_cfg.arm, len(ds),
             tcfg.max_steps, sum(p.numel() for p in vla.parameters() if p.requires_grad))
    trainer = Trainer(vla, ds, tcfg, out_dir / "vla", run_config=run_config, collate_fn=collate)
    results = {"vla": trainer.fit()["metrics"]}
    trainer.release()  # FSDP: plain parameters again, for the refiner stage and save_pretrained
    if vla.refiner is not None:
        seed_everything(tcfg.seed + 1)
        vla.set_stage("refiner")
        rcfg = dataclasses.replace(tcfg, max_steps=model_cfg.refiner_steps, ema_decay=None,
                                   optim=dataclasses.replace(tcfg.optim, lr=model_cfg.refiner_lr))
        trainer = Trainer(vla, ds, rcfg, out_dir / "refiner", run_config=run_config, collate_fn=collate)
        results["refiner"] = trainer.fit()["metrics"]
        trainer.release()
    vla.set_stage("vla")
    command = (f"embodied train automot model.arm={model_cfg.arm} trainer.seed={tcfg.seed} "
               f"trainer.max_steps={tcfg.max_steps}")
    if is_main_process():  # under torchrun only rank 0 writes the policy (the ranks raced)
        vla.save_pretrained(out_dir / POLICY_DIR, card={"command": command, "stages": results,
                                                        "env_image_size": data.image_size,
                                                        "scenarios": list(data.scenarios)},
                            run_config={k: v for k, v in run_config.items() if k != "model"})
    barrier()  # the other ranks return once the policy is on disk
    return {"arm": model_cfg.arm, "stages": results, "policy": str(out_dir / POLICY_DIR)}


@torch.no_grad()
def predict_waypoints(policy: Any, batch: dict[str, Any], refine: bool, seed: int = 0) -> dict[str, Any]:
    """The coarse (and refined) plans and the meta-action of a model batch (``policy``: a ``DrivingVLA``)."""
    refiner = policy.refiner
    out = policy(batch)
    res = {"coarse": out.waypoints, "meta": out.meta_logits.argmax(-1)}
    if refine and refiner is not None:
        g = torch.Generator().manual_seed(seed)
        res["refined"] = refiner.refine(out.features, out.waypoints, generator=g)
    return res


def openloop(policy: Any, ds: Any, batch: int = 64, limit: int | None = None) -> dict[str, Any]:
    """Open-loop metrics on logged steps: L2 at 1 / 2 / 3 s, ADE and the collision rate of the coarse (and
    refined) plans against the logged future (other agents at their logged positions at the waypoint times,
    ``driving.openloop``), and meta-action accuracy against the expert's label. ``gt_collision_rate`` is the same
    test on the logged future itself (the floor that approximation sets)."""
    from driving.automot.data import collate_driving
    from driving.automot.inputs import model_batch
    from driving.openloop import future_targets, l2_at_horizons, trajectory_collisions

    n = len(ds) if limit is None else min(limit, len(ds))
    idx = np.linspace(0, len(ds) - 1, n).round().astype(int) if n < len(ds) else np.arange(n)
    futures: dict[int, np.ndarray] = {}

    def agents_future(ei: int, t: int) -> np.ndarray:
        if ei not in futures:
            log_ = ds._logs[ei]
            futures[ei] = future_targets(log_["poses"][:-1], log_["agents"], log_["dt"])[1]
        return futures[ei][t]

    preds: dict[str, list[np.ndarray]] = {"coarse": [], "refined": []}
    gts, hits, afs = [], [], []
    for lo in range(0, n, batch):
        s = collate_driving([ds[int(i)] for i in idx[lo: lo + batch]])
        res = predict_waypoints(policy, model_batch(s, policy.prompter, policy.spec), refine=True, seed=lo)
        for k in preds:
            if k in res:
                preds[k].append(res[k].cpu().numpy())
        gts.append(s["waypoints"].numpy())
        hits.append((res["meta"].cpu() == s["meta_action"]).numpy())
        afs += [agents_future(int(e), int(t)) for e, t in zip(s["episode"], s["step"], strict=True)]
    gt, af = np.concatenate(gts), np.stack(afs)
    out: dict[str, Any] = {"samples": int(n), "meta_accuracy": float(np.concatenate(hits).mean()),
                           "gt_collision_rate": float(trajectory_collisions(gt, af).mean())}
    for k, v in preds.items():
        if v:
            p = np.concatenate(v)
            out[k] = {**l2_at_horizons(p, gt), "ade": float(np.linalg.norm(p - gt, axis=-1).mean()),
                      "collision_rate": float(trajectory_collisions(p, af).mean())}
    return out


@torch.no_grad()
def qa_token_match(vlm: nn.Module, prompter: Any, spec: Any, ds: Any, n: int = 300, seed: int = 0) -> dict[str, Any]:
    """General reasoning kept (``qa_token_match``): the share of held-out scene-QA / reasoning answers whose every
    token (the closing ``<|im_end|>`` included) is the understanding expert's argmax under teacher forcing, over
    ``n`` drawn steps.

    Token for token this is "greedy decoding reproduces the reference answer"; it is stricter than Deep-VRM's
    ``qa_exact_match`` (generated text compared after normalising case and punctuation), hence its own name.
    """
    from core.vlm import vlm_inputs

    sset = UnderstandingSet(ds, seed)
    idx = np.random.default_rng(seed).choice(len(ds), size=min(n, len(ds)), replace=False)
    correct = []
    for lo in range(0, len(idx), 32):
        b = understanding_collate([sset[int(i)] for i in idx[lo: lo + 32]], prompter, spec)
        kw = vlm_inputs(vlm, b["input_ids"], b["attention_mask"], b["pixel_values"], b["image_grid_thw"])
        pred = vlm(**kw).logits[:, :-1].argmax(-1)
        labels = b["labels"][:, 1:]
        ok = ((pred == labels) | (labels == -100)).all(-1)
        correct.append(ok.numpy())
    return {"n": int(len(idx)), "acc": float(np.concatenate(correct).mean())}


def evaluate(cfg) -> dict[str, Any]:
    """Open loop on the test logs, general reasoning, and closed loop in every scenario -> ``eval.json``."""
    from core.bootstrap import prepare_process
    from driving.evaluate import evaluate_policy

    prepare_process()
    model_cfg, data, tcfg = _configs(cfg)
    out_dir = Path(cfg.out_dir)
    ensure_data(data)
    policy = load_model(out_dir / POLICY_DIR)
    test = samples(model_cfg, data, "test", stride=1)
    result: dict[str, Any] = {"arm": model_cfg.arm, "openloop": openloop(policy, test, limit=data.eval_samples)}
    if policy.prompter is not None:
        from core.vlm import add_tokens, load_vlm

        qa_test = samples(model_cfg, data, "test", qa=True, stride=1)
        result["qa_token_match"] = qa_token_match(policy.mot.vlm, policy.prompter, policy.spec, qa_test)
        base_vlm, base_tok = load_vlm(policy.config.base_path, dtype=policy.config.base_dtype)
        add_tokens(base_vlm, base_tok, policy.config.added_tokens)  # the policy's vocabulary (none: a no-op)
        result["qa_token_match_base"] = qa_token_match(base_vlm.eval(), policy.prompter, policy.spec, qa_test)
    if data.eval_episodes > 0:
        closed = {}
        for refine in ((False, True) if policy.refiner is not None else (False,)):
            name = f"n{model_cfg.update_interval}" + ("_refiner" if refine else "")
            rep = evaluate_policy("automot" if model_cfg.arm != "noreason" else "noreason", "all",
                                  data.eval_episodes, out_dir / "closed_loop" / name, seed=data.eval_seed,
                                  videos=1, progress=False,
                                  policy_args={"checkpoint": str(out_dir / POLICY_DIR),
                                               "update_interval": model_cfg.update_interval, "refiner": refine})
            closed[name] = {s: r["aggregate"] for s, r in rep["scenarios"].items()} | {"all": rep["aggregate"]}
        result["closed_loop"] = closed
    write_json(out_dir / "eval.json", result)
    ol = result["openloop"]
    log.info("%s: open-loop L2 1/2/3 s %.2f / %.2f / %.2f m (coarse), meta-action acc %.3f%s", model_cfg.arm,
             ol["coarse"]["l2_1s"], ol["coarse"]["l2_2s"], ol["coarse"]["l2_3s"], ol["meta_accuracy"],
             f"; QA token match {result['qa_token_match']['acc']:.3f} (base "
             f"{result['qa_token_match_base']['acc']:.3f})" if "qa_token_match" in result else "")
    return result
