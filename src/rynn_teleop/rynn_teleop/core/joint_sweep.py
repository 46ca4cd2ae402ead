"""A smooth joint test pattern that respects every joint limit.

Used by the ``joint_sweep`` node (a stand-in for ``joint_state_publisher``
that moves every joint, for checking the description, RViz and the world
model's conditioning).

Each joint follows ``q_i(t) = c_i + A_i sin(w t + phi_i)``. The amplitude is
chosen so that position, velocity (``A w``), acceleration (``A w^2``) and
jerk (``A w^3``) stay within the joint's limits, scaled by ``margin``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .robot_model import JointLimits


class SweepState(NamedTuple):
    """Position [rad], velocity [rad/s] and acceleration [rad/s^2] at one instant."""

    position: np.ndarray
    velocity: np.ndarray
    acceleration: np.ndarray


class JointSweep:
    """Sinusoidal sweep of a set of joints inside their limits."""

    def __init__(
        self,
        limits: JointLimits,
        period: float,
        amplitude_fraction: float,
        margin: float = 0.9,
        center: np.ndarray | None = None,
    ) -> None:
        """
        Args:
            limits: limits of the joints to sweep (any length n).
            period: sweep period [s], > 0.
            amplitude_fraction: amplitude as a fraction (0..1] of the largest
                amplitude the position limits allow around ``center``.
            margin: fraction (0..1] of the velocity/acceleration/jerk limits used.
            center: (n,) reference posture [rad]; the sweep centres halfway
                between it (clipped into the limits) and mid-range, so every
                joint has room to move even if the reference sits on a limit.
                Default: mid-range.
        """
        if period <= 0 or not 0 < amplitude_fraction <= 1 or not 0 < margin <= 1:
            raise ValueError("period must be > 0, amplitude_fraction and margin in (0, 1]")
        self.omega = 2 * math.pi / period  # [rad/s]
        mid = 0.5 * (limits.lower + limits.upper)
        ref = mid if center is None else limits.clip_position(np.asarray(center, dtype=float))
        self.center = 0.5 * (ref + mid)
        room = np.minimum(self.center - limits.lower, limits.upper - self.center)
        w = self.omega
        self.amplitude = np.minimum.reduce(
            [
                amplitude_fraction * room,
                margin * limits.velocity / w,
                margin * limits.acceleration / w**2,
                margin * limits.jerk / w**3,
            ]
        )
        n = self.center.size
        self.phase = np.linspace(0.0, 2 * math.pi, n, endpoint=False) if n else np.zeros(0)

    def sample(self, t: float) -> SweepState:
        """The sweep at time ``t`` [s] since its start."""
        arg = self.omega * t + self.phase
        a, w = self.amplitude, self.omega
        return SweepState(self.center + a * np.sin(arg), a * w * np.cos(arg), -a * w * w * np.sin(arg))
