"""The image-to-video policy: a pretrained latent video DiT that continues a clean first frame, with an SDE sampler
that records every step's Gaussian transition (for GRPO) and a deterministic ODE sampler (for evaluation).

Backbone: a Flex-Forcing checkpoint (``perception/video``: diffusers' causal ``AutoencoderKLWan`` + a
``WanTransformer3DModel`` run chunk-causally by ``core.layers.wan.CausalWan``), loaded through the model registry
(``core.pretrained.load_pretrained``), or a user's Wan diffusers folder around which the registry's Flex-Forcing
class is built (``build_backbone``). TAGRPO is the one method that post-trains another method's model, and it
does so through the registry and the model's public interface (``dit``, ``encode``, ``decode``, ``config``)
rather than by importing the other method's code. The policy is itself a ``core.pretrained.PreTrainedModel``
(method ``tagrpo``) that references its backbone folder (``base_path``) and stores only the post-trained DiT.

Layout (Wan2.2-TI2V's): the conditioning image is encoded alone (the causal VAE's first latent frame) and enters
the sequence as one clean latent frame at ``t = 0``; the ``N`` new *latent* frames follow, all at the step's level
``t``. With a base trained on chunked layouts (``chunking`` random / singletons) the first frame is its own,
earlier chunk and the new frames the next one (denoised together, bidirectionally), the layout of its clean-context
prefixes; with ``chunking=one`` it sits inline under full attention. The video is the first latent and the new
ones decoded as one (causal) clip, ``1 + N r`` frames for the VAE's temporal factor ``r``, with the given image put
back as frame 0 exactly.

Rollouts (``rollout``) run ``core.diffusion.sde_step`` along the grid ``1 = t_0 > t_1 > ... > t_S = 0``; a
``Trajectory`` keeps every intermediate latent ``x_i`` (``x_0`` is the initial noise), the transition means
``mu(x_i)`` and the per-step standard deviations, and the per-element mean log-probability of each step (the
Flow-GRPO normalisation: a sum over thousands of latent elements would put the PPO ratio far outside any clip
range after one update).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from core.diffusion import euler_step, sde_step, timestep_grid
from core.errors import CheckpointError, ConfigError
from core.pretrained import PreTrainedModel, load_pretrained
from perception.i2v_rl.configuration_tagrpo import TAGRPOModelConfig

if TYPE_CHECKING:
    from core.testing import ModelExample

__all__ = ["I2VPolicy", "Trajectory", "build_backbone", "gaussian_logprob", "is_wan_folder", "tiny_config"]


def is_wan_folder(path: str | Path) -> bool:
    """Whether ``path`` is a user's Wan diffusers folder rather than a workspace checkpoint: a pipeline folder
    (``model_index.json`` naming a Wan pipeline, or a ``transformer/`` holding a ``WanTransformer3DModel``) or a
    ``WanTransformer3DModel`` folder. A folder whose ``config.json`` names a workspace method is not."""
    import json

    p = Path(path)

    def class_name(f: Path) -> str | None:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("method"):
            return None
        return data.get("_class_name")

    if (p / "model_index.json").is_file() and str(class_name(p / "model_index.json") or "").startswith("Wan"):
        return True
    return any((f.is_file() and class_name(f) == "WanTransformer3DModel")
               for f in (p / "config.json", p / "transformer" / "config.json"))


def build_backbone(config: TAGRPOModelConfig) -> nn.Module:
    """The video model ``config.base_path`` names, only read.

    A workspace folder (Flex-Forcing checkpoint, or a TAGRPO policy whose post-trained backbone is then the base)
    loads through ``core.pretrained.load_pretrained``. A user's Wan folder (``is_wan_folder``) becomes the
    registry's Flex-Forcing model (``MODELS.get("flexforcing")``) built from it, with ``config.frame_size``,
    ``config.k_projection`` and ``config.frames`` latent frames; without the K-projection the first frame sits
    inline (``chunking=one``, Wan2.2-TI2V), with it in its own chunk (``chunking=random``).
    """
    from core.registry import MODELS, load_plugins

    if is_wan_folder(config.base_path):
        load_plugins()
        cls = MODELS.get("flexforcing")
        kw: dict[str, Any] = {"base_path": str(Path(config.base_path).resolve()), "k_projection": config.k_projection,
                              "chunking": "random" if config.k_projection else "one",
                              "noise": "per_chunk" if config.k_projection else "per_clip",
                              "sample_steps": config.sample_steps, "sample_shift": config.sample_shift}
        if config.frame_size is not None:
            kw["frame_size"] = config.frame_size
        if config.vae_path is not None:
            kw["vae_path"] = str(Path(config.vae_path).resolve())
        if config.frames is not None:
            kw["num_frames"] = config.frames
            kw["max_context"] = min(2, config.frames - 1)
        return cls(cls.config_class(**kw))
    if config.vae_path is not None:
        raise ConfigError(f"model.vae_path={config.vae_path}: only a Wan transformer folder as model.base_path takes "
                          f"a VAE folder; {config.base_path} is a workspace checkpoint with its own VAE")
    backbone = load_pretrained(config.base_path)
    if isinstance(backbone, I2VPolicy):  # continue post-training a policy: its backbone is the base
        backbone = backbone.backbone
    return backbone


def gaussian_logprob(sample: Tensor, mean: Tensor, std: Tensor | float) -> Tensor:
    """Per-element mean log-density of ``sample`` under ``N(mean, std^2)``, reduced over all but dim 0.

    ``std`` is a positive scalar (or broadcastable tensor); ``mean`` may carry gradients.
    """
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    elem = -((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * torch.log(torch.tensor(2 * torch.pi))
    return elem.flatten(1).mean(1)


@dataclass
class Trajectory:
    """One batch of SDE rollouts.

    Attributes:
        latents: (B, S + 1, N, C, h, w) ``x_0`` (initial noise) ... ``x_S`` (the sample), normalised latents of the
            N new frames.
        means: (B, S, N, C, h, w) mean of the transition ``x_i -> x_{i+1}`` under the sampling policy.
        stds: (S,) its standard deviation (the same for every element: one ``t`` per step).
        log_probs: (B, S) per-element mean log-probability of each sampled ``x_{i+1}``.
    """

    latents: Tensor
    means: Tensor
    stds: Tensor
    log_probs: Tensor

    @property
    def final(self) -> Tensor:
        return self.latents[:, -1]


class I2VPolicy(PreTrainedModel):
    """Image-to-video flow policy around a pretrained video model (see the module docstring).

    TAGRPO's trained artefact: a ``PreTrainedModel`` of method ``tagrpo`` whose config (``TAGRPOModelConfig``)
    names the backbone folder in ``base_path`` (``base_fields``). The backbone is built read-only by
    ``build_backbone``: a Flex-Forcing folder, another TAGRPO policy folder (whose post-trained backbone is then
    post-trained further) or a user's Wan diffusers folder. Post-training changes the whole DiT, so the policy's
    folder stores the DiT's weights (``trained_state_dict``); the frozen VAE and the latent statistics come from
    the base (rebuilt from it when loading). Loading requires exactly those tensors.

    Args:
        config: ``base_path`` (the backbone), ``frames`` (latent frames with the conditioning frame's; default the
            backbone's ``num_frames``), ``sample_steps`` / ``sample_shift`` (the grid of
            ``core.diffusion.timestep_grid``), ``frame_size`` / ``k_projection`` (for a Wan folder only).
    """

    config_class = TAGRPOModelConfig
    method = "tagrpo"
    base_fields = ("base_path", "vae_path")

    def __init__(self, config: TAGRPOModelConfig):
        super().__init__()
        self.config = config
        backbone = build_backbone(config)
        missing = [a for a in ("dit", "vae", "encode", "decode") if not hasattr(backbone, a)]
        if missing:
            raise CheckpointError(f"model.base_path={config.base_path}: a {type(backbone).__name__} has no "
                                  f"{', '.join(missing)}; the base must be a video model (a Flex-Forcing checkpoint "
                                  "or a Wan diffusers folder)")
        self.backbone = backbone
        self.frames = int(config.frames or backbone.config.num_frames)
        if self.frames < 2:
            raise ConfigError(f"model.frames must be >= 2, got {self.frames}")
        self.temporal_factor = int(backbone.config.temporal_factor)
        # the first frame's own chunk, unless the base only ever saw one chunk (full attention)
        self.inline_first = getattr(backbone.config, "chunking", "random") == "one"
        self.steps, self.shift = config.sample_steps, config.sample_shift
        self.register_buffer("grid", timestep_grid(self.steps, self.shift), persistent=False)
        backbone.vae.requires_grad_(False)

    def trained_state_dict(self) -> dict[str, Tensor]:
        """The post-trained tensors, the DiT's (``backbone.dit.*``); the VAE and latent statistics are the base's."""
        return {k: v for k, v in self.state_dict().items() if k.startswith("backbone.dit.")}

    def forward(self, first: Tensor, x: Tensor, t: Tensor | float) -> Tensor:
        """The velocity of the new frames (``velocity``)."""
        return self.velocity(first, x, t)

    def save_shipped(self, directory: str | Path, base_ref: str, card: dict[str, Any] | None = None,
                     run_config: dict[str, Any] | None = None, body: str = "") -> Path:
        """``save_pretrained`` with the base referenced by ``base_ref``, a path relative to ``directory``.

        For a shipped asset beside its base (``assets/checkpoints/tagrpo`` -> ``../flexforcing``): the folder
        stays self-contained within the assets tree without a second copy of the base (``copy_base=True`` would
        copy it into ``<directory>/base``). ``base_ref`` must lead from ``directory`` to ``config.base_path``;
        the folder is written atomically.
        """
        import os

        from core.io import atomic_dir, read_json, write_json, write_text
        from core.pretrained import CARD_FILE, card_body, front_matter, read_card

        directory = Path(directory)
        if Path(base_ref).is_absolute() or (directory / base_ref).resolve() != Path(self.config.base_path).resolve():
            raise ConfigError(f"base_ref={base_ref!r}: does not lead from {directory} to the base folder "
                              f"{self.config.base_path} (a path relative to the exported folder)")
        with atomic_dir(directory) as tmp:
            staged = self.save_pretrained(tmp / "staged", card=card, run_config=run_config, body=body)
            config = read_json(staged / "config.json")
            config["model"]["base_path"] = base_ref
            write_json(staged / "config.json", config)
            meta = {**read_card(staged), "base": {"base_path": base_ref}}
            write_text(staged / CARD_FILE, front_matter(meta) + "\n" + card_body(staged))
            for f in staged.iterdir():
                os.replace(f, tmp / f.name)
            staged.rmdir()
        return directory

    # -- shapes -------------------------------------------------------------------------------------------
    @property
    def new_frames(self) -> int:
        """N: the generated latent frames."""
        return self.frames - 1

    @property
    def video_frames(self) -> int:
        """Frames of a decoded video, the given one included: ``1 + N r``."""
        return 1 + self.new_frames * self.temporal_factor

    @property
    def frame_hw(self) -> tuple[int, int]:
        """(H, W) of the video frames."""
        return tuple(self.backbone.config.frame_hw)

    def latent_shape(self) -> tuple[int, int, int, int]:
        """(N, C, h, w) of the generated latents."""
        c = self.backbone.config
        h, w = c.latent_hw
        return (self.new_frames, c.latent_channels, h, w)

    def trainable(self) -> nn.Module:
        """The post-trained part: the DiT."""
        return self.backbone.dit

    def checkpoint_units(self) -> list[nn.Module]:
        """The DiT's transformer blocks: what gradient checkpointing recomputes and FSDP shards as units.

        The frozen VAE (run under no_grad) and the DiT's small per-layer modules stay with the root.
        """
        from core.layers.checkpointing import block_units

        blocks = getattr(self.backbone.dit, "blocks", None)
        return list(blocks) if isinstance(blocks, nn.ModuleList) else [m for _, m in block_units(self.backbone.dit)]

    def fsdp_units(self) -> list[nn.Module]:
        """The units ``trainer.strategy=fsdp`` shards on their own (``checkpoint_units``)."""
        return self.checkpoint_units()

    # -- conditioning and pixels ------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_first(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) uint8 conditioning images -> (B, 1, C, h, w) normalised latents (the causal VAE's first
        latent frame: the image encoded alone)."""
        h, w = self.frame_hw
        if images.ndim != 4 or images.shape[1] != 3 or tuple(images.shape[-2:]) != (h, w):
            raise ValueError(f"conditioning images must be (B, 3, {h}, {w}), got {tuple(images.shape)}")
        return self.backbone.encode(images[:, None])

    @torch.no_grad()
    def decode_video(self, images: Tensor, latents: Tensor, first: Tensor | None = None) -> Tensor:
        """The video (B, 1 + N r, 3, H, W) uint8: the first latent (``first``, else ``encode_first(images)``) and
        the new ``latents`` (B, N, C, h, w) decoded as one clip, with the given image as frame 0 exactly."""
        if first is None:
            first = self.encode_first(images)
        video = self.backbone.decode(torch.cat([first.to(latents), latents], 1))
        video[:, 0] = images.to(video.device)
        return video

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """(n, N, C, h, w) standard-normal initial latents (drawn on the CPU generator: device independent)."""
        return torch.randn(n, *self.latent_shape(), generator=generator).to(self.grid.device)

    # -- the flow ---------------------------------------------------------------------------------------------
    def velocity(self, first: Tensor, x: Tensor, t: Tensor | float) -> Tensor:
        """Velocity of the new frames ``x`` (B, N, C, h, w) at shared level ``t`` given the first-frame latent."""
        b, n = x.shape[:2]
        if first.shape[0] != b or first.shape[1] != 1:
            raise ValueError(f"first must be (B={b}, 1, C, h, w), got {tuple(first.shape)}")
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        tt = torch.cat([torch.zeros(b, 1, device=x.device, dtype=x.dtype), t.reshape(-1, 1).expand(b, n)], 1)
        frames = torch.arange(n + 1, device=x.device)
        chunks = None
        if not self.inline_first:
            chunks = torch.ones(n + 1, dtype=torch.long, device=x.device)
            chunks[0] = 0
        return self.backbone.dit(torch.cat([first.to(x.dtype), x], 1), tt, frames, chunks)[:, 1:]

    def transition(self, first: Tensor, x: Tensor, i: int, eta: float) -> tuple[Tensor, Tensor]:
        """Mean (with gradients through the DiT) and std of the SDE transition ``x_i -> x_{i+1}`` at step ``i``."""
        v = self.velocity(first, x, self.grid[i])
        st = sde_step(x, v, self.grid[i], self.grid[i + 1], eta=eta, prev_sample=x)
        return st.mean.to(x.dtype), st.std.reshape(())

    def training_step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """TAGRPO's loss (``grpo.contrastive_loss``) of one group at one sampling step of recorded rollouts.

        Keys: ``first`` (K, 1, C, h, w), ``state`` (K, N, C, h, w) the states ``x_i``, ``step`` (``i``), ``old_mean``
        (K, ...) their means at rollout, ``targets`` (J, ...) next latents, ``adv`` (J,), ``own`` (K,) each state's
        own target, and the scalars ``eta``, ``clip`` and ``weight`` (0: DanceGRPO's own term only). The trainer's
        model is ``task.GRPOLearner``, which batches every group of a micro-batch into one transition; this is the
        same loss for one group (the contract test's training step).
        """
        from perception.i2v_rl.grpo import contrastive_loss

        mean, std = self.transition(batch["first"], batch["state"], int(batch["step"]), float(batch["eta"]))
        loss, st = contrastive_loss(mean, batch["old_mean"], batch["targets"], std, batch["adv"], batch["own"],
                                    float(batch["clip"]), float(batch["weight"]))
        return {"loss": loss, "ratio_dev": (st["ratio"] - 1).abs().max(), "clipped": st["clipped"]}

    @torch.no_grad()
    def rollout(self, first: Tensor, noise: Tensor, eta: float, generator: torch.Generator | None = None,
                step_noise: Tensor | None = None, sde_steps: list[int] | None = None) -> Trajectory:
        """SDE rollouts from initial ``noise`` (B, N, C, h, w), recording the trajectory (see ``Trajectory``).

        The SDE's standard-normal draws come from ``generator``, or are given as ``step_noise`` (B, S, N, C, h, w)
        (e.g. drawn per group, so that a rollout does not depend on which batch it is sampled in).
        ``sde_steps`` (MixGRPO's window; None: every step) are the steps sampled with the SDE; the others take the
        deterministic Euler ODE step of ``sample``, recorded with ``mean`` = the next latent, std 0 and
        log-probability 0, and draw nothing from ``generator``.
        """
        if step_noise is not None and tuple(step_noise.shape) != (noise.shape[0], self.steps, *noise.shape[1:]):
            raise ValueError(f"step_noise must be (B, S, N, C, h, w) = {(noise.shape[0], self.steps, *noise.shape[1:])}"
                             f", got {tuple(step_noise.shape)}")
        x = noise
        latents, means, stds, logps = [x], [], [], []
        sde = set(range(self.steps)) if sde_steps is None else set(sde_steps)
        for i in range(self.steps):
            v = self.velocity(first, x, self.grid[i])
            if i not in sde:  # the ODE outside the window
                x = euler_step(x, v, self.grid[i], self.grid[i + 1])
                latents.append(x)
                means.append(x)
                stds.append(None)
                logps.append(None)
                continue
            z = None if step_noise is None else step_noise[:, i].to(x.dtype)
            st = sde_step(x, v, self.grid[i], self.grid[i + 1], eta=eta, noise=z,
                          generator=None if z is not None else generator)
            mean = st.mean.to(x.dtype)
            x = st.prev_sample
            std = st.std.reshape(())
            latents.append(x)
            means.append(mean)
            stds.append(std)
            logps.append(st.log_prob / x[0].numel())  # sde_step's summed log-density, as a per-element mean
        if None in stds:  # ODE steps: std 0, log-probability 0, in the SDE steps' dtypes
            std0 = next((s for s in stds if s is not None), torch.zeros((), device=x.device))
            lp0 = next((lp for lp in logps if lp is not None), torch.zeros(x.shape[0], device=x.device))
            stds = [torch.zeros_like(std0) if s is None else s for s in stds]
            logps = [torch.zeros_like(lp0) if lp is None else lp for lp in logps]
        return Trajectory(torch.stack(latents, 1), torch.stack(means, 1), torch.stack(stds), torch.stack(logps, 1))

    @torch.no_grad()
    def sample(self, first: Tensor, noise: Tensor) -> Tensor:
        """Deterministic ODE (Euler) sample from ``noise``: the evaluation sampler."""
        x = noise
        for i in range(self.steps):
            x = euler_step(x, self.velocity(first, x, self.grid[i]), self.grid[i], self.grid[i + 1])
        return x


