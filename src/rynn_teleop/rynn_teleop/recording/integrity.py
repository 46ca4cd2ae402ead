"""Whether an episode's MCAP file is intact, and which of its messages are (ROS-free).

:func:`verify_mcap` reads a file once, record by record, and proves what it can:

* **CRCs** (the ``mcap`` package's own checks): each chunk's CRC over its records
  (:func:`mcap.stream_reader.breakup_chunk` with ``validate_crc``); the data-section CRC of the ``DataEnd``
  record, summed by the package's :class:`~mcap.data_stream.ReadDataStream` while the file is read; the
  summary CRC of the footer (over the summary and the footer's offsets, as the package's writer sums it: the
  package's readers do not check it, so it is checked here). A CRC of 0 means "not written" (files recorded
  with ``crcs`` off, or before CRCs were on): those parts are proven by decoding alone.
* **Structure**: every record of the data section fills its length exactly; a record that does not, or whose
  opcode does not belong there, is unreadable. Reading continues at the next chunk, found through the
  summary's chunk index when the summary is intact, else by searching for a record that is a well-formed chunk.
* **Decoding**: each message of a chunk decodes with its channel's schema (rosbags typestore; types it does
  not know are registered from the schema text) - always for a chunk without CRC, for every chunk with
  ``decode=True`` (what ``episodes check`` does).
* **Stamps**: per topic, receive (log) times never go backwards in file order (the recorder writes them so),
  lie in the episode's window (``window``, with :data:`WINDOW_MARGIN_S`), and header stamps stay within
  :data:`PLAUSIBLE_STAMP_OFFSET_S` of the topic's usual stamp-to-receive offset (a replay or simulated clock
  shifts all of them alike; garbage read as a stamp does not). In a chunk proven by its CRC a finding is a
  recording problem (:attr:`IntegrityReport.problems`); in a chunk without CRC it is evidence of damage and
  the chunk counts as lost.

A chunk is intact or lost as a whole. :class:`IntegrityReport` lists the intact blocks (what
:func:`intact_messages` reads back, e.g. to salvage them into a new episode) and the damaged byte ranges
(:class:`Damage`) with the topics, message counts and receive-time ranges lost, from the damaged chunk's own
message indexes, the summary's chunk index, or the intact messages around it. A file that ends inside its data
section is *cut*: damage in a closed episode, the normal state of an unclosed one (``closed=False``: a recorder
killed mid-episode, which ``episodes recover`` repairs in place).

Offsets are byte offsets in the file; times are MCAP ``log_time`` values (receive times) [ns].
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from mcap.data_stream import ReadDataStream
from mcap.opcode import Opcode
from mcap.reader import make_reader
from mcap.records import (
    Attachment,
    Channel,
    Chunk,
    DataEnd,
    Header,
    Message,
    MessageIndex,
    Metadata,
    Schema,
)
from mcap.stream_reader import CRCValidationError, breakup_chunk
from mcap.summary import Summary

from .cdr import has_header, header_stamp_ns
from .errors import EpisodeDataError, RecordingError

MAGIC = b"\x89MCAP0\r\n"
PLAUSIBLE_STAMP_OFFSET_S = 3600.0
"""[s] a header stamp further than this from its topic's median (stamp - receive time) is implausible."""
WINDOW_MARGIN_S = 1.0
"""[s] receive times may lie this far outside the episode's [start, stop] (latched messages, clock rounding)."""
SEARCH_BLOCK = 4 * 2**20
"""[bytes] read at a time when searching past unreadable bytes for the next chunk."""

_PREFIX = struct.Struct("<BQ")  # opcode, content length
_FOOTER = struct.Struct("<BQQQI")  # opcode, length, summary start, summary offset start, summary crc
_CHUNK_HEAD = struct.Struct("<QQQII")  # start time, end time, uncompressed size, crc, compression length
_COMPRESSIONS = ("", "zstd", "lz4")
_DATA_SECTION = frozenset({Opcode.HEADER, Opcode.SCHEMA, Opcode.CHANNEL, Opcode.MESSAGE, Opcode.CHUNK,
                           Opcode.MESSAGE_INDEX, Opcode.ATTACHMENT, Opcode.METADATA, Opcode.DATA_END})


