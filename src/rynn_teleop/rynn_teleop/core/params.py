"""Declarative parameters: declare once, load from YAML, validate at start.

Every node describes its parameters as a :class:`ParamSchema` of :class:`Param`
entries (type, default, units, inclusive bounds, choices, list length, whether it
may change at runtime). The schema validates values with messages that name the
key, the offending value and what is allowed (an unknown key: the known ones and
the closest, :func:`did_you_mean`); loads standard ROS 2 parameter files; and
renders a commented parameter file of its defaults (:meth:`ParamSchema.to_yaml`,
``rynn-teleop params NODE``, which wrote ``config/<node>.yaml``). The same
declarations serve every other setting: the backends' settings blocks
(:mod:`.plugins`), the training runs' keys and the core objects' fields
(:mod:`.settings`). This module is ROS-free; ``rynn_teleop.nodes.parameters``
declares a schema on an rclpy node.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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


class _Required:
    """The type of :data:`REQUIRED`."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a parameter that has none: a value must be given (run configs' input and output folders)."""


def did_you_mean(name: Any, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` naming the known name closest to ``name``, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def nonempty(value: Any) -> str | None:
    """A :attr:`Param.check`: a string (or list) must not be empty (blank strings are empty)."""
    empty = not value.strip() if isinstance(value, str) else not value
    return "is empty" if empty else None


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
    ``also`` lists values accepted as they are besides the type (``"auto"`` for a bool);
    ``check`` is a further test of a value that passed the others: it returns what is wrong with it
    (``"is empty"``, appended to the parameter and value in the error) or None. A ``default`` of
    :data:`REQUIRED` means there is none: a value must be given.
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
    also: tuple = ()
    check: Callable[[Any], str | None] | None = None

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
        object.__setattr__(self, "also", tuple(self.also))
        for bound in ("min", "max"):  # float bounds print as floats: [0.0, 1.0] not [0, 1]
            if element is float and getattr(self, bound) is not None:
                object.__setattr__(self, bound, float(getattr(self, bound)))
        if self.required:
            return
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

    @property
    def required(self) -> bool:
        """True when the parameter has no default (:data:`REQUIRED`)."""
        return self.default is REQUIRED

    def _check_one(self, value: Any, shown: str) -> Any:
        """Coerce and check one scalar (``shown`` prefixes the message)."""
        kind = self.element_type
        try:
            value = _coerce_scalar(value, kind)
        except ValueError:
            raise ParameterError(self.name, f"{shown} is not a number (NaN)") from None
        except TypeError as exc:
            also = "".join(f" or {v!r}" for v in self.also)
            raise ParameterError(
                self.name, f"{shown} has type {exc}, expected {_type_name(self.type)}{also}"
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
        if any(type(value) is type(special) and value == special for special in self.also):
            return value
        value = self._check_all(value, shown)
        problem = self.check(value) if self.check is not None else None
        if problem:
            raise ParameterError(self.name, f"{shown} {problem}")
        return value

    def _check_all(self, value: Any, shown: str) -> Any:
        """The value, or each element of a list, coerced and checked (``shown`` prefixes messages)."""
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
        if self.also:
            notes.append("or " + " or ".join(repr(v) for v in self.also))
        if self.required:
            notes.append("required")
        return text + (f" ({'; '.join(notes)})" if notes else "")


class ParamSchema:
    """The ordered parameters of one node (``node_name`` is its ROS node name).

    ``what`` names the owner in messages (``"node"``; ``"run config"`` for a training run's keys);
    ``renamed`` maps former keys to their new names: a former key is refused with a message naming
    the new one.
    """

    def __init__(self, node_name: str, params: Sequence[Param], *, what: str = "node",
                 renamed: Mapping[str, str] | None = None) -> None:
        self.node_name = node_name
        self.what = what
        self.renamed: Mapping[str, str] = MappingProxyType(dict(renamed or {}))
        self._params = self._table(params)

    def _table(self, params: Sequence[Param]) -> Mapping[str, Param]:
        """``params`` by name (ConfigurationError: a name declared twice)."""
        table: dict[str, Param] = {}
        for param in params:
            if param.name in table:
                raise ConfigurationError(
                    f"parameter {param.name!r} is declared twice for {self.what} {self.node_name!r}"
                )
            table[param.name] = param
        return MappingProxyType(table)

    @property
    def params(self) -> Mapping[str, Param]:
        """Every parameter by name, in declaration order."""
        return self._params

    def defaults(self) -> dict[str, Any]:
        """A fresh dict of every parameter's default (lists are copies; required ones are left out)."""
        return {n: list(p.default) if p.is_list else p.default
                for n, p in self.params.items() if not p.required}

    def validate(self, values: Mapping[str, Any], *, allow_partial: bool = True) -> dict[str, Any]:
        """Validate ``values`` and return the defaults overlaid with them (a complete dict).

        Raises :class:`ParameterError` for an unknown or renamed key, a bad value, a
        missing required key, or (when ``allow_partial`` is false) any missing key.
        """
        params = self.params
        result = self.defaults()
        for key, value in values.items():
            if key not in params:
                owner = f"{self.what} {self.node_name!r}"
                if key in self.renamed:
                    raise ParameterError(
                        key, f"parameter {key!r} of {owner} was renamed {self.renamed[key]!r}"
                    )
                raise ParameterError(
                    key, f"unknown parameter {key!r} for {owner}; known: {', '.join(params)}"
                    + did_you_mean(key, params),
                )
            result[key] = params[key].validate(value)
        required = [k for k, p in params.items() if p.required and k not in values]
        if required:
            raise ParameterError(
                required[0], f"parameter {required[0]!r} is required for {self.what} "
                f"{self.node_name!r} (missing: {', '.join(required)})"
            )
        if not allow_partial:
            missing = [k for k in params if k not in values]
            if missing:
                raise ParameterError(
                    missing[0], f"missing parameter(s) for {self.what} {self.node_name!r}: "
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

    def to_yaml(self, *, ros: bool = True) -> str:
        """A complete, commented ROS 2 parameter file of this node's defaults.

        Empty-list defaults are written commented out: a ROS parameter file
        cannot give an empty array a type, and a missing key keeps its default.
        Required parameters (no default) are written commented out, marked
        required. ``ros=False``: a plain mapping of the keys (a run config file).
        """
        lines = [f"# Parameters of {self.what} {self.node_name!r} (defaults)."]
        if ros:
            lines += [f"{self.node_name}:", "  ros__parameters:"]
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
                if value.required:
                    lines.append(f"{indent}# {key}:")
                    continue
                text = yaml.safe_dump(value.default, default_flow_style=True, width=math.inf)
                text = text.strip().removesuffix("...").strip()
                empty = value.is_list and not value.default
                lines.append(f"{indent}{'# ' if empty else ''}{key}: {text}")

        emit(tree, 2 if ros else 0)
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
