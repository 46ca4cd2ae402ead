"""Rate and latency statistics over a sliding window (ROS-free)."""

from __future__ import annotations

from collections import deque

import numpy as np


class RateMeter:
    """Events per second over the last ``window`` seconds, and latency percentiles.

    Times are caller-supplied [s] (monotonic or ROS time), so tests can drive it.
    """

    def __init__(self, window: float = 5.0, max_samples: int = 10000) -> None:
        self.window = window  # [s]
        self._times: deque[float] = deque(maxlen=max_samples)
        self._latencies: deque[tuple[float, float]] = deque(maxlen=max_samples)  # (time [s], latency [s])
        self.count = 0  # events since construction

    def tick(self, now: float, latency: float | None = None) -> None:
        """Record one event at ``now`` [s], optionally with its latency [s]."""
        self._times.append(now)
        if latency is not None:
            self._latencies.append((now, latency))
            while self._latencies[0][0] < now - self.window:
                self._latencies.popleft()
        self.count += 1

    def rate(self, now: float) -> float:
        """Events per second [Hz] in the window ending at ``now`` [s]."""
        while self._times and self._times[0] < now - self.window:
            self._times.popleft()
        if len(self._times) < 2:
            return 0.0
        span = self._times[-1] - self._times[0]
        return (len(self._times) - 1) / span if span > 0 else 0.0

    def latency_percentiles(self, *q: float) -> tuple[float, ...]:
        """Latency percentiles [s] (``q`` in 0..100) of the samples of the last ``window`` seconds before the
        newest one (at most ``max_samples``); NaN if none."""
        samples = list(self._latencies)  # one C-level copy: another thread may tick meanwhile
        if not samples:
            return tuple(float("nan") for _ in q)
        return tuple(float(v) for v in np.percentile(np.fromiter((lat for _, lat in samples), float), q))
