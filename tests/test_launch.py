"""The bringup table (``rynn_teleop.bringup``) and the launch files built from it.

The table is tested as data. ``launch/bringup.launch.py`` is built twice: with stand-in ``launch`` /
``launch_ros`` modules that record each action (runs everywhere), and with upstream launch / launch_ros where
they are importable (a ROS install; not on PyPI), whose actions are executed against a launch context.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import sys
import types
from pathlib import Path

import pytest

from rynn_teleop import bringup
from rynn_teleop.errors import REFUSED_EXIT_CODE

LAUNCH_DIR = Path(__file__).resolve().parents[1] / "launch"
FILES = sorted(LAUNCH_DIR.glob("*.launch.py"))
BRINGUP = LAUNCH_DIR / "bringup.launch.py"
DESCRIPTION = LAUNCH_DIR / "description.launch.py"
#: the arguments that choose parameter values (the others are on/off switches, and the policy's path)
VALUE_ARGUMENTS = ("mode", "camera", "tracker_backend", "hand_retarget_backend", "world_model_backend",
                   "policy_backend")
SWITCHES = tuple(a.name for a in bringup.ARGUMENTS if a.choices == bringup.SWITCH)
#: the arguments that take any text (a path): no choices
FREE = tuple(a.name for a in bringup.ARGUMENTS if not a.choices)


def _combinations(names):
    """Every combination of the named arguments' choices, as launch argument values."""
    for row in itertools.product(*(bringup.argument(n).choices for n in names)):
        yield dict(zip(names, row))


