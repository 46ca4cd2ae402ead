"""Fixed-rate deadlines for wall-clock control loops, and the scheduling priority of a node's process
(ROS-free; the caller supplies the clock and the system calls).

Tick ``k`` of a loop is due at ``start + k * period``. A late tick does not shift the ticks after it (the loop
keeps its phase and average rate); ticks the loop fell a whole period or more behind on are skipped and counted,
never run in a burst: a late control loop commands the newest state once, not several stale ones.

A node declares a :class:`PriorityClass` by name; once its nodes are built, the process asks for real-time
round-robin scheduling at that class's priority for all its threads where the user may, so that the arm loops
run first, then the recorder's drains, operator input and the camera. The world model, start-up and background
threads stay in the normal scheduler (nice): the kernel throttles every real-time thread of a CPU once they
have used ``sched_rt_runtime_us`` of a period, so unbounded work at any real-time priority would stall the arm
loops too. Processes are also placed on CPUs (:func:`process_cpus`): the control processes, once real-time, on
the control CPU (the lowest they may use), the other real-time classes on the rest; ``generate`` and ``normal``
are not placed (in the normal scheduler they use what the real-time threads leave on every CPU).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
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
    ``placement``: the CPUs it is placed on (:func:`process_cpus`): ``"control"`` (the control CPU, only
    once real-time scheduling is granted: without it the process competes with every other on its CPU) or
    ``"others"`` (every CPU it may use but the control CPU) or None (not placed).
    """

    name: str
    rr_priority: int | None
    fallback_nice: int
    placement: str | None = "others"


#: the classes, most urgent first. A node declares its class (``TeleopNode.PRIORITY``); a process running
#: several nodes takes the most urgent of theirs.
PRIORITY_CLASSES: dict[str, PriorityClass] = {c.name: c for c in (
    PriorityClass("control", 30, 0, "control"),  # 200 Hz arm loops and the drivers: a late tick is a late command
    # the recorder: short drains that must come before its subscriptions' history overflows (its file
    # writer thread, behind a queue, runs in the normal scheduler: lower_this_thread)
    PriorityClass("record", 25, 0),
    PriorityClass("input", 20, 0),  # operator input feeding the arm loops (trackers, gloves -> retargeting)
    PriorityClass("stream", 10, 0),  # the camera and the feed switch (frames the operator watches)
    # the world model: heavy and unbounded (a diffusion model may take a whole core), late-tolerant (its
    # frames carry their commands' stamps): never real time, which would spend the arm loops' budget. Not
    # placed: in the normal scheduler it runs where no real-time thread does, on any CPU. Placed beside the
    # real-time input, camera and recorder processes, its middleware's receive threads waited behind them for
    # over 100 ms at a time, and the generated feed had no new command to show (gaps of 110-200 ms in the demo)
    PriorityClass("generate", None, 10, None),
    # viewers, tools, the description, the demo's parent process: the normal scheduler, unplaced (a process
    # that spawns others hands its CPUs down to them)
    PriorityClass("normal", None, 0, None),
)}

#: environment variable: "auto" (default) tries real-time scheduling, "off" leaves the process as started
REALTIME_ENV = "RYNN_TELEOP_REALTIME"


def process_priority(classes: list[str]) -> PriorityClass:
    """The class a process running nodes of ``classes`` takes: the most urgent (``normal`` if none), with the
    placement its nodes share (``normal`` nodes have none and do not count): a process whose nodes would be
    placed differently, such as the whole stack in one process (``rynn-teleop run --mode``), is not placed,
    so that it keeps every CPU it may use.

    Raises:
        ConfigurationError: a name that is not in :data:`PRIORITY_CLASSES`.
    """
    order = list(PRIORITY_CLASSES)
    unknown = sorted(set(classes) - set(order))
    if unknown:
        raise ConfigurationError(f"unknown priority class(es) {unknown}; classes are {', '.join(order)}")
    cls = PRIORITY_CLASSES[order[min((order.index(c) for c in classes), default=order.index("normal"))]]
    placements = {PRIORITY_CLASSES[c].placement for c in classes} - {None}
    placement = placements.pop() if len(placements) == 1 else None
    return cls if placement == cls.placement else replace(cls, placement=placement)


def realtime_mode(value: str | None) -> str:
    """The mode a :data:`REALTIME_ENV` value names: "auto" (also for None or empty) or "off".

    Raises:
        ConfigurationError: any other value.
    """
    mode = value or "auto"
    if mode not in ("auto", "off"):
        raise ConfigurationError(f"{REALTIME_ENV} must be 'auto' or 'off', got {mode!r}")
    return mode


PLACEMENTS = ("control", "others")


def process_cpus(placement: str | None, allowed: Iterable[int]) -> frozenset[int] | None:
    """The CPUs a process with ``placement`` (:class:`PriorityClass`) is placed on when it may use the CPUs
    ``allowed``: ``"control"``: the lowest of them (the control CPU); ``"others"``: all of them but that one.
    None (not placed) for no placement or when fewer than two CPUs are allowed.

    Raises:
        ConfigurationError: a placement that is not in :data:`PLACEMENTS`.
    """
    if placement is not None and placement not in PLACEMENTS:
        raise ConfigurationError(f"unknown CPU placement {placement!r}; placements are {', '.join(PLACEMENTS)}")
    cpus = frozenset(allowed)
    if placement is None or len(cpus) < 2:
        return None
    control = min(cpus)
    return frozenset({control}) if placement == "control" else cpus - {control}


