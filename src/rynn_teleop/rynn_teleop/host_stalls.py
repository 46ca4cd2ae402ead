"""Stalls of the machine itself, detected beside the stack (ROS-free).

A virtual machine's host may pause the guest's CPUs, which no scheduling inside the guest can prevent; every
stream then shows a gap at the same instant. A *host probe* tells such stalls apart from the stack's own
lateness: one process per CPU, pinned to it, at ``SCHED_FIFO`` 99 (above every thread of the stack), sleeping
to a deadline every :data:`PERIOD_S`; a tick at least :data:`STALL_S` late means the CPU did not run. Without
the privilege the probe runs in the normal scheduler and says so (``policy``); its stalls then prove nothing.

The host may also slow the guest's memory access while the CPUs run, so the lowest CPU's probe also reads
one byte of every page of its own resident buffer (:class:`PageWalker`) every :data:`MEMORY_EVERY` ticks: a
walk taking :data:`MEMORY_STALL_S` or more is a *memory stall* (slow address translation).

Used by ``rynn-teleop demo`` (gaps that overlap a stall) and ``bench/stack.py``. Times are wall-clock
seconds (``time.time``), the clock of ROS stamps and episode gaps.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

PERIOD_S = 0.005  # [s] between a probe's ticks
REALTIME_POLICY = "SCHED_FIFO 99"  # the policy a probe must run at for its stalls to be the machine's
STALL_S = 0.010  # [s] a tick at least this late is a stall
MEMORY_MIB = 32  # [MiB] the page walker's buffer (8192 pages of 4 KiB)
MEMORY_EVERY = 4  # [ticks] between two page walks (50 Hz)
MEMORY_STALL_S = 0.005  # [s] a page walk at least this long is a memory stall
PAGE = 4096  # [bytes]


class Stall(NamedTuple):
    """One stall seen by the probe of CPU ``cpu``."""

    start_s: float  # [s] wall clock: when the late tick was due (a memory stall: when the walk began)
    length_s: float  # [s] how late it came (a memory stall: how long the walk took)
    cpu: int
    kind: str = "cpu"  # "cpu": the CPU did not run; "memory": a page walk this slow


class PageWalker:
    """A buffer of ``mib`` MiB of its own, every page touched once (no transparent huge pages, so one
    translation per 4 KiB page); :meth:`walk` reads one byte of every page."""

    def __init__(self, mib: int = MEMORY_MIB) -> None:
        self._map = mmap.mmap(-1, mib << 20)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            self._map.madvise(mmap.MADV_NOHUGEPAGE)
        view = memoryview(self._map)
        view[::PAGE] = b"\x01" * (len(view) // PAGE)
        self._pages = view[::PAGE]

    def walk(self) -> int:
        """Read one byte of every page; returns how many read 1 (all of them: the number of pages)."""
        return bytes(self._pages).count(1)


class StallDetector:
    """Stalls in one probe's ticks. A run of late ticks (each more than a period late) is one stall,
    reported by its first tick, when that tick is at least ``threshold`` [s] late."""

    def __init__(self, cpu: int, period: float = PERIOD_S, threshold: float = STALL_S) -> None:
        self.cpu, self.period, self.threshold = cpu, period, threshold
        self._in_stall = False

    def tick(self, woke_s: float, late: float) -> Stall | None:
        """One tick that woke at wall-clock ``woke_s`` [s], ``late`` [s] after its due time."""
        stall = Stall(woke_s - late, late, self.cpu) if late >= self.threshold and not self._in_stall else None
        self._in_stall = late > self.period
        return stall


def probe(seconds: float, cpu: int, clock: Callable[[], float] = time.monotonic,
          wall: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
          system: Any = os, stop: Callable[[], bool] = lambda: False, walker: PageWalker | None = None) -> dict:
    """Run one probe on CPU ``cpu`` for ``seconds`` [s] or until ``stop()``; returns ``{"policy", "cpu",
    "stalls": [[start_s, length_s], ...], "memory_stalls": [[start_s, length_s], ...]}``. With ``walker``,
    it walks the pages every :data:`MEMORY_EVERY` ticks (after the tick's lateness is taken; the next tick is
    then due a period after the walk, so a slow walk is not also a late tick). Only stalls are kept (memory
    does not grow with ``seconds``)."""
    try:
        system.sched_setaffinity(0, {cpu})
        system.sched_setscheduler(0, system.SCHED_FIFO, system.sched_param(99))
        policy = REALTIME_POLICY
    except (OSError, AttributeError):
        policy = "normal (real-time refused)"
    detector, stalls, memory = StallDetector(cpu), [], []
    start = due = clock()
    ticks = 0
    while due - start < seconds and not stop():
        due += PERIOD_S
        wait = due - clock()
        if wait > 0:
            sleep(wait)
        late = clock() - due
        stall = detector.tick(wall(), late)
        if stall is not None:
            stalls.append(stall)
        ticks += 1
        if walker is not None and ticks % MEMORY_EVERY == 0:
            began, t0 = wall(), clock()
            walker.walk()
            t1 = clock()
            if t1 - t0 >= MEMORY_STALL_S:
                memory.append((began, t1 - t0))
            due = max(due, t1 - PERIOD_S)  # the next tick: a period after the walk at the latest
    return {"policy": policy, "cpu": cpu, "stalls": [[s.start_s, s.length_s] for s in stalls],
            "memory_stalls": [list(m) for m in memory]}


class HostProbes:
    """One probe process per CPU this process may use, from construction until :meth:`finish` (at most
    ``seconds`` [s]: an orphaned probe ends by itself); the lowest CPU's also walks pages."""

    def __init__(self, seconds: float) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        self._procs = [subprocess.Popen([sys.executable, "-m", __name__, str(seconds), str(cpu),
                                         *(["--memory"] if cpu == cpus[0] else [])],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                       for cpu in cpus]

    def finish(self, timeout: float = 10.0) -> tuple[str | None, list[Stall]]:
        """End the probes; returns (the policy they ran at: None if any failed, several joined by ", " if
        they differ; and every stall seen, by start time)."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the probe prints what it saw and exits
        policies, stalls = set(), []
        for proc in self._procs:
            try:
                out, _ = proc.communicate(timeout=timeout)
                doc = json.loads(out.strip().splitlines()[-1])
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                proc.kill()
                return None, []
            policies.add(doc["policy"])
            stalls += [Stall(float(t), float(length), int(doc["cpu"])) for t, length in doc["stalls"]]
            stalls += [Stall(float(t), float(length), int(doc["cpu"]), "memory")
                       for t, length in doc.get("memory_stalls", ())]
        return (policies.pop() if len(policies) == 1 else ", ".join(sorted(policies))), sorted(stalls)

    def stop(self) -> None:
        """End the probes now, results lost (idempotent)."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def within(stalls: Iterable[Stall], start_s: float, stop_s: float) -> list[Stall]:
    """The stalls that start between ``start_s`` and ``stop_s`` [s]."""
    return [s for s in stalls if start_s <= s.start_s <= stop_s]


def rows(stalls: Iterable[Stall], start_s: float) -> list[list]:
    """The stalls as ``[cpu, seconds after start_s, ms, kind]`` rows (JSON reports)."""
    return [[s.cpu, round(s.start_s - start_s, 3), round(1e3 * s.length_s, 1), s.kind] for s in stalls]


def overlaps(stalls: Iterable[Stall], start_ns: int, end_ns: int) -> bool:
    """Whether a silence from ``start_ns`` to ``end_ns`` [ns, wall clock] overlaps a stall."""
    return any(s.start_s * 1e9 < end_ns and (s.start_s + s.length_s) * 1e9 > start_ns for s in stalls)


def main(argv: list[str] | None = None) -> int:
    """``python -m rynn_teleop.host_stalls SECONDS CPU [--memory]``: run one probe (``--memory``: it walks
    pages too), print its JSON line."""
    args = sys.argv[1:] if argv is None else argv
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    walker = PageWalker() if "--memory" in args[2:] else None
    print(json.dumps(probe(float(args[0]), int(args[1]), stop=lambda: bool(stopped), walker=walker)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
