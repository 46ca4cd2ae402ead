"""arm_driver node: the two TIANJI M6 / Marvin arms (14 joints), vendor SDK or simulation.

Follows ``/arms/command`` (from ``arm_ik``) through the safety layer
(``nodes.driver``) and publishes the measured arm joints on ``/joint_states``.
Backend ``marvin``: the vendor's ``fx_robot`` from ``sdk_path`` (not on PyPI),
controller at ``ip``, targets streamed in degrees, arm A/B mapped to
left/right by ``arm_a_side``; ``sim``: a kinematic simulation (digital
teleoperation, tests).
"""

from __future__ import annotations

import numpy as np

from ..core.arm_teleop import DEFAULT_HOME
from ..core.layout import SIDES
from ..core.params import FLOAT_LIST, Param, ParamSchema
from ..core.robot_model import GROUPS, arm_joint_names
from ..hardware.sim import SimBackend
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import run_single
from .driver import JointDriverNode, safety_params


class ArmDriverNode(JointDriverNode):
    SCHEMA = ParamSchema(
        "arm_driver",
        [
            DESCRIPTION_OVERLAY,
            Param("backend", str, "sim", "joint backend", choices=("sim", "marvin")),
            *safety_params(rate_hz=200.0, timeout=0.1),
            Param("command_topic", str, "/arms/command", "arm commands (sensor_msgs/JointState)"),
            Param("sim.initial_position", FLOAT_LIST, list(DEFAULT_HOME),
                  "sim backend: starting arm joints, left 1-7 then right", "rad", min=-3.2, max=3.2, length=14),
            Param("marvin.sdk_path", str, "",
                  "marvin backend: the SDK's SDK_PYTHON folder (fx_robot.py, libMarvinSDK.so)"),
            Param("marvin.ip", str, "192.168.1.190", "marvin backend: controller address"),
            Param("marvin.arm_a_side", str, "left", "marvin backend: which side the controller's arm 'A' is",
                  choices=SIDES),
            Param("marvin.vel_ratio", float, 30.0, "marvin backend: controller velocity ratio", "%",
                  min=1.0, max=100.0),
            Param("marvin.acc_ratio", float, 30.0, "marvin backend: controller acceleration ratio", "%",
                  min=1.0, max=100.0),
        ],
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        robot = robot_from_overlay(p["description_overlay"])
        names = arm_joint_names("left") + arm_joint_names("right")
        if p["backend"] == "sim":
            idx = np.r_[GROUPS.left_arm, GROUPS.right_arm]
            backend = SimBackend(names, robot.limits[idx], np.array(p["sim.initial_position"]),
                                 bandwidth_hz=p["sim.bandwidth_hz"], latency_s=p["sim.latency_s"])
        else:
            from ..hardware.marvin import MarvinBackend, MarvinConfig  # only with the vendor SDK

            a = p["marvin.arm_a_side"]
            backend = MarvinBackend(MarvinConfig(
                p["marvin.sdk_path"], ip=p["marvin.ip"],
                arm_map={a: "A", ("right" if a == "left" else "left"): "B"},
                vel_ratio=p["marvin.vel_ratio"], acc_ratio=p["marvin.acc_ratio"], rate_limit_hz=p["rate_hz"],
            ))
        self._start(robot, backend, p["command_topic"])
        self.get_logger().info(f"{backend.kind} arms, {p['rate_hz']:.0f} Hz, commands from {p['command_topic']}")


def main(args=None) -> int:
    return run_single(ArmDriverNode, args)
