"""core.arm_teleop on a real-time budget: steps by the measured time, the outlier gate, IK recovery after a
burst of bad targets, stale-cycle counters. Simulated time throughout (no ROS, no sleeps)."""

from __future__ import annotations

import numpy as np
import pytest

from rynn_teleop.core.arm_teleop import DEFAULT_HOME, ArmTeleop, ArmTeleopSettings
from rynn_teleop.core.calibration import Calibration
from rynn_teleop.core.robot_model import GROUPS, JointLimits, RobotModel
from rynn_teleop.errors import ConfigurationError

SIDES = ("left", "right")
DT = 0.005  # [s] nominal control cycle
# arm_ik's default motion limits (half the vendor's), per arm joint 1-7
VELOCITY = [1.5708] * 7
ACCELERATION = [3.927, 3.927, 7.854, 7.854, 7.854, 7.854, 7.854]
JERK = [30.0] * 7


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def limits(robot) -> JointLimits:
    lim = robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]]
    return JointLimits(lim.lower, lim.upper, np.tile(VELOCITY, 2), np.tile(ACCELERATION, 2), np.tile(JERK, 2))


def make_controller(robot, **settings):
    """Engaged, with an identity calibration (chest frame = torso frame); with the robot's home hand poses
    and upper-arm points, which are then also the operator's."""
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), limits(robot), settings=ArmTeleopSettings(**settings))
    hands, elbows = ctl.robot_home_points()
    ctl.calibration = Calibration(is_default=False)
    assert ctl.engage()[0]
    return ctl, hands, elbows


def moved(T: np.ndarray, offset) -> np.ndarray:
    out = T.copy()
    out[:3, 3] += offset
    return out


def send(ctl, hands, elbows, stamp, offset=(0.0, 0.0, 0.0), sides=SIDES) -> list[bool]:
    return [ctl.set_operator(s, moved(hands[s], offset), elbows[s] + np.asarray(offset), stamp) for s in sides]


def jittered_times(rng: np.random.Generator, n: int) -> np.ndarray:
    """Step times of a 200 Hz loop on a busy machine: small jitter, and now and then a tick 10 ms late
    followed by an early one (the loop keeps its phase)."""
    intervals = []
    while len(intervals) < n:
        if rng.random() < 0.1:
            intervals += [DT + 0.010, 0.0005]
        else:
            intervals.append(DT + rng.uniform(-0.0003, 0.0003))
    return np.cumsum(intervals[:n])


# ------------------------------------------------------------------------------------------ wall-clock steps
def test_steps_at_jittered_times_stay_within_the_limits_over_the_real_intervals(robot):
    ctl, hands, elbows = make_controller(robot)
    lim = ctl.follower.limits
    times = jittered_times(np.random.default_rng(4), 1600)
    q = []
    for k, now in enumerate(times):
        if k % 2 == 0:  # the operator at ~100 Hz: a brisk reach, and jumps the Ruckig limits must absorb
            offset = [0.15 * np.sin(2.5 * now), 0.1 * np.sin(1.7 * now), 0.12 * (int(now / 1.5) % 2)]
            send(ctl, hands, elbows, now, offset)
        q.append(ctl.step(now).state.position.copy())
    q, dt = np.array(q), np.diff(times)
    speed = np.abs(np.diff(q, axis=0)) / dt[:, None]
    assert np.all(speed <= lim.velocity * (1 + 1e-6))
    assert (speed / lim.velocity).max() > 0.9  # the test drives the arms at their limits
    mid = times[:-1] + dt / 2
    accel = np.abs(np.diff(np.diff(q, axis=0) / dt[:, None], axis=0)) / np.diff(mid)[:, None]
    assert np.all(accel <= 1.05 * lim.acceleration)
    assert (accel / lim.acceleration).max() > 0.5
    assert ctl.follower.errors == 0


def test_a_step_advances_the_trajectory_by_the_time_since_the_previous_one(robot):
    """Stepping at 10 ms lands where stepping at 5 ms does (one trajectory, sampled at the step times)."""
    fine, hands, elbows = make_controller(robot)
    coarse, _, _ = make_controller(robot)
    for k in range(200):
        now = k * DT
        # the same operator samples for both: the first anchors the clutch, then one fixed target from the
        # start of the first 10 ms interval on (no elbow hint: re-solving it returns the same joints)
        for ctl in (fine, coarse):
            for s in SIDES:
                ctl.set_operator(s, moved(hands[s], (0.0, 0.0, 0.0) if k == 0 else (0.1, 0.05, -0.05)), None, now)
        a = fine.step(now)
        if k % 2 == 0:
            b = coarse.step(now)
            np.testing.assert_allclose(b.state.position, a.state.position, atol=1e-6)
    assert np.abs(fine.follower.state.position - np.array(DEFAULT_HOME)).max() > 0.05  # it did move
    # the first step (and the first after a reset) advances by the nominal cycle
    first, _, _ = make_controller(robot)
    twin, _, _ = make_controller(robot)
    for ctl in (first, twin):
        send(ctl, hands, elbows, 10.0, (0.1, 0.0, 0.0))
        ctl.step(10.0, dt=None if ctl is first else DT)
    np.testing.assert_array_equal(first.follower.state.position, twin.follower.state.position)


