"""The interface of a policy runner (ROS-free; a runner that needs torch imports it when it is built).

A runner is a :class:`~rynn_teleop.core.plugins.Backend`: registered by ``name`` with its ``SETTINGS`` in
:data:`POLICY_BACKENDS` and built from them and a :class:`PolicyContext`. Per control step it takes the newest
observation and returns the action to command.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..core.plugins import Backend, BackendRegistry
from ..core.robot_model import CANONICAL_JOINT_NAMES

if TYPE_CHECKING:
    from ..core.robot_model import RobotModel


STATE_KEY = "observation.state"  # (54,) float32 [rad] measured joint positions, robot joint order
ACTION_KEY = "action"  # (54,) float32 [rad] joint position targets, robot joint order
IMAGE_PREFIX = "observation.images."  # + camera key (recording.frames.FEED_TOPICS): (H, W, 3) uint8 RGB


def image_key(camera: str) -> str:
    """The LeRobot feature name of camera key ``camera`` (``physical``, ``generated``, ``consumer``)."""
    return IMAGE_PREFIX + camera


class PolicySpec(NamedTuple):
    """What a policy takes and gives, as the dataset it was trained on defines them (LeRobot feature layout:
    the same keys, shapes and joint order as ``rynn-teleop episodes export`` writes)."""

    fps: float  # [Hz] the dataset's frame rate: act() is called this often
    state_names: tuple[str, ...]  # joint names of observation.state, in order
    action_names: tuple[str, ...]  # joint names of action, in order
    images: Mapping[str, tuple[int, int]]  # camera key -> (height, width) [px] the policy takes
    source: str = ""  # where this came from (a policy folder, a recorded episode), for messages

    def check(self, names: Sequence[str] = CANONICAL_JOINT_NAMES) -> None:
        """Refuse a policy that is not for the robot whose joints are ``names`` (in order).

        Raises:
            ConfigurationError: naming the first mismatch (action or state dimension, joint order, camera key).
        """
        from ..errors import ConfigurationError
        from ..recording.frames import FEED_TOPICS

        names = tuple(names)
        where = f" ({self.source})" if self.source else ""
        for what, got in (("action", self.action_names), ("observation.state", self.state_names)):
            if len(got) != len(names):
                raise ConfigurationError(f"the policy's {what} has {len(got)} dimensions, the robot has {len(names)} "
                                         f"joints{where}: not a policy for this robot")
            wrong = [i for i, (a, b) in enumerate(zip(got, names)) if a != b]
            if wrong:
                i = wrong[0]
                raise ConfigurationError(f"the policy's {what} joint order differs from the robot's at {len(wrong)} "
                                         f"place(s), first at index {i}: {got[i]!r} where the robot has "
                                         f"{names[i]!r}{where}")
        unknown = [k for k in self.images if k not in FEED_TOPICS]
        if unknown:
            raise ConfigurationError(f"the policy takes camera {unknown[0]!r}, which is not a feed of this robot "
                                     f"({', '.join(FEED_TOPICS)}){where}")
        if not self.fps > 0:
            raise ConfigurationError(f"the policy's frame rate {self.fps} Hz is not positive{where}")


class PolicyContext(NamedTuple):
    """What a node running a policy tells the runner it builds."""

    robot: RobotModel  # the robot description (joint order of actions and observations)
    rate_hz: float  # [Hz] how often :meth:`PolicyRunner.act` is called


class PolicyRunner(Backend, ABC):
    """A learned controller: observations in, one action out per step.

    :attr:`spec` is known once the runner is built (from its policy folder), before the first :meth:`act`.
    """

    spec: PolicySpec

    @abstractmethod
    def reset(self) -> None:
        """Start a new episode (forget any history)."""

    @abstractmethod
    def act(self, observation: Mapping[str, np.ndarray]) -> np.ndarray:
        """The (54,) joint position action [rad] (robot joint order) for the newest ``observation``: LeRobot
        feature name -> array, as :class:`~.observation.ObservationBuilder` builds it (``observation.state``
        (54,) float32 [rad]; ``observation.images.<camera>`` (H, W, 3) uint8 RGB at :attr:`spec`'s size)."""

    def close(self) -> None:
        """Release resources (device memory, threads)."""


#: the policy runners: every module of this package, and entry points of group ``rynn_teleop.policy``
POLICY_BACKENDS = BackendRegistry("policy", "policy backend", package=__package__, base=PolicyRunner)
