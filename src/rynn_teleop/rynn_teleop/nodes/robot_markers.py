"""robot_markers node: the robot's primitive geometry as RViz markers.

Merges partial ``/joint_states`` messages (arm and hand drivers publish
separate subsets) into the 54-joint state, and publishes every visual
primitive of the description at that state, in ``base_link``. Works without
robot_state_publisher and tf2 (neither is on PyPI).
"""

from __future__ import annotations

from rclpy.time import Time
from sensor_msgs.msg import JointState
from visualization_msgs.msg import Marker, MarkerArray

from ..core.joint_state import JointStateBuffer
from ..core.node_io import NodeIO, QoS, Topic
from ..core.params import Param, ParamSchema
from ..core.robot_geometry import RobotGeometry
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .conversions import matrices_to_poses

_KIND = {"box": Marker.CUBE, "cylinder": Marker.CYLINDER, "sphere": Marker.SPHERE}


class RobotMarkersNode(TeleopNode):
    SCHEMA = ParamSchema(
        "robot_markers",
        [
            DESCRIPTION_OVERLAY,
            Param("rate_hz", float, 30.0, "marker publication rate", "Hz", min=0.5, max=200.0),
            Param("frame_id", str, "base_link", "frame the markers are expressed in (the description root)"),
            Param("joint_states_topic", str, "/joint_states", "input joint states"),
            Param("topic", str, "/robot_markers", "output MarkerArray topic"),
        ],
    )
    IO = NodeIO(
        publishers=(Topic("{topic}", "visualization_msgs/msg/MarkerArray", QoS(10),
                          "every visual primitive of the description, in frame_id, at rate_hz once a joint state "
                          "arrived"),),
        subscriptions=(Topic("{joint_states_topic}", "sensor_msgs/msg/JointState", QoS(10),
                             "any subset of the 54 joints per message, merged by name"),),
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        self.robot = robot_from_overlay(p["description_overlay"])
        self.geometry = RobotGeometry(self.robot)
        self.state = JointStateBuffer(self.robot.neutral())
        self._template = self._make_template(p["frame_id"])
        self._pub = self.io_publisher("{topic}")
        self.io_subscription("{joint_states_topic}", self._on_joint_state)
        self.create_timer(1.0 / p["rate_hz"], self._tick)
        self._latest_stamp = None

    def _make_template(self, frame_id: str) -> list[Marker]:
        markers = []
        for i, prim in enumerate(self.geometry.primitives):
            m = Marker(ns=prim.link, id=i, type=_KIND[prim.kind], action=Marker.ADD)
            m.header.frame_id = frame_id
            m.scale.x, m.scale.y, m.scale.z = (float(s) for s in prim.size)
            m.color.r, m.color.g, m.color.b, m.color.a = (float(c) for c in prim.rgba)
            markers.append(m)
        return markers

    def _on_joint_state(self, msg: JointState) -> None:
        stamp = Time.from_msg(msg.header.stamp)
        if self.state.update(msg.name, msg.position, stamp.nanoseconds * 1e-9):
            self._latest_stamp = msg.header.stamp
            self.meter("joint_states_in").tick(self.now_s(), self.now_s() - stamp.nanoseconds * 1e-9)

    def _tick(self) -> None:
        if self._latest_stamp is None:
            return
        matrices_to_poses(self.geometry.poses(self.state.position), [m.pose for m in self._template])
        for marker in self._template:
            marker.header.stamp = self._latest_stamp
        self._pub.publish(MarkerArray(markers=self._template))
        self.meter("markers").tick(self.now_s())

    def diagnostic_values(self):
        return {"unknown_joint_names": len(self.state.unknown_names), "rejected_joint_states": self.state.rejected}


def main(args=None) -> int:
    return run_single(RobotMarkersNode, args)
