"""FeRA adapters as a library: ``apply_fera(model, config)`` on any diffusers UNet / DiT (or any module whose
forward receives the latent), by module-name pattern, peft-style.

What is injected:

- every ``nn.Linear`` whose qualified name matches ``config.target_modules`` (a name, a dotted suffix such as
  ``to_out.0``, or a regular expression when ``config.target_regex``) becomes a ``FeRALinear``: the frozen
  base linear plus ``E`` rank-``r`` LoRA experts, ``y = W x + scale * sum_e r_e B_e A_e x``; ``A_e`` is
  Kaiming-uniform, ``B_e`` zero, so the adapted model equals the base exactly at init;
- one ``FeRARouter`` at ``model.fera_router``: a forward pre-hook on ``model`` reads the latent (keyword
  ``sample`` / ``hidden_states`` / ``x``, else the first positional argument; an image latent ``(B, C, H, W)``,
  or a video latent in either layout, ``(N, T, C, H, W)`` (frames first, the workspace's video DiT) or
  ``(B, C, F, H, W)`` (channels first: diffusers' Wan and the other video transformers), routed on its frames'
  mean band energies; ``config.video_layout`` names the layout, ``"auto"`` reads it from the adapted model, see
  ``FeRARouter.layout_of``), computes its band energies
  (``perception.adapters.frequency``) and the routing weights ``softmax(MLP(e) / T)`` once per forward; every
  adapted layer of that forward reads the same ``(N, E)`` weights. ``routing="uniform"`` (the "no router"
  ablation) uses ``1 / E`` for every expert and builds no MLP. ``routing="xlora"`` routes the same experts as
  X-LoRA (Buehler & Buehler 2024; peft's ``xlora``) does: a scaling pass of the base (experts off, no gradient),
  a linear classifier on its last hidden state (the input of ``config.xlora_hidden``: ``norm_out`` of a
  diffusers DiT, ``conv_norm_out`` of a UNet) giving per-token ``softmax(logits / T)`` over the experts, shared
  by every layer (X-LoRA's default, not layer-wise), then the adapted pass. A layer whose token count differs
  from the hidden state's (a UNet level of another resolution, cross-attention keys) gets the tokens' mean.
  peft's own ``XLoraModel`` cannot wrap a denoiser: its scaling pass asks the model for ``output_hidden_states``
  and reads ``input_ids`` / ``inputs_embeds``, a language model's interface.

The experts of one layer are evaluated as one rank-``E*r`` product with the routing weights between the two
factors (``B diag(r (x) 1_r) A x``), so a FeRA layer costs what a LoRA of rank ``E*r`` costs.

Save / load: ``save_fera(model, DIR)`` writes ``fera_config.json`` + ``adapter_model.safetensors`` (adapter
and router tensors only, atomically); ``load_fera(model, DIR)`` injects (if needed) and loads them strictly.
``disable_fera(model)`` is a context manager for the base pass (FECL's); ``merge_fera(model, routing)`` folds
the experts into the base weights for a fixed routing vector (routing is then frozen; ``unmerge_fera`` undoes).

peft has no routed-expert layer, so a FeRA adapter with input-dependent routing is not a peft adapter. Under a
frozen routing vector ``r`` it is exactly one: a rank-``E*r`` LoRA per layer with ``A' = A`` and
``B' = scale * B diag(r (x) 1_r)``; ``fera_to_peft(model, DIR, routing)`` writes that folder
(``adapter_config.json`` + ``adapter_model.safetensors``) for ``peft.PeftModel.from_pretrained(<the un-adapted
model>, DIR)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.errors import ConfigError, DataError
from perception.adapters.frequency import band_energies

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "FeRAConfig",
    "FeRALinear",
    "FeRARouter",
    "apply_fera",
    "disable_fera",
    "fera_layers",
    "fera_parameters",
    "fera_state_dict",
    "fera_to_peft",
    "fixed_routing",
    "load_fera",
    "merge_fera",
    "router_of",
    "save_fera",
    "unmerge_fera",
]

ROUTINGS = ("soft", "uniform", "xlora")
#: the modules whose input is a model's last hidden state (``routing="xlora"``, ``xlora_hidden="auto"``)
HIDDEN_MODULES = ("norm_out", "conv_norm_out")
CONFIG_FILE = "fera_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ROUTER_NAME = "fera_router"
#: 5-D latent layouts the router reads: frames first ``(N, T, C, H, W)``, channels first ``(B, C, F, H, W)``.
VIDEO_LAYOUTS = ("auto", "ntchw", "bcfhw")
#: diffusers video models whose latents are channels first ``(B, C, F, H, W)`` (class-name prefixes), for "auto"
#: when the channel count cannot tell the two axes apart.
CHANNELS_FIRST_MODELS = ("Wan", "SkyReels", "HunyuanVideo", "LTX", "Mochi", "Allegro", "Cosmos", "ChronoEdit")


@dataclass
class FeRAConfig:
    """Everything that defines a FeRA adapter (saved with it)."""

    target_modules: list[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    target_regex: bool = False
    num_experts: int = 3
    rank: int = 4
    alpha: float | None = None  # scale = alpha / rank; None -> 1
    num_bands: int = 3
    kappa: float | None = None  # None -> min(H, W) / kappa_divisor of the latent
    kappa_divisor: float = 128.0  # the paper's (SD-size latents); see frequency.py
    finest_band: str = "keep"  # keep | drop (the reference code's); see frequency.py
    router_hidden: int = 64
    temperature: float = 0.7
    routing: str = "soft"  # soft | uniform (no router: every expert weighted 1 / E) | xlora (see the module doc)
    xlora_hidden: str = "auto"  # xlora: the module whose input is the last hidden state (auto: norm_out /
    # conv_norm_out)
    fecl_weight: float = 0.1  # read by the training loop, not by the layers
    latent_keys: list[str] = field(default_factory=lambda: ["sample", "hidden_states", "x"])
    video_layout: str = "auto"  # auto | ntchw (N, T, C, H, W) | bcfhw (B, C, F, H, W): how a 5-D latent is read

    def __post_init__(self) -> None:
        if not self.target_modules:
            raise ConfigError("FeRA: target_modules is empty")
        for name, v in (("num_experts", self.num_experts), ("rank", self.rank), ("router_hidden",
                                                                                   self.router_hidden)):
            if int(v) < 1:
                raise ConfigError(f"FeRA: {name} must be >= 1, got {v}")
        if self.num_bands < 2:
            raise ConfigError(f"FeRA: num_bands must be >= 2, got {self.num_bands}")
        if self.temperature <= 0:
            raise ConfigError(f"FeRA: temperature must be > 0, got {self.temperature}")
        if self.routing not in ROUTINGS:
            raise ConfigError(f"FeRA: routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if self.finest_band not in ("keep", "drop"):
            raise ConfigError(f"FeRA: finest_band must be keep or drop, got {self.finest_band!r}")
        if self.video_layout not in VIDEO_LAYOUTS:
            raise ConfigError(f"FeRA: video_layout must be one of {', '.join(VIDEO_LAYOUTS)}, got "
                              f"{self.video_layout!r}")
        if (self.kappa is not None and self.kappa <= 0) or self.kappa_divisor <= 0:
            raise ConfigError(f"FeRA: kappa and kappa_divisor must be > 0, got {self.kappa}, {self.kappa_divisor}")

    @property
    def scale(self) -> float:
        return (self.alpha if self.alpha is not None else self.rank) / self.rank

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeRAConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"FeRA config: unknown keys {unknown}")
        return cls(**data)


class FeRARouter(nn.Module):
    """Band energies of the latent -> routing weights over the experts, once per forward of the model."""

    def __init__(self, config: FeRAConfig):
        super().__init__()
        self.config = config
        e = config.num_experts
        self.mlp = (nn.Sequential(nn.Linear(config.num_bands, config.router_hidden), nn.GELU(),
                                  nn.Linear(config.router_hidden, e))
                    if config.routing == "soft" else None)
        self.classifier: nn.Linear | None = None  # routing="xlora": set by apply_fera (it knows the width)
        object.__setattr__(self, "_hidden_module", None)
        # (N, E) of the latest adapted forward. Kept after it returns: gradient-checkpointed blocks re-run their
        # forward during backward and must route as they did (a disabled base pass in between leaves it alone)
        self.weights: torch.Tensor | None = None
        self.fixed: torch.Tensor | None = None  # (E,) when routing is frozen
        self.enabled = True
        self.calls = 0  # how many times routing weights were computed (tests count one per forward)
        self._expanded: tuple[torch.Tensor, torch.dtype, torch.Tensor] | None = None  # see ``expanded``
        # what "auto" reads a 5-D latent's layout from (apply_fera sets them from the adapted model)
        self.in_channels: int | None = None
        self.default_layout = "ntchw"

    def layout_of(self, shape: Sequence[int]) -> str:
        """The layout of a 5-D latent of ``shape``: ``"ntchw"`` or ``"bcfhw"``.

        ``config.video_layout`` when it names one. ``"auto"``: the axis whose size is the adapted model's input
        channel count (``config.in_channels`` of a diffusers model, or its ``in_channels``) is the channel axis;
        when both axes 1 and 2 have that size (or the model states none), the model's kind decides: channels first
        for diffusers' video transformers (``CHANNELS_FIRST_MODELS``: Wan, HunyuanVideo, LTX, ...), frames first
        otherwise (the workspace's video DiT).
        """
        if self.config.video_layout != "auto":
            return self.config.video_layout
        c = self.in_channels
        if c is not None and (shape[1] == c) != (shape[2] == c):
            return "bcfhw" if shape[1] == c else "ntchw"
        return self.default_layout

    def frames(self, latent: torch.Tensor) -> torch.Tensor:
        """The latent as ``(N * T, C, H, W)`` frames (an image latent as it is)."""
        if latent.dim() == 4:
            return latent
        if latent.dim() != 5:
            raise ValueError(f"FeRA router: expected a (B, C, H, W), (N, T, C, H, W) or (B, C, F, H, W) latent, "
                             f"got {tuple(latent.shape)}")
        if self.layout_of(latent.shape) == "bcfhw":
            latent = latent.transpose(1, 2)  # (B, C, F, H, W) -> (B, F, C, H, W)
        return latent.flatten(0, 1)

    def route(self, latent: torch.Tensor) -> torch.Tensor:
        """``(N, E)`` routing weights for a latent ``(N, C, H, W)``, or a video latent ``(N, T, C, H, W)`` /
        ``(B, C, F, H, W)`` (``layout_of``): the band energies of its frames are averaged, one routing per video."""
        self.calls += 1
        n, e = latent.shape[0], self.config.num_experts
        if self.fixed is not None:
            return self.fixed.to(latent.device, latent.dtype).expand(n, e)
        if self.mlp is None:
            return latent.new_full((n, e), 1.0 / e)
        frames = self.frames(latent.detach())  # video: per frame
        energies = band_energies(frames, self.config.num_bands, self.config.kappa, self.config.finest_band,
                                 kappa_divisor=self.config.kappa_divisor)
        energies = energies.view(n, -1, energies.shape[-1]).mean(1)  # a video's frames share one routing
        logits = self.mlp(energies.to(self.mlp[0].weight.dtype))
        return torch.softmax(logits / self.config.temperature, dim=-1).to(latent.dtype)

    def expanded(self, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``weights`` (N, E) as ``(N, E * rank)`` in ``dtype`` (each expert's weight repeated over its ranks),
        built once per routing and shared by every adapted layer of the forward (one node in the graph, not
        one per layer)."""
        cached = self._expanded
        if cached is not None and cached[0] is weights and cached[1] == dtype:
            return cached[2]
        rr = weights.to(dtype).repeat_interleave(self.config.rank, dim=-1)
        self._expanded = (weights, dtype, rr)
        return rr

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not self.enabled:
            return
        latent = next((kwargs[k] for k in self.config.latent_keys if isinstance(kwargs.get(k), torch.Tensor)),
                      None)
        if latent is None:
            latent = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if latent is None or latent.dim() not in (4, 5):
            raise ValueError(f"FeRA router: no (N, C, H, W) or 5-D video latent among the keywords "
                             f"{self.config.latent_keys} or the first positional argument of the adapted model")
        if self.classifier is not None and self.fixed is None:
            self.weights = self.scaling_pass(module, args, kwargs)
            return
        self.weights = self.route(latent)

    def scaling_pass(self, model: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
        """X-LoRA's routing: the base's last hidden state (experts off, no gradient) -> per-token softmax over
        the experts, ``(N, T, E)`` (a 4-D hidden state ``(N, C, H, W)`` is read as ``H * W`` tokens)."""
        self.calls += 1
        captured: list[torch.Tensor] = []
        hook = self._hidden_module.register_forward_pre_hook(lambda m, a: captured.append(a[0]))
        self.enabled = False
        try:
            with torch.no_grad():
                model(*args, **kwargs)
        finally:
            self.enabled = True
            hook.remove()
        h = captured[-1]
        if h.dim() == 4:
            h = h.flatten(2).transpose(1, 2)  # (N, C, H, W) -> (N, H*W, C)
        logits = self.classifier(h.to(self.classifier.weight.dtype))
        return torch.softmax(logits / self.config.temperature, dim=-1)


class FeRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus ``E`` routed rank-``r`` LoRA experts (state keys: ``base_layer.*``,
    ``lora_A`` (E*r, in), ``lora_B`` (out, E*r))."""

    def __init__(self, base: nn.Linear, config: FeRAConfig, router: FeRARouter):
        super().__init__()
        self.base_layer = base
        base.requires_grad_(False)
        e, r = config.num_experts, config.rank
        self.num_experts, self.rank, self.scale = e, r, config.scale
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(e * r, base.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, e * r, device=w.device, dtype=w.dtype))
        for i in range(e):  # each expert's A initialised as its own LoRA's (Kaiming-uniform, a=sqrt(5))
            nn.init.kaiming_uniform_(self.lora_A.data[i * r:(i + 1) * r], a=math.sqrt(5))
        object.__setattr__(self, "_router", router)  # shared, not a submodule of every layer
        self.merged = False

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def delta_weight(self, routing: torch.Tensor) -> torch.Tensor:
        """``scale * sum_e r_e B_e A_e`` for a routing vector ``(E,)``: the merged update, (out, in)."""
        rr = routing.to(self.lora_A.dtype).repeat_interleave(self.rank)
        return self.scale * (self.lora_B * rr) @ self.lora_A

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)
        router: FeRARouter = self._router
        if self.merged or not router.enabled:
            return y
        weights = router.weights
        if weights is None:
            if router.fixed is None:
                raise RuntimeError("FeRA layer called before any forward of the adapted model (no routing "
                                   "weights); call the model itself, or fix the routing with fixed_routing()")
            weights = router.fixed.to(x.device, x.dtype).expand(x.shape[0], -1)
        if x.shape[0] != weights.shape[0]:
            raise ValueError(f"FeRA layer: input batch {x.shape[0]} differs from the routed batch "
                             f"{weights.shape[0]} (the layer must see the model's batch as its first dim)")
        rr = router.expanded(weights, x.dtype)  # (N, E*r), or (N, T, E*r) per token (xlora)
        if rr.dim() == 3 and not (x.dim() == 3 and x.shape[1] == rr.shape[1]):
            rr = rr.mean(1)  # another token count than the hidden state's: the tokens' mean routing
        if rr.dim() == 2:
            rr = rr.view(rr.shape[0], *([1] * (x.dim() - 2)), rr.shape[1])
        h = nn.functional.linear(x, self.lora_A) * rr
        return y + self.scale * nn.functional.linear(h, self.lora_B)


# -- injection -----------------------------------------------------------------------------------------------
def _matches(name: str, config: FeRAConfig) -> bool:
    if config.target_regex:
        return any(re.fullmatch(p, name) for p in config.target_modules)
    return any(name == p or name.endswith("." + p) for p in config.target_modules)


def router_of(model: nn.Module) -> FeRARouter:
    router = getattr(model, ROUTER_NAME, None)
    if not isinstance(router, FeRARouter):
        raise ConfigError(f"{type(model).__name__} has no FeRA adapter (apply_fera first)")
    return router


def fera_layers(model: nn.Module) -> Iterator[tuple[str, FeRALinear]]:
    for name, m in model.named_modules():
        if isinstance(m, FeRALinear):
            yield name, m


def _input_channels(model: nn.Module) -> int | None:
    """The latent channel count the model states (diffusers ``config.in_channels``, else ``in_channels``)."""
    value = getattr(getattr(model, "config", None), "in_channels", None)
    if value is None and not hasattr(type(model), "config_name"):  # not a diffusers ConfigMixin (it warns)
        value = getattr(model, "in_channels", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _hidden_module(model: nn.Module, name: str) -> nn.Module:
    """The module whose input is ``model``'s last hidden state (``routing="xlora"``)."""
    names = HIDDEN_MODULES if name == "auto" else (name,)
    for n in names:
        try:
            m = model.get_submodule(n)
        except AttributeError:
            continue
        if m is not None:
            return m
    raise ConfigError(f"FeRA xlora routing: {type(model).__name__} has no module {' or '.join(names)} whose input "
                      "is the last hidden state; set xlora_hidden to one")


def _width(module: nn.Module, name: str) -> int:
    """The feature width of ``module``'s input (a norm's or a linear's)."""
    for attr in ("in_features", "num_channels", "normalized_shape"):
        v = getattr(module, attr, None)
        if v is not None:
            return int(v[-1] if isinstance(v, (tuple, list)) else v)
    raise ConfigError(f"FeRA xlora routing: cannot read the width of {name!r} ({type(module).__name__}); point "
                      "xlora_hidden at a norm or linear layer")


def _default_layout(model: nn.Module) -> str:
    """``"bcfhw"`` for diffusers' channels-first video transformers, else ``"ntchw"`` (see ``layout_of``)."""
    return "bcfhw" if type(model).__name__.startswith(CHANNELS_FIRST_MODELS) else "ntchw"


def apply_fera(model: nn.Module, config: FeRAConfig) -> nn.Module:
    """Inject FeRA into ``model`` in place (its own parameters frozen); returns ``model``.

    Raises ``ConfigError`` when the model already has a FeRA adapter or no ``nn.Linear`` matches.
    """
    if isinstance(getattr(model, ROUTER_NAME, None), FeRARouter):
        raise ConfigError(f"{type(model).__name__} already has a FeRA adapter")
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and _matches(n, config)]
    if not targets:
        raise ConfigError(f"FeRA: no nn.Linear in {type(model).__name__} matches {config.target_modules}")
    model.requires_grad_(False)
    router = FeRARouter(config)
    router.in_channels, router.default_layout = _input_channels(model), _default_layout(model)
    if config.routing == "xlora":
        hidden = _hidden_module(model, config.xlora_hidden)
        object.__setattr__(router, "_hidden_module", hidden)  # not a submodule of the router
        router.classifier = nn.Linear(_width(hidden, config.xlora_hidden), config.num_experts)
    p = next(model.parameters(), None)
    if p is not None:
        router.to(p.device)
    for name, lin in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, FeRALinear(lin, config, router))
    model.add_module(ROUTER_NAME, router)
    handle = model.register_forward_pre_hook(router._pre_hook, with_kwargs=True)
    object.__setattr__(router, "_handle", handle)
    object.__setattr__(model, "fera_config", config)
    return model


