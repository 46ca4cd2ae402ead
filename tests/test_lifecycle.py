"""Managed drivers: the lifecycle plan (ROS-free), the drivers' transitions and safety in each state, and the
lifecycle manager bringing them up in order over their services (real rclpy, the sim backend)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from hypothesis import given, settings
from hypothesis import strategies as st
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions, GetState
from rclpy.node import Node
from ros_helpers import wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool
from std_srvs.srv import Trigger

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.lifecycle import (
    ACTIVE,
    FINALIZED,
    GOALS,
    INACTIVE,
    TRANSITIONS,
    UNCONFIGURED,
    LifecycleError,
    Step,
    bring_to,
    plan,
)
from rynn_teleop.core.robot_model import JointLimits, arm_joint_names
from rynn_teleop.core.safety import SafetyController
from rynn_teleop.core.status import DriverStatus
from rynn_teleop.errors import REFUSED_EXIT_CODE, HardwareUnavailableError
from rynn_teleop.nodes.lifecycle_manager import manage
from rynn_teleop.runner import Composition

ARM = list(arm_joint_names("left") + arm_joint_names("right"))


# --- the plan (ROS-free) -----------------------------------------------------------------------------------------


def _apply(states: dict[str, str], steps: list[Step]) -> dict[str, str]:
    """The states after ``steps``, each checked to start from the state its transition leaves."""
    states = dict(states)
    for node, transition in steps:
        start, end = TRANSITIONS[transition]
        assert states[node] == start, (node, transition, states[node])
        states[node] = end
    return states


def test_up_configures_every_node_before_activating_any_and_down_is_the_reverse():
    order = ["arm_driver", "hand_driver"]
    assert plan(dict.fromkeys(order, UNCONFIGURED), order, ACTIVE) == [
        Step("arm_driver", "configure"), Step("hand_driver", "configure"),
        Step("arm_driver", "activate"), Step("hand_driver", "activate")]
    assert plan(dict.fromkeys(order, ACTIVE), order, UNCONFIGURED) == [
        Step("hand_driver", "deactivate"), Step("arm_driver", "deactivate"),
        Step("hand_driver", "cleanup"), Step("arm_driver", "cleanup")]
    assert plan({"arm_driver": ACTIVE, "hand_driver": UNCONFIGURED}, order, ACTIVE) == [
        Step("hand_driver", "configure"), Step("hand_driver", "activate")]
    assert plan(dict.fromkeys(order, INACTIVE), order, INACTIVE) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(GOALS), min_size=1, max_size=5), st.sampled_from(GOALS))
def test_a_plan_brings_every_node_to_the_goal_one_valid_transition_at_a_time(starts, goal):
    order = [f"n{i}" for i in range(len(starts))]
    states = dict(zip(order, starts))
    steps = plan(states, order, goal)
    assert _apply(states, steps) == dict.fromkeys(order, goal)
    kinds = [s.transition for s in steps]
    for first, then in (("configure", "activate"), ("deactivate", "cleanup")):  # a whole rung before the next
        if first in kinds and then in kinds:
            assert max(i for i, k in enumerate(kinds) if k == first) < min(i for i, k in enumerate(kinds) if k == then)
    for kind in set(kinds):
        nodes = [s.node for s in steps if s.transition == kind]
        expected = [n for n in order if n in nodes]
        assert nodes == (expected if kind in ("configure", "activate") else expected[::-1])


def test_a_plan_refuses_what_no_transition_reaches():
    with pytest.raises(LifecycleError, match="n0: finalized"):
        plan({"n0": FINALIZED}, ["n0"], ACTIVE)
    with pytest.raises(LifecycleError, match="middle of a transition \\(configuring\\)"):
        plan({"n0": "configuring"}, ["n0"], ACTIVE)
    with pytest.raises(ValueError, match="unknown lifecycle goal 'finalized'"):
        plan({"n0": ACTIVE}, ["n0"], FINALIZED)


class _Nodes:
    """A Transitioner stand-in: states in a dict, one transition made to fail."""

    def __init__(self, states, fail):
        self.states, self.fail, self.calls = dict(states), fail, []

    def state(self, node):
        return self.states[node]

    def change(self, node, transition):
        self.calls.append((node, transition))
        if (node, transition) == self.fail:
            raise HardwareUnavailableError(f"{node}: no device")
        self.states[node] = TRANSITIONS[transition][1]


def test_a_failed_transition_undoes_what_the_bring_up_did_and_raises_the_nodes_error():
    nodes = _Nodes({"arm": UNCONFIGURED, "hand": UNCONFIGURED, "head": INACTIVE}, fail=("hand", "activate"))
    with pytest.raises(HardwareUnavailableError, match="hand: no device"):
        bring_to(ACTIVE, ["arm", "hand", "head"], nodes)
    assert nodes.calls == [("arm", "configure"), ("hand", "configure"), ("arm", "activate"), ("hand", "activate"),
                           ("arm", "deactivate"), ("hand", "cleanup"), ("arm", "cleanup")]
    assert nodes.states == {"arm": UNCONFIGURED, "hand": UNCONFIGURED, "head": INACTIVE}  # as they were found


def test_restarting_the_safety_layer_forgets_commands_and_keeps_the_estop():
    n = 2
    limits = JointLimits(np.full(n, -1.0), np.full(n, 1.0), np.full(n, 1.0), np.full(n, 10.0), np.full(n, 100.0))
    ctl = SafetyController(["a", "b"], limits, 0.01, command_timeout=0.1)
    ctl.command(np.array([0.5, 0.5]), 0.0)
    assert ctl.step(0.01, np.zeros(n)).mode in ("ramp", "track")
    ctl.restart(0.02)
    assert ctl.mode == "waiting"
    ctl.command(np.array([0.5, 0.5]), 0.015)  # received before the restart, handed over after it
    out = ctl.step(0.03, np.full(n, 0.2))
    assert out.mode == "watchdog" and np.allclose(out.target, 0.2)  # re-seeded from the measurement, holding
    ctl.estop()
    ctl.restart(0.04)
    assert ctl.estopped and ctl.mode == "estop"


# --- the drivers on real rclpy -------------------------------------------------------------------------------------


class Probe:
    """A node in the composition's context: lifecycle and Trigger clients, /joint_states, commands, /estop."""

    def __init__(self, comp: Composition) -> None:
        self.node = Node("lifecycle_probe", context=comp.context)
        self.lock = threading.Lock()
        self.arm_states: list[float] = []  # arrival times [s] of the arm driver's /joint_states
        self.node.create_subscription(JointState, "/joint_states", self._on_state, 200)
        self.arm_cmd = self.node.create_publisher(JointState, "/arms/command", 10)
        self.estop = self.node.create_publisher(Bool, "/estop", 10)
        self._clients = {}
        comp.add_node(self.node)

    def _on_state(self, msg: JointState) -> None:
        if list(msg.name) == ARM:
            with self.lock:
                self.arm_states.append(time.monotonic())

    def states_within(self, seconds: float) -> int:
        time.sleep(seconds)
        now = time.monotonic()
        with self.lock:
            return sum(1 for t in self.arm_states if t > now - seconds)

    def call(self, srv_type, name: str, request=None):
        client = self._clients.get(name) or self._clients.setdefault(name, self.node.create_client(srv_type, name))
        assert client.wait_for_service(timeout_sec=10.0), name
        future = client.call_async(request if request is not None else srv_type.Request())
        assert wait_for(future.done, 10.0), name
        return future.result()

    def change(self, node: str, transition_id: int) -> bool:
        request = ChangeState.Request(transition=Transition(id=transition_id))
        return self.call(ChangeState, f"/{node}/change_state", request).success

    def state(self, node: str) -> str:
        return self.call(GetState, f"/{node}/get_state").current_state.label


