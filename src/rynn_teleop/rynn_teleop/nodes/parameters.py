"""Declare a :class:`~rynn_teleop.core.params.ParamSchema` on an rclpy node.

:func:`declare_schema` validates the node's overrides (``--params-file``, ``-p``
or ``parameter_overrides=``) against the schema before declaring anything, so a
node with an unknown key or a bad value refuses to start with a message naming
the key, the value and the allowed range. It then declares every parameter with
a descriptor (description with units and range, read-only unless ``dynamic``,
numeric range) and validates runtime changes of dynamic parameters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.node import Node
from rclpy.parameter import Parameter

from rynn_teleop.core.params import (
    BOOL_LIST,
    FLOAT_LIST,
    INT_LIST,
    STR_LIST,
    Param,
    ParamSchema,
    format_range,
)
from rynn_teleop.errors import ParameterError

ROS_TYPES: dict[Any, Parameter.Type] = {
    bool: Parameter.Type.BOOL,
    int: Parameter.Type.INTEGER,
    float: Parameter.Type.DOUBLE,
    str: Parameter.Type.STRING,
    FLOAT_LIST: Parameter.Type.DOUBLE_ARRAY,
    INT_LIST: Parameter.Type.INTEGER_ARRAY,
    STR_LIST: Parameter.Type.STRING_ARRAY,
    BOOL_LIST: Parameter.Type.BOOL_ARRAY,
}
"""ROS parameter type of each schema type."""

ROS_BUILTIN_PARAMETERS = frozenset({"use_sim_time", "start_type_description_service"})
"""Overrides that rclpy itself declares; never checked against a schema."""


def _is_builtin(name: str) -> bool:
    return name in ROS_BUILTIN_PARAMETERS or name.startswith("qos_overrides.")


def descriptor_for(param: Param, *, read_only: bool | None = None) -> ParameterDescriptor:
    """The ROS descriptor of ``param`` (``read_only`` defaults to ``not param.dynamic``)."""
    descriptor = ParameterDescriptor(
        description=param.describe(),
        read_only=(not param.dynamic) if read_only is None else read_only,
        type=ROS_TYPES[param.type].value,
    )
    bounded = param.min is not None and param.max is not None
    if bounded and param.type is float:
        descriptor.floating_point_range = [
            FloatingPointRange(from_value=float(param.min), to_value=float(param.max), step=0.0)
        ]
    elif bounded and param.type is int:
        descriptor.integer_range = [
            IntegerRange(from_value=math.ceil(param.min), to_value=math.floor(param.max), step=0)
        ]
    notes = []
    if param.is_list and (param.min is not None or param.max is not None):
        notes.append(f"each element in {format_range(param)}")
    if param.choices is not None:
        notes.append(f"one of {list(param.choices)}")
    if param.length is not None:
        notes.append(f"length {param.length}")
    descriptor.additional_constraints = "; ".join(notes)
    return descriptor


def declare_schema(node: Node, schema: ParamSchema) -> dict[str, Any]:
    """Validate overrides, declare every schema parameter on ``node``, return the values.

    Raises :class:`~rynn_teleop.errors.ParameterError` for an unknown override key
    or a bad override value (before anything is declared). Registers a callback
    that rejects runtime changes failing :meth:`Param.validate` with our message
    (rclpy checks read-only, type and a scalar's numeric range first, with its
    own message).
    """
    overrides: dict[str, Parameter] = getattr(node, "_parameter_overrides", None) or {}
    given = {name: p.value for name, p in overrides.items() if not _is_builtin(name)}
    for name, value in given.items():  # a parameter file's `[]` arrives untyped (NOT_SET)
        if value is None and name in schema.params and schema.params[name].is_list:
            given[name] = []
    values = schema.validate(given)
    for name in given:
        overrides[name] = Parameter(name, ROS_TYPES[schema.params[name].type], values[name])

    for name, param in schema.params.items():
        ros_type = ROS_TYPES[param.type]
        if param.is_list and not values[name]:
            # An empty list has no element type: rclpy would infer BYTE_ARRAY from [].
            # Declare by type (writable, unset), then set the final descriptor and value.
            overrides.pop(name, None)
            node.declare_parameter(name, ros_type, descriptor_for(param, read_only=False))
            result = node.set_parameters([Parameter(name, ros_type, [])])[0]
            if not result.successful:
                raise ParameterError(name, f"cannot set parameter {name!r} = []: {result.reason}")
            node.set_descriptor(name, descriptor_for(param))
        else:
            # The validated value (override or default) fixes the type: an int given
            # for a float parameter is declared as the float it was coerced to.
            node.declare_parameter(name, values[name], descriptor_for(param), ignore_override=True)

    def check(parameters: list[Parameter]) -> SetParametersResult:
        for p in parameters:
            param = schema.params.get(p.name)
            if param is None or p.type_ == Parameter.Type.NOT_SET:
                continue
            try:
                param.validate(p.value)
            except ParameterError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    node.add_on_set_parameters_callback(check)
    return values


def to_ros_parameters(schema: ParamSchema, values: Mapping[str, Any]) -> list[Parameter]:
    """``rclpy`` parameters (explicit array types, so empty lists work)."""
    out = []
    for key, value in values.items():
        param = schema.params[key]
        if param.is_list:
            out.append(Parameter(key, ROS_TYPES[param.type], list(value)))
        else:
            out.append(Parameter(key, value=value))
    return out
