"""The interface of a policy runner (ROS-free; a runner that needs torch imports it when it is built).

A runner is a :class:`~rynn_teleop.core.plugins.Backend`: registered by ``name`` with its ``SETTINGS`` in
:data:`POLICY_BACKENDS` and built from them and a :class:`PolicyContext`. Per control step it takes the newest
observation and returns the action to command.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..core.plugins import Backend, BackendRegistry

if TYPE_CHECKING:
    from ..core.robot_model import RobotModel


class PolicyContext(NamedTuple):
    """What a node running a policy tells the runner it builds."""

    robot: RobotModel  # the robot description (joint order of actions and observations)
    rate_hz: float  # [Hz] how often :meth:`PolicyRunner.act` is called


class PolicyRunner(Backend, ABC):
    """A learned controller: observations in, one action out per step."""

    @abstractmethod
    def reset(self) -> None:
        """Start a new episode (forget any history)."""

    @abstractmethod
    def act(self, observation: Mapping[str, np.ndarray]) -> np.ndarray:
        """The (54,) joint position action [rad] (robot joint order) for the newest ``observation`` (name ->
        array: joint positions [rad], camera images RGB uint8, ...)."""

    def close(self) -> None:
        """Release resources (device memory, threads)."""


#: the policy runners: every module of this package, and entry points of group ``rynn_teleop.policy``
POLICY_BACKENDS = BackendRegistry("policy", "policy backend", package=__package__, base=PolicyRunner)
