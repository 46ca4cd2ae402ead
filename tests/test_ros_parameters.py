"""Tests of declare_schema on real rclpy nodes (rynn_teleop.nodes.parameters).

Each test gets its own rclpy context; run with ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
and a ROS_DOMAIN_ID so nothing leaves the loopback interface.
"""

from __future__ import annotations

import os
import textwrap

import pytest
import rclpy
from rcl_interfaces.msg import ParameterType
from rclpy.node import Node
from rclpy.parameter import Parameter

from rynn_teleop.core.params import FLOAT_LIST, INT_LIST, STR_LIST, Param, ParamSchema
from rynn_teleop.errors import ParameterError
from rynn_teleop.nodes.parameters import declare_schema

DOMAIN_ID = int(os.environ.get("ROS_DOMAIN_ID", "61"))

SCHEMA = ParamSchema(
    "demo_node",
    [
        Param("rate_hz", float, 100.0, "Control loop rate", "Hz", min=1.0, max=1000.0),
        Param("gain", float, 1.0, "Output gain", min=0.0, dynamic=True),
        Param("speed", float, 0.5, "Speed", "m/s", min=0.0, max=2.0, dynamic=True),
        Param("source", str, "synthetic", "Pose source",
              choices=("openvr", "replay", "synthetic"), dynamic=True),
        Param("queue", int, 10, "Queue depth", min=1, max=100),
        Param("offsets", FLOAT_LIST, [0.0, 0.0, 0.0], "Offset", "m", min=-1.0, max=1.0,
              length=3, dynamic=True),
        Param("ids", INT_LIST, [], "Device ids"),
        Param("names", STR_LIST, ["left", "right"], "Arm names"),
        Param("limits.max_step", float, 0.05, "Max step per tick", "m", min=0.0),
    ],
)


@pytest.fixture
def ctx():
    context = rclpy.Context()
    yield context
    if context.ok():
        rclpy.shutdown(context=context)


@pytest.fixture
def make_node(ctx):
    """Build a demo_node, from constructor overrides or a params file (via ``args``)."""
    nodes = []

    def make(overrides=(), args=None):
        rclpy.init(args=args, context=ctx, domain_id=DOMAIN_ID)
        node = Node(
            "demo_node",
            context=ctx,
            parameter_overrides=list(overrides),
            automatically_declare_parameters_from_overrides=False,
        )
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.destroy_node()


def params_file(tmp_path, body: str):
    path = tmp_path / "params.yaml"
    body = textwrap.indent(textwrap.dedent(body), "    ")
    path.write_text("demo_node:\n  ros__parameters:\n" + body)
    return ["--ros-args", "--params-file", str(path)]


def test_defaults_are_declared_with_descriptors(make_node):
    node = make_node()
    values = declare_schema(node, SCHEMA)
    assert values == SCHEMA.defaults()
    assert node.get_parameter("rate_hz").value == 100.0
    assert list(node.get_parameter("names").value) == ["left", "right"]

    rate = node.describe_parameter("rate_hz")
    assert rate.description == "Control loop rate [Hz] (range [1.0, 1000.0])"
    assert rate.read_only and rate.type == ParameterType.PARAMETER_DOUBLE
    assert (rate.floating_point_range[0].from_value, rate.floating_point_range[0].to_value) == (
        1.0, 1000.0)
    queue = node.describe_parameter("queue")
    assert queue.type == ParameterType.PARAMETER_INTEGER
    assert (queue.integer_range[0].from_value, queue.integer_range[0].to_value) == (1, 100)
    assert not node.describe_parameter("gain").floating_point_range  # one-sided: no ROS range
    assert not node.describe_parameter("speed").read_only
    assert "one of ['openvr', 'replay', 'synthetic']" in (
        node.describe_parameter("source").additional_constraints)
    assert "length 3" in node.describe_parameter("offsets").additional_constraints


def test_empty_list_default_is_typed(make_node):
    node = make_node()
    declare_schema(node, SCHEMA)
    ids = node.get_parameter("ids")
    assert ids.type_ == Parameter.Type.INTEGER_ARRAY and list(ids.value) == []
    assert node.describe_parameter("ids").read_only
    assert not node.set_parameters([Parameter("ids", value=[1])])[0].successful


def test_constructor_overrides_are_validated_and_coerced(make_node):
    node = make_node([Parameter("rate_hz", value=50), Parameter("source", value="replay")])
    values = declare_schema(node, SCHEMA)
    assert values["rate_hz"] == 50.0 and type(values["rate_hz"]) is float
    rate = node.get_parameter("rate_hz")
    assert rate.type_ == Parameter.Type.DOUBLE and rate.value == 50.0
    assert node.get_parameter("source").value == "replay"
    assert node._parameter_overrides["rate_hz"].type_ == Parameter.Type.DOUBLE


def test_constructor_override_bad_value(make_node):
    node = make_node([Parameter("source", value="foo")])
    with pytest.raises(ParameterError) as info:
        declare_schema(node, SCHEMA)
    assert info.value.key == "source"
    assert "'foo' is not one of ['openvr', 'replay', 'synthetic']" in str(info.value)
    assert not node.has_parameter("rate_hz")  # refused before declaring anything


def test_builtin_overrides_are_ignored(make_node):
    node = make_node([
        Parameter("use_sim_time", value=False),
        Parameter("qos_overrides./tf.publisher.depth", value=10),
    ])
    assert declare_schema(node, SCHEMA) == SCHEMA.defaults()


