"""The `embodied` CLI: the DESIGN.md contract is present, bad input is one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from embodied.cli import EXIT_BAD_INPUT, build_parser, main

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
    ["libero", "eval"],
    ["libero", "record"],
    ["train"],
    ["eval"],
]


@pytest.mark.parametrize("words", CONTRACT, ids=" ".join)
def test_every_contract_command_explains_itself(words, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*words, "--help"])
    assert e.value.code == 0
    assert "usage: embodied " + " ".join(words) in capsys.readouterr().out


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
    assert "arms: fera, fera_norouter, fera_nofecl, lora, dora" in out and "arms: bc" in out
    assert "eacwm" not in out.split("arms:")[0]  # EAC-WM is an arm of lacwm, not a method


def _printed(capsys, argv: list[str]) -> dict:
    """The config `embodied ARGV --print-config` prints, as a dict, and its recorded arm (popped)."""
    import yaml

    assert main([*argv, "--print-config"]) == 0, capsys.readouterr().err
    cfg = yaml.safe_load(capsys.readouterr().out)
    return cfg, cfg.pop("arm")


@pytest.mark.parametrize("method, arm, old", [
    ("fera", "lora", ["adapter=lora"]),
    ("tagrpo", "dancegrpo", ["algo=dancegrpo"]),
    ("deepvrm", "lora", ["model.arm=lora"]),
    ("automot", "noreason", ["model.arm=noreason"]),
    ("flexforcing", "bidirectional_only", ["model=flexforcing_bidirectional", "out_dir=outputs/flex_bidir"]),
    ("flexforcing", "autoregressive_only", ["model=flexforcing_autoregressive", "out_dir=outputs/flex_ar"]),
    ("sola", "lpe", ["model=sola_lpe", "out_dir=outputs/sola_lpe"]),
    ("lacwm", "eacwm", ["model=eacwm", "out_dir=outputs/eacwm/run"]),
])
def test_an_arm_by_name_composes_the_config_of_its_old_spelling(method, arm, old, capsys):
    for verb in ("train", "eval"):
        by_name, recorded = _printed(capsys, [verb, method, "--arm", arm])
        spelled, none = _printed(capsys, [verb, method, *old])
        assert by_name == spelled and recorded == arm and none is None
        base, _ = _printed(capsys, [verb, method])
        assert base != by_name and base["out_dir"] != by_name["out_dir"]  # another run, in another folder
    first, recorded = _printed(capsys, ["train", method, "--arm", method])  # the first arm: the method
    assert first == base and recorded == method


def test_eacwm_arm_is_experiment_eacwm_under_lacwm(capsys):
    """`train lacwm --arm eacwm` trains what `experiment=eacwm` (the scaling sweep's config) describes."""
    from core.config import compose, to_container

    by_name, _ = _printed(capsys, ["train", "lacwm", "--arm", "eacwm", "debug=tiny"])
    old = to_container(compose(["experiment=eacwm", "debug=tiny"]))
    old.pop("arm")
    assert old.pop("method") == "eacwm" and by_name.pop("method") == "lacwm" and by_name == old


def test_arm_overrides_come_before_the_users(capsys):
    cfg, _ = _printed(capsys, ["train", "flexforcing", "debug=tiny", "--arm", "bidirectional_only",
                               "model=flexforcing_tiny", "out_dir=elsewhere"])
    assert cfg["out_dir"] == "elsewhere" and cfg["model"]["head_dim"] == 16  # the user's keys win
    assert cfg["model"]["chunking"] == "one" and cfg["model"]["k_projection"] is False  # the arm's stay
    cfg, recorded = _printed(capsys, ["train", "bc", "--arm", "bc"])  # a single-arm method: its own name
    assert recorded == "bc" and cfg["method"] == "bc"


def test_an_unknown_arm_is_one_line(capsys):
    assert main(["train", "fera", "--arm", "lorra", "--print-config"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err == ("embodied: error: method 'fera' has no arm 'lorra' "
                   "(arms: fera, fera_norouter, fera_nofecl, lora, dora, xlora, fourierft, waveft)")
    assert main(["eval", "bc", "--arm", "lora", "--print-config"]) == EXIT_BAD_INPUT
    assert "\n" not in capsys.readouterr().err.strip()
    assert main(["train", "fera", "arm=lora", "--print-config"]) == EXIT_BAD_INPUT  # naming is not choosing
    assert "--arm NAME" in capsys.readouterr().err
    assert main(["train", "eacwm", "--print-config"]) == EXIT_BAD_INPUT  # was a method of its own
    assert capsys.readouterr().err.strip() == ("embodied: error: 'eacwm' is an arm of 'lacwm', not a method: "
                                               "`embodied train lacwm --arm eacwm`")


def test_every_declared_arm_composes():
    """A typo in a method's `arms=` (a key, a group option) fails here, not in the middle of an experiment."""
    from core.config import compose
    from core.registry import method_specs

    ours = {"transnormal", "sola", "deepvrm", "flexforcing", "fera", "tagrpo", "lacwm", "bc", "automot"}
    specs = [s for s in method_specs() if s.name in ours]
    assert {s.name for s in specs} == ours
    for spec in specs:
        assert spec.arms and spec.arms[0] == (spec.name, ()), f"{spec.name}: the first arm is the method"
        dirs = set()
        for arm, overrides in spec.arms:
            cfg = compose([f"experiment={spec.name}", *overrides, f"arm={arm}", "debug=tiny"])
            assert cfg.arm == arm
            dirs.add(cfg.out_dir)
        assert len(dirs) == len(spec.arms), f"{spec.name}: two arms share an out_dir"


def test_console_script_help_is_fast_and_light():
    """`embodied --help` imports neither torch nor a simulator."""
    code = ("import sys; from embodied.cli import build_parser; build_parser();"
            "heavy = [m for m in ('torch', 'mujoco', 'robosuite', 'highway_env', 'mitsuba') if m in sys.modules];"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
