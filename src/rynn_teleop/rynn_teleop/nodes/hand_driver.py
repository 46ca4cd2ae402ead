"""hand_driver node: the two WUJI hands (40 joints), wujihandpy or simulation.

Follows ``/hands/command`` (from ``hand_retarget``; one hand per message is
fine) through the safety layer (``nodes.driver``) and publishes the measured
hand joints on ``/joint_states``. Also speaks the vendor ROS 2 driver's topic
shape (``vendor_topics``), so labs can swap drivers.
"""

from __future__ import annotations

import time

from sensor_msgs.msg import JointState

from ..core.layout import SIDES
from ..core.node_io import Each, NodeIO, Topic, merged, when
from ..core.params import STR_LIST, Param
from ..core.plugins import BackendSchema
from ..core.robot_model import hand_joint_names
from ..hardware.base import HAND_BACKENDS, DriverContext
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import run_single
from .driver import COMMAND_QOS, DRIVER_IO, JointDriverNode, safety_params


class HandDriverNode(JointDriverNode):
    SCHEMA = BackendSchema(
        "hand_driver",
        [
            DESCRIPTION_OVERLAY,
            Param("sides", STR_LIST, list(SIDES), "hands driven", choices=SIDES),
            *safety_params(rate_hz=100.0, timeout=0.2),
            Param("command_topic", str, "/hands/command", "hand commands (sensor_msgs/JointState, by name)"),
            Param("vendor_topics", bool, True, "also serve /hand_{side}/joint_states and /hand_{side}/joint_commands"),
        ],
        backends=HAND_BACKENDS, default="sim", description="joint backend",
    )
    IO = merged(DRIVER_IO, NodeIO(
        publishers=(Topic("/hand_{side}/joint_states", "sensor_msgs/msg/JointState", COMMAND_QOS,
                          "the vendor driver's shape: one hand's 20 joints, measured (built only while subscribed)",
                          when=(when("vendor_topics", True),), each=Each("side", param="sides")),),
        subscriptions=(Topic("/hand_{side}/joint_commands", "sensor_msgs/msg/JointState", COMMAND_QOS,
                             "the vendor driver's shape: 20 positions, names optional (vendor order = canonical)",
                             when=(when("vendor_topics", True),), each=Each("side", param="sides")),),
    ))

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        robot = robot_from_overlay(p["description_overlay"])
        self.sides = tuple(dict.fromkeys(p["sides"]))
        names = sum((hand_joint_names(s) for s in self.sides), ())
        backend = self.SCHEMA.create(p, DriverContext(names, robot.limits[robot.indices(names)], self.sides,
                                                      p["rate_hz"]))
        # set up before _start: it starts the control loop, whose ticks (publish_extra) may run before __init__ returns
        self._vendor_pubs = {}
        self._vendor_listened: set[str] = set()  # sides whose vendor topic has a subscriber
        self._vendor_checked_at = -float("inf")  # time.monotonic() of the last subscriber count [s]
        if p["vendor_topics"]:
            for side in self.sides:
                self._vendor_pubs[side] = self.io_publisher("/hand_{side}/joint_states", side=side)
                self.io_subscription("/hand_{side}/joint_commands", lambda m, s=side: self._on_vendor_command(s, m),
                                     side=side)
        self._start(robot, backend)
        self.get_logger().info(f"{backend.name} hands {', '.join(self.sides)}, {p['rate_hz']:.0f} Hz")

    def _on_vendor_command(self, side: str, msg: JointState) -> None:
        names = list(msg.name) if msg.name else list(hand_joint_names(side))  # vendor order = canonical order
        if any(not n.startswith(f"{side}_") for n in names):  # only this hand's joints on this hand's topic
            self.rejected_commands += 1
            return
        self.accept_command(names, msg.position, self.now_s())

    def publish_extra(self, joint_states: JointState) -> None:
        """The vendor-shaped per-hand topics, built only for a topic that has a subscriber (counted once a
        second)."""
        now = time.monotonic()
        if now >= self._vendor_checked_at + 1.0:
            self._vendor_checked_at = now
            self._vendor_listened = {s for s, pub in self._vendor_pubs.items() if pub.get_subscription_count() > 0}
        for side in self._vendor_listened:
            pub = self._vendor_pubs[side]
            k = self.sides.index(side) * 20
            out = JointState(name=joint_states.name[k:k + 20], position=joint_states.position[k:k + 20])
            if joint_states.effort:
                out.effort = joint_states.effort[k:k + 20]
            if joint_states.velocity:
                out.velocity = joint_states.velocity[k:k + 20]
            out.header = joint_states.header
            pub.publish(out)


def main(args=None) -> int:
    return run_single(HandDriverNode, args)
