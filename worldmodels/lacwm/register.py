"""Registers LAC-WM (named in pyproject's ``embodied.methods`` entry points); EAC-WM is its baseline arm.

``embodied train lacwm --arm eacwm`` trains EAC-WM (one explicit-action encoder per embodiment) on the same
data, steps and harness. The ``eacwm`` model class and policy stay registered under that name so that
checkpoints whose ``config.json`` names ``method: eacwm`` (the shipped ``assets/checkpoints/eacwm``) load with
``load_pretrained`` and ``--policy``.
"""

from core.registry import MODELS, POLICIES, register_method

register_method(
    "lacwm",
    folder="worldmodels/lacwm",
    description="latent-action-conditioned cross-embodiment world model, against the explicit-action EAC-WM",
    task="worldmodels.lacwm.task",
    config="worldmodels.lacwm.configuration_lacwm",
    model="worldmodels.lacwm.modeling_lacwm:WorldModel",
    example="worldmodels.lacwm.modeling_lacwm:example",
    experiment="worldmodels.lacwm.experiments:STUDIES",
    headline=[("rollout.*.psnr[-1]", "dB"), ("rollout.*.ssim[-1]", ""), ("probe.r2", ""), ("probe_adapted.r2", ""),
              ("planning.*.success_rate", "%", 100)],
    policy="worldmodels.lacwm.task:make_policy",
    demo="worldmodels.lacwm.demo:demo_section",
    arms={"lacwm": [], "eacwm": ["model=eacwm", "out_dir=outputs/eacwm/run"]},
)
MODELS.register("eacwm", "worldmodels.lacwm.modeling_lacwm:WorldModel", overwrite=True)
POLICIES.register("eacwm", "worldmodels.lacwm.task:make_policy", overwrite=True)
