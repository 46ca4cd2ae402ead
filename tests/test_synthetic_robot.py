"""The synthetic head camera sees the robot: drawn at the given joints, from the description's head camera,
over the tabletop in colour and depth; the head camera node draws it at the measured /joint_states."""

from __future__ import annotations

import math
import threading

import cv2
import numpy as np
import pytest
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from ros_helpers import wait_for
from sensor_msgs.msg import Image, JointState

from rynn_teleop.core.camera_view import camera_pose
from rynn_teleop.core.robot_geometry import RobotGeometry
from rynn_teleop.core.robot_model import RobotModel, arm_joint_names, hand_joint_names
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.nodes.conversions import image_array
from rynn_teleop.runner import Composition
from rynn_teleop.sources.camera.scene import TABLE_TOP_Z, TabletopScene
from rynn_teleop.sources.camera.synthetic import SyntheticScene, home_position

W, H = 320, 240
CAMERA = "camera_color_optical_frame"


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def teleop_pose(robot: RobotModel) -> np.ndarray:
    """The home pose with the shoulders raised 0.3 rad: wrists and forearms in the head camera's view [rad]."""
    q = home_position(robot)
    q[robot.joint_index("left_arm_joint1")] -= 0.3
    q[robot.joint_index("right_arm_joint1")] += 0.3
    return q


def project(robot: RobotModel, q: np.ndarray, frames: list[str], intrinsics) -> tuple[np.ndarray, np.ndarray]:
    """(N, 2) [px] and (N,) [m] optical z of link origins, by forward kinematics and a plain pinhole."""
    T = robot.frame_pose(q, CAMERA)
    cam = (robot.forward_kinematics(q, frames)[:, :3, 3] - T[:3, 3]) @ T[:3, :3]
    uv = cam @ intrinsics.K().T
    return uv[:, :2] / uv[:, 2:3], cam[:, 2]


def footprint(robot: RobotModel, qs: list[np.ndarray], intrinsics, margin: int = 3) -> np.ndarray:
    """(H, W) bool: the projected bounding boxes of every primitive at each of ``qs``, grown by ``margin`` px
    (independent of the renderer: Pinocchio poses, a plain pinhole, primitives in front of the camera)."""
    geometry = RobotGeometry(robot)
    T = robot.frame_pose(qs[0], CAMERA)
    unit = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)
    mask = np.zeros((intrinsics.height, intrinsics.width), np.uint8)
    for q in qs:
        for prim, pose in zip(geometry.primitives, geometry.poses(q)):
            cam = ((0.5 * unit * prim.size) @ pose[:3, :3].T + pose[:3, 3] - T[:3, 3]) @ T[:3, :3]
            if np.any(cam[:, 2] <= 0.02):
                continue  # at or behind the camera (its own box): never drawn in front of the table here
            uv = (cam @ intrinsics.K().T)[:, :2] / cam[:, 2:3]
            cv2.fillConvexPoly(mask, cv2.convexHull(np.round(uv).astype(np.int32)), 1)
    return cv2.dilate(mask, np.ones((2 * margin + 1, 2 * margin + 1), np.uint8)).astype(bool)


# ------------------------------------------------------------------------------------ the camera pose
def test_the_scene_is_seen_from_the_description_head_camera(robot):
    cam = SyntheticScene(W, H, seed=1)
    T_base_camera = camera_pose(robot)
    np.testing.assert_allclose(cam.scene.T_world_base @ T_base_camera, cam.T_world_camera, atol=1e-12)
    # the camera the scene had before it was taken from the description: 0.70 m above the table top at x = y = 0,
    # looking along +y, pitched 45 deg down (one fact now: urdf/robot.yaml, with the table TABLE_TOP_Z in base_link)
    p = math.radians(45.0)
    R = np.column_stack([[1.0, 0.0, 0.0], [0.0, -math.sin(p), -math.cos(p)], [0.0, math.cos(p), -math.sin(p)]])
    np.testing.assert_allclose(cam.T_world_camera[:3, :3], R, atol=1e-12)
    np.testing.assert_allclose(cam.T_world_camera[:3, 3], [0.0, 0.0, 0.70], atol=1e-12)
    assert T_base_camera[2, 3] - TABLE_TOP_Z == pytest.approx(0.70)


