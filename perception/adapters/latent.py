"""A user's diffusers base in its latent space: the SD-class UNet, DiT or Wan video transformer FeRA adapts.

``embodied train fera model.base_path=<folder>`` with a diffusers folder adapts that model where it was trained:
images (or clips) are encoded through the base's own VAE, the adapter arm trains on the latents with the base's
own objective, and samples are decoded through the VAE. Everything is opened read-only (diffusers' and
transformers' ``from_pretrained`` on a local folder; nothing is ever written there).

Where the weights come from (``resolve_base``):

- ``model.base_path`` = a **pipeline folder** (``model_index.json`` with ``unet/`` or ``transformer/`` and
  ``vae/``, as ``huggingface-cli download`` / ``DiffusionPipeline.save_pretrained`` leave it), or a **model
  folder** (``config.json`` of one of ``SUPPORTED`` + ``diffusion_pytorch_model.safetensors``), e.g. the
  ``unet/`` of such a pipeline;
- ``model.vae_path`` = the VAE's folder (``AutoencoderKL`` or ``AutoencoderKLWan``); empty: the pipeline's
  ``vae/`` (also when ``base_path`` is the ``unet/`` / ``transformer/`` inside a pipeline folder).

The backbones (``SUPPORTED``):

- ``UNet2DConditionModel`` (Stable Diffusion 1 / 2 structure): latents ``(B, C, h, w)``, called
  ``sample=, timestep=, encoder_hidden_states=``. Bases that need added conditioning (SDXL's
  ``addition_embed_type``) are refused in one line.
- ``DiTTransformer2DModel`` / ``Transformer2DModel`` with ``norm_type="ada_norm_zero"`` (DiT): called
  ``hidden_states=, timestep=, class_labels=``; the class is ``model.class_label``, default the null
  (classifier-free) class when the label table has one; a learned-sigma output (``out_channels = 2 C``) is cut
  to its first ``C`` channels.
- ``WanTransformer3DModel`` (Wan 2.1): clip latents ``(B, C, F, h, w)`` (channels first), called
  ``hidden_states=, timestep=, encoder_hidden_states=``. Clips of ``model.frames`` frames (``1 + 4 k`` for
  Wan's VAE) are encoded by ``AutoencoderKLWan``.

Latents: ``AutoencoderKL``: ``(mode - shift_factor) * scaling_factor``; ``AutoencoderKLWan``: per-channel
``(mode - latents_mean) / latents_std`` (the pipelines' normalisation). The posterior mode, so a shot encodes to
one latent.

Objective (``Objective``): the base's own. ``model.objective=auto`` reads the pipeline's
``scheduler/scheduler_config.json`` (``prediction_type``; a flow scheduler or ``use_flow_sigmas`` means flow
matching, ``flow_shift`` / ``shift`` its shift), else the backbone's default (Wan: flow; UNet: epsilon on SD's
scaled-linear betas 0.00085-0.012; DiT: epsilon on linear betas 1e-4-0.02). The noise level ``t`` is in
``[0, 1]`` for every kind (as in the pixel experiment's held-out levels): flow ``x_t = (1 - t) x0 + t eps``,
timestep ``1000 t``, target ``eps - x0``; DDPM ``x_t = a x0 + s eps`` with ``a^2 = alpha_bar(t (T - 1))``
(interpolated), timestep ``t (T - 1)``, target ``eps`` or ``v = a eps - s x0``. Training draws ``t``
logit-normal (flow, then shifted) or uniform (DDPM, as the DDPM recipes); sampling is DDIM (eta 0) on a grid
from 1 to 0, which for flow is exactly the Euler step.

Text conditioning: the base's cross-attention gets one fixed prompt embedding for every sample
(``prompt_embedding``): the pipeline's own text encoder on ``model.prompt`` (default ``""``, the unconditional
embedding) when the pipeline folder has ``text_encoder/`` and ``tokenizer/``; else ``model.prompt_embeds`` (a
``.safetensors`` file with a ``prompt_embeds`` tensor ``(L, D)`` or ``(1, L, D)``, e.g. saved from the user's
own text encoder); else a fixed seeded Gaussian embedding of ``model.prompt_tokens`` tokens of the base's
cross-attention width. That last one stands in for a prompt the workspace cannot encode: it is not a real
prompt; its tokens differ from one another so cross-attention still attends (identical tokens, e.g. zeros,
would make ``attn2``'s q / k and their adapters receive no gradient).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from core.errors import CheckpointError, ConfigError

__all__ = ["SUPPORTED", "VAES", "DiffusersBase", "LatentDenoiser", "Objective", "is_diffusers_base",
           "latent_heldout_loss", "resolve_base"]

#: diffusers backbone classes FeRA adapts in latent space -> their kind.
SUPPORTED = {"UNet2DConditionModel": "unet", "DiTTransformer2DModel": "dit", "Transformer2DModel": "dit",
             "WanTransformer3DModel": "wan"}
VAES = ("AutoencoderKL", "AutoencoderKLWan")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _class_name(folder: Path) -> str | None:
    """``_class_name`` of a diffusers folder's ``config.json`` (None when there is none)."""
    file = folder / "config.json"
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data.get("_class_name") if isinstance(data, dict) else None


