"""Registers the behaviour-cloning reference method (named in pyproject's ``embodied.methods``)."""

from core.registry import register_method

register_method(
    "bc",
    folder="worldmodels/bc",
    description="behaviour cloning with action chunks (the reference method of the pattern)",
    task="worldmodels.bc.task",
    config="worldmodels.bc.configuration_bc",
    model="worldmodels.bc.modeling_bc:BCPolicyModel",
    example="worldmodels.bc.modeling_bc:example",
    headline=[("policies.*.success_rate", "%", 100), ("policies.*.mean_length", "steps")],
    policy="worldmodels.bc.task:make_policy",
    demo="worldmodels.bc.demo:demo_section",
    arms={"bc": []},
)