class Damage(NamedTuple):
    """One damaged byte range of a file and what was lost with it."""

    start: int  # first damaged byte [bytes]
    end: int  # one past the last [bytes]
    reason: str  # e.g. "chunk CRC mismatch", "unreadable record", "cut off", "summary CRC mismatch"
    topics: tuple[str, ...] = ()  # topics whose messages were there (empty: none, or unknown)
    messages: int | None = 0  # messages lost there (None: unknown)
    first_ns: int | None = None  # receive-time range lost [ns] (None: unknown)
    last_ns: int | None = None
    cut: bool = False  # the file ends here, inside its data section (a killed recorder, or a truncated copy)


class Block(NamedTuple):
    """An intact chunk (or loose message record) of the data section."""

    start: int  # offset of the record [bytes]
    end: int  # offset after it [bytes]
    messages: int
    crc: bool  # proven by its CRC (False: by decoding only)


class TopicMessages(NamedTuple):
    """A topic's intact messages, in file order (what the integrity statistics need)."""

    type_name: str  # ROS type name ("a, b" if the topic changed type)
    times_ns: np.ndarray  # (n,) int64 receive times [ns]
    stamps_ns: np.ndarray  # (n,) int64 would-be header stamps [ns] (meaningless for a type without a header)


@dataclass
class IntegrityReport:
    """What :func:`verify_mcap` found (see the module description)."""

    path: Path
    size: int  # [bytes]
    closed: bool  # verified as a closed file: a cut is damage
    complete: bool = False  # ends with a readable footer and the closing magic
    header: Header | None = None
    schemas: dict[int, Schema] = field(default_factory=dict)
    channels: dict[int, Channel] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)  # intact, in file order
    damage: list[Damage] = field(default_factory=list)  # in file order
    problems: list[str] = field(default_factory=list)  # recording problems in data proven intact (stamps)
    notes: list[str] = field(default_factory=list)  # what could not be proven (no CRCs, types not decoded)
    crc_chunks: int = 0  # intact chunks proven by their CRC
    plain_chunks: int = 0  # intact chunks without CRC (proven by decoding)
    decoded: int = 0  # messages decoded with their schema
    intact_counts: dict[str, int] = field(default_factory=dict)  # topic -> intact messages
    lost_counts: dict[str, int] = field(default_factory=dict)  # topic -> messages the file or metadata lists, lost
    first_ns: int | None = None  # receive time of the first and last intact message [ns]
    last_ns: int | None = None
    topics: dict[str, TopicMessages] = field(default_factory=dict)  # the intact messages' times, by topic
    data_crc: str = "absent"  # "ok", "mismatch", "absent" (0 or no DataEnd), "unchecked" (read with a gap)

    @property
    def messages(self) -> int:
        """Intact messages."""
        return sum(b.messages for b in self.blocks)

    @property
    def cut(self) -> bool:
        """The file ends inside its data section."""
        return any(d.cut for d in self.damage)

    @property
    def damaged(self) -> bool:
        """Some part of the file is damaged (a cut counts only in a closed file)."""
        return any(self.closed or not d.cut for d in self.damage)

    @property
    def ok(self) -> bool:
        """Nothing damaged and no recording problem found."""
        return not self.damaged and not self.problems

    def reason(self) -> str:
        """One line: why the file is damaged (empty when it is not)."""
        found = [d for d in self.damage if self.closed or not d.cut]
        if not found:
            return ""
        lost = sum(self.lost_counts.values())
        what = f"{lost} message(s) lost" if lost else ("no message lost" if all(d.messages == 0 for d in found)
                                                       else "messages lost")
        topics = sorted(self.lost_counts) or sorted({t for d in found for t in d.topics})
        where = f" on {', '.join(topics)}" if topics and lost else ""
        return f"damaged: {found[0].reason} at byte {found[0].start}" + \
            (f" and {len(found) - 1} more" if len(found) > 1 else "") + f" ({what}{where})"

    def lines(self, t0_ns: int | None = None) -> list[str]:
        """The damage in detail, one line per damaged range and per topic that lost messages.

        Args:
            t0_ns: times are shown relative to this [ns] (default: the first intact message).
        """
        t0 = t0_ns if t0_ns is not None else (self.first_ns or 0)
        out = []
        for d in self.damage:
            if d.cut and not self.closed:
                continue
            span = ""
            if d.first_ns is not None and d.last_ns is not None:
                span = f" from +{(d.first_ns - t0) * 1e-9:.3f} s to +{(d.last_ns - t0) * 1e-9:.3f} s"
            elif d.first_ns is not None:
                span = f" from +{(d.first_ns - t0) * 1e-9:.3f} s to the end"
            if d.messages == 0 and not d.topics:
                lost = "no message lost"
            else:
                count = "messages" if d.messages is None else f"{d.messages} message(s)"
                on = f" of {', '.join(d.topics)}" if d.topics else " (topics unknown)"
                lost = f"lost {count}{on}{span}"
            out.append(f"bytes {d.start}..{d.end} ({d.reason}): {lost}")
        for topic in sorted(self.lost_counts):
            total = self.lost_counts[topic] + self.intact_counts.get(topic, 0)
            out.append(f"{topic}: {self.lost_counts[topic]} of {total} message(s) lost")
        return out


