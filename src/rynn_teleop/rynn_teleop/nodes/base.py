"""What every rynn_teleop node shares: schema-declared parameters, diagnostics, ``main``.

A node subclasses :class:`TeleopNode`, sets ``SCHEMA`` (its parameters, see
``core.params``) and builds its core objects from ``self.params``. It is
started either by its console script (``ros2 run rynn_teleop <name>``, see
:func:`run_single`) or together with other nodes by ``rynn_teleop.runner``.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
from contextlib import ExitStack
from typing import Any, Callable, ClassVar, Iterator, Mapping, NamedTuple

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.executors import ExternalShutdownException
from rclpy.guard_condition import GuardCondition
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.clock import ClockType
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import QoSCompatibility, qos_check_compatible
from rclpy.subscription import Subscription

from ..core.params import ParamSchema
from ..core.scheduling import Deadlines, name_this_thread
from ..core.stats import RateMeter
from ..errors import RynnTeleopError
from .parameters import declare_schema
from .process import freeze_startup_objects, process_priority_class, use_process_priority, use_transport_profile


class Taken(NamedTuple):
    """One message taken from a polled subscription, with what the middleware knows about it."""

    message: Any  # the message, or its CDR bytes for a raw subscription
    received_ns: int  # when the middleware received it, on the node's clock [ns] (the take time if unknown)
    publisher: bytes  # the publisher's GID
    sequence: int | None  # the publisher's sequence number of this message (None when the RMW does not tell)


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

    def __init__(self, node: "TeleopNode", period: float, callback: Callable[[], None], name: str) -> None:
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
                    time.sleep(wait)  # cheaper per tick than Event.wait's lock dance (bench/control_loop.py)
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

    The thread waits on an rcl wait set of just ``subscriptions`` (polled ones:
    :meth:`TeleopNode.create_polled_subscription`) and a guard condition that stops it, and for each
    subscription with messages waiting calls ``callback(subscription)`` holding :attr:`TeleopNode.lock`; the
    callback drains it (:meth:`TeleopNode.take_all`). A wake costs one wait and the takes, not the executor's
    rebuild of a wait set over every entity of the node. An exception raised by the callback is logged and
    kept in :attr:`TeleopNode.loop_exceptions`; the loop goes on.
    """

    WAKE_TIMEOUT_NS = 500_000_000  # [ns] longest wait before the loop looks at the context again

    def __init__(self, node: "TeleopNode", subscriptions: list[Subscription], callback: Callable[[Subscription], None],
                 name: str) -> None:
        self.node = node
        self.name = name
        self.callback = callback
        self._subscriptions = list(subscriptions)
        self._stop = threading.Event()
        self._guard = GuardCondition(None, None, context=node.context)  # not the node's: the executor ignores it
        self._thread = threading.Thread(target=self._run, name=f"{node.get_name()}:{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        name_this_thread(self._thread.name)
        context, stop, lock = self.node.context, self._stop, self.node.lock
        with ExitStack() as held:  # the handles stay valid while the loop waits on them
            handles = [sub.handle for sub in self._subscriptions]
            guard = self._guard.handle
            for handle in (*handles, guard, context.handle):
                held.enter_context(handle)
            by_pointer = {handle.pointer: sub for handle, sub in zip(handles, self._subscriptions)}
            wait_set = _rclpy.WaitSet(len(handles), 1, 0, 0, 0, 0, context.handle)
            while not stop.is_set():
                wait_set.clear_entities()
                for handle in handles:
                    wait_set.add_subscription(handle)
                wait_set.add_guard_condition(guard)
                wait_set.wait(self.WAKE_TIMEOUT_NS)
                if stop.is_set() or not context.ok():
                    break
                ready = [by_pointer[p] for p in wait_set.get_ready_entities("subscription") if p in by_pointer]
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
            self._guard.trigger()
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
    tick holds :attr:`lock`, so node state needs no other locking between them.

    Publishers and subscriptions are created without rclpy's default QoS event handlers (each is one more
    waitable woken per event); incompatible publishers are found by a 1 Hz check instead and reported in
    diagnostics (``incompatible_qos``).
    """

    SCHEMA: ClassVar[ParamSchema]
    #: the node's :data:`~..core.scheduling.PRIORITY_CLASSES` name: how urgently its process must run
    PRIORITY: ClassVar[str] = "normal"

    def __init__(self, **node_kwargs: Any) -> None:
        """``node_kwargs`` go to ``rclpy.node.Node`` (context, parameter_overrides, namespace...)."""
        self.lock = threading.RLock()
        self.loops: list[ControlLoop | EventLoop] = []
        self.loop_exceptions: list[BaseException] = []  # exceptions raised by loop ticks
        super().__init__(self.SCHEMA.node_name, **node_kwargs)
        self.params: dict[str, Any] = declare_schema(self, self.SCHEMA)
        self.meters: dict[str, RateMeter] = {}
        self.nominal_hz: dict[str, float] = {}  # meter name -> the rate it should show [Hz] (diagnostics)
        self.latency_budget_ms: dict[str, float] = {}  # meter name -> the p99 latency it should stay under [ms]
        self._polled: dict[int, list[Taken]] = {}  # id of each subscription the executor must leave alone
        self._unwaited: set[int] = set()  # ids of their event handlers
        self.incompatible_qos: dict[str, str] = {}  # polled topic -> why a publisher of it cannot match
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diag_timer = self.create_timer(1.0, self._publish_diagnostics)

    # ------------------------------------------------------------------ polled subscriptions
    def create_polled_subscription(self, msg_type: Any, topic: str, qos: Any, *, raw: bool = False) -> Subscription:
        """A subscription the node drains itself (:meth:`take_all`) instead of one executor callback per message.

        rclpy's executor spends 0.1-0.2 ms of Python per message (it rebuilds its wait set every time); a node
        that only needs batches (the recorder, the world model taking the newest command per frame) drains the
        middleware's queue from a timer instead. The queue (``qos`` depth) must hold what arrives between two
        drains. The subscription belongs to this node in the graph and is destroyed with it. Its QoS event
        handlers are not waited on (see below); instead the node checks its publishers' QoS against it once
        a second, and an incompatible publisher is logged and reported in diagnostics (``incompatible_qos``).
        """
        strays: list[Taken] = []  # taken by the executor before it learnt to leave this subscription alone
        sub = Node.create_subscription(self, msg_type, topic, lambda msg, info: strays.append(_taken(msg, info)),
                                       qos, raw=raw, event_callbacks=_NO_SUB_EVENTS)
        self._polled[id(sub)] = strays
        # Event handlers, if any, wait on the same DDS reader condition, which stays triggered while data waits
        # to be drained: left in the wait set they would make the executor's wait return at once, for ever.
        self._unwaited.update(id(h) for h in sub.event_handlers)
        return sub

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

    def destroy_node(self) -> None:
        """Stop the loops (a running tick ends first), then destroy the node."""
        self.stop_loops()
        super().destroy_node()

    @property
    def subscriptions(self) -> Iterator[Subscription]:
        """The subscriptions the executor waits on (polled ones excluded)."""
        return (s for s in super().subscriptions if id(s) not in self._polled)

    @property
    def waitables(self) -> Iterator[Any]:
        """The waitables the executor waits on (the event handlers of polled subscriptions excluded)."""
        return (w for w in super().waitables if id(w) not in self._unwaited)

    def destroy_subscription(self, subscription: Subscription) -> bool:
        self._polled.pop(id(subscription), None)
        self._unwaited.difference_update(id(h) for h in subscription.event_handlers)
        return super().destroy_subscription(subscription)

    def take_all(self, sub: Subscription, limit: int = 10_000) -> Iterator[Taken]:
        """Take every message waiting in ``sub`` (a polled subscription), oldest first.

        Receive times come from the middleware on the system clock; with ``use_sim_time`` they are moved onto
        the node's clock by the offset between the two clocks at the take. Messages come in sequence order, so
        their receive times may step back (a reliable message repaired after a loss arrived after later ones).
        """
        strays = self._polled[id(sub)]
        if strays:
            now_ns, offset = self.get_clock().now().nanoseconds, self._system_clock_offset()
            while strays:
                yield _on_clock(strays.pop(0), offset, now_ns)
        with sub.handle:
            take, msg_type, raw = sub.handle.take_message, sub.msg_type, sub.raw
            taken = take(msg_type, raw)
            if taken is None:
                return  # nothing waiting: no clock read
            now_ns, offset = self.get_clock().now().nanoseconds, self._system_clock_offset()
            for _ in range(limit):
                msg, info = taken  # info: the RMW message info as a dict
                received = info.get("received_timestamp") or 0
                gid = info.get("publisher_gid")
                yield Taken(msg, received + offset if received else now_ns, bytes(gid["data"]) if gid else b"",
                            info.get("publication_sequence_number"))
                taken = take(msg_type, raw)
                if taken is None:
                    return

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

    def _check_polled_qos(self) -> None:
        """Log and remember publishers whose QoS cannot match one of the node's subscriptions (1 Hz,
        diagnostics timer)."""
        found = {}
        for sub in super().subscriptions:
            for info in self.get_publishers_info_by_topic(sub.topic_name):
                compatibility, reason = qos_check_compatible(info.qos_profile, sub.qos_profile)
                if compatibility == QoSCompatibility.ERROR:
                    found[sub.topic_name] = f"publisher {info.node_name}: {reason}"
        for topic, why in found.items():
            if self.incompatible_qos.get(topic) != why:
                self.get_logger().warning(f"{topic}: a publisher's QoS cannot match this subscription ({why})")
        self.incompatible_qos = found

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
        self._check_polled_qos()
        now = self.now_s()
        values = {}
        for name, m in self.meters.items():
            values[f"{name}.rate_hz"] = f"{m.rate(now):.1f}"
            if name in self.nominal_hz:
                values[f"{name}.nominal_hz"] = f"{self.nominal_hz[name]:g}"
            if name in self.latency_budget_ms:
                values[f"{name}.latency_budget_ms"] = f"{self.latency_budget_ms[name]:g}"
            p50, p99 = m.latency_percentiles(50, 99)
            if p50 == p50:  # not NaN
                values[f"{name}.latency_p50_ms"] = f"{1e3 * p50:.2f}"
                values[f"{name}.latency_p99_ms"] = f"{1e3 * p99:.2f}"
        values.update({k: str(v) for k, v in self.diagnostic_values().items()})
        level, message = self.diagnostic_level()
        if self.incompatible_qos:
            values["incompatible_qos"] = "; ".join(f"{t}: {why}" for t, why in sorted(self.incompatible_qos.items()))
            if level == DiagnosticStatus.OK:
                level, message = DiagnosticStatus.WARN, f"incompatible QoS on {', '.join(sorted(self.incompatible_qos))}"
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


def _on_clock(taken: Taken, offset_ns: int, now_ns: int) -> Taken:
    """``taken`` with its system-clock receive time moved onto the node's clock (the take time if unknown)."""
    return taken._replace(received_ns=taken.received_ns + offset_ns if taken.received_ns else now_ns)