def _spy(driver, log: list) -> None:
    """Record the driver's backend calls (node, method) in ``log``, the real methods still called."""
    backend = driver.backend

    def recorded(name, real):
        def call(*args):
            log.append((driver.get_name(), name))
            return real(*args)
        return call

    for name in ("connect", "enable", "disable", "stop", "close"):
        setattr(backend, name, recorded(name, getattr(backend, name)))


def _status(driver) -> DriverStatus:
    """What the console reads: the typed status from the published values."""
    return DriverStatus.decode({k: str(v) for k, v in driver.diagnostic_values().items()})


@pytest.fixture
def arm(ros_domain_id):
    """An arm driver left unconfigured, a probe and the driver's backend calls."""
    comp = Composition(["arm_driver"], domain_id=ros_domain_id, lifecycle=UNCONFIGURED,
                       overrides={"arm_driver": {"command_timeout_s": 0.1}})
    log: list = []
    try:
        driver = comp.node("arm_driver")
        _spy(driver, log)
        yield comp, Probe(comp), driver, log
    finally:
        comp.shutdown()
    assert not comp.errors


def test_each_transition_does_its_backend_call_and_only_an_active_driver_writes(arm):
    comp, probe, driver, log = arm
    assert probe.state("arm_driver") == UNCONFIGURED and _status(driver).lifecycle == UNCONFIGURED
    labels = {t.transition.label for t in probe.call(GetAvailableTransitions,
                                                     "/arm_driver/get_available_transitions").available_transitions}
    assert "configure" in labels and "activate" not in labels
    assert probe.states_within(0.3) == 0 and log == []  # nothing connected, nothing published

    assert probe.change("arm_driver", Transition.TRANSITION_CONFIGURE)  # what `ros2 lifecycle set` sends
    assert log == [("arm_driver", "connect")] and probe.state("arm_driver") == INACTIVE
    assert wait_for(lambda: probe.states_within(0.2) > 0, 5.0)  # measured, published
    writes = driver.backend.writes
    for _ in range(20):  # commands while inactive: dropped, counted, nothing written
        probe.arm_cmd.publish(JointState(name=ARM, position=(np.array(DEFAULT_HOME) + 0.2).tolist()))
        time.sleep(0.01)
    assert wait_for(lambda: driver.ignored_commands > 0, 2.0)
    assert driver.backend.writes == writes == 0
    refused = probe.call(Trigger, "/arm_driver/reset")
    assert not refused.success and "inactive" in refused.message and "activate" in refused.message
    assert _status(driver).lifecycle == INACTIVE and driver.diagnostic_level()[1].startswith("inactive")

    assert probe.change("arm_driver", Transition.TRANSITION_ACTIVATE)
    assert log[-1] == ("arm_driver", "enable") and _status(driver).lifecycle == ACTIVE
    assert wait_for(lambda: driver.backend.writes > 0, 5.0)  # holding the measured position
    time.sleep(0.3)
    np.testing.assert_allclose(driver.last_reading.position, DEFAULT_HOME, atol=1e-6)  # the dropped ones not followed

    assert probe.change("arm_driver", Transition.TRANSITION_DEACTIVATE)
    assert log[-2:] == [("arm_driver", "stop"), ("arm_driver", "disable")]
    writes = driver.backend.writes
    time.sleep(0.3)
    assert driver.backend.writes == writes and probe.states_within(0.2) > 0  # read, published, not written

    assert probe.change("arm_driver", Transition.TRANSITION_CLEANUP)
    assert log[-1] == ("arm_driver", "close") and probe.state("arm_driver") == UNCONFIGURED
    time.sleep(0.1)
    assert probe.states_within(0.3) == 0

    assert not probe.change("arm_driver", Transition.TRANSITION_ACTIVATE)  # not from unconfigured
    driver.change_state("configure")  # in-process, as the runner does
    driver.change_state("activate")
    driver.change_state("shutdown")  # from active: stopped and closed
    assert log[-2:] == [("arm_driver", "stop"), ("arm_driver", "close")]
    assert driver.lifecycle_state == FINALIZED and _status(driver).lifecycle == FINALIZED
    with pytest.raises(LifecycleError, match="arm_driver: configure failed \\(now finalized\\)"):
        driver.change_state("configure")


