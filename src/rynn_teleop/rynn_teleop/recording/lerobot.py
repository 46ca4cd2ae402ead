"""The LeRobot dataset format v3.0 on disk: layout, features, statistics, metadata files, video streams (ROS-free).

What LeRobot 0.4 and later read (``LeRobotDataset(repo_id, root=DIR)``)::

    meta/info.json                       format version, fps, features, totals, path templates
    meta/stats.json                      per-feature statistics over the whole dataset (normalisation)
    meta/tasks.parquet                   task string (index "task") -> task_index
    meta/episodes/chunk-000/file-000.parquet   one row per episode: length, frame range, file
                                         locations, per-episode statistics, extra columns
    data/chunk-CCC/file-FFF.parquet      one row per frame: state, action, timestamp, indices
    videos/<video key>/chunk-CCC/file-FFF.mp4  one video stream per camera key

This module writes one data file and one video file per episode and key (chunk index = episode index div
``CHUNKS_SIZE``, file index = episode index mod ``CHUNKS_SIZE``), so each episode's video starts at timestamp
0; readers find episodes through the per-episode file indices and time ranges. Only numpy, pyarrow and PyAV:
nothing here knows about bags or ROS.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CODEBASE_VERSION = "v3.0"
"""The dataset format version written (``info.json`` ``codebase_version``)."""
CHUNKS_SIZE = 1000
"""Files per chunk folder."""
DATA_FILES_SIZE_IN_MB = 100
VIDEO_FILES_SIZE_IN_MB = 200

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
"""Quantiles kept in the statistics, as LeRobot's (keys ``q01``, ``q10``, ``q50``, ``q90``, ``q99``)."""
_QUANTILE_KEYS = tuple(f"q{round(q * 100):02d}" for q in QUANTILES)

IMAGE_STATS_MAX_SIDE = 150
"""Frames sampled for image statistics are subsampled to at most about this many pixels per side [px]."""
IMAGE_STATS_SAMPLES = 100
"""About this many frames per episode and camera key go into the image statistics."""

DEPTH_QMAX = 4095
"""Largest depth code: depth streams hold 12-bit codes (LeRobot's depth quantisation, ``DEPTH_QMAX``)."""
DEPTH_CODE_AT_MAX = 255 * 16
"""Code of the largest depth (``depth_max_m``): depth codes run linearly over 0..4080, so a code's top 8 bits
(what a decoder to 8-bit RGB keeps: ``round(code / 16)``) are ``round(depth / depth_max_m * 255)``."""
DEPTH_PIX_FMT = "gray12le"
"""Pixel format of depth streams (one 12-bit full-range grey plane, LeRobot's depth default)."""
DEPTH_ENCODER = "libx265"
"""Encoder of depth streams: HEVC (Main 12 / RExt profile), lossless, as LeRobot's depth encoder."""

DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
"""The per-frame bookkeeping features every LeRobot dataset has."""


def chunk_file(episode_index: int) -> tuple[int, int]:
    """(chunk index, file index) of an episode's own data and video files."""
    return episode_index // CHUNKS_SIZE, episode_index % CHUNKS_SIZE


def data_path(episode_index: int) -> str:
    """Path of an episode's data file, relative to the dataset root."""
    c, f = chunk_file(episode_index)
    return DATA_PATH.format(chunk_index=c, file_index=f)


def video_path(video_key: str, episode_index: int) -> str:
    """Path of an episode's video of ``video_key``, relative to the dataset root."""
    c, f = chunk_file(episode_index)
    return VIDEO_PATH.format(video_key=video_key, chunk_index=c, file_index=f)


# -- features --------------------------------------------------------------------------------


def vector_feature(names: Sequence[str], dtype: str = "float32") -> dict[str, Any]:
    """A 1-D feature (state, action) with one name per element."""
    return {"dtype": dtype, "shape": [len(names)], "names": list(names)}


def video_feature(height: int, width: int, fps: int, codec: str, pix_fmt: str) -> dict[str, Any]:
    """A camera key stored as video: shape (height, width, 3) [px], and the stream description LeRobot keeps."""
    return {
        "dtype": "video",
        "shape": [int(height), int(width), 3],
        "names": ["height", "width", "channels"],
        "info": {
            "video.height": int(height),
            "video.width": int(width),
            "video.codec": codec,
            "video.pix_fmt": pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(fps),
            "video.channels": 3,
            "has_audio": False,
        },
    }