@dataclass(frozen=True)
class DiffusersBase:
    """Where a diffusers base lives: its backbone folder, its VAE folder and (when there is one) its pipeline."""

    model_dir: Path
    vae_dir: Path
    class_name: str
    kind: str  # unet | dit | wan
    pipeline_dir: Path | None = None


def is_diffusers_base(path: str | Path) -> bool:
    """Whether ``path`` is a diffusers pipeline folder or a folder of one of the ``SUPPORTED`` backbones."""
    path = Path(path)
    return (path / "model_index.json").is_file() or _class_name(path) in SUPPORTED


def resolve_base(base_path: str | Path, vae_path: str | Path = "") -> DiffusersBase:
    """The backbone, VAE and pipeline folders of ``model.base_path`` / ``model.vae_path`` (see the module docstring).

    Raises:
        ConfigError: No supported backbone there, or no VAE found (name it with ``model.vae_path``).
    """
    path = Path(base_path)
    pipeline = None
    if (path / "model_index.json").is_file():
        pipeline = path
        subs = [path / s for s in ("unet", "transformer") if _class_name(path / s) in SUPPORTED]
        if not subs:
            raise ConfigError(f"model.base_path={path}: a pipeline folder without a unet/ or transformer/ of a "
                              f"supported class ({', '.join(SUPPORTED)})")
        model_dir = subs[0]
    elif _class_name(path) in SUPPORTED:
        model_dir = path
        if (path.parent / "model_index.json").is_file():
            pipeline = path.parent  # <pipeline>/unet or <pipeline>/transformer
    else:
        raise ConfigError(f"model.base_path={path}: not a diffusers pipeline folder (model_index.json) nor a "
                          f"model folder of {', '.join(SUPPORTED)} (config.json _class_name: {_class_name(path)})")
    if vae_path:
        vae = Path(vae_path)
    elif pipeline is not None and (pipeline / "vae" / "config.json").is_file():
        vae = pipeline / "vae"
    else:
        raise ConfigError(f"model.base_path={path}: FeRA adapts a diffusers base in its latent space and needs its "
                          "VAE: set model.vae_path=<the AutoencoderKL / AutoencoderKLWan folder>")
    if _class_name(vae) not in VAES:
        raise ConfigError(f"model.vae_path={vae}: not a diffusers {' / '.join(VAES)} folder (config.json "
                          f"_class_name: {_class_name(vae)})")
    name = _class_name(model_dir)
    return DiffusersBase(model_dir, vae, name, SUPPORTED[name], pipeline)


# -- the objective ---------------------------------------------------------------------------------------------
def _betas(schedule: str, start: float, end: float, steps: int) -> Tensor:
    if schedule == "scaled_linear":
        return torch.linspace(start ** 0.5, end ** 0.5, steps, dtype=torch.float64) ** 2
    if schedule == "linear":
        return torch.linspace(start, end, steps, dtype=torch.float64)
    if schedule == "squaredcos_cap_v2":
        f = [math.cos((i / steps + 0.008) / 1.008 * math.pi / 2) ** 2 for i in range(steps + 1)]
        return torch.tensor([min(1 - f[i + 1] / f[i], 0.999) for i in range(steps)], dtype=torch.float64)
    raise ConfigError(f"beta_schedule {schedule!r} is not one of scaled_linear, linear, squaredcos_cap_v2")


