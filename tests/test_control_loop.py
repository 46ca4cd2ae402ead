"""Fixed-rate loops off the executor: deadlines (core, injected times) and ControlLoop on real rclpy."""

from __future__ import annotations

import os
import threading
import time

import pytest
from ros_helpers import wait_for
from std_srvs.srv import Trigger

from rynn_teleop.core.params import Param, ParamSchema
from rynn_teleop.core.scheduling import Deadlines, name_this_thread
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.nodes.base import TeleopNode
from rynn_teleop.runner import Composition


# ---------------------------------------------------------------------- Deadlines (no ROS)
def test_a_late_tick_does_not_shift_the_grid():
    d = Deadlines(0.005, start=1.0)
    assert d.due == 1.0
    assert d.start_tick(1.003) == pytest.approx(0.003)  # 3 ms late
    assert d.finish_tick(1.004) == pytest.approx(1.005)  # the next is due on the grid, 1 ms later
    d.start_tick(1.005)
    assert d.finish_tick(1.0055) == pytest.approx(1.010)
    assert d.skipped == 0 and d.ticks == 2 and d.max_late == pytest.approx(0.003)


def test_ticks_a_whole_period_behind_are_skipped_and_counted_not_run_in_a_burst():
    d = Deadlines(0.01, start=0.0)
    d.start_tick(0.0)
    due = d.finish_tick(0.047)  # the tick overran into the 5th period
    assert due == pytest.approx(0.04)  # ticks due at 0.01..0.03 are gone; the one due at 0.04 runs now, late
    assert d.skipped == 3
    d.start_tick(0.047)
    assert d.finish_tick(0.048) == pytest.approx(0.05)  # and the grid goes on