def test_a_description_overlay_moves_the_scene_camera_and_the_robot_camera_together():
    tilted = RobotModel.from_description({"camera": {"xyz": [0.06, 0.0, 0.05], "rpy": [0.0, 0.9, 0.0]}})
    cam = SyntheticScene(W, H, draw_robot=True, robot_model=tilted)
    T_base_camera = camera_pose(tilted)
    np.testing.assert_allclose(cam.painter.view.T_base_camera, T_base_camera)
    np.testing.assert_allclose(cam.scene.T_base_camera, T_base_camera)
    forward = cam.T_world_camera[:3, 2]  # the optical axis in the world: 0.9 rad below the horizontal
    assert math.atan2(-forward[2], forward[1]) == pytest.approx(0.9)
    with pytest.raises(ConfigurationError, match="above the table"):
        TabletopScene(W, H, T_base_camera=np.eye(4))  # a camera at base_link, below the table top


def test_frames_without_the_robot_are_the_tabletop_as_before():
    """Without ``draw_robot`` a frame is the tabletop alone, bit for bit the one the scene drew from its own
    hard-coded camera before (0.70 m up, 45 deg down), joints or not."""
    cam = SyntheticScene(W, H, seed=3)
    assert not cam.draw_robot and cam.painter is None
    legacy = TabletopScene(W, H, seed=3)
    p = math.radians(45.0)
    legacy.T_world_camera = np.eye(4)
    legacy.T_world_camera[:3, :3] = np.column_stack([[1.0, 0.0, 0.0], [0.0, -math.sin(p), -math.cos(p)],
                                                     [0.0, math.cos(p), -math.sin(p)]])
    legacy.T_world_camera[:3, 3] = (0.0, 0.0, 0.70)
    legacy.objects, legacy._cube_yaw, legacy._plank_phase = legacy._layout(np.random.default_rng(3))
    cam.set_joint_positions(np.zeros(54))
    for t in (0.0, 0.7):
        frame, image = cam.render(t), legacy.render(legacy.ball_center(t))
        np.testing.assert_array_equal(frame.color, image.color)
        np.testing.assert_array_equal(frame.depth, image.depth)


# ------------------------------------------------------------------------------------ the robot in the frame
def test_the_robot_is_drawn_where_forward_kinematics_projects_its_wrists(robot):
    plain = SyntheticScene(W, H, moving=False).render(0.0)
    cam = SyntheticScene(W, H, moving=False, draw_robot=True)
    K = cam.camera_intrinsics
    # before any joints: the home pose; its hands stand at the bottom of the image, fingers up
    np.testing.assert_array_equal(cam.joint_positions, home_position(robot))
    home = cam.render(0.0)
    tips = [f"{side}_finger{i}_tip_link" for side in ("left", "right") for i in (2, 3, 4)]
    uv, _ = project(robot, home_position(robot), tips, K)
    for u, v in np.round(uv).astype(int):
        assert 0 <= u < W and 0 <= v < H
        assert np.any(home.color[v, u] != plain.color[v, u]), (u, v)
    # the teleop pose: wrists and forearms in view, drawn in front of the table (colour and depth)
    q = teleop_pose(robot)
    cam.set_joint_positions(q, stamp=12.5)
    assert cam.joint_stamp == 12.5
    frame = cam.render(0.0)
    wrists = [f"{side}_{link}" for side in ("left", "right") for link in ("arm_flange", "palm_link")]
    uv, z = project(robot, q, wrists, K)
    for (u, v), depth in zip(np.round(uv).astype(int), z):
        assert 0 <= u < W and 0 <= v < H
        window = np.s_[v - 2 : v + 3, u - 2 : u + 3]
        assert np.any(frame.color[window] != plain.color[window], axis=2).all(), (u, v)
        drawn = frame.depth[window].astype(float) * frame.depth_scale
        assert np.all(drawn < plain.depth[window] * plain.depth_scale)  # nearer than the table
        assert np.all(np.abs(drawn - depth) < 0.06)  # on the robot's wrist (its links are a few cm thick)


