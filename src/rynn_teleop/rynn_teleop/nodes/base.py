"""What every rynn_teleop node shares: schema-declared parameters, diagnostics, ``main``.

A node subclasses :class:`TeleopNode`, sets ``SCHEMA`` (its parameters, see
``core.params``) and builds its core objects from ``self.params``. It is
started either by its console script (``ros2 run rynn_teleop <name>``, see
:func:`run_single`) or together with other nodes by ``rynn_teleop.runner``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import ClockType

try:
    from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
except ImportError:  # rclpy 3 (Humble) names the module qos_event
    from rclpy.qos_event import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import QoSCompatibility, qos_check_compatible
from rclpy.subscription import Subscription

from ..core.node_io import BASE_IO, NodeIO
from ..core.params import ParamSchema
from ..core.scheduling import Deadlines, name_this_thread
from ..core.stats import RateMeter
from ..core.status import Meter, encode_meters
from ..core.yamlfile import read_yaml
from ..errors import REFUSED_EXIT_CODE, RynnTeleopError
from ..recording.cdr import first_name_after_header, header_stamp_ns
from .io import declared, qos_profile
from .parameters import declare_schema
from .process import (
    freeze_startup_objects,
    params_files,
    process_priority_class,
    release_startup_objects,
    use_process_priority,
    use_transport_profile,
)
from .rmw import NeverExecuted, SubscriptionWaitSet, take_waiting


class Taken(NamedTuple):
    """One message taken from a polled subscription, with what the middleware knows about it."""

    message: Any  # the message, or its CDR bytes for a raw subscription
    received_ns: int  # when the middleware received it, on the node's clock [ns] (the take time if unknown)
    publisher: bytes  # the publisher's GID (b"" when rclpy does not tell, see nodes.rmw)
    sequence: int | None  # the publisher's sequence number of this message (None when rclpy or the RMW does not tell)


SAMPLE_LEAD_S = 0.001  # [s] a synthetic sample is due this long before the loop tick that reads it
SLEEP_MAX_S = 0.05  # [s] a loop waits for its next tick in one plain sleep up to this long (longer: a stoppable wait)
_THIS_THREAD = threading.local()  # .loop: the ControlLoop running on this thread


class ControlLoop:
    """A fixed-rate loop of one node on its own thread, off the executor (deadline sleeps, no wait set).

    Tick ``k`` is due ``k * period`` after the loop starts (:class:`~..core.scheduling.Deadlines`: a late
    tick does not shift the next ones; ticks a whole period behind are skipped and counted). Between ticks it
    sleeps (a wait of up to :data:`SLEEP_MAX_S` in one plain sleep, so :meth:`cancel` may wait that long). Each tick
    calls ``callback()`` holding :attr:`TeleopNode.lock`, so it never runs concurrently with the node's
    executor callbacks (services, subscriptions, timers, parameter changes). An exception raised by the
    callback is logged and kept in :attr:`TeleopNode.loop_exceptions`; the loop goes on.
    """

    def __init__(self, node: TeleopNode, period: float, callback: Callable[[], None], name: str) -> None:
        self.node = node
        self.name = name
        self.callback = callback
        self.deadlines = Deadlines(period, time.monotonic() + period)
        self.lateness = 0.0  # [s] how long after its due time the current (or last) tick started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{node.get_name()}:{name}", daemon=True)
        self._thread.start()

    @property
    def period(self) -> float:
        """[s] between ticks."""
        return self.deadlines.period

    def _run(self) -> None:
        _THIS_THREAD.loop = self
        name_this_thread(self._thread.name)
        deadlines, stop, lock = self.deadlines, self._stop, self.node.lock
        while not stop.is_set():
            wait = deadlines.due - time.monotonic()
            if wait > 0:
                if wait <= SLEEP_MAX_S:
                    time.sleep(wait)  # cheaper per tick than Event.wait (bench/control_loop.py)
                elif stop.wait(wait):
                    break
            with lock:  # a stop during the sleep is seen here
                if stop.is_set() or not self.node.context.ok():
                    break
                self.lateness = deadlines.start_tick(time.monotonic())
                try:
                    self.callback()
                except Exception as exc:  # noqa: BLE001 - reported, the loop goes on
                    if not self.node.context.ok() or stop.is_set():
                        break
                    self.node.loop_exceptions.append(exc)
                    self.node.get_logger().error(f"loop {self.name!r} raised: {exc!r}",
                                                 throttle_duration_sec=1.0)
            deadlines.finish_tick(time.monotonic())

    def due_time(self, now: float) -> float:
        """During a tick: when it was due [s], on the clock that reads ``now`` [s] at this tick (a source whose
        sample grid starts here has one sample due at every tick, however late this tick started)."""
        return now - max(self.lateness, 0.0)

    def cancel(self, timeout: float = 2.0) -> None:
        """Stop the loop and wait (at most ``timeout`` [s]) for a running tick to end. Idempotent."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