def depth_video_feature(height: int, width: int, fps: int, depth_max_m: float, topic: str) -> dict[str, Any]:
    """A depth key stored as a 12-bit grey video (codes from :func:`quantize_depth`).

    ``shape`` is (height, width, 3) [px] and ``video.is_depth_map`` false: LeRobot (0.4, and 0.6.1 for a key not
    marked as depth) decodes the stream to 8-bit RGB, so a reader gets three equal channels of value
    ``depth / depth_max_m`` in [0, 1] (``depth_max_m / 255`` m per step; 0: no reading; 1: ``depth_max_m`` or
    farther), and the statistics describe that image. ``rynn_teleop/depth_scale_m`` (= ``depth_max_m``) is metres
    per unit of that value. A reader of the grey plane itself (PyAV ``to_ndarray(format="gray12le")``, LeRobot 0.6's
    depth reader for a key marked as depth) gets the 12-bit code ``c``: depth ``c / DEPTH_QMAX * video.depth_max``
    [m] (``depth_max_m / 4080`` m per step); ``video.depth_min`` (0), ``video.depth_max``
    (``depth_max_m * 4095 / 4080``), ``video.shift`` (0) and ``video.use_log`` (false) are those codes' parameters
    in LeRobot 0.6's depth quantiser.
    """
    feature = video_feature(height, width, fps, "hevc", DEPTH_PIX_FMT)
    feature["info"].update({
        "video.channels": 1,
        "video.depth_min": 0.0,
        "video.depth_max": float(depth_max_m) * DEPTH_QMAX / DEPTH_CODE_AT_MAX,
        "video.shift": 0.0,
        "video.use_log": False,
        "rynn_teleop/depth_scale_m": float(depth_max_m),
        "rynn_teleop/depth_topic": topic,
    })
    return feature


