"""Common interface of the body-tracker sources (ROS-free).

A source yields :class:`TrackerSample` records: the pose of one tracker,
identified by its serial number (e.g. ``LHR-1A2B3C4D``), in the source's own
tracking world frame (:attr:`TrackerSource.world_frame`). Which body part a
serial is worn on (its *role*) comes from configuration, not from the source;
the calibration downstream maps the tracking world onto the robot.

Times are caller-supplied [s] (``now`` arguments), so tests and replays can
drive a source without a wall clock. A new backend (e.g. libsurvive)
subclasses :class:`TrackerSource`, sets ``kind`` and implements ``start``,
``read`` and ``close``, recording every serial it emits with ``_saw``.
"""

from __future__ import annotations

from typing import ClassVar

from ...core.trackers import TrackerSample
from ..base import PolledSource


class TrackerSource(PolledSource[TrackerSample]):
    """A non-blocking supplier of tracker poses.

    Life cycle: construct (cheap, no device access) -> :meth:`start` -> any
    number of :meth:`read` -> :meth:`close`. Used as a context manager,
    ``__enter__`` returns the source *without* starting it and ``__exit__``
    closes it.
    """

    kind: ClassVar[str]  # "synthetic" | "replay" | "openvr"

    def __init__(self, world_frame: str) -> None:
        self.world_frame = world_frame  # frame id of the tracking world
        self._seen: set[str] = set()


    def serials_seen(self) -> set[str]:
        """Every serial observed so far (a copy)."""
        return set(self._seen)

    def _saw(self, serial: str) -> None:
        """Record that ``serial`` was observed (for :meth:`serials_seen`)."""
        self._seen.add(serial)

