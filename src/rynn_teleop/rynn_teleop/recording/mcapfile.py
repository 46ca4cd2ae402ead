"""MCAP files at the record level, on top of the ``mcap`` package's record classes (ROS-free).

* :func:`scan` reads the data section record by record up to the first record that is cut off or
  unreadable (a writer killed mid-write), keeping every complete chunk and each message's would-be
  header stamp (:func:`.cdr.header_stamp_ns`; meaningless for types without a header, which users ignore);
* :func:`repair` cuts the file after the last complete chunk (regenerating its message indexes when they
  were cut) and appends a summary and footer with the data-section and summary CRCs, so that indexed readers
  (rosbag2's MCAP plugin, rosbags, ``mcap``) open it and ``episodes check`` can prove it intact;
* :func:`read_index` reads a complete file's channels and receive times from its indexes, without payloads;
* :func:`read_stamps` reads chosen topics' header stamps (first 12 bytes), for the integrity statistics.

Offsets are byte offsets in the file; times are MCAP ``log_time`` values [ns].
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
from mcap.data_stream import ReadDataStream, RecordBuilder
from mcap.opcode import Opcode
from mcap.reader import make_reader
from mcap.records import (
    Channel,
    Chunk,
    ChunkIndex,
    DataEnd,
    Footer,
    Header,
    Message,
    MessageIndex,
    Metadata,
    MetadataIndex,
    Schema,
    Statistics,
    SummaryOffset,
)
from mcap.stream_reader import get_chunk_data_stream

from .cdr import header_stamp_ns
from .errors import RecordingError

MAGIC = b"\x89MCAP0\r\n"
_RECORD_PREFIX = struct.Struct("<BQ")  # opcode, content length
_FOOTER_SIZE = _RECORD_PREFIX.size + 8 + 8 + 4


@dataclass
class Scan:
    """What the intact part of an MCAP file holds."""

    size: int  # file size [bytes]
    complete: bool  # ends with a footer and the magic: written to the end by its writer
    keep_end: int  # offset up to which the file is kept by a repair [bytes]
    header: Header | None = None
    schemas: dict[int, Schema] = field(default_factory=dict)
    channels: dict[int, Channel] = field(default_factory=dict)
    chunk_indexes: list[ChunkIndex] = field(default_factory=list)
    times: dict[int, list[int]] = field(default_factory=dict)  # channel id -> message log times [ns]
    stamps: dict[int, list[int]] = field(default_factory=dict)  # channel id -> header stamps [ns], as times
    missing_index: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Message index entries (log time, offset) to regenerate for the last chunk, by channel (empty if intact)."""

    @property
    def message_count(self) -> int:
        """Messages in the intact part."""
        return sum(len(t) for t in self.times.values())


class _LastChunk(NamedTuple):
    """The newest chunk of a scan, whose message index records may be cut off."""

    index: ChunkIndex  # its chunk index entry; message index offsets filled in as they are read
    entries: dict[int, list[tuple[int, int]]]  # channel id -> (log time [ns], offset in the chunk) of its messages


class _RecordAt(NamedTuple):
    """One complete record of a file."""

    opcode: int
    start: int  # offset of the record's opcode [bytes]
    end: int  # offset after the record [bytes]
    body: bytes  # the record's content (after opcode and length)


_DATA_RECORDS = frozenset({Opcode.HEADER, Opcode.SCHEMA, Opcode.CHANNEL, Opcode.MESSAGE, Opcode.CHUNK,
                           Opcode.MESSAGE_INDEX})
"""Records a scan keeps; any other (data end, metadata, attachment, summary) ends the kept data section."""


def _is_complete(f: BinaryIO, size: int) -> bool:
    if size < len(MAGIC) * 2 + _FOOTER_SIZE:
        return False
    f.seek(size - len(MAGIC) - _FOOTER_SIZE)
    tail = f.read(_FOOTER_SIZE + len(MAGIC))
    op, length = _RECORD_PREFIX.unpack_from(tail)
    return op == Opcode.FOOTER and length == 20 and tail[-len(MAGIC):] == MAGIC


