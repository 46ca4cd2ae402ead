"""arm_driver and hand_driver on real rclpy with the sim backend (the physical twin; here the robot alone, no twin
node in the process): rates, following, watchdog, e-stop."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.node import Node
from ros_helpers import wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool
from std_srvs.srv import Trigger

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.robot_model import arm_joint_names, hand_joint_names
from rynn_teleop.core.status import DriverStatus
from rynn_teleop.errors import HardwareUnavailableError
from rynn_teleop.runner import Composition

ARM = list(arm_joint_names("left") + arm_joint_names("right"))
HANDS = list(hand_joint_names("left") + hand_joint_names("right"))


class Probe:
    def __init__(self, comp: Composition) -> None:
        self.node = Node("probe", context=comp.context)
        self.lock = threading.Lock()
        self.states: list[tuple[float, JointState]] = []
        self.vendor: list[JointState] = []
        self.node.create_subscription(JointState, "/joint_states", self._on_state, 200)
        self.node.create_subscription(JointState, "/hand_left/joint_states", self.vendor.append, 50)
        self.arm_cmd = self.node.create_publisher(JointState, "/arms/command", 10)
        self.hand_cmd = self.node.create_publisher(JointState, "/hand_left/joint_commands", 10)
        self.estop = self.node.create_publisher(Bool, "/estop", 10)
        comp.add_node(self.node)

    def _on_state(self, msg: JointState) -> None:
        with self.lock:
            self.states.append((time.monotonic(), msg))

    def latest(self, names: list[str]) -> np.ndarray | None:
        with self.lock:
            for _, m in reversed(self.states):
                if list(m.name) == names:
                    return np.array(m.position)
        return None

    def rate(self, names: list[str], seconds: float) -> float:
        with self.lock:
            start = len(self.states)
        time.sleep(seconds)
        with self.lock:
            return sum(1 for _, m in self.states[start:] if list(m.name) == names) / seconds

    def call(self, name: str) -> Trigger.Response:
        client = self.node.create_client(Trigger, name)
        assert client.wait_for_service(timeout_sec=10.0)
        future = client.call_async(Trigger.Request())
        assert wait_for(future.done, 10.0)
        return future.result()


def test_arm_driver_follows_holds_on_silence_and_latches_the_estop(ros_domain_id):
    comp = Composition(["arm_driver"], overrides={"arm_driver": {"command_timeout_s": 0.1}}, domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        driver = comp.node("arm_driver")
        assert wait_for(lambda: probe.latest(ARM) is not None, 10.0)
        assert probe.rate(ARM, 1.0) > 0  # streaming (how close to 200 Hz is bench/stack.py's to say)
        home = np.array(DEFAULT_HOME)
        np.testing.assert_allclose(probe.latest(ARM), home, atol=1e-6)  # holding where it started
        goal = home + 0.2
        stop = threading.Event()

        def stream() -> None:
            while not stop.is_set():
                probe.arm_cmd.publish(JointState(name=ARM, position=goal.tolist()))
                time.sleep(0.01)

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        assert wait_for(lambda: np.abs(probe.latest(ARM) - goal).max() < 0.01, 10.0), "did not reach the command"
        assert driver.safety.mode in ("ramp", "track")
        stop.set()
        streamer.join()
        assert wait_for(lambda: driver.safety.mode == "watchdog", 2.0)
        time.sleep(0.3)  # the sim settles onto the held position
        held = probe.latest(ARM)
        time.sleep(0.3)
        np.testing.assert_allclose(probe.latest(ARM), held, atol=1e-4)  # holding, not drifting
        # e-stop: later commands are ignored until reset
        assert probe.call("/arm_driver/estop").success
        assert driver.safety.estopped and driver.diagnostic_level()[0] == DiagnosticStatus.ERROR
        before = probe.latest(ARM)
        for _ in range(30):
            probe.arm_cmd.publish(JointState(name=ARM, position=(home - 0.2).tolist()))
            time.sleep(0.01)
        np.testing.assert_allclose(probe.latest(ARM), before, atol=1e-3)
        assert probe.call("/arm_driver/reset").success
        assert not driver.safety.estopped
        stop.clear()
        goal = home - 0.2
        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        assert wait_for(lambda: driver.safety.mode == "ramp", 5.0)  # far away: ramped after the reset
        assert wait_for(lambda: np.abs(probe.latest(ARM) - goal).max() < 0.01, 15.0)
        stop.set()
        streamer.join()
    finally:
        comp.shutdown()
    assert not comp.errors


def test_hand_driver_rates_vendor_topics_and_the_shared_estop_topic(ros_domain_id):
    comp = Composition(["hand_driver", "arm_driver"], domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        hands, arms = comp.node("hand_driver"), comp.node("arm_driver")
        assert wait_for(lambda: probe.latest(HANDS) is not None and probe.vendor, 10.0)
        right_start = probe.latest(HANDS)[20:]  # where the backend holds it (the twin: the open hand)
        assert probe.rate(HANDS, 1.0) > 0  # streaming (the rate is bench/stack.py's)
        assert list(probe.vendor[-1].name) == list(hand_joint_names("left"))
        goal = np.full(20, 0.3)  # the vendor driver's topic shape: 20 positions, names optional
        assert wait_for(lambda: (probe.hand_cmd.publish(JointState(position=goal.tolist())),
                                 np.abs(probe.latest(HANDS)[:20] - goal).max() < 0.01)[1], 10.0)
        np.testing.assert_allclose(probe.latest(HANDS)[20:], right_start, atol=1e-6)  # the other hand held
        probe.estop.publish(Bool(data=True))  # one message stops every driver
        assert wait_for(lambda: hands.safety.estopped and arms.safety.estopped, 5.0)
    finally:
        comp.shutdown()
    assert not comp.errors


def test_marvin_backend_without_the_sdk_is_a_clear_error(ros_domain_id, tmp_path):
    with pytest.raises(HardwareUnavailableError, match="sdk_path"):
        Composition(["arm_driver"], overrides={"arm_driver": {"backend": "marvin"}}, domain_id=ros_domain_id)
    with pytest.raises(HardwareUnavailableError, match="fx_robot"):
        Composition(["arm_driver"], overrides={"arm_driver": {"backend": "marvin", "marvin.sdk_path": str(tmp_path)}},
                    domain_id=ros_domain_id)


def test_a_backend_failure_latches_the_estop_and_the_node_stays_reachable(ros_domain_id):
    comp = Composition(["arm_driver"], domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        driver = comp.node("arm_driver")
        assert wait_for(lambda: probe.latest(ARM) is not None, 10.0)
        stops = []
        real_read, real_stop = driver.backend.read, driver.backend.stop

        def failing_read(now):
            raise ConnectionError("cable pulled")

        driver.backend.stop = lambda: (stops.append(1), real_stop())
        driver.backend.read = failing_read
        assert wait_for(lambda: driver.safety.estopped, 5.0)
        assert stops  # the backend was told to stop
        assert "cable pulled" in driver.diagnostic_level()[1]
        # what the console reads: the typed status, decoded from the values the node publishes
        status = DriverStatus.decode({k: str(v) for k, v in driver.diagnostic_values().items()})
        assert status.estop and "cable pulled" in status.latched_by and status.backend == "sim"
        assert probe.call("/arm_driver/estop").success  # services still answer
        driver.backend.read = real_read  # the cable is back
        assert probe.call("/arm_driver/reset").success
        assert wait_for(lambda: driver.safety.mode == "waiting", 5.0)  # running again, waiting for commands
        assert driver.loop_errors > 0
        status = DriverStatus.decode({k: str(v) for k, v in driver.diagnostic_values().items()})
        assert not status.estop and status.latched_by == "" and status.faults == ()
    finally:
        comp.shutdown()
    assert not comp.errors


def test_a_partial_command_after_a_reset_does_not_replay_old_targets(ros_domain_id):
    comp = Composition(["hand_driver"], domain_id=ros_domain_id)
    try:
        probe = Probe(comp)
        hands = comp.node("hand_driver")
        assert wait_for(lambda: probe.latest(HANDS) is not None, 10.0)
        goal = np.clip(0.3, hands.limits.lower, hands.limits.upper)
        assert wait_for(lambda: (hands.accept_command(HANDS, [0.3] * 40, hands.now_s()),
                                 np.abs(probe.latest(HANDS) - goal).max() < 0.01)[1], 10.0)
        assert probe.call("/hand_driver/estop").success
        assert probe.call("/hand_driver/reset").success
        right_before = probe.latest(HANDS)[20:].copy()
        for _ in range(50):  # only the left hand is commanded after the reset
            hands.accept_command(HANDS[:20], [0.1] * 20, hands.now_s())
            time.sleep(0.01)
        assert wait_for(lambda: np.abs(probe.latest(HANDS)[:20] - np.clip(0.1, hands.limits.lower[:20],
                                                                           hands.limits.upper[:20])).max() < 0.01, 5.0)
        np.testing.assert_allclose(probe.latest(HANDS)[20:], right_before, atol=1e-3)  # right hand did not move
    finally:
        comp.shutdown()
    assert not comp.errors
