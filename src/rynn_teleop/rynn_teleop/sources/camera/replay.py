"""Replay camera frames from a rosbag2, a video file or a folder of images (ROS-free).

The kind of ``path`` is detected at start: a rosbag2 directory (or its ``metadata.yaml``, ``*.mcap``,
``*.db3``), read with ``rosbags``: ``sensor_msgs/msg/Image`` colour (rgb8, bgr8, rgba8, bgra8, mono8), an
optional depth topic (16UC1 / mono16 [mm], 32FC1 [m] -> mm; each colour frame gets the depth nearest in
stamp within half a frame interval) and ``CameraInfo``, read on demand; a folder of images (``.png``,
``.jpg``, ``.jpeg``, natural name order; one image file is a one-frame folder); any other file: a video
(``cv2.VideoCapture``).

Intrinsics: the bag's first ``CameraInfo`` (rescaled, with a warning, to the image size); otherwise
:func:`~rynn_teleop.core.camera.default_intrinsics` of the first frame's size. Timing on the caller's clock:
with ``rate_hz=None`` a bag keeps its recorded timing (header stamps; receive time where a stamp is zero)
from the ``now`` given to :meth:`ReplayCamera.start`; otherwise, and for videos (their fps) and folders,
frame k is stamped start + k / rate. With ``loop`` the clip repeats and time keeps increasing. Frames that
cannot be decoded are skipped with a warning and counted in :attr:`ReplayCamera.skipped`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ...core.camera import (
    DEFAULT_DEPTH_SCALE,
    CameraFrame,
    CameraIntrinsics,
    default_intrinsics,
)
from ...core.image import decode_image
from ...core.params import Param
from ...errors import ConfigurationError, ParameterError
from .base import CAMERA_BACKENDS, DEFAULT_MAX_BACKLOG, CameraContext, CameraSource

_LOG = logging.getLogger(__name__)

IMAGE = "sensor_msgs/msg/Image"
CAMERA_INFO = "sensor_msgs/msg/CameraInfo"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
BAG_FILES = (".mcap", ".db3")
DEFAULT_RATE_HZ = 30.0  # [Hz] folders, and videos that give no frame rate

_END = object()  # a clip's frame() at the end of a pass


class _Undecodable(Exception):
    """One frame cannot be turned into an array (skipped and counted)."""


def intrinsics_from_camera_info(msg: Any) -> CameraIntrinsics:
    """:class:`CameraIntrinsics` of a ``sensor_msgs/msg/CameraInfo`` (or a stand-in with its fields).

    Raises:
        ConfigurationError: a zero size or focal length (an uncalibrated camera).
    """
    k = [float(x) for x in msg.k]
    return CameraIntrinsics(
        int(msg.width), int(msg.height), k[0], k[4], k[2], k[5],
        str(msg.distortion_model) or "plumb_bob", tuple(float(x) for x in msg.d),
    ).check()


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", path.name)]


def _bgr_to_rgb(image: np.ndarray) -> np.ndarray:
    if image.ndim == 2:
        return np.repeat(image[..., None], 3, axis=2)
    return np.ascontiguousarray(image[..., 2::-1])


class _Clip:
    """The frames of one pass over a path: ``read_next`` in order, ``seek`` to jump."""

    description = ""
    rate_hz = DEFAULT_RATE_HZ  # [Hz] nominal rate (videos: their fps)
    rel_stamps: np.ndarray | None = None  # recorded stamp - first [s] per frame (bags only)
    intrinsics: CameraIntrinsics
    depth_intrinsics: CameraIntrinsics | None = None
    length: int | None = None  # frames per pass; None until a video's end is met
    pos = 0  # index of the next frame in the pass

    def read_next(self, decode: bool) -> Any:
        """(colour, depth or None) of frame ``pos`` (None if not ``decode``), or ``_END``; advances ``pos``.

        Raises _Undecodable for a frame that cannot be read (it is consumed).
        """
        raise NotImplementedError

    def seek(self, index: int) -> bool:
        """Make frame ``index`` the next one; False if the pass has no such frame."""
        if self.length is not None and index >= self.length:
            return False
        self.pos = index
        return True

    def close(self) -> None:
        pass


class _FolderClip(_Clip):
    def __init__(self, files: list[Path], where: str) -> None:
        self.files = files
        self.length = len(files)
        self.description = f"{len(files)} image(s) in {where}"
        first = self._load(files[0])
        if first is None:
            raise ConfigurationError(f"replay camera: cannot read the image {str(files[0])!r}")
        self.size = first.shape[1], first.shape[0]
        self.intrinsics = default_intrinsics(*self.size)

    @staticmethod
    def _load(path: Path) -> np.ndarray | None:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        return None if image is None else _bgr_to_rgb(image)

    def read_next(self, decode: bool) -> Any:
        if self.pos >= len(self.files):
            return _END
        path = self.files[self.pos]
        self.pos += 1
        if not decode:
            return None
        image = self._load(path)
        if image is None:
            raise _Undecodable(f"cannot read the image {str(path)!r}")
        if (image.shape[1], image.shape[0]) != self.size:
            raise _Undecodable(f"{str(path)!r} is {image.shape[1]}x{image.shape[0]}, not {self.size[0]}x{self.size[1]}")
        return image, None


class _VideoClip(_Clip):
    """A video read in order; its length is learnt when its end is first met; seeking back reopens it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cap = self._open()
        ok, first = self._cap.read()
        if not ok or first is None:
            self._cap.release()
            raise ConfigurationError(
                f"replay camera: {str(path)!r} is not a readable video (no frame could be decoded)"
            )
        self.size = first.shape[1], first.shape[0]
        self._first: np.ndarray | None = first  # frame 0, already taken from the capture
        fps = float(self._cap.get(cv2.CAP_PROP_FPS) or 0.0)
        if not (math.isfinite(fps) and 0.0 < fps < 1000.0):
            _LOG.warning("replay camera: %s gives no frame rate; playing it at %.0f Hz", path, DEFAULT_RATE_HZ)
            fps = DEFAULT_RATE_HZ
        self.rate_hz = fps
        self.intrinsics = default_intrinsics(*self.size)
        self.description = f"video {str(path)!r} ({self.size[0]}x{self.size[1]} at {fps:g} fps)"

    def _open(self) -> cv2.VideoCapture:
        cap = cv2.VideoCapture(str(self.path))
        if not cap.isOpened():
            raise ConfigurationError(
                f"replay camera: cannot open {str(self.path)!r} as a video (nor is it a rosbag2 or an image)"
            )
        return cap

    def _grab(self) -> bool:
        """Take frame ``pos`` from the capture without decoding it (False at the end)."""
        if self._first is not None:
            self._first = None
            return True
        if self._cap.grab():
            return True
        self.length = self.pos
        return False

    def read_next(self, decode: bool) -> Any:
        first = self._first
        if not self._grab():
            return _END
        self.pos += 1
        if not decode:
            return None
        if first is not None:
            image = first
        else:
            ok, image = self._cap.retrieve()
            if not ok or image is None:
                raise _Undecodable(f"cannot decode frame {self.pos - 1} of {str(self.path)!r}")
        if (image.shape[1], image.shape[0]) != self.size:
            raise _Undecodable(f"a frame of {str(self.path)!r} changed size to {image.shape[1]}x{image.shape[0]}")
        return _bgr_to_rgb(image), None

    def seek(self, index: int) -> bool:
        if self.length is not None and index >= self.length:
            return False
        if index < self.pos:
            self._cap.release()
            self._cap = self._open()
            self._first = None
            self.pos = 0
        while self.pos < index:
            if not self._grab():
                return False
            self.pos += 1
        return True

    def close(self) -> None:
        self._cap.release()


