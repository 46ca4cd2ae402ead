"""Episodes: numbered bag directories started, stopped (kept) or discarded (ROS-free).

An output directory holds ``episode_0001``, ``episode_0002``, ...: each a
rosbag2 bag (MCAP storage) plus ``episode.yaml`` (see :mod:`.metadata`). A new
episode takes the number after the highest one present, so the number of a
discarded last episode is used again.

:class:`EpisodeRecorder` is what the recorder node drives: ``start`` with an
:class:`EpisodeMetadata`, ``submit`` every received message (a no-op returning
False between episodes), ``stop`` to keep or ``discard`` to delete. Receive
times and the start/stop times are integer nanoseconds of one clock
(``time.time_ns`` by default; a node passes its clock's ``now().nanoseconds``).
The recorder should subscribe before an episode starts: a configured topic's
silence from the start to its first message counts as a gap like any other.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rosbags.typesys.store import Typestore

from .. import __version__
from .errors import RecordingError
from .metadata import custom_data, write_sidecar
from .stats import EpisodeStats, episode_stats
from .writer import (
    DEFAULT_FLUSH_PERIOD_S,
    DEFAULT_QUEUE_MAX_BYTES,
    DEFAULT_QUEUE_MAX_MESSAGES,
    EpisodeWriter,
    TopicQos,
    default_typestore,
)

EPISODE_PREFIX = "episode_"
_EPISODE_RE = re.compile(rf"^{EPISODE_PREFIX}(\d+)$")


def software_version() -> str:
    """This package's version string, e.g. ``"rynn_teleop 0.1.0"``."""
    return f"rynn_teleop {__version__}"


def description_hash(urdf: str) -> str:
    """Identifier of a robot description: ``"sha256:<hex>"`` of its UTF-8 text."""
    return "sha256:" + hashlib.sha256(urdf.encode("utf-8")).hexdigest()