def _taken(msg: Any, info: Any) -> Taken:
    """A message and its RMW message info (a dict from ``take_message``, a MessageInfo in a callback) as Taken."""
    get = info.get if isinstance(info, dict) else lambda k: getattr(info, k, None)
    gid = get("publisher_gid") or {}
    return Taken(msg, int(get("received_timestamp") or 0), bytes(gid.get("data", b"")),
                 get("publication_sequence_number"))


def run_single(node_cls: type[TeleopNode], args: list[str] | None = None) -> int:
    """Console-script entry: init rclpy, spin one node until Ctrl-C; exit code.

    A :class:`RynnTeleopError` at start (bad parameter, missing hardware) is
    printed as one line on stderr and returns 2: the node refuses to start.
    """
    use_transport_profile()
    node = None
    code = 0
    try:
        priority_class = process_priority_class([node_cls])
    except RynnTeleopError as exc:
        print(f"[{node_cls.SCHEMA.node_name}] refusing to start: {exc}", file=sys.stderr)
        return 2
    rclpy.init(args=args if args is not None else sys.argv)
    try:
        node = node_cls()
        node.get_logger().info(f"scheduling: {use_process_priority(priority_class)}")
        freeze_startup_objects()
        rclpy.spin(node)
    except RynnTeleopError as exc:
        print(f"[{node_cls.SCHEMA.node_name}] refusing to start: {exc}", file=sys.stderr)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:  # noqa: BLE001
        if rclpy.ok():  # a real error; after a shutdown (launch's Shutdown action) a racing publish is not one
            raise
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code