# -- reading records --------------------------------------------------------------------------


class _Exact(io.BytesIO):
    """A record's content: reading past its end is an error (a short read would hide damage)."""

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return super().read()
        data = super().read(size)
        if len(data) != size:
            raise ValueError(f"a field of {size} bytes runs past the record's end")
        return data


def _parse(opcode: int, body: bytes) -> Any:
    """The record ``opcode`` from its content, which it must fill exactly.

    Raises:
        Exception: the content is not such a record (any exception of the parser).
    """
    stream = ReadDataStream(_Exact(body))
    if opcode == Opcode.MESSAGE:
        if len(body) < 22:
            raise ValueError("a message record shorter than its fixed fields")
        record: Any = Message.read(stream, len(body))
    elif opcode == Opcode.HEADER:
        record = Header.read(stream)
    elif opcode == Opcode.SCHEMA:
        record = Schema.read(stream)
    elif opcode == Opcode.CHANNEL:
        record = Channel.read(stream)
    elif opcode == Opcode.CHUNK:
        record = Chunk.read(stream)
        if record.compression not in _COMPRESSIONS:
            raise ValueError(f"unknown chunk compression {record.compression!r}")
    elif opcode == Opcode.MESSAGE_INDEX:
        record = MessageIndex.read(stream)
    elif opcode == Opcode.METADATA:
        record = Metadata.read(stream)
    elif opcode == Opcode.ATTACHMENT:
        record = Attachment.read(stream)
    elif opcode == Opcode.DATA_END:
        record = DataEnd.read(stream)
    else:
        raise ValueError(f"opcode {opcode:#x} does not belong in the data section")
    if stream.count != len(body):
        raise ValueError(f"the record's fields fill {stream.count} of its {len(body)} bytes")
    return record


def _chunk_end(buf: bytes, i: int, offset: int, limit: int) -> int | None:
    """Where a well-formed chunk record starting at ``buf[i]`` (file offset ``offset``) ends, else None."""
    if i + _PREFIX.size + _CHUNK_HEAD.size > len(buf):
        return None
    op, length = _PREFIX.unpack_from(buf, i)
    end = offset + _PREFIX.size + length
    if op != Opcode.CHUNK or end > limit:
        return None
    start_ns, end_ns, usize, _, clen = _CHUNK_HEAD.unpack_from(buf, i + _PREFIX.size)
    at = i + _PREFIX.size + _CHUNK_HEAD.size
    if clen > 8 or at + clen + 8 > len(buf) or start_ns > end_ns:
        return None
    try:
        compression = bytes(buf[at:at + clen]).decode("ascii")
    except UnicodeDecodeError:
        return None
    (dlen,) = struct.unpack_from("<Q", buf, at + clen)
    if compression not in _COMPRESSIONS or _CHUNK_HEAD.size + clen + 8 + dlen != length:
        return None
    if compression == "" and usize != dlen:
        return None
    return end


def _next_chunk(f: Any, after: int, limit: int, known: list[int]) -> int | None:
    """The offset of the next chunk record after ``after``: from the summary's chunk index (``known``,
    sorted) when there is one, else the first well-formed chunk record found in the file."""
    if known:
        return next((o for o in known if o > after), None)
    pos = after + 1
    overlap = _PREFIX.size + _CHUNK_HEAD.size + 16
    while pos < limit:
        f.seek(pos)
        buf = f.read(min(SEARCH_BLOCK + overlap, limit - pos))
        i = buf.find(b"\x06")
        while 0 <= i < min(len(buf), SEARCH_BLOCK):
            if _chunk_end(buf, i, pos + i, limit) is not None:
                return pos + i
            i = buf.find(b"\x06", i + 1)
        pos += SEARCH_BLOCK
    return None


