"""TeleopNode polled subscriptions on real rclpy: drained by the node, never woken for by the executor.

The last test checks the contract with rclpy that ``nodes.rmw`` states; if it fails, rclpy changed it.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import rclpy
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from ros_helpers import wait_for
from sensor_msgs.msg import JointState

from rynn_teleop.core.params import ParamSchema
from rynn_teleop.nodes.base import TeleopNode
from rynn_teleop.nodes.rmw import NeverExecuted, SubscriptionWaitSet, take_waiting


class _Poller(TeleopNode):
    SCHEMA = ParamSchema("poller", [])


@pytest.fixture
def context(ros_domain_id):
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    yield ctx
    rclpy.try_shutdown(context=ctx)


def _pair(context, depth: int = 10, *, raw: bool = False, match: bool = True, sub_qos=None, pub_qos=None,
          **node_kwargs):
    """A poller node with a polled subscription to /polled, a publisher node and its publisher (matched)."""
    node = _Poller(context=context, **node_kwargs)
    pub_node = Node("pub", context=context)
    sub = node.create_polled_subscription(JointState, "/polled", sub_qos or depth, raw=raw)
    pub = pub_node.create_publisher(JointState, "/polled", pub_qos or depth)
    if match:
        assert wait_for(lambda: pub.get_subscription_count() > 0, 10.0)
    return node, sub, pub_node, pub


@contextlib.contextmanager
def _spinning(context, node):
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        executor.shutdown()
        thread.join(5.0)


def test_polled_messages_are_taken_in_order_with_sequence_and_receive_time(context):
    node, sub, _, pub = _pair(context, 100, raw=True)
    before = time.time_ns()
    for k in range(20):
        pub.publish(JointState(position=[float(k)]))
    published = time.time_ns()
    time.sleep(0.3)  # delivered long before it is taken: the receive time says when it arrived, not the take
    taken = []
    assert wait_for(lambda: taken.extend(node.take_all(sub)) or len(taken) >= 20, 5.0)
    assert [deserialize_message(t.message, JointState).position[0] for t in taken] == [float(k) for k in range(20)]
    assert [t.sequence for t in taken] == list(range(taken[0].sequence, taken[0].sequence + 20))
    assert len({t.publisher for t in taken}) == 1 and taken[0].publisher
    assert all(before <= t.received_ns <= published + 100_000_000 for t in taken)
    assert list(node.take_all(sub)) == []
    executor = SingleThreadedExecutor(context=context)  # it leaves the subscription and its handlers alone
    assert not executor.can_execute(sub) and not any(executor.can_execute(h) for h in sub.event_handlers)
    executor.shutdown()
    assert node.destroy_subscription(sub) and sub not in list(node.subscriptions)


def test_only_polled_subscriptions_can_be_drained(context):
    node = _Poller(context=context)
    sub = node.create_subscription(JointState, "/served", lambda msg: None, 10)
    with pytest.raises(ValueError, match="/served: not a polled subscription"):
        next(node.take_all(sub))


def test_waiting_data_does_not_make_the_executor_spin(context):
    """Data left in a polled subscription must not wake the executor: with the subscription's QoS event
    handlers still in the wait set, Fast DDS's wait returned at once for as long as data waited (a full core)."""
    node, sub, _, pub = _pair(context, raw=True)
    pub.publish(JointState())
    time.sleep(0.2)  # delivered, not taken
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    cpu = []

    def spin() -> None:
        start, t0 = time.thread_time(), time.monotonic()
        while time.monotonic() - t0 < 1.0:
            executor.spin_once(timeout_sec=0.1)
        cpu.append(time.thread_time() - start)

    thread = threading.Thread(target=spin)
    thread.start()
    thread.join(10.0)
    executor.shutdown()
    assert cpu and cpu[0] < 0.3, f"the executor thread used {cpu[0]:.2f} s of CPU in 1 s while data waited"
    assert len(list(node.take_all(sub))) == 1  # still there for the node to drain


