"""The model of ``embodied train fera``: one adapter arm on a frozen base denoiser, as a ``PreTrainedModel``.

``AdaptedDenoiser(AdaptedDenoiserConfig(base_path=BASE, adapter=AdapterConfig(...)))`` loads the base denoiser
from ``BASE`` (``backbones.load_denoiser``: read-only, frozen) and injects the arm on its diffusers backbone:
FeRA's routed experts (``perception.adapters.fera.apply_fera``; its ablations are FeRA configs) or peft's LoRA /
DoRA (``core.layers.lora.inject_lora``). Its folder (``save_pretrained``) stores only what the arm trains and
references the base (``base_fields = ("base_path",)``)::

    model.safetensors   the adapter tensors, in the model's naming: FeRA's experts
                        (``denoiser.backbone.<layer>.lora_A`` / ``.lora_B``) and router
                        (``denoiser.backbone.fera_router.mlp.*``), or peft's
                        (``<layer>.lora_A.default.weight``, ``.lora_B.default.weight``, DoRA's
                        ``.lora_magnitude_vector.default.weight``)
    config.json         {"method": "fera", "model": {"base_path": <the base folder>, "adapter": {the arm}},
                         "base_model": {the base's architecture and pretraining settings}, ... the run config}
    README.md           model card
    base/               the base denoiser folder, in a self-contained export (``copy_base=True``)

``AdaptedDenoiser.from_pretrained(DIR)`` / ``core.pretrained.load_pretrained(DIR)`` rebuild it around the base
and require exactly those tensors. The library's own adapter folders (``save_fera``: ``fera_config.json`` +
``adapter_model.safetensors``; ``save_lora``: peft's layout) stay what they are, for adapting any model; this
folder is the method's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError, ConfigError
from core.pretrained import PreTrainedModel
from perception.adapters.configuration_fera import AdaptedDenoiserConfig, AdapterConfig

__all__ = ["ADAPTER_TENSORS", "AdaptedDenoiser", "example", "is_adapter_key"]

#: State-dict name segments of the tensors an arm trains (FeRA's experts and peft's LoRA / DoRA layers).
ADAPTER_TENSORS = ("lora_A", "lora_B", "lora_magnitude_vector")
_ROUTER_PREFIX = "denoiser.backbone.fera_router."


def is_adapter_key(key: str) -> bool:
    """Whether a state-dict key of an ``AdaptedDenoiser`` is an adapter tensor (and not the base's)."""
    return key.startswith(_ROUTER_PREFIX) or any(part in ADAPTER_TENSORS for part in key.split("."))


class AdaptedDenoiser(PreTrainedModel):
    """A frozen base denoiser with one adapter arm on its backbone; ``training_step`` adds FECL for FeRA.

    Args:
        config: The base folder and the arm.
        denoiser: The base as a module already in memory (training: the base just pretrained or loaded); default:
            loaded from ``config.base_path``. Frozen in place.
    """

    config_class = AdaptedDenoiserConfig
    method = "fera"
    base_fields = ("base_path",)

    def __init__(self, config: AdaptedDenoiserConfig, denoiser: nn.Module | None = None):
        super().__init__()
        from core.layers.lora import inject_lora
        from perception.adapters.fera import apply_fera

        self.config = config
        adapter = config.adapter
        if denoiser is None:
            from perception.adapters.backbones import load_denoiser

            if not config.base_path:
                raise ConfigError("model.base_path is empty: an adapted denoiser needs its base denoiser folder")
            denoiser = load_denoiser(config.base_path)
        self.denoiser = denoiser.requires_grad_(False)
        self.fera = adapter.fera_config() if adapter.kind == "fera" else None
        if self.fera is not None:
            apply_fera(denoiser.backbone, self.fera)
        else:
            inject_lora(denoiser.backbone, adapter.target_modules, rank=adapter.rank, alpha=adapter.alpha,
                        use_dora=adapter.kind == "dora")

    @classmethod
    def around(cls, denoiser: nn.Module, adapter: AdapterConfig, base_path: str | Path = "") -> AdaptedDenoiser:
        """``adapter`` injected on the in-memory ``denoiser`` (``base_path``: its folder, needed to save)."""
        return cls(AdaptedDenoiserConfig(base_path=str(base_path), adapter=adapter), denoiser)

    @property
    def adapter(self) -> AdapterConfig:
        """The arm (``config.adapter``)."""
        return self.config.adapter

    @classmethod
    def config_from_dict(cls, data: dict[str, Any]) -> AdaptedDenoiserConfig:
        """The typed config; a base denoiser's folder (its ``model`` is an architecture) fails in one line."""
        if isinstance(data, dict) and "adapter" not in data and "kind" in data:
            raise CheckpointError("a FeRA base denoiser's folder, not an adapted model: load it with "
                                  "perception.adapters.backbones.load_denoiser")
        return super().config_from_dict(data)

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter tensors only (the experts and the router, or peft's LoRA / DoRA tensors)."""
        return {k: v for k, v in self.state_dict().items() if is_adapter_key(k)}

    def save_pretrained(self, directory: str | Path, *args: Any, **kwargs: Any) -> Path:
        """``PreTrainedModel.save_pretrained``; the folder references ``config.base_path``, which must be set."""
        if not self.config.base_path:
            raise CheckpointError(f"{directory}: model.base_path is empty, so the adapter folder could not name "
                                  "its base (build the model with the base's folder)")
        return super().save_pretrained(directory, *args, **kwargs)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Predicted velocity ``eps - x0`` of the adapted base (``FlowDenoiser.forward``)."""
        return self.denoiser(x_t, t)

    def trainable_parameters(self) -> int:
        """Number of trainable (adapter) parameters."""
        return self.num_parameters(trainable_only=True)

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Flow-matching MSE on ``batch["image"]`` (``(B, C, H, W)`` in ``[-1, 1]``), plus FECL for FeRA."""
        from perception.adapters.fera import disable_fera
        from perception.adapters.frequency import fecl_loss

        x_t, t, target = self.denoiser.noisy_batch(batch["image"])
        pred = self.denoiser(x_t, t)
        mse = F.mse_loss(pred, target)
        out = {"mse": mse}
        loss = mse
        if self.fera is not None and self.fera.fecl_weight > 0:
            with torch.no_grad(), disable_fera(self.denoiser.backbone):
                base = self.denoiser(x_t, t)  # FECL's extra no-grad pass (benchmarks/fera.py measures it)
            fecl = fecl_loss(pred, base, target, self.fera.num_bands, self.fera.kappa, self.fera.finest_band,
                             weight=self.fera.fecl_weight, kappa_divisor=self.fera.kappa_divisor)
            out["fecl"] = fecl
            loss = loss + fecl
        out["loss"] = loss
        return out


# -- the contract test's tiny model --------------------------------------------------------------------------
def example(workdir: Path):
    """A tiny FeRA-adapted UNet denoiser (8 px) on a tiny base written once into ``workdir``, and a fixed batch.

    The base is a seeded ``FlowDenoiser`` saved with its own ``save_pretrained``; ``build`` wraps it with a
    2-expert FeRA adapter whose up-projections are drawn from the global RNG (so the adapter changes the output).
    """
    from core.testing import ModelExample
    from perception.adapters.backbones import BASE_RUN_CONFIG, BackboneConfig, FlowDenoiser

    base = Path(workdir) / "fera_base"
    if not (base / "config.json").is_file():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            denoiser = FlowDenoiser(BackboneConfig(kind="unet", image_size=8, block_out_channels=[8, 16],
                                                   attention_head_dim=8, cross_attention_dim=8, context_tokens=2))
        denoiser.save_pretrained(base, run_config=dict(BASE_RUN_CONFIG), card={"data": "none (random init)"})
    adapter = AdapterConfig(name="fera", kind="fera", rank=2, num_experts=2, alpha=4.0, kappa_divisor=8.0,
                            router_hidden=8)

    def build() -> AdaptedDenoiser:
        model = AdaptedDenoiser(AdaptedDenoiserConfig(base_path=str(base), adapter=adapter))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("lora_B"):
                    p.normal_(0.0, 0.2)
        return model

    def inputs() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"x_t": torch.randn(2, 3, 8, 8, generator=g), "t": torch.tensor([0.25, 0.75])}

    def train_inputs() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return {"image": torch.rand(2, 3, 8, 8, generator=g) * 2 - 1}

    return ModelExample(build=build, inputs=inputs, train_inputs=train_inputs)
