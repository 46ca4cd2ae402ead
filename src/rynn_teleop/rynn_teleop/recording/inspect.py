"""Looking at recorded episodes: list, info, check, joint plots, camera previews (ROS-free).

``rynn-teleop episodes ...`` is :func:`episodes_main`::

    episodes list DIR                      one line per episode of an output directory
    episodes info PATH [--json] [--plot FILE.png] [--video FILE.mp4] [--camera-topic T] [--rate TOPIC=HZ ...]
    episodes check PATH [--quick] [--rate TOPIC=HZ ...]   exit 1 if an episode is damaged or has problems
    episodes recover PATH [--out DIR]      repair a killed recorder's bag; salvage a damaged one into a new episode
    episodes export PATHS --out DIR ... [--skip-damaged]   a LeRobot dataset
    episodes replay EPISODE [--twin] [--scene S] [--seed N] [--speed X]   its commands through the drivers again
                                           (``rynn-teleop`` only: it needs ROS; :mod:`.replay`, ``rynn_teleop.replay``)

PATH is one episode directory or an output directory (every episode in it). Exit codes: 0 fine, 1 the data
(``check`` found damage or problems, an episode that cannot be read or is damaged), 2 the request (bad
arguments, a path that does not exist or is not an episode, an output that cannot be written).

``check`` verifies each episode's file (:func:`.integrity.verify_mcap`: chunk, data-section and summary CRCs,
every message decoded with its schema, receive times monotonic and inside the episode, header stamps
plausible) and reports a damaged one with the byte ranges, topics and times lost, then computes the integrity
statistics from the intact messages; ``check --quick`` and ``info`` compute the statistics only, from the MCAP
index (receive times) plus the header stamps of the topics with a rate (gaps:
:mod:`rynn_teleop.recording.stats`), without reading every byte.
The plot draws commanded (``/arms/command``, ``/hands/command``) and measured (``/joint_states``) joint
positions against receive time; the preview is an MP4 (``mp4v``) of an Image topic at its recorded rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from rosbags.rosbag2 import Reader

from ..core.image import DEPTH_ENCODINGS, decode_image
from ..errors import RynnTeleopError
from .cdr import has_header
from .episodes import episode_dirs
from .errors import USAGE_EXIT_CODE, EpisodeDataError, RecordingError
from .integrity import IntegrityReport
from .mcapfile import read_index, read_stamps
from .metadata import episode_doc, read_metadata, salvage_problems
from .recover import mcap_file, recover_bag, verify_episode
from .replay import add_arguments as add_replay_arguments
from .stats import EpisodeStats, episode_stats, parse_topic_rates
from .writer import default_typestore

COMMAND_TOPICS = ("/arms/command", "/hands/command")
MEASURED_TOPIC = "/joint_states"
CAMERA_TOPIC = "/head_camera/color/image_raw"
IMAGE_TYPE = "sensor_msgs/msg/Image"
JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"


@dataclass(frozen=True)
class EpisodeInfo:
    """What an episode directory holds and how healthy it is."""

    path: Path
    state: str  # complete, recovered, failed, recording (not closed: needs recover), or unknown (no description)
    doc: dict[str, Any] = field(default_factory=dict)  # the episode description (episode.yaml)
    stats: EpisodeStats | None = None  # None when the bag has no readable index
    problems: list[str] = field(default_factory=list)  # empty when the episode is fine
    integrity: IntegrityReport | None = None  # the file's verification (None: statistics only)
    unreadable: bool = False  # statistics only: the closed bag's index or messages could not be read (damaged)

    @property
    def damaged(self) -> bool:
        """The file was verified and found damaged."""
        return self.integrity is not None and self.integrity.damaged

    @property
    def ok(self) -> bool:
        """True when nothing is wrong with the episode."""
        return not self.problems and not self.damaged

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON)."""
        return {
            "path": str(self.path),
            "state": self.state,
            "task": self.doc.get("task", ""),
            "operator": self.doc.get("operator", ""),
            "notes": self.doc.get("notes", ""),
            "camera_sources": self.doc.get("camera_sources", []),
            "stats": self.stats.to_dict() if self.stats else None,
            "problems": list(self.problems),
            "verified": self.integrity is not None,
            "damaged": self.damaged,
            "damage": self.integrity.lines(self.doc.get("start_ns")) if self.damaged else [],
        }


