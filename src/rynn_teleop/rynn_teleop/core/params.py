"""Declarative node parameters: declare once, load from YAML, validate at start.

Every node describes its parameters as a :class:`ParamSchema` of :class:`Param`
entries (type, default, units, inclusive bounds, choices, list length, whether it
may change at runtime). The schema validates values with messages that name the
key, the offending value and what is allowed; loads standard ROS 2 parameter
files; and renders a commented parameter file of its defaults (:meth:`to_yaml`).
This module is ROS-free; ``rynn_teleop.nodes.parameters`` declares a schema on an
rclpy node.

List types are written as the module constants :data:`FLOAT_LIST`,
:data:`INT_LIST`, :data:`STR_LIST` and :data:`BOOL_LIST`, which are the typing
aliases ``list[float]``, ``list[int]``, ``list[str]`` and ``list[bool]``
(writing ``type=list[float]`` directly is equivalent).
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import yaml

from ..errors import ConfigurationError, ParameterError
from .yamlfile import read_yaml

FLOAT_LIST = list[float]
INT_LIST = list[int]
STR_LIST = list[str]
BOOL_LIST = list[bool]

SCALAR_TYPES: tuple[type, ...] = (bool, int, float, str)
LIST_TYPES = {FLOAT_LIST: float, INT_LIST: int, STR_LIST: str, BOOL_LIST: bool}
"""Maps each list marker to its element type."""


def _is_bool(value: Any) -> bool:
    """True for Python and numpy booleans."""
    return isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b"


def _coerce_scalar(value: Any, kind: type) -> Any:
    """Return ``value`` as ``kind`` or raise ``TypeError`` (bool never passes as a number)."""
    if kind is bool:
        if _is_bool(value):
            return bool(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    elif not _is_bool(value):
        if isinstance(value, numbers.Integral):
            return int(value) if kind is int else float(value)
        if kind is float and isinstance(value, numbers.Real):
            if math.isnan(float(value)):
                raise ValueError("nan")
            return float(value)
    raise TypeError(type(value).__name__)


def _type_name(kind: Any) -> str:
    return f"list of {LIST_TYPES[kind].__name__}" if kind in LIST_TYPES else kind.__name__


def format_range(param: Param) -> str:
    """Inclusive range of ``param`` with its units, e.g. ``[1.0, 1000.0] Hz`` or ``[0.0, +inf) s``.

    Returns ``""`` when the parameter has neither ``min`` nor ``max``.
    """
    if param.min is None and param.max is None:
        return ""
    low = "(-inf" if param.min is None else f"[{param.min!r}"
    high = "+inf)" if param.max is None else f"{param.max!r}]"
    return f"{low}, {high}" + (f" {param.units}" if param.units else "")


@dataclass(frozen=True)
class Param:
    """One node parameter.

    ``min``/``max`` are inclusive, in ``units``, and apply element-wise to lists;
    ``choices`` lists the allowed values; ``length`` is the required list length;
    ``dynamic`` parameters may change at runtime, the others are read-only.
    """

    name: str
    type: Any  # bool, int, float, str, or FLOAT_LIST / INT_LIST / STR_LIST / BOOL_LIST
    default: Any
    description: str
    units: str = ""
    min: float | None = None
    max: float | None = None
    choices: tuple | None = None
    length: int | None = None
    dynamic: bool = False

    def __post_init__(self) -> None:
        def bad(why: str) -> ConfigurationError:
            return ConfigurationError(f"bad declaration of parameter {self.name!r}: {why}")

        if not isinstance(self.name, str) or not self.name:
            raise bad("name must be a non-empty string")
        if not any(self.type == known for known in (*SCALAR_TYPES, *LIST_TYPES)):
            raise bad(f"type {self.type!r} is not bool, int, float, str or a *_LIST marker")
        element = LIST_TYPES.get(self.type, self.type)
        if (self.min is not None or self.max is not None) and element not in (int, float):
            raise bad("min/max apply to int and float parameters only")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise bad(f"min {self.min!r} > max {self.max!r}")
        if self.length is not None and (self.type not in LIST_TYPES or self.length < 0):
            raise bad("length applies to list parameters only and must be >= 0")
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        for bound in ("min", "max"):  # float bounds print as floats: [0.0, 1.0] not [0, 1]
            if element is float and getattr(self, bound) is not None:
                object.__setattr__(self, bound, float(getattr(self, bound)))
        try:
            object.__setattr__(self, "default", self.validate(self.default))
        except ParameterError as exc:
            raise ParameterError(self.name, f"invalid default: {exc}") from None

    @property
    def element_type(self) -> type:
        """Python type of the value, or of each element for list parameters."""
        return LIST_TYPES.get(self.type, self.type)

    @property
    def is_list(self) -> bool:
        return self.type in LIST_TYPES

    def _check_one(self, value: Any, shown: str) -> Any:
        """Coerce and check one scalar (``shown`` prefixes the message)."""
        kind = self.element_type
        try:
            value = _coerce_scalar(value, kind)
        except ValueError:
            raise ParameterError(self.name, f"{shown} is not a number (NaN)") from None
        except TypeError as exc:
            raise ParameterError(
                self.name, f"{shown} has type {exc}, expected {_type_name(self.type)}"
            ) from None
        if (self.min is not None and value < self.min) or (
            self.max is not None and value > self.max
        ):
            raise ParameterError(self.name, f"{shown} is out of range {format_range(self)}")
        if self.choices is not None and value not in self.choices:
            raise ParameterError(self.name, f"{shown} is not one of {list(self.choices)}")
        return value

    def validate(self, value: Any) -> Any:
        """Return ``value`` coerced to this parameter's type, or raise :class:`ParameterError`.

        Ints become floats for float parameters; lists (any sequence, numpy array
        or ``array.array``) are returned as lists.
        """
        shown = f"parameter {self.name!r} = {value!r}"
        if not self.is_list:
            return self._check_one(value, shown)
        items = value.tolist() if hasattr(value, "tolist") else value  # numpy arrays
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise ParameterError(
                self.name,
                f"{shown} has type {type(value).__name__}, expected {_type_name(self.type)}",
            )
        items = list(items)
        if self.length is not None and len(items) != self.length:
            raise ParameterError(
                self.name, f"{shown} has length {len(items)}, expected {self.length}"
            )
        return [self._check_one(v, f"{shown}: element [{i}] = {v!r}") for i, v in enumerate(items)]

    def describe(self) -> str:
        """One line ``description [units] (range ...)`` for a ROS ParameterDescriptor."""
        text = self.description + (f" [{self.units}]" if self.units else "")
        notes = []
        if self.min is not None or self.max is not None:
            bounds = format_range(self).removesuffix(f" {self.units}" if self.units else "")
            notes.append(f"range {bounds}" + (" per element" if self.is_list else ""))
        if self.choices is not None:
            notes.append(f"one of {list(self.choices)}")
        if self.length is not None:
            notes.append(f"length {self.length}")
        return text + (f" ({'; '.join(notes)})" if notes else "")


class ParamSchema:
    """The ordered parameters of one node (``node_name`` is its ROS node name)."""

    def __init__(self, node_name: str, params: Sequence[Param]) -> None:
        table: dict[str, Param] = {}
        for param in params:
            if param.name in table:
                raise ConfigurationError(
                    f"parameter {param.name!r} is declared twice for node {node_name!r}"
                )
            table[param.name] = param
        self.node_name = node_name
        self.params: Mapping[str, Param] = MappingProxyType(table)

    def defaults(self) -> dict[str, Any]:
        """A fresh dict of every parameter's default (lists are copies)."""
        return {n: list(p.default) if p.is_list else p.default for n, p in self.params.items()}

    def validate(self, values: Mapping[str, Any], *, allow_partial: bool = True) -> dict[str, Any]:
        """Validate ``values`` and return the defaults overlaid with them (a complete dict).

        Raises :class:`ParameterError` for an unknown key, a bad value, or (when
        ``allow_partial`` is false) a missing key.
        """
        result = self.defaults()
        for key, value in values.items():
            if key not in self.params:
                message = (
                    f"unknown parameter {key!r} for node {self.node_name!r}; "
                    f"known: {', '.join(self.params)}"
                )
                close = difflib.get_close_matches(str(key), list(self.params), n=1)
                raise ParameterError(
                    key, message + (f"; did you mean {close[0]!r}?" if close else "")
                )
            result[key] = self.params[key].validate(value)
        if not allow_partial:
            missing = [k for k in self.params if k not in values]
            if missing:
                raise ParameterError(
                    missing[0], f"missing parameter(s) for node {self.node_name!r}: "
                    f"{', '.join(missing)}"
                )
        return result

    def _matches(self, section: str) -> bool:
        last = section.strip("/").split("/")[-1]
        return last in (self.node_name, "**")

    def _sections(self, data: Mapping, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """Yield ``(path, body)`` for each node section of a parameter file."""
        for key, body in data.items():
            path = f"{prefix}/{key}" if prefix else str(key)
            if self._matches(path) or (isinstance(body, Mapping) and "ros__parameters" in body):
                yield path, body
            elif isinstance(body, Mapping):
                yield from self._sections(body, path)

    def load_yaml(self, path: str | os.PathLike) -> dict[str, Any]:
        """Load this node's values from a ROS 2 parameter file and validate them.

        Sections ``node``, ``/node``, ``ns/node``, ``/**`` (and nested namespace
        mappings) apply, merged in file order; nested mappings under
        ``ros__parameters`` flatten to dotted keys. Returns the complete dict.
        """
        data = read_yaml(path, "parameter file")
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"parameter file {os.fspath(path)} is not a mapping")
        found: list[str] = []
        merged: dict[str, Any] = {}
        matched = False
        for section, body in self._sections(data):
            found.append(section)
            if not self._matches(section):
                continue
            extra = [str(k) for k in body] if isinstance(body, Mapping) else [repr(body)]
            extra = [k for k in extra if k != "ros__parameters"]
            if extra or not isinstance(body, Mapping):
                raise ConfigurationError(
                    f"section {section!r} of {os.fspath(path)} has entries outside "
                    f"ros__parameters: {', '.join(extra)}"
                )
            params = body["ros__parameters"] or {}
            if not isinstance(params, Mapping):
                raise ConfigurationError(
                    f"ros__parameters of section {section!r} in {os.fspath(path)} is not a mapping"
                )
            merged.update(_flatten(params))
            matched = True
        if not matched:
            raise ConfigurationError(
                f"parameter file {os.fspath(path)} has no section for node {self.node_name!r}; "
                f"sections found: {', '.join(found) or '(none)'}"
            )
        try:
            return self.validate(merged)
        except ParameterError as exc:
            raise ParameterError(exc.key, f"{exc} (in {os.fspath(path)})") from None

    def to_yaml(self) -> str:
        """A complete, commented ROS 2 parameter file of this node's defaults.

        Empty-list defaults are written commented out: a ROS parameter file
        cannot give an empty array a type, and a missing key keeps its default.
        """
        lines = [f"# Parameters of node {self.node_name!r} (defaults).", f"{self.node_name}:",
                 "  ros__parameters:"]
        # dotted names become nested mappings, each group written once where it first appears
        tree: dict = {}
        for name, param in self.params.items():
            *path, leaf = name.split(".")
            node = tree
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = param

        def emit(node: dict, depth: int) -> None:
            indent = "  " * depth
            for key, value in node.items():
                if isinstance(value, dict):
                    lines.append(f"{indent}{key}:")
                    emit(value, depth + 1)
                    continue
                lines.append(f"{indent}# {value.describe()}")
                text = yaml.safe_dump(value.default, default_flow_style=True, width=math.inf)
                text = text.strip().removesuffix("...").strip()
                empty = value.is_list and not value.default
                lines.append(f"{indent}{'# ' if empty else ''}{key}: {text}")

        emit(tree, 2)
        return "\n".join(lines) + "\n"


def _flatten(params: Mapping, prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings to dotted keys (``{a: {b: 1}}`` -> ``{"a.b": 1}``)."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"  # YAML may give non-str keys (ints)
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
