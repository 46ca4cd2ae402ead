"""An XR headset's hand tracking: 25 WebXR joints per hand -> the 21 MediaPipe keypoints (ROS-free).

The operator console receives the headset's frames (WebXR, ``/xr`` page) and publishes each tracked hand's
25 joints (``core.xr.WEBXR_JOINTS`` order) as one ``geometry_msgs/PoseArray`` per hand and frame on
``xr.input_topic`` (default ``/xr/hands/{side}``, ``{side}`` replaced by left / right), in the ``xr_world``
frame, stamped with the frame's time on the console's clock. This backend maps each onto the 21 MediaPipe
keypoints in the glove path's wrist frame (``core.xr.hand_keypoints``: origin at the wrist joint, +z towards the
fingers, +x out of the palm; a left hand is the mirror image of a right one), which the hand_retarget node
retargets like a glove's.

Lost tracking: the console publishes nothing for an untracked hand, so the node repeats that hand's last
command (a hold); a hand that comes back is smoothed and velocity-limited from there, never a jump.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...core.node_io import SENSOR_DATA, Each, NodeIO, Topic
from ...core.params import Param
from ...core.xr import N_XR_JOINTS, hand_keypoints
from ...errors import ConfigurationError
from .base import HAND_BACKENDS, HandContext, HandMessageError, MessageHands, check_sides


@HAND_BACKENDS.register
class XRHands(MessageHands):
    """One PoseArray of 25 WebXR joints per hand and headset frame (see the module)."""

    name = "xr"
    message_type = "geometry_msgs/msg/PoseArray"
    SETTINGS = (
        Param("input_topic", str, "/xr/hands/{side}", "25 WebXR hand joints per headset frame (geometry_msgs/"
              "PoseArray from the console's /xr page; {side} replaced)"),
    )
    IO = NodeIO(subscriptions=(
        Topic("{input_topic}", "geometry_msgs/msg/PoseArray", SENSOR_DATA,
              "one tracked hand per headset frame: its 25 WebXR joints (the console's xr.hands_topic)",
              each=Each("side", param="sides")),
    ))

    def __init__(self, input_topic: str = "/xr/hands/{side}", sides: tuple[str, ...] = ("left", "right")) -> None:
        """
        Args:
            input_topic: the PoseArray topic of a hand, ``{side}`` replaced by its side.
            sides: the hands to take.

        Raises:
            ConfigurationError: no ``{side}`` in the topic (both hands on one topic), or a bad side.
        """
        sides = check_sides(sides, "xr hand source")
        if len(sides) > 1 and "{side}" not in input_topic:
            raise ConfigurationError(f"xr hand source: input_topic {input_topic!r} needs {{side}} (one topic per hand)")
        self._topics = {input_topic.replace("{side}", side): side for side in sides}

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: HandContext) -> XRHands:
        return cls(settings["input_topic"], context.sides)

    def topics(self) -> dict[str, str | None]:
        return dict(self._topics)

    def convert(self, topic: str, side: str | None, message: Any) -> tuple[str, np.ndarray]:
        """The topic's side and the 21 keypoints [m] in the wrist frame (``core.xr.hand_keypoints``).

        Raises:
            HandMessageError: not 25 poses, or a wrist pose that is not finite (no wrist frame); other
                non-finite joints give non-finite keypoints, which the node's check rejects (a hold).
        """
        poses = message.poses
        if len(poses) != N_XR_JOINTS:
            raise HandMessageError(f"expected the {N_XR_JOINTS} WebXR hand joints, got {len(poses)} poses")
        positions = np.array([[p.position.x, p.position.y, p.position.z] for p in poses])
        o = poses[0].orientation
        wrist = np.array([o.x, o.y, o.z, o.w])
        norm = float(np.linalg.norm(wrist))
        if not (np.isfinite(positions[0]).all() and np.isfinite(norm) and norm > 1e-6):
            raise HandMessageError("the wrist joint's pose is not finite: no wrist frame")
        return side, hand_keypoints(positions, wrist / norm)
