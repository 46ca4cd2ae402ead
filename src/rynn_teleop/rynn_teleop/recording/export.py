"""Recorded episodes as LeRobot datasets (format v3.0) for policy training (ROS-free).

:func:`export_lerobot` turns episode directories (rosbag2 MCAP + ``episode.yaml``) into one LeRobot dataset
(layout: :mod:`rynn_teleop.recording.lerobot`); ``rynn-teleop episodes export`` is its command line.
One row per frame of the first camera key (``images[0]``), in header-stamp order; every other column holds the
newest value stamped at or before the row's stamp: ``observation.images.<key>`` per key of ``images``
(:data:`FEED_TOPICS`; resized to ``image_size`` when given); with ``depth``,
``observation.images.<depth>_depth`` (12-bit grey video of depth over 0..``depth_max_m``,
:func:`.lerobot.depth_video_feature`); ``observation.state``, the 54 measured joints [rad]; ``action``, the 54
commanded joints [rad] (a generated frame has its command's exact stamp); ``timestamp`` = ``frame_index/fps``
[s], LeRobot's indices, and ``stamp_ns`` (the frame's header stamp [ns]). Rows before every column has a value
are left out (counted). Episodes are converted in parallel, one process each. An episode lacking a needed topic,
or whose first camera key does not run at ``fps``, stops the export with an :class:`ExportError` and nothing is
written; one whose integrity check fails is skipped unless ``include_problems``. A *damaged* episode (its MCAP
file fails :func:`.recover.require_intact`: CRCs, structure) stops the export too, with one line naming it and
the damage, or is skipped with that line (``skip_damaged``). The output folder is created (as a staging sibling)
before any episode is read, so one that cannot be created or written is refused first; the dataset is moved into
place at the end.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..core.image import resize_rgb
from ..core.robot_model import CANONICAL_JOINT_NAMES
from .errors import DATA_EXIT_CODE, USAGE_EXIT_CODE, DamagedEpisodeError
from .frames import (
    COMMAND_TOPICS,
    FEED_TOPICS,
    IMAGE,
    MEASURED_TOPIC,
    Bag,
    EpisodeDataError,
    JointStateReader,
    JointTrack,
    episode_problems,
    missing_command_topic,
    read_images,
    scan_episode,
)
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
from .recover import require_intact
from .writer import default_typestore

DEPTH_TOPICS: dict[str, str] = {
    "physical": "/head_camera/physical/aligned_depth_to_color/image_raw",
    "consumer": "/head_camera/aligned_depth_to_color/image_raw",
}
"""Depth feed -> the recorded ``sensor_msgs/Image`` topic of its depth registered to the colour image
(16UC1 [mm], also mono16 or 32FC1 [m]). The generated feed has no depth; the consumer feed carries it
while the physical source is active."""
DEPTH_MAX_M = 2.0
"""Default depth at the largest depth code [m]: a head camera looking at a table 0.5-1.5 m away."""
ROBOT_TYPE = "rynn_m6_wuji"
"""``robot_type`` written to ``info.json``."""
RATE_TOLERANCE = 0.10
"""A first camera key whose rate (from its median frame interval) differs from ``fps`` by more than this
fraction stops the export."""
IDLE_TOLERANCE_RAD = 0.05
"""Default ``trim_idle_start`` [rad]: the arms have started once a joint's command is this far from the
episode's first command (3 degrees: above a tracker's jitter at rest, below any reach)."""
ARM_COLUMNS = np.array([i for i, n in enumerate(CANONICAL_JOINT_NAMES) if "_arm_" in n], np.intp)
"""Columns of the 54-D action that are arm joints: the joints whose motion starts a demonstration (a glove's
hand joints jitter by tenths of a radian at rest)."""
EXTRA_PREFIX = "rynn_teleop/"
"""Prefix of this stack's columns in the episodes metadata file."""


class ExportError(EpisodeDataError):
    """An export cannot be done as asked.

    Attributes:
        episode: the episode directory it is about (None: the export as a whole).
        topic: the topic it is about, or None.
        exit_code: 1 (an episode's data is at fault) when about an episode, else 2 (the arguments or the
            output folder).
    """

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return DATA_EXIT_CODE if self.episode is not None else USAGE_EXIT_CODE


@dataclass(frozen=True)
class ExportedEpisode:
    """One episode written to the dataset."""

    source: Path  # the episode directory
    episode_index: int  # its index in the dataset
    frames: int  # rows (= frames of every video stream)
    dropped_leading_frames: int  # first-key frames before every joint and key had a value
    exact_action_frames: int  # rows whose stamp equals a command's stamp (every generated frame)
    problems: tuple[str, ...] = ()  # check problems (only with include_problems)
    trimmed_idle_frames: int = 0  # rows left out before the arms first moved (``trim_idle_start``)


