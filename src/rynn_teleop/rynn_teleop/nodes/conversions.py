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

