"""The robot's and the operator's fixed layout: sides, tracker roles, joint counts.

Every module that loops over sides or roles, or sizes an arm or hand vector, uses these names; the
canonical 54-joint order built from them lives in :mod:`.robot_model`.
"""

from __future__ import annotations

SIDES: tuple[str, ...] = ("left", "right")
"""The robot's two sides (and the operator's), in the one order used everywhere."""

ROLES: tuple[str, ...] = ("chest", "left_elbow", "right_elbow", "left_wrist", "right_wrist")
"""Where the five trackers are worn (``*_elbow`` trackers sit on the upper arm), in the one order used
everywhere: the poses of a ``<topic_prefix>/trackers`` ``geometry_msgs/PoseArray`` frame (tracker node),
its replay and its consumers (arm_ik), and the rows of a frame's (5, 4, 4) matrices (``core.trackers``)."""

N_ARM = 7  # joints per Marvin arm
N_FINGERS = 5  # fingers per Wuji hand
N_FINGER_JOINTS = 4  # joints per finger
N_HAND = N_FINGERS * N_FINGER_JOINTS  # 20 joints per Wuji hand
N_JOINTS = len(SIDES) * (N_ARM + N_HAND)  # 54 actuated joints