# -- decoding and stamps ----------------------------------------------------------------------


class _Decoder:
    """Decodes CDR messages with their schema (rosbags), registering unknown types from the schema text."""

    def __init__(self, typestore: Any) -> None:
        self.typestore = typestore
        self._private = False
        self.failed_types: dict[str, str] = {}  # type name -> why it cannot be decoded

    def can_decode(self, schema: Schema | None) -> bool:
        if schema is None or not schema.name:
            return False
        name = schema.name
        if name in self.failed_types:
            return False
        if name in self.typestore.fielddefs:
            return True
        try:
            from rosbags.typesys import Stores, get_typestore
            from rosbags.typesys.msg import get_types_from_msg

            if not self._private:  # never register into the shared, cached typestore
                self.typestore, self._private = get_typestore(Stores.ROS2_KILTED), True
            self.typestore.register(get_types_from_msg(schema.data.decode(), name))
        except Exception as exc:  # noqa: BLE001 - a definition rosbags cannot parse: that type is not decoded
            self.failed_types[name] = f"{type(exc).__name__}: {exc}"
            return False
        return name in self.typestore.fielddefs

    def decode(self, data: bytes, type_name: str) -> None:
        """Raises Exception (rosbags' SerdeError and others): the bytes are not a ``type_name``."""
        self.typestore.deserialize_cdr(data, type_name)


# -- the walk ---------------------------------------------------------------------------------


@dataclass
class _Candidate:
    """A chunk or loose message record read by the walk, before the stamp checks: its messages' channel ids,
    receive times [ns] and would-be header stamps [ns] (payloads are not kept)."""

    start: int
    end: int
    crc: bool
    channels: list[int]
    logs: list[int]
    stamps: list[int]

    @classmethod
    def of(cls, start: int, end: int, crc: bool, messages: list[Message]) -> _Candidate:
        return cls(start, end, crc, [m.channel_id for m in messages], [m.log_time for m in messages],
                   [header_stamp_ns(m.data) for m in messages])


