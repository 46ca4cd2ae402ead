"""Simulated joints without physics: a kinematic model that tracks position targets (ROS-free).

The drivers' ``kinematic`` backend. Each joint follows its target like a first-order system of the given
bandwidth, after a transport latency, with its velocity and acceleration clipped to the limits and its position
kept within them. Nothing else exists: no objects, no contacts, no gravity. The digital mode's drivers use the
physical twin instead (the ``sim`` backend, :mod:`.twin`); this one needs no MuJoCo and no twin node, for a
driver run on its own, a bench or a test of the safety layer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.arm_teleop import DEFAULT_HOME
from ..core.params import FLOAT_LIST, Param
from ..core.robot_model import JointLimits
from ..errors import ConfigurationError
from .base import ARM_BACKENDS, HAND_BACKENDS, DriverContext, JointBackend, JointReading

#: the settings of the kinematic simulation in either driver
SIM_SETTINGS = (
    Param("bandwidth_hz", float, 10.0, "tracking bandwidth", "Hz", min=0.1, max=200.0),
    Param("latency_s", float, 0.005, "command latency", "s", min=0.0, max=1.0),
)


class SimBackend(JointBackend):
    """Kinematic joint simulation (``name = "kinematic"``)."""

    name = "kinematic"

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
        self._nvmax = -self._vmax
        self._buf = np.empty_like(self._q)  # scratch of _advance
        self._zero = np.zeros_like(self._q)
        self._constants_key: tuple[float, float] | None = None  # what _constants_cache was computed for
        self._constants_cache: tuple[np.ndarray, ...] = ()
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
        """Integrate up to ``now`` [s] in steps of ``substep_s`` (the last one shorter to land on ``now``).

        Each step, with ``h`` its length [s]: targets whose time has come take effect; the velocity moves
        towards ``gain * (target - q)`` (zero when disabled or stopped) clipped to the velocity limits, by at
        most ``acceleration * h``; the position moves by ``velocity * h`` and is clipped into the limits,
        where a joint that hit a limit stops. ``_q`` and ``_v`` are updated in place.
        """
        t = self._time
        if t is None:
            self._time = now
            return
        end = now - 1e-12
        if not t < end:
            return
        sub, mul, vmin, vmax_ = np.subtract, np.multiply, np.minimum, np.maximum
        lower, upper, vmax, nvmax, amax = self._lower, self._upper, self._vmax, self._nvmax, self._amax
        q, v, buf, zero = self._q, self._v, self._buf, self._zero
        h_full = self.substep_s
        gain, h_arr, a_full, na_full = self._constants()
        moving = self._enabled and not self._stopped
        queue, target = self._queue, self._target
        due = queue[0][0] if queue else np.inf  # when the next queued target takes effect [s]
        q_view, buf_view = memoryview(q), memoryview(buf)
        while t < end:
            h = now - t
            full = not h < h_full
            if full:
                h = h_full
            t += h
            while due <= t:
                target = queue.popleft()[1]
                due = queue[0][0] if queue else np.inf
            if moving:
                sub(target, q, out=buf)
                buf *= gain
                vmax_(buf, nvmax, out=buf)
                vmin(buf, vmax, out=buf)
                buf -= v  # v_des - v
            else:
                sub(zero, v, out=buf)  # v_des (0) - v
            if full:
                vmax_(buf, na_full, out=buf)
                vmin(buf, a_full, out=buf)
                v += buf
                mul(v, h_arr, out=buf)
            else:
                a_step = amax * h
                vmax_(buf, -a_step, out=buf)
                vmin(buf, a_step, out=buf)
                v += buf
                mul(v, h, out=buf)
            buf += q  # the new position before the limits
            vmax_(buf, lower, out=q)
            vmin(q, upper, out=q)
            if q_view != buf_view:  # by value: a superset of the joints outside the limits (NaN too)
                v[(buf < lower) | (buf > upper)] = 0.0
        self._time, self._target = t, target

    def _constants(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(n,) arrays of the tracking gain [1/s], ``substep_s`` [s] and the velocity change per full substep,
        +/- [rad/s], for the current ``bandwidth_hz`` and ``substep_s``."""
        key = (self.bandwidth_hz, self.substep_s)
        if self._constants_key != key:
            n = self._q.size
            a_full = self._amax * self.substep_s
            self._constants_cache = (np.full(n, 2.0 * np.pi * self.bandwidth_hz), np.full(n, self.substep_s),
                                     a_full, -a_full)
            self._constants_key = key
        return self._constants_cache

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


@ARM_BACKENDS.register
class SimArms(SimBackend):
    """The arm_driver's kinematic simulation: both arms, starting at ``initial_position``."""

    SETTINGS = (
        *SIM_SETTINGS,
        Param("initial_position", FLOAT_LIST, list(DEFAULT_HOME), "starting arm joints, left 1-7 then right", "rad",
              min=-3.2, max=3.2, length=14),
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: DriverContext) -> SimArms:
        return cls(context.joint_names, context.limits, np.array(settings["initial_position"]),
                   bandwidth_hz=settings["bandwidth_hz"], latency_s=settings["latency_s"])


@HAND_BACKENDS.register
class SimHands(SimBackend):
    """The hand_driver's kinematic simulation: the hands driven, starting open (all joints at 0)."""

    SETTINGS = SIM_SETTINGS

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: DriverContext) -> SimHands:
        return cls(context.joint_names, context.limits, np.zeros(len(context.joint_names)),
                   bandwidth_hz=settings["bandwidth_hz"], latency_s=settings["latency_s"])
