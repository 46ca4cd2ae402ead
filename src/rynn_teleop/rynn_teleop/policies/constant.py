"""The ``constant`` policy backend: one fixed action whatever the observation (a stand-in for tests and dry runs).

It needs no policy folder and no LeRobot: its :class:`~.base.PolicySpec` is built from its settings (the frame
rate, one camera key and the size its images are resized to, the joint names), and :meth:`ConstantPolicy.act`
returns the configured action, by default the robot's home posture (:func:`~rynn_teleop.sim.rollout.home_posture`:
the arms at ``config/arm_ik.yaml``'s ``home_position``, the hands open). ``delay_s`` makes each :meth:`act` block
that long, as a real policy's inference does. ``joint_names`` and ``action`` may be set to another robot's on
purpose: such a policy is refused when it is built, as :meth:`PolicySpec.check` refuses any policy for another
robot.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.params import FLOAT_LIST, STR_LIST, Param
from ..core.robot_model import CANONICAL_JOINT_NAMES
from ..errors import ConfigurationError
from .base import POLICY_BACKENDS, PolicyContext, PolicyRunner, PolicySpec, image_key

#: camera keys a spec may name (``recording.frames.FEED_TOPICS``; listed here: this module imports no recording)
CAMERA_KEYS = ("physical", "generated", "consumer")


@POLICY_BACKENDS.register
class ConstantPolicy(PolicyRunner):
    """Always the same action (see the module doc).

    Args:
        action: the action [rad], one value per name of ``joint_names``; empty: the robot's home posture.
        fps: [Hz] the spec's frame rate (act() is called this often).
        camera: the one camera key the spec takes.
        image_height, image_width: [px] the size of that camera's images in the spec.
        joint_names: the spec's state and action joint names, in order; empty: the robot's.
        delay_s: [s] each act() blocks this long (a policy's inference time).
        robot_names: the robot's joints (what the spec is checked against).

    Raises:
        ConfigurationError: an action whose length is not the number of joint names, a non-finite action, or a
            spec that is not for this robot (:meth:`PolicySpec.check`: the first mismatch named).
    """

    name = "constant"
    SETTINGS = (
        Param("action", FLOAT_LIST, [], "the action returned at every step, one value per joint of joint_names; "
              "empty: the robot's home posture (config/arm_ik.yaml home_position, hands open)", "rad"),
        Param("fps", float, 30.0, "the policy's frame rate (act() is called this often)", "Hz", min=0.5, max=1000.0),
        Param("camera", str, "physical", "the camera key the policy takes", choices=CAMERA_KEYS),
        Param("image_height", int, 96, "height of the images the policy takes", "px", min=8, max=4096),
        Param("image_width", int, 128, "width of the images the policy takes", "px", min=8, max=4096),
        Param("joint_names", STR_LIST, [], "the policy's joint order (state and action); empty: the robot's "
              "(another robot's is refused at start)"),
        Param("delay_s", float, 0.0, "each act() blocks this long (as a policy's inference would)", "s",
              min=0.0, max=10.0),
    )

    def __init__(self, action: Sequence[float] = (), *, fps: float = 30.0, camera: str = "physical",
                 image_height: int = 96, image_width: int = 128, joint_names: Sequence[str] = (),
                 delay_s: float = 0.0, robot_names: Sequence[str] = CANONICAL_JOINT_NAMES) -> None:
        names = tuple(joint_names) or tuple(robot_names)
        described = "the robot's home posture"
        if len(action) == 0:
            if names != tuple(robot_names):
                raise ConfigurationError("constant policy: an empty action means the robot's home posture, which "
                                         f"has {len(robot_names)} values; joint_names lists {len(names)}: give the "
                                         "action too")
            from ..sim.rollout import home_posture  # the robot description and config/arm_ik.yaml: at build time

            action = home_posture()
        else:
            described = "a configured action"
        values = np.asarray(action, dtype=float).reshape(-1)
        if values.shape != (len(names),):
            raise ConfigurationError(f"constant policy: the action has {values.size} values, joint_names "
                                     f"{len(names)}: one value per joint")
        if not np.all(np.isfinite(values)):
            raise ConfigurationError("constant policy: the action holds a value that is not finite")
        self.action = values
        self.action.flags.writeable = False
        self.delay_s = float(delay_s)
        self.spec = PolicySpec(float(fps), names, names, {camera: (int(image_height), int(image_width))},
                               source=f"constant action ({described})")
        self.spec.check(robot_names)
        self.calls = 0  # [-] act() calls since the last reset
        self.resets = 0  # [-] reset() calls

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: PolicyContext | None) -> ConstantPolicy:
        robot = getattr(context, "robot", None)
        names = tuple(robot.joint_names) if robot is not None else CANONICAL_JOINT_NAMES
        return cls(settings["action"], fps=settings["fps"], camera=settings["camera"],
                   image_height=settings["image_height"], image_width=settings["image_width"],
                   joint_names=settings["joint_names"], delay_s=settings["delay_s"], robot_names=names)

    def reset(self) -> None:
        self.calls = 0
        self.resets += 1

    def act(self, observation: Mapping[str, np.ndarray]) -> np.ndarray:
        """The configured action [rad] (a copy), after ``delay_s``; the observation must hold the spec's image.

        Raises:
            ValueError: the observation lacks the spec's camera image.
        """
        key = image_key(next(iter(self.spec.images)))
        if key not in observation:
            raise ValueError(f"the observation has no {key!r} (it has {', '.join(observation) or 'nothing'})")
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        self.calls += 1
        return self.action.copy()
