"""The shared data layer: datasets in the formats each field already uses, samplers, a device loader.

Importing ``core.data`` is light (no torch, h5py or cv2); the names below load their module on first
access. Datasets are registered by name in ``core.registry.DATASETS`` as lazy string targets.

Modules:
    trajectories   robomimic / LIBERO HDF5: ``TrajectoryWriter``, ``TrajectoryFile``, ``TrajectoryDataset``
    hdf5           the HDF5 reader alone (``TrajectoryFile``, no torch), shared by trajectories and lerobot
    images         dense-label image folders ("embodied-dense", ClearGrasp): ``DenseImageDataset``,
                   ``ClearGraspDataset``, ``write_dense_sample``, ``write_meta``
    panoramas      equirectangular RGB / depth / semantics: ``EquirectDataset``, ``Stanford2D3DDataset``,
                   pixel <-> direction helpers
    video          mp4 / frame-folder clips: ``VideoClipDataset``, ``write_mp4``
    samplers       ``build_sampler``, ``build_loader``, ``seed_worker``, ``GroupedBatchSampler``
    device         ``DeviceLoader`` and the device-side transforms
"""

from __future__ import annotations

import importlib
from typing import Any

from core.registry import DATASETS

_EXPORTS: dict[str, str] = {
    "TrajectoryWriter": "trajectories",
    "TrajectoryFile": "hdf5",
    "TrajectoryDataset": "trajectories",
    "EpisodeInfo": "trajectories",
    "DenseImageDataset": "images",
    "ClearGraspDataset": "images",
    "write_dense_sample": "images",
    "write_meta": "images",
    "read_normals": "images",
    "read_depth": "images",
    "EquirectDataset": "panoramas",
    "Stanford2D3DDataset": "panoramas",
    "equirect_to_direction": "panoramas",
    "direction_to_equirect": "panoramas",
    "equirect_directions": "panoramas",
    "VideoClipDataset": "video",
    "write_mp4": "video",
    "read_frames": "video",
    "build_sampler": "samplers",
    "build_loader": "samplers",
    "seed_worker": "samplers",
    "GroupedBatchSampler": "samplers",
    "ResumableDistributedSampler": "samplers",
    "DeviceLoader": "device",
    "RandomCrop": "device",
    "RandomHorizontalFlip": "device",
    "Normalize": "device",
}

# Dataset name -> lazy "module:attr" target, registered in core.registry.DATASETS.
DATASET_TARGETS: dict[str, str] = {
    "trajectories": "core.data.trajectories:TrajectoryDataset",
    "dense_images": "core.data.images:DenseImageDataset",
    "cleargrasp": "core.data.images:ClearGraspDataset",
    "equirect": "core.data.panoramas:EquirectDataset",
    "stanford2d3d": "core.data.panoramas:Stanford2D3DDataset",
    "video_clips": "core.data.video:VideoClipDataset",
}
for _name, _target in DATASET_TARGETS.items():
    if _name not in DATASETS:
        DATASETS.register(_name, _target)

__all__ = sorted([*_EXPORTS, "DATASET_TARGETS"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'core.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"core.data.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
