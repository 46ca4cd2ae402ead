"""Reading a YAML file with errors that name the file and, for malformed YAML, the line and column."""

from __future__ import annotations

import os
from typing import Any

import yaml

from ..errors import ConfigurationError


def read_yaml(path: str | os.PathLike, what: str = "file", *, error: type[Exception] = ConfigurationError,
              mapping: bool = False) -> Any:
    """The document of the YAML file ``path`` (None when it is empty).

    Args:
        what: the file in words, for messages ("parameter file", "calibration file", ...).
        error: the exception type raised (the caller's layer's error).
        mapping: the document must be a mapping at its top level.

    Raises:
        error: the file is missing, unreadable or not UTF-8, its YAML is malformed (the message gives the
            line and column, from 1, of the problem), or it is not a mapping when ``mapping`` asks for one.
    """
    shown = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as stream:
            data = yaml.safe_load(stream)
    except FileNotFoundError:
        raise error(f"{what} not found: {shown}") from None
    except yaml.MarkedYAMLError as exc:
        raise error(f"{what} {shown}{_yaml_problem(exc)}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise error(f"cannot read {what} {shown}: {exc}") from None
    if mapping and not isinstance(data, dict):
        raise error(f"{what} {shown}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """``, line L, column C: invalid YAML: <problem> (<context> at line l, column c)`` of a parser error."""
    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark = exc.problem_mark or exc.context_mark
    text = f", {at(mark)}" if mark is not None else ""
    text += f": invalid YAML: {exc.problem or exc.context or 'unparsable'}"
    if exc.problem and exc.context:
        text += f" ({exc.context}" + (f" at {at(exc.context_mark)})" if exc.context_mark is not None else ")")
    return text
