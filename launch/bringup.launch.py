"""The whole teleoperation stack, real or digital.

    ros2 launch rynn_teleop bringup.launch.py [mode:=digital|real] [camera:=generated|real]
        [record:=false] [console:=false] [foxglove:=false] [tracker_source:=synthetic] [glove_source:=synthetic]
        [world_model_backend:=render] [rviz:=false] [robot_state_publisher:=true]

- mode:=digital (default): simulated arm and hand drivers, synthetic physical
  camera, world model, feed switch on the generated stream.
  mode:=real: Marvin arms, Wuji hands, RealSense camera, feed switch on the
  physical stream (the world model still runs as a preview).
- camera: the feed the switch shows first; empty (default) = by mode
  (digital -> generated, real -> real). Toggle later with the switch's services.
- Operator input is separate from the mode. The defaults (synthetic tracker and
  glove) need no hardware, so a plain `ros2 launch rynn_teleop bringup.launch.py`
  runs anywhere (arm_ik then calibrates and engages on the synthetic operator by
  itself); a lab passes tracker_source:=openvr glove_source:=manus.
- record:=true adds the recorder; episodes start and stop by its services
  (config/recorder.yaml: auto_start false, output_dir).
- console:=true adds the operator console (a web page with the feeds, the
  state and every operator control; config/console.yaml).
- foxglove:=true adds this package's Foxglove WebSocket server (the shipped
  Foxglove layout without foxglove_bridge; config/foxglove.yaml).

The same nodes and backends as `rynn-teleop run --mode` (rynn_teleop.bringup;
tests/test_launch.py keeps MODE_BACKENDS, SWITCH_SOURCE and DEFAULT_CAMERA
equal to it). Every other parameter comes from config/<node>.yaml in the
package share directory; the launch arguments and the mode override only the
keys named here (the drivers' `backend`, head_camera `source`, camera_switch
`active_source`, tracker and hand_retarget `source`, world_model `backend`,
arm_ik `auto_calibrate`/`auto_engage`).
Non-hardware nodes respawn after 2 s; the hardware nodes (arm_driver,
hand_driver, head_camera) do not, so a device error stays visible.
Processes get config/fastdds_profile.xml (images over shared memory) unless
FASTDDS_DEFAULT_PROFILES_FILE is already set (labs with several machines set
their own).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import (
    Command,
    EnvironmentVariable,
    LaunchConfiguration,
    PathJoinSubstitution,
    PythonExpression,
)
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

PKG = "rynn_teleop"

#: each mode's backends (the same table as rynn_teleop.bringup)
MODE_BACKENDS = {
    "digital": {
        "arm_driver": {"backend": "sim"},
        "hand_driver": {"backend": "sim"},
        "head_camera": {"source": "synthetic"},
    },
    "real": {
        "arm_driver": {"backend": "marvin"},
        "hand_driver": {"backend": "wuji"},
        "head_camera": {"source": "realsense"},
    },
}
#: camera argument -> camera_switch active_source
SWITCH_SOURCE = {"generated": "generated", "real": "physical"}
#: camera shown first when the camera argument is empty
DEFAULT_CAMERA = {"digital": "generated", "real": "real"}

MODE = LaunchConfiguration("mode")
CAMERA = LaunchConfiguration("camera")
#: a synthetic operator cannot call ~/calibrate: arm_ik calibrates and engages on its posture by itself
SYNTHETIC_OPERATOR = PythonExpression(["'", LaunchConfiguration("tracker_source"), "' == 'synthetic'"])


def _config(name):
    return PathJoinSubstitution([FindPackageShare(PKG), "config", name + ".yaml"])


def _mode_value(node, key):
    """MODE_BACKENDS[mode][node][key], chosen when the launch runs."""
    return PythonExpression([repr(MODE_BACKENDS), "['", MODE, "']['" + node + "']['" + key + "']"])


def generate_launch_description():
    urdf_file = PathJoinSubstitution([FindPackageShare(PKG), "urdf", "rynn_m6_wuji.urdf"])
    rviz_config = PathJoinSubstitution([FindPackageShare(PKG), "config", "rynn_teleop.rviz"])
    fastdds_profile = PathJoinSubstitution([FindPackageShare(PKG), "config", "fastdds_profile.xml"])
    # the camera argument, or the mode's default when it is empty -> the switch's source name
    active_source = PythonExpression(
        [repr(SWITCH_SOURCE), "['", CAMERA, "' or ", repr(DEFAULT_CAMERA), "['", MODE, "']]"]
    )
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "mode", default_value="digital", choices=["digital", "real"],
                description="digital: sim drivers, synthetic camera, world model feed; "
                "real: Marvin arms, Wuji hands, RealSense camera",
            ),
            DeclareLaunchArgument(
                "camera", default_value="", choices=["", "generated", "real"],
                description="feed shown first: generated (world model) or real (physical camera); "
                "empty: by mode (digital -> generated, real -> real)",
            ),
            DeclareLaunchArgument(
                "record", default_value="false",
                description="start the recorder (episodes start and stop by its services)",
            ),
            DeclareLaunchArgument(
                "console", default_value="false",
                description="start the operator console: a web page (config/console.yaml: host, port; default "
                "http://127.0.0.1:8080/) with the camera feeds, state and every operator control",
            ),
            DeclareLaunchArgument(
                "foxglove", default_value="false",
                description="serve the topics to the Foxglove app with this package's foxglove node "
                "(config/foxglove.yaml; ws://127.0.0.1:8765), e.g. where foxglove_bridge is not installed",
            ),
            DeclareLaunchArgument(
                "tracker_source", default_value="synthetic", choices=["synthetic", "replay", "openvr"],
                description="tracker input: synthetic (no hardware), replay (replay.path in "
                "config/tracker.yaml) or openvr (Vive trackers through SteamVR)",
            ),
            DeclareLaunchArgument(
                "glove_source", default_value="synthetic", choices=["synthetic", "replay", "skeleton", "manus"],
                description="hand input of hand_retarget: synthetic (no hardware), replay, skeleton "
                "(PoseArray hand trackers) or manus (Manus gloves)",
            ),
            DeclareLaunchArgument(
                "world_model_backend", default_value="render", choices=["render", "diffusion"],
                description="world model: render (robot drawn over the reference frame) or diffusion "
                "(needs world_model.diffusion.checkpoint in config/world_model.yaml)",
            ),
            DeclareLaunchArgument(
                "rviz", default_value="false",
                description="start RViz (config/rynn_teleop.rviz: robot, camera feed, tracker poses)",
            ),
            DeclareLaunchArgument(
                "robot_state_publisher", default_value="true",
                description="use robot_state_publisher (tf + /robot_description); false: our robot_description node",
            ),
            SetEnvironmentVariable(
                "FASTDDS_DEFAULT_PROFILES_FILE",
                EnvironmentVariable("FASTDDS_DEFAULT_PROFILES_FILE", default_value=fastdds_profile),
            ),
            # Other packages' nodes first: if one is missing, launch aborts before ours start.
            Node(
                package="rviz2", executable="rviz2", arguments=["-d", rviz_config],
                condition=IfCondition(LaunchConfiguration("rviz")),
            ),
            # display only: the tracking world frames (synthetic operator, SteamVR) placed at the robot's
            # base, so RViz can show /operator/trackers next to the robot (not the calibrated mapping)
            *(Node(
                package="tf2_ros", executable="static_transform_publisher",
                arguments=["--frame-id", "base_link", "--child-frame-id", world],
                condition=IfCondition(LaunchConfiguration("rviz")),
            ) for world in ("synthetic_world", "vive_world")),
            Node(
                package="robot_state_publisher",
                executable="robot_state_publisher",
                parameters=[{"robot_description": ParameterValue(Command(["cat ", urdf_file]), value_type=str)}],
                condition=IfCondition(LaunchConfiguration("robot_state_publisher")),
            ),
            # bringup.NODES, in their start order
            Node(
                package=PKG, executable="robot_description", parameters=[_config("robot_description")],
                condition=UnlessCondition(LaunchConfiguration("robot_state_publisher")),
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="tracker",
                parameters=[_config("tracker"), {"source": LaunchConfiguration("tracker_source")}],
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="arm_ik",
                parameters=[_config("arm_ik"), {"auto_calibrate": SYNTHETIC_OPERATOR, "auto_engage": SYNTHETIC_OPERATOR}],
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="hand_retarget",
                parameters=[_config("hand_retarget"), {"source": LaunchConfiguration("glove_source")}],
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="arm_driver",
                parameters=[_config("arm_driver"), {"backend": _mode_value("arm_driver", "backend")}],
                respawn=False,
            ),
            Node(
                package=PKG, executable="hand_driver",
                parameters=[_config("hand_driver"), {"backend": _mode_value("hand_driver", "backend")}],
                respawn=False,
            ),
            Node(
                package=PKG, executable="head_camera",
                parameters=[_config("head_camera"), {"source": _mode_value("head_camera", "source")}],
                respawn=False,
            ),
            Node(
                package=PKG, executable="world_model",
                parameters=[_config("world_model"), {"backend": LaunchConfiguration("world_model_backend")}],
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="camera_switch",
                parameters=[_config("camera_switch"), {"active_source": active_source}],
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="robot_markers", parameters=[_config("robot_markers")],
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="recorder", parameters=[_config("recorder")],
                condition=IfCondition(LaunchConfiguration("record")),
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="console", parameters=[_config("console")],
                condition=IfCondition(LaunchConfiguration("console")),
                respawn=True, respawn_delay=2.0,
            ),
            Node(
                package=PKG, executable="foxglove", parameters=[_config("foxglove")],
                condition=IfCondition(LaunchConfiguration("foxglove")),
                respawn=True, respawn_delay=2.0,
            ),
        ]
    )
