"""Settings objects declared with the node parameters' spec (ROS-free).

A settings dataclass declares each checked field with :func:`setting`: its default, description, units and
bounds, i.e. a :class:`~.params.Param`. :class:`Settings` validates every such field on construction with
that Param, so a bad value raises the same :class:`~rynn_teleop.errors.ParameterError` (the key, the value,
what is allowed) as a bad node parameter or run-config key, and :meth:`Settings.schema` gives the fields as
a :class:`~.params.ParamSchema` (a commented YAML template, help text)::

    @dataclass(frozen=True)
    class Shading(Settings):
        SETTINGS_NAME = "shading"
        ambient: float = setting(0.35, "share of the colour every face gets", min=0.0, max=2.0)

Fields declared without :func:`setting` are not checked here (the class checks them in :meth:`_problems`,
which also reports inconsistencies between fields).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from ..errors import ParameterError
from .params import LIST_TYPES, REQUIRED, Param, ParamSchema

_SCALARS = (bool, int, float, str)


def setting(default: Any = REQUIRED, description: str = "", *, type: Any = None, units: str = "",
            min: float | None = None, max: float | None = None, choices: tuple | None = None,
            length: int | None = None, also: tuple = (), check: Callable[[Any], str | None] | None = None) -> Any:
    """A dataclass field declared as a :class:`~.params.Param` (same arguments; the name is the field's).

    ``type`` defaults to the default's (a tuple or list of floats: ``list[float]``); without a default
    (:data:`~.params.REQUIRED`) the field must be given and ``type`` is needed. List values are stored as
    tuples (a frozen dataclass stays hashable).
    """
    spec = dict(type=type, description=description, units=units, min=min, max=max, choices=choices,
                length=length, also=also, check=check)
    if isinstance(default, (list, tuple)):
        value = tuple(default)
        return dataclasses.field(default_factory=lambda: value, metadata={"setting": spec})
    if default is REQUIRED:
        return dataclasses.field(metadata={"setting": spec})
    return dataclasses.field(default=default, metadata={"setting": spec})


def _inferred_type(name: str, default: Any) -> Any:
    if default is REQUIRED:
        raise TypeError(f"setting {name!r} has no default: give its type")
    if isinstance(default, tuple):
        kinds = {type(v) for v in default}
        element = float if float in kinds else next(iter(kinds), str)
        return list[element]
    if type(default) in _SCALARS:
        return type(default)
    raise TypeError(f"setting {name!r}: cannot infer a parameter type from {default!r}; give its type")


class Settings:
    """Base of a dataclass whose :func:`setting` fields are validated on construction.

    Subclasses name themselves in messages with ``SETTINGS_NAME`` and may yield ``(field, problem)`` pairs
    from :meth:`_problems` for checks a single field cannot express.
    """

    SETTINGS_NAME: ClassVar[str] = "settings"
    SETTINGS_WHAT: ClassVar[str] = "settings"  # what the name is, in messages ("run config")

    def __post_init__(self) -> None:
        for param in self.params():
            try:
                value = param.validate(getattr(self, param.name))
            except ParameterError as exc:
                raise self._error(param.name, str(exc)) from None
            object.__setattr__(self, param.name, tuple(value) if param.is_list else value)
        for key, problem in self._problems():
            raise self._error(key, f"parameter {key!r}: {problem}")

    def _problems(self) -> Iterator[tuple[str, str]]:
        """``(field, what is wrong)`` of each problem the field declarations cannot express."""
        return iter(())

    def _error(self, key: str, message: str) -> ParameterError:
        """The error raised for ``key`` (a subclass may raise its own kind)."""
        return ParameterError(key, f"{self.SETTINGS_NAME}: {message}")

    @classmethod
    def params(cls) -> tuple[Param, ...]:
        """The declared fields as parameters, in declaration order."""
        return _params(cls)

    @classmethod
    def schema(cls) -> ParamSchema:
        """The declared fields as a :class:`~.params.ParamSchema` (messages name ``SETTINGS_WHAT`` and
        ``SETTINGS_NAME``)."""
        return _schema(cls)


@functools.cache
def _params(cls: type) -> tuple[Param, ...]:
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        if spec is None:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        kind = spec["type"] if spec["type"] is not None else _inferred_type(f.name, default)
        if kind in LIST_TYPES and isinstance(default, tuple):
            default = list(default)
        out.append(Param(f.name, kind, default, **{k: v for k, v in spec.items() if k != "type"}))
    return tuple(out)


@functools.cache
def _schema(cls: type) -> ParamSchema:
    return ParamSchema(cls.SETTINGS_NAME, _params(cls), what=cls.SETTINGS_WHAT)
