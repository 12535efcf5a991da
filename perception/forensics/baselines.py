"""Two non-VLM baselines of AI-generated-image detection: a spectrum CNN and a frozen-feature linear probe.

``FrequencyCNN`` follows the spectrum-input detectors of Zhang et al. ("Detecting and Simulating Artifacts in
GAN Fake Images", WIFS 2019, AutoGAN) and Frank et al. ("Leveraging Frequency Analysis for Deep Fake Image
Recognition", ICML 2020): the classifier sees only the log-magnitude of the 2-D Fourier spectrum, so it can
use up-sampling / periodic traces but not image content. Deviations: a 4-block conv-bn-relu CNN (not a
ResNet); an optional 3 x 3 high-pass (image minus its box blur) before the FFT, which suppresses the 1/f
content spectrum; a per-image standardised log-magnitude; a fixed radial-frequency channel appended to the
spectrum (the CNN is otherwise nearly translation-invariant, and in a spectrum the position IS the
frequency); mean + max global pooling. Augmentation: random horizontal flips only (no JPEG, blur or resize,
which would change the very trace being learned).

``FrozenFeatureProbe`` is the recipe of UniversalFakeDetect (Ojha et al., "Towards Universal Fake Image
Detectors that Generalize Across Generative Models", CVPR 2023): logistic regression on frozen features of
a pretrained network. Deviation: the network is the ImageNet EfficientNet-Lite0 of
``core.metrics.features`` (pooled 1280-d features, inputs resized to 224 x 224), not CLIP ViT-L/14, and the
features are L2-normalised (then scaled by sqrt(1280) so each coordinate is O(1)).

Both share one interface (``BaselineDetector``): ``fit(images, labels, *, seed, epochs, batch_size, lr)``
returns a training log; ``predict_proba(images)`` gives (N,) float64 probabilities of "fake"; ``save`` /
``load`` write / read a folder with ``model.safetensors`` and ``config.json`` (atomically). ``images`` are
(N, S, S, 3) uint8 RGB numpy arrays, ``labels`` (N,) int with 1 = fake (AI) and 0 = real. ``fit`` first
re-initialises the trainable weights from ``seed``, so equal seeds give equal models (on one device).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.checkpoint import load_into, load_weights, save_weights
from core.errors import CheckpointError
from core.io import atomic_dir, read_json, write_json

__all__ = [
    "BASELINES",
    "BaselineDetector",
    "FrequencyCNN",
    "FrozenFeatureProbe",
    "load_baseline",
    "log_spectrum",
]

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def _images_to_tensor(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(N, H, W, 3) uint8 RGB -> (N, 3, H, W) uint8 CPU tensor (a view where possible)."""
    x = torch.as_tensor(images)
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"images must be (N, H, W, 3) uint8, got {tuple(x.shape)} {x.dtype}")
    return x.permute(0, 3, 1, 2)


def _labels_to_tensor(labels: np.ndarray | torch.Tensor, n: int) -> torch.Tensor:
    y = torch.as_tensor(np.asarray(labels)).reshape(-1)
    if y.numel() != n:
        raise ValueError(f"labels has {y.numel()} entries, images {n}")
    if not bool(((y == 0) | (y == 1)).all()):
        raise ValueError("labels must be 0 (real) or 1 (fake)")
    return y.float()


