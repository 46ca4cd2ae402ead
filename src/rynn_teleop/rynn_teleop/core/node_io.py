"""What a node publishes, subscribes to, serves and calls, declared once (ROS-free).

Each node class declares its topics and services as ``IO = NodeIO(...)``: name, interface type, QoS and a
description per entry. The node creates its publishers, subscriptions and services *from* that declaration
(``TeleopNode.io_publisher`` and friends resolve the name, import the type and build the QoS), the reference
pages are generated from it (``docs/gen_reference.py``), and ``tests/test_node_io.py`` compares it with the
topics, services and types the running nodes show in the ROS graph::

    IO = NodeIO(
        publishers=(
            Topic("{command_topic}", "sensor_msgs/msg/JointState", QoS(100), "14 arm joints, position + velocity"),
            Topic("~/engaged", "std_msgs/msg/Bool", LATCHED, "true while the arms follow the operator"),
        ),
        subscriptions=(
            Topic("{joint_states_topic}", "sensor_msgs/msg/JointState", QoS(50, reliable=False),
                  "measured positions", when=(When("start_from", "measured"),), dynamic="until the first command"),
        ),
        services=(Service("~/calibrate", "std_srvs/srv/Trigger", "capture the operator calibration"),),
    )

Names: ``/absolute``, ``~/private`` (under the node's name) or a template whose ``{placeholders}`` name a
parameter of the node (``{command_topic}``: the name is that parameter's value), a *fact* the running node
reports (:attr:`NodeIO.facts`) or the variable of :attr:`Topic.each` (``{side}``). A backend may declare
its own ``IO`` (class attribute of the registered class, :mod:`.plugins`); its placeholders name its own
settings first (``{input_topic}`` for ``skeleton.input_topic``), then the node's parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import ConfigurationError

#: the type of a subscription made to whatever type the topic's publishers have (the recorder, Foxglove)
ANY_TYPE = "*"
#: the interface kinds a node has, in the order the reference pages list them
KINDS = ("publishers", "subscriptions", "services", "clients")

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")
_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*/(msg|srv)/[A-Z][A-Za-z0-9]*$")
_MAX_PASSES = 4  # a parameter's value may itself hold a placeholder ("/xr/hands/{side}"): resolved again


class NodeIOError(ConfigurationError):
    """A declaration that cannot be resolved or does not hold (an unknown placeholder, a creation the
    declaration does not allow)."""


class QoS(NamedTuple):
    """The quality of service of a topic, as declared (``nodes.io.qos_profile`` makes the rclpy profile).

    History is always keep-last ``depth``.
    """

    depth: int  # [messages] kept for a late reader
    reliable: bool = True  # False: best effort
    latched: bool = False  # transient local: a late subscriber gets the newest ``depth`` messages

    def describe(self) -> str:
        words = ["reliable" if self.reliable else "best effort"]
        if self.latched:
            words.append("transient local (latched)")
        return ", ".join(words) + f", depth {self.depth}"


#: rclpy's ``qos_profile_sensor_data`` (camera streams, the clutch pedal)
SENSOR_DATA = QoS(5, reliable=False)
#: a latched topic: one value, delivered to every subscriber that comes later
LATCHED = QoS(1, latched=True)


class When(NamedTuple):
    """A condition on a parameter (or fact) under which an entry exists: its value is one of ``values``
    (``negate``: is none of them)."""

    key: str
    values: tuple[Any, ...]
    negate: bool = False

    def holds(self, values: Mapping[str, Any]) -> bool:
        if self.key not in values:
            raise NodeIOError(f"condition on {self.key!r}: no such parameter or fact (known: "
                              f"{', '.join(sorted(values))})")
        return (values[self.key] in self.values) != self.negate

    def describe(self) -> str:
        shown = " or ".join(f"`{_literal(v)}`" for v in self.values)
        return f"`{self.key}` {'is not' if self.negate else 'is'} {shown}"


def when(key: str, *values: Any) -> When:
    """``key`` is one of ``values``."""
    return When(key, tuple(values))


def unless(key: str, *values: Any) -> When:
    """``key`` is none of ``values`` (``unless("reanchor_topic", "")``: the topic is set)."""
    return When(key, tuple(values), negate=True)


class Each(NamedTuple):
    """One entry per value of a variable: the elements of the list parameter ``param`` (repeats once), or
    the fixed ``values``."""

    var: str
    param: str | None = None
    values: tuple[Any, ...] = ()

    def items(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        if self.param is None:
            return self.values
        if self.param not in values:
            raise NodeIOError(f"{{{self.var}}}: no parameter {self.param!r} to take its values from")
        return tuple(dict.fromkeys(values[self.param]))

    def describe(self) -> str:
        if self.param is not None:
            return f"one per element of `{self.param}` as `{{{self.var}}}`"
        return f"one per `{{{self.var}}}` in " + ", ".join(f"`{v}`" for v in self.values)


@dataclass(frozen=True)
class Topic:
    """A topic a node publishes or subscribes to.

    Attributes:
        name: ``/absolute``, ``~/private`` or a template (see the module docstring).
        type: ``package/msg/Type`` (:data:`ANY_TYPE`: whatever the publishers have).
        qos: as declared; None: matched to what the topic's publishers offer (discovered at run time).
        description: what flows, for people (units, frames, rates).
        when: conditions (all must hold) under which the node has it; empty: always.
        each: one such topic per value of a variable.
        dynamic: when it exists beyond ``when``, for topics the node creates or drops as it runs ("until the
            first command", "once a publisher appears"); such a topic may be absent from the graph.
    """

    name: str
    type: str
    qos: QoS | None
    description: str
    when: tuple[When, ...] = ()
    each: Each | None = None
    dynamic: str = ""

    def __post_init__(self) -> None:
        _check_entry(self, "msg")


@dataclass(frozen=True)
class Service:
    """A service a node serves or calls: ``type`` is ``package/srv/Type``; the other fields as :class:`Topic`."""

    name: str
    type: str
    description: str
    when: tuple[When, ...] = ()
    each: Each | None = None
    dynamic: str = ""

    def __post_init__(self) -> None:
        _check_entry(self, "srv")


Entry = Topic | Service


def _check_entry(entry: Entry, kind: str) -> None:
    if entry.type != ANY_TYPE and not (_TYPE.match(entry.type) and f"/{kind}/" in entry.type):
        raise NodeIOError(f"{entry.name}: type {entry.type!r} is not 'package/{kind}/Type'")
    if not entry.name or not entry.description:
        raise NodeIOError(f"{entry.name or '(no name)'}: a declared entry needs a name and a description")
    if isinstance(entry.when, When) or not all(isinstance(w, When) for w in entry.when):
        raise NodeIOError(f"{entry.name}: `when` is a tuple of When conditions")


class Endpoint(NamedTuple):
    """One resolved topic or service of a running node."""

    name: str  # fully qualified
    type: str  # package/msg/Type, package/srv/Type or ANY_TYPE
    declared: Entry  # the declaration it comes from


@dataclass(frozen=True)
class NodeIO:
    """Every topic and service of one node (or one backend), by kind.

    Attributes:
        facts: what only the running node knows and ``when`` or names refer to (fact -> description), e.g. a
            backend's capability; the node sets them in ``TeleopNode.io_facts`` before creating the entries
            that depend on them.
    """

    publishers: tuple[Topic, ...] = ()
    subscriptions: tuple[Topic, ...] = ()
    services: tuple[Service, ...] = ()
    clients: tuple[Service, ...] = ()
    facts: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind in KINDS:
            entries = getattr(self, kind)
            expected = Topic if kind in ("publishers", "subscriptions") else Service
            if not all(isinstance(e, expected) for e in entries):
                raise NodeIOError(f"NodeIO.{kind} holds only {expected.__name__} entries")
            names = [e.name for e in entries]
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise NodeIOError(f"NodeIO.{kind}: {', '.join(repeated)} declared twice")

    def entries(self, kind: str) -> tuple[Entry, ...]:
        if kind not in KINDS:
            raise NodeIOError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
        return getattr(self, kind)

    def entry(self, kind: str, name: str) -> Entry:
        """The entry of ``kind`` declared as ``name`` (exactly as written in the declaration)."""
        for e in self.entries(kind):
            if e.name == name:
                return e
        declared = ", ".join(e.name for e in self.entries(kind)) or "none"
        raise NodeIOError(f"no {kind[:-1]} {name!r} declared; declared {kind}: {declared}")

    def __bool__(self) -> bool:
        return any(self.entries(kind) for kind in KINDS)

    def placeholders(self) -> set[str]:
        """Every name a placeholder, condition or ``each`` refers to (``each`` variables excluded)."""
        out: set[str] = set()
        for kind in KINDS:
            for e in self.entries(kind):
                variables = {e.each.var} if e.each else set()
                out |= set(_PLACEHOLDER.findall(e.name)) - variables
                out |= {w.key for w in e.when}
                if e.each is not None and e.each.param is not None:
                    out.add(e.each.param)
        return out

    def check(self, known: Iterable[str], where: str) -> None:
        """Fail fast: every placeholder and condition names one of ``known`` (parameters) or a fact.

        Raises:
            NodeIOError: naming the unknown ones and what is known.
        """
        known = set(known) | set(self.facts)
        unknown = sorted(self.placeholders() - known)
        if unknown:
            raise NodeIOError(f"{where}: the IO declaration refers to {', '.join(unknown)}, which are neither "
                              f"parameters nor declared facts")

    def resolve(self, node_name: str, values: Mapping[str, Any], namespace: str = "/") -> dict[str, list[Endpoint]]:
        """The endpoints this declaration gives a node named ``node_name`` whose parameters and facts are
        ``values``: kind -> endpoints whose conditions hold (one per ``each`` value)."""
        out: dict[str, list[Endpoint]] = {kind: [] for kind in KINDS}
        for kind in KINDS:
            for e in self.entries(kind):
                if not all(w.holds(values) for w in e.when):
                    continue
                for extra in expansions(e, values):
                    out[kind].append(Endpoint(resolve_name(e.name, {**values, **extra}, node_name, namespace),
                                              e.type, e))
        return out


def expansions(entry: Entry, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``each`` bindings of ``entry`` (one empty binding without ``each``)."""
    if entry.each is None:
        return [{}]
    return [{entry.each.var: v} for v in entry.each.items(values)]


def resolve_name(template: str, values: Mapping[str, Any], node_name: str, namespace: str = "/") -> str:
    """The fully qualified name of ``template`` with ``values`` (repeated slashes collapsed, no trailing one).

    Raises:
        NodeIOError: a placeholder with no value.
    """
    name = template
    for _ in range(_MAX_PASSES):
        missing = [k for k in _PLACEHOLDER.findall(name) if k not in values]
        if missing:
            raise NodeIOError(f"{template!r}: no value for {', '.join('{' + k + '}' for k in missing)}")
        new = _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), name)
        if new == name:
            break
        name = new
    ns = "/" + namespace.strip("/")
    if name.startswith("~"):
        name = f"{ns}/{node_name}/{name[1:]}"
    elif not name.startswith("/"):
        name = f"{ns}/{name}"
    name = re.sub("/+", "/", name)
    return name.rstrip("/") or "/"


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return "''"
    return str(value)