class EventLoop:
    """Message-driven work of one node on its own thread, off the executor.

    The thread waits on a wait set of just ``subscriptions`` (polled ones:
    :meth:`TeleopNode.create_polled_subscription`) and a guard condition that stops it
    (:class:`~.rmw.SubscriptionWaitSet`), and for each subscription with messages waiting calls
    ``callback(subscription)`` holding :attr:`TeleopNode.lock`; the callback drains it (:meth:`TeleopNode.take_all`).
    A wake costs one wait on these subscriptions and the takes, not a wait set over every entity of the node.
    An exception raised by the callback is logged and kept in :attr:`TeleopNode.loop_exceptions`; the loop goes on.
    """

    WAKE_TIMEOUT_NS = 500_000_000  # [ns] longest wait before the loop looks at the context again

    def __init__(self, node: TeleopNode, subscriptions: list[Subscription], callback: Callable[[Subscription], None],
                 name: str) -> None:
        self.node = node
        self.name = name
        self.callback = callback
        self._stop = threading.Event()
        self._waiter = SubscriptionWaitSet(subscriptions, node.context)
        self._thread = threading.Thread(target=self._run, name=f"{node.get_name()}:{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        name_this_thread(self._thread.name)
        context, stop, lock = self.node.context, self._stop, self.node.lock
        with self._waiter as waiter:
            while not stop.is_set():
                ready = waiter.wait(self.WAKE_TIMEOUT_NS)
                if stop.is_set() or not context.ok():
                    break
                if not ready:
                    continue
                with lock:
                    for sub in ready:
                        try:
                            self.callback(sub)
                        except Exception as exc:  # noqa: BLE001 - reported, the loop goes on
                            if not context.ok() or stop.is_set():
                                return
                            self.node.loop_exceptions.append(exc)
                            self.node.get_logger().error(f"event loop {self.name!r} raised: {exc!r}",
                                                         throttle_duration_sec=1.0)

    def cancel(self, timeout: float = 2.0) -> None:
        """Stop the loop and wait (at most ``timeout`` [s]) for a running callback to end. Idempotent."""
        self._stop.set()
        try:
            self._waiter.wake()
        except Exception:  # noqa: BLE001 - the context is gone already: the wait ends by its timeout
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def _locked(lock: threading.RLock, callback: Callable) -> Callable:
    """``callback`` run holding ``lock``, with the same number of positional parameters (rclpy passes a
    subscription's MessageInfo only to a callback that takes two)."""
    try:
        n = len([p for p in inspect.signature(callback).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty])
    except (TypeError, ValueError):
        n = -1
    if n == 2:
        @functools.wraps(callback)
        def two(a, b):
            with lock:
                return callback(a, b)
        return two
    if n == 1:
        @functools.wraps(callback)
        def one(a):
            with lock:
                return callback(a)
        return one

    @functools.wraps(callback)
    def any_args(*args):
        with lock:
            return callback(*args)
    return any_args


class TeleopNode(Node):
    """Base node: declares ``SCHEMA``, publishes ``/diagnostics`` at 1 Hz.

    Threading contract: fixed-rate work runs in :class:`ControlLoop` threads (:meth:`create_loop`), the
    executor serves services, parameters, timers and event-driven subscriptions. Every callback made
    through this class's ``create_subscription`` / ``create_service`` / ``create_timer`` and every loop
    tick holds :attr:`lock`, so node state needs no other locking between them. Polled subscriptions
    (:meth:`create_polled_subscription`) are never served by the executor: the node takes from them itself.

    Publishers and subscriptions are created without rclpy's default QoS event handlers (each is one more
    waitable woken per event); incompatible publishers are found by a 1 Hz check instead and reported in
    diagnostics (``incompatible_qos``).
    """

    SCHEMA: ClassVar[ParamSchema]
    #: the node's topics and services (``core.node_io``): created from it by :meth:`io_publisher` and friends,
    #: rendered on its reference page, compared with the graph by tests/test_node_io.py
    IO: ClassVar[NodeIO] = NodeIO()
    #: the node's :data:`~..core.scheduling.PRIORITY_CLASSES` name: how urgently its process must run
    PRIORITY: ClassVar[str] = "normal"

    def __init__(self, **node_kwargs: Any) -> None:
        """``node_kwargs`` go to ``rclpy.node.Node`` (context, parameter_overrides, namespace...)."""
        self.lock = threading.RLock()
        self.loops: list[ControlLoop | EventLoop] = []
        self.loop_exceptions: list[BaseException] = []  # exceptions raised by loop ticks
        self._owned: list[Any] = []  # closed by destroy_node, newest first (close_on_destroy)
        super().__init__(self.SCHEMA.node_name, **node_kwargs)
        self.params: dict[str, Any] = declare_schema(self, self.SCHEMA)
        self.IO.check(self.params, f"node {self.SCHEMA.node_name}")
        self.io_facts: dict[str, Any] = {}  # the facts of IO.facts, set before the entries that depend on them
        self.meters: dict[str, RateMeter] = {}
        self.nominal_hz: dict[str, float] = {}  # meter name -> the rate it should show [Hz] (diagnostics)
        self.latency_budget_ms: dict[str, float] = {}  # meter name -> the p99 latency it should stay under [ms]
        self._polled_group = NeverExecuted()  # the callback group of polled subscriptions: no executor serves it
        self.incompatible_qos: dict[str, str] = {}  # subscribed topic -> why a publisher of it cannot match
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics",
                                               qos_profile(BASE_IO.entry("publishers", "/diagnostics").qos))
        self._diag_timer = self.create_timer(1.0, self._publish_diagnostics)

    # ------------------------------------------------------------------ entities from the IO declaration
    def _declared(self, kind: str, name: str, each: dict[str, Any]):
        return declared(self.IO, kind, name, {**self.params, **self.io_facts}, self.get_name(),
                        self.get_namespace(), each)

    def io_publisher(self, name: str, **each: Any) -> Any:
        """The publisher declared in :attr:`IO` as ``name`` (as written there, e.g. ``"{command_topic}"``;
        ``each``: the value of its ``each`` variable, e.g. ``side="left"``), with the declared type and QoS.

        Raises:
            NodeIOError: not declared, or its ``when`` does not hold for the node's parameters and facts.
        """
        d = self._declared("publishers", name, each)
        return self.create_publisher(d.cls, d.name, d.qos)

    def io_subscription(self, name: str, callback: Callable, *, raw: bool = False, **each: Any) -> Subscription:
        """The subscription declared in :attr:`IO` as ``name``, served by the executor (see :meth:`io_publisher`)."""
        d = self._declared("subscriptions", name, each)
        return self.create_subscription(d.cls, d.name, callback, d.qos, raw=raw)

    def io_polled_subscription(self, name: str, *, raw: bool = False, **each: Any) -> Subscription:
        """The subscription declared in :attr:`IO` as ``name``, polled (:meth:`create_polled_subscription`)."""
        d = self._declared("subscriptions", name, each)
        return self.create_polled_subscription(d.cls, d.name, d.qos, raw=raw)

    def io_service(self, name: str, callback: Callable, **each: Any) -> Any:
        """The service declared in :attr:`IO` as ``name`` (see :meth:`io_publisher`)."""
        d = self._declared("services", name, each)
        return self.create_service(d.cls, d.name, callback)

    # ------------------------------------------------------------------ polled subscriptions
    def create_polled_subscription(self, msg_type: Any, topic: str, qos: Any, *, raw: bool = False) -> Subscription:
        """A subscription the node drains itself (:meth:`take_all`, or an :class:`EventLoop`) instead of one
        executor callback per message; ``raw``: messages come as CDR bytes.

        The subscription is in a callback group that no executor serves (:class:`~.rmw.NeverExecuted`), from
        the moment it exists: the executor neither waits on it nor on its QoS event handlers (those wait on the
        same reader condition, which stays triggered while data waits, so waiting on them would return at once
        for as long as the queue is not drained). The queue (``qos`` depth) must hold what arrives between two
        drains. The subscription belongs to this node in the graph and is destroyed with it. Incompatible
        publishers are found by the node's 1 Hz QoS check instead of an event handler, logged and reported in
        diagnostics (``incompatible_qos``).
        """
        return Node.create_subscription(self, msg_type, topic, _polled_callback, qos, raw=raw,
                                        callback_group=self._polled_group, event_callbacks=_NO_SUB_EVENTS)

    # ------------------------------------------------------------------ entities with the node's lock
    def create_subscription(self, msg_type: Any, topic: str, callback: Callable, qos_profile: Any,
                            **kwargs: Any) -> Subscription:
        """rclpy's, with ``callback`` holding :attr:`lock` and no default QoS event handlers."""
        kwargs.setdefault("event_callbacks", _NO_SUB_EVENTS)
        return super().create_subscription(msg_type, topic, _locked(self.lock, callback), qos_profile, **kwargs)

    def create_publisher(self, msg_type: Any, topic: str, qos_profile: Any, **kwargs: Any) -> Any:
        """rclpy's, without default QoS event handlers."""
        kwargs.setdefault("event_callbacks", _NO_PUB_EVENTS)
        return super().create_publisher(msg_type, topic, qos_profile, **kwargs)

    def create_service(self, srv_type: Any, srv_name: str, callback: Callable, **kwargs: Any) -> Any:
        """rclpy's, with ``callback`` holding :attr:`lock`."""
        return super().create_service(srv_type, srv_name, _locked(self.lock, callback), **kwargs)

    def create_timer(self, timer_period_sec: float, callback: Callable, *args: Any, **kwargs: Any) -> Any:
        """rclpy's, with ``callback`` holding :attr:`lock`. For fixed-rate control work use :meth:`create_loop`."""
        return super().create_timer(timer_period_sec, _locked(self.lock, callback), *args, **kwargs)

    def create_loop(self, rate_hz: float, callback: Callable[[], None], name: str = "loop") -> ControlLoop:
        """Run ``callback()`` at ``rate_hz`` [Hz] on its own thread (:class:`ControlLoop`), from now until
        :meth:`destroy_node`."""
        loop = ControlLoop(self, 1.0 / rate_hz, callback, name)
        self.loops.append(loop)
        return loop

    def create_event_loop(self, subscriptions: list[Subscription], callback: Callable[[Subscription], None],
                          name: str = "events") -> EventLoop:
        """Call ``callback(subscription)`` on its own thread (:class:`EventLoop`) whenever messages wait in one of
        ``subscriptions`` (polled ones, created by :meth:`create_polled_subscription`), until :meth:`destroy_node`."""
        loop = EventLoop(self, subscriptions, callback, name)
        self.loops.append(loop)
        return loop

    @staticmethod
    def tick_due_time(now: float) -> float:
        """Inside a loop tick (:meth:`create_loop`): when this tick was due [s], on the clock that reads ``now``
        [s] (see :meth:`ControlLoop.due_time`). Outside a loop tick: ``now``."""
        loop = getattr(_THIS_THREAD, "loop", None)
        return now if loop is None else loop.due_time(now)

    def start_grid_on_this_tick(self, source: Any, now: float) -> None:
        """Inside a loop tick: ``source.start(t0)`` (a synthetic source sampling on a grid at the loop's period)
        with ``t0`` :data:`SAMPLE_LEAD_S` before this tick's due time, so a sample is due just before every
        tick however late this one started (``now``: the node clock [s] at this tick)."""
        source.start(self.tick_due_time(now) - SAMPLE_LEAD_S)

    def stop_loops(self) -> None:
        """Stop the node's loops (a running tick ends first). Idempotent. A subclass that closes what its
        loops use (a source, a backend) calls this first in its ``destroy_node``."""
        for loop in getattr(self, "loops", ()):
            loop.cancel()

    def close_on_destroy(self, resource: Any) -> Any:
        """Have :meth:`destroy_node` call ``resource.close()`` once the loops have stopped (resources closed
        newest first; a close that raises is logged); returns ``resource``."""
        self._owned.append(resource)
        return resource

    def destroy_node(self) -> None:
        """Stop the loops (a running tick ends first), close what :meth:`close_on_destroy` was given, then
        destroy the node."""
        self.stop_loops()
        while self._owned:
            resource = self._owned.pop()
            try:
                resource.close()
            except Exception as exc:  # noqa: BLE001 - shutting down regardless; the error is logged
                self.get_logger().error(f"closing {type(resource).__name__} failed: {exc!r}")
        super().destroy_node()

    def take_all(self, sub: Subscription, limit: int = 10_000) -> Iterator[Taken]:
        """Take the messages waiting in ``sub`` (a polled subscription of this node), oldest first, at most
        ``limit``; one direct take from the middleware each (:func:`~.rmw.take_waiting`).

        Receive times come from the middleware on the system clock; with ``use_sim_time`` they are moved onto
        the node's clock by the offset between the two clocks at the take (the take time when the middleware
        does not tell). Messages come in sequence order, so their receive times may step back (a reliable
        message repaired after a loss arrived after later ones). Raises ``ValueError`` for a subscription that
        is not one of this node's polled ones.
        """
        if sub.callback_group is not self._polled_group:
            raise ValueError(f"{sub.topic_name}: not a polled subscription of node {self.get_name()!r} "
                             "(create it with create_polled_subscription)")
        received = take_waiting(sub, limit)
        first = next(received, None)
        if first is None:
            return  # nothing waiting: no clock read
        now_ns, offset = self.get_clock().now().nanoseconds, self._system_clock_offset()
        for r in itertools.chain((first,), received):
            yield Taken(r.message, r.received_ns + offset if r.received_ns else now_ns, r.publisher, r.sequence)

    def take_newest_joint_states(self, sub: Subscription, meter: str) -> tuple[list[tuple[bytes, float]], int]:
        """Take the raw ``sensor_msgs/JointState`` messages waiting in ``sub`` (a raw polled subscription),
        ticking ``meter`` with each one's receive time and latency from its header stamp [s]; keep only the
        newest of each joint group (same first joint name), so that only those need deserializing.

        Returns:
            (CDR bytes, receive time [s]) of the newest message per joint group, and how many older messages
            they superseded.
        """
        newest: dict[bytes, tuple[bytes, float]] = {}
        superseded = 0
        for taken in self.take_all(sub):
            raw, received_s = taken.message, taken.received_ns * 1e-9
            self.meter(meter).tick(received_s, received_s - 1e-9 * header_stamp_ns(raw))
            key = first_name_after_header(raw)
            superseded += key in newest
            newest[key] = (raw, received_s)
        return list(newest.values()), superseded

    def _system_clock_offset(self) -> int:
        """Node clock minus system clock [ns]: 0 unless simulated time drives the node clock. Estimated from
        the read bracketed most tightly by two system-clock reads (a read preempted between two clocks would
        otherwise shift every receive time by the preemption)."""
        clock = self.get_clock()
        if clock.clock_type != ClockType.ROS_TIME or not clock.ros_time_is_active:
            return 0
        best = None
        for _ in range(3):
            before = time.time_ns()
            node_ns = clock.now().nanoseconds
            after = time.time_ns()
            if best is None or after - before < best[0]:
                best = (after - before, node_ns - (before + after) // 2)
        return best[1]

    def _check_subscription_qos(self) -> None:
        """Log and remember publishers whose QoS cannot match one of the node's subscriptions (1 Hz,
        diagnostics timer)."""
        found = {}
        for sub in self.subscriptions:
            for info in self.get_publishers_info_by_topic(sub.topic_name):
                compatibility, reason = qos_check_compatible(info.qos_profile, sub.qos_profile)
                if compatibility == QoSCompatibility.ERROR:
                    found[sub.topic_name] = f"publisher {info.node_name}: {reason}"
        for topic, why in found.items():
            if self.incompatible_qos.get(topic) != why:
                self.get_logger().warning(f"{topic}: a publisher's QoS cannot match this subscription ({why})")
        self.incompatible_qos = found

    def log_at(self, level: str, text: str) -> None:
        """Log ``text`` at ``level`` (``"info"``, ``"warning"``, anything else: error) of a core object's notice;
        one call site per severity, as rclpy's logger requires."""
        log = self.get_logger()
        if level == "info":
            log.info(text)
        elif level == "warning":
            log.warning(text)
        else:
            log.error(text)

    def now_s(self) -> float:
        """The node clock [s]."""
        return self.get_clock().now().nanoseconds * 1e-9

    def meter(self, name: str, nominal_hz: float | None = None, latency_budget_ms: float | None = None) -> RateMeter:
        """A named rate/latency meter reported in diagnostics (``<name>.rate_hz``, latency percentiles and,
        once given, ``<name>.nominal_hz``: the rate it should show [Hz], ``<name>.latency_budget_ms``: the p99
        latency it should stay under [ms]) and by the demo."""
        if nominal_hz is not None:
            self.nominal_hz[name] = float(nominal_hz)
        if latency_budget_ms is not None:
            self.latency_budget_ms[name] = float(latency_budget_ms)
        return self.meters.setdefault(name, RateMeter())

    def diagnostic_values(self) -> Mapping[str, Any]:
        """Extra key/values for this node's diagnostics (override to add)."""
        return {}

    def diagnostic_level(self) -> tuple[int, str]:
        """(level, message) of this node's status (override for warnings)."""
        return DiagnosticStatus.OK, "running"

    def _publish_diagnostics(self) -> None:
        self._check_subscription_qos()
        now = self.now_s()
        meters = []
        for name, m in self.meters.items():
            p50, p99 = m.latency_percentiles(50, 99)  # [s]; NaN without latencies (then not written)
            meters.append(Meter(name, m.rate(now), self.nominal_hz.get(name, math.nan), 1e3 * p50, 1e3 * p99,
                                self.latency_budget_ms.get(name, math.nan)))
        values = encode_meters(meters)
        values.update({k: str(v) for k, v in self.diagnostic_values().items()})
        level, message = self.diagnostic_level()
        if self.incompatible_qos:
            values["incompatible_qos"] = "; ".join(f"{t}: {why}" for t, why in sorted(self.incompatible_qos.items()))
            if level == DiagnosticStatus.OK:
                level = DiagnosticStatus.WARN
                message = f"incompatible QoS on {', '.join(sorted(self.incompatible_qos))}"
        status = DiagnosticStatus(
            level=level,
            name=f"{self.get_name()}",
            message=message,
            hardware_id="",
            values=[KeyValue(key=k, value=v) for k, v in values.items()],
        )
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)


