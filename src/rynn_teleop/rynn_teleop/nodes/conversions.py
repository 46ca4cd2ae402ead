"""Message <-> numpy conversions shared by the nodes."""

from __future__ import annotations

import numpy as np
from geometry_msgs.msg import Pose
from scipy.spatial.transform import Rotation


def matrices_to_poses(ts: np.ndarray, out: list[Pose] | None = None) -> list[Pose]:
    """(N, 4, 4) transforms -> N poses (one vectorised rotation conversion).

    If ``out`` is given its Pose objects are filled in place and returned.
    """
    quats = Rotation.from_matrix(ts[:, :3, :3]).as_quat().tolist()
    positions = ts[:, :3, 3].tolist()
    poses = out if out is not None else [Pose() for _ in range(len(ts))]
    for pose, (px, py, pz), (x, y, z, w) in zip(poses, positions, quats):
        pose.position.x, pose.position.y, pose.position.z = px, py, pz
        pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w = x, y, z, w
    return poses



def matrix_to_pose(T: np.ndarray, pose: Pose | None = None) -> Pose:
    """(4, 4) transform -> ``geometry_msgs/Pose`` (filled in place if given)."""
    pose = pose if pose is not None else Pose()
    x, y, z, w = Rotation.from_matrix(T[:3, :3]).as_quat().tolist()
    pose.position.x, pose.position.y, pose.position.z = (float(v) for v in T[:3, 3])
    pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w = x, y, z, w
    return pose


def pose_to_matrix(pose: Pose) -> np.ndarray:
    """``geometry_msgs/Pose`` -> (4, 4); all-NaN when the pose is not finite or its quaternion is zero.

    Callers reject NaN matrices (and count them) instead of catching exceptions.
    """
    p, q = pose.position, pose.orientation
    quat = np.array([q.x, q.y, q.z, q.w])
    pos = np.array([p.x, p.y, p.z])
    n = float(np.linalg.norm(quat))
    if not (np.all(np.isfinite(quat)) and np.all(np.isfinite(pos))) or n < 1e-9:
        return np.full((4, 4), np.nan)
    T = np.eye(4)
    T[:3, :3] = Rotation.from_quat(quat / n).as_matrix()
    T[:3, 3] = pos
    return T


def stamp_to_seconds(stamp) -> float:
    """``builtin_interfaces/Time`` -> seconds."""
    return stamp.sec + stamp.nanosec * 1e-9
