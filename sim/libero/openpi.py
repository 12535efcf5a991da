"""openpi's LIBERO example observation, both ways: ``LiberoEnv`` -> request (the client) and back (the server).

openpi's ``examples/libero/main.py`` sends, at every replanning step::

    img = np.ascontiguousarray(obs["agentview_image"][::-1, ::-1])          # "rotate 180 degrees"
    wrist_img = np.ascontiguousarray(obs["robot0_eye_in_hand_image"][::-1, ::-1])
    {"observation/image": image_tools.resize_with_pad(img, 224, 224),
     "observation/wrist_image": image_tools.resize_with_pad(wrist_img, 224, 224),
     "observation/state": np.concatenate((obs["robot0_eef_pos"], _quat2axisangle(obs["robot0_eef_quat"]),
                                          obs["robot0_gripper_qpos"])),
     "prompt": str(task_description)}

``LiberoEnv`` gives the images already rotated that way (``IMAGE_CONVENTION = "rot180"``) and ``proprio[0:8]`` is
that state (robosuite's ``quat2axisangle``), so ``openpi_observation`` only resizes and renames; the state is sent
as float32 (openpi's is float64). ``env_observation`` is the way back for a server that runs a ``LiberoEnv``
policy behind openpi's protocol: the 224 x 224 images are resized to the side the policy was trained at with
OpenCV's ``INTER_AREA`` (an area average when shrinking; when enlarging OpenCV falls back to bilinear), and the
arm's joint positions, which openpi's state does not carry, are zeros: a server refuses a policy that reads them
(``PROPRIO_KEYS_SENT``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from core.errors import ConfigError
from sim.libero.env import PROPRIO_DIM

__all__ = ["OPENPI_IMAGE_SIZE", "OPENPI_LIBERO_SPEC", "PROPRIO_KEYS_SENT", "STATE_DIM", "env_observation",
           "openpi_observation", "resize_with_pad"]

OPENPI_IMAGE_SIZE = 224
"""Side of the square images in openpi's LIBERO observation, pixels."""
STATE_DIM = 8
"""``observation/state``: end-effector position (3, m), axis-angle (3, rad), gripper finger joints (2, m)."""
OPENPI_LIBERO_SPEC: dict[str, tuple[tuple[int, ...], str]] = {
    "observation/image": ((OPENPI_IMAGE_SIZE, OPENPI_IMAGE_SIZE, 3), "uint8"),
    "observation/wrist_image": ((OPENPI_IMAGE_SIZE, OPENPI_IMAGE_SIZE, 3), "uint8"),
    "observation/state": ((STATE_DIM,), "float32"),
    "prompt": ((), "str"),
}
"""Key -> (shape, dtype name) of openpi's LIBERO observation (``"str"``: text); the wrist image only when the env
renders it."""
PROPRIO_KEYS_SENT: tuple[str, ...] = ("ee_pos", "ee_ori", "ee_states", "gripper_states")
"""The ``LiberoEnv`` proprio keys (``PROPRIO_LAYOUT`` names, LIBERO's demo keys) that openpi's state carries;
``joint_states`` is not among them."""