class _Walk:
    """One pass over a file's data section (see :func:`verify_mcap`)."""

    def __init__(self, f: Any, report: IntegrityReport, summary: Summary | None, decode: bool | None,
                 typestore: Any) -> None:
        self.f = f
        self.report = report
        self.summary = summary
        self.decode = decode
        self.decoder = _Decoder(typestore)
        self.candidates: list[_Candidate] = []
        self.bad: list[Damage] = []  # damaged ranges (their lost content filled in later)
        self.index_after: dict[int, list[MessageIndex]] = {}  # chunk start -> message indexes after it
        self.known_chunks = sorted(ci.chunk_start_offset for ci in summary.chunk_indexes) if summary else []
        self.data_end: int | None = None

    def run(self, limit: int) -> None:
        """Read the records from after the magic up to ``limit`` (the summary's start, or the file's end)."""
        f, report = self.f, self.report
        f.seek(0)
        stream: ReadDataStream | None = ReadDataStream(f, calculate_crc=True)
        stream.read(len(MAGIC))  # the data-section CRC covers the leading magic too
        pos = len(MAGIC)
        last_chunk: int | None = None
        while pos < limit:
            crc_before = stream.checksum() if stream is not None else None
            if pos + _PREFIX.size > limit:
                self.bad.append(Damage(pos, limit, "cut off inside a record", cut=not report.complete))
                return
            head = stream.read(_PREFIX.size) if stream is not None else f.read(_PREFIX.size)
            op, length = _PREFIX.unpack(head)
            end = pos + _PREFIX.size + length
            if op in _DATA_SECTION and end > limit and not report.complete:
                self.bad.append(Damage(pos, report.size, "cut off inside a record", cut=True))
                return
            record = None
            why = "unreadable record"
            if op in _DATA_SECTION and end <= limit:
                body = stream.read(length) if stream is not None else f.read(length)
                try:
                    record = _parse(op, body)
                except Exception as exc:  # noqa: BLE001 - whatever the parser raises, the record is unreadable
                    why = f"unreadable record ({type(exc).__name__}: {exc})".replace("\n", " ")[:160]
            elif op not in _DATA_SECTION:
                why = f"unreadable record (opcode {op:#x})"
            else:
                why = f"unreadable record (length {length} runs past the data section)"
            if record is None:
                nxt = _next_chunk(f, pos, limit, self.known_chunks)
                self.bad.append(Damage(pos, limit if nxt is None else nxt, why))
                if nxt is None:
                    return
                pos, stream, last_chunk = nxt, None, None  # read on without the data-section CRC
                report.data_crc = "unchecked"
                f.seek(pos)
                continue
            if isinstance(record, Header):
                report.header = record
            elif isinstance(record, Schema):
                report.schemas.setdefault(record.id, record)
            elif isinstance(record, Channel):
                report.channels.setdefault(record.id, record)
            elif isinstance(record, Message):
                self._loose(pos, end, record)
            elif isinstance(record, Chunk):
                self._chunk(pos, end, record)
                last_chunk = pos
            elif isinstance(record, MessageIndex) and last_chunk is not None:
                self.index_after.setdefault(last_chunk, []).append(record)
            elif isinstance(record, DataEnd):
                self.data_end = end
                if stream is not None and record.data_section_crc:
                    report.data_crc = "ok" if record.data_section_crc == crc_before else "mismatch"
                    if report.data_crc == "mismatch" and not self.bad:  # else: explained by the damage found
                        self.bad.append(Damage(len(MAGIC), pos, "data-section CRC mismatch (outside the chunks' "
                                               "records: header, chunk times, indexes or metadata)"))
                return
            pos = end
        if not report.complete:
            self.bad.append(Damage(pos, report.size, "the file ends before its data-end record", cut=True))

    def _loose(self, start: int, end: int, message: Message) -> None:
        if message.channel_id not in self.report.channels or not self._decodes([message], crc=False):
            self.bad.append(Damage(start, end, "message record that does not decode"))
            return
        self.candidates.append(_Candidate.of(start, end, False, [message]))

    def _chunk(self, start: int, end: int, chunk: Chunk) -> None:
        try:
            records = breakup_chunk(chunk, validate_crc=True)
        except CRCValidationError:
            self.bad.append(Damage(start, end, "chunk CRC mismatch"))
            return
        except Exception as exc:  # noqa: BLE001 - any parse failure of the chunk's records loses the chunk
            self.bad.append(Damage(start, end, f"unreadable chunk ({type(exc).__name__})"))
            return
        crc = chunk.uncompressed_crc != 0
        messages = []
        for r in records:
            if isinstance(r, Schema):
                self.report.schemas.setdefault(r.id, r)
            elif isinstance(r, Channel):
                self.report.channels.setdefault(r.id, r)
            elif isinstance(r, Message):
                messages.append(r)
        unknown = sorted({m.channel_id for m in messages} - set(self.report.channels))
        if unknown:
            self.bad.append(Damage(start, end, f"messages of channel(s) {unknown} that no intact record defines"))
            return
        if not self._decodes(messages, crc=crc):
            self.bad.append(Damage(start, end, "a message does not decode with its schema"
                                   + ("" if crc else " (chunk without CRC)")))
            return
        self.candidates.append(_Candidate.of(start, end, crc, messages))

    def _decodes(self, messages: list[Message], *, crc: bool) -> bool:
        """Every message decodes with its schema (checked per :attr:`decode`)."""
        if self.decode is False or (self.decode is None and crc):
            return True
        for m in messages:
            channel = self.report.channels[m.channel_id]
            schema = self.report.schemas.get(channel.schema_id)
            if channel.message_encoding != "cdr" or not self.decoder.can_decode(schema):
                continue
            try:
                self.decoder.decode(m.data, schema.name)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - rosbags raises SerdeError and others for bytes that are not the type
                return False
            self.report.decoded += 1
        return True


# -- after the walk ---------------------------------------------------------------------------


