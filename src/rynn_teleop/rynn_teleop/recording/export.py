"""Recorded episodes as LeRobot datasets (format v3.0) for policy training (ROS-free).

:func:`export_lerobot` turns episode directories (rosbag2 MCAP + ``episode.yaml``) into one LeRobot dataset
(layout: :mod:`rynn_teleop.recording.lerobot`); ``rynn-teleop episodes export`` is its command line.
One row per frame of the first camera key (``images[0]``), in header-stamp order; every other column holds
the newest value stamped at or before the row's stamp: ``observation.images.<key>`` per key of ``images``
(:data:`FEED_TOPICS`); with ``depth``, ``observation.images.<depth>_depth`` (12-bit grey video of depth over
0..``depth_max_m``, :func:`.lerobot.depth_video_feature`); ``observation.state``, the 54 measured joints
[rad]; ``action``, the 54 commanded joints [rad] (a generated frame has its command's exact stamp);
``timestamp`` = ``frame_index / fps`` [s], LeRobot's indices, and ``stamp_ns`` (the frame's header stamp
[ns]). Rows before every column has a value are left out (counted). Episodes are converted in parallel, one
process each. An episode lacking a needed topic, or whose first camera key does not run at ``fps``, stops
the export with an :class:`ExportError` and nothing is written; one whose integrity check fails is skipped
unless ``include_problems``.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from mcap.data_stream import ReadDataStream
from mcap.reader import make_reader
from mcap.records import Chunk
from mcap.stream_reader import get_chunk_data_stream

from ..core.image import decode_image
from ..core.robot_model import CANONICAL_JOINT_NAMES
from .cdr import has_header, header_stamp_ns
from .errors import RecordingError
from .lerobot import (
    DEFAULT_FEATURES,
    DEPTH_ENCODER,
    EPISODES_PATH,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    ImageStatsSampler,
    Stats,
    VideoOptions,
    VideoWriter,
    aggregate_stats,
    chunk_file,
    data_path,
    depth_codes_to_rgb,
    depth_video_feature,
    depth_video_options,
    encoder_available,
    episode_stats_columns,
    info_doc,
    quantize_depth,
    read_episodes,
    read_tasks,
    stats_from_json,
    stats_to_json,
    vector_feature,
    vector_stats,
    video_feature,
    video_path,
    write_episodes,
    write_frames,
    write_json,
    write_tasks,
)
from .metadata import episode_doc, read_metadata
from .recover import mcap_file
from .stats import episode_stats
from .writer import default_typestore

FEED_TOPICS: dict[str, str] = {
    "physical": "/head_camera/physical/color/image_raw",
    "generated": "/head_camera/generated/color/image_raw",
    "consumer": "/head_camera/color/image_raw",
}
"""Camera key -> the recorded ``sensor_msgs/Image`` topic of that feed."""
DEPTH_TOPICS: dict[str, str] = {
    "physical": "/head_camera/physical/aligned_depth_to_color/image_raw",
    "consumer": "/head_camera/aligned_depth_to_color/image_raw",
}
"""Depth feed -> the recorded ``sensor_msgs/Image`` topic of its depth registered to the colour image
(16UC1 [mm], also mono16 or 32FC1 [m]). The generated feed has no depth; the consumer feed carries it
while the physical source is active."""
DEPTH_MAX_M = 2.0
"""Default depth at the largest depth code [m]: a head camera looking at a table 0.5-1.5 m away."""
MEASURED_TOPIC = "/joint_states"
COMMAND_TOPICS = ("/arms/command", "/hands/command")
SOURCE_TOPIC = "/head_camera/active_source"
JOINT_STATE = "sensor_msgs/msg/JointState"
IMAGE = "sensor_msgs/msg/Image"
ROBOT_TYPE = "rynn_m6_wuji"
"""``robot_type`` written to ``info.json``."""
RATE_TOLERANCE = 0.10
"""A first camera key whose rate (from its median frame interval) differs from ``fps`` by more than this
fraction stops the export."""
EXTRA_PREFIX = "rynn_teleop/"
"""Prefix of this stack's columns in the episodes metadata file."""


class ExportError(RecordingError):
    """An export cannot be done as asked.

    Attributes:
        episode: the episode directory it is about (None: the export as a whole).
        topic: the topic it is about, or None.
    """

    def __init__(self, message: str, *, episode: Path | None = None, topic: str | None = None) -> None:
        super().__init__(message)
        self.episode = episode
        self.topic = topic

    def __reduce__(self) -> tuple[Any, ...]:  # keeps episode and topic across the process pool
        return (_rebuild_export_error, (self.args[0], self.episode, self.topic))


def _rebuild_export_error(message: str, episode: Path | None, topic: str | None) -> ExportError:
    return ExportError(message, episode=episode, topic=topic)