def _topic_times(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """Topic -> (type name, sorted receive times [ns]) from the bag's MCAP index."""
    index = read_index(mcap_file(path))
    out: dict[str, tuple[str, list[np.ndarray]]] = {}
    for cid, ch in index.channels.items():
        schema = index.schemas.get(ch.schema_id)
        type_name = schema.name if schema is not None else ""
        known, parts = out.setdefault(ch.topic, (type_name, []))
        if type_name not in known.split(", "):
            out[ch.topic] = (f"{known}, {type_name}", parts)
        parts.append(index.times.get(cid, np.zeros(0, np.int64)))
    return {t: (ty, np.sort(np.concatenate(parts))) for t, (ty, parts) in out.items()}


def _topic_stamps(
    path: Path, times: Mapping[str, tuple[str, np.ndarray]], rates: Mapping[str, float | None]
) -> tuple[dict[str, np.ndarray], str]:
    """Header stamps [ns] of the topics with a rate whose every type starts with a std_msgs/Header, and why
    they could not be read ("" when they could).

    Empty if the messages cannot be read (gaps then fall back to receive times; the reason is a problem).
    """
    typestore = default_typestore()
    topics = [
        t for t, (ty, _) in times.items() if rates.get(t) and all(has_header(typestore, x) for x in ty.split(", "))
    ]
    try:
        return read_stamps(mcap_file(path), topics), ""
    except RecordingError as exc:
        return {}, f"damaged: {exc}; `rynn-teleop episodes check {path}` verifies it"


def episode_info(path: str | Path, expected_rates: Mapping[str, float] | None = None, *,
                 verify: bool = False) -> EpisodeInfo:
    """Describe and check one episode directory.

    Args:
        path: the episode (bag) directory.
        expected_rates: topic -> rate [Hz], overriding or adding to the recorded configuration.
        verify: read and verify the whole file (:func:`.recover.verify_episode`, every message decoded) and
            compute the statistics from its intact messages; default: the statistics only, from the index.

    Raises:
        RecordingError: the directory holds no MCAP file, or one that cannot be opened; EpisodeDataError: a
            description that cannot be parsed, a file that is no MCAP file.
    """
    path = Path(path)
    doc = episode_doc(path)
    state = str(doc.get("state") or "unknown")
    problems: list[str] = []
    if state == "failed":
        problems.append(f"recording failed: {doc.get('error', 'unknown error')}")
    problems += salvage_problems(doc)
    meta = read_metadata(path)
    rates = {**(doc.get("expected_rates") or {}), **(expected_rates or {})}
    if verify:
        return _verified_info(path, doc, state, meta, rates, problems)
    try:
        if meta is None:
            raise RecordingError("no metadata.yaml")
        times = _topic_times(path)
    except RecordingError as exc:
        if meta is not None:
            problems.append(f"damaged: {exc}; `rynn-teleop episodes check {path}` verifies it")
        elif state != "failed":
            problems.append(f"not closed ({exc}): still being recorded, or run `rynn-teleop episodes recover {path}`")
        return EpisodeInfo(path, "recording" if state in ("recording", "unknown") and meta is None else state, doc,
                           None, problems, unreadable=meta is not None)
    edges = [int(x) for _, ts in times.values() if ts.size for x in (ts[0], ts[-1])]
    start_ns = int(doc.get("start_ns") or min(edges, default=0))
    stop_ns = int(doc.get("stop_ns") or max(edges, default=start_ns))
    recorded = (doc.get("stats") or {}).get("topics") or {}
    dropped = {t: int(s.get("dropped", 0)) for t, s in recorded.items()}
    stamps, unreadable = _topic_stamps(path, times, rates)
    stats = episode_stats(
        times, start_ns=start_ns, stop_ns=stop_ns, expected_rates=rates, dropped=dropped,
        stamps=stamps, gap_rates=doc.get("gap_rates") or {},
    )
    return EpisodeInfo(path, state, doc, stats, problems + ([unreadable] if unreadable else []) + stats.problems(),
                       unreadable=bool(unreadable))


def _verified_info(path: Path, doc: dict[str, Any], state: str, meta: dict[str, Any] | None,
                   rates: Mapping[str, float | None], problems: list[str]) -> EpisodeInfo:
    """:func:`episode_info` with ``verify``: one pass over the file gives the damage and the statistics."""
    report = verify_episode(path, doc=doc, decode=True)
    if meta is None:
        if state != "failed":
            problems.append("not closed (no metadata.yaml): still being recorded, or run "
                            f"`rynn-teleop episodes recover {path}`")
        return EpisodeInfo(path, "recording" if state in ("recording", "unknown") else state, doc, None,
                           problems + report.problems, report)
    times = {t: (m.type_name, m.times_ns) for t, m in report.topics.items()}
    edges = [int(x) for _, ts in times.values() if ts.size for x in (ts.min(), ts.max())]
    start_ns = int(doc.get("start_ns") or min(edges, default=0))
    stop_ns = int(doc.get("stop_ns") or max(edges, default=start_ns))
    recorded = (doc.get("stats") or {}).get("topics") or {}
    typestore = default_typestore()
    stamps = {t: m.stamps_ns for t, m in report.topics.items()
              if rates.get(t) and all(has_header(typestore, x) for x in m.type_name.split(", "))}
    stats = episode_stats(
        times, start_ns=start_ns, stop_ns=stop_ns, expected_rates=rates,
        dropped={t: int(s.get("dropped", 0)) for t, s in recorded.items()}, stamps=stamps,
        gap_rates=doc.get("gap_rates") or {},
    )
    return EpisodeInfo(path, state, doc, stats, problems + stats.problems() + report.problems, report)


@dataclass(frozen=True)
class EpisodeListing:
    """One line of ``episodes list`` (from the descriptions only; no bag is read)."""

    path: Path
    state: str
    task: str
    operator: str
    duration_s: float | None  # None while not stopped
    message_count: int | None  # None while not closed
    problem_count: int | None  # recorded at stop or recover; None if never checked
    error: str = ""  # why its description could not be read (state "unreadable"); empty when it could


def list_episodes(output_dir: str | Path) -> list[EpisodeListing]:
    """The episodes of an output directory, by number; one whose description cannot be parsed is listed with
    state ``unreadable`` and the reason in ``error``.

    Raises:
        RecordingError: ``output_dir`` is not a directory, or is an episode itself.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise RecordingError(f"{output_dir} is not a directory")
    if any(output_dir.glob("*.mcap")):
        raise RecordingError(f"{output_dir} is an episode, not an output directory of episodes: "
                             f"`rynn-teleop episodes info {output_dir}` describes it")
    out = []
    for path in episode_dirs(output_dir):
        try:
            doc = episode_doc(path)
            meta = read_metadata(path)
        except RecordingError as exc:
            out.append(EpisodeListing(path, "unreadable", "", "", None, None, None, str(exc)))
            continue
        start, stop = doc.get("start_ns"), doc.get("stop_ns")
        problems = doc.get("problems")
        out.append(
            EpisodeListing(
                path=path,
                state=str(doc.get("state") or ("unknown" if meta else "recording")),
                task=str(doc.get("task", "")),
                operator=str(doc.get("operator", "")),
                duration_s=(stop - start) * 1e-9 if start is not None and stop is not None else None,
                message_count=int(meta["message_count"]) if meta else None,
                problem_count=len(problems) if isinstance(problems, list) else None,
            )
        )
    return out


# -- decoding --------------------------------------------------------------------------------


def _messages(path: Path, topics: Sequence[str], type_name: str) -> Iterator[tuple[str, int, Any]]:
    """(topic, receive time [ns], decoded message) of the given topics of one type, in time order."""
    typestore = default_typestore()
    try:
        with Reader(path) as reader:
            conns = [c for c in reader.connections if c.topic in topics and c.msgtype == type_name]
            for conn, t, data in reader.messages(connections=conns) if conns else ():
                yield conn.topic, int(t), typestore.deserialize_cdr(data, type_name)
    except RecordingError:
        raise
    except Exception as exc:  # rosbags raises its own errors for a bag it cannot read
        raise EpisodeDataError(f"cannot read {path}: {exc}; `rynn-teleop episodes check {path}` verifies it",
                               episode=path) from exc


def image_to_bgr(msg: Any) -> np.ndarray:
    """A ``sensor_msgs/Image`` as an (H, W, 3) uint8 BGR array for the preview (decoded like the replay camera).

    Depth images (16UC1, mono16, 32FC1) are scaled so that their largest value is white.

    Raises:
        RecordingError: another encoding, or data too short for the declared size.
    """
    depth = str(msg.encoding) in DEPTH_ENCODINGS
    try:
        image = decode_image(msg, depth=depth)
    except ValueError as exc:
        raise EpisodeDataError(f"cannot preview image: {exc}") from exc
    if depth:
        peak = float(image.max()) or 1.0
        return cv2.cvtColor((image.astype(np.float32) * (255.0 / peak)).astype(np.uint8), cv2.COLOR_GRAY2BGR)
    return np.ascontiguousarray(image[..., ::-1])


# -- joint plot ------------------------------------------------------------------------------

_COMMAND_COLOUR = (40, 40, 220)  # BGR: red
_MEASURED_COLOUR = (200, 120, 0)  # BGR: blue


def _series(
    path: Path, topics: Sequence[str]
) -> tuple[list[str], dict[str, tuple[list[int], list[float]]]]:
    """Joint names in order of first appearance, and joint -> (receive times [ns], positions) of the topics."""
    names: list[str] = []
    out: dict[str, tuple[list[int], list[float]]] = {}
    for _, t, msg in _messages(path, topics, JOINT_STATE_TYPE):
        for name, pos in zip(msg.name, np.asarray(msg.position, dtype=float)):
            if name not in out:
                names.append(name)
                out[name] = ([], [])
            out[name][0].append(t)
            out[name][1].append(float(pos))
    return names, out


def plot_joints(
    path: str | Path,
    png: str | Path,
    *,
    command_topics: Sequence[str] = COMMAND_TOPICS,
    measured_topic: str = MEASURED_TOPIC,
    panel_size: tuple[int, int] = (300, 110),
    columns: int = 6,
) -> int:
    """Draw commanded (red) and measured (blue) position of every joint over receive time into a PNG.

    One panel per joint (commanded joints first, in the order they appear), each
    scaled to its own range; the time axis [s since the first message plotted] is
    shared.

    Args:
        path: the episode (bag) directory.
        png: the image file to write.
        panel_size: (width, height) of one joint's panel [px].
        columns: panels per row.

    Returns:
        The number of joints drawn.

    Raises:
        RecordingError: the bag cannot be read, holds none of these topics, or the PNG cannot be written.
    """
    path = Path(path)
    partial = partial_file(png)  # refused here, before the bag is read, if it cannot be written
    try:
        joints = _draw_joints(path, partial, command_topics, measured_topic, panel_size, columns)
        os.replace(partial, png)
    finally:
        partial.unlink(missing_ok=True)
    return joints


def partial_file(target: str | Path) -> Path:
    """A new file beside ``target`` (same suffix) to write into and rename to it when complete.

    Raises:
        RecordingError: the folder of ``target`` does not exist or cannot be written (named).
    """
    target = Path(target)
    partial = target.with_name(f".{target.stem}.partial-{os.getpid()}{target.suffix}")
    try:
        partial.touch()
    except OSError as exc:
        raise RecordingError(f"cannot write {target}: {exc.strerror or exc}") from exc
    return partial


def _draw_joints(path: Path, png: Path, command_topics: Sequence[str], measured_topic: str,
                 panel_size: tuple[int, int], columns: int) -> int:
    """:func:`plot_joints` into ``png``."""
    cmd_names, cmd = _series(path, command_topics)
    meas_names, meas = _series(path, [measured_topic])
    joints = cmd_names + [n for n in meas_names if n not in cmd]
    if not joints:
        raise RecordingError(f"{path}: no JointState on {', '.join([*command_topics, measured_topic])}")
    t_all = [t for s in (cmd, meas) for ts, _ in s.values() for t in (ts[0], ts[-1])]
    t0, t1 = min(t_all), max(t_all)
    span = max(t1 - t0, 1)
    pw, ph = panel_size
    rows = math.ceil(len(joints) / columns)
    header = 36
    canvas = np.full((header + rows * ph, columns * pw, 3), 255, np.uint8)
    font = cv2.FONT_HERSHEY_SIMPLEX
    title = f"{path.name}: commanded (red) vs measured (blue) joint position, {span * 1e-9:.2f} s"
    cv2.putText(canvas, title, (8, 24), font, 0.6, (0, 0, 0), 1, cv2.LINE_AA)
    for k, name in enumerate(joints):
        x0, y0 = (k % columns) * pw, header + (k // columns) * ph
        left, right, top, bottom = x0 + 6, x0 + pw - 6, y0 + 16, y0 + ph - 6
        cv2.rectangle(canvas, (left, top), (right, bottom), (200, 200, 200), 1)
        values = [v for s in (cmd, meas) if name in s for v in s[name][1]]
        lo, hi = min(values), max(values)
        if hi - lo < 1e-6:
            lo, hi = lo - 0.5, hi + 0.5
        cv2.putText(canvas, f"{name} [{lo:.2f}, {hi:.2f}]", (left, y0 + 12), font, 0.33, (0, 0, 0), 1, cv2.LINE_AA)
        for series, colour in ((meas, _MEASURED_COLOUR), (cmd, _COMMAND_COLOUR)):
            if name not in series:
                continue
            ts, vs = np.asarray(series[name][0], np.int64), np.asarray(series[name][1], float)
            step = max(1, len(ts) // (2 * (right - left)))  # about two points per pixel column
            xs = left + (ts[::step] - t0) / span * (right - left)
            ys = bottom - (vs[::step] - lo) / (hi - lo) * (bottom - top)
            pts = np.stack([xs, ys], axis=1).round().astype(np.int32).reshape(-1, 1, 2)
            cv2.polylines(canvas, [pts], False, colour, 1, cv2.LINE_AA)
    if not cv2.imwrite(str(png), canvas):
        raise RecordingError(f"cannot write {png}")
    return len(joints)


# -- camera preview --------------------------------------------------------------------------


def image_topics(path: str | Path) -> list[str]:
    """The ``sensor_msgs/Image`` topics of a closed bag, sorted.

    Raises:
        RecordingError: the bag has no readable index.
    """
    return sorted(t for t, (ty, _) in _topic_times(Path(path)).items() if IMAGE_TYPE in ty.split(", "))


def video_preview(path: str | Path, mp4: str | Path, *, topic: str | None = None, max_width: int = 640) -> int:
    """Write an MP4 (``mp4v``) of an Image topic at its measured rate, with the receive time printed on it.

    Args:
        path: the episode (bag) directory.
        mp4: the video file to write.
        topic: the Image topic (default: ``/head_camera/color/image_raw`` if recorded,
            else the first Image topic).
        max_width: frames wider than this are scaled down [px].

    Returns:
        The number of frames written.

    Raises:
        RecordingError: no Image topic, an encoding that cannot be shown, or the video
            cannot be written.
    """
    path = Path(path)
    times = _topic_times(path)
    candidates = [t for t, (ty, _) in times.items() if IMAGE_TYPE in ty.split(", ")]
    if topic is None:
        topic = CAMERA_TOPIC if CAMERA_TOPIC in candidates else (sorted(candidates) or [None])[0]
    if topic is None or topic not in candidates:
        raise RecordingError(
            f"{path}: no {IMAGE_TYPE} topic {topic or ''} to preview (found: {', '.join(candidates) or 'none'})"
        )
    stamps = times[topic][1]
    fps = (len(stamps) - 1) / ((stamps[-1] - stamps[0]) * 1e-9) if len(stamps) > 1 and stamps[-1] > stamps[0] else 30.0
    partial = partial_file(mp4)  # refused here, before any frame is decoded, if it cannot be written
    try:
        frames = _write_preview(path, partial, topic, stamps, fps, max_width)
        os.replace(partial, mp4)
    finally:
        partial.unlink(missing_ok=True)
    return frames


def _write_preview(path: Path, mp4: Path, topic: str, stamps: np.ndarray, fps: float, max_width: int) -> int:
    """:func:`video_preview` into ``mp4``."""
    writer: cv2.VideoWriter | None = None
    size: tuple[int, int] = (0, 0)
    frames = 0
    t0 = int(stamps[0]) if len(stamps) else 0
    try:
        for _, t, msg in _messages(path, [topic], IMAGE_TYPE):
            img = image_to_bgr(msg)
            if writer is None:
                h, w = img.shape[:2]
                scale = min(1.0, max_width / w)
                size = (max(2, int(w * scale)) // 2 * 2, max(2, int(h * scale)) // 2 * 2)
                writer = cv2.VideoWriter(str(mp4), cv2.VideoWriter_fourcc(*"mp4v"), float(fps), size)
                if not writer.isOpened():
                    raise RecordingError(f"cannot write video {mp4}")
            if img.shape[1] != size[0] or img.shape[0] != size[1]:
                img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
            cv2.putText(img, f"{topic}  t={(t - t0) * 1e-9:7.3f} s", (8, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.5,
                        (255, 255, 255), 1, cv2.LINE_AA)
            writer.write(img)
            frames += 1
    finally:
        if writer is not None:
            writer.release()
    return frames


# -- command line ----------------------------------------------------------------------------


def episodes_at(path: str | Path) -> list[Path]:
    """``path`` as episode directories: itself if it holds an MCAP file, else its numbered episodes.

    Raises:
        RecordingError: neither (named).
    """
    path = Path(path)
    if not path.is_dir():
        raise RecordingError(f"{path} is not a directory")
    if any(path.glob("*.mcap")):
        return [path]
    found = episode_dirs(path)
    if not found:
        raise RecordingError(f"{path} is neither an episode (no *.mcap) nor a directory of episode_NNNN folders")
    return found


def _rates(items: Sequence[str]) -> dict[str, float]:
    """``--rate TOPIC=HZ`` arguments -> {topic: rate [Hz]}."""
    try:
        return parse_topic_rates(items)
    except ValueError as exc:
        raise RecordingError(f"--rate {exc}") from exc


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_info(info: EpisodeInfo) -> None:
    doc = info.doc
    print(f"{info.path}")
    print(f"  state {info.state}   task {doc.get('task', '')!r}   operator {doc.get('operator', '')!r}")
    if doc.get("notes"):
        print(f"  notes {doc['notes']!r}")
    if doc.get("camera_sources"):
        print(f"  camera sources {', '.join(doc['camera_sources'])}")
    if info.stats is not None:
        s = info.stats
        print(f"  duration {s.duration_s:.3f} s   messages {s.message_count}")
        print(f"  {'topic':<40} {'received':>9} {'expected':>9} {'dropped':>8} {'rate Hz':>9} {'gaps':>5} "
              f"{'longest gap s':>14}  type")
        for name, t in s.topics.items():
            longest = max((g.duration_s for g in t.gaps), default=None)
            print(
                f"  {name:<40} {t.received:>9} {_fmt(t.expected, 'd'):>9} {t.dropped:>8} "
                f"{_fmt(t.rate_hz, '.2f'):>9} {len(t.gaps):>5} {_fmt(longest, '.3f'):>14}  {t.type_name}"
            )
        for name in s.missing:
            print(f"  {name:<40} {0:>9} {'':>9} {'':>8} {'':>9} {'':>5} {'':>14}  (never received)")
    print("  problems: none" if info.ok else "  problems:\n" + "\n".join(f"    - {p}" for p in info.problems))


def _cmd_list(args: argparse.Namespace) -> int:
    rows = list_episodes(args.dir)
    if not rows:
        print(f"no episodes in {args.dir}")
        return 0
    print(f"{'episode':<16} {'state':<10} {'duration s':>10} {'messages':>9} {'problems':>9}  task / operator")
    for r in rows:
        problems = "-" if r.problem_count is None else str(r.problem_count)
        print(
            f"{r.path.name:<16} {r.state:<10} {_fmt(r.duration_s, '.3f'):>10} {_fmt(r.message_count, 'd'):>9} "
            f"{problems:>9}  " + (r.error if r.error else f"{r.task} / {r.operator}")
        )
    return 1 if any(r.error for r in rows) else 0


def _cmd_info(args: argparse.Namespace) -> int:
    paths = episodes_at(args.path)
    if (args.plot or args.video) and len(paths) != 1:
        raise RecordingError("--plot and --video need a single episode directory")
    infos = [episode_info(p, _rates(args.rate)) for p in paths]
    if args.json:
        print(json.dumps([i.to_dict() for i in infos] if len(infos) > 1 else infos[0].to_dict(), indent=2))
    else:
        for info in infos:
            _print_info(info)
    if args.plot:
        n = plot_joints(paths[0], args.plot)
        print(f"wrote {args.plot} ({n} joints)", file=sys.stderr if args.json else sys.stdout)
    if args.video:
        n = video_preview(paths[0], args.video, topic=args.camera_topic)
        print(f"wrote {args.video} ({n} frames)", file=sys.stderr if args.json else sys.stdout)
    return 1 if any(i.unreadable for i in infos) else 0  # a closed bag that cannot be read: its data is at fault


def _proof(report: IntegrityReport) -> str:
    """What the verification proved, in words."""
    parts = [f"{report.crc_chunks} chunk CRC(s)" + (f", {report.plain_chunks} chunk(s) without CRC"
                                                   if report.plain_chunks else "")]
    crc = {"ok": "data-section CRC ok", "absent": "no data-section CRC"}
    parts.append(crc.get(report.data_crc, f"data-section CRC {report.data_crc}"))
    parts.append(f"{report.decoded} message(s) decoded")
    return ", ".join(parts)


def _cmd_check(args: argparse.Namespace) -> int:
    bad = 0
    rates = _rates(args.rate)
    for path in episodes_at(args.path):
        try:
            info = episode_info(path, rates, verify=not args.quick)
        except EpisodeDataError as exc:  # not an MCAP file, an unreadable description: this episode only
            bad += 1
            print(f"{path}: DAMAGED, {str(exc).removeprefix(f'{path}: ')}")
            continue
        report = info.integrity
        if info.ok:
            print(f"{path}: ok (" + (_proof(report) if report is not None else "statistics only, --quick") + ")")
            continue
        bad += 1
        if info.damaged:
            assert report is not None
            print(f"{path}: DAMAGED, {report.reason().removeprefix('damaged: ')}")
            print("\n".join(f"  ! {line}" for line in report.lines(info.doc.get("start_ns"))))
            print(f"  `rynn-teleop episodes recover {path}` salvages the intact part into a new episode")
        if info.problems:
            print(f"{path}: {len(info.problems)} problem(s)\n" + "\n".join(f"  - {p}" for p in info.problems))
        if report is not None:
            for note in report.notes:
                print(f"  note: {note}")
    return 1 if bad else 0


def _cmd_recover(args: argparse.Namespace) -> int:
    paths = episodes_at(args.path)
    if args.out is not None and len(paths) != 1:
        raise RecordingError("--out needs a single episode directory")
    for path in paths:
        r = recover_bag(path, force=args.force, out=args.out)
        if r.salvaged_from is not None:
            lost = sum(r.lost.values())
            print(f"{path}: salvaged {r.message_count} message(s) into {r.bag_dir} ({lost} lost; {path} is unchanged)")
            print("\n".join(f"  ! {line}" for line in r.damage))
            continue
        what = "was complete; metadata rewritten" if r.was_complete else f"cut {r.bytes_cut} bytes of incomplete data"
        print(f"{path}: {r.message_count} messages, {what}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import IDLE_TOLERANCE_RAD, export_lerobot, parse_image_size  # PyAV, pyarrow: only for an export
    from .lerobot import VideoOptions

    paths = [p for path in args.paths for p in episodes_at(path)]
    try:
        if args.lossless:
            given = [f for f, v in (("--codec", args.codec), ("--crf", args.crf), ("--pix-fmt", args.pix_fmt))
                     if v is not None]
            if given:
                raise ValueError(f"--lossless sets the codec, CRF and pixel format; drop {', '.join(given)}")
            video = VideoOptions.lossless(gop=args.gop)
        else:
            video = VideoOptions(codec=args.codec or "libx264", crf=23 if args.crf is None else args.crf, gop=args.gop,
                                 preset=args.preset or None, pix_fmt=args.pix_fmt or "yuv420p")
        image_size = parse_image_size(args.image_size) if args.image_size else None
    except ValueError as exc:
        raise RecordingError(f"export: {exc}") from exc
    report = export_lerobot(
        paths, args.out, args.repo_id, fps=args.fps, images=args.image or ["consumer"], video=video,
        include_problems=args.include_problems, append=args.append, overwrite=args.overwrite, workers=args.workers,
        depth=args.depth, depth_max_m=args.depth_max_m, skip_damaged=args.skip_damaged, image_size=image_size,
        trim_idle_start=IDLE_TOLERANCE_RAD if args.trim_idle_start == -1.0 else args.trim_idle_start,
    )
    for s in report.skipped:
        if s.damaged:
            print(f"{s.source}: skipped, {s.problems[0]}")
            continue
        print(f"{s.source}: skipped, {len(s.problems)} problem(s) (--include-problems exports it)\n"
              + "\n".join(f"  - {p}" for p in s.problems))
    for e in report.episodes:
        leading = e.dropped_leading_frames
        notes = ([f"{leading} leading frames before every joint had a value"] if leading else []) + \
            ([f"{e.trimmed_idle_frames} idle frames before the arms moved left out"] if e.trimmed_idle_frames else [])
        print(f"{e.source}: episode {e.episode_index}, {e.frames} frames" + (f" ({'; '.join(notes)})" if notes else ""))
    print(f"wrote {args.out}: {len(report.episodes)} episode(s), {report.total_frames} frames, "
          f"{report.recorded_seconds:.1f} s of recording in {report.seconds:.1f} s ({report.speed:.1f}x real time)")
    return 0 if report.episodes else 1


def build_parser(prog: str = "rynn-teleop episodes") -> argparse.ArgumentParser:
    """The argument parser of :func:`episodes_main`."""
    parser = argparse.ArgumentParser(prog=prog, description="Recorded episodes: list, info, check, recover.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="one line per episode of an output directory")
    p.add_argument("dir", type=Path)
    p.set_defaults(func=_cmd_list)
    rate_help = "expected rate of a topic (gap detection), overrides the recorded configuration; repeatable"
    p = sub.add_parser("info", help="per-topic counts, rates, gaps and duration (from the index; exit 1 if it "
                       "cannot be read); optional plot and preview")
    p.add_argument("path", type=Path, help="an episode directory, or an output directory of episodes")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="commanded vs measured joint positions")
    p.add_argument("--video", type=Path, metavar="FILE.mp4", help="MP4 preview of a camera Image topic")
    p.add_argument("--camera-topic",
                   help=f"Image topic of the preview (default {CAMERA_TOPIC} or the first Image topic)")
    p.add_argument("--rate", action="append", default=[], metavar="TOPIC=HZ", help=rate_help)
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("check", help="verify each episode's file (CRCs, every message decoded, stamps) and exit 1 "
                       "if one is damaged, has gaps, missing topics, drops or was not closed")
    p.add_argument("path", type=Path, help="an episode directory, or an output directory of episodes")
    p.add_argument("--quick", action="store_true", help="statistics only, from the index (no CRCs, no decoding: "
                   "fast on large corpora, but blind to damage)")
    p.add_argument("--rate", action="append", default=[], metavar="TOPIC=HZ", help=rate_help)
    p.set_defaults(func=_cmd_check)
    p = sub.add_parser("recover", help="rebuild index and metadata.yaml of a bag whose recorder was killed; salvage "
                       "a damaged one's intact chunks into a new episode (the damaged one is left as it is)")
    p.add_argument("path", type=Path, help="an episode directory, or an output directory of episodes")
    p.add_argument("--force", action="store_true", help="even if the recorder that started it still runs on this host")
    p.add_argument("--out", type=Path, help="write the recovered episode to this new directory and leave PATH "
                   "unchanged (default: repair a killed recorder's bag in place; a damaged one goes to the next "
                   "episode_NNNN beside it)")
    p.set_defaults(func=_cmd_recover)
    p = sub.add_parser("export", help="write episodes as a LeRobot dataset (format v3.0) for policy training")
    p.add_argument("paths", type=Path, nargs="+", metavar="EPISODE_DIRS",
                   help="episode directories, or output directories of episodes")
    p.add_argument("--format", choices=["lerobot"], default="lerobot", help="dataset format (default lerobot)")
    p.add_argument("--out", type=Path, required=True, help="the dataset folder to create")
    p.add_argument("--repo-id", required=True, help="the dataset's name, e.g. lab/pick_place (LeRobot repo_id)")
    p.add_argument("--fps", type=int, default=30, help="frame rate of the first camera key [Hz] (default 30)")
    p.add_argument("--image", action="append", choices=["physical", "generated", "consumer"],
                   help="camera key (feed), repeatable; the first one's frames are the rows (default consumer)")
    p.add_argument("--depth", choices=["physical", "consumer"],
                   help="add that feed's aligned depth as the key <feed>_depth (12-bit HEVC, linear over "
                        "0..--depth-max-m; off by default)")
    p.add_argument("--depth-max-m", type=float, default=2.0,
                   help="depth at the largest depth value [m] (default 2.0: 2.0/255 m steps as LeRobot decodes "
                        "it, 2.0/4080 m in the stream)")
    p.add_argument("--image-size", metavar="WxH", help="resize every colour camera key to W x H pixels before "
                   "encoding (e.g. 96x72; the policy node resizes its observations the same way); not with --depth")
    p.add_argument("--trim-idle-start", type=float, nargs="?", const=-1.0, metavar="RAD",
                   help="leave out each episode's frames before its arms first move more than RAD from where they "
                        "started (RAD defaults to IDLE_TOLERANCE_RAD, 0.05 rad; the last frame at rest is kept): "
                        "an operator's wait teaches a policy to stay at rest")
    p.add_argument("--codec", help="video encoder (default libx264; libsvtav1 as LeRobot's default)")
    p.add_argument("--crf", type=int, help="constant rate factor, lower is better quality (default 23)")
    p.add_argument("--pix-fmt", help="pixel format of the colour streams (default yuv420p)")
    p.add_argument("--lossless", action="store_true", help="encode so that LeRobot's reader returns exactly the "
                   "recorded pixels: libx264rgb, CRF 0, rgb24 (larger files than the lossy default)")
    p.add_argument("--gop", type=int, default=2, help="frames between key frames (default 2)")
    p.add_argument("--preset", default="veryfast", help="encoder speed preset (default veryfast; '' for the encoder's)")
    p.add_argument("--workers", type=int, help="episodes converted at once (default: one per CPU)")
    p.add_argument("--include-problems", action="store_true", help="export episodes whose check fails too")
    p.add_argument("--skip-damaged", action="store_true", help="leave out an episode whose file is damaged (one "
                   "line says why) instead of stopping the export")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--append", action="store_true", help="add to an existing dataset (indices continue)")
    mode.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    p.set_defaults(func=_cmd_export)
    p = sub.add_parser("replay", help="send the episode's arm and hand commands through the drivers again (a fresh "
                       "twin with --twin, which judges the task; else the drivers running), after a slow approach to "
                       "the first command; an e-stop or Ctrl-C stops it")
    add_replay_arguments(p)
    p.set_defaults(func=None)
    return parser


def episodes_main(argv: Sequence[str] | None = None, *, replay: Any = None) -> int:
    """``rynn-teleop episodes ...``; returns the exit code (0 ok, 1 the data: damaged, unreadable or failing its
    check, 2 the request: bad arguments, missing paths, unwritable output).

    ``replay``: what runs ``episodes replay`` (parsed arguments -> exit code): it needs ROS, a layer above this
    one (``rynn_teleop.replay.main``, which ``rynn-teleop`` passes).
    """
    args = build_parser().parse_args(argv)
    func = args.func
    if func is None:  # replay
        if replay is None:
            print("error: episodes replay needs ROS 2 (rclpy): run it as `rynn-teleop episodes replay`",
                  file=sys.stderr)
            return USAGE_EXIT_CODE
        func = replay
    try:
        return int(func(args))
    except RynnTeleopError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", USAGE_EXIT_CODE))
    except OSError as exc:  # a folder or file the system refuses (permissions, read-only, gone meanwhile)
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return USAGE_EXIT_CODE