def _chunk_records(chunk: Chunk) -> list[tuple[int, Schema | Channel | Message]]:
    """The schema, channel and message records of a chunk with their offsets in its uncompressed records.

    Raises:
        Exception: the chunk's CRC does not match (``CRCValidationError``) or its records are unreadable.
    """
    stream, length = get_chunk_data_stream(chunk, validate_crc=True)
    out: list[tuple[int, Schema | Channel | Message]] = []
    while stream.count < length:
        offset = stream.count
        op = stream.read1()
        size = stream.read8()
        if op == Opcode.MESSAGE:
            out.append((offset, Message.read(stream, size)))
        elif op == Opcode.SCHEMA:
            out.append((offset, Schema.read(stream)))
        elif op == Opcode.CHANNEL:
            out.append((offset, Channel.read(stream)))
        else:
            stream.read(size)
    return out


def _complete_records(f: BinaryIO, size: int) -> Iterator[_RecordAt]:
    """The records after the leading magic, up to the first one cut off by the end of the file."""
    pos = len(MAGIC)
    f.seek(pos)
    while pos + _RECORD_PREFIX.size <= size:
        op, length = _RECORD_PREFIX.unpack(f.read(_RECORD_PREFIX.size))
        end = pos + _RECORD_PREFIX.size + length
        if end > size:
            return
        yield _RecordAt(op, pos, end, f.read(length))
        pos = end


def _add_message(result: Scan, message: Message) -> None:
    result.times.setdefault(message.channel_id, []).append(message.log_time)
    result.stamps.setdefault(message.channel_id, []).append(header_stamp_ns(message.data))


def _take_loose_record(result: Scan, rec: _RecordAt) -> None:
    """A header, schema, channel or message record outside any chunk.

    Raises:
        Exception: the record is unreadable (nothing was added to ``result``).
    """
    body = ReadDataStream(BytesIO(rec.body))
    if rec.opcode == Opcode.HEADER:
        result.header = Header.read(body)
    elif rec.opcode == Opcode.SCHEMA:
        schema = Schema.read(body)
        result.schemas[schema.id] = schema
    elif rec.opcode == Opcode.CHANNEL:
        channel = Channel.read(body)
        result.channels[channel.id] = channel
    else:
        _add_message(result, Message.read(body, len(rec.body)))


def _take_chunk(result: Scan, rec: _RecordAt) -> _LastChunk:
    """A chunk record: its schemas, channels and messages go into ``result``; returns its index entry.

    Raises:
        Exception: the chunk is unreadable (nothing was added to ``result``).
    """
    chunk = Chunk.read(ReadDataStream(BytesIO(rec.body)))
    records = _chunk_records(chunk)
    last = _LastChunk(
        ChunkIndex(
            message_start_time=chunk.message_start_time,
            message_end_time=chunk.message_end_time,
            chunk_start_offset=rec.start,
            chunk_length=rec.end - rec.start,
            message_index_offsets={},
            message_index_length=0,
            compression=chunk.compression,
            compressed_size=len(chunk.data),
            uncompressed_size=chunk.uncompressed_size,
        ),
        {},
    )
    for offset, record in records:
        if isinstance(record, Message):
            last.entries.setdefault(record.channel_id, []).append((record.log_time, offset))
            _add_message(result, record)
        elif isinstance(record, Schema):
            result.schemas[record.id] = record
        else:
            result.channels[record.id] = record
    return last


def _take_message_index(last: _LastChunk | None, rec: _RecordAt) -> None:
    """A message index record: noted in the index entry of the chunk it follows.

    Raises:
        Exception: the record is unreadable (nothing was noted).
    """
    index = MessageIndex.read(ReadDataStream(BytesIO(rec.body)))
    if last is not None:
        last.index.message_index_offsets[index.channel_id] = rec.start
        last.index.message_index_length = rec.end - (last.index.chunk_start_offset + last.index.chunk_length)


