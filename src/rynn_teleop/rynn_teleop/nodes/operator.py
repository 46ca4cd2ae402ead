"""What an operator does to a running stack, as rclpy clients: one table for the console and the CLI.

:data:`ACTIONS` names every operator action and the services (and topic) it uses; :class:`OperatorClient`
performs them from any rclpy node and keeps a :class:`~..core.session.SessionState` from ``/diagnostics``
and the latched active camera source. ``rynn-teleop call ...`` (:func:`call_main`) is the command line of
the same client, for scripts and the venv path (no ros2cli needed).

Episode actions return the episode's directory in a typed field (:attr:`Result.episode`), read from the
recorder's latched ``/recorder/episode`` topic (std_msgs/String), never from a service's message text:
``rynn-teleop call episode start`` and ``episode stop`` print it as their last line.

Exit codes of ``rynn-teleop call``: 0 done, 1 refused by the node (its message is printed), 2 bad
arguments, 3 a service is not available (the message names the node to start).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.srv import SetParameters
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Bool, String
from std_srvs.srv import SetBool, Trigger

from ..core.session import DRIVERS, SessionState
from ..recording import OUTCOMES
from .process import use_transport_profile

ESTOP_TOPIC = "/estop"
ACTIVE_SOURCE_TOPIC = "/head_camera/active_source"
DIAGNOSTICS_TOPIC = "/diagnostics"
EPISODE_TOPIC = "/recorder/episode"  # the recorder's latched ~/episode (nodes.recorder, not imported: it is heavy)
SERVICE_TIMEOUT_S = 5.0  # [s] to find a service (DDS discovery of a new process), then again to get its answer
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


class Step(NamedTuple):
    """One service call of an action."""

    service: str  # absolute service name
    srv_type: Any  # std_srvs Trigger or SetBool
    data: bool | None = None  # SetBool's request data
    node: str = ""  # the node serving it, named in errors


@dataclass(frozen=True)
class Action:
    """An operator action: its service calls, in order.

    ``any_of``: the action succeeds when at least one step does (e-stop and reset reach every driver
    running; a stack without hand driver still e-stops its arms); otherwise every step must succeed.
    """

    steps: tuple[Step, ...]
    help: str
    any_of: bool = False


ACTIONS: dict[str, Action] = {
    "calibrate": Action((Step("/arm_ik/calibrate", Trigger, node="arm_ik"),),
                        "capture the operator calibration (operator in the robot's home posture)"),
    "engage": Action((Step("/arm_ik/set_clutch", SetBool, True, "arm_ik"),), "engage the clutch: the arms follow"),
    "disengage": Action((Step("/arm_ik/set_clutch", SetBool, False, "arm_ik"),), "disengage: the arms brake to a stop"),
    "estop": Action(tuple(Step(f"/{d}/estop", Trigger, node=d) for d in DRIVERS),
                    f"e-stop every driver (also published on {ESTOP_TOPIC})", any_of=True),
    "reset": Action(tuple(Step(f"/{d}/reset", Trigger, node=d) for d in DRIVERS), "release the e-stop", any_of=True),
    "feed physical": Action((Step("/camera_switch/use_physical", Trigger, node="camera_switch"),),
                            "show the physical camera"),
    "feed generated": Action((Step("/camera_switch/use_generated", Trigger, node="camera_switch"),),
                             "show the generated (world model) feed"),
    "feed toggle": Action((Step("/camera_switch/toggle", Trigger, node="camera_switch"),), "toggle the feed"),
    "episode start": Action((Step("/recorder/start_episode", Trigger, node="recorder"),),
                            "start recording an episode"),
    "episode stop": Action((Step("/recorder/stop_episode", Trigger, node="recorder"),),
                           "stop and keep the episode"),
    "episode discard": Action((Step("/recorder/discard_episode", Trigger, node="recorder"),),
                              "stop and delete the episode"),
    "twin reset": Action((Step("/twin/reset", Trigger, node="twin"),),
                         "the physical twin (digital mode): the next layout of its scene, the robot back at home "
                         "(the synthetic operator with synthetic.task twin then does the task again)"),
    "policy start": Action((Step("/policy/start", Trigger, node="policy"),),
                           "the policy node (run --policy): start acting (refused while e-stopped or without a fresh "
                           "observation); with a recorder, an episode starts"),
    "policy stop": Action((Step("/policy/stop", Trigger, node="policy"),),
                          "the policy node: stop acting (the arms brake to a stop, the hands hold); its episode ends"),
}
#: recorder parameters an action may set first (``episode start``: task, operator; ``episode stop``: outcome, notes)
RECORDER_FIELDS = {"episode start": ("task", "operator"), "episode stop": ("outcome", "notes")}
#: actions whose result names an episode directory (the one started, the one kept)
EPISODE_ACTIONS = ("episode start", "episode stop")


class Result(NamedTuple):
    """What an action did."""

    ok: bool
    message: str  # for people (the nodes' answers)
    unavailable: bool = False  # a service (node) was missing
    episode: str = ""  # episode actions: the directory started or kept (from /recorder/episode; '' if none)


class LatchedValue:
    """The newest message of a latched topic and how many have arrived (thread-safe): a client waits for the
    message its own call caused (:meth:`wait_after`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.value: str | None = None  # None until the first message
        self.count = 0  # messages received

    def put(self, value: str) -> None:
        with self._cond:
            self.value, self.count = value, self.count + 1
            self._cond.notify_all()

    def wait_after(self, count: int, timeout: float) -> tuple[int, str] | None:
        """(count, value) once more than ``count`` messages have arrived; None after ``timeout`` [s]."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.count > count, timeout):
                return None
            return self.count, self.value


class OperatorClient:
    """Operator actions and session state through ``node`` (which something else spins).

    The blocking :meth:`perform` waits for service answers: call it from a thread other than the one
    spinning ``node``. The state (:attr:`state`, guarded by :attr:`lock`) is fed by ``node``'s executor.
    """

    def __init__(self, node: Node, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.clock = clock
        self.lock = threading.Lock()
        self.state = SessionState()
        self._clients = {}
        for action in ACTIONS.values():
            for step in action.steps:
                if step.service not in self._clients:
                    self._clients[step.service] = node.create_client(step.srv_type, step.service)
        self._params_client = node.create_client(SetParameters, "/recorder/set_parameters")
        self._estop_pub = node.create_publisher(Bool, ESTOP_TOPIC, COMMAND_QOS)
        self.episode = LatchedValue()  # /recorder/episode: the newest episode's directory
        node.create_subscription(DiagnosticArray, DIAGNOSTICS_TOPIC, self._on_diagnostics, 50)
        node.create_subscription(String, ACTIVE_SOURCE_TOPIC, self._on_active_source, LATCHED)
        node.create_subscription(String, EPISODE_TOPIC, lambda msg: self.episode.put(msg.data), LATCHED)

    # ------------------------------------------------------------------ state
    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        now = self.clock()
        with self.lock:
            for st in msg.status:
                self.state.on_diagnostics(st.name, _level(st.level), st.message,
                                          {kv.key: kv.value for kv in st.values}, now)

    def _on_active_source(self, msg: String) -> None:
        with self.lock:
            self.state.on_active_source(msg.data)

    def snapshot(self) -> dict[str, Any]:
        """The session state as plain data (see ``SessionState.snapshot``)."""
        with self.lock:
            return self.state.snapshot(self.clock())

    def summary(self) -> str:
        with self.lock:
            return self.state.summary(self.clock())

    def wait_for_state(self, nodes: Sequence[str], timeout: float) -> None:
        """Block until every node of ``nodes`` reported (or ``timeout`` [s])."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(self.state.alive(n, self.clock()) for n in nodes):
                    return
            time.sleep(0.05)

    # ------------------------------------------------------------------ actions
    def wait_for_action(self, name: str, timeout: float) -> bool:
        """Wait (at most ``timeout`` [s] per service) until every service of action ``name`` is available."""
        return all(self._wait_for(self._clients[step.service], timeout) for step in ACTIONS[name].steps)

    def perform(self, name: str, fields: Mapping[str, str] | None = None,
                timeout: float = SERVICE_TIMEOUT_S) -> Result:
        """Do action ``name`` (a key of :data:`ACTIONS`); ``fields``: recorder parameters to set first
        (:data:`RECORDER_FIELDS`). Blocks at most about ``timeout`` [s] per service."""
        action = ACTIONS.get(name)
        if action is None:
            return Result(False, f"unknown action {name!r}; actions: {', '.join(ACTIONS)}")
        fields = {k: v for k, v in (fields or {}).items() if v is not None}
        allowed = RECORDER_FIELDS.get(name, ())
        if unknown := sorted(set(fields) - set(allowed)):
            return Result(False, f"{name} does not take {', '.join(unknown)}"
                          + (f"; it takes {', '.join(allowed)}" if allowed else ""))
        if "outcome" in fields and fields["outcome"] not in OUTCOMES:
            return Result(False, f"outcome must be one of {', '.join(repr(o) for o in OUTCOMES)}")
        if name == "estop":  # at once, to every driver listening; the services below confirm it per driver
            self._estop_pub.publish(Bool(data=True))
        if fields:
            result = self._set_recorder_fields(fields, timeout)
            if not result.ok:
                return result
        if name in EPISODE_ACTIONS:
            return self._episode_action(action.steps, timeout)
        results = [self._call(step, timeout) for step in action.steps]
        if name == "estop":  # the topic may have latched them first: say what holds, not what each service saw
            results = [r._replace(message=f"{s.node}: e-stop latched") if r.ok else r
                       for s, r in zip(action.steps, results)]
        ok = any(r.ok for r in results) if action.any_of else all(r.ok for r in results)
        if action.any_of:  # a missing driver is not a failure when another answered
            shown = [r for r in results if r.ok or not r.unavailable] if ok else results
        else:
            shown = results
        return Result(ok, "; ".join(r.message for r in shown),
                      unavailable=not ok and all(r.unavailable for r in results))

    def _episode_action(self, steps: tuple[Step, ...], timeout: float) -> Result:
        """An episode start or stop, and the directory the recorder then announced on its latched topic.

        The recorder publishes a directory at its start and at each episode start and stop; the client first
        waits for the latched one (so the next message is the call's), calls, then waits for the next one.
        """
        (step,) = steps
        if not self._wait_for(self._clients[step.service], timeout):
            return self._call(step, timeout)  # says what is missing
        seen = self.episode.wait_after(0, timeout)
        if seen is None:
            return Result(False, f"{EPISODE_TOPIC}: no message within {timeout:g} s: a recorder that does not "
                          f"announce its episodes (another version?)")
        result = self._call(step, timeout)
        if not result.ok:
            return result
        announced = self.episode.wait_after(seen[0], timeout)
        if announced is None or not announced[1]:
            return result._replace(message=f"{result.message}; but no episode directory on {EPISODE_TOPIC} "
                                   f"within {timeout:g} s")
        return result._replace(episode=announced[1])

    def _wait_for(self, client: Any, timeout: float) -> bool:
        return client.service_is_ready() or client.wait_for_service(timeout_sec=timeout)

    def _call(self, step: Step, timeout: float) -> Result:
        client = self._clients[step.service]
        if not self._wait_for(client, timeout):
            how = ("rynn-teleop run --mode digital --policy PATH, or ros2 launch rynn_teleop bringup.launch.py "
                   "policy:=PATH" if step.node == "policy" else
                   "rynn-teleop run --mode digital, or ros2 launch rynn_teleop bringup.launch.py")
            return Result(False, f"{step.service} is not available: start the {step.node} node ({how})",
                          unavailable=True)
        request = step.srv_type.Request()
        if step.data is not None:
            request.data = step.data
        response = self._wait_future(client.call_async(request), timeout)
        if response is None:
            return Result(False, f"{step.service}: no answer within {timeout:g} s")
        return Result(bool(response.success), f"{step.node}: {response.message}" if response.message else step.node)

    def _set_recorder_fields(self, fields: Mapping[str, str], timeout: float) -> Result:
        if not self._wait_for(self._params_client, timeout):
            return Result(False, "/recorder/set_parameters is not available: start the recorder node "
                          "(rynn-teleop run --mode digital --record)", unavailable=True)
        request = SetParameters.Request(
            parameters=[Parameter(k, Parameter.Type.STRING, str(v)).to_parameter_msg() for k, v in fields.items()])
        response = self._wait_future(self._params_client.call_async(request), timeout)
        if response is None:
            return Result(False, f"/recorder/set_parameters: no answer within {timeout:g} s")
        refused = [f"{k}: {r.reason}" for k, r in zip(fields, response.results) if not r.successful]
        return Result(not refused, "; ".join(refused) or "recorder parameters set")

    @staticmethod
    def _wait_future(future: Any, timeout: float) -> Any:
        done = threading.Event()
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(timeout):
            future.cancel()
            return None
        return future.result()


def _level(level: Any) -> int:
    """DiagnosticStatus.level (a byte in rclpy) as an int."""
    return level[0] if isinstance(level, (bytes, bytearray)) else int(level)


# ---------------------------------------------------------------------- rynn-teleop call
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rynn-teleop call", description=(
        "Operate a running stack (the same services as the console). 'episode start' and 'episode stop' print "
        "the episode directory as their last line. Exit codes: 0 done, 1 refused by the node, "
        "2 bad arguments, 3 a service is not available."))
    p.add_argument("--timeout", type=float, default=SERVICE_TIMEOUT_S, help="seconds to wait for each service")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("calibrate", "engage", "disengage", "estop", "reset"):
        sub.add_parser(name, help=ACTIONS[name].help)
    feed = sub.add_parser("feed", help="choose the camera feed")
    feed.add_argument("source", choices=("physical", "generated", "toggle"))
    ep = sub.add_parser("episode", help="start, stop or discard an episode")
    ep_sub = ep.add_subparsers(dest="episode_command", required=True)
    start = ep_sub.add_parser("start", help=ACTIONS["episode start"].help)
    start.add_argument("--task", help="task text stored with the episode")
    start.add_argument("--operator", help="operator name stored with the episode")
    stop = ep_sub.add_parser("stop", help=ACTIONS["episode stop"].help)
    stop.add_argument("--outcome", choices=[o for o in OUTCOMES if o], help="outcome label stored with the episode")
    stop.add_argument("--notes", help="notes stored with the episode")
    ep_sub.add_parser("discard", help=ACTIONS["episode discard"].help)
    twin = sub.add_parser("twin", help="the physical twin (digital mode)")
    twin.add_subparsers(dest="twin_command", required=True).add_parser("reset", help=ACTIONS["twin reset"].help)
    policy = sub.add_parser("policy", help="the policy node (a learned policy acting instead of the operator)")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    for name in ("start", "stop"):
        policy_sub.add_parser(name, help=ACTIONS[f"policy {name}"].help)
    sub.add_parser("status", help="calibrated/engaged per arm, e-stop, active feed, episode, twin, policy")
    return p


