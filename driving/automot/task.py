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
  ``<out_dir>/policy``: a self-contained folder (the VLM, the trained weights, the refiner, ``automot.json``).

evaluate: open loop on the held-out logs (L2 at 1 / 2 / 3 s, ADE, meta-action accuracy, coarse and refined;
general reasoning: the understanding expert's scene-QA answer accuracy next to the base's), then closed loop
through ``driving.evaluate`` in every scenario (``data.eval_episodes`` episodes, update interval
``model.update_interval``, refiner on / off). Writes ``<out_dir>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from core.config import TrainerConfig, save_resolved, to_container, to_object
from core.errors import CheckpointError, ConfigError
from core.io import read_json, write_json
from core.logging import get_logger
from driving.automot.configuration_automot import (
    META_ACTIONS,
    REASON_PROMPT,
    SYSTEM_PROMPT,
    AutoMoTConfig,
    AutoMoTDataConfig,
    AutoMoTModelConfig,
)

log = get_logger("embodied.automot")

POLICY_DIR = "policy"
POLICY_FILE = "automot.json"
WEIGHTS_FILE = "automot.safetensors"
REFINER_FILE = "refiner.safetensors"
BASE_DIR = "base"


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


class UnderstandingModel(nn.Module):
    """The VLM trained on driving QA / reasoning (next-token loss on the answers): the base's pretraining."""

    def __init__(self, vlm: nn.Module):
        super().__init__()
        self.vlm = vlm

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"loss": lm_loss(self.vlm, batch)}


def lm_loss(vlm: nn.Module, batch: dict[str, Any], prefix: str = "") -> torch.Tensor:
    from core.vlm import image_token_id, next_token_loss, vlm_inputs

    ids = batch[f"{prefix}input_ids"]
    kw = vlm_inputs(vlm, ids, batch[f"{prefix}attention_mask"], batch["pixel_values"], batch["image_grid_thw"])
    kw.setdefault("mm_token_type_ids", (ids == image_token_id(vlm)).long())  # Qwen2.5-VL's 3-D positions too
    return next_token_loss(vlm(**kw).logits, batch[f"{prefix}labels"])


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


def ensure_base(model_cfg: AutoMoTModelConfig, data: AutoMoTDataConfig, tcfg: TrainerConfig):
    """(vlm, tokenizer) from ``model.base_path``; pretrained there on driving QA + reasoning if it holds none."""
    from core.outputs import lock_folder
    from core.vlm import VLMConfig, build_tokenizer, build_vlm, load_vlm, save_vlm

    base = Path(model_cfg.base_path)
    if not (base / "config.json").is_file() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"{base}: no base VLM there; pretrain it in one process first (embodied train automot "
                          "with the same model.base_path) or point model.base_path at a local VLM folder")
    with lock_folder(base.with_name(base.name + ".pretrain"), wait=24 * 3600):
        if not (base / "config.json").is_file():
            from core.trainer import Trainer
            from core.vlm import load_tokenizer
            from driving.automot.inputs import Prompter

            train = samples(model_cfg, data, "train", qa=True)
            run_dir = base.with_name(base.name + ".run")
            tok_dir = run_dir / "tokenizer"
            if (tok_dir / "tokenizer.json").is_file():  # a resumed pretraining keeps its tokenizer
                tok = load_tokenizer(tok_dir)
            else:
                tok = build_tokenizer(tokenizer_corpus(train), vocab_size=model_cfg.tokenizer_vocab)
                tok.add_tokens(list(META_ACTIONS))
                tok.save_pretrained(tok_dir)
            vcfg = VLMConfig(**{**dict(model_cfg.vlm), "vocab_size": len(tok)})
            torch.manual_seed(tcfg.seed)
            vlm = build_vlm(vcfg)
            spec = vcfg.patch_spec(model_cfg.image_size)
            prompter = Prompter(tok, spec.tokens_per_image, model_cfg.history)
            ds = UnderstandingSet(train, tcfg.seed)
            pcfg = dataclasses.replace(tcfg, max_steps=model_cfg.pretrain_steps, batch_size=model_cfg.pretrain_batch,
                                       optim=dataclasses.replace(tcfg.optim, lr=model_cfg.pretrain_lr),
                                       scheduler=dataclasses.replace(tcfg.scheduler, name="cosine"))
            log.info("pretraining the understanding expert on %d driving steps (QA + reasoning) for %d steps -> %s",
                     len(ds), model_cfg.pretrain_steps, base)
            Trainer(UnderstandingModel(vlm), ds, pcfg, run_dir, run_config={"model": dataclasses.asdict(model_cfg)},
                    collate_fn=functools.partial(understanding_collate, prompter=prompter, spec=spec)).fit()
            card = {"what": "tiny Qwen2.5-VL-class model pretrained on driving-scene QA and reasoning text by "
                            "`embodied train automot`", "vlm": dataclasses.asdict(vcfg), "examples": len(ds),
                    "steps": model_cfg.pretrain_steps, "meta_action_tokens": list(META_ACTIONS)}
            save_vlm(base, vlm, tok, spec, extra_files={"pretraining.json": json.dumps(card, indent=1)})
    return load_vlm(base)


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


