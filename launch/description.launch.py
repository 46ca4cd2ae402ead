"""Robot description bringup: the 54-joint model, its state and RViz markers.

    ros2 launch rynn_teleop description.launch.py [robot_state_publisher:=true]
        [sweep:=false] [markers:=true] [rviz:=false]

- robot_state_publisher (when the lab has it) publishes /tf from /joint_states
  and the URDF on /robot_description; otherwise our robot_description node
  publishes the URDF (latched) and robot_markers draws the robot without tf.
- sweep:=true moves every joint through a limit-respecting test pattern
  (never together with real drivers: both publish /joint_states).
Every argument is true or false (launch refuses anything else before a node starts). Parameters come from
config/<node>.yaml in the package share directory, each read and checked before any node starts.
robot_description and robot_markers are started again ``bringup.RESPAWN_DELAY_S`` after they exit, unless
they refused to start (exit code 2: a bad parameter).
"""

from functools import partial
from pathlib import Path

from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction, TimerAction
from launch.conditions import IfCondition, UnlessCondition
from launch.launch_description import LaunchDescription
from launch.substitutions import Command, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from rynn_teleop import bringup
from rynn_teleop.errors import REFUSED_EXIT_CODE

PKG = "rynn_teleop"


def _config(name):
    return PathJoinSubstitution([FindPackageShare(PKG), "config", name + ".yaml"])


def _switch(name, default, description):
    return DeclareLaunchArgument(name, default_value=default, choices=list(bringup.SWITCH), description=description)


def _node(name, condition=None):
    """Our node ``name``; a respawning one (bringup table) is started again by :func:`_restart` when it exits."""
    respawn = name in {spec.name for spec in bringup.NODES if spec.respawn}
    return Node(package=PKG, executable=name, parameters=[_config(name)], condition=condition,
                on_exit=partial(_restart, name) if respawn else None)


def _check_config_files(nodes, context):
    """Read and validate the parameter file of every node this launch starts (a bad one stops it, named)."""
    from rynn_teleop.nodes import node_class  # imports rclpy

    config = Path(FindPackageShare(PKG).perform(context)) / "config"
    for node in nodes:
        if node.condition.evaluate(context):
            node_class(node.node_executable).SCHEMA.load_yaml(config / f"{node.node_executable}.yaml")


def _restart(name, event, context):
    """The same node again after RESPAWN_DELAY_S, unless the launch is ending or it refused to start."""
    if context.is_shutdown:
        return None
    if event.returncode == REFUSED_EXIT_CODE:
        return [LogInfo(msg=f"{name} refused to start (exit code {event.returncode}, reason above): "
                            "not restarted; fix it and launch again")]
    return [TimerAction(period=bringup.RESPAWN_DELAY_S, actions=[_node(name)])]


def generate_launch_description():
    urdf_file = PathJoinSubstitution([FindPackageShare(PKG), "urdf", "rynn_m6_wuji.urdf"])
    rsp = bringup.argument("robot_state_publisher")
    ours = [
        _node("robot_description", UnlessCondition(LaunchConfiguration("robot_state_publisher"))),
        _node("joint_sweep", IfCondition(LaunchConfiguration("sweep"))),
        _node("robot_markers", IfCondition(LaunchConfiguration("markers"))),
    ]
    return LaunchDescription(
        [
            _switch(rsp.name, rsp.default, rsp.description),
            _switch("sweep", "false", "publish the joint test pattern on /joint_states"),
            _switch("markers", "true", "publish the robot geometry as a MarkerArray"),
            _switch("rviz", "false", "start RViz"),
            OpaqueFunction(function=partial(_check_config_files, ours)),
            # Other packages' nodes first: if one is missing, launch aborts before ours start.
            Node(package="rviz2", executable="rviz2", condition=IfCondition(LaunchConfiguration("rviz"))),
            Node(
                package="robot_state_publisher",
                executable="robot_state_publisher",
                parameters=[{"robot_description": ParameterValue(Command(["cat ", urdf_file]), value_type=str)}],
                condition=IfCondition(LaunchConfiguration("robot_state_publisher")),
            ),
            *ours,
        ]
    )