_NO_SUB_EVENTS = SubscriptionEventCallbacks(use_default_callbacks=False)
_NO_PUB_EVENTS = PublisherEventCallbacks(use_default_callbacks=False)


def _polled_callback(msg: Any) -> None:
    """The callback of every polled subscription. Their callback group keeps executors from calling it."""
    raise RuntimeError("an executor called back a polled subscription: it ignored the subscription's callback "
                       "group (nodes.rmw.NeverExecuted)")


def run_single(node_cls: type[TeleopNode], args: list[str] | None = None) -> int:
    """Console-script entry: init rclpy, spin one node until Ctrl-C; exit code.

    A :class:`RynnTeleopError` at start (bad parameter, an unreadable ``--params-file``, missing hardware) is
    printed as one line on stderr and returns :data:`~..errors.REFUSED_EXIT_CODE`: the node refuses to start.
    """
    use_transport_profile()
    args = list(args if args is not None else sys.argv)
    node = None
    code = 0
    try:
        priority_class = process_priority_class([node_cls])
        for path in params_files(args):  # rclpy would stop on a malformed one with a traceback
            read_yaml(path, "parameter file")
    except RynnTeleopError as exc:
        print(f"[{node_cls.SCHEMA.node_name}] refusing to start: {exc}", file=sys.stderr)
        return REFUSED_EXIT_CODE
    rclpy.init(args=args)
    try:
        node = node_cls()
        node.get_logger().info(f"scheduling: {use_process_priority(priority_class)}")
        freeze_startup_objects()
        rclpy.spin(node)
    except RynnTeleopError as exc:
        print(f"[{node_cls.SCHEMA.node_name}] refusing to start: {exc}", file=sys.stderr)
        code = REFUSED_EXIT_CODE
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:
        if rclpy.ok():  # a real error; after a shutdown (launch's Shutdown action) a racing publish is not one
            raise
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        node = None
        release_startup_objects()
    return code