class DrivingVLA(nn.Module):
    """``AutoMoT`` + its training objective (and the understanding expert's language loss in the automot arm)."""

    def __init__(self, mot: nn.Module, lm_weight: float = 0.0):
        super().__init__()
        self.mot, self.lm_weight = mot, float(lm_weight)

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        losses = self.mot.loss(self.mot(batch), batch)
        if self.lm_weight > 0 and "lm_input_ids" in batch:
            lm = lm_loss(self.mot.vlm, batch, prefix="lm_")
            losses["lm"] = lm
            losses["loss"] = losses["loss"] + self.lm_weight * lm
        return losses


def vla_collate(items: list[dict[str, Any]], prompter: Any, spec: Any, lm: bool) -> dict[str, Any]:
    from driving.automot.data import collate_driving
    from driving.automot.inputs import model_batch

    s = collate_driving(items)
    answers = ([reasoning_answer(int(m), r) for m, r in zip(s["meta_action"], s["reasoning"], strict=True)]
               if lm else None)
    return model_batch(s, prompter, spec, questions=[REASON_PROMPT] * len(items) if lm else None,
                       lm_answers=answers)


def build_policy_model(model_cfg: AutoMoTModelConfig, vlm: nn.Module | None, tok: Any | None):
    """(AutoMoT, Prompter | None, PatchSpec | None) for an arm."""
    from core.vlm import patch_spec_of
    from driving.automot.inputs import Prompter
    from driving.automot.modeling_automot import AutoMoT

    cfg = mot_config(model_cfg, vlm, tok)
    if vlm is None:
        return AutoMoT(cfg, None), None, None
    spec = patch_spec_of(vlm, model_cfg.image_size)
    return AutoMoT(cfg, vlm), Prompter(tok, spec.tokens_per_image, model_cfg.history), spec


class RefinerStage(nn.Module):
    """The refiner trained on the frozen VLA's features and coarse waypoints (flow-matching loss)."""

    def __init__(self, mot: nn.Module, refiner: nn.Module):
        super().__init__()
        self.mot, self.refiner = mot.eval().requires_grad_(False), refiner

    def train(self, mode: bool = True):  # the VLA stays in eval mode
        super().train(mode)
        self.mot.eval()
        return self

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            out = self.mot(batch)
        return {"loss": self.refiner.loss(out.features, out.waypoints, batch["waypoints"])}


def refiner_config(model_cfg: AutoMoTModelConfig, mot: nn.Module):
    from driving.automot.refiner import RefinerConfig

    cond = mot.cfg.n_wp * mot.cfg.expert_hidden_size
    return RefinerConfig.from_dict({**dict(model_cfg.refiner), "cond_dim": cond, "n_wp": mot.cfg.n_wp})


