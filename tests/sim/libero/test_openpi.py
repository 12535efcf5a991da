"""sim/libero/openpi.py without an env: resize_with_pad bit for bit against openpi-client's, the spec, the server
side's checks. (Against a real LiberoEnv observation: tests/sim/libero/test_image_convention.py.)"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("shape, height, width", [
    ((64, 64, 3), 224, 224),      # up, square (our LIBERO renders)
    ((256, 256, 3), 224, 224),    # down, square (openpi's LIBERO renders)
    ((100, 60, 3), 224, 224),     # non-square, padded left and right
    ((60, 100, 3), 224, 224),     # padded top and bottom
    ((480, 640, 3), 224, 224),    # a camera frame, down
    ((37, 53, 3), 96, 160),       # odd sides to a non-square target
    ((2, 3, 50, 70, 3), 64, 48),  # leading batch dims
])
def test_resize_with_pad_is_openpi_clients_bit_for_bit(shape, height, width):
    from openpi_client import image_tools

    from sim.libero.openpi import resize_with_pad

    images = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    got, want = resize_with_pad(images, height, width), image_tools.resize_with_pad(images, height, width)
    assert got.dtype == want.dtype == np.uint8 and got.shape == want.shape == (*shape[:-3], height, width, 3)
    assert np.array_equal(got, want)
    same = np.zeros((224, 224, 3), np.uint8)
    assert resize_with_pad(same, 224, 224) is same  # already that size: as it is, like openpi's


def test_spec_and_keys_sent():
    from sim.libero.env import PROPRIO_DIM, PROPRIO_LAYOUT
    from sim.libero.openpi import OPENPI_IMAGE_SIZE, OPENPI_LIBERO_SPEC, PROPRIO_KEYS_SENT

    assert OPENPI_IMAGE_SIZE == 224
    assert OPENPI_LIBERO_SPEC == {"observation/image": ((224, 224, 3), "uint8"),
                                  "observation/wrist_image": ((224, 224, 3), "uint8"),
                                  "observation/state": ((8,), "float32"), "prompt": ((), "str")}
    assert set(PROPRIO_KEYS_SENT) <= {*PROPRIO_LAYOUT, "ee_states"} and "joint_states" not in PROPRIO_KEYS_SENT
    assert all(PROPRIO_LAYOUT[k].stop <= 8 for k in PROPRIO_KEYS_SENT if k in PROPRIO_LAYOUT) and PROPRIO_DIM == 15


def test_env_observation_resizes_with_area_and_checks_the_request():
    import cv2

    from core.errors import ConfigError
    from sim.libero.openpi import env_observation

    rng = np.random.default_rng(0)
    request = {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
               "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
               "observation/state": rng.normal(size=8), "prompt": "put the bowl on the plate"}
    out = env_observation(request, 64, wrist=True)
    area = cv2.resize(request["observation/image"], (64, 64), interpolation=cv2.INTER_AREA)
    assert np.array_equal(out["image"], area)
    assert out["wrist_image"].shape == (64, 64, 3) and out["wrist_image"].dtype == np.uint8
    assert out["proprio"].dtype == np.float32 and out["proprio"].shape == (15,)
    np.testing.assert_array_equal(out["proprio"][:8], request["observation/state"].astype(np.float32))
    assert np.isfinite(out["proprio"]).all() and not out["proprio"][8:].any()
    assert set(env_observation(request, 224, wrist=False)) == {"image", "proprio"}
    assert np.array_equal(env_observation(request, 224, wrist=False)["image"], request["observation/image"])
    with pytest.raises(ConfigError, match="lacks observation/wrist_image"):
        env_observation({k: v for k, v in request.items() if k != "observation/wrist_image"}, 64, wrist=True)
    with pytest.raises(ConfigError, match="7 values"):
        env_observation({**request, "observation/state": np.zeros(7)}, 64, wrist=False)
