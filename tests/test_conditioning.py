"""Conditioning: projection of the robot's keypoints, depth encoding, skeleton drawing, style validation."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import cv2
import numpy as np
import pytest

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.camera import CameraIntrinsics, default_intrinsics
from rynn_teleop.core.camera_view import CameraView
from rynn_teleop.core.hand_skeleton import robot_keypoint_frames
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.errors import ConfigurationError, ParameterError
from rynn_teleop.world_model.conditioning import (
    HAND_BONES,
    Conditioner,
    SkeletonStyle,
    arm_chain_frames,
    draw_skeleton,
)

CAMERA = "camera_color_optical_frame"


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def home_with_curled_hands(robot: RobotModel) -> np.ndarray:
    """Arms at DEFAULT_HOME with the shoulders raised 0.3 rad (hands and wrists in the head camera's view),
    fingers at 60 % of their range [rad]."""
    q = robot.neutral()
    q[:14] = DEFAULT_HOME
    q[0] -= 0.3  # left_arm_joint1
    q[7] += 0.3  # right_arm_joint1 (mirrored)
    lim = robot.limits
    q[14:] = lim.lower[14:] + 0.6 * (lim.upper[14:] - lim.lower[14:])
    return q


def _rpy(r: float, p: float, y: float) -> np.ndarray:
    cr, sr, cp, sp, cy, sy = math.cos(r), math.sin(r), math.cos(p), math.sin(p), math.cos(y), math.sin(y)
    rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
    ry = np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
    rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
    return rz @ ry @ rx


def camera_pose_from_urdf(urdf: str, frame: str = CAMERA) -> np.ndarray:
    """Pose of ``frame`` in base_link, composed from the URDF's fixed joints by hand (no Pinocchio)."""
    joints = {j.find("child").get("link"): j for j in ET.fromstring(urdf).iter("joint")}
    chain = []
    link = frame
    while link in joints:
        joint = joints[link]
        assert joint.get("type") == "fixed", f"{joint.get('name')} on the camera chain is not fixed"
        chain.append(joint)
        link = joint.find("parent").get("link")
    assert link == "base_link"
    T = np.eye(4)
    for joint in reversed(chain):
        origin = joint.find("origin")
        step = np.eye(4)
        step[:3, :3] = _rpy(*map(float, origin.get("rpy", "0 0 0").split()))
        step[:3, 3] = [float(v) for v in origin.get("xyz", "0 0 0").split()]
        T = T @ step
    return T


def pinhole(points_base: np.ndarray, T: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """K @ (R^T (p - t)) / z: (N, 2) pixels and (N,) depths."""
    cam = (points_base - T[:3, 3]) @ T[:3, :3]
    h = cam @ K.T
    return h[:, :2] / h[:, 2:3], cam[:, 2]


# ------------------------------------------------------------------------------------ projection
@pytest.mark.parametrize(
    "intrinsics",
    [default_intrinsics(640, 480), CameraIntrinsics(832, 480, 540.0, 560.0, 400.3, 251.7)],
    ids=["d435_640x480", "off_centre_832x480"],
)
def test_keypoints_land_where_an_independent_pinhole_says(robot, intrinsics):
    q = home_with_curled_hands(robot)
    cond = Conditioner(robot, intrinsics)
    T = camera_pose_from_urdf(robot.urdf)
    np.testing.assert_allclose(cond.view.T_base_camera, T, atol=1e-9)

    kp = cond.keypoints(q)
    for side in ("left", "right"):
        frames = robot_keypoint_frames(side)
        np.testing.assert_allclose(kp.hand(side), robot.forward_kinematics(q, frames)[:, :3, 3], atol=1e-12)
        np.testing.assert_allclose(kp.arm(side), robot.forward_kinematics(q, arm_chain_frames(side))[:, :3, 3],
                                   atol=1e-12)
        np.testing.assert_allclose(kp.arm(side)[-1], kp.hand(side)[0])  # the arm chain ends at the wrist

    points = np.concatenate([kp.left_hand, kp.right_hand])
    expected, depth = pinhole(points, T, intrinsics.K())
    proj = cond.view.project(points)
    in_view = (depth > 0) & (expected[:, 0] >= 0) & (expected[:, 0] <= intrinsics.width - 1) & (
        expected[:, 1] >= 0) & (expected[:, 1] <= intrinsics.height - 1)
    assert in_view.sum() >= 30, "the test configuration should show most hand keypoints"
    assert np.abs(proj.uv[in_view] - expected[in_view]).max() <= 0.5
    np.testing.assert_allclose(proj.depth, depth, atol=1e-9)

    image = cond.condition_image(q)  # every keypoint in view is drawn (a joint disc covers it)
    u, v = np.round(expected[in_view]).astype(int).T
    assert np.all(image[v, u].max(axis=1) > 0)


def test_points_behind_the_near_plane_have_no_pixel():
    view = CameraView(default_intrinsics(640, 480), np.eye(4), near=0.05)
    proj = view.project_camera(np.array([[0.0, 0.0, 1.0], [0.1, 0.0, 0.05], [0.0, 0.0, -1.0], [np.nan, 0.0, 1.0]]))
    np.testing.assert_allclose(proj.uv[0], [320.0, 240.0])
    assert proj.in_front.tolist() == [True, False, False, False]
    assert np.isnan(proj.uv[1:]).all()


def test_distortion_matches_opencv():
    coeffs = (0.08, -0.21, 0.001, -0.0015, 0.09)
    intr = default_intrinsics(640, 480)._replace(coeffs=coeffs)
    view = CameraView(intr, np.eye(4))
    rng = np.random.default_rng(0)
    pts = np.c_[rng.uniform(-0.3, 0.3, (50, 2)), rng.uniform(0.4, 1.5, 50)]
    expected, _ = cv2.projectPoints(pts, np.zeros(3), np.zeros(3), intr.K(), np.array(coeffs))
    np.testing.assert_allclose(view.project_camera(pts).uv, expected.reshape(-1, 2), atol=1e-6)
    with pytest.raises(ConfigurationError, match="equidistant"):
        CameraView(intr._replace(distortion_model="equidistant", coeffs=(0.1, 0.0, 0.0, 0.0)), np.eye(4))


def test_the_camera_must_be_fixed_to_the_torso(robot):
    with pytest.raises(ConfigurationError, match="fixed"):
        CameraView.from_robot(robot, default_intrinsics(640, 480), "left_palm_link")


# ------------------------------------------------------------------------------------ depth encoding
def _luma(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(rgb, dtype=float) @ np.array([0.299, 0.587, 0.114])


def test_depth_encoding_is_monotonic():
    style = SkeletonStyle()
    z = np.linspace(style.near, style.far, 12)
    r = style.radii(z)
    assert np.all(np.diff(r) <= 0) and r[0] > r[-1]
    assert style.radii(np.array([style.reference_depth]))[0] == pytest.approx(style.radius)
    unclipped = (r > style.radius_min) & (r < style.radius_max)
    assert np.all(np.diff(r[unclipped]) < 0)
    assert style.radii(np.array([1e-3, 100.0])).tolist() == [style.radius_max, style.radius_min]

    c = style.colors(z).astype(float)
    assert np.all(np.diff(_luma(c)) < 0), "farther must be darker"
    assert np.all(np.diff(c[:, 2] / c.sum(axis=1)) > 0), "farther must be colder (a larger share of blue)"
    np.testing.assert_array_equal(style.colors(np.array([0.01, style.far + 1.0])), style.lut[[255, 0]])

    custom = SkeletonStyle(colormap=[(0, 0, 80), (255, 255, 255)], radius=10.0, reference_depth=0.5)
    assert np.all(np.diff(_luma(custom.colors(z))) < 0)
    assert custom.radii(np.array([1.0]))[0] == pytest.approx(5.0)


def test_a_farther_joint_is_drawn_smaller_and_darker():
    view = CameraView(default_intrinsics(640, 480), np.eye(4))
    style = SkeletonStyle()
    drawn = []
    for z in (0.4, 0.7, 1.0):
        image = draw_skeleton(np.zeros((480, 640, 3), np.uint8), np.array([[0.0, 0.0, z]]), [], style, view)
        drawn.append((int((image.max(axis=2) > 0).sum()), float(_luma(image[240, 320]))))
    areas, brightness = zip(*drawn)
    assert areas[0] > areas[1] > areas[2] > 0
    assert brightness[0] > brightness[1] > brightness[2] > 0


def test_nearer_joints_cover_farther_ones_and_bones_lie_under_joints():
    view = CameraView(default_intrinsics(640, 480), np.eye(4))
    style = SkeletonStyle(colormap=[(0, 0, 255), (255, 0, 0)], antialias=False)  # far blue, near red
    near, far = np.array([0.0, 0.0, 0.3]), np.array([0.0, 0.0, 1.1])  # the same pixel, different depths
    for points in (np.stack([near, far]), np.stack([far, near])):
        image = draw_skeleton(np.zeros((480, 640, 3), np.uint8), points, [], style, view)
        r, _, b = image[240, 320].astype(int)
        assert r > 200 and b < 50, "the nearer (red) joint must be on top"

    # a near bone passing over a far joint: the joint stays visible (bones first, then joints)
    points = np.array([[-0.05, 0.0, 0.3], [0.05, 0.0, 0.3], [0.0, 0.0, 1.1]])
    image = draw_skeleton(np.zeros((480, 640, 3), np.uint8), points, [(0, 1)], style, view)
    r, _, b = image[240, 320].astype(int)
    assert b > 200 and r < 50


def test_points_behind_the_camera_are_skipped_and_bones_clipped():
    view = CameraView(default_intrinsics(640, 480), np.eye(4), near=0.05)
    style = SkeletonStyle()
    blank = np.zeros((480, 640, 3), np.uint8)
    behind = np.array([[0.0, 0.0, -0.5], [0.01, 0.0, 0.05], [0.02, 0.0, -0.1]])
    assert not draw_skeleton(blank.copy(), behind, [(0, 2)], style, view).any()

    # a bone from in front to behind the camera is drawn up to the near plane only
    points = np.array([[0.0, 0.1, 0.5], [0.0, 0.1, -0.5]])
    image = draw_skeleton(blank.copy(), points, [(0, 1)], style, view)
    rows = np.flatnonzero(image.max(axis=(1, 2)) > 0)
    assert rows.size and rows.min() < 240 + 615 * 0.1 / 0.5 - 5  # starts at the joint...
    assert rows.max() == 479  # ...and runs down out of the image (towards the near plane), no wrap-around
    assert not image[:, :300].any() and not image[:, 340:].any()


def test_skeleton_image_of_the_robot(robot):
    q = home_with_curled_hands(robot)
    cond = Conditioner(robot, default_intrinsics(640, 480))
    image = cond.condition_image(q)
    assert image.shape == (480, 640, 3) and image.dtype == np.uint8
    lit = image.max(axis=2) > 0
    assert 0.005 < lit.mean() < 0.2  # a skeleton on a black background
    np.testing.assert_array_equal(image, cond.condition_image(q))  # deterministic
    assert lit[:, :320].any() and lit[:, 320:].any()  # both hands
    # the arms add their chain to the hands' skeletons
    hands_only = Conditioner(robot, default_intrinsics(640, 480), arms=False).condition_image(q)
    assert (lit & ~(hands_only.max(axis=2) > 0)).any()


def test_operator_skeletons_are_drawn_like_the_robot_hands(robot):
    q = home_with_curled_hands(robot)
    cond = Conditioner(robot, default_intrinsics(640, 480), arms=False)
    kp = cond.keypoints(q)
    skeletons = [cond.view.to_camera(kp.left_hand), cond.view.to_camera(kp.right_hand)]
    np.testing.assert_array_equal(cond.operator_image(skeletons), cond.condition_image(q))

    missing = skeletons[0].copy()
    missing[5:9] = np.nan  # an undetected index finger: its joints and bones are left out
    image = cond.operator_image([missing])
    assert image.any()
    with pytest.raises(ValueError, match="21, 3"):
        cond.operator_image([np.zeros((20, 3))])


def test_draw_skeleton_rejects_bad_bone_indices():
    view = CameraView(default_intrinsics(64, 48), np.eye(4))
    with pytest.raises(ValueError, match="bone indices"):
        draw_skeleton(np.zeros((48, 64, 3), np.uint8), np.zeros((21, 3)), HAND_BONES + 1, SkeletonStyle(), view)


# ------------------------------------------------------------------------------------ style validation
@pytest.mark.parametrize(
    ("key", "kwargs"),
    [
        ("colormap", {"colormap": "no_such_map"}),
        ("colormap", {"colormap": [(0, 0, 0)]}),
        ("colormap", {"colormap": [(0, 0, 300), (0, 0, 0)]}),
        ("colormap", {"colormap": 3}),
        ("near", {"near": 0.0}),
        ("near", {"near": float("nan")}),
        ("far", {"near": 1.0, "far": 1.0}),
        ("radius", {"radius": -1.0}),
        ("reference_depth", {"reference_depth": 0.0}),
        ("radius_min", {"radius_min": 0.0}),
        ("radius_max", {"radius_min": 5.0, "radius_max": 4.0}),
        ("bone_thickness", {"bone_thickness": 0}),
        ("bone_thickness", {"bone_thickness": 1.5}),
        ("antialias", {"antialias": "yes"}),
    ],
)
def test_style_errors_name_the_bad_field(key, kwargs):
    with pytest.raises(ParameterError, match=key) as err:
        SkeletonStyle(**kwargs)
    assert err.value.key == key


def test_style_accepts_opencv_names_in_any_case():
    assert SkeletonStyle(colormap="COLORMAP_Turbo").colormap == "turbo"
    np.testing.assert_array_equal(SkeletonStyle(colormap="INFERNO").lut, SkeletonStyle(colormap="inferno").lut)
