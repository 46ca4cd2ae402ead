"""lifecycle_manager: bring managed nodes to a lifecycle state in order over their services, then exit.

What the launch file starts beside the drivers, and what ``rynn-teleop lifecycle`` runs: like ros2_control's
spawner (and the start-up of nav2's lifecycle manager) it waits for each node's lifecycle services, brings the
nodes to ``goal`` in the order of ``node_names`` (every one configured before any is activated:
``core.lifecycle.bring_to``) and exits 0. When a transition fails it puts back what it did, prints the node's
reason (its ``lifecycle_error`` in ``/diagnostics``, e.g. the HardwareUnavailableError of a configure that found
no device) and exits with :data:`~..errors.REFUSED_EXIT_CODE`; the nodes stay up where they were, for
``ros2 lifecycle set`` once the cause is fixed. ``rynn-teleop run`` does the same in-process.

Parameters (``--ros-args -p``): ``node_names`` (default: arm_driver, hand_driver), ``goal`` (active, inactive,
unconfigured) and ``timeout_s`` (how long to wait for each node's services, then for each answer).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from ..core.lifecycle import ACTIVE, GOALS, LifecycleError, bring_to
from ..core.params import STR_LIST, Param, ParamSchema
from ..core.session import DRIVERS
from ..errors import REFUSED_EXIT_CODE, RynnTeleopError
from .parameters import declare_schema
from .process import use_transport_profile

NAME = "lifecycle_manager"
SCHEMA = ParamSchema(NAME, [
    Param("node_names", STR_LIST, list(DRIVERS), "the managed nodes, in bring-up order"),
    Param("goal", str, ACTIVE, "the state they are brought to", choices=GOALS),
    Param("timeout_s", float, 30.0, "wait for each node's lifecycle services this long, then for each answer", "s",
          min=0.1, max=600.0),
])
#: transition label -> lifecycle_msgs/Transition id
TRANSITION_IDS = {"configure": Transition.TRANSITION_CONFIGURE, "activate": Transition.TRANSITION_ACTIVATE,
                  "deactivate": Transition.TRANSITION_DEACTIVATE, "cleanup": Transition.TRANSITION_CLEANUP}
REASON_WAIT_S = 1.0  # [s] after a failed transition, how long to wait for the node's diagnostics saying why


class LifecycleClient:
    """Managed nodes over their lifecycle services (``core.lifecycle.Transitioner``), through ``node``, which
    something else spins; blocking calls: use from another thread.

    A failed transition raises :class:`~..core.lifecycle.LifecycleError` whose reason is the node's own, read
    from its ``/diagnostics`` (``lifecycle_error``), or the node's diagnostics message.
    """

    def __init__(self, node: Node, timeout: float = 10.0) -> None:
        self.node = node
        self.timeout = timeout
        self._clients: dict[tuple[str, Any], Any] = {}
        self._cond = threading.Condition()
        self._diagnostics: dict[str, tuple[int, str, dict[str, str]]] = {}  # node -> (count, message, values)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 50)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        with self._cond:
            for st in msg.status:
                count = self._diagnostics.get(st.name, (0, "", {}))[0]
                self._diagnostics[st.name] = (count + 1, st.message, {kv.key: kv.value for kv in st.values})
            self._cond.notify_all()

    def _client(self, name: str, srv_type: Any, service: str) -> Any:
        key = (name, srv_type)
        if key not in self._clients:
            self._clients[key] = self.node.create_client(srv_type, f"/{name}/{service}")
        client = self._clients[key]
        if not (client.service_is_ready() or client.wait_for_service(timeout_sec=self.timeout)):
            raise LifecycleError(name, "", "", f"no /{name}/{service} service within {self.timeout:g} s: is the "
                                 "node running, and is it a managed node?")
        return client

    def _call(self, name: str, client: Any, request: Any, what: str) -> Any:
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(self.timeout):
            future.cancel()
            raise LifecycleError(name, what, "", f"no answer within {self.timeout:g} s")
        return future.result()

    def state(self, node: str) -> str:
        client = self._client(node, GetState, "get_state")
        return self._call(node, client, GetState.Request(), "").current_state.label

    def change(self, node: str, transition: str) -> None:
        client = self._client(node, ChangeState, "change_state")
        with self._cond:
            seen = self._diagnostics.get(node, (0, "", {}))[0]
        request = ChangeState.Request(transition=Transition(id=TRANSITION_IDS[transition]))
        if self._call(node, client, request, transition).success:
            return
        reason = self._reason(node, seen).removeprefix(f"{transition} failed: ")
        raise LifecycleError(node, transition, self.state(node), reason)

    def _reason(self, node: str, seen: int) -> str:
        """What the node's diagnostics published after message number ``seen`` say about the failure."""
        with self._cond:
            self._cond.wait_for(lambda: self._diagnostics.get(node, (0, "", {}))[0] > seen, REASON_WAIT_S)
            count, message, values = self._diagnostics.get(node, (0, "", {}))
        if count <= seen:
            return "the node did not say why (see its log)"
        return values.get("lifecycle_error") or message or "the node did not say why (see its log)"


def manage(goal: str, names: Sequence[str], *, timeout: float = 30.0, node: Node | None = None) -> int:
    """Bring ``names`` to ``goal`` through their services; print what happened; the exit code (0, or
    REFUSED_EXIT_CODE when a node failed, naming why). ``node``: use this (spun elsewhere) instead of
    starting rclpy."""
    if node is not None:
        return _manage(LifecycleClient(node, timeout), goal, names)
    use_transport_profile()
    context = rclpy.Context()
    rclpy.init(context=context, signal_handler_options=SignalHandlerOptions.NO)
    own = Node(NAME, context=context, start_parameter_services=False)
    try:
        return _spinning(own, lambda: _manage(LifecycleClient(own, timeout), goal, names))
    finally:
        rclpy.try_shutdown(context=context)


def _manage(client: LifecycleClient, goal: str, names: Sequence[str]) -> int:
    try:
        steps = bring_to(goal, list(names), client)
    except RynnTeleopError as exc:
        print(f"[{NAME}] {exc}", file=sys.stderr)
        return REFUSED_EXIT_CODE
    done = ", ".join(f"{s.transition} {s.node}" for s in steps) or "nothing to do"
    print(f"[{NAME}] {', '.join(names)} {goal} ({done})")
    return 0


def _spinning(node: Node, work) -> int:
    """``work()`` while ``node`` spins on another thread."""
    executor = SingleThreadedExecutor(context=node.context)
    executor.add_node(node)

    def spin() -> None:
        try:
            executor.spin()
        except ExternalShutdownException:
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        return work()
    finally:
        executor.shutdown(timeout_sec=1.0)
        spinner.join(timeout=2.0)
        node.destroy_node()


def main(args: list[str] | None = None) -> int:
    """Console script ``lifecycle_manager`` (the launch file's): parameters from ``--ros-args``."""
    use_transport_profile()
    context = rclpy.Context()
    rclpy.init(args=args if args is not None else sys.argv, context=context)
    try:
        node = Node(NAME, context=context)
        try:
            params = declare_schema(node, SCHEMA)
        except RynnTeleopError as exc:
            print(f"[{NAME}] refusing to start: {exc}", file=sys.stderr)
            node.destroy_node()
            return REFUSED_EXIT_CODE
        return _spinning(node, lambda: _manage(LifecycleClient(node, params["timeout_s"]), params["goal"],
                                               params["node_names"]))
    except KeyboardInterrupt:
        return 0
    finally:
        rclpy.try_shutdown(context=context)
