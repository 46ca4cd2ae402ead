"""Node I/O declared once (``core.node_io``): the declarations resolve, refuse what they do not declare, and
match the topics, services and types the running nodes show in the ROS graph."""

from __future__ import annotations

import time

import pytest
import rclpy
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, ReliabilityPolicy

from rynn_teleop import bringup
from rynn_teleop.core.node_io import (
    ANY_TYPE,
    KINDS,
    LATCHED,
    SENSOR_DATA,
    Each,
    NodeIO,
    NodeIOError,
    QoS,
    Service,
    Topic,
    backend_values,
    resolve_name,
    unless,
    when,
)
from rynn_teleop.core.plugins import BackendSchema
from rynn_teleop.nodes import REGISTRY, node_class
from rynn_teleop.nodes.io import declared, graph_io, node_io, qos_profile
from rynn_teleop.runner import Composition

GRAPH_TIMEOUT_S = 30.0  # [s] for the graph to show every node's entities (a loaded 2-core machine)


# ---------------------------------------------------------------------- the declarations themselves
def test_names_resolve_from_parameters_facts_and_each():
    assert resolve_name("{prefix}/trackers", {"prefix": "/operator/"}, "tracker") == "/operator/trackers"
    assert resolve_name("~/engaged", {}, "arm_ik") == "/arm_ik/engaged"
    assert resolve_name("~/engaged", {}, "arm_ik", namespace="/lab") == "/lab/arm_ik/engaged"
    assert resolve_name("relative", {}, "n", namespace="/lab/") == "/lab/relative"
    # a parameter's value may hold the each variable ("/xr/hands/{side}")
    assert resolve_name("{hands}", {"hands": "/xr/hands/{side}", "side": "left"}, "console") == "/xr/hands/left"
    with pytest.raises(NodeIOError, match=r"\{missing\}"):
        resolve_name("{missing}/x", {}, "n")


def test_conditions_and_expansions():
    io = NodeIO(
        publishers=(
            Topic("/{side}/a", "std_msgs/msg/Bool", QoS(1), "per side", each=Each("side", param="sides")),
            Topic("/b", "std_msgs/msg/Bool", SENSOR_DATA, "when on", when=(when("on", True),)),
            Topic("{t}", "std_msgs/msg/Bool", LATCHED, "unless empty", when=(unless("t", ""),)),
        ),
        services=(Service("~/s", "std_srvs/srv/Trigger", "a service"),),
    )
    out = io.resolve("n", {"sides": ["left", "right", "left"], "on": False, "t": "/c"})
    assert [e.name for e in out["publishers"]] == ["/left/a", "/right/a", "/c"]
    assert [e.name for e in out["services"]] == ["/n/s"]
    out = io.resolve("n", {"sides": [], "on": True, "t": ""})
    assert [e.name for e in out["publishers"]] == ["/b"]
    with pytest.raises(NodeIOError, match="'on'.*known"):
        io.resolve("n", {"sides": []})
    io.check(["sides", "on", "t"], "n")
    with pytest.raises(NodeIOError, match="refers to on"):
        io.check(["sides", "t"], "n")


def test_a_bad_declaration_fails_at_construction():
    with pytest.raises(NodeIOError, match="package/msg/Type"):
        Topic("/a", "std_msgs/Bool", QoS(1), "no /msg/")
    with pytest.raises(NodeIOError, match="package/srv/Type"):
        Service("~/s", "std_msgs/msg/Bool", "a message is no service")
    with pytest.raises(NodeIOError, match="needs a name and a description"):
        Topic("/a", "std_msgs/msg/Bool", QoS(1), "")
    with pytest.raises(NodeIOError, match="tuple of When"):
        Topic("/a", "std_msgs/msg/Bool", QoS(1), "d", when=when("x", 1))
    with pytest.raises(NodeIOError, match="/a declared twice"):
        NodeIO(publishers=(Topic("/a", "std_msgs/msg/Bool", QoS(1), "d"),
                           Topic("/a", "std_msgs/msg/Bool", QoS(1), "e")))


def test_creating_what_is_not_declared_or_not_allowed_is_a_named_error():
    io = NodeIO(publishers=(
        Topic("{topic}", "std_msgs/msg/Bool", QoS(3, reliable=False), "always"),
        Topic("/when", "std_msgs/msg/Bool", QoS(1), "only when on", when=(when("on", True),)),
        Topic("/{side}/x", "std_msgs/msg/Bool", QoS(1), "per side", each=Each("side", values=("left", "right"))),
    ))
    values = {"topic": "/t", "on": False}
    d = declared(io, "publishers", "{topic}", values, "n", "/", {})
    assert d.name == "/t" and d.cls.__name__ == "Bool"
    assert d.qos.depth == 3 and d.qos.reliability == ReliabilityPolicy.BEST_EFFORT
    with pytest.raises(NodeIOError, match=r"no publisher '/t' declared; declared publishers: \{topic\}"):
        declared(io, "publishers", "/t", values, "n", "/", {})
    with pytest.raises(NodeIOError, match="declared only when `on` is `true`"):
        declared(io, "publishers", "/when", values, "n", "/", {})
    assert declared(io, "publishers", "/{side}/x", values, "n", "/", {"side": "left"}).name == "/left/x"
    with pytest.raises(NodeIOError, match="not {'side': 'up'}"):
        declared(io, "publishers", "/{side}/x", values, "n", "/", {"side": "up"})


