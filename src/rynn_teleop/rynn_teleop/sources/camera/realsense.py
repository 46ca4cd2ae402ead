"""Intel RealSense (D400 series) head camera through ``pyrealsense2`` (ROS-free).

Streams colour as RGB8 and optionally depth as Z16 (device units; :attr:`CameraFrame.depth_scale` carries the
device's scale) at "WxHxFPS" profiles; with ``align_depth`` depth is registered to colour and shares its
intrinsics, else it has its own (:attr:`RealSenseCamera.depth_intrinsics`). Intrinsics come from the
device's calibration.

Stamps are capture times on the caller's clock: a device stamp in the host's epoch domain (``system_time``,
``global_time``) is used when it lies within :data:`MAX_CLOCK_OFFSET_S` of ``now`` (kept <= ``now``);
otherwise, and for ``hardware_clock``, the ``now`` of the :meth:`~RealSenseCamera.read` that polled it.

Reading never blocks and never raises for device errors: ``poll_for_frames()`` hands out the newest frameset
not yet delivered (read at least at the stream rate). After ``recovery_timeout_s`` without a frame a
background thread restarts the pipeline once the device is listed again (:attr:`~RealSenseCamera.restarts`,
:attr:`~RealSenseCamera.last_error`). Start lists the devices first, so a missing camera fails at once
instead of after ``pipeline.start()``'s own wait.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import numpy as np

from ...core.camera import (
    DEFAULT_DEPTH_SCALE,
    CameraFrame,
    CameraIntrinsics,
    Profile,
    parse_profile,
    profile_problem,
)
from ...core.params import Param
from ...errors import ConfigurationError, HardwareUnavailableError
from .base import CAMERA_BACKENDS, CameraSource

_LOG = logging.getLogger(__name__)

MAX_CLOCK_OFFSET_S = 1.0  # [s] a device epoch stamp farther than this from ``now`` is not on the caller's clock
_FALLBACK = "use the 'replay' or 'synthetic' camera source to run without the camera"
_INSTALL = "install it with pip install pyrealsense2 (its wheel needs Debian's libusb-1.0-0: apt install libusb-1.0-0)"


def _enum_name(value: Any) -> str:
    """'brown_conrady' for rs.distortion.brown_conrady, a string stand-in or 'distortion.brown_conrady'."""
    name = getattr(value, "name", None)
    return str(name if isinstance(name, str) else value).split(".")[-1]


def intrinsics_from_realsense(intr: Any) -> CameraIntrinsics:
    """:class:`CameraIntrinsics` of an ``rs.intrinsics`` (width, height, fx, fy, ppx, ppy, model, coeffs).

    Distortion models are named as realsense-ros names them in ``CameraInfo``:
    Kannala-Brandt -> "equidistant" (4 coefficients), every Brown-Conrady
    variant and "none" -> "plumb_bob" (5 coefficients).
    """
    coeffs = tuple(float(c) for c in intr.coeffs)
    if _enum_name(intr.model) == "kannala_brandt4":
        model, coeffs = "equidistant", (coeffs + (0.0,) * 4)[:4]
    else:
        model, coeffs = "plumb_bob", (coeffs + (0.0,) * 5)[:5]
    return CameraIntrinsics(
        int(intr.width), int(intr.height), float(intr.fx), float(intr.fy), float(intr.ppx), float(intr.ppy),
        model, coeffs,
    ).check()


@CAMERA_BACKENDS.register
class RealSenseCamera(CameraSource):
    """A RealSense camera's colour (+ depth) stream (see the module doc)."""

    name = "realsense"
    SETTINGS = (
        Param("serial", str, "", "serial number of the camera (empty: the first found)"),
        Param("color_profile", str, "640x480x30", "colour WIDTHxHEIGHTxFPS", check=profile_problem),
        Param("depth_profile", str, "640x480x30", "depth WIDTHxHEIGHTxFPS", check=profile_problem),
        Param("enable_depth", bool, True, "stream depth"),
        Param("align_depth", bool, True, "align depth to the colour image"),
    )

    @property
    def nominal_fps(self) -> float:
        return float(self.color_profile.fps)

    def __init__(
        self,
        serial: str = "",
        color_profile: str = "640x480x30",
        depth_profile: str = "640x480x30",
        enable_depth: bool = True,
        align_depth: bool = True,
        recovery_timeout_s: float = 2.0,
        rs_module: Any = None,
    ) -> None:
        """
        Args:
            serial: serial number of the camera to open; "" = the first one listed.
            color_profile: colour stream "WIDTHxHEIGHTxFPS".
            depth_profile: depth stream "WIDTHxHEIGHTxFPS".
            enable_depth: stream depth too.
            align_depth: register depth to the colour image (depth frames then
                have the colour size and intrinsics).
            recovery_timeout_s: restart the pipeline after this long [s] without a frame.
            rs_module: the ``pyrealsense2`` module or a stand-in with the same
                attributes (tests); default: ``import pyrealsense2`` in :meth:`start`.

        Raises:
            ConfigurationError: a malformed profile or a timeout <= 0.
        """
        super().__init__()
        self.serial = str(serial or "").strip()
        self.color_profile: Profile = parse_profile(color_profile)
        self.depth_profile: Profile | None = parse_profile(depth_profile) if enable_depth else None
        self.align_depth = bool(align_depth) and enable_depth
        if not (math.isfinite(recovery_timeout_s) and recovery_timeout_s > 0):
            raise ConfigurationError(f"realsense camera: recovery_timeout_s must be > 0 [s], got {recovery_timeout_s}")
        self.recovery_timeout_s = float(recovery_timeout_s)
        self.restarts = 0  # pipeline restarts after a stall (USB drop)
        self.failed_restarts = 0  # restart attempts that failed (device gone, start error)
        self.last_error = ""  # the most recent device error, in words ("" if none yet)
        self.frames = 0  # frames delivered
        self.device_serial = ""  # the serial of the opened camera, after start
        self.device_name = ""
        self._rs: Any = rs_module
        self._pipeline: Any = None
        self._align: Any = None
        self._depth_scale = DEFAULT_DEPTH_SCALE
        self._last_frame_now: float | None = None  # caller time of the last frame (or of start / a restart)
        self._lock = threading.Lock()  # guards _pipeline against the recovery thread
        self._recovery: threading.Thread | None = None
        self._started = False
        self._closed = False

    # ----------------------------------------------------------------------------- start
    def _import(self) -> Any:
        if self._rs is None:
            try:
                import pyrealsense2 as rs  # optional dependency
            except Exception as exc:  # ImportError, or OSError for a missing libusb-1.0 / librealsense
                raise HardwareUnavailableError(
                    f"the 'pyrealsense2' Python package cannot be loaded ({type(exc).__name__}: {exc}); "
                    f"{_INSTALL}, or {_FALLBACK}"
                ) from exc
            self._rs = rs
        return self._rs

    def _devices(self) -> list[tuple[str, str]]:
        """(serial, name) of every connected RealSense device."""
        rs = self._rs
        out = []
        for dev in rs.context().query_devices():
            out.append((str(dev.get_info(rs.camera_info.serial_number)), str(dev.get_info(rs.camera_info.name))))
        return out

    def _config(self) -> Any:
        rs = self._rs
        config = rs.config()
        config.enable_device(self.device_serial)
        c = self.color_profile
        config.enable_stream(rs.stream.color, c.width, c.height, rs.format.rgb8, c.fps)
        if self.depth_profile is not None:
            d = self.depth_profile
            config.enable_stream(rs.stream.depth, d.width, d.height, rs.format.z16, d.fps)
        return config

    def _streams(self) -> str:
        text = f"colour {self.color_profile} rgb8"
        return text + (f", depth {self.depth_profile} z16" if self.depth_profile is not None else "")

    def start(self, now: float) -> None:
        """Open the camera and start streaming (does nothing if already started).

        Raises:
            HardwareUnavailableError: ``pyrealsense2`` cannot be imported, no
                RealSense is connected, the one with ``serial`` is not (the
                message lists the serials seen), or the pipeline fails to start.
            ConfigurationError: the camera does not support the profiles.
        """
        if self._started and not self._closed:
            return
        rs = self._import()
        try:
            devices = self._devices()
        except Exception as exc:  # librealsense backend errors (rs.error subclasses RuntimeError)
            raise HardwareUnavailableError(f"cannot list RealSense devices: {exc}; {_FALLBACK}") from exc
        if not devices:
            raise HardwareUnavailableError(
                "no RealSense device connected (check the USB 3 cable and the udev rules); " + _FALLBACK
            )
        if self.serial:
            names = dict(devices)
            if self.serial not in names:
                raise HardwareUnavailableError(
                    f"no RealSense with serial {self.serial!r} is connected; connected: "
                    + ", ".join(f"{s} ({n})" for s, n in devices)
                )
            self.device_serial, self.device_name = self.serial, names[self.serial]
        else:
            self.device_serial, self.device_name = devices[0]
            if len(devices) > 1:
                _LOG.warning(
                    "several RealSense devices connected (%s); using %s (set serial to choose)",
                    ", ".join(s for s, _ in devices), self.device_serial,
                )
        pipeline = rs.pipeline()
        config = self._config()
        try:
            resolvable = config.can_resolve(rs.pipeline_wrapper(pipeline))
        except Exception as exc:
            raise HardwareUnavailableError(f"RealSense {self.device_serial}: cannot query its streams: {exc}") from exc
        if not resolvable:
            raise ConfigurationError(
                f"RealSense {self.device_serial} ({self.device_name}) does not support {self._streams()}; "
                "choose profiles it lists (rs-enumerate-devices)"
            )
        try:
            profile = pipeline.start(config)
        except Exception as exc:
            raise HardwareUnavailableError(
                f"RealSense {self.device_serial}: cannot start {self._streams()}: {exc}"
            ) from exc
        try:
            color = profile.get_stream(rs.stream.color).as_video_stream_profile().get_intrinsics()
            self._intrinsics = intrinsics_from_realsense(color)
            self._depth_intrinsics = None
            if self.depth_profile is not None:
                if self.align_depth:
                    self._depth_intrinsics = self._intrinsics
                else:
                    depth = profile.get_stream(rs.stream.depth).as_video_stream_profile().get_intrinsics()
                    self._depth_intrinsics = intrinsics_from_realsense(depth)
                self._depth_scale = float(profile.get_device().first_depth_sensor().get_depth_scale())
        except Exception:
            pipeline.stop()
            raise
        self._align = rs.align(rs.stream.color) if self.align_depth else None
        with self._lock:
            self._pipeline = pipeline
        self._last_frame_now = float(now)
        self._started, self._closed = True, False
        _LOG.info("RealSense %s (%s) streaming %s", self.device_serial, self.device_name, self._streams())

    # ----------------------------------------------------------------------------- read
    def _stamp(self, frame: Any, now: float) -> float:
        rs = self._rs
        try:
            domain = frame.get_frame_timestamp_domain()
            if domain in (rs.timestamp_domain.system_time, rs.timestamp_domain.global_time):
                stamp = float(frame.get_timestamp()) * 1e-3
                if abs(stamp - now) <= MAX_CLOCK_OFFSET_S:
                    return min(stamp, now)
        except Exception:  # noqa: BLE001 - stamps are best effort: any failure falls back to the poll time
            pass
        return now

    def _poll(self, now: float) -> CameraFrame | None:
        """The newest undelivered frameset as a frame, or None."""
        with self._lock:
            pipeline = self._pipeline
            if pipeline is None:
                return None
            frames = pipeline.poll_for_frames()
            if not frames:
                return None
            if self._align is not None:
                frames = self._align.process(frames)
            color = frames.get_color_frame()
            if not color:
                return None
            rgb = np.array(np.asanyarray(color.get_data()), dtype=np.uint8, copy=True)
            depth = None
            if self.depth_profile is not None:
                depth_frame = frames.get_depth_frame()
                if depth_frame:
                    depth = np.array(np.asanyarray(depth_frame.get_data()), dtype=np.uint16, copy=True)
            stamp = self._stamp(color, now)
        return CameraFrame(stamp, rgb, depth, self._depth_scale)

    def read(self, now: float) -> list[CameraFrame]:
        """The newest frame captured since the previous call (at most one; never blocks, never raises for the device).

        Raises RuntimeError when called before :meth:`start` or after :meth:`close`.
        """
        if not self._started or self._closed:
            raise RuntimeError("RealSenseCamera.read() called before start() or after close()")
        if self._recovery is not None:
            if self._recovery.is_alive():
                return []
            self._recovery = None
            self._last_frame_now = float(now)  # give the restarted (or not) pipeline a full timeout
        try:
            frame = self._poll(now)
        except Exception as exc:  # noqa: BLE001 - rs.error on a USB drop, or anything else: read never raises
            self._note_error(f"polling frames failed: {exc}")
            frame = None
        if frame is not None:
            self.frames += 1
            self._last_frame_now = float(now)
            return [frame]
        assert self._last_frame_now is not None
        if now - self._last_frame_now > self.recovery_timeout_s:
            self._note_error(f"no frame for {now - self._last_frame_now:.1f} s; restarting the pipeline")
            self._recovery = threading.Thread(target=self._recover, name="realsense-recovery", daemon=True)
            self._recovery.start()
        return []

    def _note_error(self, text: str) -> None:
        if text != self.last_error:
            _LOG.warning("RealSense %s: %s", self.device_serial, text)
        self.last_error = text

    def _recover(self) -> None:
        """Stop the pipeline; start a new one if the device is listed (runs in the recovery thread)."""
        with self._lock:
            pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            try:
                pipeline.stop()
            except Exception as exc:  # noqa: BLE001 - stopping a pipeline whose device vanished may fail
                _LOG.debug("RealSense %s: stop failed: %s", self.device_serial, exc)
        if self._closed:
            return
        try:
            if self.device_serial not in dict(self._devices()):
                self.failed_restarts += 1
                self._note_error(f"device {self.device_serial} is not connected; retrying")
                return
            new = self._rs.pipeline()
            new.start(self._config())
        except Exception as exc:  # noqa: BLE001 - a failed restart is counted and retried, never raised
            self.failed_restarts += 1
            self._note_error(f"restart failed: {exc}")
            return
        with self._lock:
            if self._closed:
                new.stop()
                return
            self._pipeline = new
        self.restarts += 1
        _LOG.info("RealSense %s: pipeline restarted (%d restart(s) so far)", self.device_serial, self.restarts)

    @property
    def recovering(self) -> bool:
        """True while the recovery thread restarts the pipeline."""
        return self._recovery is not None and self._recovery.is_alive()

    def diagnostics(self) -> dict[str, Any]:
        return {
            "serial": self.device_serial,
            "name": self.device_name,
            "frames": self.frames,
            "restarts": self.restarts,
            "failed_restarts": self.failed_restarts,
            "recovering": self.recovering,
            "last_error": self.last_error,
            "dropped": self.dropped,
        }

    # ----------------------------------------------------------------------------- close
    def close(self, timeout_s: float = 5.0) -> None:
        """Stop streaming (idempotent; waits up to ``timeout_s`` [s] for a running recovery)."""
        if self._closed:
            return
        self._closed = True
        recovery = self._recovery
        if recovery is not None:
            recovery.join(timeout_s)
        self._recovery = None
        with self._lock:
            pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            try:
                pipeline.stop()
            except Exception as exc:  # noqa: BLE001 - closing regardless (the device may be gone)
                _LOG.debug("RealSense %s: stop failed: %s", self.device_serial, exc)
        self._started = False
