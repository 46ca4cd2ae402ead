"""One rosbag2 bag (MCAP storage) written by a thread behind a bounded queue (ROS-free).

:class:`EpisodeWriter` takes serialized messages (CDR bytes exactly as a raw
ROS subscription delivers them) with their topic, type name and receive time,
and writes them unchanged with rosbags' rosbag2 writer. ``submit`` never
blocks: it appends to a queue bounded in messages and bytes, and a full queue
drops the message and counts the drop for its topic. The writer thread adds a
connection on the first message of each (topic, type), with the type's message
definition and RIHS01 hash from a rosbags typestore (ROS 2 Kilted by default),
so ``ros2 bag play`` and the MCAP ROS 2 decoders can decode the bag.

Durability: rosbags closes an MCAP chunk when it reaches 1 MiB; in addition
the writer thread closes the open chunk and flushes the file to the operating
system every ``flush_period_s`` (0.5 s by default) when something was written
since the last flush. A process killed with SIGKILL therefore loses at most
the messages received in the last ``flush_period_s`` plus what was still
queued; the file then has no summary and no ``metadata.yaml``, which
:func:`rynn_teleop.recording.recover.recover_bag` rebuilds. (Flushing hands
the data to the kernel, which survives the death of the process; ``fsync=True``
also forces it to the device, against power loss.)

Failures: an output directory that cannot be created raises
:class:`RecordingError` from :meth:`EpisodeWriter.open`. An error while
writing (disk full, I/O error) puts the writer in the ``failed`` state: the
thread stores the error in :attr:`EpisodeWriter.error`, calls ``on_error``,
closes the file without an index, counts what was still queued as dropped and
ends; later ``submit`` calls return False; :meth:`EpisodeWriter.close` raises
the error.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
from rosbags.interfaces import (
    Connection,
    Qos,
    QosDurability,
    QosHistory,
    QosLiveliness,
    QosReliability,
    QosTime,
)
from rosbags.rosbag2 import StoragePlugin, Writer, WriterError
from rosbags.typesys import Stores, get_typestore
from rosbags.typesys.store import Typestore

from ..core.scheduling import lower_this_thread, name_this_thread
from .cdr import has_header, header_stamp_ns
from .errors import RecordingError

BAG_VERSION = 9
"""rosbag2 metadata version written (Jazzy and Kilted read it)."""
UNKNOWN_TYPE_HASH = "RIHS01_" + "0" * 64
"""Placeholder type hash of a topic whose type the typestore does not know (written with an empty definition)."""
DEFAULT_QUEUE_MAX_BYTES = 256 * 2**20
"""Default bound of the writer queue [bytes]: about 9 s of 640x480 RGB at 30 Hz."""
DEFAULT_QUEUE_MAX_MESSAGES = 100_000
DEFAULT_FLUSH_PERIOD_S = 0.5


@cache
def default_typestore() -> Typestore:
    """The rosbags typestore of ROS 2 Kilted (standard message definitions), built once."""
    return get_typestore(Stores.ROS2_KILTED)


@dataclass(frozen=True)
class TopicQos:
    """The QoS a topic's publisher offered, stored in the bag so that ``ros2 bag play`` offers it again."""

    reliability: str = "reliable"  # "reliable" or "best_effort"
    durability: str = "volatile"  # "volatile" or "transient_local"
    depth: int = 10  # keep-last history depth [messages]

    def to_rosbags(self) -> Qos:
        """The rosbags form of this profile (infinite deadline, lifespan and lease)."""
        forever = QosTime(0x7FFFFFFF, 0xFFFFFFFF)
        return Qos(
            history=QosHistory.KEEP_LAST,
            depth=int(self.depth),
            reliability=QosReliability[self.reliability.upper()],
            durability=QosDurability[self.durability.upper()],
            deadline=forever,
            lifespan=forever,
            liveliness=QosLiveliness.AUTOMATIC,
            liveliness_lease_duration=forever,
            avoid_ros_namespace_conventions=False,
        )


class _Item(NamedTuple):
    topic: str
    type_name: str
    data: bytes | bytearray | memoryview
    time_ns: int