def test_declared_qos_makes_the_rclpy_profile():
    latched = qos_profile(LATCHED)
    assert latched.depth == 1 and latched.durability == DurabilityPolicy.TRANSIENT_LOCAL
    assert latched.reliability == ReliabilityPolicy.RELIABLE
    sensor = qos_profile(SENSOR_DATA)
    assert sensor.reliability == rclpy.qos.qos_profile_sensor_data.reliability
    assert sensor.depth == rclpy.qos.qos_profile_sensor_data.depth


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_node_declares_its_io_against_its_parameters(name):
    cls = node_class(name)
    assert cls.IO, f"{name} declares no IO"
    params = cls.SCHEMA.defaults()
    cls.IO.check(params, name)
    for kind in KINDS:
        for entry in cls.IO.entries(kind):
            assert entry.description.strip()
    if isinstance(cls.SCHEMA, BackendSchema):  # each backend's own declaration names its settings or the node's
        for backend, backend_cls in cls.SCHEMA.backends.items():
            io = getattr(backend_cls, "IO", None)
            if io is not None:
                io.check(backend_values(params, backend), f"{name} backend {backend}")


# ---------------------------------------------------------------------- declarations against the graph
FULL = {  # every node, the digital mode's backends; small frames (only the graph is checked)
    **{node: dict(values) for node, values in bringup.BACKENDS["digital"].items()},
    "console": {"port": 0},
    "foxglove": {"port": 0},
    "world_model": {"profile": "160x120x10"},
    "policy": {"backend": "constant"},  # the default backend (lerobot) needs a policy folder
}
VARIANT = {  # the other side of the declarations' conditions
    "tracker": {"backend": "xr"},
    "arm_ik": {"start_from": "home"},
    "hand_retarget": {"backend": "skeleton", "sides": ["left"]},
    "hand_driver": {"backend": "sim", "vendor_topics": False, "sides": ["right"]},
    "head_camera": {"backend": "synthetic", "synthetic.depth": False, "synthetic.draw_robot": False},
    "world_model": {"profile": "160x120x10", "publish_condition": True, "action_source": "joint_states",
                    "reference.source": "topic"},
}


def _overrides(names: list[str], config: dict, tmp_path) -> dict:
    out = {node: dict(values) for node, values in config.items()}
    if "recorder" in names:
        out.setdefault("recorder", {})["output_dir"] = str(tmp_path / "episodes")
    if "head_camera" in names:
        out.setdefault("head_camera", {}).setdefault("synthetic.profile", "160x120x10")
    return out


def _mismatches(probe: Node, node: Node) -> list[str]:
    """What the graph shows of ``node`` that its declaration does not say, and the reverse."""
    name = node.get_name()
    expected = node_io(type(node), node.params, node.io_facts, node_name=name)
    try:
        actual = graph_io(probe, name)
    except rclpy.exceptions.NodeNameNonExistentError:
        return [f"{name}: not in the graph yet"]
    problems = []
    for kind in KINDS:
        by_name: dict[str, list] = {}
        for endpoint in expected[kind]:
            by_name.setdefault(endpoint.name, []).append(endpoint)
        for topic, types in actual[kind].items():
            declared_here = by_name.get(topic)
            if declared_here is None:
                problems.append(f"{name}: {kind[:-1]} {topic} ({', '.join(types)}) is not declared")
            elif not any(e.type == ANY_TYPE or e.type in types for e in declared_here):
                problems.append(f"{name}: {kind[:-1]} {topic} has type {', '.join(types)}, declared "
                                f"{', '.join(e.type for e in declared_here)}")
        for endpoint in expected[kind]:
            if endpoint.declared.dynamic or endpoint.name in actual[kind]:
                continue
            problems.append(f"{name}: declared {kind[:-1]} {endpoint.name} ({endpoint.type}) is not in the graph")
        if kind in ("publishers", "subscriptions"):
            problems += _qos_mismatches(probe, name, kind, expected[kind], actual[kind])
    return problems


def _qos_mismatches(probe: Node, name: str, kind: str, expected: list, actual: dict) -> list[str]:
    infos_of = probe.get_publishers_info_by_topic if kind == "publishers" else probe.get_subscriptions_info_by_topic
    problems = []
    for endpoint in expected:
        qos = endpoint.declared.qos
        if qos is None or endpoint.name not in actual:
            continue
        for info in infos_of(endpoint.name):
            if info.node_name != name:
                continue
            reliable = info.qos_profile.reliability == ReliabilityPolicy.RELIABLE
            latched = info.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL
            if (reliable, latched) != (qos.reliable, qos.latched):
                problems.append(f"{name}: {kind[:-1]} {endpoint.name} has QoS reliable={reliable}, latched={latched}; "
                                f"declared {qos.describe()}")
    return problems


@pytest.mark.parametrize("names, config", [(list(REGISTRY), FULL), (list(VARIANT), VARIANT)],
                         ids=["every-node-digital", "conditions-reversed"])
def test_the_graph_shows_what_each_node_declares(names, config, ros_domain_id, tmp_path):
    """Every node composed in one process: each topic, service and client it has in the graph is declared with
    that type (and the topics' reliability and durability), and each declared one whose conditions hold is
    there (those marked ``dynamic`` may be missing)."""
    comp = Composition(names, overrides=_overrides(names, config, tmp_path), domain_id=ros_domain_id)
    probe = Node("node_io_probe", context=comp.context)
    try:
        nodes = [n for n in comp.nodes if n.get_name() in names]
        assert {n.get_name() for n in nodes} == set(names)
        deadline = time.monotonic() + GRAPH_TIMEOUT_S
        while True:
            problems = [p for node in nodes for p in _mismatches(probe, node)]
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not problems, "\n".join(problems)
        assert not comp.errors, comp.errors
    finally:
        probe.destroy_node()
        comp.shutdown()

