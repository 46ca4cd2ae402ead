"""hand_retarget node: operator hand skeletons -> 20 Wuji joint commands per hand.

Input (parameter ``backend``, registered in ``sources.hands``; each with its settings under ``<backend>.``):
    synthetic  procedural open/fist/pinch/grasp gestures (``sources.hands.SyntheticGlove``)
    replay     a rosbag2 with ``<skeleton_prefix>/{left,right}/skeleton`` recorded by this stack
    skeleton   any publisher of 21-point hands: geometry_msgs/PoseArray on
               ``skeleton.input_topic`` (``{side}`` replaced), positions in the wrist frame,
               MediaPipe order (camera hand trackers, XR headsets)
    manus      the Manus SDK's ROS 2 publisher (``manus_ros2_msgs/msg/ManusGlove`` on
               ``manus.topics``); the message package is imported at start
A polled backend (``sources.hands.HandSource``) is read by a loop at ``rate_hz``; a message backend
(``sources.hands.MessageHands``) is subscribed to (its topics: its class's ``IO`` declaration) and each
message processed as it arrives.

Each input frame is checked, retargeted (``core.hand_retarget``), smoothed
(EMA, ``ema_alpha``), limited to the joints' velocity and published at the
input rate (polled sources: up to ``max_backlog_s`` behind, older frames are
skipped when the node falls behind), stamped with the frame's capture time;
bad frames (including a mirrored, i.e. other-side, hand) repeat the last good
command (counted); nothing is published before the first good frame.
"""

from __future__ import annotations

import importlib
from collections import deque

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import JointState

from ..core.hand_retarget import HandPipeline, HandRetargeter, RetargetSettings, split_backlog
from ..core.layout import SIDES
from ..core.node_io import Each, NodeIO, QoS, Topic
from ..core.params import STR_LIST, Param
from ..core.plugins import BackendSchema
from ..core.robot_model import hand_joint_names
from ..errors import HardwareUnavailableError
from ..recording.cdr import pose_array_cdr
from ..sources.hands import HAND_BACKENDS, HandContext, HandMessageError, HandSample, MessageHands
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .conversions import stamp_to_seconds
from .io import interface_class, qos_profile

LATENCY_BUDGET_MS = 15.0  # glove frame -> its /hands/command, p99 (shown against in diagnostics)
RELIABLE = QoS(100)  # 100: ~0.5 s for a late subscriber


