"""hand_retarget node: operator hand skeletons -> 20 Wuji joint commands per hand.

Input (parameter ``source``):
    synthetic  procedural open/fist/pinch/grasp gestures (``sources.hands.SyntheticGlove``)
    replay     a rosbag2 with ``<skeleton_prefix>/{left,right}/skeleton`` recorded by this stack
    skeleton   any publisher of 21-point hands: geometry_msgs/PoseArray on
               ``skeleton.input_topic`` (``{side}`` replaced), positions in the wrist frame,
               MediaPipe order (camera hand trackers, XR headsets)
    manus      the Manus SDK's ROS 2 publisher (``manus_ros2_msgs/msg/ManusGlove`` on
               ``manus.topics``); the message package is imported at start

Each input frame is checked, retargeted (``core.hand_retarget``), smoothed
(EMA, ``ema_alpha``), limited to the joints' velocity and published at the
input rate (polled sources: up to ``max_backlog_s`` behind, older frames are
skipped when the node falls behind), stamped with the frame's capture time;
bad frames (including a mirrored, i.e. other-side, hand) repeat the last good
command (counted); nothing is published before the first good frame.

Topics (out):
    <skeleton_prefix>/{left,right}/skeleton  geometry_msgs/PoseArray (21 points used, wrist frame)
    /hands/command  sensor_msgs/JointState: one hand's 20 joints per message (Wuji names,
                    canonical order), position; reliable
"""

from __future__ import annotations

import importlib
from collections import deque

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseArray
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.time import Time
from scipy.spatial.transform import Rotation
from sensor_msgs.msg import JointState

from ..core.hand_retarget import HandPipeline, HandRetargeter, RetargetSettings, split_backlog
from ..core.layout import SIDES
from ..core.params import FLOAT_LIST, STR_LIST, Param, ParamSchema
from ..core.robot_model import hand_joint_names
from ..errors import HardwareUnavailableError
from ..recording.cdr import pose_array_cdr
from ..sources.hands import HandSample, ManusSkeletonError, make_hand_source, manus_to_mediapipe
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .conversions import stamp_to_seconds

LATENCY_BUDGET_MS = 15.0  # glove frame -> its /hands/command, p99 (shown against in diagnostics)
RELIABLE = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)  # 100: ~0.5 s for a late subscriber


