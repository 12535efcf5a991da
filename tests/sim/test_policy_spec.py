"""A policy built for other spaces than its env's is refused before the first step, in one line naming both shapes.

``sim.api.PolicySpec`` (a policy's ``expects``) checked by ``sim.rollout.install_policy``; the CLI cases run the
console script from a folder outside the repository (``tests/sim/test_cli_user.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from core.errors import CheckpointError
from sim.api import PolicySpec, policy_expects
from sim.rollout import RolloutConfig, numbered_env_ids, rollout, suggest_env_ids


def _obs(**shapes):
    return spaces.Dict({k: spaces.Box(-1, 1, shape=s, dtype=np.float32) for k, s in shapes.items()})


ACT7 = spaces.Box(-1, 1, shape=(7,), dtype=np.float32)


def test_fits_when_every_declared_key_and_axis_matches():
    spec = PolicySpec({"image": (None, None, 3), "proprio": (15,)}, (7,))
    obs = _obs(image=(128, 96, 3), proprio=(15,), wrist_image=(8, 8, 3))  # extra keys are fine
    assert spec.mismatches(obs, ACT7) == []
    spec.check(obs, ACT7, "embodied/X-v0")  # no raise


def test_refusal_names_both_shapes_the_policy_and_the_env():
    spec = PolicySpec({"image": (None, None, 3), "proprio": (23,)}, (7,), source="runs/bc", made_for="embodied/A-v0")
    with pytest.raises(CheckpointError) as e:
        spec.check(_obs(image=(64, 64, 3), proprio=(15,)), spaces.Box(-1, 1, (2,)), "embodied/B-v0")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("policy runs/bc (made for embodied/A-v0) does not fit env embodied/B-v0: ")
    assert "observation 'proprio': policy (23,), env (15,)" in msg
    assert "action: policy (7,), env (2,)" in msg
    assert "image" not in msg.split(": ", 1)[1]  # the key that fits is not blamed


def test_missing_keys_are_named_once_with_the_env_keys():
    spec = PolicySpec({"bev": (6, None, None), "ego_state": (9,)}, (2,))
    (phrase,) = spec.mismatches(_obs(image=(8, 8, 3), proprio=(23,)), spaces.Box(-1, 1, (2,)))
    assert phrase == ("observation 'bev' (6, ?, ?), 'ego_state' (9,): policy reads them, env has no such key "
                      "(its keys: image, proprio)")


def test_rank_and_channel_mismatches_count():
    spec = PolicySpec({"image": (None, None, 3)}, None)
    assert spec.mismatches(_obs(image=(8, 8, 4)), ACT7) == ["observation 'image': policy (?, ?, 3), env (8, 8, 4)"]
    assert spec.mismatches(_obs(image=(8, 3)), ACT7)
    assert PolicySpec({}, (7,)).mismatches(_obs(), spaces.Discrete(3))  # no shape to fit


def test_policy_expects_reads_only_a_spec():
    class P:
        expects = PolicySpec({}, (7,))

    class Q:
        expects = "(7,)"

    assert policy_expects(P()) is P.expects
    assert policy_expects(Q()) is None and policy_expects(object()) is None


class _Declared:
    """A policy declaring spaces it was not built for; acting at all would fail the test."""

    def __init__(self, batched: bool):
        self.expects = PolicySpec({"proprio": (99,)}, (7,), source="ckpt/x")
        if batched:
            self.act_batch = self._act

    def reset(self, seed=None, index=None):
        pass

    def act(self, obs, info):
        return self._act(obs, info)

    def _act(self, *args):
        raise AssertionError("the policy acted before its spaces were checked")


@pytest.mark.parametrize("batched", [False, True], ids=["per-env", "batched"])
def test_rollout_refuses_before_the_first_step(batched):
    import functools

    factory = functools.partial(_factory, batched=batched)
    cfg = RolloutConfig("embodied/Reach-Panda-v0", episodes=1, env_kwargs={"image_size": 0}, progress=False)
    with pytest.raises(CheckpointError, match=r"policy ckpt/x does not fit env embodied/Reach-Panda-v0: "
                                              r"observation 'proprio': policy \(99,\), env \(\d+,\)$"):
        rollout(cfg, policy=factory)


def _factory(env, batched):
    return _Declared(batched)


REGISTERED = ["embodied/Reach-Panda-v0", "embodied/Reach-Sawyer-v0", "embodied/Lift-Panda-v0",
              *(f"embodied/Libero-spatial-{i}-v0" for i in range(10)), *(f"embodied/Libero-10-{i}-v0" for i in range(10)),
              "CartPole-v1"]


def test_an_unprefixed_id_suggests_the_prefixed_one_alone():
    assert suggest_env_ids("Reach-Panda-v0", REGISTERED) == ["embodied/Reach-Panda-v0"]
    assert suggest_env_ids("Libero-spatial-3-v0", REGISTERED) == ["embodied/Libero-spatial-3-v0"]
    assert suggest_env_ids("other/Reach-Panda-v0", REGISTERED) == ["embodied/Reach-Panda-v0"]


def test_an_index_out_of_range_suggests_its_own_family_and_the_range():
    near = suggest_env_ids("Libero-spatial-10-v0", REGISTERED)
    assert near and all(k.startswith("embodied/Libero-spatial-") for k in near)
    assert numbered_env_ids("Libero-spatial-10-v0", REGISTERED) == "embodied/Libero-spatial-N-v0 has N in 0..9"
    assert numbered_env_ids("Reach-Pand-v0", REGISTERED) is None
    assert suggest_env_ids("Nothing-Like-It", REGISTERED) == []


def test_check_env_id_message():
    from core.errors import ConfigError
    from sim.rollout import check_env_id

    with pytest.raises(ConfigError, match=r"^env id 'Reach-Panda-v0' is not registered; did you mean "
                                          r"'embodied/Reach-Panda-v0'\?; `embodied sim list` lists them all$"):
        check_env_id("Reach-Panda-v0")
    with pytest.raises(ConfigError, match=r"embodied/Libero-spatial-N-v0 has N in 0\.\.9; did you mean "
                                          r"'embodied/Libero-spatial-"):
        check_env_id("Libero-spatial-10-v0")
