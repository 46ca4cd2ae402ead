"""foxglove node: the stack's topics served to the Foxglove app over the Foxglove WebSocket protocol.

For machines without ``foxglove_bridge``: a ``foxglove-sdk`` server (``ws://<host>:<port>``, subprotocol
``foxglove.sdk.v1`` only, as foxglove_bridge >= 3; older clients get HTTP 400) advertises one channel per
topic with its ``ros2msg`` schema (as rosbag2 writes into MCAP, rosbags typestore of ROS 2 Kilted) and
passes the CDR messages through unchanged, so ``config/rynn_teleop.foxglove.json`` works as with the bridge.

Topics: ``topics`` (empty: every topic whose type the typestore knows), each advertised once it has a
publisher (QoS discovered like the recorder); a type unknown or not importable is listed in ``unservable``.
Never blocking: a ROS subscription exists only while a client wants its channel, is drained every
``poll_period_s``, and the SDK queues per client (``client_backlog``; a full queue drops its oldest). A
latched message is sent again when a client joins (to every client of the topic).

Exposure (threat model: ``docs/security.md``): a client sees every served topic (camera images, joint states,
the robot description, diagnostics) and can change nothing (no services, parameters or client publishing are
advertised). The SDK server listens on 127.0.0.1 at a free port behind a gate (``console.gate``) on
``host``:``port``, which refuses (HTTP 403, counted) a connection whose ``Host`` is not one the node serves
(the address, localhost, ``allowed_hosts``; DNS rebinding) or whose ``Origin`` is not in ``allowed_origins``
(default: the Foxglove web app, https://app.foxglove.dev); a client without ``Origin`` (Foxglove desktop,
scripts) passes. Loopback by default; there is no authentication: bind beyond it only on a trusted network.

Diagnostics: ``cpu_percent`` [% of one core] (executor, drain, gate and SDK threads), ``url``, ``channels``,
``subscribed``, per topic ``<topic>.forwarded`` and ``<topic>.dropped`` (sent by publishers, never
received here), ``unservable``, ``clients`` (connections through the gate), ``refused.host`` /
``refused.origin`` / ``refused.malformed``; WARN for a minute after a refusal.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.qos import DurabilityPolicy, QoSProfile
from rclpy.subscription import Subscription

from ..console.access import AccessRules, Refusal
from ..console.gate import GateError, WebSocketGate
from ..core.node_io import ANY_TYPE, Each, NodeIO, Topic
from ..core.params import STR_LIST, Param, ParamSchema
from ..errors import ConfigurationError, ParameterError
from ..recording.stats import SequenceGaps
from ..recording.writer import default_typestore
from .base import TeleopNode, run_single
from .graph import message_class, subscription_qos

if TYPE_CHECKING:
    import foxglove
    from rosbags.typesys.store import Typestore

LAYOUT_TOPICS = (  # what config/rynn_teleop.foxglove.json shows (tests keep the two in step)
    "/robot_markers",
    "/twin/markers",  # the physics twin's objects and targets (digital mode)
    "/head_camera/color/image_raw",
    "/head_camera/color/camera_info",
    "/head_camera/generated/color/image_raw",
    "/head_camera/generated/color/camera_info",
    "/arms/command",
    "/operator/trackers",
    "/head_camera/active_source",
    "/diagnostics",
)
DEFAULT_TOPICS = (*LAYOUT_TOPICS, "/joint_states", "/robot_description", "/tf", "/tf_static")
SCHEMA_ENCODING = "ros2msg"  # the Foxglove schema encoding of ROS 2 .msg definitions
MESSAGE_ENCODING = "cdr"
SERVER_NAME = "rynn_teleop"
SDK_THREAD_PREFIX = "tokio-runtime"  # the foxglove-sdk server runs on a tokio runtime ("tokio-runtime-worker")
REQUIREMENT = "foxglove-sdk"
FOXGLOVE_WEB_APP = "https://app.foxglove.dev"  # the Origin of the Foxglove app in a browser
GATE_THREAD = "foxglove-gate"
REFUSED_WARN_S = 60.0  # [s] the node's status stays WARN after a refused connection


def ros2msg_definition(type_name: str, typestore: Typestore | None = None) -> str | None:
    """The ``ros2msg`` schema text of ``type_name`` (e.g. ``sensor_msgs/msg/JointState``): its fields, then each
    nested type after a line of 80 ``=`` and ``MSG: pkg/Name``, as rosbag2 writes it into MCAP; None if the
    typestore (default: ROS 2 Kilted) does not know the type."""
    store = typestore if typestore is not None else default_typestore()
    if type_name not in store.fielddefs:
        return None
    definition, _ = store.generate_msgdef(type_name, ros_version=2)
    return definition


def threads_cpu_s(native_ids: Iterable[int], name_prefix: str = "") -> float | None:
    """CPU time [s] (user + system) of this process's threads with the given native ids or whose name starts
    with ``name_prefix`` (Linux ``/proc/self/task``); None where that is not available."""
    ids = {str(i) for i in native_ids if i}
    try:
        tasks = os.listdir("/proc/self/task")
        ticks_per_s = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    ticks = 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name_end = stat.rfind(")")
        name = stat[stat.find("(") + 1:name_end]
        if tid in ids or (name_prefix and name.startswith(name_prefix)):
            fields = stat[name_end + 2:].split()  # from field 3 (state) on: utime is field 14, stime field 15
            ticks += int(fields[11]) + int(fields[12])
    return ticks / ticks_per_s


@dataclass
class ServedTopic:
    """One topic advertised as a Foxglove channel, and its ROS subscription while a client wants it."""

    topic: str
    type_name: str
    msg_type: Any  # the rclpy message class (a raw subscription still needs its type support)
    channel: foxglove.Channel
    qos: QoSProfile  # matches the publishers found at discovery
    sub: Subscription | None = None
    clients: set[int] = field(default_factory=set)  # ids of the clients subscribed to the channel
    gaps: SequenceGaps = field(default_factory=SequenceGaps)
    latched_message: tuple[bytes, int] | None = None  # newest (CDR, receive time [ns]) of a transient-local topic
    forwarded: int = 0  # messages handed to the server
    dropped: int = 0  # messages its publishers sent that the node never received

    @property
    def latched(self) -> bool:
        return self.qos.durability == DurabilityPolicy.TRANSIENT_LOCAL


class _ClientSubscriptions:
    """The clients' (un)subscriptions, in order (a foxglove-sdk ServerListener, called on the SDK's threads; the
    node takes them from its own). A client that disconnects is unsubscribed from each of its channels."""

    def __init__(self) -> None:
        self.events: deque[tuple[bool, int, str]] = deque()  # (subscribed, client id, topic), oldest first
        self.changed = threading.Event()

    def on_subscribe(self, client: Any, channel: Any) -> None:
        self.events.append((True, client.id, channel.topic))
        self.changed.set()

    def on_unsubscribe(self, client: Any, channel: Any) -> None:
        self.events.append((False, client.id, channel.topic))
        self.changed.set()


class FoxgloveNode(TeleopNode):
    SCHEMA = ParamSchema(
        "foxglove",
        [
            Param("host", str, "127.0.0.1",
                  "address the WebSocket server listens on (127.0.0.1: this machine only; 0.0.0.0: every "
                  "interface; the protocol has no authentication)"),
            Param("port", int, 8765, "TCP port of the WebSocket server (Foxglove's usual 8765; 0: any free port, "
                  "logged and in diagnostics)", min=0, max=65535),
            Param("allowed_origins", STR_LIST, [FOXGLOVE_WEB_APP],
                  "origins (scheme://host[:port]) of browser pages allowed to connect; a connection from any other "
                  "page is refused (403); clients that send no Origin (Foxglove desktop, scripts) are accepted"),
            Param("allowed_hosts", STR_LIST, [],
                  "host names clients may also use to reach the server (e.g. robot.lab; no port); any other name "
                  "is refused (DNS rebinding); served anyway: the address, localhost, loopback addresses on "
                  "loopback, any IP address when host is 0.0.0.0 or ::"),
            Param("topics", STR_LIST, list(DEFAULT_TOPICS),
                  "topics served (types discovered from the graph); empty: every topic in the graph whose type "
                  "the typestore knows"),
            Param("client_backlog", int, 256,
                  "messages queued per client; when a slow client's queue is full its oldest message is dropped "
                  "(the node never waits for a client)", "messages", min=16, max=100_000),
            Param("discovery_period_s", float, 0.5, "how often the graph is searched for topics to serve", "s",
                  min=0.05, max=10.0),
            Param("poll_period_s", float, 0.02,
                  "subscriptions are drained this often (added latency; each holds 100 messages between drains)",
                  "s", min=0.001, max=0.1),
        ],
    )
    IO = NodeIO(subscriptions=(
        Topic("{topic}", ANY_TYPE, None, "passed through to the Foxglove clients as CDR; type and QoS from its "
              "publishers (topics empty: every topic in the graph whose type the typestore knows)",
              each=Each("topic", param="topics"), dynamic="while a Foxglove client subscribes to its channel"),
    ))

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        self.host = p["host"].strip()
        if not self.host:
            raise ParameterError("host", "parameter 'host' is empty: give an address to listen on, e.g. 127.0.0.1")
        bad = [t for t in p["topics"] if not t.startswith("/")]
        if bad:
            raise ParameterError("topics", f"parameter 'topics' has names that are not absolute: {bad}")
        self.configured: list[str] = list(dict.fromkeys(p["topics"]))  # empty: every known topic in the graph
        self.typestore = default_typestore()
        self.served: dict[str, ServedTopic] = {}
        self.unservable: dict[str, str] = {}  # topic -> why it is not served
        self._sdk_listener = _ClientSubscriptions()
        self._cpu_ids: dict[str, int] = {}  # "executor" / "drain" -> native thread id
        self._cpu_mark: tuple[float, float] | None = None  # (monotonic time [s], CPU time [s]) of the last report
        self.cpu_percent: float | None = None
        rules = AccessRules(self.host, tuple(p["allowed_hosts"]), tuple(p["allowed_origins"]),
                            same_origin=False)  # ParameterError naming the key
        foxglove = _import_sdk()
        self._sdk_context = foxglove.Context()
        try:  # on loopback only: clients reach it through the gate
            self._sdk_server = foxglove.start_server(
                name=SERVER_NAME, host="127.0.0.1", port=0, context=self._sdk_context,
                server_listener=self._sdk_listener, message_backlog_size=p["client_backlog"],
            )
        except Exception as exc:  # the SDK raises its own error types; the message says why
            raise ParameterError("port", f"cannot start the Foxglove server on 127.0.0.1 ({exc})") from exc
        self._refusal_logged = 0.0  # monotonic time [s] of the last refusal logged
        self.gate = WebSocketGate(self.host, p["port"], self._sdk_server.port, rules, on_refused=self._on_refused,
                                  thread_name=GATE_THREAD)
        try:
            self.gate.start()
        except GateError as exc:
            self._sdk_server.stop()
            raise ParameterError("port", f"cannot listen on {self.host}:{p['port']} ({exc}); is the port in use? "
                                 "choose another with the parameter 'port' (0: any free port)") from exc
        self.port = self.gate.port
        self.url = f"ws://{self.host}:{self.port}"
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            self.get_logger().warning(f"serving on {self.url}: reachable from the network, without authentication")
        origins = ", ".join(sorted(rules.origins)) or "none"
        self.get_logger().info(f"browser pages allowed to connect: {origins} (parameter allowed_origins)")
        self.get_logger().info(f"Foxglove WebSocket server on {self.url} (Foxglove: Open connection -> {self.url})")
        self._discover()
        self.create_timer(p["discovery_period_s"], self._on_timer)
        self._loop = self.create_loop(1.0 / p["poll_period_s"], self._drain, "drain")

    def _on_refused(self, refusal: Refusal, client: str) -> None:  # gate thread
        now = time.monotonic()
        if now - self._refusal_logged >= 5.0:  # at most one line every 5 s (a page retrying floods no log)
            self._refusal_logged = now
            self.get_logger().warning(f"refused a connection ({refusal.reason}) from {client}: {refusal.message}")

    # ------------------------------------------------------------------ graph -> channels
    def _on_timer(self) -> None:
        self._cpu_ids.setdefault("executor", threading.get_native_id())  # the thread spinning this node
        self._discover()

    def _discover(self) -> None:
        """Advertise every wanted topic that has appeared; (un)subscribe as clients come and go."""
        graph = dict(self.get_topic_names_and_types())
        wanted = self.configured or sorted(graph)
        for topic in wanted:
            if topic in self.served or topic in self.unservable or not graph.get(topic):
                continue
            infos = self.get_publishers_info_by_topic(topic)
            if not infos:  # only subscribers so far: wait for a publisher, whose QoS the subscription must match
                continue
            self._advertise(topic, graph[topic][0], infos)
        self._reconcile()

    def _advertise(self, topic: str, type_name: str, infos: list) -> None:
        definition = ros2msg_definition(type_name, self.typestore)
        if definition is None:
            self._refuse(topic, f"type {type_name} unknown to the typestore (ROS 2 Kilted standard messages)")
            return
        try:
            msg_type = message_class(type_name)
        except (ImportError, AttributeError, ValueError):
            self._refuse(topic, f"type {type_name} cannot be imported (its Python message package is missing)")
            return
        import foxglove  # present: checked at start

        schema = foxglove.Schema(name=type_name, encoding=SCHEMA_ENCODING, data=definition.encode())
        channel = foxglove.Channel(topic, schema=schema, message_encoding=MESSAGE_ENCODING, context=self._sdk_context)
        qos, _ = subscription_qos(infos)
        self.served[topic] = ServedTopic(topic, type_name, msg_type, channel, qos)
        self.get_logger().info(f"serving {topic} ({type_name}, {qos.reliability.name.lower()}"
                               f"{', latched' if qos.durability == DurabilityPolicy.TRANSIENT_LOCAL else ''})")

    def _refuse(self, topic: str, why: str) -> None:
        self.unservable[topic] = why
        if self.configured:  # asked for by name: say so (the all-topics mode lists them in diagnostics only)
            self.get_logger().warning(f"{topic} not served: {why}")

    def _reconcile(self) -> None:
        """Follow the clients' (un)subscriptions: a ROS subscription for each channel with a client, none for the
        others; the newest message of a latched topic again for a client that joins an existing subscription
        (a new subscription receives it from the middleware)."""
        listener = self._sdk_listener
        listener.changed.clear()
        while listener.events:
            subscribed, client, topic = listener.events.popleft()
            served = self.served.get(topic)
            if served is None:
                continue
            if subscribed:
                served.clients.add(client)
                if served.sub is None:
                    served.sub = self.create_polled_subscription(served.msg_type, topic, served.qos, raw=True)
                    served.gaps = SequenceGaps()  # sequence numbers from before are not losses of this one
                elif served.latched_message is not None:
                    raw, received_ns = served.latched_message
                    served.channel.log(raw, log_time=received_ns)
            else:
                served.clients.discard(client)
                if not served.clients and served.sub is not None:
                    self.destroy_subscription(served.sub)
                    served.sub, served.latched_message = None, None

    # ------------------------------------------------------------------ ROS -> clients
    def _drain(self) -> None:
        """Hand every message the subscriptions received since the last drain to the server (it never waits)."""
        self._cpu_ids.setdefault("drain", threading.get_native_id())
        if self._sdk_listener.changed.is_set():
            self._reconcile()
        for served in self.served.values():
            if served.sub is None:
                continue
            for taken in self.take_all(served.sub):
                served.dropped += served.gaps.observe(served.topic, taken.publisher, taken.sequence)
                raw = taken.message
                served.channel.log(raw, log_time=taken.received_ns)
                served.forwarded += 1
                if served.latched:
                    served.latched_message = (raw, taken.received_ns)

    # ------------------------------------------------------------------ diagnostics
    def _cpu_share(self) -> float | None:
        """% of one core the node's threads used since the previous call (None on the first call or off Linux)."""
        ids = [*self._cpu_ids.values(), self.gate.native_id or 0]
        cpu = threads_cpu_s(ids, SDK_THREAD_PREFIX)
        now = time.monotonic()
        if cpu is None:
            return None
        mark, self._cpu_mark = self._cpu_mark, (now, cpu)
        if mark is None or now <= mark[0]:
            return None
        return 100.0 * (cpu - mark[1]) / (now - mark[0])

    def diagnostic_values(self):
        self.cpu_percent = self._cpu_share()
        values: dict[str, Any] = {
            "url": self.url,
            "cpu_percent": "n/a" if self.cpu_percent is None else f"{self.cpu_percent:.1f}",
            "channels": len(self.served),
            "subscribed": sum(1 for s in self.served.values() if s.sub is not None),
            "clients": self.gate.connections,
        }
        for reason, n in self.gate.refused.items():
            values[f"refused.{reason}"] = n
        for topic, served in sorted(self.served.items()):
            values[f"{topic}.forwarded"] = served.forwarded
            values[f"{topic}.dropped"] = served.dropped
        if self.unservable:
            values["unservable"] = "; ".join(f"{t}: {why}" for t, why in sorted(self.unservable.items()))
        return values

    def diagnostic_level(self):
        last = self.gate.last_refused
        if last is not None and time.time() - last["time"] < REFUSED_WARN_S:
            return DiagnosticStatus.WARN, f"serving {len(self.served)} topics on {self.url}; refused " \
                f"{self.gate.requests_refused} connection(s), last: {last['reason']} from {last['client']}"
        missing = [t for t in self.configured if t in self.unservable]
        if missing:
            return DiagnosticStatus.WARN, f"serving {len(self.served)} topics on {self.url}; not servable: " + \
                ", ".join(missing[:4]) + ("..." if len(missing) > 4 else "")
        return DiagnosticStatus.OK, f"serving {len(self.served)} topics on {self.url}"

    def destroy_node(self) -> None:
        """Stop draining, close the server (clients see the connection close), then destroy the node."""
        self.stop_loops()
        gate = getattr(self, "gate", None)
        if gate is not None:
            gate.stop()
        server = getattr(self, "_sdk_server", None)
        if server is not None:
            server.stop()
        for served in getattr(self, "served", {}).values():
            served.channel.close()
        super().destroy_node()


def _import_sdk():
    try:
        import foxglove  # optional until the node runs
    except ImportError as exc:
        raise ConfigurationError(f"the foxglove node needs the Python package {REQUIREMENT} "
                                 f"(pip install -r requirements/core.txt): {exc}") from None
    return foxglove


def main(args=None) -> int:
    return run_single(FoxgloveNode, args)
