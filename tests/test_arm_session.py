"""core.arm_session: arm_ik's rules with an injected clock (start gating, clutch pedal and deadman,
auto-calibration on a still posture, auto-engage, notices, status)."""

from __future__ import annotations

import numpy as np
import pytest

from rynn_teleop.core.arm_session import ArmSession, SessionSettings
from rynn_teleop.core.arm_teleop import DEFAULT_HOME, ArmTeleop
from rynn_teleop.core.calibration import Calibration
from rynn_teleop.core.layout import ROLES
from rynn_teleop.core.robot_model import GROUPS, RobotModel, arm_joint_names
from rynn_teleop.core.status import ArmIKStatus
from rynn_teleop.core.trackers import TrackerSet, group_frames
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.sources.trackers import SyntheticOperator

SERIALS = {r: f"LHR-{i:08X}" for i, r in enumerate(ROLES, start=1)}
ARM_NAMES = list(arm_joint_names("left") + arm_joint_names("right"))
DT = 0.005  # [s] control cycle


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def make_session(robot, *, calibrated: bool = False, **settings) -> ArmSession:
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]])
    if calibrated:
        ctl.calibration = Calibration(is_default=False)
    return ArmSession(ctl, SessionSettings(**{"start_from": "home", **settings}))


class Operator:
    """The synthetic operator's frames as the tracker node publishes them ((5, 4, 4), NaN for an absent role)."""

    def __init__(self, **kwargs) -> None:
        self.source = SyntheticOperator(SERIALS, **kwargs)
        self.trackers = TrackerSet(SERIALS, 0.1)
        self.source.start(0.0)

    def feed(self, session: ArmSession, now: float) -> None:
        for frame in group_frames(self.source.read(now)):
            session.add_frame(frame.stamp, self.trackers.update_frame(frame))


def run(session: ArmSession, t0: float, t1: float, operator: Operator | None = None, until=None) -> float | None:
    """Control cycles from ``t0`` to ``t1`` [s]; the first time ``until(session)`` holds (None if never)."""
    for k in range(int(round((t1 - t0) / DT))):
        now = t0 + k * DT
        if operator is not None:
            operator.feed(session, now)
        session.step(now)
        if until is not None and until(session):
            return now
    return None


# ------------------------------------------------------------------------------------------ start gating
def test_a_measured_start_waits_for_fresh_joint_states_of_every_arm_joint(robot):
    session = make_session(robot, start_from="measured")
    assert session.needs_joint_states and session.step(0.0) is None
    measured = np.array(DEFAULT_HOME) + 0.05
    session.add_joint_states(ARM_NAMES[:7], measured[:7], 0.0)  # the left arm only
    assert session.step(0.01) is None
    session.add_joint_states(ARM_NAMES[7:], measured[7:], 0.0)
    assert session.step(0.6) is None  # 0.6 s old: older than measured_timeout (0.5 s)
    session.add_joint_states(ARM_NAMES, measured, 0.6)
    command = session.step(0.61)
    assert command is not None and session.started and not session.needs_joint_states
    np.testing.assert_allclose(command.state.position, measured, atol=1e-12)  # starts where the robot is
    assert ("info", "starting from the measured arm positions") in session.take_notices()
    session.add_joint_states(ARM_NAMES, measured + 0.3, 0.62)  # ignored once started
    np.testing.assert_allclose(session.step(0.62).state.position, measured, atol=1e-9)


def test_a_measured_position_far_outside_its_limit_blocks_the_start_and_a_near_one_is_clipped(robot):
    session = make_session(robot, start_from="measured")
    upper = session.ctl.follower.limits.upper
    measured = np.array(DEFAULT_HOME)
    measured[2] = upper[2] + 0.3
    for k in range(5):
        session.add_joint_states(ARM_NAMES, measured, k * DT)
        assert session.step(k * DT) is None
    assert "left_arm_joint3" in session.start_error
    notices = session.take_notices()
    assert [n.level for n in notices] == ["error"]  # reported once while it lasts
    assert session.status().level == "error"
    measured[2] = upper[2] + 0.005  # within start_tolerance (0.01 rad)
    session.add_joint_states(ARM_NAMES, measured, 0.1)
    command = session.step(0.1)
    assert command is not None and command.state.position[2] == pytest.approx(upper[2])
    assert not session.start_error
    assert any(n.level == "warning" and "clipped" in n.text for n in session.take_notices())