def test_changing_joints_changes_only_pixels_near_the_robot(robot):
    cam = SyntheticScene(W, H, moving=False, draw_robot=True)
    q = teleop_pose(robot)
    cam.set_joint_positions(q)
    before = cam.render(0.0)
    moved = q.copy()
    moved[robot.indices(arm_joint_names("left"))[6]] += 0.6  # the left wrist turns
    moved[robot.indices(hand_joint_names("left"))] = robot.limits.lower[robot.indices(hand_joint_names("left"))]
    cam.set_joint_positions(moved)
    after = cam.render(0.0)
    changed = np.any(before.color != after.color, axis=2) | (before.depth != after.depth)
    assert changed.sum() > 100
    assert not changed[~footprint(robot, [q, moved], cam.camera_intrinsics)].any()
    assert not changed[:, W // 2 :].any()  # the right arm did not move


def test_the_robot_depth_is_nearer_where_it_is_drawn_and_the_scene_elsewhere(robot):
    plain = SyntheticScene(W, H, moving=False).render(0.0)
    cam = SyntheticScene(W, H, moving=False, draw_robot=True)
    cam.set_joint_positions(teleop_pose(robot))
    frame = cam.render(0.0)
    depth_changed = frame.depth != plain.depth
    assert depth_changed.sum() > 0.05 * W * H
    assert np.all(frame.depth[depth_changed] < plain.depth[depth_changed])
    colour_changed = np.any(frame.color != plain.color, axis=2)
    assert not (depth_changed & ~colour_changed).any()  # the depth changed only where the robot shows
    # colour alone outside the depth change: the anti-aliased outline, a pixel wide
    rim = colour_changed & ~cv2.dilate(depth_changed.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    assert rim.sum() <= 0.002 * colour_changed.sum()


def test_the_scene_hides_the_parts_of_the_robot_behind_it(robot):
    """Shoulders lowered: the fingers reach below the table top; there the table stays, colour and depth."""
    q = home_position(robot)
    q[robot.joint_index("left_arm_joint1")] += 0.2
    q[robot.joint_index("right_arm_joint1")] -= 0.2
    cam = SyntheticScene(W, H, moving=False, draw_robot=True)
    cam.set_joint_positions(q)
    frame = cam.render(0.0)
    plain = SyntheticScene(W, H, moving=False).render(0.0)
    v, u, z = cam.painter.draw_depth(np.zeros((H, W, 3), np.uint8), q)  # the robot alone
    robot_mm = np.round(z * 1000.0)
    behind = robot_mm >= plain.depth[v, u]
    assert behind.sum() > 20 and (~behind).sum() > 20
    np.testing.assert_array_equal(frame.color[v[behind], u[behind]], plain.color[v[behind], u[behind]])
    np.testing.assert_array_equal(frame.depth[v[behind], u[behind]], plain.depth[v[behind], u[behind]])
    np.testing.assert_array_equal(frame.depth[v[~behind], u[~behind]], robot_mm[~behind])


def test_a_frame_shows_the_joints_given_before_its_delivery(robot):
    cam = SyntheticScene(W, H, fps=30.0, draw_robot=True, depth=False)
    cam.start(0.0)
    (first,) = cam.read(0.0)
    cam.prepare_next()  # the next frame's scene is rendered ahead, before the joints change
    q = teleop_pose(robot)
    cam.set_joint_positions(q)
    (second,) = cam.read(1 / 30)
    assert second.depth is None
    np.testing.assert_array_equal(second.color, cam.render(1 / 30).color)
    other = SyntheticScene(W, H, fps=30.0, draw_robot=True, depth=False)
    np.testing.assert_array_equal(first.color, other.render(0.0).color)  # the home pose
    assert np.any(second.color != other.render(1 / 30).color)
    assert cam.diagnostics()["joint_updates"] == 1
    # a still robot: frames rendered ahead with it are delivered as they are, the same as drawn at delivery
    for k in (2, 3, 4):
        cam.prepare_next()
        cam.set_joint_positions(q.copy())  # the same joints again (a driver publishing a robot at rest)
        (frame,) = cam.read(k / 30)
        np.testing.assert_array_equal(frame.color, cam.render(k / 30).color)


def test_bad_joint_vectors_are_refused():
    cam = SyntheticScene(W, H, draw_robot=True)
    for q in (np.zeros(14), np.full(54, np.nan), np.zeros((2, 54))):
        with pytest.raises(ValueError, match="joint positions"):
            cam.set_joint_positions(q)
    np.testing.assert_array_equal(cam.joint_positions, home_position(cam.robot_model))
    with pytest.raises(ValueError):
        cam.joint_positions[0] = 1.0  # read-only


# ------------------------------------------------------------------------------------ the node
def test_the_node_draws_the_robot_at_the_published_joint_states(ros_domain_id, robot):
    """Publishing /joint_states (the left arm only) moves the robot in the published images; the hands keep
    the home pose they were never sent; the same joints drawn offline give the same robot pixels."""
    comp = Composition(["head_camera"], overrides={"head_camera": {"synthetic.profile": f"{W}x{H}x30"}},
                       domain_id=ros_domain_id)
    try:
        probe = Node("joint_probe", context=comp.context)
        lock, images = threading.Lock(), []

        def keep(msg: Image) -> None:
            with lock:
                images.append(msg)

        probe.create_subscription(Image, "/head_camera/physical/color/image_raw", keep, qos_profile_sensor_data)
        pub = probe.create_publisher(JointState, "/joint_states", QoSProfile(depth=10,
                                                                           reliability=ReliabilityPolicy.RELIABLE))
        comp.add_node(probe)
        camera = comp.node("head_camera")
        assert camera.source.draw_robot
        assert wait_for(lambda: len(images) > 3, 15.0)

        # offline: where the robot at home and at the new joints differ, away from the moving ball
        q = teleop_pose(robot)
        names = list(arm_joint_names("left"))
        offline = SyntheticScene(W, H, moving=False, draw_robot=True)
        home_image = offline.render(0.0).color
        moved = home_position(robot)
        moved[robot.indices(names)] = q[robot.indices(names)]
        offline.set_joint_positions(moved)
        moved_image = offline.render(0.0).color
        region = np.any(home_image != moved_image, axis=2)
        region[: H // 2] = False  # the ball rolls across the middle of the table, above the hands' rows
        assert region.sum() > 200

        def error(image: np.ndarray, reference: np.ndarray) -> float:
            return float(np.abs(image[region].astype(int) - reference[region]).mean())

        with lock:
            latest = image_array(images[-1])
        assert error(latest, home_image) < 1.0 < error(latest, moved_image)

        msg = JointState(name=names, position=[float(v) for v in q[robot.indices(names)]])

        def shows_the_new_pose() -> bool:
            msg.header.stamp = probe.get_clock().now().to_msg()
            pub.publish(msg)
            with lock:
                image = image_array(images[-1])
            return error(image, moved_image) < 1.0
        assert wait_for(shows_the_new_pose, 10.0, period=0.05)
        assert camera.source.joint_updates >= 1
        np.testing.assert_array_equal(camera.source.joint_positions, moved)
        # the joint states stop: the last pose stays
        n = len(images)
        assert wait_for(lambda: len(images) > n + 5, 5.0)
        with lock:
            assert error(image_array(images[-1]), moved_image) < 1.0
        assert camera.diagnostic_values()["rejected_joint_states"] == 0
    finally:
        comp.shutdown()
    assert not comp.errors