def _finish_last_chunk(result: Scan, last: _LastChunk) -> None:
    """Append the newest chunk's index entry; if some of its message indexes were cut, keep the file only up
    to the chunk's end and note its entries for :func:`repair` to write again."""
    if set(last.index.message_index_offsets) != set(last.entries):
        result.keep_end = last.index.chunk_start_offset + last.index.chunk_length
        last.index.message_index_offsets.clear()
        last.index.message_index_length = 0
        result.missing_index = last.entries
    result.chunk_indexes.append(last.index)


def _scan_data_section(f: BinaryIO, result: Scan) -> None:
    """Fill ``result`` from the records after the magic, up to the first record that is cut off, unreadable
    or not a data record."""
    result.keep_end = len(MAGIC)
    last: _LastChunk | None = None
    for rec in _complete_records(f, result.size):
        if rec.opcode not in _DATA_RECORDS:
            break
        try:
            if rec.opcode == Opcode.CHUNK:
                newest = _take_chunk(result, rec)
                if last is not None:
                    result.chunk_indexes.append(last.index)
                last = newest
            elif rec.opcode == Opcode.MESSAGE_INDEX:
                _take_message_index(last, rec)
            else:
                _take_loose_record(result, rec)
        except Exception:  # noqa: BLE001 - a corrupt record ends the intact part like a cut one
            break
        result.keep_end = rec.end
    if last is not None:
        _finish_last_chunk(result, last)


def scan(path: str | Path) -> Scan:
    """Read an MCAP file's data section up to its first incomplete or unreadable record.

    Raises:
        RecordingError: the file does not start like an MCAP file.
    """
    path = Path(path)
    with path.open("rb") as f:
        size = path.stat().st_size
        head = f.read(len(MAGIC))
        if head != MAGIC[: len(head)]:
            raise RecordingError(f"{path} is not an MCAP file")
        result = Scan(size=size, complete=_is_complete(f, size), keep_end=0)
        if len(head) == len(MAGIC):
            _scan_data_section(f, result)
    return result


class _Appender:
    """Records appended to a file at offset ``base``, built in memory (offsets as they will be in the file)."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.records = RecordBuilder()
        self.done = bytearray()  # what :meth:`take` took out of ``records``, in order

    @property
    def at(self) -> int:
        """The file offset of the next byte [bytes]."""
        return self.base + len(self.done) + self.records.count

    def take(self) -> bytes:
        """The bytes built since the previous call (kept in :attr:`done` too)."""
        data = self.records.end()
        self.done += data
        return data

    def since(self, offset: int) -> bytes:
        """Everything built from file offset ``offset`` on."""
        self.take()
        return bytes(self.done[offset - self.base:])

    def group(self, records: Sequence[Any]) -> tuple[int, int]:
        """Write ``records``; returns (start offset, length) [bytes] of the group."""
        start = self.at
        for record in records:
            record.write(self.records)
        return start, self.at - start


def _start_of_repair(result: Scan) -> _Appender:
    """Where the repaired part starts: after what is kept, or a new magic and header when those did not survive."""
    intact_magic = result.keep_end >= len(MAGIC)
    out = _Appender(result.keep_end if intact_magic else 0)
    if not intact_magic:
        out.records.write(MAGIC)
    if result.header is None:
        result.header = Header(profile="ros2", library="rynn_teleop recover")
        result.header.write(out.records)
    return out


def _write_missing_index(out: _Appender, result: Scan) -> None:
    """The message index records of the last chunk, when they were cut, noted in its chunk index entry."""
    if not result.missing_index:
        return
    last = result.chunk_indexes[-1]
    first = out.at
    for channel_id, entries in sorted(result.missing_index.items()):
        last.message_index_offsets[channel_id] = out.at
        MessageIndex(channel_id=channel_id, records=entries).write(out.records)
    last.message_index_length = out.at - first
    result.missing_index = {}


def _statistics(result: Scan) -> Statistics:
    """The summary's statistics record of the kept data (one metadata record: the ``rosbag2`` one)."""
    times = [t for ts in result.times.values() for t in ts]
    return Statistics(
        message_count=len(times),
        schema_count=len(result.schemas),
        channel_count=len(result.channels),
        attachment_count=0,
        metadata_count=1,
        chunk_count=len(result.chunk_indexes),
        message_start_time=min(times, default=0),
        message_end_time=max(times, default=0),
        channel_message_counts={k: len(v) for k, v in sorted(result.times.items())},
    )


