"""The render backend: the robot drawn where forward kinematics projects it, over the reference frame."""

from __future__ import annotations

import numpy as np
import pytest

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.camera import default_intrinsics
from rynn_teleop.core.camera_view import CameraView
from rynn_teleop.core.hand_skeleton import robot_keypoint_frames
from rynn_teleop.core.robot_geometry import Primitive, RobotGeometry
from rynn_teleop.core.robot_model import RobotModel, hand_joint_names
from rynn_teleop.core.robot_render import PrimitiveRenderer, Shading
from rynn_teleop.errors import ParameterError
from rynn_teleop.sources.camera.synthetic import SyntheticScene
from rynn_teleop.world_model.generator import Generator
from rynn_teleop.world_model.render import RenderGenerator

W, H = 640, 480
CAMERA = "camera_color_optical_frame"


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    """The synthetic tabletop, as the head camera's reference frame."""
    return SyntheticScene(W, H, depth=False, moving=False).render(0.0).color


@pytest.fixture(scope="module")
def generator(robot, reference) -> RenderGenerator:
    gen = RenderGenerator(robot, default_intrinsics(W, H))
    gen.reset(reference)
    return gen


def in_view_configuration(robot: RobotModel) -> np.ndarray:
    """Arms at DEFAULT_HOME, shoulders raised 0.3 rad (hands and wrists in view), fingers at 60 % of range [rad]."""
    q = robot.neutral()
    q[:14] = DEFAULT_HOME
    q[0] -= 0.3
    q[7] += 0.3
    lim = robot.limits
    q[14:] = lim.lower[14:] + 0.6 * (lim.upper[14:] - lim.lower[14:])
    return q


def pinhole(points_base: np.ndarray, T_base_camera: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cam = (points_base - T_base_camera[:3, 3]) @ T_base_camera[:3, :3]
    h = cam @ K.T
    return h[:, :2] / h[:, 2:3], cam[:, 2]


def robot_footprint(robot: RobotModel, q: np.ndarray, margin: int = 3) -> np.ndarray:
    """(H, W) bool: the convex hulls of every primitive's projected bounding box, grown by ``margin`` px.

    Computed independently of the renderer: primitive poses from Pinocchio, the camera pose from
    the robot model, a plain pinhole projection.
    """
    import cv2

    geometry = RobotGeometry(robot)
    T_cam = robot.frame_pose(q, CAMERA)
    K = default_intrinsics(W, H).K()
    mask = np.zeros((H, W), np.uint8)
    unit = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)
    edges = [(a, b) for a in range(8) for b in range(a + 1, 8) if np.sum(unit[a] != unit[b]) == 1]
    near = 0.02  # [m] the renderer's near plane (Shading.near)
    for prim, pose in zip(geometry.primitives, geometry.poses(q)):
        corners = (0.5 * unit * prim.size) @ pose[:3, :3].T + pose[:3, 3]
        cam = (corners - T_cam[:3, 3]) @ T_cam[:3, :3]  # optical frame
        front = cam[:, 2] > near
        points = [cam[front]]  # the box's part in front of the near plane: its corners there and edge cuts
        for a, b in edges:
            if front[a] != front[b]:
                s = (near - cam[a, 2]) / (cam[b, 2] - cam[a, 2])
                points.append((cam[a] + s * (cam[b] - cam[a]))[None])
        part = np.concatenate(points)
        if len(part) < 3:
            continue
        uv = (part @ K.T)[:, :2] / part[:, 2:3]
        hull = cv2.convexHull(np.round(np.clip(uv, -1e6, 1e6)).astype(np.int32))
        cv2.fillConvexPoly(mask, hull, 1)
    return cv2.dilate(mask, np.ones((2 * margin + 1, 2 * margin + 1), np.uint8)).astype(bool)


# ------------------------------------------------------------------------------------ where the robot is drawn
def test_hand_keypoints_in_view_are_drawn_over_the_reference(robot, reference, generator):
    q = in_view_configuration(robot)
    frame = generator.step(q)[0]
    assert frame.shape == (H, W, 3) and frame.dtype == np.uint8
    T_cam = robot.frame_pose(q, CAMERA)
    frames = robot_keypoint_frames("left") + robot_keypoint_frames("right")
    uv, depth = pinhole(robot.forward_kinematics(q, frames)[:, :3, 3], T_cam, default_intrinsics(W, H).K())
    u, v = np.round(uv).astype(int).T
    in_view = (depth > 0) & (u >= 0) & (u < W) & (v >= 0) & (v < H)
    assert in_view.sum() >= 30
    changed = np.any(frame[v[in_view], u[in_view]] != reference[v[in_view], u[in_view]], axis=1)
    assert changed.all(), f"keypoints not drawn: {np.asarray(frames)[in_view][~changed]}"


