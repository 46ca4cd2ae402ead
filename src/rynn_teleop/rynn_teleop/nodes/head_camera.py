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

The synthetic scene is seen from the description's head camera (``description_overlay``) and, with
``synthetic.draw_robot``, shows the robot standing at the table at the measured joints, as the physical
camera would (colour and depth):

    <synthetic.joint_states_topic>   sensor_msgs/JointState (in, default /joint_states; any subset of the
                                     54 joints per message, merged by name; reliable, drained twice a frame)

Each frame draws the newest positions received by its delivery; joints never received stay at the home
pose (``sources.camera.synthetic.home_position``: arms at DEFAULT_HOME, hands open); when the joint states
stop, the last pose received stays.
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.serialization import deserialize_message
from rclpy.time import Time
from sensor_msgs.msg import CameraInfo, Image, JointState

from ..core.camera import parse_profile
from ..core.joint_state import JointStateBuffer
from ..core.params import Param, ParamSchema
from ..errors import ConfigurationError, ParameterError
from ..sources.camera import CAMERA_KINDS, make_camera_source
from ..sources.camera.synthetic import home_position
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .conversions import camera_info_message, image_message

# measured joint states, as the drivers publish them (reliable); drained twice per frame: 50 messages hold the
# arm (200 Hz) and hand (100 Hz) drivers' output for 1/6 s, five frames at 30 Hz
JOINT_STATES_QOS = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)


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
            DESCRIPTION_OVERLAY,  # the synthetic scene's head camera pose and the robot it draws
            Param("synthetic.profile", str, "640x480x30", "synthetic scene: WIDTHxHEIGHTxFPS"),
            Param("synthetic.seed", int, 0, "synthetic scene: random seed", min=0, max=2**31 - 1),
            Param("synthetic.depth", bool, True, "synthetic scene: also publish depth"),
            Param("synthetic.draw_robot", bool, True,
                  "synthetic scene: draw the robot at the measured joint states over the tabletop (colour and "
                  "depth), as the head camera on the robot sees it"),
            Param("synthetic.joint_states_topic", str, "/joint_states",
                  "synthetic scene (draw_robot): measured joint states the robot is drawn at"),
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
        self.joint_states = None  # the measured joints merged by name (synthetic scene with the robot)
        self._joint_states_sub = None
        if kind == "synthetic":
            prof = _profile(p, "synthetic.profile")
            robot = robot_from_overlay(p["description_overlay"])
            kwargs = dict(width=prof.width, height=prof.height, fps=float(prof.fps), seed=p["synthetic.seed"],
                          depth=p["synthetic.depth"], draw_robot=p["synthetic.draw_robot"], robot_model=robot)
            if p["synthetic.draw_robot"]:
                self.joint_states = JointStateBuffer(home_position(robot))
                self._joint_states_sub = self.create_polled_subscription(
                    JointState, p["synthetic.joint_states_topic"], JOINT_STATES_QOS, raw=True)
                self.meter("joint_states_in")
            # two ticks per frame, on the frame grid: a frame is published right at its capture time, the next
            # one rendered ahead half a frame later (work right after a publish delays its delivery to other
            # processes by that long: bench/camera.py)
            period = 0.5 / prof.fps
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
        self._prepare_between_frames = kind == "synthetic"
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
        if self._joint_states_sub is not None:
            self._take_joint_states()
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
            published = self.now_s()  # capture -> publish, including the source's work in read()
            self._info_pub.publish(camera_info_message(self.source.intrinsics, stamp, p["color_frame_id"]))
            if frame.depth is not None and self._depth_pub is not None:
                frame_id = p["color_frame_id"] if self.depth_aligned else p["depth_frame_id"]
                self._depth_pub.publish(image_message(frame.depth, "16UC1", stamp, frame_id))
                depth_intr = self.source.depth_intrinsics or self.source.intrinsics
                self._depth_info_pub.publish(camera_info_message(depth_intr, stamp, frame_id))
            self.frames += 1
            self.meter("color").tick(published, published - frame.stamp)
        # the next frame's work: the synthetic scene's on the tick between two frames, other sources' after one
        if (not frames) if self._prepare_between_frames else frames:
            self.source.prepare_next()

    def _take_joint_states(self) -> None:
        """Merge the joint states received since the last frame and hand the whole pose to the source. Messages
        are taken as CDR bytes; of several of the same joints (same first joint name) only the newest is
        deserialized (a frame shows one pose)."""
        newest, _ = self.take_newest_joint_states(self._joint_states_sub, "joint_states_in")
        if not newest:
            return
        state, merged = self.joint_states, False
        for raw, _ in newest:
            msg = deserialize_message(raw, JointState)
            merged |= state.update(msg.name, msg.position, msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec)
        if merged:  # a malformed message (counted in rejected_joint_states) changes nothing
            self.source.set_joint_positions(state.position, state.latest_stamp)

    def diagnostic_values(self):
        values = {"source": self.params["source"], "frames": self.frames, "read_errors": self.read_errors}
        if self.joint_states is not None:
            values["unknown_joint_names"] = len(self.joint_states.unknown_names)
            values["rejected_joint_states"] = self.joint_states.rejected
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