def resize_with_pad(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """Images (..., H, W, 3) uint8 resized to (..., height, width, 3) keeping their aspect ratio, zero-padded.

    Bit-identical to ``openpi_client.image_tools.resize_with_pad`` (which replicates TensorFlow's
    ``resize_with_pad`` with PIL): scale by ``1 / max(W / width, H / height)``, sides truncated to integers, PIL's
    bilinear filter, the result pasted at the centre of a black image (offsets truncated). Images already
    ``height`` x ``width`` come back as they are (the same array).
    """
    images = np.asarray(images)
    if images.shape[-3:-1] == (height, width):
        return images
    flat = images.reshape(-1, *images.shape[-3:])
    out = np.stack([_resize_with_pad_one(im, height, width) for im in flat])
    return out.reshape(*images.shape[:-3], *out.shape[-3:])


def _resize_with_pad_one(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """One (H, W, 3) uint8 image (see ``resize_with_pad``)."""
    from PIL import Image

    cur_height, cur_width = image.shape[:2]
    ratio = max(cur_width / width, cur_height / height)
    new_height, new_width = int(cur_height / ratio), int(cur_width / ratio)
    resized = np.asarray(Image.fromarray(np.ascontiguousarray(image)).resize((new_width, new_height),
                                                                            resample=Image.BILINEAR))
    out = np.zeros((height, width, image.shape[2]), dtype=resized.dtype)
    top, left = max(0, int((height - new_height) / 2)), max(0, int((width - new_width) / 2))
    out[top : top + new_height, left : left + new_width] = resized
    return out


def openpi_observation(obs: Mapping[str, Any], language: str, size: int = OPENPI_IMAGE_SIZE) -> dict[str, Any]:
    """The request openpi's LIBERO example sends, from a ``LiberoEnv`` observation.

    Args:
        obs: ``image`` (H, W, 3) uint8 (``rot180``), optionally ``wrist_image``, ``proprio`` (15,).
        language: The task's instruction (``prompt``).
        size: Side of the square images sent.

    Returns:
        ``observation/image`` (size, size, 3) uint8, ``observation/wrist_image`` (only when ``obs`` has it),
        ``observation/state`` (8,) float32 = ``proprio[0:8]``, ``prompt``.
    """
    out: dict[str, Any] = {"observation/image": _send(obs["image"], size)}
    if "wrist_image" in obs:
        out["observation/wrist_image"] = _send(obs["wrist_image"], size)
    out["observation/state"] = np.array(np.asarray(obs["proprio"])[..., :STATE_DIM], dtype=np.float32)
    out["prompt"] = str(language)
    return out


def _send(image: Any, size: int) -> np.ndarray:
    return np.ascontiguousarray(resize_with_pad(np.asarray(image, dtype=np.uint8), size, size))


def env_observation(request: Mapping[str, Any], image_size: int, wrist: bool) -> dict[str, np.ndarray]:
    """A ``LiberoEnv`` observation from openpi's LIBERO request (the server side).

    Args:
        request: ``observation/image`` (224, 224, 3) uint8 (any square side works), ``observation/wrist_image``
            when ``wrist``, ``observation/state`` (8,).
        image_size: Side the policy reads its images at (the ``LiberoEnv`` it was trained on).
        wrist: Whether to return ``wrist_image``.

    Returns:
        ``image`` (and ``wrist_image``) (image_size, image_size, 3) uint8, resized with ``cv2.INTER_AREA``;
        ``proprio`` (15,) float32 with [0:8] the state and the 7 arm joint positions zeros.

    Raises:
        ConfigError: A missing key or a state of another length (one line).
    """
    keys = ["observation/image", "observation/state"] + (["observation/wrist_image"] if wrist else [])
    missing = [k for k in keys if k not in request]
    if missing:
        raise ConfigError(f"openpi LIBERO request lacks {', '.join(missing)}")
    out = {"image": _receive(request["observation/image"], image_size)}
    if wrist:
        out["wrist_image"] = _receive(request["observation/wrist_image"], image_size)
    state = np.asarray(request["observation/state"], dtype=np.float32).reshape(-1)
    if state.shape != (STATE_DIM,):
        raise ConfigError(f"observation/state has {state.size} values, openpi's LIBERO state has {STATE_DIM}")
    proprio = np.zeros(PROPRIO_DIM, np.float32)
    proprio[:STATE_DIM] = state
    out["proprio"] = proprio
    return out


def _receive(image: Any, side: int) -> np.ndarray:
    import cv2

    image = np.asarray(image, dtype=np.uint8)
    if image.shape[:2] == (side, side):
        return np.array(image)
    return cv2.resize(image, (side, side), interpolation=cv2.INTER_AREA)
