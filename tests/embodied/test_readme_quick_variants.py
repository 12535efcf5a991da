"""The README's commands work from any working directory: shipped assets are found by the one rule of
``core.resources`` (an ``assets/...`` config value missing from the working directory is the shipped asset).

The quick variants are read from README.md itself (the "quick variant" table and the end-to-end block), so a
README edit is tested as written. The cheap tests compose every variant from a temporary folder; the slow ones
run each for real there (``make test-all``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from core.resources import asset, repository_root, resolve_asset_path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def quick_variants() -> dict[str, list[list[str]]]:
    """``{name: [argv, ...]}`` for every row of README's quick-variant table (a row may chain two commands)."""
    text = README.read_text()
    start = text.index("| quick variant |")
    lines = text[start:].splitlines()[2:]  # below the header and its separator, up to the table's end
    rows = lines[: next((i for i, line in enumerate(lines) if not line.startswith("| ")), len(lines))]
    out: dict[str, list[list[str]]] = {}
    previous: list[str] | None = None
    for row in rows:
        cell = row.split(" | ")[0]
        code = re.search(r"`([^`]+)`", cell)
        if code is None:
            continue
        if cell.startswith("| the same with") and previous is not None:  # the previous command plus these args
            argv = [*previous, *shlex.split(code.group(1))]
            name = f"{previous[2]}-{argv[argv.index('--arm') + 1]}"
            out[name] = [argv]
            continue
        chain = [shlex.split(c) for c in code.group(1).split("&&")]
        train = next(c for c in chain if c[:2] == ["embodied", "train"])
        out[train[2]] = chain
        previous = train
    return out


def end_to_end_block() -> list[list[str]]:
    """The commands of the "End to end with the reference method" block, continuations joined, comments cut."""
    text = README.read_text()
    block = text[text.index("### End to end with the reference method"):]
    block = block[block.index("```") + 3:]
    block = block[: block.index("```")]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line.split("#")[0]) for line in joined.splitlines() if line.split("#")[0].strip()]


def _embodied() -> list[str]:
    exe = Path(sys.executable).with_name("embodied")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "embodied"]


def _run(argv: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    cmd = [*_embodied(), *argv[1:]] if argv[0] == "embodied" else \
        [sys.executable, *argv[1:]] if argv[0] == "python" else argv
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl",
           "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


# ---------------------------------------------------------------------------------------------- cheap


def test_the_readme_lists_the_quick_variants():
    variants = quick_variants()
    assert {"bc", "sola", "transnormal", "lacwm", "lacwm-eacwm", "flexforcing", "fera", "tagrpo", "automot",
            "deepvrm"} <= set(variants), sorted(variants)
    assert variants["deepvrm"][0][:3] == ["python", "-m", "perception.forensics.generators"]
    steps = end_to_end_block()
    assert [c[:3] for c in steps] == [["embodied", "sim", "rollout"], ["embodied", "train", "bc"],
                                      ["embodied", "eval", "bc"], ["embodied", "sim", "rollout"]]


def test_the_asset_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository
    shipped = asset("checkpoints", "flexforcing")
    assert shipped.is_dir()
    assert resolve_asset_path("assets/checkpoints/flexforcing") == str(shipped)
    assert resolve_asset_path("outputs/run") == "outputs/run"  # outputs stay relative to the working directory
    assert resolve_asset_path("assets/checkpoints/no_such") == "assets/checkpoints/no_such"  # named as written
    (tmp_path / "assets" / "checkpoints" / "flexforcing").mkdir(parents=True)  # the user's own copy wins
    assert resolve_asset_path("assets/checkpoints/flexforcing") == "assets/checkpoints/flexforcing"


def test_every_quick_variant_composes_from_another_folder(tmp_path, monkeypatch, capsys):
    """Each variant's resolved config names no ``assets/`` path relative to the (empty) working directory: every
    shipped asset it names is the absolute path of an existing folder (TAGRPO's base: the shipped video model)."""
    from omegaconf import OmegaConf

    from embodied.cli import main

    monkeypatch.chdir(tmp_path)
    assets_dir = str(asset())
    for name, chain in quick_variants().items():
        argv = next(c for c in chain if c[0] == "embodied")
        assert main([*argv[1:], "--print-config"]) == 0, name
        cfg = OmegaConf.to_container(OmegaConf.create(capsys.readouterr().out), resolve=True)
        values = _strings(cfg)
        assert not [v for v in values if v.startswith("assets/")], (name, values)
        for v in values:
            if v.startswith(assets_dir):
                assert Path(v).exists(), (name, v)
        if name == "tagrpo":
            assert cfg["model"]["base_path"] == str(asset("checkpoints", "flexforcing"))
    assert not any(tmp_path.iterdir())  # composing writes nothing


def test_tagrpo_config_from_another_folder_by_the_console_script(tmp_path):
    """As the user types it: the console script, in a folder of theirs (the failure this rule fixed)."""
    argv = quick_variants()["tagrpo"][0]
    r = _run([*argv, "--print-config"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    base = re.search(r"^\s*base_path: (.+)$", r.stdout, re.M).group(1)
    assert Path(base).is_absolute() and Path(base) == asset("checkpoints", "flexforcing")
    if repository_root() is not None:
        assert Path(base).is_relative_to(repository_root())


# ----------------------------------------------------------------------------------------------- slow


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", sorted(quick_variants()))
def test_quick_variant_runs_from_another_folder(name, tmp_path):
    variants = quick_variants()
    if name == "bc" or name == "lacwm-eacwm":  # bc reads step 1's recording; eacwm reuses lacwm's recording
        first = end_to_end_block()[0] if name == "bc" else variants["lacwm"][0]
        first = [*first[: first.index("--episodes") + 1], "2", *first[first.index("--episodes") + 2:]] \
            if name == "bc" else first
        r = _run(first, tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
    for argv in variants[name]:
        r = _run(argv, tmp_path)
        assert r.returncode == 0, (argv, r.stderr[-2000:])
    out_dir = next(a.split("=", 1)[1] for a in reversed(variants[name][-1]) if a.startswith("out_dir="))
    assert (tmp_path / out_dir).is_dir() and not Path(out_dir).is_absolute()  # written where the user is


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_end_to_end_block_quick_variant_from_another_folder(tmp_path):
    """The block with the bc quick variant's tiny training (and 2 episodes where it says 40 or 5)."""
    record, _, evaluate, watch = end_to_end_block()
    shrink = {"--episodes": "2"}
    record = [shrink.get(record[i - 1], a) if i else a for i, a in enumerate(record)]
    train = quick_variants()["bc"][0]
    out = next(a.split("=", 1)[1] for a in train if a.startswith("out_dir="))
    evaluate = [*evaluate, "debug=tiny", f"out_dir={out}", "env.episodes=2"]
    watch = [a if a != "outputs/bc" else out for a in watch]
    watch = [shrink.get(watch[i - 1], a) if i else a for i, a in enumerate(watch)]
    for argv in (record, train, evaluate, watch):
        r = _run(argv, tmp_path)
        assert r.returncode == 0, (argv, r.stderr[-2000:])
    assert r.stdout and (tmp_path / "outputs" / "bc_rollouts" / "videos").is_dir()
    assert (tmp_path / out / "eval.json").is_file()
