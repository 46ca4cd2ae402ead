"""Message <-> numpy conversions shared by the nodes."""

from __future__ import annotations

import numpy as np
from geometry_msgs.msg import Pose
from scipy.spatial.transform import Rotation


def matrix_to_pose(t: np.ndarray) -> Pose:
    """4x4 homogeneous transform -> geometry_msgs/Pose (quaternion x, y, z, w)."""
    return matrices_to_poses(t[None])[0]


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


def pose_to_matrix(pose: Pose) -> np.ndarray:
    """geometry_msgs/Pose -> 4x4 homogeneous transform."""
    t = np.eye(4)
    q = pose.orientation
    t[:3, :3] = Rotation.from_quat([q.x, q.y, q.z, q.w]).as_matrix()
    t[:3, 3] = (pose.position.x, pose.position.y, pose.position.z)
    return t