def _place(cls: PriorityClass, system: Any, targets: list[int], real_time: bool) -> str:
    """Place ``targets`` on ``cls``'s CPUs (:func:`process_cpus`; ``"control"`` only with ``real_time``
    granted); returns what was done, for the log."""
    if cls.placement is None or (cls.placement == "control" and not real_time) \
            or not hasattr(system, "sched_setaffinity"):
        return ""
    try:
        allowed = frozenset(system.sched_getaffinity(0))
    except OSError:
        return ""
    cpus = process_cpus(cls.placement, allowed)
    if cpus is None:
        return ""
    for tid in targets:
        try:
            system.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # that thread has ended
            continue
        except OSError as exc:  # a cpuset that changed meanwhile
            return f"; CPUs as started (placement on {sorted(cpus)} refused: {exc.strerror or exc})"
    return f" on CPU {', '.join(str(c) for c in sorted(cpus))}"


def process_threads(system: Any = os) -> list[int]:
    """The native ids of this process's threads (Linux ``/proc/self/task``); ``[0]`` (the calling thread)
    where that cannot be read."""
    try:
        return sorted(int(tid) for tid in system.listdir("/proc/self/task"))
    except (OSError, ValueError, AttributeError):
        return [0]


def apply_process_priority(cls: PriorityClass, mode: str = "auto", system: Any = os,
                           threads: Iterable[int] = (0,)) -> str:
    """Give ``cls``'s scheduling to ``threads`` (native thread ids, 0: the calling thread), except those
    that lowered themselves (:func:`lower_this_thread`); threads they start afterwards inherit it. Call it
    once the process's nodes are built, with :func:`process_threads`: start-up work (imports, models) then
    ran in the normal scheduler, and the middleware's and the loops' threads, which exist by then, take the
    class. Returns what was done, in words, for the log.

    ``mode``: "auto" asks for ``SCHED_RR`` at ``cls.rr_priority`` (not ``SCHED_RESET_ON_FORK``: it would
    keep new threads out of it too); where that is refused or the class has none, it sets
    ``cls.fallback_nice`` (when above a thread's current nice value). Then it places the threads on
    ``cls.placement``'s CPUs (:func:`process_cpus`; threads started later inherit them; the control CPU
    only with real-time scheduling granted). "off" changes nothing. A thread that ended meanwhile is passed
    over. ``system``: the ``os`` module or a stand-in with ``sched_setscheduler``, ``sched_param``,
    ``SCHED_RR``, ``getpriority``, ``setpriority`` and ``PRIO_PROCESS`` (and ``sched_getaffinity`` /
    ``sched_setaffinity`` to place).

    Raises:
        ConfigurationError: ``mode`` is neither "auto" nor "off".
    """
    if realtime_mode(mode) == "off":
        return f"scheduling unchanged ({REALTIME_ENV}=off)"
    targets = [t for t in threads if t not in _LOWERED]
    refused = ""
    if cls.rr_priority is not None and hasattr(system, "sched_setscheduler"):
        try:
            for tid in targets:
                try:
                    system.sched_setscheduler(tid, system.SCHED_RR, system.sched_param(cls.rr_priority))
                except ProcessLookupError:  # that thread has ended
                    continue
            return f"{cls.name}: SCHED_RR priority {cls.rr_priority}{_place(cls, system, targets, True)}"
        except OSError as exc:  # EPERM without the privilege; EINVAL where the kernel has no RR
            refused = f" (SCHED_RR {cls.rr_priority} refused: {exc.strerror or exc}; see the README's 'Priorities')"
    placed = _place(cls, system, targets, False)
    if cls.fallback_nice > 0 and hasattr(system, "setpriority"):
        for tid in targets:
            try:
                if system.getpriority(system.PRIO_PROCESS, tid) < cls.fallback_nice:
                    system.setpriority(system.PRIO_PROCESS, tid, cls.fallback_nice)
            except ProcessLookupError:
                continue
        return f"{cls.name}: nice {cls.fallback_nice}{placed}{refused}"
    return f"{cls.name}: normal scheduling{placed}{refused}"


#: the nice value a thread takes in :func:`lower_this_thread`: below the world model's (``generate``, nice 10),
#: whose late frames show in the episode, while a writer behind a queue only catches up later
BACKGROUND_THREAD_NICE = 15

_LOWERED: set[int] = set()  # native ids of the threads that lowered themselves (apply_process_priority skips them)


def lower_this_thread(system: Any = os) -> bool:
    """Put the calling thread in the normal scheduler at nice :data:`BACKGROUND_THREAD_NICE` (never higher
    priority than it had; no privilege needed), on the CPUs it has: for a thread of an urgent process whose
    work may wait, such as the recorder's file writer behind its queue. :func:`apply_process_priority`
    leaves it there. True if anything changed.
    """
    _LOWERED.add(threading.get_native_id())
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


def name_this_thread(name: str, proc: str = "/proc/thread-self/comm") -> str | None:
    """Give the calling thread the kernel name ``name`` (its first 15 bytes, what Linux keeps), so that
    ``top -H``, ``ps -L``, ``perf`` and scheduler traces tell the threads of a process apart (Python's
    ``threading`` names stay inside the interpreter). Returns the name set, None where the system has no
    such file (not Linux) or refuses."""
    short = name.encode("utf-8", "replace")[:15].decode("utf-8", "ignore")
    try:
        with open(proc, "w", encoding="utf-8") as f:
            f.write(short)
    except OSError:
        return None
    return short