@dataclass(frozen=True)
class ExportedEpisode:
    """One episode written to the dataset."""

    source: Path  # the episode directory
    episode_index: int  # its index in the dataset
    frames: int  # rows (= frames of every video stream)
    dropped_leading_frames: int  # first-key frames before every joint and key had a value
    exact_action_frames: int  # rows whose stamp equals a command's stamp (every generated frame)
    problems: tuple[str, ...] = ()  # check problems (only with include_problems)


@dataclass(frozen=True)
class SkippedEpisode:
    """An episode left out because its integrity check failed."""

    source: Path
    problems: tuple[str, ...]


@dataclass
class ExportReport:
    """What :func:`export_lerobot` did."""

    out: Path  # the dataset root
    repo_id: str
    fps: int  # [Hz]
    episodes: list[ExportedEpisode] = field(default_factory=list)  # in dataset order
    skipped: list[SkippedEpisode] = field(default_factory=list)
    seconds: float = 0.0  # wall-clock time of the export [s]

    @property
    def total_frames(self) -> int:
        """Rows written by this export."""
        return sum(e.frames for e in self.episodes)

    @property
    def recorded_seconds(self) -> float:
        """Real time covered by the rows written [s] (frames / fps)."""
        return self.total_frames / self.fps

    @property
    def speed(self) -> float:
        """Export speed as a multiple of real time (recorded seconds per wall-clock second)."""
        return self.recorded_seconds / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON)."""
        return {
            "out": str(self.out),
            "repo_id": self.repo_id,
            "fps": self.fps,
            "episodes": [
                {"source": str(e.source), "episode_index": e.episode_index, "frames": e.frames,
                 "dropped_leading_frames": e.dropped_leading_frames, "exact_action_frames": e.exact_action_frames,
                 "problems": list(e.problems)}
                for e in self.episodes
            ],
            "skipped": [{"source": str(s.source), "problems": list(s.problems)} for s in self.skipped],
            "total_frames": self.total_frames,
            "recorded_seconds": round(self.recorded_seconds, 3),
            "seconds": round(self.seconds, 3),
            "speed_x_realtime": round(self.speed, 2),
        }


# -- one episode (runs in a worker process) --------------------------------------------------


@dataclass(frozen=True)
class _Job:
    source: Path
    position: int  # in the caller's list
    work_dir: Path  # where this episode's videos are written before they are moved into place
    fps: int
    images: tuple[str, ...]
    video: VideoOptions
    include_problems: bool
    depth: str | None = None  # depth feed, or None
    depth_max_m: float = DEPTH_MAX_M
    depth_video: VideoOptions | None = None


@dataclass
class _Converted:
    source: Path
    position: int
    doc: dict[str, Any]
    problems: tuple[str, ...]
    state: np.ndarray  # (frames, 54) float32 [rad]
    action: np.ndarray  # (frames, 54) float32 [rad]
    stamp_ns: np.ndarray  # (frames,) int64
    videos: dict[str, Path]  # camera key (or depth key) -> temporary MP4
    sizes: dict[str, tuple[int, int]]  # camera key (or depth key) -> (height, width) [px]
    codec: str
    image_stats: dict[str, Stats]
    dropped: int
    exact_action: int
    source_changes: list[dict[str, Any]]


@dataclass
class _Skipped:
    source: Path
    position: int
    problems: tuple[str, ...]


_JOINT_INDEX = {n: i for i, n in enumerate(CANONICAL_JOINT_NAMES)}
N_JOINTS = len(CANONICAL_JOINT_NAMES)


class _JointTrack:
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
            raise ExportError(f"{episode}: a JointState on {topic} has {len(idx)} names but {len(positions)} positions",
                              episode=episode, topic=topic)
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
class _Bag:
    """An episode bag's channels (from the MCAP summary), read once per pass by :meth:`scan`."""

    path: Path
    topics: dict[int, str]  # channel id -> topic
    types: dict[str, str]  # topic -> type name
    chunks: list[Any]  # the summary's chunk indexes, in file order

    @classmethod
    def open(cls, episode: Path) -> _Bag:
        """Raises ExportError: the bag has no summary (not closed: ``episodes recover`` rebuilds it)."""
        path = mcap_file(episode)
        try:
            with path.open("rb") as f:
                summary = make_reader(f).get_summary()
        except Exception as exc:  # mcap raises several types for a cut file
            raise ExportError(f"{episode}: the bag has no readable index ({exc}); run `rynn-teleop episodes recover "
                              f"{episode}`", episode=episode) from exc
        if summary is None:
            raise ExportError(f"{episode}: the bag has no index; run `rynn-teleop episodes recover {episode}`",
                              episode=episode)
        topics = {cid: ch.topic for cid, ch in summary.channels.items()}
        types = {ch.topic: (summary.schemas[ch.schema_id].name if ch.schema_id in summary.schemas else "")
                 for ch in summary.channels.values()}
        chunks = sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset)
        if not chunks and summary.statistics and summary.statistics.message_count:
            raise ExportError(f"{episode}: the bag's messages are not in chunks (not written by this stack)",
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


class _JointStateReader:
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
    """The records of a chunk record's content, decompressed by the mcap library."""
    try:
        stream, length = get_chunk_data_stream(Chunk.read(ReadDataStream(io.BytesIO(body))))
    except Exception as exc:  # unsupported compression, a cut chunk
        raise ExportError(f"{path}: a chunk cannot be read ({exc})", episode=path) from exc
    return memoryview(stream.read(length))


def _episode_problems(path: Path, doc: Mapping[str, Any], bag: _Bag, times: Mapping[str, list[int]],
                      stamps: Mapping[str, list[int]]) -> list[str]:
    """What ``episodes check`` reports for the episode (:func:`..inspect.episode_info`), from this pass's
    receive times and header stamps instead of another read of the bag."""
    problems: list[str] = []
    if str(doc.get("state") or "") == "failed":
        problems.append(f"recording failed: {doc.get('error', 'unknown error')}")
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


def _convert(job: _Job) -> _Converted | _Skipped:
    """Convert one episode: check it, read the joints, choose the rows, encode every camera key."""
    path = job.source
    doc = episode_doc(path)
    if read_metadata(path) is None:
        problems = [
            f"not closed (no metadata.yaml): still being recorded, or run `rynn-teleop episodes recover {path}`"
        ]
        if job.include_problems:
            raise ExportError(f"{path}: {problems[0]}", episode=path)
        return _Skipped(path, job.position, tuple(problems))
    bag = _Bag.open(path)
    typestore = default_typestore()
    image_topics = [FEED_TOPICS[k] for k in job.images]
    for key, topic in zip(job.images, image_topics):
        if topic not in bag.types:
            raise ExportError(f"{path}: camera key {key!r} needs topic {topic}, which the episode did not record",
                              episode=path, topic=topic)
        if bag.types[topic] != IMAGE:
            raise ExportError(f"{path}: {topic} is {bag.types[topic]}, not {IMAGE}", episode=path, topic=topic)
    depth_topic = DEPTH_TOPICS[job.depth] if job.depth else None
    if depth_topic is not None:
        if depth_topic not in bag.types:
            raise ExportError(f"{path}: depth of the {job.depth!r} feed needs topic {depth_topic}, which the episode "
                              "did not record", episode=path, topic=depth_topic)
        if bag.types[depth_topic] != IMAGE:
            raise ExportError(f"{path}: {depth_topic} is {bag.types[depth_topic]}, not {IMAGE}",
                              episode=path, topic=depth_topic)
    for topic in (MEASURED_TOPIC, *COMMAND_TOPICS):
        if topic not in bag.types:
            raise ExportError(f"{path}: topic {topic} (joint {'state' if topic == MEASURED_TOPIC else 'commands'}) "
                              "was not recorded", episode=path, topic=topic)
    measured = _JointTrack([MEASURED_TOPIC])
    commanded = _JointTrack(COMMAND_TOPICS)
    command_stamps: set[int] = set()
    joints = _JointStateReader(typestore)
    sources: list[tuple[int, str]] = []
    times: dict[str, list[int]] = {t: [] for t in bag.types}
    stamps: dict[str, list[int]] = {t: [] for t in bag.types}
    for topic, log_time, data in bag.scan(None):  # one pass: the check's times and stamps, joints, frame stamps
        times[topic].append(log_time)
        stamps[topic].append(header_stamp_ns(data))
        if topic == SOURCE_TOPIC:
            sources.append((log_time, str(typestore.deserialize_cdr(data, bag.types[topic]).data)))
        elif topic == MEASURED_TOPIC or topic in COMMAND_TOPICS:
            if bag.types[topic] != JOINT_STATE:
                raise ExportError(f"{path}: {topic} is {bag.types[topic]}, not {JOINT_STATE}",
                                  episode=path, topic=topic)
            names, positions = joints.read(data)
            stamp = stamps[topic][-1]
            (measured if topic == MEASURED_TOPIC else commanded).add(stamp, names, positions, path, topic)
            if topic != MEASURED_TOPIC:
                command_stamps.add(stamp)
    problems = _episode_problems(path, doc, bag, times, stamps)
    if problems and not job.include_problems:
        return _Skipped(path, job.position, tuple(problems))
    key_topics = image_topics + ([depth_topic] if depth_topic else [])
    image_stamps = {t: stamps[t] for t in key_topics}

    primary = image_topics[0]
    first_stamps = np.asarray(image_stamps[primary], np.int64)
    if first_stamps.size == 0:
        raise ExportError(f"{path}: no frame on {primary}", episode=path, topic=primary)
    row_msg = np.argsort(first_stamps, kind="stable")  # row -> message number on the first key's topic
    rows_ns = first_stamps[row_msg]
    for track, what in ((measured, "measured"), (commanded, "commanded")):
        if not track.seen.all():
            missing = [CANONICAL_JOINT_NAMES[i] for i in np.nonzero(~track.seen)[0]]
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            topic = MEASURED_TOPIC if track is measured else _missing_command_topic(missing)
            raise ExportError(f"{path}: joints never {what} on {', '.join(track.topics)}: {shown}",
                              episode=path, topic=topic)
    state = measured.sample(rows_ns)
    action = commanded.sample(rows_ns)
    valid = ~np.isnan(state).any(axis=1) & ~np.isnan(action).any(axis=1)
    selections: dict[str, np.ndarray] = {primary: row_msg}
    for topic in dict.fromkeys(key_topics[1:]):
        key_stamps = np.asarray(image_stamps[topic], np.int64)
        order = np.argsort(key_stamps, kind="stable")
        pos = np.searchsorted(key_stamps[order], rows_ns, side="right") - 1
        valid &= pos >= 0
        selections[topic] = np.where(pos >= 0, order[np.maximum(pos, 0)], -1)
    if not valid.any():
        raise ExportError(f"{path}: no frame of {primary} after every joint and camera (and depth) key has a value",
                          episode=path, topic=primary)
    start = int(np.argmax(valid))
    rows = np.arange(start, len(rows_ns))
    if not valid[start:].all():  # values never disappear once present; kept as a guard
        rows = np.nonzero(valid)[0]
    intervals = np.diff(rows_ns[rows])
    if len(intervals) >= 2 and np.median(intervals) > 0:
        rate = 1e9 / float(np.median(intervals))  # the median interval: a gap does not change the camera's rate
        if abs(rate - job.fps) > RATE_TOLERANCE * job.fps:
            raise ExportError(f"{path}: {primary} runs at {rate:.2f} Hz, not the dataset's {job.fps} Hz (--fps)",
                              episode=path, topic=primary)

    videos: dict[str, Path] = {}
    sizes: dict[str, tuple[int, int]] = {}
    image_stats: dict[str, Stats] = {}
    codec = job.video.codec
    job.work_dir.mkdir(parents=True, exist_ok=True)
    for key, topic in zip(job.images, image_topics):
        target = job.work_dir / f"{key}.mp4"
        sel = selections[topic][rows]
        height, width, codec = _encode(bag, topic, sel, target, job, typestore, image_stats, key)
        videos[key] = target
        sizes[key] = (height, width)
    if depth_topic is not None:
        key = depth_key(job.depth)
        target = job.work_dir / f"{key}.mp4"
        height, width, _ = _encode(bag, depth_topic, selections[depth_topic][rows], target, job, typestore,
                                   image_stats, key, depth_max_m=job.depth_max_m)
        videos[key] = target
        sizes[key] = (height, width)

    changes = [
        {"receive_time_ns": int(t), "frame_index": int(np.searchsorted(rows_ns[rows], t, side="left")), "source": s}
        for t, s in sources
    ]
    return _Converted(
        source=path,
        position=job.position,
        doc=dict(doc),
        problems=tuple(problems),
        state=state[rows].astype(np.float32),
        action=action[rows].astype(np.float32),
        stamp_ns=rows_ns[rows],
        videos=videos,
        sizes=sizes,
        codec=codec,
        image_stats=image_stats,
        dropped=int(len(rows_ns) - len(rows)),
        exact_action=int(sum(1 for t in rows_ns[rows] if int(t) in command_stamps)),
        source_changes=changes,
    )


def _missing_command_topic(missing: Sequence[str]) -> str:
    """The command topic that should have carried the first of the ``missing`` joints."""
    return COMMAND_TOPICS[0] if "_arm_" in missing[0] else COMMAND_TOPICS[1]


def _encode(
    bag: _Bag,
    topic: str,
    sel: np.ndarray,
    target: Path,
    job: _Job,
    typestore: Any,
    image_stats: dict[str, Stats],
    key: str,
    *,
    depth_max_m: float | None = None,
) -> tuple[int, int, str]:
    """Write the frames ``sel`` (message numbers on ``topic``, one per row) as one video.

    Returns (height, width, codec).

    With ``depth_max_m`` the topic holds depth images, written as 12-bit codes (:func:`.lerobot.quantize_depth`)
    with ``job.depth_video``; otherwise colour images, written with ``job.video``.
    """
    path = bag.path.parent
    need: dict[int, int] = {}  # message number -> last row that uses it
    for r, m in enumerate(sel):
        need[int(m)] = r
    cache: dict[int, np.ndarray] = {}
    writer: VideoWriter | None = None
    sampler: ImageStatsSampler | None = None
    nxt = 0
    try:
        for m, (_, _, data) in enumerate(bag.scan({topic})):
            if m not in need:
                continue
            try:
                image = decode_image(typestore.deserialize_cdr(data, IMAGE), depth=depth_max_m is not None)
            except ValueError as exc:
                raise ExportError(f"{path}: {topic}: {exc}", episode=path, topic=topic) from exc
            cache[m] = image if depth_max_m is None else quantize_depth(image, depth_max_m)
            while nxt < len(sel) and int(sel[nxt]) in cache:
                frame = cache[int(sel[nxt])]
                if writer is None:
                    h, w = frame.shape[:2]
                    if depth_max_m is None:
                        options = job.video
                    else:
                        options = job.depth_video or depth_video_options(job.video.gop)
                    try:
                        writer = VideoWriter(target, width=w, height=h, fps=job.fps, options=options)
                    except ValueError as exc:
                        raise ExportError(f"{path}: {topic}: {exc}", episode=path, topic=topic) from exc
                    sampler = ImageStatsSampler(len(sel), h, w)
                if frame.shape[:2] != (writer.size[1], writer.size[0]):
                    raise ExportError(f"{path}: {topic}: frame {nxt} is {frame.shape[1]}x{frame.shape[0]}, "
                                      f"the first was {writer.size[0]}x{writer.size[1]}", episode=path, topic=topic)
                writer.write(frame)
                assert sampler is not None
                sampler.offer(nxt, frame if depth_max_m is None else depth_codes_to_rgb(frame))
                if need[int(sel[nxt])] == nxt:
                    del cache[int(sel[nxt])]
                nxt += 1
            if nxt == len(sel):
                break
        if writer is None or nxt != len(sel):
            raise ExportError(f"{path}: {topic}: {len(sel) - nxt} frame(s) could not be read back",
                              episode=path, topic=topic)
        writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    assert sampler is not None
    image_stats[key] = sampler.stats()
    return writer.size[1], writer.size[0], writer.codec


# -- the dataset -----------------------------------------------------------------------------


def depth_key(feed: str) -> str:
    """The video key name of a feed's depth (``observation.images.<name>``): ``<feed>_depth``, LeRobot's naming."""
    return f"{feed}_depth"


def _features(images: Sequence[str], sizes: Mapping[str, tuple[int, int]], fps: int, video: VideoOptions,
              codec: str, depth: str | None = None, depth_max_m: float = DEPTH_MAX_M) -> dict[str, dict[str, Any]]:
    """The dataset's features besides LeRobot's bookkeeping ones (``sizes``: key -> (height, width) [px])."""
    features: dict[str, dict[str, Any]] = {}
    for key in images:
        h, w = sizes[key]
        features[f"observation.images.{key}"] = video_feature(h, w, fps, _codec_name(codec), video.pix_fmt)
    if depth:
        h, w = sizes[depth_key(depth)]
        features[f"observation.images.{depth_key(depth)}"] = depth_video_feature(h, w, fps, depth_max_m,
                                                                                DEPTH_TOPICS[depth])
    features["observation.state"] = vector_feature(CANONICAL_JOINT_NAMES)
    features["action"] = vector_feature(CANONICAL_JOINT_NAMES)
    features["stamp_ns"] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def _codec_name(encoder: str) -> str:
    """The codec (as FFmpeg names it in a stream) of an encoder name."""
    return {"libx264": "h264", "libopenh264": "h264", "libx265": "hevc", "libsvtav1": "av1", "libaom-av1": "av1",
            "librav1e": "av1", "libvpx-vp9": "vp9"}.get(encoder, encoder)


def _cpu_count() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _worker_count(workers: int | None, jobs: int) -> int:
    """Processes converting episodes: ``workers`` (default one per CPU), at most one per episode."""
    return max(1, min(jobs, _cpu_count() if workers is None else int(workers)))


def _run(jobs: Sequence[_Job], workers: int) -> list[_Converted | _Skipped]:
    """Convert every job, in a process pool when there are several workers; results in job order."""
    if workers <= 1 or len(jobs) <= 1:
        return [_convert(j) for j in jobs]
    # fork (no re-import of the caller's main module) unless other threads run here, whose locks a forked
    # child could inherit held; then a fork server (the caller's main module must be import-safe).
    if threading.active_count() == 1:
        ctx = multiprocessing.get_context("fork")
    else:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(_convert, j) for j in jobs]
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool as exc:
            raise ExportError(f"an export worker process died ({exc}); with threads running, workers start from a "
                              "fork server, which imports the calling script: guard its top level with "
                              "`if __name__ == '__main__':`, or pass workers=1") from exc
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _is_dataset(path: Path) -> bool:
    return (path / INFO_PATH).is_file()


