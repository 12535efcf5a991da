"""``core.logging.quiet_third_party``: the libraries' chatter off stderr, their errors kept (each in a fresh process,
since it changes process-wide logging / warnings state)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ENV = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "OMP_NUM_THREADS": "1"}

SCRIPT = textwrap.dedent("""
    import logging, sys, warnings
    if sys.argv[1] == "quiet":
        from core.logging import quiet_third_party
        quiet_third_party()
    import gym  # LIBERO imports it: its banner is print()ed on import
    import robosuite  # logs WARNINGs while importing, then INFO lines per env
    from robosuite.utils.log_utils import ROBOSUITE_DEFAULT_LOGGER
    ROBOSUITE_DEFAULT_LOGGER.info("Loading controller configuration from: x.json")
    ROBOSUITE_DEFAULT_LOGGER.error("robosuite error kept")
    road = logging.getLogger("highway_env.road.road")  # the logger of highway-env's route warnings
    road.warning("Route ('nx', 'nxs', None) does not start after current road ('wx', 'we', 1).")
    road.error("highway error kept")
    warnings.warn_explicit("old API", DeprecationWarning, gym.core.__file__, 1, module="gym.core")
    warnings.warn_explicit("ours kept", UserWarning, "/work/sim/x.py", 1, module="sim.x")
""")


def _stderr(mode: str) -> str:
    r = subprocess.run([sys.executable, "-W", "default", "-c", SCRIPT, mode], env=ENV, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stderr


def test_quiet_drops_banner_log_lines_and_warnings_but_keeps_errors():
    err = _stderr("quiet")
    assert "Gym has been unmaintained" not in err
    assert "[robosuite WARNING]" not in err and "[robosuite INFO]" not in err
    assert "does not start after current road" not in err
    assert "old API" not in err and "ours kept" in err
    assert "robosuite error kept" in err and "highway error kept" in err


def test_without_it_the_chatter_is_there():  # the control: each line above is real
    err = _stderr("loud")
    assert "Gym has been unmaintained" in err
    assert "[robosuite WARNING] No private macro file found!" in err and "[robosuite INFO] Loading" in err
    assert "does not start after current road" in err
    assert "old API" in err
