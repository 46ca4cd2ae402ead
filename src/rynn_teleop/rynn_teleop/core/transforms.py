"""Rigid transforms as 4x4 numpy matrices (ROS-free).

Conventions: a pose ``T_a_b`` is the (4, 4) homogeneous matrix of frame ``b``
expressed in frame ``a`` (positions in metres); quaternions are (x, y, z, w)
like ``geometry_msgs/Quaternion`` and scipy.

Quaternion <-> matrix conversions go through Pinocchio's (Eigen's) quaternion,
far cheaper per call than scipy's ``Rotation`` (the tracker path converts every
pose of every frame).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pinocchio as pin


def make_transform(position=(0.0, 0.0, 0.0), rotation: np.ndarray | None = None) -> np.ndarray:
    """(4, 4) transform from a position [m] and an optional (3, 3) rotation."""
    T = np.eye(4)
    T[:3, 3] = position
    if rotation is not None:
        T[:3, :3] = rotation
    return T


def pose_to_matrix(position, quat_xyzw) -> np.ndarray:
    """Position [m] + quaternion (x, y, z, w; normalised here) -> (4, 4).

    Raises ValueError for a non-finite input or a zero quaternion.
    """
    p = np.asarray(position, dtype=float)
    q = np.asarray(quat_xyzw, dtype=float)
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(q))):
        raise ValueError("pose contains NaN or infinity")
    n = float(np.linalg.norm(q))
    if n < 1e-9:
        raise ValueError("pose has a zero quaternion")
    return make_transform(p, rotation_from_quat(q / n))


def rotation_from_quat(q_xyzw) -> np.ndarray:
    """Unit quaternion (x, y, z, w) -> (3, 3) rotation matrix."""
    x, y, z, w = (float(v) for v in q_xyzw)
    return pin.Quaternion(w, x, y, z).toRotationMatrix()


def quat_from_rotation(R: np.ndarray) -> np.ndarray:
    """(3, 3) rotation matrix -> unit quaternion (x, y, z, w) with w >= 0."""
    q = pin.Quaternion(np.ascontiguousarray(R, dtype=float)).coeffs()
    q = q / np.linalg.norm(q)
    return -q if q[3] < 0 else q


def matrix_to_pose(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(4, 4) -> (position (3,) [m], quaternion (4,) x, y, z, w with w >= 0)."""
    return T[:3, 3].copy(), quat_from_rotation(T[:3, :3])


def invert(T: np.ndarray) -> np.ndarray:
    """Inverse of a rigid (4, 4) transform."""
    R = T[:3, :3]
    out = np.eye(4)
    out[:3, :3] = R.T
    out[:3, 3] = -R.T @ T[:3, 3]
    return out


def is_rigid(T: np.ndarray, tol: float = 1e-6) -> bool:
    """True if ``T`` is a finite (4, 4) rigid transform: rotation orthonormal (every entry of ``R^T R - I``
    within ``tol``) with determinant +1 (within ``tol``), bottom row (0, 0, 0, 1) (each entry within ``tol``)."""
    T = np.asarray(T)
    if T.shape != (4, 4):
        return False
    return rows_rigid(T.tolist(), tol)


def rows_rigid(rows: list, tol: float) -> bool:
    """:func:`is_rigid` of a (4, 4) transform given as nested lists of floats (``T.tolist()``).

    Plain float arithmetic: for one small matrix it avoids the per-call cost of numpy reductions.
    """
    (a, b, c, tx), (d, e, f, ty), (g, h, i, tz), (p, q, r, s) = rows
    if not math.isfinite(a + b + c + d + e + f + g + h + i + tx + ty + tz + p + q + r + s):
        return False  # NaN or infinity somewhere (a sum of finite floats that overflows is not rigid either)
    # R^T R - I entry by entry (columns (a, d, g), (b, e, h), (c, f, i)), then det R and the bottom row
    det = a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)
    return (abs(a * a + d * d + g * g - 1.0) <= tol and abs(b * b + e * e + h * h - 1.0) <= tol
            and abs(c * c + f * f + i * i - 1.0) <= tol and abs(a * b + d * e + g * h) <= tol
            and abs(a * c + d * f + g * i) <= tol and abs(b * c + e * f + h * i) <= tol
            and abs(det - 1.0) <= tol and abs(p) <= tol and abs(q) <= tol and abs(r) <= tol and abs(s - 1.0) <= tol)


_EYE3 = np.eye(3)
_BOTTOM = np.array([0.0, 0.0, 0.0, 1.0])


def rotation_angle(R_a: np.ndarray, R_b: np.ndarray) -> float:
    """Angle [rad] of the rotation taking ``R_a`` to ``R_b`` (0..pi)."""
    c = (np.trace(R_a.T @ R_b) - 1.0) / 2.0
    return float(np.arccos(np.clip(c, -1.0, 1.0)))


class PoseError(NamedTuple):
    """Distance between two poses."""

    position: float  # [m]
    orientation: float  # [rad]


def pose_error(T_a: np.ndarray, T_b: np.ndarray) -> PoseError:
    """Position [m] and orientation [rad] distance between two (4, 4) poses."""
    return PoseError(
        float(np.linalg.norm(T_a[:3, 3] - T_b[:3, 3])), rotation_angle(T_a[:3, :3], T_b[:3, :3])
    )


class Similarity(NamedTuple):
    """``x -> scale * rotation @ x + translation``."""

    rotation: np.ndarray  # (3, 3)
    translation: np.ndarray  # (3,) [m]
    scale: float  # [-]

    def apply(self, points: np.ndarray) -> np.ndarray:
        """Map (3,) or (N, 3) points."""
        return self.scale * np.asarray(points) @ self.rotation.T + self.translation


def fit_similarity(source: np.ndarray, target: np.ndarray, *, with_scale: bool = True) -> Similarity:
    """Least-squares similarity taking ``source`` points onto ``target`` (Umeyama 1991).

    Args:
        source, target: (N, 3) corresponding points, N >= 3, not collinear.
        with_scale: fit a uniform scale (else scale = 1).

    Raises ValueError when the points are too few or (nearly) collinear, since
    the rotation about their line is then undetermined.
    """
    src = np.asarray(source, dtype=float)
    dst = np.asarray(target, dtype=float)
    if src.shape != dst.shape or src.ndim != 2 or src.shape[1] != 3 or src.shape[0] < 3:
        raise ValueError("need two (N, 3) arrays of corresponding points with N >= 3")
    mu_s, mu_d = src.mean(0), dst.mean(0)
    xs, xd = src - mu_s, dst - mu_d
    var_s = float((xs**2).sum() / len(src))
    cov = xd.T @ xs / len(src)
    U, S, Vt = np.linalg.svd(cov)
    sv_src = np.linalg.svd(xs, compute_uv=False)
    if var_s < 1e-12 or sv_src[1] < 1e-3 * sv_src[0]:
        raise ValueError("points are (nearly) collinear: the rotation about their line is undetermined")
    D = np.eye(3)
    if np.linalg.det(U) * np.linalg.det(Vt) < 0:
        D[2, 2] = -1.0
    R = U @ D @ Vt
    scale = float(np.trace(np.diag(S) @ D) / var_s) if with_scale else 1.0
    t = mu_d - scale * R @ mu_s
    return Similarity(R, t, scale)