def test_pixels_away_from_the_robot_are_the_reference(robot, reference, generator):
    q = in_view_configuration(robot)
    frame = generator.step(q)[0]
    footprint = robot_footprint(robot, q)
    changed = np.any(frame != reference, axis=2)
    assert changed.sum() > 0.03 * H * W  # the hands and wrists are drawn
    assert not changed[~footprint].any(), "pixels far from every projected primitive changed"
    assert footprint.mean() < 0.5


def test_same_joints_give_bit_identical_frames(robot, reference, generator):
    q = in_view_configuration(robot)
    other = RenderGenerator(robot, default_intrinsics(W, H))
    other.reset(reference.copy())
    first = generator.step(q)[0]
    np.testing.assert_array_equal(first, generator.step(q.copy())[0])
    np.testing.assert_array_equal(first, other.step(q)[0])
    np.testing.assert_array_equal(generator.reference, reference)  # the reference is never drawn into


def test_moving_a_joint_moves_the_drawn_pixels(robot, generator):
    q = in_view_configuration(robot)
    before = generator.step(q)[0]
    moved = q.copy()
    moved[robot.indices(hand_joint_names("right"))] = robot.limits.lower[robot.indices(hand_joint_names("right"))]
    after = generator.step(moved)[0]
    diff = np.any(before != after, axis=2)
    assert diff.sum() > 200  # the right fingers opened
    assert not diff[:, : W // 2].any()  # the left half (left hand) is untouched

    moved = q.copy()
    moved[robot.joint_index("left_arm_joint7")] += 0.6
    diff = np.any(generator.step(moved)[0] != before, axis=2)
    assert diff.sum() > 200 and not diff[:, W // 2 :].any()


# ------------------------------------------------------------------------------------ painter's algorithm
def _box(name: str, rgb: tuple[float, float, float], size: float) -> Primitive:
    return Primitive(name, name, "box", np.full(3, size), np.array([*rgb, 1.0]))


def _pose(z: float, x: float = 0.0) -> np.ndarray:
    T = np.eye(4)
    T[:3, 3] = (x, 0.0, z)
    return T


@pytest.mark.parametrize("antialias", [True, False])
def test_the_nearer_primitive_wins_where_two_overlap(antialias):
    view = CameraView(default_intrinsics(W, H), np.eye(4))
    red, blue = _box("red", (1.0, 0.0, 0.0), 0.3), _box("blue", (0.0, 0.0, 1.0), 0.05)
    centre = (H // 2, W // 2)
    for prims, poses in (([red, blue], [_pose(1.0), _pose(0.5)]), ([blue, red], [_pose(0.5), _pose(1.0)])):
        image = PrimitiveRenderer(prims, view, Shading(antialias=antialias)).draw(np.zeros((H, W, 3), np.uint8),
                                                                                 np.stack(poses))
        r, _, b = image[centre].astype(int)
        assert b > 50 and r == 0, "the nearer (blue) box must cover the farther (red) one"
        assert image[centre[0], centre[1] + 60, 0] > 50  # the red box shows around the small blue one
    # swap the depths: now the red box is in front and hides the small blue one entirely
    image = PrimitiveRenderer([red, blue], view).draw(np.zeros((H, W, 3), np.uint8), np.stack([_pose(0.5), _pose(1.0)]))
    assert not image[..., 2].any()


def test_faces_are_lambert_shaded_and_back_faces_culled():
    view = CameraView(default_intrinsics(W, H), np.eye(4))
    grey = _box("grey", (0.5, 0.5, 0.5), 0.2)
    shading = Shading(light=(0.0, 0.0, -1.0), ambient=0.2, diffuse=0.6, antialias=False)
    image = PrimitiveRenderer([grey], view, shading).draw(np.zeros((H, W, 3), np.uint8), _pose(1.0)[None])
    # only the face towards the camera is visible; it faces the light: 0.5 * (0.2 + 0.6) = 0.4
    assert image[H // 2, W // 2].tolist() == [102, 102, 102]
    tilted = _pose(1.0)
    c, s = np.cos(np.pi / 3), np.sin(np.pi / 3)
    tilted[:3, :3] = [[c, 0, s], [0, 1, 0], [-s, 0, c]]  # turned 60 deg about y: two faces seen, at 60 and 30 deg
    image = PrimitiveRenderer([grey], view, shading).draw(np.zeros((H, W, 3), np.uint8), tilted[None])
    seen = set(image[H // 2, W // 2 - 60 : W // 2 + 60, 0].tolist()) - {0}
    assert seen == {round(255 * 0.5 * (0.2 + 0.6 * c)), round(255 * 0.5 * (0.2 + 0.6 * s))}


def test_primitives_behind_the_near_plane_are_skipped_or_clipped():
    view = CameraView(default_intrinsics(W, H), np.eye(4))
    box = Primitive("b", "b", "box", np.array([0.2, 0.2, 0.4]), np.array([0.8, 0.8, 0.8, 1.0]))
    renderer = PrimitiveRenderer([box], view, Shading(near=0.02))
    assert not renderer.draw(np.zeros((H, W, 3), np.uint8), _pose(-1.0)[None]).any()  # behind the camera
    # a box from z = -0.1 to 0.3 beside the optical axis: its inner face crosses the near plane and is clipped
    image = renderer.draw(np.zeros((H, W, 3), np.uint8), _pose(0.1, x=0.15)[None])
    lit = np.flatnonzero(image.max(axis=(0, 2)) > 0)
    assert lit.size and lit.min() >= 320 + 615 * 0.05 / 0.3 - 2 and lit.max() == W - 1


def test_spheres_are_discs_of_the_projected_radius():
    view = CameraView(default_intrinsics(W, H), np.eye(4))
    ball = Primitive("ball", "ball", "sphere", np.full(3, 0.1), np.array([0.0, 1.0, 0.0, 1.0]))
    image = PrimitiveRenderer([ball], view, Shading(antialias=False)).draw(np.zeros((H, W, 3), np.uint8),
                                                                            _pose(1.0)[None])
    row = np.flatnonzero(image[H // 2, :, 1])
    assert abs(len(row) - 2 * 615 * 0.05) <= 2 and abs(row.mean() - W / 2) <= 1


# ------------------------------------------------------------------------------------ the backend interface
def test_generator_interface(robot, reference):
    gen = RenderGenerator(robot, default_intrinsics(W, H))
    assert isinstance(gen, Generator) and (gen.width, gen.height) == (W, H) and gen.pending == 0
    q = in_view_configuration(robot)
    with pytest.raises(RuntimeError, match="reset"):
        gen.step(q)
    small = reference[::2, ::2].copy()
    gen.reset(small)  # any size: resized
    assert gen.reference.shape == (H, W, 3) and not gen.reference.flags.writeable
    frames = gen.step(q, condition=np.zeros((H, W, 3), np.uint8))
    assert len(frames) == 1 and frames[0].shape == (H, W, 3)
    assert set(gen.timings()) == {"fk", "draw"}

    gen.observe(np.zeros((H, W, 3), np.uint8))  # kept, not used until a re-anchoring
    np.testing.assert_array_equal(gen.step(q)[0], frames[0])
    assert gen.observed is not None and not gen.observed.any()
    gen.reanchor(reference)
    np.testing.assert_array_equal(gen.reference, reference)
    assert np.any(gen.step(q)[0] != frames[0])

    with pytest.raises(ValueError, match="joint vector"):
        gen.step(np.zeros(14))
    with pytest.raises(ValueError, match="joint vector"):
        gen.step(np.full(54, np.nan))


def test_output_size_scales_the_intrinsics(robot, reference):
    gen = RenderGenerator(robot, default_intrinsics(W, H), width=W // 2, height=H // 2)
    gen.reset(reference)
    assert gen.intrinsics.fx == pytest.approx(default_intrinsics(W, H).fx / 2)
    assert gen.step(in_view_configuration(robot))[0].shape == (H // 2, W // 2, 3)


@pytest.mark.parametrize(
    ("key", "kwargs"),
    [
        ("light", {"light": (0.0, 0.0, 0.0)}),
        ("light", {"light": (1.0, 2.0)}),
        ("ambient", {"ambient": -0.1}),
        ("diffuse", {"diffuse": float("inf")}),
        ("cylinder_segments", {"cylinder_segments": 2}),
        ("cylinder_segments", {"cylinder_segments": 8.0}),
        ("antialias", {"antialias": 1}),
        ("near", {"near": 0.0}),
    ],
)
def test_shading_errors_name_the_bad_field(key, kwargs):
    with pytest.raises(ParameterError, match=key) as err:
        Shading(**kwargs)
    assert err.value.key == key