def _write_summary(out: _Appender, result: Scan, metadata_index: MetadataIndex) -> None:
    """The summary section (schemas, channels, chunk indexes, metadata index, statistics, summary offsets),
    the footer with the summary's CRC (as the ``mcap`` writer sums it) and the closing magic."""
    summary_start = out.at
    groups = [
        (Opcode.SCHEMA, [result.schemas[k] for k in sorted(result.schemas)]),
        (Opcode.CHANNEL, [result.channels[k] for k in sorted(result.channels)]),
        (Opcode.CHUNK_INDEX, result.chunk_indexes),
        (Opcode.METADATA_INDEX, [metadata_index]),
        (Opcode.STATISTICS, [_statistics(result)]),
    ]
    offsets = []
    for opcode, records in groups:
        if records:
            start, length = out.group(records)
            offsets.append(SummaryOffset(group_opcode=opcode, group_start=start, group_length=length))
    summary_offset_start, _ = out.group(offsets)
    crc = zlib.crc32(out.since(summary_start))
    crc = zlib.crc32(struct.pack("<BQQQ", Opcode.FOOTER, 8 + 8 + 4, summary_start, summary_offset_start), crc)
    Footer(summary_start=summary_start, summary_offset_start=summary_offset_start, summary_crc=crc).write(out.records)
    out.records.write(MAGIC)


def repair(path: str | Path, result: Scan, metadata: dict[str, str] | None = None) -> None:
    """Make an MCAP file whole again after :func:`scan`: cut what is incomplete, append index and footer.

    Everything after ``result.keep_end`` is discarded (cut records, and a summary or
    metadata that would describe more than is kept); then come the message indexes of
    the last chunk if they were cut, a ``rosbag2`` metadata record holding
    ``metadata`` (as rosbag2 and rosbags write it), the data end record, the summary
    (schemas, channels, chunk indexes, metadata index, statistics, summary offsets), the footer and the
    closing magic. The data-end record carries the CRC of the data section and the footer that of the summary
    (the kept part of the file is read once for the former). Updates ``result`` (offsets, sizes) to the
    repaired file.

    Args:
        metadata: key/value strings of the ``rosbag2`` metadata record (e.g.
            ``{"serialized_metadata": <metadata.yaml contents>}``).
    """
    out = _start_of_repair(result)
    _write_missing_index(out, result)
    start, length = out.group([Metadata(name="rosbag2", metadata=dict(metadata or {}))])
    with Path(path).open("r+b") as f:
        crc = 0
        left = out.base
        while left > 0:
            block = f.read(min(left, 1 << 22))
            if not block:
                raise OSError(f"{path} is shorter than its kept part ({out.base} bytes)")
            crc = zlib.crc32(block, crc)
            left -= len(block)
        DataEnd(data_section_crc=zlib.crc32(out.since(out.base), crc)).write(out.records)
        _write_summary(out, result, MetadataIndex(offset=start, length=length, name="rosbag2"))
        f.seek(out.base)
        f.truncate(out.base)
        f.write(out.since(out.base))
        f.flush()
        result.size = f.tell()
    result.complete = True


