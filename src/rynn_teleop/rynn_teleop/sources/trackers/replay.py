"""Replay a recorded operator session from a rosbag2 (ROS-free, via ``rosbags``).

The bag (MCAP or sqlite3 storage) holds the tracker node's frames as recorded by this stack: one
``geometry_msgs/msg/PoseArray`` per sampled frame on ``topic`` (default ``/operator/trackers``), header
stamp = the frame's capture time, header frame id = the tracking world, ``poses`` = the five roles in
:data:`~.base.ROLES` order, a role without a sample in that frame all-NaN. Recordings of the older
layout, one ``geometry_msgs/msg/PoseStamped`` topic per role (``<topic>/<role>``), replay too when the
bag has no PoseArray on ``topic``. Samples are timed by their header stamps (the bag's receive time when
a header stamp is zero) and played back on the caller's clock; the samples of one recorded frame keep
one stamp.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...core.layout import ROLES
from ...core.params import Param
from ...core.trackers import TrackerSample
from ...core.transforms import pose_to_matrix
from ...errors import ConfigurationError
from ..playback import Playback, ReplayTiming, bag_directory, loop_period, open_bag
from .base import TRACKER_BACKENDS, TrackerContext, TrackerSource

_LOG = logging.getLogger(__name__)

POSE_ARRAY = "geometry_msgs/msg/PoseArray"
POSE_STAMPED = "geometry_msgs/msg/PoseStamped"

Row = tuple[float, int, str, np.ndarray]  # recorded stamp [s], role index, role, (4, 4) pose


def _stamp(msg: Any, log_ns: int) -> float:
    """Header stamp [s] of a recorded message, the bag's receive time when the header stamp is zero."""
    stamp = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
    return 1e-9 * log_ns if stamp == 0.0 else stamp


def _absent(pose: Any) -> bool:
    """True for the all-NaN pose of a role without a sample in its frame."""
    p, q = pose.position, pose.orientation
    return all(math.isnan(v) for v in (p.x, p.y, p.z, q.x, q.y, q.z, q.w))


