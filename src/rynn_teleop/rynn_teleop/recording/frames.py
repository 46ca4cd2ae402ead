"""Reading recorded episodes' messages: one pass over the bag, commands aligned with camera frames (ROS-free).

Shared by the LeRobot export (:mod:`.export`) and the world-model dataset
(:mod:`rynn_teleop.world_model.training.dataset`), so both read a bag, check an episode and give a frame its
action the same way:

* :class:`Bag`: an episode's MCAP file, read chunk by chunk in file order (:meth:`Bag.scan`);
* :func:`scan_episode`: one pass collecting every topic's receive times and header stamps (what
  ``episodes check`` needs: :func:`episode_problems`), the measured and commanded joints
  (:class:`JointTrack`) and the camera-source changes;
* :func:`command_rows`: a camera topic's frames in header-stamp order, each with the 54-D command in force
  at its stamp (the newest value of every joint stamped at or before it, canonical joint order of
  :data:`~rynn_teleop.core.robot_model.CANONICAL_JOINT_NAMES`), frames before every joint was commanded
  left out and counted;
* :func:`read_images`: decoded frames of a topic in any chosen order; :func:`first_message`.

Message numbers on a topic count its messages in file order (the order :meth:`Bag.scan` yields them).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from mcap.data_stream import ReadDataStream
from mcap.reader import make_reader
from mcap.records import Chunk
from mcap.stream_reader import CRCValidationError, get_chunk_data_stream

from ..core.image import decode_image
from ..core.robot_model import CANONICAL_JOINT_NAMES
from .cdr import has_header, header_stamp_ns
from .errors import DamagedEpisodeError, EpisodeDataError
from .metadata import salvage_problems
from .recover import mcap_file
from .stats import episode_stats
from .writer import default_typestore

FEED_TOPICS: dict[str, str] = {
    "physical": "/head_camera/physical/color/image_raw",
    "generated": "/head_camera/generated/color/image_raw",
    "consumer": "/head_camera/color/image_raw",
}
"""Camera key -> the recorded ``sensor_msgs/Image`` topic of that feed."""
MEASURED_TOPIC = "/joint_states"
COMMAND_TOPICS = ("/arms/command", "/hands/command")
SOURCE_TOPIC = "/head_camera/active_source"
JOINT_STATE = "sensor_msgs/msg/JointState"
IMAGE = "sensor_msgs/msg/Image"
CAMERA_INFO = "sensor_msgs/msg/CameraInfo"


_JOINT_INDEX = {n: i for i, n in enumerate(CANONICAL_JOINT_NAMES)}
N_JOINTS = len(CANONICAL_JOINT_NAMES)


class JointTrack:
    """JointState messages of some topics: canonical indices and positions by header stamp."""

    def __init__(self, topics: Sequence[str]) -> None:
        self.topics = tuple(topics)
        self.stamps: list[int] = []
        self.indices: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.seen = np.zeros(N_JOINTS, bool)
        self._cache: dict[tuple[str, ...], np.ndarray] = {}

    def add(self, stamp: int, names: Sequence[str], positions: np.ndarray, episode: Path, topic: str) -> None:
        key = tuple(names)
        idx = self._cache.get(key)
        if idx is None:
            idx = self._cache[key] = np.array([_JOINT_INDEX.get(n, -1) for n in key], dtype=np.int64)
        if len(positions) != len(idx):
            raise EpisodeDataError(f"{episode}: a JointState on {topic} has {len(idx)} names but {len(positions)} "
                                   "positions", episode=episode, topic=topic)
        keep = idx >= 0
        self.stamps.append(stamp)
        self.indices.append(idx[keep])
        self.values.append(np.asarray(positions, np.float64)[keep])
        self.seen[idx[keep]] = True

    def sample(self, at_ns: np.ndarray) -> np.ndarray:
        """(rows, 54) newest value of each joint stamped at or before each of the sorted stamps ``at_ns``
        (NaN before a joint's first value)."""
        order = np.argsort(np.asarray(self.stamps, np.int64), kind="stable")
        stamps = np.asarray(self.stamps, np.int64)[order]
        out = np.empty((len(at_ns), N_JOINTS))
        cur = np.full(N_JOINTS, np.nan)
        k, n = 0, len(order)
        for r, t in enumerate(at_ns):
            while k < n and stamps[k] <= t:
                j = order[k]
                cur[self.indices[j]] = self.values[j]
                k += 1
            out[r] = cur
        return out


_RECORD = struct.Struct("<BQ")  # opcode, content length
_MESSAGE = struct.Struct("<HIQ")  # channel id, sequence, log time (publish time follows)
_OP_MESSAGE = 0x05


@dataclass
class Bag:
    """An episode bag's channels (from the MCAP summary), read once per pass by :meth:`scan`."""

    path: Path
    topics: dict[int, str]  # channel id -> topic
    types: dict[str, str]  # topic -> type name
    chunks: list[Any]  # the summary's chunk indexes, in file order

    @classmethod
    def open(cls, episode: Path) -> Bag:
        """Raises EpisodeDataError: the bag has no summary (not closed: ``episodes recover`` rebuilds it)."""
        path = mcap_file(episode)
        try:
            with path.open("rb") as f:
                summary = make_reader(f).get_summary()
        except Exception as exc:  # mcap raises several types for a cut file
            raise EpisodeDataError(f"{episode}: the bag has no readable index ({exc}); run `rynn-teleop episodes "
                                   f"recover {episode}`", episode=episode) from exc
        if summary is None:
            raise EpisodeDataError(f"{episode}: the bag has no index; run `rynn-teleop episodes recover {episode}`",
                                   episode=episode)
        topics = {cid: ch.topic for cid, ch in summary.channels.items()}
        types = {ch.topic: (summary.schemas[ch.schema_id].name if ch.schema_id in summary.schemas else "")
                 for ch in summary.channels.values()}
        chunks = sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset)
        if not chunks and summary.statistics and summary.statistics.message_count:
            raise EpisodeDataError(f"{episode}: the bag's messages are not in chunks (not written by this stack)",
                                   episode=episode)
        return cls(path, topics, types, chunks)

    def scan(self, topics: set[str] | None) -> Iterator[tuple[str, int, memoryview]]:
        """(topic, log time [ns], CDR data) of every message of ``topics`` (None: all), in file order.

        Reads the chunks straight from the file (no per-record objects, no ordering queue):
        file order is the order the recorder wrote, the same in every pass.
        """
        wanted = {cid for cid, t in self.topics.items() if topics is None or t in topics}
        with self.path.open("rb") as f:
            for ci in self.chunks:
                if not wanted.intersection(ci.message_index_offsets or wanted):
                    continue
                f.seek(ci.chunk_start_offset + _RECORD.size)
                body = f.read(ci.chunk_length - _RECORD.size)
                records = _chunk_records(body, self.path)
                end = len(records)
                pos = 0
                while pos + _RECORD.size <= end:
                    op, length = _RECORD.unpack_from(records, pos)
                    pos += _RECORD.size
                    if op == _OP_MESSAGE:
                        cid, _, log_time = _MESSAGE.unpack_from(records, pos)
                        if cid in wanted:
                            yield self.topics[cid], log_time, records[pos + 22: pos + length]
                    pos += length