def _action_of(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    if args.command == "feed":
        return f"feed {args.source}", {}
    if args.command == "twin":
        return f"twin {args.twin_command}", {}
    if args.command == "policy":
        return f"policy {args.policy_command}", {}
    if args.command == "episode":
        name = f"episode {args.episode_command}"
        return name, {k: getattr(args, k) for k in RECORDER_FIELDS.get(name, ()) if getattr(args, k, None) is not None}
    return args.command, {}


def call_main(argv: Sequence[str] | None = None) -> int:
    """``rynn-teleop call ...``; returns the exit code."""
    args = build_parser().parse_args(argv)
    import rclpy  # after argument errors, which need no ROS
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    use_transport_profile()
    context = rclpy.Context()
    rclpy.init(context=context, signal_handler_options=SignalHandlerOptions.NO)
    node = Node(f"rynn_teleop_call_{os.getpid()}", context=context, start_parameter_services=False)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    def spin() -> None:
        try:
            executor.spin()
        except ExternalShutdownException:  # the context shut down below: done
            pass
        except Exception:  # a wait set made as the context shut down (rclpy's RCLError): done too
            if context.ok():
                raise

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        client = OperatorClient(node)
        if args.command == "status":
            client.wait_for_state(("arm_ik", *DRIVERS, "camera_switch", "recorder"), timeout=max(args.timeout, 1.5))
            print(client.summary())
            return 0
        name, fields = _action_of(args)
        result = client.perform(name, fields, timeout=args.timeout)
        print(result.message, file=sys.stdout if result.ok else sys.stderr)
        if result.episode:
            print(result.episode)  # the last line: the episode directory, for scripts
        return 0 if result.ok else (3 if result.unavailable else 1)
    finally:
        rclpy.try_shutdown(context=context)  # wakes the executor's wait: spin() returns
        spinner.join(timeout=2.0)
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
