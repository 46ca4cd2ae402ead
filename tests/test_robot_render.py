"""The robot renderer in core: the depth it draws lies on the surfaces it paints, and colour is unchanged by it."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.camera import default_intrinsics
from rynn_teleop.core.camera_view import CameraView, camera_pose
from rynn_teleop.core.robot_geometry import Primitive
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.core.robot_render import PrimitiveRenderer, RobotRenderer, Shading

W, H = 320, 240
K = default_intrinsics(W, H)


def _prim(kind: str, size, rgb=(0.6, 0.6, 0.6)) -> Primitive:
    return Primitive(kind, kind, kind, np.asarray(size, float), np.array([*rgb, 1.0]))


def _pose(t, R=None) -> np.ndarray:
    T = np.eye(4)
    T[:3, 3] = t
    if R is not None:
        T[:3, :3] = R
    return T


def _rotation(axis: np.ndarray, angle: float) -> np.ndarray:
    a = np.asarray(axis, float) / np.linalg.norm(axis)
    S = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + np.sin(angle) * S + (1 - np.cos(angle)) * S @ S


def _back_project(v: np.ndarray, u: np.ndarray, z: np.ndarray) -> np.ndarray:
    """(P, 3) optical-frame points at depth z [m] on the rays through pixel centres (u, v)."""
    return np.stack([(u - K.cx) / K.fx * z, (v - K.cy) / K.fy * z, z], axis=1)


def _view() -> CameraView:
    return CameraView(K, np.eye(4))


def test_draw_depth_paints_exactly_what_draw_paints():
    robot = RobotModel.default()
    painter = RobotRenderer(robot, K)
    q = robot.neutral()
    q[:14] = DEFAULT_HOME
    q[0] -= 0.3
    q[7] += 0.3
    background = np.full((H, W, 3), 90, np.uint8)
    colour = painter.draw(background.copy(), q)
    with_depth = background.copy()
    v, u, z = painter.draw_depth(with_depth, q)
    np.testing.assert_array_equal(colour, with_depth)
    assert len(v) > 0.03 * W * H and np.all(z > painter.shading.near)
    covered = np.zeros((H, W), np.uint8)
    covered[v, u] = 1
    painted = np.any(colour != background, axis=2)
    # every covered pixel is painted; painted pixels outside it are the anti-aliased rim of the outlines
    assert painted[covered > 0].mean() > 0.99
    near_covered = cv2.dilate(covered, np.ones((5, 5), np.uint8)) > 0
    assert (painted & ~near_covered).sum() <= 0.002 * painted.sum()


def test_a_box_face_towards_the_camera_has_the_depth_of_its_plane():
    renderer = PrimitiveRenderer([_prim("box", [0.2, 0.2, 0.2])], _view())
    v, u, z = renderer.draw_depth(np.zeros((H, W, 3), np.uint8), _pose([0.0, 0.0, 1.0])[None])
    np.testing.assert_allclose(z, 0.9, atol=1e-12)
    # the face spans f * 0.2 / 0.9 px
    assert abs((u.max() - u.min() + 1) - K.fx * 0.2 / 0.9) <= 2


def test_the_nearer_primitive_gives_the_depth_where_two_overlap():
    red, blue = _prim("box", [0.3, 0.3, 0.3], (1, 0, 0)), _prim("box", [0.05, 0.05, 0.05], (0, 0, 1))
    renderer = PrimitiveRenderer([red, blue], _view())
    image = np.zeros((H, W, 3), np.uint8)
    v, u, z = renderer.draw_depth(image, np.stack([_pose([0, 0, 1.0]), _pose([0, 0, 0.5])]))
    depth = np.full((H, W), np.nan)
    depth[v, u] = z
    assert depth[H // 2, W // 2] == pytest.approx(0.475)
    assert depth[H // 2, W // 2 + 40] == pytest.approx(0.85)


def test_a_sphere_has_the_depth_of_its_front_surface():
    renderer = PrimitiveRenderer([_prim("sphere", [0.1, 0.1, 0.1])], _view(), Shading(antialias=False))
    centre = np.array([0.02, -0.01, 0.8])
    v, u, z = renderer.draw_depth(np.zeros((H, W, 3), np.uint8), _pose(centre)[None])
    distance = np.linalg.norm(_back_project(v, u, z) - centre, axis=1)
    inside = distance < 0.05 + 1e-9
    assert inside.mean() > 0.9  # the disc's edge pixels whose rays miss the ball get the nearest point of the ray
    np.testing.assert_allclose(distance[inside], 0.05, atol=1e-9)


def test_depth_is_refused_through_a_distorted_view():
    view = CameraView(K._replace(coeffs=(0.1, 0.0, 0.0, 0.0, 0.0)), np.eye(4))
    renderer = PrimitiveRenderer([_prim("box", [0.2, 0.2, 0.2])], view)
    with pytest.raises(ValueError, match="distortion"):
        renderer.draw_depth(np.zeros((H, W, 3), np.uint8), _pose([0, 0, 1.0])[None])


def _planes(kind: str, size: np.ndarray, segments: int) -> tuple[np.ndarray, np.ndarray]:
    """The primitive as a convex polytope in its own frame: outward normals (M, 3), offsets (M,): n . p <= d."""
    half = size / 2
    if kind == "box":
        normals = np.concatenate([np.eye(3), -np.eye(3)])
        return normals, np.concatenate([half, half])
    mid = 2 * np.pi * np.arange(segments) / segments + np.pi / segments  # the renderer's facets
    sides = np.stack([np.cos(mid), np.sin(mid), np.zeros(segments)], axis=1)
    normals = np.concatenate([sides, [[0, 0, 1.0], [0, 0, -1.0]]])
    return normals, np.r_[np.full(segments, half[0] * np.cos(np.pi / segments)), half[2], half[2]]


def _entry(normals, offsets, R, centre, v, u) -> np.ndarray:
    """(P,) [m] optical z where the rays through pixel centres (u, v) enter the polytope; nan where they miss."""
    rays = np.stack([(u - K.cx) / K.fx, (v - K.cy) / K.fy, np.ones(len(u))], axis=1) @ R  # in its frame
    origin = -centre @ R
    nd = rays @ normals.T  # (P, M)
    gap = offsets - normals @ origin  # (M,) > 0: the camera is inside that half-space
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = gap / nd
    t_in = np.where(nd < 0, t, -np.inf).max(axis=1)
    t_out = np.where(nd > 0, t, np.inf).min(axis=1)
    parallel_out = ((nd == 0) & (gap < 0)).any(axis=1)
    return np.where((t_in <= t_out) & (t_in > 0) & ~parallel_out, t_in, np.nan)


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["box", "cylinder"]),
    x=st.floats(-0.15, 0.15), y=st.floats(-0.1, 0.1), zc=st.floats(0.35, 1.5),
    ax=st.floats(-1, 1), ay=st.floats(-1, 1), az=st.floats(-1, 1), angle=st.floats(0.0, 3.1),
    sx=st.floats(0.03, 0.3), sz=st.floats(0.03, 0.3),
)
@example(kind="box", x=0.021, y=0.015625, zc=1.046875, ax=-0.26212257507872516, ay=0.0, az=0.4917,
         angle=0.91796875, sx=0.158675499190462, sz=0.22604215136334976)  # a pixel on a diagonal seam
def test_the_depth_is_where_each_pixel_ray_enters_the_primitive(kind, x, y, zc, ax, ay, az, angle, sx, sz):
    """A covered pixel whose ray meets the primitive gets the depth where the ray enters it, exactly (also at
    the seams of faces); a covered pixel whose ray just misses it (its rasterised outline) lies next to one that
    meets it; every depth lies within the primitive's depth range."""
    axis = np.array([ax, ay, az])
    R = _rotation(axis, angle) if np.linalg.norm(axis) > 1e-3 else np.eye(3)
    size = np.array([sx, 0.7 * sx + 0.02, sz]) if kind == "box" else np.array([sx, sx, sz])
    centre = np.array([x, y, zc])
    segments = 16
    renderer = PrimitiveRenderer([_prim(kind, size)], _view(), Shading(cylinder_segments=segments))
    v, u, z = renderer.draw_depth(np.zeros((H, W, 3), np.uint8), _pose(centre, R)[None])
    if not len(v):
        return
    normals, offsets = _planes(kind, size, segments)
    true = _entry(normals, offsets, R, centre, v, u)
    hit = np.isfinite(true)
    np.testing.assert_allclose(z[hit], true[hit], rtol=0, atol=1e-9)
    steps = [(dv, du) for dv in (-1, 0, 1) for du in (-1, 0, 1) if dv or du]
    corners = np.array([[i, j, k] for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)]) * size / 2 @ R.T + centre
    assert np.all((z >= corners[:, 2].min() - 1e-9) & (z <= corners[:, 2].max() + 1e-9))
    for dv, du in steps:
        near = _entry(normals, offsets, R, centre, v[~hit] + dv, u[~hit] + du)
        hit[np.flatnonzero(~hit)[np.isfinite(near)]] = True
    assert hit.all(), "a covered pixel more than a pixel away from the primitive"


def test_the_camera_pose_is_the_description_head_camera():
    robot = RobotModel.default()
    T = camera_pose(robot)
    np.testing.assert_allclose(T[:3, 3], [0.11, 0.0, 1.381], atol=1e-9)  # urdf/robot.yaml: torso + head + camera
    np.testing.assert_allclose(CameraView.from_robot(robot, K).T_base_camera, T)
    forward = T[:3, 2]  # the optical axis, 45 deg below the horizontal, straight ahead
    np.testing.assert_allclose(forward, [np.sqrt(0.5), 0.0, -np.sqrt(0.5)], atol=1e-12)
