"""Light registration of the manipulation suite: embodiment and task tables, no simulator import.

Env ids are ``embodied/<Task>-<Embodiment>-v0`` (e.g. ``embodied/Lift-Sawyer-v0``); every task runs on
every embodiment. The tables here are plain data so that ``embodied sim list`` can print action
dimensions without building a robosuite model.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "embodied"
ENTRY_POINT = "sim.manipulation.env:ManipulationEnv"


@dataclass(frozen=True)
class EmbodimentSpec:
    """One robot + end effector + arm controller combination.

    Attributes:
        name: Embodiment name used in env ids and ``metadata["embodiment"]`` (e.g. ``"Panda+InspireHand"``
            is registered as ``PandaInspireHand`` in the id).
        robot: robosuite robot class name (``PandaDexRH`` is robosuite's Panda composition that mounts the
            Inspire right hand with its fingers along the flange axis).
        gripper: robosuite gripper / hand class name (``"default"`` = the robot's own).
        controller: robosuite arm part-controller type: ``OSC_POSE`` (6-d delta pose),
            ``OSC_POSITION`` (3-d delta position) or ``JOINT_POSITION`` (delta joint angles).
        arm_dof: Number of arm joints.
        hand_dims: Semantics of the end-effector action dims (one name per dim).
    """

    name: str
    robot: str
    gripper: str
    controller: str
    arm_dof: int
    hand_dims: tuple[str, ...] = ("gripper",)

    @property
    def id_name(self) -> str:
        """The embodiment as it appears in env ids (no ``+``)."""
        return self.name.replace("+", "")

    @property
    def arm_action_dim(self) -> int:
        """Arm part of the action: 6 for OSC_POSE, 3 for OSC_POSITION, ``arm_dof`` for joint control."""
        return {"OSC_POSE": 6, "OSC_POSITION": 3}.get(self.controller, self.arm_dof)

    @property
    def action_dim(self) -> int:
        """Total action dimension (arm + end effector)."""
        return self.arm_action_dim + len(self.hand_dims)


# Inspire hand action order as robosuite's InspireRightHand maps it onto its 12 actuators.
# The hand runs on robosuite's ``PandaDexRH`` robot, i.e. the Panda arm with the hand's own mount rotation:
# on the plain ``Panda`` the hand keeps the GR1 mount of its MJCF, which leaves the fingers pointing back
# up past the wrist, so nothing below the hand can be grasped.
INSPIRE_FINGERS = ("pinky", "ring", "middle", "index", "thumb_bend", "thumb_rotation")

EMBODIMENTS: dict[str, EmbodimentSpec] = {
    e.id_name: e
    for e in (
        EmbodimentSpec("Panda", "Panda", "PandaGripper", "OSC_POSE", 7),
        EmbodimentSpec("Sawyer", "Sawyer", "RethinkGripper", "OSC_POSITION", 7),
        EmbodimentSpec("UR5e", "UR5e", "Robotiq140Gripper", "OSC_POSE", 6),
        EmbodimentSpec("IIWA", "IIWA", "Robotiq140Gripper", "JOINT_POSITION", 7),
        EmbodimentSpec("Kinova3", "Kinova3", "JacoThreeFingerGripper", "OSC_POSITION", 7),
        EmbodimentSpec("Panda+InspireHand", "PandaDexRH", "InspireRightHand", "OSC_POSE", 7, INSPIRE_FINGERS),
    )
}

#: Task id name -> (metadata task name, default horizon in control steps at 20 Hz).
TASKS: dict[str, tuple[str, int]] = {"Reach": ("reach", 60), "Lift": ("lift", 120)}


def env_id(task: str, embodiment: str) -> str:
    """Gymnasium id of ``task`` (``"Reach"`` / ``"Lift"``) on ``embodiment`` (id name)."""
    return f"{NAMESPACE}/{task}-{embodiment}-v0"


def env_ids() -> list[str]:
    """Every manipulation env id, task-major."""
    return [env_id(t, e) for t in TASKS for e in EMBODIMENTS]


def register() -> None:
    """Register every task x embodiment with Gymnasium (idempotent; imports no simulator)."""
    import gymnasium as gym

    for task, (task_name, horizon) in TASKS.items():
        for emb in EMBODIMENTS.values():
            gid = env_id(task, emb.id_name)
            if gid in gym.registry:
                continue
            gym.register(
                id=gid,
                entry_point=ENTRY_POINT,
                max_episode_steps=None,
                disable_env_checker=True,
                kwargs={"task": task_name, "embodiment": emb.id_name, "horizon": horizon},
            )