# -- the policy folder ---------------------------------------------------------------------------------------------
def save_policy(folder: Path, mot: nn.Module, refiner: nn.Module | None, model_cfg: AutoMoTModelConfig,
                data: AutoMoTDataConfig, meta: dict[str, Any]) -> Path:
    """``base/`` (the understanding expert's config, tokenizer and processor — its weights are in the next file),
    the trained weights (the whole AutoMoT, VLM included), the refiner and ``automot.json``; written aside, then
    renamed."""
    from core.checkpoint import save_weights

    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if mot.vlm is not None:
        shutil.copytree(Path(model_cfg.base_path), tmp / BASE_DIR,
                        ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "qa_eval.json"))
    save_weights({k: v.detach().cpu().contiguous() for k, v in mot.state_dict().items()}, tmp / WEIGHTS_FILE)
    if refiner is not None:
        save_weights({k: v.detach().cpu().contiguous() for k, v in refiner.state_dict().items()}, tmp / REFINER_FILE)
    write_json(tmp / POLICY_FILE, {"kind": "automot", "model": dataclasses.asdict(model_cfg),
                                   "mot": mot.cfg.to_dict(), "env_image_size": data.image_size,
                                   "scenarios": list(data.scenarios), **meta})
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def load_policy_model(folder: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """A policy folder (or a run folder holding ``policy/``) -> ``{"mot", "refiner", "prompter", "spec",
    "meta"}``, in eval mode.

    Raises:
        CheckpointError: Not an AutoMoT policy folder, or its files are missing / unreadable.
    """
    from core.checkpoint import load_weights

    folder = Path(folder)
    if (folder / POLICY_DIR / POLICY_FILE).is_file():
        folder = folder / POLICY_DIR
    if not (folder / POLICY_FILE).is_file():
        raise CheckpointError(f"{folder}: not an AutoMoT policy folder (no {POLICY_FILE}); train one with "
                              "`embodied train automot`")
    meta = read_json(folder / POLICY_FILE)
    model_cfg = AutoMoTModelConfig(**meta["model"])
    vlm = tok = None
    if model_cfg.arm != "noreason":
        from core.vlm import load_vlm

        vlm, tok = load_vlm(folder / BASE_DIR, weights=False)  # the weights come with WEIGHTS_FILE
    mot, prompter, spec = build_policy_model(model_cfg, vlm, tok)
    state = load_weights(folder / WEIGHTS_FILE)
    missing, unexpected = mot.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{folder}: {WEIGHTS_FILE} does not match the model ({len(missing)} missing, e.g. "
                              f"{missing[:1]}; {len(unexpected)} unexpected, e.g. {unexpected[:1]})")
    refiner = None
    if (folder / REFINER_FILE).is_file():
        from driving.automot.refiner import WaypointRefiner

        refiner = WaypointRefiner(refiner_config(model_cfg, mot))
        refiner.load_state_dict(load_weights(folder / REFINER_FILE))
        refiner = refiner.to(device).eval().requires_grad_(False)
    return {"mot": mot.to(device).eval().requires_grad_(False), "refiner": refiner, "prompter": prompter,
            "spec": spec, "meta": meta}


# -- train / evaluate ----------------------------------------------------------------------------------------------
def _configs(cfg) -> tuple[AutoMoTModelConfig, AutoMoTDataConfig, TrainerConfig]:
    model_cfg, data, tcfg = to_object(cfg.model), to_object(cfg.data), to_object(cfg.trainer)
    if not isinstance(model_cfg, AutoMoTModelConfig) or not isinstance(data, AutoMoTDataConfig):
        raise ConfigError("automot needs model=automot* and data=automot (the experiment preset sets both)")
    return model_cfg, data, tcfg


def train(cfg) -> dict[str, Any]:
    """Train one arm (see the module docstring)."""
    from core.bootstrap import prepare_process
    from core.trainer import Trainer, seed_everything

    prepare_process()
    model_cfg, data, tcfg = _configs(cfg)
    out_dir = Path(cfg.out_dir)
    run_config = to_container(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        save_resolved(run_config, out_dir)
    ensure_data(data)
    seed_everything(tcfg.seed)
    vlm, tok = ensure_base(model_cfg, data, tcfg) if model_cfg.arm != "noreason" else (None, None)
    seed_everything(tcfg.seed)
    mot, prompter, spec = build_policy_model(model_cfg, vlm, tok)
    lm = model_cfg.arm == "automot" and model_cfg.lm_loss_weight > 0
    ds = samples(model_cfg, data, "train")
    collate = functools.partial(vla_collate, prompter=prompter, spec=spec, lm=lm)
    log.info("%s: imitation on %d logged steps for %d steps (trainable %d parameters)", model_cfg.arm, len(ds),
             tcfg.max_steps, sum(p.numel() for p in mot.trainable_parameters()))
    vla = DrivingVLA(mot, model_cfg.lm_loss_weight if lm else 0.0)
    results = {"vla": Trainer(vla, ds, tcfg, out_dir / "vla", run_config=run_config, collate_fn=collate).fit()["metrics"]}
    refiner = None
    if model_cfg.refiner_steps > 0:
        from driving.automot.refiner import WaypointRefiner

        seed_everything(tcfg.seed + 1)
        refiner = WaypointRefiner(refiner_config(model_cfg, mot))
        rcfg = dataclasses.replace(tcfg, max_steps=model_cfg.refiner_steps, ema_decay=None,
                                   optim=dataclasses.replace(tcfg.optim, lr=model_cfg.refiner_lr))
        results["refiner"] = Trainer(RefinerStage(mot, refiner), ds, rcfg, out_dir / "refiner",
                                     run_config=run_config, collate_fn=collate).fit()["metrics"]
    save_policy(out_dir / POLICY_DIR, mot, refiner, model_cfg, data,
                {"stages": results, "command": f"embodied train automot model.arm={model_cfg.arm} "
                                               f"trainer.seed={tcfg.seed} trainer.max_steps={tcfg.max_steps}"})
    return {"arm": model_cfg.arm, "stages": results, "policy": str(out_dir / POLICY_DIR)}


@torch.no_grad()
def predict_waypoints(policy: dict[str, Any], batch: dict[str, Any], refine: bool, seed: int = 0) -> dict[str, Any]:
    """The coarse (and refined) plans and the meta-action of a model batch."""
    mot, refiner = policy["mot"], policy["refiner"]
    out = mot(batch)
    res = {"coarse": out.waypoints, "meta": out.meta_logits.argmax(-1)}
    if refine and refiner is not None:
        g = torch.Generator().manual_seed(seed)
        res["refined"] = refiner.refine(out.features, out.waypoints, generator=g)
    return res


def openloop(policy: dict[str, Any], ds: Any, batch: int = 64, limit: int | None = None) -> dict[str, Any]:
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
        res = predict_waypoints(policy, model_batch(s, policy["prompter"], policy["spec"]), refine=True, seed=lo)
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
def qa_accuracy(vlm: nn.Module, prompter: Any, spec: Any, ds: Any, n: int = 300, seed: int = 0) -> dict[str, Any]:
    """General reasoning kept: the share of held-out scene-QA / reasoning answers whose every token is the
    understanding expert's argmax under teacher forcing (exact match), over ``n`` drawn steps."""
    from core.vlm import image_token_id, vlm_inputs

    sset = UnderstandingSet(ds, seed)
    idx = np.random.default_rng(seed).choice(len(ds), size=min(n, len(ds)), replace=False)
    correct = []
    for lo in range(0, len(idx), 32):
        b = understanding_collate([sset[int(i)] for i in idx[lo: lo + 32]], prompter, spec)
        kw = vlm_inputs(vlm, b["input_ids"], b["attention_mask"], b["pixel_values"], b["image_grid_thw"])
        kw.setdefault("mm_token_type_ids", (b["input_ids"] == image_token_id(vlm)).long())
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
    policy = load_policy_model(out_dir / POLICY_DIR)
    test = samples(model_cfg, data, "test", stride=1)
    result: dict[str, Any] = {"arm": model_cfg.arm, "openloop": openloop(policy, test, limit=data.eval_samples)}
    if policy["prompter"] is not None:
        from core.vlm import load_vlm

        qa_test = samples(model_cfg, data, "test", qa=True, stride=1)
        result["qa"] = qa_accuracy(policy["mot"].vlm, policy["prompter"], policy["spec"], qa_test)
        base_vlm, _ = load_vlm(model_cfg.base_path)
        result["qa_base"] = qa_accuracy(base_vlm.eval(), policy["prompter"], policy["spec"], qa_test)
    if data.eval_episodes > 0:
        closed = {}
        for refine in ((False, True) if policy["refiner"] is not None else (False,)):
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
             f"; QA {result['qa']['acc']:.3f} (base {result['qa_base']['acc']:.3f})" if "qa" in result else "")
    return result
