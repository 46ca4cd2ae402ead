"""Arm IK (core.arm_ik): accuracy from warm starts, limits, elbow swivel, unreachable targets."""

from __future__ import annotations

import numpy as np
import pytest

from rynn_teleop.core.arm_ik import ArmIK, IKSettings
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.core.transforms import make_transform, pose_error
from rynn_teleop.errors import ConfigurationError, FrameNotFoundError


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


@pytest.fixture(scope="module", params=["left", "right"])
def ik(request, robot) -> ArmIK:
    return ArmIK(robot, request.param)


def test_forward_matches_the_whole_robot_model(robot, ik):
    rng = np.random.default_rng(3)
    for _ in range(5):
        q7 = rng.uniform(ik.lower, ik.upper)
        q = robot.neutral()
        q[robot.indices(ik.joint_names)] = q7
        np.testing.assert_allclose(ik.forward(q7), robot.frame_pose(q, ik.tip_frame, base="torso_link"), atol=1e-12)
        np.testing.assert_allclose(
            ik.elbow_position(q7), robot.frame_pose(q, ik.elbow_frame, base="torso_link")[:3, 3], atol=1e-12
        )


def test_reaches_random_reachable_targets_from_warm_starts(ik):
    """Targets from in-limit configurations, warm start 0.05 rad (std) away: <= 1 mm and 0.5 deg."""
    rng = np.random.default_rng(7)
    zone = ik.settings.limit_zone
    worst_pos = worst_rot = 0.0
    for _ in range(300):
        q_true = rng.uniform(ik.lower + zone, ik.upper - zone)
        target = ik.forward(q_true)
        q0 = np.clip(q_true + rng.normal(0.0, 0.05, 7), ik.lower, ik.upper)
        result = ik.solve(target, q0)
        err = pose_error(ik.forward(result.q), target)
        assert err.position == pytest.approx(result.position_error, abs=1e-9)
        worst_pos = max(worst_pos, err.position)
        worst_rot = max(worst_rot, err.orientation)
    assert worst_pos <= 1e-3
    assert np.degrees(worst_rot) <= 0.5


def test_solutions_stay_inside_the_limits(ik):
    rng = np.random.default_rng(11)
    for _ in range(50):
        target = make_transform(rng.uniform(-1.5, 1.5, 3), np.linalg.qr(rng.normal(size=(3, 3)))[0])
        if np.linalg.det(target[:3, :3]) < 0:
            target[:3, 0] *= -1
        result = ik.solve(target, rng.uniform(ik.lower, ik.upper))
        assert np.all(result.q >= ik.lower - 1e-12) and np.all(result.q <= ik.upper + 1e-12)
        assert np.all(np.isfinite(result.q))


def test_unreachable_target_gives_the_nearest_reach_and_no_convergence(ik):
    shoulder = np.array([0.0, 0.294 if ik.side == "left" else -0.294, 0.0])
    direction = np.array([1.0, 1.0 if ik.side == "left" else -1.0, -0.5])
    direction /= np.linalg.norm(direction)
    q0 = np.zeros(7)
    home = ik.forward(q0)
    target = make_transform(shoulder + 2.0 * direction, home[:3, :3])
    result = ik.solve(target, q0)
    assert not result.converged
    reached = ik.forward(result.q)[:3, 3] - shoulder
    # stretched out towards the target (the orientation task pulls a little): within 20 deg of its
    # direction and longer than most of the reach, so the error is close to the geometric minimum
    cos = reached @ direction / np.linalg.norm(reached)
    assert cos > np.cos(np.radians(20))
    assert np.linalg.norm(reached) > 0.6
    assert result.position_error < 2.0 - 0.6
    assert result.position_error == pytest.approx(np.linalg.norm(ik.forward(result.q)[:3, 3] - target[:3, 3]))


def test_elbow_hint_chooses_the_swivel_without_moving_the_wrist(ik):
    q = np.array([0.4, 0.9, 0.3, -1.6, 0.2, 0.3, 0.1])
    if ik.side == "right":
        q = q * np.array([-1, 1, -1, 1, -1, 1, -1])
    target = ik.forward(q)
    elbow0 = ik.elbow_position(q)
    shoulder = np.array([0.0, 0.294 if ik.side == "left" else -0.294, 0.0])
    wrist = target[:3, 3]
    axis = (wrist - shoulder) / np.linalg.norm(wrist - shoulder)
    finals = []
    for sign in (+1.0, -1.0):
        # a hint rotated +-60 deg about the shoulder-wrist axis from the current elbow
        r = elbow0 - shoulder
        r_par = axis * (axis @ r)
        r_perp = r - r_par
        ang = np.radians(60.0) * sign
        rot = r_perp * np.cos(ang) + np.cross(axis, r_perp) * np.sin(ang)
        hint = shoulder + r_par + rot
        qk = q.copy()
        for _ in range(300):  # one capped null-space step per call, as per operator sample (2.5 s at 120 Hz)
            result = ik.solve(target, qk, hint)
            qk = result.q
        err = pose_error(ik.forward(qk), target)
        assert err.position <= ik.settings.position_tolerance * 1.01
        assert err.orientation <= ik.settings.orientation_tolerance * 1.01
        elbow = ik.elbow_position(qk)
        assert np.linalg.norm(elbow - hint) < 0.5 * np.linalg.norm(elbow0 - hint)
        finals.append(elbow)
    assert np.linalg.norm(finals[0] - finals[1]) > 0.1


def test_joint_limit_avoidance_moves_a_joint_out_of_its_limit_zone(ik):
    s = ik.settings
    q = np.array([0.3, 0.8, 0.0, -1.5, 0.3, 0.2, 0.1])
    q[4] = ik.upper[4] - 0.05  # joint 5 deep in its limit zone
    target = ik.forward(q)
    qk = q.copy()
    for _ in range(100):
        qk = ik.solve(target, qk, ik.elbow_position(q)).q
    assert qk[4] < q[4] - 0.05  # pushed back towards the range
    assert pose_error(ik.forward(qk), target).position <= s.position_tolerance * 1.01


def test_damping_shortens_the_step_at_a_singularity(robot, ik):
    """Stretched arm (elbow joint at 0), target beyond reach along the arm: the undamped
    step is large, the damped one stays small and the error still falls."""
    q = np.array([0.3, 0.8, 0.2, 0.0, 0.1, 0.3, 0.1])
    target = ik.forward(q)
    shoulder = robot.frame_pose(np.zeros(54), f"{ik.side}_arm_link2", base="torso_link")[:3, 3]
    out = target[:3, 3] - shoulder
    target[:3, 3] += 0.002 * out / np.linalg.norm(out)  # 2 mm past full reach
    damped = ArmIK(robot, ik.side, settings=IKSettings(max_iterations=1))
    undamped = ArmIK(robot, ik.side, settings=IKSettings(max_iterations=1, damping=0.0))
    step_damped = np.abs(damped.solve(target, q).q - q).max()
    step_undamped = np.abs(undamped.solve(target, q).q - q).max()
    assert step_undamped > 2 * step_damped
    assert step_damped < 0.05
    result = ik.solve(target, q)
    assert np.all(np.isfinite(result.q))
    assert result.position_error <= 0.002 + 1e-9


def test_bad_configuration_is_refused(robot):
    with pytest.raises(ConfigurationError, match="side"):
        ArmIK(robot, "middle")
    with pytest.raises(FrameNotFoundError):
        ArmIK(robot, "left", tip_frame="no_such_link")
    with pytest.raises(ConfigurationError, match="moves with"):
        ArmIK(robot, "left", base_frame="left_arm_link3")