def episode_dirs(output_dir: str | Path) -> list[Path]:
    """The numbered episode directories in ``output_dir``, by number (none if it does not exist)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _EPISODE_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def next_episode_dir(output_dir: str | Path) -> Path:
    """``output_dir/episode_NNNN`` numbered one past the highest existing episode (first: 0001)."""
    dirs = episode_dirs(output_dir)
    n = int(_EPISODE_RE.match(dirs[-1].name).group(1)) + 1 if dirs else 1  # type: ignore[union-attr]
    return Path(output_dir) / f"{EPISODE_PREFIX}{n:04d}"


OUTCOMES = ("", "success", "failure")  # an episode's outcome label ("": not labelled)


def split_at_window(items: Sequence[tuple], since_ns: int | None = None,
                    until_ns: int | None = None) -> tuple[list[tuple], list[tuple]]:
    """``items`` (each a tuple whose first element is its receive time [ns]) as (those received in
    [``since_ns``, ``until_ns``], the others), each in the given order; None leaves that side open.

    An episode starts and stops at one instant for every topic: a recorder taking its subscriptions one
    after the other cuts by receive time, not by which take found a message.
    """
    if since_ns is None and until_ns is None:  # between start and stop (every drain of the recorder)
        return list(items), []
    inside, outside = [], []
    for item in items:
        t = item[0]
        early = since_ns is not None and t < since_ns
        late = until_ns is not None and t > until_ns
        (outside if early or late else inside).append(item)
    return inside, outside


#: the operator input's topics (the tracker's poses, the hand tracking's skeletons): absent from a bringup in which
#: a policy drives instead of the operator (the recorder leaves them out there: its ``exclude_topics``)
OPERATOR_INPUT_TOPICS = ("/operator/trackers", "/operator/hand/left/skeleton", "/operator/hand/right/skeleton")

class EpisodeProgress(NamedTuple):
    """The episode being recorded, as far as it got (cheap: for a 1 Hz status)."""

    name: str  # the episode directory's name
    elapsed_s: float  # [s] since its start
    messages: int  # messages written or queued
    problems: list[str]  # so far: dropped messages per topic, configured topics not received after 2 s


@dataclass
class EpisodeMetadata:
    """What an episode is about; stored in ``episode.yaml`` and in ``metadata.yaml``'s custom data."""

    task: str = ""
    operator: str = ""
    notes: str = ""
    outcome: str = ""  # "" (none), "success" or "failure" (OUTCOMES): the operator's label, else the twin's judgement
    outcome_reason: str = ""  # why, when the physical twin decided the outcome (its task's reason); "" otherwise
    camera_sources: list[str] = field(default_factory=list)  # e.g. ["physical"]; add more while recording
    robot_description_hash: str = ""  # see description_hash()
    calibration: dict[str, Any] = field(default_factory=dict)  # plain data (YAML/JSON-serialisable)
    software_version: str = field(default_factory=software_version)
    extra: dict[str, Any] = field(default_factory=dict)  # any other plain-data fields, stored as given

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, the fields of ``episode.yaml``."""
        return {
            "task": self.task,
            "operator": self.operator,
            "notes": self.notes,
            "outcome": self.outcome,
            "outcome_reason": self.outcome_reason,
            "camera_sources": list(self.camera_sources),
            "robot_description_hash": self.robot_description_hash,
            "calibration": dict(self.calibration),
            "software_version": self.software_version,
            "extra": dict(self.extra),
        }


@dataclass(frozen=True)
class EpisodeSummary:
    """A stopped episode."""

    path: Path  # the episode (bag) directory
    stats: EpisodeStats
    problems: list[str]  # EpisodeStats.problems(): empty when every configured topic arrived without gaps or drops
    bytes_written: int  # message payload [bytes]


class EpisodeRecorder:
    """Starts, feeds, stops and discards episodes under one output directory.

    Args:
        output_dir: where episode directories are created (created if missing).
        topics: configured topic -> expected rate [Hz] (None: no rate, no gap detection).
            A configured topic that never delivers is reported missing at stop;
            topics not configured but submitted are recorded too.
        gap_rates: topic -> the rate of its fastest publisher [Hz], for a topic several
            publishers share at different rates (gaps are measured in its periods).
        writer_options: keyword arguments of :class:`EpisodeWriter` (``typestore``,
            ``queue_max_bytes``, ``queue_max_messages``, ``flush_period_s``, ``fsync``, ``crcs``).
        on_error: called from the writer thread when writing an episode fails.
        clock: the default for ``now_ns`` of start/stop [ns].
    """

    def __init__(
        self,
        output_dir: str | Path,
        topics: Mapping[str, float | None],
        *,
        gap_rates: Mapping[str, float | None] | None = None,
        queue_max_bytes: int = DEFAULT_QUEUE_MAX_BYTES,
        queue_max_messages: int = DEFAULT_QUEUE_MAX_MESSAGES,
        flush_period_s: float = DEFAULT_FLUSH_PERIOD_S,
        fsync: bool = False,
        typestore: Typestore | None = None,
        on_error: Callable[[RecordingError], None] | None = None,
        clock: Callable[[], int] = time.time_ns,
        crcs: bool = True,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.topics = {t: (float(r) if r else None) for t, r in topics.items()}
        self.gap_rates = {t: float(r) for t, r in (gap_rates or {}).items() if r}
        self._writer_options: dict[str, Any] = {
            # built here, not at the first start: building the standard typestore is costly, and at an
            # episode's start it would delay whatever the process runs
            "typestore": typestore or default_typestore(),
            "queue_max_bytes": queue_max_bytes,
            "queue_max_messages": queue_max_messages,
            "flush_period_s": flush_period_s,
            "fsync": fsync,
            "on_error": on_error,
            "crcs": crcs,
        }
        self._clock = clock
        self._lock = threading.Lock()
        self._writer: EpisodeWriter | None = None
        self._doc: dict[str, Any] = {}

    @property
    def active(self) -> bool:
        """True while an episode is being recorded."""
        return self._writer is not None

    @property
    def current(self) -> Path | None:
        """The directory of the episode being recorded, or None."""
        w = self._writer
        return w.bag_dir if w is not None else None

    @property
    def writer(self) -> EpisodeWriter | None:
        """The current episode's writer (queue level, drops, failure), or None."""
        return self._writer

    def start(
        self,
        metadata: EpisodeMetadata,
        *,
        topic_qos: Mapping[str, Sequence[TopicQos]] | None = None,
        now_ns: int | None = None,
    ) -> Path:
        """Create the next episode directory and start recording into it.

        Args:
            metadata: the episode's description.
            topic_qos: offered QoS per topic, stored for ``ros2 bag play``.
            now_ns: the episode start [ns] (default: the clock).

        Returns:
            The new episode directory.

        Raises:
            RecordingError: an episode is already being recorded, or the output
                directory cannot be created or written.
        """
        with self._lock:
            if self._writer is not None:
                raise RecordingError(f"an episode is already being recorded in {self._writer.bag_dir}")
            try:
                self.output_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RecordingError(
                    f"cannot create output directory {self.output_dir}: {exc.strerror or exc}"
                ) from exc
            bag_dir = next_episode_dir(self.output_dir)
            writer = EpisodeWriter(bag_dir, topic_qos=topic_qos, **self._writer_options)
            writer.open()
            start_ns = self._clock() if now_ns is None else int(now_ns)
            self._doc = {
                "episode": bag_dir.name,
                "state": "recording",
                **metadata.to_dict(),
                "start_ns": start_ns,
                "stop_ns": None,
                "expected_rates": dict(self.topics),
                "gap_rates": dict(self.gap_rates),
                "recorder": {"host": socket.gethostname(), "pid": os.getpid()},
            }
            try:
                write_sidecar(bag_dir, self._doc)
            except OSError as exc:
                writer.abort()
                raise RecordingError(f"cannot write {bag_dir}/episode.yaml: {exc.strerror or exc}") from exc
            self._writer = writer
            return bag_dir

    def submit(self, topic: str, type_name: str, data: bytes | bytearray | memoryview, receive_time_ns: int) -> bool:
        """Hand one serialized message to the current episode; never blocks.

        Returns:
            True if queued; False between episodes, while stopping, or when dropped
            (queue full or episode failed: counted per topic).
        """
        writer = self._writer
        return writer.submit(topic, type_name, data, receive_time_ns) if writer is not None else False

    def describe(self, **fields: Any) -> None:
        """Change description fields of the current episode (e.g. notes typed while recording).

        Args:
            fields: :class:`EpisodeMetadata` field names -> new values; written at stop.

        Raises:
            RecordingError: no episode is being recorded, or an unknown field.
        """
        known = set(EpisodeMetadata.__dataclass_fields__)
        if unknown := sorted(set(fields) - known):
            raise RecordingError(
                f"unknown episode description field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        with self._lock:
            if self._writer is None:
                raise RecordingError("no episode is being recorded")
            self._doc.update(fields)

    def progress(self, now_ns: int | None = None) -> EpisodeProgress | None:
        """The current episode's progress at ``now_ns`` [ns] (default: the clock), or None between episodes."""
        with self._lock:
            writer, doc = self._writer, self._doc
            if writer is None:
                return None
            start_ns = doc["start_ns"]
        now_ns = self._clock() if now_ns is None else int(now_ns)
        elapsed = max(0.0, (now_ns - start_ns) * 1e-9)
        counts = writer.counts()
        problems = [f"{topic}: {n} dropped" for topic, n in sorted(writer.dropped().items()) if n]
        if elapsed > 2.0:
            problems += [f"{topic}: nothing received" for topic, rate in self.topics.items()
                         if rate and not counts.get(topic)]
        return EpisodeProgress(writer.bag_dir.name, elapsed, sum(counts.values()), problems)

    def add_camera_source(self, source: str) -> None:
        """Note that the current episode used camera ``source`` (e.g. after a feed switch)."""
        with self._lock:
            sources = self._doc.setdefault("camera_sources", [])
            if self._writer is not None and source not in sources:
                sources.append(source)

    def stop(self, *, now_ns: int | None = None) -> EpisodeSummary:
        """Stop and keep the current episode: write what is queued, then its metadata.

        Blocks while the queue is written (bounded by ``queue_max_bytes``).

        Raises:
            RecordingError: no episode is being recorded, or writing it failed (its
                ``episode.yaml`` then says ``state: failed`` with the error, when the
                disk allows; the directory is kept for ``recover``).
        """
        with self._lock:
            writer = self._writer
            if writer is None:
                raise RecordingError("no episode is being recorded")
            stop_ns = self._clock() if now_ns is None else int(now_ns)
            doc = self._doc
            self._writer = None
            self._doc = {}
            try:
                writer.drain()
                stats = episode_stats(
                    writer.received(),
                    start_ns=doc["start_ns"],
                    stop_ns=stop_ns,
                    expected_rates=self.topics,
                    dropped=writer.dropped(),
                    stamps=writer.stamps(),
                    gap_rates=self.gap_rates,
                )
                doc.update(state="complete", stop_ns=stop_ns, stats=stats.to_dict(), problems=stats.problems())
                writer.close(custom_data(doc))
                write_sidecar(writer.bag_dir, doc)
                return EpisodeSummary(writer.bag_dir, stats, stats.problems(), writer.written_bytes)
            except RecordingError as exc:
                error = exc
            except OSError as exc:
                error = RecordingError(f"cannot write {writer.bag_dir}/episode.yaml: {exc.strerror or exc}")
                error.__cause__ = exc
            doc.update(state="failed", stop_ns=stop_ns, error=str(error))
            try:
                write_sidecar(writer.bag_dir, doc)
            except OSError:
                pass  # a full or broken disk: the error is raised below all the same
            raise error

    def discard(self) -> Path:
        """Stop the current episode and delete its directory.

        Returns:
            The deleted directory.

        Raises:
            RecordingError: no episode is being recorded, or the directory cannot be deleted.
        """
        with self._lock:
            writer = self._writer
            if writer is None:
                raise RecordingError("no episode is being recorded")
            self._writer = None
            self._doc = {}
            writer.abort()
            try:
                shutil.rmtree(writer.bag_dir)
            except OSError as exc:
                raise RecordingError(
                    f"cannot delete discarded episode {writer.bag_dir}: {exc.strerror or exc}"
                ) from exc
            return writer.bag_dir