class JointStateReader:
    """``name`` and ``position`` of little-endian CDR ``sensor_msgs/JointState`` messages, read in place.

    A publisher sends the same names every time, so the name block is parsed once and afterwards only
    compared byte for byte; anything unexpected goes through the rosbags typestore instead.
    """

    _U32 = struct.Struct("<I")

    def __init__(self, typestore: Any) -> None:
        self._typestore = typestore
        self._known: dict[tuple[int, bytes], tuple[tuple[str, ...], bytes]] = {}

    def read(self, data: memoryview) -> tuple[tuple[str, ...], np.ndarray]:
        try:
            if len(data) < 16 or data[0] != 0 or data[1] != 1:
                raise ValueError("not plain little-endian CDR")
            u32 = self._U32.unpack_from
            pos = 4 + 8  # after the encapsulation header and the stamp
            pos += 4 + u32(data, pos)[0]  # frame_id
            pos = 4 + ((pos - 4 + 3) & ~3)
            count = u32(data, pos)[0]
            start = pos = pos + 4
            key = (count, bytes(data[start: start + 48]))
            known = self._known.get(key)
            if known is not None and data[start: start + len(known[1])] == known[1]:
                names, block = known
                pos = start + len(block)
            else:
                names_list = []
                for _ in range(count):
                    pos = 4 + ((pos - 4 + 3) & ~3)
                    n = u32(data, pos)[0]
                    names_list.append(bytes(data[pos + 4: pos + 3 + n]).decode())
                    pos += 4 + n
                names = tuple(names_list)
                self._known[key] = (names, bytes(data[start:pos]))
            pos = 4 + ((pos - 4 + 3) & ~3)
            n_pos = u32(data, pos)[0]
            pos = 4 + ((pos + 4 - 4 + 7) & ~7)
            if n_pos and pos + 8 * n_pos > len(data):
                raise ValueError("positions past the end")
            return names, np.frombuffer(data, "<f8", n_pos, pos) if n_pos else np.zeros(0)
        except (ValueError, struct.error):
            msg = self._typestore.deserialize_cdr(bytes(data), JOINT_STATE)
            return tuple(msg.name), np.asarray(msg.position, np.float64)


