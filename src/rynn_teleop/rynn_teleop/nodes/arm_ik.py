"""arm_ik node: operator wrist poses -> dual-arm IK -> Ruckig -> /arms/command at 200 Hz.

Subscribes to the wrist-in-chest and upper-arm (elbow) poses of the tracker
node, maps them into the torso frame with the operator calibration, solves
both 7-DoF arms (``core.arm_ik``) and smooths with Ruckig
(``core.motion``); all of it in ``core.arm_teleop.ArmTeleop``. A timer at
``rate_hz`` publishes the command every cycle, always from the newest target.

Topics:
    in:  /operator/wrist_in_chest/{left,right}  geometry_msgs/PoseStamped
         /operator/elbow_in_chest/{left,right}  geometry_msgs/PoseStamped
         /operator/clutch                       std_msgs/Bool (pedal: true engages, false disengages)
         /joint_states                          sensor_msgs/JointState (start_from: measured)
    out: /arms/command   sensor_msgs/JointState, 14 arm joints, position + velocity, reliable
         ~/engaged       std_msgs/Bool, transient local (latched)
Services:
    ~/calibrate   std_srvs/Trigger   capture the calibration (operator in the home posture), save it
    ~/set_clutch  std_srvs/SetBool   engage (true) / disengage (false)
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseStamped
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool
from std_srvs.srv import SetBool, Trigger

from ..core.arm_ik import IKSettings
from ..core.arm_teleop import DEFAULT_HOME, ArmTeleop, ArmTeleopSettings
from ..core.calibration import SIDES, Calibration
from ..core.joint_state import JointStateBuffer
from ..core.params import FLOAT_LIST, Param, ParamSchema
from ..core.robot_model import GROUPS, N_ARM, JointLimits
from ..errors import ParameterError, RynnTeleopError
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .base import TeleopNode, run_single
from .conversions import pose_to_matrix, stamp_to_seconds

# Defaults: half of the vendor's per-joint limits (hardware-facts: 180 deg/s; 450, 450,
# 900 x 5 deg/s^2) and half of the configured arm jerk (urdf/robot.yaml, 60 rad/s^3).
DEFAULT_VELOCITY = [round(0.5 * math.radians(180.0), 4)] * N_ARM
DEFAULT_ACCELERATION = [round(0.5 * math.radians(a), 4) for a in (450, 450, 900, 900, 900, 900, 900)]
DEFAULT_JERK = [30.0] * N_ARM

# 100: half a second of history for a subscriber that falls behind (the recorder on a loaded machine)
COMMAND_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
POSE_QOS = QoSProfile(depth=50, reliability=ReliabilityPolicy.BEST_EFFORT)  # newest wins; 50 = 0.25 s of 200 Hz
LATCHED_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class ArmIKNode(TeleopNode):
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
                  "capture the calibration auto_calibrate_delay_s after both wrists first appear (synthetic "
                  "operator only: it holds the calibration posture at start); not saved to calibration_file"),
            Param("auto_calibrate_delay_s", float, 1.0, "delay of auto_calibrate", "s", min=0.0, max=60.0),
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

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        self.robot = robot_from_overlay(p["description_overlay"])
        limits = self._motion_limits(p)
        home = np.asarray(p["home_position"], dtype=float)
        outside = np.nonzero((home < limits.lower) | (home > limits.upper))[0]
        if outside.size:
            j = int(outside[0])
            raise ParameterError(
                "home_position", f"home_position[{j}] = {home[j]} is outside the limits of {self.robot.joint_names[j]}: "
                f"[{limits.lower[j]:.4f}, {limits.upper[j]:.4f}] rad"
            )
        self.ctl = ArmTeleop(
            self.robot,
            home,
            limits,
            settings=ArmTeleopSettings(
                rate_hz=p["rate_hz"], stale_timeout=p["stale_timeout_s"],
                unreachable_position=p["unreachable_position_m"],
                unreachable_orientation=p["unreachable_orientation_rad"], target_margin=p["target_margin"],
            ),
            ik_settings=IKSettings(
                position_tolerance=p["ik.position_tolerance"], orientation_tolerance=p["ik.orientation_tolerance"],
                max_iterations=p["ik.max_iterations"], damping=p["ik.damping"], elbow_gain=p["ik.elbow_gain"],
                limit_zone=p["ik.limit_zone"],
            ),
        )
        self.calibration_path = Path(p["calibration_file"]).expanduser()
        if self.calibration_path.exists():
            self.ctl.calibration = Calibration.load(self.calibration_path)  # a broken file refuses to start
            self.get_logger().info(f"calibration loaded from {self.calibration_path}")
        else:
            self.get_logger().warning(
                f"no calibration at {self.calibration_path}: call ~/calibrate with the operator in the home posture"
            )
        self.names = list(self.ctl.joint_names)
        self._arm_idx = np.r_[GROUPS.left_arm, GROUPS.right_arm]
        self._measured = JointStateBuffer(self.robot.neutral())
        self._started = p["start_from"] == "home"
        self._elbows: dict[str, tuple[np.ndarray, float]] = {}
        self._first_seen: float | None = None
        self._ik_times: deque[float] = deque(maxlen=2000)
        self._auto_calibrated = False
        self._next_auto_calibration = 0.0

        prefix = p["operator_prefix"].rstrip("/")
        # operator poses are drained at each control tick, oldest first (elbows before wrists, as a wrist pose
        # pairs with the newest elbow): no executor wake-up per pose
        self._pose_subs = [
            (self.create_polled_subscription(PoseStamped, f"{prefix}/{kind}_in_chest/{side}", POSE_QOS),
             handler, side)
            for kind, handler in (("elbow", self._on_elbow), ("wrist", self._on_wrist)) for side in SIDES
        ]
        # best effort: accepts reliable and best-effort pedal publishers alike
        self.create_subscription(Bool, f"{prefix}/clutch", self._on_clutch, qos_profile_sensor_data)
        self._clutch_topic_stamp: float | None = None  # last true on the clutch topic while it holds the clutch
        self._start_error = ""
        self._joint_states_sub = None  # measured positions are needed only until the first command
        if not self._started:
            self._joint_states_sub = self.create_polled_subscription(JointState, p["joint_states_topic"], POSE_QOS)
        self._pub = self.create_publisher(JointState, p["command_topic"], COMMAND_QOS)
        self._engaged_pub = self.create_publisher(Bool, "~/engaged", LATCHED_QOS)
        self._engaged_pub.publish(Bool(data=False))
        self.create_service(Trigger, "~/calibrate", self._srv_calibrate)
        self.create_service(SetBool, "~/set_clutch", self._srv_clutch)
        self._msg = JointState(name=self.names)
        self._timer = self.create_timer(1.0 / p["rate_hz"], self._tick)

    # ------------------------------------------------------------------ setup
    def _motion_limits(self, p) -> JointLimits:
        robot_lim = self.robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]]
        chosen = {}
        for key, robot_values in (("max_velocity", robot_lim.velocity), ("max_acceleration", robot_lim.acceleration),
                                  ("max_jerk", robot_lim.jerk)):
            v = np.tile(np.asarray(p[key], dtype=float), 2)
            over = np.nonzero(v > robot_values + 1e-9)[0]
            if over.size:
                j = int(over[0]) % N_ARM
                raise ParameterError(
                    key, f"{key}[{j}] = {v[j]} exceeds the robot's limit {robot_values[j]:.4f} for arm joint {j + 1}; "
                    f"allowed range (0, {robot_values[j]:.4f}]"
                )
            chosen[key] = v
        return JointLimits(robot_lim.lower, robot_lim.upper, chosen["max_velocity"], chosen["max_acceleration"],
                           chosen["max_jerk"])

    # ------------------------------------------------------------------ callbacks
    def _on_wrist(self, side: str, msg: PoseStamped) -> None:
        stamp = stamp_to_seconds(msg.header.stamp)
        elbow = None
        if side in self._elbows:
            point, elbow_stamp = self._elbows[side]
            if abs(stamp - elbow_stamp) <= self.params["stale_timeout_s"]:
                elbow = point
        if self.ctl.set_operator(side, pose_to_matrix(msg.pose), elbow, stamp) and self._first_seen is None:
            if all(self.ctl.operator(s) is not None for s in SIDES):
                self._first_seen = self.now_s()

    def _on_elbow(self, side: str, msg: PoseStamped) -> None:
        p = msg.pose.position
        point = np.array([p.x, p.y, p.z])
        if np.all(np.isfinite(point)):
            self._elbows[side] = (point, stamp_to_seconds(msg.header.stamp))

    def _on_joint_states(self, msg: JointState) -> None:
        self._measured.update(msg.name, msg.position, stamp_to_seconds(msg.header.stamp))

    def _on_clutch(self, msg: Bool) -> None:
        if msg.data:
            if not self.ctl.clutch.engaged:
                self._set_clutch(True)
            if self.ctl.clutch.engaged:
                self._clutch_topic_stamp = self.now_s()
        else:
            self._clutch_topic_stamp = None
            self._set_clutch(False)

    def _set_clutch(self, engage: bool) -> tuple[bool, str]:
        was = self.ctl.clutch.engaged
        ok, message = self.ctl.engage() if engage else self.ctl.disengage()
        if self.ctl.clutch.engaged != was:
            self.get_logger().info(message)
            self._engaged_pub.publish(Bool(data=self.ctl.clutch.engaged))
        elif not ok:
            self.get_logger().warning(f"clutch: {message}")
        return ok, message

    def _srv_clutch(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        self._clutch_topic_stamp = None  # the service takes over from a deadman pedal
        response.success, response.message = self._set_clutch(bool(request.data))
        return response

    def _calibrate(self, save: bool) -> str:
        """Capture, save (if asked; a failed save leaves the old calibration in use), apply."""
        cal = self.ctl.capture_calibration(self.now_s())
        where = f"; saved to {cal.save(self.calibration_path)}" if save else " (not saved)"
        self.ctl.set_calibration(cal)
        self._clutch_topic_stamp = None
        self._engaged_pub.publish(Bool(data=False))
        return f"calibrated: arm-length scale {cal.scale:.3f}, fit residual {cal.fit_residual * 100:.1f} cm{where}"

    def _srv_calibrate(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        try:
            response.message = self._calibrate(save=True)
            response.success = True
            self.get_logger().info(response.message)
        except RynnTeleopError as exc:
            response.success, response.message = False, str(exc)
            self.get_logger().error(f"calibration failed: {exc}")
        return response

    # ------------------------------------------------------------------ control cycle
    def _start_if_ready(self, now: float) -> bool:
        if self._started:
            return True
        for taken in self.take_all(self._joint_states_sub):
            self._on_joint_states(taken.message)
        fresh = self._measured.fresh(now, 0.5)[self._arm_idx]
        if not fresh.all():
            return False
        measured = self._measured.position[self._arm_idx]
        lim = self.ctl.follower.limits
        excess = np.maximum(lim.lower - measured, measured - lim.upper)  # > 0: outside [rad]
        tol = self.params["start_tolerance"]
        if np.any(excess > tol):
            j = int(np.argmax(excess))
            message = (
                f"measured {self.names[j]} = {measured[j]:.4f} rad is {excess[j]:.4f} rad outside its limits "
                f"[{lim.lower[j]:.4f}, {lim.upper[j]:.4f}]; not commanding until it is back in range"
            )
            if message != self._start_error:
                self.get_logger().error(message)
            self._start_error = message
            return False
        if np.any(excess > 0):
            clipped = [f"{self.names[j]} by {excess[j]:.4f} rad" for j in np.nonzero(excess > 0)[0]]
            self.get_logger().warning(f"measured positions clipped into the limits: {', '.join(clipped)}")
        self._start_error = ""
        self.ctl.reset(measured)
        self._started = True
        self.destroy_subscription(self._joint_states_sub)  # from here on the commands are the reference
        self._joint_states_sub = None
        self.get_logger().info("starting from the measured arm positions")
        return True

    def _automation(self, now: float) -> None:
        p = self.params
        if p["auto_calibrate"] and not self._auto_calibrated and self._first_seen is not None:
            if now - self._first_seen >= p["auto_calibrate_delay_s"] and now >= self._next_auto_calibration:
                try:
                    self.get_logger().info(self._calibrate(save=False))
                    self._auto_calibrated = True
                except RynnTeleopError as exc:  # e.g. poses not fresh yet on a loaded machine: retry
                    self._next_auto_calibration = now + 0.5
                    self.get_logger().warning(f"auto calibration failed (retrying): {exc}",
                                              throttle_duration_sec=2.0)
        timeout = p["clutch_topic_timeout_s"]
        if timeout > 0 and self._clutch_topic_stamp is not None and now - self._clutch_topic_stamp > timeout:
            self._clutch_topic_stamp = None
            self.get_logger().warning(f"clutch pedal silent for {timeout} s: disengaging")
            self._set_clutch(False)
        if p["auto_engage"] and not self.ctl.clutch.engaged and not self.ctl.calibration.is_default:
            if self.ctl.clutch.engagements == 0:  # once: a later disengage is the operator's choice
                self._set_clutch(True)

    def _tick(self) -> None:
        now_time = self.get_clock().now()
        now = now_time.nanoseconds * 1e-9
        for sub, handler, side in self._pose_subs:
            for taken in self.take_all(sub):
                handler(side, taken.message)
        if not self._start_if_ready(now):
            return
        self._automation(now)
        command = self.ctl.step(now)
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
        values = {
            "engaged": self.ctl.clutch.engaged,
            "calibrated": not self.ctl.calibration.is_default,
            "started": self._started,
            "ruckig_errors": self.ctl.follower.errors,
        }
        if self._ik_times:
            t = np.fromiter(self._ik_times, float)
            values["ik_time_p50_ms"] = f"{1e3 * np.percentile(t, 50):.3f}"
            values["ik_time_p99_ms"] = f"{1e3 * np.percentile(t, 99):.3f}"
        for side, st in self.ctl.sides.items():
            values[f"{side}.active"] = st.active
            values[f"{side}.stale"] = st.stale
            values[f"{side}.unreachable"] = st.unreachable
            values[f"{side}.rejected"] = st.rejected
            values[f"{side}.elbow_rejected"] = st.elbow_rejected
            values[f"{side}.unreachable_count"] = st.unreachable_count
            values[f"{side}.stale_events"] = st.stale_events
        return values

    def diagnostic_level(self):
        if self._start_error:
            return DiagnosticStatus.ERROR, self._start_error
        if not self._started:
            return DiagnosticStatus.WARN, f"waiting for {self.params['joint_states_topic']}"
        if self.ctl.follower.errors:
            return DiagnosticStatus.ERROR, "Ruckig errors"
        flags = [f"{s} unreachable" for s, st in self.ctl.sides.items() if st.unreachable]
        if self.ctl.clutch.engaged:
            flags += [f"{s} stale" for s, st in self.ctl.sides.items() if st.stale]
        if flags:
            return DiagnosticStatus.WARN, ", ".join(flags)
        if self.ctl.calibration.is_default:
            return DiagnosticStatus.WARN, "not calibrated"
        return DiagnosticStatus.OK, "engaged" if self.ctl.clutch.engaged else "disengaged (holding)"


def main(args=None) -> int:
    return run_single(ArmIKNode, args)
