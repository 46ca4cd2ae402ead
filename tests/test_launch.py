"""Launch files: declarative, arguments described; loaded by launch_ros where it exists."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

LAUNCH_DIR = Path(__file__).resolve().parents[1] / "launch"
FILES = sorted(LAUNCH_DIR.glob("*.launch.py"))


def test_there_are_launch_files():
    assert FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_argument_has_a_description(path):
    tree = ast.parse(path.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "DeclareLaunchArgument"]
    assert calls, f"{path.name} declares no arguments"
    for call in calls:
        keywords = {k.arg for k in call.keywords}
        assert "description" in keywords and "default_value" in keywords, ast.unparse(call)
    # declarative: no imperative control flow in the file
    assert not any(isinstance(n, (ast.If, ast.For, ast.While)) for n in ast.walk(tree)), path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_launch_description_loads(path):
    pytest.importorskip("launch")
    pytest.importorskip("launch_ros", reason="launch_ros is not on PyPI; install ROS 2 to run this test")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    from launch.actions import DeclareLaunchArgument

    args = [e for e in description.entities if isinstance(e, DeclareLaunchArgument)]
    assert all(a.description for a in args)


# --- bringup.launch.py mirrors rynn_teleop.bringup (read from the file's syntax: no launch_ros needed) ---

BRINGUP = LAUNCH_DIR / "bringup.launch.py"
#: other packages' nodes the bringup may start besides ours
OTHER_EXECUTABLES = {"rviz2", "robot_state_publisher", "static_transform_publisher"}


def _tree():
    return ast.parse(BRINGUP.read_text())


def _constant(name):
    """A module-level literal of bringup.launch.py (its mode tables)."""
    for node in _tree().body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"bringup.launch.py has no module-level {name}")


def _calls(name):
    return [n for n in ast.walk(_tree()) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == name]


def _keywords(call):
    return {k.arg: k.value for k in call.keywords}


def _our_nodes():
    """executable -> keywords of each Node(package=PKG, ...), in file order."""
    out = {}
    for call in _calls("Node"):
        kw = _keywords(call)
        if isinstance(kw["package"], ast.Name) and kw["package"].id == "PKG":
            name = ast.literal_eval(kw["executable"])
            assert name not in out, f"{name} started twice"
            out[name] = kw
    return out


def _arguments():
    """name -> keywords of each DeclareLaunchArgument."""
    return {ast.literal_eval(c.args[0]): _keywords(c) for c in _calls("DeclareLaunchArgument")}


def test_bringup_starts_exactly_the_mode_nodes_in_order():
    from rynn_teleop import bringup

    assert tuple(_our_nodes()) == bringup.mode_nodes(record=True, console=True, foxglove=True)
    others = {ast.literal_eval(_keywords(c)["executable"]) for c in _calls("Node")} - set(_our_nodes())
    assert others <= OTHER_EXECUTABLES
    nodes = _our_nodes()
    # the recorder only with record:=true; our robot_description only without robot_state_publisher
    assert ast.unparse(nodes["recorder"]["condition"]) == "IfCondition(LaunchConfiguration('record'))"
    for optional in ("console", "foxglove"):
        assert ast.unparse(nodes[optional]["condition"]) == f"IfCondition(LaunchConfiguration('{optional}'))"
    assert ast.unparse(nodes["robot_description"]["condition"]) == (
        "UnlessCondition(LaunchConfiguration('robot_state_publisher'))"
    )
    always = [n for n in bringup.NODES if n != "robot_description"]
    assert all("condition" not in nodes[n] for n in always)


def test_bringup_hardware_nodes_never_respawn_the_others_do():
    from rynn_teleop import bringup

    for name, kw in _our_nodes().items():
        respawn = ast.literal_eval(kw["respawn"]) if "respawn" in kw else False
        assert respawn is (name not in bringup.HARDWARE_NODES), name
        assert not respawn or ast.literal_eval(kw["respawn_delay"]) == 2.0, name


def test_bringup_parameters_come_from_the_share_config():
    for name, kw in _our_nodes().items():
        params = kw["parameters"]
        assert isinstance(params, ast.List)
        assert ast.unparse(params.elts[0]) == f"_config({name!r})", name


@pytest.mark.parametrize("mode", ["digital", "real"])
@pytest.mark.parametrize("camera", [None, "generated", "real"])
def test_bringup_tables_equal_the_mode_table(mode, camera):
    """MODE_BACKENDS / SWITCH_SOURCE / DEFAULT_CAMERA give what bringup.mode_overrides gives."""
    from rynn_teleop import bringup

    backends, switch, default_camera = _constant("MODE_BACKENDS"), _constant("SWITCH_SOURCE"), _constant("DEFAULT_CAMERA")
    launched = {node: dict(values) for node, values in backends[mode].items()}
    # the launch file's camera expression: SWITCH_SOURCE[camera or DEFAULT_CAMERA[mode]]
    launched["camera_switch"] = {"active_source": switch[camera or default_camera[mode]]}
    assert launched == bringup.mode_overrides(mode, camera=camera)


def test_bringup_overrides_are_wired_to_the_right_keys():
    """Each node gets exactly the keys bringup.mode_overrides sets, from the mode table or its argument."""
    from rynn_teleop import bringup

    expected = {
        **{node: {key: f"_mode_value({node!r}, {key!r})" for key in values}
           for node, values in _constant("MODE_BACKENDS")["digital"].items()},
        "camera_switch": {"active_source": "active_source"},
        "tracker": {"source": "LaunchConfiguration('tracker_source')"},
        "arm_ik": {"auto_calibrate": "SYNTHETIC_OPERATOR", "auto_engage": "SYNTHETIC_OPERATOR"},
        "hand_retarget": {"source": "LaunchConfiguration('glove_source')"},
        "world_model": {"backend": "LaunchConfiguration('world_model_backend')"},
    }
    full = bringup.mode_overrides("real", camera="real", tracker_source="x", glove_source="y", world_model_backend="z")
    assert {n: set(v) for n, v in expected.items()} == {n: set(v) for n, v in full.items()}
    assert _constant("MODE_BACKENDS")["digital"].keys() == _constant("MODE_BACKENDS")["real"].keys()
    wired = {}
    for name, kw in _our_nodes().items():
        for entry in kw["parameters"].elts[1:]:
            assert isinstance(entry, ast.Dict), ast.unparse(entry)
            wired[name] = {ast.literal_eval(k): ast.unparse(v) for k, v in zip(entry.keys, entry.values)}
    assert wired == expected
    # the camera expression is the one test_bringup_tables_equal_the_mode_table models
    # and _mode_value(node, key) is MODE_BACKENDS[mode][node][key]
    expressions = {ast.unparse(c) for c in _calls("PythonExpression")}
    for expression in (
        """PythonExpression([repr(SWITCH_SOURCE), "['", CAMERA, "' or ", repr(DEFAULT_CAMERA), "['", MODE, "']]"])""",
        """PythonExpression([repr(MODE_BACKENDS), "['", MODE, "']['" + node + "']['" + key + "']"])""",
        """PythonExpression(["'", LaunchConfiguration('tracker_source'), "' == 'synthetic'"])""",
    ):
        assert ast.unparse(ast.parse(expression)) in expressions, expression


def test_bringup_arguments_and_their_choices():
    from rynn_teleop import bringup
    from rynn_teleop.nodes import node_class

    args = _arguments()
    assert set(args) == {"mode", "camera", "record", "console", "foxglove", "tracker_source", "glove_source", "world_model_backend",
                         "rviz", "robot_state_publisher"}
    for name, kw in args.items():
        assert ast.literal_eval(kw["description"]), name
    choices = {name: tuple(ast.literal_eval(kw["choices"])) for name, kw in args.items() if "choices" in kw}
    assert choices["mode"] == bringup.MODES
    assert choices["camera"] == ("",) + bringup.CAMERAS  # "": by mode
    for arg, node, key in [("tracker_source", "tracker", "source"), ("glove_source", "hand_retarget", "source"),
                           ("world_model_backend", "world_model", "backend")]:
        assert set(choices[arg]) == set(node_class(node).SCHEMA.params[key].choices), arg
    # every mode's backend is a value its node accepts
    for nodes in _constant("MODE_BACKENDS").values():
        for node, values in nodes.items():
            node_class(node).SCHEMA.validate(values)
    # a plain launch needs no hardware
    defaults = {name: ast.literal_eval(kw["default_value"]) for name, kw in args.items()}
    assert defaults["mode"] == "digital" and defaults["tracker_source"] == defaults["glove_source"] == "synthetic"
    assert defaults["record"] == defaults["rviz"] == defaults["console"] == defaults["foxglove"] == "false"


def test_rviz_config_is_installed_and_shows_robot_camera_and_trackers():
    import yaml

    from rynn_teleop.paths import share_dir

    assert 'PathJoinSubstitution([FindPackageShare(PKG), "config", "rynn_teleop.rviz"])' in BRINGUP.read_text()
    config = yaml.safe_load((share_dir() / "config" / "rynn_teleop.rviz").read_text())
    displays = config["Visualization Manager"]["Displays"]
    flat = displays + [d for g in displays for d in g.get("Displays", [])]
    topics = {d["Class"]: set() for d in flat}
    for d in flat:
        topic = d.get("Topic") or d.get("Description Topic")
        if topic:
            topics[d["Class"]].add(topic["Value"])
    assert topics["rviz_default_plugins/RobotModel"] == {"/robot_description"}
    assert topics["rviz_default_plugins/Image"] == {"/head_camera/color/image_raw"}
    assert topics["rviz_default_plugins/PoseArray"] == {"/operator/trackers"}
    assert config["Visualization Manager"]["Global Options"]["Fixed Frame"] == "base_link"


def test_foxglove_layout_is_installed_and_uses_only_topics_the_stack_publishes():
    import json

    from rynn_teleop.nodes.recorder import DEFAULT_TOPICS
    from rynn_teleop.paths import share_dir

    layout = json.loads((share_dir() / "config" / "rynn_teleop.foxglove.json").read_text())

    def leaves(node):
        return [node] if isinstance(node, str) else leaves(node["first"]) + leaves(node["second"])

    panels = layout["configById"]
    assert sorted(leaves(layout["layout"])) == sorted(panels)  # every panel placed once, none missing
    published = set(DEFAULT_TOPICS) | {"/robot_markers", "/head_camera/generated/color/image_raw",
                                       "/head_camera/generated/color/camera_info"}
    used = set()
    for panel_id, config in panels.items():
        kind = panel_id.split("!")[0]
        if kind == "Image":
            used |= {config["imageMode"]["imageTopic"], config["imageMode"]["calibrationTopic"]}
        elif kind == "3D":
            assert config["followTf"] == "base_link"
            used |= set(config["topics"])
        elif kind == "Plot":
            used |= {p["value"].split(".", 1)[0] for p in config["paths"]}
        elif kind == "RawMessages":
            used.add(config["topicPath"])
        elif kind == "DiagnosticSummary":
            used.add(config["topicToRender"])
        else:
            raise AssertionError(f"unexpected panel {panel_id}")
    assert used <= published, used - published
    assert {"/head_camera/color/image_raw", "/head_camera/active_source", "/robot_markers"} <= used


# --- with upstream launch / launch_ros: the substitutions resolve as the mode table says ---


@pytest.mark.parametrize("mode", ["digital", "real"])
@pytest.mark.parametrize("camera", ["", "generated", "real"])
@pytest.mark.parametrize("record", ["true", "false"])
def test_bringup_resolves_per_mode(mode, camera, record):
    pytest.importorskip("launch")
    pytest.importorskip("launch_ros", reason="launch_ros is not on PyPI; install ROS 2 to run this test")
    from launch import LaunchContext
    from launch.actions import DeclareLaunchArgument
    from launch_ros.actions import Node
    from launch_ros.utilities import evaluate_parameters

    from rynn_teleop import bringup

    spec = importlib.util.spec_from_file_location("bringup_launch", BRINGUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    context = LaunchContext()
    given = {"mode": mode, "camera": camera, "record": record, "robot_state_publisher": "false",
             "tracker_source": "openvr", "glove_source": "manus", "world_model_backend": "diffusion"}
    context.launch_configurations.update(given)
    for action in description.entities:
        if isinstance(action, DeclareLaunchArgument):
            action.execute(context)  # checks choices, fills in defaults
    started, overrides = [], {}
    for action in description.entities:
        if isinstance(action, Node) and action.node_package == "rynn_teleop":
            if action.condition is None or action.condition.evaluate(context):
                started.append(action.node_executable)
            # parameter files are found through the ament index; evaluate only the inline values
            params = [p for p in action._Node__parameters if isinstance(p, dict)]  # private: no public accessor
            values = {k: v for d in evaluate_parameters(context, params) for k, v in d.items()}
            if values:
                overrides[action.node_executable] = values
    assert tuple(started) == bringup.mode_nodes(record=record == "true")
    assert overrides == bringup.mode_overrides(mode, camera=camera or None, tracker_source="openvr",
                                               glove_source="manus", world_model_backend="diffusion")
