"""Transform -> Pose conversion used for the robot markers."""

from __future__ import annotations

import numpy as np
import pinocchio as pin

from rynn_teleop.core.robot_geometry import RobotGeometry
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.nodes.conversions import matrices_to_poses


def test_poses_round_trip_the_geometry_transforms():
    robot = RobotModel.default()
    rng = np.random.default_rng(5)
    mats = RobotGeometry(robot).poses(rng.uniform(robot.limits.lower, robot.limits.upper))
    existing = matrices_to_poses(mats[:3])
    assert matrices_to_poses(mats[:3], existing) is existing  # filled in place
    for t, pose in zip(mats, matrices_to_poses(mats)):
        q = pose.orientation
        rot = pin.Quaternion(q.w, q.x, q.y, q.z).toRotationMatrix()  # independent quaternion -> matrix
        np.testing.assert_allclose(rot, t[:3, :3], atol=1e-9)
        np.testing.assert_allclose([pose.position.x, pose.position.y, pose.position.z], t[:3, 3], atol=1e-12)
