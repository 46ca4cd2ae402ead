"""The safety layer between commands and joint hardware (ROS-free, shared by both drivers).

Every control cycle a driver calls :meth:`SafetyController.step` with the
newest measurement; it decides the target actually sent:

* **e-stop** (:meth:`SafetyController.estop`): latched within the cycle it is
  requested; the target freezes at the position measured then (the backend's
  own stop is the driver's job) until :meth:`SafetyController.reset`;
* **watchdog**: no command for ``command_timeout`` -> hold the position
  measured when it tripped; commands are followed again only once a command
  newer than the trip arrives;
* **start-up**: hold the measured position until the first command; a
  command far from the held position (more than ``ramp_threshold``) is
  approached at ``ramp_speed`` (a fraction of the velocity limits) instead of
  at full speed; the same ramp is used when resuming after a hold;
* **clamp** (:func:`clamp_command`, a pure function): into the position limits
  and to at most ``velocity * dt`` from the previous target, returning the
  target actually sent and what was clipped.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Sequence

import numpy as np

from ..errors import ConfigurationError
from .robot_model import JointLimits

_log = logging.getLogger(__name__)

MODES = ("waiting", "hold", "ramp", "track", "watchdog", "estop")


class ClampResult(NamedTuple):
    """What :func:`clamp_command` sent and why it differs from what was asked."""

    sent: np.ndarray  # (n,) target actually sent [rad]
    position_clipped: np.ndarray  # (n,) bool: asked outside the position limits
    step_clipped: np.ndarray  # (n,) bool: asked further than max_step from the previous target

    @property
    def clipped(self) -> bool:
        return bool(self.position_clipped.any() or self.step_clipped.any())

    def describe(self, names: Sequence[str], asked: np.ndarray) -> str:
        """Human-readable list of the clipped joints: 'name asked -> sent (reason)'."""
        parts = []
        for i in np.nonzero(self.position_clipped | self.step_clipped)[0]:
            why = "position limit" if self.position_clipped[i] else "max step"
            parts.append(f"{names[i]} {asked[i]:+.4f} -> {self.sent[i]:+.4f} rad ({why})")
        return ", ".join(parts)


def clamp_command(
    asked: np.ndarray, previous: np.ndarray, lower: np.ndarray, upper: np.ndarray, max_step: np.ndarray
) -> ClampResult:
    """The target to send for ``asked``: within [lower, upper] and within ``max_step`` of ``previous``.

    Args:
        asked: (n,) requested positions [rad] (non-finite entries keep ``previous``).
        previous: (n,) the target sent last cycle [rad].
        lower, upper: (n,) position limits [rad].
        max_step: (n,) largest change per cycle [rad] (velocity limit x cycle time).
    """
    asked = np.asarray(asked, dtype=float)
    finite = np.isfinite(asked)
    wanted = np.where(finite, asked, previous)
    in_limits = np.minimum(np.maximum(wanted, lower), upper)
    position_clipped = (in_limits != wanted) | ~finite
    step = in_limits - previous
    limited = np.minimum(np.maximum(step, -max_step), max_step)
    sent = np.minimum(np.maximum(previous + limited, lower), upper)
    return ClampResult(sent, position_clipped, limited != step)


class Watchdog:
    """Trips when no command arrived for ``timeout`` seconds; re-arms on a command newer than the trip."""

    def __init__(self, timeout: float) -> None:
        if not timeout > 0:
            raise ConfigurationError(f"command timeout must be positive, got {timeout}")
        self.timeout = timeout
        self.last_command: float | None = None
        self.tripped_at: float | None = None
        self.trips = 0

    def feed(self, stamp: float) -> None:
        """A command was received at ``stamp`` [s]."""
        self.last_command = stamp

    def check(self, now: float) -> bool:
        """True while commands may be followed (fresh and, after a trip, renewed)."""
        if self.last_command is None:
            return False
        if self.tripped_at is not None:
            if self.last_command > self.tripped_at and now - self.last_command <= self.timeout:
                self.tripped_at = None  # fresh again
            else:
                return False
        if now - self.last_command > self.timeout:
            self.tripped_at = now
            self.trips += 1
            return False
        return True

    @property
    def tripped(self) -> bool:
        return self.tripped_at is not None


class SafetyOutput(NamedTuple):
    """One cycle's decision."""

    target: np.ndarray  # (n,) position target to send [rad]
    mode: str  # one of MODES
    clamp: ClampResult | None  # None while holding