def test_a_sample_s_latency_counts_at_the_command_that_first_solves_it(robot):
    """``source_stamp``: the newest operator sample solved in that cycle; cycles that only go on towards an
    already solved target report none (arm_ik's latency meter: sample -> the command that used it)."""
    ctl, hands, elbows = make_controller(robot)
    stamps = []
    for k in range(12):  # 120 Hz samples into a 200 Hz loop: a new sample every 5/3 cycles
        now = k * DT
        sample = np.floor(now * 120.0) / 120.0
        send(ctl, hands, elbows, sample, (0.01 * sample, 0.0, 0.0))
        stamps.append(ctl.step(now + 0.001).source_stamp)
    new = [s for s in stamps if not np.isnan(s)]
    assert new == sorted(set(new)) and len(new) == len(set(np.floor(np.arange(12) * DT * 120.0)))
    assert len(new) < len(stamps)  # some cycles solved nothing new


# ------------------------------------------------------------------------------------------ outlier gate
def test_a_single_glitch_is_not_followed_and_counted(robot):
    ctl, hands, elbows = make_controller(robot, outlier_speed=3.0)
    for k in range(40):
        now = k * DT
        glitch = k == 20
        ok = send(ctl, hands, elbows, now, (1.0, 0.0, 0.0) if glitch else (0.0, 0.0, 0.0))
        assert ok == [not glitch] * 2
        ctl.step(now)
    assert all(ctl.sides[s].outliers == 1 for s in SIDES)
    assert np.abs(ctl.follower.state.position - np.array(DEFAULT_HOME)).max() < 1e-3  # the arms held still


def test_a_burst_of_glitches_is_refused_while_fast_real_motion_is_followed(robot):
    ctl, hands, elbows = make_controller(robot, outlier_speed=3.0)
    glitches = 0
    for k in range(int(2.0 / DT)):
        now = k * DT
        offset = np.array([0.2 * np.sin(6.0 * now), 0.0, 0.0])  # up to 1.2 m/s: followed
        if k % 2:
            offset = offset + [0.0, 1.0, 0.0]  # every other pose 1 m away
            glitches += 1
        send(ctl, hands, elbows, now, offset)
        ctl.step(now)
    assert all(ctl.sides[s].outliers == glitches for s in SIDES)
    assert not any(ctl.sides[s].unreachable for s in SIDES)
    for s in SIDES:  # followed the real motion, never towards the glitches
        assert abs(ctl.commanded_hand_pose(s)[1, 3] - hands[s][1, 3]) < 0.02


def test_same_stamp_jumps_are_outliers_and_slow_drift_is_not(robot):
    ctl, hands, elbows = make_controller(robot, outlier_speed=3.0)
    assert send(ctl, hands, elbows, 1.0) == [True, True]
    assert send(ctl, hands, elbows, 1.0, (0.05, 0.0, 0.0)) == [False, False]  # 5 cm at the same stamp
    assert send(ctl, hands, elbows, 1.0, (0.01, 0.0, 0.0)) == [True, True]  # within the 2 cm slack
    assert send(ctl, hands, elbows, 1.01, (0.04, 0.0, 0.0)) == [True, True]  # 3 cm in 10 ms: 3 m/s + slack


def test_a_true_repositioning_re_anchors_after_the_stale_timeout(robot):
    """The pose jumps 0.5 m and stays there (a tracker re-localised): refused until the side goes stale,
    then accepted as a re-anchor, so the arm does not jump but follows the motion from there."""
    ctl, hands, elbows = make_controller(robot, outlier_speed=3.0)
    accepted = []
    positions = []
    for k in range(int(1.5 / DT)):
        now = k * DT
        offset = (0.0, 0.0, 0.0) if now < 0.5 else (0.5, 0.0, 0.0)
        if now >= 1.0:
            offset = (0.5, 0.0, 0.05 * min(1.0, (now - 1.0) / 0.3))  # then moves 5 cm up
        accepted.append(send(ctl, hands, elbows, now, offset)[0])
        positions.append(ctl.step(now).state.position.copy())
    first_back = next(k for k in range(int(0.5 / DT), len(accepted)) if accepted[k]) * DT
    assert 0.5 + 0.1 - 1e-9 <= first_back <= 0.5 + 0.1 + 2 * DT  # refused for stale_timeout, then accepted
    assert ctl.sides["left"].outliers == round((first_back - 0.5) / DT) and not ctl.sides["left"].stale
    positions = np.array(positions)
    assert np.abs(positions[: int(1.0 / DT)] - np.array(DEFAULT_HOME)).max() < 1e-3  # no jump
    for s in SIDES:
        np.testing.assert_allclose(ctl.commanded_hand_pose(s)[:3, 3] - hands[s][:3, 3], [0.0, 0.0, 0.05], atol=2e-3)


