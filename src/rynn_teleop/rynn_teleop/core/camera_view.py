"""A camera fixed to the robot: intrinsics, the optical frame's pose in ``base_link``, projection (ROS-free).

:class:`CameraView` projects points given in ``base_link`` or in the optical frame (x right, y down,
z forward) through a pinhole with optional OpenCV radial-tangential distortion (:class:`Projection`);
:func:`fixed_point` turns pixel coordinates into OpenCV's sub-pixel drawing coordinates
(:data:`SUBPIXEL_BITS`). Shared by everything that draws into the head camera's image: the skeleton
conditioning and the render backend of the world model, and the synthetic head camera's robot
(:mod:`.robot_render`). Pixel coordinates follow :mod:`.camera`: u right, v down, pixel centres at
integer coordinates.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import ConfigurationError
from .camera import CameraIntrinsics
from .robot_model import RobotModel

DEFAULT_CAMERA_FRAME = "camera_color_optical_frame"
DEFAULT_NEAR_CLIP = 0.01  # [m] points with optical z at or below this are not projected (behind the camera)
SUBPIXEL_BITS = 4  # OpenCV drawing ``shift``: coordinates and radii are drawn with 1/16 px precision
SUBPIXEL = float(1 << SUBPIXEL_BITS)  # [1/px] fixed-point units per pixel
_MAX_PX = float(1 << 20)  # [px] projected coordinates are clamped to +-this before drawing (int32 with shift)


class Projection(NamedTuple):
    """Points projected into an image."""

    uv: np.ndarray  # (N, 2) [px] pixel coordinates; NaN for points not in front of the near clip plane
    depth: np.ndarray  # (N,) [m] z in the optical frame, as given (also for points behind the camera)

    @property
    def in_front(self) -> np.ndarray:
        """(N,) bool: the point lies in front of the near clip plane (its ``uv`` is defined)."""
        return np.isfinite(self.uv[:, 0])


def _distortion(intrinsics: CameraIntrinsics) -> np.ndarray | None:
    """OpenCV's (k1, k2, p1, p2, k3, k4, k5, k6) of ``intrinsics``, None when there is no distortion.

    Raises:
        ConfigurationError: non-zero coefficients of a model other than
            ``plumb_bob`` / ``rational_polynomial``.
    """
    coeffs = np.asarray(intrinsics.coeffs, dtype=float).ravel()
    if not np.any(coeffs):
        return None
    if intrinsics.distortion_model not in ("plumb_bob", "rational_polynomial") or coeffs.size > 8:
        raise ConfigurationError(
            f"camera view: distortion model {intrinsics.distortion_model!r} with coefficients {tuple(coeffs)} is not "
            "supported (plumb_bob and rational_polynomial are); give rectified intrinsics"
        )
    out = np.zeros(8)
    out[: coeffs.size] = coeffs
    return out


def _pinhole(points_cam: np.ndarray, intrinsics: CameraIntrinsics, dist: np.ndarray | None) -> np.ndarray:
    """(N, 2) [px] projections of (N, 3) optical-frame points with z > 0 (no masking)."""
    z = points_cam[:, 2]
    x, y = points_cam[:, 0] / z, points_cam[:, 1] / z
    if dist is not None:  # OpenCV's radial-tangential model (cv2.projectPoints)
        k1, k2, p1, p2, k3, k4, k5, k6 = dist
        r2 = x * x + y * y
        radial = (1 + r2 * (k1 + r2 * (k2 + r2 * k3))) / (1 + r2 * (k4 + r2 * (k5 + r2 * k6)))
        x, y = (
            x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x),
            y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y,
        )
    return np.stack([intrinsics.fx * x + intrinsics.cx, intrinsics.fy * y + intrinsics.cy], axis=1)


def camera_pose(robot: RobotModel, frame: str = DEFAULT_CAMERA_FRAME) -> np.ndarray:
    """(4, 4) pose of the camera's optical frame ``frame`` in ``base_link`` [m], from the robot description
    (``urdf/robot.yaml``: ``head``, ``camera``, and an overlay's changes): the one fact of where the head
    camera is, shared by every image drawn through it.

    Raises:
        FrameNotFoundError: ``frame`` is not in the description.
        ConfigurationError: ``frame`` moves with an actuated joint (its pose would depend on the joint vector).
    """
    fid = robot.frame_id(frame)
    if robot.model.frames[fid].parentJoint != 0:
        raise ConfigurationError(
            f"camera view: frame {frame!r} moves with joint "
            f"{robot.model.names[robot.model.frames[fid].parentJoint]!r}; the camera must be fixed to the torso"
        )
    return robot.frame_pose(robot.neutral(), frame)


class CameraView:
    """A camera fixed to the robot: its intrinsics and the pose of its optical frame in ``base_link``.

    Attributes:
        intrinsics: the pinhole model of the images drawn through this view.
        T_base_camera: (4, 4) pose of the optical frame (x right, y down, z forward) in ``base_link``.
        near: [m] near clip plane: points with optical z <= near are not projected.
    """

    def __init__(
        self, intrinsics: CameraIntrinsics, T_base_camera: np.ndarray, near: float = DEFAULT_NEAR_CLIP
    ) -> None:
        """
        Raises:
            ConfigurationError: bad intrinsics, a pose that is not a rigid
                transform, a non-positive near plane or unsupported distortion.
        """
        self.intrinsics = intrinsics.check()
        T = np.asarray(T_base_camera, dtype=float)
        if T.shape != (4, 4) or not np.all(np.isfinite(T)) or not np.allclose(T[:3, :3] @ T[:3, :3].T, np.eye(3)):
            raise ConfigurationError(f"camera view: T_base_camera must be a (4, 4) rigid transform, got {T!r}")
        if not (math.isfinite(near) and near > 0.0):
            raise ConfigurationError(f"camera view: near = {near} m must be > 0")
        self.T_base_camera = T.copy()
        self.T_camera_base = np.eye(4)
        self.T_camera_base[:3, :3] = T[:3, :3].T
        self.T_camera_base[:3, 3] = -T[:3, :3].T @ T[:3, 3]
        self.near = float(near)
        self._dist = _distortion(intrinsics)

    @classmethod
    def from_robot(
        cls,
        robot: RobotModel,
        intrinsics: CameraIntrinsics,
        frame: str = DEFAULT_CAMERA_FRAME,
        near: float = DEFAULT_NEAR_CLIP,
    ) -> CameraView:
        """The view of ``frame`` (an optical frame of the description), fixed to ``base_link``
        (:func:`camera_pose`).

        Raises:
            FrameNotFoundError: ``frame`` is not in the description.
            ConfigurationError: ``frame`` moves with an actuated joint (its
                pose would depend on the joint vector).
        """
        return cls(intrinsics, camera_pose(robot, frame), near)

    @property
    def distorted(self) -> bool:
        """Whether the intrinsics have lens distortion (projection is then not a plain pinhole)."""
        return self._dist is not None

    def to_camera(self, points_base: np.ndarray) -> np.ndarray:
        """(N, 3) points [m] in ``base_link`` -> the same points in the optical frame [m]."""
        p = np.asarray(points_base, dtype=float).reshape(-1, 3)
        return p @ self.T_camera_base[:3, :3].T + self.T_camera_base[:3, 3]

    def project(self, points_base: np.ndarray) -> Projection:
        """Project (N, 3) points [m] given in ``base_link``; see :meth:`project_camera`."""
        return self.project_camera(self.to_camera(points_base))

    def project_camera(self, points_cam: np.ndarray) -> Projection:
        """Project (N, 3) points [m] given in the optical frame.

        Returns:
            ``uv`` (N, 2) [px] (NaN where z <= :attr:`near` or the point is not
            finite) and ``depth`` (N,) = z [m].
        """
        p = np.asarray(points_cam, dtype=float).reshape(-1, 3)
        depth = p[:, 2].copy()
        with np.errstate(invalid="ignore"):
            front = np.isfinite(p).all(axis=1) & (depth > self.near)
        uv = np.full((len(p), 2), np.nan)
        if front.any():
            uv[front] = _pinhole(p[front], self.intrinsics, self._dist)
        return Projection(uv, depth)

    def project_unmasked(self, points_cam: np.ndarray) -> np.ndarray:
        """(N, 2) [px] projections of optical-frame points the caller knows to have z > 0 (no checks)."""
        return _pinhole(points_cam, self.intrinsics, self._dist)


def fixed_point(uv: np.ndarray) -> np.ndarray:
    """(N, 2) [px] -> int32 coordinates in 1/16 px for OpenCV's ``shift`` = :data:`SUBPIXEL_BITS`.

    Coordinates beyond +-2^20 px (points just in front of the near plane) are
    clamped there, which keeps them in int32.
    """
    return np.round(np.clip(uv, -_MAX_PX, _MAX_PX) * SUBPIXEL).astype(np.int32)
