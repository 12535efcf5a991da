"""Multi-embodiment MuJoCo manipulation suite over robosuite: shared tasks, scripted experts.

Ids ``embodied/<Task>-<Embodiment>-v0`` with tasks Reach / Lift and embodiments Panda (OSC pose, 7-d),
Sawyer (OSC position, 4-d), UR5e (OSC pose, 7-d), IIWA (delta joint position, 8-d), Kinova3 (OSC
position, 4-d) and PandaInspireHand (OSC pose + 6 finger dims, 12-d). Importing this package loads
no simulator; ``sim.manipulation.env`` does.
"""

from sim.manipulation.registration import EMBODIMENTS, TASKS, EmbodimentSpec, env_id, env_ids, register

__all__ = ["EMBODIMENTS", "TASKS", "EmbodimentSpec", "env_id", "env_ids", "register"]
