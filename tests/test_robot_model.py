"""Forward kinematics against independent references; layout and errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pinocchio as pin
import pytest

from rynn_teleop.core.robot_model import GROUPS, RobotModel, hand_joint_names
from rynn_teleop.errors import FrameNotFoundError, JointNotFoundError

# Marvin M6 modified-DH table, typed from hardware-facts.md (alpha, a [mm], d [mm], theta0), deg.
DH = [
    (0, 0, 174.5, 0),
    (90, 0, 0, 0),
    (-90, 0, 287, 0),
    (90, 18, 0, 180),
    (90, 18, 314, 180),
    (90, 0, 0, 90),
    (90, 0, 0, 90),
]
FLANGE = (90, 0, 95, 90)
VENDOR = Path(__file__).resolve().parents[2] / "shared" / "vendor" / "wuji-hand-description" / "urdf"


def craig(alpha_deg, a_mm, d_mm, theta):
    """Craig's modified DH: RotX(alpha) TransX(a) RotZ(theta) TransZ(d), written out by hand."""
    al = math.radians(alpha_deg)
    a, d = a_mm / 1000, d_mm / 1000
    rx = np.array([[1, 0, 0, 0], [0, math.cos(al), -math.sin(al), 0], [0, math.sin(al), math.cos(al), 0], [0, 0, 0, 1]])
    tx = np.eye(4)
    tx[0, 3] = a
    rz = np.array([[math.cos(theta), -math.sin(theta), 0, 0], [math.sin(theta), math.cos(theta), 0, 0],
                   [0, 0, 1, 0], [0, 0, 0, 1]])
    tz = np.eye(4)
    tz[2, 3] = d
    return rx @ tx @ rz @ tz


def dh_chain(q):
    """Poses of link1..7 and the flange in the arm base frame."""
    t = np.eye(4)
    out = []
    for (alpha, a, d, th0), qi in zip(DH, q):
        t = t @ craig(alpha, a, d, math.radians(th0) + qi)
        out.append(t.copy())
    alpha, a, d, th0 = FLANGE
    out.append(t @ craig(alpha, a, d, math.radians(th0)))
    return out


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def random_q(robot: RobotModel, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(robot.limits.lower, robot.limits.upper)


@pytest.mark.parametrize("side", ["left", "right"])
def test_arm_fk_equals_modified_dh(robot, side):
    rng = np.random.default_rng(7)
    frames = [f"{side}_arm_link{i}" for i in range(1, 8)] + [f"{side}_arm_flange"]
    for _ in range(50):
        q = random_q(robot, rng)
        ours = robot.forward_kinematics(q, frames, base=f"{side}_arm_base_link")
        ref = dh_chain(q[GROUPS.arm(side)])
        for frame, t, r in zip(frames, ours, ref):
            assert np.linalg.norm(t[:3, 3] - r[:3, 3]) <= 1e-6, frame
            np.testing.assert_allclose(t[:3, :3], r[:3, :3], atol=1e-9, err_msg=frame)


def test_arm_fk_is_not_trivially_constant(robot):
    """Guard for the test above: the flange really moves with the joints."""
    q = robot.neutral()
    p0 = robot.frame_pose(q, "left_arm_flange", base="left_arm_base_link")[:3, 3]
    q[GROUPS.left_arm][1] = 0.5
    p1 = robot.frame_pose(q, "left_arm_flange", base="left_arm_base_link")[:3, 3]
    assert np.linalg.norm(p1 - p0) > 0.1


@pytest.mark.parametrize("side", ["left", "right"])
def test_hand_fk_equals_vendor_description(robot, side):
    vendor_file = VENDOR / f"{side}.urdf"
    if not vendor_file.exists():
        pytest.skip(f"vendor hand description not found at {vendor_file} (../shared/vendor is absent)")
    vendor = pin.buildModelFromUrdf(str(vendor_file))
    vdata = vendor.createData()
    names = hand_joint_names(side)
    frames = [f"{side}_finger{f}_link{j}" for f in range(1, 6) for j in range(1, 5)]
    frames += [f"{side}_finger{f}_tip_link" for f in range(1, 6)]
    rng = np.random.default_rng(11)
    for _ in range(50):
        q = random_q(robot, rng)
        ours = robot.forward_kinematics(q, frames, base=f"{side}_palm_link")
        vq = np.zeros(vendor.nq)
        for name, value in zip(names, q[GROUPS.hand(side)]):
            vq[vendor.joints[vendor.getJointId(name)].idx_q] = value
        pin.framesForwardKinematics(vendor, vdata, vq)
        root = vdata.oMf[vendor.getFrameId(f"{side}_palm_link")].inverse()
        for frame, t in zip(frames, ours):
            ref = (root * vdata.oMf[vendor.getFrameId(frame)]).homogeneous
            assert np.linalg.norm(t[:3, 3] - ref[:3, 3]) <= 1e-6, frame
            np.testing.assert_allclose(t[:3, :3], ref[:3, :3], atol=1e-6, err_msg=frame)
    # the vendor's limits too
    for name in names:
        jid = vendor.getJointId(name)
        i = robot.joint_index(name)
        assert robot.limits.lower[i] == pytest.approx(vendor.lowerPositionLimit[vendor.joints[jid].idx_q])
        assert robot.limits.upper[i] == pytest.approx(vendor.upperPositionLimit[vendor.joints[jid].idx_q])


def test_unknown_frame_lists_known_frames(robot):
    with pytest.raises(FrameNotFoundError) as err:
        robot.frame_pose(robot.neutral(), "left_wrist")
    assert err.value.frame == "left_wrist"
    assert "left_palm_link" in err.value.known and "left_palm_link" in str(err.value)
    with pytest.raises(JointNotFoundError, match="left_arm_joint1"):
        robot.joint_index("left_arm_joint8")


def test_joint_layout_and_indices(robot):
    assert robot.indices(["right_finger5_joint4", "left_arm_joint1"]).tolist() == [53, 0]
    with pytest.raises(ValueError, match="54"):
        robot.to_pinocchio(np.zeros(53))
    assert robot.limits.within(robot.neutral())
    assert not robot.limits.within(robot.limits.upper + 0.01)
    sub = robot.limits[GROUPS.right_hand]
    assert sub.lower.shape == (20,) and sub.jerk.shape == (20,)