@dataclass(frozen=True)
class SkippedEpisode:
    """An episode left out because its integrity check failed, or (``damaged``) because its file is damaged."""

    source: Path
    problems: tuple[str, ...]
    damaged: bool = False  # left out by ``skip_damaged``: ``problems`` holds the one-line reason


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
                 "dropped_leading_frames": e.dropped_leading_frames, "trimmed_idle_frames": e.trimmed_idle_frames,
                 "exact_action_frames": e.exact_action_frames,
                 "problems": list(e.problems)}
                for e in self.episodes
            ],
            "skipped": [{"source": str(s.source), "problems": list(s.problems), "damaged": s.damaged}
                        for s in self.skipped],
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
    skip_damaged: bool = False
    image_size: tuple[int, int] | None = None  # (width, height) [px] of every colour key, or None: as recorded
    trim_idle_start: float | None = None  # [rad] see export_lerobot, or None: every row


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
    trimmed: int  # rows left out before the arms first moved
    exact_action: int
    source_changes: list[dict[str, Any]]


@dataclass
class _Skipped:
    source: Path
    position: int
    problems: tuple[str, ...]
    damaged: bool = False


# the episode reading shared with the world-model dataset (.frames), under this module's former names
_Bag = Bag
_JointTrack = JointTrack
_JointStateReader = JointStateReader
_episode_problems = episode_problems
_missing_command_topic = missing_command_topic


def _convert(job: _Job) -> _Converted | _Skipped:
    """Convert one episode: check it, read the joints, choose the rows, encode every camera key.

    Raises:
        ExportError: as :func:`export_lerobot` says (errors of the shared reader :mod:`.frames` included).
    """
    try:
        return _convert_episode(job)
    except ExportError:
        raise
    except EpisodeDataError as exc:
        raise ExportError(str(exc), episode=exc.episode or job.source, topic=exc.topic) from exc


def _convert_episode(job: _Job) -> _Converted | _Skipped:
    path = job.source
    doc = episode_doc(path)
    if read_metadata(path) is None:
        problems = [
            f"not closed (no metadata.yaml): still being recorded, or run `rynn-teleop episodes recover {path}`"
        ]
        if job.include_problems:
            raise ExportError(f"{path}: {problems[0]}", episode=path)
        return _Skipped(path, job.position, tuple(problems))
    try:
        require_intact(path, doc=doc)
    except DamagedEpisodeError as exc:
        if not job.skip_damaged:
            raise ExportError(f"{exc} (--skip-damaged leaves it out)", episode=path) from exc
        return _Skipped(path, job.position, (str(exc).removeprefix(f"{path}: "),), damaged=True)
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
    scan = scan_episode(path, bag, typestore)  # one pass: the check's times and stamps, joints, frame stamps
    measured, commanded, command_stamps, sources = scan.measured, scan.commanded, scan.command_stamps, scan.sources
    stamps = scan.stamps
    problems = scan.problems(doc)
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
    dropped = int(len(rows_ns) - len(rows))
    trimmed = 0 if job.trim_idle_start is None else idle_start_rows(action[rows], job.trim_idle_start)
    rows = rows[trimmed:]

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
        dropped=dropped,
        trimmed=trimmed,
        exact_action=int(sum(1 for t in rows_ns[rows] if int(t) in command_stamps)),
        source_changes=changes,
    )


