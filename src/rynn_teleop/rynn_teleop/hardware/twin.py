"""The drivers' ``sim`` backend: the joints of the physical twin (MuJoCo; ROS-free).

The arm driver's backend drives the 14 arm joints, the hand driver's the hands' 20 joints each, of one physics
world per process (:mod:`rynn_teleop.sim.shared`): the world the twin node of the same process created (its task
scene; ``rynn-teleop run twin arm_driver hand_driver``), or, when no twin node runs in the process, one the first
backend creates at connect: the robot alone at its home posture (no table, no objects; logged). Measured
positions, velocities and efforts [N m] come from the physics; a target written is each joint's position servo
target (the servo is the twin's: gains and torque limits per joint group, :mod:`rynn_teleop.sim.model`). Every
read steps the world to the read's time first, so a measurement is never older than the call; the twin node
also steps it at its own rate.

Life cycle as a vendor backend: ``connect`` attaches to the world (MuJoCo is imported then, not when the backend
registers); ``enable`` holds the measured position and follows writes; ``stop`` (the e-stop, a soft stop) and
``disable`` hold the measured position and ignore writes until the next ``enable`` (a real arm brakes, a
Wuji hand would go limp: the twin holds); ``close`` detaches. When the world was reset (the twin node's
``~/reset``: a new layout, the robot back at home), the measured joints jumped: :meth:`TwinJoints.discontinuity`
says so once, and the driver restarts its safety layer from the measurement.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.params import Param
from ..errors import HardwareUnavailableError
from ..sim.shared import DEFAULT_WORLD, SharedWorld, attach, detach
from .base import ARM_BACKENDS, HAND_BACKENDS, DriverContext, JointBackend, JointReading

_LOG = logging.getLogger(__name__)

#: the settings of the twin backend in either driver
TWIN_SETTINGS = (
    Param("world", str, DEFAULT_WORLD, "name of the process's physics world (the twin node's `world`)"),
)


def _robot_alone():
    """A world of the robot alone at its home posture (for a process without a twin node)."""
    from ..sim.physics import PhysicsWorld
    from ..sim.rollout import home_posture

    return PhysicsWorld(None, initial=home_posture())


class TwinJoints(JointBackend):
    """Some joints of the process's physics world (``name = "sim"``; see the module doc).

    Args:
        joint_names: the joints driven, canonical names.
        world: the registry name of the world (:mod:`rynn_teleop.sim.shared`).
        user: who attaches (names the backend in the registry and in logs).
    """

    name = "sim"
    SETTINGS = TWIN_SETTINGS

    def __init__(self, joint_names: Sequence[str], world: str = DEFAULT_WORLD, user: str = "sim backend") -> None:
        self.joint_names = tuple(joint_names)
        self.world_name = world
        self.user = user
        self.shared: SharedWorld | None = None
        self._enabled = False
        self._stopped = False
        self._generation = 0
        self._jumped = False
        self.writes = 0

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: DriverContext) -> TwinJoints:
        return cls(context.joint_names, settings["world"], user=f"{cls.name} backend of {'+'.join(context.sides)} "
                                                                 f"{cls.__name__}")

    # ------------------------------------------------------------------ life cycle
    def connect(self) -> None:
        """Attach to the process's world (creating the robot alone when there is none; see the module doc).

        Raises:
            HardwareUnavailableError: MuJoCo is not installed, or the world does not have these joints.
        """
        if self.shared is not None:
            return
        if importlib.util.find_spec("mujoco") is None:  # say so here rather than deep in a model build
            raise HardwareUnavailableError("the sim backend (the physical twin) needs MuJoCo: pip install -c "
                                           "requirements/constraints.txt mujoco (or use the kinematic backend)")

        def make():
            _LOG.warning("sim backend: no twin node in this process, so the robot runs alone (no table, no objects); "
                         "start the twin node in the same process for a task scene (rynn-teleop run twin "
                         "arm_driver hand_driver)")
            return _robot_alone()

        shared = attach(self.world_name, self.user, make)
        try:
            self._index = shared.world.indices(self.joint_names)
        except Exception:
            detach(self.world_name, self.user)
            raise
        self.shared = shared
        self._generation = shared.generation

    def enable(self) -> None:
        self._shared()
        self._hold()
        self._enabled, self._stopped = True, False

    def read(self, now: float) -> JointReading:
        shared = self._shared()
        with shared.lock:
            shared.advance(now)
            sample = shared.world.joint_state(self.joint_names)
            if shared.generation != self._generation:
                self._generation = shared.generation
                self._jumped = True
        return JointReading(sample.position, sample.velocity, sample.effort, now)

    def write(self, position: np.ndarray) -> None:
        if self._stopped or not self._enabled:
            return
        self._world().set_targets(position, self.joint_names)
        self.writes += 1

    def stop(self) -> None:
        self._stopped = True
        self._hold()

    def disable(self) -> None:
        self._enabled = False
        self._hold()

    def close(self) -> None:
        self._enabled = False
        if self.shared is not None:
            self.shared = None
            detach(self.world_name, self.user)

    def discontinuity(self) -> bool:
        """True once after the world was reset (the measured joints jumped to the home posture)."""
        jumped, self._jumped = self._jumped, False
        return jumped

    def status(self) -> Mapping[str, Any]:
        shared = self.shared
        if shared is None:
            return {"world": self.world_name, "attached": False}
        return {"world": self.world_name, "attached": True, "world_owner": shared.owner,
                "scene": shared.world.scene.name if shared.world.scene is not None else "(robot alone)",
                "sim_time_s": round(shared.world.time, 3), "stopped": self._stopped}

    # ------------------------------------------------------------------ helpers
    def _shared(self) -> SharedWorld:
        if self.shared is None:
            raise HardwareUnavailableError(f"sim backend ({self.user}): not connected to a physics world")
        return self.shared

    def _world(self):
        return self._shared().world

    def _hold(self) -> None:
        """Servo targets at the measured positions (a soft stop); nothing when not connected."""
        shared = self.shared
        if shared is None:
            return
        world, idx = shared.world, self._index
        with world.lock:  # a joint pressed just past its range holds at the range's end (no clipping warning)
            held = np.clip(world.joint_state(self.joint_names).position, world.index.lower[idx], world.index.upper[idx])
            world.set_targets(held, self.joint_names)


@ARM_BACKENDS.register
class TwinArms(TwinJoints):
    """The arm_driver's sim backend: both arms' 14 joints of the physical twin."""


@HAND_BACKENDS.register
class TwinHands(TwinJoints):
    """The hand_driver's sim backend: the driven hands' 20 joints each, of the physical twin."""