def _stamp_findings(walk: _Walk, window: tuple[int, int] | None, typestore: Any) -> set[int]:
    """Check receive times and header stamps per channel; note problems in CRC-proven chunks; return the
    candidates (indices) without CRC whose stamps show damage."""
    report = walk.report
    by_channel: dict[int, tuple[list[int], list[int], list[int]]] = {}  # id -> receive times, stamps, candidates
    for k, c in enumerate(walk.candidates):
        for cid, log, stamp in zip(c.channels, c.logs, c.stamps):
            track = by_channel.setdefault(cid, ([], [], []))
            track[0].append(log)
            track[1].append(stamp)
            track[2].append(k)
    suspect: set[int] = set()
    margin = int(WINDOW_MARGIN_S * 1e9)
    for cid, (logs, stamps, owners) in sorted(by_channel.items()):
        channel = report.channels[cid]
        schema = report.schemas.get(channel.schema_id)
        log = np.asarray(logs, np.int64)
        owner = np.asarray(owners, np.int64)
        checks = [("receive times that go backwards", np.concatenate([[False], np.diff(log) < 0]))]
        if window is not None:
            outside = (log < window[0] - margin) | (log > window[1] + margin)
            checks.append(("receive times outside the episode", outside))
        if schema is not None and has_header(typestore, schema.name):
            stamp = np.asarray(stamps, np.int64)
            offset = stamp - log
            valid = stamp != 0
            if valid.any():
                median = int(np.median(offset[valid]))
                checks.append(("implausible header stamps",
                               valid & (np.abs(offset - median) > int(PLAUSIBLE_STAMP_OFFSET_S * 1e9))))
        proven = np.asarray([walk.candidates[k].crc for k in owners], bool)
        for what, bad in checks:
            if not bad.any():
                continue
            suspect.update(int(k) for k in owner[bad & ~proven])
            n = int(np.count_nonzero(bad & proven))
            if n:
                first = int(log[bad & proven][0])
                start = window[0] if window is not None else int(log[0])
                report.problems.append(f"{channel.topic}: {n} message(s) with {what} (first at receive time "
                                       f"+{(first - start) * 1e-9:.3f} s)")
    return suspect


def _indexes_at(f: Any, offsets: Mapping[int, int], length: int) -> list[MessageIndex]:
    """The message index records at ``offsets`` (a chunk index's), or none if they do not read back."""
    if not offsets or length <= 0:
        return []
    try:
        f.seek(min(offsets.values()))
        stream = ReadDataStream(_Exact(f.read(length)))
        out = []
        while stream.count < length:
            op, size = stream.read1(), stream.read8()
            body = stream.read(size)
            if op == Opcode.MESSAGE_INDEX:
                out.append(_parse(op, body))
        return out
    except Exception:  # noqa: BLE001 - damaged indexes: the chunk index's coarser view is used instead
        return []


def _lost_content(walk: _Walk, damage: Damage) -> Damage:
    """``damage`` with the topics, messages and times lost there, as far as they can be known."""
    report, summary = walk.report, walk.summary
    if damage.reason.startswith(("summary", "unreadable summary", "data-section CRC")):
        return damage
    topic = {cid: ch.topic for cid, ch in report.channels.items()}
    indexes = [i for s, found in walk.index_after.items() if damage.start <= s < damage.end for i in found]
    inside = [ci for ci in summary.chunk_indexes if damage.start <= ci.chunk_start_offset < damage.end] \
        if summary is not None else []
    if not indexes:
        for ci in inside:
            indexes += _indexes_at(walk.f, ci.message_index_offsets, ci.message_index_length)
    if indexes:
        times = [t for i in indexes for t, _ in i.records]
        if times:
            return damage._replace(topics=tuple(sorted({topic.get(i.channel_id, f"channel {i.channel_id}")
                                                        for i in indexes if i.records})),
                                   messages=len(times), first_ns=min(times), last_ns=max(times))
    if inside:
        topics = {topic.get(c, f"channel {c}") for ci in inside for c in ci.message_index_offsets}
        return damage._replace(topics=tuple(sorted(topics)), messages=None,
                               first_ns=min(ci.message_start_time for ci in inside),
                               last_ns=max(ci.message_end_time for ci in inside))
    if summary is not None and not damage.cut:
        return damage._replace(messages=0)  # the summary lists every chunk: none was there
    before = [t for c in walk.candidates if c.end <= damage.start for t in c.logs]
    after = [t for c in walk.candidates if c.start >= damage.end for t in c.logs]
    return damage._replace(messages=None, first_ns=max(before, default=None), last_ns=min(after, default=None))