@TRACKER_BACKENDS.register
class ReplaySource(ReplayTiming, TrackerSource):
    """Tracker poses from a rosbag2 directory, re-timed onto the caller's clock.

    Playback stamp = ``now`` given to :meth:`start` + (recorded stamp - first
    recorded stamp) / ``rate_scale``. With ``loop`` the recording repeats
    without time going backwards: each pass starts one typical sample
    interval after the previous pass's last sample. :attr:`world_frame` is
    the ``frame_id`` of the bag's chest messages (of the first replayed role
    if the chest is not replayed), known after :meth:`start`.
    """

    name = "replay"
    follows_rate_hz = False  # samples come at the recording's rate
    impersonates_serials = True  # the configured serials name the recorded roles
    SETTINGS = (
        Param("path", str, "", "rosbag2 directory of a recorded session"),
        Param("rate_scale", float, 1.0, "replay speed factor", min=0.05, max=20.0),
        Param("loop", bool, False, "restart the replay at its end"),
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: TrackerContext) -> ReplaySource:
        """The recording of the node's own topic, its roles mapped to the node's serials."""
        return cls(path=settings["path"], serials=context.serials, topic=context.topic,
                   rate_scale=settings["rate_scale"], loop=settings["loop"])

    def __init__(
        self,
        path: str | Path,
        serials: Mapping[str, str],
        topic: str = "/operator/trackers",
        rate_scale: float = 1.0,
        loop: bool = False,
    ) -> None:
        """
        Args:
            path: rosbag2 directory (the folder holding ``metadata.yaml``); a file
                inside it (``metadata.yaml``, ``*.mcap``, ``*.db3``) is accepted too.
            serials: role -> serial for each role to replay (each must be in the bag).
            topic: the recorded PoseArray topic (older recordings: ``<topic>/<role>`` PoseStamped topics).
            rate_scale: playback speed [-] (2 = twice as fast).
            loop: start over at the end instead of finishing.

        Raises:
            ConfigurationError: no role, an unknown role, an empty or repeated
                serial, or ``rate_scale`` <= 0.
        """
        super().__init__("replay_world")
        if not serials:
            raise ConfigurationError("replay tracker source: no role to replay (serials is empty)")
        unknown = sorted(set(serials) - set(ROLES))
        if unknown:
            raise ConfigurationError(
                f"replay tracker source: unknown role(s) {', '.join(unknown)}; roles are {', '.join(ROLES)}"
            )
        empty = [r for r in serials if not str(serials[r] or "").strip()]
        if empty:
            raise ConfigurationError(f"replay tracker source: no serial for role(s) {', '.join(empty)}")
        if len(set(serials.values())) != len(serials):
            raise ConfigurationError("replay tracker source: two roles share a serial")
        if not rate_scale > 0:
            raise ConfigurationError(f"replay tracker source: rate_scale must be > 0, got {rate_scale}")
        self.path = Path(path)
        self.serials = {r: str(serials[r]) for r in ROLES if r in serials}
        self.topic = "/" + topic.strip("/")
        self.rate_scale = float(rate_scale)
        self.loop = bool(loop)
        self.skipped = 0  # recorded poses dropped: partly NaN, a zero quaternion, or a frame of the wrong size
        self._playback: Playback | None = None  # recorded -> playback times (after start)
        self._rel: np.ndarray = np.empty(0)  # recorded stamp - first recorded stamp [s], sorted
        self._roles: list[str] = []
        self._matrices: np.ndarray = np.empty((0, 4, 4))
        self._period = 0.0  # recorded time [s] of one pass, loop spacing included
        self._closed = False

    def _bag_dir(self) -> Path:
        return bag_directory(self.path, "replay tracker source")

    def _load(self, bag: Path) -> list[Row]:
        """Every replayed sample of the bag, sorted by (stamp, role index)."""
        reader = open_bag(bag, "replay tracker source")
        try:
            topics = {c.topic: c.msgtype for c in reader.connections}
            frames: dict[str, str] = {}  # role -> frame_id of its first sample
            if topics.get(self.topic) == POSE_ARRAY:
                rows = self._load_frames(reader, frames)
            else:
                rows = self._load_per_role(reader, topics, frames, bag)
        finally:
            reader.close()
        recorded = sorted({row[2] for row in rows}, key=ROLES.index)
        missing = [r for r in self.serials if r not in recorded]
        if missing:
            raise ConfigurationError(
                f"replay tracker source: {str(bag)!r} has no recording of role(s) {', '.join(missing)}; "
                f"recorded roles: {', '.join(recorded) or 'none'}"
            )
        if self.skipped:
            _LOG.warning("replay: skipped %d recorded pose(s) with NaN or a zero quaternion", self.skipped)
        rows = [row for row in rows if row[2] in self.serials]
        first_role = "chest" if "chest" in self.serials else min(self.serials, key=ROLES.index)
        self.world_frame = frames.get(first_role) or self.world_frame
        rows.sort(key=lambda row: (row[0], row[1]))
        return rows

    def _load_frames(self, reader: Any, frames: dict[str, str]) -> list[Row]:
        """Rows of the PoseArray frames on :attr:`topic`."""
        rows: list[Row] = []
        connections = [c for c in reader.connections if c.topic == self.topic]
        for conn, log_ns, raw in reader.messages(connections=connections):
            msg = reader.deserialize(raw, conn.msgtype)
            if len(msg.poses) != len(ROLES):
                self.skipped += len(msg.poses)
                continue
            stamp = _stamp(msg, log_ns)
            for role, pose in zip(ROLES, msg.poses):
                if role not in self.serials or _absent(pose):
                    continue
                row = self._row(stamp, role, pose)
                if row is not None:
                    frames.setdefault(role, msg.header.frame_id)
                    rows.append(row)
        return rows

    def _load_per_role(self, reader: Any, topics: dict[str, str], frames: dict[str, str], bag: Path) -> list[Row]:
        """Rows of the older per-role PoseStamped topics ``<topic>/<role>``."""
        recorded = {
            topic[len(self.topic) + 1 :]: topic
            for topic, msgtype in topics.items()
            if topic.startswith(self.topic + "/") and msgtype == POSE_STAMPED and topic[len(self.topic) + 1 :] in ROLES
        }
        if not recorded:
            shown = ", ".join(f"{t} [{m}]" for t, m in sorted(topics.items())) or "none"
            raise ConfigurationError(
                f"replay tracker source: {str(bag)!r} has no {POSE_ARRAY} topic {self.topic} (nor per-role "
                f"{POSE_STAMPED} topics {self.topic}/<role>); its topics: {shown}"
            )
        wanted = {recorded[r]: r for r in self.serials if r in recorded}
        rows: list[Row] = []
        connections = [c for c in reader.connections if c.topic in wanted]
        for conn, log_ns, raw in reader.messages(connections=connections):
            role = wanted[conn.topic]
            msg = reader.deserialize(raw, conn.msgtype)
            row = self._row(_stamp(msg, log_ns), role, msg.pose)
            if row is not None:
                frames.setdefault(role, msg.header.frame_id)
                rows.append(row)
        if not rows and wanted:
            raise ConfigurationError(
                f"replay tracker source: {str(bag)!r} has no usable message for role(s) {', '.join(self.serials)}"
            )
        return rows

    def _row(self, stamp: float, role: str, pose: Any) -> Row | None:
        """One sample, or None (counted in :attr:`skipped`) for a pose that is not a valid rigid pose."""
        p, q = pose.position, pose.orientation
        try:
            T = pose_to_matrix((p.x, p.y, p.z), (q.x, q.y, q.z, q.w))
        except ValueError:
            self.skipped += 1
            return None
        return stamp, ROLES.index(role), role, T

    def start(self, now: float) -> None:
        """Open and load the bag, and map its first sample to ``now`` [s].

        Raises:
            ConfigurationError: the directory is missing or not a bag, it has no
                tracker topic, or a configured role was not recorded.
        """
        rows = self._load(self._bag_dir())
        stamps = np.array([r[0] for r in rows])
        self._rel = stamps - stamps[0]
        self._roles = [r[2] for r in rows]
        self._matrices = np.stack([r[3] for r in rows])
        self._period = loop_period(self._rel, self._roles)
        self._playback = Playback(self._rel, self._period, now, self.rate_scale, self.loop)
        self._closed = False
        _LOG.info(
            "replaying %d samples (%.1f s) of %s from %s",
            len(rows), self._rel[-1], ", ".join(self.serials), self.path,
        )

    def read(self, now: float) -> list[TrackerSample]:
        """The samples whose playback stamp is <= ``now`` [s] not returned yet, oldest first."""
        if self._playback is None or self._closed:
            raise RuntimeError("ReplaySource.read() called before start() or after close()")
        out: list[TrackerSample] = []
        for i, stamp in self._playback.due(now):
            serial = self.serials[self._roles[i]]
            out.append(TrackerSample(serial, stamp, self._matrices[i].copy()))
            self._saw(serial)
        return out

    def close(self) -> None:
        """Release the loaded samples (idempotent; the bag itself is closed after loading)."""
        self._closed = True
        self._matrices = np.empty((0, 4, 4))
