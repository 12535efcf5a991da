"""The `embodied` CLI: the DESIGN.md contract is present, bad input is one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from embodied.cli import EXIT_BAD_INPUT, EXIT_NOT_BUILT, build_parser, main

CONTRACT = [
    ["demo"],
    ["infer", "normals"],
    ["infer", "depth360"],
    ["infer", "forensics"],
    ["infer", "video"],
    ["infer", "i2v"],
    ["sim", "list"],
    ["sim", "rollout"],
    ["sim", "make-dataset"],
    ["drive", "eval"],
    ["train"],
    ["eval"],
]


@pytest.mark.parametrize("words", CONTRACT, ids=" ".join)
def test_every_contract_command_explains_itself(words, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*words, "--help"])
    assert e.value.code == 0
    assert "usage: embodied " + " ".join(words) in capsys.readouterr().out


_INFER_ARGS = {
    "normals": ["x.png", "--out", "o"],
    "depth360": ["p.png", "--out", "o"],
    "forensics": ["x.png"],
    "video": ["--out", "v.mp4"],
    "i2v": ["x.png", "--out", "v.mp4"],
}


def _unbuilt_commands() -> list[list[str]]:
    from core.registry import INFER, METHODS, load_plugins
    from embodied.methods import PLANNED, PLANNED_INFER

    load_plugins()
    cmds = [["infer", k, *_INFER_ARGS[k]] for k in PLANNED_INFER if k not in INFER]
    cmds += [[verb, m] for m in PLANNED if m not in METHODS for verb in ("train", "eval")]
    return cmds


def test_unbuilt_methods_say_so_in_one_line(monkeypatch, capsys):
    """Every planned method is built now; a planned one that registered nothing still gets the one-line answer."""
    from embodied import methods

    monkeypatch.setitem(methods.PLANNED, "futuremethod", ("somewhere", "a method on the roadmap"))
    cmds = _unbuilt_commands()
    assert ["train", "futuremethod"] in cmds and ["eval", "futuremethod"] in cmds
    for argv in cmds:
        assert main(argv) == EXIT_NOT_BUILT
        err = capsys.readouterr().err.strip()
        assert "not built yet" in err and "\n" not in err


def test_bad_input_is_one_line(capsys):
    assert main(["train", "bc", "trainer.max_stpes=3"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err == "embodied: error: unknown config key 'trainer.max_stpes'; did you mean max_steps?"
    assert main(["train", "nosuchmethod"]) == EXIT_BAD_INPUT
    assert main(["sim", "rollout", "embodied/Nope-v0", "--episodes", "1", "--out", "x"]) == EXIT_BAD_INPUT
    assert main(["demo", "--only", "nosuchsection", "--out", "x"]) == EXIT_BAD_INPUT
    assert main(["eval", "bc", "--rotate", "so3", "--print-config"]) == EXIT_BAD_INPUT  # only spherical methods
    assert "--rotate: method 'bc' has no such option (sola has)" in capsys.readouterr().err


def test_print_config_and_methods(capsys):
    assert main(["train", "bc", "debug=tiny", "--print-config"]) == 0
    assert "max_steps: 4" in capsys.readouterr().out
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "transnormal" in out and "bc" in out


def test_console_script_help_is_fast_and_light():
    """`embodied --help` imports neither torch nor a simulator."""
    code = ("import sys; from embodied.cli import build_parser; build_parser();"
            "heavy = [m for m in ('torch', 'mujoco', 'robosuite', 'highway_env', 'mitsuba') if m in sys.modules];"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
