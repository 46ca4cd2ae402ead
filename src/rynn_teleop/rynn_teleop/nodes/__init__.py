"""Thin ROS 2 nodes: parameters, message <-> numpy conversion, publishing.

:data:`REGISTRY` maps each node's name (its executable, its YAML file
``config/<name>.yaml`` and its default ROS node name) to its class. The
console scripts in ``setup.py`` list the same names, and the reference pages
and the architecture overview are generated from each class's ``SCHEMA`` and
``IO`` (``docs/gen_reference.py``); tests keep them in step.
"""

from __future__ import annotations

import importlib

REGISTRY: dict[str, str] = {
    "robot_description": "rynn_teleop.nodes.robot_description:RobotDescriptionNode",
    "joint_sweep": "rynn_teleop.nodes.joint_sweep:JointSweepNode",
    "robot_markers": "rynn_teleop.nodes.robot_markers:RobotMarkersNode",
    "tracker": "rynn_teleop.nodes.tracker:TrackerNode",
    "arm_ik": "rynn_teleop.nodes.arm_ik:ArmIKNode",
    "hand_retarget": "rynn_teleop.nodes.hand_retarget:HandRetargetNode",
    "policy": "rynn_teleop.nodes.policy:PolicyNode",
    "arm_driver": "rynn_teleop.nodes.arm_driver:ArmDriverNode",
    "hand_driver": "rynn_teleop.nodes.hand_driver:HandDriverNode",
    "twin": "rynn_teleop.nodes.twin:TwinNode",
    "head_camera": "rynn_teleop.nodes.head_camera:HeadCameraNode",
    "camera_switch": "rynn_teleop.nodes.camera_switch:CameraSwitchNode",
    "world_model": "rynn_teleop.nodes.world_model:WorldModelNode",
    "recorder": "rynn_teleop.nodes.recorder:RecorderNode",
    "console": "rynn_teleop.nodes.console:ConsoleNode",
    "foxglove": "rynn_teleop.nodes.foxglove:FoxgloveNode",
}


def node_class(name: str):
    """The node class registered under ``name`` (imports rclpy)."""
    from ..errors import ConfigurationError

    try:
        target = REGISTRY[name]
    except KeyError:
        raise ConfigurationError(f"unknown node {name!r}; known nodes: {', '.join(REGISTRY)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