class HandRetargetNode(TeleopNode):
    PRIORITY = "input"  # glove frame -> /hands/command
    SCHEMA = BackendSchema(
        "hand_retarget",
        [
            DESCRIPTION_OVERLAY,
            Param("sides", STR_LIST, list(SIDES), "hands to drive", choices=SIDES),
            Param("rate_hz", float, 90.0, "polling rate of a polled backend (synthetic: its sample rate)",
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
            Param("velocity_scale", float, 1.0,
                  "per-frame command change limited to this fraction of the hand's joint velocity limits",
                  min=0.05, max=1.0),
            Param("max_backlog_s", float, 0.05,
                  "polled backends: frames older than this behind the newest of their hand are skipped (node "
                  "behind)", "s", min=0.0, max=1.0),
        ],
        backends=HAND_BACKENDS, default="synthetic", description="hand input", renamed={"source": "backend"},
    )
    IO = NodeIO(publishers=(
        Topic("{skeleton_prefix}/{side}/skeleton", "geometry_msgs/msg/PoseArray", RELIABLE,
              "the operator's hand as retargeted: 21 points (MediaPipe order) in the wrist frame skeleton_frame, "
              "stamped with the capture time", each=Each("side", param="sides")),
        Topic("{command_topic}", "sensor_msgs/msg/JointState", RELIABLE,
              "one hand's 20 Wuji joints per message (canonical order), position, at the input rate"),
    ))

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
        self._input_topics: dict[str, str] = {}  # side -> the topic that drives it (message backends)
        self.unused = 0  # frames of hands not configured, or of a second glove claiming a side
        self._names = {s: list(hand_joint_names(s)) for s in self.sides}
        self._commands = {s: JointState(name=self._names[s]) for s in self.sides}  # reused: stamp and positions change
        self._solve_times: deque[float] = deque(maxlen=2000)
        self.skipped = {s: 0 for s in self.sides}  # polled samples dropped for a newer one (node behind)
        self._last_counts: dict[str, tuple[int, int]] = {}  # (held, good) at the last diagnostics
        self.source = None
        prefix = p["skeleton_prefix"].rstrip("/")
        self._skeleton_pubs = {s: self.io_publisher("{skeleton_prefix}/{side}/skeleton", side=s)
                               for s in self.sides}
        self._skeleton_frames = {s: p["skeleton_frame"].replace("{side}", s) for s in self.sides}
        self._command_pub = self.io_publisher("{command_topic}")
        self.message_errors = 0  # messages of a message backend that hold no usable skeleton
        backend = self.SCHEMA.create(p, HandContext(self.sides, p["rate_hz"], prefix))
        if isinstance(backend, MessageHands):
            self._subscribe(p["backend"], backend)
        else:  # a polled HandSource (the registry admits no other kind)
            self.source = self.close_on_destroy(backend)
            self.source.start(self.now_s())
            self._source_inputs = self._subscribe_source_inputs()
            self._align_on_first_poll = self.source.aligns_to_ticks
            if self.source.follows_rate_hz:
                for side in self.sides:
                    self.meter(f"command.{side}", nominal_hz=p["rate_hz"])
        for side in self.sides:
            self.meter(f"command.{side}", latency_budget_ms=LATENCY_BUDGET_MS)
        if self.source is not None:
            self._loop = self.create_loop(p["rate_hz"], self._poll, "poll")  # one loop polls both hands
        self.get_logger().info(f"{p['backend']} hands {', '.join(self.sides)} -> {p['command_topic']}")

    # ------------------------------------------------------------------ inputs
    def _subscribe(self, name: str, backend: MessageHands) -> None:
        """Subscribe to the backend's topics with its message type (imported now)."""
        package, _, type_name = backend.message_type.partition("/msg/")
        try:
            message_class = getattr(importlib.import_module(f"{package}.msg"), type_name)
        except (ImportError, AttributeError) as exc:
            hint = f" ({backend.message_hint})" if backend.message_hint else ""
            others = ", ".join(n for n in HAND_BACKENDS if n != name)
            raise HardwareUnavailableError(
                f"backend {name!r} needs the ROS 2 message package {package}{hint}; {backend.message_type} cannot "
                f"be imported: {exc}. Other backends: {others}."
            ) from None
        for topic, side in backend.topics().items():
            self.create_subscription(message_class, topic,
                                     lambda m, t=topic, s=side: self._on_message(backend, t, s, m),
                                     qos_profile_sensor_data)

    def _on_message(self, backend: MessageHands, topic: str, side: str | None, msg) -> None:
        header = getattr(msg, "header", None)
        stamp_msg = header.stamp if header is not None and (header.stamp.sec or header.stamp.nanosec) else None
        try:
            side, points = backend.convert(topic, side, msg)
        except HandMessageError as exc:
            self.message_errors += 1
            self.get_logger().warning(f"bad hand skeleton on {topic}: {exc}", throttle_duration_sec=5.0)
            return
        owner = self._input_topics.setdefault(side, topic)
        if side not in self.pipelines or owner != topic:
            self.unused += 1
            if owner != topic:
                self.get_logger().warning(f"{topic} also reports a {side} hand; {owner} drives that hand",
                                          throttle_duration_sec=5.0)
            return
        stamp = stamp_to_seconds(stamp_msg) if stamp_msg is not None else self.now_s()
        self._process(HandSample(side, stamp, points), stamp_msg)

    def _subscribe_source_inputs(self) -> dict:
        """The topics a polled source follows (``message_inputs()``: the synthetic glove doing the twin's task
        follows its scene), polled; drained at each poll, before the source is read."""
        return {self.create_polled_subscription(interface_class(spec.type), topic, qos_profile(spec.qos)): topic
                for topic, spec in self.source.message_inputs().items()}

    def _poll(self) -> None:
        now = self.now_s()
        if self._align_on_first_poll:  # (synthetic) its frame grid on this loop's ticks
            self._align_on_first_poll = False
            self.start_grid_on_this_tick(self.source, now)
        for sub, topic in self._source_inputs.items():  # messages the source follows, before it is read
            for taken in self.take_all(sub):
                self.source.feed(topic, taken.message)
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
        values = {"backend": self.params["backend"]}
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
        if self.source is None:
            values["message_errors"] = self.message_errors
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
