"""The nodes' status that others act on, typed, and its ``/diagnostics`` key/values (ROS-free).

Every node publishes ``/diagnostics`` once a second: a level, a message and key/value strings. The part of
those values that the console, ``rynn-teleop call status``, the demo and :class:`~.session.SessionState`
read is declared here once, per producer, as a frozen dataclass; the producer builds one and publishes
:meth:`Status.values` (its fields' keys, plus free-form extras for people), the readers call
:meth:`Status.decode`. Writer and reader share the field -> key table, so a renamed key or a changed type
fails the reader with a named error (:class:`MissingStatusKey`, :class:`BadStatusValue`) instead of reading a
default.

Each status, who writes it and who reads it:

* :class:`ArmIKStatus`: ``core.arm_session`` (arm_ik); the session (arms), the demo (engaged), tests.
* :class:`DriverStatus`: ``nodes.driver`` (arm_driver, hand_driver); the session (e-stop, drivers and their
  lifecycle states), tests.
* :class:`FeedStatus`: ``nodes.camera_switch``; the session (the active feed).
* :class:`RecorderStatus`: ``nodes.recorder``; the session (episode), the demo (topics flowing), tests.
* :class:`ConsoleStatus`: ``nodes.console``; the demo (the page's address).
* :class:`TwinStatus`: ``nodes.twin`` (the physical twin); the session (scene and task outcome), the console.
* :class:`PolicyStatus`: ``nodes.policy`` (a learned policy acting); the session (its state), the console.
* :class:`Meter`: ``nodes.base`` (every node's meters); the session (health), the demo (rates table).

Encoding of a field by its type: ``bool`` as ``True`` / ``False``; ``int``, ``float`` (``fmt`` of the field,
default ``repr``), ``str`` as written; ``tuple[str, ...]`` as a JSON list; :class:`Count` as ``done/of``;
``dict[str, bool]`` per side of :data:`~.layout.SIDES`, one key per side (the key template's ``{side}``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, ClassVar, NamedTuple, get_type_hints

import numpy as np

from ..errors import RynnTeleopError
from .layout import SIDES

#: a meter below this share of its nominal rate is flagged slow
SLOW_SHARE = 0.9


class StatusError(RynnTeleopError):
    """A status and its ``/diagnostics`` key/values do not agree."""


class MissingStatusKey(StatusError, KeyError):
    """The diagnostics of a producer lack a key its status declares (writer and reader disagree).

    Attributes:
        status: the status type (its producer) being read.
        key: the key missing.
        present: the keys the diagnostics do have.
    """

    def __init__(self, status: str, key: str, present: Iterable[str]) -> None:
        self.status, self.key, self.present = status, key, tuple(sorted(present))
        super().__init__(f"{status}: no {key!r} in the diagnostics read (the writer and this reader disagree; "
                         f"keys present: {', '.join(self.present) or 'none'})")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


class BadStatusValue(StatusError, ValueError):
    """A status value is not of its field's type (read from diagnostics, or given to a constructor).

    Attributes:
        status: the status type.
        key: the diagnostics key (or field) of the value.
        value: the value as found.
        expected: what the field takes.
    """

    def __init__(self, status: str, key: str, value: Any, expected: str) -> None:
        self.status, self.key, self.value, self.expected = status, key, value, expected
        super().__init__(f"{status}: {key} = {value!r} is not {expected}")


class StatusKeyCollision(StatusError):
    """A free-form extra value uses a key of the typed status (it would overwrite it)."""


class Count(NamedTuple):
    """``done`` of ``of`` (e.g. recorded topics subscribed of those configured); ``done/of`` in diagnostics."""

    done: int
    of: int

    @property
    def complete(self) -> bool:
        return self.done == self.of

    def __str__(self) -> str:
        return f"{self.done}/{self.of}"


# ---------------------------------------------------------------------- codecs
class _Codec(NamedTuple):
    expected: str  # what the field takes, for errors
    coerce: Any  # value given to the constructor -> the field's value (raises TypeError / ValueError)
    encode: Any  # (value, fmt) -> str
    decode: Any  # str -> value (raises ValueError)


def _coerce_bool(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError


def _decode_bool(text: str) -> bool:
    if text in ("True", "False"):
        return text == "True"
    raise ValueError


def _coerce_int(value: Any) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise TypeError


def _coerce_float(value: Any) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise TypeError


def _coerce_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise TypeError


def _coerce_strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError  # a string is an iterable of strings: never what was meant
    out = tuple(value)
    if not all(isinstance(v, str) for v in out):
        raise TypeError
    return out


def _decode_strings(text: str) -> tuple[str, ...]:
    out = json.loads(text)
    if not isinstance(out, list) or not all(isinstance(v, str) for v in out):
        raise ValueError
    return tuple(out)


def _coerce_count(value: Any) -> Count:
    done, of = value
    return Count(_coerce_int(done), _coerce_int(of))


def _decode_count(text: str) -> Count:
    done, of = text.split("/")
    return Count(int(done), int(of))


def _coerce_sides(value: Any) -> dict[str, bool]:
    if not isinstance(value, Mapping) or set(value) != set(SIDES):
        raise TypeError
    return {side: _coerce_bool(value[side]) for side in SIDES}


_CODECS: dict[Any, _Codec] = {
    bool: _Codec("True or False", _coerce_bool, lambda v, fmt: str(v), _decode_bool),
    int: _Codec("an integer", _coerce_int, lambda v, fmt: str(v), int),
    float: _Codec("a number", _coerce_float, lambda v, fmt: format(v, fmt) if fmt else repr(v), float),
    str: _Codec("a string", _coerce_str, lambda v, fmt: v, str),
    tuple[str, ...]: _Codec("a JSON list of strings", _coerce_strings, lambda v, fmt: json.dumps(list(v)),
                            _decode_strings),
    Count: _Codec("DONE/OF (two integers)", _coerce_count, lambda v, fmt: str(v), _decode_count),
}
_PER_SIDE = dict[str, bool]
_SIDE_CODEC = _CODECS[bool]


def key(name: str, fmt: str = "", doc: str = "") -> Any:
    """A status field written under the diagnostics key ``name`` (``{side}`` in it: one key per side).

    Args:
        name: the key.
        fmt: ``format`` spec of a float field (e.g. ``".1f"``); default: ``repr``.
        doc: what the field means, with its unit.
    """
    return field(metadata={"key": name, "fmt": fmt, "doc": doc})


class _Field(NamedTuple):
    name: str  # the dataclass field
    key: str  # the diagnostics key (a template with {side} for a per-side field)
    codec: _Codec
    fmt: str
    per_side: bool


# ---------------------------------------------------------------------- statuses
class Status:
    """Base of the typed statuses: a frozen dataclass whose fields are written as ``/diagnostics`` keys.

    Subclasses set :attr:`PRODUCER` (who writes it, named in errors); their fields' types are those of
    the module docstring's table, their keys the field names unless :func:`key` names another.
    """

    PRODUCER: ClassVar[str] = ""

    @classmethod
    @cache
    def _fields(cls) -> tuple[_Field, ...]:
        hints = get_type_hints(cls)
        out = []
        for f in fields(cls):  # type: ignore[arg-type]
            hint = hints[f.name]
            per_side = hint == _PER_SIDE
            codec = _SIDE_CODEC if per_side else _CODECS.get(hint)
            if codec is None:
                raise TypeError(f"{cls.__name__}.{f.name}: a status field cannot be {hint} (see core.status)")
            name = f.metadata.get("key", f.name)
            if per_side != ("{side}" in name):
                raise TypeError(f"{cls.__name__}.{f.name}: a dict[str, bool] field, and only it, has a {{side}} key")
            out.append(_Field(f.name, name, codec, f.metadata.get("fmt", ""), per_side))
        return tuple(out)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every diagnostics key this status writes, in field order."""
        return tuple(k for f in cls._fields() for k in _keys_of(f))

    def __post_init__(self) -> None:
        """Validate (and normalise: numpy scalars to Python ones) every field; raises BadStatusValue."""
        for f in self._fields():
            value = getattr(self, f.name)
            try:
                value = _coerce_sides(value) if f.per_side else f.codec.coerce(value)
            except (TypeError, ValueError):
                expected = f"a mapping of {', '.join(SIDES)} to True/False" if f.per_side else f.codec.expected
                raise BadStatusValue(type(self).__name__, f.name, value, expected) from None
            object.__setattr__(self, f.name, value)

    def encode(self) -> dict[str, str]:
        """The status as diagnostics key/values."""
        out = {}
        for f in self._fields():
            value = getattr(self, f.name)
            if f.per_side:
                out.update({f.key.format(side=s): f.codec.encode(value[s], f.fmt) for s in SIDES})
            else:
                out[f.key] = f.codec.encode(value, f.fmt)
        return out

    def values(self, extras: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """:meth:`encode` plus free-form ``extras`` (counters for people; no reader depends on them).

        Raises:
            StatusKeyCollision: an extra uses one of this status's keys.
        """
        out: dict[str, Any] = self.encode()
        extras = extras or {}
        if clash := sorted(set(out) & set(extras)):
            raise StatusKeyCollision(f"{type(self).__name__}: extra diagnostics values {clash} use keys of the "
                                     f"typed status; rename the extras")
        out.update(extras)
        return out

    @classmethod
    def decode(cls, values: Mapping[str, str]) -> Any:
        """The status from a producer's diagnostics key/values (other keys are ignored).

        Raises:
            MissingStatusKey: a key of the status is absent.
            BadStatusValue: a value is not of its field's type.
        """
        kwargs: dict[str, Any] = {}
        for f in cls._fields():
            decoded = {}
            for k in _keys_of(f):
                if k not in values:
                    raise MissingStatusKey(cls._name(), k, values)
                try:
                    decoded[k] = f.codec.decode(values[k])
                except (TypeError, ValueError):
                    raise BadStatusValue(cls._name(), k, values[k], f.codec.expected) from None
            kwargs[f.name] = ({s: decoded[f.key.format(side=s)] for s in SIDES} if f.per_side
                              else decoded[f.key])
        return cls(**kwargs)

    @classmethod
    def _name(cls) -> str:
        return f"{cls.__name__} ({cls.PRODUCER})" if cls.PRODUCER else cls.__name__


def _keys_of(f: _Field) -> tuple[str, ...]:
    return tuple(f.key.format(side=s) for s in SIDES) if f.per_side else (f.key,)


@dataclass(frozen=True)
class ArmIKStatus(Status):
    """The arm teleoperation session (arm_ik, :meth:`~.arm_session.ArmSession.arm_status`)."""

    PRODUCER: ClassVar[str] = "arm_ik"

    calibrated: bool = key("calibrated", doc="an operator calibration is in use (one serves both arms)")
    engaged: bool = key("engaged", doc="the clutch is engaged: the arms follow")
    started: bool = key("started", doc="the start gate passed (measured positions in range, or start at home)")
    following: dict[str, bool] = key("{side}.active", doc="per side: engaged and tracked this cycle")


@dataclass(frozen=True)
class DriverStatus(Status):
    """An arm or hand driver (``nodes.driver.JointDriverNode``)."""

    PRODUCER: ClassVar[str] = "arm_driver / hand_driver"

    backend: str = key("backend", doc="the backend's registered name (sim, marvin, wuji, ...)")
    mode: str = key("mode", doc="the safety layer's mode (core.safety.MODES: waiting, hold, ramp, track, ...)")
    estop: bool = key("estop", doc="the e-stop is latched (~/reset releases it)")
    latched_by: str = key("latched_by", doc="the fault that latched the e-stop ('' none, or an operator's e-stop)")
    faults: tuple[str, ...] = key("faults", doc="the backend's present faults")
    lifecycle: str = key("lifecycle", doc="the managed node's state (core.lifecycle: unconfigured, inactive, active, "
                         "finalized); only an active driver commands its joints")
    lifecycle_error: str = key("lifecycle_error", doc="why the latest lifecycle transition failed ('' when it "
                               "succeeded), e.g. a configure that found no device")


@dataclass(frozen=True)
class FeedStatus(Status):
    """The head-camera feed switch (camera_switch)."""

    PRODUCER: ClassVar[str] = "camera_switch"

    active_source: str = key("active_source", doc="the source on the consumer topic: physical or generated")
    preferred_source: str = key("preferred_source", doc="the operator's choice (differs while falling back)")
    fallback_active: bool = key("fallback_active", doc="the preferred source is silent: the other one is shown")


@dataclass(frozen=True)
class RecorderStatus(Status):
    """The recorder (``nodes.recorder``); the episode fields describe the episode being recorded."""

    PRODUCER: ClassVar[str] = "recorder"

    recording: bool = key("recording", doc="an episode is being recorded")
    episode: str = key("episode", doc="its directory ('' when not recording)")
    output_dir: str = key("output_dir", doc="where episodes go")
    elapsed_s: float = key("episode_elapsed_s", ".1f", doc="[s] since its start (0 when not recording)")
    messages: int = key("episode_messages", doc="messages it holds so far")
    problems: tuple[str, ...] = key("episode_problems", doc="its problems so far (missing topics, gaps, drops)")
    topics_subscribed: Count = key("topics_subscribed", doc="configured topics subscribed (seen in the graph)")
    topics_flowing: Count = key("topics_flowing", doc="topics with an expected rate that delivered within 1 s")
    failure: str = key("failure", doc="why the last episode failed ('' none)")

    @property
    def name(self) -> str:
        """The episode's directory name ('' when not recording)."""
        return self.episode.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ConsoleStatus(Status):
    """The operator console (``nodes.console``)."""

    PRODUCER: ClassVar[str] = "console"

    url: str = key("url", doc="the page's address (without its token)")


@dataclass(frozen=True)
class TwinStatus(Status):
    """The physical twin (``nodes.twin``): its scene and the task's outcome so far."""

    PRODUCER: ClassVar[str] = "twin"

    scene: str = key("scene", doc="the task scene's name (config/sim/<scene>.yaml)")
    seed: int = key("seed", doc="the layout's seed (the objects' initial poses)")
    task: str = key("task", doc="the task in words (place red_cube in goal)")
    outcome: str = key("outcome", doc="success (the task's predicate holds now), failure (it cannot any more) or "
                       "undecided")
    reason: str = key("outcome_reason", doc="why, in words")
    sim_time_s: float = key("sim_time_s", ".2f", doc="[s] simulated time since the last reset")
    slipped_s: float = key("slipped_s", ".3f", doc="[s] simulated time skipped because the process stalled")


@dataclass(frozen=True)
class PolicyStatus(Status):
    """A learned policy acting on the robot (``nodes.policy``; its states: ``policies.controller.STATES``).

    Its rate and inference time are the node's ``act`` meter (actions a second; latency: one act() call)."""

    PRODUCER: ClassVar[str] = "policy"

    state: str = key("state", doc="idle, running (acting), holding (stale observation: the arms hold), estopped or "
                     "error")
    reason: str = key("reason", doc="why it is in that state (stale input, the e-stop's cause, how the last run "
                      "ended); '' while running")
    backend: str = key("backend", doc="the policy backend's registered name (lerobot, replay, constant, ...)")
    source: str = key("source", doc="the policy: its folder, dataset or description")
    fps: float = key("fps", "g", doc="[Hz] the policy's frame rate (its dataset's): act() is asked for this often")
    run: int = key("run", doc="runs started since the node started (the current or last one)")
    steps: int = key("steps", doc="actions taken in the current (or last) run")
    overruns: int = key("overruns", doc="frames skipped because the previous act() was still running")
    last_error: str = key("last_error", doc="the newest failure of the policy ('' none)")
    recording: bool = key("recording", doc="the current run is being recorded as an episode (record_episodes)")


#: the statuses of the bringup's nodes, by node name (what SessionState decodes)
STATUS_OF_NODE: dict[str, type[Status]] = {
    "arm_ik": ArmIKStatus, "arm_driver": DriverStatus, "hand_driver": DriverStatus,
    "camera_switch": FeedStatus, "recorder": RecorderStatus, "console": ConsoleStatus, "twin": TwinStatus,
    "policy": PolicyStatus,
}


# ---------------------------------------------------------------------- meters (every node)
class Meter(NamedTuple):
    """One rate/latency meter of a node (``nodes.base.TeleopNode.meter``); keys ``<name>.rate_hz``, ...
    An optional part (NaN here) is not written."""

    name: str
    rate_hz: float  # measured [Hz]
    nominal_hz: float = math.nan  # [Hz] what it should show
    latency_p50_ms: float = math.nan  # [ms]
    latency_p99_ms: float = math.nan  # [ms]
    latency_budget_ms: float = math.nan  # [ms] the p99 it should stay under

    @property
    def slow(self) -> bool:
        """Below :data:`SLOW_SHARE` of its nominal rate."""
        return not math.isnan(self.nominal_hz) and self.rate_hz < SLOW_SHARE * self.nominal_hz

    @property
    def late(self) -> bool:
        """Its p99 latency is over its budget."""
        return not math.isnan(self.latency_budget_ms) and self.latency_p99_ms > self.latency_budget_ms


#: Meter field -> (key suffix, format); the rate is the one always written
_METER_KEYS = {"rate_hz": ("rate_hz", ".1f"), "nominal_hz": ("nominal_hz", "g"),
               "latency_budget_ms": ("latency_budget_ms", "g"), "latency_p50_ms": ("latency_p50_ms", ".2f"),
               "latency_p99_ms": ("latency_p99_ms", ".2f")}
_RATE_SUFFIX = ".rate_hz"


def encode_meters(meters: Iterable[Meter]) -> dict[str, str]:
    """Meters as diagnostics key/values (the NaN parts left out)."""
    out = {}
    for m in meters:
        for part, (suffix, fmt) in _METER_KEYS.items():
            value = getattr(m, part)
            if not math.isnan(value):
                out[f"{m.name}.{suffix}"] = format(value, fmt)
    return out


def decode_meters(values: Mapping[str, str]) -> list[Meter]:
    """The meters in a node's diagnostics, by name: every ``<name>.rate_hz`` key and its optional parts.

    Raises:
        BadStatusValue: a meter value is not a number.
    """
    out = []
    for name in sorted(k[: -len(_RATE_SUFFIX)] for k in values if k.endswith(_RATE_SUFFIX)):
        parts = {}
        for part, (suffix, _) in _METER_KEYS.items():
            text = values.get(f"{name}.{suffix}")
            try:
                parts[part] = math.nan if text is None else float(text)
            except ValueError:
                raise BadStatusValue("Meter (every node)", f"{name}.{suffix}", text, "a number") from None
        out.append(Meter(name, **parts))
    return out
