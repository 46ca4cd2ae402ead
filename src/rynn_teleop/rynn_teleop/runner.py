"""Run several nodes in one process, each on its own executor thread.

For machines without launch_ros, for the demo and for integration tests.
Each node gets the parameters of ``config/<name>.yaml`` (validated against
its schema: unknown keys and bad values stop everything before any node
starts), then per-node overrides. Managed nodes (the drivers, ``nodes.lifecycle``)
are then brought to active, in the order named, as the launch file's
``lifecycle_manager`` does (``core.lifecycle.bring_to``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import rclpy
from rclpy.exceptions import InvalidHandle
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions
from rclpy.task import Future

from .core.lifecycle import ACTIVE, GOALS, bring_to
from .core.params import ParamSchema
from .core.scheduling import name_this_thread
from .nodes import node_class
from .nodes.lifecycle import ManagedNode
from .nodes.parameters import to_ros_parameters
from .nodes.process import (
    process_priority_class,
    use_process_priority,
    use_transport_profile,
)
from .paths import share_dir


def node_parameters(
    name: str, schema: ParamSchema, config_dir: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Validated parameter values of node ``name``: YAML file, then ``overrides``."""
    path = Path(config_dir) / f"{name}.yaml" if config_dir is not None else share_dir() / "config" / f"{name}.yaml"
    values = schema.load_yaml(path) if path.exists() else schema.defaults()
    if overrides:
        values = schema.validate({**values, **overrides})
    return values


