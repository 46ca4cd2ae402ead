"""arm_driver node: the two TIANJI M6 / Marvin arms (14 joints), vendor SDK or simulation.

Follows ``/arms/command`` (from ``arm_ik``) through the safety layer
(``nodes.driver``) and publishes the measured arm joints on ``/joint_states``.
Backends (``backend`` parameter, registered in ``hardware``; each with its settings under ``<backend>.``):
``marvin``: the vendor's ``fx_robot`` from ``sdk_path`` (not on PyPI),
controller at ``ip``, targets streamed in degrees, arm A/B mapped to
left/right by ``arm_a_side``; ``sim``: a kinematic simulation (digital
teleoperation, tests).
"""

from __future__ import annotations

import time

from ..core.layout import SIDES
from ..core.params import Param
from ..core.plugins import BackendSchema
from ..core.robot_model import arm_joint_names
from ..hardware.base import ARM_BACKENDS, DriverContext
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import run_single
from .driver import DRIVER_IO, JointDriverNode, safety_params


class ArmDriverNode(JointDriverNode):
    SCHEMA = BackendSchema(
        "arm_driver",
        [
            DESCRIPTION_OVERLAY,
            *safety_params(rate_hz=200.0, timeout=0.1),
            Param("command_topic", str, "/arms/command", "arm commands (sensor_msgs/JointState)"),
        ],
        backends=ARM_BACKENDS, default="sim", description="joint backend",
    )
    IO = DRIVER_IO

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        robot = robot_from_overlay(p["description_overlay"])
        names = tuple(n for side in SIDES for n in arm_joint_names(side))
        # the vendor stream's rate limit counts on the control loop's deadline grid (hardware.base.DriverContext)
        context = DriverContext(names, robot.limits[robot.indices(names)], SIDES, p["rate_hz"],
                                clock=lambda: self.tick_due_time(time.monotonic()))
        backend = self.SCHEMA.create(p, context)
        self._start(robot, backend)
        self.get_logger().info(f"{backend.name} arms, {p['rate_hz']:.0f} Hz, commands from {p['command_topic']}")


def main(args=None) -> int:
    return run_single(ArmDriverNode, args)