def test_a_polled_subscription_created_while_its_node_spins_is_never_served_by_the_executor(context):
    """The executor rebuilds its wait set when a subscription is created; a polled one is left out from the
    start, so every message is there for take_all (an executor call would raise in the spin thread)."""
    node = _Poller(context=context)
    pub_node = Node("pub", context=context)
    pub = pub_node.create_publisher(JointState, "/polled", 100)
    with _spinning(context, node):
        sub = node.create_polled_subscription(JointState, "/polled", 100)
        assert wait_for(lambda: pub.get_subscription_count() > 0, 10.0)
        for k in range(20):
            pub.publish(JointState(position=[float(k)]))
            time.sleep(0.005)
        taken = []
        assert wait_for(lambda: taken.extend(node.take_all(sub)) or len(taken) >= 20, 5.0)
    assert [t.message.position[0] for t in taken] == [float(k) for k in range(20)]


def test_a_publisher_whose_qos_cannot_match_is_reported(context):
    """The event handlers that would warn about an incompatible publisher are not waited on; the node checks
    its publishers' QoS itself (1 Hz) and reports it in the log and diagnostics."""
    node, *_ = _pair(context, match=False, sub_qos=QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
                     pub_qos=QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))
    with _spinning(context, node):
        assert wait_for(lambda: "/polled" in node.incompatible_qos, 10.0)
    assert "pub" in node.incompatible_qos["/polled"] and "reliab" in node.incompatible_qos["/polled"].lower()


def test_receive_times_are_on_the_node_clock_with_simulated_time(context):
    """With use_sim_time the node clock runs on /clock; receive times (system clock from the middleware) are moved
    onto it, so a command's age is judged in one clock (the drivers' watchdog, the recorder's bag times)."""
    from rclpy.parameter import Parameter
    from rosgraph_msgs.msg import Clock

    node, sub, pub_node, pub = _pair(context, parameter_overrides=[Parameter("use_sim_time", value=True)])
    clock_pub = pub_node.create_publisher(Clock, "/clock", 10)
    sim_ns = 1_000 * 1_000_000_000  # 1000 s: far from the system clock
    msg = Clock()
    msg.clock.sec = 1000
    with _spinning(context, node):
        assert wait_for(lambda: clock_pub.publish(msg) or node.get_clock().now().nanoseconds == sim_ns, 10.0)
        pub.publish(JointState())
        taken = []
        assert wait_for(lambda: taken.extend(node.take_all(sub)) or taken, 5.0)
    # received a moment before the take, on the simulated clock (which stands still at 1000 s)
    assert sim_ns - 2_000_000_000 < taken[0].received_ns <= sim_ns


def test_event_loop_hands_over_each_message_as_it_arrives_holding_the_node_lock(context):
    node, sub, pub_node, pub = _pair(context, 100, raw=True)
    other = node.create_polled_subscription(JointState, "/polled_other", 100, raw=True)
    pub_other = pub_node.create_publisher(JointState, "/polled_other", 100)
    assert wait_for(lambda: pub_other.get_subscription_count() > 0, 10.0)
    got: list[tuple[str, float, bool]] = []

    def on_ready(s):
        owned = node.lock._is_owned()
        for taken in node.take_all(s):
            value = deserialize_message(taken.message, JointState).position[0]
            if value < 0:
                raise RuntimeError("bad value")
            got.append(("main" if s is sub else "other", value, owned))

    loop = node.create_event_loop([sub, other], on_ready, "relay")
    for k in range(10):
        pub.publish(JointState(position=[float(k)]))
        pub_other.publish(JointState(position=[100.0 + k]))
        time.sleep(0.01)
    assert wait_for(lambda: len(got) >= 20, 10.0)
    assert [v for s, v, _ in got if s == "main"] == [float(k) for k in range(10)]
    assert [v for s, v, _ in got if s == "other"] == [100.0 + k for k in range(10)]
    assert all(owned for _, _, owned in got)
    pub.publish(JointState(position=[-1.0]))  # the callback raises: kept, and the loop goes on
    assert wait_for(lambda: node.loop_exceptions, 5.0)
    pub.publish(JointState(position=[42.0]))
    assert wait_for(lambda: got[-1][1] == 42.0, 5.0)
    started = time.monotonic()
    node.stop_loops()
    assert not loop.running and time.monotonic() - started < 1.0  # the guard condition ends the wait at once
    pub.publish(JointState(position=[43.0]))
    time.sleep(0.3)
    assert got[-1][1] == 42.0
    node.destroy_node()


