"""The rclpy behaviour and internals that polled subscriptions rely on, beyond creating a subscription.

Contract relied on (each item is detailed where it is used below):
- executors wait only on entities whose ``callback_group.can_execute(entity)`` is true (:class:`NeverExecuted`);
- ``Subscription.handle`` is a context manager that keeps the rcl subscription valid while entered, and its
  ``take_message(msg_type, raw)`` takes one message without blocking (:func:`take_waiting`);
- ``rclpy.impl.implementation_singleton.rclpy_implementation.WaitSet`` waits on chosen subscriptions and a
  guard condition and reports ready ones by handle ``pointer`` (:class:`SubscriptionWaitSet`).
Checked against the sources of rclpy 3.3 (Humble) and 7.1 (Jazzy) and the installed rclpy 9.1 (Kilted).
tests/test_polled_subscription.py::test_the_rclpy_contract_of_polled_subscriptions exercises exactly this.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from typing import Any, NamedTuple

from rclpy.callback_groups import CallbackGroup
from rclpy.context import Context
from rclpy.guard_condition import GuardCondition
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.subscription import Subscription


class NeverExecuted(CallbackGroup):
    """A callback group whose entities rclpy's executors never wait on, take from or call back.

    Contract: ``Executor`` (single- and multi-threaded) builds its wait set from the entities for which
    ``Executor.can_execute(entity)`` holds, which asks ``entity.callback_group.can_execute(entity)``, and checks
    the group again before it takes; a subscription's QoS event handlers are created in the subscription's group.
    The experimental ``EventsExecutor`` (C++, Kilted) is not covered.
    """

    def can_execute(self, entity: Any) -> bool:
        return False

    def beginning_execution(self, entity: Any) -> bool:
        return False

    def ending_execution(self, entity: Any) -> None:
        return None


class Received(NamedTuple):
    """One message taken straight from the middleware."""

    message: Any  # the message, or its CDR bytes for a raw subscription
    received_ns: int  # when the middleware received it, system clock [ns]; 0 when the RMW does not tell
    publisher: bytes  # the publisher's GID; b"" when rclpy does not tell (before Kilted)
    sequence: int | None  # the publisher's sequence number of this message; None when not told (Humble, some RMWs)


def take_waiting(sub: Subscription, limit: int) -> Iterator[Received]:
    """Take up to ``limit`` messages waiting in ``sub``, oldest first, one direct take each (no executor, no
    callback); ends when none waits. Holds ``sub``'s handle while the iterator runs.

    Contract: ``sub.handle.take_message(msg_type, raw)`` returns ``None`` when no message waits, else
    ``(message, info)``: the message (CDR ``bytes`` when ``raw``) and a dict with ``received_timestamp``
    (system clock [ns], 0 if unknown), from Jazzy on ``publication_sequence_number`` (int or None), from
    Kilted on ``publisher_gid`` (a dict whose ``data`` is the GID's bytes).
    """
    with sub.handle:
        take, msg_type, raw = sub.handle.take_message, sub.msg_type, sub.raw
        for _ in range(limit):
            taken = take(msg_type, raw)
            if taken is None:
                return
            msg, info = taken
            gid = info.get("publisher_gid")
            yield Received(msg, info.get("received_timestamp") or 0, bytes(gid["data"]) if gid else b"",
                           info.get("publication_sequence_number"))


class SubscriptionWaitSet:
    """A wait set of just ``subscriptions`` and a guard condition, for a thread that waits on them itself.

    Build it on any thread; enter it (``with``) on the thread that waits: entered, it holds the handles of the
    subscriptions, its guard condition and ``context`` valid. :meth:`wake`, from any thread, ends a :meth:`wait`.
    The guard condition belongs to no node, so no executor waits on it.

    Contract: ``_rclpy.WaitSet(n_subscriptions, n_guard_conditions, n_timers, n_clients, n_services, n_events,
    context_handle)`` with ``clear_entities()``, ``add_subscription(handle)``, ``add_guard_condition(handle)``,
    ``wait(timeout_ns)`` and ``get_ready_entities("subscription")``, which lists the ready handles' ``pointer``.
    """

    def __init__(self, subscriptions: Iterable[Subscription], context: Context) -> None:
        self.subscriptions = list(subscriptions)
        self._context = context
        self._guard = GuardCondition(None, None, context=context)
        self._held: ExitStack | None = None

    def __enter__(self) -> SubscriptionWaitSet:
        held = ExitStack()
        try:
            self._handles = [sub.handle for sub in self.subscriptions]
            self._guard_handle = self._guard.handle
            for handle in (*self._handles, self._guard_handle, self._context.handle):
                held.enter_context(handle)
            self._by_pointer = {h.pointer: sub for h, sub in zip(self._handles, self.subscriptions, strict=True)}
            self._wait_set = _rclpy.WaitSet(len(self._handles), 1, 0, 0, 0, 0, self._context.handle)
        except BaseException:
            held.close()
            raise
        self._held = held
        return self

    def __exit__(self, *exc: Any) -> None:
        held, self._held = self._held, None
        self._wait_set = None
        if held is not None:
            held.close()

    def wait(self, timeout_ns: int) -> list[Subscription]:
        """Block until a subscription has a message waiting, :meth:`wake` is called or ``timeout_ns`` [ns] pass;
        the subscriptions with messages waiting, in the order given (empty after a wake or a timeout).
        Only while entered."""
        wait_set = self._wait_set
        wait_set.clear_entities()
        for handle in self._handles:
            wait_set.add_subscription(handle)
        wait_set.add_guard_condition(self._guard_handle)
        wait_set.wait(timeout_ns)
        by_pointer = self._by_pointer
        return [by_pointer[p] for p in wait_set.get_ready_entities("subscription") if p in by_pointer]

    def wake(self) -> None:
        """End a running (or the next) :meth:`wait` at once. Raises ``rclpy`` errors once the context is shut
        down."""
        self._guard.trigger()