def merged(*parts: NodeIO) -> NodeIO:
    """One declaration of several (a node's own and what its base class adds)."""
    return NodeIO(**{kind: tuple(e for p in parts for e in p.entries(kind)) for kind in KINDS},
                  facts={k: v for p in parts for k, v in p.facts.items()})


def backend_values(values: Mapping[str, Any], backend: str) -> dict[str, Any]:
    """The values a backend's IO placeholders see: its own settings (``<backend>.<key>`` as ``key``) over
    the node's parameters."""
    prefix = f"{backend}."
    return {**values, **{k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}}


#: what every node has, created by rclpy and ``TeleopNode`` rather than declared by each node
BASE_IO = NodeIO(
    publishers=(
        Topic("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", QoS(10),
              "1 Hz: the node's status, meters (rates, latencies) and counters"),
        Topic("/rosout", "rcl_interfaces/msg/Log", QoS(1000, latched=True), "the node's log (rclpy)"),
        Topic("/parameter_events", "rcl_interfaces/msg/ParameterEvent", QoS(1000),
              "parameter changes (rclpy)"),
    ),
    services=tuple(
        Service(f"~/{name}", f"rcl_interfaces/srv/{type_name}", f"the standard parameter service ({name})")
        for name, type_name in (("describe_parameters", "DescribeParameters"),
                                ("get_parameter_types", "GetParameterTypes"),
                                ("get_parameters", "GetParameters"), ("list_parameters", "ListParameters"),
                                ("set_parameters", "SetParameters"),
                                ("set_parameters_atomically", "SetParametersAtomically"))
    ) + (Service("~/get_type_description", "type_description_interfaces/srv/GetTypeDescription",
                 "the interface definitions of the node's topics (rclpy)", dynamic="ROS 2 Jazzy and later"),),
)

#: what every managed (lifecycle) node has besides :data:`BASE_IO`, created by rclpy's lifecycle support
LIFECYCLE_IO = NodeIO(
    publishers=(Topic("~/transition_event", "lifecycle_msgs/msg/TransitionEvent", QoS(10),
                      "each lifecycle transition (rclpy)"),),
    services=tuple(
        Service(f"~/{name}", f"lifecycle_msgs/srv/{type_name}", f"the standard lifecycle service ({name})")
        for name, type_name in (("change_state", "ChangeState"), ("get_state", "GetState"),
                                ("get_available_states", "GetAvailableStates"),
                                ("get_available_transitions", "GetAvailableTransitions"),
                                ("get_transition_graph", "GetAvailableTransitions"))
    ),
)
