"""The pretrained-model contract: ``save_pretrained`` / ``from_pretrained`` for every model of the workspace.

In the spirit of diffusers' ``ModelMixin`` + ``ConfigMixin`` and LeRobot's ``PreTrainedPolicy``: a model's
constructor takes one typed dataclass config (``config_class``), so the config IS the architecture and a
folder with that config and the weights rebuilds the model exactly::

    class MyModel(PreTrainedModel):
        config_class = MyConfig
        method = "mymethod"
        def __init__(self, config: MyConfig): super().__init__(); self.config = config; ...

    model.save_pretrained("exported/", card={"data": "...", "command": "...", "metrics": {...}})
    model = MyModel.from_pretrained("exported/")                 # an exported folder
    model = MyModel.from_pretrained("outputs/run")                # or a training run / checkpoint directory
    model = load_pretrained("outputs/run")                        # any method: the class comes from config.json

An exported folder and a training checkpoint share one layout, so one loader reads both::

    model.safetensors   the weights (``ema.safetensors`` beside it in training checkpoints that keep an EMA)
    config.json         {"method": ..., "model": {the model config}, ... the rest of the run config}
    README.md           model card: YAML front matter (method, model_class, parameters, weights, training
                        domain, data, producing command, metrics) + free text

``from_pretrained`` reads only ``config.json`` and one weights file — never the optimizer / RNG training
state — and takes the EMA weights when the folder has them, unless ``use_ema=False``. Loading checks every
key and shape (``core.checkpoint.load_into``) and rejects config keys the class does not know.

A model wrapped around a pretrained base (LoRA on a VLM, adapters on a diffusers UNet, a policy post-trained
from another checkpoint) names the config fields that hold its base folders in ``base_fields`` and returns
from ``trained_state_dict`` only what it trained. Its folder then stores those tensors and *references* the
base by its absolute path (the base is opened read-only and never copied), unless ``save_pretrained(...,
copy_base=True)`` asks for a self-contained export: the base is copied into ``<folder>/base`` (``base_<field>``
for a second one) and referenced relatively. ``from_pretrained`` resolves a relative reference against the
folder first, builds the model around the base and requires exactly the trained tensors::

    class MyAdapter(PreTrainedModel):
        config_class = MyAdapterConfig          # has base_path: str
        base_fields = ("base_path",)
        def trained_state_dict(self): return {k: v for k, v in self.state_dict().items() if "lora_" in k}
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from core.checkpoint import (
    CONFIG_FILE,
    EMA_FILE,
    MODEL_FILE,
    load_into,
    load_weights,
    method_entry,
    read_config,
    resolve_checkpoint,
    save_weights,
)
from core.config import from_dict_strict
from core.errors import CheckpointError
from core.io import atomic_dir, to_jsonable, write_json, write_text

CARD_FILE = "README.md"


def dataclass_from_dict(cls: type, data: dict[str, Any], where: str = "model") -> Any:
    """Build dataclass ``cls`` from a config section, recursing into nested dataclass fields (strict).

    ``core.config.from_dict_strict`` raising ``CheckpointError``: an unknown key is a one-line error naming it (a
    config written by other code is not silently cut down to what this class knows).
    """
    return from_dict_strict(cls, data, where, error=CheckpointError)


def front_matter(meta: dict[str, Any]) -> str:
    """YAML front matter (``---`` fenced) for a model card."""
    from omegaconf import OmegaConf

    return "---\n" + OmegaConf.to_yaml(OmegaConf.create(to_jsonable(meta, nan_to_none=True))).rstrip() + "\n---\n"


def read_card(directory: str | Path) -> dict[str, Any]:
    """The YAML front matter of ``directory/README.md`` as a dict ({} when there is none)."""
    import yaml

    path = Path(directory) / CARD_FILE
    if not path.is_file():
        return {}
    text = path.read_text()
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---", 4)
    if end < 0:
        return {}
    try:
        meta = yaml.safe_load(text[4:end])
    except yaml.YAMLError as e:
        raise CheckpointError(f"{path}: unreadable model card front matter ({e})") from None
    return meta if isinstance(meta, dict) else {}


def card_body(directory: str | Path) -> str:
    """The free text of a model card (after the front matter)."""
    path = Path(directory) / CARD_FILE
    if not path.is_file():
        return ""
    text = path.read_text()
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end >= 0:
            return text[end + 4:].lstrip("\n")
    return text


def write_card_metrics(directory: str | Path, metrics: dict[str, Any]) -> None:
    """Put measured ``metrics`` into a model card's front matter (``metrics:``), atomically.

    The rest of the card, its body and the weights stay unchanged. The code that measures a shipped model writes its
    card with this, so ``embodied models`` shows what was measured and a re-export (which copies the card) keeps it.
    """
    directory = Path(directory)
    meta = read_card(directory)
    meta["metrics"] = dict(metrics)
    write_text(directory / CARD_FILE, front_matter(meta) + "\n" + card_body(directory))


class PreTrainedModel(nn.Module):
    """Base class of every model that is saved, shipped or loaded (see the module docstring).

    Subclasses set ``config_class`` (a dataclass) and ``method`` (the registered method name, recorded in
    ``config.json``) and keep their config as ``self.config``. The contract is checked when a subclass is
    defined: a concrete subclass without a dataclass ``config_class`` fails at import.
    """

    config_class: ClassVar[type | None] = None
    method: ClassVar[str | None] = None
    #: Config fields naming base folders the model wraps (see the module docstring); () for a standalone model.
    base_fields: ClassVar[tuple[str, ...]] = ()
    #: Abstract bases (e.g. a family's shared parent) set this in their own body to skip the check.
    abstract: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("abstract", False):
            return
        cls.abstract = False
        if cls.config_class is None or not dataclasses.is_dataclass(cls.config_class):
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: a PreTrainedModel needs "
                            "config_class = <a dataclass>")

    # -- hooks a subclass may override ------------------------------------------------------------
    @classmethod
    def config_from_dict(cls, data: dict[str, Any]) -> Any:
        """The typed config from ``config.json``'s ``model`` section (strict: unknown keys fail)."""
        return dataclass_from_dict(cls.config_class, data)

    @classmethod
    def build_for_loading(cls, config: Any) -> PreTrainedModel:
        """Construct the model whose weights are about to be loaded (default: ``cls(config)``).

        Override when the constructor would otherwise read external weights that the checkpoint already
        holds, or when the concrete class depends on the config (a model family).
        """
        return cls(config)

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors the model's folder stores: the whole ``state_dict`` unless the model wraps a base.

        A model with ``base_fields`` overrides this to return only what it trains on top of its base (every
        other tensor is rebuilt from the base folder when loading).
        """
        return self.state_dict()

    def base_folders(self) -> dict[str, Path]:
        """``{field: folder}`` of the base folders this model references (fields of ``base_fields`` that are set)."""
        out = {}
        for name in self.base_fields:
            value = getattr(self.config, name, None)
            if value not in (None, ""):
                out[name] = Path(value)
        return out

    def save_upstream(self, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, str]:
        """Write sub-folders that the upstream libraries open themselves; return ``{subfolder: how to open it}``.

        Called by ``save_pretrained`` inside the staged export folder (``directory``), after the workspace's own
        files. A model built on a diffusers / transformers / peft class writes that part with the library's own
        ``save_pretrained`` (e.g. ``unet/`` for ``UNet2DConditionModel.from_pretrained``, ``adapter/`` for
        ``peft.PeftModel.from_pretrained``); the card lists the returned entries under ``upstream``. ``state_dict``
        is the export's weights when they differ from the live module's (an EMA copy). Default: nothing.
        """
        return {}

    # -- save -------------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | Path, card: dict[str, Any] | None = None,
                        run_config: dict[str, Any] | None = None, body: str = "",
                        state_dict: dict[str, torch.Tensor] | None = None, copy_base: bool = False) -> Path:
        """Export the model: ``model.safetensors`` + ``config.json`` + ``README.md`` (model card), atomically.

        Args:
            directory: Target folder; replaced if it exists (the new one is complete before the swap). It may not
                be (or hold) one of the model's base folders.
            card: Model-card fields: ``data``, ``command``, ``metrics``, ``training_domain``, free keys.
            run_config: The rest of the run config (data, trainer ...) to keep beside the model section.
            body: Free text of the model card (markdown) after the front matter.
            state_dict: Weights to write instead of ``self.trained_state_dict()`` (e.g. an EMA copy's).
            copy_base: Copy the base folders into the export (a self-contained folder) instead of referencing
                them by absolute path.
        """
        import shutil

        directory = Path(directory)
        bases = self.base_folders()
        target = directory.resolve()
        for name, base in bases.items():
            if not base.is_dir():
                raise CheckpointError(f"model.{name}={base}: no such base folder, so the export cannot refer to it")
            if target == base.resolve() or base.resolve() in target.parents or target in base.resolve().parents:
                raise CheckpointError(f"{directory}: would write into or over the base folder {base} "
                                      f"(model.{name}); a base is read-only — export elsewhere")
        config = dict(run_config or {})
        config["method"] = self.method or config.get("method")
        config["model"] = to_jsonable(self.config, nan_to_none=True)
        sd = state_dict if state_dict is not None else self.trained_state_dict()
        refs: dict[str, str] = {}
        meta = {"method": config["method"], "model_class": f"{type(self).__module__}:{type(self).__qualname__}",
                "parameters": int(sum(p.numel() for p in self.parameters())), "weights": MODEL_FILE,
                **(card or {})}
        title = f"# {config['method'] or type(self).__name__} — {type(self).__name__}\n\n"
        with atomic_dir(directory) as tmp:
            for i, (name, base) in enumerate(bases.items()):
                if copy_base:
                    rel = "base" if i == 0 else f"base_{name}"
                    shutil.copytree(base, tmp / rel, symlinks=False)
                    refs[name] = rel
                else:
                    refs[name] = str(base.resolve())
            config["model"].update(refs)
            if refs:
                meta["base"] = dict(refs)
            save_weights(sd, tmp / MODEL_FILE)
            upstream = self.save_upstream(tmp, state_dict)
            if upstream:
                meta["upstream"] = dict(upstream)
            write_json(tmp / CONFIG_FILE, to_jsonable(config, nan_to_none=True))
            write_text(tmp / CARD_FILE, front_matter(meta) + "\n" + (body or title))
        return directory

    # -- load -------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path, use_ema: bool | None = None,
                        device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                        strict: bool = True) -> PreTrainedModel:
        """Load an exported folder, a training checkpoint or a run directory (its newest checkpoint).

        Args:
            path: Folder with ``config.json`` + ``model.safetensors`` (run directories resolve through
                ``checkpoints/latest``).
            use_ema: None: the EMA weights when the folder has them; True: require them; False: never.
            device: Where to put the model (default CPU).
            dtype: Cast floating-point parameters and buffers (default: as saved).
            strict: Every key and shape must match.

        Returns:
            The model in eval mode; ``model.loaded_from`` records the folder, the weights file and the
            full ``config.json``.
        """
        ckpt = resolve_checkpoint(path)
        config = read_config(ckpt)
        if not isinstance(config.get("model"), dict):
            raise CheckpointError(f"{ckpt}/{CONFIG_FILE} has no 'model' section")
        if cls.method and config.get("method") not in (None, cls.method) and not cls._accepts_method(config["method"]):
            raise CheckpointError(f"{ckpt}: a {config['method']!r} checkpoint, not {cls.method!r}")
        try:
            model_cfg = cls.config_from_dict(cls.resolve_bases(config["model"], ckpt))
        except CheckpointError as e:
            raise CheckpointError(f"{ckpt}/{CONFIG_FILE}: {e}") from None
        model = cls.build_for_loading(model_cfg)
        weights = weights_file(ckpt, use_ema)
        required = model.trained_state_dict().keys() if cls.base_fields else None
        load_into(model, load_weights(weights), source=str(weights), strict=strict, required=required)
        model.loaded_from = {"path": str(ckpt), "weights": weights.name, "config": config}
        if dtype is not None:
            model.to(dtype=dtype)
        return model.to(device or "cpu").eval()

    @classmethod
    def resolve_bases(cls, model_section: dict[str, Any], folder: Path) -> dict[str, Any]:
        """``model_section`` with each base reference made a usable path.

        A relative reference is looked up in ``folder`` first (a self-contained export's ``base/``), then as
        given (a training run's config, relative to where it was started). A reference that exists nowhere is a
        one-line ``CheckpointError`` naming the field.
        """
        out = dict(model_section)
        for name in cls.base_fields:
            value = out.get(name)
            if value in (None, ""):
                continue
            path = Path(value)
            candidates = [path] if path.is_absolute() else [folder / path, path]
            found = next((c for c in candidates if c.is_dir()), None)
            if found is None:
                raise CheckpointError(f"model.{name}: base folder {value!r} not found (looked in "
                                      f"{', '.join(str(c) for c in candidates)}); the folder references its base "
                                      "by path — put it back there or export with copy_base=True")
            out[name] = str(found)
        return out

    @classmethod
    def _accepts_method(cls, method: str) -> bool:
        """Whether checkpoints of ``method`` load into this class (a family shares one class)."""
        return False

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of parameters (all, or those with ``requires_grad``)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    # -- scaling ----------------------------------------------------------------------------------
    def checkpoint_units(self) -> list[nn.Module]:
        """The blocks whose activations gradient checkpointing recomputes in backward.

        Default: every element of the model's outermost ``nn.ModuleList``s (``core.layers.checkpointing
        .block_units``, the same blocks the trainer shards under FSDP); a model without one recomputes each of
        its top-level submodules. Override when the blocks live elsewhere;
        a model wrapping a diffusers / transformers base may instead override ``enable_gradient_checkpointing``
        to call the base's own switch.
        """
        from core.layers.checkpointing import block_units

        units = [m for _, m in block_units(self)]
        # no block list (a small MLP / conv net): its top-level parts, each recomputed as a whole
        return units or [m for m in self.children() if next(m.parameters(), None) is not None]

    def enable_gradient_checkpointing(self) -> None:
        """Recompute ``checkpoint_units()``' activations in backward instead of storing them (training only).

        Gradients are unchanged (dropout's RNG is replayed); parameter names are unchanged. ``trainer.
        gradient_checkpointing=true`` calls this. Raises ``ValueError`` when the model has no units.
        """
        from core.layers.checkpointing import checkpoint_modules

        checkpoint_modules(self.checkpoint_units())


def weights_file(directory: Path, use_ema: bool | None) -> Path:
    """The weights to load: ``ema.safetensors`` when present (unless ``use_ema`` is False)."""
    ema = directory / EMA_FILE
    if use_ema is True and not ema.is_file():
        raise CheckpointError(f"{directory}: use_ema=True but there is no {EMA_FILE} "
                              "(trained without trainer.ema_decay?)")
    if use_ema is not False and ema.is_file():
        return ema
    return directory / MODEL_FILE


def load_pretrained(path: str | Path, **kwargs: Any) -> PreTrainedModel:
    """Load any method's model: the class is the one its method registered (``core.registry.MODELS``)."""
    from core.registry import MODELS

    ckpt, cls = method_entry(path, MODELS, "model class")
    return cls.from_pretrained(ckpt, **kwargs)