class EpisodeWriter:
    """Writes one bag directory from a thread; ``submit`` from any thread never blocks.

    States: ``new`` -> ``open`` (:meth:`open`) -> ``draining`` (:meth:`drain`) ->
    ``closed`` (:meth:`close`); ``failed`` from ``open``/``draining``/``close`` on an
    error; ``aborted`` (:meth:`abort`) from any state.

    Args:
        bag_dir: the bag directory to create (must not exist; parents are created).
        typestore: where message definitions come from (default: ROS 2 Kilted).
        queue_max_bytes: queue bound [bytes] (message payloads).
        queue_max_messages: queue bound [messages].
        flush_period_s: close the open chunk and flush at least this often [s] while data arrives.
        fsync: also ``os.fsync`` at each periodic flush (power-loss safety; costs device syncs).
        topic_qos: topic -> offered QoS profiles recorded for it (default: none recorded,
            ``ros2 bag play`` then uses its defaults).
        on_error: called once with the error that failed the writer (from the writer thread,
            or from :meth:`close` when finishing the file failed).
    """

    def __init__(
        self,
        bag_dir: str | Path,
        *,
        typestore: Typestore | None = None,
        queue_max_bytes: int = DEFAULT_QUEUE_MAX_BYTES,
        queue_max_messages: int = DEFAULT_QUEUE_MAX_MESSAGES,
        flush_period_s: float = DEFAULT_FLUSH_PERIOD_S,
        fsync: bool = False,
        topic_qos: Mapping[str, Sequence[TopicQos]] | None = None,
        on_error: Callable[[RecordingError], None] | None = None,
    ) -> None:
        self.bag_dir = Path(bag_dir)
        self._typestore = typestore or default_typestore()
        self._max_bytes = int(queue_max_bytes)
        self._max_messages = int(queue_max_messages)
        self._flush_period = float(flush_period_s)
        self._fsync = bool(fsync)
        self._qos = {t: [q.to_rosbags() for q in qs] for t, qs in (topic_qos or {}).items()}
        self._on_error = on_error
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._queued_bytes = 0
        self._state = "new"
        self._error: RecordingError | None = None
        self._dropped: dict[str, int] = {}
        self._types: dict[str, str] = {}  # topic -> type name(s) submitted
        self._times: dict[str, list[int]] = {}  # topic -> receive times written [ns] (writer thread only)
        self._stamps: dict[str, list[int]] = {}  # topic -> header stamps [ns] of the same messages, 0: none
        self._connections: dict[tuple[str, str], Connection] = {}
        self._bag: Writer | None = None
        self._thread: threading.Thread | None = None
        self._written_bytes = 0

    # -- state -------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``new``, ``open``, ``draining``, ``closed``, ``failed`` or ``aborted``."""
        return self._state

    @property
    def failed(self) -> bool:
        """True once a write, flush or close failed; see :attr:`error`."""
        return self._state == "failed"

    @property
    def error(self) -> RecordingError | None:
        """The error that failed the writer, or None."""
        return self._error

    @property
    def mcap_path(self) -> Path:
        """The MCAP file of the bag (rosbags names it after the directory)."""
        return self.bag_dir / f"{self.bag_dir.name}.mcap"

    @property
    def queued_bytes(self) -> int:
        """Payload bytes waiting in the queue, including the message being written [bytes]."""
        return self._queued_bytes

    @property
    def written_bytes(self) -> int:
        """Payload bytes handed to the bag so far [bytes]."""
        return self._written_bytes

    def dropped(self) -> dict[str, int]:
        """Topic -> messages lost so far (queue full, submitted after a failure, or noted by :meth:`note_dropped`)."""
        with self._cond:
            return dict(self._dropped)

    def note_dropped(self, topic: str, count: int) -> None:
        """Count ``count`` messages of ``topic`` lost before they reached the writer (e.g. skipped publisher
        sequence numbers: published, never delivered to the recorder)."""
        if count > 0:
            with self._cond:
                self._dropped[topic] = self._dropped.get(topic, 0) + int(count)

    def received(self) -> dict[str, tuple[str, np.ndarray]]:
        """Topic -> (type name, receive times [ns] of the messages written), for every topic submitted.

        Complete once :meth:`drain` returned; while recording, a snapshot that may lag the queue.
        """
        with self._cond:
            types = dict(self._types)
        return {t: (types[t], np.asarray(self._times.get(t, ()), dtype=np.int64)) for t in sorted(types)}

    def counts(self) -> dict[str, int]:
        """Topic -> messages written so far (a snapshot; cheap)."""
        with self._cond:
            topics = list(self._types)
        return {t: len(self._times.get(t, ())) for t in topics}

    def stamps(self) -> dict[str, np.ndarray]:
        """Topic -> header stamps [ns] of the messages written, in the order of :meth:`received`'s times.

        0 for a message whose type does not start with a std_msgs/Header (or unknown to the
        typestore); the integrity statistics then use receive times for that topic.
        Complete once :meth:`drain` returned.
        """
        with self._cond:
            topics = sorted(self._types)
        return {t: np.asarray(self._stamps.get(t, ()), dtype=np.int64) for t in topics}

    # -- life cycle --------------------------------------------------------------------------

    def open(self) -> None:
        """Create the bag directory and its MCAP file, and start the writer thread.

        Raises:
            RecordingError: the directory exists already or cannot be created or written
                (permissions, a file in the way, read-only or full file system).
        """
        if self._state != "new":
            raise RecordingError(f"episode writer for {self.bag_dir} was already opened")
        if self.bag_dir.exists():
            raise RecordingError(f"cannot create episode directory {self.bag_dir}: it exists already")
        bag = Writer(self.bag_dir, version=BAG_VERSION, storage_plugin=StoragePlugin.MCAP)
        try:
            bag.open()
        except (OSError, WriterError) as exc:
            raise RecordingError(f"cannot create episode directory {self.bag_dir}: {_reason(exc)}") from exc
        storage = bag.storage
        if not (hasattr(storage, "close_chunk") and hasattr(storage, "chunk") and hasattr(storage, "bio")):
            bag.abort()
            raise RecordingError(
                "this rosbags version's MCAP writer has no close_chunk()/bio: periodic flushing is impossible; "
                "use rosbags 0.10-0.11"
            )
        self._bag = bag
        self._state = "open"
        self._thread = threading.Thread(target=self._run, name=f"episode-writer:{self.bag_dir.name}", daemon=True)
        self._thread.start()

    def submit(self, topic: str, type_name: str, data: bytes | bytearray | memoryview, receive_time_ns: int) -> bool:
        """Queue one serialized message; never blocks.

        Args:
            topic: topic name, e.g. "/joint_states".
            type_name: ROS type name, e.g. "sensor_msgs/msg/JointState".
            data: the CDR bytes, written unchanged (not copied: do not modify them afterwards).
            receive_time_ns: receive time [ns], the bag timestamp of the message.

        Returns:
            True if queued. False if dropped: queue full or writer failed (counted in
            :meth:`dropped`), or writer not accepting (not open yet, draining, closed: not counted).
        """
        size = _size(data)
        with self._cond:
            if self._state not in ("open", "failed"):
                return False
            known = self._types.get(topic)
            if known is None:
                self._types[topic] = type_name
            elif type_name not in known.split(", "):
                self._types[topic] = f"{known}, {type_name}"
            if self._state == "failed" or len(self._queue) >= self._max_messages or self._queued_bytes + size > self._max_bytes:
                self._dropped[topic] = self._dropped.get(topic, 0) + 1
                return False
            self._queue.append(_Item(topic, type_name, data, int(receive_time_ns)))
            self._queued_bytes += size
            self._cond.notify()
        return True

    def drain(self, timeout_s: float | None = None) -> None:
        """Stop accepting messages, write everything queued, flush and stop the thread.

        Blocks for as long as the queue takes to write (bounded by ``queue_max_bytes``).

        Raises:
            RecordingError: the writer failed (now or before), or the thread did not
                finish within ``timeout_s`` [s].
        """
        with self._cond:
            if self._state == "open":
                self._state = "draining"
                self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise RecordingError(f"episode {self.bag_dir}: writer still busy after {timeout_s} s")
        if self._error is not None:
            raise self._error

    def close(self, custom_data: Mapping[str, str] | None = None) -> None:
        """Drain, then finish the MCAP file (summary, index) and write ``metadata.yaml``.

        Args:
            custom_data: string key -> string value pairs for the ``custom_data`` map of
                ``metadata.yaml`` (rosbag2 metadata version >= 6) and of the MCAP
                ``rosbag2`` metadata record.

        Raises:
            RecordingError: the writer failed, or finishing the file failed.
        """
        if self._bag is None:
            raise RecordingError(f"episode writer for {self.bag_dir} was never opened")
        self.drain()
        if self._state == "closed":
            return
        try:
            for key, value in (custom_data or {}).items():
                self._bag.set_custom_data(key, value)
            self._bag.close()
        except (OSError, WriterError) as exc:
            self._fail(exc, "closing the bag")
            raise self._error  # type: ignore[misc]
        self._state = "closed"

    def abort(self) -> None:
        """Stop now: forget the queue, stop the thread, close the file without index or metadata."""
        with self._cond:
            previous, self._state = self._state, "aborted"
            self._queue.clear()
            self._queued_bytes = 0
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        if self._bag is not None and previous not in ("closed", "failed"):
            try:
                self._bag.abort()
            except OSError:
                pass  # the directory is about to be deleted or is already broken

    # -- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        lower_this_thread()  # behind its queue: never ahead of the process's own drains or other nodes' loops
        name_this_thread("episode-writer")
        flush_at: float | None = None  # monotonic deadline [s] of the oldest unflushed write; None: all flushed
        try:
            while True:
                with self._cond:
                    while not self._queue and self._state == "open":
                        if flush_at is None:
                            self._cond.wait()
                        elif (timeout := flush_at - time.monotonic()) > 0:
                            self._cond.wait(timeout)
                        else:
                            break
                    if self._state == "aborted":
                        return
                    item = self._queue[0] if self._queue else None
                    draining = self._state == "draining"
                if item is not None:
                    self._write(item)
                    with self._cond:
                        if self._queue:  # abort() may have cleared it meanwhile
                            self._queue.popleft()
                            self._queued_bytes -= _size(item.data)
                    if flush_at is None:
                        flush_at = time.monotonic() + self._flush_period
                finished = item is None and draining
                if flush_at is not None and (finished or time.monotonic() >= flush_at):
                    self._flush()
                    flush_at = None
                if finished:
                    return
        except Exception as exc:  # noqa: BLE001 - any failure must fail the episode visibly, never kill the thread silently
            self._fail(exc, "writing")

    def _write(self, item: _Item) -> None:
        assert self._bag is not None
        key = (item.topic, item.type_name)
        conn = self._connections.get(key)
        if conn is None:
            qos = self._qos.get(item.topic, ())
            if item.type_name in self._typestore.fielddefs:
                conn = self._bag.add_connection(
                    item.topic, item.type_name, typestore=self._typestore, offered_qos_profiles=qos
                )
            else:
                conn = self._bag.add_connection(
                    item.topic, item.type_name, msgdef="", rihs01=UNKNOWN_TYPE_HASH, offered_qos_profiles=qos
                )
            self._connections[key] = conn
        self._bag.write(conn, item.time_ns, item.data)
        self._times.setdefault(item.topic, []).append(item.time_ns)
        stamp = header_stamp_ns(item.data) if has_header(self._typestore, item.type_name) else 0
        self._stamps.setdefault(item.topic, []).append(stamp)
        self._written_bytes += _size(item.data)

    def _flush(self) -> None:
        storage = self._bag.storage  # type: ignore[union-attr]
        if storage.chunk.bio.tell():  # type: ignore[union-attr]
            storage.close_chunk()  # type: ignore[union-attr]
        storage.bio.flush()  # type: ignore[union-attr]
        if self._fsync:
            os.fsync(storage.bio.fileno())  # type: ignore[union-attr]

    def _fail(self, exc: BaseException, doing: str) -> None:
        error = RecordingError(f"episode {self.bag_dir}: {doing} failed: {_reason(exc)}; the episode is incomplete")
        error.__cause__ = exc
        with self._cond:
            self._error = error
            self._state = "failed"
            for item in self._queue:
                self._dropped[item.topic] = self._dropped.get(item.topic, 0) + 1
            self._queue.clear()
            self._queued_bytes = 0
        if self._bag is not None and self._bag.storage is not None:
            try:
                self._bag.abort()
            except OSError:
                pass  # the file is what failed; closing it may fail the same way
        if self._on_error is not None:
            self._on_error(error)


def _size(data: bytes | bytearray | memoryview) -> int:
    """Length of a payload [bytes]."""
    return data.nbytes if isinstance(data, memoryview) else len(data)


def _reason(exc: BaseException) -> str:
    """A short human reason for an I/O error (names a full disk plainly)."""
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOSPC:
            return "no space left on the device (disk full)"
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    return str(exc)
