"""world_model node: generated head-camera frames for digital teleoperation.

The operator's commands drive a world model instead of (or beside) the robot;
the model renders what the head camera would see, frame by frame, and each
frame is tied to one known 54-D action.

Timing: a generation thread (off the executor) ticks at the profile's rate.
Each tick conditions on the newest action if a newer command arrived since
the last one (commands overwritten in between are dropped and counted) and
publishes one frame, stamped with the header stamp of the newest command its
action used, so a recorded action and its frame align exactly and no two
frames share a stamp (``world_model.stream``). A block-wise backend
(diffusion) returns frames a block at a time; they leave one per tick, a
block later. Without new commands no frame is generated (the feed goes
silent, which the camera switch reports); a half-full block is completed by
repeating the last action so its frame is still shown. No frame is generated
before every one of the 54 joints has been commanded once (diagnostics name
the missing groups). Real frames on ``reanchor_topic`` are subscribed only
for a backend that re-anchors on them (diffusion).

Reference frame (the stream's first frame, ``reference.source``): the synthetic tabletop, an image file, the
first frame on a camera topic, or ``twin``: the physical twin's layout (table, targets, objects where an episode
starts) drawn without the robot from the first ``/twin/scene`` message, so that a generated episode on a twin
layout starts from the scene the twin simulates.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.serialization import deserialize_message
from rclpy.time import Time
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from ..core.camera import default_intrinsics, parse_profile
from ..core.layout import SIDES
from ..core.node_io import LATCHED, SENSOR_DATA, NodeIO, QoS, Topic, unless, when
from ..core.params import Param
from ..core.plugins import BackendSchema
from ..core.robot_model import arm_joint_names, hand_joint_names
from ..core.scheduling import name_this_thread
from ..errors import ConfigurationError, ParameterError
from ..world_model.generator import WORLD_MODEL_BACKENDS, WorldModelContext, as_rgb
from ..world_model.stream import ActionStream, FrameQueue
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .conversions import camera_info_message, image_array, image_message

# commands are reliable (as published); drained at each generation tick, where the newest wins (50 = a quarter
# second of 200 Hz commands)
ACTION_QOS = QoS(50)
GROUPS = {f"{side}_{part}": names(side) for side in SIDES
          for part, names in (("arm", arm_joint_names), ("hand", hand_joint_names))}


class WorldModelNode(TeleopNode):
    PRIORITY = "generate"
    SCHEMA = BackendSchema(
        "world_model",
        [
            DESCRIPTION_OVERLAY,
            Param("profile", str, "640x480x30", "output WIDTHxHEIGHTxFPS (frames are generated at this rate)"),
            Param("namespace", str, "/head_camera/generated", "topic prefix of the generated camera"),
            Param("color_frame_id", str, "camera_color_optical_frame", "frame id of the generated images"),
            Param("camera.fx", float, 0.0, "focal length u of the generated camera (0 = the default D435-like "
                  "intrinsics of the profile size, as the synthetic camera)", "px", min=0.0, max=1e5),
            Param("camera.fy", float, 0.0, "focal length v (0 = default)", "px", min=0.0, max=1e5),
            Param("camera.cx", float, -1.0, "principal point u (-1 = image centre)", "px", min=-1.0, max=1e5),
            Param("camera.cy", float, -1.0, "principal point v (-1 = image centre)", "px", min=-1.0, max=1e5),
            Param("action_source", str, "commands", "what drives the model: the teleop commands or the drivers' "
                  "measured /joint_states", choices=("commands", "joint_states")),
            Param("arms_topic", str, "/arms/command", "arm commands (14 joints)"),
            Param("hands_topic", str, "/hands/command", "hand commands (20 joints per message)"),
            Param("joint_states_topic", str, "/joint_states", "measured joint states (action_source joint_states)"),
            Param("reference.source", str, "synthetic", "first frame of the stream: the synthetic tabletop, an image "
                  "file, the first frame on a camera topic, or the physical twin's layout (its objects where an "
                  "episode starts, drawn from the first reference.twin_scene_topic message)",
                  choices=("synthetic", "file", "topic", "twin")),
            Param("reference.path", str, "", "reference.source file: an image file (PNG, JPEG)"),
            Param("reference.topic", str, "/head_camera/physical/color/image_raw",
                  "reference.source topic: camera topic whose first frame is the reference"),
            Param("reference.seed", int, 0, "reference.source synthetic: scene seed", min=0, max=2**31 - 1),
            Param("reference.twin_scene_topic", str, "/twin/scene",
                  "reference.source twin: the twin's latched scene (JSON) whose first message is drawn"),
            Param("reanchor_topic", str, "/head_camera/physical/color/image_raw",
                  "real frames offered to the model for re-anchoring (empty = none)"),
            Param("publish_condition", bool, False, "also publish the condition (skeleton) image on "
                  "<namespace>/condition/image_raw"),
            Param("condition.colormap", str, "plasma", "skeleton image: OpenCV colour map name of depth, near = "
                  "its bright end (plasma, inferno, magma, viridis...)"),
            Param("condition.near_m", float, 0.25, "skeleton image: depth drawn brightest/largest", "m",
                  min=0.01, max=10.0),
            Param("condition.far_m", float, 1.2, "skeleton image: depth drawn darkest/smallest", "m",
                  min=0.02, max=20.0),
            Param("condition.radius_px", float, 6.0, "skeleton image: joint radius at condition.reference_m "
                  "(radius ~ 1/depth)", "px", min=0.5, max=100.0),
            Param("condition.reference_m", float, 0.6, "skeleton image: depth at which a joint has radius_px", "m",
                  min=0.01, max=20.0),
        ],
        backends=WORLD_MODEL_BACKENDS, default="render", description="generator: render (robot drawn over the "
        "reference frame), diffusion (the learned model; needs a checkpoint), or another registered backend",
    )
    IO = NodeIO(
        publishers=(
            Topic("{namespace}/color/image_raw", "sensor_msgs/msg/Image", SENSOR_DATA,
                  "the generated frames, rgb8, frame color_frame_id, each stamped with the newest command its "
                  "action used"),
            Topic("{namespace}/color/camera_info", "sensor_msgs/msg/CameraInfo", SENSOR_DATA,
                  "the generated camera's intrinsics, same stamps"),
            Topic("{namespace}/condition/image_raw", "sensor_msgs/msg/Image", SENSOR_DATA,
                  "the condition (skeleton) image of each frame, rgb8", when=(when("publish_condition", True),)),
        ),
        subscriptions=(
            Topic("{arms_topic}", "sensor_msgs/msg/JointState", ACTION_QOS, "the arm commands that drive the model",
                  when=(when("action_source", "commands"),)),
            Topic("{hands_topic}", "sensor_msgs/msg/JointState", ACTION_QOS, "the hand commands that drive the model",
                  when=(when("action_source", "commands"),)),
            Topic("{joint_states_topic}", "sensor_msgs/msg/JointState", ACTION_QOS,
                  "the drivers' measured joints that drive the model", when=(when("action_source", "joint_states"),)),
            Topic("{reference.topic}", "sensor_msgs/msg/Image", SENSOR_DATA,
                  "its first frame is the reference frame of the stream", when=(when("reference.source", "topic"),)),
            Topic("{reference.twin_scene_topic}", "std_msgs/msg/String", LATCHED,
                  "the twin's scene; its first message, drawn without the robot, is the reference frame",
                  when=(when("reference.source", "twin"),)),
            Topic("{reanchor_topic}", "sensor_msgs/msg/Image", SENSOR_DATA,
                  "real frames offered to the model for re-anchoring",
                  when=(unless("reanchor_topic", ""), when("uses_real_frames", True))),
        ),
        facts={"uses_real_frames": "the backend re-anchors on real frames (diffusion)"},
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        profile = _profile(p)
        self.width, self.height, self.rate_hz = profile.width, profile.height, float(profile.fps)
        if p["condition.far_m"] <= p["condition.near_m"]:
            raise ParameterError("condition.far_m", f"condition.far_m ({p['condition.far_m']}) must be greater than "
                                 f"condition.near_m ({p['condition.near_m']})")
        self.intrinsics = _intrinsics(p, self.width, self.height)
        self.robot = robot_from_overlay(p["description_overlay"])
        self.conditioner = _conditioner(self.robot, self.intrinsics, p)
        self.generator = self.SCHEMA.create(p, WorldModelContext(self.robot, self.intrinsics))
        # None: the first frame on reference.topic, or the first scene on reference.twin_scene_topic
        reference = _load_reference(p, self.width, self.height, self.robot)

        self.actions = ActionStream(self.robot.joint_names, GROUPS, self.robot.neutral())
        self.frame_queue = FrameQueue(self.generator)
        self._lock = threading.Lock()  # guards actions, _reference, _real
        self._reference = reference
        self._real = None  # newest real frame (Image) not yet offered to the generator
        self.frames = self.idle_ticks = self.overruns = self.generation_errors = self.bad_images = 0
        # created before the generation thread can add them while diagnostics iterate the meters
        self.meter("frames", nominal_hz=self.rate_hz)
        self.meter("commands_in")

        self._image_pub = self.io_publisher("{namespace}/color/image_raw")
        self._info_pub = self.io_publisher("{namespace}/color/camera_info")
        # the camera info is the same for every frame but its stamp: built once, restamped per frame (publishing
        # serialises it at once)
        self._info_msg = camera_info_message(self.intrinsics, _stamp_msg(0), p["color_frame_id"])
        self._condition_pub = self.io_publisher("{namespace}/condition/image_raw") if p["publish_condition"] else None
        topics = (["{arms_topic}", "{hands_topic}"] if p["action_source"] == "commands"
                  else ["{joint_states_topic}"])
        # drained by the generation thread at each tick: no executor wake-up per command
        self._action_subs = [self.io_polled_subscription(topic, raw=True) for topic in topics]
        if p["reference.source"] == "topic":
            self.io_subscription("{reference.topic}", self._on_reference)
        elif p["reference.source"] == "twin":
            self.io_subscription("{reference.twin_scene_topic}", self._on_twin_scene)
        self.io_facts["uses_real_frames"] = self.generator.uses_real_frames
        self.reanchoring = bool(p["reanchor_topic"].strip()) and self.generator.uses_real_frames
        # the skeleton image is drawn per action only where it is used: by the backend or for publishing
        self._draws_condition = self._condition_pub is not None or self.generator.uses_condition
        if self.reanchoring:  # only a backend that re-anchors on real frames gets them
            self.io_subscription("{reanchor_topic}", self._on_real)

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._generate_loop, name="world_model", daemon=True)
        self._thread.start()
        self.get_logger().info(f"{p['backend']} world model {self.width}x{self.height} at {self.rate_hz:g} Hz on "
                               f"{self._image_pub.topic_name}")

    # ------------------------------------------------------------------ inputs (executor thread)
    def _on_joints(self, msg: JointState, received_s: float) -> bool:
        """Merge one command into the action; whether it was accepted."""
        stamp_ns = Time.from_msg(msg.header.stamp).nanoseconds
        with self._lock:
            accepted = self.actions.update(msg.name, msg.position, stamp_ns)
        return accepted

    def _take_actions(self) -> None:
        """What the action subscriptions received since the last tick. Messages are taken as CDR bytes; of
        several commands of the same joints (same first joint name) only the newest is deserialized and
        merged, the others count as dropped (a frame shows one action per tick)."""
        for sub in self._action_subs:
            newest, superseded = self.take_newest_joint_states(sub, "commands_in")
            if superseded:
                with self._lock:
                    self.actions.note_superseded(superseded)
            for raw, received_s in newest:
                self._on_joints(deserialize_message(raw, JointState), received_s)

    def _on_reference(self, msg: Image) -> None:
        self._offer_reference(lambda: as_rgb(image_array(msg), self.width, self.height), "reference frame")

    def _on_twin_scene(self, msg: String) -> None:
        """The first usable scene becomes the reference: the twin's table, targets and objects at their layout
        poses, without the robot (:func:`~rynn_teleop.sources.camera.synthetic.reference_frame`)."""
        from ..sources.camera.synthetic import reference_frame

        self._offer_reference(lambda: reference_frame(self.width, self.height, self.robot,
                                                      seed=self.params["reference.seed"], twin_scene=msg.data),
                              "twin scene")

    def _offer_reference(self, make, what: str) -> None:
        """Until the stream has a reference, ``make()`` it; an input it cannot use (ValueError, TypeError: e.g. a
        mono8 image, a scene this camera cannot draw) is counted in ``bad_images`` and logged, and the node keeps
        waiting."""
        if self._reference is not None:
            return
        try:
            frame = make()
        except (ValueError, TypeError) as exc:
            self.bad_images += 1
            self.get_logger().error(f"{what} rejected as reference: {exc}", throttle_duration_sec=5.0)
            return
        with self._lock:
            if self._reference is None:
                self._reference = frame

    def _on_real(self, msg: Image) -> None:
        with self._lock:
            self._real = msg  # converted on the generation thread, newest only

    # ------------------------------------------------------------------ generation thread
    def _generate_loop(self) -> None:
        name_this_thread("world_model:gen")
        period = 1.0 / self.rate_hz
        next_tick = time.monotonic()
        started = False
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())) and self.context.ok():
            next_tick += period
            if time.monotonic() > next_tick:  # a tick late already: skip ahead, count it
                self.overruns += 1
                next_tick = time.monotonic() + period
            try:
                started = self._tick(started)
            except Exception as exc:  # noqa: BLE001 - report, keep the node (and its diagnostics) alive
                if not self.context.ok():  # shut down under this tick (Ctrl-C before destroy_node): not an error
                    return
                self.generation_errors += 1
                self.get_logger().error(f"generation failed: {exc!r}", throttle_duration_sec=5.0)

    def _tick(self, started: bool) -> bool:
        """One generation tick; returns whether the stream has started."""
        self._take_actions()
        with self._lock:
            reference, real, self._real = self._reference, self._real, None
            if reference is None or not self.actions.complete:
                return started
            if not started:
                self.actions.skip_pending()  # what arrived before the stream started is not "dropped"
            taken = self.actions.take() if started else None
        if not started:
            self.frame_queue.reset(reference)
            started = True
        if real is not None:
            try:
                self.generator.observe(as_rgb(image_array(real), self.width, self.height))
            except (ValueError, TypeError):
                self.bad_images += 1
        if taken is None:
            self.idle_ticks += 1
            self.frame_queue.pad()  # a half-full block completes with the last action repeated
        else:
            q, stamp_ns = taken
            condition = None
            if self._draws_condition:
                with self.generator.timer.stage("condition"):
                    condition = self.conditioner.condition_image(q)
            self.frame_queue.push(q, stamp_ns, condition)
            if self._condition_pub is not None:
                self._condition_pub.publish(image_message(condition, "rgb8", _stamp_msg(stamp_ns),
                                                          self.params["color_frame_id"]))
        out = self.frame_queue.pop()  # one frame per tick: a fixed output rate
        if out is not None:
            frame, stamp_ns = out
            stamp, fid = _stamp_msg(stamp_ns), self.params["color_frame_id"]
            self._image_pub.publish(image_message(frame, "rgb8", stamp, fid))
            self._info_msg.header.stamp = stamp
            self._info_pub.publish(self._info_msg)
            self.frames += 1
            now = self.now_s()
            self.meter("frames").tick(now, now - 1e-9 * stamp_ns)
        return started

    # ------------------------------------------------------------------ diagnostics
    def diagnostic_values(self):
        a = self.actions
        values = {"backend": self.params["backend"], "frames": self.frames, "commands_dropped": a.dropped,
                  "commands_out_of_order": a.out_of_order, "commands_rejected": a.rejected,
                  "idle_ticks": self.idle_ticks, "overruns": self.overruns, "waiting_actions": self.frame_queue.waiting,
                  "generation_errors": self.generation_errors, "bad_images": self.bad_images,
                  "reanchoring": self.reanchoring}
        for stage, ms in self.generator.timings().items():
            values[f"stage.{stage}_ms"] = f"{ms:.2f}"
        return values

    def diagnostic_level(self):
        if not self._thread.is_alive():
            return DiagnosticStatus.ERROR, "generation thread stopped"
        if self._reference is None:
            topic = self.params["reference.twin_scene_topic" if self.params["reference.source"] == "twin"
                                else "reference.topic"]
            return DiagnosticStatus.WARN, f"waiting for a reference frame on {topic}"
        missing = self.actions.missing_groups()
        if missing:
            return DiagnosticStatus.WARN, f"waiting for commands of {', '.join(missing)}"
        if self.meter("frames").rate(self.now_s()) == 0.0:
            return DiagnosticStatus.WARN, "no new commands: no frames"
        return DiagnosticStatus.OK, "generating"

    def destroy_node(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            self._thread.join(timeout=10.0)
        generator = getattr(self, "generator", None)
        if generator is not None:
            if stop is not None and self._thread.is_alive():  # still inside a step: closing would pull the model away
                self.get_logger().error("generation thread did not stop within 10 s; generator left open")
            else:
                generator.close()
        super().destroy_node()


def _stamp_msg(stamp_ns: int):
    return Time(nanoseconds=stamp_ns).to_msg()


def _profile(p):
    try:
        profile = parse_profile(p["profile"])
    except ConfigurationError as exc:
        raise ParameterError("profile", f"profile: {exc}") from None
    if not (16 <= profile.width <= 4096 and 16 <= profile.height <= 4096 and 1 <= profile.fps <= 120):
        raise ParameterError("profile", f"profile: {p['profile']!r} out of range (16..4096 px, 1..120 Hz)")
    return profile


def _intrinsics(p, width: int, height: int):
    intr = default_intrinsics(width, height)
    return intr._replace(
        fx=p["camera.fx"] or intr.fx, fy=p["camera.fy"] or intr.fy,
        cx=intr.cx if p["camera.cx"] < 0 else p["camera.cx"], cy=intr.cy if p["camera.cy"] < 0 else p["camera.cy"],
    )


def _conditioner(robot, intrinsics, p):
    from ..world_model.conditioning import Conditioner, SkeletonStyle

    try:
        style = SkeletonStyle(colormap=p["condition.colormap"], near=p["condition.near_m"], far=p["condition.far_m"],
                              radius=p["condition.radius_px"], reference_depth=p["condition.reference_m"])
    except ParameterError as exc:  # names the style field: map it back to this node's key
        key = f"condition.{_STYLE_KEYS.get(exc.key, exc.key)}"
        raise ParameterError(key, f"{key}: {exc}") from None
    return Conditioner(robot, intrinsics, style)


_STYLE_KEYS = {"near": "near_m", "far": "far_m", "radius": "radius_px", "reference_depth": "reference_m"}


def _load_reference(p, width: int, height: int, robot) -> np.ndarray | None:
    source = p["reference.source"]
    if source == "topic":
        return None
    if source == "file":
        import cv2

        path = p["reference.path"].strip()
        image = cv2.imread(path, cv2.IMREAD_COLOR) if path and Path(path).is_file() else None
        if image is None:
            raise ParameterError("reference.path", f"reference.path: {path!r} is not a readable image file "
                                 "(reference.source file needs one)")
        return as_rgb(image[:, :, ::-1], width, height)
    if source == "twin":
        return None
    from ..sources.camera.synthetic import reference_frame

    # the tabletop without the robot (the backends draw it), seen from the description's head camera
    return reference_frame(width, height, robot, seed=p["reference.seed"])


def main(args=None) -> int:
    return run_single(WorldModelNode, args)
