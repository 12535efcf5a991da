"""Registers AutoMoT (named in pyproject's ``embodied.methods`` entry points): train / eval tasks, configs,
the ``automot`` and ``noreason`` driving policies, the demo section and the arms."""

from core.registry import POLICIES, register_method

register_method(
    "automot",
    folder="driving/automot",
    description="mixture-of-transformers driving VLA (a VLM understanding expert + an action expert, joint "
                "attention, asynchronous inference, a flow-matching waypoint refiner), closed loop in "
                "highway-env",
    task="driving.automot.task",
    config="driving.automot.configuration_automot",
    model="driving.automot.modeling_automot:DrivingVLA",
    example="driving.automot.modeling_automot:tiny_example",
    experiment="driving.automot.experiments:EXPERIMENT",
    headline=[("openloop.coarse.l2_*", "m"), ("openloop.meta_accuracy", ""), ("qa_token_match.acc", ""),
              ("closed_loop.*.all.driving_score", "%", 100), ("closed_loop.*.all.success_rate", "%", 100)],
    policy="driving.automot.pipeline_automot:make_policy",
    demo="driving.automot.demo:demo_section",
    # same data, base VLM, steps, harness; out_dir follows model.arm
    arms={"automot": [], "frozen": ["model.arm=frozen"], "noreason": ["model.arm=noreason"]},
)
POLICIES.register("noreason", "driving.automot.pipeline_automot:make_noreason_policy", overwrite=True)