@dataclass
class Index:
    """A complete MCAP file's channels and per-channel receive times, read from its index."""

    schemas: dict[int, Schema]
    channels: dict[int, Channel]
    times: dict[int, np.ndarray]  # channel id -> sorted message log times [ns]


def read_index(path: str | Path) -> Index:
    """Channels and message times of an MCAP file from its summary and message indexes.

    Chunks listed without message indexes are read in full instead.

    Raises:
        RecordingError: the file has no summary (its writer did not finish it).
    """
    path = Path(path)
    with path.open("rb") as f:
        try:
            summary = make_reader(f).get_summary()
        except Exception as exc:
            raise RecordingError(f"{path} has no readable index ({exc})") from exc
        if summary is None or (summary.statistics and summary.statistics.message_count and not summary.chunk_indexes):
            raise RecordingError(f"{path} has no index")
        try:
            times = _index_times(f, summary, path.stat().st_size)
        except Exception as exc:  # garbage offsets and lengths raise several types
            raise RecordingError(f"{path}: its index is damaged ({type(exc).__name__}: {exc}); run "
                                 f"`rynn-teleop episodes check` on the episode") from exc
    return Index(
        schemas=dict(summary.schemas),
        channels=dict(summary.channels),
        times={k: np.sort(np.asarray(v, dtype=np.int64)) for k, v in times.items()},
    )


def _index_times(f: BinaryIO, summary: Any, size: int) -> dict[int, list[int]]:
    """Channel id -> message log times [ns], from the message indexes (a chunk without them: its records).

    Raises:
        ValueError: an offset or length outside the file.
    """
    times: dict[int, list[int]] = {}
    for ci in summary.chunk_indexes:
        ends = [ci.chunk_start_offset + ci.chunk_length, min(ci.message_index_offsets.values(), default=0)
                + ci.message_index_length]
        if max(ends) > size or ci.chunk_start_offset < len(MAGIC):
            raise ValueError(f"a chunk index points past the end of the file ({max(ends)} > {size} bytes)")
        if ci.message_index_offsets:
            f.seek(min(ci.message_index_offsets.values()))
            stream = ReadDataStream(BytesIO(f.read(ci.message_index_length)))
            while stream.count < ci.message_index_length:
                op = stream.read1()
                length = stream.read8()
                if op != Opcode.MESSAGE_INDEX:
                    stream.read(length)
                    continue
                index = MessageIndex.read(stream)
                times.setdefault(index.channel_id, []).extend(t for t, _ in index.records)
        else:
            f.seek(ci.chunk_start_offset + _RECORD_PREFIX.size)
            chunk = Chunk.read(ReadDataStream(BytesIO(f.read(ci.chunk_length - _RECORD_PREFIX.size))))
            for _, rec in _chunk_records(chunk):
                if isinstance(rec, Message):
                    times.setdefault(rec.channel_id, []).append(rec.log_time)
    return times


def read_stamps(path: str | Path, topics: list[str]) -> dict[str, np.ndarray]:
    """Topic -> header stamps [ns] of its messages in log-time order (as :func:`read_index`'s times).

    Reads each message's first 12 bytes (the chunks are decompressed and their CRCs checked); only meaningful
    for topics whose types start with a std_msgs/Header.

    Raises:
        RecordingError: the file cannot be read to the end, or a chunk's CRC does not match.
    """
    pairs: dict[str, list[tuple[int, int]]] = {t: [] for t in topics}
    if not topics:
        return {}
    path = Path(path)
    try:
        with path.open("rb") as f:
            for _, channel, message in make_reader(f, validate_crcs=True).iter_messages(topics=list(topics)):
                pairs[channel.topic].append((message.log_time, header_stamp_ns(message.data)))
    except Exception as exc:
        raise RecordingError(f"cannot read the messages of {path}: {exc}") from exc
    out = {}
    for topic, p in pairs.items():
        a = np.asarray(p, dtype=np.int64).reshape(-1, 2)
        out[topic] = a[np.argsort(a[:, 0], kind="stable"), 1]
    return out