def test_a_home_start_commands_at_once(robot):
    session = make_session(robot)
    assert not session.needs_joint_states
    np.testing.assert_allclose(session.step(0.0).state.position, DEFAULT_HOME)
    assert session.status().message == "not calibrated"


# ------------------------------------------------------------------------------------------ clutch
def test_the_deadman_pedal_ends_an_engagement_after_its_timeout(robot):
    session = make_session(robot, calibrated=True, clutch_topic_timeout=0.3)
    session.step(0.0)
    session.clutch_topic(True, 0.0)
    assert session.engaged and session.pedal_holds
    for k in range(1, 11):  # held: true every 0.1 s
        session.clutch_topic(True, 0.1 * k)
        session.step(0.1 * k + 0.05)
        assert session.engaged
    assert session.ctl.clutch.engagements == 1  # a held pedal does not re-engage
    session.step(1.0 + 0.29)
    assert session.engaged
    session.step(1.0 + 0.31)  # silent for longer than the timeout
    assert not session.engaged and not session.pedal_holds
    assert any(n.level == "warning" and "silent" in n.text for n in session.take_notices())
    session.clutch_topic(True, 2.0)
    session.clutch_topic(False, 2.1)  # released
    assert not session.engaged


def test_the_service_takes_over_from_the_pedal_and_without_a_timeout_the_pedal_only_switches(robot):
    session = make_session(robot, calibrated=True, clutch_topic_timeout=0.3)
    session.clutch_topic(True, 0.0)
    assert session.set_clutch(True) == (True, "engaged")
    session.step(5.0)
    assert session.engaged  # the service's engagement has no deadman
    switch = make_session(robot, calibrated=True)  # clutch_topic_timeout 0
    switch.clutch_topic(True, 0.0)
    switch.step(5.0)
    assert switch.engaged


def test_engaging_uncalibrated_is_refused_and_a_pedal_is_told_at_most_every_two_seconds(robot):
    session = make_session(robot)
    ok, message = session.set_clutch(True)
    assert not ok and "calibrate" in message and not session.engaged
    session.take_notices()
    for k in range(100):  # a pedal held at 100 Hz for 1 s
        session.clutch_topic(True, 0.01 * k)
    assert len(session.take_notices()) == 1
    session.clutch_topic(True, 2.5)
    assert len(session.take_notices()) == 1
    assert not session.pedal_holds


# ------------------------------------------------------------------------------------------ auto-calibration
def test_auto_calibration_waits_for_the_delay_and_a_still_operator_then_auto_engages_once(robot):
    session = make_session(robot, auto_calibrate=True, auto_engage=True, auto_calibrate_delay=1.0)
    op = Operator(hold_s=4.0)
    t = run(session, 0.0, 3.0, op, until=lambda s: s.auto_calibrated)
    assert t is not None
    assert session.first_seen is not None and t >= session.first_seen + 1.0 - 1e-9
    assert t < session.first_seen + 1.0 + 0.1  # still since the start: captured right after the delay
    assert not session.ctl.calibration.is_default and session.engaged
    assert session.ctl.clutch.engagements == 1
    session.set_clutch(False)  # the operator's choice: auto-engage does not engage again
    run(session, 3.0, 3.5, op)
    assert not session.engaged and session.ctl.clutch.engagements == 1
    assert any("calibrated" in n.text and "not saved" in n.text for n in session.take_notices())


def test_auto_calibration_waits_for_the_still_window_after_a_short_delay(robot):
    session = make_session(robot, auto_calibrate=True, auto_calibrate_delay=0.0, still_window=0.8)
    op = Operator(hold_s=4.0)
    t = run(session, 0.0, 3.0, op, until=lambda s: s.auto_calibrated)
    assert t is not None and t >= 0.8 - 1e-9  # a whole window of still poses first