@pytest.mark.parametrize("period", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_period_is_refused(period):
    with pytest.raises(ConfigurationError, match="period"):
        Deadlines(period, 0.0)


# ---------------------------------------------------------------------- ControlLoop on rclpy
class _LoopNode(TeleopNode):
    SCHEMA = ParamSchema("loop_probe", [Param("rate_hz", float, 200.0, "loop rate", "Hz", min=1.0, max=1000.0)])

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.inside = False
        self.overlaps = 0
        self.ticks = 0
        self.service_calls = 0
        self.ticks_at_poke: list[int] = []  # self.ticks at each service call
        self.fail_at = -1
        self.loop = self.create_loop(self.params["rate_hz"], self._tick, "test")
        self.create_service(Trigger, "~/poke", self._poke)

    def _tick(self) -> None:
        self.overlaps += self.inside
        self.inside = True
        self.ticks += 1
        time.sleep(0.001)
        self.inside = False
        if self.ticks == self.fail_at:
            raise RuntimeError("tick failed")

    def _poke(self, request, response):
        self.overlaps += self.inside
        self.inside = True
        self.service_calls += 1
        self.ticks_at_poke.append(self.ticks)
        time.sleep(0.002)
        self.inside = False
        response.success = True
        return response


@pytest.fixture
def loop_node(ros_domain_id):
    comp = Composition([], domain_id=ros_domain_id)
    node = _LoopNode(context=comp.context)
    comp.add_node(node)
    yield comp, node
    comp.shutdown()


def test_loop_ticks_and_service_callbacks_never_overlap(loop_node):
    comp, node = loop_node
    client = node.create_client(Trigger, "/loop_probe/poke")
    assert client.wait_for_service(timeout_sec=10.0)
    for _ in range(20):  # one call at a time, 5 ms apart: the 200 Hz loop ticks between them
        future = client.call_async(Trigger.Request())
        assert wait_for(future.done, 10.0)
        time.sleep(0.005)
    assert node.service_calls == 20
    assert node.ticks_at_poke[-1] > node.ticks_at_poke[0]  # the loop ran while the services were called
    assert wait_for(lambda: node.ticks > node.ticks_at_poke[-1] + 5, 5.0)  # and goes on
    assert node.overlaps == 0


def test_a_failing_tick_is_recorded_and_the_loop_goes_on(loop_node):
    comp, node = loop_node
    node.fail_at = node.ticks + 3
    assert wait_for(lambda: comp.errors, 5.0)
    assert isinstance(comp.errors[0], RuntimeError)
    ticks = node.ticks
    assert wait_for(lambda: node.ticks > ticks + 5, 5.0)


def test_destroying_the_node_stops_its_loop(ros_domain_id):
    comp = Composition([], domain_id=ros_domain_id)
    try:
        node = _LoopNode(context=comp.context)
        comp.add_node(node)
        assert wait_for(lambda: node.ticks > 3, 5.0)
        thread = node.loop._thread
        comp.remove_node(node)
        assert not thread.is_alive()
        ticks = node.ticks
        time.sleep(0.05)
        assert node.ticks == ticks
    finally:
        comp.shutdown()
    assert not any(t.name.startswith("loop_probe:") for t in threading.enumerate())


class _Resource:
    def __init__(self, name: str, closed: list, node: _LoopNode, fail: bool = False) -> None:
        self.name, self.closed, self.node, self.fail = name, closed, node, fail

    def close(self) -> None:
        self.closed.append((self.name, self.node.loop.running))
        if self.fail:
            raise OSError("device gone")


def test_destroying_the_node_closes_its_resources_after_its_loops_newest_first(ros_domain_id):
    comp = Composition([], domain_id=ros_domain_id)
    closed: list[tuple[str, bool]] = []
    try:
        node = _LoopNode(context=comp.context)
        first = _Resource("source", closed, node)
        assert node.close_on_destroy(first) is first
        node.close_on_destroy(_Resource("backend", closed, node, fail=True))  # a failing close stops nothing
        comp.add_node(node)
        assert wait_for(lambda: node.ticks > 3, 5.0)
        comp.remove_node(node)
    finally:
        comp.shutdown()
    assert closed == [("backend", False), ("source", False)]  # the loop had stopped before each close


def test_entities_have_no_default_event_handlers(loop_node):
    from std_msgs.msg import Bool

    _, node = loop_node
    sub = node.create_subscription(Bool, "/x", lambda m: None, 10)
    pub = node.create_publisher(Bool, "/x", 10)
    assert list(sub.event_handlers) == [] and list(pub.event_handlers) == []


def test_a_tick_knows_when_it_was_due_however_late_it_started(loop_node):
    """Synthetic sources start their sample grid at a tick's due time: a late first tick must not shift it."""
    _, node = loop_node
    period = 0.2
    seen: list[tuple[float, float]] = []  # (due [s], now [s]) per tick, node clock
    done = threading.Event()

    def tick():
        now = node.now_s()
        seen.append((node.tick_due_time(now), now))
        if len(seen) == 4:
            done.set()

    with node.lock:  # the first tick waits for the lock: it starts about 0.15 s after its due time
        loop = node.create_loop(1.0 / period, tick, "due")
        time.sleep(period + 0.15)
    assert done.wait(10.0)
    loop.cancel()
    dues = [d for d, _ in seen]
    assert seen[0][1] - dues[0] > 0.1  # the first tick did start late
    for k, due in enumerate(dues):  # yet every due time is on the grid of the first (clock reads: 20 ms)
        assert due == pytest.approx(dues[0] + k * period, abs=0.02)
    assert TeleopNode.tick_due_time(12.5) == 12.5  # outside a loop tick: now


def _kernel_names() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # the thread ended meanwhile
    return names


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/comm"), reason="Linux thread names")
def test_loop_and_spin_threads_carry_their_names_in_the_kernel(loop_node):
    comp, node = loop_node  # top -H, ps -L, perf and scheduler traces show which loop of which node ran
    assert wait_for(lambda: "loop_probe:test" in _kernel_names() and "spin:loop_probe" in _kernel_names(), 5.0)


def test_a_thread_name_is_cut_to_what_the_kernel_keeps(tmp_path):
    comm = tmp_path / "comm"
    comm.write_text("")
    assert name_this_thread("hand_retarget:poll", str(comm)) == "hand_retarget:p"
    assert comm.read_text() == "hand_retarget:p"
    assert name_this_thread("x", str(tmp_path / "absent" / "comm")) is None  # no such file: nothing set, no error


def test_a_loop_with_a_long_period_stops_at_once_not_at_its_next_tick(loop_node):
    # waits up to SLEEP_MAX_S are plain sleeps; a longer one must stay interruptible by cancel()
    comp, node = loop_node
    slow = node.create_loop(0.05, lambda: None, "slow")  # a tick every 20 s
    assert wait_for(lambda: slow.running, 5.0)
    time.sleep(0.1)  # now inside its first wait
    started = time.monotonic()
    slow.cancel(timeout=30.0)
    assert not slow.running
    assert time.monotonic() - started < 10.0  # a plain sleep would end only at 20 s
