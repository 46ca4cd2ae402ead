"""head_camera node: the physical head camera stream (RealSense, a replay, or a synthetic scene).

Publishes realsense-ros style topics under ``<namespace>`` (default
``/head_camera/physical``, the physical source the feed switch reads):

    <namespace>/color/image_raw        sensor_msgs/Image (rgb8), SensorDataQoS
    <namespace>/color/camera_info      sensor_msgs/CameraInfo, SensorDataQoS
    <namespace>/aligned_depth_to_color/image_raw (+ camera_info)   16UC1 [mm] in the colour frame, when the
                                      source's depth is registered to colour (synthetic, RealSense align_depth)
    <namespace>/depth/image_rect_raw (+ camera_info)              otherwise, frame ``depth_frame_id``

Frame ids ``camera_color_optical_frame`` / ``camera_depth_optical_frame``;
header stamps are the capture times. Backends (``source``): ``realsense``
(pyrealsense2; no device or no runtime stops the node at start saying so;
USB drops are recovered and counted), ``replay`` (a rosbag2 recorded by this
stack, a video file or an image folder) and ``synthetic`` (a procedurally
drawn tabletop, deterministic; the demo's and the tests' reference image).
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import CameraInfo, Image

from ..core.camera import parse_profile
from ..core.params import Param, ParamSchema
from ..errors import ConfigurationError, ParameterError
from ..sources.camera import CAMERA_KINDS, make_camera_source
from .base import TeleopNode, run_single
from .conversions import camera_info_message, image_message


class HeadCameraNode(TeleopNode):
    PRIORITY = "stream"
    SCHEMA = ParamSchema(
        "head_camera",
        [
            Param("source", str, "synthetic", "camera backend", choices=CAMERA_KINDS),
            Param("namespace", str, "/head_camera/physical", "topic prefix (color/..., depth/...)"),
            Param("color_frame_id", str, "camera_color_optical_frame", "frame id of colour images"),
            Param("depth_frame_id", str, "camera_depth_optical_frame", "frame id of depth images"),
            Param("poll_hz", float, 200.0,
                  "how often the backend is polled for new frames (bounds the capture-to-publish delay)", "Hz",
                  min=5.0, max=1000.0),
            Param("synthetic.profile", str, "640x480x30", "synthetic scene: WIDTHxHEIGHTxFPS"),
            Param("synthetic.seed", int, 0, "synthetic scene: random seed", min=0, max=2**31 - 1),
            Param("synthetic.depth", bool, True, "synthetic scene: also publish depth"),
            Param("replay.path", str, "", "replay: rosbag2 directory, video file or image folder"),
            Param("replay.rate_hz", float, 0.0, "replay: frame rate (0 = as recorded / the video's / 30 Hz)", "Hz",
                  min=0.0, max=240.0),
            Param("replay.loop", bool, True, "replay: start again at the end"),
            Param("replay.topic", str, "/head_camera/color/image_raw",
                  "replay (rosbag2): colour topic to play (its camera_info and depth are found next to it)"),
            Param("realsense.serial", str, "", "realsense: serial number of the camera (empty: the first found)"),
            Param("realsense.color_profile", str, "640x480x30", "realsense: colour WIDTHxHEIGHTxFPS"),
            Param("realsense.depth_profile", str, "640x480x30", "realsense: depth WIDTHxHEIGHTxFPS"),
            Param("realsense.enable_depth", bool, True, "realsense: stream depth"),
            Param("realsense.align_depth", bool, True, "realsense: align depth to the colour image"),
        ],
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        kind = p["source"]
        period = 1.0 / p["poll_hz"]
        if kind == "synthetic":
            prof = _profile(p, "synthetic.profile")
            kwargs = dict(width=prof.width, height=prof.height, fps=float(prof.fps), seed=p["synthetic.seed"],
                          depth=p["synthetic.depth"])
            period = 1.0 / prof.fps  # ticks on the frame grid: a frame is published right at its capture time
            self.meter("color", nominal_hz=prof.fps)
        elif kind == "replay":
            if not p["replay.path"].strip():
                raise ParameterError("replay.path", "source replay needs replay.path: a rosbag2 directory, a video "
                                     "file or an image folder")
            kwargs = dict(path=p["replay.path"], rate_hz=p["replay.rate_hz"] or None, loop=p["replay.loop"],
                          topic=p["replay.topic"])
        else:
            for key in ("realsense.color_profile", "realsense.depth_profile"):
                _profile(p, key)  # a bad profile names its key before the device is touched
            self.meter("color", nominal_hz=_profile(p, "realsense.color_profile").fps)
            kwargs = dict(serial=p["realsense.serial"], color_profile=p["realsense.color_profile"],
                          depth_profile=p["realsense.depth_profile"], enable_depth=p["realsense.enable_depth"],
                          align_depth=p["realsense.align_depth"])
        self.source = self.close_on_destroy(make_camera_source(kind, **kwargs))
        self.source.start(self.now_s())
        self._align_on_first_tick = kind == "synthetic"
        self.read_errors = 0
        self._last_error = ""
        ns = p["namespace"].rstrip("/")
        qos = qos_profile_sensor_data
        self._color_pub = self.create_publisher(Image, f"{ns}/color/image_raw", qos)
        self._info_pub = self.create_publisher(CameraInfo, f"{ns}/color/camera_info", qos)
        self._depth_pub = self._depth_info_pub = None
        self.depth_aligned = False
        if self.source.has_depth:
            # registered (aligned) depth goes where realsense-ros puts it, in the colour frame
            self.depth_aligned = self.source.depth_intrinsics == self.source.intrinsics
            topic = "aligned_depth_to_color/image_raw" if self.depth_aligned else "depth/image_rect_raw"
            self._depth_pub = self.create_publisher(Image, f"{ns}/{topic}", qos)
            self._depth_info_pub = self.create_publisher(CameraInfo, f"{ns}/{topic.rsplit('/', 1)[0]}/camera_info", qos)
        self.frames = 0
        self._loop = self.create_loop(1.0 / period, self._poll, "capture")
        intr = self.source.intrinsics
        self.get_logger().info(f"{kind} camera {intr.width}x{intr.height} on {ns}/color/image_raw")

    def _poll(self) -> None:
        """Publish the frames captured since the last call; a failing read is counted and reported
        (ERROR in /diagnostics), never ends the timer."""
        now = self.now_s()
        if self._align_on_first_tick:  # synthetic: its frame grid on this loop's ticks
            self._align_on_first_tick = False
            self.start_grid_on_this_tick(self.source, now)
        try:
            frames = self.source.read(now)
        except Exception as exc:  # noqa: BLE001 - see above
            self.read_errors += 1
            self._last_error = repr(exc)
            self.get_logger().error(f"camera read failed: {exc!r}", throttle_duration_sec=5.0)
            return
        for frame in frames:
            stamp = Time(nanoseconds=int(round(frame.stamp * 1e9))).to_msg()
            p = self.params
            self._color_pub.publish(image_message(frame.color, "rgb8", stamp, p["color_frame_id"]))
            self._info_pub.publish(camera_info_message(self.source.intrinsics, stamp, p["color_frame_id"]))
            if frame.depth is not None and self._depth_pub is not None:
                frame_id = p["color_frame_id"] if self.depth_aligned else p["depth_frame_id"]
                self._depth_pub.publish(image_message(frame.depth, "16UC1", stamp, frame_id))
                depth_intr = self.source.depth_intrinsics or self.source.intrinsics
                self._depth_info_pub.publish(camera_info_message(depth_intr, stamp, frame_id))
            self.frames += 1
            self.meter("color").tick(now, now - frame.stamp)
        if frames:
            self.source.prepare_next()

    def diagnostic_values(self):
        values = {"source": self.params["source"], "frames": self.frames, "read_errors": self.read_errors}
        if self._last_error:
            values["last_read_error"] = self._last_error
        values.update({k: str(v) for k, v in self.source.diagnostics().items()})
        return values

    def diagnostic_level(self):
        if self._last_error and self.meter("color").rate(self.now_s()) == 0.0:
            return DiagnosticStatus.ERROR, f"camera read failing: {self._last_error}"
        if self.meter("color").rate(self.now_s()) == 0.0:
            return DiagnosticStatus.WARN, "no frames"
        return DiagnosticStatus.OK, "streaming"



def _profile(p, key: str):
    try:
        return parse_profile(p[key])
    except ConfigurationError as exc:
        raise ParameterError(key, f"{key}: {exc}") from None


def main(args=None) -> int:
    return run_single(HeadCameraNode, args)
