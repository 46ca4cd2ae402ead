"""Simulated joints: a kinematic model that tracks position targets (ROS-free).

Each joint follows its target like a first-order system of the given
bandwidth, after a transport latency, with its velocity and acceleration
clipped to the limits and its position kept within them. Used for digital
teleoperation (no robot) and the tests.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigurationError
from ..core.robot_model import JointLimits
from .base import JointBackend, JointReading


class SimBackend(JointBackend):
    """Kinematic joint simulation (``kind = "sim"``)."""

    kind = "sim"

    def __init__(
        self,
        joint_names: Sequence[str],
        limits: JointLimits,
        initial: np.ndarray,
        *,
        bandwidth_hz: float = 10.0,
        latency_s: float = 0.005,
        substep_s: float = 0.001,
    ) -> None:
        """
        Args:
            joint_names: the simulated joints.
            limits: their position [rad], velocity [rad/s] and acceleration [rad/s^2] limits.
            initial: (n,) starting positions [rad] (clipped into the limits).
            bandwidth_hz: tracking bandwidth [Hz] (time constant 1 / (2 pi bw)).
            latency_s: delay between ``write`` and the target taking effect [s].
            substep_s: integration step [s].
        """
        if not bandwidth_hz > 0 or latency_s < 0 or not substep_s > 0:
            raise ConfigurationError("sim: bandwidth must be > 0, latency >= 0, substep > 0")
        self.joint_names = tuple(joint_names)
        self.limits = limits
        self.bandwidth_hz = bandwidth_hz
        self.latency_s = latency_s
        self.substep_s = substep_s
        self._lower, self._upper = np.asarray(limits.lower, float), np.asarray(limits.upper, float)
        self._vmax, self._amax = np.asarray(limits.velocity, float), np.asarray(limits.acceleration, float)
        self._q = np.minimum(np.maximum(np.asarray(initial, dtype=float), limits.lower), limits.upper)
        self._v = np.zeros_like(self._q)
        self._target = self._q.copy()
        self._queue: deque[tuple[float, np.ndarray]] = deque()
        self._time: float | None = None
        self._enabled = False
        self._stopped = False
        self.writes = 0

    def connect(self) -> None:
        pass

    def enable(self) -> None:
        self._enabled = True
        self._stopped = False
        self._target = self._q.copy()
        self._queue.clear()

    def _advance(self, now: float) -> None:
        if self._time is None:
            self._time = now
            return
        lower, upper, vmax, amax = self._lower, self._upper, self._vmax, self._amax
        gain = 2.0 * np.pi * self.bandwidth_hz
        q, v = self._q, self._v
        while self._time < now - 1e-12:
            h = min(self.substep_s, now - self._time)
            self._time += h
            while self._queue and self._queue[0][0] <= self._time:
                self._target = self._queue.popleft()[1]
            if not self._enabled or self._stopped:
                v_des = np.zeros_like(v)
            else:
                v_des = np.minimum(np.maximum(gain * (self._target - q), -vmax), vmax)
            a_step = amax * h
            v = v + np.minimum(np.maximum(v_des - v, -a_step), a_step)
            q_new = q + v * h
            hit = (q_new < lower) | (q_new > upper)
            q = np.minimum(np.maximum(q_new, lower), upper)
            if hit.any():
                v[hit] = 0.0
        self._q, self._v = q, v

    def read(self, now: float) -> JointReading:
        self._advance(now)
        return JointReading(self._q.copy(), self._v.copy(), None, now)

    def write(self, position: np.ndarray) -> None:
        if self._stopped or not self._enabled:
            return
        t = (self._time or 0.0) + self.latency_s
        self._queue.append((t, np.asarray(position, dtype=float).copy()))
        self.writes += 1

    def stop(self) -> None:
        self._stopped = True
        self._queue.clear()

    def disable(self) -> None:
        self._enabled = False

    def close(self) -> None:
        self._enabled = False

    def status(self) -> Mapping[str, Any]:
        return {"bandwidth_hz": self.bandwidth_hz, "latency_s": self.latency_s, "stopped": self._stopped}
