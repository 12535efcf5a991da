"""The model of ``embodied train fera``: one adapter arm on a frozen base denoiser, as a ``PreTrainedModel``.

``AdaptedDenoiser(AdaptedDenoiserConfig(base_path=BASE, adapter=AdapterConfig(...)))`` loads the base denoiser
from ``BASE`` (read-only, frozen: a user's diffusers pipeline / model folder with its VAE (``vae_path``), run in its
latent space as ``latent.LatentDenoiser`` with the settings of ``latent``; else a pixel base,
``backbones.load_denoiser``) and injects the arm on its diffusers backbone:
FeRA's routed experts (``perception.adapters.fera.apply_fera``; its ablations and the X-LoRA-routed arm are FeRA
configs) or peft's LoRA / DoRA (``core.layers.lora.inject_lora``) / FourierFT / WaveFT (``inject_peft``). Its folder (``save_pretrained``) stores only what the arm trains and
references the base (``base_fields = ("base_path",)``)::

    model.safetensors   the adapter tensors, in the model's naming: FeRA's experts
                        (``denoiser.backbone.<layer>.lora_A`` / ``.lora_B``) and router
                        (``denoiser.backbone.fera_router.mlp.*``), or peft's
                        (``<layer>.lora_A.default.weight``, ``.lora_B.default.weight``, DoRA's
                        ``.lora_magnitude_vector.default.weight``, FourierFT's / WaveFT's
                        ``.fourierft_spectrum.default`` / ``.waveft_spectrum.default``)
    config.json         {"method": "fera", "model": {"base_path": <the base folder>, "adapter": {the arm}},
                         "base_model": {the base's architecture and pretraining settings}, ... the run config}
    README.md           model card (its ``upstream`` field says what peft opens, see ``save_upstream``)
    base/               the base denoiser folder, in a self-contained export (``copy_base=True``)
    adapter/            the arm as a peft folder (``adapter_config.json`` + ``adapter_model.safetensors``)
                        for ``peft.PeftModel.from_pretrained(<the base's diffusers backbone>, DIR/adapter)``: the
                        ``lora`` / ``dora`` / ``fourierft`` / ``waveft`` arms, and FeRA with ``routing="uniform"`` (a frozen routing vector is
                        a rank-``E*r`` LoRA, ``fera.fera_to_peft``). Soft-routed FeRA has no peft equivalent
                        (its routing, and the X-LoRA-routed arm's, depends on the input), so its export has no ``adapter/``.

``AdaptedDenoiser.from_pretrained(DIR)`` / ``core.pretrained.load_pretrained(DIR)`` rebuild it around the base
and require exactly those tensors. The library's own adapter folders (``save_fera``: ``fera_config.json`` +
``adapter_model.safetensors``; ``save_lora``: peft's layout) stay what they are, for adapting any model; this
folder is the method's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError, ConfigError
from core.pretrained import PreTrainedModel
from perception.adapters.configuration_fera import (
    AdaptedDenoiserConfig,
    AdapterConfig,
    FeRAModelConfig,
    LatentSettings,
)

__all__ = ["ADAPTER_TENSORS", "AdaptedDenoiser", "example", "is_adapter_key", "load_base_denoiser", "tiny_config"]

#: State-dict name segments of the tensors an arm trains (FeRA's experts, peft's LoRA / DoRA layers and the
#: FourierFT / WaveFT spectra).
ADAPTER_TENSORS = ("lora_A", "lora_B", "lora_magnitude_vector", "fourierft_spectrum", "waveft_spectrum")
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
    base_fields = ("base_path", "vae_path")

    def __init__(self, config: AdaptedDenoiserConfig, denoiser: nn.Module | None = None):
        super().__init__()
        from core.layers.lora import inject_lora
        from perception.adapters.fera import apply_fera

        self.config = config
        adapter = config.adapter
        if denoiser is None:
            if not config.base_path:
                raise ConfigError("model.base_path is empty: an adapted denoiser needs its base denoiser folder")
            denoiser = load_base_denoiser(config.base_path, config.vae_path, config.latent)
        self.denoiser = denoiser.requires_grad_(False)
        self.fera = adapter.fera_config() if adapter.kind == "fera" else None
        if self.fera is not None:
            apply_fera(denoiser.backbone, self.fera)
        elif adapter.kind in ("lora", "dora"):
            inject_lora(denoiser.backbone, adapter.target_modules, rank=adapter.rank, alpha=adapter.alpha,
                        use_dora=adapter.kind == "dora")
        else:  # peft's fourierft / waveft, on the same linears
            from core.layers.lora import inject_peft, matching_linears

            layers = matching_linears(denoiser.backbone, adapter.target_modules)
            inject_peft(denoiser.backbone, adapter.peft_config(
                {n: (m.in_features, m.out_features) for n, m in layers.items()}))

    @classmethod
    def around(cls, denoiser: nn.Module, adapter: AdapterConfig, base_path: str | Path = "", vae_path: str | Path = "",
               latent: LatentSettings | None = None) -> AdaptedDenoiser:
        """``adapter`` injected on the in-memory ``denoiser`` (``base_path`` / ``vae_path`` / ``latent``: how it was
        loaded, needed to save)."""
        return cls(AdaptedDenoiserConfig(base_path=str(base_path), adapter=adapter, vae_path=str(vae_path or ""),
                                         latent=latent or LatentSettings()), denoiser)

    @property
    def is_latent(self) -> bool:
        """Whether the base is a diffusers model in its VAE's latent space (``latent.LatentDenoiser``)."""
        from perception.adapters.latent import LatentDenoiser

        return isinstance(self.denoiser, LatentDenoiser)

    @contextlib.contextmanager
    def base_pass(self) -> Iterator[None]:
        """Run the unadapted base inside the block: FeRA disabled, or peft's LoRA / DoRA layers disabled."""
        from perception.adapters.fera import disable_fera

        if self.fera is not None:
            with disable_fera(self.denoiser.backbone):
                yield
            return
        from peft.tuners.tuners_utils import BaseTunerLayer

        layers = [m for m in self.denoiser.backbone.modules() if isinstance(m, BaseTunerLayer)]
        for m in layers:
            m.enable_adapters(False)
        try:
            yield
        finally:
            for m in layers:
                m.enable_adapters(True)

    def enable_gradient_checkpointing(self) -> None:
        """The diffusers backbone's own gradient checkpointing (its blocks recompute in backward; FeRA's routing
        weights of the forward are kept for the recompute). Same gradients as without (tested)."""
        backbone = self.denoiser.backbone
        if not getattr(backbone, "_supports_gradient_checkpointing", False):
            raise ConfigError(f"{type(backbone).__name__} does not support gradient checkpointing")
        backbone.enable_gradient_checkpointing()

    def disable_gradient_checkpointing(self) -> None:
        """Undo ``enable_gradient_checkpointing``."""
        if getattr(self.denoiser.backbone, "_supports_gradient_checkpointing", False):
            self.denoiser.backbone.disable_gradient_checkpointing()

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

    def save_upstream(self, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, str]:
        """Write ``adapter/``, the arm in peft's layout, when peft can express it (module docstring); the card's
        ``upstream`` field says how to open it, or why there is no such folder (soft-routed FeRA).

        ``state_dict`` (the export's weights, in this model's naming) is written when given.
        """
        from core.layers.lora import save_lora
        from perception.adapters.fera import fera_to_peft

        backbone = self.denoiser.backbone
        prefix = "denoiser.backbone."
        sub = None if state_dict is None else {k[len(prefix):]: v for k, v in state_dict.items()
                                               if k.startswith(prefix)}
        how = (f"peft.PeftModel.from_pretrained(<the base's {type(backbone).__name__}, un-adapted>, DIR/adapter) "
               "(a diffusers base: its unet/ or transformer/; the pixel base: load_denoiser(base).backbone)")
        if self.fera is None:
            save_lora(backbone, directory / "adapter", state_dict=sub)
            return {"adapter": how}
        if self.fera.routing == "uniform":
            fera_to_peft(backbone, directory / "adapter", state_dict=sub)
            return {"adapter": how + f"; FeRA's {self.fera.num_experts} experts at 1/E each as one rank-"
                                     f"{self.fera.num_experts * self.fera.rank} LoRA"}
        return {"model.safetensors": "FeRA's routed experts (<layer>.lora_A (E*r, in), <layer>.lora_B (out, E*r)) "
                                     "and router (fera_router.mlp.*, or X-LoRA routing's fera_router.classifier.*): "
                                     "no peft equivalent (input-dependent routing); "
                                     "under a frozen routing vector perception.adapters.fera.fera_to_peft writes "
                                     "a peft LoRA folder"}

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Predicted velocity ``eps - x0`` of the adapted base (``FlowDenoiser.forward``)."""
        return self.denoiser(x_t, t)

    def trainable_parameters(self) -> int:
        """Number of trainable (adapter) parameters."""
        return self.num_parameters(trainable_only=True)

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The base's objective, plus FECL for FeRA: flow-matching MSE on ``batch["image"]`` (``(B, C, H, W)`` in
        ``[-1, 1]``) for a pixel base; for a latent base the objective's MSE on ``batch["latent"]`` (VAE latents,
        ``latent.LatentDenoiser.encode``; ``batch["image"]`` is encoded when no latent is given)."""
        from perception.adapters.frequency import fecl_loss

        if self.is_latent:
            x0 = batch["latent"] if "latent" in batch else self.denoiser.encode(batch["image"])
        else:
            x0 = batch["image"]
        x_t, t, target = self.denoiser.noisy_batch(x0)
        pred = self.denoiser(x_t, t)
        mse = F.mse_loss(pred.float(), target.float())
        out = {"mse": mse}
        loss = mse
        if self.fera is not None and self.fera.fecl_weight > 0:
            with torch.no_grad(), self.base_pass():
                base = self.denoiser(x_t, t)  # FECL's extra no-grad pass (benchmarks/fera.py measures it)
            fecl = fecl_loss(pred, base, target, self.fera.num_bands, self.fera.kappa, self.fera.finest_band,
                             weight=self.fera.fecl_weight, kappa_divisor=self.fera.kappa_divisor)
            out["fecl"] = fecl
            loss = loss + fecl
        out["loss"] = loss
        return out


