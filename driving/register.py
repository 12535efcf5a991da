"""Registers the closed-loop driving evaluator's demo section (named in pyproject's ``embodied.methods``).

The evaluator is not a method: AutoMoT registers itself from ``driving/automot/register.py``.
"""

from core.registry import DEMOS

DEMOS.register("driving", "driving.demo:demo_section", overwrite=True)
