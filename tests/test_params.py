"""Tests of the ROS-free parameter schema (rynn_teleop.core.params)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rynn_teleop.core.params import (
    BOOL_LIST,
    FLOAT_LIST,
    INT_LIST,
    STR_LIST,
    Param,
    ParamSchema,
    format_range,
)
from rynn_teleop.errors import ConfigurationError, ParameterError

RATE = Param("rate_hz", float, 100.0, "Control loop rate", "Hz", min=1.0, max=1000.0)
SOURCE = Param("source", str, "synthetic", "Pose source", choices=("openvr", "replay", "synthetic"))


def make_schema() -> ParamSchema:
    return ParamSchema(
        "demo_node",
        [
            RATE,
            SOURCE,
            Param("queue", int, 10, "Queue depth", min=1, max=100),
            Param("enabled", bool, True, "Enable output"),
            Param("gains", FLOAT_LIST, [1.0, 1.0, 1.0], "Per-axis gain", min=0.0, max=2.0,
                  length=3, dynamic=True),
            Param("joints", STR_LIST, ["a", "b"], "Joint names"),
            Param("ids", INT_LIST, [], "Device ids", min=0),
            Param("flags", BOOL_LIST, [True, False], "Flags"),
            Param("limits.max_step", float, 0.05, "Max step per tick", "m", min=0.0),
            Param("limits.max_turn", float, 0.1, "Max turn per tick", "rad", min=0.0, max=1.0),
            Param("label", str, "it's: \"quoted\" # not a comment", "Free text"),
        ],
    )


def write(tmp_path, text: str, name: str = "params.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_module_is_ros_free():
    code = "import sys, rynn_teleop.core.params; sys.exit('rclpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env=os.environ).returncode == 0


# --- Param.validate ---------------------------------------------------------------


def test_out_of_range_message_names_key_value_range_and_units():
    with pytest.raises(ParameterError) as info:
        RATE.validate(5000.0)
    assert info.value.key == "rate_hz"
    assert str(info.value) == "parameter 'rate_hz' = 5000.0 is out of range [1.0, 1000.0] Hz"


def test_bounds_are_inclusive():
    assert RATE.validate(1.0) == 1.0
    assert RATE.validate(1000.0) == 1000.0
    with pytest.raises(ParameterError):
        RATE.validate(math.nextafter(1.0, 0.0))


def test_choices_message():
    assert SOURCE.validate("replay") == "replay"
    with pytest.raises(ParameterError) as info:
        SOURCE.validate("foo")
    assert str(info.value) == (
        "parameter 'source' = 'foo' is not one of ['openvr', 'replay', 'synthetic']"
    )


def test_int_choices():
    mode = Param("mode", int, 1, "Mode", choices=(1, 2, 4))
    assert mode.validate(4) == 4
    with pytest.raises(ParameterError, match=r"= 3 is not one of \[1, 2, 4\]"):
        mode.validate(3)


@pytest.mark.parametrize(
    "param, value",
    [
        (RATE, True),  # bool is an int subclass: refused for float
        (Param("n", int, 1, "n"), False),
        (Param("n", int, 1, "n"), 1.0),  # float for int
        (RATE, "100"),  # str for float
        (Param("flag", bool, False, "f"), 1),  # int for bool
        (Param("flag", bool, False, "f"), "true"),
        (Param("s", str, "x", "s"), 3),
        (Param("v", FLOAT_LIST, [0.0], "v"), "1.0"),  # str is not a list
        (Param("v", FLOAT_LIST, [0.0], "v"), 1.0),
        (Param("v", FLOAT_LIST, [0.0], "v"), [1.0, True]),
        (Param("v", INT_LIST, [0], "v"), [1, 2.5]),
    ],
)
def test_wrong_types_are_refused(param, value):
    with pytest.raises(ParameterError) as info:
        param.validate(value)
    assert info.value.key == param.name
    assert f"parameter {param.name!r}" in str(info.value)
    assert "expected" in str(info.value)


def test_type_message():
    with pytest.raises(ParameterError) as info:
        RATE.validate("100")
    assert str(info.value) == "parameter 'rate_hz' = '100' has type str, expected float"


def test_nan_is_refused_even_without_bounds():
    free = Param("x", float, 0.0, "x")
    with pytest.raises(ParameterError, match="NaN"):
        free.validate(float("nan"))
    with pytest.raises(ParameterError, match="NaN"):
        Param("v", FLOAT_LIST, [], "v").validate([0.0, math.nan])
    assert free.validate(math.inf) == math.inf


def test_int_is_coerced_to_float():
    value = RATE.validate(50)
    assert value == 50.0 and type(value) is float
    values = Param("v", FLOAT_LIST, [0.0], "v").validate((1, 2.5))
    assert values == [1.0, 2.5] and all(type(v) is float for v in values)
    assert type(values) is list


def test_numpy_values_are_accepted():
    assert type(RATE.validate(np.float32(2.5))) is float
    assert type(RATE.validate(np.int64(3))) is float
    assert Param("n", int, 1, "n").validate(np.int32(7)) == 7
    assert Param("f", bool, False, "f").validate(np.bool_(True)) is True
    assert Param("v", FLOAT_LIST, [], "v").validate(np.array([1, 2])) == [1.0, 2.0]
    with pytest.raises(ParameterError):
        RATE.validate(np.bool_(True))


def test_list_length_and_element_bounds():
    gains = make_schema().params["gains"]
    assert gains.validate([0.0, 2.0, 1]) == [0.0, 2.0, 1.0]
    with pytest.raises(ParameterError) as info:
        gains.validate([1.0, 1.0])
    assert str(info.value) == "parameter 'gains' = [1.0, 1.0] has length 2, expected 3"
    with pytest.raises(ParameterError) as info:
        gains.validate([1.0, 2.5, 1.0])
    assert "element [1] = 2.5 is out of range [0.0, 2.0]" in str(info.value)
    assert info.value.key == "gains"


def test_one_sided_range_text():
    step = make_schema().params["limits.max_step"]
    assert format_range(step) == "[0.0, +inf) m"
    assert format_range(Param("x", float, 0.0, "x", max=1.0)) == "(-inf, 1.0]"
    assert format_range(Param("x", float, 0.0, "x")) == ""
    with pytest.raises(ParameterError, match=r"= -0.5 is out of range \[0.0, \+inf\) m"):
        step.validate(-0.5)


def test_describe():
    assert RATE.describe() == "Control loop rate [Hz] (range [1.0, 1000.0])"
    assert SOURCE.describe() == "Pose source (one of ['openvr', 'replay', 'synthetic'])"
    gains = make_schema().params["gains"]
    assert gains.describe() == "Per-axis gain (range [0.0, 2.0] per element; length 3)"
    assert Param("x", bool, True, "Plain").describe() == "Plain"


@given(st.floats(allow_nan=False))
def test_property_inside_returns_itself_outside_raises(value):
    param = Param("x", float, 0.0, "x", "m", min=-10.0, max=10.0)
    if -10.0 <= value <= 10.0:
        assert param.validate(value) == value
    else:
        with pytest.raises(ParameterError, match=r"out of range \[-10.0, 10.0\] m"):
            param.validate(value)


# --- Param declaration -----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(name="x", type=float, default=2.0, description="d", min=0.0, max=1.0),
        dict(name="x", type=str, default="c", description="d", choices=("a", "b")),
        dict(name="x", type=FLOAT_LIST, default=[1.0], description="d", length=2),
        dict(name="x", type=int, default=1.5, description="d"),
        dict(name="", type=int, default=1, description="d"),
        dict(name="x", type=float, default=0.5, description="d", min=1.0, max=0.0),
        dict(name="x", type=dict, default={}, description="d"),
        dict(name="x", type=str, default="a", description="d", min=0.0),
        dict(name="x", type=int, default=1, description="d", length=1),
    ],
)
def test_bad_declaration_fails_at_construction(kwargs):
    with pytest.raises(ConfigurationError):
        Param(**kwargs)


def test_default_and_float_bounds_are_coerced_and_defaults_are_copies():
    param = Param("x", float, 1, "x", "m", min=0, max=2)
    assert type(param.default) is float
    assert format_range(param) == "[0.0, 2.0] m"
    schema = make_schema()
    first = schema.defaults()
    first["gains"].append(9.0)
    assert schema.defaults()["gains"] == [1.0, 1.0, 1.0]


def test_duplicate_names_fail():
    with pytest.raises(ConfigurationError, match="rate_hz"):
        ParamSchema("n", [RATE, RATE])


# --- ParamSchema.validate --------------------------------------------------------


def test_validate_overlays_defaults_in_declared_order():
    schema = make_schema()
    values = schema.validate({"rate_hz": 50, "source": "openvr"})
    assert list(values) == list(schema.params)
    assert values["rate_hz"] == 50.0 and values["source"] == "openvr"
    assert values["queue"] == 10


def test_unknown_key_names_key_and_suggests():
    with pytest.raises(ParameterError) as info:
        make_schema().validate({"rate_hz_": 10.0})
    message = str(info.value)
    assert info.value.key == "rate_hz_"
    assert "unknown parameter 'rate_hz_' for node 'demo_node'" in message
    assert "known: rate_hz, source, queue" in message
    assert "did you mean 'rate_hz'?" in message


def test_unknown_key_without_close_match_has_no_suggestion():
    with pytest.raises(ParameterError) as info:
        make_schema().validate({"zzzzzz": 1})
    assert "did you mean" not in str(info.value)


def test_allow_partial_false_requires_every_key():
    schema = make_schema()
    with pytest.raises(ParameterError, match="missing"):
        schema.validate({"rate_hz": 10.0}, allow_partial=False)
    assert schema.validate(schema.defaults(), allow_partial=False) == schema.defaults()


# --- YAML ------------------------------------------------------------------------


def test_load_standard_layout(tmp_path):
    path = write(
        tmp_path,
        """\
        demo_node:
          ros__parameters:
            rate_hz: 200
            source: replay
            gains: [0.5, 1, 1.5]
        """,
    )
    values = make_schema().load_yaml(path)
    assert values["rate_hz"] == 200.0 and type(values["rate_hz"]) is float
    assert values["source"] == "replay"
    assert values["gains"] == [0.5, 1.0, 1.5]
    assert values["queue"] == 10  # default


@pytest.mark.parametrize("section", ["/demo_node", "/**", "**", "robot/demo_node",
                                     "/robot/left/demo_node"])
def test_load_other_section_names(tmp_path, section):
    path = write(tmp_path, f'"{section}":\n  ros__parameters:\n    queue: 7\n')
    assert make_schema().load_yaml(path)["queue"] == 7


def test_load_nested_namespace_mapping_and_merge_order(tmp_path):
    path = write(
        tmp_path,
        """\
        /**:
          ros__parameters:
            queue: 3
            rate_hz: 20.0
        robot:
          demo_node:
            ros__parameters:
              queue: 4
        other_node:
          ros__parameters:
            unrelated: 1
        """,
    )
    values = make_schema().load_yaml(path)
    assert values["queue"] == 4  # later, more specific section wins
    assert values["rate_hz"] == 20.0


def test_nested_dicts_flatten_to_dotted_keys(tmp_path):
    path = write(
        tmp_path,
        """\
        demo_node:
          ros__parameters:
            limits:
              max_step: 0.2
              max_turn: 0.5
        """,
    )
    values = make_schema().load_yaml(path)
    assert values["limits.max_step"] == 0.2 and values["limits.max_turn"] == 0.5


def test_nested_bad_value_names_dotted_key(tmp_path):
    path = write(tmp_path, "demo_node:\n  ros__parameters:\n    limits:\n      max_turn: 3.0\n")
    with pytest.raises(ParameterError) as info:
        make_schema().load_yaml(path)
    assert info.value.key == "limits.max_turn"
    assert "'limits.max_turn' = 3.0 is out of range [0.0, 1.0] rad" in str(info.value)


def test_yaml_bad_value_and_unknown_key_name_the_file(tmp_path):
    path = write(tmp_path, "demo_node:\n  ros__parameters:\n    rate_hz: 5000.0\n")
    with pytest.raises(ParameterError) as info:
        make_schema().load_yaml(path)
    assert "parameter 'rate_hz' = 5000.0 is out of range [1.0, 1000.0] Hz" in str(info.value)
    assert str(path) in str(info.value)

    path = write(tmp_path, "demo_node:\n  ros__parameters:\n    sorce: replay\n", "b.yaml")
    with pytest.raises(ParameterError) as info:
        make_schema().load_yaml(path)
    assert info.value.key == "sorce"
    assert "did you mean 'source'?" in str(info.value) and str(path) in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigurationError, match="nope.yaml"):
        make_schema().load_yaml(path)


def test_missing_section_lists_sections_found(tmp_path):
    path = write(
        tmp_path,
        "other_node:\n  ros__parameters:\n    a: 1\nns/third:\n  ros__parameters:\n    b: 2\n",
    )
    with pytest.raises(ConfigurationError) as info:
        make_schema().load_yaml(path)
    assert "demo_node" in str(info.value)
    assert "other_node, ns/third" in str(info.value)


def test_empty_file_has_no_section(tmp_path):
    with pytest.raises(ConfigurationError, match=r"\(none\)"):
        make_schema().load_yaml(write(tmp_path, ""))


def test_keys_outside_ros_parameters_are_errors(tmp_path):
    path = write(tmp_path, "demo_node:\n  ros__parameters:\n    queue: 2\n  queue: 3\n")
    with pytest.raises(ConfigurationError, match="outside ros__parameters: queue"):
        make_schema().load_yaml(path)
    path = write(tmp_path, "demo_node:\n  rate_hz: 10.0\n", "b.yaml")
    with pytest.raises(ConfigurationError, match="rate_hz"):
        make_schema().load_yaml(path)


def test_malformed_yaml_is_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="params.yaml"):
        make_schema().load_yaml(write(tmp_path, "demo_node: [unclosed\n"))


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        # an unclosed list: the parser notices at the end of the file, and says where the list starts
        ("demo_node:\n  ros__parameters:\n    ids: [1, 2\n", "line 4, column 1",
         "expected ',' or ']', but got '<stream end>' (while parsing a flow sequence at line 3, column 10)"),
        ("demo_node:\n  ros__parameters:\n    source: 'replay\n", "line 4, column 1",
         "found unexpected end of stream (while scanning a quoted scalar at line 3, column 13)"),
        ("demo_node:\n\tros__parameters: {}\n", "line 2, column 1",
         "found character '\\t' that cannot start any token"),
        ("demo_node:\n  ros__parameters:\n    queue: 2\n   rate_hz: 5.0\n", "line 4, column 4",
         "expected <block end>, but found '<block mapping start>'"),
    ],
    ids=["unclosed-list", "unclosed-quote", "tab", "indentation"],
)
def test_malformed_yaml_names_file_line_and_column(tmp_path, text, where, problem):
    path = write(tmp_path, text)
    with pytest.raises(ConfigurationError) as info:
        make_schema().load_yaml(path)
    message = str(info.value)
    assert message.startswith(f"parameter file {path}, {where}: invalid YAML: {problem}"), message
    assert "\n" not in message  # one line: launch and the node logs print it as such


def test_unreadable_parameter_files_name_the_file(tmp_path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"demo_node:\n  ros__parameters:\n    source: r\xe9play\n")
    with pytest.raises(ConfigurationError, match=r"cannot read parameter file .*latin1\.yaml: 'utf-8' codec"):
        make_schema().load_yaml(latin1)
    with pytest.raises(ConfigurationError, match=f"cannot read parameter file {tmp_path}"):
        make_schema().load_yaml(tmp_path)  # a folder


def test_to_yaml_round_trip_and_comments(tmp_path):
    schema = make_schema()
    text = schema.to_yaml()
    assert "    # Control loop rate [Hz] (range [1.0, 1000.0])\n    rate_hz: 100.0\n" in text
    assert "# Max step per tick [m] (range [0.0, +inf))" in text
    assert "\n    # ids: []\n" in text  # an untyped empty array stays commented out
    path = write(tmp_path, text)
    assert schema.load_yaml(path) == schema.defaults()


def test_to_yaml_round_trip_with_non_default_values(tmp_path):
    schema = ParamSchema(
        "demo_node",
        [
            Param("a", float, 1e-9, "tiny"),
            Param("b", float, -math.inf, "inf"),
            Param("c", str, "yes", "looks like a bool"),
            Param("d", str, "1.5", "looks like a float"),
            Param("e", STR_LIST, ["on", "", "x y"], "tricky strings"),
            Param("f", int, -(2**40), "big int"),
        ],
    )
    loaded = schema.load_yaml(write(tmp_path, schema.to_yaml()))
    assert loaded == schema.defaults()
    assert type(loaded["c"]) is str and type(loaded["d"]) is str
