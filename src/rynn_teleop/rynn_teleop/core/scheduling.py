"""Fixed-rate deadlines for wall-clock control loops (ROS-free; the caller supplies the clock).

Tick ``k`` of a loop is due at ``start + k * period``. A tick that runs late
does not shift the ticks after it (the loop keeps its phase and its average
rate); ticks that could not run at all because the loop fell a whole period
or more behind are skipped and counted, never run in a burst to catch up:
a control loop that ran late commands the newest state once, not several
stale ones.
"""

from __future__ import annotations

import math

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
