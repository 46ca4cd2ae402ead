"""A node's declared topics and services (``core.node_io``) made rclpy objects, and read back from the graph.

``TeleopNode.io_publisher`` and friends call :func:`declared`: the entry as declared, its name resolved
with the node's parameters and facts, its interface class imported and its QoS built, after checking that the
declaration allows it (its ``when`` holds, its ``each`` variable is bound). :func:`node_io` resolves a node's
whole declaration (its own, its backend's, :data:`~..core.node_io.BASE_IO`) and :func:`graph_io` reads what a
node really has from the ROS graph, for the test that compares the two.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, NamedTuple

from rclpy.lifecycle import LifecycleNodeMixin
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from ..core.node_io import (
    ANY_TYPE,
    BASE_IO,
    KINDS,
    LIFECYCLE_IO,
    Endpoint,
    Entry,
    NodeIO,
    NodeIOError,
    QoS,
    backend_values,
    expansions,
    merged,
    resolve_name,
)


def qos_profile(qos: QoS) -> QoSProfile:
    """The rclpy profile of a declared :class:`~..core.node_io.QoS` (keep last ``depth``)."""
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=qos.depth,
        reliability=ReliabilityPolicy.RELIABLE if qos.reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if qos.latched else DurabilityPolicy.VOLATILE,
    )


def interface_class(type_name: str) -> Any:
    """The rclpy class of ``package/msg/Name`` or ``package/srv/Name`` (ImportError, AttributeError when its
    package is not installed)."""
    package, kind, name = type_name.split("/")
    return getattr(importlib.import_module(f"{package}.{kind}"), name)


def type_name(cls: Any) -> str:
    """``package/msg/Name`` (or ``srv``) of an rclpy interface class."""
    package, kind = cls.__module__.split(".")[:2]
    return f"{package}/{kind.lstrip('_')}/{cls.__name__}"


class Declared(NamedTuple):
    """One entry to create: what the node passes to rclpy."""

    name: str  # fully qualified
    cls: Any  # the interface class
    qos: QoSProfile | None  # None for a service, or a topic whose QoS is discovered
    entry: Entry


def declared(io: NodeIO, kind: str, template: str, values: Mapping[str, Any], node_name: str, namespace: str,
             each: Mapping[str, Any]) -> Declared:
    """The entry of ``kind`` declared as ``template``, for ``values`` (parameters and facts) and the ``each``
    binding given.

    Raises:
        NodeIOError: not declared, its conditions do not hold, or ``each`` does not bind its variable to one
            of its values.
    """
    entry = io.entry(kind, template)
    failing = [w.describe() for w in entry.when if not w.holds(values)]
    if failing:
        raise NodeIOError(f"{node_name}: {kind[:-1]} {template!r} is declared only when {' and '.join(failing)}")
    allowed = expansions(entry, values)
    if dict(each) not in allowed:
        raise NodeIOError(f"{node_name}: {kind[:-1]} {template!r} is declared for "
                          f"{', '.join(map(str, allowed))}, not {dict(each)}")
    if entry.type == ANY_TYPE:
        raise NodeIOError(f"{node_name}: {template!r} takes its type from the graph; create it directly")
    qos = getattr(entry, "qos", None)
    return Declared(resolve_name(template, {**values, **each}, node_name, namespace), interface_class(entry.type),
                    qos_profile(qos) if qos is not None else None, entry)


def node_io(cls: type, params: Mapping[str, Any], facts: Mapping[str, Any] | None = None, *,
            node_name: str | None = None, namespace: str = "/", base: bool = True) -> dict[str, list[Endpoint]]:
    """Everything node class ``cls`` declares for ``params`` and ``facts``: its ``IO``, the chosen backend's
    ``IO`` (a node with a backend choice) and, with ``base``, what every node has (:func:`standard_io`); kind ->
    endpoints."""
    node_name = node_name or cls.SCHEMA.node_name
    values = {**params, **(facts or {})}
    out = cls.IO.resolve(node_name, values, namespace)
    parts = []
    own = backend_io(cls, params)
    if own is not None:
        parts.append(own.resolve(node_name, backend_values(values, params[cls.SCHEMA.key]), namespace))
    if base:
        parts.append(standard_io(cls).resolve(node_name, values, namespace))
    for part in parts:
        for kind, endpoints in part.items():
            out[kind] += endpoints
    return out


def backend_io(cls: type, params: Mapping[str, Any]) -> NodeIO | None:
    """The ``IO`` the chosen backend of node class ``cls`` declares (None: no backend choice or none declared)."""
    schema = cls.SCHEMA
    backends = getattr(schema, "backends", None)
    if backends is None:
        return None
    return getattr(backends.backend(params[schema.key], schema.key), "IO", None)


def standard_io(cls: type) -> NodeIO:
    """What rclpy and ``TeleopNode`` give every node of class ``cls``: :data:`~..core.node_io.BASE_IO`, and
    :data:`~..core.node_io.LIFECYCLE_IO` for a managed node."""
    return merged(BASE_IO, LIFECYCLE_IO) if issubclass(cls, LifecycleNodeMixin) else BASE_IO


def graph_io(node: Any, node_name: str, namespace: str = "/") -> dict[str, dict[str, tuple[str, ...]]]:
    """What the graph shows of node ``node_name`` (seen from rclpy node ``node``): kind -> name -> types."""
    calls = {
        "publishers": node.get_publisher_names_and_types_by_node,
        "subscriptions": node.get_subscriber_names_and_types_by_node,
        "services": node.get_service_names_and_types_by_node,
        "clients": node.get_client_names_and_types_by_node,
    }
    return {kind: {name: tuple(types) for name, types in calls[kind](node_name, namespace)} for kind in KINDS}


__all__ = ["Declared", "NodeIOError", "backend_io", "declared", "graph_io", "interface_class",
           "node_io", "qos_profile", "standard_io", "type_name"]
