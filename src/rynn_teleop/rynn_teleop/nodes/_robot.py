"""Shared parameter and construction of the robot model for nodes."""

from __future__ import annotations

from ..core.params import Param
from ..core.robot_model import RobotModel

DESCRIPTION_OVERLAY = Param(
    "description_overlay",
    str,
    "",
    "YAML overriding urdf/robot.yaml (mounts, adapters, camera pose, limits); empty = defaults",
)


def robot_from_overlay(overlay: str) -> RobotModel:
    """The robot model for a node's ``description_overlay`` parameter."""
    return RobotModel.from_description(overlay) if overlay else RobotModel.default()
