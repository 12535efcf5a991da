"""VBench's ``temporal_flickering``, computed offline on our frames (no download: the dimension needs no network).

VBench (Huang et al., CVPR 2024; ``vbench/temporal_flickering.py``) reads a video's frames as uint8 and scores
``(255 - mean_t MAE(frame_t, frame_t+1)) / 255``, where ``MAE`` is the mean absolute difference over every pixel
and channel (``cv2.absdiff`` on float32 frames); the dimension is the mean over videos (1 = perfectly static).
Re-implemented here from that definition. Deviation: VBench decodes mp4 files (lossy) and scores only videos of
its static-scene prompts; here the uint8 frames are scored as generated, for any clip, so the number is a
frame-to-frame stability measure comparable between our arms and against the ground-truth clips, not with
VBench's published table.
"""

from __future__ import annotations

import torch

__all__ = ["temporal_flickering"]


def temporal_flickering(video: torch.Tensor) -> torch.Tensor:
    """(B, T, C, H, W) uint8 frames (T >= 2) -> (B,) float64 scores ``(255 - mean |x[t+1] - x[t]|) / 255``."""
    if video.ndim != 5 or video.shape[1] < 2:
        raise ValueError(f"video must be (B, T >= 2, C, H, W), got {tuple(video.shape)}")
    if video.dtype != torch.uint8:
        raise ValueError(f"VBench scores uint8 frames (0..255), got {video.dtype}")
    x = video.to(torch.float32)
    mae = (x[:, 1:] - x[:, :-1]).abs().flatten(2).mean(2)  # (B, T - 1): one MAE per consecutive pair
    return (255.0 - mae.double().mean(1)) / 255.0