def test_the_estop_latches_in_every_state_and_activation_does_not_release_it(arm):
    comp, probe, driver, log = arm
    probe.estop.publish(Bool(data=True))  # unconfigured: latched all the same
    assert wait_for(lambda: driver.safety.estopped, 5.0)
    driver.change_state("configure")
    driver.change_state("activate")
    assert ("arm_driver", "enable") not in log  # the servos stay off while latched
    assert _status(driver).estop and _status(driver).lifecycle == ACTIVE
    time.sleep(0.2)
    assert driver.backend.writes == 0
    assert probe.call(Trigger, "/arm_driver/reset").success  # active: the reset enables
    assert log[-1] == ("arm_driver", "enable") and not driver.safety.estopped
    assert wait_for(lambda: driver.backend.writes > 0, 5.0)

    assert probe.call(Trigger, "/arm_driver/estop").success  # active
    assert driver.safety.estopped and log[-1] == ("arm_driver", "stop")
    writes = driver.backend.writes
    time.sleep(0.2)
    assert driver.backend.writes == writes
    assert probe.call(Trigger, "/arm_driver/reset").success
    driver.change_state("deactivate")
    probe.estop.publish(Bool(data=True))  # inactive
    assert wait_for(lambda: driver.safety.estopped, 5.0)
    assert "e-stop latched" in driver.diagnostic_level()[1]
    assert not probe.call(Trigger, "/arm_driver/reset").success  # released only when active