def load_base_denoiser(base_path: str | Path, vae_path: str | Path = "", latent: LatentSettings | None = None
                       ) -> nn.Module:
    """The frozen base of ``base_path``, read-only: a diffusers pipeline / model folder (with its VAE) as a
    ``latent.LatentDenoiser``, else a pixel base folder or run (``backbones.load_denoiser``)."""
    from perception.adapters.latent import LatentDenoiser, is_diffusers_base, resolve_base

    if is_diffusers_base(base_path):
        s = latent or LatentSettings()
        return LatentDenoiser(resolve_base(base_path, vae_path), objective=s.objective, flow_shift=s.flow_shift,
                              prompt=s.prompt, prompt_embeds=s.prompt_embeds, prompt_tokens=s.prompt_tokens,
                              class_label=s.class_label, dtype=s.base_dtype)
    from perception.adapters.backbones import load_denoiser

    return load_denoiser(base_path)


# -- tiny configs and the contract test's tiny model --------------------------------------------------------
def tiny_config(kind: str = "unet", **overrides: Any) -> FeRAModelConfig:
    """The tests' and smoke runs' pixel base (``model=fera_unet_tiny`` / ``model=fera_dit_tiny``): small images, a
    narrow UNet or a shallow DiT, a few pretraining steps (``overrides`` replace fields).

    Args:
        kind: ``unet`` or ``dit``; ``.backbone()`` of the result is the ``BackboneConfig`` of a ``FlowDenoiser``.
    """
    common: dict[str, Any] = dict(kind=kind, image_size=16, pretrain_steps=4, pretrain_batch=4, sample_steps=2,
                                  pretrain_dir=f"outputs/fera/base_{kind}_tiny")
    sizes: dict[str, dict[str, Any]] = {
        "unet": dict(block_out_channels=[16, 32], attention_levels=None, layers_per_block=1, attention_head_dim=8,
                     cross_attention_dim=16),
        "dit": dict(dit_layers=2, dit_heads=2, dit_head_dim=16, patch_size=2),
    }
    if kind not in sizes:
        raise ValueError(f"kind must be one of {sorted(sizes)}, got {kind!r}")
    return FeRAModelConfig(**{**common, **sizes[kind], **overrides})


def example(workdir: Path):
    """A tiny FeRA-adapted UNet denoiser (8 px) on a tiny base written once into ``workdir``, and a fixed batch.

    The base is a seeded ``FlowDenoiser`` saved with its own ``save_pretrained``; ``build`` wraps it with a
    2-expert FeRA adapter whose up-projections are drawn from the global RNG (so the adapter changes the output).
    """
    from core.testing import ModelExample
    from perception.adapters.backbones import BASE_RUN_CONFIG, FlowDenoiser

    base = Path(workdir) / "fera_base"
    if not (base / "config.json").is_file():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            denoiser = FlowDenoiser(tiny_config("unet", image_size=8, block_out_channels=[8, 16],
                                                cross_attention_dim=8, context_tokens=2).backbone())
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