def _chunk_records(body: bytes, path: Path) -> memoryview:
    """The records of a chunk record's content, decompressed and CRC-checked by the mcap library.

    Raises:
        DamagedEpisodeError: the chunk's CRC does not match, or the chunk cannot be read.
    """
    try:
        stream, length = get_chunk_data_stream(Chunk.read(ReadDataStream(io.BytesIO(body))), validate_crc=True)
    except CRCValidationError as exc:
        raise DamagedEpisodeError(f"{path}: damaged: a chunk's CRC does not match ({exc})", episode=path) from exc
    except Exception as exc:  # unsupported compression, a cut chunk
        raise DamagedEpisodeError(f"{path}: damaged: a chunk cannot be read ({exc})", episode=path) from exc
    return memoryview(stream.read(length))


def _undecodable(path: Path, topic: str, exc: Exception) -> DamagedEpisodeError:
    """The error of a message that does not decode with its type (garbage where a message was)."""
    return DamagedEpisodeError(f"{path}: damaged: a message on {topic} does not decode ({type(exc).__name__}: "
                               f"{exc})", episode=path, topic=topic)


def episode_problems(path: Path, doc: Mapping[str, Any], bag: Bag, times: Mapping[str, list[int]],
                     stamps: Mapping[str, list[int]]) -> list[str]:
    """What ``episodes check`` reports for the episode (:func:`..inspect.episode_info`), from this pass's
    receive times and header stamps instead of another read of the bag."""
    problems: list[str] = []
    if str(doc.get("state") or "") == "failed":
        problems.append(f"recording failed: {doc.get('error', 'unknown error')}")
    problems += salvage_problems(doc)
    rates = dict(doc.get("expected_rates") or {})
    typestore = default_typestore()
    received = {t: (bag.types[t], np.asarray(times.get(t, ()), np.int64)) for t in bag.types}
    edges = [int(x) for _, ts in received.values() if ts.size for x in (ts.min(), ts.max())]
    start_ns = int(doc.get("start_ns") or min(edges, default=0))
    stop_ns = int(doc.get("stop_ns") or max(edges, default=start_ns))
    recorded = (doc.get("stats") or {}).get("topics") or {}
    stats = episode_stats(
        received, start_ns=start_ns, stop_ns=stop_ns, expected_rates=rates,
        dropped={t: int(v.get("dropped", 0)) for t, v in recorded.items()},
        stamps={t: np.asarray(stamps[t], np.int64) for t in stamps
                if rates.get(t) and has_header(typestore, bag.types.get(t, ""))},
        gap_rates=doc.get("gap_rates") or {},
    )
    return problems + stats.problems()



def missing_command_topic(missing: Sequence[str]) -> str:
    """The command topic that should have carried the first of the ``missing`` joints."""
    return COMMAND_TOPICS[0] if "_arm_" in missing[0] else COMMAND_TOPICS[1]


# -- one pass over an episode ----------------------------------------------------------------


@dataclass
class EpisodeScan:
    """What one pass over an episode's bag found (:func:`scan_episode`).

    Attributes:
        path: the episode directory.
        bag: its bag.
        times: topic -> receive (log) times [ns] of its messages, in file order (every topic of the bag).
        stamps: topic -> header stamps [ns] of its messages, in file order (meaningless for a type without
            a header).
        measured: the joints of :data:`MEASURED_TOPIC`.
        commanded: the joints of :data:`COMMAND_TOPICS`.
        command_stamps: header stamps of every command message [ns].
        sources: (receive time [ns], feed name) of every :data:`SOURCE_TOPIC` message, in file order.
    """

    path: Path
    bag: Bag
    times: dict[str, list[int]]
    stamps: dict[str, list[int]]
    measured: JointTrack
    commanded: JointTrack
    command_stamps: set[int] = field(default_factory=set)
    sources: list[tuple[int, str]] = field(default_factory=list)

    def problems(self, doc: Mapping[str, Any]) -> list[str]:
        """What ``episodes check`` reports for the episode, given its description ``doc``
        (:func:`.metadata.episode_doc`); see :func:`episode_problems`."""
        return episode_problems(self.path, doc, self.bag, self.times, self.stamps)


