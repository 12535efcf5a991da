"""Build hook: ship ``configs/`` and ``assets/`` inside the wheel as ``core/_resources/`` (see core/resources.py).

Everything else about the distribution is declared in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithResources(build_py):
    """``build_py`` that also copies the config tree and the shipped assets into the built ``core`` package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads them from the checkout
            return
        here = Path(__file__).resolve().parent
        for name in ("configs", "assets"):
            target = Path(self.build_lib) / "core" / "_resources" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(here / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.tmp*"))


setup(cmdclass={"build_py": BuildWithResources})