def idle_start_rows(action: np.ndarray, tolerance: float = IDLE_TOLERANCE_RAD) -> int:
    """Rows of an episode's idle start: those before the last row at which every arm joint's command is still
    within ``tolerance`` [rad] of the first row's.

    ``action`` is (rows, 54) [rad] in :data:`CANONICAL_JOINT_NAMES` order. The row returned is kept: the
    first exported observation is the robot at rest, with the motion beginning in its action and the actions
    after it. 0 when the first row already moves, or when the arms never move (nothing is left out: an
    episode that is all rest is the operator's to judge).
    """
    arms = np.asarray(action, np.float64)[:, ARM_COLUMNS]
    moved = np.abs(arms - arms[0]).max(axis=1) > float(tolerance)
    if not moved.any():
        return 0
    return max(int(np.argmax(moved)) - 1, 0)


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

    Returns (height, width, codec) of the video written.

    With ``depth_max_m`` the topic holds depth images, written as 12-bit codes (:func:`.lerobot.quantize_depth`)
    with ``job.depth_video``; otherwise colour images, written with ``job.video``, each resized to
    ``job.image_size`` first (:func:`rynn_teleop.core.image.resize_rgb`) when that is set: the video and the
    image statistics hold the resized frames.
    """
    path = bag.path.parent
    transform = None if depth_max_m is None else partial(quantize_depth, depth_max_m=depth_max_m)
    frames = read_images(bag, topic, sel, typestore, depth=depth_max_m is not None, transform=transform)
    writer: VideoWriter | None = None
    sampler: ImageStatsSampler | None = None
    resize = job.image_size if depth_max_m is None else None
    first_shape: tuple[int, ...] = ()
    try:
        for nxt, frame in enumerate(frames):
            if writer is None:
                first_shape = frame.shape[:2]
                h, w = first_shape if resize is None else (resize[1], resize[0])
                if depth_max_m is None:
                    options = job.video
                else:
                    options = job.depth_video or depth_video_options(job.video.gop)
                try:
                    writer = VideoWriter(target, width=w, height=h, fps=job.fps, options=options)
                except ValueError as exc:
                    raise ExportError(f"{path}: {topic}: {exc}", episode=path, topic=topic) from exc
                sampler = ImageStatsSampler(len(sel), h, w)
            if frame.shape[:2] != first_shape:
                raise ExportError(f"{path}: {topic}: frame {nxt} is {frame.shape[1]}x{frame.shape[0]}, "
                                  f"the first was {first_shape[1]}x{first_shape[0]}", episode=path, topic=topic)
            if resize is not None:
                frame = resize_rgb(frame, resize[1], resize[0])
            writer.write(frame)
            assert sampler is not None
            sampler.offer(nxt, frame if depth_max_m is None else depth_codes_to_rgb(frame))
        if writer is None:
            raise ExportError(f"{path}: {topic}: {len(sel)} frame(s) could not be read back",
                              episode=path, topic=topic)
        writer.close()
    except BaseException:
        frames.close()
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
        features[f"observation.images.{key}"] = video_feature(h, w, fps, _codec_name(codec), video.stream_pix_fmt)
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
    return {"libx264": "h264", "libx264rgb": "h264", "libopenh264": "h264", "libx265": "hevc", "libsvtav1": "av1",
            "libaom-av1": "av1", "librav1e": "av1", "libvpx-vp9": "vp9"}.get(encoder, encoder)


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


MAX_IMAGE_SIDE = 8192
"""Largest ``image_size`` side [px]."""


def parse_image_size(text: str) -> tuple[int, int]:
    """``WxH`` (e.g. ``96x72``) as (width, height) [px] (``--image-size``).

    Raises:
        ValueError: not two positive integers joined by ``x``.
    """
    parts = text.lower().split("x")
    try:
        width, height = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"image size {text!r}: give WIDTHxHEIGHT in pixels, e.g. 96x72") from None
    if width < 1 or height < 1:
        raise ValueError(f"image size {text!r}: width and height must be positive")
    return width, height


def _check_image_size(size: Sequence[int], video: VideoOptions) -> tuple[int, int]:
    """``size`` as (width, height) after checking it against the bounds and the stream's pixel format.

    Raises:
        ExportError: not two integers in 1..MAX_IMAGE_SIDE, or odd for a 4:2:0 ``video.pix_fmt``.
    """
    try:
        width, height = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ExportError(f"image size {size!r}: give (width, height) in pixels") from None
    if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
        raise ExportError(f"image size {width}x{height} is outside 1..{MAX_IMAGE_SIDE} px per side")
    if video.pix_fmt.startswith("yuv420") and (width % 2 or height % 2):
        raise ExportError(f"image size {width}x{height}: {video.pix_fmt} needs an even width and height")
    return width, height


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
    skip_damaged: bool = False,
    image_size: tuple[int, int] | None = None,
    trim_idle_start: float | None = None,
) -> ExportReport:
    """Export episode directories as one LeRobot (v3.0) dataset at ``out``.

    Args:
        episodes: episode (bag) directories, in the order they get episode indices.
        out: the dataset root to create (or extend with ``append``).
        repo_id: the dataset's name (``user/name``; LeRobot's ``repo_id``).
        fps: the dataset's frame rate [Hz]: the rate of the first camera key (checked).
        images: camera keys, each of ``physical``, ``generated``, ``consumer``; the first
            one's frames are the rows.
        video: codec options (default :class:`VideoOptions`: H.264, CRF 23, key frame every 2 frames;
            :meth:`VideoOptions.lossless`: LeRobot's reader returns exactly the pixels written).
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
            linearly over 0..depth_max_m, farther depth is stored as depth_max_m. The 8-bit RGB a LeRobot
            reader (0.4; 0.6.1) decodes holds depth / depth_max_m in [0, 1] (steps of depth_max_m / 255; 0: no reading);
            the 12-bit stream has steps of depth_max_m / 4080 (:func:`.lerobot.depth_video_feature`).
            Recorded in the feature's ``info`` and in every episode's ``rynn_teleop/depth_max_m``.
        skip_damaged: leave out an episode whose MCAP file is damaged (reported in ``skipped`` with its
            one-line reason) instead of stopping the export.
        image_size: (width, height) [px] of every colour camera key: each frame is resized to it
            (:func:`rynn_teleop.core.image.resize_rgb`, the resize the policy node applies to its
            observations) before it is encoded and sampled for the statistics, and ``info.json`` declares
            that shape; None (default): as recorded. Not with ``depth`` (depth is not resampled).
        trim_idle_start: leave out each episode's rows before its arms first move: every row before the last
            one whose arm commands are all within this many radians of the first row's
            (:func:`idle_start_rows`; :data:`IDLE_TOLERANCE_RAD` is a good value). An operator's wait before
            moving teaches a policy that the scene at rest means "stay at rest". None (default): every row.

    Returns:
        What was written and skipped, and how long it took.

    Raises:
        ExportError: a bad argument; ``out`` exists (a non-empty folder without ``append`` or
            ``overwrite``, or a folder that is not a dataset with either); an episode lacks a
            needed topic (with ``depth``, the depth topic) or its camera does not run at ``fps``;
            camera (or depth) sizes differ between episodes; an episode is damaged (without
            ``skip_damaged``); the output folder cannot be created or written (named, before any episode is
            read). Nothing is written then (with ``append``, the existing dataset is unchanged).
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
    if image_size is not None:
        image_size = _check_image_size(image_size, video)
        if depth is not None:
            raise ExportError("--image-size and --depth exclude each other: depth images are not resized "
                              "(averaging would mix missing readings into valid depth); export depth at its "
                              "recorded size without --image-size")
    if trim_idle_start is not None and not 0.0 < float(trim_idle_start) <= 1.0:
        raise ExportError(f"trim_idle_start {trim_idle_start} is outside (0, 1] rad")
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
    try:
        stage.mkdir(parents=True)
        (stage / ".write-test").touch()
        (stage / ".write-test").unlink()
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        raise ExportError(f"cannot create the dataset folder {out}: {exc.strerror or exc} "
                          f"({exc.filename or stage})") from exc
    root = out if extend else stage
    work = stage / "work"
    report = ExportReport(out=out, repo_id=repo_id, fps=fps)
    written: list[Path] = []  # files written into an existing dataset (removed again on failure)
    try:
        n_workers = _worker_count(workers, len(sources))
        job_video = video if video.threads else replace(video, threads=max(1, _cpu_count() // n_workers))
        depth_video = depth_video_options(video.gop, job_video.threads)
        jobs = [_Job(p, i, work / f"{i:05d}", fps, images, job_video, include_problems, depth, depth_max_m, depth_video,
                     skip_damaged, image_size, trim_idle_start) for i, p in enumerate(sources)]
        results = _run(jobs, n_workers)
        converted = [r for r in results if isinstance(r, _Converted)]
        report.skipped = [SkippedEpisode(r.source, r.problems, r.damaged) for r in results if isinstance(r, _Skipped)]
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
                trimmed_idle_frames=c.trimmed,
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
    except BaseException as exc:
        for p in written:  # appending: this run's files; the existing dataset's metadata was not touched
            p.unlink(missing_ok=True)
        shutil.rmtree(stage, ignore_errors=True)
        if isinstance(exc, OSError):  # disk full, a folder removed under us...: named, nothing left behind
            raise ExportError(f"the export into {out} failed: {exc.strerror or exc}"
                              + (f" ({exc.filename})" if exc.filename else "") + "; nothing was written") from exc
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
        EXTRA_PREFIX + "trimmed_idle_frames": int(c.trimmed),
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
    "IDLE_TOLERANCE_RAD",
    "FEED_TOPICS",
    "SkippedEpisode",
    "VideoOptions",
    "depth_key",
    "export_lerobot",
    "idle_start_rows",
    "parse_image_size",
]