def scan_episode(path: str | Path, bag: Bag | None = None, typestore: Any = None) -> EpisodeScan:
    """Read every message of the episode at ``path`` once (see :class:`EpisodeScan`).

    Args:
        path: the episode directory.
        bag: its already opened :class:`Bag` (default: opened here).
        typestore: the rosbags typestore to decode with (default :func:`.writer.default_typestore`).

    Raises:
        EpisodeDataError: the bag has no readable index or chunk; a joint topic that is not a JointState; a
            JointState whose names and positions differ in number.
    """
    path = Path(path)
    bag = Bag.open(path) if bag is None else bag
    typestore = default_typestore() if typestore is None else typestore
    scan = EpisodeScan(path, bag, {t: [] for t in bag.types}, {t: [] for t in bag.types},
                       JointTrack([MEASURED_TOPIC]), JointTrack(COMMAND_TOPICS))
    joints = JointStateReader(typestore)
    times, stamps = scan.times, scan.stamps
    for topic, log_time, data in bag.scan(None):  # one pass: the check's times and stamps, joints, frame stamps
        times[topic].append(log_time)
        stamps[topic].append(header_stamp_ns(data))
        if topic == SOURCE_TOPIC:
            try:
                scan.sources.append((log_time, str(typestore.deserialize_cdr(data, bag.types[topic]).data)))
            except Exception as exc:  # rosbags raises SerdeError and others for garbage
                raise _undecodable(path, topic, exc) from exc
        elif topic == MEASURED_TOPIC or topic in COMMAND_TOPICS:
            if bag.types[topic] != JOINT_STATE:
                raise EpisodeDataError(f"{path}: {topic} is {bag.types[topic]}, not {JOINT_STATE}",
                                       episode=path, topic=topic)
            try:
                names, positions = joints.read(data)
            except Exception as exc:  # rosbags raises SerdeError and others for garbage
                raise _undecodable(path, topic, exc) from exc
            stamp = stamps[topic][-1]
            (scan.measured if topic == MEASURED_TOPIC else scan.commanded).add(stamp, names, positions, path, topic)
            if topic != MEASURED_TOPIC:
                scan.command_stamps.add(stamp)
    return scan


# -- camera frames and the commands in force -------------------------------------------------


class CommandRows(NamedTuple):
    """A camera topic's frames in header-stamp order, each with the command in force at its stamp
    (:func:`command_rows`)."""

    messages: np.ndarray  # (rows,) int64: each row's message number on the topic (file order)
    stamps_ns: np.ndarray  # (rows,) int64 header stamps [ns], non-decreasing
    actions: np.ndarray  # (rows, 54) float64 commanded joint positions [rad], canonical joint order
    dropped: int  # frames stamped before every joint had been commanded (left out)


