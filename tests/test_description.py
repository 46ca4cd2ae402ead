"""The generated URDF: structure, names, limits against the hardware facts."""

from __future__ import annotations

import math
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pinocchio as pin
import pytest

from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, RobotModel
from rynn_teleop.core.urdf_builder import DEFAULT_URDF_NAME, build_urdf, matrix_to_rpy, rpy_to_matrix
from rynn_teleop.core.urdf_compare import urdf_differences
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.paths import urdf_file

# hardware-facts.md, Marvin M6 table: limits [deg], vmax [deg/s], amax [deg/s^2]
ARM_LIMITS_DEG = [(-170, 170), (-120, 120), (-170, 170), (-145, 60), (-170, 170), (-60, 60), (-90, 90)]
ARM_AMAX_DEG = [450, 450, 900, 900, 900, 900, 900]
# hardware-facts.md, Wuji position limits [rad] (rows thumb..pinky, columns joint1..4)
HAND_LIMITS = [
    [(0.0475, 1.6033), (-0.1387, 0.9324), (-0.4642, 1.5623), (-0.4699, 1.5568)],
    [(-0.1585, 1.5604), (-0.37, 0.37), (-0.4777, 1.5485), (-0.4683, 1.5753)],
    [(-0.1644, 1.5516), (-0.37, 0.37), (-0.4739, 1.5512), (-0.4684, 1.5745)],
    [(-0.1554, 1.5585), (-0.37, 0.37), (-0.4765, 1.5487), (-0.4777, 1.5634)],
    [(-0.1626, 1.5585), (-0.37, 0.37), (-0.4768, 1.5490), (-0.4683, 1.5735)],
]


@pytest.fixture(scope="module")
def urdf() -> str:
    return build_urdf()


def test_exactly_54_actuated_joints_in_canonical_order(urdf):
    model = pin.buildModelFromXML(urdf)
    assert model.nq == model.nv == 54
    actuated = [j.get("name") for j in ET.fromstring(urdf).iter("joint") if j.get("type") != "fixed"]
    assert len(actuated) == 54 and set(actuated) == set(CANONICAL_JOINT_NAMES)
    assert CANONICAL_JOINT_NAMES[:7] == tuple(f"left_arm_joint{i}" for i in range(1, 8))
    assert CANONICAL_JOINT_NAMES[7:14] == tuple(f"right_arm_joint{i}" for i in range(1, 8))
    assert CANONICAL_JOINT_NAMES[14] == "left_finger1_joint1" and CANONICAL_JOINT_NAMES[17] == "left_finger1_joint4"
    assert CANONICAL_JOINT_NAMES[18] == "left_finger2_joint1" and CANONICAL_JOINT_NAMES[33] == "left_finger5_joint4"
    assert CANONICAL_JOINT_NAMES[34] == "right_finger1_joint1" and CANONICAL_JOINT_NAMES[53] == "right_finger5_joint4"


def test_required_links_exist(urdf):
    links = {link.get("name") for link in ET.fromstring(urdf).iter("link")}
    for side in ("left", "right"):
        assert {f"{side}_arm_base_link", f"{side}_arm_flange", f"{side}_palm_link"} <= links
        assert {f"{side}_finger{f}_tip_link" for f in range(1, 6)} <= links
    assert {"base_link", "torso_link", "head_link", "camera_link", "camera_color_optical_frame"} <= links


def test_limits_match_the_hardware_facts():
    lim = RobotModel.default().limits
    for k in range(2):  # left, right
        arm = slice(7 * k, 7 * k + 7)
        np.testing.assert_allclose(np.degrees(lim.lower[arm]), [lo for lo, _ in ARM_LIMITS_DEG], atol=1e-9)
        np.testing.assert_allclose(np.degrees(lim.upper[arm]), [hi for _, hi in ARM_LIMITS_DEG], atol=1e-9)
        np.testing.assert_allclose(np.degrees(lim.velocity[arm]), 180.0, atol=1e-9)
        np.testing.assert_allclose(np.degrees(lim.acceleration[arm]), ARM_AMAX_DEG, atol=1e-9)
        hand = slice(14 + 20 * k, 34 + 20 * k)
        flat = np.array(HAND_LIMITS).reshape(20, 2)
        np.testing.assert_allclose(lim.lower[hand], flat[:, 0], atol=1e-9)
        np.testing.assert_allclose(lim.upper[hand], flat[:, 1], atol=1e-9)
    assert np.all(lim.jerk > 0) and np.all(lim.acceleration > 0)
    # Wuji velocity limits: joint3 12.86, joint4 13.58 rad/s, thumb joint2 11.1
    assert lim.velocity[14 + 2] == pytest.approx(12.863) and lim.velocity[14 + 3] == pytest.approx(13.578)
    assert lim.velocity[14 + 1] == pytest.approx(11.1)


