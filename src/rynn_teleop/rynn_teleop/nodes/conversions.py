"""Message <-> numpy conversions shared by the nodes."""

from __future__ import annotations

import numpy as np
from geometry_msgs.msg import Pose
from scipy.spatial.transform import Rotation

from ..core.image import DEPTH_ENCODINGS, decode_image
from ..core.transforms import quat_from_rotation, rotation_from_quat


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
    x, y, z, w = quat_from_rotation(T[:3, :3]).tolist()
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
    T[:3, :3] = rotation_from_quat(quat / n)
    T[:3, 3] = pos
    return T


def stamp_to_seconds(stamp) -> float:
    """``builtin_interfaces/Time`` -> seconds."""
    return stamp.sec + stamp.nanosec * 1e-9


# Images: written by hand (cv_bridge is not available from PyPI; a few lines). Image.data is filled from
# bytes in one assignment: assigning a numpy array converts it element by element, far slower.
def image_message(array: np.ndarray, encoding: str, stamp, frame_id: str):
    """(H, W, 3) uint8 ("rgb8") or (H, W) uint16 ("16UC1") array -> ``sensor_msgs/Image``."""
    from sensor_msgs.msg import Image

    a = np.ascontiguousarray(array)
    msg = Image(height=int(a.shape[0]), width=int(a.shape[1]), encoding=encoding, is_bigendian=0,
                step=int(a.strides[0]))
    msg.data = a.tobytes()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    return msg


def image_array(msg) -> np.ndarray:
    """``sensor_msgs/Image`` -> numpy, a view of the message's data where it can be (``core.image.decode_image``
    with ``copy=False``): (H, W, 3) uint8 RGB for colour, (H, W) uint16 [mm] for depth encodings."""
    return decode_image(msg, depth=str(msg.encoding) in DEPTH_ENCODINGS, copy=False)


def camera_info_message(intrinsics, stamp, frame_id: str):
    """``core.camera.CameraIntrinsics`` -> ``sensor_msgs/CameraInfo``."""
    from sensor_msgs.msg import CameraInfo

    msg = CameraInfo(height=int(intrinsics.height), width=int(intrinsics.width),
                     distortion_model=intrinsics.distortion_model)
    msg.d = [float(c) for c in intrinsics.coeffs]
    msg.k = intrinsics.K().ravel().tolist()
    msg.r = np.eye(3).ravel().tolist()
    msg.p = intrinsics.P().ravel().tolist()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    return msg