class SafetyController:
    """Watchdog, e-stop latch, start-up hold and ramp, and clamping for one set of joints."""

    def __init__(
        self,
        names: Sequence[str],
        limits: JointLimits,
        dt: float,
        *,
        command_timeout: float = 0.2,
        ramp_threshold: float = 0.05,
        ramp_speed: float = 0.2,
    ) -> None:
        """
        Args:
            names: joint names (for messages).
            limits: their position [rad] and velocity [rad/s] limits.
            dt: control cycle [s].
            command_timeout: watchdog timeout [s].
            ramp_threshold: a command further than this [rad] from the held position is ramped to.
            ramp_speed: ramp speed as a fraction of the velocity limits (0..1].
        """
        if not dt > 0:
            raise ConfigurationError(f"control cycle must be positive, got {dt}")
        if not 0 < ramp_speed <= 1:
            raise ConfigurationError(f"ramp_speed must be in (0, 1], got {ramp_speed}")
        self.names = tuple(names)
        self.lower = np.asarray(limits.lower, dtype=float)
        self.upper = np.asarray(limits.upper, dtype=float)
        n = len(self.names)
        if self.lower.shape != (n,):
            raise ConfigurationError(f"{n} joint names but {self.lower.shape} limits")
        self.max_step = np.asarray(limits.velocity, dtype=float) * dt
        self.ramp_step = self.max_step * ramp_speed
        self.ramp_threshold = ramp_threshold
        self.watchdog = Watchdog(command_timeout)
        self._command: np.ndarray | None = None
        self._sent: np.ndarray | None = None
        self._hold: np.ndarray | None = None
        self._estop = False
        self._ramping = False
        self._resuming = True  # the next followed command comes after a hold (start-up)
        self.mode = "waiting"
        self.clamp_counts = {"position": 0, "step": 0}  # cycles with clipping, by reason
        self._last_clip_log = -np.inf
        self.estops = 0

    # ------------------------------------------------------------------ inputs
    def command(self, position: np.ndarray, stamp: float) -> None:
        """A new command (n,) [rad] received at ``stamp`` [s]."""
        self._command = np.asarray(position, dtype=float)
        self.watchdog.feed(stamp)

    def estop(self) -> bool:
        """Latch the emergency stop; True if it was not latched before."""
        new = not self._estop
        self._estop = True
        self.estops += int(new)
        return new

    def reset(self) -> None:
        """Release the e-stop; motion resumes (ramped) only with fresh commands."""
        if self._estop:
            self._estop = False
            self._command = None  # require a command received after the reset
            last = self.watchdog.last_command
            self.watchdog.tripped_at = last if last is not None else -np.inf

    @property
    def estopped(self) -> bool:
        return self._estop

    # ------------------------------------------------------------------ cycle
    def _hold_at(self, measured: np.ndarray) -> np.ndarray:
        if self._hold is None:
            self._hold = np.minimum(np.maximum(measured, self.lower), self.upper)
        return self._hold

    def step(self, now: float, measured: np.ndarray) -> SafetyOutput:
        """This cycle's target, given the newest measured positions (n,) [rad] at ``now`` [s]."""
        measured = np.asarray(measured, dtype=float)
        if self._sent is None:
            self._sent = np.minimum(np.maximum(measured, self.lower), self.upper)
        if self._estop or not self.watchdog.check(now) or self._command is None:
            if self._estop:
                self.mode = "estop"
            else:
                self.mode = "waiting" if self.watchdog.last_command is None else "watchdog"
            self._resuming = True
            # hold the position measured when the hold began (reached within the step limit)
            self._sent = clamp_command(self._hold_at(measured), self._sent, self.lower, self.upper, self.max_step).sent
            return SafetyOutput(self._sent, self.mode, None)
        self._hold = None
        previous = self._sent
        if self._resuming:  # leaving a hold: ramp (until arrived) if the command is far, else follow at once
            far = np.abs(np.minimum(np.maximum(self._command, self.lower), self.upper) - previous).max()
            self._ramping = bool(far > self.ramp_threshold)
            self._resuming = False
        result = clamp_command(self._command, previous, self.lower, self.upper,
                               self.ramp_step if self._ramping else self.max_step)
        if self._ramping:
            self.mode = "ramp"
            if np.abs(result.sent - np.minimum(np.maximum(self._command, self.lower), self.upper)).max() < 1e-9:
                self._ramping = False  # arrived
        else:
            self.mode = "track"
            if result.position_clipped.any():
                self.clamp_counts["position"] += 1
            if result.step_clipped.any():
                self.clamp_counts["step"] += 1
            if result.clipped and now - self._last_clip_log >= 1.0:  # at most once a second
                self._last_clip_log = now
                _log.warning("clipped: %s", result.describe(self.names, self._command))
        self._sent = result.sent
        return SafetyOutput(result.sent, self.mode, result)
