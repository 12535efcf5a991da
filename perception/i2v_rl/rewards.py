"""Video rewards for TAGRPO, computed from what the simulator knows.

Conventions. A video is a uint8 tensor ``(B, F, 3, H, W)``; frame 0 is the conditioning image, frames ``1..F-1``
are generated. The simulator's ``reference`` is the physically correct continuation (same shape, same frame 0).
Pixels are read as ``x / 255`` in [0, 1]. Every reward maps a ``RewardInputs`` to a ``(B,)`` float32 tensor on
the frames' device, and **higher is better**.

Rewards (registered in ``REWARDS`` by name; ``build_reward(name, **kwargs)`` builds one):

``psnr``
    ``(1 / (F-1)) sum_{f>=1} PSNR(x_f, r_f)`` with ``PSNR = 10 log10(1 / max(MSE, min_mse))`` dB per frame
    (``core.metrics.image.psnr``); ``min_mse = 1e-10`` caps identical frames at 100 dB.
``feature``
    ``-(1 / (F-1)) sum_{f>=1} (1 - cos(phi(x_f), phi(r_f)))`` with ``phi`` the frozen EfficientNet-Lite0
    pooled features (``core.metrics.features.feature_distance``); 0 at best, >= -2.
``trajectory``
    A change-detection tracker (``track_centroids``): in frame ``f >= 1`` the moving pixels are
    ``M_f = {p : max_c |x_f(p) - x_0(p)| / 255 > threshold}``, tracked by their centroid ``c_f = (row, col)`` in
    pixel indices. Reward ``-(1 / (F-1)) sum_f e_f`` with ``e_f = |c_f(gen) - c_f(ref)| / sqrt(H^2 + W^2)`` (the
    frame diagonal, so ``e_f`` is in [0, 1]); ``e_f = 1`` when exactly one of the two masks is empty and 0 when
    both are. A square of side ``s`` moved by ``>= s`` pixels leaves a mask made of its old and new positions,
    whose centroid is the midpoint of the two.
``smoothness``
    ``-mean_{t, c, h, w} (x[t+1] - 2 x[t] + x[t-1])^2`` over the whole clip (frame 0 included, ``F >= 3``): zero
    for any per-pixel motion that is linear in time (constant-velocity intensity ramps, static scenes); 4 for a
    clip that alternates between black and white at every frame.
``goal``
    ``PSNR(x_{F-1}, g)`` dB of the last generated frame against the goal frame ``g`` (``RewardInputs.goal``, else
    the reference's last frame), capped as for ``psnr``.
``learned``
    Any ``nn.Module`` mapping float videos ``(B, F, 3, H, W)`` in [0, 1] to ``(B,)`` (or ``(B, 1)``) scores, run
    in eval mode under ``torch.no_grad()`` in batches; ``LearnedReward.from_path`` loads a TorchScript file.

``CompositeReward({name: weight})`` returns ``sum_k w_k R_k`` and each term; a non-finite term is an error.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from core.errors import DataError
from core.metrics.image import psnr as _psnr
from core.registry import Registry

__all__ = [
    "REWARDS",
    "CompositeReward",
    "FeatureReward",
    "GoalReward",
    "LearnedReward",
    "PSNRReward",
    "RewardInputs",
    "SmoothnessReward",
    "TrajectoryReward",
    "VideoReward",
    "build_reward",
    "track_centroids",
]

REWARDS = Registry("video reward")


def _check_video(video: Tensor, name: str) -> None:
    if not isinstance(video, Tensor) or video.ndim != 5 or video.shape[2] != 3:
        shape = tuple(video.shape) if isinstance(video, Tensor) else type(video).__name__
        raise ValueError(f"{name} must be a (B, F, 3, H, W) tensor, got {shape}")
    if video.dtype != torch.uint8:
        raise ValueError(f"{name} must be uint8 in [0, 255], got {video.dtype}")


@dataclass
class RewardInputs:
    """What a reward sees of one batch of rollouts.

    Attributes:
        frames: (B, F, 3, H, W) uint8 generated video, frame 0 (the conditioning image) included; F >= 2.
        reference: The simulator's physically correct continuation, same shape and dtype; None when there is
            no ground truth (e.g. a conditioning image from disk).
        goal: Optional (B, 3, H, W) uint8 goal frame; the ``goal`` reward uses ``reference[:, -1]`` when None.
    """

    frames: Tensor
    reference: Tensor | None
    goal: Tensor | None = None

    def __post_init__(self) -> None:
        _check_video(self.frames, "frames")
        if self.frames.shape[1] < 2:
            raise ValueError(f"frames need F >= 2 (frame 0 plus generated frames), got {tuple(self.frames.shape)}")
        if self.reference is not None:
            _check_video(self.reference, "reference")
            if self.reference.shape != self.frames.shape:
                raise ValueError(f"reference shape {tuple(self.reference.shape)} differs from frames shape "
                                 f"{tuple(self.frames.shape)}")
        if self.goal is not None:
            b, _, c, h, w = self.frames.shape
            if not isinstance(self.goal, Tensor) or tuple(self.goal.shape) != (b, c, h, w):
                shape = tuple(self.goal.shape) if isinstance(self.goal, Tensor) else type(self.goal).__name__
                raise ValueError(f"goal must be a (B, 3, H, W) = {(b, c, h, w)} tensor, got {shape}")
            if self.goal.dtype != torch.uint8:
                raise ValueError(f"goal must be uint8 in [0, 255], got {self.goal.dtype}")

    @property
    def batch_size(self) -> int:
        return int(self.frames.shape[0])


class VideoReward:
    """Base class of the rewards: ``name``, ``needs_reference`` and ``__call__(inputs) -> (B,)`` float32."""

    name: str = ""
    needs_reference: bool = True

    def missing(self, inputs: RewardInputs) -> str | None:
        """Why ``inputs`` cannot be scored (one line), or None when they can."""
        if self.needs_reference and inputs.reference is None:
            return f"reward {self.name!r} needs the simulator's reference video, but inputs.reference is None"
        return None

    def _require(self, inputs: RewardInputs) -> None:
        reason = self.missing(inputs)
        if reason is not None:
            raise ValueError(reason)

    def __call__(self, inputs: RewardInputs) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _capped_psnr(pred: Tensor, target: Tensor, min_mse: float) -> Tensor:
    """PSNR in dB of uint8 images read as x / 255, MSE floored at ``min_mse`` (in [0, 1] units)."""
    # data_range 255 on the raw integer values keeps the squared errors exact; the floor scales with range^2.
    return _psnr(pred.float(), target.float(), data_range=255.0, min_mse=min_mse * 255.0**2)


@REWARDS.register("psnr")
class PSNRReward(VideoReward):
    """Mean per-frame PSNR (dB) of the generated frames 1..F-1 against the reference."""

    name = "psnr"
    needs_reference = True

    def __init__(self, min_mse: float = 1e-10):
        if not min_mse > 0:
            raise ValueError(f"min_mse must be > 0 (it caps identical frames), got {min_mse}")
        self.min_mse = float(min_mse)

    def __call__(self, inputs: RewardInputs) -> Tensor:
        self._require(inputs)
        return _capped_psnr(inputs.frames[:, 1:], inputs.reference[:, 1:], self.min_mse).mean(1).float()


@REWARDS.register("feature")
class FeatureReward(VideoReward):
    """Minus the mean EfficientNet-Lite0 feature distance (1 - cosine) of frames 1..F-1 to the reference."""

    name = "feature"
    needs_reference = True

    def __init__(self, network: nn.Module | None = None, batch_size: int = 64):
        self.network = network
        self.batch_size = int(batch_size)

    def _net(self) -> nn.Module:
        if self.network is None:
            from core.metrics.features import load_feature_network

            self.network = load_feature_network()
        return self.network

    def __call__(self, inputs: RewardInputs) -> Tensor:
        from core.metrics.features import feature_distance

        self._require(inputs)
        d = feature_distance(inputs.frames[:, 1:], inputs.reference[:, 1:], self._net(), self.batch_size)
        return -d.mean(1).float().to(inputs.frames.device)


def track_centroids(video: Tensor, threshold: float = 0.1) -> tuple[Tensor, Tensor]:
    """Centroid of the pixels that changed since frame 0, in each frame f >= 1.

    Args:
        video: (B, F, 3, H, W) uint8, F >= 2.
        threshold: A pixel moves when ``max_c |x_f - x_0| / 255 > threshold``.

    Returns:
        ``centroids`` (B, F-1, 2) float32 (row, col) in pixel indices (NaN where the mask is empty) and
        ``present`` (B, F-1) bool, whether frame f's moving-pixel mask is non-empty.
    """
    _check_video(video, "video")
    if video.shape[1] < 2:
        raise ValueError(f"video needs F >= 2 frames, got {tuple(video.shape)}")
    h, w = video.shape[-2:]
    diff = (video[:, 1:].float() - video[:, :1].float()).abs().amax(dim=2)  # (B, F-1, H, W), integer values
    mask = (diff > threshold * 255.0).float()
    count = mask.sum(dim=(-2, -1))
    rows = torch.arange(h, device=video.device, dtype=torch.float32)
    cols = torch.arange(w, device=video.device, dtype=torch.float32)
    r = (mask.sum(-1) * rows).sum(-1)
    c = (mask.sum(-2) * cols).sum(-1)
    present = count > 0
    centroids = torch.stack([r, c], dim=-1) / count.unsqueeze(-1)  # 0 / 0 = NaN where empty
    return centroids, present


@REWARDS.register("trajectory")
class TrajectoryReward(VideoReward):
    """Minus the mean distance (fraction of the frame diagonal) between generated and reference centroids."""

    name = "trajectory"
    needs_reference = True

    def __init__(self, threshold: float = 0.1):
        if not 0 <= threshold < 1:
            raise ValueError(f"threshold must be in [0, 1), got {threshold}")
        self.threshold = float(threshold)

    def __call__(self, inputs: RewardInputs) -> Tensor:
        self._require(inputs)
        cg, pg = track_centroids(inputs.frames, self.threshold)
        cr, pr = track_centroids(inputs.reference, self.threshold)
        h, w = inputs.frames.shape[-2:]
        dist = (cg - cr).norm(dim=-1) / math.hypot(h, w)
        both = pg & pr
        err = torch.where(both, torch.nan_to_num(dist, nan=0.0), (pg ^ pr).float())
        return -err.mean(1)


@REWARDS.register("smoothness")
class SmoothnessReward(VideoReward):
    """Minus the mean squared second temporal difference of the whole clip (needs F >= 3)."""

    name = "smoothness"
    needs_reference = False

    def __call__(self, inputs: RewardInputs) -> Tensor:
        x = inputs.frames
        if x.shape[1] < 3:
            raise ValueError(f"smoothness needs F >= 3 frames, got {tuple(x.shape)}")
        x = x.float()  # integer values: the second difference is exact, 0 for linear-in-time pixels
        d2 = x[:, 2:] - 2 * x[:, 1:-1] + x[:, :-2]
        return -(d2.square().flatten(1).mean(1) / 255.0**2)


@REWARDS.register("goal")
class GoalReward(VideoReward):
    """PSNR (dB) of the last generated frame against the goal frame (inputs.goal, else reference[:, -1])."""

    name = "goal"
    needs_reference = True  # unless inputs.goal is given

    def __init__(self, min_mse: float = 1e-10):
        if not min_mse > 0:
            raise ValueError(f"min_mse must be > 0 (it caps identical frames), got {min_mse}")
        self.min_mse = float(min_mse)

    def missing(self, inputs: RewardInputs) -> str | None:
        if inputs.goal is None and inputs.reference is None:
            return "reward 'goal' needs inputs.goal or the simulator's reference video, but both are None"
        return None

    def __call__(self, inputs: RewardInputs) -> Tensor:
        self._require(inputs)
        goal = inputs.goal if inputs.goal is not None else inputs.reference[:, -1]
        return _capped_psnr(inputs.frames[:, -1], goal, self.min_mse).float()


@REWARDS.register("learned")
class LearnedReward(VideoReward):
    """A learned reward model: ``nn.Module`` float videos (B, F, 3, H, W) in [0, 1] -> (B,) or (B, 1) scores."""

    name = "learned"
    needs_reference = False

    def __init__(self, model: nn.Module, batch_size: int = 64):
        if not callable(model):
            raise ValueError(f"model must be an nn.Module (or callable), got {type(model).__name__}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.batch_size = int(batch_size)

    @classmethod
    def from_path(cls, path: str | os.PathLike, batch_size: int = 64,
                  map_location: str | torch.device | None = "cpu") -> LearnedReward:
        """Load a TorchScript reward model (``torch.jit.save`` of a scripted / traced module).

        Raises:
            DataError: The file is missing or is not a loadable TorchScript archive.
        """
        if not os.path.isfile(path):
            raise DataError(path, "no such TorchScript reward model file")
        try:
            with warnings.catch_warnings():  # torch 2.10+ marks TorchScript deprecated; it is the format here
                warnings.simplefilter("ignore", FutureWarning)
                model = torch.jit.load(str(path), map_location=map_location)
        except Exception as e:  # any archive / format failure means a bad file
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise DataError(path, f"cannot load as TorchScript ({type(e).__name__}: {first})") from None
        return cls(model, batch_size=batch_size)

    def _device(self, fallback: torch.device) -> torch.device:
        if isinstance(self.model, nn.Module):
            for t in (*self.model.parameters(), *self.model.buffers()):
                return t.device
        return fallback

    def __call__(self, inputs: RewardInputs) -> Tensor:
        frames = inputs.frames
        b = frames.shape[0]
        device = self._device(frames.device)
        was_training = getattr(self.model, "training", False)
        if isinstance(self.model, nn.Module):
            self.model.eval()
        outs = []
        try:
            with torch.no_grad():
                for i in range(0, b, self.batch_size):
                    chunk = frames[i : i + self.batch_size].to(device).float() / 255.0
                    out = self.model(chunk)
                    n = chunk.shape[0]
                    if not isinstance(out, Tensor) or tuple(out.shape) not in ((n,), (n, 1)):
                        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                        raise ValueError(f"learned reward model must return ({n},) or ({n}, 1) scores, got {shape}")
                    outs.append(out.reshape(n).float().to(frames.device))
        finally:
            if was_training and isinstance(self.model, nn.Module):
                self.model.train()
        return torch.cat(outs)


def build_reward(name: str, **kwargs: Any) -> VideoReward:
    """The reward registered as ``name`` built with ``kwargs``; an unknown name is a ``ConfigError``."""
    return REWARDS.build(name, **kwargs)


class CompositeReward:
    """A weighted sum of registered rewards: ``R = sum_k w_k R_k``.

    Args:
        weights: Reward name -> weight (finite; at least one).
        **per_reward_kwargs: Reward name -> dict of constructor arguments, e.g.
            ``CompositeReward({"learned": 1.0}, learned={"model": m})``.
    """

    def __init__(self, weights: dict[str, float], **per_reward_kwargs: dict[str, Any]):
        if not weights:
            raise ValueError("CompositeReward needs at least one reward weight, got none")
        for name, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise ValueError(f"reward weight for {name!r} must be a finite number, got {w!r}")
        extra = sorted(set(per_reward_kwargs) - set(weights))
        if extra:
            raise ValueError(f"kwargs given for rewards not in weights: {', '.join(extra)} "
                             f"(weights: {', '.join(weights)})")
        self.weights = {name: float(w) for name, w in weights.items()}
        self.terms: dict[str, VideoReward] = {
            name: build_reward(name, **dict(per_reward_kwargs.get(name, {}))) for name in self.weights}

    @property
    def needs_reference(self) -> bool:
        return any(t.needs_reference for t in self.terms.values())

    def __call__(self, inputs: RewardInputs) -> tuple[Tensor, dict[str, Tensor]]:
        """Returns the (B,) float32 weighted sum and each (B,) term, by name.

        Raises:
            ValueError: A term cannot be scored (e.g. it needs the reference and there is none), returns the
                wrong shape, or is non-finite (NaN / inf).
        """
        for term in self.terms.values():
            reason = term.missing(inputs)
            if reason is not None:
                raise ValueError(reason)
        b = inputs.batch_size
        values: dict[str, Tensor] = {}
        total = torch.zeros(b, dtype=torch.float32, device=inputs.frames.device)
        for name, term in self.terms.items():
            v = term(inputs)
            if tuple(v.shape) != (b,):
                raise ValueError(f"reward {name!r} returned shape {tuple(v.shape)}, expected ({b},)")
            v = v.float().to(total.device)
            if not torch.isfinite(v).all():
                bad = int((~torch.isfinite(v)).sum())
                raise ValueError(f"reward {name!r} is non-finite (NaN / inf) for {bad} of {b} samples")
            values[name] = v
            total = total + self.weights[name] * v
        return total, values

    def __repr__(self) -> str:
        return f"CompositeReward({self.weights})"
