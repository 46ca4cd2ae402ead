"""Fixed-rate deadlines for wall-clock control loops, and the scheduling priority of a node's process
(ROS-free; the caller supplies the clock and the system calls).

Tick ``k`` of a loop is due at ``start + k * period``. A tick that runs late
does not shift the ticks after it (the loop keeps its phase and its average
rate); ticks that could not run at all because the loop fell a whole period
or more behind are skipped and counted, never run in a burst to catch up:
a control loop that ran late commands the newest state once, not several
stale ones.

A node declares a :class:`PriorityClass` by name; the process running it asks the kernel for real-time
round-robin scheduling at that class's priority where the user may, so that on a small machine the arm
loops run first, then the recorder's drains, operator input, the camera and the world model; where that
is refused, only the heavy, late-tolerant world model lowers its priority (nice), which needs no privilege.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError


class Deadlines:
    """The due times of a loop at ``period`` [s] from ``start`` [s], on a monotonic clock."""

    def __init__(self, period: float, start: float) -> None:
        """
        Args:
            period: time between two ticks [s], > 0.
            start: the due time of the first tick [s].

        Raises:
            ConfigurationError: a period that is not a positive finite number.
        """
        if not (math.isfinite(period) and period > 0):
            raise ConfigurationError(f"loop period must be a positive number of seconds, got {period!r}")
        self.period = float(period)
        self.due = float(start)  # [s] when the next tick is due
        self.ticks = 0  # ticks run
        self.skipped = 0  # due ticks never run (the loop was a period or more behind)
        self.max_late = 0.0  # [s] the largest lateness of a tick start seen
        self._late_sum = 0.0

    def start_tick(self, now: float) -> float:
        """A tick starts at ``now`` [s]; returns its lateness [s] (``now`` - due, >= 0 expected)."""
        late = now - self.due
        self.ticks += 1
        if late > self.max_late:
            self.max_late = late
        self._late_sum += max(late, 0.0)
        return late

    def finish_tick(self, now: float) -> float:
        """The tick ended at ``now`` [s]: the next due time, skipping (and counting) every one already past
        by a whole period or more."""
        self.due += self.period
        behind = now - self.due
        if behind >= self.period:
            missed = int(behind // self.period)
            self.skipped += missed
            self.due += missed * self.period
        return self.due

    @property
    def mean_late(self) -> float:
        """Mean lateness of the ticks run so far [s] (0 before the first)."""
        return self._late_sum / self.ticks if self.ticks else 0.0


# ---------------------------------------------------------------------- process priority
@dataclass(frozen=True)
class PriorityClass:
    """How urgently a node's process must run on a loaded machine.

    ``rr_priority``: the ``SCHED_RR`` real-time priority (1-99, higher runs first) the process takes where
    the user may (root, ``CAP_SYS_NICE`` or an ``rtprio`` limit); None: it stays in the normal scheduler.
    ``fallback_nice``: the nice value it takes otherwise (or when real-time scheduling is off): only values
    >= 0, which need no privilege.
    """

    name: str
    rr_priority: int | None
    fallback_nice: int


#: the classes, most urgent first. A node declares its class (``TeleopNode.PRIORITY``); a process running
#: several nodes takes the most urgent of theirs.
PRIORITY_CLASSES: dict[str, PriorityClass] = {c.name: c for c in (
    PriorityClass("control", 30, 0),  # 200 Hz arm loops and the drivers: a late tick is a late command
    # the recorder: short drains that must come before its subscriptions' history overflows (its file
    # writer thread, behind a queue, runs in the normal scheduler: lower_this_thread)
    PriorityClass("record", 25, 0),
    PriorityClass("input", 20, 0),  # operator input feeding the arm loops (trackers, gloves -> retargeting)
    PriorityClass("stream", 10, 0),  # the camera and the feed switch (frames the operator watches)
    PriorityClass("generate", 5, 10),  # the world model: heavy, frames carry their commands' stamps
    PriorityClass("normal", None, 0),  # viewers, tools, the description: the normal scheduler, unchanged
)}

#: environment variable: "auto" (default) tries real-time scheduling, "off" leaves the process as started
REALTIME_ENV = "RYNN_TELEOP_REALTIME"


def process_priority(classes: list[str]) -> PriorityClass:
    """The class a process running nodes of ``classes`` takes: the most urgent (``normal`` if none).

    Raises:
        ConfigurationError: a name that is not in :data:`PRIORITY_CLASSES`.
    """
    order = list(PRIORITY_CLASSES)
    unknown = sorted(set(classes) - set(order))
    if unknown:
        raise ConfigurationError(f"unknown priority class(es) {unknown}; classes are {', '.join(order)}")
    return PRIORITY_CLASSES[order[min((order.index(c) for c in classes), default=order.index("normal"))]]


def apply_process_priority(cls: PriorityClass, mode: str = "auto", system: Any = os) -> str:
    """Give the calling thread ``cls``'s scheduling; threads it starts afterwards inherit it (call it before
    the process creates its middleware threads). Returns what was done, in words, for the log.

    ``mode``: "auto" asks for ``SCHED_RR`` at ``cls.rr_priority`` (not ``SCHED_RESET_ON_FORK``: it would
    keep new threads out of it too) and, where that is refused or the class has none, sets
    ``cls.fallback_nice`` (when above the current nice value); "off" changes nothing. ``system``: the
    ``os`` module or a stand-in with ``sched_setscheduler``, ``sched_param``, ``SCHED_RR``,
    ``getpriority``, ``setpriority`` and ``PRIO_PROCESS``.

    Raises:
        ConfigurationError: ``mode`` is neither "auto" nor "off".
    """
    if mode not in ("auto", "off"):
        raise ConfigurationError(f"{REALTIME_ENV} must be 'auto' or 'off', got {mode!r}")
    if mode == "off":
        return f"scheduling unchanged ({REALTIME_ENV}=off)"
    refused = ""
    if cls.rr_priority is not None and hasattr(system, "sched_setscheduler"):
        try:
            system.sched_setscheduler(0, system.SCHED_RR, system.sched_param(cls.rr_priority))
            return f"{cls.name}: SCHED_RR priority {cls.rr_priority}"
        except OSError as exc:  # EPERM without the privilege; EINVAL where the kernel has no RR
            refused = f" (SCHED_RR {cls.rr_priority} refused: {exc.strerror or exc}; see the README's 'Priorities')"
    if cls.fallback_nice > 0 and hasattr(system, "setpriority"):
        if system.getpriority(system.PRIO_PROCESS, 0) < cls.fallback_nice:
            system.setpriority(system.PRIO_PROCESS, 0, cls.fallback_nice)
        return f"{cls.name}: nice {cls.fallback_nice}{refused}"
    return f"{cls.name}: normal scheduling{refused}"


#: the nice value a thread takes in :func:`lower_this_thread`
BACKGROUND_THREAD_NICE = 5


def lower_this_thread(system: Any = os) -> bool:
    """Put the calling thread in the normal scheduler at nice :data:`BACKGROUND_THREAD_NICE` (never higher
    priority than it had; no privilege needed): for a thread of an urgent process whose work may wait, such
    as the recorder's file writer behind its queue. True if anything changed.
    """
    changed = False
    if hasattr(system, "sched_getscheduler"):
        try:
            if system.sched_getscheduler(0) != system.SCHED_OTHER:
                system.sched_setscheduler(0, system.SCHED_OTHER, system.sched_param(0))
                changed = True
        except OSError:
            pass
    if hasattr(system, "setpriority"):
        try:
            if system.getpriority(system.PRIO_PROCESS, 0) < BACKGROUND_THREAD_NICE:
                system.setpriority(system.PRIO_PROCESS, 0, BACKGROUND_THREAD_NICE)
                changed = True
        except OSError:
            pass
    return changed
