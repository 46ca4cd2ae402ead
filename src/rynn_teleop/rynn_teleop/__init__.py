"""rynn_teleop: ROS 2 teleoperation of a bimanual dexterous robot, real and digital."""

__version__ = "0.1.0"