def _cpu_of_spinning(executor, seconds: float) -> float:
    """CPU time [s] the thread spinning ``executor`` (spin_once, 0.1 s timeout) used in ``seconds`` [s]."""
    cpu = []

    def spin() -> None:
        start, t0 = time.thread_time(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            executor.spin_once(timeout_sec=0.1)
        cpu.append(time.thread_time() - start)

    thread = threading.Thread(target=spin)
    thread.start()
    thread.join(seconds + 10.0)
    return cpu[0]


def test_the_rclpy_contract_of_polled_subscriptions(context):
    """What nodes.rmw relies on in rclpy (its module docstring), on plain rclpy entities: if this fails, the
    installed rclpy changed that contract and nodes.rmw needs adapting."""
    node = Node("contract", context=context)
    pub_node = Node("contract_pub", context=context)
    called = []
    events = SubscriptionEventCallbacks(incompatible_qos=called.append)  # a QoS event handler in the group
    subs = [node.create_subscription(JointState, f"/contract_{k}", called.append, 10, raw=k == 0,
                                     callback_group=NeverExecuted(), event_callbacks=events) for k in range(2)]
    pubs = [pub_node.create_publisher(JointState, f"/contract_{k}", 10) for k in range(2)]
    assert all(s.event_handlers for s in subs)
    assert wait_for(lambda: all(p.get_subscription_count() > 0 for p in pubs), 10.0)

    # executors leave entities of a group that cannot execute alone, event handlers included
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    assert not any(executor.can_execute(e) for s in subs for e in (s, *s.event_handlers))
    before = time.time_ns()
    for k in range(3):
        pubs[0].publish(JointState(position=[float(k)]))
    pubs[1].publish(JointState(position=[7.0]))
    published = time.time_ns()
    time.sleep(0.2)  # delivered, not taken
    cpu = _cpu_of_spinning(executor, 0.5)
    executor.shutdown()
    assert not called and cpu < 0.2, f"the executor thread used {cpu:.2f} s of CPU in 0.5 s while data waited"

    # a wait set of just these subscriptions: ready ones in the order given, a wake ends a wait at once
    waiter = SubscriptionWaitSet(subs, context)
    with waiter:
        assert waiter.wait(1_000_000_000) == subs
        assert waiter.wait(0) == subs  # still ready: nothing was taken
        # direct takes: raw bytes or messages, oldest first, with the middleware's receive time and publisher
        raw = list(take_waiting(subs[0], 10))
        assert waiter.wait(5_000_000_000) == [subs[1]]
        typed = list(take_waiting(subs[1], 10))
        started = time.monotonic()
        assert waiter.wait(100_000_000) == [] and time.monotonic() - started > 0.05  # nothing waits: a timeout
        threading.Timer(0.1, waiter.wake).start()
        assert waiter.wait(5_000_000_000) == [] and time.monotonic() - started < 4.0  # woken, not timed out
    assert [deserialize_message(r.message, JointState).position[0] for r in raw] == [0.0, 1.0, 2.0]
    assert [r.message.position[0] for r in typed] == [7.0]
    assert all(before <= r.received_ns <= published + 100_000_000 for r in raw + typed)  # system clock [ns]
    assert [r.sequence for r in raw] == [raw[0].sequence + k for k in range(3)]
    assert raw[0].publisher and len({r.publisher for r in raw}) == 1 and typed[0].publisher != raw[0].publisher
    assert list(take_waiting(subs[0], 10)) == []  # nothing waiting
    pubs[0].publish(JointState())
    assert wait_for(lambda: len(list(take_waiting(subs[0], 1))) == 1, 5.0)  # at most ``limit``
    assert all(node.destroy_subscription(s) for s in subs)  # the wait set let go of the handles
