"""21-point hand skeletons published by any hand tracker as ``geometry_msgs/PoseArray`` (ROS-free).

Camera hand trackers and XR headsets publish one PoseArray per hand and frame: the 21 MediaPipe keypoints'
positions in the wrist frame (orientations unused), stamped with the capture time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...core.node_io import SENSOR_DATA, Each, NodeIO, Topic
from ...core.params import Param
from .base import HAND_BACKENDS, HandContext, MessageHands


@HAND_BACKENDS.register
class SkeletonTopics(MessageHands):
    """One PoseArray topic per hand (``{side}`` in ``input_topic`` replaced by left / right)."""

    name = "skeleton"
    message_type = "geometry_msgs/msg/PoseArray"
    SETTINGS = (
        Param("input_topic", str, "/hand_tracking/{side}/skeleton", "PoseArray input per hand ({side} replaced)"),
    )
    IO = NodeIO(subscriptions=(
        Topic("{input_topic}", "geometry_msgs/msg/PoseArray", SENSOR_DATA,
              "one hand per message: the 21 MediaPipe keypoints' positions in the wrist frame, stamped with the "
              "capture time", each=Each("side", param="sides")),
    ))

    def __init__(self, input_topic: str, sides: tuple[str, ...]) -> None:
        self._topics = {input_topic.replace("{side}", side): side for side in sides}

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: HandContext) -> SkeletonTopics:
        return cls(settings["input_topic"], context.sides)

    def topics(self) -> dict[str, str | None]:
        return dict(self._topics)

    def convert(self, topic: str, side: str | None, message: Any) -> tuple[str, np.ndarray]:
        """The positions of the poses (any count: the node checks the skeleton)."""
        points = np.array([[q.position.x, q.position.y, q.position.z] for q in message.poses]).reshape(-1, 3)
        return side, points
