"""Common interface of the body-tracker sources (ROS-free).

A source yields :class:`TrackerSample` records: the pose of one tracker,
identified by its serial number (e.g. ``LHR-1A2B3C4D``), in the source's own
tracking world frame (:attr:`TrackerSource.world_frame`). Which body part a
serial is worn on (its *role*) comes from configuration, not from the source;
the calibration downstream maps the tracking world onto the robot.

Times are caller-supplied [s] (``now`` arguments), so tests and replays can
drive a source without a wall clock. A new backend (e.g. libsurvive) is a
module of this package (or an entry point of group ``rynn_teleop.tracker``)
with a subclass of :class:`TrackerSource` decorated ``@TRACKER_BACKENDS.register``:
it sets ``name`` and its ``SETTINGS``, builds itself from them and the
:class:`TrackerContext` (:meth:`~rynn_teleop.core.plugins.Backend.from_settings`)
and implements ``start``, ``read`` and ``close``, recording every serial it
emits with ``_saw``. The tracker node offers it as ``backend:=<name>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, NamedTuple

from ...core.plugins import BackendRegistry
from ...core.trackers import TrackerSample
from ..base import PolledSource


class TrackerContext(NamedTuple):
    """What the tracker node tells the backend it builds."""

    serials: Mapping[str, str]  # role -> serial of every role (ROLES)
    rate_hz: float  # [Hz] the node's polling and publication rate
    topic: str  # the node's output topic (a replay reads the recorded one)


class TrackerSource(PolledSource[TrackerSample]):
    """A non-blocking supplier of tracker poses.

    Life cycle: construct (cheap, no device access) -> :meth:`start` -> any
    number of :meth:`read` -> :meth:`close`. Used as a context manager,
    ``__enter__`` returns the source *without* starting it and ``__exit__``
    closes it.
    """

    #: its samples come at the node's ``rate_hz`` (the node meters them against it); a replay's come at the
    #: recording's rate
    follows_rate_hz: ClassVar[bool] = True
    #: it reports the configured serials itself (a synthetic operator, a replay mapped by role); otherwise a
    #: device reports its own, and the node lists them when a role has no serial
    impersonates_serials: ClassVar[bool] = False

    def __init__(self, world_frame: str) -> None:
        self.world_frame = world_frame  # frame id of the tracking world
        self._seen: set[str] = set()

    def serials_seen(self) -> set[str]:
        """Every serial observed so far (a copy)."""
        return set(self._seen)

    def _saw(self, serial: str) -> None:
        """Record that ``serial`` was observed (for :meth:`serials_seen`)."""
        self._seen.add(serial)


#: the tracker node's backends (``backend`` parameter): every module of this package, and entry points of group
#: ``rynn_teleop.tracker``
TRACKER_BACKENDS = BackendRegistry("tracker", "tracker backend", package=__package__, base=TrackerSource)
