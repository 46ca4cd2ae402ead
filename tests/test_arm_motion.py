"""Ruckig following (core.motion) and the dual-arm controller (core.arm_teleop).

The property test drives the whole controller (mapping, IK, Ruckig) with
arbitrary operator streams (jumps, NaN, unreachable poses, stale gaps, clutch
changes) and checks the 200 Hz command stream by finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rynn_teleop.core.arm_teleop import DEFAULT_HOME, ArmTeleop
from rynn_teleop.core.calibration import Calibration
from rynn_teleop.core.motion import JerkLimitedFollower
from rynn_teleop.core.robot_model import GROUPS, JointLimits, RobotModel
from rynn_teleop.core.transforms import make_transform
from rynn_teleop.errors import ConfigurationError

DT = 0.005  # [s] 200 Hz
SIDES = ("left", "right")


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def arm_limits(robot: RobotModel, scale: float = 0.5) -> JointLimits:
    lim = robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]]
    return JointLimits(lim.lower, lim.upper, lim.velocity * scale, lim.acceleration * scale, lim.jerk * scale)


def check_stream(positions: np.ndarray, limits: JointLimits, dt: float = DT) -> None:
    """Positions (T, n) stay in the limits; finite differences respect vel/acc/jerk limits."""
    assert np.all(np.isfinite(positions))
    assert np.all(positions >= limits.lower - 1e-9), "below a position limit"
    assert np.all(positions <= limits.upper + 1e-9), "above a position limit"
    tol = 1.0 + 1e-6
    v = np.diff(positions, axis=0) / dt
    a = np.diff(v, axis=0) / dt
    j = np.diff(a, axis=0) / dt
    assert np.all(np.abs(v) <= limits.velocity * tol + 1e-9), f"velocity {np.abs(v).max(0)}"
    assert np.all(np.abs(a) <= limits.acceleration * tol + 1e-6), f"acceleration {np.abs(a).max(0)}"
    assert np.all(np.abs(j) <= limits.jerk * tol + 1e-3), f"jerk {np.abs(j).max(0)}"


# ---------------------------------------------------------------------------------------------- follower
def test_follower_reaches_a_target_and_rests(robot):
    lim = arm_limits(robot)
    f = JerkLimitedFollower(lim, DT)
    start = np.array(DEFAULT_HOME)
    f.reset(start)
    goal = start + 0.3
    out = [f.step(goal).position for _ in range(600)]
    np.testing.assert_allclose(out[-1], np.clip(goal, lim.lower + 0.02, lim.upper - 0.02), atol=1e-9)
    assert f.at_rest()
    check_stream(np.array([start] + out), lim)


def test_follower_targets_are_clipped_inside_the_limits(robot):
    lim = arm_limits(robot)
    f = JerkLimitedFollower(lim, DT, target_margin=0.05)
    f.reset(np.zeros(14))
    out = np.array([f.step(lim.upper + 1.0).position for _ in range(1500)])
    np.testing.assert_allclose(out[-1], lim.upper - 0.05, atol=1e-9)
    check_stream(out, lim)


def test_follower_brakes_inactive_and_nonfinite_joints(robot):
    lim = arm_limits(robot)
    f = JerkLimitedFollower(lim, DT)
    f.reset(np.zeros(14))
    goal = np.full(14, 1.0)
    for _ in range(40):  # get moving
        f.step(goal)
    moving = f.state.velocity.copy()
    assert np.all(moving > 0.1)
    goal_nan = goal.copy()
    goal_nan[3] = np.nan
    active = np.ones(14, dtype=bool)
    active[10] = False
    out = [f.step(goal_nan, active) for _ in range(200)]
    # joints 3 and 10 came to rest short of the goal; the others kept following
    assert abs(out[-1].velocity[3]) < 1e-9 and abs(out[-1].velocity[10]) < 1e-9
    assert out[-1].position[3] < 1.0 - 1e-3 and out[-1].position[10] < 1.0 - 1e-3
    np.testing.assert_allclose(out[-1].position[[0, 5, 13]], 1.0, atol=1e-6)
    check_stream(np.array([o.position for o in out]), lim)


def test_follower_stop_from_full_speed_towards_a_limit_stays_inside(robot):
    lim = arm_limits(robot)
    f = JerkLimitedFollower(lim, DT)
    f.reset(lim.lower + 0.1)
    out = []
    for k in range(400):
        out.append(f.step(lim.upper if k < 150 else None).position)
    check_stream(np.array(out), lim)
    assert f.at_rest()


def test_follower_rejects_bad_limits_and_needs_a_reset(robot):
    lim = arm_limits(robot)
    bad = JointLimits(lim.lower, lim.upper, lim.velocity * 0, lim.acceleration, lim.jerk)
    with pytest.raises(ConfigurationError, match="velocity"):
        JerkLimitedFollower(bad, DT)
    with pytest.raises(ConfigurationError, match="cycle time"):
        JerkLimitedFollower(lim, 0.0)
    with pytest.raises(RuntimeError):
        JerkLimitedFollower(lim, DT).step(np.zeros(14))


# ---------------------------------------------------------------------------------------------- controller
def make_controller(robot: RobotModel) -> tuple[ArmTeleop, dict, dict]:
    """A controller calibrated with an identity mapping (chest frame = torso frame).

    Returns it with the robot's home hand poses and upper-arm points (torso frame),
    which are then also operator poses.
    """
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), arm_limits(robot))
    hands, elbows = ctl.robot_home_points()
    ctl.calibration = Calibration(is_default=False)
    return ctl, hands, elbows


def test_engage_is_refused_until_calibrated(robot):
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), arm_limits(robot))
    ok, message = ctl.engage()
    assert not ok and "calibrate" in message
    assert not ctl.clutch.engaged


def test_follows_the_operator_and_brakes_when_the_target_goes_stale(robot):
    ctl, hands, elbows = make_controller(robot)
    assert ctl.engage()[0]
    offset = np.array([0.05, -0.03, 0.04])
    positions = []
    for k in range(400):
        now = k * DT
        if k < 200:
            for s in SIDES:
                T = hands[s].copy()
                T[:3, 3] += offset * min(1.0, now / 0.5)
                ctl.set_operator(s, T, elbows[s], now)
        positions.append(ctl.step(now).state.position)
    # followed: at k = 199 the hands were near the moved target
    # stale after 0.1 s without samples: brakes to rest and stays there
    assert all(ctl.sides[s].stale for s in SIDES)
    assert ctl.follower.at_rest()
    for s in SIDES:
        assert ctl.sides[s].stale_events == 1
        err = np.linalg.norm(ctl.commanded_hand_pose(s)[:3, 3] - (hands[s][:3, 3] + offset))
        assert err < 0.01
    np.testing.assert_allclose(positions[-1], positions[-50], atol=1e-12)
    check_stream(np.array(positions), ctl.follower.limits)


def test_engaging_after_a_large_operator_offset_does_not_jump(robot):
    ctl, hands, elbows = make_controller(robot)
    far = {s: hands[s].copy() for s in SIDES}
    quarter_turn_z = make_transform(rotation=np.array([[0, -1, 0], [1, 0, 0], [0, 0, 1.0]]))[:3, :3]
    for s in SIDES:
        far[s][:3, 3] += [0.4, 0.3, 0.3]  # operator 0.58 m away from the robot's pose
        far[s][:3, :3] = far[s][:3, :3] @ quarter_turn_z
    start = ctl.follower.state.position.copy()
    positions = []
    for k in range(100):
        now = k * DT
        for s in SIDES:
            ctl.set_operator(s, far[s], elbows[s] + [0.4, 0.3, 0.3], now)
        if k == 10:
            assert ctl.engage()[0]
        positions.append(ctl.step(now).state.position)
    positions = np.array(positions)
    # the operator held still after engaging: the robot did not move at all
    assert np.abs(positions - start).max() < 1e-4
    for s in SIDES:
        assert ctl.clutch.offset(s) is not None
    # and relative motion after engaging is followed 1:1 (identity calibration)
    for k in range(100, 400):
        now = k * DT
        for s in SIDES:
            T = far[s].copy()
            T[:3, 3] += [0.0, 0.0, 0.05]
            ctl.set_operator(s, T, elbows[s], now)
        ctl.step(now)
    for s in SIDES:
        moved = ctl.commanded_hand_pose(s)[:3, 3] - hands[s][:3, 3]
        np.testing.assert_allclose(moved, [0.0, 0.0, 0.05], atol=2e-3)


def test_disengage_brakes_smoothly_to_rest(robot):
    ctl, hands, elbows = make_controller(robot)
    ctl.engage()
    positions = []
    for k in range(300):
        now = k * DT
        for s in SIDES:
            T = hands[s].copy()
            T[:3, 3] += [0.0, 0.15 * np.sin(4 * now), 0.0]
            ctl.set_operator(s, T, elbows[s], now)
        if k == 100:
            assert np.abs(ctl.follower.state.velocity).max() > 0.05  # moving when disengaged
            ctl.disengage()
        positions.append(ctl.step(now).state.position)
    assert ctl.follower.at_rest()
    check_stream(np.array(positions), ctl.follower.limits)


def test_rejected_inputs_are_counted_and_the_last_good_target_kept(robot):
    ctl, hands, elbows = make_controller(robot)
    ctl.engage()
    assert ctl.set_operator("left", hands["left"], elbows["left"], 0.0)
    bad = hands["left"].copy()
    bad[0, 3] = np.nan
    assert not ctl.set_operator("left", bad, elbows["left"], 0.001)
    skew = hands["left"].copy()
    skew[:3, :3] *= 2.0
    assert not ctl.set_operator("left", skew, elbows["left"], 0.002)
    assert not ctl.set_operator("left", hands["left"], elbows["left"], float("inf"))
    assert ctl.sides["left"].rejected == 3
    assert ctl.operator("left").stamp == 0.0
    # a NaN elbow hint is dropped but the wrist pose is used
    assert ctl.set_operator("right", hands["right"], np.array([np.nan, 0, 0]), 0.0)
    assert ctl.operator("right").elbow is None


def test_unreachable_target_is_flagged_and_the_nearest_solution_used(robot):
    ctl, hands, elbows = make_controller(robot)
    ctl.engage()
    for k in range(300):
        now = k * DT
        T = hands["left"].copy()
        if k >= 5:
            T[:3, 3] += [1.5, 1.5, 0.0]  # far out of reach
        ctl.set_operator("left", T, elbows["left"], now)
        ctl.set_operator("right", hands["right"], elbows["right"], now)
        command = ctl.step(now)
    assert ctl.sides["left"].unreachable and ctl.sides["left"].unreachable_count > 0
    assert not ctl.sides["right"].unreachable
    assert ctl.follower.limits.within(command.state.position)
    reached = ctl.commanded_hand_pose("left")[:3, 3] - hands["left"][:3, 3]
    assert reached @ np.array([1.0, 1.0, 0.0]) / np.sqrt(2) > 0.2  # moved a long way towards it


def test_engaging_again_while_engaged_does_not_re_anchor(robot):
    """A pedal that keeps publishing "engaged" must not eat the operator's motion."""
    ctl, hands, elbows = make_controller(robot)
    ctl.engage()
    for k in range(400):
        now = k * DT
        for s in SIDES:
            T = hands[s].copy()
            T[:3, 3] += [0.0, 0.0, 0.1 * min(1.0, now / 1.0)]
            ctl.set_operator(s, T, elbows[s], now)
        if k % 4 == 0:
            ctl.engage()
        ctl.step(now)
    assert ctl.clutch.engagements == 1
    for s in SIDES:
        moved = ctl.commanded_hand_pose(s)[:3, 3] - hands[s][:3, 3]
        np.testing.assert_allclose(moved, [0.0, 0.0, 0.1], atol=2e-3)


