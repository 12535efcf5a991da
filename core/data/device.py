"""Device loader: prefetching host->device copies plus device-side normalisation and augmentation.

``DeviceLoader`` wraps a ``DataLoader`` whose batches are (nested) dicts / lists of tensors. On CUDA it
keeps ``prefetch`` batches in flight: each is pinned (if the DataLoader did not already pin it) and
copied with ``non_blocking=True`` on a side stream; before a batch is handed out the compute stream
waits on that copy's event and every copied tensor is ``record_stream``-ed on the compute stream, so the
caching allocator never recycles its memory while compute still reads it. Transforms then run on the
compute stream. On CPU the same code runs without pinning or streams and yields identical values.

Augmentation randomness: batch number ``step`` (counted over the loader's whole life, across epochs)
draws its parameters from a CPU ``torch.Generator`` seeded by ``(seed, step)``. A resumed run calls
``set_step(global_step)`` (or ``load_state_dict``) and sees exactly the augmentations the interrupted
run would have; parameters are drawn on the CPU, so CPU and GPU runs augment identically.

Transforms (applied in order, each ``transform(batch, generator) -> batch``):
    ``RandomCrop(size)``          same random window for every spatial key of a sample
    ``RandomHorizontalFlip(...)`` flips every spatial key of the chosen samples; normal maps (channel
                                  dim -3, OpenCV camera frame) get their x component negated; actions get
                                  their lateral dims negated
    ``Normalize(mean, std)``      uint8 images -> float32 in [0, 1] -> (x - mean) / std per channel
Spatial keys are tensors of rank >= 3, shaped (B, ..., H, W), whose last two dims match the first image
key's (H, W) — or the keys named explicitly. Keys starting with ``action`` are never spatial.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["DeviceLoader", "Normalize", "RandomCrop", "RandomHorizontalFlip", "augment_seed", "to_device"]


class BatchTransform(Protocol):
    """A device-side batch transform drawing all randomness from ``generator`` (CPU)."""

    def __call__(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]: ...


def augment_seed(seed: int, step: int) -> int:
    """The 63-bit generator seed of batch ``step`` for base ``seed`` (stable across processes)."""
    words = [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, step]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0]) >> 1


def _map(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, fn) for v in obj)
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """Move every tensor of a nested batch to ``device``."""
    return _map(batch, lambda t: t.to(device, non_blocking=non_blocking))


# ---------------------------------------------------------------------------------------- transforms
def _image_keys(batch: Mapping[str, Any]) -> list[str]:
    return [
        k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.ndim >= 4
    ]


def _spatial_keys(
    batch: Mapping[str, Any], keys: Sequence[str] | None
) -> tuple[list[str], tuple[int, int] | None]:
    if keys is not None:
        ks = [k for k in keys if k in batch]
        return ks, (tuple(batch[ks[0]].shape[-2:]) if ks else None)
    images = _image_keys(batch)
    if not images:
        return [], None
    hw = tuple(batch[images[0]].shape[-2:])
    ks = [
        k for k, v in batch.items()
        if isinstance(v, torch.Tensor) and v.ndim >= 3 and tuple(v.shape[-2:]) == hw and not k.startswith("action")
    ]  # fmt: skip
    return ks, hw


class RandomCrop:
    """Crop every spatial key to ``size`` at one random offset per sample (shared by all keys).

    Args:
        size: Output (h, w) in pixels.
        keys: Spatial keys to crop; auto-detected when None (module docstring).
    """

    def __init__(self, size: int | tuple[int, int], keys: Sequence[str] | None = None):
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.keys = keys

    def __call__(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        """The batch with its spatial keys cropped (offsets drawn from ``generator``)."""
        keys, hw = _spatial_keys(batch, self.keys)
        if not keys:
            return batch
        H, W = hw
        h, w = self.size
        if h > H or w > W:
            raise ValueError(f"crop {self.size} larger than the images ({H}, {W})")
        B = batch[keys[0]].shape[0]
        y0 = torch.randint(0, H - h + 1, (B,), generator=generator)
        x0 = torch.randint(0, W - w + 1, (B,), generator=generator)
        ys, xs = y0.tolist(), x0.tolist()
        out = dict(batch)
        for k in keys:
            v = batch[k]  # (B, ..., H, W): B strided views, one copy
            out[k] = torch.stack([v[b, ..., y : y + h, x : x + w] for b, (y, x) in enumerate(zip(ys, xs))])
        return out


class RandomHorizontalFlip:
    """Mirror chosen samples left-right, consistently across spatial keys, normals and actions.

    Args:
        p: Probability that a sample is flipped.
        keys: Spatial keys; auto-detected when None.
        normal_keys: Keys holding normal maps (B, [T,] 3, H, W) in a camera frame with x to the right
            (OpenCV): their x component (channel 0) is negated on flipped samples.
        action_keys: Keys holding actions (B, [T,] A).
        lateral_dims: Action dims that change sign under a left-right mirror (e.g. the lateral
            translation and the yaw / roll rates of an end-effector delta, or steering).
    """

    def __init__(
        self,
        p: float = 0.5,
        keys: Sequence[str] | None = None,
        normal_keys: Sequence[str] = ("normals",),
        action_keys: Sequence[str] = ("actions",),
        lateral_dims: Sequence[int] = (),
    ):
        self.p, self.keys = p, keys
        self.normal_keys, self.action_keys, self.lateral_dims = (
            tuple(normal_keys),
            tuple(action_keys),
            list(lateral_dims),
        )

    def __call__(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        """The batch with each sample flipped with probability ``p`` (draws from ``generator``)."""
        keys, _ = _spatial_keys(batch, self.keys)
        ref = next((batch[k] for k in (*keys, *self.action_keys) if k in batch), None)
        if ref is None:
            return batch
        B = ref.shape[0]
        flip_cpu = torch.rand(B, generator=generator) < self.p
        out = dict(batch)
        for k in keys:
            v = batch[k]
            f = flip_cpu.to(v.device).view(B, *([1] * (v.ndim - 1)))
            flipped = v.flip(-1)
            if k in self.normal_keys:
                sign = torch.ones(v.shape[-3], 1, 1, dtype=v.dtype, device=v.device)
                sign[0] = -1
                flipped = flipped * sign
            out[k] = torch.where(f, flipped, v)
        if self.lateral_dims:
            for k in self.action_keys:
                if k not in batch:
                    continue
                a = batch[k]
                sign = torch.ones(a.shape[-1], dtype=a.dtype, device=a.device)
                sign[self.lateral_dims] = -1
                f = flip_cpu.to(a.device).view(B, *([1] * (a.ndim - 1)))
                out[k] = torch.where(f, a * sign, a)
        return out


class Normalize:
    """uint8 images -> float32: ``(x / 255 - mean) / std`` per channel (channel dim -3).

    Args:
        mean: Per-channel means of the [0, 1] images.
        std: Per-channel standard deviations.
        keys: Image keys; every uint8 tensor of rank >= 4 with ``len(mean)`` channels when None.
    """

    def __init__(self, mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5),
                 keys: Sequence[str] | None = None):  # fmt: skip
        if len(mean) != len(std):
            raise ValueError("mean and std must have the same length")
        self.mean, self.std, self.keys = list(mean), list(std), keys

    def __call__(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        """The batch with its image keys normalised (``generator`` is unused: the transform is deterministic)."""
        keys = self.keys if self.keys is not None else [
            k for k in _image_keys(batch) if batch[k].shape[-3] == len(self.mean)
        ]  # fmt: skip
        out = dict(batch)
        for k in keys:
            v = batch[k]
            mean = torch.tensor(self.mean, dtype=torch.float32, device=v.device).view(-1, 1, 1)
            std = torch.tensor(self.std, dtype=torch.float32, device=v.device).view(-1, 1, 1)
            x = v.float() / 255.0 if v.dtype == torch.uint8 else v.float()
            out[k] = (x - mean) / std
        return out


# ------------------------------------------------------------------------------------------- loader
class DeviceLoader:
    """Iterate a ``DataLoader`` with batches prefetched onto ``device`` and transformed there.

    Args:
        loader: Any iterable of (nested) tensor batches, usually a ``DataLoader`` (ideally built with
            ``pin_memory=True`` on CUDA, as ``core.data.samplers.build_loader`` does).
        device: Target device; CUDA if available when None.
        prefetch: Batches kept in flight ahead of the one being consumed (>= 1; 2 hides one batch's
            copy behind the previous batch's compute with slack for jitter).
        transforms: Device-side ``BatchTransform``s applied in order.
        seed: Base seed of the augmentation generator.
        step: Number of batches already consumed (the global step; see ``set_step``).
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: torch.device | str | None = None,
        prefetch: int = 2,
        transforms: Sequence[BatchTransform] | BatchTransform | None = None,
        seed: int = 0,
        step: int = 0,
    ):
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.loader = loader
        self.device = torch.device(
            device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        )
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.prefetch = prefetch
        if transforms is None:
            transforms = []
        elif callable(transforms):
            transforms = [transforms]
        self.transforms = list(transforms)
        self.seed = int(seed)
        self.step = int(step)
        self._stream: torch.cuda.Stream | None = None

    # -- state
    def set_step(self, step: int) -> None:
        """Set how many batches have been consumed; the next batch is augmented as batch ``step``."""
        self.step = int(step)

    def state_dict(self) -> dict[str, int]:
        """``{"seed", "step"}``; store it in the checkpoint together with the sampler's state."""
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore ``state_dict()``."""
        self.seed, self.step = int(state["seed"]), int(state["step"])

    def set_epoch(self, epoch: int) -> None:
        """Forward ``set_epoch`` to the wrapped loader's sampler / batch sampler when they have one."""
        for obj in (getattr(self.loader, "sampler", None), getattr(self.loader, "batch_sampler", None)):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    # -- iteration
    def _transform(self, batch: Any) -> Any:
        if not self.transforms:
            return batch
        if not isinstance(batch, dict):
            raise TypeError(f"transforms need dict batches, got {type(batch).__name__}")
        g = torch.Generator().manual_seed(augment_seed(self.seed, self.step))
        for t in self.transforms:
            batch = t(batch, g)
        return batch

    def _copy_async(self, batch: Any) -> tuple[Any, torch.cuda.Event]:
        assert self._stream is not None
        batch = _map(batch, lambda t: t.pin_memory() if t.device.type == "cpu" and not t.is_pinned() else t)
        with torch.cuda.stream(self._stream):
            out = _map(batch, lambda t: t.to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(self._stream)
        return out, event

    def __iter__(self) -> Iterator[Any]:
        if self.device.type != "cuda":
            for batch in self.loader:
                out = self._transform(to_device(batch, self.device))
                self.step += 1
                yield out
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        it = iter(self.loader)
        queue: deque[tuple[Any, torch.cuda.Event]] = deque()

        def fill() -> None:
            while len(queue) < self.prefetch:
                try:
                    queue.append(self._copy_async(next(it)))
                except StopIteration:
                    return

        fill()
        while queue:
            batch, event = queue.popleft()
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(event)
            for t in _tensors(batch):
                t.record_stream(compute)
            fill()  # queue the next copies before this batch's compute is issued
            out = self._transform(batch)
            self.step += 1
            yield out