def _read_summary(f: Any, report: IntegrityReport) -> tuple[Summary | None, int]:
    """The summary if the footer and the summary CRC allow, and where the data section must end."""
    size = report.size
    tail = len(MAGIC) + _FOOTER.size
    if size < len(MAGIC) + tail:
        return None, size
    f.seek(size - tail)
    raw = f.read(tail)
    op, length, summary_start, offset_start, summary_crc = _FOOTER.unpack_from(raw)
    if raw[-len(MAGIC):] != MAGIC or op != Opcode.FOOTER or length != 20:
        return None, size
    footer_at = size - tail
    if not (summary_start == 0 or len(MAGIC) < summary_start <= footer_at) or \
            not (offset_start == 0 or summary_start <= offset_start <= footer_at):
        return None, size  # not a footer after all: the walk reports what it finds
    report.complete = True
    if summary_start == 0:
        return None, footer_at
    if summary_crc:
        f.seek(summary_start)
        crc = 0
        left = footer_at + 1 + 8 + 8 + 8 - summary_start
        while left > 0:
            block = f.read(min(left, SEARCH_BLOCK))
            crc = zlib.crc32(block, crc)
            left -= len(block)
        if crc != summary_crc:
            report.damage.append(Damage(summary_start, size, "summary CRC mismatch (the index)"))
            return None, summary_start
    try:
        f.seek(0)
        summary = make_reader(f).get_summary()
    except Exception as exc:  # noqa: BLE001 - mcap raises several types for a damaged summary
        report.damage.append(Damage(summary_start, size, f"unreadable summary ({type(exc).__name__})"))
        return None, summary_start
    bad = [ci for ci in summary.chunk_indexes if not len(MAGIC) <= ci.chunk_start_offset < summary_start] \
        if summary is not None else []
    if bad:
        report.damage.append(Damage(summary_start, size, "summary lists chunks outside the data section"))
        return None, summary_start
    return summary, summary_start


def verify_mcap(path: str | Path, *, closed: bool = True, decode: bool | None = None,
                window: tuple[int, int] | None = None, expected_counts: Mapping[str, int] | None = None,
                typestore: Any = None) -> IntegrityReport:
    """Read an MCAP file once and report what is intact and what is damaged (see the module description).

    Args:
        path: the MCAP file.
        closed: the file was closed by its writer (its episode is complete): a cut counts as damage.
        decode: decode every message with its schema (True), none (False), or only those of chunks without
            a CRC (None, default: what the CRCs do not prove).
        window: the episode's (start, stop) receive times [ns]: receive times outside it are implausible.
        expected_counts: topic -> messages recorded (``metadata.yaml``), for the losses of a file whose
            summary is lost (default: the summary's statistics when it is intact).
        typestore: rosbags typestore to decode with (default: ROS 2 Kilted's).

    Raises:
        RecordingError: the file cannot be opened for lack of permission; ``EpisodeDataError``: it does not
            start like an MCAP file, or cannot be read back (an I/O error).
    """
    from .writer import default_typestore

    path = Path(path)
    typestore = typestore if typestore is not None else default_typestore()
    try:
        return _verify(path, closed, decode, window, expected_counts, typestore)
    except PermissionError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except OSError as exc:  # EIO and the like: the file (or the disk under it) cannot be read back
        raise EpisodeDataError(f"cannot read {path}: {exc.strerror or exc} (the file or the disk under it is "
                               "failing)", episode=path) from exc