def test_a_moving_operator_is_not_auto_calibrated(robot):
    session = make_session(robot, auto_calibrate=True, auto_calibrate_delay=0.5)
    op = Operator(hold_s=0.0)
    op.feed(session, 1.0)  # skip the start at home: the operator is on the move from here
    assert run(session, 1.0, 7.5, op, until=lambda s: s.auto_calibrated) is None
    assert session.ctl.calibration.is_default
    assert any("hold the calibration posture still" in n.text for n in session.take_notices())


def test_a_failed_auto_calibration_is_retried_and_reported_at_most_every_two_seconds(robot):
    """A still operator in a posture that is not the calibration posture: refused, retried."""
    session = make_session(robot, auto_calibrate=True, auto_calibrate_delay=0.0, auto_calibrate_retry=0.5)
    op = Operator(hold_s=30.0)
    home = op.source.home_pose()
    frame = np.stack([home[r] for r in ROLES])
    frame[ROLES.index("left_wrist"), :3, 3] += [0.0, 0.0, 0.6]  # the left hand raised 60 cm, held still
    attempts = []
    capture = session.ctl.capture_calibration

    def counted(now):
        attempts.append(now)
        return capture(now)

    session.ctl.capture_calibration = counted
    for k in range(int(3.0 / DT)):
        now = k * DT
        if k % 2 == 0:  # frames at 100 Hz
            session.add_frame(now, frame)
        session.step(now)
    assert not session.auto_calibrated and session.ctl.calibration.is_default
    assert len(attempts) >= 4 and np.all(np.diff(attempts) >= 0.5 - 1e-9)
    warnings = [n for n in session.take_notices() if n.level == "warning"]
    assert 1 <= len(warnings) <= 2 and "calibration rejected" in warnings[0].text


def test_calibrate_saves_or_keeps_the_old_calibration(robot, tmp_path):
    session = make_session(robot)
    op = Operator(hold_s=5.0)
    run(session, 0.0, 0.5, op)
    message = session.calibrate(0.5, tmp_path / "cal.yaml")
    assert "saved to" in message and (tmp_path / "cal.yaml").exists()
    old = session.ctl.calibration
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ConfigurationError, match="cannot write"):
        session.calibrate(0.5, tmp_path / "file" / "cal.yaml")
    assert session.ctl.calibration is old
    with pytest.raises(ConfigurationError, match="no fresh"):
        session.calibrate(5.0)  # the poses are 4.5 s old


# ------------------------------------------------------------------------------------------ input and status
def test_frames_drive_the_controller_and_a_missing_wrist_goes_stale(robot):
    session = make_session(robot, calibrated=True)
    op = Operator(hold_s=0.5, dropouts=[("left_wrist", 1.0, 1.5)])
    session.set_clutch(True)
    run(session, 0.0, 1.2, op)
    assert session.ctl.sides["left"].stale and not session.ctl.sides["right"].stale
    assert session.status().message == "left stale"
    assert session.ctl.stale_cycles > 0
    run(session, 1.2, 2.0, op)
    assert not session.ctl.sides["left"].stale
    values = session.diagnostic_values()
    assert values["tracker_frames"] > 200 and values["tracker_frames_malformed"] == 0
    # the typed status the console reads, decoded from the values as a subscriber gets them
    status = ArmIKStatus.decode({k: str(v) for k, v in values.items()})
    assert status == session.arm_status() and status.engaged and status.calibrated
    assert status.following == {"left": True, "right": True}
    assert values["left.stale_events"] == 1 and values["cycles"] == session.ctl.cycles
    session.add_frame(3.0, np.eye(4))  # not a frame
    assert session.diagnostic_values()["tracker_frames_malformed"] == 1


def test_bad_settings_are_refused(robot):
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]])
    with pytest.raises(ConfigurationError, match="start_from"):
        ArmSession(ctl, SessionSettings(start_from="elsewhere"))
    with pytest.raises(ConfigurationError, match="still"):
        ArmSession(ctl, SessionSettings(still_window=0.0))
