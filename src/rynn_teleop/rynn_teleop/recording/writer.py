"""One rosbag2 bag (MCAP storage), written synchronously (:class:`BagFile`) or by a thread behind a bounded queue
(:class:`EpisodeWriter`) (ROS-free).

A bag is ``<bag>/<bag>.mcap`` plus ``metadata.yaml`` (rosbag2 metadata version 9), laid out as rosbag2 and
rosbags write them: the ``mcap`` package's public writer with the ros2 profile, uncompressed chunks of about
1 MiB, ``ros2msg`` schemas and RIHS01 hashes from a rosbags typestore (ROS 2 Kilted by default), each
channel's offered QoS in its metadata, and a ``rosbag2`` metadata record. Messages are written unchanged.

Integrity: with ``crcs`` (the default, as rosbag2's MCAP storage) every chunk carries the CRC32 of its
records, the data-end record the CRC of the whole data section and the footer the CRC of the summary (the
``mcap`` writer's ``enable_crcs`` and ``enable_data_crcs``), so that ``rynn-teleop episodes check`` can tell a
damaged file (a failing disk, a bad copy) from a good one (:mod:`.integrity`). They cost two more passes
over every byte written (zlib's CRC32, a few GB/s; ``bench/recording.py`` measures the writer with and
without); ``crcs=False`` (the recorder's ``crcs`` parameter) turns them off, and such episodes are then
checked by decoding alone.

Durability: while data arrives, the open chunk is finished and the file flushed to the operating system at
least every ``flush_period_s`` (``fsync=True``: to the device too, against power loss). A process killed
with SIGKILL loses at most the messages of the last ``flush_period_s`` plus what was still queued; the file
then has no summary and there is no ``metadata.yaml``, which :func:`.recover.recover_bag` rebuilds.
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
from io import StringIO
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from mcap.writer import LIBRARY_IDENTIFIER, CompressionType
from mcap.writer import Writer as McapWriter
from rosbags.interfaces import (
    Qos,
    QosDurability,
    QosHistory,
    QosLiveliness,
    QosReliability,
    QosTime,
)
from rosbags.rosbag2.metadata import dump_qos_v9
from rosbags.typesys import Stores, get_typestore
from rosbags.typesys.store import Typestore
from ruamel.yaml import YAML

from .. import __version__
from ..core.scheduling import lower_this_thread, name_this_thread
from .cdr import has_header, header_stamp_ns
from .errors import RecordingError
from .metadata import METADATA

BAG_VERSION = 9
"""rosbag2 metadata version written (Jazzy and Kilted read it)."""
UNKNOWN_TYPE_HASH = "RIHS01_" + "0" * 64
"""Placeholder type hash of a topic whose type the typestore does not know (written with an empty definition)."""
CHUNK_SIZE = 2**20
"""A chunk is written to the file once its records pass this size [bytes]."""
DEFAULT_QUEUE_MAX_BYTES = 256 * 2**20
"""Default bound of the writer queue [bytes]: about 9 s of 640x480 RGB at 30 Hz."""
DEFAULT_QUEUE_MAX_MESSAGES = 100_000
DEFAULT_FLUSH_PERIOD_S = 0.5
_NO_MESSAGE_START_NS = 2**63 - 1  # ``starting_time`` of a bag without messages (the largest int64, as rosbag2) [ns]


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


# -- metadata.yaml ---------------------------------------------------------------------------


class BagTopic(NamedTuple):
    """One connection of a bag (a topic with one type): a ``topics_with_message_count`` entry."""

    name: str
    type_name: str
    offered_qos: list[Qos]
    type_hash: str  # RIHS01 hash of the type, or UNKNOWN_TYPE_HASH
    message_count: int
    serialization_format: str = "cdr"


def type_hash(typestore: Typestore, type_name: str) -> str:
    """The RIHS01 hash of ``type_name`` in ``typestore``; UNKNOWN_TYPE_HASH for a type it does not know."""
    return typestore.hash_rihs01(type_name) if type_name in typestore.fielddefs else UNKNOWN_TYPE_HASH


def dump_yaml(data: Any) -> str:
    """YAML text in rosbags' style (ruamel, block style), which rosbag2's yaml-cpp reads."""
    stream = StringIO()
    writer = YAML(typ="safe")
    writer.default_flow_style = False
    writer.dump(data, stream)
    return stream.getvalue()


def bagfile_information(
    mcap_name: str, topics: Sequence[BagTopic], *, start_ns: int, end_ns: int, custom_data: Mapping[str, str] | None
) -> dict[str, Any]:
    """``rosbag2_bagfile_information`` (version 9) of a bag with one MCAP file, in rosbags' layout.

    Args:
        mcap_name: the MCAP file's name, relative to the bag directory.
        topics: the bag's connections, in channel id order.
        start_ns: receive time of the first message [ns] (the bag's ``starting_time``).
        end_ns: receive time of the last message [ns] (duration: ``end_ns - start_ns``, at least 0).
        custom_data: the ``custom_data`` map (None or empty: none).
    """
    count = sum(t.message_count for t in topics)
    duration = max(0, end_ns - start_ns)
    return {
        "version": BAG_VERSION,
        "storage_identifier": "mcap",
        "relative_file_paths": [mcap_name],
        "duration": {"nanoseconds": duration},
        "starting_time": {"nanoseconds_since_epoch": start_ns},
        "message_count": count,
        "topics_with_message_count": [
            {
                "topic_metadata": {
                    "name": t.name,
                    "type": t.type_name,
                    "serialization_format": t.serialization_format,
                    "offered_qos_profiles": dump_qos_v9(list(t.offered_qos)),
                    "type_description_hash": t.type_hash,
                },
                "message_count": t.message_count,
            }
            for t in topics
        ],
        "compression_format": "",
        "compression_mode": "",
        "files": [
            {
                "path": mcap_name,
                "starting_time": {"nanoseconds_since_epoch": start_ns},
                "duration": {"nanoseconds": duration},
                "message_count": count,
            }
        ],
        "custom_data": dict(custom_data) if custom_data else None,
        "ros_distro": "rosbags",
    }


def write_metadata_yaml(bag_dir: Path, info: Mapping[str, Any]) -> None:
    """Write ``bag_dir/metadata.yaml`` holding ``info`` through a temporary file and a rename.

    Raises:
        OSError: the file cannot be written.
    """
    path = bag_dir / METADATA
    tmp = path.with_name(METADATA + ".tmp")
    tmp.write_text(dump_yaml({"rosbag2_bagfile_information": dict(info)}), encoding="utf-8")
    tmp.replace(path)


# -- the bag file ----------------------------------------------------------------------------


class BagFile:
    """A rosbag2 bag being written: its directory, its MCAP file, its connections (one thread at a time).

    Creating one creates the directory (parents too) and starts the MCAP file. :meth:`write` adds a
    message (registering its type's schema and its connection on first use), :meth:`flush` puts every
    message written so far in the file, :meth:`close` writes the summary and ``metadata.yaml``,
    :meth:`abort` closes the file as it is (no summary, no ``metadata.yaml``).

    Args:
        bag_dir: the bag directory to create (must not exist).
        typestore: where message definitions and type hashes come from; a type it does not know is
            written with an empty definition and UNKNOWN_TYPE_HASH.
        topic_qos: topic -> QoS profiles its publishers offered (default: none recorded).
        crcs: write chunk, data-section and summary CRCs (see the module description).

    Raises:
        OSError: the directory exists already (FileExistsError) or cannot be created, or the file cannot be
            written.
    """

    def __init__(
        self, bag_dir: str | Path, typestore: Typestore, topic_qos: Mapping[str, Sequence[Qos]] | None = None,
        *, crcs: bool = True,
    ) -> None:
        self.bag_dir = Path(bag_dir)
        self.mcap_path = self.bag_dir / f"{self.bag_dir.name}.mcap"
        self._typestore = typestore
        self._qos = {topic: list(profiles) for topic, profiles in (topic_qos or {}).items()}
        self._schema_ids: dict[str, int] = {}  # type name -> schema id
        self._channel_ids: dict[tuple[str, str], int] = {}  # (topic, type name) -> channel id
        self._topics: list[BagTopic] = []  # by channel id - 1, message_count 0 (counted in _counts)
        self._counts: dict[int, int] = {}  # channel id -> messages written
        self._start_ns = _NO_MESSAGE_START_NS
        self._end_ns = 0
        self.bag_dir.mkdir(mode=0o755, parents=True)
        self._file = self.mcap_path.open("xb")
        try:
            self._mcap = McapWriter(
                self._file, chunk_size=CHUNK_SIZE, compression=CompressionType.NONE, enable_crcs=bool(crcs),
                enable_data_crcs=bool(crcs),
            )
            self._mcap.start(profile="ros2", library=f"rynn_teleop {__version__}; {LIBRARY_IDENTIFIER}")
        except BaseException:
            self._file.close()
            raise

    def write(self, topic: str, type_name: str, time_ns: int, data: bytes | bytearray | memoryview) -> None:
        """Add one serialized message with its receive time [ns] (its MCAP log and publish time)."""
        channel_id = self._channel_ids.get((topic, type_name))
        if channel_id is None:
            channel_id = self._add_channel(topic, type_name)
        self._mcap.add_message(channel_id, time_ns, data, time_ns)  # type: ignore[arg-type]  # any buffer
        self._counts[channel_id] += 1
        if time_ns < self._start_ns:
            self._start_ns = time_ns
        if time_ns > self._end_ns:
            self._end_ns = time_ns

    def flush(self, *, fsync: bool = False) -> None:
        """Finish the open chunk and hand the file's buffered bytes to the operating system.

        Args:
            fsync: also ``os.fsync`` the file (to the device, against power loss).
        """
        self._mcap.flush()
        if fsync:
            os.fsync(self._file.fileno())

    def topics(self) -> list[BagTopic]:
        """The connections written so far with their message counts, in channel id order."""
        return [t._replace(message_count=self._counts[cid]) for cid, t in enumerate(self._topics, 1)]

    def information(self, custom_data: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The bag's ``rosbag2_bagfile_information`` so far (see :func:`bagfile_information`)."""
        return bagfile_information(
            self.mcap_path.name, self.topics(), start_ns=self._start_ns, end_ns=self._end_ns, custom_data=custom_data
        )

    def close(self, custom_data: Mapping[str, str] | None = None) -> None:
        """Write the last chunk, the ``rosbag2`` metadata record, the summary and ``metadata.yaml``.

        Args:
            custom_data: string key -> string value pairs for the ``custom_data`` map of ``metadata.yaml``
                and of the ``rosbag2`` metadata record.

        Raises:
            ValueError: a key or value of ``custom_data`` is not a string (nothing written).
            OSError: a write failed (the file is left open: call :meth:`abort`).
        """
        bad = {k: v for k, v in (custom_data or {}).items() if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise ValueError(f"custom_data keys and values must be strings: {bad!r}")
        info = self.information(custom_data)
        self._mcap.flush()  # the last chunk before the metadata record, where recover's data section ends
        self._mcap.add_metadata("rosbag2", {"serialized_metadata": dump_yaml(info).strip()})
        self._mcap.finish()
        self._file.close()
        write_metadata_yaml(self.bag_dir, info)

    def abort(self) -> None:
        """Close the file as it is, without summary or ``metadata.yaml`` (idempotent).

        Raises:
            OSError: writing the file's buffered bytes failed (the file is closed all the same).
        """
        self._file.close()

    def _add_channel(self, topic: str, type_name: str) -> int:
        schema_id = self._schema_ids.get(type_name)
        if schema_id is None:
            known = type_name in self._typestore.fielddefs
            msgdef = self._typestore.generate_msgdef(type_name, ros_version=2)[0] if known else ""
            schema_id = self._mcap.register_schema(type_name, "ros2msg", msgdef.encode())
            self._schema_ids[type_name] = schema_id
        qos = self._qos.get(topic, [])
        qos_text = dump_yaml(dump_qos_v9(qos)).strip()
        channel_id = self._mcap.register_channel(topic, "cdr", schema_id, {"offered_qos_profiles": qos_text})
        self._channel_ids[(topic, type_name)] = channel_id
        self._topics.append(BagTopic(topic, type_name, qos, type_hash(self._typestore, type_name), 0))
        self._counts[channel_id] = 0
        return channel_id


# -- the episode writer ----------------------------------------------------------------------


class _Item(NamedTuple):
    topic: str
    type_name: str
    data: bytes | bytearray | memoryview
    time_ns: int


class EpisodeWriter:
    """Writes one bag directory (a :class:`BagFile`) from a thread; ``submit`` from any thread never blocks.

    ``submit`` appends to a queue bounded in messages and bytes; a full queue drops the message and counts
    the drop for its topic. States: ``new`` -> ``open`` (:meth:`open`) -> ``draining`` (:meth:`drain`) ->
    ``closed`` (:meth:`close`); ``failed`` from ``open``/``draining``/``close`` on an
    error; ``aborted`` (:meth:`abort`) from any state.

    Failures: an error while writing (disk full, I/O error) stores a :class:`RecordingError` in
    :attr:`error`, calls ``on_error``, closes the file without an index, counts what was still queued as
    dropped and ends the thread; later ``submit`` calls return False and :meth:`close` raises the error.

    Args:
        bag_dir: the bag directory to create (must not exist; parents are created).
        typestore: where message definitions come from (default: ROS 2 Kilted).
        queue_max_bytes: queue bound [bytes] (message payloads).
        queue_max_messages: queue bound [messages].
        flush_period_s: finish the open chunk and flush at least this often [s] while data arrives.
        fsync: also ``os.fsync`` at each periodic flush (power-loss safety; costs device syncs).
        topic_qos: topic -> offered QoS profiles recorded for it (default: none recorded,
            ``ros2 bag play`` then uses its defaults).
        on_error: called once with the error that failed the writer (from the writer thread,
            or from :meth:`close` when finishing the file failed).
        crcs: write chunk, data-section and summary CRCs (default; see the module description).
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
        crcs: bool = True,
    ) -> None:
        self.bag_dir = Path(bag_dir)
        self._crcs = bool(crcs)
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
        self._bag: BagFile | None = None
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
        """The MCAP file of the bag, named after the directory."""
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
        try:
            self._bag = BagFile(self.bag_dir, self._typestore, self._qos, crcs=self._crcs)
        except OSError as exc:
            raise RecordingError(f"cannot create episode directory {self.bag_dir}: {_reason(exc)}") from exc
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
            if (
                self._state == "failed"
                or len(self._queue) >= self._max_messages
                or self._queued_bytes + size > self._max_bytes
            ):
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
            self._bag.close(custom_data)
        except (OSError, ValueError) as exc:
            self._fail(exc, "closing the bag")
            raise self._error from exc  # type: ignore[misc]
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
        self._bag.write(item.topic, item.type_name, item.time_ns, item.data)
        self._times.setdefault(item.topic, []).append(item.time_ns)
        stamp = header_stamp_ns(item.data) if has_header(self._typestore, item.type_name) else 0
        self._stamps.setdefault(item.topic, []).append(stamp)
        self._written_bytes += _size(item.data)

    def _flush(self) -> None:
        assert self._bag is not None
        self._bag.flush(fsync=self._fsync)

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
        if self._bag is not None:
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
