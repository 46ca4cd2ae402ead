"""MCAP files at the record level: scan what is intact, repair a truncated file, read the index.

Only what the recorder needs, on top of the ``mcap`` package's record classes:

* :func:`scan` reads the data section record by record and stops at the first
  record that is cut off or unreadable (a writer killed mid-write), keeping
  every complete chunk;
* :func:`repair` truncates the file after the last complete chunk (and its
  message index records, regenerated when they were cut) and appends a fresh
  summary section and footer, so that indexed readers (rosbag2's MCAP plugin,
  rosbags, the ``mcap`` readers) open it;
* :func:`read_index` reads a complete file's channels and message receive
  times from its chunk and message indexes, without reading message payloads;
* :func:`read_stamps` reads the header stamps (first 12 bytes) of chosen
  topics' messages, for the integrity statistics.

:class:`Scan` also holds each message's would-be header stamp (see
:func:`rynn_teleop.recording.cdr.header_stamp_ns`; meaningless for types without
a header, which its users ignore).

Offsets are byte offsets in the file; times are MCAP ``log_time`` values [ns].
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import BinaryIO

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


def _is_complete(f: BinaryIO, size: int) -> bool:
    if size < len(MAGIC) * 2 + _FOOTER_SIZE:
        return False
    f.seek(size - len(MAGIC) - _FOOTER_SIZE)
    tail = f.read(_FOOTER_SIZE + len(MAGIC))
    op, length = _RECORD_PREFIX.unpack_from(tail)
    return op == Opcode.FOOTER and length == 20 and tail[-len(MAGIC):] == MAGIC


def _chunk_records(chunk: Chunk) -> list[tuple[int, Schema | Channel | Message]]:
    """The schema, channel and message records of a chunk with their offsets in its uncompressed records."""
    stream, length = get_chunk_data_stream(chunk)
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
        if len(head) < len(MAGIC):
            return result
        f.seek(len(MAGIC))
        pos = result.keep_end = len(MAGIC)
        last: ChunkIndex | None = None  # the newest chunk, whose message indexes may be cut
        last_entries: dict[int, list[tuple[int, int]]] = {}
        while pos + _RECORD_PREFIX.size <= size:
            op, length = _RECORD_PREFIX.unpack(f.read(_RECORD_PREFIX.size))
            end = pos + _RECORD_PREFIX.size + length
            if end > size:
                break
            body = ReadDataStream(BytesIO(f.read(length)))
            try:
                if op == Opcode.HEADER:
                    result.header = Header.read(body)
                elif op == Opcode.SCHEMA:
                    schema = Schema.read(body)
                    result.schemas[schema.id] = schema
                elif op == Opcode.CHANNEL:
                    channel = Channel.read(body)
                    result.channels[channel.id] = channel
                elif op == Opcode.MESSAGE:
                    msg = Message.read(body, length)
                    result.times.setdefault(msg.channel_id, []).append(msg.log_time)
                    result.stamps.setdefault(msg.channel_id, []).append(header_stamp_ns(msg.data))
                elif op == Opcode.CHUNK:
                    chunk = Chunk.read(body)
                    records = _chunk_records(chunk)
                elif op == Opcode.MESSAGE_INDEX:
                    index = MessageIndex.read(body)
                else:  # data end, summary, metadata, attachments: the data section we keep ends here
                    break
            except Exception:  # noqa: BLE001 - a corrupt record ends the intact part like a cut one
                break
            if op == Opcode.CHUNK:
                if last is not None:
                    result.chunk_indexes.append(last)
                last = ChunkIndex(
                    message_start_time=chunk.message_start_time,
                    message_end_time=chunk.message_end_time,
                    chunk_start_offset=pos,
                    chunk_length=end - pos,
                    message_index_offsets={},
                    message_index_length=0,
                    compression=chunk.compression,
                    compressed_size=len(chunk.data),
                    uncompressed_size=chunk.uncompressed_size,
                )
                last_entries = {}
                for offset, rec in records:
                    if isinstance(rec, Message):
                        last_entries.setdefault(rec.channel_id, []).append((rec.log_time, offset))
                        result.times.setdefault(rec.channel_id, []).append(rec.log_time)
                        result.stamps.setdefault(rec.channel_id, []).append(header_stamp_ns(rec.data))
                    elif isinstance(rec, Schema):
                        result.schemas[rec.id] = rec
                    else:
                        result.channels[rec.id] = rec
            elif op == Opcode.MESSAGE_INDEX and last is not None:
                last.message_index_offsets[index.channel_id] = pos
                last.message_index_length = end - (last.chunk_start_offset + last.chunk_length)
            pos = end
            result.keep_end = end
        if last is not None:
            if set(last.message_index_offsets) != set(last_entries):  # cut among its message indexes
                result.keep_end = last.chunk_start_offset + last.chunk_length
                last.message_index_offsets = {}
                last.message_index_length = 0
                result.missing_index = last_entries
            result.chunk_indexes.append(last)
    return result


def repair(path: str | Path, result: Scan, metadata: dict[str, str] | None = None) -> None:
    """Make an MCAP file whole again after :func:`scan`: cut what is incomplete, append index and footer.

    Everything after ``result.keep_end`` is discarded (cut records, and a summary or
    metadata that would describe more than is kept); then come the message indexes of
    the last chunk if they were cut, a ``rosbag2`` metadata record holding
    ``metadata`` (as rosbag2 and rosbags write it), the data end record, the summary
    (schemas, channels, chunk indexes, statistics, summary offsets), the footer and the
    closing magic. Updates ``result`` (offsets, sizes) to the repaired file.

    Args:
        metadata: key/value strings of the ``rosbag2`` metadata record (e.g.
            ``{"serialized_metadata": <metadata.yaml contents>}``).
    """
    path = Path(path)
    out = RecordBuilder()
    with path.open("r+b") as f:
        base = result.keep_end
        if base < len(MAGIC):  # not even the magic survived
            base = 0
            out.write(MAGIC)
        if result.header is None:
            result.header = Header(profile="ros2", library="rynn_teleop recover")
            result.header.write(out)

        def at() -> int:
            return base + out.count

        if result.missing_index:
            last = result.chunk_indexes[-1]
            first = at()
            for channel_id, entries in sorted(result.missing_index.items()):
                last.message_index_offsets[channel_id] = at()
                MessageIndex(channel_id=channel_id, records=entries).write(out)
            last.message_index_length = at() - first
            result.missing_index = {}
        metadata_start = at()
        Metadata(name="rosbag2", metadata=dict(metadata or {})).write(out)
        metadata_end = at()
        DataEnd(data_section_crc=0).write(out)

        summary_start = at()
        groups: list[tuple[int, int, int]] = []

        def group(opcode: int, records: list) -> None:
            start = at()
            for rec in records:
                rec.write(out)
            if records:
                groups.append((opcode, start, at() - start))

        group(Opcode.SCHEMA, [result.schemas[k] for k in sorted(result.schemas)])
        group(Opcode.CHANNEL, [result.channels[k] for k in sorted(result.channels)])
        group(Opcode.CHUNK_INDEX, result.chunk_indexes)
        group(Opcode.METADATA_INDEX, [MetadataIndex(offset=metadata_start, length=metadata_end - metadata_start, name="rosbag2")])
        times = [t for ts in result.times.values() for t in ts]
        group(
            Opcode.STATISTICS,
            [
                Statistics(
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
            ],
        )
        summary_offset_start = at()
        for opcode, start, length in groups:
            SummaryOffset(group_opcode=opcode, group_start=start, group_length=length).write(out)
        Footer(summary_start=summary_start, summary_offset_start=summary_offset_start, summary_crc=0).write(out)
        out.write(MAGIC)
        f.seek(base)
        f.truncate(base)
        f.write(out.end())
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
        times: dict[int, list[int]] = {}
        for ci in summary.chunk_indexes:
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
    return Index(
        schemas=dict(summary.schemas),
        channels=dict(summary.channels),
        times={k: np.sort(np.asarray(v, dtype=np.int64)) for k, v in times.items()},
    )


def read_stamps(path: str | Path, topics: list[str]) -> dict[str, np.ndarray]:
    """Topic -> header stamps [ns] of its messages in log-time order (as :func:`read_index`'s times).

    Reads each message's first 12 bytes (the chunks are decompressed); only meaningful
    for topics whose types start with a std_msgs/Header.

    Raises:
        RecordingError: the file cannot be read to the end.
    """
    pairs: dict[str, list[tuple[int, int]]] = {t: [] for t in topics}
    if not topics:
        return {}
    path = Path(path)
    try:
        with path.open("rb") as f:
            for _, channel, message in make_reader(f).iter_messages(topics=list(topics)):
                pairs[channel.topic].append((message.log_time, header_stamp_ns(message.data)))
    except Exception as exc:
        raise RecordingError(f"cannot read the messages of {path}: {exc}") from exc
    out = {}
    for topic, p in pairs.items():
        a = np.asarray(p, dtype=np.int64).reshape(-1, 2)
        out[topic] = a[np.argsort(a[:, 0], kind="stable"), 1]
    return out