@pytest.mark.parametrize("frame", ["camera_color_optical_frame", "camera_depth_optical_frame"])
def test_camera_optical_frame_convention(frame):
    robot = RobotModel.default()
    t = robot.frame_pose(robot.neutral(), frame, base="camera_link")
    # optical z (forward) = body x, optical x (right) = body -y, optical y (down) = body -z
    np.testing.assert_allclose(t[:3, 2], [1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(t[:3, 0], [0, -1, 0], atol=1e-12)
    np.testing.assert_allclose(t[:3, 1], [0, 0, -1], atol=1e-12)


def test_committed_urdf_is_the_generator_output(urdf):
    committed = urdf_file(DEFAULT_URDF_NAME).read_text(encoding="utf-8")
    assert urdf_differences(committed, urdf) == [], \
        "urdf/rynn_m6_wuji.urdf is stale: run `rynn-teleop urdf -o urdf/rynn_m6_wuji.urdf`"


def test_urdf_comparison_tolerates_the_last_digit_only():
    a = '<robot name="r"><joint name="j"><origin xyz="0.1 0 0.30000000000000004" rpy="0 0 1"/></joint></robot>'
    assert urdf_differences(a, a.replace("0.30000000000000004", "0.3")) == []  # 4e-17 apart
    assert urdf_differences(a, a.replace("0.30000000000000004", "0.3000001"))  # a real change
    assert urdf_differences(a, a.replace('rpy="0 0 1"', 'rpy="0 0"'))  # a missing number
    assert urdf_differences(a, a.replace('name="j"', 'name="k"'))  # a name
    assert urdf_differences(a, a.replace("<joint", "<link").replace("</joint>", "</link>"))  # an element


def test_cli_compare_exits_non_zero_on_a_difference(tmp_path, urdf):
    same, other = tmp_path / "same.urdf", tmp_path / "other.urdf"
    same.write_text(urdf, encoding="utf-8")
    other.write_text(urdf.replace('name="base_link"', 'name="base"', 1), encoding="utf-8")
    cmd = [sys.executable, "-m", "rynn_teleop.cli", "urdf", "--compare"]
    assert subprocess.run(cmd + [str(same)], capture_output=True, timeout=120).returncode == 0
    bad = subprocess.run(cmd + [str(other)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "base" in bad.stderr


def test_cli_prints_the_urdf(urdf):
    out = subprocess.run(
        [sys.executable, "-m", "rynn_teleop.cli", "urdf"], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout == urdf


def test_overlay_moves_the_camera_and_rejects_unknown_keys(tmp_path):
    overlay = tmp_path / "lab.yaml"
    overlay.write_text("camera:\n  xyz: [0.1, 0.02, 0.07]\n")
    robot = RobotModel.from_description(overlay)
    t = robot.frame_pose(robot.neutral(), "camera_link", base="head_link")
    np.testing.assert_allclose(t[:3, 3], [0.1, 0.02, 0.07], atol=1e-12)
    (tmp_path / "typo.yaml").write_text("camra:\n  xyz: [0, 0, 0]\n")
    with pytest.raises(ConfigurationError, match="camra"):
        build_urdf(tmp_path / "typo.yaml")


def test_rpy_round_trip():
    rng = np.random.default_rng(3)
    for _ in range(200):
        rpy = rng.uniform([-math.pi, -math.pi / 2 + 1e-3, -math.pi], [math.pi, math.pi / 2 - 1e-3, math.pi])
        r = rpy_to_matrix(rpy)
        np.testing.assert_allclose(rpy_to_matrix(matrix_to_rpy(r)), r, atol=1e-12)
        np.testing.assert_allclose(r, pin.rpy.rpyToMatrix(*rpy), atol=1e-12)
    gimbal = rpy_to_matrix((0.3, math.pi / 2, -0.2))
    np.testing.assert_allclose(rpy_to_matrix(matrix_to_rpy(gimbal)), gimbal, atol=1e-12)
