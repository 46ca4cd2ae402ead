"""arm_ik node: operator tracker frames -> dual-arm IK -> Ruckig -> /arms/command at 200 Hz.

The maths is ``core.arm_teleop.ArmTeleop`` and the session rules (start gating, clutch and deadman,
auto-calibration, auto-engage) ``core.arm_session``; this node converts messages and calls them. A loop at
``rate_hz`` on its own thread drains the tracker frames and publishes one command per cycle, stamped with
the cycle's time (node clock): the Ruckig trajectory advanced by the time since the previous command.

Diagnostics: ``cycles``, ``stale_cycles``, per side ``outliers``, ``ik_reseeds``, ``unreachable_count``,
``stale_events``.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool
from std_srvs.srv import SetBool, Trigger

from ..core.arm_ik import IKSettings
from ..core.arm_session import ArmSession, SessionSettings
from ..core.arm_teleop import DEFAULT_HOME, ArmTeleop, ArmTeleopSettings
from ..core.calibration import Calibration
from ..core.layout import N_ARM
from ..core.motion import arm_motion_limits
from ..core.node_io import LATCHED, SENSOR_DATA, NodeIO, QoS, Service, Topic, when
from ..core.params import FLOAT_LIST, Param, ParamSchema
from ..core.trackers import frame_matrices
from ..errors import ParameterError, RynnTeleopError
from ..recording.cdr import pose_array
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .conversions import stamp_to_seconds

# Defaults: half of the vendor's per-joint limits (hardware-facts: 180 deg/s; 450, 450,
# 900 x 5 deg/s^2) and half of the configured arm jerk (urdf/robot.yaml, 60 rad/s^3).
DEFAULT_VELOCITY = [round(0.5 * math.radians(180.0), 4)] * N_ARM
DEFAULT_ACCELERATION = [round(0.5 * math.radians(a), 4) for a in (450, 450, 900, 900, 900, 900, 900)]
DEFAULT_JERK = [30.0] * N_ARM

# 100: half a second of history for a subscriber that falls behind (the recorder on a loaded machine)
COMMAND_QOS = QoS(100)
POSE_QOS = QoS(50, reliable=False)  # drained per cycle; 50 = 0.4 s of 120 Hz
LATENCY_BUDGET_MS = 10.0  # tracker sample -> the command that first solves it, p99 (shown against in diagnostics)


class ArmIKNode(TeleopNode):
    PRIORITY = "control"  # 200 Hz IK -> /arms/command
    SCHEMA = ParamSchema(
        "arm_ik",
        [
            DESCRIPTION_OVERLAY,
            Param("rate_hz", float, 200.0, "control and command rate", "Hz", min=50.0, max=1000.0),
            Param("home_position", FLOAT_LIST, list(DEFAULT_HOME),
                  "home/calibration posture, left arm joints 1-7 then right", "rad", min=-3.2, max=3.2, length=14),
            Param("max_velocity", FLOAT_LIST, DEFAULT_VELOCITY,
                  "Ruckig velocity limit per arm joint 1-7 (both arms); at most the robot's", "rad/s",
                  min=0.01, max=10.0, length=N_ARM),
            Param("max_acceleration", FLOAT_LIST, DEFAULT_ACCELERATION,
                  "Ruckig acceleration limit per arm joint 1-7; at most the robot's", "rad/s^2",
                  min=0.01, max=100.0, length=N_ARM),
            Param("max_jerk", FLOAT_LIST, DEFAULT_JERK,
                  "Ruckig jerk limit per arm joint 1-7; at most the robot's", "rad/s^3",
                  min=0.1, max=10000.0, length=N_ARM),
            Param("target_margin", float, 0.02, "IK targets stay this far inside the position limits", "rad",
                  min=0.0, max=0.3),
            Param("stale_timeout_s", float, 0.1, "an operator pose older than this is stale: the arm brakes", "s",
                  min=0.005, max=2.0),
            Param("unreachable_position_m", float, 0.005, "IK position error flagged as unreachable", "m",
                  min=1e-4, max=0.5),
            Param("unreachable_orientation_rad", float, 0.035, "IK orientation error flagged as unreachable",
                  "rad", min=1e-3, max=3.2),
            Param("outlier_speed_m_s", float, 3.0,
                  "a wrist pose that moved faster than this from the side's last accepted one (distance / stamp "
                  "difference, plus 2 cm of noise) is an outlier: not followed, counted; the side re-anchors "
                  "after stale_timeout_s without an accepted pose", "m/s", min=0.1, max=50.0),
            Param("ik.position_tolerance", float, 3e-4, "IK convergence tolerance, position", "m", min=1e-6, max=0.01),
            Param("ik.orientation_tolerance", float, 2e-3, "IK convergence tolerance, orientation", "rad",
                  min=1e-5, max=0.1),
            Param("ik.max_iterations", int, 20, "IK iterations per solve", min=1, max=200),
            Param("ik.damping", float, 0.02, "damping at singular configurations", min=0.0, max=1.0),
            Param("ik.elbow_gain", float, 0.3, "share of the elbow swivel error corrected per solve",
                  min=0.0, max=1.0),
            Param("ik.limit_zone", float, 0.2, "distance from a joint limit where avoidance starts", "rad",
                  min=0.0, max=1.0),
            Param("calibration_file", str, "~/.ros/rynn_teleop/arm_calibration.yaml",
                  "operator calibration, loaded at start if present, written by ~/calibrate"),
            Param("auto_calibrate", bool, False,
                  "capture the calibration auto_calibrate_delay_s after both wrists first appear, once the "
                  "operator holds still (synthetic operator only: it holds the calibration posture at start); "
                  "not saved to calibration_file"),
            Param("auto_calibrate_delay_s", float, 1.0, "delay of auto_calibrate", "s", min=0.0, max=60.0),
            Param("auto_calibrate_retry_s", float, 0.5, "time between failed auto_calibrate attempts", "s",
                  min=0.05, max=10.0),
            Param("auto_calibrate_still_window_s", float, 0.5,
                  "auto_calibrate waits until both wrist and both upper-arm trackers have been still this long",
                  "s", min=0.1, max=5.0),
            Param("auto_calibrate_still_position_m", float, 0.01,
                  "still: every tracker within this distance of its mean position over the window", "m",
                  min=0.001, max=0.1),
            Param("auto_calibrate_still_rotation_rad", float, 0.05,
                  "still: every tracker within this rotation of its newest orientation over the window", "rad",
                  min=0.005, max=0.5),
            Param("auto_engage", bool, False, "engage the clutch as soon as a calibration exists"),
            Param("clutch_topic_timeout_s", float, 0.0,
                  "deadman pedal: when > 0, an engagement made on <operator_prefix>/clutch ends unless a true "
                  "message arrives at least this often; 0 = the topic only switches", "s", min=0.0, max=10.0),
            Param("start_tolerance", float, 0.01,
                  "start_from measured: a measured position at most this far outside its limit is clipped "
                  "(logged); further out the node does not start commanding", "rad", min=0.0, max=0.1),
            Param("start_from", str, "measured",
                  "initial command: the measured arm positions (waits for joint_states_topic) or home_position",
                  choices=("measured", "home")),
            Param("operator_prefix", str, "/operator", "prefix of the tracker node's topics"),
            Param("joint_states_topic", str, "/joint_states", "measured joint states (start_from: measured)"),
            Param("command_topic", str, "/arms/command", "arm command output"),
        ],
    )
    IO = NodeIO(
        publishers=(
            Topic("{command_topic}", "sensor_msgs/msg/JointState", COMMAND_QOS,
                  "the 14 arm joints, position + velocity, one per control cycle (rate_hz), stamped with the cycle's "
                  "time; depth 100: half a second for a subscriber that falls behind"),
            Topic("~/engaged", "std_msgs/msg/Bool", LATCHED, "true while the arms follow the operator"),
        ),
        subscriptions=(
            Topic("{operator_prefix}/trackers", "geometry_msgs/msg/PoseArray", POSE_QOS,
                  "the tracker node's frames (stamp: capture time; poses in ROLES order, all-NaN for a role without "
                  "a sample), drained at each control cycle"),
            Topic("{operator_prefix}/clutch", "std_msgs/msg/Bool", SENSOR_DATA,
                  "the pedal: true engages, false disengages (a deadman with clutch_topic_timeout_s); best effort "
                  "accepts reliable and best-effort publishers"),
            Topic("{joint_states_topic}", "sensor_msgs/msg/JointState", POSE_QOS,
                  "the measured arm positions the first command starts from", when=(when("start_from", "measured"),),
                  dynamic="until the first command"),
        ),
        services=(
            Service("~/calibrate", "std_srvs/srv/Trigger",
                    "capture and save the calibration (operator in the home posture)"),
            Service("~/set_clutch", "std_srvs/srv/SetBool", "engage (true) or disengage (false) the clutch"),
        ),
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        self.robot = robot_from_overlay(p["description_overlay"])
        limits = arm_motion_limits(self.robot.limits, p)
        home = np.asarray(p["home_position"], dtype=float)
        outside = np.nonzero((home < limits.lower) | (home > limits.upper))[0]
        if outside.size:
            j = int(outside[0])
            raise ParameterError(
                "home_position",
                f"home_position[{j}] = {home[j]} is outside the limits of {self.robot.joint_names[j]}: "
                f"[{limits.lower[j]:.4f}, {limits.upper[j]:.4f}] rad",
            )
        self.ctl = ArmTeleop(
            self.robot,
            home,
            limits,
            settings=ArmTeleopSettings(
                rate_hz=p["rate_hz"], stale_timeout=p["stale_timeout_s"],
                unreachable_position=p["unreachable_position_m"],
                unreachable_orientation=p["unreachable_orientation_rad"], target_margin=p["target_margin"],
                outlier_speed=p["outlier_speed_m_s"],
            ),
            ik_settings=IKSettings(
                position_tolerance=p["ik.position_tolerance"], orientation_tolerance=p["ik.orientation_tolerance"],
                max_iterations=p["ik.max_iterations"], damping=p["ik.damping"], elbow_gain=p["ik.elbow_gain"],
                limit_zone=p["ik.limit_zone"],
            ),
        )
        self.session = ArmSession(self.ctl, SessionSettings(
            start_from=p["start_from"], start_tolerance=p["start_tolerance"],
            clutch_topic_timeout=p["clutch_topic_timeout_s"], auto_calibrate=p["auto_calibrate"],
            auto_calibrate_delay=p["auto_calibrate_delay_s"], auto_calibrate_retry=p["auto_calibrate_retry_s"],
            auto_engage=p["auto_engage"], still_window=p["auto_calibrate_still_window_s"],
            still_position=p["auto_calibrate_still_position_m"], still_rotation=p["auto_calibrate_still_rotation_rad"],
        ))
        self.calibration_path = Path(p["calibration_file"]).expanduser()
        if self.calibration_path.exists():
            self.ctl.calibration = Calibration.load(self.calibration_path)  # a broken file refuses to start
            self.get_logger().info(f"calibration loaded from {self.calibration_path}")
        else:
            self.get_logger().warning(
                f"no calibration at {self.calibration_path}: call ~/calibrate with the operator in the home posture"
            )
        self.names = list(self.ctl.joint_names)
        self._ik_times: deque[float] = deque(maxlen=2000)
        self.malformed_frames = 0  # tracker messages whose bytes are not a PoseArray

        # tracker frames are drained at each control cycle, oldest first: no executor wake-up per frame
        self._frames_sub = self.io_polled_subscription("{operator_prefix}/trackers", raw=True)
        # best effort: accepts reliable and best-effort pedal publishers alike
        self.io_subscription("{operator_prefix}/clutch", self._on_clutch)
        self._joint_states_sub = None  # measured positions are needed only until the first command
        if self.session.needs_joint_states:
            self._joint_states_sub = self.io_polled_subscription("{joint_states_topic}")
        self._pub = self.io_publisher("{command_topic}")
        self._engaged_pub = self.io_publisher("~/engaged")
        self._engaged = False
        self._engaged_pub.publish(Bool(data=False))
        self.io_service("~/calibrate", self._srv_calibrate)
        self.io_service("~/set_clutch", self._srv_clutch)
        self._msg = JointState(name=self.names)
        self.meter("command", nominal_hz=p["rate_hz"], latency_budget_ms=LATENCY_BUDGET_MS)
        self._loop = self.create_loop(p["rate_hz"], self._tick, "control")

    # ------------------------------------------------------------------ setup
    # ------------------------------------------------------------------ callbacks
    def _report(self) -> None:
        """Log the session's notices and publish ~/engaged when it changed."""
        for notice in self.session.take_notices():
            self.log_at(notice.level, notice.text)
        if self.session.engaged != self._engaged:
            self._engaged = self.session.engaged
            self._engaged_pub.publish(Bool(data=self._engaged))

    def _on_clutch(self, msg: Bool) -> None:
        self.session.clutch_topic(bool(msg.data), self.now_s())
        self._report()

    def _srv_clutch(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        response.success, response.message = self.session.set_clutch(bool(request.data))
        self._report()
        return response

    def _srv_calibrate(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        try:
            response.message = self.session.calibrate(self.now_s(), self.calibration_path)
            response.success = True
            self.get_logger().info(response.message)
        except RynnTeleopError as exc:
            response.success, response.message = False, str(exc)
            self.get_logger().error(f"calibration failed: {exc}")
        self._report()
        return response

    # ------------------------------------------------------------------ control cycle
    def _tick(self) -> None:
        now_time = self.get_clock().now()
        now = now_time.nanoseconds * 1e-9
        session = self.session
        for taken in self.take_all(self._frames_sub):  # CDR bytes: the poses are read straight into arrays
            try:
                stamp_ns, positions, quaternions = pose_array(taken.message)
            except ValueError:
                self.malformed_frames += 1
                continue
            session.add_frame(stamp_ns * 1e-9, frame_matrices(positions, quaternions))
        if self._joint_states_sub is not None:
            for taken in self.take_all(self._joint_states_sub):
                msg = taken.message
                session.add_joint_states(msg.name, msg.position, stamp_to_seconds(msg.header.stamp))
        command = session.step(now)
        if session.started and self._joint_states_sub is not None:
            self.destroy_subscription(self._joint_states_sub)  # from here on the commands are the reference
            self._joint_states_sub = None
        self._report()
        if command is None:
            return
        msg = self._msg
        msg.header.stamp = now_time.to_msg()
        msg.position = command.state.position.tolist()
        msg.velocity = command.state.velocity.tolist()
        self._pub.publish(msg)
        latency = None if math.isnan(command.source_stamp) else now - command.source_stamp
        self.meter("command").tick(now, latency)
        if command.ik_time > 0:
            self._ik_times.append(command.ik_time)

    # ------------------------------------------------------------------ diagnostics
    def diagnostic_values(self):
        values = self.session.diagnostic_values()
        if self.malformed_frames:
            values["tracker_messages_unreadable"] = self.malformed_frames
        if self._ik_times:
            t = np.fromiter(self._ik_times, float)
            values["ik_time_p50_ms"] = f"{1e3 * np.percentile(t, 50):.3f}"
            values["ik_time_p99_ms"] = f"{1e3 * np.percentile(t, 99):.3f}"
        return values

    def diagnostic_level(self):
        status = self.session.status(self.params["joint_states_topic"])
        level = {"ok": DiagnosticStatus.OK, "warning": DiagnosticStatus.WARN}.get(status.level, DiagnosticStatus.ERROR)
        return level, status.message


def main(args=None) -> int:
    return run_single(ArmIKNode, args)