class Objective:
    """The base's diffusion objective on a noise level ``t`` in ``[0, 1]`` (module docstring).

    Args:
        kind: ``flow``, ``epsilon`` or ``v_prediction``.
        shift: Flow matching's timestep shift (training draws and the sampling grid).
        alphas_cumprod: DDPM ``alpha_bar`` per training step ``(T,)`` (epsilon / v_prediction only).
    """

    def __init__(self, kind: str, shift: float = 1.0, alphas_cumprod: Tensor | None = None):
        if kind not in ("flow", "epsilon", "v_prediction"):
            raise ConfigError(f"model.objective must be auto, flow, epsilon or v_prediction, got {kind!r}")
        if kind != "flow" and alphas_cumprod is None:
            raise ConfigError(f"objective {kind} needs a DDPM schedule")
        self.kind, self.shift = kind, float(shift)
        self.log_ab = None if alphas_cumprod is None else alphas_cumprod.double().log()

    @classmethod
    def for_base(cls, base: DiffusersBase, objective: str = "auto", flow_shift: float | None = None) -> Objective:
        """``model.objective`` for ``base``: given, or read from its pipeline's scheduler config (module docstring)."""
        sched: dict = {}
        if base.pipeline_dir is not None:
            file = base.pipeline_dir / "scheduler" / "scheduler_config.json"
            if file.is_file():
                sched = json.loads(file.read_text())
        kind = objective
        if kind == "auto":
            prediction = sched.get("prediction_type")
            if (str(sched.get("_class_name", "")).startswith("FlowMatch") or sched.get("use_flow_sigmas")
                    or prediction == "flow_prediction"):
                kind = "flow"
            elif prediction in ("epsilon", "v_prediction"):
                kind = prediction
            else:
                kind = "flow" if base.kind == "wan" else "epsilon"
        shift = flow_shift if flow_shift is not None else float(sched.get("flow_shift", sched.get("shift", 1.0)))
        if kind == "flow":
            return cls("flow", shift)
        default = ("linear", 1e-4, 0.02) if base.kind == "dit" else ("scaled_linear", 0.00085, 0.012)
        if not sched.get("beta_schedule"):
            sched = {}
        betas = _betas(sched.get("beta_schedule", default[0]), float(sched.get("beta_start", default[1])),
                       float(sched.get("beta_end", default[2])), int(sched.get("num_train_timesteps", 1000)))
        return cls(kind, shift, torch.cumprod(1 - betas, 0))

    @property
    def train_steps(self) -> int:
        return 1000 if self.log_ab is None else self.log_ab.numel()

    def timestep(self, t: Tensor) -> Tensor:
        """The backbone's timestep for levels ``t``: ``1000 t`` (flow) or ``t (T - 1)`` (DDPM)."""
        return t.float() * (1000.0 if self.log_ab is None else self.train_steps - 1)

    def coeffs(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """``(a, s)`` with ``x_t = a x0 + s eps`` at levels ``t`` (float32, ``t``'s shape)."""
        t = t.double()
        if self.log_ab is None:
            return (1 - t).float(), t.float()
        pos = t.clamp(0, 1) * (self.train_steps - 1)
        lo = pos.floor().long().clamp(max=self.train_steps - 2)
        frac = pos - lo
        log_ab = self.log_ab.to(t.device)
        ab = (log_ab[lo] * (1 - frac) + log_ab[lo + 1] * frac).exp()
        return ab.sqrt().float(), (1 - ab).sqrt().float()

    def sample_t(self, n: int, generator: torch.Generator | None = None, device=None) -> Tensor:
        """Training levels: logit-normal then shifted (flow), uniform (DDPM)."""
        from core.diffusion import sample_timesteps

        if self.log_ab is None:
            return sample_timesteps((n,), shift=self.shift, generator=generator, device=device)
        draw = generator.device if generator is not None else device
        return torch.rand(n, generator=generator, device=draw).to(device)

    def grid(self, steps: int, device=None) -> Tensor:
        """The sampling levels, ``steps + 1`` from 1 to 0 (shifted for flow)."""
        from core.diffusion import timestep_grid

        return timestep_grid(steps, self.shift if self.log_ab is None else 1.0, device=device)

    def noisy(self, x0: Tensor, eps: Tensor, t: Tensor) -> Tensor:
        a, s = (c.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype) for c in self.coeffs(t))
        return a * x0 + s * eps

    def target(self, x0: Tensor, eps: Tensor, t: Tensor) -> Tensor:
        if self.kind == "flow":
            return eps - x0
        if self.kind == "epsilon":
            return eps
        a, s = (c.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype) for c in self.coeffs(t))
        return a * eps - s * x0

    def split(self, pred: Tensor, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """``(x0, eps)`` predicted from the backbone's output ``pred`` at ``(x_t, t)``."""
        a, s = (c.view(-1, *([1] * (x_t.dim() - 1))).to(x_t.dtype) for c in self.coeffs(t))
        if self.kind == "flow":
            return x_t - s * pred, x_t + a * pred
        if self.kind == "epsilon":
            return (x_t - s * pred) / a.clamp_min(1e-4), pred
        return a * x_t - s * pred, s * x_t + a * pred

    def describe(self) -> dict:
        return {"kind": self.kind, "shift": self.shift, "train_steps": self.train_steps}


# -- the denoiser ----------------------------------------------------------------------------------------------
def _load(class_name: str, folder: Path, dtype: torch.dtype) -> nn.Module:
    import diffusers

    cls = getattr(diffusers, class_name, None)
    if cls is None:
        raise ConfigError(f"{folder}: diffusers {diffusers.__version__} has no class {class_name}")
    try:
        return cls.from_pretrained(str(folder), torch_dtype=dtype)
    except (OSError, ValueError, RuntimeError) as e:  # no / wrong weights
        raise CheckpointError(f"{folder}: could not load the {class_name} ({str(e).splitlines()[0]})") from None


def prompt_embedding(base: DiffusersBase, width: int, prompt: str = "", prompt_embeds: str = "",
                     tokens: int = 77) -> tuple[Tensor, str]:
    """The fixed ``(1, L, width)`` prompt embedding and where it came from (module docstring)."""
    pipe = base.pipeline_dir
    if prompt_embeds:
        from core.checkpoint import load_weights

        sd = load_weights(Path(prompt_embeds))
        if "prompt_embeds" not in sd:
            raise CheckpointError(f"model.prompt_embeds={prompt_embeds}: no 'prompt_embeds' tensor in the file")
        emb = sd["prompt_embeds"].float()
        emb = emb[None] if emb.dim() == 2 else emb
        if emb.dim() != 3 or emb.shape[0] != 1 or emb.shape[-1] != width:
            raise ConfigError(f"model.prompt_embeds={prompt_embeds}: shape {tuple(emb.shape)}, expected (L, {width})"
                              f" or (1, L, {width}) for this base")
        return emb, f"file {prompt_embeds}"
    if pipe is not None and (pipe / "text_encoder").is_dir() and (pipe / "tokenizer").is_dir():
        import transformers

        index = json.loads((pipe / "model_index.json").read_text())
        enc_cls = getattr(transformers, index.get("text_encoder", [None, "AutoModel"])[1])
        tok = transformers.AutoTokenizer.from_pretrained(str(pipe / "tokenizer"))
        enc = enc_cls.from_pretrained(str(pipe / "text_encoder")).eval()
        length = min(int(getattr(tok, "model_max_length", 77) or 77), 512)
        ids = tok([prompt], padding="max_length", max_length=length, truncation=True, return_tensors="pt")
        with torch.no_grad():
            emb = enc(input_ids=ids.input_ids, attention_mask=ids.attention_mask).last_hidden_state.float()
        if "T5" in type(enc).__name__:  # Wan: the padding positions are zeros
            emb = emb * ids.attention_mask[..., None]
        if emb.shape[-1] != width:
            raise ConfigError(f"{pipe}/text_encoder: width {emb.shape[-1]} != the base's {width}")
        return emb, f"text encoder {type(enc).__name__} on prompt {prompt!r}"
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, tokens, width, generator=g), f"fixed Gaussian ({tokens} tokens, seed 0; no text encoder)"


