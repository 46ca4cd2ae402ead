"""Stalls of the machine itself, measured beside the stack (ROS-free).

On a virtual machine the host may pause the guest's CPUs; the guest kernel does not see it and no
scheduling inside the guest can prevent it, yet every stream of an episode then shows a gap at the same
instant. A *host probe* tells such stalls apart from the stack's own lateness: one process per CPU, pinned
to it, at the highest real-time priority (``SCHED_FIFO`` 99, above every thread of the stack), sleeping to
a deadline every :data:`PERIOD_S`. Nothing in the guest can keep it from running on time, so a tick later
than :data:`STALL_S` means the CPU itself did not run (or the kernel held it). Without the privilege the
probe runs in the normal scheduler and says so (``policy``); its stalls then prove nothing.

Used by the demo (``rynn-teleop demo`` reports the episode's gaps that overlap a stall) and by
``bench/stack.py``. Times are wall-clock seconds (``time.time``), the clock of ROS stamps and episode
gaps. Cost: about 0.01 core per probe.
"""

from __future__ import annotations

import json
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


class Stall(NamedTuple):
    """One stall seen by the probe of CPU ``cpu``."""

    start_s: float  # [s] wall clock: when the late tick was due
    length_s: float  # [s] how late it came
    cpu: int


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
          system: Any = os, stop: Callable[[], bool] = lambda: False) -> dict:
    """Run one probe on CPU ``cpu`` for ``seconds`` [s] or until ``stop()``; returns ``{"policy", "cpu",
    "stalls": [[start_s, length_s], ...]}``. Only stalls are kept (memory does not grow with ``seconds``)."""
    try:
        system.sched_setaffinity(0, {cpu})
        system.sched_setscheduler(0, system.SCHED_FIFO, system.sched_param(99))
        policy = REALTIME_POLICY
    except (OSError, AttributeError):
        policy = "normal (real-time refused)"
    detector, stalls = StallDetector(cpu), []
    start = due = clock()
    while due - start < seconds and not stop():
        due += PERIOD_S
        wait = due - clock()
        if wait > 0:
            sleep(wait)
        late = clock() - due
        stall = detector.tick(wall(), late)
        if stall is not None:
            stalls.append(stall)
    return {"policy": policy, "cpu": cpu, "stalls": [[s.start_s, s.length_s] for s in stalls]}


class HostProbes:
    """One probe process per CPU this process may use, from construction until :meth:`finish` (at most
    ``seconds`` [s]: an orphaned probe ends by itself)."""

    def __init__(self, seconds: float) -> None:
        self._procs = [subprocess.Popen([sys.executable, "-m", __name__, str(seconds), str(cpu)],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                       for cpu in sorted(os.sched_getaffinity(0))]

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
    """The stalls as ``[cpu, seconds after start_s, ms]`` rows (JSON reports)."""
    return [[s.cpu, round(s.start_s - start_s, 3), round(1e3 * s.length_s, 1)] for s in stalls]


def overlaps(stalls: Iterable[Stall], start_ns: int, end_ns: int) -> bool:
    """Whether a silence from ``start_ns`` to ``end_ns`` [ns, wall clock] overlaps a stall."""
    return any(s.start_s * 1e9 < end_ns and (s.start_s + s.length_s) * 1e9 > start_ns for s in stalls)


def main(argv: list[str] | None = None) -> int:
    """``python -m rynn_teleop.host_stalls SECONDS CPU``: run one probe, print its JSON line."""
    args = sys.argv[1:] if argv is None else argv
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    print(json.dumps(probe(float(args[0]), int(args[1]), stop=lambda: bool(stopped))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
