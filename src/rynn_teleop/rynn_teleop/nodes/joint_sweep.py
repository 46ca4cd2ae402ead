"""joint_sweep node: a limit-respecting test pattern on /joint_states.

Moves the selected joint groups through smooth sinusoids inside their
position, velocity, acceleration and jerk limits (``core.joint_sweep``) and
holds the others at the neutral posture. For checking the description in
RViz, the marker publisher and the world model's conditioning without
hardware; never run it beside real drivers (both would publish /joint_states).
"""

from __future__ import annotations

import numpy as np
from sensor_msgs.msg import JointState

from ..core.joint_sweep import JointSweep
from ..core.node_io import NodeIO, QoS, Topic
from ..core.params import STR_LIST, Param, ParamSchema
from ..core.robot_model import GROUPS
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single

GROUP_NAMES = ("left_arm", "right_arm", "left_hand", "right_hand")


class JointSweepNode(TeleopNode):
    PRIORITY = "input"  # a command source, like arm_ik
    SCHEMA = ParamSchema(
        "joint_sweep",
        [
            DESCRIPTION_OVERLAY,
            Param("rate_hz", float, 100.0, "publication rate", "Hz", min=1.0, max=1000.0),
            Param("period_s", float, 8.0, "sweep period", "s", min=0.5, max=600.0),
            Param("amplitude_fraction", float, 0.5, "fraction of each joint's position range swept",
                  min=0.01, max=1.0),
            Param("limit_margin", float, 0.9, "fraction of the velocity/acceleration/jerk limits used",
                  min=0.05, max=1.0),
            Param("groups", STR_LIST, list(GROUP_NAMES), "joint groups that move (others hold)", choices=GROUP_NAMES),
            Param("topic", str, "/joint_states", "output topic"),
        ],
    )
    IO = NodeIO(publishers=(
        Topic("{topic}", "sensor_msgs/msg/JointState", QoS(10), "the 54 joints in canonical order, position and "
              "velocity, at rate_hz"),
    ))

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        self.robot = robot_from_overlay(p["description_overlay"])
        self._moving = np.zeros(len(self.robot.joint_names), dtype=bool)
        for g in p["groups"]:
            self._moving[getattr(GROUPS, g)] = True
        self._hold = self.robot.neutral()
        self.sweep = JointSweep(
            self.robot.limits[self._moving], p["period_s"], p["amplitude_fraction"], p["limit_margin"],
            center=self._hold[self._moving],
        )
        self._pub = self.io_publisher("{topic}")
        self._t0 = self.now_s()
        self._timer = self.create_timer(1.0 / p["rate_hz"], self._tick)

    def _tick(self) -> None:
        now = self.get_clock().now()
        state = self.sweep.sample(now.nanoseconds * 1e-9 - self._t0)
        q = self._hold.copy()
        v = np.zeros_like(q)
        q[self._moving] = state.position
        v[self._moving] = state.velocity
        msg = JointState(name=list(self.robot.joint_names), position=q.tolist(), velocity=v.tolist())
        msg.header.stamp = now.to_msg()
        self._pub.publish(msg)
        self.meter("joint_states").tick(now.nanoseconds * 1e-9)


def main(args=None) -> int:
    return run_single(JointSweepNode, args)