class _BagClip(_Clip):
    """Colour (and depth) messages of a rosbag2, indexed at start and read on demand."""

    def __init__(self, bag: Path, topic: str, info_topic: str | None, depth_topic: str | None) -> None:
        from rosbags.highlevel import AnyReader  # only bag replays need rosbags
        from rosbags.typesys import Stores, get_typestore

        from ...recording.recover import refuse_damaged

        refuse_damaged(bag, "replay camera")  # a damaged MCAP file: one line, not a decoding error mid-replay
        try:
            self._reader = AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_JAZZY))
            self._reader.open()
        except Exception as exc:  # rosbags raises its own reader errors for broken bags
            raise ConfigurationError(f"replay camera: cannot open rosbag2 {str(bag)!r}: {exc}") from exc
        try:
            self._index(bag, topic, info_topic, depth_topic)
        except BaseException:
            self._reader.close()
            raise

    def _connection(self, topic: str, msgtype: str) -> Any:
        for conn in self._reader.connections:
            if conn.topic == topic and conn.msgtype == msgtype:
                return conn
        return None

    def _index(self, bag: Path, topic: str, info_topic: str | None, depth_topic: str | None) -> None:
        topics = {c.topic: c.msgtype for c in self._reader.connections}
        shown = ", ".join(f"{t} [{m}]" for t, m in sorted(topics.items())) or "none"
        images = sorted(t for t, m in topics.items() if m == IMAGE)
        if not images:
            raise ConfigurationError(f"replay camera: rosbag2 {str(bag)!r} has no {IMAGE} topic; its topics: {shown}")
        color_conn = self._connection(topic, IMAGE)
        if color_conn is None:
            raise ConfigurationError(
                f"replay camera: rosbag2 {str(bag)!r} has no {IMAGE} topic {topic!r}; "
                f"its image topics: {', '.join(images)} (set topic)"
            )
        ns = topic[: -len("/color/image_raw")] if topic.endswith("/color/image_raw") else topic.rsplit("/", 1)[0]
        if depth_topic is None:  # automatic: realsense-ros names, aligned depth first
            candidates = [f"{ns}/aligned_depth_to_color/image_raw", f"{ns}/depth/image_rect_raw"]
            depth_topic = next((t for t in candidates if topics.get(t) == IMAGE), "")
        elif depth_topic and topics.get(depth_topic) != IMAGE:
            raise ConfigurationError(
                f"replay camera: rosbag2 {str(bag)!r} has no {IMAGE} depth topic {depth_topic!r}; "
                f"its image topics: {', '.join(images)} (set depth_topic, or '' for no depth)"
            )
        explicit_info = info_topic is not None
        if info_topic is None:
            info_topic = topic.rsplit("/", 1)[0] + "/camera_info"
        if explicit_info and topics.get(info_topic) != CAMERA_INFO:
            raise ConfigurationError(
                f"replay camera: rosbag2 {str(bag)!r} has no {CAMERA_INFO} topic {info_topic!r}; its topics: {shown}"
            )
        depth_conn = self._connection(depth_topic, IMAGE) if depth_topic else None
        color = self._scan(color_conn, depth=False)
        if not color:
            raise ConfigurationError(f"replay camera: topic {topic!r} of {str(bag)!r} has no message")
        depth = self._scan(depth_conn, depth=True) if depth_conn is not None else []
        self._color_conn, self._depth_conn = color_conn, depth_conn
        stamps = np.array([c[0] - color[0][0] for c in color], dtype=np.int64)  # [ns] since the first
        self.rel_stamps = stamps * 1e-9
        self.length = len(color)
        self._color_refs = [(c[1], c[2]) for c in color]
        gaps = np.diff(stamps)
        gaps = gaps[gaps > 0]
        self.spacing = float(np.median(gaps)) * 1e-9 if gaps.size else 1.0 / DEFAULT_RATE_HZ  # [s]
        self.rate_hz = 1.0 / self.spacing
        self._depth_refs: list[tuple[int, int] | None] = [None] * len(color)
        if depth:
            d_stamps = np.array([d[0] - color[0][0] for d in depth], dtype=np.int64)
            order = np.argsort(d_stamps, kind="stable")
            d_sorted = d_stamps[order]
            for i, s in enumerate(stamps):
                j = int(np.searchsorted(d_sorted, s))
                best = min((k for k in (j - 1, j) if 0 <= k < len(d_sorted)), key=lambda k: abs(d_sorted[k] - s))
                if abs(int(d_sorted[best]) - int(s)) <= 0.5 * self.spacing * 1e9 + 1000:
                    self._depth_refs[i] = depth[order[best]][1:3]
            paired = sum(r is not None for r in self._depth_refs)
            if paired < len(color):
                missing = len(color) - paired
                _LOG.warning("replay camera: %d of %d colour frames have no depth frame near them", missing, len(color))
        # intrinsics
        self._size = color[0][3]
        info = self._first_info(info_topic) if topics.get(info_topic) == CAMERA_INFO else None
        self.intrinsics = self._fit(info, self._size, info_topic)
        self.depth_intrinsics = None
        if depth:
            d_size = depth[0][3]
            d_info_topic = depth_topic.rsplit("/", 1)[0] + "/camera_info"
            d_info = self._first_info(d_info_topic) if topics.get(d_info_topic) == CAMERA_INFO else None
            if d_info is None and d_size == self._size:
                self.depth_intrinsics = self.intrinsics  # registered to the colour image
            else:
                self.depth_intrinsics = self._fit(d_info, d_size, d_info_topic)
            self._depth_size = d_size
        self.description = (
            f"{len(color)} frames of {topic}"
            + (f" with depth from {depth_topic}" if depth else "")
            + f" in {str(bag)!r}"
        )

    def _scan(self, conn: Any, depth: bool) -> list[tuple[int, int, int, tuple[int, int]]]:
        """(stamp [ns], log time [ns], ordinal among messages with that log time, (w, h)) of every message."""
        rows: list[tuple[int, int, int, tuple[int, int]]] = []
        last_log, ordinal = None, 0
        for _, log_ns, raw in self._reader.messages(connections=[conn]):
            msg = self._reader.deserialize(raw, conn.msgtype)
            if not rows:  # the first message decides the format; check it can be decoded
                try:
                    decode_image(msg, depth=depth)
                except ValueError as exc:
                    raise ConfigurationError(f"replay camera: topic {conn.topic!r}: {exc}") from exc
            ordinal = ordinal + 1 if log_ns == last_log else 0
            last_log = log_ns
            stamp = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
            rows.append((stamp if stamp != 0 else int(log_ns), int(log_ns), ordinal, (int(msg.width), int(msg.height))))
        return rows

    def _first_info(self, topic: str) -> Any:
        conn = self._connection(topic, CAMERA_INFO)
        for _, _, raw in self._reader.messages(connections=[conn]):
            return self._reader.deserialize(raw, conn.msgtype)
        return None

    @staticmethod
    def _fit(info: Any, size: tuple[int, int], topic: str) -> CameraIntrinsics:
        if info is None:
            _LOG.info("replay camera: no CameraInfo on %s; using default intrinsics for %dx%d", topic, *size)
            return default_intrinsics(*size)
        try:
            intrinsics = intrinsics_from_camera_info(info)
        except ConfigurationError as exc:
            _LOG.warning("replay camera: unusable CameraInfo on %s (%s); using default intrinsics", topic, exc)
            return default_intrinsics(*size)
        if (intrinsics.width, intrinsics.height) != size:
            _LOG.warning(
                "replay camera: CameraInfo on %s is for %dx%d but the images are %dx%d; rescaling it",
                topic, intrinsics.width, intrinsics.height, *size,
            )
            intrinsics = intrinsics.scaled(*size)
        return intrinsics

    def _message(self, conn: Any, ref: tuple[int, int]) -> Any:
        log_ns, ordinal = ref
        found = list(self._reader.messages(connections=[conn], start=log_ns, stop=log_ns + 1))
        if len(found) <= ordinal:
            raise _Undecodable(f"message at {log_ns} ns on {conn.topic} vanished from the bag")
        return self._reader.deserialize(found[ordinal][2], conn.msgtype)

    def read_next(self, decode: bool) -> Any:
        if self.pos >= self.length:
            return _END
        i = self.pos
        self.pos += 1
        if not decode:
            return None
        try:
            msg = self._message(self._color_conn, self._color_refs[i])
            color = decode_image(msg, depth=False)
            if (color.shape[1], color.shape[0]) != self._size:
                raise ValueError(f"size {color.shape[1]}x{color.shape[0]} differs from the first frame's")
            depth = None
            if self._depth_refs[i] is not None:
                dmsg = self._message(self._depth_conn, self._depth_refs[i])
                depth = decode_image(dmsg, depth=True)
                if (depth.shape[1], depth.shape[0]) != self._depth_size:
                    raise ValueError(f"depth size {depth.shape[1]}x{depth.shape[0]} differs from the first's")
        except ValueError as exc:
            raise _Undecodable(f"frame {i} of {self._color_conn.topic}: {exc}") from exc
        return color, depth

    def close(self) -> None:
        self._reader.close()


