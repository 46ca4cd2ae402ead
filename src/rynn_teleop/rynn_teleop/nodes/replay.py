"""The replay client: an rclpy node that sends an episode's commands to running drivers (``recording.replay``).

It publishes on the drivers' command topics (``/arms/command``, ``/hands/command``), as arm_ik and hand_retarget
do, so every command goes through the drivers' safety layer (limits, ramp, watchdog, e-stop). It listens to
``/joint_states`` (where the joints are, for the approach), ``/estop`` and the drivers' status in
``/diagnostics`` (a latched e-stop ends the replay at once: nothing more is sent), and the twin's
``/twin/outcome`` (the task's judgement, when a twin runs). :meth:`ReplayClient.run` blocks: call it from a
thread other than the one spinning the node; a set ``stop`` event (Ctrl-C) ends it between two commands.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, String

from ..core.session import DRIVERS
from ..core.status import DriverStatus, StatusError
from ..errors import RynnTeleopError
from ..recording.replay import (
    ARM_COMMAND_TOPIC,
    HAND_COMMAND_TOPIC,
    Command,
    CommandTrack,
    ReplayOptions,
    approach,
)

OUTCOME_TOPIC = "/twin/outcome"
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
COMMAND_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)


class CommandConflictError(RynnTeleopError):
    """Another node publishes the drivers' commands: a replay would fight it.

    Attributes:
        publishers: topic -> the other publishing nodes.
    """

    def __init__(self, publishers: dict[str, list[str]]) -> None:
        self.publishers = publishers
        shown = "; ".join(f"{topic}: {', '.join(nodes)}" for topic, nodes in publishers.items())
        super().__init__(f"replay refused: other nodes command the drivers ({shown}); stop them (a replay runs with "
                         "the drivers alone: rynn-teleop run [twin] arm_driver hand_driver)")


class ReplayResult(NamedTuple):
    """How a replay went."""

    completed: bool  # every command was sent and the settle time passed
    stopped_by: str  # why it ended early ('' when completed): an e-stop, Ctrl-C
    commands_sent: int  # of the episode's commands
    arrived: bool  # the joints reached the first command after the approach (else it started anyway)
    outcome: dict[str, Any] | None  # the twin's /twin/outcome after the settle time (None: no twin reported)
    seconds: float  # [s] wall time of the replay, approach included


class ReplayClient(Node):
    """See the module doc. ``node_kwargs`` go to ``rclpy.node.Node`` (``context`` ...)."""

    def __init__(self, name: str = "episode_replay", **node_kwargs: Any) -> None:
        super().__init__(name, **node_kwargs)
        self._lock = threading.Lock()
        self.measured: dict[str, float] = {}  # joint -> newest measured position [rad]
        self.estop_reason = ""  # why the replay must stop ('' none)
        self.outcome: dict[str, Any] | None = None  # the newest /twin/outcome
        self.outcomes = 0  # /twin/outcome messages received
        self._pubs = {topic: self.create_publisher(JointState, topic, COMMAND_QOS)
                      for topic in (ARM_COMMAND_TOPIC, HAND_COMMAND_TOPIC)}
        self.create_subscription(JointState, "/joint_states", self._on_joint_states, 100)
        self.create_subscription(Bool, "/estop", self._on_estop, 10)
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 50)
        self.create_subscription(String, OUTCOME_TOPIC, self._on_outcome, LATCHED)

    # ------------------------------------------------------------------ inputs
    def _on_joint_states(self, msg: JointState) -> None:
        with self._lock:
            self.measured.update(zip(msg.name, msg.position))

    def _on_estop(self, msg: Bool) -> None:
        if msg.data:
            self.estop_reason = self.estop_reason or "e-stop (/estop)"

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name in DRIVERS:
                try:
                    driver = DriverStatus.decode({kv.key: kv.value for kv in status.values})
                except StatusError:
                    continue
                if driver.estop:
                    self.estop_reason = self.estop_reason or f"e-stop latched in {status.name}" + (
                        f" ({driver.latched_by})" if driver.latched_by else "")

    def _on_outcome(self, msg: String) -> None:
        try:
            doc = json.loads(msg.data)
        except ValueError:
            return
        if isinstance(doc, dict):
            with self._lock:
                self.outcome = doc
                self.outcomes += 1

    # ------------------------------------------------------------------ checks
    def other_commanders(self) -> dict[str, list[str]]:
        """Command topic -> the other nodes publishing on it."""
        out = {}
        for topic in self._pubs:
            others = sorted({i.node_name for i in self.get_publishers_info_by_topic(topic)
                             if i.node_name != self.get_name()})
            if others:
                out[topic] = others
        return out

    def wait_for_joints(self, names: Sequence[str], timeout: float) -> dict[str, float]:
        """The measured positions of ``names`` once every one was received (at most ``timeout`` [s]).

        Raises:
            RynnTeleopError: some never arrived (their drivers are not running).
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                missing = [n for n in names if n not in self.measured]
                if not missing:
                    return {n: self.measured[n] for n in names}
            if time.monotonic() > deadline:
                raise RynnTeleopError(f"replay: no /joint_states of {', '.join(missing[:4])}"
                                      + (" ..." if len(missing) > 4 else "") + f" within {timeout:g} s: start the "
                                      "drivers (rynn-teleop run [twin] arm_driver hand_driver), or give --twin")
            time.sleep(0.05)

    # ------------------------------------------------------------------ the replay
    def _publish(self, topic: str, names: Sequence[str], position: Sequence[float]) -> None:
        msg = JointState(name=list(names), position=[float(v) for v in position])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._pubs[topic].publish(msg)

    def _stopped(self, stop: threading.Event) -> str:
        if self.estop_reason:
            return self.estop_reason
        return "interrupted" if stop.is_set() else ""

    def run(self, track: CommandTrack, options: ReplayOptions, stop: threading.Event,
            log=lambda line: None) -> ReplayResult:
        """Approach, send, settle (``recording.replay``); ends early on an e-stop or a set ``stop``."""
        started = time.monotonic()
        period = 1.0 / options.publish_hz
        streams = {(c.topic, c.names): c for c in reversed(track.commands)}  # each stream's first command
        goal = track.first_pose()
        plan = approach(self.wait_for_joints(list(goal), 10.0), goal, options)
        index = {n: i for i, n in enumerate(plan.names)}
        log(f"approach: {plan.duration:.1f} s to the first command")

        def send_pose(values) -> None:
            for topic, names in streams:
                self._publish(topic, names, [values[index[n]] for n in names])

        def result(completed: bool, why: str, sent: int, arrived: bool) -> ReplayResult:
            with self._lock:
                outcome = dict(self.outcome) if self.outcome is not None else None
            return ReplayResult(completed, why, sent, arrived, outcome, time.monotonic() - started)

        t0 = time.monotonic()
        while (t := time.monotonic() - t0) < plan.duration + options.arrive_timeout_s:
            if why := self._stopped(stop):
                return result(False, why, 0, False)
            send_pose(plan.sample(t))
            if t >= plan.duration and self._arrived(goal, options.arrive_tolerance):
                break
            time.sleep(period)
        arrived = self._arrived(goal, options.arrive_tolerance)
        if not arrived:
            log(f"the joints did not reach the first command within {options.arrive_tolerance:g} rad after "
                f"{options.arrive_timeout_s:g} s: replaying anyway")
        log(f"replaying {len(track.commands)} commands ({track.duration / options.speed:.1f} s)")
        t0 = time.monotonic()
        sent = 0
        for command in track.commands:
            if why := self._stopped(stop):
                return result(False, why, sent, arrived)
            wait = t0 + command.time / options.speed - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._publish(command.topic, command.names, command.position)
            sent += 1
        last: list[Command] = track.last_commands()
        end = time.monotonic() + options.settle_s
        while time.monotonic() < end:  # hold the last commands while the scene comes to rest
            if why := self._stopped(stop):
                return result(False, why, sent, arrived)
            for c in last:
                self._publish(c.topic, c.names, c.position)
            time.sleep(period)
        if self.outcomes:  # the newest judgement after the settle time (the twin publishes it when it changes)
            time.sleep(0.2)
        return result(True, "", sent, arrived)

    def _arrived(self, goal: dict[str, float], tolerance: float) -> bool:
        with self._lock:
            return all(abs(self.measured.get(n, float("inf")) - v) <= tolerance for n, v in goal.items())
