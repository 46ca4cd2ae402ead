"""The whole teleoperation stack, real or digital, built from the bringup table (``rynn_teleop.bringup``).

    ros2 launch rynn_teleop bringup.launch.py [mode:=digital|real] [camera:=generated|physical]
        [record:=false] [console:=false] [foxglove:=false] [tracker_backend:=synthetic]
        [hand_retarget_backend:=synthetic] [world_model_backend:=render] [policy:=PATH] [policy_backend:=lerobot]
        [lifecycle:=active|inactive|unconfigured] [rviz:=false] [robot_state_publisher:=true]

``ros2 launch rynn_teleop bringup.launch.py --show-args`` lists every argument with its choices (a backend
argument's are the node's registered backends); a value outside them stops the launch before any node starts,
and so does a former argument name (tracker_source, glove_source), naming the new one. The nodes, their
optional arguments and per-mode backends are the same as ``rynn-teleop run --mode``. Every other parameter
comes from config/<node>.yaml in the package share directory; each is read and checked before any node starts.
``policy:=PATH`` runs the policy node (``policy_backend``'s policy at PATH, acting once started: ``rynn-teleop call
policy start``) instead of the operator input (tracker, arm_ik, hand_retarget); a PATH that does not exist stops the
launch before any node starts, as a bad choice does.
A node that exits is started again after ``bringup.RESPAWN_DELAY_S`` unless it talks to hardware (arm_driver,
hand_driver, head_camera: a device error stays visible) or it refused to start (exit code 2: a bad parameter
comes back the same at every restart).
The drivers are managed (lifecycle) nodes: they start unconfigured, and ``lifecycle_manager`` brings them to the
``lifecycle`` argument's state in the table's order (every one configured before any is activated), then exits;
when one fails (a device missing) it exits with code 2 naming the node and why, and the drivers stay up where
they were (``ros2 lifecycle set`` or ``rynn-teleop lifecycle active`` once fixed).
In the digital mode the twin and the drivers run as one process (``bringup.COMPOSED``: the drivers' sim backend
drives the twin's physics world, which lives in that process): ``rynn-teleop run twin arm_driver hand_driver
--mode digital --lifecycle unconfigured``, its nodes' parameters from the same config files; the lifecycle manager
brings its drivers up as any other.
Processes get config/fastdds_profile.xml unless FASTDDS_DEFAULT_PROFILES_FILE is already set.
"""

from functools import partial
from pathlib import Path

from launch.actions import (
    DeclareLaunchArgument,
    ExecuteProcess,
    LogInfo,
    OpaqueFunction,
    SetEnvironmentVariable,
    TimerAction,
)
from launch.conditions import IfCondition, UnlessCondition
from launch.launch_description import LaunchDescription
from launch.substitutions import (
    Command,
    EnvironmentVariable,
    LaunchConfiguration,
    PathJoinSubstitution,
    PythonExpression,
)
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackagePrefix, FindPackageShare

from rynn_teleop import bringup
from rynn_teleop.errors import REFUSED_EXIT_CODE

PKG = "rynn_teleop"
CONDITIONS = {"true": IfCondition, "false": UnlessCondition}  # NodeSpec.started_when -> its condition


def _share(*parts):
    return PathJoinSubstitution([FindPackageShare(PKG), *parts])


def _config(name):
    return _share("config", name + ".yaml")


def _lookup(table):
    """The table's value for the arguments given, chosen when the launch runs."""
    row = [part for name in table.arguments for part in ("'", LaunchConfiguration(name), "', ")]
    return PythonExpression([repr(table.values), "[(", *row, ")]"])


def _check_config_files(context):
    """Refuse former argument names; read and validate the parameter file of every node this launch starts (a
    bad one stops it, named)."""
    from rynn_teleop.nodes import node_class  # imports rclpy

    bringup.check_renamed(context.launch_configurations)
    bringup.check_policy(context.launch_configurations)
    config = Path(FindPackageShare(PKG).perform(context)) / "config"
    for name in bringup.started_nodes(context.launch_configurations):
        node_class(name).SCHEMA.load_yaml(config / f"{name}.yaml")


def _node(spec, overrides, condition=None):
    """``spec``'s Node action; a respawning one is started again by :func:`_restart` when it exits."""
    return Node(
        package=PKG, executable=spec.name, parameters=[_config(spec.name), overrides], condition=condition,
        on_exit=partial(_restart, spec, overrides) if spec.respawn else None,
    )


