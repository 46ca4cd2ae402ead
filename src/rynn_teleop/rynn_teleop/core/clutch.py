"""Relative-motion clutch (ROS-free).

While engaged, the robot follows the operator's motion *relative to the
moment of engagement*: at engagement (per side, at the side's first target)
the offset between the mapped operator pose and the robot's current
commanded pose is captured, and every later target is the mapped operator
pose composed with that offset. So engaging never makes the robot jump, and
the operator can re-position (disengage, move, engage) like lifting a mouse.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .layout import SIDES
from .transforms import make_transform


class ClutchOffset(NamedTuple):
    """Offset captured at engagement."""

    position: np.ndarray  # (3,) [m], added in the torso frame
    rotation: np.ndarray  # (3, 3), applied on the right (in the hand frame)


class Clutch:
    """Per-side operator-to-robot offsets, captured at engagement."""

    def __init__(self, sides: tuple[str, ...] = SIDES) -> None:
        self.sides = sides
        self.engaged = False
        self._offsets: dict[str, ClutchOffset] = {}
        self.engagements = 0  # [-] number of engage() calls that engaged

    def engage(self) -> None:
        """Engage; offsets are captured at each side's next :meth:`apply`.

        Engaging while engaged changes nothing (a pedal that keeps publishing
        "engaged" must not re-anchor the motion every message).
        """
        if self.engaged:
            return
        self.engagements += 1
        self.engaged = True
        self._offsets.clear()

    def release(self, side: str) -> None:
        """Forget ``side``'s offset: it is re-captured at its next :meth:`apply`
        (e.g. when its tracking resumes after a dropout)."""
        self._offsets.pop(side, None)

    def disengage(self) -> None:
        self.engaged = False
        self._offsets.clear()

    def offset(self, side: str) -> ClutchOffset | None:
        return self._offsets.get(side)

    def apply(self, side: str, mapped: np.ndarray, robot_now: np.ndarray | None) -> np.ndarray | None:
        """Robot target (4, 4) for the mapped operator pose, or None when disengaged.

        Args:
            side: arm side.
            mapped: (4, 4) operator pose mapped into the torso frame (calibration applied).
            robot_now: (4, 4) the robot hand's current commanded pose; needed only at
                the first call after engaging, when the offset is captured.
        """
        if not self.engaged:
            return None
        off = self._offsets.get(side)
        if off is None:
            if robot_now is None:
                raise ValueError(f"clutch offset of the {side} side not captured yet: robot_now is required")
            off = ClutchOffset(robot_now[:3, 3] - mapped[:3, 3], mapped[:3, :3].T @ robot_now[:3, :3])
            self._offsets[side] = off
        return make_transform(mapped[:3, 3] + off.position, mapped[:3, :3] @ off.rotation)

    def apply_point(self, side: str, point: np.ndarray) -> np.ndarray:
        """Shift a mapped point (the elbow hint) by the side's position offset (if captured)."""
        off = self._offsets.get(side)
        return point if off is None else point + off.position
