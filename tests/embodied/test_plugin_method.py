"""A new method is one folder plus one entry-point line: a toy method living OUTSIDE this repository registers
an infer command, a model class and a demo section, and the CLI serves them — no file of core or of the app
layer was edited for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TOY = {
    "toymethod/__init__.py": "",
    "toymethod/register.py": """
        from core.registry import InferSpec, register_method

        register_method(
            "toy", folder="toymethod", description="a toy method from another distribution",
            task="toymethod.task", model="toymethod.modeling:ToyModel", demo="toymethod.demo:demo_section",
            infer=[InferSpec("echo", "toymethod.cli:infer", "echo the inputs (toy)",
                             (("inputs", dict(nargs="+")), ("--shout", dict(action="store_true"))))],
        )
    """,
    "toymethod/task.py": "def train(cfg): return {}\ndef evaluate(cfg): return {}\n",
    "toymethod/cli.py": """
        def infer(args):
            words = [w.upper() if args.shout else w for w in args.inputs]
            print("toy:", " ".join(words))
            return 0
    """,
    "toymethod/modeling.py": """
        import dataclasses
        from torch import nn
        from core.pretrained import PreTrainedModel

        @dataclasses.dataclass
        class ToyConfig:
            width: int = 3

        class ToyModel(PreTrainedModel):
            config_class = ToyConfig
            method = "toy"
            def __init__(self, config):
                super().__init__()
                self.config = config
                self.lin = nn.Linear(config.width, 1)
    """,
    "toymethod/demo.py": """
        from core.demo import DemoSection
        def demo_section(ctx):
            return DemoSection(title="Toy", lead="a plug-in section", figures={"ok": 1})
    """,
    "toy_plugin-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n",
    "toy_plugin-0.1.dist-info/entry_points.txt": "[embodied.methods]\ntoy = toymethod.register\n",
}


def _run(args: list[str], root: Path, code: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "embodied", *args]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_a_method_from_another_distribution_plugs_in(tmp_path):
    for name, text in TOY.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    out = _run(["methods"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["toy", "toymethod"])
    assert lines[at + 1].split() == ["arms:", "toy"], out.stdout  # no arms declared: the method itself
    out = _run(["infer", "echo", "a", "--shout", "b"], tmp_path)  # its flag, anywhere among its arguments
    assert out.returncode == 0 and out.stdout.strip() == "toy: A B", out.stdout + out.stderr
    code = textwrap.dedent(f"""
        from pathlib import Path
        from core.pretrained import load_pretrained
        from toymethod.modeling import ToyConfig, ToyModel
        ToyModel(ToyConfig(width=5)).save_pretrained(Path({str(tmp_path)!r}) / "export")
        m = load_pretrained(Path({str(tmp_path)!r}) / "export")
        print(type(m).__name__, m.config.width)
    """)
    out = _run([], tmp_path, code=code)
    assert out.returncode == 0 and out.stdout.split() == ["ToyModel", "5"], out.stdout + out.stderr
    out = _run(["demo", "--only", "toy", "--out", str(tmp_path / "demo")], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "a plug-in section" in (tmp_path / "demo" / "index.html").read_text()


def test_a_stale_entry_point_is_one_line(tmp_path):
    (tmp_path / "ghost-0.1.dist-info").mkdir()
    (tmp_path / "ghost-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: ghost\nVersion: 0.1\n")
    (tmp_path / "ghost-0.1.dist-info" / "entry_points.txt").write_text("[embodied.methods]\nghost = ghost.register\n")
    out = _run(["methods"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == ("embodied: error: entry point 'ghost' (embodied.methods) names missing module "
                                  "'ghost.register'; the installed metadata is stale — run `make setup`")