def _restart(spec, overrides, event, context):
    """After ``spec``'s process exited: the same node again after RESPAWN_DELAY_S, unless the launch is ending
    or the node refused to start (REFUSED_EXIT_CODE: its parameters are wrong, a restart would only repeat it)."""
    if context.is_shutdown:
        return None
    if event.returncode == REFUSED_EXIT_CODE:
        return [LogInfo(msg=f"{spec.name} refused to start (exit code {event.returncode}, reason above): "
                            "not restarted; fix it and launch again")]
    return [TimerAction(period=bringup.RESPAWN_DELAY_S, actions=[_node(spec, overrides)])]


def _in_modes(modes):
    """Started when the ``mode`` argument is one of ``modes``."""
    return IfCondition(PythonExpression(["'", LaunchConfiguration("mode"), f"' in {tuple(modes)!r}"]))


def _switch_test(spec):
    """A Python expression (substitution parts) true when ``spec``'s switch starts it: the argument's value (a
    path, quoted raw: bringup.check_policy refuses what this quoting cannot hold) equals ``started_when``, or for
    ``started_when`` None is not empty."""
    value = ["r'''", LaunchConfiguration(spec.switch), "'''"]
    return [*value, " != ''" if spec.started_when is None else f" == {spec.started_when!r}"]


def _our_node(spec, tables):
    """``spec``'s own process (None: it runs only inside a composed process)."""
    modes = bringup.separate_modes(spec.name)
    if not modes:
        return None
    overrides = {t.key: _lookup(t) for t in tables if t.node == spec.name}
    overrides.update({key: LaunchConfiguration(argument) for key, argument in spec.passed.items()})
    condition = None
    if spec.switch and spec.started_when in CONDITIONS:  # an on/off argument
        condition = CONDITIONS[spec.started_when](LaunchConfiguration(spec.switch))
    elif spec.switch:
        condition = IfCondition(PythonExpression(_switch_test(spec)))
    if modes != bringup.MODES:
        if spec.switch:  # both: one expression
            condition = IfCondition(PythonExpression(["'", LaunchConfiguration("mode"), f"' in {tuple(modes)!r} and ",
                                                      *_switch_test(spec)]))
        else:
            condition = _in_modes(modes)
    return _node(spec, overrides, condition)


def _composed(process):
    """One process running ``process.nodes`` (``rynn-teleop run``) in its mode; never restarted (drivers)."""
    executable = PathJoinSubstitution([FindPackagePrefix(PKG), "lib", PKG, "rynn-teleop"])
    return ExecuteProcess(cmd=[executable, *bringup.composed_arguments(process)], name="+".join(process.nodes),
                          output="screen", condition=_in_modes((process.mode,)))


def _other_node(other, extras):
    kwargs = {"arguments": list(other.arguments), **extras.get(other.executable, {})}
    return Node(package=other.package, executable=other.executable,
                condition=IfCondition(LaunchConfiguration(other.switch)), **kwargs)


def _lifecycle_manager():
    """The managed nodes brought to the ``lifecycle`` argument's state, in table order (nodes.lifecycle_manager)."""
    return Node(package=PKG, executable=bringup.LIFECYCLE_MANAGER,
                parameters=[{"node_names": list(bringup.MANAGED_NODES), "goal": LaunchConfiguration("lifecycle")}])


def generate_launch_description():
    urdf = ParameterValue(Command(["cat ", _share("urdf", "rynn_m6_wuji.urdf")]), value_type=str)
    extras = {  # what other packages' nodes get from this package's share directory
        "rviz2": {"arguments": ["-d", _share("config", "rynn_teleop.rviz")]},
        "robot_state_publisher": {"parameters": [{"robot_description": urdf}]},
    }
    tables = bringup.lookup_tables()
    return LaunchDescription([
        *(DeclareLaunchArgument(a.name, default_value=a.default, description=a.description,
                                **({"choices": list(a.choices)} if a.choices else {}))  # no choices: a path
          for a in bringup.ARGUMENTS),
        SetEnvironmentVariable(
            "FASTDDS_DEFAULT_PROFILES_FILE",
            EnvironmentVariable("FASTDDS_DEFAULT_PROFILES_FILE", default_value=_share("config", "fastdds_profile.xml")),
        ),
        OpaqueFunction(function=_check_config_files),
        *(_other_node(other, extras) for other in bringup.OTHER_NODES),
        *(node for node in (_our_node(spec, tables) for spec in bringup.NODES) if node is not None),
        *(_composed(process) for process in bringup.COMPOSED),
        _lifecycle_manager(),
    ])