def test_tracking_resumed_far_away_re_anchors_at_once(robot):
    ctl, hands, elbows = make_controller(robot, outlier_speed=3.0)
    for k in range(20):
        send(ctl, hands, elbows, k * DT)
        ctl.step(k * DT)
    start = ctl.follower.state.position.copy()
    for k in range(20, 80):  # lost for 0.3 s, found 0.4 m away
        if k >= 60:
            assert send(ctl, hands, elbows, k * DT, (0.0, 0.4, 0.0)) == [True, True]
        ctl.step(k * DT)
    assert all(ctl.sides[s].outliers == 0 for s in SIDES)
    assert np.abs(ctl.follower.state.position - start).max() < 1e-3


def test_bad_gate_settings_are_refused(robot):
    with pytest.raises(ConfigurationError, match="outlier"):
        ArmTeleop(robot, np.array(DEFAULT_HOME), limits(robot), settings=ArmTeleopSettings(outlier_speed=0.0))


# ------------------------------------------------------------------------------------------ IK recovery
@pytest.mark.parametrize("direction", [(0.19, -0.2, 0.96), (0.36, 0.92, -0.11), (0.88, -0.43, 0.23),
                                       (-0.9, -0.44, 0.03)])
def test_a_burst_of_glitches_does_not_trap_an_arm_at_a_limit(robot, direction):
    """2 s of alternating 1 m glitches with the gate off (every one is followed), then good input: the IK is
    back on target within 1 s and the arm there soon after, not held at a joint limit."""
    ctl, hands, elbows = make_controller(robot)  # outlier_speed: inf (no gate)
    d = np.asarray(direction) / np.linalg.norm(direction)
    unreachable_position = ctl.settings.unreachable_position
    sample = 0
    on_target_ik = arm_back = None
    for k in range(int(6.0 / DT)):
        now = k * DT
        while sample / 120.0 <= now:  # a 120 Hz tracker
            t = sample / 120.0
            for s, sign in zip(SIDES, (1.0, -1.0)):
                offset = np.array([0.05 * np.sin(t), 0.0, 0.0])
                if 1.0 <= t < 3.0 and sample % 2:
                    offset = offset + sign * d
                ctl.set_operator(s, moved(hands[s], offset), elbows[s] + offset, t)
            sample += 1
        ctl.step(now)
        if now < 3.0:
            continue
        good = np.array([0.05 * np.sin(now), 0.0, 0.0])
        ik_ok = all(not ctl.sides[s].unreachable and ctl.sides[s].last_ik.position_error < unreachable_position
                    for s in SIDES)
        if ik_ok and on_target_ik is None:
            on_target_ik = now - 3.0
        elif not ik_ok:
            on_target_ik = None
        error = max(np.linalg.norm(ctl.commanded_hand_pose(s)[:3, 3] - hands[s][:3, 3] - good) for s in SIDES)
        if error < unreachable_position and arm_back is None:
            arm_back = now - 3.0
    assert on_target_ik is not None and on_target_ik <= 1.0
    assert arm_back is not None and arm_back <= 3.0  # the arm travels back at its motion limits
    lim = ctl.follower.limits
    q = ctl.follower.state.position
    assert np.all(q > lim.lower + 0.05) and np.all(q < lim.upper - 0.05)


# ------------------------------------------------------------------------------------------ counters
def test_stale_cycles_count_engaged_cycles_with_a_stale_side(robot):
    ctl, hands, elbows = make_controller(robot)
    for k in range(100):
        now = k * DT
        send(ctl, hands, elbows, now, sides=("left",) if 40 <= k < 80 else SIDES)
        ctl.step(now)
    assert ctl.cycles == 100
    assert ctl.stale_cycles == 80 - 40 - int(round(0.1 / DT))  # stale once 0.1 s passed without a right pose
    ctl.disengage()
    for k in range(100, 150):
        ctl.step(k * DT)  # everything stale, but disengaged: not counted
    assert ctl.cycles == 150 and ctl.stale_cycles == 80 - 40 - 20
