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
drive a source without a wall clock.

The hand_retarget node's backends (its ``backend`` parameter) are of two kinds: a :class:`HandSource` it
polls, or :class:`MessageHands`, skeletons that arrive as ROS messages the node subscribes to. A new backend
is a module of this package (or an entry point of group ``rynn_teleop.hand_retarget``) with a subclass of
either, decorated ``@HAND_BACKENDS.register``: it sets ``name`` and its ``SETTINGS`` and builds itself from
them and the :class:`HandContext` (:meth:`~rynn_teleop.core.plugins.Backend.from_settings`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ...core.layout import SIDES
from ...core.plugins import Backend, BackendRegistry
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


class HandContext(NamedTuple):
    """What the hand_retarget node tells the backend it builds."""

    sides: tuple[str, ...]  # the hands the node drives
    rate_hz: float  # [Hz] the node's polling rate (of a polled source)
    skeleton_prefix: str  # the node publishes <skeleton_prefix>/<side>/skeleton (a replay reads recorded ones)


class HandSource(PolledSource[HandSample]):
    """A non-blocking supplier of hand skeletons.

    Life cycle and context manager: :class:`~rynn_teleop.sources.base.PolledSource`.
    """

    #: its samples come at the node's ``rate_hz`` (the node meters them against it)
    follows_rate_hz: ClassVar[bool] = False


class HandMessageError(ValueError):
    """A hand message that cannot be turned into 21 keypoints (the node counts it and drops it)."""


class MessageHands(Backend, ABC):
    """Hand skeletons that arrive as ROS messages (ROS-free: messages are read by attribute).

    The node imports :attr:`message_type`, subscribes to every topic of :meth:`topics` and hands each message
    to :meth:`convert`; the skeleton is processed as it arrives, stamped with the message's header stamp.
    """

    #: the message type, "package/msg/Type" (imported by the node when it starts)
    message_type: ClassVar[str]
    #: how to get the message package when it cannot be imported
    message_hint: ClassVar[str] = ""

    @abstractmethod
    def topics(self) -> Mapping[str, str | None]:
        """Topic -> the side its messages carry (None: each message says)."""

    @abstractmethod
    def convert(self, topic: str, side: str | None, message: Any) -> tuple[str, np.ndarray]:
        """The side and the (21, 3) keypoints [m] of one message (``side``: the topic's, from :meth:`topics`).

        Raises:
            HandMessageError: the message holds no usable skeleton.
        """


#: the hand_retarget node's backends (``backend`` parameter): every module of this package, and entry points of
#: group ``rynn_teleop.hand_retarget``
HAND_BACKENDS = BackendRegistry("hand_retarget", "hand_retarget backend", package=__package__,
                                base=(HandSource, MessageHands))


