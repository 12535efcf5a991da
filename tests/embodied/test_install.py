"""A non-editable install (`pip install .`) runs the commands from any directory: configs and assets travel.

The fresh venv reuses the project's pinned set (a ``.pth`` line points at this venv's site-packages, so no
package is downloaded) and installs only the project itself from a copy of the tracked files, as a fresh
clone would have them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from core.resources import repository_root

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_non_editable_install_runs_from_another_directory(tmp_path):
    repo = repository_root()
    assert repo is not None, "run from a source checkout"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=repo, capture_output=True,
                           text=True, check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (repo / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / f, src / f)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)  # pip, setuptools: the pinned ones
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_pinned_set.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # reuse the installed deps
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(src)],
         tmp_path)
    shutil.rmtree(src)  # nothing may be read from the source tree any more
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([str(py), "-c", "import core, embodied; from core.resources import resource_dir; "
                                 "print(core.__file__); print(resource_dir('configs'))"], elsewhere).stdout.split()
    assert all(str(site) in w for w in where), where
    embodied = str(venv / "bin" / "embodied")
    out = _run([embodied, "methods"], elsewhere).stdout
    assert "sola" in out and "arms: sola, lpe" in out
    sample = sorted((Path(where[1]).parent / "assets" / "samples" / "normals").glob("*.png"))[0]
    _run([embodied, "infer", "normals", str(sample), "--out", "normals"], elsewhere)
    assert list((elsewhere / "normals").glob("*_normals.png"))
    _run([embodied, "demo", "--only", "sola", "--out", "demo"], elsewhere, timeout=1200)
    assert (elsewhere / "demo" / "index.html").is_file()