class BaselineDetector(nn.Module):
    """Binary real / fake detector with a shared training loop, probabilities and save / load.

    A subclass defines ``name``, ``config()`` (its constructor kwargs, JSON-able), ``default_fit`` and three
    hooks: ``encode`` (uint8 images -> the tensor the trainable part sees, computed once per ``fit``),
    ``augment`` (training-time augmentation of an encoded batch) and ``head`` (encoded batch -> (B,) logits).
    """

    name: ClassVar[str]
    default_fit: ClassVar[dict[str, Any]]

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        missing = [a for a in ("name", "default_fit") if a not in cls.__dict__]
        if missing:
            raise TypeError(f"{cls.__name__} must define {', '.join(missing)}")

    # -- subclass hooks -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this detector (recorded in ``config.json``)."""
        raise NotImplementedError

    @classmethod
    def tiny(cls) -> BaselineDetector:
        """A small instance for tests."""
        return cls()

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) uint8 CPU -> (N, ...) tensor on ``self.device`` that ``head`` takes."""
        raise NotImplementedError

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Training augmentation of an encoded batch (none by default)."""
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Encoded batch -> (B,) float32 logits of "fake"."""
        raise NotImplementedError

    # -- shared machinery -----------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def reset_parameters(self) -> None:
        """Re-initialise every trainable submodule (BatchNorm statistics included) from torch's global RNG."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.reset_running_stats()

    def _batches(self, x: torch.Tensor, batch_size: int) -> Iterator[torch.Tensor]:
        for i in range(0, len(x), batch_size):
            yield x[i : i + batch_size]

    def fit(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        seed: int = 0,
        epochs: int | None = None,
        batch_size: int | None = None,
        lr: float | None = None,
        weight_decay: float | None = None,
    ) -> dict[str, Any]:
        """Train from scratch (weights re-initialised from ``seed``) with AdamW on the binary cross-entropy.

        Args:
            images: (N, S, S, 3) uint8 RGB.
            labels: (N,) int, 1 = fake, 0 = real.
            seed: Seeds the initialisation (``torch.manual_seed`` inside a forked RNG, so the caller's
                global RNG is untouched) and a ``torch.Generator`` for shuffling and augmentation.
            epochs, batch_size, lr, weight_decay: ``None`` takes the class's ``default_fit`` value.

        Returns:
            The training log: the hyper-parameters, ``n``, ``steps``, ``seconds`` (encoding included),
            ``encode_seconds`` and per-epoch ``loss`` / ``train_acc`` (running, on augmented batches).
        """
        hp = dict(self.default_fit)
        for k, v in (("epochs", epochs), ("batch_size", batch_size), ("lr", lr), ("weight_decay", weight_decay)):
            if v is not None:
                hp[k] = v
        if hp["epochs"] < 1 or hp["batch_size"] < 1 or hp["lr"] <= 0:
            raise ValueError(f"fit: need epochs >= 1, batch_size >= 1, lr > 0, got {hp}")
        x_u8 = _images_to_tensor(images)
        y = _labels_to_tensor(labels, len(x_u8)).to(self.device)
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.reset_parameters()
        x = self.encode(x_u8)
        encode_s = time.perf_counter() - t0
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(
            [p for p in self.parameters() if p.requires_grad], lr=hp["lr"], weight_decay=hp["weight_decay"]
        )
        log: dict[str, Any] = {"baseline": self.name, "seed": seed, "n": len(y), **hp, "loss": [], "train_acc": []}
        steps = 0
        self.train()
        for _ in range(hp["epochs"]):
            order = torch.randperm(len(y), generator=gen).to(self.device)
            total, correct, seen = 0.0, 0, 0
            for idx in self._batches(order, hp["batch_size"]):
                if len(idx) < 2 and len(y) >= 2:  # a batch of one breaks BatchNorm; skip the remainder
                    continue
                xb = self.augment(x[idx], gen)
                logits = self.head(xb)
                loss = F.binary_cross_entropy_with_logits(logits, y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
                total += float(loss.detach()) * len(idx)
                correct += int(((logits > 0).float() == y[idx]).sum())
                seen += len(idx)
            log["loss"].append(total / max(seen, 1))
            log["train_acc"].append(correct / max(seen, 1))
        self.eval()
        log.update(steps=steps, encode_seconds=encode_s, seconds=time.perf_counter() - t0)
        self._fit_log = {k: v for k, v in log.items() if k not in ("loss", "train_acc")}
        return log

    @torch.no_grad()
    def predict_logits(self, images: np.ndarray, batch_size: int = 256) -> torch.Tensor:
        """(N, S, S, 3) uint8 -> (N,) float32 logits of "fake" on CPU (eval mode)."""
        was = self.training
        self.eval()
        x_u8 = _images_to_tensor(images)
        out = [self.head(self.encode(xb)).cpu() for xb in self._batches(x_u8, batch_size)]
        self.train(was)
        return torch.cat(out) if out else torch.zeros(0)

    def predict_proba(self, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """(N, S, S, 3) uint8 -> (N,) float64 probability of "fake" in [0, 1]."""
        return torch.sigmoid(self.predict_logits(images, batch_size).double()).numpy()

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/model.safetensors`` (trainable state) and ``folder/config.json``, atomically."""
        folder = Path(folder)
        meta = {"baseline": self.name, "config": self.config(), "fit": getattr(self, "_fit_log", None)}
        with atomic_dir(folder) as tmp:
            save_weights(self.state_dict(), tmp / WEIGHTS_FILE, metadata={"baseline": self.name})
            write_json(tmp / CONFIG_FILE, meta)
        return folder

    @classmethod
    def load(cls, folder: str | Path, device: str | torch.device = "cpu") -> BaselineDetector:
        """Rebuild a detector saved by ``save`` (every key and shape checked), in eval mode on ``device``.

        Called on ``BaselineDetector`` it dispatches on the recorded name; on a subclass the name must match.
        """
        folder = Path(folder)
        meta = read_json(folder / CONFIG_FILE)
        name = meta.get("baseline")
        if name not in BASELINES:
            raise CheckpointError(f"{folder}: unknown baseline {name!r} (known: {', '.join(BASELINES)})")
        klass = BASELINES[name]
        if cls is not BaselineDetector and klass is not cls:
            raise CheckpointError(f"{folder}: holds a {name!r} baseline, not {cls.name!r}")
        model = klass(**meta["config"])
        load_into(model, load_weights(folder / WEIGHTS_FILE), source=str(folder / WEIGHTS_FILE))
        if meta.get("fit") is not None:
            model._fit_log = meta["fit"]
        return model.to(device).eval()


# ------------------------------------------------------------------------------------------------
# Spectrum CNN


def log_spectrum(images: torch.Tensor, grey: bool = True, highpass: bool = True) -> torch.Tensor:
    """The spectrum input: (B, 3, S, S) float in [0, 1] -> (B, C, S, S) float32, C = 1 (grey) or 3.

    Luminance (ITU-R BT.601 weights) or each RGB channel, optionally minus its 3 x 3 box blur (reflect
    padding), then ``log(|FFT2| + 1e-3)`` with orthonormal scaling, ``fftshift``-ed (zero frequency at
    (S // 2, S // 2)), and standardised per image to zero mean and unit variance over (C, S, S).
    """
    x = images.float()
    if grey:
        w = x.new_tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
        x = (x * w).sum(1, keepdim=True)
    if highpass:
        x = x - F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), 3, stride=1)
    mag = torch.log(torch.fft.fft2(x, norm="ortho").abs() + 1e-3)
    mag = torch.fft.fftshift(mag, dim=(-2, -1))
    mean = mag.mean(dim=(1, 2, 3), keepdim=True)
    std = mag.std(dim=(1, 2, 3), keepdim=True)
    return (mag - mean) / (std + 1e-6)


def _radius(h: int, w: int, device: torch.device) -> torch.Tensor:
    """(1, 1, H, W) radial frequency of the fftshift-ed grid, 0 at DC and 1 at the (Nyquist, Nyquist) corner."""
    fy = torch.fft.fftshift(torch.fft.fftfreq(h, device=device))
    fx = torch.fft.fftshift(torch.fft.fftfreq(w, device=device))
    r = torch.sqrt(fy[:, None] ** 2 + fx[None, :] ** 2) / math.sqrt(0.5)
    return r[None, None]


class FrequencyCNN(BaselineDetector):
    """Spectrum-only detector: ``log_spectrum`` + radius channel -> 4 x (conv3x3-BN-ReLU) -> mean+max pool -> linear.

    Widths ``(width, 2 width, 4 width, 4 width)``, strides ``(1, 2, 2, 2)``; about 0.24 M parameters at
    ``width=32``. ``forward`` takes (B, 3, S, S) float images in [0, 1] (any S >= 8) and returns (B,) logits.
    """

    name = "freq_cnn"
    default_fit: ClassVar[dict[str, Any]] = {"epochs": 10, "batch_size": 64, "lr": 1e-3, "weight_decay": 1e-4}

    def __init__(self, width: int = 32, grey: bool = True, highpass: bool = True, flip: bool = True):
        super().__init__()
        if width < 1:
            raise ValueError(f"FrequencyCNN: width must be >= 1, got {width}")
        self.width, self.grey, self.highpass, self.flip = width, grey, highpass, flip
        chans = [(1 if grey else 3) + 1, width, 2 * width, 4 * width, 4 * width]
        layers: list[nn.Module] = []
        for i, stride in enumerate((1, 2, 2, 2)):
            layers += [
                nn.Conv2d(chans[i], chans[i + 1], 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(chans[i + 1]),
                nn.ReLU(inplace=True),
            ]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(2 * chans[-1], 1)

    def config(self) -> dict[str, Any]:
        return {"width": self.width, "grey": self.grey, "highpass": self.highpass, "flip": self.flip}

    @classmethod
    def tiny(cls) -> FrequencyCNN:
        return cls(width=8)

    def spectrum(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) float in [0, 1] -> (B, C + 1, S, S): ``log_spectrum`` and the radius channel."""
        s = log_spectrum(images, self.grey, self.highpass)
        r = _radius(*s.shape[-2:], s.device).expand(len(s), 1, -1, -1)
        return torch.cat([s, r], 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) float in [0, 1] -> (B,) float32 logits of "fake"."""
        h = self.body(self.spectrum(images))  # (B, 4 width, S / 8, S / 8)
        h = torch.cat([h.mean(dim=(2, 3)), h.amax(dim=(2, 3))], 1)  # (B, 8 width)
        return self.fc(h).squeeze(1)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.device)  # stays uint8 (N, 3, S, S); converted per batch in ``head``

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if not self.flip:
            return x
        flip = (torch.rand(len(x), generator=generator) < 0.5).to(x.device)
        return torch.where(flip[:, None, None, None], x.flip(-1), x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self(x.float() / 255.0)


# ------------------------------------------------------------------------------------------------
# Linear probe on frozen ImageNet features


class FrozenFeatureProbe(BaselineDetector):
    """Logistic regression on frozen, L2-normalised EfficientNet-Lite0 features (UniversalFakeDetect's recipe).

    Only ``linear`` (1280 -> 1) is trainable and saved; the network is the shared cached
    ``core.metrics.features.load_feature_network(device)`` (never a submodule, never updated). ``forward``
    takes (B, 3, H, W) uint8 or float images in [0, 1] (resized to 224 x 224) and returns (B,) logits.
    """

    name = "feature_probe"
    default_fit: ClassVar[dict[str, Any]] = {"epochs": 100, "batch_size": 64, "lr": 1e-2, "weight_decay": 1e-4}

    def __init__(self, feature_batch_size: int = 64):
        super().__init__()
        from core.metrics.features import FEATURE_DIM

        self.feature_batch_size = feature_batch_size
        self.linear = nn.Linear(FEATURE_DIM, 1)

    def config(self) -> dict[str, Any]:
        return {"feature_batch_size": self.feature_batch_size}

    @property
    def network(self) -> nn.Module:
        """The frozen feature network on this probe's device."""
        from core.metrics.features import load_feature_network

        return load_feature_network(self.device)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) uint8 or float in [0, 1] -> (B, 1280) float32, L2-normalised then times sqrt(1280)."""
        f = self.network.features(images, batch_size=self.feature_batch_size)
        return F.normalize(f, dim=1) * math.sqrt(f.shape[1])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) images -> (B,) float32 logits of "fake"."""
        return self.head(self.features(images))

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).squeeze(1)


#: name -> detector class; ``BASELINES[name](**config)`` builds one, ``.tiny()`` a small one for tests.
BASELINES: dict[str, type[BaselineDetector]] = {
    FrequencyCNN.name: FrequencyCNN,
    FrozenFeatureProbe.name: FrozenFeatureProbe,
}


def load_baseline(folder: str | Path, device: str | torch.device = "cpu") -> BaselineDetector:
    """Load any saved baseline, dispatching on the name in its ``config.json``."""
    return BaselineDetector.load(folder, device)