def export_lerobot(
    episodes: Sequence[str | Path],
    out: str | Path,
    repo_id: str,
    *,
    fps: int = 30,
    images: Sequence[str] = ("consumer",),
    video: VideoOptions | None = None,
    include_problems: bool = False,
    append: bool = False,
    overwrite: bool = False,
    workers: int | None = None,
    depth: str | None = None,
    depth_max_m: float = DEPTH_MAX_M,
) -> ExportReport:
    """Export episode directories as one LeRobot (v3.0) dataset at ``out``.

    Args:
        episodes: episode (bag) directories, in the order they get episode indices.
        out: the dataset root to create (or extend with ``append``).
        repo_id: the dataset's name (``user/name``; LeRobot's ``repo_id``).
        fps: the dataset's frame rate [Hz]: the rate of the first camera key (checked).
        images: camera keys, each of ``physical``, ``generated``, ``consumer``; the first
            one's frames are the rows.
        video: codec options (default :class:`VideoOptions`: H.264, CRF 23, key frame every 2 frames).
        include_problems: export episodes whose integrity check fails, instead of skipping them.
        append: add to an existing dataset at ``out`` (episode and frame indices continue;
            features, fps and camera sizes must match).
        overwrite: replace an existing dataset at ``out``.
        workers: processes converting episodes at once (default: one per CPU, at most one per episode);
            with ``video.threads`` 0 each encoder gets CPUs / workers threads.
        depth: add the depth of this feed (``physical`` or ``consumer``; :data:`DEPTH_TOPICS`) as the video
            key ``observation.images.<depth>_depth``, one frame per row (the newest depth image stamped at or
            before the row's stamp); None (default): no depth key.
        depth_max_m: depth at the largest depth value [m] (0 < depth_max_m <= 65.535): depth is quantised
            linearly over 0..depth_max_m, farther depth is stored as depth_max_m. The 8-bit RGB a LeRobot 0.4
            reader decodes holds depth / depth_max_m in [0, 1] (steps of depth_max_m / 255; 0: no reading);
            the 12-bit stream has steps of depth_max_m / 4080 (:func:`.lerobot.depth_video_feature`).
            Recorded in the feature's ``info`` and in every episode's ``rynn_teleop/depth_max_m``.

    Returns:
        What was written and skipped, and how long it took.

    Raises:
        ExportError: a bad argument; ``out`` exists (a non-empty folder without ``append`` or
            ``overwrite``, or a folder that is not a dataset with either); an episode lacks a
            needed topic (with ``depth``, the depth topic) or its camera does not run at ``fps``;
            camera (or depth) sizes differ between episodes. Nothing is written then (with ``append``,
            the existing dataset is unchanged).
    """
    started = time.perf_counter()
    out = Path(out)
    video = video or VideoOptions()
    images = tuple(images)
    fps = int(fps)
    if not images:
        raise ExportError("at least one camera key is needed (--image)")
    if unknown := [k for k in images if k not in FEED_TOPICS]:
        raise ExportError(f"unknown camera key(s) {', '.join(unknown)}; known: {', '.join(FEED_TOPICS)}")
    if len(set(images)) != len(images):
        raise ExportError(f"camera keys repeated: {', '.join(images)}")
    if depth is not None and depth not in DEPTH_TOPICS:
        raise ExportError(f"no depth for feed {depth!r}; depth exists for: {', '.join(DEPTH_TOPICS)}")
    depth_max_m = float(depth_max_m)
    if not 0.0 < depth_max_m <= 65.535:
        raise ExportError(f"depth_max_m {depth_max_m} is outside (0, 65.535] m")
    if depth is not None and not encoder_available(DEPTH_ENCODER):
        raise ExportError(f"depth needs the video encoder {DEPTH_ENCODER!r}, which this PyAV build lacks")
    video_keys = images + ((depth_key(depth),) if depth else ())
    if not 1 <= fps <= 1000:
        raise ExportError(f"fps {fps} is outside 1..1000 Hz")
    if workers is not None and int(workers) < 1:
        raise ExportError(f"workers must be >= 1, got {workers}")
    if append and overwrite:
        raise ExportError("--append and --overwrite exclude each other")
    if not repo_id or repo_id.strip() != repo_id:
        raise ExportError(f"repo id {repo_id!r}: give a name such as 'lab/pick_place'")
    if not encoder_available(video.codec):
        raise ExportError(f"video codec {video.codec!r} is not available in this PyAV build")
    sources = [Path(p) for p in episodes]
    if not sources:
        raise ExportError("no episode to export")
    for p in sources:
        if not p.is_dir():
            raise ExportError(f"{p} is not an episode directory", episode=p)

    exists = out.exists() and (not out.is_dir() or any(out.iterdir()))
    if exists and not (append or overwrite):
        raise ExportError(f"{out} exists; use --append to add episodes to it or --overwrite to replace it")
    if exists and not _is_dataset(out):
        raise ExportError(f"{out} exists and is not a LeRobot dataset (no {INFO_PATH}); refusing to "
                          f"{'append to' if append else 'overwrite'} it")
    extend = append and exists

    old_info: dict[str, Any] | None = None
    old_rows: list[dict[str, Any]] = []
    tasks: list[str] = []
    old_stats: dict[str, Stats] | None = None
    if extend:
        old_info = json.loads((out / INFO_PATH).read_text(encoding="utf-8"))
        if int(old_info.get("fps", 0)) != fps:
            raise ExportError(f"{out} is a {old_info.get('fps')} fps dataset; --fps {fps} cannot be appended to it")
        old_keys = sorted(k for k in old_info["features"] if k.startswith("observation.images."))
        if old_keys != sorted(f"observation.images.{k}" for k in video_keys):
            raise ExportError(f"{out} has camera keys {', '.join(old_keys)}; append with the same --image keys "
                              "and --depth")
        if depth:
            old_info_d = old_info["features"][f"observation.images.{depth_key(depth)}"].get("info", {})
            old_max = old_info_d.get("rynn_teleop/depth_scale_m")
            if old_max is None or float(old_max) != depth_max_m:
                raise ExportError(f"{out} quantises depth over 0..{old_max} m; append with --depth-max-m {old_max}")
        old_rows = read_episodes(out / EPISODES_PATH) if (out / EPISODES_PATH).is_file() else []
        tasks = read_tasks(out / TASKS_PATH) if (out / TASKS_PATH).is_file() else []
        old_stats = stats_from_json(json.loads((out / STATS_PATH).read_text(encoding="utf-8"))) \
            if (out / STATS_PATH).is_file() else None
        stage = out / ".export-staging"
    else:
        stage = out.parent / f".{out.name}.export-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    root = out if extend else stage
    work = stage / "work"
    report = ExportReport(out=out, repo_id=repo_id, fps=fps)
    written: list[Path] = []  # files written into an existing dataset (removed again on failure)
    try:
        n_workers = _worker_count(workers, len(sources))
        job_video = video if video.threads else replace(video, threads=max(1, _cpu_count() // n_workers))
        depth_video = depth_video_options(video.gop, job_video.threads)
        jobs = [_Job(p, i, work / f"{i:05d}", fps, images, job_video, include_problems, depth, depth_max_m, depth_video)
                for i, p in enumerate(sources)]
        results = _run(jobs, n_workers)
        converted = [r for r in results if isinstance(r, _Converted)]
        report.skipped = [SkippedEpisode(r.source, r.problems) for r in results if isinstance(r, _Skipped)]
        if not converted:
            shutil.rmtree(stage, ignore_errors=True)
            report.seconds = time.perf_counter() - started
            return report

        sizes = dict(converted[0].sizes)
        if old_info is not None:
            sizes = {k: tuple(old_info["features"][f"observation.images.{k}"]["shape"][:2]) for k in video_keys}
        for c in converted:
            for key in video_keys:
                if tuple(c.sizes[key]) != tuple(sizes[key]):
                    topic = FEED_TOPICS[key] if key in FEED_TOPICS else DEPTH_TOPICS[str(depth)]
                    raise ExportError(f"{c.source}: camera key {key!r} is {c.sizes[key][1]}x{c.sizes[key][0]}, other "
                                      f"episodes of the dataset are {sizes[key][1]}x{sizes[key][0]}",
                                      episode=c.source, topic=topic)
        features = _features(images, sizes, fps, video, converted[0].codec, depth, depth_max_m)
        if old_info is not None:
            old_features = {k: v for k, v in old_info["features"].items() if k not in DEFAULT_FEATURES}
            if set(old_features) != set(features):
                raise ExportError(f"{out} has features {', '.join(sorted(old_features))}; this export writes "
                                  f"{', '.join(sorted(features))}: append only to datasets exported the same way")
            features = old_features
        all_features = {**features, **DEFAULT_FEATURES}

        next_episode = int(old_info["total_episodes"]) if old_info else 0
        next_index = int(old_info["total_frames"]) if old_info else 0
        new_rows: list[dict[str, Any]] = []
        new_stats: list[dict[str, Stats]] = []
        for c in converted:
            ep = next_episode
            n = len(c.stamp_ns)
            task = str(c.doc.get("task", "") or "")
            if task not in tasks:
                tasks.append(task)
            task_index = tasks.index(task)
            frame_index = np.arange(n, dtype=np.int64)
            columns = {
                "observation.state": c.state,
                "action": c.action,
                "stamp_ns": c.stamp_ns,
                "timestamp": (frame_index / fps).astype(np.float32),
                "frame_index": frame_index,
                "episode_index": np.full(n, ep, np.int64),
                "index": np.arange(next_index, next_index + n, dtype=np.int64),
                "task_index": np.full(n, task_index, np.int64),
            }
            write_frames(root / data_path(ep), columns, all_features)
            if extend:
                written.append(root / data_path(ep))
            stats = {k: vector_stats(v) for k, v in columns.items()}
            for key in video_keys:
                stats[f"observation.images.{key}"] = c.image_stats[key]
                target = root / video_path(f"observation.images.{key}", ep)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(c.videos[key], target)
                if extend:
                    written.append(target)
            new_stats.append(stats)
            chunk, file = chunk_file(ep)
            row: dict[str, Any] = {
                "episode_index": ep,
                "tasks": [task],
                "length": n,
                "data/chunk_index": chunk,
                "data/file_index": file,
                "dataset_from_index": next_index,
                "dataset_to_index": next_index + n,
            }
            for key in video_keys:
                vk = f"observation.images.{key}"
                row.update({f"videos/{vk}/chunk_index": chunk, f"videos/{vk}/file_index": file,
                            f"videos/{vk}/from_timestamp": 0.0, f"videos/{vk}/to_timestamp": n / fps})
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            row.update(episode_stats_columns(stats))
            row.update(_extra_columns(c))
            if depth:
                row.update({EXTRA_PREFIX + "depth_topic": DEPTH_TOPICS[depth],
                            EXTRA_PREFIX + "depth_max_m": depth_max_m})
            new_rows.append(row)
            report.episodes.append(ExportedEpisode(
                source=c.source, episode_index=ep, frames=n, dropped_leading_frames=c.dropped,
                exact_action_frames=c.exact_action, problems=c.problems if include_problems else (),
            ))
            next_episode += 1
            next_index += n

        total_stats = aggregate_stats(([old_stats] if old_stats else []) + new_stats)
        write_episodes(root / EPISODES_PATH, _uniform_rows(old_rows + new_rows))
        write_tasks(root / TASKS_PATH, tasks)
        write_json(root / STATS_PATH, stats_to_json(total_stats))
        write_json(root / INFO_PATH, info_doc(fps=fps, features=features, total_episodes=next_episode,
                                              total_frames=next_index, total_tasks=len(tasks), robot_type=ROBOT_TYPE))
        shutil.rmtree(work, ignore_errors=True)
        if not extend:
            if out.exists():
                shutil.rmtree(out) if out.is_dir() else out.unlink()
            os.replace(stage, out)
        else:
            shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        for p in written:  # appending: this run's files; the existing dataset's metadata was not touched
            p.unlink(missing_ok=True)
        shutil.rmtree(stage, ignore_errors=True)
        raise
    report.seconds = time.perf_counter() - started
    return report


def _extra_columns(c: _Converted) -> dict[str, Any]:
    """This stack's per-episode metadata columns."""
    doc = c.doc
    return {
        EXTRA_PREFIX + "episode": str(doc.get("episode") or c.source.name),
        EXTRA_PREFIX + "source_dir": str(c.source.resolve()),
        EXTRA_PREFIX + "outcome": str(doc.get("outcome", "") or ""),
        EXTRA_PREFIX + "notes": str(doc.get("notes", "") or ""),
        EXTRA_PREFIX + "operator": str(doc.get("operator", "") or ""),
        EXTRA_PREFIX + "camera_source_changes": json.dumps(c.source_changes),
        EXTRA_PREFIX + "first_stamp_ns": int(c.stamp_ns[0]),
        EXTRA_PREFIX + "dropped_leading_frames": int(c.dropped),
        EXTRA_PREFIX + "problems": json.dumps(list(c.problems)),
    }


def _uniform_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row with the union of the keys (None where a row lacks one), in first-seen key order."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in keys} for r in rows]


__all__ = [
    "ExportError",
    "ExportReport",
    "DEPTH_MAX_M",
    "DEPTH_TOPICS",
    "ExportedEpisode",
    "FEED_TOPICS",
    "SkippedEpisode",
    "VideoOptions",
    "depth_key",
    "export_lerobot",
]
