"""Replay recorded hand skeletons from a rosbag2 (ROS-free, via ``rosbags``).

The bag (MCAP or sqlite3 storage) holds one ``geometry_msgs/msg/PoseArray``
topic per hand, ``<topic_prefix>/<side>/skeleton``, as recorded by this stack:
21 poses whose positions are the MediaPipe keypoints [m] in the hand's wrist
frame (orientations are ignored). Samples are timed by their header stamps
(the bag's receive time when a header stamp is zero) and played back on the
caller's clock.

Messages are replayed as recorded, without checks: one with a wrong number of
poses (or NaN coordinates) becomes a sample whose ``points`` has shape (N, 3),
N != 21, and the consumer counts and holds it like a bad live skeleton.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...core.layout import SIDES
from ...core.params import Param
from ...errors import ConfigurationError
from ..playback import Playback, ReplayTiming, bag_directory, loop_period, open_bag
from .base import HAND_BACKENDS, HandContext, HandSample, HandSource, check_sides

_LOG = logging.getLogger(__name__)

POSE_ARRAY = "geometry_msgs/msg/PoseArray"


@HAND_BACKENDS.register
class ReplayHands(ReplayTiming, HandSource):
    """Hand skeletons from a rosbag2 directory, re-timed onto the caller's clock.

    Playback stamp = ``now`` given to :meth:`start` + (recorded stamp - first
    recorded stamp) / ``rate_scale``. With ``loop`` the recording repeats
    without time going backwards: each pass starts one typical sample
    interval after the previous pass's last sample. :attr:`frame_ids` maps
    each replayed side to the ``frame_id`` of its first message, known after
    :meth:`start`.
    """

    name = "replay"
    SETTINGS = (
        Param("path", str, "", "rosbag2 directory of a recorded session"),
        Param("rate_scale", float, 1.0, "replay speed factor", min=0.05, max=20.0),
        Param("loop", bool, False, "restart the replay at its end"),
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: HandContext) -> ReplayHands:
        """The node's hands as recorded on its own skeleton topics."""
        return cls(path=settings["path"], topic_prefix=context.skeleton_prefix, rate_scale=settings["rate_scale"],
                   loop=settings["loop"], sides=context.sides)

    def __init__(
        self,
        path: str | Path,
        topic_prefix: str = "/operator/hand",
        rate_scale: float = 1.0,
        loop: bool = False,
        sides: Sequence[str] | None = None,
    ) -> None:
        """
        Args:
            path: rosbag2 directory (the folder holding ``metadata.yaml``); a file
                inside it (``metadata.yaml``, ``*.mcap``, ``*.db3``) is accepted too.
            topic_prefix: the recorded topics are ``<topic_prefix>/{left,right}/skeleton``.
            rate_scale: playback speed [-] (2 = twice as fast).
            loop: start over at the end instead of finishing.
            sides: the hands to replay, each of which must be in the bag;
                None: every hand the bag has.

        Raises:
            ConfigurationError: ``rate_scale`` <= 0, or an empty, unknown or
                repeated side.
        """
        if not rate_scale > 0:
            raise ConfigurationError(f"replay hand source: rate_scale must be > 0, got {rate_scale}")
        if sides is not None:
            sides = check_sides(sides, "replay hand source")
        self.path = Path(path)
        self.topic_prefix = "/" + topic_prefix.strip("/")
        self.rate_scale = float(rate_scale)
        self.loop = bool(loop)
        self.requested_sides: tuple[str, ...] | None = (
            None if sides is None else tuple(s for s in SIDES if s in sides)
        )
        self.sides: tuple[str, ...] = ()  # replayed sides, known after start
        self.frame_ids: dict[str, str] = {}
        self._playback: Playback | None = None  # recorded -> playback times (after start)
        self._rel: np.ndarray = np.empty(0)  # recorded stamp - first recorded stamp [s], sorted
        self._sides: list[str] = []
        self._points: list[np.ndarray] = []
        self._period = 0.0  # recorded time [s] of one pass, loop spacing included
        self._closed = False

    def topic(self, side: str) -> str:
        """The recorded topic of ``side``."""
        return f"{self.topic_prefix}/{side}/skeleton"

    def _bag_dir(self) -> Path:
        return bag_directory(self.path, "replay hand source")

    def _load(self, bag: Path) -> list[tuple[int, int, str, np.ndarray]]:
        """(recorded stamp [ns], side index, side, (N, 3) points [m]) of every replayed message."""
        reader = open_bag(bag, "replay hand source")
        try:
            topics = {c.topic: c.msgtype for c in reader.connections}
            recorded = [s for s in SIDES if topics.get(self.topic(s)) == POSE_ARRAY]
            shown = ", ".join(f"{t} [{m}]" for t, m in sorted(topics.items())) or "none"
            if not recorded:
                raise ConfigurationError(
                    f"replay hand source: {str(bag)!r} has no {POSE_ARRAY} topic "
                    f"{self.topic_prefix}/{{left,right}}/skeleton; its topics: {shown}"
                )
            wanted_sides = self.requested_sides or tuple(recorded)
            missing = [s for s in wanted_sides if s not in recorded]
            if missing:
                raise ConfigurationError(
                    f"replay hand source: {str(bag)!r} has no recording of the {', '.join(missing)} hand; "
                    f"recorded hands: {', '.join(recorded)}"
                )
            wanted = {self.topic(s): s for s in wanted_sides}
            connections = [c for c in reader.connections if c.topic in wanted]
            rows: list[tuple[int, int, str, np.ndarray]] = []
            for conn, log_ns, raw in reader.messages(connections=connections):
                side = wanted[conn.topic]
                msg = reader.deserialize(raw, conn.msgtype)
                stamp = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
                if stamp == 0:
                    stamp = int(log_ns)
                points = np.array([(p.position.x, p.position.y, p.position.z) for p in msg.poses], dtype=float)
                self.frame_ids.setdefault(side, msg.header.frame_id)
                rows.append((stamp, SIDES.index(side), side, points.reshape(-1, 3)))
        finally:
            reader.close()
        if not rows:
            raise ConfigurationError(
                f"replay hand source: {str(bag)!r} has no message for the {', '.join(wanted_sides)} hand"
            )
        self.sides = tuple(wanted_sides)
        rows.sort(key=lambda row: (row[0], row[1]))
        return rows

    def start(self, now: float) -> None:
        """Open and load the bag, and map its first sample to ``now`` [s].

        Raises:
            ConfigurationError: the directory is missing or not a bag, it has no
                skeleton topic, or a requested side was not recorded.
        """
        self.frame_ids = {}
        rows = self._load(self._bag_dir())
        stamps = np.array([r[0] for r in rows], dtype=np.int64)
        self._rel = 1e-9 * (stamps - stamps[0])  # integer nanoseconds first: no precision lost to epoch stamps
        self._sides = [r[2] for r in rows]
        self._points = [r[3] for r in rows]
        self._period = loop_period(self._rel, self._sides)
        self._playback = Playback(self._rel, self._period, now, self.rate_scale, self.loop)
        self._closed = False
        bad = sum(1 for p in self._points if p.shape[0] != 21)
        if bad:
            _LOG.warning("replay: %d recorded skeleton(s) do not have 21 points; they are replayed as recorded", bad)
        _LOG.info(
            "replaying %d hand skeletons (%.1f s) of the %s hand(s) from %s",
            len(rows), self._rel[-1], ", ".join(self.sides), self.path,
        )

    def read(self, now: float) -> list[HandSample]:
        """The samples whose playback stamp is <= ``now`` [s] not returned yet, oldest first."""
        if self._playback is None or self._closed:
            raise RuntimeError("ReplayHands.read() called before start() or after close()")
        return [HandSample(self._sides[i], stamp, self._points[i].copy()) for i, stamp in self._playback.due(now)]

    def close(self) -> None:
        """Release the loaded samples (idempotent; the bag itself is closed after loading)."""
        self._closed = True
        self._points = []
