"""Registers LAC-WM and its explicit-action baseline EAC-WM (named in pyproject's ``embodied.methods``)."""

from core.registry import register_method

for _name, _description in (
    ("lacwm", "latent-action-conditioned cross-embodiment world model"),
    ("eacwm", "explicit-action-conditioned world model (LAC-WM's baseline)"),
):
    register_method(
        _name,
        folder="worldmodels/lacwm",
        description=_description,
        task="worldmodels.lacwm.task",
        config="worldmodels.lacwm.configuration_lacwm",
        model="worldmodels.lacwm.modeling_lacwm:WorldModel",
        policy="worldmodels.lacwm.task:load_policy",
        demo="worldmodels.lacwm.demo:demo_section" if _name == "lacwm" else None,
    )
