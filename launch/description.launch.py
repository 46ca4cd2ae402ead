"""Robot description bringup: the 54-joint model, its state and RViz markers.

    ros2 launch rynn_teleop description.launch.py [robot_state_publisher:=true]
        [sweep:=false] [markers:=true] [rviz:=false]

- robot_state_publisher (when the lab has it) publishes /tf from /joint_states
  and the URDF on /robot_description; otherwise our robot_description node
  publishes the URDF (latched) and robot_markers draws the robot without tf.
- sweep:=true moves every joint through a limit-respecting test pattern
  (never together with real drivers: both publish /joint_states).
Parameters come from config/<node>.yaml in the package share directory.
Non-hardware nodes respawn after 2 s (a node refusing a bad parameter file
therefore retries every 2 s and prints its reason each time; Humble's
launch_ros has no respawn_max_retries).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import Command, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

PKG = "rynn_teleop"


def _config(name):
    return PathJoinSubstitution([FindPackageShare(PKG), "config", name + ".yaml"])


def generate_launch_description():
    urdf_file = PathJoinSubstitution([FindPackageShare(PKG), "urdf", "rynn_m6_wuji.urdf"])
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "robot_state_publisher", default_value="true",
                description="use robot_state_publisher (tf + /robot_description); false: our robot_description node",
            ),
            DeclareLaunchArgument("sweep", default_value="false", description="publish the joint test pattern on /joint_states"),
            DeclareLaunchArgument("markers", default_value="true", description="publish the robot geometry as a MarkerArray"),
            DeclareLaunchArgument("rviz", default_value="false", description="start RViz"),
            # Other packages' nodes first: if one is missing, launch aborts before ours start.
            Node(package="rviz2", executable="rviz2", condition=IfCondition(LaunchConfiguration("rviz"))),
            Node(
                package="robot_state_publisher",
                executable="robot_state_publisher",
                parameters=[{"robot_description": ParameterValue(Command(["cat ", urdf_file]), value_type=str)}],
                condition=IfCondition(LaunchConfiguration("robot_state_publisher")),
            ),
            Node(
                package=PKG, executable="robot_description", parameters=[_config("robot_description")],
                condition=UnlessCondition(LaunchConfiguration("robot_state_publisher")),
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="joint_sweep", parameters=[_config("joint_sweep")],
                condition=IfCondition(LaunchConfiguration("sweep")),
            ),
            Node(
                package=PKG, executable="robot_markers", parameters=[_config("robot_markers")],
                condition=IfCondition(LaunchConfiguration("markers")),
                respawn=True, respawn_delay=2.0,
            ),
        ]
    )
