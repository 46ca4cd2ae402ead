"""Common interface of the hand-skeleton sources (ROS-free).

A source yields :class:`HandSample` records: the 21 MediaPipe keypoints of one
hand (layout in :mod:`rynn_teleop.core.hand_skeleton`) in that hand's own
wrist frame. Which wrist-frame convention a source uses is its own business:
the consumer builds its palm frame from the points alone
(:func:`rynn_teleop.core.hand_skeleton.palm_frame`), so any consistent,
right-handed-or-mirrored convention works.

Sources do not validate the skeletons they hand out: a sample may have the
wrong number of points or NaN coordinates, and the consumer checks every one
(:func:`rynn_teleop.core.hand_skeleton.check`), counts the bad ones and holds
the last good pose.

Times are caller-supplied [s] (``now`` arguments), so tests and replays can
drive a source without a wall clock. A new backend subclasses
:class:`HandSource`, sets ``kind`` and implements ``start``, ``read`` and
``close``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from ...core.layout import SIDES
from ...errors import ConfigurationError
from ..base import PolledSource


def check_sides(sides: str | Sequence[str], what: str) -> tuple[str, ...]:
    """``sides`` as a tuple; ConfigurationError naming ``what`` if it is empty, unknown or repeated."""
    sides = (sides,) if isinstance(sides, str) else tuple(sides)
    if not sides:
        raise ConfigurationError(f"{what}: no side given (sides is empty)")
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        raise ConfigurationError(
            f"{what}: unknown side(s) {', '.join(map(repr, unknown))}; sides are {', '.join(SIDES)}")
    if len(set(sides)) != len(sides):
        raise ConfigurationError(f"{what}: a side is repeated")
    return sides


class HandSample(NamedTuple):
    """The skeleton of one hand at one time."""

    side: str  # "left" | "right"
    stamp: float  # capture time [s] on the caller's clock (the ``now`` values given to read)
    points: np.ndarray  # (21, 3) MediaPipe keypoints [m] in the hand's wrist frame (may be malformed, see module doc)


class HandSource(PolledSource[HandSample]):
    """A non-blocking supplier of hand skeletons.

    Life cycle and context manager: :class:`~rynn_teleop.sources.base.PolledSource`.
    """

    kind: ClassVar[str]  # "synthetic" | "replay"