def _verify(path: Path, closed: bool, decode: bool | None, window: tuple[int, int] | None,
            expected_counts: Mapping[str, int] | None, typestore: Any) -> IntegrityReport:
    """:func:`verify_mcap` (which maps the OSErrors raised here)."""
    with path.open("rb") as f:
        size = path.stat().st_size
        head = f.read(len(MAGIC))
        if head != MAGIC[:len(head)] or (len(head) < len(MAGIC) and closed):
            raise EpisodeDataError(f"{path} is not an MCAP file" + (" (it is empty)" if not head else ""),
                                   episode=path)
        report = IntegrityReport(path=path, size=size, closed=closed)
        if len(head) < len(MAGIC):
            report.damage.append(Damage(0, size, "cut off inside the leading magic", cut=True))
            return report
        summary, limit = _read_summary(f, report)
        if summary is not None:
            report.schemas.update(summary.schemas)
            report.channels.update(summary.channels)
        walk = _Walk(f, report, summary, decode, typestore)
        walk.run(limit)
        if walk.data_end is None and report.complete and not any(d.cut for d in walk.bad):
            walk.bad.append(Damage(limit, limit, "no data-end record before the summary"))
        if walk.data_end is not None and not report.complete:
            # cut while the summary was written (an unclosed file), or a closed file's summary or footer damaged
            report.damage.append(Damage(walk.data_end, size, "summary or footer missing or unreadable", cut=True))
        suspect = _stamp_findings(walk, window, typestore)
        for k in sorted(suspect):
            c = walk.candidates[k]
            walk.bad.append(Damage(c.start, c.end, "implausible stamps in a chunk without CRC"))
        good = [c for k, c in enumerate(walk.candidates) if k not in suspect]
        walk.candidates = good
        report.damage = sorted([_lost_content(walk, d) for d in walk.bad] + report.damage, key=lambda d: d.start)
    intact: dict[str, int] = {}
    times: list[int] = []
    by_topic: dict[str, tuple[list[str], list[int], list[int]]] = {}
    for c in good:
        report.blocks.append(Block(c.start, c.end, len(c.channels), c.crc))
        for cid, log, stamp in zip(c.channels, c.logs, c.stamps):
            channel = report.channels[cid]
            t = channel.topic
            intact[t] = intact.get(t, 0) + 1
            types, logs, stamps = by_topic.setdefault(t, ([], [], []))
            schema = report.schemas.get(channel.schema_id)
            name = schema.name if schema is not None else ""
            if name not in types:
                types.append(name)
            logs.append(log)
            stamps.append(stamp)
        times += c.logs
    report.topics = {t: TopicMessages(", ".join(types), np.asarray(logs, np.int64), np.asarray(stamps, np.int64))
                     for t, (types, logs, stamps) in sorted(by_topic.items())}
    report.crc_chunks = sum(1 for c in good if c.crc)
    report.plain_chunks = len(good) - report.crc_chunks
    report.intact_counts = dict(sorted(intact.items()))
    report.first_ns, report.last_ns = (min(times), max(times)) if times else (None, None)
    expected: dict[str, int] = {}
    if summary is not None and summary.statistics is not None:
        for cid, n in summary.statistics.channel_message_counts.items():
            t = report.channels[cid].topic if cid in report.channels else f"channel {cid}"
            expected[t] = expected.get(t, 0) + int(n)
    elif expected_counts:
        expected = {t: int(n) for t, n in expected_counts.items()}
    report.lost_counts = {t: n - intact.get(t, 0) for t, n in sorted(expected.items()) if n > intact.get(t, 0)}
    unknown = [k for k, d in enumerate(report.damage) if d.messages is None]
    if len(unknown) == 1 and report.lost_counts:  # the one range whose content is unknown lost the rest
        k = unknown[0]
        rest = sum(report.lost_counts.values()) - sum(d.messages or 0 for d in report.damage)
        if rest > 0:
            d = report.damage[k]
            report.damage[k] = d._replace(messages=rest, topics=d.topics or tuple(report.lost_counts))
    if report.plain_chunks:
        report.notes.append(f"{report.plain_chunks} chunk(s) carry no CRC (recorded with CRCs off): proven by "
                            "decoding their messages only")
    for name, why in walk.decoder.failed_types.items():
        report.notes.append(f"type {name} not decoded: its definition cannot be parsed ({why})")
    return report


def intact_messages(report: IntegrityReport) -> Iterator[Message]:
    """The messages of the intact blocks of ``report``'s file, in file order (read again, CRCs checked again).

    Raises:
        RecordingError: the file changed since it was verified (a block no longer reads back).
    """
    with report.path.open("rb") as f:
        for block in report.blocks:
            f.seek(block.start)
            op, length = _PREFIX.unpack(f.read(_PREFIX.size))
            try:
                record = _parse(op, f.read(length))
                if isinstance(record, Chunk):
                    yield from (r for r in breakup_chunk(record, validate_crc=True) if isinstance(r, Message))
                else:
                    yield record
            except (ValueError, struct.error) as exc:
                raise EpisodeDataError(f"{report.path}: the block at byte {block.start} no longer reads back "
                                       f"({exc}); was the file changed?", episode=report.path) from exc
