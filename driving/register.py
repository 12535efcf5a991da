"""Registers the closed-loop driving evaluator's demo section (named in pyproject's ``embodied.methods``).

AutoMoT, when it lands, registers itself here with ``register_method``.
"""

from core.registry import DEMOS

DEMOS.register("driving", "driving.demo:demo_section", overwrite=True)