def test_resuming_after_a_dropout_re_anchors_that_side_only(robot):
    ctl, hands, elbows = make_controller(robot)
    ctl.engage()
    positions = []
    for k in range(500):
        now = k * DT
        left = hands["left"].copy()
        if k >= 100:
            left[:3, 3] += [0.0, 0.25, 0.0]  # moved 25 cm while its wrist tracker was lost
        if not 50 <= k < 250:
            ctl.set_operator("left", left, elbows["left"] + left[:3, 3] - hands["left"][:3, 3], now)
        ctl.set_operator("right", hands["right"], elbows["right"], now)
        positions.append(ctl.step(now).state.position.copy())
    positions = np.array(positions)
    assert ctl.sides["left"].stale_events == 1 and not ctl.sides["left"].stale
    # the left arm stopped where it was and stayed there after tracking resumed
    assert np.abs(positions[-1] - positions[0]).max() < 1e-3
    assert np.abs(np.diff(positions[250:, :7], axis=0)).max() < 1e-4
    # and follows relative motion again from there
    for k in range(500, 800):
        left = hands["left"].copy()
        left[:3, 3] += [0.0, 0.25, 0.05]
        ctl.set_operator("left", left, elbows["left"] + left[:3, 3] - hands["left"][:3, 3], k * DT)
        ctl.set_operator("right", hands["right"], elbows["right"], k * DT)
        ctl.step(k * DT)
    moved = ctl.commanded_hand_pose("left")[:3, 3] - hands["left"][:3, 3]
    np.testing.assert_allclose(moved, [0.0, 0.0, 0.05], atol=2e-3)
    check_stream(positions, ctl.follower.limits)