class HandRetargetNode(TeleopNode):
    PRIORITY = "input"  # glove frame -> /hands/command
    SCHEMA = ParamSchema(
        "hand_retarget",
        [
            DESCRIPTION_OVERLAY,
            Param("source", str, "synthetic", "hand input", choices=("synthetic", "replay", "skeleton", "manus")),
            Param("sides", STR_LIST, list(SIDES), "hands to drive", choices=SIDES),
            Param("rate_hz", float, 90.0, "polling rate of synthetic/replay input (synthetic: its sample rate)",
                  "Hz", min=10.0, max=500.0),
            Param("ema_alpha", float, 0.5, "EMA weight of the newest solution (1 = no smoothing)", min=0.01, max=1.0),
            Param("retarget.pinch_weight", float, 20.0, "weight of thumb-to-fingertip vectors at a full pinch",
                  min=0.0, max=1000.0),
            Param("retarget.pinch_threshold", float, 0.04,
                  "human thumb-to-fingertip distance where pinch weighting starts", "m", min=0.001, max=0.2),
            Param("retarget.previous_weight", float, 3e-4, "pull towards the previous solution", "m^2/rad^2",
                  min=0.0, max=1.0),
            Param("retarget.max_iterations", int, 30, "solver iterations per frame", min=1, max=200),
            Param("skeleton_prefix", str, "/operator/hand", "prefix of the published skeletons (and of replayed ones)"),
            Param("skeleton_frame", str, "{side}_operator_wrist", "frame id of published skeletons ({side} replaced)"),
            Param("command_topic", str, "/hands/command", "joint command output"),
            Param("skeleton.input_topic", str, "/hand_tracking/{side}/skeleton",
                  "source skeleton: PoseArray input per hand ({side} replaced)"),
            Param("manus.topics", STR_LIST, ["/manus_glove_0", "/manus_glove_1"],
                  "source manus: ManusGlove topics (the side comes from each message)"),
            Param("manus.glove_to_wrist_rpy", FLOAT_LIST, [0.0, 0.0, 0.0],
                  "source manus: rotation from the glove skeleton frame to the wrist frame (roll, pitch, yaw)",
                  "rad", min=-3.1416, max=3.1416, length=3),
            Param("manus.mirror", bool, False,
                  "source manus: the SDK build reports a left-handed frame (mirror y after the rotation)"),
            Param("velocity_scale", float, 1.0,
                  "per-frame command change limited to this fraction of the hand's joint velocity limits",
                  min=0.05, max=1.0),
            Param("max_backlog_s", float, 0.05,
                  "polled sources: frames older than this behind the newest of their hand are skipped (node behind)",
                  "s", min=0.0, max=1.0),
            Param("synthetic.seed", int, 0, "random seed of the synthetic glove", min=0, max=2**31 - 1),
            Param("synthetic.noise", float, 0.001, "keypoint noise (std)", "m", min=0.0, max=0.02),
            Param("synthetic.cycle_s", float, 6.0, "duration of one gesture cycle", "s", min=1.0, max=120.0),
            Param("replay.path", str, "", "rosbag2 directory of a recorded session (source replay)"),
            Param("replay.rate_scale", float, 1.0, "replay speed factor", min=0.05, max=20.0),
            Param("replay.loop", bool, False, "restart the replay at its end"),
        ],
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        self.sides = tuple(dict.fromkeys(p["sides"]))
        robot = robot_from_overlay(p["description_overlay"])
        settings = RetargetSettings(
            pinch_weight=p["retarget.pinch_weight"], pinch_threshold=p["retarget.pinch_threshold"],
            previous_weight=p["retarget.previous_weight"], max_iterations=p["retarget.max_iterations"],
        )
        self.pipelines = {}
        for s in self.sides:
            velocity = robot.limits.velocity[robot.indices(hand_joint_names(s))] * p["velocity_scale"]
            self.pipelines[s] = HandPipeline(HandRetargeter(robot, s, settings), p["ema_alpha"], velocity)
        self._glove_topics: dict[str, str] = {}  # side -> the Manus topic that drives it
        self.unused = 0  # frames of hands not configured, or of a second glove claiming a side
        self._names = {s: list(hand_joint_names(s)) for s in self.sides}
        self._commands = {s: JointState(name=self._names[s]) for s in self.sides}  # reused: stamp and positions change
        self._solve_times: deque[float] = deque(maxlen=2000)
        self.skipped = {s: 0 for s in self.sides}  # polled samples dropped for a newer one (node behind)
        self._last_counts: dict[str, tuple[int, int]] = {}  # (held, good) at the last diagnostics
        self.source = None
        prefix = p["skeleton_prefix"].rstrip("/")
        self._skeleton_pubs = {s: self.create_publisher(PoseArray, f"{prefix}/{s}/skeleton", RELIABLE)
                               for s in self.sides}
        self._skeleton_frames = {s: p["skeleton_frame"].replace("{side}", s) for s in self.sides}
        self._command_pub = self.create_publisher(JointState, p["command_topic"], RELIABLE)
        kind = p["source"]
        if kind == "manus":
            self._setup_manus(p)
        elif kind == "skeleton":
            for side in self.sides:
                self.create_subscription(PoseArray, p["skeleton.input_topic"].replace("{side}", side),
                                         lambda m, s=side: self._on_pose_array(s, m), qos_profile_sensor_data)
        else:
            if kind == "synthetic":
                kwargs = dict(sides=self.sides, rate_hz=p["rate_hz"], seed=p["synthetic.seed"],
                              noise=p["synthetic.noise"], cycle_s=p["synthetic.cycle_s"])
            else:
                kwargs = dict(path=p["replay.path"], topic_prefix=prefix, rate_scale=p["replay.rate_scale"],
                              loop=p["replay.loop"], sides=self.sides)
            self.source = self.close_on_destroy(make_hand_source(kind, **kwargs))
            self.source.start(self.now_s())
            self._align_on_first_poll = kind == "synthetic"
            if kind == "synthetic":
                for side in self.sides:
                    self.meter(f"command.{side}", nominal_hz=p["rate_hz"])
        for side in self.sides:
            self.meter(f"command.{side}", latency_budget_ms=LATENCY_BUDGET_MS)
        if self.source is not None:
            self._loop = self.create_loop(p["rate_hz"], self._poll, "poll")  # one loop polls both hands
        self.get_logger().info(f"{kind} hands {', '.join(self.sides)} -> {p['command_topic']}")

    # ------------------------------------------------------------------ inputs
    def _setup_manus(self, p) -> None:
        try:
            glove_type = importlib.import_module("manus_ros2_msgs.msg").ManusGlove
        except (ImportError, AttributeError) as exc:
            raise HardwareUnavailableError(
                "source manus needs the Manus SDK's ROS 2 message package manus_ros2_msgs (build it in your "
                f"workspace and source it); it cannot be imported: {exc}. Use source:=synthetic, replay or skeleton."
            ) from None
        R = Rotation.from_euler("xyz", p["manus.glove_to_wrist_rpy"]).as_matrix()
        self._glove_to_wrist = np.diag([1.0, -1.0, 1.0]) @ R if p["manus.mirror"] else R
        self.manus_errors = 0
        for topic in p["manus.topics"]:
            self.create_subscription(glove_type, topic, lambda m, t=topic: self._on_manus(t, m),
                                     qos_profile_sensor_data)

    def _on_manus(self, topic: str, msg) -> None:
        header = getattr(msg, "header", None)
        stamp_msg = header.stamp if header is not None and (header.stamp.sec or header.stamp.nanosec) else None
        try:
            hand = manus_to_mediapipe(msg, self._glove_to_wrist)
        except ManusSkeletonError as exc:
            self.manus_errors += 1
            self.get_logger().warning(f"bad Manus skeleton on {topic}: {exc}", throttle_duration_sec=5.0)
            return
        owner = self._glove_topics.setdefault(hand.side, topic)
        if hand.side not in self.pipelines or owner != topic:
            self.unused += 1
            if owner != topic:
                self.get_logger().warning(f"{topic} also reports a {hand.side} glove; {owner} drives that hand",
                                          throttle_duration_sec=5.0)
            return
        self._process(self._sample(hand.side, stamp_msg, hand.points), stamp_msg)

    def _sample(self, side: str, stamp_msg, points: np.ndarray) -> HandSample:
        return HandSample(side, stamp_to_seconds(stamp_msg) if stamp_msg is not None else self.now_s(), points)

    def _on_pose_array(self, side: str, msg: PoseArray) -> None:
        points = np.array([[q.position.x, q.position.y, q.position.z] for q in msg.poses]).reshape(-1, 3)
        stamp_msg = msg.header.stamp if (msg.header.stamp.sec or msg.header.stamp.nanosec) else None
        self._process(self._sample(side, stamp_msg, points), stamp_msg)

    def _poll(self) -> None:
        now = self.now_s()
        if self._align_on_first_poll:  # synthetic: its frame grid on this loop's ticks
            self._align_on_first_poll = False
            self.start_grid_on_this_tick(self.source, now)
        samples = [s for s in self.source.read(now) if s.side in self.pipelines]
        kept, dropped = split_backlog(samples, self.params["max_backlog_s"])
        for side, n in dropped.items():
            self.skipped[side] += n
        for sample in kept:
            self._process(sample)

    # ------------------------------------------------------------------ per frame
    def _process(self, sample: HandSample, stamp_msg=None) -> None:
        """Retarget one frame; publish its skeleton and command stamped with its capture time.

        ``stamp_msg``: the input message's own stamp, passed through unchanged (exact).
        """
        out = self.pipelines[sample.side].step(sample.points, sample.stamp)
        now = self.now_s()
        self.meter(f"input.{sample.side}").tick(now)
        if out.solve_time > 0:
            self._solve_times.append(out.solve_time)
        if out.q is None:
            return  # no good frame yet: nothing to command
        stamp = stamp_msg if stamp_msg is not None else Time(nanoseconds=int(round(sample.stamp * 1e9))).to_msg()
        if not out.held:  # the skeleton as its CDR bytes: no Pose objects to build for rclpy
            points = np.asarray(sample.points, dtype=float).reshape(-1, 3)
            self._skeleton_pubs[sample.side].publish(
                pose_array_cdr(stamp.sec * 1_000_000_000 + stamp.nanosec, self._skeleton_frames[sample.side], points))
        command = self._commands[sample.side]
        command.position = out.q.tolist()
        command.header.stamp = stamp
        self._command_pub.publish(command)
        self.meter(f"command.{sample.side}").tick(now, now - sample.stamp)

    # ------------------------------------------------------------------ diagnostics
    def diagnostic_values(self):
        values = {"source": self.params["source"]}
        if self._solve_times:
            t = np.fromiter(self._solve_times, float)
            values["solve_time_p50_ms"] = f"{1e3 * np.percentile(t, 50):.3f}"
            values["solve_time_p99_ms"] = f"{1e3 * np.percentile(t, 99):.3f}"
        for side, pipe in self.pipelines.items():
            values[f"{side}.frames"] = pipe.frames
            for reason, n in pipe.held.items():
                values[f"{side}.held.{reason}"] = n
            values[f"{side}.skipped"] = self.skipped[side]
            values[f"{side}.velocity_limited"] = pipe.limited
        values["unused_frames"] = self.unused
        if self.params["source"] == "manus":
            values["manus_errors"] = self.manus_errors
        return values

    def diagnostic_level(self):
        now = self.now_s()
        quiet = [s for s in self.sides if self.meter(f"input.{s}").rate(now) == 0.0]
        if quiet:
            return DiagnosticStatus.WARN, f"no input for {', '.join(quiet)}"
        # frames arrive but (almost) none is usable: say why
        bad = []
        for side, pipe in self.pipelines.items():
            held_now = sum(pipe.held.values())
            good_now = pipe.frames
            last = self._last_counts.get(side, (0, 0))
            self._last_counts[side] = (held_now, good_now)
            d_held, d_good = held_now - last[0], good_now - last[1]
            if d_held > d_good:
                worst = max(pipe.held, key=pipe.held.get)
                bad.append(f"{side}: most frames held (mostly {worst})")
        if bad:
            return DiagnosticStatus.WARN, "; ".join(bad)
        return DiagnosticStatus.OK, "retargeting"



def main(args=None) -> int:
    return run_single(HandRetargetNode, args)
