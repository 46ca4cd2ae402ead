"""Replay a recorded operator session from a rosbag2 (ROS-free, via ``rosbags``).

The bag (MCAP or sqlite3 storage) holds one ``geometry_msgs/msg/PoseStamped``
topic per role, ``<topic_prefix>/<role>``, as recorded by this stack. Samples
are timed by their header stamps (the bag's receive time when a header stamp
is zero) and played back on the caller's clock.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

import numpy as np

from ...core.transforms import pose_to_matrix
from ...errors import ConfigurationError
from ..playback import Playback, ReplayTiming, bag_directory, loop_period, open_bag
from .base import ROLES, TrackerSample, TrackerSource

_LOG = logging.getLogger(__name__)

POSE_STAMPED = "geometry_msgs/msg/PoseStamped"


class ReplaySource(ReplayTiming, TrackerSource):
    """Tracker poses from a rosbag2 directory, re-timed onto the caller's clock.

    Playback stamp = ``now`` given to :meth:`start` + (recorded stamp - first
    recorded stamp) / ``rate_scale``. With ``loop`` the recording repeats
    without time going backwards: each pass starts one typical sample
    interval after the previous pass's last sample. :attr:`world_frame` is
    the ``frame_id`` of the bag's chest messages (of the first replayed role
    if the chest is not replayed), known after :meth:`start`.
    """

    kind = "replay"

    def __init__(
        self,
        path: str | Path,
        serials: Mapping[str, str],
        topic_prefix: str = "/operator/trackers",
        rate_scale: float = 1.0,
        loop: bool = False,
    ) -> None:
        """
        Args:
            path: rosbag2 directory (the folder holding ``metadata.yaml``); a file
                inside it (``metadata.yaml``, ``*.mcap``, ``*.db3``) is accepted too.
            serials: role -> serial for each role to replay (each must be in the bag).
            topic_prefix: the recorded topics are ``<topic_prefix>/<role>``.
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
        self.topic_prefix = "/" + topic_prefix.strip("/")
        self.rate_scale = float(rate_scale)
        self.loop = bool(loop)
        self.skipped = 0  # recorded messages dropped for a NaN or zero-quaternion pose
        self._playback: Playback | None = None  # recorded -> playback times (after start)
        self._rel: np.ndarray = np.empty(0)  # recorded stamp - first recorded stamp [s], sorted
        self._roles: list[str] = []
        self._matrices: np.ndarray = np.empty((0, 4, 4))
        self._period = 0.0  # recorded time [s] of one pass, loop spacing included
        self._closed = False

    def _bag_dir(self) -> Path:
        return bag_directory(self.path, "replay tracker source")

    def _load(self, bag: Path) -> list[tuple[float, int, str, np.ndarray]]:
        """(recorded stamp [s], role index, role, (4, 4)) of every replayed message."""
        reader = open_bag(bag, "replay tracker source")
        try:
            topics = {c.topic: c.msgtype for c in reader.connections}
            recorded = {
                topic[len(self.topic_prefix) + 1 :]: topic
                for topic, msgtype in topics.items()
                if topic.startswith(self.topic_prefix + "/") and msgtype == POSE_STAMPED
            }
            shown = ", ".join(f"{t} [{m}]" for t, m in sorted(topics.items())) or "none"
            if not recorded:
                raise ConfigurationError(
                    f"replay tracker source: {str(bag)!r} has no {POSE_STAMPED} topic under "
                    f"{self.topic_prefix}/; its topics: {shown}"
                )
            missing = [r for r in self.serials if r not in recorded]
            if missing:
                raise ConfigurationError(
                    f"replay tracker source: {str(bag)!r} has no recording of role(s) {', '.join(missing)}; "
                    f"recorded roles: {', '.join(sorted(recorded))}"
                )
            wanted = {recorded[r]: r for r in self.serials}
            connections = [c for c in reader.connections if c.topic in wanted]
            frames: dict[str, str] = {}
            rows: list[tuple[float, int, str, np.ndarray]] = []
            for conn, log_ns, raw in reader.messages(connections=connections):
                role = wanted[conn.topic]
                msg = reader.deserialize(raw, conn.msgtype)
                stamp = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
                if stamp == 0.0:
                    stamp = 1e-9 * log_ns
                p, q = msg.pose.position, msg.pose.orientation
                try:
                    T = pose_to_matrix((p.x, p.y, p.z), (q.x, q.y, q.z, q.w))
                except ValueError:
                    self.skipped += 1
                    continue
                frames.setdefault(role, msg.header.frame_id)
                rows.append((stamp, ROLES.index(role), role, T))
        finally:
            reader.close()
        if not rows:
            raise ConfigurationError(
                f"replay tracker source: {str(bag)!r} has no usable message for role(s) {', '.join(self.serials)}"
            )
        if self.skipped:
            _LOG.warning("replay: skipped %d recorded pose(s) with NaN or a zero quaternion", self.skipped)
        first_role = "chest" if "chest" in frames else min(frames, key=ROLES.index)
        self.world_frame = frames[first_role] or self.world_frame
        rows.sort(key=lambda row: (row[0], row[1]))
        return rows

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