def test_params_file_values_arrive(make_node, tmp_path):
    node = make_node(args=params_file(tmp_path, """\
        rate_hz: 250
        queue: 20
        offsets: [0, -1, 1]
        ids: [3, 4]
        limits:
          max_step: 0.2
        """))
    values = declare_schema(node, SCHEMA)
    assert values["rate_hz"] == 250.0 and type(values["rate_hz"]) is float
    assert node.get_parameter("rate_hz").value == 250.0
    assert node.get_parameter("queue").value == 20
    offsets = node.get_parameter("offsets")  # an int list given for a float list
    assert offsets.type_ == Parameter.Type.DOUBLE_ARRAY and list(offsets.value) == [0.0, -1.0, 1.0]
    assert values["offsets"] == [0.0, -1.0, 1.0]
    assert list(node.get_parameter("ids").value) == [3, 4]
    assert node.get_parameter("limits.max_step").value == 0.2


def test_params_file_empty_list_override(make_node, tmp_path):
    node = make_node(args=params_file(tmp_path, "names: []\n"))
    values = declare_schema(node, SCHEMA)
    assert values["names"] == []
    names = node.get_parameter("names")
    assert names.type_ == Parameter.Type.STRING_ARRAY and list(names.value) == []


def test_params_file_unknown_key(make_node, tmp_path):
    node = make_node(args=params_file(tmp_path, "rate_hs: 10.0\n"))
    with pytest.raises(ParameterError) as info:
        declare_schema(node, SCHEMA)
    assert info.value.key == "rate_hs"
    assert "unknown parameter 'rate_hs' for node 'demo_node'" in str(info.value)
    assert "did you mean 'rate_hz'?" in str(info.value)


def test_params_file_bad_value(make_node, tmp_path):
    node = make_node(args=params_file(tmp_path, "rate_hz: 5000.0\n"))
    with pytest.raises(ParameterError) as info:
        declare_schema(node, SCHEMA)
    assert info.value.key == "rate_hz"
    assert str(info.value) == "parameter 'rate_hz' = 5000.0 is out of range [1.0, 1000.0] Hz"


def test_params_file_wrong_list_length(make_node, tmp_path):
    node = make_node(args=params_file(tmp_path, "offsets: [0.1, 0.2]\n"))
    with pytest.raises(ParameterError, match="has length 2, expected 3"):
        declare_schema(node, SCHEMA)


def test_to_yaml_is_a_valid_ros_params_file(make_node, tmp_path):
    path = tmp_path / "defaults.yaml"
    path.write_text(SCHEMA.to_yaml())
    node = make_node(args=["--ros-args", "--params-file", str(path)])
    assert "rate_hz" in node._parameter_overrides  # rcl parsed the generated file
    assert declare_schema(node, SCHEMA) == SCHEMA.defaults()


def test_runtime_set_uses_our_validation(make_node):
    node = make_node()
    declare_schema(node, SCHEMA)

    result = node.set_parameters([Parameter("gain", value=-0.5)])[0]
    assert not result.successful
    assert result.reason == "parameter 'gain' = -0.5 is out of range [0.0, +inf)"
    assert node.get_parameter("gain").value == 1.0

    result = node.set_parameters([Parameter("source", value="foo")])[0]
    assert not result.successful and "is not one of" in result.reason

    result = node.set_parameters([Parameter("offsets", value=[0.0, 2.0, 0.0])])[0]
    assert not result.successful
    assert "'offsets'" in result.reason and "element [1] = 2.0 is out of range [-1.0, 1.0] m" in (
        result.reason)

    assert node.set_parameters([Parameter("gain", value=3.5)])[0].successful
    assert node.get_parameter("gain").value == 3.5
    assert node.set_parameters([Parameter("offsets", value=[0.5, -1.0, 1.0])])[0].successful
    assert list(node.get_parameter("offsets").value) == [0.5, -1.0, 1.0]


def test_runtime_scalar_range_is_enforced(make_node):
    node = make_node()
    declare_schema(node, SCHEMA)
    # A two-sided scalar range is also in the ROS descriptor, which rclpy checks first.
    result = node.set_parameters([Parameter("speed", value=5.0)])[0]
    assert not result.successful and "speed" in result.reason and "5.0" in result.reason
    assert node.get_parameter("speed").value == 0.5
    assert node.set_parameters([Parameter("speed", value=2.0)])[0].successful


def test_read_only_parameter_is_refused(make_node):
    node = make_node()
    declare_schema(node, SCHEMA)
    result = node.set_parameters([Parameter("rate_hz", value=200.0)])[0]
    assert not result.successful and "read-only" in result.reason
    assert node.get_parameter("rate_hz").value == 100.0


@pytest.mark.parametrize("args, expected", [
    (["node", "--ros-args", "--params-file", "a.yaml", "-p", "x:=1", "--params-file=b.yaml"], ["a.yaml", "b.yaml"]),
    (["node", "--params-file", "not_ros.yaml", "--ros-args", "--", "--params-file", "after.yaml"], []),
    (["node"], []),
])
def test_params_files_are_the_ones_inside_ros_args(args, expected):
    from rynn_teleop.nodes.process import params_files

    assert params_files(args) == expected


def test_a_malformed_params_file_is_refused_naming_file_line_and_column(ros_env, tmp_path):
    import subprocess
    import sys

    from rynn_teleop.errors import REFUSED_EXIT_CODE

    bad = tmp_path / "joint_sweep.yaml"
    bad.write_text("joint_sweep:\n  ros__parameters:\n    rate_hz: [1, 2\n")
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from rynn_teleop.nodes.joint_sweep import main; sys.exit(main())",
         "--ros-args", "--params-file", str(bad)],
        env=ros_env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == REFUSED_EXIT_CODE, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"[joint_sweep] refusing to start: parameter file {bad}, line 4, column 1: invalid YAML" in proc.stderr