def command_rows(scan: EpisodeScan, topic: str) -> CommandRows:
    """The frames of the camera ``topic``, sorted by header stamp (stable: equal stamps keep file order), each
    with the newest commanded value of every joint stamped at or before the frame's stamp.

    Frames before every one of the 54 joints has been commanded are left out (counted in ``dropped``);
    after that no value disappears, so the rows are the sorted frames from the first complete one on.

    Raises:
        EpisodeDataError: the topic was not recorded, is not a ``sensor_msgs/Image`` topic or has no frame; a
            command topic was not recorded; joints that were never commanded (named); no frame stamped at or
            after the first command of every joint. ``topic`` names the topic at fault.
    """
    path, bag = scan.path, scan.bag
    if topic not in bag.types:
        raise EpisodeDataError(f"{path}: no camera frames: topic {topic} was not recorded", episode=path, topic=topic)
    if bag.types[topic] != IMAGE:
        raise EpisodeDataError(f"{path}: {topic} is {bag.types[topic]}, not {IMAGE}", episode=path, topic=topic)
    frame_stamps = np.asarray(scan.stamps[topic], np.int64)
    if frame_stamps.size == 0:
        raise EpisodeDataError(f"{path}: no camera frames on {topic}", episode=path, topic=topic)
    for command_topic in COMMAND_TOPICS:
        if command_topic not in bag.types:
            raise EpisodeDataError(f"{path}: no commands: topic {command_topic} was not recorded", episode=path,
                                   topic=command_topic)
    track = scan.commanded
    if not track.seen.all():
        missing = [CANONICAL_JOINT_NAMES[i] for i in np.nonzero(~track.seen)[0]]
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise EpisodeDataError(f"{path}: joints never commanded on {', '.join(track.topics)}: {shown}",
                               episode=path, topic=missing_command_topic(missing))
    order = np.argsort(frame_stamps, kind="stable")
    stamps = frame_stamps[order]
    actions = track.sample(stamps)
    valid = ~np.isnan(actions).any(axis=1)
    if not valid.any():
        raise EpisodeDataError(f"{path}: every frame on {topic} is stamped before every joint had been commanded",
                               episode=path, topic=topic)
    start = int(np.argmax(valid))
    return CommandRows(order[start:].astype(np.int64), stamps[start:], actions[start:], start)


def read_images(bag: Bag, topic: str, messages: Sequence[int] | np.ndarray, typestore: Any = None, *,
                depth: bool = False, transform: Callable[[np.ndarray], np.ndarray] | None = None,
                ) -> Iterator[np.ndarray]:
    """The images of the messages numbered ``messages`` on ``topic``, in that order (a number may repeat).

    One pass over the topic; a decoded image is kept only until its last use in ``messages``.

    Args:
        bag: the episode's bag.
        topic: a ``sensor_msgs/Image`` topic.
        messages: message numbers on ``topic`` (file order, as :func:`command_rows` gives them).
        typestore: the rosbags typestore (default :func:`.writer.default_typestore`).
        depth: decode depth images ((H, W) uint16 [mm]) instead of colour ((H, W, 3) uint8 RGB);
            :func:`~rynn_teleop.core.image.decode_image`.
        transform: applied once to each decoded image (e.g. depth quantisation); its results are yielded.

    Raises:
        EpisodeDataError: an image that cannot be decoded, or numbers past the topic's last message (raised
            when the pass reaches the end).
    """
    path = bag.path.parent
    typestore = default_typestore() if typestore is None else typestore
    sel = [int(m) for m in messages]
    if not sel:
        return
    need: dict[int, int] = {}  # message number -> last position that uses it
    for r, m in enumerate(sel):
        need[m] = r
    cache: dict[int, np.ndarray] = {}
    nxt = 0
    scan = bag.scan({topic})
    try:
        for m, (_, _, data) in enumerate(scan):
            if m not in need:
                continue
            try:
                msg = typestore.deserialize_cdr(data, IMAGE)
            except Exception as exc:  # rosbags raises SerdeError and others for garbage
                raise _undecodable(path, topic, exc) from exc
            try:
                image = decode_image(msg, depth=depth)
            except ValueError as exc:
                raise EpisodeDataError(f"{path}: {topic}: {exc}", episode=path, topic=topic) from exc
            cache[m] = image if transform is None else transform(image)
            while nxt < len(sel) and sel[nxt] in cache:
                frame = cache[sel[nxt]]
                if need[sel[nxt]] == nxt:
                    del cache[sel[nxt]]
                nxt += 1
                yield frame
            if nxt == len(sel):
                return
    finally:
        scan.close()
    raise EpisodeDataError(f"{path}: {topic}: {len(sel) - nxt} frame(s) could not be read back",
                           episode=path, topic=topic)


def first_message(bag: Bag, topic: str, typestore: Any = None) -> Any | None:
    """The first message on ``topic`` (file order), decoded with its recorded type; None when there is none."""
    if topic not in bag.types:
        return None
    typestore = default_typestore() if typestore is None else typestore
    scan = bag.scan({topic})
    try:
        for _, _, data in scan:
            try:
                return typestore.deserialize_cdr(data, bag.types[topic])
            except Exception as exc:  # rosbags raises SerdeError and others for garbage
                raise _undecodable(bag.path.parent, topic, exc) from exc
    finally:
        scan.close()
    return None