def fera_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable FeRA tensors: every layer's experts and the router MLP."""
    return [p for n, p in fera_state_items(model, params=True)]


def fera_state_items(model: nn.Module, params: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of the adapter's own tensors (experts and router), in ``model``'s naming."""
    items = model.named_parameters() if params else model.state_dict(keep_vars=True).items()
    for name, p in items:
        if name.rpartition(".")[2] in ("lora_A", "lora_B") or name.startswith(ROUTER_NAME + "."):
            yield name, p


def fera_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Adapter-only state: ``<layer>.lora_A`` / ``<layer>.lora_B`` and ``fera_router.mlp.*``."""
    router_of(model)
    return {n: p.detach().clone() for n, p in fera_state_items(model)}


def save_fera(model: nn.Module, directory: str | Path) -> Path:
    """Write ``fera_config.json`` + ``adapter_model.safetensors`` (adapter tensors only) into ``directory``."""
    from core.checkpoint import save_weights
    from core.io import write_text

    router = router_of(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if any(layer.merged for _, layer in fera_layers(model)):
        raise ConfigError("FeRA: unmerge the adapter before saving it (the base weights hold the update)")
    save_weights(fera_state_dict(model), directory / WEIGHTS_FILE, metadata={"format": "fera"})
    write_text(directory / CONFIG_FILE, json.dumps(router.config.to_dict(), indent=2) + "\n")
    return directory


def read_fera_config(directory: str | Path) -> FeRAConfig:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise DataError(path, "missing (not a FeRA adapter folder)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(path, f"corrupt JSON ({e})") from None
    return FeRAConfig.from_dict(data)


def load_fera(model: nn.Module, directory: str | Path) -> nn.Module:
    """Inject the saved adapter's config into ``model`` (unless it has one) and load its tensors strictly."""
    from core.checkpoint import load_weights

    config = read_fera_config(directory)
    if getattr(model, ROUTER_NAME, None) is None:
        apply_fera(model, config)
    weights_path = Path(directory) / WEIGHTS_FILE
    if not weights_path.is_file():
        raise DataError(weights_path, "missing (not a FeRA adapter folder)")
    sd = load_weights(weights_path)
    own = dict(fera_state_items(model))
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    if missing or unexpected:
        raise DataError(weights_path, f"does not fit this model: missing {missing[:3]}, unexpected "
                                      f"{unexpected[:3]}")
    with torch.no_grad():
        for k, t in sd.items():
            if own[k].shape != t.shape:
                raise DataError(weights_path, f"{k}: shape {tuple(t.shape)} != model's {tuple(own[k].shape)}")
            own[k].copy_(t)
    return model


@contextlib.contextmanager
def disable_fera(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base inside the block (no routing, no expert term)."""
    router = router_of(model)
    if any(layer.merged for _, layer in fera_layers(model)):
        raise ConfigError("FeRA: the adapter is merged into the base weights; unmerge_fera before disabling")
    before = router.enabled
    router.enabled = False
    try:
        yield
    finally:
        router.enabled = before


def fixed_routing(model: nn.Module, routing: torch.Tensor | Sequence[float] | None) -> None:
    """Freeze the routing to one ``(E,)`` vector for every input (``None``: back to latent-driven routing)."""
    router = router_of(model)
    if routing is None:
        router.fixed = None
        return
    r = torch.as_tensor(routing, dtype=torch.float32)
    if r.shape != (router.config.num_experts,):
        raise ValueError(f"routing must have shape ({router.config.num_experts},), got {tuple(r.shape)}")
    router.fixed = r


def merge_fera(model: nn.Module, routing: torch.Tensor | Sequence[float] | None = None) -> nn.Module:
    """Fold the experts into the base weights under a frozen routing vector (given, or already fixed)."""
    router = router_of(model)
    if routing is not None:
        fixed_routing(model, routing)
    if router.fixed is None:
        if router.config.routing == "uniform":
            fixed_routing(model, [1.0 / router.config.num_experts] * router.config.num_experts)
        else:
            raise ConfigError("FeRA: merging needs a frozen routing vector (routing is input-dependent)")
    with torch.no_grad():
        for _, layer in fera_layers(model):
            if not layer.merged:
                layer.base_layer.weight += layer.delta_weight(router.fixed.to(layer.lora_A.device))
                layer.merged = True
    return model


def unmerge_fera(model: nn.Module) -> nn.Module:
    router = router_of(model)
    with torch.no_grad():
        for _, layer in fera_layers(model):
            if layer.merged:
                layer.base_layer.weight -= layer.delta_weight(router.fixed.to(layer.lora_A.device))
                layer.merged = False
    return model


def fera_to_peft(model: nn.Module, directory: str | Path, routing: torch.Tensor | Sequence[float] | None = None,
                 base_model: str | None = None, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write the FeRA adapter of ``model`` under a frozen routing vector as a peft LoRA folder.

    Each adapted linear ``<layer>`` (a ``FeRALinear``) becomes peft's ``lora_A`` ``(E*r, in)`` = the stacked
    experts' ``A`` and ``lora_B`` ``(out, E*r)`` = ``scale * B * (r (x) 1_r)``, with ``r = lora_alpha = E*r`` (peft's
    scaling 1), so ``PeftModel.from_pretrained(<the un-adapted model>, directory)`` computes
    ``W x + scale * sum_e r_e B_e A_e x``: ``model`` with ``fixed_routing(model, routing)``. Keys are peft's
    (``base_model.model.<layer>.lora_A.weight``); ``target_modules`` lists the adapted layers by full name.

    Args:
        model: A model with ``apply_fera`` (not merged).
        directory: The folder to write (created; the two files are written atomically).
        routing: ``(E,)`` weights; default the routing already fixed on ``model``, or ``1 / E`` each for a
            ``routing="uniform"`` adapter. An input-dependent (soft) router without a vector is a ``ConfigError``.
        base_model: Recorded as ``base_model_name_or_path`` (documentation for peft's loaders).
        state_dict: The experts' values to write (``<layer>.lora_A`` / ``.lora_B`` in ``model``'s naming, e.g. an
            EMA copy's) instead of the live ones.
    """
    from peft import LoraConfig

    from core.checkpoint import save_weights
    from core.io import write_text

    router = router_of(model)
    config = router.config
    e, r = config.num_experts, config.rank
    if routing is None:
        routing = router.fixed
    if routing is None and config.routing == "uniform":
        routing = [1.0 / e] * e
    if routing is None:
        raise ConfigError("FeRA -> peft: the router is input-dependent; give a frozen routing vector (E,) "
                          "(peft has no routed-expert layer)")
    rvec = torch.as_tensor(routing, dtype=torch.float32)
    if rvec.shape != (e,):
        raise ValueError(f"routing must have shape ({e},), got {tuple(rvec.shape)}")
    layers = list(fera_layers(model))
    if any(layer.merged for _, layer in layers):
        raise ConfigError("FeRA: unmerge the adapter before exporting it (the base weights hold the update)")
    state = {}
    for name, layer in layers:
        a = (state_dict or {}).get(f"{name}.lora_A", layer.lora_A).detach()
        b = (state_dict or {}).get(f"{name}.lora_B", layer.lora_B).detach()
        rr = rvec.to(b.device, b.dtype).repeat_interleave(r)
        state[f"base_model.model.{name}.lora_A.weight"] = a.clone().contiguous()
        state[f"base_model.model.{name}.lora_B.weight"] = (layer.scale * b * rr).contiguous()
    peft_config = LoraConfig(r=e * r, lora_alpha=e * r, target_modules=[n for n, _ in layers], lora_dropout=0.0,
                             bias="none", base_model_name_or_path=base_model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_weights(state, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    fields = peft_config.to_dict()
    write_text(directory / "adapter_config.json", json.dumps(fields, indent=2, sort_keys=True, default=list) + "\n")
    return directory