class LatentDenoiser(nn.Module):
    """A diffusers backbone in its VAE's latent space with its own objective (module docstring).

    The VAE is frozen and kept outside the module tree (never in ``state_dict``, never trained); it follows the
    backbone's device when encoding / decoding. ``forward(x_t, t)`` is the backbone's native prediction.

    Args:
        base: The resolved folders.
        objective: ``flow`` / ``epsilon`` / ``v_prediction`` / ``auto``.
        flow_shift: Override of the flow shift.
        prompt, prompt_embeds, prompt_tokens: The fixed text conditioning (``prompt_embedding``).
        class_label: DiT's class (None: the null class when there is one, else 0).
        dtype: ``float32`` / ``bfloat16`` / ``float16`` of the base and the VAE.
    """

    def __init__(self, base: DiffusersBase, objective: str = "auto", flow_shift: float | None = None,
                 prompt: str = "", prompt_embeds: str = "", prompt_tokens: int = 77, class_label: int | None = None,
                 dtype: str = "float32"):
        super().__init__()
        if dtype not in _DTYPES:
            raise ConfigError(f"model.base_dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        self.base, self.kind = base, base.kind
        torch_dtype = _DTYPES[dtype]
        self.backbone = _load(base.class_name, base.model_dir, torch_dtype).eval().requires_grad_(False)
        cfg = self.backbone.config
        if self.kind == "unet" and (cfg.get("addition_embed_type") or cfg.get("class_embed_type")):
            raise ConfigError(f"{base.model_dir}: a UNet with added conditioning ({cfg.get('addition_embed_type')} / "
                              f"{cfg.get('class_embed_type')}, e.g. SDXL) is not supported; SD 1 / 2 structure is")
        if self.kind == "dit" and cfg.get("norm_type", "ada_norm_zero") != "ada_norm_zero":
            raise ConfigError(f"{base.model_dir}: a Transformer2DModel with norm_type={cfg.get('norm_type')!r}; "
                              "only DiT's ada_norm_zero is supported")
        vae = _load(_class_name(base.vae_dir), base.vae_dir, torch_dtype).eval().requires_grad_(False)
        object.__setattr__(self, "vae", vae)  # frozen, not a submodule: never in state_dict or checkpoints
        self.objective = Objective.for_base(base, objective, flow_shift)
        self.channels = int(cfg.in_channels)
        self.prompt_source = None
        if self.kind in ("unet", "wan"):
            width = int(cfg.cross_attention_dim if self.kind == "unet" else cfg.text_dim)
            ctx, self.prompt_source = prompt_embedding(base, width, prompt, prompt_embeds, prompt_tokens)
            self.register_buffer("context", ctx.to(torch_dtype), persistent=False)
        else:
            from diffusers.models.embeddings import LabelEmbedding

            emb = next((m for m in self.backbone.modules() if isinstance(m, LabelEmbedding)), None)
            null = emb is not None and emb.embedding_table.num_embeddings > emb.num_classes
            self.class_label = int(class_label) if class_label is not None else (emb.num_classes if null else 0)
            if emb is not None:
                emb.dropout_prob = 0.0  # in memory only: the label is fixed, training draws no label dropout

    # -- the VAE -------------------------------------------------------------------------------------------
    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1) if self.vae_kind == "kl" else \
            2 ** (len(self.vae.config.dim_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(bool(d) for d in self.vae.config.temperal_downsample) if self.vae_kind == "wan" else 1

    @property
    def vae_kind(self) -> str:
        return "wan" if type(self.vae).__name__ == "AutoencoderKLWan" else "kl"

    def _vae_stats(self, z: Tensor) -> tuple[Tensor, Tensor]:
        c = self.vae.config
        if self.vae_kind == "wan":
            shape = (1, -1, 1, 1, 1)
            return (torch.tensor(c.latents_mean, device=z.device).view(shape),
                    torch.tensor(c.latents_std, device=z.device).view(shape))
        shift = float(c.get("shift_factor") or 0.0)
        return torch.tensor(shift, device=z.device), torch.tensor(1.0 / float(c.scaling_factor), device=z.device)

    def _vae_device(self) -> torch.device:
        param = next(self.backbone.parameters())
        if next(self.vae.parameters()).device != param.device:
            self.vae.to(param.device)
        return param.device

    @torch.no_grad()
    def encode(self, pixels: Tensor, batch_size: int = 8) -> Tensor:
        """Normalised latents of images ``(N, 3, H, W)`` or clips ``(N, 3, F, H, W)`` (uint8, or float in
        ``[-1, 1]``); float32 on the backbone's device."""
        device = self._vae_device()
        dtype = next(self.vae.parameters()).dtype
        out = []
        for i in range(0, pixels.shape[0], batch_size):
            x = pixels[i:i + batch_size].to(device)
            x = x.float() / 127.5 - 1 if x.dtype == torch.uint8 else x.float()
            z = self.vae.encode(x.to(dtype)).latent_dist.mode().float()
            mean, std = self._vae_stats(z)
            out.append((z - mean) / std)
        return torch.cat(out)

    @torch.no_grad()
    def decode(self, latents: Tensor, batch_size: int = 8) -> Tensor:
        """uint8 pixels (CPU) of normalised latents: images ``(N, 3, H, W)`` or clips ``(N, 3, F, H, W)``."""
        device = self._vae_device()
        dtype = next(self.vae.parameters()).dtype
        out = []
        for i in range(0, latents.shape[0], batch_size):
            z = latents[i:i + batch_size].to(device).float()
            mean, std = self._vae_stats(z)
            x = self.vae.decode((z * std + mean).to(dtype)).sample.float()
            out.append(((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu())
        return torch.cat(out)

    def latent_shape(self, image_size: int, frames: int = 1) -> tuple[int, ...]:
        """``(C, h, w)`` (or ``(C, f, h, w)`` for Wan) of a ``image_size`` px image / ``frames``-frame clip."""
        h = image_size // self.spatial_factor
        if self.kind == "wan":
            return (self.channels, 1 + (frames - 1) // self.temporal_factor, h, h)
        return (self.channels, h, h)

    # -- the denoiser --------------------------------------------------------------------------------------
    def forward(self, x_t: Tensor, t: Tensor | float) -> Tensor:
        """The backbone's native prediction (``objective.kind``) at latents ``x_t`` and levels ``t``."""
        b = x_t.shape[0]
        t = torch.as_tensor(t, device=x_t.device, dtype=torch.float32)
        t = t.expand(b) if t.ndim == 0 else t.reshape(b)
        dtype = next(self.backbone.parameters()).dtype
        x = x_t.to(dtype)
        timestep = self.objective.timestep(t)
        if self.kind == "dit":
            labels = torch.full((b,), self.class_label, dtype=torch.long, device=x.device)
            out = self.backbone(hidden_states=x, timestep=timestep, class_labels=labels, return_dict=False)[0]
            return out[:, :self.channels]  # a learned-sigma DiT: the prediction is the first half
        ctx = self.context.expand(b, -1, -1).to(dtype)
        key = "sample" if self.kind == "unet" else "hidden_states"
        return self.backbone(**{key: x}, timestep=timestep, encoder_hidden_states=ctx, return_dict=False)[0]

    def noisy_batch(self, x0: Tensor, generator: torch.Generator | None = None, t: Tensor | float | None = None
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(x_t, t, target)`` for clean latents ``x0`` (levels drawn by ``objective.sample_t`` unless given)."""
        b = x0.shape[0]
        if t is None:
            t = self.objective.sample_t(b, generator, x0.device)
        else:
            t = torch.as_tensor(t, dtype=torch.float32, device=x0.device)
            t = t.expand(b).clone() if t.ndim == 0 else t
        draw = generator.device if generator is not None else x0.device
        eps = torch.randn(x0.shape, generator=generator, device=draw, dtype=x0.dtype).to(x0.device)
        return self.objective.noisy(x0, eps, t), t, self.objective.target(x0, eps, t)


@torch.no_grad()
def latent_heldout_loss(model: nn.Module, latents: Tensor, objective: Objective,
                        levels=(0.1, 0.3, 0.5, 0.7, 0.9), seed: int = 0, batch_size: int = 16) -> dict[str, float]:
    """The objective's MSE at fixed levels on held-out latents with fixed noise (a CPU generator seeded ``seed``):
    comparable across arms. ``model(x_t, t)``: the native prediction."""
    from perception.adapters.backbones import fixed_level_mse

    return fixed_level_mse(model, latents, objective.noisy, objective.target, levels, seed, batch_size)