def test_the_manager_brings_the_drivers_up_in_order_and_down_in_reverse(ros_domain_id, capsys):
    comp = Composition(["arm_driver", "hand_driver"], domain_id=ros_domain_id, lifecycle=UNCONFIGURED)
    log: list = []
    try:
        for name in ("arm_driver", "hand_driver"):
            _spy(comp.node(name), log)
        probe = Probe(comp)
        assert manage(ACTIVE, ["arm_driver", "hand_driver"], timeout=10.0, node=probe.node) == 0
        assert log == [("arm_driver", "connect"), ("hand_driver", "connect"),
                       ("arm_driver", "enable"), ("hand_driver", "enable")]
        assert "arm_driver, hand_driver active" in capsys.readouterr().out
        assert [probe.state(n) for n in ("arm_driver", "hand_driver")] == [ACTIVE, ACTIVE]
        del log[:]
        assert manage(UNCONFIGURED, ["arm_driver", "hand_driver"], timeout=10.0, node=probe.node) == 0
        assert [c for c in log if c[1] in ("disable", "close")] == [
            ("hand_driver", "disable"), ("arm_driver", "disable"), ("hand_driver", "close"), ("arm_driver", "close")]
        assert manage(ACTIVE, ["arm_driver", "hand_driver"], timeout=10.0, node=probe.node) == 0  # and up again
        assert all(comp.node(n).lifecycle_state == ACTIVE for n in ("arm_driver", "hand_driver"))
    finally:
        comp.shutdown()
    assert not comp.errors


def test_a_missing_device_is_named_the_driver_stays_unconfigured_and_the_others_are_put_back(ros_domain_id, capsys):
    marvin = {"arm_driver": {"backend": "marvin"}}  # no sdk_path: HardwareUnavailableError at configure
    with pytest.raises(HardwareUnavailableError, match="sdk_path"):  # the runner: refuses as before
        Composition(["hand_driver", "arm_driver"], domain_id=ros_domain_id, overrides=marvin)
    comp = Composition(["hand_driver", "arm_driver"], domain_id=ros_domain_id, overrides=marvin,
                       lifecycle=UNCONFIGURED)
    try:
        probe = Probe(comp)
        hands, arms = comp.node("hand_driver"), comp.node("arm_driver")
        assert manage(ACTIVE, ["hand_driver", "arm_driver"], timeout=10.0, node=probe.node) == REFUSED_EXIT_CODE
        err = capsys.readouterr().err
        assert "arm_driver: configure failed (now unconfigured): marvin: sdk_path" in err
        assert hands.lifecycle_state == UNCONFIGURED  # configured by the manager, then cleaned up again
        status = _status(arms)
        assert status.lifecycle == UNCONFIGURED and "configure failed: marvin: sdk_path" in status.lifecycle_error
        level, message = arms.diagnostic_level()
        assert level == DiagnosticStatus.ERROR and "sdk_path" in message  # in the console's node table
        assert probe.state("arm_driver") == UNCONFIGURED  # still up, for `ros2 lifecycle set` once fixed
    finally:
        comp.shutdown()
    assert not comp.errors


def test_rynn_teleop_lifecycle_and_run_across_processes(ros_domain_id, ros_env):
    out = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "run", "arm_driver", "-p",
                          "arm_driver.backend=marvin", "--duration", "5"],
                         env=ros_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == REFUSED_EXIT_CODE and "sdk_path" in out.stderr  # refuses, naming what is missing
    comp = Composition(["arm_driver"], domain_id=ros_domain_id, lifecycle=UNCONFIGURED)
    try:
        done = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", "lifecycle", "active", "arm_driver",
                               "--timeout", "20"], env=ros_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "configure arm_driver, activate arm_driver" in done.stdout
        assert comp.node("arm_driver").lifecycle_state == ACTIVE
    finally:
        comp.shutdown()
    assert not comp.errors