def test_reset_while_engaged_continues_from_the_new_position(robot):
    ctl, hands, elbows = make_controller(robot)
    ctl.engage()
    for k in range(20):
        for s in SIDES:
            ctl.set_operator(s, hands[s], elbows[s], k * DT)
        ctl.step(k * DT)
    moved = np.array(DEFAULT_HOME) + np.array([0.3, -0.2, 0.1, 0.2, 0.1, 0.1, 0.1] * 2)
    ctl.reset(moved)
    out = []
    for k in range(20, 200):
        for s in SIDES:
            ctl.set_operator(s, hands[s], None, k * DT)  # operator holds still (no elbow hint)
        out.append(ctl.step(k * DT).state.position)
    assert np.abs(np.array(out) - moved).max() < 1e-3  # no drive back to the old target


def test_poses_stamped_in_the_future_are_not_fresh(robot):
    ctl, hands, elbows = make_controller(robot)
    ctl.engage()
    for k in range(50):
        for s in SIDES:
            ctl.set_operator(s, hands[s], elbows[s], k * DT + 10.0)  # a clock 10 s ahead
        ctl.step(k * DT)
    assert all(ctl.sides[s].stale and not ctl.sides[s].active for s in SIDES)


# ---------------------------------------------------------------------------------------------- property
EVENTS = st.one_of(
    st.tuples(st.just("hold"), st.integers(1, 30)),  # no new sample for n cycles (> 20 = stale)
    st.tuples(st.just("move"), st.lists(st.floats(-0.6, 0.6), min_size=3, max_size=3)),  # offset target
    st.tuples(st.just("rotate"), st.lists(st.floats(-3.0, 3.0), min_size=3, max_size=3)),  # rotation vector
    st.tuples(st.just("far"), st.lists(st.floats(-3.0, 3.0), min_size=3, max_size=3)),  # likely unreachable
    st.tuples(st.just("nan"), st.integers(0, 15)),
    st.tuples(st.just("clutch"), st.booleans()),
    st.tuples(st.just("drop"), st.tuples(st.sampled_from(SIDES), st.integers(1, 40))),  # one side silent
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(EVENTS, min_size=5, max_size=25),
    side_mask=st.sampled_from(["both", "left", "right"]),
    start=st.lists(st.floats(0.0, 1.0), min_size=14, max_size=14),
)
def test_command_stream_respects_every_limit_for_arbitrary_inputs(robot, events, side_mask, start):
    from scipy.spatial.transform import Rotation

    ctl, hands, elbows = make_controller(robot)
    lim = ctl.follower.limits
    ctl.reset(lim.lower + np.asarray(start) * (lim.upper - lim.lower))  # anywhere in the limits
    ctl.engage()
    sides = SIDES if side_mask == "both" else (side_mask,)
    targets = {s: hands[s].copy() for s in SIDES}
    positions = [ctl.follower.state.position.copy()]
    k = 0

    def cycle(send: bool, poses: dict, skip: str | None = None) -> None:
        nonlocal k
        now = k * DT
        if send:
            for s in sides:
                if s != skip:
                    ctl.set_operator(s, poses[s], elbows[s], now)
        positions.append(ctl.step(now).state.position.copy())
        k += 1

    for kind, arg in events:
        if kind == "hold":
            for _ in range(arg):
                cycle(False, targets)
            continue
        if kind == "move":
            for s in sides:
                targets[s] = hands[s].copy()
                targets[s][:3, 3] += arg
        elif kind == "rotate":
            for s in sides:
                targets[s][:3, :3] = hands[s][:3, :3] @ Rotation.from_rotvec(arg).as_matrix()
        elif kind == "far":
            for s in sides:
                targets[s][:3, 3] = hands[s][:3, 3] + np.asarray(arg)
        elif kind == "nan":
            bad = {s: targets[s].copy() for s in SIDES}
            for s in sides:
                bad[s].flat[arg] = np.nan
            cycle(True, bad)
            continue
        elif kind == "clutch":
            ctl.engage() if arg else ctl.disengage()
        elif kind == "drop":
            silent, n = arg
            for _ in range(n):
                cycle(True, targets, skip=silent)
            continue
        for _ in range(8):  # a new operator sample every cycle for a while (tracker rate ~ command rate)
            cycle(True, targets)
    for _ in range(200):  # finally silence: stale after 0.1 s, then braking to rest
        cycle(False, targets)
    check_stream(np.array(positions), ctl.follower.limits)
    assert ctl.follower.at_rest(1e-3)
