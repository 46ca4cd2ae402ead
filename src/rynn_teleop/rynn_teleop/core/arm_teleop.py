"""Dual-arm teleoperation controller: operator poses -> IK -> Ruckig (ROS-free).

One :meth:`ArmTeleop.step` per control cycle: per side, the newest operator wrist pose (wrist-in-chest), while
it is fresh and the clutch engaged, is mapped into the torso frame (:class:`~.calibration.Calibration`),
composed with the clutch offset (:class:`~.clutch.Clutch`) and solved by :class:`~.arm_ik.ArmIK` (warm-started,
the upper-arm tracker steering the elbow); the 14 solutions are the targets of one
:class:`~.motion.JerkLimitedFollower`, whose state, advanced by the time since the previous step, is the
command. A side that is stale or disengaged brakes to a stop.

Bad input never reaches the robot: non-finite or non-rigid poses and outliers (a wrist faster than
``outlier_speed``) are rejected at :meth:`ArmTeleop.set_operator` (counted, the last good target kept); an
unreachable target gives the nearest reachable solution and the side's ``unreachable`` flag, the solve retried
from the home posture and the current command so that a joint limit cannot trap the arm. A side whose tracking
resumes after going stale is re-anchored (its clutch offset re-captured), like a re-engage.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..errors import ConfigurationError
from .arm_ik import ArmIK, IKResult, IKSettings
from .calibration import Calibration, calibrate
from .clutch import Clutch
from .layout import N_ARM, SIDES
from .motion import JerkLimitedFollower, MotionState
from .robot_model import GROUPS, JointLimits, RobotModel, arm_joint_names
from .transforms import is_rigid

# Home posture [rad] (left arm joints 1-7, then right): upper arms down, elbows bent,
# forearms forward, palms facing each other, thumbs up; hands about 0.38 m in front
# of and 0.22 m below the shoulders. Mirror-symmetric. Also the calibration posture.
DEFAULT_HOME = (-1.429, 1.34, 1.953, -2.044, 1.529, 0.441, -0.277, 1.429, 1.34, -1.953, -2.044, -1.529, 0.441, 0.277)


class ArmTeleopSettings(NamedTuple):
    """Tuning of :class:`ArmTeleop`."""

    rate_hz: float = 200.0  # [Hz] control rate (Ruckig cycle time 1 / rate_hz)
    stale_timeout: float = 0.1  # [s] an operator pose older than this is stale: the side brakes
    future_tolerance: float = 0.05  # [s] a pose stamped further in the future than this is not fresh (clock skew)
    unreachable_position: float = 0.005  # [m] IK position error above which the target counts as unreachable
    unreachable_orientation: float = 0.035  # [rad] same for orientation (2 deg)
    target_margin: float = 0.02  # [rad] Ruckig targets stay this far inside the position limits
    # [m/s] wrist speed from the side's last accepted pose above which a pose is an outlier (inf: no gate)
    outlier_speed: float = math.inf
    outlier_slack: float = 0.02  # [m] jump allowed on top of outlier_speed * stamp difference (tracker noise)


class OperatorSample(NamedTuple):
    """Newest operator input of one side."""

    wrist: np.ndarray  # (4, 4) wrist tracker in the chest frame
    elbow: np.ndarray | None  # (3,) upper-arm tracker position in the chest frame [m]
    stamp: float  # [s] capture time


@dataclass
class SideState:
    """Per-side status for diagnostics."""

    active: bool = False  # following a fresh target this cycle
    stale: bool = True  # no fresh operator pose
    unreachable: bool = False  # last IK result outside the unreachable thresholds
    rejected: int = 0  # operator poses rejected (NaN, inf, not rigid)
    elbow_rejected: int = 0  # non-finite elbow hints dropped (the wrist pose was used)
    unreachable_count: int = 0  # IK solves flagged unreachable
    stale_events: int = 0  # fresh -> stale transitions
    outliers: int = 0  # operator poses refused by the outlier gate
    ik_reseeds: int = 0  # IK solves whose warm start was unreachable and a home or command seed reached the target
    last_ik: IKResult | None = None
    q_goal: np.ndarray = field(default_factory=lambda: np.zeros(N_ARM))  # last IK solution [rad]
    solved_stamp: float = float("nan")  # stamp of the operator sample the last IK solved


class ArmCommand(NamedTuple):
    """Output of one control cycle."""

    state: MotionState  # 14 arm joints, canonical order (left then right)
    source_stamp: float  # [s] newest operator sample first solved this cycle (NaN if none): latency = stamp - this
    ik_time: float  # [s] wall time spent in IK this cycle


class ArmTeleop:
    """Operator wrist poses in, jerk-limited 14-joint arm commands out."""

    def __init__(
        self,
        robot: RobotModel,
        home: np.ndarray,
        limits: JointLimits,
        *,
        settings: ArmTeleopSettings | None = None,
        ik_settings: IKSettings | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        """
        Args:
            robot: the whole robot's model.
            home: (14,) home posture [rad], the calibration reference (left arm, then right).
            limits: (14-joint) motion limits for Ruckig (position limits are the robot's;
                velocity/acceleration/jerk usually scaled down from the robot's).
            settings, ik_settings: tuning (default: the defaults of :class:`ArmTeleopSettings`, :class:`IKSettings`).
            calibration: operator-to-robot calibration (default: uncalibrated; engaging is then refused).
        """
        settings = ArmTeleopSettings() if settings is None else settings
        ik_settings = IKSettings() if ik_settings is None else ik_settings
        self.robot = robot
        self.settings = settings
        self.joint_names = arm_joint_names("left") + arm_joint_names("right")
        self.home = np.asarray(home, dtype=float)
        arm_limits = robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]]
        if self.home.shape != (2 * N_ARM,) or not arm_limits.within(self.home):
            raise ConfigurationError(
                f"home must be 14 joint positions within the arm limits; got {np.round(self.home, 3).tolist()}"
            )
        self.ik = {s: ArmIK(robot, s, settings=ik_settings) for s in SIDES}
        self._slices = {"left": slice(0, N_ARM), "right": slice(N_ARM, 2 * N_ARM)}
        self.follower = JerkLimitedFollower(limits, 1.0 / settings.rate_hz, target_margin=settings.target_margin)
        self.calibration = calibration or Calibration()
        self.clutch = Clutch(SIDES)
        if not settings.outlier_speed > 0 or not settings.outlier_slack >= 0:
            raise ConfigurationError(
                f"outlier_speed must be > 0 m/s and outlier_slack >= 0 m; got {settings.outlier_speed}, "
                f"{settings.outlier_slack}"
            )
        self.sides = {s: SideState() for s in SIDES}
        self._operator: dict[str, OperatorSample] = {}
        self._reanchor: set[str] = set()  # sides whose next target re-captures the clutch offset
        self.cycles = 0  # [-] steps run
        self.stale_cycles = 0  # [-] steps in which the clutch was engaged and a side was stale
        self._last_step: float | None = None  # [s] time of the previous step (None: the next one is nominal)
        self.reset(self.home)

    # ------------------------------------------------------------------ state
    def reset(self, position: np.ndarray) -> None:
        """Restart from ``position`` (14,) [rad] at rest (e.g. the measured joint state).

        Clutch offsets are re-captured at the next targets, so an engaged
        clutch continues from the new position instead of driving back.
        """
        self.follower.reset(position)
        self._last_step = None
        for s in SIDES:
            self.clutch.release(s)
        for s in SIDES:
            self.sides[s].q_goal = self.follower.state.position[self._slices[s]].copy()
            self.sides[s].solved_stamp = float("nan")

    def commanded_hand_pose(self, side: str) -> np.ndarray:
        """(4, 4) pose of the hand at the current command, torso frame."""
        return self.ik[side].forward(self.follower.state.position[self._slices[side]])

    # ------------------------------------------------------------------ input
    def set_operator(self, side: str, wrist: np.ndarray, elbow: np.ndarray | None, stamp: float) -> bool:
        """Store the newest operator pose of ``side``; False (counted) if rejected.

        Rejected: a non-finite or non-rigid wrist or a non-finite stamp (``rejected``), and an outlier
        (``outliers``): a wrist farther than ``outlier_speed * (stamp - last stamp) + outlier_slack`` [m]
        from the side's last accepted wrist, while that one is at most ``stale_timeout`` older. A pose
        that comes more than ``stale_timeout`` after the last accepted one is accepted whatever its
        position and re-anchors the side (like tracking that resumes).

        Args:
            wrist: (4, 4) wrist tracker pose in the chest tracker frame.
            elbow: (3,) upper-arm tracker position in the chest frame [m] or None.
            stamp: capture time [s].
        """
        st = self.sides[side]
        wrist = np.asarray(wrist, dtype=float)
        ok = wrist.shape == (4, 4) and is_rigid(wrist, 1e-3) and np.isfinite(stamp)
        if elbow is not None:
            elbow = np.asarray(elbow, dtype=float)
            if elbow.shape != (3,) or not np.all(np.isfinite(elbow)):
                elbow = None  # the hint is optional: keep the wrist, drop the hint
                st.elbow_rejected += 1
        if not ok:
            st.rejected += 1
            return False
        last = self._operator.get(side)
        if last is not None:
            gap = float(stamp) - last.stamp  # [s]
            if gap > self.settings.stale_timeout:
                self._reanchor.add(side)  # tracked again after a gap: continue from where the arm is
            elif self._outlier(wrist, last.wrist, gap):
                st.outliers += 1
                return False
        self._operator[side] = OperatorSample(wrist, elbow, float(stamp))
        return True

    def _outlier(self, wrist: np.ndarray, last: np.ndarray, gap: float) -> bool:
        """True if ``wrist`` moved too far from ``last`` in ``gap`` [s] (the outlier gate)."""
        speed = self.settings.outlier_speed
        if not math.isfinite(speed):
            return False
        d = wrist[:3, 3] - last[:3, 3]
        distance = math.sqrt(float(d @ d))  # [m]
        return distance > speed * max(gap, 0.0) + self.settings.outlier_slack

    def operator(self, side: str) -> OperatorSample | None:
        return self._operator.get(side)

    # ------------------------------------------------------------------ clutch and calibration
    def engage(self) -> tuple[bool, str]:
        """Engage the clutch (offsets captured at each side's next fresh target)."""
        if self.calibration.is_default:
            return False, "not calibrated: call calibrate first (operator in the calibration posture)"
        self.clutch.engage()
        return True, "engaged"

    def disengage(self) -> tuple[bool, str]:
        """Disengage: both arms brake to a stop."""
        self.clutch.disengage()
        return True, "disengaged"

    def robot_home_points(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Robot hand poses (4, 4) and upper-arm midpoints (3,) at home, torso frame."""
        q = self.robot.neutral()
        q[GROUPS.left_arm] = self.home[: N_ARM]
        q[GROUPS.right_arm] = self.home[N_ARM:]
        hands, elbows = {}, {}
        for s in SIDES:
            ik = self.ik[s]
            hands[s] = ik.forward(self.home[self._slices[s]])
            shoulder, elbow = self.robot.forward_kinematics(
                q, [f"{s}_arm_link2", ik.elbow_frame], base=ik.base_frame
            )[:, :3, 3]
            elbows[s] = 0.5 * (shoulder + elbow)
        return hands, elbows

    def capture_calibration(self, now: float) -> Calibration:
        """A calibration from the current (fresh) operator poses, not yet applied.

        Raises ConfigurationError when a pose is missing or stale or the
        posture is not the calibration posture.
        """
        wrists, elbows = {}, {}
        for s in SIDES:
            sample = self._operator.get(s)
            if sample is None or not self._fresh(sample, now):
                raise ConfigurationError(f"cannot calibrate: no fresh {s} wrist pose (trackers tracking?)")
            if sample.elbow is None:
                raise ConfigurationError(f"cannot calibrate: no fresh {s} upper-arm tracker pose")
            wrists[s], elbows[s] = sample.wrist, sample.elbow
        hands, robot_elbows = self.robot_home_points()
        return calibrate(wrists, elbows, hands, robot_elbows)

    def set_calibration(self, calibration: Calibration) -> None:
        """Use ``calibration`` from now on; the clutch disengages (the mapping changes)."""
        self.clutch.disengage()
        self.calibration = calibration

    def calibrate(self, now: float) -> Calibration:
        """:meth:`capture_calibration` and :meth:`set_calibration` in one step."""
        cal = self.capture_calibration(now)
        self.set_calibration(cal)
        return cal

    # ------------------------------------------------------------------ cycle
    def _fresh(self, sample: OperatorSample, now: float) -> bool:
        age = now - sample.stamp
        return -self.settings.future_tolerance <= age <= self.settings.stale_timeout

    def _unreachable(self, result: IKResult) -> bool:
        return (result.position_error > self.settings.unreachable_position
                or result.orientation_error > self.settings.unreachable_orientation)

    def _solve(self, side: str, target: np.ndarray, hint: np.ndarray | None) -> IKResult:
        """IK from the warm start; when that is unreachable, from the side's home posture and then from its
        current command, keeping the first that reaches the target (else the warm-started result)."""
        st, sl, ik = self.sides[side], self._slices[side], self.ik[side]
        result = ik.solve(target, st.q_goal, hint)
        if not self._unreachable(result):
            return result
        for seed in (self.home[sl], self.follower.state.position[sl]):
            other = ik.solve(target, seed, hint)
            if not self._unreachable(other):
                st.ik_reseeds += 1
                return other
        return result

    def step(self, now: float, *, dt: float | None = None) -> ArmCommand:
        """One control cycle at time ``now`` [s]; returns the 14-joint command.

        Args:
            now: the cycle's time [s], the stamp of the command it returns.
            dt: the time the trajectory advances [s]; None: the time since the previous step (the nominal
                cycle ``1 / rate_hz`` at the first step, after :meth:`reset`, or when time did not advance).
        """
        last, self._last_step = self._last_step, now
        if dt is None:
            dt = now - last if last is not None and now > last else self.follower.dt
        goal = np.empty(2 * N_ARM)
        active = np.zeros(2 * N_ARM, dtype=bool)
        source_stamp = float("nan")
        ik_time = 0.0
        for side in SIDES:
            st = self.sides[side]
            sl = self._slices[side]
            sample = self._operator.get(side)
            fresh = sample is not None and self._fresh(sample, now)
            if st.stale is False and not fresh:
                st.stale_events += 1
            if fresh and (st.stale or side in self._reanchor):
                # tracking resumed: re-anchor this side like a re-engage, so the arm does not
                # race to wherever the operator moved while untracked
                self.clutch.release(side)
                self._reanchor.discard(side)
            st.stale = not fresh
            st.active = bool(fresh and self.clutch.engaged)
            if not st.active:
                if not self.clutch.engaged:
                    st.solved_stamp = float("nan")
                goal[sl] = self.follower.state.position[sl]
                continue
            if sample.stamp != st.solved_stamp:
                t0 = time.perf_counter()
                robot_now = None
                if self.clutch.offset(side) is None:  # first target after engaging: start from the command
                    st.q_goal = self.follower.state.position[sl].copy()
                    robot_now = self.commanded_hand_pose(side)
                mapped = self.calibration.map_wrist(side, sample.wrist)
                target = self.clutch.apply(side, mapped, robot_now)
                hint = None
                if sample.elbow is not None:
                    hint = self.clutch.apply_point(side, self.calibration.map_elbow(side, sample.elbow))
                result = self._solve(side, target, hint)
                ik_time += time.perf_counter() - t0
                st.last_ik = result
                st.q_goal = result.q
                st.solved_stamp = sample.stamp
                st.unreachable = self._unreachable(result)
                st.unreachable_count += int(st.unreachable)
                source_stamp = sample.stamp if np.isnan(source_stamp) else max(source_stamp, sample.stamp)
            goal[sl] = st.q_goal
            active[sl] = True
        self.cycles += 1
        if self.clutch.engaged and any(self.sides[s].stale for s in SIDES):
            self.stale_cycles += 1
        state = self.follower.step(goal, active, dt=dt)
        return ArmCommand(state, source_stamp, ik_time)
