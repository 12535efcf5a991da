"""LiberoEnv(lazy_images=True): frames rendered when read are the eager env's frames bit for bit, reading them
leaves the simulation exactly as it was, unread frames cost no render, and a stale read is refused."""

from __future__ import annotations

import numpy as np
import pytest

from sim.api import LazyObservation

SIZE = 32


@pytest.fixture(scope="module")
def lazy():
    from sim.libero.env import LiberoEnv

    env = LiberoEnv("libero_spatial", 0, image_size=SIZE, lazy_images=True, render_mode="rgb_array")
    yield env
    env.close()


def _count_renders(env) -> list[str]:
    calls: list[str] = []
    for cam in env._cameras:
        snap = env._snapshots[cam]
        render = snap["render"]

        def counted(cache, _render=render, _cam=cam):
            calls.append(_cam)
            return _render(cache)

        snap["render"] = counted
    return calls


def test_frames_render_only_when_read(lazy):
    obs, _ = lazy.reset(seed=0, options={"init_state_id": 1})
    calls = _count_renders(lazy)
    assert isinstance(obs, LazyObservation) and list(obs) == ["image", "wrist_image", "proprio"]
    assert obs.materialized == [] and obs["proprio"].shape == (15,)
    for _ in range(3):
        obs, *_ = lazy.step(np.zeros(7))
    assert calls == []  # three steps, nothing read: nothing rendered
    image = obs["image"]
    assert calls == ["agentview"] and obs.materialized == ["image"]
    assert image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8 and image.std() > 5  # a real scene
    assert obs["image"] is image and calls == ["agentview"]  # kept, not rendered again
    assert np.array_equal(dict(obs)["wrist_image"], obs["wrist_image"])
    assert calls == ["agentview", "robot0_eye_in_hand"]
    assert np.array_equal(lazy.render(), image)  # render() is the observation's frame


def test_a_stale_read_is_refused(lazy):
    obs, _ = lazy.reset(seed=0, options={"init_state_id": 0})
    kept = obs["image"]
    lazy.step(np.zeros(7))
    assert obs["image"] is kept  # what was read stays readable
    with pytest.raises(RuntimeError, match="after the env stepped on"):
        obs["wrist_image"]  # its sampled state is gone


def test_a_replaced_sensor_is_refused(lazy):
    obs, _ = lazy.reset(seed=0, options={"init_state_id": 0})
    observable = lazy._rs._observables["agentview_image"]
    ours = observable._sensor
    observable._sensor = lambda cache: ours(cache)  # what a hard reset leaves: a sensor without the env's mark
    try:
        with pytest.raises(RuntimeError, match="replaced the agentview camera's sensor"):
            obs["image"]  # the copy it would render from is stale: refused, not a wrong frame
    finally:
        observable._sensor = ours
    assert obs["wrist_image"].std() > 5  # the other camera's sensor is the env's own: it renders


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lazy_frames_and_state_equal_the_eager_env(lazy):
    """Same init state and actions: every frame read from the lazy env (observation and ``raw_obs``) equals the
    eager env's, proprio equals at every step, and the simulation state stays bit-identical, reads and all."""
    from sim.libero.env import LiberoEnv

    eager = LiberoEnv("libero_spatial", 0, image_size=SIZE)
    try:
        actions = np.random.default_rng(0).uniform(-1, 1, (15, 7))
        oe, _ = eager.reset(seed=3, options={"init_state_id": 2})
        ol, _ = lazy.reset(seed=3, options={"init_state_id": 2})
        for key in ("image", "wrist_image"):
            assert np.array_equal(oe[key], ol[key])
        for t, a in enumerate(actions):
            oe, re_, te, _, ie = eager.step(a)
            ol, rl, tl, _, il = lazy.step(a)
            assert np.array_equal(oe["proprio"], ol["proprio"]) and (re_, te) == (rl, tl)
            assert np.array_equal(ie["eef_delta"], il["eef_delta"])
            if t % 3 == 1:  # read some steps, skip others
                for key in ("image", "wrist_image"):
                    assert np.array_equal(oe[key], ol[key]), (t, key)
                assert np.array_equal(eager.raw_obs["robot0_eye_in_hand_image"],
                                      lazy.raw_obs["robot0_eye_in_hand_image"])
        for field in ("qpos", "qvel", "act", "qacc_warmstart"):
            assert np.array_equal(getattr(eager.sim.data, field), getattr(lazy.sim.data, field)), field
    finally:
        eager.close()