class Composition:
    """Nodes sharing one rclpy context, each spun by its own executor thread.

    Why one ``SingleThreadedExecutor`` per node instead of one
    ``MultiThreadedExecutor``: the multi-threaded executor of the rclpy
    releases in use re-queues callbacks that are waiting in its thread pool
    (ros2/rclpy#1452), so a timer falls far below its rate; one executor
    thread per node delivers the full rate. Per-node threads also keep a slow
    node from delaying a fast one's timer.

    Use as a context manager; :meth:`spin` returns after ``duration`` or on
    Ctrl-C / shutdown, and leaving the block shuts everything down.

    ``lifecycle``: the state the managed nodes are brought to once every node is up, in the order of ``names``
    (every one configured before any is activated): ``active`` (default), ``inactive`` (connected, commanding
    nothing) or ``unconfigured`` (left to ``ros2 lifecycle set`` or ``lifecycle_manager``). A transition that
    fails shuts everything down and raises the node's own error (e.g. ``HardwareUnavailableError``).
    """

    def __init__(
        self,
        names: Iterable[str],
        *,
        config_dir: str | Path | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        domain_id: int | None = None,
        lifecycle: str = ACTIVE,
    ) -> None:
        if lifecycle not in GOALS:
            raise ValueError(f"unknown lifecycle state {lifecycle!r}; choose one of {', '.join(GOALS)}")
        names = list(names)
        overrides = overrides or {}
        unknown = set(overrides) - set(names)
        if unknown:
            raise ValueError(f"overrides for nodes that are not started: {sorted(unknown)}")
        classes = [node_class(n) for n in names]
        # validate every node's parameters before starting anything
        params = [node_parameters(n, c.SCHEMA, config_dir, overrides.get(n)) for n, c in zip(names, classes)]
        use_transport_profile()
        priority_class = process_priority_class(classes)
        self.context = rclpy.Context()
        # Ctrl-C / SIGTERM reach the main thread as KeyboardInterrupt (Python's handlers; see spin()), not
        # through rclpy's signal handler thread, with which a runner process can miss a SIGINT
        rclpy.init(context=self.context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
        self._shut_down = threading.Event()  # set at the context's shutdown: spin() waits on it, not polling
        self.context.on_shutdown(self._shut_down.set)
        self.nodes: list[Node] = []
        self._executors: list[SingleThreadedExecutor] = []
        self._threads: list[threading.Thread] = []
        self._stops: list[Future] = []  # done: that executor's thread stops spinning (see _stop_spinning)
        self._errors: list[BaseException] = []  # exceptions that escaped a node's executor callbacks
        self._past_loop_errors: list[BaseException] = []  # loop errors of nodes already destroyed
        self._closing = False  # set by shutdown(): an InvalidHandle from then on is part of shutting down
        try:
            for cls, values in zip(classes, params):
                self.add_node(cls(context=self.context, parameter_overrides=to_ros_parameters(cls.SCHEMA, values)))
            self.bring_to(lifecycle)
        except BaseException:
            self.shutdown()
            raise
        self.priority = use_process_priority(priority_class)  # the scheduling this process took, in words
        if classes:
            rclpy.logging.get_logger("rynn_teleop.runner").info(f"scheduling: {self.priority}")

    def bring_to(self, goal: str) -> None:
        """Bring the managed nodes to ``goal`` (unconfigured, inactive, active) in the order they were added;
        a failed transition undoes this call's and raises the node's error."""
        managed = [n.get_name() for n in self.nodes if isinstance(n, ManagedNode)]
        bring_to(goal, managed, _InProcess(self))

    def add_node(self, node: Node) -> None:
        """Spin ``node`` (created with :attr:`context`) on its own executor thread."""
        executor = SingleThreadedExecutor(context=self.context)
        executor.add_node(node)
        stop = Future()
        thread = threading.Thread(target=self._spin_executor, args=(executor, stop), name=f"spin:{node.get_name()}",
                                  daemon=True)
        self.nodes.append(node)
        self._executors.append(executor)
        self._threads.append(thread)
        self._stops.append(stop)
        thread.start()

    def _spin_executor(self, executor: SingleThreadedExecutor, stop: Future) -> None:
        name_this_thread(threading.current_thread().name)
        try:
            executor.spin_until_future_complete(stop)
        except ExternalShutdownException:
            pass
        except BaseException as exc:  # noqa: BLE001 - whatever a node callback raised: record it, stop this node
            if self.context.ok() and not (self._closing and isinstance(exc, InvalidHandle)):
                self._errors.append(exc)
                rclpy.logging.get_logger("rynn_teleop.runner").error(f"node callback raised: {exc!r}")

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions that escaped a node's executor callbacks or its control loops (those of removed nodes
        included)."""
        loop_errors = [e for n in self.nodes for e in getattr(n, "loop_exceptions", ())]
        return self._errors + self._past_loop_errors + loop_errors

    def node(self, name: str) -> Node:
        """The running node whose ROS name is ``name``."""
        for node in self.nodes:
            if node.get_name() == name:
                return node
        raise KeyError(name)

    def spin(self, duration: float | None = None) -> None:
        """Wait while the nodes run, for ``duration`` [s] (None: until Ctrl-C or shutdown)."""
        deadline = None if duration is None else time.monotonic() + duration
        try:
            while self.context.ok() and (deadline is None or time.monotonic() < deadline):
                # a signal (Ctrl-C) interrupts the wait; the slice bounds the wait should a shutdown go unseen
                self._shut_down.wait(1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic())))
        except KeyboardInterrupt:
            pass

    def remove_node(self, node: Node) -> None:
        """Stop spinning ``node`` and destroy it."""
        i = self.nodes.index(node)
        self._stop_spinning([i])
        node.destroy_node()
        self._past_loop_errors.extend(getattr(node, "loop_exceptions", ()))
        del self.nodes[i], self._executors[i], self._threads[i], self._stops[i]

    def _stop_spinning(self, indices: list[int]) -> None:
        """End the spin of executors ``indices``: their threads leave the spin loop (their stop future is done),
        then each executor is shut down. Shut down while its thread still spins, an rclpy 9 executor may
        hand a callback the guard condition it has just destroyed (AttributeError on None.trigger)."""
        for i in indices:
            if not self._stops[i].done():
                self._stops[i].set_result(None)  # its done callback wakes the executor
        for i in indices:
            self._threads[i].join(timeout=2.0)
        for i in indices:
            self._executors[i].shutdown(timeout_sec=2.0)

    def shutdown(self) -> None:
        """Stop every executor thread, destroy the nodes, shut the context down.

        A callback still running when its node is destroyed (an executor that
        did not stop within its timeout on a loaded machine) may raise
        ``InvalidHandle``; that is part of shutting down, not a node error.
        """
        self._closing = True
        self._stop_spinning(list(range(len(self._executors))))
        for node in self.nodes:
            node.destroy_node()
            self._past_loop_errors.extend(getattr(node, "loop_exceptions", ()))
        self.nodes, self._executors, self._threads, self._stops = [], [], [], []
        rclpy.try_shutdown(context=self.context)

    def __enter__(self) -> Composition:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


class _InProcess:
    """The managed nodes of a composition, transitioned in this process (``core.lifecycle.Transitioner``)."""

    def __init__(self, comp: Composition) -> None:
        self.comp = comp

    def state(self, node: str) -> str:
        return self.comp.node(node).lifecycle_state

    def change(self, node: str, transition: str) -> None:
        self.comp.node(node).change_state(transition)