@CAMERA_BACKENDS.register
class ReplayCamera(CameraSource):
    """Frames of a rosbag2, a video or an image folder, re-timed onto the caller's clock (module doc).

    :meth:`read` returns the frames whose playback stamp is <= now not yet
    returned, oldest first, at most ``max_backlog`` (the newest; the older
    due ones are dropped and counted in :attr:`dropped`).
    """

    name = "replay"
    SETTINGS = (
        Param("path", str, "", "rosbag2 directory, video file or image folder"),
        Param("rate_hz", float, 0.0, "frame rate (0 = as recorded / the video's / 30 Hz)", "Hz", min=0.0, max=240.0),
        Param("loop", bool, True, "start again at the end"),
        Param("topic", str, "/head_camera/color/image_raw",
              "(rosbag2) colour topic to play (its camera_info and depth are found next to it)"),
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: CameraContext) -> ReplayCamera:
        """Raises ParameterError (key ``path``) when no path is given."""
        if not settings["path"].strip():
            raise ParameterError("path", "backend replay needs a path: a rosbag2 directory, a video file or an "
                                 "image folder")
        return cls(path=settings["path"], rate_hz=settings["rate_hz"] or None, loop=settings["loop"],
                   topic=settings["topic"])

    def __init__(
        self,
        path: str | Path,
        rate_hz: float | None = None,
        loop: bool = True,
        topic: str = "/head_camera/color/image_raw",
        info_topic: str | None = None,
        depth_topic: str | None = None,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
    ) -> None:
        """
        Args:
            path: rosbag2 directory, video file, image folder or image file.
            rate_hz: playback rate [Hz]; None: a bag's recorded timing, a video's
                fps, 30 Hz for images.
            loop: start over at the end instead of finishing.
            topic: (bags) the colour ``sensor_msgs/msg/Image`` topic.
            info_topic: (bags) the ``CameraInfo`` topic; None: the ``camera_info``
                next to ``topic``, used if the bag has it.
            depth_topic: (bags) the depth image topic; None: the bag's
                ``<ns>/aligned_depth_to_color/image_raw`` or else
                ``<ns>/depth/image_rect_raw`` if it has one (``<ns>``: ``topic``
                without ``/color/image_raw``); "": no depth.
            max_backlog: most frames one :meth:`read` returns [frames] (>= 1).

        Raises:
            ConfigurationError: a rate <= 0, an empty topic or a backlog < 1.
        """
        super().__init__()
        if rate_hz is not None and not (math.isfinite(rate_hz) and rate_hz > 0):
            raise ConfigurationError(f"replay camera: rate_hz must be > 0 (or None), got {rate_hz}")
        if not str(topic or "").strip():
            raise ConfigurationError("replay camera: topic is empty")
        if int(max_backlog) < 1:
            raise ConfigurationError(f"replay camera: max_backlog must be >= 1, got {max_backlog}")
        self.path = Path(path)
        self.rate_hz = None if rate_hz is None else float(rate_hz)
        self.loop = bool(loop)
        self.topic = str(topic)
        self.info_topic = info_topic
        self.depth_topic = depth_topic
        self.max_backlog = int(max_backlog)
        self.skipped = 0  # frames that could not be decoded
        self.source_kind = ""  # "rosbag2" | "video" | "images", after start
        self._clip: _Clip | None = None
        self._t0: float | None = None
        self._rate = DEFAULT_RATE_HZ  # [Hz] of the re-timed playback
        self._period = 0.0  # [s] recorded time of one bag pass, loop spacing included
        self._g = 0  # global index (over loop passes) of the next frame to return
        self._finished = False
        self._closed = False

    # ----------------------------------------------------------------------------- opening
    def _open(self) -> _Clip:
        path = self.path.expanduser()
        if path.is_file() and (path.name == "metadata.yaml" or path.suffix in BAG_FILES):
            path = path.parent
        if not path.exists():
            raise ConfigurationError(f"replay camera: {str(path)!r} does not exist")
        if path.is_dir():
            if (path / "metadata.yaml").is_file():
                self.source_kind = "rosbag2"
                return _BagClip(path, self.topic, self.info_topic, self.depth_topic)
            files = sorted(
                (p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES), key=_natural_key
            )
            if not files:
                raise ConfigurationError(
                    f"replay camera: folder {str(path)!r} has no {'/'.join(IMAGE_SUFFIXES)} image "
                    "and is not a rosbag2 (no metadata.yaml)"
                )
            self.source_kind = "images"
            return _FolderClip(files, repr(str(path)))
        if path.suffix.lower() in IMAGE_SUFFIXES:
            self.source_kind = "images"
            return _FolderClip([path], repr(str(path)))
        self.source_kind = "video"
        return _VideoClip(path)

    def start(self, now: float) -> None:
        """Open the path and map its first frame to ``now`` [s] (restarting if already started).

        Raises:
            ConfigurationError: the path is missing; a folder without images; a
                file that is no readable video; a bag that cannot be opened, has no
                ``topic`` (the message lists its image topics), has a missing
                explicit ``info_topic`` / ``depth_topic``, or an unsupported encoding.
        """
        if self._clip is not None:
            self._clip.close()
            self._clip = None
        clip = self._open()
        self._clip = clip
        self._intrinsics = clip.intrinsics
        self._depth_intrinsics = clip.depth_intrinsics
        self._rate = self.rate_hz if self.rate_hz is not None else clip.rate_hz
        if clip.rel_stamps is not None:
            self._period = float(clip.rel_stamps[-1]) + 1.0 / clip.rate_hz
        self._t0 = float(now)
        self._g = 0
        self._finished = False
        self._closed = False
        timing = "the recorded timing" if self._recorded_timing else f"{self._rate:g} Hz"
        _LOG.info("replaying %s at %s", clip.description, timing)

    @property
    def _recorded_timing(self) -> bool:
        return self.rate_hz is None and self._clip is not None and self._clip.rel_stamps is not None

    # ----------------------------------------------------------------------------- playback
    @property
    def frame_rate(self) -> float:
        """Nominal frame rate [Hz] of the playback (a bag's: its median recorded interval), after start."""
        return self._clip.rate_hz if self._recorded_timing else self._rate  # type: ignore[union-attr]

    @property
    def finished(self) -> bool:
        """True once every frame was returned (never while looping)."""
        return self._finished

    def _newest_due(self, now: float) -> int:
        """Global index of the newest frame whose playback stamp is <= ``now`` [s] (-1 if none)."""
        assert self._clip is not None and self._t0 is not None
        elapsed = now - self._t0 + 1e-9  # a frame stamped exactly now is due
        if elapsed < 0:
            return -1
        n = self._clip.length
        if not self._recorded_timing:
            newest = math.floor(elapsed * self._rate)
            return min(newest, n - 1) if n is not None and not self.loop else newest
        rel = self._clip.rel_stamps
        assert rel is not None and n is not None
        if not self.loop:
            return int(np.searchsorted(rel, elapsed, side="right")) - 1
        passes = math.floor(elapsed / self._period)
        return passes * n + int(np.searchsorted(rel, elapsed - passes * self._period, side="right")) - 1

    def _stamp(self, g: int) -> float:
        """Playback stamp [s] of global frame ``g``."""
        assert self._clip is not None and self._t0 is not None
        if not self._recorded_timing:
            return self._t0 + g / self._rate
        n = self._clip.length
        assert self._clip.rel_stamps is not None and n is not None
        return self._t0 + (g // n) * self._period + float(self._clip.rel_stamps[g % n])

    def _frame_at(self, g: int) -> Any:
        """(colour, depth) of global frame ``g``, or ``_END`` past the end without loop (raises _Undecodable)."""
        clip = self._clip
        assert clip is not None
        while True:
            n = clip.length
            if n == 0:
                return _END
            if n is not None and g >= n and not self.loop:
                return _END
            index = g % n if n is not None else g  # a video's first pass: length not known yet
            if clip.pos != index and not clip.seek(index):
                continue  # a video met its end: its length is known now
            item = clip.read_next(decode=True)
            if item is _END:
                continue
            return item

    def read(self, now: float) -> list[CameraFrame]:
        """The frames whose playback stamp is <= ``now`` [s] not returned yet, oldest first."""
        if self._clip is None or self._closed or self._t0 is None:
            raise RuntimeError("ReplayCamera.read() called before start() or after close()")
        if self._finished:
            return []
        newest = self._newest_due(now)
        first = max(self._g, newest - self.max_backlog + 1)
        self.dropped += max(0, first - self._g)
        out: list[CameraFrame] = []
        for g in range(first, newest + 1):
            self._g = g + 1
            try:
                item = self._frame_at(g)
            except _Undecodable as exc:
                self.skipped += 1
                _LOG.warning("replay camera: skipped a frame: %s", exc)
                continue
            if item is _END:
                self._finished = True
                break
            color, depth = item
            out.append(CameraFrame(self._stamp(g), color, depth, DEFAULT_DEPTH_SCALE))
        n = self._clip.length
        if not self.loop and n is not None and self._g >= n:
            self._finished = True
        return out

    def diagnostics(self) -> dict[str, Any]:
        n = self._clip.length if self._clip is not None else None
        passes = self._g // n if n else 0
        return {"source": self.source_kind, "dropped": self.dropped, "skipped": self.skipped, "passes": passes}

    def close(self) -> None:
        """Close the file or bag (idempotent)."""
        self._closed = True
        if self._clip is not None:
            self._clip.close()
            self._clip = None