def _load(path):
    spec = importlib.util.spec_from_file_location(path.name.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_launch_files():
    assert BRINGUP in FILES and DESCRIPTION in FILES


# --- the table -------------------------------------------------------------------------------------------


def test_arguments_their_choices_and_defaults():
    from rynn_teleop.nodes import node_class

    names = [a.name for a in bringup.ARGUMENTS]
    assert len(set(names)) == len(names)
    assert set(names) == {*VALUE_ARGUMENTS, "record", "console", "foxglove", "lifecycle", "rviz",
                          "robot_state_publisher", "policy"}
    assert FREE == ("policy",) and bringup.argument("policy").default == ""  # a path; empty: teleoperation
    for arg in bringup.ARGUMENTS:
        if arg.name in FREE:
            continue
        assert arg.description and arg.default in arg.choices and len(set(arg.choices)) == len(arg.choices), arg
    assert bringup.argument("mode").choices == bringup.MODES
    assert bringup.argument("camera").choices == ("", *bringup.CAMERAS)  # "": by mode
    # a backend argument is <node>_backend, its choices the node's registered backends
    assert set(bringup.BACKEND_ARGUMENTS) == {"tracker_backend", "hand_retarget_backend", "world_model_backend",
                                              "policy_backend"}
    for arg, node in bringup.BACKEND_ARGUMENTS.items():
        assert arg == f"{node}_backend"
        assert bringup.argument(arg).choices == node_class(node).SCHEMA.params["backend"].choices, arg
    # every switch of a node is an on/off argument, and every on/off argument starts something
    switched = {s.switch for s in bringup.NODES if s.switch} | {o.switch for o in bringup.OTHER_NODES}
    assert switched == {*SWITCHES, "policy"}
    assert all(s.started_when in bringup.SWITCH for s in bringup.NODES if s.switch in SWITCHES)
    # a plain launch needs no hardware
    defaults = {a.name: a.default for a in bringup.ARGUMENTS}
    assert defaults["mode"] == "digital" and defaults["tracker_backend"] == defaults["hand_retarget_backend"] == \
        "synthetic"
    assert [n for n in SWITCHES if defaults[n] == "true"] == ["robot_state_publisher"]


def test_a_former_argument_name_is_refused_naming_the_new_one():
    from rynn_teleop.errors import ConfigurationError

    assert bringup.RENAMED_ARGUMENTS == {"tracker_source": "tracker_backend", "glove_source": "hand_retarget_backend"}
    for old, new in bringup.RENAMED_ARGUMENTS.items():
        with pytest.raises(ConfigurationError, match=f"launch argument '{old}' was renamed '{new}': give {new}:=manus"):
            bringup.check_renamed({old: "manus"})
    bringup.check_renamed({"tracker_backend": "openvr", "mode": "real"})
    assert "real" not in bringup.CAMERAS and bringup.DEFAULT_CAMERA["real"] == "physical"


def test_nodes_are_registered_have_a_config_file_and_hardware_never_respawns():
    from rynn_teleop.nodes import REGISTRY
    from rynn_teleop.paths import config_file

    names = [s.name for s in bringup.NODES]
    assert len(set(names)) == len(names)
    for name in names:
        assert name in REGISTRY and config_file(name).is_file(), name
    assert bringup.HARDWARE_NODES == ("arm_driver", "hand_driver", "head_camera")
    assert [s.name for s in bringup.NODES if not s.respawn] == list(bringup.HARDWARE_NODES)
    assert bringup.node("recorder").switch == "record" and bringup.node("robot_description").started_when == "false"
    with pytest.raises(KeyError):
        bringup.node("nope")


def test_the_managed_nodes_are_the_lifecycle_nodes_arm_before_hand():
    from rynn_teleop.core.lifecycle import GOALS
    from rynn_teleop.nodes import node_class
    from rynn_teleop.nodes.lifecycle import ManagedNode

    assert bringup.MANAGED_NODES == ("arm_driver", "hand_driver")
    for spec in bringup.NODES:
        assert spec.managed is issubclass(node_class(spec.name), ManagedNode), spec.name
    lifecycle = bringup.argument("lifecycle")
    assert lifecycle.choices == GOALS and lifecycle.default == "active"


def test_each_modes_backends_are_values_their_nodes_accept():
    from rynn_teleop.nodes import node_class

    assert tuple(bringup.BACKENDS) == bringup.MODES
    assert bringup.BACKENDS["digital"].keys() == bringup.BACKENDS["real"].keys()
    for nodes in bringup.BACKENDS.values():
        for name, values in nodes.items():
            node_class(name).SCHEMA.validate(values)
            assert set(values) <= set(bringup.node(name).overrides), name


def test_declared_override_keys_are_the_ones_mode_overrides_sets():
    full = bringup.mode_overrides("real", camera="physical", tracker_backend="x", hand_retarget_backend="y",
                                  world_model_backend="z", policy_backend="w", policy="/p")
    declared = {s.name: set(s.overrides) | set(s.passed) for s in bringup.NODES if s.overrides or s.passed}
    assert {name: set(values) for name, values in full.items()} == declared
    for spec in bringup.NODES:
        for key, names in spec.overrides.items():
            assert set(names) <= set(VALUE_ARGUMENTS), (spec.name, key)
        assert set(spec.passed.values()) <= set(FREE), spec.name


def test_the_lookup_tables_give_what_mode_overrides_gives_for_every_launch():
    """The launch file evaluates these tables: for every combination of argument values they must equal
    ``mode_overrides`` (so a table that misses an argument its value depends on fails here)."""
    tables = bringup.lookup_tables()
    assert {(t.node, t.key) for t in tables} == {(s.name, k) for s in bringup.NODES for k in s.overrides}
    for values in _combinations(VALUE_ARGUMENTS):
        looked_up: dict[str, dict] = {}
        for t in tables:
            looked_up.setdefault(t.node, {})[t.key] = t.values[tuple(values[a] for a in t.arguments)]
        assert looked_up == bringup.launch_overrides(values), values
    synthetic = bringup.launch_overrides({"tracker_backend": "synthetic"})["arm_ik"]
    assert synthetic == {"auto_calibrate": True, "auto_engage": True}
    assert bringup.launch_overrides({"mode": "real"})["camera_switch"] == {"active_source": "physical"}
    assert bringup.launch_overrides({"mode": "real", "camera": "generated"})["camera_switch"] == {
        "active_source": "generated"}


@pytest.mark.parametrize(("mode", "camera"), [("lab", None), ("digital", "depth")])
def test_mode_overrides_refuses_an_unknown_mode_or_camera(mode, camera):
    with pytest.raises(ValueError, match="unknown"):
        bringup.mode_overrides(mode, camera=camera)


def test_started_nodes_follow_the_switches():
    always = [s.name for s in bringup.NODES if s.switch is None]
    for values in _combinations(SWITCHES):
        values = {**values, "policy": ""}
        started = bringup.started_nodes(values)
        assert list(started) == [s.name for s in bringup.NODES if s.name in started]  # table order
        assert set(always) <= set(started)
        assert ("recorder" in started) == (values["record"] == "true")
        assert ("robot_description" in started) == (values["robot_state_publisher"] == "false")
    assert bringup.mode_nodes() == tuple(n for n in (s.name for s in bringup.NODES) if n not in (
        "recorder", "console", "foxglove", "policy"))
    assert bringup.mode_nodes(record=True, console=True, foxglove=True) == tuple(
        s.name for s in bringup.NODES if s.name != "policy")
    # the physical twin runs in the digital mode only, in the drivers' process
    assert "twin" in bringup.mode_nodes() and "twin" not in bringup.mode_nodes(mode="real")
    assert bringup.node("twin").group == bringup.node("arm_driver").group == bringup.node("hand_driver").group


def test_the_demo_runs_the_digital_bringup_in_the_tables_process_groups():
    from rynn_teleop import demo

    assert set(demo.DEMO_NODES) == set(bringup.mode_nodes(record=True)) - set(demo.LEFT_OUT)
    members = [n for group in demo.DEMO_GROUPS for n in group]
    assert sorted(members) == sorted(demo.DEMO_NODES)  # each node in exactly one process
    for group in demo.DEMO_GROUPS:
        assert len({bringup.node(n).group for n in group}) == 1, group
    # the drivers' sim backend drives the twin's physics world: one process
    assert ("twin", "arm_driver", "hand_driver") in [tuple(n for n in g if n != "robot_description")
                                                    for g in demo.DEMO_GROUPS]
    assert ("head_camera", "camera_switch") in demo.DEMO_GROUPS and ("tracker",) in demo.DEMO_GROUPS
    assert demo.OPERATOR_GROUP in demo.DEMO_GROUPS


# --- bringup.launch.py with stand-in launch modules ----------------------------------------------------------


class _Recorded:
    """A stand-in launch class: keeps its constructor's arguments."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


_FAKE_MODULES = {
    "launch": [],
    "launch.launch_description": ["LaunchDescription"],
    "launch.actions": ["DeclareLaunchArgument", "ExecuteProcess", "LogInfo", "OpaqueFunction", "SetEnvironmentVariable",
                       "TimerAction"],
    "launch.conditions": ["IfCondition", "UnlessCondition"],
    "launch.substitutions": ["Command", "EnvironmentVariable", "LaunchConfiguration", "PathJoinSubstitution",
                             "PythonExpression"],
    "launch_ros": [],
    "launch_ros.actions": ["Node"],
    "launch_ros.parameter_descriptions": ["ParameterValue"],
    "launch_ros.substitutions": ["FindPackagePrefix", "FindPackageShare"],
}


@pytest.fixture
def fake_launch(monkeypatch):
    """The launch file's actions built with stand-in launch / launch_ros modules; returns its module."""
    for name, classes in _FAKE_MODULES.items():
        module = types.ModuleType(name)
        for cls in classes:
            setattr(module, cls, type(cls, (_Recorded,), {}))
        monkeypatch.setitem(sys.modules, name, module)
    return _load(BRINGUP)


def _kind(obj):
    return type(obj).__name__


def _text(parts, values):
    """A stand-in substitution list as launch would perform it with these argument values."""
    out = ""
    for part in parts:
        out += part if isinstance(part, str) else values[part.args[0]]  # LaunchConfiguration(name)
    return out


def _is_started(condition, values):
    if condition is None:
        return True
    if _kind(condition.args[0]) == "PythonExpression":  # a mode (and a switch)
        return bool(eval(_text(condition.args[0].args[0], values))) is (_kind(condition) == "IfCondition")
    name = condition.args[0].args[0]
    return (values[name] == "true") is (_kind(condition) == "IfCondition")


def test_bringup_launch_declares_the_tables_arguments(fake_launch):
    entities = fake_launch.generate_launch_description().args[0]
    declared = [e for e in entities if _kind(e) == "DeclareLaunchArgument"]
    assert [(d.args[0], d.kwargs["default_value"], tuple(d.kwargs.get("choices", ())), d.kwargs["description"])
            for d in declared] == [tuple(a) for a in bringup.ARGUMENTS]  # a path argument: no choices
    first_node = next(i for i, e in enumerate(entities) if _kind(e) == "Node")
    check = next(i for i, e in enumerate(entities) if _kind(e) == "OpaqueFunction")
    assert max(entities.index(d) for d in declared) < check < first_node  # arguments, then files, then nodes


def test_bringup_launch_starts_the_tables_nodes_with_their_overrides(fake_launch):
    entities = fake_launch.generate_launch_description().args[0]
    nodes = [e for e in entities if _kind(e) == "Node"]
    ours = [n for n in nodes if n.kwargs["package"] == "rynn_teleop"
            and n.kwargs["executable"] != bringup.LIFECYCLE_MANAGER]
    others = [n for n in nodes if n.kwargs["package"] != "rynn_teleop"]
    manager = nodes[-1]
    assert nodes == others + ours + [manager]  # other packages' first: a missing one stops the launch before ours
    # the lifecycle manager brings the drivers to the lifecycle argument's state, in the table's order
    assert (manager.kwargs["package"], manager.kwargs["executable"]) == ("rynn_teleop", bringup.LIFECYCLE_MANAGER)
    (params,) = manager.kwargs["parameters"]
    assert params["node_names"] == list(bringup.MANAGED_NODES)
    assert _kind(params["goal"]) == "LaunchConfiguration" and params["goal"].args[0] == "lifecycle"
    assert manager.kwargs.get("condition") is None and manager.kwargs.get("on_exit") is None  # runs once
    own = [s for s in bringup.NODES if bringup.separate_modes(s.name)]  # the twin runs only in a composed process
    assert [n.kwargs["executable"] for n in ours] == [s.name for s in own]
    assert bringup.separate_modes("twin") == () and bringup.separate_modes("arm_driver") == ("real",)
    composed = [e for e in entities if _kind(e) == "ExecuteProcess"]
    assert len(composed) == len(bringup.COMPOSED)
    for action, process in zip(composed, bringup.COMPOSED):
        executable, *arguments = action.kwargs["cmd"]
        assert executable.args[0][1:] == ["lib", "rynn_teleop", "rynn-teleop"]  # the installed console script
        assert arguments == bringup.composed_arguments(process) == [
            "run", *process.nodes, "--mode", process.mode, "--lifecycle", "unconfigured"]
        assert "on_exit" not in action.kwargs  # drivers: never restarted
    assert [(n.kwargs["package"], n.kwargs["executable"], n.kwargs["condition"].args[0].args[0])
            for n in others] == [(o.package, o.executable, o.switch) for o in bringup.OTHER_NODES]
    rviz = next(n for n in others if n.kwargs["executable"] == "rviz2")
    assert rviz.kwargs["arguments"][0] == "-d" and rviz.kwargs["arguments"][1].args[0][1:] == [
        "config", "rynn_teleop.rviz"]
    for node, spec in zip(ours, own):
        config, overrides = node.kwargs["parameters"]
        assert config.args[0][1:] == ["config", f"{spec.name}.yaml"]  # the share directory's config file
        assert set(overrides) == set(spec.overrides) | set(spec.passed), spec.name
        for key, argument in spec.passed.items():  # a path: passed as given
            assert _kind(overrides[key]) == "LaunchConfiguration" and overrides[key].args[0] == argument
        assert (node.kwargs["on_exit"] is not None) is spec.respawn, spec.name
        assert "respawn" not in node.kwargs  # restarts go through on_exit (exit code 2 is not restarted)
    for values in _combinations((*SWITCHES, "mode")):
        for policy in ("", "/runs/act", "/runs/it's here"):  # a path (quotes and all): the policy node, no operator
            _check_started(ours, composed, {**values, "policy": policy})
    for values in _combinations(VALUE_ARGUMENTS):
        resolved = {}
        for node in ours:
            for key, expression in node.kwargs["parameters"][1].items():
                if key in bringup.node(node.kwargs["executable"]).passed:
                    continue  # checked above
                assert _kind(expression) == "PythonExpression"
                resolved.setdefault(node.kwargs["executable"], {})[key] = eval(_text(expression.args[0], values))
        assert resolved == bringup.launch_overrides(values), values


def _check_started(ours, composed, values):
    """The launch file's conditions start what the table starts with these argument values."""
    started = {n.kwargs["executable"] for n in ours if _is_started(n.kwargs["condition"], values)}
    for action, process in zip(composed, bringup.COMPOSED):
        if _is_started(action.kwargs["condition"], values):
            assert not started & set(process.nodes), values  # each node in one process
            started |= set(process.nodes)
    assert tuple(n for n in (s.name for s in bringup.NODES) if n in started) == bringup.started_nodes(values), values


def test_bringup_launch_restarts_a_node_unless_it_refused_or_the_launch_ends(fake_launch):
    spec = bringup.node("tracker")
    context = types.SimpleNamespace(is_shutdown=False)
    again = fake_launch._restart(spec, {}, types.SimpleNamespace(returncode=1), context)
    assert [_kind(a) for a in again] == ["TimerAction"] and again[0].kwargs["period"] == bringup.RESPAWN_DELAY_S
    node = again[0].kwargs["actions"][0]
    assert node.kwargs["executable"] == "tracker" and node.kwargs["on_exit"] is not None  # restarted again later
    refused = fake_launch._restart(spec, {}, types.SimpleNamespace(returncode=REFUSED_EXIT_CODE), context)
    assert [_kind(a) for a in refused] == ["LogInfo"] and "tracker refused to start" in refused[0].kwargs["msg"]
    context.is_shutdown = True
    assert fake_launch._restart(spec, {}, types.SimpleNamespace(returncode=-2), context) is None


# --- with upstream launch / launch_ros --------------------------------------------------------------------


def _upstream():
    pytest.importorskip("launch.actions")  # not the repository's launch/ folder
    pytest.importorskip("launch_ros", reason="launch_ros is not on PyPI; install ROS 2 to run this test")


def _declare(description, context, given):
    from launch.actions import DeclareLaunchArgument

    context.launch_configurations.update(given)
    for action in description.entities:
        if isinstance(action, DeclareLaunchArgument):
            action.execute(context)  # checks choices, fills in defaults


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_launch_description_loads_and_every_argument_is_described_with_choices(path):
    _upstream()
    from launch.actions import DeclareLaunchArgument

    description = _load(path).generate_launch_description()
    args = [e for e in description.entities if isinstance(e, DeclareLaunchArgument)]
    assert args and all(a.description and (a.choices or a.name in FREE) for a in args)


@pytest.mark.parametrize(("name", "value"), [("record", "maybe"), ("rviz", "yes"), ("robot_state_publisher", "maybe"),
                                             ("mode", "lab"), ("camera", "real"), ("tracker_backend", "vive")])
def test_a_bad_argument_value_stops_the_launch_before_any_node_naming_the_argument(name, value):
    _upstream()
    from launch import LaunchContext

    with pytest.raises(Exception, match=f'Argument "{name}" provided value "{value}" is not valid'):
        _declare(_load(BRINGUP).generate_launch_description(), LaunchContext(), {name: value})


@pytest.mark.parametrize("mode", bringup.MODES)
@pytest.mark.parametrize("camera", ["", *bringup.CAMERAS])
@pytest.mark.parametrize("record", bringup.SWITCH)
def test_bringup_resolves_per_mode(mode, camera, record):
    _upstream()
    from launch_ros.actions import Node
    from launch_ros.utilities import evaluate_parameters

    from launch import LaunchContext

    description = _load(BRINGUP).generate_launch_description()
    context = LaunchContext()
    given = {"mode": mode, "camera": camera, "record": record, "robot_state_publisher": "false",
             "tracker_backend": "openvr", "hand_retarget_backend": "manus", "world_model_backend": "diffusion"}
    _declare(description, context, given)
    started, overrides = [], {}
    for action in description.entities:
        if type(action).__name__ == "ExecuteProcess" and (action.condition is None
                                                          or action.condition.evaluate(context)):
            started += [n for c in bringup.COMPOSED if c.mode == mode for n in c.nodes]  # the composed process
        if isinstance(action, Node) and action.node_package == "rynn_teleop" \
                and action.node_executable != bringup.LIFECYCLE_MANAGER:
            if action.condition is None or action.condition.evaluate(context):
                started.append(action.node_executable)
            # parameter files are found through the ament index; evaluate only the inline values
            params = [p for p in action._Node__parameters if isinstance(p, dict)]  # private: no public accessor
            values = {k: v for d in evaluate_parameters(context, params) for k, v in d.items()}
            if values:
                overrides[action.node_executable] = values
            on_exit = action._ExecuteLocal__on_exit  # private: the restart policy wired to this node
            assert (on_exit is not None) is bringup.node(action.node_executable).respawn
    order = [s.name for s in bringup.NODES]
    assert tuple(sorted(started, key=order.index)) == bringup.started_nodes(given) == bringup.mode_nodes(
        record=record == "true", mode=mode)
    assert overrides.pop("policy") == {"backend": "lerobot", "path": ""}  # not started (no policy given)
    assert overrides == bringup.mode_overrides(mode, camera=camera or None, tracker_backend="openvr",
                                               hand_retarget_backend="manus", world_model_backend="diffusion")


def test_bringup_restart_policy_with_upstream_events():
    _upstream()
    from launch.actions import LogInfo, TimerAction
    from launch.events.process import ProcessExited
    from launch_ros.actions import Node

    from launch import LaunchContext

    module = _load(BRINGUP)
    description = module.generate_launch_description()
    tracker = next(e for e in description.entities if isinstance(e, Node) and e.node_executable == "tracker")
    context = LaunchContext()

    def exited(code):
        return ProcessExited(returncode=code, action=tracker, name="tracker-1", cmd=["tracker"], cwd=None, env=None,
                             pid=1)

    again = tracker._ExecuteLocal__on_exit(exited(1), context)
    assert len(again) == 1 and isinstance(again[0], TimerAction)
    assert [a.node_executable for a in again[0].actions] == ["tracker"]
    refused = tracker._ExecuteLocal__on_exit(exited(REFUSED_EXIT_CODE), context)
    assert len(refused) == 1 and isinstance(refused[0], LogInfo)
    context._set_is_shutdown(True)
    assert tracker._ExecuteLocal__on_exit(exited(-2), context) is None


def test_bringup_checks_the_config_files_before_any_node_starts(tmp_path, monkeypatch):
    _upstream()
    import shutil

    from launch import LaunchContext
    from rynn_teleop.errors import ConfigurationError
    from rynn_teleop.paths import share_dir

    module = _load(BRINGUP)
    shutil.copytree(share_dir() / "config", tmp_path / "config")
    context = LaunchContext()
    _declare(module.generate_launch_description(), context, {"robot_state_publisher": "false"})
    # the share directory is found through the ament index: here, a copy of config/
    monkeypatch.setattr(module, "FindPackageShare", lambda pkg: types.SimpleNamespace(perform=lambda c: str(tmp_path)))
    module._check_config_files(context)  # the shipped files pass
    tracker = tmp_path / "config" / "tracker.yaml"
    tracker.write_text(tracker.read_text() + "    extra: [1, 2\n")
    with pytest.raises(ConfigurationError, match=r"tracker\.yaml, line \d+, column \d+: invalid YAML"):
        module._check_config_files(context)
    tracker.write_text((share_dir() / "config" / "tracker.yaml").read_text())
    recorder = tmp_path / "config" / "recorder.yaml"
    recorder.write_text("recorder: [")  # not started: not read
    module._check_config_files(context)


def test_description_launch_restarts_only_its_respawning_nodes():
    _upstream()
    from launch.actions import OpaqueFunction
    from launch_ros.actions import Node

    entities = _load(DESCRIPTION).generate_launch_description().entities
    nodes = {e.node_executable: e for e in entities if isinstance(e, Node) and e.node_package == "rynn_teleop"}
    check = next(i for i, e in enumerate(entities) if isinstance(e, OpaqueFunction))  # the config files' check
    assert check < min(i for i, e in enumerate(entities) if isinstance(e, Node))
    assert set(nodes) == {"robot_description", "joint_sweep", "robot_markers"}
    assert {name for name, n in nodes.items() if n._ExecuteLocal__on_exit is not None} == {
        "robot_description", "robot_markers"}


# --- launch/description.launch.py and the shared configs ------------------------------------------------------


def test_description_launch_arguments_are_switches_with_descriptions():
    tree = ast.parse(DESCRIPTION.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "_switch"]
    assert len(calls) == 4
    for call in calls[1:]:
        name, default, description = (ast.literal_eval(a) for a in call.args)
        assert default in bringup.SWITCH and description, name


def test_rviz_config_is_installed_and_shows_robot_camera_and_trackers():
    import yaml

    from rynn_teleop.paths import share_dir

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
                                       "/head_camera/generated/color/camera_info", "/twin/markers"}
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


