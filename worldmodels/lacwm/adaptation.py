"""Adapting a pretrained world model to a held-out embodiment from a few demonstrations.

Each stage is a small ``nn.Module`` wrapper with a ``training_step`` for ``core.trainer.Trainer``; it sets
``requires_grad`` so that only the parts the stage trains are optimised (the trainer skips frozen
parameters). Stages (spec):

LAC-WM
    1. ``lac_lora``: LoRA (peft, through ``core.layers``) on IDM + FDM, the LAC loss (reconstruction + motion)
       on the new embodiment.
    2. ``lac_projector``: the action projector P(a) -> z with the FDM frozen: reconstruction through
       FDM(x_t, P(a_t)) plus ``align_weight * ||P(a_t) - sg(IDM(x_t, x_t+1))||^2``.
    3. ``lac_joint``: projector + LoRA (IDM + FDM) with the stage-2 loss.
    At inference only P + FDM run (``WorldModel.forward`` / ``imagine``).
EAC-WM
    ``eac_adapt``: a new action encoder + LoRA on the FDM, reconstruction loss.
Scratch
    ``scratch``: a fresh EAC-style model (new encoder + FDM, all weights), reconstruction loss.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.layers import lora_parameters
from worldmodels.lacwm.configuration_lacwm import LACWMConfig
from worldmodels.lacwm.modeling_lacwm import EACWorldModel, LACWorldModel, WorldModel, _key, build_model

STAGES = ("lac_lora", "lac_projector", "lac_joint", "eac_adapt", "scratch")


def adapted_config(config: LACWMConfig, embodiment: str, action_dim: int, scratch: bool = False) -> LACWMConfig:
    """The config of the adapted model: a projector / encoder for ``embodiment`` and LoRA in place."""
    a = config.adapt
    if scratch:
        return dataclasses.replace(config, conditioning="explicit", action_dims={embodiment: action_dim},
                                   projectors={}, lora_rank=0)
    if config.conditioning == "latent":
        return dataclasses.replace(config, projectors={**config.projectors, embodiment: action_dim},
                                   lora_rank=a.lora_rank, lora_targets=list(a.lora_targets))
    return dataclasses.replace(config, action_dims={**config.action_dims, embodiment: action_dim},
                               lora_rank=a.lora_rank, lora_targets=list(a.lora_targets))


def adapt_model(pretrained: WorldModel, embodiment: str, action_dim: int) -> WorldModel:
    """A copy of ``pretrained`` extended for ``embodiment`` (new projector / encoder, LoRA), weights carried over."""
    cfg = adapted_config(pretrained.config, embodiment, action_dim)
    model = build_model(cfg)
    missing, unexpected = model.load_state_dict(_lora_keys(pretrained.state_dict(), model), strict=False)
    new = {k for k in missing if "lora_" in k or k.startswith(("projectors.", "encoders."))}
    if set(missing) - new or unexpected:
        raise RuntimeError(f"adapt_model: unexpected key mismatch {sorted(set(missing) - new)[:5]} "
                           f"{sorted(unexpected)[:5]}")
    return model


def _lora_keys(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Map plain-linear keys ``a.q.weight`` onto peft-wrapped ``a.q.base_layer.weight`` where the model wraps
    them."""
    target = model.state_dict()
    out = {}
    for k, v in state.items():
        if k in target:
            out[k] = v
            continue
        head, _, leaf = k.rpartition(".")
        alt = f"{head}.base_layer.{leaf}"
        out[alt if alt in target else k] = v
    return out


class AdaptationStage(nn.Module):
    """One adaptation stage around ``model`` for ``embodiment`` (see the module docstring)."""

    def __init__(self, model: WorldModel, stage: str, embodiment: str, align_weight: float = 1.0):
        super().__init__()
        if stage not in STAGES:
            raise ValueError(f"unknown adaptation stage {stage!r}; choose from {STAGES}")
        if stage.startswith("lac") and not isinstance(model, LACWorldModel):
            raise TypeError(f"stage {stage} needs a LAC-WM model")
        self.model, self.stage, self.embodiment, self.align_weight = model, stage, embodiment, align_weight
        for p in model.parameters():
            p.requires_grad_(False)
        for p in self.trainable_parameters():
            p.requires_grad_(True)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Exactly the parameters this stage trains."""
        m, key = self.model, _key(self.embodiment)
        if self.stage == "lac_lora":
            return lora_parameters(m.idm) + lora_parameters(m.fdm)
        if self.stage == "lac_projector":
            return list(m.projectors[key].parameters())
        if self.stage == "lac_joint":
            return list(m.projectors[key].parameters()) + lora_parameters(m.idm) + lora_parameters(m.fdm)
        if self.stage == "eac_adapt":
            return list(m.action_encoder(self.embodiment).parameters()) + lora_parameters(m.fdm)
        return list(m.parameters())  # scratch

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        m = self.model
        if self.stage == "lac_lora":
            return m.losses(batch)
        if self.stage.startswith("lac"):
            x = m.codec.to_float(batch["frames"])
            with torch.no_grad():
                target_z = m.encode_pairs(x)  # stop-gradient IDM latent (un-augmented)
            z = m.projectors[_key(self.embodiment)](batch["actions"].float())
            recon = F.mse_loss(m.predict(x[:, :-1], z), x[:, 1:])
            align = F.mse_loss(z, target_z)
            return {"loss": recon + self.align_weight * align, "recon": recon.detach(), "align": align.detach()}
        x = m.codec.to_float(batch["frames"])
        z = m.action_encoder(self.embodiment)(batch["actions"].float())
        recon = F.mse_loss(m.predict(x[:, :-1], z), x[:, 1:])
        return {"loss": recon, "recon": recon.detach()}


def stage_plan(model: WorldModel, scratch: bool = False) -> list[tuple[str, int]]:
    """(stage, steps) for this model under its ``adapt.stage_steps`` (EAC / scratch: one stage, same total)."""
    steps = list(model.config.adapt.stage_steps)
    if scratch:
        return [("scratch", sum(steps))]
    if isinstance(model, EACWorldModel):
        return [("eac_adapt", sum(steps))]
    return [(s, n) for s, n in zip(("lac_lora", "lac_projector", "lac_joint"), steps, strict=True) if n > 0]
