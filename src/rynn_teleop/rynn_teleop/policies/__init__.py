"""Policy runners: learned controllers that turn observations into the robot's 54-D action (ROS-free).

:data:`POLICY_BACKENDS` is where they register (a module of this package, or an
entry point of group ``rynn_teleop.policy``), like every other backend family (:mod:`rynn_teleop.core.plugins`).
"""

from __future__ import annotations

from .base import (
           ACTION_KEY,
           IMAGE_PREFIX,
           POLICY_BACKENDS,
           STATE_KEY,
           PolicyContext,
           PolicyRunner,
           PolicySpec,
           image_key,
)

__all__ = ["ACTION_KEY", "IMAGE_PREFIX", "POLICY_BACKENDS", "STATE_KEY", "PolicyContext", "PolicyRunner", "PolicySpec",
           "image_key"]
