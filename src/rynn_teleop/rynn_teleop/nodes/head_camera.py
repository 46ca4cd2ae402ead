"""head_camera node: the physical head camera stream (RealSense, a replay, or a synthetic scene).

Publishes realsense-ros style topics under ``<namespace>`` (default
``/head_camera/physical``, the physical source the feed switch reads): colour, and depth where the source's
depth is registered to colour (``aligned_depth_to_color/``: synthetic, RealSense align_depth) or not
(``depth/``, frame ``depth_frame_id``). Frame ids ``camera_color_optical_frame`` / ``camera_depth_optical_frame``;
header stamps are the capture times. Backends (``backend`` parameter, registered in ``sources.camera``; each
with its settings under ``<backend>.``): ``realsense`` (pyrealsense2; no device or no runtime stops the node
at start saying so; USB drops are recovered and counted), ``replay`` (a rosbag2 recorded by this
stack, a video file or an image folder) and ``synthetic`` (a procedurally
drawn tabletop, deterministic; the demo's and the tests' reference image).

The synthetic scene is seen from the description's head camera (``description_overlay``) and, with
``synthetic.draw_robot``, shows the robot standing at the table at the measured joints, as the physical
camera would (colour and depth). A backend that shows joints (``CameraSource.joint_states_topic``) gets
the measured joint states (its own ``IO`` declares the subscription). Each frame draws the newest positions
received by its delivery; joints never received stay at the home
pose (``sources.camera.synthetic.home_position``: arms at DEFAULT_HOME, hands open); when the joint states
stop, the last pose received stays. A backend whose frames follow other topics
(``CameraSource.message_inputs``: the synthetic scene follows the physical twin's ``/twin/scene`` and
``/twin/objects``) gets their messages, drained at every poll before the backend is read.
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from rclpy.time import Time
from sensor_msgs.msg import JointState

from ..core.joint_state import JointStateBuffer
from ..core.node_io import SENSOR_DATA, NodeIO, Topic, when
from ..core.params import Param
from ..core.plugins import BackendSchema
from ..sources.camera import CAMERA_BACKENDS, CameraContext
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .conversions import camera_info_message, image_message
from .io import interface_class, qos_profile

# measured joint states, as the drivers publish them (reliable); drained twice per frame: 50 messages hold the
# arm (200 Hz) and hand (100 Hz) drivers' output for 1/6 s, five frames at 30 Hz
JOINT_STATES_QOS = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)


class HeadCameraNode(TeleopNode):
    PRIORITY = "stream"
    SCHEMA = BackendSchema(
        "head_camera",
        [
            Param("namespace", str, "/head_camera/physical", "topic prefix (color/..., depth/...)"),
            Param("color_frame_id", str, "camera_color_optical_frame", "frame id of colour images"),
            Param("depth_frame_id", str, "camera_depth_optical_frame", "frame id of depth images"),
            Param("poll_hz", float, 200.0,
                  "how often the backend is polled for new frames (bounds the capture-to-publish delay)", "Hz",
                  min=5.0, max=1000.0),
            DESCRIPTION_OVERLAY,  # the synthetic scene's head camera pose and the robot it draws
        ],
        backends=CAMERA_BACKENDS, default="synthetic", description="camera backend", renamed={"source": "backend"},
    )
    IO = NodeIO(
        publishers=(
            Topic("{namespace}/color/image_raw", "sensor_msgs/msg/Image", SENSOR_DATA,
                  "colour, rgb8, frame color_frame_id, stamped with the capture time"),
            Topic("{namespace}/color/camera_info", "sensor_msgs/msg/CameraInfo", SENSOR_DATA,
                  "the colour intrinsics, same stamps"),
            Topic("{namespace}/aligned_depth_to_color/image_raw", "sensor_msgs/msg/Image", SENSOR_DATA,
                  "depth registered to colour, 16UC1 [mm], in the colour frame", when=(when("depth", "aligned"),)),
            Topic("{namespace}/aligned_depth_to_color/camera_info", "sensor_msgs/msg/CameraInfo", SENSOR_DATA,
                  "its intrinsics (the colour ones)", when=(when("depth", "aligned"),)),
            Topic("{namespace}/depth/image_rect_raw", "sensor_msgs/msg/Image", SENSOR_DATA,
                  "depth in its own frame depth_frame_id, 16UC1 [mm]", when=(when("depth", "separate"),)),
            Topic("{namespace}/depth/camera_info", "sensor_msgs/msg/CameraInfo", SENSOR_DATA,
                  "the depth intrinsics", when=(when("depth", "separate"),)),
        ),
        facts={"depth": "the backend's depth: aligned (registered to colour), separate (its own frame) or none"},
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        context = CameraContext(robot=lambda: robot_from_overlay(p["description_overlay"]))
        self.source = self.close_on_destroy(self.SCHEMA.create(p, context))
        self.joint_states = None  # the measured joints merged by name (a backend that shows them)
        self._joint_states_sub = None
        if self.source.joint_states_topic is not None:
            self.joint_states = JointStateBuffer(self.source.joint_positions)
            self._joint_states_sub = self.create_polled_subscription(
                JointState, self.source.joint_states_topic, JOINT_STATES_QOS, raw=True)
            self.meter("joint_states_in")
        # other topics the frames follow (declared in the backend's own IO): drained before every read
        self._source_inputs = {
            self.create_polled_subscription(interface_class(spec.type), topic, qos_profile(spec.qos)): topic
            for topic, spec in self.source.message_inputs().items()}
        if self.source.nominal_fps is not None:
            self.meter("color", nominal_hz=self.source.nominal_fps)
        poll_hz = self.source.poll_rate(p["poll_hz"])
        self.source.start(self.now_s())
        self._align_on_first_tick = self.source.aligns_to_ticks
        self._prepare_between_frames = self.source.prepare_between_frames
        self.read_errors = 0
        self._last_error = ""
        self._color_pub = self.io_publisher("{namespace}/color/image_raw")
        self._info_pub = self.io_publisher("{namespace}/color/camera_info")
        self._depth_pub = self._depth_info_pub = None
        # registered (aligned) depth goes where realsense-ros puts it, in the colour frame
        self.depth_aligned = self.source.has_depth and self.source.depth_intrinsics == self.source.intrinsics
        self.io_facts["depth"] = ("none" if not self.source.has_depth else
                                  "aligned" if self.depth_aligned else "separate")
        if self.source.has_depth:
            folder = "{namespace}/aligned_depth_to_color" if self.depth_aligned else "{namespace}/depth"
            image = "image_raw" if self.depth_aligned else "image_rect_raw"
            self._depth_pub = self.io_publisher(f"{folder}/{image}")
            self._depth_info_pub = self.io_publisher(f"{folder}/camera_info")
        self.frames = 0
        self._loop = self.create_loop(poll_hz, self._poll, "capture")
        intr = self.source.intrinsics
        self.get_logger().info(f"{p['backend']} camera {intr.width}x{intr.height} on {self._color_pub.topic_name}")

    def _poll(self) -> None:
        """Publish the frames captured since the last call; a failing read is counted and reported
        (ERROR in /diagnostics), never ends the timer."""
        now = self.now_s()
        if self._align_on_first_tick:  # (synthetic) its frame grid on this loop's ticks
            self._align_on_first_tick = False
            self.start_grid_on_this_tick(self.source, now)
        if self._joint_states_sub is not None:
            self._take_joint_states()
        for sub, topic in self._source_inputs.items():
            for taken in self.take_all(sub):
                self.source.feed(topic, taken.message)
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
        # the next frame's work: on the tick between two frames (the synthetic scene), or right after frames
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
        values = {"backend": self.params["backend"], "frames": self.frames, "read_errors": self.read_errors}
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


def main(args=None) -> int:
    return run_single(HeadCameraNode, args)