def tiny_config(**overrides: Any) -> TAGRPOModelConfig:
    """The tests' policy: a short sampling grid around ``base_path``, which the tests set to a tiny Flex-Forcing
    folder (one saved from ``perception.video.modeling_flexforcing.tiny_config()``, as the contract example's in
    ``example``); ``overrides`` replace fields. TAGRPO has no model YAML of its own to keep equal: a tiny run
    composes ``model.base_path`` with a tiny base."""
    kw: dict[str, Any] = dict(sample_steps=4)
    kw.update(overrides)
    return TAGRPOModelConfig(**kw)


def example(workdir: Path) -> ModelExample:
    """The contract test's tiny policy around a tiny Flex-Forcing base.

    The base is Flex-Forcing's tiny config (``configs/model/flexforcing_tiny.yaml``) built through the registry,
    its zero-initialised weights perturbed, saved once into ``workdir``. The forward is the velocity on a fixed
    noisy latent and a 4-step ODE sample from it; the training step is one group's TAGRPO loss (``training_step``).
    """
    from omegaconf import OmegaConf

    from core.registry import MODELS, load_plugins
    from core.resources import resource_dir
    from core.testing import ModelExample

    base = (Path(workdir) / "flexforcing_tiny").resolve()
    if not (base / "config.json").is_file():
        load_plugins()
        cls = MODELS.get("flexforcing")
        sizes = OmegaConf.to_container(OmegaConf.load(resource_dir("configs") / "model" / "flexforcing_tiny.yaml"))
        sizes.pop("defaults", None)
        torch.manual_seed(0)
        backbone = cls(cls.config_from_dict(sizes))
        g = torch.Generator().manual_seed(7)  # zero-initialised weights get values: the velocity depends on x
        with torch.no_grad():
            for p in backbone.dit.parameters():
                if p.abs().sum() == 0:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        backbone.save_pretrained(base, card={"data": "random (the contract test's tiny base)"})
    config = TAGRPOModelConfig(base_path=str(base), sample_steps=4)

    def build() -> I2VPolicy:
        return I2VPolicy(config)

    def inputs() -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"first": torch.randn(2, 1, 4, 8, 8, generator=g), "x": torch.randn(2, 5, 4, 8, 8, generator=g),
                "t": torch.tensor([0.9, 0.35])}

    def run(model: I2VPolicy, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"velocity": model(**batch), "sample": model.sample(batch["first"], batch["x"])}

    def train_inputs() -> dict[str, Tensor]:  # one group of 2 states at step 1, 3 targets, weights moved off
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 5, 4, 8, 8, generator=g)
        return {"first": torch.randn(2, 1, 4, 8, 8, generator=g), "state": x, "step": torch.tensor(1),
                "old_mean": x + 0.01 * torch.randn(x.shape, generator=g), "targets": torch.randn(3, 5, 4, 8, 8,
                                                                                                generator=g),
                "adv": torch.tensor([1.0, -0.5, -0.5]), "own": torch.arange(2), "eta": torch.tensor(0.3),
                "clip": torch.tensor(10.0), "weight": torch.tensor(1.0)}

    return ModelExample(build=build, inputs=inputs, run=run, train_inputs=train_inputs)


def ship_policy(src: str | Path, dest: str | Path, base_ref: str = "../flexforcing") -> Path:
    """Copy an exported policy folder ``src`` (a run's ``<out_dir>/policy``) to the shipped asset ``dest``.

    The copy references its base by ``base_ref``, relative to ``dest`` (default the sibling shipped Flex-Forcing
    folder), instead of the run's absolute path, so the assets tree stays relocatable; the model card and run
    config are kept. The base of ``src`` must be the folder ``base_ref`` leads to (``I2VPolicy.save_shipped``).
    """
    from core.io import read_json
    from core.pretrained import card_body, read_card

    src = Path(src)
    policy = I2VPolicy.from_pretrained(src)
    card = {k: v for k, v in read_card(src).items()
            if k not in ("method", "model_class", "parameters", "weights", "base")}
    run_config = {k: v for k, v in read_json(src / "config.json").items() if k not in ("method", "model")}
    return policy.save_shipped(dest, base_ref, card=card, run_config=run_config, body=card_body(src))