# --- a policy instead of the operator ----------------------------------------------------------------------


def test_a_policy_replaces_the_operator_input_and_keeps_the_rest(tmp_path):
    operator = ("tracker", "arm_ik", "hand_retarget")
    for mode in bringup.MODES:
        teleop = bringup.mode_nodes(record=True, mode=mode)
        policy = bringup.mode_nodes(record=True, mode=mode, policy=True)
        assert set(operator) <= set(teleop) and "policy" not in teleop
        assert set(policy) == (set(teleop) - set(operator)) | {"policy"}  # twin, drivers, camera, recorder stay
    assert "policy" in bringup.started_nodes({"policy": str(tmp_path)})
    assert "tracker" not in bringup.started_nodes({"policy": str(tmp_path)})
    assert ("policy",) in bringup.process_groups(bringup.mode_nodes(policy=True))  # a process of its own
    overrides = bringup.mode_overrides("real", policy=str(tmp_path), policy_backend="replay")
    assert overrides["policy"] == {"backend": "replay", "path": str(tmp_path)}
    assert "policy" not in bringup.mode_overrides("digital")  # the YAML's, and not started anyway
    assert bringup.launch_overrides({"policy": str(tmp_path)})["policy"] == {"backend": "lerobot",
                                                                             "path": str(tmp_path)}
    assert [bringup.node(n).started_by for n in ("tracker", "policy", "recorder", "twin")] == [
        "`policy` empty", "`policy:=PATH` (given)", "`record:=true`", "always"]


def test_a_policy_argument_that_names_nothing_stops_the_launch(tmp_path):
    from rynn_teleop.errors import ConfigurationError

    bringup.check_policy({})  # none given: teleoperation
    bringup.check_policy({"policy": str(tmp_path)})
    with pytest.raises(ConfigurationError, match="policy:='/no/such/run': no such file or folder"):
        bringup.check_policy({"policy": "/no/such/run"})
    bringup.check_policy({"policy": "-", "policy_backend": "constant"})  # loads nothing from a path
    quoted = tmp_path / "a'''b"
    quoted.mkdir()
    with pytest.raises(ConfigurationError, match="three single quotes"):
        bringup.check_policy({"policy": str(quoted)})
