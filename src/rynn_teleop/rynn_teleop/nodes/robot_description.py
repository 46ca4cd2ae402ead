"""robot_description node: publishes the generated URDF on a latched topic.

Labs with robot_state_publisher can feed it the same text
(``rynn-teleop urdf``); this node exists for machines without it and so
that recorded episodes carry the exact description they were made with.
"""

from __future__ import annotations

import hashlib

from std_msgs.msg import String

from ..core.node_io import LATCHED, NodeIO, Topic
from ..core.params import Param, ParamSchema
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single


class RobotDescriptionNode(TeleopNode):
    SCHEMA = ParamSchema(
        "robot_description",
        [
            DESCRIPTION_OVERLAY,
            Param("topic", str, "/robot_description", "topic the URDF is published on (latched)"),
        ],
    )
    IO = NodeIO(publishers=(
        Topic("{topic}", "std_msgs/msg/String", LATCHED, "the URDF, once at start (latched: every later "
              "subscriber gets it)"),
    ))

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.robot = robot_from_overlay(self.params["description_overlay"])
        self.sha256 = hashlib.sha256(self.robot.urdf.encode()).hexdigest()
        self._pub = self.io_publisher("{topic}")
        self._pub.publish(String(data=self.robot.urdf))
        self.get_logger().info(
            f"published the robot description ({len(self.robot.urdf)} bytes, sha256 {self.sha256[:12]})"
        )

    def diagnostic_values(self):
        return {"urdf_sha256": self.sha256, "joints": len(self.robot.joint_names)}


def main(args=None) -> int:
    return run_single(RobotDescriptionNode, args)