def info_doc(
    *,
    fps: int,
    features: Mapping[str, Mapping[str, Any]],
    total_episodes: int,
    total_frames: int,
    total_tasks: int,
    robot_type: str | None,
) -> dict[str, Any]:
    """The content of ``meta/info.json`` (``features`` without the default ones; they are added)."""
    has_video = any(f["dtype"] == "video" for f in features.values())
    return {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": int(total_episodes),
        "total_frames": int(total_frames),
        "total_tasks": int(total_tasks),
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": DATA_FILES_SIZE_IN_MB,
        "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB,
        "fps": int(fps),
        "splits": {"train": f"0:{int(total_episodes)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if has_video else None,
        "features": {**{k: dict(v) for k, v in features.items()}, **DEFAULT_FEATURES},
    }


# -- depth -----------------------------------------------------------------------------------


def quantize_depth(depth_mm: np.ndarray, depth_max_m: float) -> np.ndarray:
    """Depth [mm] as 12-bit codes, linear: LeRobot's ``quantize_depth`` with ``depth_min=0``,
    ``depth_max=depth_max_m * DEPTH_QMAX / DEPTH_CODE_AT_MAX``, ``shift=0``, ``use_log=False``, saturated at
    ``DEPTH_CODE_AT_MAX``.

    Args:
        depth_mm: (H, W) depth [mm] (uint16; 0: no reading).
        depth_max_m: depth of code ``DEPTH_CODE_AT_MAX`` [m]; farther depth gets that code.

    Returns:
        (H, W) uint16 codes ``round(depth / depth_max_m * DEPTH_CODE_AT_MAX)`` in 0..``DEPTH_CODE_AT_MAX``.
    """
    scale = DEPTH_CODE_AT_MAX / (float(depth_max_m) * 1000.0)
    codes = np.rint(np.asarray(depth_mm, np.float64) * scale)
    return np.minimum(codes, DEPTH_CODE_AT_MAX).astype(np.uint16)


def depth_codes_to_rgb(codes: np.ndarray) -> np.ndarray:
    """12-bit depth codes as the (H, W, 3) uint8 image a decoder to RGB makes of them (FFmpeg's full-range
    12 -> 8 bit conversion: ``round(code / 16)``, three equal channels): what :class:`ImageStatsSampler`
    describes for a depth key."""
    grey = np.minimum((np.asarray(codes, np.uint16) + 8) >> 4, 255).astype(np.uint8)
    return np.broadcast_to(grey[..., None], (*grey.shape, 3))


def depth_video_options(gop: int, threads: int = 0) -> VideoOptions:
    """How depth keys are encoded: ``DEPTH_ENCODER``, ``DEPTH_PIX_FMT``, lossless, marked full range
    (decoders to RGB then map code c to ``round(c / 16)``, not to studio swing), ``gop`` frames between key frames."""
    return VideoOptions(codec=DEPTH_ENCODER, crf=None, gop=gop, preset="veryfast", pix_fmt=DEPTH_PIX_FMT,
                        threads=threads, extra={"x265-params": "lossless=1:range=full:log-level=error"})


# -- statistics ------------------------------------------------------------------------------

Stats = dict[str, np.ndarray]
"""One feature's statistics: ``min``, ``max``, ``mean``, ``std``, ``count`` and the quantile keys."""


def vector_stats(values: np.ndarray) -> Stats:
    """Statistics of a per-frame feature over one episode, per element.

    Args:
        values: (frames,) or (frames, n) values.

    Returns:
        Arrays of shape (1,) for a scalar feature, (n,) for a vector; ``count`` is (1,).
    """
    a = np.asarray(values, dtype=np.float64)
    a = a.reshape(len(a), -1)
    out: Stats = {
        "min": a.min(axis=0),
        "max": a.max(axis=0),
        "mean": a.mean(axis=0),
        "std": a.std(axis=0),
        "count": np.array([len(a)], dtype=np.int64),
    }
    for key, q in zip(_QUANTILE_KEYS, np.quantile(a, QUANTILES, axis=0)):
        out[key] = q
    return out


class ImageStatsSampler:
    """Per-channel statistics of an episode's frames, from about ``IMAGE_STATS_SAMPLES`` of them.

    Exact for the sampled pixels (they are accumulated as 256-bin histograms per channel).
    Values are in [0, 1] (pixel / 255) with shape (3, 1, 1), as LeRobot keeps them;
    ``count`` is the number of frames sampled.
    """

    def __init__(self, n_frames: int, height: int, width: int) -> None:
        self.every = max(1, n_frames // IMAGE_STATS_SAMPLES)
        self.step = max(1, math.ceil(max(height, width) / IMAGE_STATS_MAX_SIDE))
        self._hist = np.zeros((3, 256), np.int64)
        self._frames = 0

    def offer(self, index: int, rgb: np.ndarray) -> None:
        """Frame ``index`` of the episode, (H, W, 3) uint8; counted if it is one of the sampled ones."""
        if index % self.every == 0:
            px = rgb[:: self.step, :: self.step]
            for c in range(3):
                self._hist[c] += np.bincount(px[..., c].reshape(-1), minlength=256)
            self._frames += 1

    def stats(self) -> Stats:
        """The statistics of the sampled frames.

        Raises:
            ValueError: no frame was offered.
        """
        if not self._frames:
            raise ValueError("no frame sampled")
        levels = np.arange(256) / 255.0
        n = self._hist.sum(axis=1)
        mean = (self._hist * levels).sum(axis=1) / n
        var = (self._hist * (levels - mean[:, None]) ** 2).sum(axis=1) / n
        present = self._hist > 0
        cdf = np.cumsum(self._hist, axis=1)
        out: Stats = {
            "min": levels[np.argmax(present, axis=1)],
            "max": levels[255 - np.argmax(present[:, ::-1], axis=1)],
            "mean": mean,
            "std": np.sqrt(var),
        }
        for key, q in zip(_QUANTILE_KEYS, QUANTILES):
            out[key] = levels[np.argmax(cdf >= q * n[:, None], axis=1)]
        out = {k: np.asarray(v, np.float64).reshape(3, 1, 1) for k, v in out.items()}
        out["count"] = np.array([self._frames], dtype=np.int64)
        return out


def aggregate_stats(per_episode: Sequence[Mapping[str, Stats]]) -> dict[str, Stats]:
    """Statistics of a dataset from its episodes' (or of two datasets'), per feature.

    min/max of the extremes, mean weighted by ``count``, std from the pooled variance,
    quantiles as the count-weighted mean of the parts' quantiles (what LeRobot does).
    """
    keys = sorted({k for s in per_episode for k in s})
    out: dict[str, Stats] = {}
    for key in keys:
        parts = [s[key] for s in per_episode if key in s]
        counts = np.array([float(p["count"][0]) for p in parts])
        total = counts.sum()
        w = counts / total
        shape = np.shape(parts[0]["mean"])
        wb = w.reshape((-1,) + (1,) * len(shape))
        means = np.stack([np.asarray(p["mean"], np.float64) for p in parts])
        mean = (means * wb).sum(axis=0)
        variances = np.stack([np.asarray(p["std"], np.float64) ** 2 for p in parts])
        var = ((variances + (means - mean) ** 2) * wb).sum(axis=0)
        agg: Stats = {
            "min": np.min(np.stack([p["min"] for p in parts]), axis=0),
            "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
            "mean": mean,
            "std": np.sqrt(var),
            "count": np.array([int(total)], dtype=np.int64),
        }
        for q in _QUANTILE_KEYS:
            if all(q in p for p in parts):
                agg[q] = (np.stack([np.asarray(p[q], np.float64) for p in parts]) * wb).sum(axis=0)
        out[key] = agg
    return out


def stats_to_json(stats: Mapping[str, Stats]) -> dict[str, dict[str, Any]]:
    """Statistics as plain lists (``meta/stats.json``)."""
    return {k: {s: np.asarray(v).tolist() for s, v in st.items()} for k, st in stats.items()}


def stats_from_json(doc: Mapping[str, Mapping[str, Any]]) -> dict[str, Stats]:
    """Inverse of :func:`stats_to_json`."""
    return {k: {s: np.asarray(v) for s, v in st.items()} for k, st in doc.items()}


# -- files -----------------------------------------------------------------------------------


def write_json(path: Path, doc: Any) -> None:
    """Write JSON through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=4, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def write_tasks(path: Path, tasks: Sequence[str]) -> None:
    """``meta/tasks.parquet``: the task strings in task-index order, as the pandas frame LeRobot reads
    (index named ``task``, column ``task_index``)."""
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()),
                      "task": pa.array(list(tasks), pa.string())})
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def read_tasks(path: Path) -> list[str]:
    """The task strings of ``meta/tasks.parquet`` in task-index order."""
    table = pq.read_table(path)
    names = table.column_names
    task_col = "task" if "task" in names else "__index_level_0__"
    pairs = sorted(zip(table.column("task_index").to_pylist(), table.column(task_col).to_pylist()))
    return [t for _, t in pairs]


def write_frames(
    path: Path,
    columns: Mapping[str, np.ndarray],
    features: Mapping[str, Mapping[str, Any]],
) -> None:
    """One data parquet file: a column per non-video feature, typed as ``features`` declares.

    Args:
        columns: feature key -> (frames,) or (frames, n) values.
    """
    arrays = {}
    for key, values in columns.items():
        ft = features[key]
        dtype = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
        values = np.asarray(values, dtype=ft["dtype"])
        if list(ft["shape"]) == [1]:
            arrays[key] = pa.array(values.reshape(-1), dtype)
        else:
            n = int(ft["shape"][0])
            flat = pa.array(values.reshape(-1), dtype)
            arrays[key] = pa.FixedSizeListArray.from_arrays(flat, n)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(arrays), path, compression="snappy")


def write_episodes(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """``meta/episodes/.../file-000.parquet`` from one plain-data mapping per episode (all with the same keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), tmp)
    os.replace(tmp, path)


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """The rows of an episodes parquet file as plain data."""
    return pq.read_table(path).to_pylist()


def episode_stats_columns(stats: Mapping[str, Stats]) -> dict[str, Any]:
    """Per-episode statistics as episodes-file columns ``stats/<feature>/<stat>`` (plain lists)."""
    return {f"stats/{k}/{s}": np.asarray(v).tolist() for k, st in stats.items() for s, v in st.items()}


# -- video -----------------------------------------------------------------------------------


_X264RGB_PIX_FMTS = ("rgb24", "bgr24", "bgr0")
"""Input pixel formats of ``libx264rgb``."""


@dataclass(frozen=True)
class VideoOptions:
    """How camera keys are encoded.

    :meth:`lossless` gives the options under which LeRobot's reader (torchcodec or PyAV) returns exactly the
    RGB pixels written (H.264 in RGB, ``libx264rgb`` at CRF 0); the default (H.264 4:2:0, CRF 23) is lossy.

    Attributes:
        codec: an FFmpeg encoder name PyAV has (``libx264``, ``libx264rgb``, ``libsvtav1``, ``libopenh264``,
            ``mpeg4``...).
        crf: constant rate factor (quality; lower is better; 0..63) for codecs that take one (x264, x265,
            SVT-AV1; other encoders ignore it); 0 is lossless for the 8-bit x264 encoders.
        gop: frames between key frames (2, as LeRobot's default, keeps random access cheap for training).
        preset: the encoder's speed preset (x264: ``ultrafast``..``veryslow``; SVT-AV1: ``0``..``13``), or None
            (the encoder's default; encoders other than x264, x265 and SVT-AV1 ignore it).
        pix_fmt: pixel format of the stream (``libx264rgb``: ``rgb24``, ``bgr24`` or ``bgr0``).
        threads: encoder threads (0: the encoder decides).
    """

    codec: str = "libx264"
    crf: int | None = 23
    gop: int = 2
    preset: str | None = "veryfast"
    pix_fmt: str = "yuv420p"
    threads: int = 0
    extra: dict[str, str] = field(default_factory=dict)  # any other FFmpeg encoder options, passed as given

    def __post_init__(self) -> None:
        if int(self.gop) < 1:
            raise ValueError(f"gop must be >= 1 frame, got {self.gop}")
        if self.crf is not None and not 0 <= int(self.crf) <= 63:
            raise ValueError(f"crf must be in 0..63, got {self.crf}")
        if int(self.threads) < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if self.codec == "libx264rgb" and self.pix_fmt not in _X264RGB_PIX_FMTS:
            raise ValueError(f"libx264rgb encodes pix_fmt {', '.join(_X264RGB_PIX_FMTS)}, not {self.pix_fmt!r}")

    @classmethod
    def lossless(cls, gop: int = 2, threads: int = 0) -> VideoOptions:
        """Options under which a decoder to RGB (LeRobot's torchcodec or PyAV reader) returns exactly the
        (H, W, 3) uint8 pixels written: H.264 High 4:4:4 Predictive in RGB (``libx264rgb``, ``rgb24``,
        CRF 0: lossless, no colour conversion), ``gop`` frames between key frames. The files are larger
        than the default (lossy) stream's."""
        return cls(codec="libx264rgb", crf=0, gop=gop, preset="veryfast", pix_fmt="rgb24", threads=threads)

    @property
    def stream_pix_fmt(self) -> str:
        """The stream's pixel format as a decoder reports it (``info.json`` ``video.pix_fmt``): ``gbrp`` for
        ``libx264rgb`` (H.264 stores RGB as planar G, B, R), else ``pix_fmt``."""
        return "gbrp" if self.codec == "libx264rgb" else self.pix_fmt

    def encoder_options(self) -> dict[str, str]:
        """FFmpeg options of the encoder."""
        opts = {"g": str(self.gop)}
        if self.codec in ("libx264", "libx264rgb", "libx265"):
            opts["bf"] = "0"  # no frame reordering: presentation time i / fps from the first frame on, no edit list
        if self.crf is not None and self.codec in ("libx264", "libx264rgb", "libx265", "libsvtav1", "h264", "hevc"):
            opts["crf"] = str(self.crf)
        if self.preset is not None and self.codec in ("libx264", "libx264rgb", "libx265", "libsvtav1"):
            opts["preset"] = str(self.preset)
        if self.threads and self.codec == "libsvtav1":
            opts["svtav1-params"] = f"lp={self.threads}"
        elif self.threads:
            opts["threads"] = str(self.threads)
        opts.update(self.extra)
        return opts


def encoder_available(codec: str) -> bool:
    """True if PyAV's FFmpeg has an encoder of that name."""
    try:
        av.codec.Codec(codec, "w")
    except Exception:  # noqa: BLE001 - PyAV raises several types for an unknown codec
        return False
    return True


class _KeepScheduling:
    """Puts the calling thread's scheduling back as it was when made, after each block it guards.

    SVT-AV1 (``libsvtav1``), run as root, switches the thread that first feeds it a frame to ``SCHED_FIFO``
    priority 99: an export beside a live stack would then run before its arm loops. Nothing is done where
    the platform has no scheduling calls.
    """

    def __init__(self) -> None:
        try:
            self._state = (os.sched_getscheduler(0), os.sched_getparam(0))
        except (AttributeError, OSError):
            self._state = None

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        if self._state is None:
            return
        policy, param = self._state
        try:
            if os.sched_getscheduler(0) != policy or os.sched_getparam(0) != param:
                os.sched_setscheduler(0, policy, param)
        except OSError:
            pass  # lowering a priority is always allowed; a failure here leaves what the encoder chose


_GREY_INPUT = {"gray": np.uint8, "gray10le": np.uint16, "gray12le": np.uint16, "gray16le": np.uint16}


class VideoWriter:
    """One MP4 video stream written frame by frame (arrays in, no intermediate image files).

    Frames are (height, width, 3) uint8 RGB, or for a grey ``pix_fmt`` (``gray``, ``gray10le``,
    ``gray12le``, ``gray16le``) (height, width) arrays of the stream's own values (uint8 for ``gray``,
    uint16 otherwise), written unconverted with the stream marked full range.
    Frame ``i`` gets presentation time ``i / fps`` exactly, so a video has as many frames
    as were written and LeRobot finds frame ``i`` at timestamp ``i / fps``.

    Raises (from the constructor):
        ValueError: the codec is not available in PyAV, or the size is not even (yuv420p).
    """

    def __init__(self, path: Path, *, width: int, height: int, fps: int, options: VideoOptions) -> None:
        if not encoder_available(options.codec):
            raise ValueError(f"video codec {options.codec!r} is not available in this PyAV build")
        if options.pix_fmt.startswith("yuv420") and (width % 2 or height % 2):
            raise ValueError(f"{width}x{height}: {options.pix_fmt} needs an even width and height")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.frames = 0
        self._container = av.open(str(path), mode="w", format="mp4")
        try:
            stream = self._container.add_stream(options.codec, rate=Fraction(int(fps), 1),
                                                options=options.encoder_options())
            stream.width = int(width)
            stream.height = int(height)
            stream.pix_fmt = options.pix_fmt
            stream.codec_context.time_base = Fraction(1, int(fps))
            if options.pix_fmt in _GREY_INPUT:
                stream.codec_context.color_range = 2  # full range (AVCOL_RANGE_JPEG): codes are not studio-swing
        except Exception:
            self._container.close()
            raise
        self._stream = stream
        self._time_base = Fraction(1, int(fps))
        self.codec = stream.codec_context.name
        self.size = (int(width), int(height))
        self._grey = options.pix_fmt if options.pix_fmt in _GREY_INPUT else None
        self._keep_scheduling = _KeepScheduling()

    def write(self, image: np.ndarray) -> None:
        """Append one frame: (height, width, 3) uint8 RGB, or (height, width) values for a grey stream.

        Raises:
            ValueError: the frame has another size or layout.
        """
        if self._grey is None:
            if image.shape != (self.size[1], self.size[0], 3) or image.dtype != np.uint8:
                raise ValueError(f"frame of shape {image.shape} {image.dtype}, expected "
                                 f"({self.size[1]}, {self.size[0]}, 3) uint8")
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        else:
            dtype = np.dtype(_GREY_INPUT[self._grey])
            if image.shape != (self.size[1], self.size[0]) or image.dtype != dtype:
                raise ValueError(f"frame of shape {image.shape} {image.dtype}, expected "
                                 f"({self.size[1]}, {self.size[0]}) {dtype}")
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format=self._grey)
        frame.pts = self.frames
        frame.time_base = self._time_base
        with self._keep_scheduling:
            packets = self._stream.encode(frame)
        for packet in packets:
            self._container.mux(packet)
        self.frames += 1

    def close(self) -> None:
        """Flush the encoder and finish the file."""
        if self._container is None:
            return
        try:
            with self._keep_scheduling:
                packets = self._stream.encode(None)
            for packet in packets:
                self._container.mux(packet)
        finally:
            self._container.close()
            self._container = None

    def abort(self) -> None:
        """Close without flushing and delete the file."""
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 - the file is deleted anyway
                pass
            self._container = None
        self.path.unlink(missing_ok=True)

